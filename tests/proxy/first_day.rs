//! Issue 31 "Fail at start": mistakes in a setup are refused when kvbust starts, not at the
//! first request: a broken `[synth.dataset] input_file`, a readiness that waits for the synth
//! dataset, a proxy loop (at start, and per request through `via`), and the served-models check.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;

use crate::common::*;
use http::StatusCode;
use kvbust::config::Config;
use kvbust::metrics::Metrics;
use kvbust::runtime::SharedState;

fn kvbust() -> Command {
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            p.env_remove(k);
        }
    }
    p
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let p = test_dir().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A configuration whose dataset replays `input_file`.
fn dataset_config(name: &str, input_file: &std::path::Path) -> PathBuf {
    scratch(
        name,
        &format!(
            "[synth.dataset]\ninput_file = {:?}\n",
            input_file.display().to_string()
        ),
    )
}

#[test]
fn config_check_and_serve_refuse_a_missing_or_broken_input_file_with_exit_64() {
    let missing = test_dir().join("no-such-trace.jsonl");
    let broken = scratch("broken.jsonl", "{\"input_length\": \"lots\"}\n");
    for (what, trace) in [("missing", missing), ("broken", broken)] {
        let cfg = dataset_config(&format!("{what}.toml"), &trace);
        let check = kvbust()
            .args(["config", "check", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        assert_eq!(check.status.code(), Some(64), "{what}: {}", stderr(&check));
        assert!(
            stderr(&check).contains("synth.dataset.input_file"),
            "{what}: {}",
            stderr(&check)
        );
        // `serve` refuses before it binds anything.
        let serve = kvbust()
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap();
        assert_eq!(serve.status.code(), Some(64), "{what}: {}", stderr(&serve));
        assert!(stderr(&serve).contains("synth.dataset.input_file"));
    }
    let good = scratch(
        "good.jsonl",
        "{\"input_length\": 12, \"output_length\": 2}\n",
    );
    let cfg = dataset_config("good.toml", &good);
    let check = kvbust()
        .args(["config", "check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
}

#[test]
fn readiness_waits_for_the_synth_dataset() {
    let mut cfg = Config::default();
    // Readiness ignores the upstream here, so only the dataset can hold it back.
    cfg.upstream.health_probe = false;
    cfg.synth.dataset = Some(kvbust::synth::SynthParams::default());
    let rt = SharedState::new(Arc::new(cfg), Metrics::new());
    let why = rt.readiness().unwrap_err();
    assert!(why.contains("synth.dataset"), "{why}");
    rt.dataset_built(false);
    let why = rt.readiness().unwrap_err();
    assert!(why.contains("failed to build"), "{why}");
    rt.dataset_built(true);
    assert_eq!(rt.readiness(), Ok(()));
}

#[test]
fn an_upstream_that_is_kvbusts_own_listen_address_is_refused_at_start() {
    // A port the OS just handed out and took back: free for kvbust to listen on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    for upstream in [
        format!("http://127.0.0.1:{port}"),
        format!("http://localhost:{port}/"),
    ] {
        let out = kvbust()
            .args([
                "serve",
                "--admin-listen",
                "127.0.0.1:0",
                "--listen",
                &listen,
            ])
            .args(["--upstream", &upstream])
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{upstream}: {err}");
        assert!(
            err.contains("upstream.url") && err.contains("own data port"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn a_request_that_comes_back_through_the_same_kvbust_is_refused() {
    let h = start(|_| {}).await;
    let resp = chat(&h1(), &h, chat_body("hello", false, 2)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    let sent = h.mock.recorder().requests();
    let via = sent[0].headers["via"].to_str().unwrap().to_owned();
    assert_eq!(via, format!("1.1 {}", h.runtime.via));
    // The same request arriving again, as it would through a loop.
    let looped = post(
        &h.url("/v1/chat/completions"),
        chat_body("hello", false, 2),
        &[("via", &format!("1.1 nginx, {via}"))],
    );
    let resp = send(&h1(), looped).await;
    assert_eq!(resp.status(), StatusCode::LOOP_DETECTED);
    let v = json(resp).await;
    assert_eq!(v["error"]["code"], "proxy_loop", "{v}");
    assert_eq!(h.mock.recorder().requests().len(), 1, "not forwarded");
    // Another kvbust's entry is passed on, with this one's after it.
    let chained = post(
        &h.url("/v1/chat/completions"),
        chat_body("hello", false, 2),
        &[("via", "1.1 kvbust-00000000")],
    );
    let resp = send(&h1(), chained).await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    let sent = h.mock.recorder().requests();
    assert_eq!(
        sent[1].headers["via"],
        format!("1.1 kvbust-00000000, 1.1 {}", h.runtime.via).as_str()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn the_models_check_names_a_dataset_model_the_upstream_does_not_serve() {
    let h = start(|_| {}).await;
    let cfg = kvbust::config::UpstreamConfig::default();
    let url = kvbust::config::UpstreamUrl::parse(&format!("http://{}", h.mock_addr)).unwrap();
    let upstream = kvbust::upstream::client::Upstream::from_url(&url).unwrap();
    let tls = Arc::new(kvbust::upstream::client::tls_config(&cfg).unwrap());
    let client = kvbust::upstream::client::build_client(&cfg, tls, &upstream);
    let wanted = vec!["kvbust-mock".to_string(), "claude-opus".to_string()];
    let missing =
        kvbust::served_models::warn_unserved(h.runtime.clone(), upstream, client, wanted).await;
    assert_eq!(missing, ["claude-opus"]);
    h.shutdown().await;
}

// Issue 31 group 6: the documentation says what the code does.

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// A metric's family name: a histogram's samples end in `_bucket`, `_sum` and `_count`.
fn family(sample: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| sample.strip_suffix(s))
        .unwrap_or(sample)
}

#[tokio::test]
async fn the_readme_metrics_table_lists_every_kvbust_metric_and_every_one_the_dashboards_read() {
    let h = start(|_| {}).await;
    // A marked request, so that the marker counter has a sample.
    let marked = post(
        &h.url("/v1/chat/completions"),
        chat_body("count me", true, 2),
        &[("x-kvbust-target", "first_turn_prefix")],
    );
    let resp = send(&h1(), marked).await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    let exposition = metrics_text(&h).await;
    h.shutdown().await;
    // The metrics table moved from the README to the reference page beside the config file.
    let reference = repo_file("config/README.md");
    // The table rows of "What kvbust measures".
    let table: String = reference
        .lines()
        .skip_while(|l| !l.starts_with("## What kvbust measures"))
        .take_while(|l| !l.starts_with("| API |"))
        .filter(|l| l.starts_with('|'))
        .collect();
    let mut names: std::collections::BTreeSet<String> = exposition
        .lines()
        .filter(|l| l.starts_with("kvbust_"))
        .map(|l| family(&l[..l.find(['{', ' ']).unwrap()]).to_string())
        .collect();
    for file in [
        "deploy/grafana/kvbust.json",
        "deploy/k8s/overlays/monitoring/prometheusrule.yaml",
    ] {
        let text = repo_file(file);
        for (i, _) in text.match_indices("kvbust_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.insert(family(&name).to_string());
        }
    }
    assert!(names.contains("kvbust_markers_injected_total"));
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !table.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in config/README.md's metrics table: {missing:?}"
    );
}

#[test]
fn the_config_file_lists_every_trace_type_for_custom_dataset_type() {
    use kvbust::synth::dataset::trace_kind::TraceKind;
    let all = [
        TraceKind::MooncakeTrace,
        TraceKind::BailianTrace,
        TraceKind::WekaTrace,
        TraceKind::BurstGptTrace,
        TraceKind::Tracelab,
    ];
    // A new type fails to compile here until it is listed above.
    for k in all {
        match k {
            TraceKind::MooncakeTrace
            | TraceKind::BailianTrace
            | TraceKind::WekaTrace
            | TraceKind::BurstGptTrace
            | TraceKind::Tracelab => {}
        }
    }
    let toml = repo_file("config/kvbust.toml");
    let start = toml.find("# custom_dataset_type").unwrap();
    let comment: String = toml[start..].lines().take(2).collect();
    for k in all {
        assert!(comment.contains(k.as_str()), "{}: {comment}", k.as_str());
    }
}

#[test]
fn the_readme_puts_kvbust_on_path_and_its_examples_wait_and_make_folders() {
    let readme = repo_file("README.md");
    assert!(readme.contains("`cargo install --locked --path .`"));
    let completions = readme
        .lines()
        .position(|l| l.starts_with("kvbust completions bash >"))
        .unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    assert!(
        lines[completions - 1].starts_with("mkdir -p ~/.local/share/bash-completion/completions"),
        "{}",
        lines[completions - 1]
    );
    // The access-log example (in the reference page, with the metrics) greps only once its
    // three lines are written: a line waits for the cache model's figure, so a fixed sleep is
    // not enough on a loaded machine.
    let reference = repo_file("config/README.md");
    let lines: Vec<&str> = reference.lines().collect();
    let grep = lines
        .iter()
        .position(|l| l.starts_with("grep ' access_log: ' kvbust.log"))
        .unwrap();
    assert!(
        lines[grep - 1].starts_with("until [ \"$(grep -c ' access_log: ' kvbust.log)\" -ge 3 ]"),
        "{}",
        lines[grep - 1]
    );
    assert!(readme.contains("data port 8080 on every interface, `0.0.0.0:8080` by default"));
    let toml = repo_file("config/kvbust.toml");
    assert!(toml.contains("addr = \"0.0.0.0:8080\""));
}

/// The README's target table lists `Target::ALL`, in order, and each cell shows the marker
/// `build_marker` makes for that target and phase (`D` for the digest; `unchanged` for none).
#[test]
fn readme_target_table_is_every_target_and_its_markers() {
    use kvbust::cachebust::{build_marker, digest, DigestInputs, Phase, Target};
    let readme = repo_file("README.md");
    let rows: Vec<Vec<String>> = readme
        .lines()
        .skip_while(|l| !l.starts_with("| target | warmup request | profiling request |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0].trim_matches('`')).collect();
    assert_eq!(names, Target::ALL.map(Target::as_str));
    let inputs = DigestInputs {
        benchmark_id: "b".into(),
        recycle_pass: 0,
        trajectory_index: 0,
        trace_id: "t".into(),
    };
    let d = digest(&inputs);
    for (row, target) in rows.iter().zip(Target::ALL) {
        for (cell, phase) in row[1..].iter().zip([Phase::Warmup, Phase::Profiling]) {
            match build_marker(target, phase, &inputs) {
                None => assert_eq!(cell, "unchanged", "{target} {phase:?}"),
                Some(m) => {
                    let shown = format!("`{}`", m.replace(&d, "D").replace('\n', "\\n"));
                    assert!(
                        cell.starts_with(&shown),
                        "{target} {phase:?}: {cell} vs {shown}"
                    );
                    let side = if target.is_prefix() {
                        "before"
                    } else {
                        "after"
                    };
                    assert!(cell.contains(side), "{target} {phase:?}: {cell}");
                }
            }
        }
    }
}
