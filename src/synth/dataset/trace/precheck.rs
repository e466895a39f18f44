//! The start-time check of a `[synth.dataset] input_file`: that it exists, which trace type it
//! is, and that its first record reads as that type. `kvbust config check` and `kvbust serve`
//! run it so a broken file is refused before the first request instead of failing each one.
//! Reads the file; never builds the dataset, never tokenizes and never writes.

use std::path::Path;

use crate::synth::dataset::params::SynthParams;
use crate::synth::dataset::trace::agentic::tracelab;
use crate::synth::dataset::trace::burst;
use crate::synth::dataset::trace::input::detect_prefix;
use crate::synth::dataset::trace::{detect_kind, TraceFile};
use crate::synth::dataset::trace_kind::TraceKind;
use crate::synth::error::{SynthError, TraceError};

/// Checks `params.input_file` (nothing to check without one) and returns the trace type it
/// was read as.
pub fn check_input_file(params: &SynthParams) -> Result<Option<TraceKind>, SynthError> {
    let Some(path) = params.input_file.as_deref() else {
        return Ok(None);
    };
    // A missing path would otherwise be "detected" as a mooncake file that cannot be read.
    std::fs::metadata(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let kind = detect_kind(path, params.custom_dataset_type)?;
    params.validate_trace_kind(kind)?;
    check_first_record(path, kind)?;
    Ok(Some(kind))
}

/// The first record read as `kind` (the whole loader runs when the dataset is built).
fn check_first_record(path: &Path, kind: TraceKind) -> Result<(), SynthError> {
    let file_error = |message: String| TraceError::File {
        path: path.to_path_buf(),
        message,
    };
    match kind {
        TraceKind::MooncakeTrace | TraceKind::BailianTrace => {
            let mut file = TraceFile::read(path)?;
            file.lines.truncate(1);
            file.entries(kind)?;
        }
        TraceKind::Tracelab => {
            // The bounded first bytes (gunzipped), as type detection reads them.
            let bytes = detect_prefix(path)?;
            if !tracelab::looks_like_tracelab(&bytes) {
                return Err(file_error(
                    "is not a tracelab trace: its first line is not a JSON object holding \
                     session_id, round_index, input_tokens_total, prefix_tokens, \
                     newly_append_tokens and timing_events (check custom_dataset_type)"
                        .into(),
                )
                .into());
            }
        }
        TraceKind::BurstGptTrace => {
            // The bounded first bytes (gunzipped), as type detection reads them.
            let bytes = detect_prefix(path)?;
            if !burst::looks_like_burst(&bytes) {
                return Err(file_error(
                    "is not a BurstGPT CSV: its header lacks Timestamp, Request tokens and \
                     Response tokens (check custom_dataset_type)"
                        .into(),
                )
                .into());
            }
        }
        // A folder of traces (or one trace file): its loader reads each whole trace object.
        TraceKind::WekaTrace => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(path: &Path, kind: Option<TraceKind>) -> SynthParams {
        SynthParams {
            input_file: Some(path.to_path_buf()),
            custom_dataset_type: kind,
            ..SynthParams::default()
        }
    }

    fn file(name: &str, text: &str) -> std::path::PathBuf {
        let dir = crate::test_support::test_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_good_first_line_is_detected_and_accepted() {
        let p = file("ok.jsonl", "{\"input_length\": 10, \"hash_ids\": [1]}\n");
        assert_eq!(
            check_input_file(&params(&p, None)).unwrap(),
            Some(TraceKind::MooncakeTrace)
        );
        assert_eq!(check_input_file(&SynthParams::default()).unwrap(), None);
    }

    #[test]
    fn a_missing_file_an_empty_one_and_a_bad_first_record_are_refused() {
        let missing = crate::test_support::test_dir().join("no-such-file.jsonl");
        let e = check_input_file(&params(&missing, None)).unwrap_err();
        assert!(e.to_string().contains("no-such-file"), "{e}");
        let empty = file("empty.jsonl", "\n\n");
        let e = check_input_file(&params(&empty, None)).unwrap_err();
        assert!(e.to_string().contains("no trace lines"), "{e}");
        let bad = file("bad.jsonl", "{\"input_length\": \"many\"}\n");
        let e = check_input_file(&params(&bad, None)).unwrap_err();
        assert!(e.to_string().contains(":1:"), "{e}");
        let not_json = file("notjson.jsonl", "hello\n");
        let e = check_input_file(&params(&not_json, None)).unwrap_err();
        assert!(e.to_string().contains("not valid JSON"), "{e}");
    }

    #[test]
    fn a_declared_type_the_file_is_not_is_refused() {
        let p = file("moon.jsonl", "{\"input_length\": 10}\n");
        let e = check_input_file(&params(&p, Some(TraceKind::Tracelab))).unwrap_err();
        assert!(e.to_string().contains("not a tracelab trace"), "{e}");
        let e = check_input_file(&params(&p, Some(TraceKind::BurstGptTrace))).unwrap_err();
        assert!(e.to_string().contains("not a BurstGPT CSV"), "{e}");
    }
}
