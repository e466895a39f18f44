//! `kvbust run` and `kvbust report FILE…|--runs` as a user runs them: the real binary against a
//! tiny admin server (port 0) that answers `POST /runs`, `POST /runs/NAME/close`, `GET /runs`,
//! `GET /runs/NAME`, `GET /config` and `GET /report` with canned JSON built from the report
//! types, and records every call (method, path, token, body) in order. Checked: the calls and
//! their bodies, the client's output passing through, the exit codes (the client's failure, a
//! verdict failing `--fail-on`, an unreachable port, a client that cannot start, a forwarded
//! SIGTERM), the saved run file read back, and runs side by side in every format with their
//! figures checked against the reports.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kvbust::report::{Isolation, Report, RunFile, RunSummary, Sweep, Verdict, RUN_FILE_SCHEMA};
use sha2::{Digest, Sha256};

use crate::report_cli::realistic;

/// One call the admin server saw.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    method: String,
    path: String,
    auth: Option<String>,
    body: String,
}

type Route = dyn Fn(&str, &str) -> (u16, String) + Send + Sync;

/// A server answering each request by `route(method, path)`, recording the calls, until a
/// request line `STOP` (the test's own, so it always ends).
struct Admin {
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Admin {
    fn start(route: Box<Route>) -> Admin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = calls.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line.starts_with("STOP") {
                    break;
                }
                let mut parts = line.split_whitespace();
                let method = parts.next().unwrap_or("").to_string();
                let path = parts.next().unwrap_or("").to_string();
                let (mut auth, mut length) = (None, 0usize);
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                        break;
                    }
                    let (k, v) = h.split_once(':').unwrap();
                    match k.to_ascii_lowercase().as_str() {
                        "authorization" => auth = Some(v.trim().to_string()),
                        "content-length" => length = v.trim().parse().unwrap(),
                        _ => {}
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                seen.lock().unwrap().push(Call {
                    method: method.clone(),
                    path: path.clone(),
                    auth,
                    body: String::from_utf8(body).unwrap(),
                });
                let (status, answer) = route(&method, &path);
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    answer.len()
                );
                stream.write_all(head.as_bytes()).unwrap();
                stream.write_all(answer.as_bytes()).unwrap();
            }
        });
        Admin {
            addr,
            thread: Some(thread),
            calls,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Ends the server; the calls it saw, in order.
    fn stop(mut self) -> Vec<Call> {
        TcpStream::connect(self.addr)
            .unwrap()
            .write_all(b"STOP\r\n")
            .unwrap();
        self.thread.take().unwrap().join().unwrap();
        self.calls.lock().unwrap().clone()
    }
}

const CONFIG: &str = "[admin]\naddr = \"127.0.0.1:9090\"\ntoken = \"[redacted]\"\n";

/// A closed run named `name` with `isolation` (and `warmup_share` under not requested).
fn closed(name: &str, isolation: Isolation, warmup_share: Option<f64>) -> Report {
    let mut r = realistic();
    r.run.name = name.into();
    r.run.ended_at = Some("2026-12-02T09:05:00.400Z".into());
    r.verdict = Verdict {
        isolation,
        reused_from_warmup_tokens: 0,
        cross_session_tokens: if isolation == Isolation::Breached {
            9_120
        } else {
            0
        },
        warmup_share,
        message: format!(
            "isolation {} in {name}: the canned sentence",
            isolation.as_str()
        ),
    };
    r
}

/// The admin port of a kvbust whose current run closes with `report`; `GET /report` answers
/// the same report.
fn serving(report: &Report) -> Admin {
    let json = serde_json::to_string(report).unwrap();
    let name = report.run.name.clone();
    Admin::start(Box::new(move |method, path| match (method, path) {
        ("POST", "/runs") => (200, serde_json::to_string(&realistic()).unwrap()),
        ("POST", p) if p == format!("/runs/{name}/close") => (200, json.clone()),
        ("GET", "/config") => (200, CONFIG.to_string()),
        ("GET", p) if p.starts_with("/report") => (200, json.clone()),
        _ => (404, "{\"error\":{\"message\":\"no such path\"}}".into()),
    }))
}

fn kvbust(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") || k == "NO_COLOR" {
            p.env_remove(k);
        }
    }
    p.envs(env.iter().copied()).stdin(Stdio::null());
    p.args(args).output().expect("kvbust runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `kvbust run --admin URL <flags> -- <command>`.
fn run(url: &str, flags: &[&str], command: &[&str]) -> Output {
    let mut args = vec!["run", "--admin", url];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(command);
    kvbust(&args, &[])
}

fn paths(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .map(|c| format!("{} {}", c.method, c.path))
        .collect()
}

#[test]
fn run_opens_runs_closes_saves_and_passes_the_output_through() {
    let report = closed("c8", Isolation::Held, None);
    // The report as the binary reads it back (floats parsed as serde_json parses them).
    let served: Report = serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
    let admin = serving(&report);
    let url = admin.url();
    let dir = crate::common::test_dir();
    let results = dir.join("results");
    let exe = env!("CARGO_BIN_EXE_kvbust");
    // The client: kvbust's own `report`, which reads the admin port while the run is open and
    // prints the report's JSON, so its call lands between open and close, and its output is
    // known byte for byte.
    let out = kvbust(
        &[
            "run",
            "--admin",
            &url,
            "--name",
            "c8",
            "--warmup-requests",
            "4",
            "--reset-upstream-cache",
            "--results-dir",
            results.to_str().unwrap(),
            "--",
            exe,
            "report",
            "--admin",
            &url,
            "--format",
            "json",
        ],
        &[("KVBUST_ADMIN__TOKEN", "s3cret-admin-token-for-tests")],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // The client's standard output, untouched: the report as served, indented.
    assert_eq!(
        text(&out.stdout),
        serde_json::to_string_pretty(&report).unwrap() + "\n"
    );
    // The verdict and a line per row follow, on standard error.
    let mut lines = err.lines();
    assert_eq!(
        lines.next(),
        Some(format!("kvbust run c8: {}", report.verdict.message).as_str()),
        "{err}"
    );
    for row in &served.rows {
        let line = lines.next().unwrap();
        let want = format!(
            "  {} × {}: {} requests, {} errors, - req/s; TTFT p50 {} ms, p99 {} ms; cached ",
            row.phase,
            row.target,
            row.requests,
            row.errors.count,
            kvbust_ms(row.latency.ttft_ms.p50.unwrap()),
            kvbust_ms(row.latency.ttft_ms.p99.unwrap()),
        );
        assert!(line.starts_with(&want), "{line}\n{want}");
        let rep =
            row.cached_tokens.reported.unwrap() as f64 / row.prompt_tokens.reported.unwrap() as f64;
        assert!(
            line.contains(&format!("{:.1}% reported", rep * 100.0)),
            "{line}"
        );
    }
    let saved = results.join("c8.json");
    assert_eq!(
        lines.next(),
        Some(format!("  saved {}", saved.display()).as_str())
    );

    let calls = admin.stop();
    assert_eq!(
        paths(&calls),
        [
            "POST /runs",
            "GET /report?wait=5000ms",
            "POST /runs/c8/close",
            "GET /config"
        ],
        "{calls:?}"
    );
    let token = Some("Bearer s3cret-admin-token-for-tests".to_string());
    assert_eq!(calls[0].auth, token, "mutating calls carry the token");
    assert_eq!(calls[2].auth, token);
    assert_eq!(
        (&calls[1].auth, &calls[3].auth),
        (&None, &None),
        "reads do not"
    );
    let open: serde_json::Value = serde_json::from_str(&calls[0].body).unwrap();
    assert_eq!(
        open,
        serde_json::json!({"name": "c8", "warmup_requests": 4, "reset_upstream_cache": true})
    );

    // The run file reads back: the report as closed, the command that ran, the digest of the
    // configuration as the port showed it.
    let file: RunFile = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    assert_eq!(file.kvbust_run, RUN_FILE_SCHEMA);
    assert_eq!(file.config_digest, hex::encode(Sha256::digest(CONFIG)));
    let command = file.report.run.command.clone().unwrap();
    assert_eq!(command[0], exe);
    assert_eq!(
        command[1..],
        ["report", "--admin", &url, "--format", "json"]
    );
    let mut back = file.report.clone();
    back.run.command = None;
    assert_eq!(back, served);
    // No temporary file left behind.
    assert_eq!(std::fs::read_dir(&results).unwrap().count(), 1);

    // And `kvbust report FILE` shows it whole, as the library renders it.
    let shown = kvbust(&["report", saved.to_str().unwrap()], &[]);
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown.stderr));
    assert_eq!(
        text(&shown.stdout),
        kvbust::report::render::table(&file.report)
    );
    assert!(text(&shown.stdout).starts_with(&report.verdict.message));
}

/// Milliseconds as the summary prints them (one decimal under 10, whole above).
fn kvbust_ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.1}")
    } else {
        let n = v.round() as u64;
        let digits = n.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    }
}

#[test]
fn run_exit_codes() {
    let ok = ["sh", "-c", "echo client-ran"];
    // (run, its verdict, warmup's share, flags, the client, the exit status wanted)
    type Case<'a> = (
        &'a str,
        Isolation,
        Option<f64>,
        &'a [&'a str],
        &'a [&'a str],
        i32,
    );
    let cases: [Case; 8] = [
        // The client's failure wins over the verdict.
        (
            "fails",
            Isolation::Breached,
            None,
            &[],
            &["sh", "-c", "exit 5"],
            5,
        ),
        ("breach", Isolation::Breached, None, &[], &ok, 3),
        (
            "never",
            Isolation::Breached,
            None,
            &["--fail-on", "never"],
            &ok,
            0,
        ),
        (
            "held",
            Isolation::Held,
            None,
            &["--fail-on", "contamination"],
            &ok,
            0,
        ),
        // Warmup's cache served profiling without isolation: only contamination fails it.
        ("none-a", Isolation::NotRequested, Some(0.97), &[], &ok, 0),
        (
            "none-b",
            Isolation::NotRequested,
            Some(0.97),
            &["--fail-on", "contamination"],
            &ok,
            3,
        ),
        (
            "none-c",
            Isolation::NotRequested,
            Some(0.0),
            &["--fail-on", "contamination"],
            &ok,
            0,
        ),
        // A client that cannot start: the shell's 127, and the run is still closed.
        (
            "missing",
            Isolation::Held,
            None,
            &[],
            &["/nonexistent/kvbust-test-client"],
            127,
        ),
    ];
    for (name, isolation, share, flags, command, want) in cases {
        let report = closed(name, isolation, share);
        let admin = serving(&report);
        let mut all = vec!["--name", name];
        all.extend_from_slice(flags);
        let out = run(&admin.url(), &all, command);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(want), "{name}: {err}");
        let calls = admin.stop();
        assert_eq!(
            paths(&calls),
            ["POST /runs".to_string(), format!("POST /runs/{name}/close")],
            "{name}"
        );
        // No token configured: none sent.
        assert!(calls.iter().all(|c| c.auth.is_none()), "{calls:?}");
        if command == ok {
            assert_eq!(text(&out.stdout), "client-ran\n", "{name}");
            assert!(
                err.starts_with(&format!("kvbust run {name}: {}", report.verdict.message)),
                "{err}"
            );
        }
        match want {
            3 => assert!(
                err.contains(&format!("kvbust: run `{name}`: isolation "))
                    && err.contains("(--fail-on "),
                "{name}: {err}"
            ),
            5 => assert!(err.contains("kvbust: `sh` failed (exit 5)"), "{err}"),
            127 => assert!(
                err.contains("cannot start `/nonexistent/kvbust-test-client`"),
                "{err}"
            ),
            _ => assert!(!err.contains("kvbust: "), "{name}: {err}"),
        }
    }
}

#[test]
fn run_does_not_start_the_client_when_the_run_cannot_open() {
    let dir = crate::common::test_dir();
    let marker = dir.join("client-ran");
    let touch = format!("touch {}", marker.display());
    // Nothing listening: the port of a listener just closed.
    let closed_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = run(
        &format!("http://{closed_port}"),
        &["--name", "x"],
        &["sh", "-c", &touch],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cannot open run `x`"),
        "{}",
        text(&out.stderr)
    );
    // A port that refuses the token.
    let admin = Admin::start(Box::new(|_, _| {
        (401, "{\"error\":{\"message\":\"token\"}}".into())
    }));
    let out = run(&admin.url(), &["--name", "x"], &["sh", "-c", &touch]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("KVBUST_ADMIN__TOKEN"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(paths(&admin.stop()), ["POST /runs"]);
    assert!(!marker.exists(), "the client never ran");
    // Bad flags: usage errors, nothing sent.
    for args in [
        &["run", "--name", "a b", "--", "true"][..],
        &["run", "--fail-on", "sometimes", "--", "true"],
        &["run", "--name", "x"],
        &["run", "--timeout", "soon", "--", "true"],
    ] {
        let out = kvbust(args, &[]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn run_passes_sigterm_on_and_still_closes_the_run() {
    let report = closed("sig", Isolation::Held, None);
    let admin = serving(&report);
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    p.args([
        "run",
        "--admin",
        &admin.url(),
        "--name",
        "sig",
        "--",
        "sh",
        "-c",
    ])
    // The client says it is ready, then waits; on SIGTERM it stops its sleeper and exits 7.
    // The sleeper's output goes elsewhere: if the TERM comes while the forked sleeper has not
    // yet exec'd `sleep` (a loaded machine), the sleeper swallows the kill and lives on, and it
    // must not keep this test's pipe open (seen: the test read stdout until the sleep ended).
    .arg("trap 'kill $! 2>/dev/null; echo got-term; exit 7' TERM; echo ready; sleep 1000 >/dev/null 2>&1 & wait $!")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = p.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(rest, "got-term\n", "{err}");
    assert_eq!(status.code(), Some(7), "{err}");
    assert!(err.starts_with("kvbust run sig: "), "{err}");
    assert_eq!(paths(&admin.stop()), ["POST /runs", "POST /runs/sig/close"]);
}

/// Three runs of a sweep, c1, c8, c64: TTFT rising with concurrency, the last one breached.
fn sweep_reports() -> Vec<Report> {
    [("c1", 1.0), ("c8", 1.6), ("c64", 3.1)]
        .iter()
        .enumerate()
        .map(|(i, (name, slow))| {
            let isolation = if i == 2 {
                Isolation::Breached
            } else {
                Isolation::Held
            };
            let mut r = closed(name, isolation, None);
            r.run.command = Some(vec!["aiperf".into(), format!("--concurrency={name}")]);
            for row in &mut r.rows {
                for s in [&mut row.latency.ttft_ms.p50, &mut row.latency.ttft_ms.p99] {
                    *s = s.map(|v| v * slow);
                }
                row.throughput.requests_per_s = Some(3.5 * slow);
                row.latency.itl_ms.p50 = Some(7.25 * slow);
                row.errors.count = i as u64;
                row.cached_tokens.predicted = row.cached_tokens.predicted * (3 - i as u64) / 3;
            }
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap()
        })
        .collect()
}

/// The profiling rows of `reports`, in order: (run, target, row).
fn profiling(reports: &[Report]) -> Vec<(String, String, kvbust::report::Row)> {
    reports
        .iter()
        .flat_map(|r| {
            r.rows
                .iter()
                .filter(|w| w.phase == "profiling")
                .map(|w| (r.run.name.clone(), w.target.clone(), w.clone()))
        })
        .collect()
}

/// Equal but for serde_json's float parsing, which may land a last-place bit away from the
/// value printed (each trip through JSON text may move it once more).
fn same(got: Option<f64>, want: Option<f64>) -> bool {
    match (got, want) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * b.abs().max(1.0),
        (a, b) => a == b,
    }
}

fn check_sweep_json(reports: &[Report], json: &[u8]) {
    let sweep: Sweep = serde_json::from_slice(json).unwrap();
    let want = profiling(reports);
    assert_eq!(sweep.lines.len(), want.len());
    for (line, (run, target, row)) in sweep.lines.iter().zip(&want) {
        assert_eq!((&line.run, &line.target), (run, target));
        assert_eq!(line.requests, row.requests);
        assert_eq!(line.errors, row.errors.count);
        let pairs = [
            (line.ttft_p50_ms, row.latency.ttft_ms.p50),
            (line.ttft_p99_ms, row.latency.ttft_ms.p99),
            (line.itl_p50_ms, row.latency.itl_ms.p50),
            (line.requests_per_s, row.throughput.requests_per_s),
            (
                line.cached_share_predicted,
                Some(row.cached_tokens.predicted as f64 / row.prompt_tokens.predicted as f64),
            ),
            (
                line.cached_share_reported,
                Some(
                    row.cached_tokens.reported.unwrap() as f64
                        / row.prompt_tokens.reported.unwrap() as f64,
                ),
            ),
        ];
        for (k, (got, want)) in pairs.iter().enumerate() {
            assert!(want.is_some(), "{k}: a figure to compare");
            assert!(
                same(*got, *want),
                "{run} {target} figure {k}: {got:?} != {want:?}"
            );
        }
        let report = reports.iter().find(|r| r.run.name == *run).unwrap();
        assert_eq!(line.isolation, report.verdict.isolation);
        assert_eq!(line.verdict, report.verdict.message);
        assert_eq!(line.command, report.run.command);
    }
}

/// `data-value` of every `<circle>` of the series `target`/`key` in the chart `id`, by run.
fn chart_points(page: &str, id: &str, target: &str, key: &str) -> Vec<(String, f64)> {
    let chart = page.split(&format!("<svg id=\"{id}\"")).nth(1).unwrap();
    let chart = chart.split("</svg>").next().unwrap();
    let series = chart
        .split(&format!(
            "<g class=\"series\" data-target=\"{target}\" data-series=\"{key}\""
        ))
        .nth(1)
        .unwrap_or_else(|| panic!("{id} {target} {key}"));
    let series = series.split("</g>").next().unwrap();
    series
        .split("<circle ")
        .skip(1)
        .map(|c| {
            let attr = |k: &str| {
                c.split(&format!(" {k}=\""))
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
                    .to_string()
            };
            (attr("data-run"), attr("data-value").parse().unwrap())
        })
        .collect()
}

fn check_sweep_html(reports: &[Report], page: &str) {
    assert!(page.starts_with("<!DOCTYPE html>"));
    for banned in ["<script", "src=", "href=", "url("] {
        assert!(!page.contains(banned), "self-contained: {banned}");
    }
    // The page opens with the verdicts' count, the breach making it red.
    let body = page.split("<body>\n").nth(1).unwrap();
    let verdict = body.lines().nth(1).unwrap();
    assert_eq!(
        verdict,
        "<p class=\"verdict bad\" id=\"verdict\">3 runs: 2 isolation held, 1 isolation breached</p>"
    );
    let want = profiling(reports);
    assert_eq!(page.matches("<tr class=\"run\"").count(), want.len());
    let targets: Vec<&String> = {
        let mut t: Vec<&String> = want.iter().map(|w| &w.1).collect();
        t.dedup();
        t.sort();
        t.dedup();
        t
    };
    for target in targets {
        let of = |pick: &dyn Fn(&kvbust::report::Row) -> f64| -> Vec<(String, f64)> {
            want.iter()
                .filter(|w| w.1 == *target)
                .map(|(run, _, row)| (run.clone(), pick(row)))
                .collect()
        };
        assert_eq!(
            chart_points(page, "chart-sweep-ttft", target, "ttft_p50"),
            of(&|r| r.latency.ttft_ms.p50.unwrap())
        );
        assert_eq!(
            chart_points(page, "chart-sweep-ttft", target, "ttft_p99"),
            of(&|r| r.latency.ttft_ms.p99.unwrap())
        );
        assert_eq!(
            chart_points(page, "chart-sweep-cached", target, "cached_predicted"),
            of(&|r| r.cached_tokens.predicted as f64 / r.prompt_tokens.predicted as f64)
        );
        assert_eq!(
            chart_points(page, "chart-sweep-cached", target, "cached_reported"),
            of(&|r| r.cached_tokens.reported.unwrap() as f64
                / r.prompt_tokens.reported.unwrap() as f64)
        );
    }
    for r in reports {
        assert!(
            page.contains(&format!(
                "data-run=\"{}\" data-isolation=\"{}\"",
                r.run.name,
                r.verdict.isolation.as_str()
            )),
            "{}",
            r.run.name
        );
    }
}

fn check_sweep_table(reports: &[Report], table: &str) {
    let mut lines = table.lines();
    assert_eq!(
        lines.next(),
        Some("3 runs: 2 isolation held, 1 isolation breached")
    );
    let want = profiling(reports);
    let data: Vec<&str> = table
        .lines()
        .filter(|l| {
            reports
                .iter()
                .any(|r| l.starts_with(&format!("{} ", r.run.name)))
        })
        .filter(|l| !l.contains(": "))
        .collect();
    assert_eq!(data.len(), want.len(), "{table}");
    for (line, (run, target, row)) in data.iter().zip(&want) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((f[0], f[1]), (run.as_str(), target.as_str()), "{line}");
        assert_eq!(f[3].replace(',', "").parse::<u64>().unwrap(), row.requests);
        assert_eq!(f[6], kvbust_ms(row.latency.ttft_ms.p50.unwrap()), "{line}");
        assert_eq!(f[7], kvbust_ms(row.latency.ttft_ms.p99.unwrap()), "{line}");
    }
    for r in reports {
        assert!(
            table.contains(&format!("{}: {}", r.run.name, r.verdict.message)),
            "{table}"
        );
    }
}

fn write_files(dir: &Path, reports: &[Report]) -> Vec<String> {
    reports
        .iter()
        .map(|r| {
            let path = dir.join(format!("{}.json", r.run.name));
            let file = RunFile {
                kvbust_run: RUN_FILE_SCHEMA,
                config_digest: "ab".repeat(32),
                report: r.clone(),
            };
            std::fs::write(&path, serde_json::to_string_pretty(&file).unwrap()).unwrap();
            path.to_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn saved_runs_side_by_side_in_every_format() {
    let reports = sweep_reports();
    let dir = crate::common::test_dir();
    let files = write_files(&dir, &reports);
    let with = |format: &str| {
        let mut args = vec!["report", "--format", format];
        args.extend(files.iter().map(String::as_str));
        let out = kvbust(&args, &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{format}: {}",
            text(&out.stderr)
        );
        out.stdout
    };
    check_sweep_json(&reports, &with("json"));
    check_sweep_table(&reports, &text(&with("table")));
    let html = text(&with("html"));
    // For a person to look at.
    std::fs::write(dir.join("sweep.html"), &html).unwrap();
    check_sweep_html(&reports, &html);
    let md = text(&with("markdown"));
    assert!(md.starts_with("## kvbust runs side by side\n\n**❌ 3 runs: 2 isolation held, 1 isolation breached**\n"), "{md}");
    let want = profiling(&reports);
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| `")).collect();
    assert_eq!(rows.len(), want.len(), "{md}");
    for (line, (run, target, row)) in rows.iter().zip(&want) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(cells[0], format!("`{run}`"));
        assert_eq!(cells[1], format!("`{target}`"));
        assert_eq!(cells[6], kvbust_ms(row.latency.ttft_ms.p50.unwrap()));
    }

    // A bare report saved as GET /report answered it reads too; a file that is neither fails.
    let bare = dir.join("bare.json");
    std::fs::write(&bare, serde_json::to_string(&reports[0]).unwrap()).unwrap();
    let out = kvbust(
        &[
            "report",
            "--format",
            "json",
            bare.to_str().unwrap(),
            &files[1],
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    check_sweep_json(&reports[..2], &out.stdout);
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "{\"kvbust_run\": 9}").unwrap();
    let out = kvbust(&["report", junk.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("run file schema 9"),
        "{}",
        text(&out.stderr)
    );
    let out = kvbust(&["report", "--runs", &files[0]], &[]);
    assert_eq!(out.status.code(), Some(2), "--runs or files, not both");
}

#[test]
fn report_runs_fetches_every_run_the_port_holds() {
    let reports = sweep_reports();
    let summaries: Vec<RunSummary> = reports
        .iter()
        .map(|r| RunSummary {
            name: r.run.name.clone(),
            started_at: r.run.started_at.clone(),
            ended_at: r.run.ended_at.clone(),
            complete: r.run.complete,
            verdict: r.verdict.isolation,
            message: r.verdict.message.clone(),
            requests: r.rows.iter().map(|w| w.requests).sum(),
        })
        .collect();
    let list = serde_json::to_string(&summaries).unwrap();
    let by_name: BTreeMap<String, String> = reports
        .iter()
        .map(|r| {
            (
                format!("/runs/{}", r.run.name),
                serde_json::to_string(r).unwrap(),
            )
        })
        .collect();
    let admin = Admin::start(Box::new(move |method, path| match (method, path) {
        ("GET", "/runs") => (200, list.clone()),
        ("GET", p) => by_name
            .get(p)
            .map_or((404, "{}".into()), |b| (200, b.clone())),
        _ => (405, "{}".into()),
    }));
    let out = kvbust(
        &[
            "report",
            "--runs",
            "--admin",
            &admin.url(),
            "--format",
            "json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    check_sweep_json(&reports, &out.stdout);
    let out = kvbust(
        &[
            "report",
            "--runs",
            "--admin",
            &admin.url(),
            "--format",
            "html",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    check_sweep_html(&reports, &text(&out.stdout));
    assert_eq!(
        paths(&admin.stop()),
        [
            "GET /runs",
            "GET /runs/c1",
            "GET /runs/c8",
            "GET /runs/c64",
            "GET /runs",
            "GET /runs/c1",
            "GET /runs/c8",
            "GET /runs/c64"
        ]
    );
}
