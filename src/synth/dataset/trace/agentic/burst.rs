//! BurstGPT CSVs (AIPerf 0.13.0's `burst_gpt_trace`): each row one single-turn request of
//! `Request tokens` synthesized input and `Response tokens` output at `Timestamp` seconds.
//! Owns reading the CSV into trace entries; the prompts come from the trace replay.

use std::path::Path;

use crate::synth::dataset::trace::record::{Entry, Input};
use crate::synth::error::TraceError;

/// The columns AIPerf requires (others are ignored).
const REQUIRED: [&str; 3] = ["Timestamp", "Request tokens", "Response tokens"];

/// Whether `bytes` start with a header holding the three BurstGPT columns.
pub fn looks_like_burst(bytes: &[u8]) -> bool {
    let mut r = csv::ReaderBuilder::new().from_reader(bytes);
    r.headers()
        .is_ok_and(|h| REQUIRED.iter().all(|c| h.iter().any(|x| x == *c)))
}

/// The rows as trace entries (timestamps in ms). Rows AIPerf skips (a field that does not
/// parse) are skipped too, each with a warning naming its line; negative counts are skipped
/// the same way.
pub fn entries(path: &Path, bytes: &[u8], max_isl: Option<i64>) -> Result<Vec<Entry>, TraceError> {
    let fail = |line: usize, message: String| TraceError::Line {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut r = csv::ReaderBuilder::new().flexible(true).from_reader(bytes);
    let headers = r
        .headers()
        .map_err(|e| fail(1, format!("is not a CSV header: {e}")))?
        .clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let (Some(ts), Some(input), Some(output)) =
        (col(REQUIRED[0]), col(REQUIRED[1]), col(REQUIRED[2]))
    else {
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|c| col(c).is_none())
            .collect();
        return Err(fail(
            1,
            format!(
                "burst_gpt_trace needs the columns {REQUIRED:?}; missing {missing:?} (columns \
                 present: {:?})",
                headers.iter().collect::<Vec<_>>()
            ),
        ));
    };
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line() as usize);
            fail(line, format!("is not valid CSV: {e}"))
        })?;
        let line = rec.position().map_or(0, |p| p.line() as usize);
        let parsed = (|| {
            let t: f64 = rec.get(ts)?.trim().parse().ok()?;
            let i: i64 = rec.get(input)?.trim().parse().ok()?;
            let o: i64 = rec.get(output)?.trim().parse().ok()?;
            (i >= 0 && o >= 0).then_some((t, i, o))
        })();
        let Some((t, i, o)) = parsed else {
            skipped.push(line);
            continue;
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
    if !skipped.is_empty() {
        tracing::warn!(
            file = %path.display(),
            rows = skipped.len(),
            lines = ?&skipped[..skipped.len().min(10)],
            "skipped BurstGPT rows whose Timestamp, Request tokens or Response tokens do not \
             parse (AIPerf skips them too)"
        );
    }
    if out.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
            kind: "burst_gpt_trace".into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_entries_and_bad_rows_are_skipped() {
        let csv = "Timestamp,Model,Request tokens,Response tokens\n3,GPT-4,10,5\nx,GPT-4,1,1\n4.5,\"A, B\",7,-1\n6,ChatGPT,8,2\n";
        assert!(looks_like_burst(csv.as_bytes()));
        let e = entries(Path::new("b.csv"), csv.as_bytes(), None).unwrap();
        let rows: Vec<(usize, String)> = e
            .iter()
            .map(|e| (e.line, e.timestamp.as_ref().unwrap().to_string()))
            .collect();
        assert_eq!(rows, [(2, "3000.0".to_owned()), (5, "6000.0".to_owned())]);
        let err = entries(Path::new("b.csv"), b"Timestamp,Model\n1,x\n", None).unwrap_err();
        assert!(
            err.to_string()
                .contains("missing [\"Request tokens\", \"Response tokens\"]"),
            "{err}"
        );
        assert!(!looks_like_burst(b"{\"input_length\": 5}\n"));
    }
}
