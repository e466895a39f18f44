//! The command line as a user meets it: completions, and help that lists what flags take.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::process::Command;

fn kvbust(args: &[&str]) -> std::process::Output {
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            p.env_remove(k);
        }
    }
    p.args(args).output().expect("kvbust runs")
}

#[test]
fn completions_print_a_script_for_the_shell() {
    let out = kvbust(&["completions", "bash"]);
    assert_eq!(out.status.code(), Some(0));
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("complete -F _kvbust"), "{script}");
    for sub in [
        "serve",
        "mock",
        "synth",
        "marker",
        "config",
        "healthcheck",
        "report",
    ] {
        assert!(script.contains(sub), "{sub}");
    }
    let out = kvbust(&["completions", "zsh"]);
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .starts_with("#compdef kvbust"));
    assert_eq!(kvbust(&["completions", "cmd"]).status.code(), Some(2));
}

/// `kvbust completions bash | head`: the reader is gone before kvbust writes (a socket whose
/// other end is closed, so the write fails with EPIPE every time, not only when the reader
/// wins a race). Before: a BrokenPipe panic and its backtrace, exit 101.
#[test]
fn completions_into_a_closed_pipe_end_quietly() {
    use std::os::unix::net::UnixStream;
    let (ours, theirs) = UnixStream::pair().unwrap();
    drop(ours);
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            p.env_remove(k);
        }
    }
    let out = p
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs,
        )))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn serve_help_lists_the_cache_bust_values_and_the_upstream_root() {
    let out = kvbust(&["serve", "--help"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("warmup_isolation_first_turn"), "{text}");
    assert!(text.contains("not the /v1 base URL"), "{text}");
}

/// `kvbust mock` with `mock.served_model_names` set says at start which names it serves (the
/// ones `/v1/models` lists and the only ones it accepts), not the fallback `mock.model`.
#[test]
fn mock_logs_its_served_model_names_at_start() {
    use std::io::{BufRead, BufReader};
    let config = crate::common::test_dir().join("mock-served.toml");
    std::fs::write(
        &config,
        "[mock]\nserved_model_names = [\"qwen\", \"qwen-lora\"]\n",
    )
    .unwrap();
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") || k == "RUST_LOG" {
            p.env_remove(k);
        }
    }
    let mut child = p
        .args(["mock", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kvbust runs");
    // Lines until the start line (or the end of stderr, should the mock not start).
    let mut seen = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let done = line.contains("kvbust mock model server");
        seen.push(line);
        if done {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_file(&config).ok();
    let start = seen.last().cloned().unwrap_or_default();
    assert!(
        start.contains("kvbust mock model server"),
        "no start line: {seen:?}"
    );
    assert!(start.contains("qwen,qwen-lora"), "{start}");
    assert!(!start.contains("kvbust-mock"), "{start}");
}
