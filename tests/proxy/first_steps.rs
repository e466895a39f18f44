//! Issue 43's small things, as a new user meets them: an env-variable typo named as the
//! variable with the nearest valid one, an upstream host name that does not resolve logged at
//! WARN, and an empty `x-kvbust-trace-id` refused rather than run with no trace id.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::common::*;
use http::StatusCode;

fn kvbust() -> Command {
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") || k == "RUST_LOG" {
            p.env_remove(k);
        }
    }
    p
}

#[test]
fn an_env_variable_typo_names_the_variable_and_the_nearest_one() {
    let out = kvbust()
        .args(["config", "check"])
        .env("KVBUST_CACHE_BUST__TARGETT", "system_suffix")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("environment variable KVBUST_CACHE_BUST__TARGETT"),
        "{err}"
    );
    assert!(
        err.contains("did you mean KVBUST_CACHE_BUST__TARGET (cache_bust.target)?"),
        "{err}"
    );
}

/// A typo in the upstream's host name: `/readyz` stays 503 for ever, so the reason is a WARN
/// line (at once, then once a minute), not a single INFO line among the start-up lines.
#[test]
fn an_upstream_host_that_does_not_resolve_is_logged_at_warn() {
    let mut child = kvbust()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            // `.invalid` never resolves (RFC 2606).
            "--upstream",
            "http://kvbust-no-such-host.invalid:8000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut warned = None;
    // Read until the line comes (the first probe runs at start); a closed stderr ends it.
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        if line.contains("does not resolve") {
            warned = Some(line);
            break;
        }
        seen.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    let line = warned.unwrap_or_else(|| panic!("no such line in:\n{}", seen.join("\n")));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("upstream.url"), "{line}");
    assert!(line.contains("/readyz answers 503"), "{line}");
    assert!(
        !seen.iter().any(|l| l.contains("waiting for the upstream")),
        "said once, at WARN: {seen:?}"
    );
}

/// `curl -H 'x-kvbust-trace-id:'` sends no header at all (curl's way to remove one); a client
/// that does send it empty gets a 400, not a request marked as if it had sent none.
#[tokio::test]
async fn an_empty_trace_id_header_is_refused() {
    let h = start(|c| {
        c.cache_bust.target = kvbust::cachebust::Target::FirstTurnPrefix;
    })
    .await;
    for (name, client) in clients() {
        for value in ["", "   "] {
            let req = post(
                &h.url("/v1/chat/completions"),
                chat_body("hello", false, 2),
                &[("x-kvbust-trace-id", value)],
            );
            let resp = send(&client, req).await;
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{name} {value:?}");
            let body = json(resp).await;
            assert_eq!(body["error"]["code"], "invalid_digest_header", "{body}");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("x-kvbust-trace-id must not be empty"),
                "{message}"
            );
        }
    }
}
