//! AIPerf 0.13.0's trace tooling through the `kvbust` binary, against `trace_tools.json` (made
//! by AIPerf itself): the `--synthesis-*` multipliers conversation for conversation,
//! `kvbust analyze-trace`'s JSON against `aiperf analyze-trace`'s, and the bad inputs each
//! refuses (the flag named, exit 2, no output file left behind).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::synth_common;
use crate::traces::python_dumps;

fn scratch(name: &str) -> PathBuf {
    synth_common::scratch("trace-tools", name)
}

fn kvbust() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvbust"))
}

/// The fixture, and each case's trace lines as their raw JSON text (for AIPerf's bytes).
fn fixture() -> (Value, String) {
    let text = std::fs::read_to_string(synth_common::fixture("trace_tools.json")).unwrap();
    (serde_json::from_str(&text).unwrap(), text)
}

/// `json.dumps(line) + "\n"` per line, the file AIPerf read (its sha256 scopes hash ids).
fn write_trace(name: &str, raw_lines: &[&RawValue]) -> PathBuf {
    let path = scratch(&format!("{name}.jsonl"));
    let text: String = raw_lines
        .iter()
        .map(|l| python_dumps(l.get()) + "\n")
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// The raw trace lines of `section.name` in the fixture text.
fn raw_trace<'a>(text: &'a str, section: &str, name: &str) -> Vec<&'a RawValue> {
    #[derive(serde::Deserialize)]
    struct Case<'a> {
        #[serde(borrow)]
        trace: Vec<&'a RawValue>,
    }
    let top: std::collections::HashMap<&str, &RawValue> = serde_json::from_str(text).unwrap();
    let cases: std::collections::HashMap<&str, &RawValue> =
        serde_json::from_str(top[section].get()).unwrap();
    let case: Case = serde_json::from_str(cases[name].get()).unwrap();
    case.trace
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

fn run_ok(args: &[String]) -> std::process::Output {
    let o = kvbust().args(args).output().unwrap();
    assert!(
        o.status.success(),
        "kvbust {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

#[test]
fn synthesis_vectors_through_the_cli() {
    let (v, text) = fixture();
    let cases = v["synthesis"].as_object().unwrap();
    assert_eq!(cases.len(), 6);
    for (name, case) in cases {
        let trace = write_trace(name, &raw_trace(&text, "synthesis", name));
        let out = scratch(&format!("{name}.out.jsonl"));
        let mut args: Vec<String> = vec![
            "synth".into(),
            "--input-file".into(),
            trace.display().to_string(),
            "--custom-dataset-type".into(),
            case["custom_dataset_type"].as_str().unwrap().into(),
            "-o".into(),
            out.display().to_string(),
        ];
        args.extend(strings(&case["argv"]));
        run_ok(&args);
        let got: Vec<Value> = std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let want = case["conversations"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{name}: conversations");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g["session_id"], w["session_id"], "{name}");
            let (gt, wt) = (
                g["turns"].as_array().unwrap(),
                w["turns"].as_array().unwrap(),
            );
            assert_eq!(gt.len(), wt.len(), "{name} {}", w["session_id"]);
            for (i, (a, b)) in gt.iter().zip(wt).enumerate() {
                let at = format!("{name} {} turn {i}", w["session_id"]);
                let text = a["text"].as_str().unwrap();
                assert_eq!(
                    hex::encode(Sha256::digest(text.as_bytes())),
                    b["text_sha256"].as_str().unwrap(),
                    "{at}: text differs\n got: {text:.300}\nwant: {:.300}",
                    b["text"].as_str().unwrap_or_default()
                );
                assert_eq!(a["max_tokens"], b["max_tokens"], "{at}");
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

/// Same keys, integers equal, floats equal to 1e-9 (relative to their size), recursively.
fn assert_close(at: &str, got: &Value, want: &Value) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            let gk: Vec<&String> = g.keys().collect();
            let wk: Vec<&String> = w.keys().collect();
            assert_eq!(gk, wk, "{at}: keys");
            for (k, wv) in w {
                assert_close(&format!("{at}.{k}"), &g[k], wv);
            }
        }
        (Value::Number(g), Value::Number(w)) => {
            assert_eq!(g.is_f64(), w.is_f64(), "{at}: int/float {g} vs {w}");
            let (a, b) = (g.as_f64().unwrap(), w.as_f64().unwrap());
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{at}: {a} vs {b}");
        }
        _ => assert_eq!(got, want, "{at}"),
    }
}

#[test]
fn analyze_trace_vectors_through_the_cli() {
    let (v, text) = fixture();
    let cases = v["analyze_trace"].as_object().unwrap();
    assert_eq!(cases.len(), 3);
    for (name, case) in cases {
        let trace = write_trace(name, &raw_trace(&text, "analyze_trace", name));
        let out = scratch(&format!("{name}.stats.json"));
        let _ = std::fs::remove_file(&out);
        let mut args = vec![
            "analyze-trace".to_owned(),
            trace.display().to_string(),
            "--output-file".into(),
            out.display().to_string(),
        ];
        args.extend(strings(&case["argv"]));
        let o = run_ok(&args);
        let report = String::from_utf8(o.stdout).unwrap();
        let total = case["stats"]["total_requests"].as_u64().unwrap();
        // The summary line on stderr: rows and tokens summed from the trace itself (a missing
        // length counts 0, as the analyzer's), the JSON's bytes, the time.
        let lines: Vec<Value> = std::fs::read_to_string(&trace)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let sum = |k: &str| -> i64 { lines.iter().map(|l| l[k].as_i64().unwrap_or(0)).sum() };
        let size = std::fs::metadata(&out).unwrap().len();
        let want = format!(
            "kvbust analyze-trace: {total} requests, {} input tokens, {} output tokens; {size} \
             bytes to {} in ",
            sum("input_length"),
            sum("output_length"),
            out.display()
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(lines.len() as u64, total, "{name}");
        assert!(err.contains(&want), "{name}: {want} in {err}");
        assert!(
            report.contains(&format!("Total requests:   {total}")),
            "{report}"
        );
        assert!(report.contains("Theoretical Hit Rates"), "{report}");
        let got: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_close(name, &got, &case["stats"]);
    }
}

/// Runs kvbust expecting a usage error; returns stderr and checks `out` was not written.
fn refused(args: &[&str], out: &Path) -> String {
    let _ = std::fs::remove_file(out);
    let o = kvbust().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(!out.exists(), "{args:?}: output left behind");
    err
}

#[test]
fn bad_multipliers_and_output_folders_are_refused() {
    let (_, text) = fixture();
    let trace = write_trace(
        "bad_input",
        &raw_trace(&text, "synthesis", "syn_prefix_len_2"),
    );
    let t = trace.to_str().unwrap();
    let out = scratch("bad_input.out.jsonl");
    let o = out.to_str().unwrap();
    for (flag, value, says) in [
        ("--synthesis-speedup-ratio", "-2", "above 0"),
        (
            "--synthesis-prefix-len-multiplier",
            "nan",
            "finite number above 0",
        ),
        ("--synthesis-prompt-len-multiplier", "0", "above 0"),
        ("--synthesis-output-len-multiplier", "-0.5", "0 or more"),
        ("--synthesis-prefix-root-multiplier", "0", "at least 1"),
    ] {
        let err = refused(
            &[
                "synth",
                "--input-file",
                t,
                "--random-seed",
                "1",
                flag,
                value,
                "-o",
                o,
            ],
            &out,
        );
        assert!(err.contains(flag) && err.contains(says), "{flag}: {err}");
    }
    // A multiplier needs a hash-id trace to reshape.
    let err = refused(
        &[
            "synth",
            "--isl",
            "10",
            "--synthesis-speedup-ratio",
            "2",
            "-o",
            o,
        ],
        &out,
    );
    assert!(
        err.contains("--synthesis-speedup-ratio applies to trace replay"),
        "{err}"
    );
    let missing = scratch("no-such-folder").join("stats.json");
    let err = refused(
        &[
            "analyze-trace",
            t,
            "--output-file",
            missing.to_str().unwrap(),
        ],
        &missing,
    );
    assert!(
        err.contains("--output-file") && err.contains("does not exist"),
        "{err}"
    );
    let err = refused(&["analyze-trace", t, "--block-size", "0"], &missing);
    assert!(err.contains("--block-size"), "{err}");
}

#[test]
fn a_bailian_trace_with_every_multiplier_keeps_float_timestamps() {
    let (_, text) = fixture();
    let trace = write_trace(
        "bailian_all",
        &raw_trace(&text, "synthesis", "syn_bailian_root_2"),
    );
    let out = scratch("bailian_all.out.jsonl");
    let args: Vec<String> = [
        "synth",
        "--input-file",
        trace.to_str().unwrap(),
        "--random-seed",
        "4",
        "--synthesis-speedup-ratio",
        "3",
        "--synthesis-prefix-len-multiplier",
        "1.5",
        "--synthesis-prefix-root-multiplier",
        "3",
        "--synthesis-prompt-len-multiplier",
        "0.5",
        "--synthesis-output-len-multiplier",
        "2",
        "--synthesis-max-osl",
        "50",
        "-o",
        out.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    run_ok(&args);
    let lines = std::fs::read_to_string(&out).unwrap();
    let mut turns = 0;
    for line in lines.lines() {
        let c: Value = serde_json::from_str(line).unwrap();
        for t in c["turns"].as_array().unwrap() {
            turns += 1;
            let ts = t["timestamp"].as_number().unwrap();
            assert!(ts.is_f64() && ts.as_f64().unwrap().fract() == 0.0, "{ts}");
            let m = t["max_tokens"].as_u64().unwrap();
            assert!((1..=50).contains(&m), "{m}");
        }
    }
    assert_eq!(turns, 14);
}

/// In a configuration file the same bounds give exit 64 naming the key, as does a model list
/// for a dataset whose requests all get one model.
#[test]
fn config_check_refuses_bad_multipliers_and_model_lists() {
    for (dataset, says) in [
        (
            "input_file = \"t.jsonl\"\nsynthesis_speedup_ratio = -1.0",
            "synth.dataset.synthesis_speedup_ratio",
        ),
        (
            "input_file = \"t.jsonl\"\nsynthesis_prefix_root_multiplier = 0",
            "synthesis_prefix_root_multiplier",
        ),
        ("isl = 10\nmodel = \"a,b\"", "must be one model name"),
    ] {
        let cfg = scratch("bad-config.toml");
        std::fs::write(&cfg, format!("[synth.dataset]\n{dataset}\n")).unwrap();
        let o = kvbust()
            .args(["config", "check", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{dataset}: {err}");
        assert!(
            err.contains("synth.dataset") && err.contains(says),
            "{dataset}: {err}"
        );
    }
}

/// A capture at `capture.block_size = 16` (its rows and its `.meta.json`, as the capture's own
/// `Meta` type writes it) replays and is analyzed at 16 without a flag, saying so on stderr;
/// the flag still wins. Before: 512, and "does not fit 3 hash_ids of 512 tokens".
#[test]
fn a_capture_replays_and_is_analyzed_at_its_own_block_size() {
    let trace = scratch("capture-16.jsonl");
    std::fs::write(
        &trace,
        "{\"session_id\":\"a1\",\"timestamp\":0,\"input_length\":40,\"output_length\":4,\"hash_ids\":[0,1,2]}\n\
         {\"session_id\":\"b2\",\"timestamp\":5,\"input_length\":36,\"output_length\":4,\"hash_ids\":[0,1,3]}\n",
    )
    .unwrap();
    let meta = kvbust::capture::file::Meta {
        format: kvbust::capture::file::FORMAT.into(),
        version: 1,
        start_unix_ms: 0,
        block_size: 16,
        key: None,
        chat_template: "none".into(),
        tokenizer: "qwen3".into(),
        min_sessions_per_shared_block: 0,
        rows: 2,
    };
    let meta_file = kvbust::capture::file::meta_path(&trace);
    assert_eq!(meta_file, scratch("capture-16.meta.json"));
    std::fs::write(&meta_file, serde_json::to_string(&meta).unwrap()).unwrap();
    let path = trace.display().to_string();
    let synth = |extra: &[&str]| {
        let mut args = vec![
            "synth",
            "--input-file",
            &path,
            "--custom-dataset-type",
            "mooncake_trace",
            "--random-seed",
            "7",
        ];
        args.extend_from_slice(extra);
        kvbust().args(&args).output().unwrap()
    };
    let o = synth(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "block size 16 from the capture's {} (--isl-block-size overrides it)",
            meta_file.display()
        )),
        "{err}"
    );
    // The same bytes as with the flag given.
    let flagged = synth(&["--isl-block-size", "16"]);
    assert!(flagged.status.success());
    assert_eq!(o.stdout, flagged.stdout);
    assert!(!String::from_utf8_lossy(&flagged.stderr).contains("from the capture's"));
    // The flag overrides the metadata: 3 blocks of 512 do not fit 40 tokens.
    let o = synth(&["--isl-block-size", "512"]);
    assert_eq!(o.status.code(), Some(2));

    let analyze = |extra: &[&str]| {
        let out = scratch(&format!("capture-16.stats{}.json", extra.len()));
        let mut args = vec!["analyze-trace".to_owned(), path.clone()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["--output-file".into(), out.display().to_string()]);
        let o = run_ok(&args);
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        (String::from_utf8_lossy(&o.stderr).into_owned(), json)
    };
    let (err, from_meta) = analyze(&[]);
    assert!(err.contains("block size 16 from the capture's"), "{err}");
    let (_, at_16) = analyze(&["--block-size", "16"]);
    let (err, at_512) = analyze(&[
        "--block-size",
        "512",
        "--custom-dataset-type",
        "mooncake_trace",
    ]);
    assert!(!err.contains("from the capture's"), "{err}");
    assert_eq!(from_meta, at_16);
    assert_ne!(from_meta, at_512, "the block size shows in the statistics");
}
