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

#[test]
fn serve_help_lists_the_cache_bust_values_and_the_upstream_root() {
    let out = kvbust(&["serve", "--help"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("warmup_isolation_first_turn"), "{text}");
    assert!(text.contains("not the /v1 base URL"), "{text}");
}
