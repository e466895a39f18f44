//! End to end against a real model server (llama.cpp via the `xllamacpp` wheel, SmolLM2-135M):
//! run when `KVBUST_REAL_UPSTREAM` names one (`tests/real_upstream/llamacpp.sh start` prints it);
//! otherwise each test says on stderr that it did not run. The server has one slot, so the tests
//! take turns through a lock, and each uses its own random text so earlier cache entries never
//! help it.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use http::StatusCode;
use http_body_util::BodyExt;
use kvbust::cachebust::Target;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Guard for one request: a cold prefill of a few hundred tokens takes seconds on 2 cores.
const LIMIT: Duration = Duration::from_secs(180);

pub(crate) static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The real server's URL, or a loud note on stderr (written past the test harness's capture)
/// that this test did not run.
fn upstream(test: &str) -> Option<String> {
    match std::env::var("KVBUST_REAL_UPSTREAM") {
        Ok(u) if !u.trim().is_empty() => Some(u.trim().trim_end_matches('/').to_string()),
        _ => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "NOT RUN: real-upstream test `{test}`: KVBUST_REAL_UPSTREAM is not set \
                 (start a server with `tests/real_upstream/llamacpp.sh start`)"
            );
            None
        }
    }
}

fn nonce() -> String {
    kvbust::cachebust::random_benchmark_id()
}

/// About 300 tokens of text that no earlier request has sent.
fn long_system_prompt() -> String {
    let n = nonce();
    format!(
        "Session {n}. You are the support assistant of Northwind Outfitters, a shop for camping \
         gear. Answer in one short sentence. Policies: tents can be returned within 30 days if \
         unused; sleeping bags carry a five-year warranty against seam failure; stoves carry a \
         two-year warranty; orders over 80 dollars ship free within the country; express \
         shipping takes two working days and costs 12 dollars; international orders take ten to \
         fifteen working days; gift cards never expire; price matching applies to identical \
         items sold by authorised dealers within 14 days of purchase; rental gear must be \
         cleaned before return or a 15 dollar fee applies; the flagship store in Portland opens \
         at nine and closes at seven on weekdays, ten to five on weekends; customer service \
         answers the phone from eight to eight; loyalty members earn one point per dollar and \
         can redeem 100 points for a 5 dollar voucher; damaged items must be reported within 48 \
         hours of delivery with a photo; repairs of zippers and buckles are free for the first \
         year; batteries and fuel canisters cannot be shipped by air; custom embroidery takes \
         an extra week; bulk orders for scout groups get ten percent off. Reference code {n}."
    )
}

fn chat(system: &str, turns: &[(&str, &str)], max_tokens: u32, stream: bool) -> String {
    let mut messages = vec![json!({"role": "system", "content": system})];
    for (role, content) in turns {
        messages.push(json!({"role": role, "content": content}));
    }
    let mut body = json!({
        "model": "smollm2", "messages": messages, "max_tokens": max_tokens,
        "temperature": 0, "stream": stream,
    });
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body.to_string()
}

#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    prompt: u64,
    cached: u64,
}

fn usage_of(v: &Value) -> Usage {
    let u = &v["usage"];
    Usage {
        prompt: u["prompt_tokens"].as_u64().expect("usage.prompt_tokens"),
        cached: u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    }
}

/// Sends a non-streaming chat through kvbust and returns its usage and reply text.
async fn ask(h: &Harness, body: String, headers: &[(&str, &str)]) -> (Usage, String) {
    let resp = send_within(
        &h1(),
        post(&h.url("/v1/chat/completions"), body, headers),
        LIMIT,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let v = json(resp).await;
    (
        usage_of(&v),
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

async fn server_metric(upstream: &str, name: &str) -> f64 {
    let resp = send_within(&h1(), get(&format!("{upstream}/metrics")), LIMIT).await;
    let text = String::from_utf8(body_bytes(resp).await.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.trim().parse().ok()))
        .unwrap_or_else(|| panic!("server metric {name} missing"))
}

fn kvbust_metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.trim().parse().ok()))
        .unwrap_or(0)
}

/// A TCP relay between kvbust and the server that records what the server sent.
async fn tap(upstream: &str) -> (String, Arc<Mutex<Vec<u8>>>) {
    let target = upstream.trim_start_matches("http://").to_string();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = l.accept().await {
            let mut server = TcpStream::connect(&target).await.unwrap();
            let seen = seen2.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.split();
                let (mut sr, mut sw) = server.split();
                let up = tokio::io::copy(&mut cr, &mut sw);
                let down = async {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        seen.lock().unwrap().extend_from_slice(&buf[..n]);
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                tokio::select! { _ = up => {}, _ = down => {} }
            });
        }
    });
    (format!("http://{addr}"), seen)
}

/// The body of one recorded HTTP/1.1 response (chunked or sized).
fn http_body(raw: &[u8]) -> Vec<u8> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head")
        + 4;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let mut rest = &raw[split..];
    if !head.contains("transfer-encoding: chunked") {
        return rest.to_vec();
    }
    let mut out = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&rest[..line_end])
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .expect("chunk size");
        rest = &rest[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[tokio::test]
async fn streams_and_bodies_arrive_exactly_as_the_server_sent_them() {
    let Some(up) = upstream("streams_and_bodies_arrive_exactly_as_the_server_sent_them") else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let cases = [
        ("/v1/chat/completions", chat("Answer briefly.", &[("user", "Name a color.")], 12, true), true),
        ("/v1/chat/completions", chat("Answer briefly.", &[("user", "Name a fruit.")], 12, false), false),
        ("/v1/completions", json!({"model":"smollm2","prompt":"The capital of France is","max_tokens":12,"stream":true,"stream_options":{"include_usage":true}}).to_string(), true),
        ("/v1/completions", json!({"model":"smollm2","prompt":"Two plus two is","max_tokens":12}).to_string(), false),
    ];
    for (path, body, stream) in cases {
        let t0 = Instant::now();
        let (tap_url, seen) = tap(&up).await;
        let h = start_proxy(&tap_url, |c| c.cache_bust.target = Target::FirstTurnPrefix).await;
        let resp = send_within(
            &h1(),
            post(
                &h.url(path),
                body.clone(),
                &[("x-correlation-id", &nonce())],
            ),
            LIMIT,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let client_bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let server_bytes = http_body(&seen.lock().unwrap());
        assert_eq!(
            String::from_utf8_lossy(&client_bytes),
            String::from_utf8_lossy(&server_bytes),
            "{path} stream={stream}: the client must see exactly what the server sent"
        );
        if stream {
            let data = sse_data(&client_bytes);
            assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
            let usage = data
                .iter()
                .rev()
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .find(|v| v["usage"].is_object());
            assert!(usage.is_some(), "{path}: the usage chunk arrived");
        } else {
            let v: Value = serde_json::from_slice(&client_bytes).unwrap();
            assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        }
        eprintln!(
            "intact {path} stream={stream}: {} bytes in {:?}",
            client_bytes.len(),
            t0.elapsed()
        );
        h.shutdown().await;
    }
}

#[tokio::test]
async fn warmup_isolation_defeats_a_real_prefix_cache_and_counters_agree() {
    let Some(up) = upstream("warmup_isolation_defeats_a_real_prefix_cache_and_counters_agree")
    else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let t0 = Instant::now();
    let cached_before = server_metric(&up, "llamacpp:prompt_tokens_cached_total").await;
    let prompt_before = server_metric(&up, "llamacpp:prompt_tokens_total").await;

    let h = start_proxy(&up, |c| c.cache_bust.target = Target::WarmupIsolationSystem).await;
    let body = chat(
        &long_system_prompt(),
        &[("user", "Can I return a tent?")],
        8,
        false,
    );
    let (warm, _) = ask(&h, body.clone(), &[("x-kvbust-phase", "warmup")]).await;
    let (prof, _) = ask(&h, body.clone(), &[("x-kvbust-phase", "profiling")]).await;
    eprintln!("isolation: warmup {warm:?}, profiling {prof:?}");
    assert!(prof.prompt > 250, "a few hundred tokens of system prompt");
    assert!(
        prof.cached <= 8,
        "profiling reused only the chat template's first tokens, got {prof:?}"
    );

    // The same pair through target `none`: the second request is served from the cache.
    let none = start_proxy(&up, |_| {}).await;
    let body = chat(
        &long_system_prompt(),
        &[("user", "Can I return a tent?")],
        8,
        false,
    );
    let (first, _) = ask(&none, body.clone(), &[("x-kvbust-phase", "warmup")]).await;
    let (second, _) = ask(&none, body, &[("x-kvbust-phase", "profiling")]).await;
    eprintln!("none: first {first:?}, second {second:?}");
    assert!(
        second.cached + 1 >= second.prompt,
        "identical prompt cached: {second:?}"
    );

    // kvbust's counters equal what the server reported, per phase, and the server's own totals.
    let m = metrics_text(&h).await;
    let series = |kind: &str, phase: &str| {
        kvbust_metric(&m, &format!("kvbust_upstream_{kind}_tokens_total{{phase=\"{phase}\",target=\"warmup_isolation_system\"}}"))
    };
    assert_eq!(series("cached", "warmup"), warm.cached);
    assert_eq!(series("cached", "profiling"), prof.cached);
    assert_eq!(series("prompt", "warmup"), warm.prompt);
    assert_eq!(series("prompt", "profiling"), prof.prompt);
    let m2 = metrics_text(&none).await;
    let none_cached = kvbust_metric(
        &m2,
        "kvbust_upstream_cached_tokens_total{phase=\"warmup\",target=\"none\"}",
    ) + kvbust_metric(
        &m2,
        "kvbust_upstream_cached_tokens_total{phase=\"profiling\",target=\"none\"}",
    );
    let none_prompt = kvbust_metric(
        &m2,
        "kvbust_upstream_prompt_tokens_total{phase=\"warmup\",target=\"none\"}",
    ) + kvbust_metric(
        &m2,
        "kvbust_upstream_prompt_tokens_total{phase=\"profiling\",target=\"none\"}",
    );
    let server_cached =
        server_metric(&up, "llamacpp:prompt_tokens_cached_total").await - cached_before;
    let server_prompt = server_metric(&up, "llamacpp:prompt_tokens_total").await - prompt_before;
    eprintln!(
        "totals: kvbust cached {} prompt {}; server cached {server_cached} prompt {server_prompt}; {:?}",
        series("cached", "warmup") + series("cached", "profiling") + none_cached,
        series("prompt", "warmup") + series("prompt", "profiling") + none_prompt,
        t0.elapsed()
    );
    assert_eq!(
        (series("cached", "warmup") + series("cached", "profiling") + none_cached) as f64,
        server_cached
    );
    // llama.cpp's prompt counter leaves cached tokens out; usage.prompt_tokens includes them.
    let kvbust_prompt = series("prompt", "warmup") + series("prompt", "profiling") + none_prompt;
    assert_eq!(kvbust_prompt as f64, server_prompt + server_cached);
    h.shutdown().await;
    none.shutdown().await;
}

#[tokio::test]
async fn first_turn_prefix_shares_the_system_prompt_but_not_first_turns() {
    let Some(up) = upstream("first_turn_prefix_shares_the_system_prompt_but_not_first_turns")
    else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let t0 = Instant::now();
    let h = start_proxy(&up, |c| c.cache_bust.target = Target::FirstTurnPrefix).await;
    let system = long_system_prompt();
    // llama.cpp (one slot) looks for a better cached prefix only when the new request keeps less
    // than half of the slot's tokens, so the first turn is longer than the system prompt: then a
    // session's second turn finds its own first turn again after another session ran.
    let first = format!(
        "Here is my order history, please keep it in mind. {} What are my options for the tent?",
        (1..=40)
            .map(|i| format!(
                "Order {i}: item {} shipped on day {}.",
                i * 7 % 23,
                i * 3 % 29
            ))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let first = first.as_str();
    let (a1, reply) = ask(
        &h,
        chat(&system, &[("user", first)], 8, false),
        &[("x-correlation-id", "session-a")],
    )
    .await;
    let (b1, _) = ask(
        &h,
        chat(&system, &[("user", first)], 8, false),
        &[("x-correlation-id", "session-b")],
    )
    .await;
    let turns = [
        ("user", first),
        ("assistant", reply.as_str()),
        ("user", "And how long does express shipping take?"),
    ];
    let (a2, _) = ask(
        &h,
        chat(&system, &turns, 8, false),
        &[("x-correlation-id", "session-a")],
    )
    .await;
    eprintln!(
        "sessions: a1 {a1:?}, b1 {b1:?}, a2 {a2:?}, {:?}",
        t0.elapsed()
    );
    // B reuses the shared system prompt (hundreds of tokens) ...
    assert!(b1.cached >= 250, "system prompt reused: {b1:?}");
    // ... but not A's first turn (hundreds of tokens after A's own marker).
    assert!(
        b1.cached + 300 <= b1.prompt,
        "first turn not shared: {b1:?}"
    );
    // A's second turn reuses everything A sent before, its first turn included.
    assert!(
        a2.cached + 1 >= a1.prompt,
        "own history reused: a1 {a1:?}, a2 {a2:?}"
    );
    h.shutdown().await;
}

/// llama.cpp's count of generated tokens, cancelled requests' included.
async fn tokens_predicted(up: &str) -> u64 {
    let text = send_within(&h1(), get(&format!("{up}/metrics")), LIMIT)
        .await
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&text).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("llamacpp:tokens_predicted_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no llamacpp:tokens_predicted_total in /metrics:\n{text}"))
        as u64
}

#[tokio::test]
async fn client_disconnect_cancels_the_generation_upstream() {
    let Some(up) = upstream("client_disconnect_cancels_the_generation_upstream") else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let h = start_proxy(&up, |_| {}).await;
    // `ignore_eos` makes the server generate exactly MAX tokens unless the request is
    // cancelled, so the tokens it generated tell a cancelled request from one left running,
    // whatever the machine's load (llama.cpp counts a cancelled request's tokens too:
    // tests/real_upstream/README.md). MAX is far more than a loaded proxy needs to pass the
    // hang-up on: seconds of generation on any machine.
    const MAX: u64 = 2000;
    let before = tokens_predicted(&up).await;
    let body = json!({
        "model": "smollm2", "max_tokens": MAX, "ignore_eos": true, "stream": true, "temperature": 0,
        "messages": [{"role": "user", "content": format!("{} Write a very long story about a lighthouse.", nonce())}],
    })
    .to_string();
    let resp = send_within(
        &h1(),
        post(&h.url("/v1/chat/completions"), body, &[]),
        LIMIT,
    )
    .await;
    let mut stream = resp.into_body();
    let mut events = 0;
    while events < 5 {
        let f = tokio::time::timeout(Duration::from_secs(60), stream.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if f.data_ref()
            .is_some_and(|d| d.windows(9).any(|w| w == b"\"content\""))
        {
            events += 1;
        }
    }
    let processing = |v: &Value| {
        v.as_array()
            .is_some_and(|s| s.iter().any(|s| s["is_processing"] == true))
    };
    let slots = json(send_within(&h1(), get(&format!("{up}/slots")), LIMIT).await).await;
    assert!(
        processing(&slots),
        "generation under way before the disconnect"
    );
    let hung_up = Instant::now();
    drop(stream);
    // Poll the server's own view until the slot is idle. The deadline only bounds a failing
    // run; whether the request was cancelled is judged by its token count below.
    loop {
        let slots = json(send_within(&h1(), get(&format!("{up}/slots")), LIMIT).await).await;
        if !processing(&slots) {
            break;
        }
        assert!(
            hung_up.elapsed() < Duration::from_secs(600),
            "slot still busy after {:?}",
            hung_up.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let generated = tokens_predicted(&up).await - before;
    eprintln!(
        "slot idle {:?} after the client hung up, {generated} of {MAX} tokens generated",
        hung_up.elapsed()
    );
    assert!(
        (5..MAX).contains(&generated),
        "the hang-up must cancel the generation: {generated} of {MAX} tokens generated"
    );
    h.shutdown().await;
}

/// The cache model beside a real engine: `/report` shows the model's prediction next to what
/// llama.cpp reported. llama.cpp keeps one slot's tokens (a cache per token, not vLLM's blocks)
/// and counts in SmolLM2's tokens while the model counts in the shipped Qwen3 tokenizer's, so
/// the two are compared, not required equal: both must see the second session reuse the shared
/// system prompt, and a session's second turn reuse its first.
#[tokio::test]
async fn the_report_shows_the_models_prediction_beside_the_servers_report() {
    let Some(up) = upstream("the_report_shows_the_models_prediction_beside_the_servers_report")
    else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let h = start_proxy(&up, |c| {
        c.cache_bust.target = Target::FirstTurnPrefix;
        c.cache_model.tokenizer = Some(kvbust::mock::MockTokenizerSetting::Qwen3);
        c.cache_model.block_size = 1;
    })
    .await;
    let system = long_system_prompt();
    let first = "Which tents can I still return, and what does the warranty cover?";
    let (_, reply) = ask(
        &h,
        chat(&system, &[("user", first)], 8, false),
        &[("x-correlation-id", "report-a")],
    )
    .await;
    let turns = [
        ("user", first),
        ("assistant", reply.as_str()),
        ("user", "And how long does express shipping take?"),
    ];
    ask(
        &h,
        chat(&system, &turns, 8, false),
        &[("x-correlation-id", "report-a")],
    )
    .await;
    ask(
        &h,
        chat(&system, &[("user", first)], 8, false),
        &[("x-correlation-id", "report-b")],
    )
    .await;
    let resp = send_within(&h1(), get(&h.admin_url("/report?wait=30s")), LIMIT).await;
    let report: kvbust::report::Report = serde_json::from_slice(&body_bytes(resp).await).unwrap();
    let row = &report.rows[0];
    eprintln!(
        "llama.cpp vs the cache model: requests {} (accounted {}), prompt tokens reported {:?} \
         predicted {}, cached tokens reported {:?} predicted {}, reuse {:?}, breaches {:?}",
        row.requests,
        row.accounted_requests,
        row.prompt_tokens.reported,
        row.prompt_tokens.predicted,
        row.cached_tokens.reported,
        row.cached_tokens.predicted,
        row.reuse,
        row.breaches
    );
    assert_eq!((row.requests, row.accounted_requests), (3, 3), "{row:?}");
    assert_ne!(report.upstream.reports_cached_tokens, Some(false));
    let reported = row
        .cached_tokens
        .reported
        .expect("llama.cpp reports cached tokens");
    // Both saw the second turn reuse the first and the second session reuse the system prompt.
    assert!(
        reported >= 250 && row.cached_tokens.predicted >= 250,
        "{row:?}"
    );
    assert!(
        row.reuse.same_session > 0 && row.reuse.other_session > 0,
        "{row:?}"
    );
    assert_eq!(row.breaches.total(), 0, "{row:?}");
    h.shutdown().await;
}
