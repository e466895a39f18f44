//! BurstGPT CSVs (AIPerf 0.13.0's `burst_gpt_trace`): each row one single-turn request of
//! `Request tokens` synthesized input and `Response tokens` output at `Timestamp` seconds.
//! Owns reading the CSV into trace entries and its row of the loader table ([`LOADER`]); the
//! prompts come from the hash-id replay ([`super::hash_ids`]).

use std::cell::Cell;
use std::io::Read;
use std::path::Path;
use std::rc::Rc;

use super::content::TraceContent;
use super::hash_ids::{build_entries, TraceFile, TraceParams};
use super::{Build, Loader};
use crate::synth::dataset::trace::input::{self, TraceReader};
use crate::synth::dataset::trace::record::{Entry, Input};
use crate::synth::dataset::trace_kind::TraceKind;
use crate::synth::dataset::{Conversation, Out};
use crate::synth::error::SynthError;
use crate::synth::error::TraceError;

/// The columns AIPerf requires (others are ignored).
const REQUIRED: [&str; 3] = ["Timestamp", "Request tokens", "Response tokens"];

/// Dropped rows listed by line in the warning (the count covers them all).
const LISTED: usize = 10;

/// `burst_gpt_trace`: a first line that is a header with BurstGPT's columns.
pub const LOADER: Loader = Loader {
    kind: TraceKind::BurstGptTrace,
    can_load: |p| Ok(p.first.is_some_and(|(_, l)| looks_like_burst(l.as_bytes()))),
    build,
};

/// The CSV's rows, each a single-turn request built as AIPerf builds them (512-token blocks,
/// no hash ids), with `--synthesis-max-osl` capping `max_tokens` after.
fn build(
    b: &Build<'_>,
    content: &mut dyn TraceContent,
    out: &mut Out<'_>,
) -> Result<(), SynthError> {
    let kind = TraceKind::BurstGptTrace;
    let file = TraceFile {
        path: b.path.to_path_buf(),
        trace_id: input::trace_id_of(b.path)?,
        lines: Vec::new(),
    };
    let text = TraceReader::open(b.path)?;
    let max_isl = b.params.synthesis_max_isl.map(|m| m as i64);
    let rows = entries(b.path, text, max_isl, b.params.strict)?;
    let trace = TraceParams::of(b.params, kind);
    let cap = b.params.synthesis_max_osl;
    let (max_row_bytes, max_blocks) = (out.max_row_bytes, out.max_blocks);
    // `--synthesis-max-osl` applies to each conversation on its way out.
    let mut capped = |mut conv: Conversation, unscheduled: bool| {
        out.unscheduled = unscheduled;
        if let Some(cap) = cap {
            for t in &mut conv.turns {
                t.max_tokens = t.max_tokens.map(|m| m.min(cap));
            }
        }
        out.emit(conv)
    };
    let mut out = Out {
        sink: &mut capped,
        max_row_bytes,
        max_blocks,
        unscheduled: false,
    };
    build_entries(
        &file,
        kind,
        rows,
        &trace,
        b.tokenizer,
        content,
        b.root_seed,
        512,
        &mut out,
    )
}

/// Whether `bytes` start with a header holding the three BurstGPT columns.
pub fn looks_like_burst(bytes: &[u8]) -> bool {
    let mut r = csv::ReaderBuilder::new().from_reader(bytes);
    r.headers()
        .is_ok_and(|h| REQUIRED.iter().all(|c| h.iter().any(|x| x == *c)))
}

/// Refuses a CSV record longer than the record cap while it is being read (the CSV reader
/// would otherwise hold a 500 MB field whole): `since` counts the bytes handed out since the
/// last complete record, and the reader resets it after each one.
struct RecordCap<R> {
    inner: R,
    since: Rc<Cell<u64>>,
    cap: u64,
}

impl<R: Read> Read for RecordCap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.since.set(self.since.get() + n as u64);
        if self.since.get() > self.cap {
            return Err(input::Refused::io(format!(
                "a CSV record is longer than {} MiB, kvbust's cap on one trace record",
                self.cap >> 20
            )));
        }
        Ok(n)
    }
}

/// A row as read: kept (seconds, request and response tokens), or dropped as AIPerf drops it
/// (why).
enum Row {
    Kept(f64, i64, i64),
    Dropped(String),
}

/// A field past one of kvbust's bounds (column, why): an error, not a dropped row.
type Refusal = (&'static str, String);

/// The row's three columns.
fn row_fields(
    rec: &csv::StringRecord,
    (ts, request, response): (usize, usize, usize),
) -> Result<Row, Refusal> {
    let cell = |i: usize| rec.get(i).unwrap_or("").trim();
    let Ok(t) = cell(ts).parse::<f64>() else {
        return Ok(Row::Dropped(format!(
            "Timestamp {:?} is not a number",
            short(cell(ts))
        )));
    };
    if let Some(why) = input::bad_seconds(t) {
        return Err(("Timestamp", why));
    }
    let mut counts = [0i64; 2];
    for (k, (i, name)) in [(request, REQUIRED[1]), (response, REQUIRED[2])]
        .into_iter()
        .enumerate()
    {
        let text = cell(i);
        match text.parse::<i64>() {
            Ok(n) if n < 0 => return Ok(Row::Dropped(format!("{name} is {n}, a negative count"))),
            Ok(n) => counts[k] = n,
            // Digits too many for an i64: an integer to Python (AIPerf keeps the row), far
            // over the ceiling.
            Err(_) if is_integer(text) => {
                return Err((name, format!("is {}, {}", short(text), ceiling_text())))
            }
            Err(_) => {
                return Ok(Row::Dropped(format!(
                    "{name} {:?} is not an integer",
                    short(text)
                )))
            }
        }
        if let Some(why) = input::over_ceiling(counts[k]) {
            return Err((name, why));
        }
    }
    Ok(Row::Kept(t, counts[0], counts[1]))
}

fn is_integer(s: &str) -> bool {
    let d = s.strip_prefix(['+', '-']).unwrap_or(s);
    !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
}

fn ceiling_text() -> String {
    format!(
        "above kvbust's ceiling of {} tokens per request",
        input::MAX_REQUEST_TOKENS
    )
}

/// A cell cut for a message.
fn short(s: &str) -> String {
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.to_owned()
    }
}

/// The header's required columns, or the error naming the missing ones.
fn columns(path: &Path, headers: &csv::StringRecord) -> Result<(usize, usize, usize), TraceError> {
    let col = |name: &str| headers.iter().position(|h| h == name);
    if let (Some(ts), Some(input), Some(output)) =
        (col(REQUIRED[0]), col(REQUIRED[1]), col(REQUIRED[2]))
    {
        return Ok((ts, input, output));
    }
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|c| col(c).is_none())
        .collect();
    Err(TraceError::Line {
        path: path.to_path_buf(),
        line: 1,
        message: format!(
            "burst_gpt_trace needs the columns {REQUIRED:?}; missing {missing:?} (columns \
             present: {:?})",
            headers.iter().collect::<Vec<_>>()
        ),
    })
}

/// The rows as trace entries (timestamps in ms). Rows AIPerf skips (a field that does not
/// parse) are skipped too, negative counts the same way, and all of them are counted in one
/// warning naming their lines; with `strict` the first one is an error instead. A count over
/// [`input::MAX_REQUEST_TOKENS`] or a time past [`input::MAX_TRACE_SECONDS`] is an error.
pub fn entries(
    path: &Path,
    reader: TraceReader,
    max_isl: Option<i64>,
    strict: bool,
) -> Result<Vec<Entry>, TraceError> {
    let fail = |line: usize, message: String| TraceError::Line {
        path: path.to_path_buf(),
        line,
        message,
    };
    let since = Rc::new(Cell::new(0));
    let capped = RecordCap {
        cap: reader.limits().max_record as u64,
        inner: reader.into_stream(),
        since: Rc::clone(&since),
    };
    let mut r = csv::ReaderBuilder::new().flexible(true).from_reader(capped);
    let headers = r
        .headers()
        .map_err(|e| fail(1, format!("is not a CSV header: {e}")))?
        .clone();
    let cols = columns(path, &headers)?;
    let mut out = Vec::new();
    let mut dropped: Vec<(usize, String)> = Vec::new();
    let mut rec = csv::StringRecord::new();
    let mut last_line = 1;
    loop {
        since.set(0);
        match r.read_record(&mut rec) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                let line = e.position().map_or(last_line + 1, |p| p.line() as usize);
                let message = match e.kind() {
                    csv::ErrorKind::Io(io) => io.to_string(),
                    _ => format!("is not valid CSV: {e}"),
                };
                return Err(fail(line, message));
            }
        }
        let line = rec.position().map_or(0, |p| p.line() as usize);
        last_line = line;
        let (t, i, o) = match row_fields(&rec, cols) {
            Ok(Row::Kept(t, i, o)) => (t, i, o),
            Ok(Row::Dropped(why)) => {
                dropped.push((line, why));
                continue;
            }
            Err((field, why)) => return Err(fail(line, format!("field `{field}` {why}"))),
        };
        if max_isl.is_some_and(|m| i > m) {
            continue;
        }
        out.push(Entry {
            line,
            input: Input::Length(i),
            output_length: Some(o),
            hash_ids: Vec::new(),
            timestamp: serde_json::Number::from_f64(t * 1000.0),
            delay: None,
            session_id: None,
            chat: None,
            extra: None,
        });
    }
    report_dropped(path, &dropped, strict)?;
    if out.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
            kind: "burst_gpt_trace".into(),
        });
    }
    Ok(out)
}

/// One warning for every dropped row (AIPerf drops them silently), or with `--strict` an error
/// naming the first.
fn report_dropped(
    path: &Path,
    dropped: &[(usize, String)],
    strict: bool,
) -> Result<(), TraceError> {
    let Some((line, why)) = dropped.first() else {
        return Ok(());
    };
    if strict {
        return Err(TraceError::Line {
            path: path.to_path_buf(),
            line: *line,
            message: format!(
                "{why}; --strict refuses dropped rows ({} row(s) of this file would be dropped, \
                 as AIPerf drops them); fix them, or leave out --strict to skip them",
                dropped.len()
            ),
        });
    }
    let listed: Vec<String> = dropped
        .iter()
        .take(LISTED)
        .map(|(l, w)| format!("line {l}: {w}"))
        .collect();
    tracing::warn!(
        "{}: dropped {} BurstGPT row(s) whose Timestamp, Request tokens or Response tokens do \
         not parse (AIPerf drops them too; --strict makes this an error): {}{}",
        path.display(),
        dropped.len(),
        listed.join("; "),
        if dropped.len() > LISTED { "; …" } else { "" }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(text: &str) -> TraceReader {
        TraceReader::from_read(
            Path::new("b.csv"),
            std::io::Cursor::new(text.as_bytes().to_vec()),
            input::Limits::default(),
        )
        .unwrap()
    }

    #[test]
    fn rows_become_entries_and_bad_rows_are_skipped() {
        let csv = "Timestamp,Model,Request tokens,Response tokens\n3,GPT-4,10,5\nx,GPT-4,1,1\n4.5,\"A, B\",7,-1\n6,ChatGPT,8,2\n";
        assert!(looks_like_burst(csv.as_bytes()));
        let e = entries(Path::new("b.csv"), reader(csv), None, false).unwrap();
        let rows: Vec<(usize, String)> = e
            .iter()
            .map(|e| (e.line, e.timestamp.as_ref().unwrap().to_string()))
            .collect();
        assert_eq!(rows, [(2, "3000.0".to_owned()), (5, "6000.0".to_owned())]);
        let err = entries(
            Path::new("b.csv"),
            reader("Timestamp,Model\n1,x\n"),
            None,
            false,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("missing [\"Request tokens\", \"Response tokens\"]"),
            "{err}"
        );
        assert!(!looks_like_burst(b"{\"input_length\": 5}\n"));
    }
}
