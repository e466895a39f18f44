//! `kvbust synth agentic-code` through the binary against AIPerf 0.13.0's own runs:
//! trace_tools.json's three `dataset.jsonl` files row for row and byte for byte, and
//! agentic_code_extra.json's (custom configs, restart splits, turns mode, the bundled default,
//! a manifest as config, 1,000 sessions) with `manifest.json` and `quality.json` byte-equal; then
//! the bad inputs (flag or key named, exit 2 or 64, no file left).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::synth_common;

fn kvbust() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvbust"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// Runs `kvbust synth agentic-code ARGV -o DIR/dataset.jsonl` in a fresh folder.
fn generate(name: &str, argv: &[String], config: Option<(&str, &str)>) -> PathBuf {
    let dir = synth_common::fresh_scratch("agentic-code", name);
    let mut args: Vec<String> = vec!["synth".into(), "agentic-code".into()];
    args.extend_from_slice(argv);
    if let Some((file, json)) = config {
        let path = dir.join("config").join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, json).unwrap();
        args.extend(["--config".into(), path.display().to_string()]);
    }
    let out = dir.join("dataset.jsonl");
    args.extend(["-o".into(), out.display().to_string()]);
    let o = kvbust().args(&args).output().unwrap();
    assert!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    dir
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[test]
fn trace_tools_vectors_byte_equal() {
    let v = synth_common::read_json("trace_tools.json");
    let cases = v["agentic_code"].as_object().unwrap();
    assert_eq!(cases.len(), 3);
    for (name, case) in cases {
        let dir = generate(name, &strings(&case["argv"]), None);
        let raw = std::fs::read(dir.join("dataset.jsonl")).unwrap();
        let rows: Vec<Value> = raw
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        let want = case["dataset_jsonl"].as_array().unwrap();
        assert_eq!(rows.len(), want.len(), "{name}: rows");
        for (i, (g, w)) in rows.iter().zip(want).enumerate() {
            assert_eq!(g, w, "{name}: row {i}");
        }
        assert_eq!(sha(&raw), case["dataset_jsonl_sha256"], "{name}: bytes");
        replays_as_mooncake(name, &dir, &rows);
    }
}

/// The written trace replays through `kvbust synth --custom-dataset-type mooncake_trace`: one
/// conversation per session, one turn per row with its output length as max_tokens.
fn replays_as_mooncake(name: &str, dir: &Path, rows: &[Value]) {
    let out = dir.join("replay.jsonl");
    let o = kvbust()
        .args([
            "synth",
            "--custom-dataset-type",
            "mooncake_trace",
            "--random-seed",
            "1",
        ])
        .arg("--input-file")
        .arg(dir.join("dataset.jsonl"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let turns: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .flat_map(|l| {
            let c: Value = serde_json::from_str(l).unwrap();
            c["turns"].as_array().unwrap().clone()
        })
        .collect();
    assert_eq!(turns.len(), rows.len(), "{name}: replayed turns");
    let mut by_session: Vec<&Value> = rows.iter().collect();
    // Conversations keep first-appearance order, rows stay in order within a session.
    let order: Vec<&str> = {
        let mut seen: Vec<&str> = Vec::new();
        for r in rows {
            let s = r["session_id"].as_str().unwrap();
            if !seen.contains(&s) {
                seen.push(s);
            }
        }
        seen
    };
    by_session.sort_by_key(|r| order.iter().position(|s| *s == r["session_id"]).unwrap());
    for (t, r) in turns.iter().zip(by_session) {
        assert_eq!(t["max_tokens"], r["output_length"], "{name}");
        assert!(!t["text"].as_str().unwrap().is_empty(), "{name}");
    }
}

#[test]
fn aiperf_runs_with_manifest_and_quality_byte_equal() {
    let v = synth_common::read_json("agentic_code_extra.json");
    let cases = v["cases"].as_object().unwrap();
    assert!(cases.len() >= 8);
    for (name, case) in cases {
        let config = case["config_file"]
            .as_str()
            .map(|file| (file, case["config_text"].as_str().unwrap()));
        let dir = generate(name, &strings(&case["argv"]), config);
        let raw = std::fs::read(dir.join("dataset.jsonl")).unwrap();
        assert_eq!(
            sha(&raw),
            case["dataset_jsonl_sha256"],
            "{name}: dataset.jsonl"
        );
        assert_eq!(
            raw.iter().filter(|&&b| b == b'\n').count() as u64,
            case["rows"]
        );
        for file in ["manifest_json", "quality_json"] {
            let got = std::fs::read_to_string(dir.join(file.replace('_', "."))).unwrap();
            let want = case[file].as_str().unwrap();
            if got != want {
                let at = got
                    .bytes()
                    .zip(want.bytes())
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(want.len()));
                let from = at.saturating_sub(80);
                panic!(
                    "{name}: {file} differs at byte {at}\n got: {}\nwant: {}",
                    &got[from..(at + 80).min(got.len())],
                    &want[from..(at + 80).min(want.len())]
                );
            }
        }
    }
}

/// Runs kvbust expecting `code`; checks no output (nor manifest) was written in `dir`.
fn refused<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(
    args: &[S],
    dir: &Path,
    code: i32,
) -> String {
    let o = kvbust().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file() && e.file_name() != "bad.json")
        .collect();
    assert!(left.is_empty(), "{args:?}: left {left:?}");
    err
}

#[test]
fn bad_agentic_code_input_is_refused() {
    let dir = synth_common::fresh_scratch("agentic-code", "bad");
    let out = dir.join("dataset.jsonl");
    let o = out.to_str().unwrap();
    let base = ["synth", "agentic-code", "-o", o];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| (*s).to_owned()).collect()
    };
    let err = refused(&with(&["--num-sessions", "0"]), &dir, 2);
    assert!(err.contains("--num-sessions is 0"), "{err}");
    let err = refused(&with(&["--max-isl", "-5"]), &dir, 2);
    assert!(err.contains("--max-isl must be at least 1"), "{err}");
    let missing = dir.join("nowhere").join("dataset.jsonl");
    let err = refused(
        &["synth", "agentic-code", "-o", missing.to_str().unwrap()],
        &dir,
        2,
    );
    assert!(
        err.contains("-o/--output") && err.contains("does not exist"),
        "{err}"
    );
    let cfg = dir.join("bad.json");
    let c = cfg.to_str().unwrap();
    for (json, says) in [
        (
            r#"{"cache": {"layer2": {"mean": 10, "median": 5}, "layer_3": 1}}"#,
            "unknown key cache.layer_3",
        ),
        (
            r#"{"generation_length": {"mean": 100, "median": 300}}"#,
            "must be >= median",
        ),
        (
            r#"{"turns": {"mean": 4, "median": 3, "min": 1, "max": 9}, "reset": {}}"#,
            "turns mode cannot be combined with reset",
        ),
        ("[1, 2]", "must be a JSON object"),
    ] {
        std::fs::write(&cfg, json).unwrap();
        let err = refused(&with(&["--config", c]), &dir, 64);
        assert!(
            err.contains("--config") && err.contains(says),
            "{json}: {err}"
        );
    }
    // Without a reset key a turns config turns reset off, as AIPerf's model does.
    std::fs::write(
        &cfg,
        r#"{"turns": {"mean": 4, "median": 3, "min": 1, "max": 9}}"#,
    )
    .unwrap();
    let ok = kvbust()
        .args(with(&["--config", c, "--num-sessions", "3"]))
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        out.exists() && dir.join("manifest.json").exists() && dir.join("quality.json").exists()
    );
    // One summary line: sessions and rows, their tokens summed from the written trace, its
    // bytes, the time.
    let text = std::fs::read_to_string(&out).unwrap();
    let rows: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sum = |k: &str| -> i64 { rows.iter().map(|r| r[k].as_i64().unwrap()).sum() };
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let want = format!(
        "kvbust synth agentic-code: {} sessions, {} rows, {} input tokens, {} output tokens; {} \
         bytes to {} (+ manifest.json, quality.json) in ",
        manifest["num_sessions"],
        rows.len(),
        sum("input_length"),
        sum("output_length"),
        text.len(),
        out.display()
    );
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(err.contains(&want), "{want} in {err}");
}
