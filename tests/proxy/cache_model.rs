//! The cache model against the built-in mock, whose simulated prefix cache is vLLM's: with the
//! same tokenizer, template and block size, the model's prediction must equal what the mock
//! reports, request for request; and the isolation guard must name each kind of breach, and
//! stay quiet on a correct run.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use crate::common::{self, body_bytes, get, h1, post, send, Harness, HttpClient};
use kvbust::cachebust::{Phase, Target};
use kvbust::mock::tokenize::MockTokenizer;
use kvbust::mock::{Mock, MockConfig, MockTokenizerSetting};
use kvbust::report::Report;

/// A report row whose every prediction is what the upstream reported: no request diverged,
/// and the cached and prompt tokens predicted are the ones reported.
pub(crate) fn assert_predicted_as_reported(row: &kvbust::report::Row, what: &str) {
    assert_eq!(row.divergent_requests, 0, "{what}: {row:?}");
    assert_eq!(
        row.cached_tokens.reported,
        Some(row.cached_tokens.predicted),
        "{what}"
    );
    assert_eq!(
        row.prompt_tokens.reported,
        Some(row.prompt_tokens.predicted),
        "{what}"
    );
}

/// The run's report once every request is counted.
pub(crate) async fn report(h: &Harness) -> Report {
    let resp = send(&h1(), get(&h.admin_url("/report?wait=60s"))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    serde_json::from_slice(&body_bytes(resp).await).expect("a report")
}

/// One conversation as AIPerf sends it: each turn resends the history with the server's
/// answers, under one `x-correlation-id`; streamed turns ask for usage.
pub(crate) struct Conversation {
    session: String,
    system: Option<String>,
    turns: Vec<String>,
}

/// The assistant's text of a chat response, streamed or not.
fn answer(body: &[u8], stream: bool) -> String {
    if !stream {
        let v: Value = serde_json::from_slice(body).expect("JSON");
        return v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
    }
    common::sse_data(body)
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

pub(crate) async fn run_conversation(
    client: &HttpClient,
    h: &Harness,
    c: &Conversation,
    extra: &[(&str, &str)],
) {
    let mut messages = Vec::new();
    if let Some(s) = &c.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    for (i, turn) in c.turns.iter().enumerate() {
        messages.push(json!({"role": "user", "content": turn}));
        let stream = i % 2 == 1;
        let mut body = json!({"model": "kvbust-mock", "messages": messages, "max_tokens": 6, "stream": stream});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        let mut headers = vec![("x-correlation-id", c.session.as_str())];
        headers.extend_from_slice(extra);
        let req = post(&h.url("/v1/chat/completions"), body.to_string(), &headers);
        let resp = send(client, req).await;
        assert_eq!(resp.status(), StatusCode::OK, "{} turn {i}", c.session);
        let text = answer(&body_bytes(resp).await, stream);
        messages.push(json!({"role": "assistant", "content": text}));
    }
}

pub(crate) fn qwen3_mock(cache_blocks: usize) -> Arc<Mock> {
    let cfg = MockConfig {
        cache_blocks,
        ..common::quick_mock()
    };
    let tokenizer = MockTokenizer::load(&MockTokenizerSetting::Qwen3).expect("shipped tokenizer");
    Mock::new(cfg, Some(tokenizer))
}

/// A synthesized multi-turn sonnet dataset with a shared system prompt (kvbust's synthesis,
/// which is AIPerf's): `n` conversations of 3 turns.
pub(crate) fn sonnet_conversations(n: usize) -> Vec<Conversation> {
    let params = kvbust::synth::SynthParams {
        isl: Some(60),
        osl: Some(6),
        num_dataset_entries: Some(n),
        random_seed: Some(11),
        shared_system_prompt_length: Some(40),
        session_turns_mean: 3.0,
        session_turns_stddev: 0.0,
        ..kvbust::synth::SynthParams::default()
    };
    let tokenizer = kvbust::synth::Tokenizer::default_qwen3().expect("shipped tokenizer");
    let data = kvbust::synth::build_dataset(&params, &tokenizer).expect("a dataset");
    data.conversations
        .into_iter()
        .map(|c| Conversation {
            session: c.session_id,
            system: c.system_message,
            turns: c.turns.into_iter().map(|t| t.text).collect(),
        })
        .collect()
}

/// Every target, both phases, Qwen3 with its chat template and 16-token blocks on both sides,
/// both caches unbounded: the model predicts exactly what the mock reports, for every request
/// (no divergent request, equal sums), and a correct AIPerf-style run breaches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictions_equal_the_mocks_report_under_every_target_and_phase() {
    let conversations = sonnet_conversations(70);
    assert!(conversations
        .iter()
        .all(|c| c.turns.len() >= 3 && c.system.is_some()));
    let mut total = 0;
    let mut hits = 0;
    for (t, target) in Target::ALL.into_iter().enumerate() {
        let h = common::start_with(qwen3_mock(10_000_000), |c| {
            c.cache_model.tokenizer = Some(MockTokenizerSetting::Qwen3);
            c.cache_bust.target = target;
        })
        .await;
        let client = h1();
        for (p, phase) in Phase::ALL.into_iter().enumerate() {
            for c in &conversations[t * 10 + p * 5..t * 10 + p * 5 + 5] {
                run_conversation(&client, &h, c, &[("x-kvbust-phase", phase.as_str())]).await;
            }
        }
        let r = report(&h).await;
        assert_eq!(r.rows.len(), 2, "{target}: {:?}", r.rows);
        for row in &r.rows {
            let what = format!("{} {}", row.phase, row.target);
            assert_eq!(row.target, target.as_str());
            assert_eq!(row.requests, 15, "{what}");
            assert_eq!(row.accounted_requests, 15, "{what}");
            assert_predicted_as_reported(row, &what);
            assert_eq!(row.breaches.total(), 0, "{what}: {row:?}");
            let reuse = row.reuse.same_session + row.reuse.other_session + row.reuse.warmup;
            assert_eq!(reuse, row.cached_tokens.predicted, "{what}");
            total += row.requests;
            hits += row.cached_tokens.predicted;
        }
        assert_eq!(r.upstream.reports_cached_tokens, Some(true));
        assert_eq!(r.cache_model.topology, "sidecar");
        h.shutdown().await;
    }
    assert!(total >= 200, "{total} requests");
    assert!(hits > 0, "later turns reuse earlier ones");
}

/// With the mock's cache smaller than the model's, the divergent requests are exactly those
/// where the mock had evicted: the requests whose cached tokens differ from what an unbounded
/// mock, fed the same prompts directly, reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_smaller_upstream_cache_divergence_counts_its_evictions() {
    let small = MockConfig {
        cache_blocks: 24,
        block_size: 4,
        ..common::quick_mock()
    };
    let h = common::start_with(Mock::new(small, None), |c| c.cache_model.block_size = 4).await;
    let unbounded = Mock::new(
        MockConfig {
            cache_blocks: 1_000_000,
            block_size: 4,
            ..common::quick_mock()
        },
        None,
    );
    let direct = serve_mock(unbounded).await;
    let client = h1();
    let mut evicted = 0;
    for i in 0..40 {
        // Five conversations' growing prefixes, interleaved: the small cache loses some.
        let k = i % 5;
        let text = format!("conversation {k}: ")
            + &"the quick brown fox jumps over the lazy dog ".repeat(1 + i / 5);
        let body =
            json!({"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 2})
                .to_string();
        let via = common::json(
            send(
                &client,
                post(&h.url("/v1/chat/completions"), body.clone(), &[]),
            )
            .await,
        )
        .await;
        let ref_ = common::json(
            send(
                &client,
                post(&format!("http://{direct}/v1/chat/completions"), body, &[]),
            )
            .await,
        )
        .await;
        let cached = |v: &Value| {
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("cached")
        };
        evicted += u64::from(cached(&via) != cached(&ref_));
    }
    let r = report(&h).await;
    let row = &r.rows[0];
    assert!(
        evicted > 0,
        "the small cache must evict for this test to mean anything"
    );
    assert_eq!(row.divergent_requests, evicted, "{row:?}");
    assert!(row.cached_tokens.reported < Some(row.cached_tokens.predicted));
    h.shutdown().await;
}

/// Serves `mock` on port 0 and returns its address.
async fn serve_mock(mock: Arc<Mock>) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(kvbust::mock::serve(l, mock, std::future::pending::<()>()));
    addr
}

fn chat(messages: &[(&str, &str)]) -> String {
    let m: Vec<Value> = messages
        .iter()
        .map(|(r, c)| json!({"role": r, "content": c}))
        .collect();
    json!({"model": "m", "messages": m, "max_tokens": 3}).to_string()
}

const SYSTEM: &str = "You are a patient geography tutor who answers in full sentences.";
const OPENING: &str = "What is the capital of France, and why did it become the capital?";

async fn breaches(h: &Harness) -> kvbust::report::Breaches {
    let r = report(h).await;
    let mut b = kvbust::report::Breaches::default();
    for row in &r.rows {
        b.cross_session += row.breaches.cross_session;
        b.warmup_reuse += row.breaches.warmup_reuse;
        b.session_collision += row.breaches.session_collision;
    }
    b
}

async fn say(h: &Harness, messages: &[(&str, &str)], headers: &[(&str, &str)]) -> String {
    let resp = send(
        &h1(),
        post(&h.url("/v1/chat/completions"), chat(messages), headers),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    answer(&body_bytes(resp).await, false)
}

/// Two conversations that open with the same question, keyed by the first-user-turn fallback
/// under `first_turn_prefix`, taking turns: one session key, one RID, one cache path. The
/// second one's first divergence looks like the first one cut back (a compaction); from then
/// on each turn goes back to the other live branch: a collision each. With a distinct
/// `x-correlation-id` each: neither.
#[tokio::test]
async fn two_conversations_under_one_session_key_are_a_collision() {
    for distinct in [false, true] {
        let h = common::start_with_mock(small_blocks(), |c| {
            c.cache_bust.target = Target::FirstTurnPrefix;
            c.cache_model.block_size = 4;
        })
        .await;
        let ids = |s: &'static str| {
            if distinct {
                vec![("x-correlation-id", s)]
            } else {
                vec![]
            }
        };
        let mut convs = [
            ("a", ["Tell me more about its river.", "And its bridges?"]),
            (
                "b",
                ["Now compare it with Berlin, please.", "Which is older?"],
            ),
        ]
        .map(|(id, next)| {
            (
                id,
                next,
                vec![
                    ("system", SYSTEM.to_string()),
                    ("user", OPENING.to_string()),
                ],
            )
        });
        for turn in 0..3 {
            for (id, next, history) in &mut convs {
                let m: Vec<(&str, &str)> = history.iter().map(|(r, c)| (*r, c.as_str())).collect();
                let reply = say(&h, &m, &ids(id)).await;
                if turn < 2 {
                    history.push(("assistant", reply));
                    history.push(("user", next[turn].to_string()));
                }
            }
        }
        let b = breaches(&h).await;
        let (collisions, compactions) = if distinct { (0, 0) } else { (2, 1) };
        assert_eq!(
            (b.session_collision, b.cross_session, b.warmup_reuse),
            (collisions, 0, 0),
            "distinct ids: {distinct}"
        );
        let m = common::metrics_text(&h).await;
        let line = "kvbust_isolation_breaches_total{kind=\"session_collision\",phase=\"profiling\",target=\"first_turn_prefix\"} 2";
        assert_eq!(m.contains(line), !distinct, "{m}");
        let line = "kvbust_cache_model_compactions_total{phase=\"profiling\",target=\"first_turn_prefix\"}";
        let counted = m
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .map(|v| v.trim().parse::<u64>().unwrap());
        assert_eq!(counted.unwrap_or(0), compactions, "{m}");
        h.shutdown().await;
    }
}

fn small_blocks() -> MockConfig {
    MockConfig {
        block_size: 4,
        ..common::quick_mock()
    }
}

/// Two sessions (distinct `x-correlation-id`s) given the same explicit RID inputs share one
/// marker, so the second reuses the first's blocks past the marker: `cross_session`.
#[tokio::test]
async fn the_same_explicit_rid_for_two_sessions_is_a_cross_session_breach() {
    let h = common::start_with_mock(small_blocks(), |c| {
        c.cache_bust.target = Target::FirstTurnPrefix;
        c.cache_model.block_size = 4;
    })
    .await;
    let conv = [("system", SYSTEM), ("user", OPENING)];
    for session in ["a", "b"] {
        say(
            &h,
            &conv,
            &[
                ("x-correlation-id", session),
                ("x-kvbust-trace-id", "trace-7"),
            ],
        )
        .await;
    }
    let b = breaches(&h).await;
    assert_eq!(
        (b.cross_session, b.session_collision, b.warmup_reuse),
        (1, 0, 0)
    );
    let r = report(&h).await;
    assert!(r.rows[0].reuse.other_session > 0);
    h.shutdown().await;
}

/// Under `warmup_isolation_first_turn`, a warmup request that went out unmarked (its target
/// overridden to `none`) leaves blocks a profiling request then reuses past its isolation
/// point: `warmup_reuse`. Marked properly, the same two requests breach nothing.
#[tokio::test]
async fn an_unmarked_warmup_reused_by_profiling_is_a_warmup_reuse_breach() {
    for unmarked in [true, false] {
        let h = common::start_with_mock(small_blocks(), |c| {
            c.cache_bust.target = Target::WarmupIsolationFirstTurn;
            c.cache_model.block_size = 4;
        })
        .await;
        let conv = [("system", SYSTEM), ("user", OPENING)];
        let mut warm = vec![("x-kvbust-phase", "warmup"), ("x-correlation-id", "w")];
        if unmarked {
            warm.push(("x-kvbust-target", "none"));
        }
        say(&h, &conv, &warm).await;
        say(
            &h,
            &conv,
            &[("x-kvbust-phase", "profiling"), ("x-correlation-id", "p")],
        )
        .await;
        let b = breaches(&h).await;
        let want = u64::from(unmarked);
        assert_eq!(
            (b.warmup_reuse, b.cross_session, b.session_collision),
            (want, 0, 0),
            "unmarked: {unmarked}"
        );
        let r = report(&h).await;
        let profiling = r
            .rows
            .iter()
            .find(|r| r.phase == "profiling")
            .expect("a profiling row");
        // The system prompt before the isolation point is reused from warmup either way.
        assert!(profiling.reuse.warmup > 0);
        h.shutdown().await;
    }
}

/// An upstream that reports usage without cached tokens is named: the gauge goes to 0 and the
/// report says so, with the engine flags.
#[tokio::test]
async fn a_silent_upstream_is_named_in_the_report_and_the_gauge() {
    let upstream = silent_upstream().await;
    let h = common::start_proxy(&format!("http://{upstream}"), |_| {}).await;
    for i in 0..kvbust::cache_model::ledger::SILENT_AFTER {
        say(&h, &[("user", &format!("question {i}"))], &[]).await;
    }
    let r = report(&h).await;
    assert_eq!(r.upstream.reports_cached_tokens, Some(false));
    let hint = r.upstream.hint.expect("a hint");
    assert!(
        hint.contains("--enable-prompt-tokens-details") && hint.contains("--enable-cache-report"),
        "{hint}"
    );
    assert_eq!(r.rows[0].cached_tokens.reported, None);
    assert_eq!(
        r.rows[0].prompt_tokens.reported,
        Some(5 * kvbust::cache_model::ledger::SILENT_AFTER)
    );
    let m = common::metrics_text(&h).await;
    assert!(m.contains("kvbust_upstream_reports_cached_tokens 0"), "{m}");
    h.shutdown().await;
}

/// A chat upstream whose usage has no `prompt_tokens_details` (vLLM without
/// `--enable-prompt-tokens-details`).
async fn silent_upstream() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        use http_body_util::BodyExt;
                        let _ = req.into_body().collect().await;
                        let body = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#;
                        let mut resp = http::Response::new(http_body_util::Full::new(
                            Bytes::from_static(body.as_bytes()),
                        ));
                        resp.headers_mut().insert(
                            "content-type",
                            http::HeaderValue::from_static("application/json"),
                        );
                        Ok::<_, std::convert::Infallible>(resp)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

/// `POST /report/reset` needs the token when one is set, answers with the closed run, and
/// starts a new one; `GET /report` refuses a bad `wait`.
#[tokio::test]
async fn reset_closes_the_run_and_needs_the_token() {
    let token = "a-long-enough-admin-token-0123456789";
    let h = common::start(|c| c.admin.token = Some(token.into())).await;
    say(&h, &[("user", "hello there")], &[]).await;
    let reset = |auth: Option<&str>| {
        let mut b = http::Request::post(h.admin_url("/report/reset"));
        if let Some(a) = auth {
            b = b.header("authorization", format!("Bearer {a}"));
        }
        b.body(http_body_util::Full::new(Bytes::new())).unwrap()
    };
    let denied = send(&h1(), reset(None)).await;
    assert_eq!(denied.status(), StatusCode::UNAUTHORIZED);
    report(&h).await; // settle first, so the closed run has the request
    let closed = send(&h1(), reset(Some(token))).await;
    assert_eq!(closed.status(), StatusCode::OK);
    let closed: Report = serde_json::from_slice(&body_bytes(closed).await).unwrap();
    assert_eq!(closed.rows[0].requests, 1);
    assert!(report(&h).await.rows.is_empty(), "a new run");
    let bad = send(&h1(), get(&h.admin_url("/report?wait=forever"))).await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let _ = Duration::ZERO;
    h.shutdown().await;
}

/// The binary as a user runs it (built-in mock, Qwen3 on both sides): a session collision is
/// logged once for the session, naming the session-key source and the fix, and SIGTERM logs
/// the run's report table.
#[test]
#[allow(clippy::disallowed_methods)] // the child must not inherit the test's KVBUST_* variables
fn the_binary_logs_a_breach_and_the_report_table_on_sigterm() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            p.env_remove(k);
        }
    }
    let mut child = p
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(["--cache-bust", "first_turn_prefix"])
        .env("KVBUST_LOG__ACCESS", "false")
        // Nice 0, as the harness sets it: the test counts on the model keeping up.
        .env("KVBUST_CACHE_MODEL__NICE", "0")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("kvbust starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr"));
    let mut log = String::new();
    let (data, admin) = loop {
        let mut line = String::new();
        assert!(
            lines.read_line(&mut line).expect("reads") > 0,
            "exited: {log}"
        );
        log.push_str(&line);
        if line.contains("listening") {
            let addr = |key: &str| {
                let at = line.find(&format!("{key}=")).expect("an address") + key.len() + 1;
                line[at..]
                    .split_whitespace()
                    .next()
                    .expect("an address")
                    .to_string()
            };
            break (addr("data"), addr("admin"));
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = h1();
        let url = format!("http://{data}/v1/chat/completions");
        let ask = |messages: Vec<(&'static str, String)>| {
            let m: Vec<Value> = messages
                .iter()
                .map(|(r, c)| json!({"role": r, "content": c}))
                .collect();
            let body = json!({"model": "kvbust-mock", "messages": m, "max_tokens": 4}).to_string();
            send(&client, post(&url, body, &[]))
        };
        let mut replies = Vec::new();
        for _ in 0..2 {
            let resp = ask(vec![("system", SYSTEM.into()), ("user", OPENING.into())]).await;
            replies.push(answer(&body_bytes(resp).await, false));
        }
        let mut seconds = Vec::new();
        for (reply, next) in replies.iter().zip([
            "Tell me more about its river.",
            "Now compare it with Berlin.",
        ]) {
            let resp = ask(vec![
                ("system", SYSTEM.into()),
                ("user", OPENING.into()),
                ("assistant", reply.clone()),
                ("user", next.into()),
            ])
            .await;
            assert_eq!(resp.status(), StatusCode::OK);
            seconds.push(answer(&body_bytes(resp).await, false));
        }
        // The first conversation goes on: back to a branch older than the second's.
        let resp = ask(vec![
            ("system", SYSTEM.into()),
            ("user", OPENING.into()),
            ("assistant", replies[0].clone()),
            ("user", "Tell me more about its river.".into()),
            ("assistant", seconds[0].clone()),
            ("user", "And its bridges?".into()),
        ])
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        body_bytes(resp).await;
        send(&client, get(&format!("http://{admin}/report?wait=60s"))).await;
    });
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert!(killed.expect("kill runs").success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut lines, &mut rest).expect("reads");
    log.push_str(&rest);
    assert!(child.wait().expect("exits").success(), "{log}");
    let breaches: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("isolation breach"))
        .collect();
    assert_eq!(breaches.len(), 1, "one line for the session: {log}");
    for want in ["session_collision", "first_user_turn", "x-correlation-id"] {
        assert!(breaches[0].contains(want), "{want}: {}", breaches[0]);
    }
    let at = log
        .find("run run-1's report")
        .unwrap_or_else(|| panic!("no report table: {log}"));
    let table = &log[at..];
    assert!(
        table.contains("profiling") && table.contains("first_turn_prefix"),
        "{table}"
    );
}

/// A thread's nice value: field 19 of its `stat`, counted after the `)` that ends its name.
#[cfg(target_os = "linux")]
fn nice_in(stat: &std::path::Path) -> i32 {
    let text = std::fs::read_to_string(stat).unwrap();
    let (_, rest) = text.rsplit_once(')').unwrap();
    // `rest` starts at field 3 (the state).
    rest.split_whitespace()
        .nth(19 - 3)
        .unwrap()
        .parse()
        .unwrap()
}

/// The nice value of every thread of this process named `name`.
#[cfg(target_os = "linux")]
fn nices_of_threads(name: &str) -> Vec<i32> {
    // `comm` holds the first 15 bytes of a thread's name ("kvbust-cache-mo").
    let name = &name[..name.len().min(15)];
    let mut nices = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        // A thread may end between the listing and the read: skip it.
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim_end() == name && dir.join("stat").exists() {
            nices.push(nice_in(&dir.join("stat")));
        }
    }
    nices
}

/// The model's thread runs at `cache_model.nice`, so on a saturated machine it gets only the
/// CPU forwarding leaves; the rest of the process keeps its own. Other tests in this binary run
/// models of their own at the default (19), so the check is that one model thread runs at the
/// value this one configures, 7, which no other test sets. A process already running above 7
/// keeps its value for the model too (lowering the nice back needs privilege).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_models_thread_runs_at_the_configured_nice_value() {
    let own = std::path::Path::new("/proc/thread-self/stat");
    let base = nice_in(own);
    let h = common::start(|c| c.cache_model.nice = 7).await;
    say(&h, &[("system", SYSTEM), ("user", OPENING)], &[]).await;
    // Accounted: the model's thread has served the request, so it set its nice value first.
    let accounted: u64 = report(&h)
        .await
        .rows
        .iter()
        .map(|r| r.accounted_requests)
        .sum();
    assert_eq!(accounted, 1);
    let nices = nices_of_threads("kvbust-cache-model");
    assert!(
        nices.contains(&7.max(base)),
        "model threads' nice values: {nices:?}"
    );
    // Only that thread: the one that started kvbust (and, through it, the model) is unchanged.
    assert_eq!(nice_in(own), base);
    h.shutdown().await;
}

/// `cache_model.threads = 3`: bodies are tokenized on three prepare threads, each named and at
/// `cache_model.nice` (6 here, which no other test sets), and served in forwarding order, so the
/// model still predicts exactly what the mock reports, request for request, as with one thread.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_threads_predictions_still_equal_the_mocks_report_on_niced_threads() {
    let base = nice_in(std::path::Path::new("/proc/thread-self/stat"));
    let conversations = sonnet_conversations(10);
    let h = common::start_with(qwen3_mock(10_000_000), |c| {
        c.cache_model.tokenizer = Some(MockTokenizerSetting::Qwen3);
        c.cache_model.threads = 3;
        c.cache_model.nice = 6;
        c.cache_bust.target = Target::FirstTurnPrefix;
    })
    .await;
    let client = h1();
    for (i, c) in conversations.iter().enumerate() {
        let phase = if i < 5 {
            Phase::Warmup
        } else {
            Phase::Profiling
        };
        run_conversation(&client, &h, c, &[("x-kvbust-phase", phase.as_str())]).await;
    }
    let r = report(&h).await;
    assert_eq!(r.rows.len(), 2, "{:?}", r.rows);
    for row in &r.rows {
        let what = format!("{} {}", row.phase, row.target);
        assert!(row.requests >= 15, "{what}");
        assert_eq!(row.accounted_requests, row.requests, "{what}");
        assert_predicted_as_reported(row, &what);
    }
    assert!(r.rows.iter().any(|row| row.cached_tokens.predicted > 0));
    let want = 6.max(base);
    let prep = nices_of_threads("kvbust-model-prep-0");
    assert_eq!(prep, [want; 3], "prepare threads' nice values");
    assert!(nices_of_threads("kvbust-cache-model").contains(&want));
    h.shutdown().await;
}

/// The run's report, read until `done` holds for it (a condition on the report, not a delay).
async fn report_until(h: &Harness, what: &str, done: impl Fn(&Report) -> bool) -> Report {
    report_poking(h, what, async || {}, done).await
}

/// [`report_until`], with `poke` done before each read: what makes `done` come true, sent
/// again until it has (a PUB drops what it sends before a subscription reaches it).
async fn report_poking(
    h: &Harness,
    what: &str,
    mut poke: impl AsyncFnMut(),
    done: impl Fn(&Report) -> bool,
) -> Report {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        poke().await;
        let resp = send(&h1(), get(&h.admin_url("/report"))).await;
        let r: Report = serde_json::from_slice(&body_bytes(resp).await).expect("a report");
        if done(&r) {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {:?}",
            r.cache_model.kv_events
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// kvbust has received at least one batch of the engine's KV events.
fn has_batches(r: &Report) -> bool {
    r.cache_model
        .kv_events
        .as_ref()
        .is_some_and(|k| k.batches > 0)
}

/// The mock's cache holds 64 blocks, the model's is unbounded, and a workload overflows the
/// mock's: without the mock's KV events the model predicts hits the mock had evicted
/// (divergent requests); following them (`cache_model.kv_events`), it drops each block as the
/// mock evicts it and no request diverges. Requests go one at a time, each after kvbust has
/// received the events of the one before (what an engine's publisher and the next request
/// race for is the timing, not the bookkeeping under test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_the_engines_kv_events_removes_the_divergence_of_its_evictions() {
    let without = overflow_the_mocks_cache(false, false).await;
    let with = overflow_the_mocks_cache(true, false).await;
    println!("divergent requests: without events {without}, with events {with}");
    assert!(
        without > 0,
        "the mock must evict for this test to mean anything"
    );
    assert_eq!(with, 0);
}

/// The same overflow under salt isolation (`cache_bust.method = "salt"`, a conversation per
/// session, so a salt per conversation): the mock publishes each salt in its first block's
/// `extra_keys` and the model, whose first blocks are keyed by the salt, matches those blocks
/// to its own, so following the events still leaves no divergent request: the predictions
/// equal the mock's reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_salt_isolation_following_the_events_still_predicts_what_the_mock_reports() {
    let without = overflow_the_mocks_cache(false, true).await;
    let with = overflow_the_mocks_cache(true, true).await;
    println!("salted, divergent requests: without events {without}, with events {with}");
    assert!(
        without > 0,
        "the mock must evict for this test to mean anything"
    );
    assert_eq!(with, 0);
}

/// A mock of `cache_blocks` blocks of 4 tokens publishing its KV events on a port of its own;
/// the endpoint a subscriber connects to.
async fn publishing_mock(cache_blocks: usize) -> (Arc<Mock>, String) {
    let mock = Mock::new(
        MockConfig {
            cache_blocks,
            block_size: 4,
            kv_events: Some(
                r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:0"}"#
                    .into(),
            ),
            ..common::quick_mock()
        },
        None,
    );
    let endpoint = mock
        .start_kv_events()
        .await
        .expect("binds")
        .expect("on")
        .replace("0.0.0.0", "127.0.0.1");
    (mock, endpoint)
}

/// One run of the overflow above: 40 requests, five conversations' growing prefixes
/// interleaved, through kvbust to a 64-block mock publishing its events; kvbust follows them
/// when `follow`, and isolates each conversation by `cache_salt` when `salt`. Returns the
/// divergent requests, having checked what the events and the salts did.
async fn overflow_the_mocks_cache(follow: bool, salt: bool) -> u64 {
    let (mock, endpoint) = publishing_mock(64).await;
    let h = common::start_with(mock.clone(), |c| {
        c.cache_model.block_size = 4;
        if follow {
            c.cache_model.kv_events = Some(endpoint.clone());
        }
        if salt {
            c.cache_bust.method = kvbust::cachebust::Method::Salt;
            c.cache_bust.target = Target::FirstTurnPrefix;
        }
    })
    .await;
    if follow {
        // A PUB drops what it sends before a subscription reaches it: reset (an event)
        // until kvbust receives one.
        report_poking(
            &h,
            "no event reached kvbust",
            async || mock.reset_prefix_cache(),
            has_batches,
        )
        .await;
        // Every reset sent above reached kvbust before the first request: a late one would
        // empty the model's index after that request (a race a loaded machine lost).
        let queued = mock.kv_events_queued();
        report_until(&h, "kvbust receives every reset", |r| {
            r.cache_model
                .kv_events
                .as_ref()
                .and_then(|k| k.last_seq)
                .is_some_and(|s| s + 1 == queued)
        })
        .await;
    }
    let client = h1();
    for i in 0..40 {
        let k = i % 5;
        let text = format!("conversation {k}: ")
            + &"the quick brown fox jumps over the lazy dog ".repeat(1 + i / 5);
        let body =
            json!({"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 2})
                .to_string();
        let session = format!("conversation-{k}");
        let headers: &[(&str, &str)] = if salt {
            &[("x-correlation-id", &session)]
        } else {
            &[]
        };
        let resp = send(&client, post(&h.url("/v1/chat/completions"), body, headers)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = body_bytes(resp).await;
        if follow {
            let queued = mock.kv_events_queued();
            report_until(&h, "kvbust receives every batch", |r| {
                r.cache_model
                    .kv_events
                    .as_ref()
                    .and_then(|k| k.last_seq)
                    .is_some_and(|s| s + 1 == queued)
            })
            .await;
        }
    }
    if salt {
        // Every request reached the mock salted, one salt per conversation.
        let salts: std::collections::BTreeSet<String> = h
            .mock
            .recorder()
            .requests()
            .iter()
            .filter_map(|r| {
                let v: Value = serde_json::from_slice(&r.body).ok()?;
                v["cache_salt"].as_str().map(str::to_owned)
            })
            .collect();
        assert_eq!(salts.len(), 5, "{salts:?}");
    }
    let r = report(&h).await;
    let row = &r.rows[0];
    assert_eq!(row.accounted_requests, 40, "{row:?}");
    match &r.cache_model.kv_events {
        Some(k) => {
            assert!(follow);
            assert_eq!((k.lost_batches, k.unmatched_blocks), (0, 0), "{k:?}");
            assert!(
                k.complete && k.stored_blocks > 0 && k.removed_blocks > 0,
                "{k:?}"
            );
            assert!(k.evicted_in_model > 0, "{k:?}");
        }
        None => assert!(!follow),
    }
    if row.divergent_requests == 0 {
        assert_eq!(
            row.cached_tokens.reported,
            Some(row.cached_tokens.predicted),
            "{row:?}"
        );
    }
    h.shutdown().await;
    row.divergent_requests
}

/// Through the mock's HTTP API and its ZMQ socket, decoded with kvbust's own reader: a chat
/// with a `cache_salt` stores its blocks in one `BlockStored` whose `extra_keys` hold the salt
/// for the first block only (vLLM 0.33: the salt is an extra key of the block at token 0), the
/// same chat unsalted stores a run with no key at all, and a longer chat under the salt stores
/// only its new blocks, after a parent and with no salt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_salted_requests_stored_event_carries_the_salt_on_its_first_block_only() {
    use kvbust::mock::kv_events::{decode_batch, ExtraKey, KvEvent};
    use zeromq::{Socket as _, SocketRecv as _};
    let (mock, endpoint) = publishing_mock(1000).await;
    let addr = serve_mock(mock.clone()).await;
    let mut sub = zeromq::SubSocket::new();
    sub.connect(&endpoint).await.expect("connects");
    sub.subscribe("").await.expect("subscribes");
    // The socket's messages, decoded, through a channel: waiting on a channel can be given up
    // and resumed without losing a message.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(msg) = sub.recv().await {
            let frames = msg.into_vec();
            let seq = u64::from_be_bytes(frames[1].as_ref().try_into().expect("8 bytes"));
            let events = decode_batch(&frames[2]).expect("decodes").events;
            if tx.send((seq, events)).is_err() {
                return;
            }
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // A PUB drops what it sends before a subscription reaches it: reset until a batch arrives,
    // then read up to the last reset sent.
    let seen = loop {
        mock.reset_prefix_cache();
        if let Ok(got) = tokio::time::timeout(Duration::from_millis(20), rx.recv()).await {
            break got.expect("the subscriber runs").0;
        }
        assert!(tokio::time::Instant::now() < deadline, "no event arrived");
    };
    let mut next = async || {
        tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("a batch in time")
            .expect("the subscriber runs")
    };
    let mut last = seen;
    while last + 1 < mock.kv_events_queued() {
        last = next().await.0;
    }
    let client = h1();
    let text = "the quick brown fox jumps over the lazy dog ".repeat(6);
    let mut stored = Vec::new();
    for (content, salt) in [
        (text.clone(), Some("tenant-a")),
        (text.clone(), None),
        (text.clone() + &"and runs away ".repeat(8), Some("tenant-a")),
    ] {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 2});
        if let Some(s) = salt {
            body["cache_salt"] = json!(s);
        }
        let url = format!("http://{addr}/v1/chat/completions");
        let resp = send(&client, post(&url, body.to_string(), &[])).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = body_bytes(resp).await;
        let (_, events) = next().await;
        let run = events
            .into_iter()
            .find(|e| matches!(e, KvEvent::Stored { .. }))
            .expect("a run stored");
        stored.push(run);
    }
    let keys = |e: &KvEvent| match e {
        KvEvent::Stored {
            parent,
            extra_keys,
            block_hashes,
            ..
        } => {
            let k = extra_keys.clone().expect("vLLM publishes a list");
            assert_eq!(k.len(), block_hashes.len());
            (parent.is_some(), k)
        }
        other => panic!("{other:?}"),
    };
    let (has_parent, first) = keys(&stored[0]);
    assert!(!has_parent && first.len() > 2);
    assert_eq!(first[0], Some(vec![ExtraKey::Text("tenant-a".into())]));
    assert!(first[1..].iter().all(Option::is_none), "{first:?}");
    assert_eq!(stored[0].first_block_salt(), Some("tenant-a"));
    let (has_parent, plain) = keys(&stored[1]);
    assert!(
        !has_parent && plain.iter().all(Option::is_none),
        "{plain:?}"
    );
    let (has_parent, longer) = keys(&stored[2]);
    assert!(
        has_parent && longer.iter().all(Option::is_none),
        "{longer:?}"
    );
    assert_eq!(stored[2].first_block_salt(), None);
}

/// A publisher whose batches skip a seq (2 and 5..=6 never sent): kvbust counts three lost
/// batches and marks the events incomplete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_in_the_event_seq_counts_lost_batches() {
    use kvbust::mock::kv_events::{encode_batch, Batch, KvEvent};
    use zeromq::{Socket as _, SocketSend as _};
    let mut publisher = zeromq::PubSocket::new();
    let bound = publisher.bind("tcp://127.0.0.1:0").await.expect("binds");
    let h = common::start(|c| c.cache_model.kv_events = Some(bound.to_string())).await;
    let batch = |seq: u64| {
        let payload = encode_batch(&Batch {
            ts: 1.0,
            events: vec![KvEvent::Cleared],
            data_parallel_rank: Some(0),
        });
        zeromq::ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ])
        .expect("three frames")
    };
    // Until the subscription reaches the publisher, what it sends is dropped: send seq 0
    // until kvbust has one (a lower seq than the rest: never a gap).
    report_poking(
        &h,
        "no batch reached kvbust",
        async || publisher.send(batch(0)).await.expect("sends"),
        has_batches,
    )
    .await;
    for seq in [1, 3, 4, 7] {
        publisher.send(batch(seq)).await.expect("sends");
    }
    let r = report_until(&h, "the last batch arrives", |r| {
        r.cache_model.kv_events.as_ref().and_then(|k| k.last_seq) == Some(7)
    })
    .await;
    let k = r.cache_model.kv_events.expect("following");
    assert_eq!(k.lost_batches, 3, "{k:?}");
    assert!(!k.complete);
    h.shutdown().await;
}
