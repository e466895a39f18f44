//! Bounded reading of trace input, for every trace type: a file opened as a stream (gzip
//! sniffed by its magic, as AIPerf's `open_text_maybe_gzip`), a cap on one record (a line, or a
//! whole-file JSON document), a cap on how far gzip may expand, the bounded prefix type
//! detection reads, and the per-request token ceiling every loader checks lengths against.
//! Owns those limits and the line splitting (universal newlines, blank lines skipped); must
//! never parse a record nor hold more than one record of a file in memory.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use std::cell::Cell;

use sha2::{Digest, Sha256};

use crate::synth::error::TraceError;

/// The longest record kvbust reads: one line of a JSON-lines or CSV trace, or one whole-file
/// JSON document (a Weka trace). A longer one is refused before it is held in full.
pub const MAX_RECORD_BYTES: usize = 64 << 20;

/// How far a gzip trace may expand (decompressed bytes per compressed byte), checked once
/// [`GZIP_RATIO_FREE_BYTES`] have come out. JSON-lines traces compress 5–30×; deflate's own
/// maximum is about 1032×, which only runs of one byte reach.
pub const MAX_GZIP_RATIO: u64 = 200;

/// Decompressed bytes allowed before [`MAX_GZIP_RATIO`] is checked (small files of repetitive
/// text may expand further than the ratio and are harmless).
pub const GZIP_RATIO_FREE_BYTES: u64 = 16 << 20;

/// The bytes type detection reads from the start of a file (decompressed).
pub const DETECT_BYTES: usize = 1 << 20;

/// kvbust's ceiling on one request's input or output length, in tokens, for every trace type
/// (AIPerf 0.13.0's models check only that these are integers). The largest context window
/// a model ships with is 10M tokens; a longer request cannot be served, and synthesizing it
/// would take gigabytes. `--max-context-length` (weka_trace, tracelab) drops traces below it.
pub const MAX_REQUEST_TOKENS: i64 = 10_000_000;

/// kvbust's ceiling on a trace time in seconds (about 31.7 years): times beyond it (AIPerf
/// accepts any float, 1e308 included) become infinite or lose their milliseconds.
pub const MAX_TRACE_SECONDS: f64 = 1e9;

/// The caps a reader enforces (the constants above; tests use small ones).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_record: usize,
    pub max_gzip_ratio: u64,
    pub gzip_free: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_record: MAX_RECORD_BYTES,
            max_gzip_ratio: MAX_GZIP_RATIO,
            gzip_free: GZIP_RATIO_FREE_BYTES,
        }
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A bound crossed while reading, carried inside an `io::Error` to the line reader, which
/// reports it as it is (any other I/O error is reported as a read failure).
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl Refused {
    pub fn io(message: String) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, Refused(message))
    }
}

/// Counts the bytes read through it (the compressed side of a gzip stream).
struct Counting<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// A gzip decoder that stops once its output outgrows [`Limits::max_gzip_ratio`] times its
/// input (a zip bomb), with an error that says so.
struct RatioCapped<R> {
    inner: flate2::read::MultiGzDecoder<BufReader<Counting<R>>>,
    compressed: Rc<Cell<u64>>,
    out: u64,
    limits: Limits,
}

impl<R: Read> Read for RatioCapped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out += n as u64;
        let input = self.compressed.get().max(1);
        if self.out > self.limits.gzip_free && self.out > input * self.limits.max_gzip_ratio {
            return Err(Refused::io(format!(
                "is gzip-compressed and expands more than {}-fold ({} MiB from {} KiB so far), \
                 which kvbust refuses as a likely decompression bomb; if the file is genuine, \
                 gunzip it and pass the plain file",
                self.limits.max_gzip_ratio,
                self.out >> 20,
                input >> 10
            )));
        }
        Ok(n)
    }
}

/// A trace file read as a stream of bounded records.
pub struct TraceReader {
    path: PathBuf,
    src: Box<dyn BufRead>,
    limits: Limits,
    gzip: bool,
    /// Line breaks consumed so far (`\n`, `\r\n` and a lone `\r` each count once).
    breaks: usize,
    /// The last byte consumed was a `\r` (a following `\n` belongs to the same break).
    after_cr: bool,
}

impl TraceReader {
    /// Opens `path` (gunzipped when it starts with the gzip magic) with the default limits.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        Self::open_with(path, Limits::default())
    }

    pub fn open_with(path: &Path, limits: Limits) -> Result<Self, TraceError> {
        let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_read(path, file, limits)
    }

    /// A reader over any byte source (`path` names it in messages).
    pub fn from_read(
        path: &Path,
        read: impl Read + 'static,
        limits: Limits,
    ) -> Result<Self, TraceError> {
        let mut raw = BufReader::with_capacity(1 << 16, read);
        let gz = raw
            .fill_buf()
            .map_err(|source| TraceError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .starts_with(&GZIP_MAGIC);
        let src: Box<dyn BufRead> = if gz {
            let compressed = Rc::new(Cell::new(0));
            let counting = Counting {
                inner: raw,
                count: Rc::clone(&compressed),
            };
            let inner = flate2::read::MultiGzDecoder::new(BufReader::new(counting));
            Box::new(BufReader::with_capacity(
                1 << 16,
                RatioCapped {
                    inner,
                    compressed,
                    out: 0,
                    limits,
                },
            ))
        } else {
            Box::new(raw)
        };
        Ok(TraceReader {
            path: path.to_path_buf(),
            src,
            limits,
            gzip: gz,
            breaks: 0,
            after_cr: false,
        })
    }

    fn error(&self, line: usize, e: &std::io::Error) -> TraceError {
        let refused = e.get_ref().and_then(|x| x.downcast_ref::<Refused>());
        let message = match refused {
            Some(r) => r.0.clone(),
            None if self.gzip => format!("does not decompress (a damaged gzip file?): {e}"),
            None => format!("cannot be read: {e}"),
        };
        TraceError::Line {
            path: self.path.clone(),
            line,
            message,
        }
    }

    fn too_long(&self, line: usize, what: &str) -> TraceError {
        TraceError::Line {
            path: self.path.clone(),
            line,
            message: format!(
                "{what} is longer than {} MiB, kvbust's cap on one trace record; a trace line \
                 that long is not a trace (check the file is the trace you meant)",
                self.limits.max_record >> 20
            ),
        }
    }

    /// Consumes blank bytes (ASCII whitespace and line breaks) before the next line, counting
    /// the breaks; a file of blank lines costs one pass over its bytes and no memory.
    fn skip_blank(&mut self) -> Result<bool, TraceError> {
        loop {
            let buf = match self.src.fill_buf() {
                Ok(b) => b,
                Err(e) => return Err(self.error(self.breaks + 1, &e)),
            };
            if buf.is_empty() {
                return Ok(false);
            }
            let (mut breaks, mut after_cr) = (self.breaks, self.after_cr);
            let mut used = 0;
            for &b in buf {
                match b {
                    b'\n' if after_cr => after_cr = false,
                    b'\n' => breaks += 1,
                    b'\r' => {
                        breaks += 1;
                        after_cr = true;
                    }
                    b' ' | b'\t' | 0x0b | 0x0c => after_cr = false,
                    _ => {
                        after_cr = false;
                        break;
                    }
                }
                used += 1;
            }
            let more = used < buf.len();
            self.src.consume(used);
            (self.breaks, self.after_cr) = (breaks, after_cr);
            if more {
                return Ok(true);
            }
        }
    }

    /// The next non-blank line, trimmed, with its 1-based number; `None` at the end.
    pub fn next_line(&mut self) -> Result<Option<(usize, String)>, TraceError> {
        loop {
            if !self.skip_blank()? {
                return Ok(None);
            }
            let line = self.breaks + 1;
            let mut bytes = Vec::new();
            loop {
                let buf = match self.src.fill_buf() {
                    Ok(b) => b,
                    Err(e) => return Err(self.error(line, &e)),
                };
                if buf.is_empty() {
                    break;
                }
                let (take, end) = match memchr::memchr2(b'\n', b'\r', buf) {
                    Some(i) => (i, true),
                    None => (buf.len(), false),
                };
                if bytes.len() + take > self.limits.max_record {
                    return Err(self.too_long(line, "the line"));
                }
                bytes.extend_from_slice(&buf[..take]);
                self.src.consume(take);
                if end {
                    break;
                }
            }
            let text = String::from_utf8(bytes).map_err(|_| TraceError::Line {
                path: self.path.clone(),
                line,
                message: "is not valid UTF-8".into(),
            })?;
            let t = text.trim();
            if !t.is_empty() {
                return Ok(Some((line, t.to_owned())));
            }
        }
    }

    /// Everything left, as one record (a whole-file JSON document): `None` when it is longer
    /// than the record cap (nothing past the cap is read).
    pub fn read_document(&mut self) -> Result<Option<Vec<u8>>, TraceError> {
        let cap = self.limits.max_record;
        let mut out = Vec::new();
        let read = (&mut self.src).take(cap as u64 + 1).read_to_end(&mut out);
        match read {
            Ok(_) if out.len() > cap => Ok(None),
            Ok(_) => Ok(Some(out)),
            Err(e) => Err(self.error(1, &e)),
        }
    }

    /// Up to `n` bytes from the current position (type detection).
    pub fn prefix(&mut self, n: usize) -> Result<Vec<u8>, TraceError> {
        let mut out = Vec::new();
        let read = (&mut self.src).take(n as u64).read_to_end(&mut out);
        match read {
            Ok(_) => Ok(out),
            Err(e) => Err(self.error(1, &e)),
        }
    }

    /// The decompressed stream itself, for a reader with its own framing (CSV); the gzip
    /// ratio cap still applies, the record cap is the caller's.
    pub fn into_stream(self) -> Box<dyn BufRead> {
        self.src
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }
}

/// The first [`DETECT_BYTES`] of `path`, gunzipped when it is gzip (type detection).
pub fn detect_prefix(path: &Path) -> Result<Vec<u8>, TraceError> {
    TraceReader::open(path)?.prefix(DETECT_BYTES)
}

/// AIPerf's `trace_id` for `path`: the first 16 hex digits of the sha256 of the file as it is
/// on disk (compressed, for a .gz), read as a stream.
pub fn trace_id_of(path: &Path) -> Result<String, TraceError> {
    let io = |source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io)?;
    Ok(hex::encode(hasher.finalize())[..16].to_owned())
}

/// The keys of the first top-level JSON object in `bytes` (which may stop mid-object), in
/// order, as far as `bytes` reach: enough to tell a Weka trace or a TraceLab row from a
/// prefix, without parsing (or holding) the whole document.
pub fn top_level_keys(bytes: &[u8]) -> Vec<String> {
    let mut keys = Vec::new();
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    if start.map(|i| bytes[i]) != Some(b'{') {
        return keys;
    }
    let (mut depth, mut i) = (0usize, start.unwrap_or(0));
    // Whether the next string at depth 1 is a key (after `{` or `,`), not a value.
    let mut expect_key = false;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let Some(end) = string_end(bytes, i + 1) else {
                    break;
                };
                if depth == 1 && expect_key {
                    if let Ok(Ok(k)) =
                        std::str::from_utf8(&bytes[i..=end]).map(serde_json::from_str::<String>)
                    {
                        keys.push(k);
                    }
                    expect_key = false;
                }
                i = end;
            }
            b'{' | b'[' => {
                depth += 1;
                expect_key = depth == 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    break;
                }
            }
            b',' if depth == 1 => expect_key = true,
            _ => {}
        }
        i += 1;
    }
    keys
}

/// The index of the quote closing a JSON string whose body starts at `from`.
fn string_end(bytes: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The first non-blank line of `prefix`, when it ends inside `prefix` (or `prefix` is the
/// whole file): `(1-based line number, trimmed text)`.
pub fn first_line(prefix: &[u8], whole: bool) -> Option<(usize, &str)> {
    let mut line = 1;
    let mut rest = prefix;
    loop {
        let end = memchr::memchr2(b'\n', b'\r', rest);
        let (this, next) = match end {
            Some(i) => (&rest[..i], Some(i)),
            None if whole => (rest, None),
            None => return None,
        };
        let text = std::str::from_utf8(this).ok()?.trim();
        if !text.is_empty() {
            return Some((line, text));
        }
        let i = next?;
        // `\r\n` is one break.
        let skip = if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') {
            2
        } else {
            1
        };
        rest = &rest[i + skip..];
        line += 1;
    }
}

/// A token count against the ceiling: `None` when it fits, else why not (`field` named by the
/// caller). `limit` is `--max-context-length` when the type reads it, else the ceiling.
pub fn over_ceiling(n: i64) -> Option<String> {
    (n > MAX_REQUEST_TOKENS).then(|| {
        format!(
            "is {n}, above kvbust's ceiling of {MAX_REQUEST_TOKENS} tokens per request (the \
             largest context a model serves; AIPerf checks only that it is an integer); fix \
             the trace or drop that record"
        )
    })
}

/// A trace time in seconds against [`MAX_TRACE_SECONDS`]: `None` when it is finite and within.
pub fn bad_seconds(x: f64) -> Option<String> {
    (!x.is_finite() || x.abs() > MAX_TRACE_SECONDS).then(|| {
        format!(
            "is {x:?}, beyond kvbust's bound of ±{MAX_TRACE_SECONDS:e} seconds for a trace time \
             (AIPerf accepts any float; a larger one loses its milliseconds or becomes infinite)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn reader(bytes: Vec<u8>, limits: Limits) -> TraceReader {
        TraceReader::from_read(Path::new("t.jsonl"), std::io::Cursor::new(bytes), limits).unwrap()
    }

    fn lines(bytes: &[u8]) -> Vec<(usize, String)> {
        let mut r = reader(bytes.to_vec(), Limits::default());
        std::iter::from_fn(|| r.next_line().unwrap()).collect()
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn universal_newlines_and_blank_lines() {
        let want = vec![
            (2, "{\"a\":1}".to_owned()),
            (4, "{\"b\":2}".to_owned()),
            (7, "x".to_owned()),
        ];
        let text = b"\n{\"a\":1}\r\n  \r{\"b\":2}\n\t\n\r\n \xc2\xa0x \n";
        assert_eq!(lines(text), want);
        // The same through gzip.
        let mut r = reader(gz(text), Limits::default());
        let got: Vec<_> = std::iter::from_fn(|| r.next_line().unwrap()).collect();
        assert_eq!(got, want);
        let mut r = reader(b"{}\n\xff\n".to_vec(), Limits::default());
        r.next_line().unwrap();
        assert_eq!(
            r.next_line().unwrap_err().to_string(),
            "t.jsonl:2: is not valid UTF-8"
        );
    }

    #[test]
    fn a_line_over_the_cap_is_refused_before_it_is_held() {
        let limits = Limits {
            max_record: 100,
            ..Limits::default()
        };
        let mut text = b"{}\n\n".to_vec();
        text.extend(std::iter::repeat_n(b'a', 10_000));
        let mut r = reader(text, limits);
        assert!(r.next_line().unwrap().is_some());
        let e = r.next_line().unwrap_err().to_string();
        assert!(e.starts_with("t.jsonl:3: the line is longer than"), "{e}");
        // Exactly at the cap is fine.
        let mut r = reader(vec![b'b'; 100], limits);
        assert_eq!(r.next_line().unwrap().unwrap().1.len(), 100);
    }

    #[test]
    fn gzip_expansion_is_capped() {
        let limits = Limits {
            max_record: 1 << 30,
            max_gzip_ratio: 50,
            gzip_free: 1 << 16,
        };
        let bomb = gz(&vec![b'\n'; 4 << 20]);
        let mut r = reader(bomb, limits);
        let e = r.next_line().unwrap_err().to_string();
        assert!(e.contains("expands more than 50-fold"), "{e}");
        // Ordinary text under the free allowance expands as it likes.
        let mut r = reader(gz(&vec![b'\n'; 1 << 15]), limits);
        assert!(r.next_line().unwrap().is_none());
    }

    #[test]
    fn documents_and_prefixes_are_bounded() {
        let limits = Limits {
            max_record: 10,
            ..Limits::default()
        };
        assert_eq!(
            reader(b"0123456789".to_vec(), limits)
                .read_document()
                .unwrap(),
            Some(b"0123456789".to_vec())
        );
        assert_eq!(
            reader(b"0123456789x".to_vec(), limits)
                .read_document()
                .unwrap(),
            None
        );
        assert_eq!(
            reader(gz(b"abcdef"), limits).prefix(3).unwrap(),
            b"abc".to_vec()
        );
    }

    #[test]
    fn keys_of_a_prefix() {
        let doc = br#" {"id": "x", "models": ["a", {"id": 1}], "block_size": 64, "q\"k": {"requests": 1}, "requests": [{"t"#;
        assert_eq!(
            top_level_keys(doc),
            ["id", "models", "block_size", "q\"k", "requests"]
        );
        assert!(top_level_keys(b"[1, 2]").is_empty());
        assert_eq!(top_level_keys(b"{\"a\": 1}\n{\"b\": 2}"), ["a"]);
    }

    #[test]
    fn first_line_of_a_prefix() {
        assert_eq!(first_line(b"\r\n\n  {}\nrest", false), Some((3, "{}")));
        assert_eq!(first_line(b"\n{\"a\": 1", false), None);
        assert_eq!(first_line(b"\n{\"a\": 1", true), Some((2, "{\"a\": 1")));
    }

    #[test]
    fn ceilings() {
        assert!(over_ceiling(MAX_REQUEST_TOKENS).is_none());
        assert!(over_ceiling(MAX_REQUEST_TOKENS + 1).is_some());
        assert!(bad_seconds(1e308).is_some() && bad_seconds(f64::NAN).is_some());
        assert!(bad_seconds(-5.5).is_none() && bad_seconds(1e9).is_none());
    }
}
