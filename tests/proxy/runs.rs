//! Runs (issue 39) through the running proxy and the built-in mock: each run its own warmup
//! count (AIPerf's --warmup-request-count twice through one kvbust), a request counted in the
//! run it arrived in, closing waits for the run's requests, the model following the upstream's
//! cache resets, failed requests counted as errors, the verdict, and saved run files.

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use serde_json::{json, Value};

use crate::common::{self, body_bytes, get, h1, post, send, Harness};
use kvbust::cachebust::Target;
use kvbust::report::{Isolation, Report, RunFile};

fn admin_post(h: &Harness, path: &str, body: Value) -> http::Request<Full<Bytes>> {
    http::Request::post(h.admin_url(path))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

async fn report_at(h: &Harness, path: &str) -> Report {
    let resp = send(&h1(), get(&h.admin_url(path))).await;
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    serde_json::from_slice(&body_bytes(resp).await).expect("a report")
}

/// One chat request as AIPerf sends it (a session header, no phase header); the phase kvbust
/// gave it, from the response.
async fn aiperf_request(h: &Harness, session: &str, run: Option<&str>, text: &str) -> String {
    let body =
        json!({"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 2});
    let mut headers = vec![("x-correlation-id", session)];
    if let Some(r) = run {
        headers.push(("x-kvbust-run", r));
    }
    let resp = send(
        &h1(),
        post(&h.url("/v1/chat/completions"), body.to_string(), &headers),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let phase = resp.headers()["x-kvbust-phase"]
        .to_str()
        .unwrap()
        .to_string();
    body_bytes(resp).await;
    phase
}

fn row<'a>(r: &'a Report, phase: &str) -> &'a kvbust::report::Row {
    r.rows
        .iter()
        .find(|x| x.phase == phase)
        .unwrap_or_else(|| panic!("no {phase} row: {:?}", r.rows))
}

/// Two AIPerf runs back to back through one kvbust, each `--warmup-request-count 4` with a
/// constant `--header x-kvbust-run:NAME`: the second run's first 4 requests are warmup too
/// (before runs, the count ran from process start and the second run's warmup went upstream
/// unmarked as profiling).
#[tokio::test]
async fn two_aiperf_runs_each_get_their_own_warmup() {
    let h = common::start(|c| {
        c.cache_bust.auto_warmup_requests = Some(4);
        c.cache_bust.target = Target::WarmupIsolationFirstTurn;
    })
    .await;
    for run in ["c1", "c8"] {
        let mut phases = Vec::new();
        for i in 0..10 {
            let text = format!("{run} conversation {i} says hello");
            phases.push(aiperf_request(&h, &format!("{run}-{i}"), Some(run), &text).await);
        }
        let want: Vec<&str> = (0..10)
            .map(|i| if i < 4 { "warmup" } else { "profiling" })
            .collect();
        assert_eq!(phases, want, "run {run}");
    }
    h.settle_report().await;
    for run in ["c1", "c8"] {
        let r = report_at(&h, &format!("/runs/{run}")).await;
        assert_eq!(r.run.name, run);
        assert_eq!(r.run.opened_by, "header");
        assert_eq!(row(&r, "warmup").requests, 4, "{run}");
        assert_eq!(row(&r, "profiling").requests, 6, "{run}");
        assert_eq!(
            r.verdict.isolation,
            Isolation::Held,
            "{}",
            r.verdict.message
        );
    }
    h.shutdown().await;
}

/// The same sweep wrapped as `kvbust run` wraps a client: `POST /runs` opens each run (with
/// its own warmup count), answers with the closed run's report, and the request path needs
/// no header at all.
#[tokio::test]
async fn runs_opened_on_the_admin_port_count_their_warmup_from_their_start() {
    let h = common::start(|c| c.cache_bust.target = Target::FirstTurnPrefix).await;
    let open = send(
        &h1(),
        admin_post(&h, "/runs", json!({"name": "a", "warmup_requests": 2})),
    )
    .await;
    assert_eq!(open.status(), StatusCode::OK);
    assert_eq!(open.headers()["x-kvbust-run"], "a");
    let first: Report = serde_json::from_slice(&body_bytes(open).await).unwrap();
    assert_eq!(first.run.name, "run-1", "the run kvbust started with");
    assert!(first.run.ended_at.is_some());
    for name in ["a", "b"] {
        if name == "b" {
            let resp = send(
                &h1(),
                admin_post(&h, "/runs", json!({"name": "b", "warmup_requests": 2})),
            )
            .await;
            let closed: Report = serde_json::from_slice(&body_bytes(resp).await).unwrap();
            assert_eq!(closed.run.name, "a");
            assert!(closed.run.complete, "{:?}", closed.run.unaccounted);
            assert_eq!(row(&closed, "warmup").requests, 2);
            assert_eq!(row(&closed, "profiling").requests, 3);
        }
        let mut phases = Vec::new();
        for i in 0..5 {
            phases.push(
                aiperf_request(&h, &format!("{name}{i}"), None, &format!("{name} turn {i}")).await,
            );
        }
        assert_eq!(
            phases,
            ["warmup", "warmup", "profiling", "profiling", "profiling"]
        );
    }
    // A name still open is refused; a bad name too.
    let dup = send(&h1(), admin_post(&h, "/runs", json!({"name": "b"}))).await;
    assert_eq!(dup.status(), StatusCode::CONFLICT);
    let bad = send(&h1(), admin_post(&h, "/runs", json!({"name": "a b"}))).await;
    assert_eq!(bad.status(), StatusCode::CONFLICT);
    let list: Value =
        serde_json::from_slice(&body_bytes(send(&h1(), get(&h.admin_url("/runs"))).await).await)
            .unwrap();
    let names: Vec<&str> = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["run-1", "a", "b"]);
    let metrics = common::metrics_text(&h).await;
    assert!(
        metrics.contains("kvbust_run_info{run=\"b\"} 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("kvbust_run_info{run=\"a\"}"), "{metrics}");
    h.shutdown().await;
}

/// A request that arrived in run A and is still streaming when run B opens counts in A, and
/// closing A waits for it: A's report is complete with the request, B's has none of it.
#[tokio::test]
async fn a_request_straddling_a_run_change_counts_where_it_arrived() {
    let h = common::start(|_| {}).await;
    let body = json!({"model": "m", "stream": true, "max_tokens": 30,
        "messages": [{"role": "user", "content": "a long answer please"}]});
    let resp = send(
        &h1(),
        post(
            &h.url("/v1/chat/completions"),
            body.to_string(),
            &[("x-mock-inter-token", "20ms")],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    // The stream is open (headers in, body not read): run B opens now, in another task.
    let opening = {
        let req = admin_post(&h, "/runs", json!({"name": "b"}));
        tokio::spawn(async move { send(&h1(), req).await })
    };
    // B is current before A's request ends: a request sent now is B's.
    loop {
        let list = body_bytes(send(&h1(), get(&h.admin_url("/runs"))).await).await;
        if String::from_utf8_lossy(&list).contains("\"b\"") {
            break;
        }
        tokio::task::yield_now().await;
    }
    aiperf_request(&h, "later", None, "a request of run b").await;
    body_bytes(resp).await;
    let closed = opening.await.unwrap();
    let closed: Report = serde_json::from_slice(&body_bytes(closed).await).unwrap();
    assert_eq!(closed.run.name, "run-1");
    assert!(closed.run.complete, "{:?}", closed.run.unaccounted);
    let a = &closed.rows[0];
    assert_eq!((a.requests, a.throughput.successful_requests), (1, 1));
    assert_eq!(
        a.latency.itl_ms.count, 29,
        "29 gaps between 30 streamed tokens"
    );
    assert_eq!(a.latency.tpot_ms.count, 1);
    assert!(a.latency.e2e_ms.min.unwrap() >= a.latency.ttft_ms.max.unwrap());
    h.settle_report().await;
    let b = report_at(&h, "/runs/b").await;
    assert_eq!(b.rows.iter().map(|r| r.requests).sum::<u64>(), 1);
    h.shutdown().await;
}

async fn chat_once(h: &Harness, text: &str) -> Value {
    let body =
        json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]});
    let resp = send(
        &h1(),
        post(&h.url("/v1/chat/completions"), body.to_string(), &[]),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    serde_json::from_slice(&body_bytes(resp).await).unwrap()
}

/// The model follows the upstream's cache: after a forwarded `POST /reset_prefix_cache` (and
/// after `POST /upstream/reset-cache` on the admin port) the same prompt is predicted cold, as
/// the mock reports it, and the run's time line shows each reset.
#[tokio::test]
async fn the_model_empties_its_index_when_the_upstream_cache_is_reset() {
    let mock = kvbust::mock::MockConfig {
        block_size: 4,
        ..common::quick_mock()
    };
    let h = common::start_with_mock(mock, |c| c.cache_model.block_size = 4).await;
    let text = "the same long prompt, sent again and again, to be cached by the upstream";
    chat_once(&h, text).await;
    let warm = chat_once(&h, text).await;
    assert!(
        warm["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let reset = send(&h1(), post(&h.url("/reset_prefix_cache"), "", &[])).await;
    assert_eq!(reset.status(), StatusCode::OK);
    body_bytes(reset).await;
    let cold = chat_once(&h, text).await;
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    chat_once(&h, text).await;
    let admin = send(&h1(), admin_post(&h, "/upstream/reset-cache", json!({}))).await;
    assert_eq!(admin.status(), StatusCode::OK);
    let cold_again = chat_once(&h, text).await;
    assert_eq!(
        cold_again["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    h.settle_report().await;
    let r = report_at(&h, "/report").await;
    let p = row(&r, "profiling");
    assert_eq!(p.requests, 5);
    assert_eq!(p.divergent_requests, 0, "predicted as reported: {p:?}");
    assert_eq!(p.cached_tokens.predicted, p.cached_tokens.reported.unwrap());
    let by: Vec<&str> = r.run.events.iter().map(|e| e.by.as_str()).collect();
    assert_eq!(by, ["forwarded", "admin"]);
    let metrics = common::metrics_text(&h).await;
    assert!(
        metrics.contains("kvbust_cache_resets_total{by=\"forwarded\"} 1"),
        "{metrics}"
    );
    h.shutdown().await;
}

/// Failed requests are errors, never accounted successes: an upstream that is down (kvbust's
/// 502, the upstream's side) and a body kvbust cannot mark (400, the client's side).
#[tokio::test]
async fn failed_requests_are_counted_as_errors_by_status_and_side() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let h = common::start_proxy(&url, |c| {
        c.upstream.health_probe = false;
        c.cache_bust.target = Target::FirstTurnPrefix;
    })
    .await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let resp = send(
        &h1(),
        post(&h.url("/v1/chat/completions"), body.to_string(), &[]),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    body_bytes(resp).await;
    let resp = send(
        &h1(),
        post(&h.url("/v1/chat/completions"), "{\"messages\": [", &[]),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    body_bytes(resp).await;
    h.settle_report().await;
    let r = report_at(&h, "/report").await;
    let p = row(&r, "profiling");
    assert_eq!(p.requests, 2);
    assert_eq!(p.throughput.successful_requests, 0);
    assert_eq!(p.errors.count, 2);
    assert_eq!(p.errors.by_status.get("502"), Some(&1), "{:?}", p.errors);
    assert_eq!(p.errors.by_status.get("400"), Some(&1), "{:?}", p.errors);
    assert_eq!(p.errors.by_side.get("upstream"), Some(&1));
    assert_eq!(p.errors.by_side.get("client"), Some(&1));
    h.shutdown().await;
}

/// Under target `none`, a profiling phase that reuses warmup's prompts is not "held": the
/// verdict says isolation was not requested and how much came from warmup's cache.
#[tokio::test]
async fn the_verdict_names_warmups_share_when_isolation_was_not_requested() {
    let h = common::start(|c| {
        c.cache_model.block_size = 4;
        c.cache_bust.auto_warmup_requests = Some(3);
    })
    .await;
    for round in 0..2 {
        for i in 0..3 {
            let text = format!("prompt number {i} of the dataset, long enough to fill blocks");
            let phase = aiperf_request(&h, &format!("s{round}{i}"), None, &text).await;
            assert_eq!(phase, if round == 0 { "warmup" } else { "profiling" });
        }
    }
    h.settle_report().await;
    let r = report_at(&h, "/report").await;
    assert_eq!(r.verdict.isolation, Isolation::NotRequested);
    let share = r.verdict.warmup_share.unwrap();
    assert!(share > 0.5, "{share}: {}", r.verdict.message);
    assert!(
        r.verdict.message.contains("from warmup's cache"),
        "{}",
        r.verdict.message
    );
    h.shutdown().await;
}

/// A closed run is saved into run.results_dir as one file: the report and the config digest,
/// read back as a `RunFile`.
#[tokio::test]
async fn closed_runs_are_saved_as_files() {
    let dir = common::test_dir().join("runs");
    let d = dir.clone();
    let h = common::start(move |c| c.run.results_dir = Some(d)).await;
    let open = send(&h1(), admin_post(&h, "/runs", json!({"name": "sweep-c1"}))).await;
    body_bytes(open).await;
    aiperf_request(&h, "x", None, "one request").await;
    let close = send(&h1(), admin_post(&h, "/runs/sweep-c1/close", json!({}))).await;
    assert_eq!(close.status(), StatusCode::OK);
    let closed: Report = serde_json::from_slice(&body_bytes(close).await).unwrap();
    let again = send(&h1(), admin_post(&h, "/runs/sweep-c1/close", json!({}))).await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    let text = std::fs::read_to_string(dir.join("sweep-c1.json")).unwrap();
    let file: RunFile = serde_json::from_str(&text).unwrap();
    assert_eq!(file.report, closed);
    assert_eq!(file.config_digest.len(), 64);
    assert_eq!(file.report.rows[0].requests, 1);
    assert!(
        !dir.join("run-1.json").exists(),
        "the empty run POST /runs closed is not saved"
    );
    h.shutdown().await;
}

/// A data-port header never discards a run (issue 42 item 7): explicit digest headers with a
/// new benchmark id used to start a new report without the admin token; now the request counts
/// in the current run with the others.
#[tokio::test]
async fn digest_headers_never_reset_the_run() {
    let h = common::start(|c| c.cache_bust.target = Target::FirstTurnPrefix).await;
    aiperf_request(&h, "a", None, "the first request").await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "another"}], "max_tokens": 2});
    let headers = [
        ("x-kvbust-benchmark-id", "someone-elses"),
        ("x-kvbust-trace-id", "t1"),
    ];
    let resp = send(
        &h1(),
        post(&h.url("/v1/chat/completions"), body.to_string(), &headers),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    h.settle_report().await;
    let r = report_at(&h, "/report").await;
    assert_eq!(r.run.name, "run-1");
    assert_eq!(
        row(&r, "profiling").requests,
        2,
        "both requests in the one run"
    );
    h.shutdown().await;
}
