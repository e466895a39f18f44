//! `kvbust synth --input-file`: the six traces.json cases (AIPerf 0.13.0's CustomDatasetComposer,
//! Qwen3) byte for byte through the command line, the block terminator extension, and the
//! errors bad traces get (file, line, field; exit 2; no output file left behind).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::synth_common;
use crate::synth_common::Wrapper;
use clap::Parser;
use kvbust::cli::synth::{run, SynthArgs};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Vectors {
    cases: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
struct RawCase<'a> {
    /// Absent in coding.json's synthetic cases.
    #[serde(borrow, default)]
    trace: Vec<&'a RawValue>,
}

fn fixture_text() -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth/traces.json"),
    )
    .unwrap()
}

fn scratch(name: &str) -> PathBuf {
    synth_common::scratch("traces", name)
}

/// Python's `json.dumps(obj)` of an object given as (pretty-printed) JSON text: the same
/// tokens with `", "` and `": "` separators. The vectors were written by `json.dump`, so
/// strings and numbers are already in Python's spelling.
pub(crate) fn python_dumps(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut in_str = false;
    let mut escaped = false;
    for c in raw.chars() {
        if in_str {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push(c);
            }
            ',' => out.push_str(", "),
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

/// The trace file AIPerf read for a case: `json.dumps(line) + "\n"` per line (its sha256
/// scopes the hash ids, so the bytes matter).
fn write_trace(name: &str, lines: &[&RawValue]) -> PathBuf {
    let path = scratch(&format!("{name}.jsonl"));
    let text: String = lines.iter().map(|l| python_dumps(l.get()) + "\n").collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn parse(argv: &[String]) -> SynthArgs {
    let mut full = vec!["synth".to_owned()];
    full.extend_from_slice(argv);
    Wrapper::try_parse_from(full).expect("flags parse").args
}

fn run_lines(argv: Vec<String>, out: &Path) -> Vec<Value> {
    let mut argv = argv;
    argv.extend(["-o".into(), out.display().to_string()]);
    run(&parse(&argv)).expect("synth runs");
    std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn all_trace_vectors_byte_exact() {
    let text = fixture_text();
    let vectors: Vectors = serde_json::from_str(&text).unwrap();
    let raw: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
    let raw_cases: std::collections::HashMap<String, RawCase> = {
        #[derive(Deserialize)]
        struct Top<'a> {
            #[serde(borrow)]
            cases: std::collections::HashMap<String, RawCase<'a>>,
        }
        let t: Top = serde_json::from_str(&text).unwrap();
        t.cases
    };
    assert_eq!(raw["aiperf_version"], "0.13.0");
    assert_eq!(vectors.cases.len(), 6);
    for (name, case) in &vectors.cases {
        let trace = write_trace(name, &raw_cases[name].trace);
        let mut argv: Vec<String> = vec![
            "--input-file".into(),
            trace.display().to_string(),
            "--custom-dataset-type".into(),
            case["custom_dataset_type"].as_str().unwrap().into(),
        ];
        argv.extend(
            case["argv"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned()),
        );
        let t0 = std::time::Instant::now();
        let got = run_lines(argv, &scratch(&format!("{name}.out.jsonl")));
        let took = t0.elapsed();
        let want = case["conversations"].as_array().unwrap();
        let turns: usize = want
            .iter()
            .map(|c| c["turns"].as_array().unwrap().len())
            .sum();
        eprintln!(
            "{name}: {turns} prompts in {took:?} (AIPerf: {} s)",
            case["aiperf_seconds"]
        );
        assert_eq!(got.len(), want.len(), "{name}: conversations");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g["session_id"], w["session_id"], "{name}");
            let gt = g["turns"].as_array().unwrap();
            let wt = w["turns"].as_array().unwrap();
            assert_eq!(gt.len(), wt.len(), "{name} {}", w["session_id"]);
            for (i, (a, b)) in gt.iter().zip(wt).enumerate() {
                let at = format!("{name} {} turn {i}", w["session_id"]);
                let text = a["text"].as_str().unwrap();
                assert_eq!(
                    hex::encode(Sha256::digest(text.as_bytes())),
                    b["text_sha256"].as_str().unwrap(),
                    "{at}: text differs\n got: {:.200}\nwant: {:.200}",
                    text,
                    b["text"].as_str().unwrap()
                );
                assert_eq!(a["text"], b["text"], "{at}");
                assert_eq!(a["max_tokens"], b["max_tokens"], "{at}");
                // Absent in our line means null in AIPerf's; a number must match (int 137
                // stays 137, bailian's ms stay floats such as 2380.0).
                for k in ["timestamp", "delay"] {
                    let ours = a.get(k).cloned().unwrap_or(Value::Null);
                    assert_eq!(ours, b[k], "{at}: {k}");
                    if let (Some(x), Some(y)) = (ours.as_number(), b[k].as_number()) {
                        assert_eq!(x.is_f64(), y.is_f64(), "{at}: {k} int/float");
                    }
                }
            }
        }
    }
}

#[test]
fn terminator_none_drops_the_separator_only() {
    let text = fixture_text();
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        cases: std::collections::HashMap<String, RawCase<'a>>,
    }
    let t: Top = serde_json::from_str(&text).unwrap();
    let trace = write_trace("bs32_none", &t.cases["mooncake_bs32"].trace);
    let base = |extra: &[&str], out: &str| {
        let mut argv: Vec<String> = [
            "--input-file",
            trace.to_str().unwrap(),
            "--custom-dataset-type",
            "mooncake_trace",
            "--random-seed",
            "5",
            "--isl-block-size",
            "32",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        argv.extend(extra.iter().map(|s| s.to_string()));
        run_lines(argv, &scratch(out))
    };
    let aiperf = base(&[], "term_aiperf.jsonl");
    let none = base(&["--trace-block-terminator", "none"], "term_none.jsonl");
    assert_eq!(aiperf.len(), none.len());
    for (a, n) in aiperf.iter().zip(&none) {
        let a = a["turns"][0]["text"].as_str().unwrap();
        let n = n["turns"][0]["text"].as_str().unwrap();
        assert!(!n.contains("<|im_end|>"), "{n:.100}");
        // Each block is reseeded the same way, so its window starts at the same corpus token:
        // without the separator the first block is the same text, one token longer.
        let first = a
            .strip_prefix("<|im_end|>")
            .and_then(|rest| rest.split("<|im_end|>").next())
            .unwrap();
        assert!(!first.is_empty());
        assert!(n.starts_with(first), "{first:.80} / {n:.80}");
        assert_ne!(n.len(), first.len());
    }
}

fn kvbust() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvbust"))
}

/// Runs `kvbust synth` on a trace text; returns (exit code, stderr) and checks no output file
/// (nor a temporary one) is left behind.
fn fails(name: &str, trace: &str, extra: &[&str]) -> (i32, String) {
    let path = scratch(&format!("{name}.jsonl"));
    std::fs::write(&path, trace).unwrap();
    let out = scratch(&format!("{name}.out"));
    let o = kvbust()
        .args(["synth", "--input-file", path.to_str().unwrap(), "-o"])
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    assert!(!out.exists(), "{name}: a partial output file was left");
    let leftovers: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .contains(&format!("{name}.out"))
        })
        .collect();
    assert!(leftovers.is_empty(), "{name}: {leftovers:?}");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn bad_traces_exit_2_naming_file_line_and_field() {
    // A hash id used with two block sizes (AIPerf's check), on line 3.
    let (code, err) = fails(
        "two_sizes",
        "{\"input_length\": 8, \"hash_ids\": [1, 2], \"timestamp\": 1}\n\n{\"input_length\": 3, \"hash_ids\": [2], \"timestamp\": 2}\n",
        &["--isl-block-size", "4", "--random-seed", "1"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("two_sizes.jsonl:3:")
            && err.contains("`hash_ids`")
            && err.contains("hash_id 2")
            && err.contains("line 1"),
        "{err}"
    );

    // (name, trace, flags, what the message must say): a line no loader accepts, a line that
    // is not JSON, a partial last block outside 1..=block size, an empty file, an unknown
    // --custom-dataset-type and one AIPerf has but kvbust does not reproduce, the random
    // corpus (AIPerf's reason).
    let cases: [(&str, &str, &[&str], &[&str]); 8] = [
        (
            "osl0",
            "{\"input_length\": 3, \"output_length\": 0}\n",
            &[],
            &["osl0.jsonl:1:", "`output_length`", "at least 1"],
        ),
        (
            "no_loader",
            "{\"input_length\": 3}\n{\"output_length\": 3}\n",
            &["--custom-dataset-type", "mooncake_trace"],
            &["no_loader.jsonl:2:", "`input_length`"],
        ),
        (
            "not_json",
            "{\"input_length\": 3}\n{oops\n",
            &[],
            &["not_json.jsonl:2:", "not valid JSON"],
        ),
        (
            "layout",
            "{\"input_length\": 4, \"hash_ids\": [1, 2]}\n",
            &["--isl-block-size", "4"],
            &["layout.jsonl:1:", "`input_length`"],
        ),
        (
            "empty",
            "\n  \n",
            &["--custom-dataset-type", "bailian_trace"],
            &["empty.jsonl holds no trace lines"],
        ),
        (
            "unknown",
            "{}\n",
            &["--custom-dataset-type", "mooncake"],
            &["use mooncake_trace, bailian_trace, weka_trace, burst_gpt_trace or tracelab"],
        ),
        (
            "other",
            "{}\n",
            &["--custom-dataset-type", "single_turn"],
            &["does not reproduce"],
        ),
        (
            "random",
            "{\"input_length\": 3}\n",
            &["--prompt-corpus", "random"],
            &["no corpus to draw from"],
        ),
    ];
    for (name, trace, flags, says) in cases {
        let (code, err) = fails(name, trace, flags);
        assert_eq!(code, 2, "{name}: {err}");
        for s in says {
            assert!(err.contains(s), "{name}: {err}");
        }
    }

    // A missing file.
    let o = kvbust()
        .args(["synth", "--input-file", "/nonexistent/trace.jsonl"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/trace.jsonl"));
}

#[test]
fn mixed_sessions_and_verbatim_turns() {
    let (code, err) = fails(
        "mixed",
        "{\"session_id\": \"s\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n{\"session_id\": \"s\", \"input_length\": 5}\n",
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("mixed.jsonl:2:") && err.contains("session \"s\""),
        "{err}"
    );

    // Verbatim turns come through byte for byte (member order kept), text turns verbatim.
    let path = scratch("verbatim.jsonl");
    std::fs::write(
        &path,
        "{\"session_id\": \"a\", \"payload\": {\"z\": 1, \"a\": [2]}, \"output_length\": 2}\n{\"text_input\": \"hello\", \"timestamp\": 5.0, \"extra\": {\"b\": 1, \"a\": 2}}\n",
    )
    .unwrap();
    let lines = run_lines(
        vec![
            "--input-file".into(),
            path.display().to_string(),
            "--random-seed".into(),
            "1".into(),
        ],
        &scratch("verbatim.out"),
    );
    let raw = std::fs::read_to_string(scratch("verbatim.out")).unwrap();
    assert!(raw.contains(r#""raw_payload":{"z": 1, "a": [2]}"#), "{raw}");
    assert!(raw.contains(r#""extra_body":{"b": 1, "a": 2}"#), "{raw}");
    assert_eq!(lines[0]["session_id"], "a");
    assert_eq!(lines[0]["turns"][0]["max_tokens"], 2);
    assert_eq!(lines[1]["session_id"], "session_000000");
    assert_eq!(lines[1]["turns"][0]["text"], "hello");
    assert!(raw.contains(r#""timestamp":5.0"#), "{raw}");
}

#[test]
fn coding_corpus_trace_vector_byte_exact() {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth/coding.json"),
    )
    .unwrap();
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        cases: std::collections::HashMap<String, RawCase<'a>>,
    }
    let raw: Top = serde_json::from_str(&text).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let case = &v["cases"]["coding_mooncake_trace"];
    let trace = write_trace("coding_mooncake", &raw.cases["coding_mooncake_trace"].trace);
    let mut argv = vec!["--input-file".to_owned(), trace.display().to_string()];
    argv.extend(
        case["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned()),
    );
    let got = run_lines(argv, &scratch("coding_mooncake.out.jsonl"));
    let want = case["conversations"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g["session_id"], w["session_id"]);
        for (a, b) in g["turns"]
            .as_array()
            .unwrap()
            .iter()
            .zip(w["turns"].as_array().unwrap())
        {
            let t = a["text"].as_str().unwrap();
            assert_eq!(
                hex::encode(Sha256::digest(t.as_bytes())),
                b["text_sha256"].as_str().unwrap(),
                "{}: {t:.120}",
                w["session_id"]
            );
            assert_eq!(a["max_tokens"], b["max_tokens"]);
            assert_eq!(a["timestamp"], b["timestamp"]);
        }
    }
}

/// A gzipped trace reads as its text; its hash ids are scoped by the compressed file's sha256,
/// as AIPerf hashes the file on disk, so hashed blocks differ from the plain file's while
/// everything else (sessions, lengths, schedule, plain prompts) is the same.
#[test]
fn gzipped_traces_read_like_plain_ones() {
    let text = "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 12, \"hash_ids\": [1, 2, 3]}\n{\"timestamp\": 900, \"input_length\": 20, \"output_length\": 5}\n";
    let plain = scratch("gz-plain.jsonl");
    std::fs::write(&plain, text).unwrap();
    let gz = scratch("gz-trace.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, text.as_bytes()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let run = |input: &Path, out: &str| {
        let argv: Vec<String> = [
            "--input-file",
            input.to_str().unwrap(),
            "--isl-block-size",
            "16",
        ]
        .into_iter()
        .chain(["--random-seed", "7"])
        .map(String::from)
        .collect();
        run_lines(argv, &scratch(out))
    };
    let (a, b) = (run(&plain, "gz-a.out"), run(&gz, "gz-b.out"));
    assert_eq!(a.len(), 2);
    assert_eq!(b.len(), 2);
    for k in ["max_tokens", "timestamp"] {
        assert_eq!(a[0]["turns"][0][k], b[0]["turns"][0][k]);
    }
    assert_ne!(
        a[0]["turns"][0]["text"], b[0]["turns"][0]["text"],
        "another hash scope"
    );
    assert_eq!(
        a[1]["turns"][0]["text"], b[1]["turns"][0]["text"],
        "plain prompt, same stream"
    );
}
