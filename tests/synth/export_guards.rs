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

/// vLLM's `--custom-output-len -1` raises on a row without `output_tokens`; the ShareGPT
/// loaders need each answer's length. A missing required flag is a usage error (exit 2) with
/// every format (vllm-custom exited 64 and sharegpt 2 before issue 31).
#[test]
fn a_format_without_its_required_osl_is_refused_with_exit_2_naming_osl() {
    for (format, name) in [("vllm-custom", "no-osl.jsonl"), ("sharegpt", "no-osl.json")] {
        let out_file = scratch(name);
        let mut args = vec![
            "--isl",
            "16",
            "--num-dataset-entries",
            "2",
            "--format",
            format,
            "-o",
            out_file.to_str().unwrap(),
        ];
        let out = synth(&args);
        assert_eq!(out.status.code(), Some(2), "{format}: {}", stderr(&out));
        assert!(stderr(&out).contains("--osl"), "{}", stderr(&out));
        assert!(!out_file.exists(), "no output file is written");
        args.extend(["--osl", "5"]);
        let out = synth(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let text = std::fs::read_to_string(scratch("no-osl.jsonl")).unwrap();
    assert!(
        text.lines().all(|l| l.contains("\"output_tokens\":5")),
        "{text}"
    );
}

/// `kvbust synth … | head`: the reader goes away after a line; kvbust ends quietly.
#[test]
fn a_closed_pipe_ends_synth_quietly() {
    use std::io::BufRead;
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            p.env_remove(k);
        }
    }
    // About 2 MB of output, far more than a pipe buffers.
    let mut child = p
        .args([
            "synth",
            "--isl",
            "2000",
            "--osl",
            "4",
            "--num-dataset-entries",
            "300",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kvbust runs");
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with('{'), "{first}");
    // The reader is dropped here, as `head` exits.
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(
        out.status.code() == Some(0) || out.status.code().is_none(),
        "{:?}: {err}",
        out.status
    );
    assert!(!err.to_lowercase().contains("broken pipe"), "{err}");
    assert!(
        !err.contains("kvbust synth: 300 conversations"),
        "no summary for a cut write: {err}"
    );
}

/// The end of a run says what was written; openai-chat without --model warns of its placeholder.
#[test]
fn synth_ends_with_a_summary_line_and_warns_of_the_placeholder_model() {
    let out_file = scratch("bodies.jsonl");
    let mut args = vec![
        "--isl",
        "16",
        "--osl",
        "3",
        "--num-dataset-entries",
        "4",
        "--format",
        "openai-chat",
        "-o",
        out_file.to_str().unwrap(),
    ];
    let out = synth(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("warning: no --model"), "{err}");
    let size = std::fs::metadata(&out_file).unwrap().len();
    let want = format!(
        "kvbust synth: 4 conversations, 4 turns, 12 output tokens requested; {size} bytes to {}",
        out_file.display()
    );
    assert!(err.contains(&want), "{want} in {err}");
    args.extend(["--model", "qwen"]);
    let out = synth(&args);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    // A --bench-compat job's line counts its requests and their prompt tokens.
    let bench_file = scratch("bench.jsonl");
    let out = synth(&[
        "--bench-compat",
        "vllm",
        "--random-input-len",
        "16",
        "--random-output-len",
        "2",
        "--num-prompts",
        "3",
        "-o",
        bench_file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let prompt: u64 = std::fs::read_to_string(&bench_file)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["prompt_len"]
                .as_u64()
                .unwrap()
        })
        .sum();
    let want =
        format!("kvbust synth: 3 requests, {prompt} prompt tokens, 6 output tokens requested;");
    assert!(stderr(&out).contains(&want), "{want} in {}", stderr(&out));
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

/// The contract: a progress bar on a terminal, none when piped (a spinner for a trace replay,
/// whose length is known only once read). `script` (util-linux) gives kvbust a terminal.
#[test]
fn a_progress_bar_shows_on_a_terminal_and_never_when_piped() {
    let trace = scratch("bar-trace.jsonl");
    std::fs::write(
        &trace,
        "{\"input_length\": 20, \"output_length\": 2}\n{\"input_length\": 30, \"output_length\": 2}\n",
    )
    .unwrap();
    let out = scratch("bar.jsonl");
    let bin = env!("CARGO_BIN_EXE_kvbust");
    let runs = [
        (
            format!(
                "--isl 16 --osl 2 --num-dataset-entries 20 -o {}",
                out.display()
            ),
            "synthesizing 1/20 conversations",
        ),
        (
            format!("--input-file {} -o {}", trace.display(), out.display()),
            "replaying the trace",
        ),
    ];
    for (args, drawn) in runs {
        let mut p = Command::new("script");
        for (k, _) in std::env::vars() {
            if k.starts_with("KVBUST_") {
                p.env_remove(k);
            }
        }
        let tty = p
            .args(["-qec", &format!("{bin} synth {args}"), "/dev/null"])
            .output()
            .expect("script (util-linux) runs");
        let shown = String::from_utf8_lossy(&tty.stdout);
        assert_eq!(tty.status.code(), Some(0), "{shown}");
        assert!(shown.contains(drawn), "{drawn}: {shown}");
        assert!(
            shown.contains("kvbust synth: 2") || shown.contains("kvbust synth: 20"),
            "{shown}"
        );
        let piped = synth(&args.split(' ').collect::<Vec<_>>());
        assert_eq!(piped.status.code(), Some(0), "{}", stderr(&piped));
        let err = stderr(&piped);
        assert!(
            !err.contains(drawn) && !err.contains('\r'),
            "no bar when piped: {err}"
        );
        assert!(err.contains("kvbust synth: "), "the summary line: {err}");
    }
}
