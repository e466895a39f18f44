//! `kvbust trace merge`: captures of several replicas into one trace — rows ordered by time,
//! rebased to the earliest file's start, keyed ids made dense, sessions renamed. Refuses files
//! captured under different keys or block sizes, naming them. Reads and writes files; never
//! tokenizes.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::file::{meta_path, Meta, FORMAT};
use crate::synth::dataset::trace::input::{Limits, TraceReader, MAX_TRACE_SECONDS};

/// The latest time a merged row may have, in ms from the earliest file's start: the trace
/// readers' ceiling on a trace time (`synth` refuses anything later).
const MAX_TIME_MS: u64 = MAX_TRACE_SECONDS as u64 * 1000;

/// A row as a capture wrote it.
#[derive(Deserialize)]
struct In {
    session_id: Option<String>,
    timestamp: Option<u64>,
    delay: Option<u64>,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

#[derive(Serialize)]
struct Out<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<u64>,
    input_length: u64,
    output_length: u64,
    hash_ids: &'a [u64],
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    pub files: usize,
    pub rows: u64,
    pub distinct_ids: u64,
    pub sessions: u64,
    /// The rows' input and output lengths, summed, and the bytes of the merged trace (for the
    /// command's summary line).
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub bytes: u64,
    /// Unkeyed inputs: their ids could not be matched across files.
    pub unkeyed: bool,
}

struct Loaded {
    path: PathBuf,
    meta: Meta,
    rows: Vec<In>,
}

fn load(path: &Path, limits: Limits) -> Result<Loaded, String> {
    let mp = meta_path(path);
    let meta: Meta = std::fs::read(&mp)
        .map_err(|e| format!("{}: cannot read its metadata {} ({e}); merge takes the .jsonl files kvbust's capture wrote, each with its .meta.json beside it", path.display(), mp.display()))
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", mp.display())))?;
    if meta.format != FORMAT {
        return Err(format!(
            "{}: not a kvbust capture (format {:?})",
            mp.display(),
            meta.format
        ));
    }
    // The trace readers' reader: a line is refused past their cap on one record, before it is
    // held in full.
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut reader = TraceReader::from_read(path, file, limits).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    while let Some((n, line)) = reader.next_line().map_err(|e| e.to_string())? {
        let row: In =
            serde_json::from_str(&line).map_err(|e| format!("{} line {n}: {e}", path.display()))?;
        for (name, v) in [("timestamp", row.timestamp), ("delay", row.delay)] {
            if v.is_some_and(|v| v > MAX_TIME_MS) {
                return Err(format!(
                    "{} line {n}: {name} {} ms is past {MAX_TIME_MS} ms ({MAX_TRACE_SECONDS:e}                      s), the trace readers' ceiling on a trace time",
                    path.display(),
                    v.unwrap_or_default()
                ));
            }
        }
        rows.push(row);
    }
    Ok(Loaded {
        path: path.to_owned(),
        meta,
        rows,
    })
}

/// Refuses inputs whose block size or key differ from the first's, naming both files.
fn check_alike(files: &[Loaded]) -> Result<(), String> {
    let first = &files[0];
    for f in &files[1..] {
        if f.meta.block_size != first.meta.block_size {
            return Err(format!(
                "{} was captured at block_size {} and {} at {}: ids of different block sizes \
                 cannot be merged",
                first.path.display(),
                first.meta.block_size,
                f.path.display(),
                f.meta.block_size
            ));
        }
        if f.meta.key != first.meta.key {
            let name = |k: &Option<String>| match k {
                Some(k) => format!("key {k}"),
                None => "no key".to_string(),
            };
            return Err(format!(
                "{} was captured under {} and {} under {}: replicas must share one \
                 capture.key_file for their ids to agree",
                first.path.display(),
                name(&first.meta.key),
                f.path.display(),
                name(&f.meta.key)
            ));
        }
    }
    Ok(())
}

/// Every row as (ms since `base`, file, line), sorted: a later turn (a `delay` row) sorts right
/// after its session's previous row in its own file.
/// A row whose time lands past [`MAX_TIME_MS`] (a file started long after the earliest one)
/// is refused, naming the file.
fn schedule(files: &[Loaded], base: u64) -> Result<Vec<(u64, usize, usize)>, String> {
    let mut order = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        let offset = f.meta.start_unix_ms.saturating_sub(base);
        let mut last: HashMap<&str, u64> = HashMap::new();
        for (li, r) in f.rows.iter().enumerate() {
            let t = match (r.timestamp, r.session_id.as_deref()) {
                (Some(ts), _) => offset
                    .checked_add(ts)
                    .filter(|t| *t <= MAX_TIME_MS)
                    .ok_or_else(|| {
                        format!(
                            "{}: row {} is {ts} ms after a start {offset} ms after the earliest \
                         file's, past {MAX_TIME_MS} ms, the trace readers' ceiling on a trace time",
                            f.path.display(),
                            li + 1
                        )
                    })?,
                (None, Some(s)) => last.get(s).copied().unwrap_or(offset),
                (None, None) => offset,
            };
            if let Some(s) = r.session_id.as_deref() {
                last.insert(s, t);
            }
            order.push((t, fi, li));
        }
    }
    order.sort();
    Ok(order)
}

/// Refuses an output that is one of the inputs (or either's metadata): the merge would
/// overwrite what it reads.
fn check_output(inputs: &[PathBuf], out: &Path) -> Result<(), String> {
    // The output need not exist yet: its folder does, and names it.
    let canon = |p: &Path| -> Option<PathBuf> {
        if let Ok(c) = std::fs::canonicalize(p) {
            return Some(c);
        }
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(dir).ok()?.join(p.file_name()?))
    };
    let outs = [canon(out), canon(&meta_path(out))];
    for input in inputs {
        for theirs in [canon(input), canon(&meta_path(input))] {
            if theirs.is_some() && outs.contains(&theirs) {
                return Err(format!(
                    "-o {} names an input ({}) or its metadata: the merge would overwrite \
                     what it reads; write the merged trace to a new file",
                    out.display(),
                    input.display()
                ));
            }
        }
    }
    Ok(())
}

/// Merges `inputs` into `out` (and `out`'s metadata beside it).
pub fn merge(inputs: &[PathBuf], out: &Path) -> Result<Merged, String> {
    merge_with(inputs, out, Limits::default())
}

/// [`merge`], reading lines within `limits` (the trace readers' caps; tests use small ones).
fn merge_with(inputs: &[PathBuf], out: &Path, limits: Limits) -> Result<Merged, String> {
    if inputs.is_empty() {
        return Err("name at least one capture file".into());
    }
    check_output(inputs, out)?;
    let files = inputs
        .iter()
        .map(|p| load(p, limits))
        .collect::<Result<Vec<_>, _>>()?;
    check_alike(&files)?;
    let keyed = files[0].meta.key.is_some();
    let base = files
        .iter()
        .map(|f| f.meta.start_unix_ms)
        .min()
        .unwrap_or(0);
    let order = schedule(&files, base)?;
    let tmp = out.with_file_name(format!(
        ".{}.tmp",
        out.file_name().and_then(|n| n.to_str()).unwrap_or("merged")
    ));
    let written = write_rows(&files, &order, keyed, &tmp);
    let io = |e: std::io::Error| format!("{}: {e}", out.display());
    let w = match written.map_err(io) {
        Ok(w) => w,
        Err(e) => {
            // Nothing half-written is left behind.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    // Dense now: the merged ids are no longer keyed hashes, so the result merges like an
    // unkeyed capture.
    let meta = Meta {
        start_unix_ms: base,
        rows: order.len() as u64,
        key: None,
        ..files[0].meta.clone()
    };
    let done = serde_json::to_vec_pretty(&meta)
        .map_err(std::io::Error::other)
        .and_then(|m| std::fs::write(meta_path(out), m))
        .and_then(|()| std::fs::rename(&tmp, out));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(Merged {
        files: files.len(),
        rows: order.len() as u64,
        unkeyed: !keyed,
        ..w
    })
}

/// Writes the rows in `order` to `tmp`, ids made dense and sessions renamed; what it wrote,
/// counted (`files`, `rows` and `unkeyed` left for the caller).
fn write_rows(
    files: &[Loaded],
    order: &[(u64, usize, usize)],
    keyed: bool,
    tmp: &Path,
) -> std::io::Result<Merged> {
    let mut ids: HashMap<(usize, u64), u64> = HashMap::new();
    let mut sessions: HashMap<(usize, String), u64> = HashMap::new();
    let mut w = BufWriter::new(std::fs::File::create(tmp)?);
    let mut hash = Vec::new();
    let (mut input_tokens, mut output_tokens) = (0u64, 0u64);
    for &(t, fi, li) in order {
        let r = &files[fi].rows[li];
        // Keyed ids mean the same block in every file; unkeyed ones only within theirs.
        let scope = if keyed { 0 } else { fi };
        hash.clear();
        for &h in &r.hash_ids {
            let next = ids.len() as u64;
            hash.push(*ids.entry((scope, h)).or_insert(next));
        }
        let session = r.session_id.as_ref().map(|s| {
            let next = sessions.len() as u64;
            format!("s{}", sessions.entry((scope, s.clone())).or_insert(next))
        });
        input_tokens = input_tokens.saturating_add(r.input_length);
        output_tokens = output_tokens.saturating_add(r.output_length);
        let row = Out {
            session_id: session,
            timestamp: r.timestamp.map(|_| t),
            delay: r.delay,
            input_length: r.input_length,
            output_length: r.output_length,
            hash_ids: &hash,
        };
        serde_json::to_writer(&mut w, &row)?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    let bytes = w.get_ref().metadata()?.len();
    Ok(Merged {
        files: 0,
        rows: 0,
        distinct_ids: ids.len() as u64,
        sessions: sessions.len() as u64,
        input_tokens,
        output_tokens,
        bytes,
        unkeyed: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder of the test's own.
    fn scratch(name: &str) -> PathBuf {
        let d = crate::test_support::test_dir().join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A capture file `name` in `dir` with `rows`, started at `start` ms.
    fn capture(dir: &Path, name: &str, start: u64, rows: &str) -> PathBuf {
        let p = dir.join(format!("{name}.jsonl"));
        std::fs::write(&p, rows).unwrap();
        let meta = Meta {
            format: FORMAT.into(),
            version: 1,
            start_unix_ms: start,
            block_size: 4,
            key: None,
            chat_template: "none".into(),
            tokenizer: "builtin".into(),
            min_sessions_per_shared_block: 1,
            rows: 0,
        };
        std::fs::write(meta_path(&p), serde_json::to_vec(&meta).unwrap()).unwrap();
        p
    }

    const ROW: &str = "{\"timestamp\":5,\"input_length\":4,\"output_length\":1,\"hash_ids\":[9]}\n";

    /// Issue 42 (4): a timestamp near u64::MAX, or a file started so long after the first
    /// that its rows land past the trace readers' ceiling, is refused, not wrapped.
    #[test]
    fn times_past_the_ceiling_are_refused_not_wrapped() {
        let dir = scratch("times");
        let out = dir.join("out.jsonl");
        let huge = capture(
            &dir,
            "a",
            0,
            "{\"timestamp\":18446744073709551610,\"input_length\":4,\"output_length\":1}\n",
        );
        let e = merge(&[huge], &out).unwrap_err();
        assert!(e.contains("timestamp 18446744073709551610 ms"), "{e}");
        let first = capture(&dir, "b", 0, ROW);
        let late = capture(&dir, "c", MAX_TIME_MS, ROW);
        let e = merge(&[first.clone(), late], &out).unwrap_err();
        assert!(e.contains("past 1000000000000 ms"), "{e}");
        assert!(!out.exists());
        let ok = capture(&dir, "d", MAX_TIME_MS - 5, ROW);
        assert_eq!(merge(&[first, ok], &out).unwrap().rows, 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 42 (4): `-o` naming an input (by any spelling) or its metadata is refused and the
    /// input stays as it was.
    #[test]
    fn an_output_that_is_an_input_is_refused() {
        let dir = scratch("self");
        let a = capture(&dir, "a", 0, ROW);
        let spelled = dir.join(".").join("a.jsonl");
        for out in [a.clone(), spelled, meta_path(&a)] {
            let e = merge(std::slice::from_ref(&a), &out).unwrap_err();
            assert!(e.contains("names an input"), "{e}");
        }
        assert_eq!(std::fs::read_to_string(&a).unwrap(), ROW);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 42 (4): a line past the record cap is refused as the trace readers refuse it,
    /// before it is held whole, and no temporary file is left.
    #[test]
    fn a_line_past_the_record_cap_is_refused() {
        let dir = scratch("cap");
        let long = format!("{{\"timestamp\":1,\"pad\":\"{}\"}}\n", "x".repeat(4096));
        let a = capture(&dir, "a", 0, &format!("{ROW}{long}"));
        let limits = Limits {
            max_record: 1024,
            ..Limits::default()
        };
        let out = dir.join("out.jsonl");
        let e = merge_with(&[a], &out, limits).unwrap_err();
        assert!(
            e.contains("a.jsonl:2:") && e.contains("cap on one trace record"),
            "{e}"
        );
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(left.len(), 2, "only the input and its metadata");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
