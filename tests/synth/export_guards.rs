//! Exports never fail silently: `kvbust synth` refuses what the consumer would reject, and
//! warns about what it would drop, through the binary as a user runs it.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use crate::synth_common;
use std::path::PathBuf;
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    synth_common::scratch("export-guards", name)
}

fn synth(args: &[&str]) -> Output {
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            p.env_remove(k);
        }
    }
    p.arg("synth").args(args).output().expect("kvbust runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// vLLM's `--custom-output-len -1` raises on a row without `output_tokens`.
#[test]
fn vllm_custom_without_osl_is_refused_with_exit_64_naming_osl() {
    let out_file = scratch("no-osl.jsonl");
    let base = [
        "--isl",
        "16",
        "--num-dataset-entries",
        "2",
        "--format",
        "vllm-custom",
    ];
    let mut args = base.to_vec();
    args.extend(["-o", out_file.to_str().unwrap()]);
    let out = synth(&args);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("--osl"), "{}", stderr(&out));
    assert!(!out_file.exists(), "no output file is written");

    args.extend(["--osl", "5"]);
    let out = synth(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert!(
        text.lines().all(|l| l.contains("\"output_tokens\":5")),
        "{text}"
    );
}

/// vLLM's ShareGPT loader drops prompts over 1,024 tokens without a word.
#[test]
fn sharegpt_warns_when_prompts_exceed_what_vllm_keeps() {
    let out_file = scratch("long.json");
    let out = synth(&[
        "--isl",
        "1100",
        "--osl",
        "4",
        "--num-dataset-entries",
        "2",
        "--format",
        "sharegpt",
        "-o",
        out_file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning: 2 of 2 sharegpt entries have a first prompt over 1024 tokens"),
        "{err}"
    );
    assert!(err.contains("--sharegpt-output-len"), "{err}");

    let out = synth(&[
        "--isl",
        "100",
        "--osl",
        "4",
        "--num-dataset-entries",
        "2",
        "--format",
        "sharegpt",
        "-o",
        out_file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

/// `warmup_isolation_system` over a synthetic dataset without a system prompt failed every
/// synthesized request with a 500; now `kvbust serve` refuses to start.
#[test]
fn warmup_isolation_system_without_a_system_prompt_refuses_to_start() {
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            p.env_remove(k);
        }
    }
    let out = p
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(["--cache-bust", "warmup_isolation_system"])
        .env("KVBUST_SYNTH__DATASET__NUM_DATASET_ENTRIES", "2")
        .output()
        .expect("kvbust runs");
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("synth.dataset") && err.contains("system prompt"),
        "{err}"
    );
}
