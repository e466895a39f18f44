//! The built-in mock model server over real HTTP on 127.0.0.1 port 0: HTTP/1.1 and h2c, streaming and not, every
//! API shape (chat, completions, Responses, Anthropic Messages), the simulated prefix cache and its reset, token
//! counts with the shipped Qwen3 tokenizer, cancellation, the recorder and its byte budget, and graceful
//! shutdown. No fixed ports; no sleeps used as synchronisation (waits go through the recorder, with timeouts
//! only as failure guards).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvbust::mock::{self, Mock, MockConfig, MockTokenizer};
use kvbust::synth::tokenizer::Tokenizer;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

const GUARD: Duration = Duration::from_secs(10);

struct Server {
    addr: SocketAddr,
    mock: Arc<Mock>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(cfg: MockConfig) -> Server {
        Server::start_with(cfg, None).await
    }

    /// A mock counting with the shipped Qwen3 tokenizer and its chat template (the default `mock.tokenizer`).
    async fn start_qwen3(cfg: MockConfig) -> Server {
        let tokenizer = MockTokenizer::hf(qwen3()).expect("the Qwen3 chat template compiles");
        Server::start_with(cfg, Some(tokenizer)).await
    }

    async fn start_with(cfg: MockConfig, tokenizer: Option<MockTokenizer>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
        let addr = listener.local_addr().expect("local addr");
        let mock = Mock::new(cfg, tokenizer);
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(mock::serve(listener, mock.clone(), async {
            let _ = rx.await;
        }));
        Server {
            addr,
            mock,
            stop: Some(tx),
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Signals shutdown and waits (bounded) for `serve` to return.
    async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let res = timeout(GUARD, &mut self.task)
            .await
            .expect("serve returns after shutdown");
        res.expect("serve task did not panic")
            .expect("serve returned Ok");
    }
}

/// The shipped Qwen3 tokenizer, loaded once per test binary.
fn qwen3() -> Arc<Tokenizer> {
    static QWEN3: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    QWEN3
        .get_or_init(|| Arc::new(Tokenizer::default_qwen3().expect("shipped tokenizer loads")))
        .clone()
}

/// Qwen3 tokens of `text` alone.
fn n_tokens(text: &str) -> u64 {
    qwen3().encode(text).expect("encodes").len() as u64
}

/// Qwen3's chat template: `<|im_start|>ROLE\n … <|im_end|>\n` costs 5 tokens per message, the assistant
/// header `<|im_start|>assistant\n` 3 (the mock counts the rendered template, as vLLM does).
fn qwen3_prompt(contents: &[&str]) -> u64 {
    contents.iter().map(|c| n_tokens(c) + 5).sum::<u64>() + 3
}

/// What a repeat of an `n`-token prompt reads from a 16-token-block cache: every full block but never the
/// whole prompt.
fn repeat_hit(n: u64) -> u64 {
    (n - 1) / 16 * 16
}

/// Fast pacing so tests do not wait on the defaults.
fn quick() -> MockConfig {
    MockConfig {
        base_delay: Duration::ZERO,
        prefill_per_token: Duration::ZERO,
        inter_token: Duration::from_millis(1),
        ..MockConfig::default()
    }
}

type TestClient = Client<HttpConnector, Full<Bytes>>;

fn client(h2: bool) -> TestClient {
    let mut b = Client::builder(TokioExecutor::new());
    if h2 {
        b.http2_only(true);
    }
    b.build_http()
}

fn version(h2: bool) -> Version {
    if h2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    }
}

async fn send(
    client: &TestClient,
    method: Method,
    url: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Response<Incoming> {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(body.into())).expect("valid request");
    timeout(GUARD, client.request(req))
        .await
        .expect("response in time")
        .expect("request succeeds")
}

async fn post_json(
    client: &TestClient,
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Response<Incoming> {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    send(client, Method::POST, url, body.to_string(), &h).await
}

async fn body_bytes(resp: Response<Incoming>) -> Bytes {
    timeout(GUARD, resp.into_body().collect())
        .await
        .expect("body in time")
        .expect("body reads")
        .to_bytes()
}

async fn body_json(resp: Response<Incoming>) -> Value {
    let bytes = body_bytes(resp).await;
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

/// The `data:` payloads of an SSE body, in order.
fn sse_data(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("SSE is UTF-8");
    assert!(
        text.ends_with("\n\n"),
        "SSE body ends with a blank line: {text:?}"
    );
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event is a data line: {e:?}"))
                .to_owned()
        })
        .collect()
}

fn chat(max_tokens: u32, stream: bool, include_usage: bool, prompt: &str) -> Value {
    let mut v = json!({
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": prompt},
        ],
        "max_tokens": max_tokens,
        "stream": stream,
    });
    if include_usage {
        v["stream_options"] = json!({"include_usage": true});
    }
    v
}

fn long_prompt(first: &str) -> String {
    let mut p = first.to_owned();
    for i in 0..150 {
        p.push_str(&format!(
            " sentence number {i} about the prefix cache and its blocks."
        ));
    }
    p
}

fn assert_usage(usage: &Value, completion_tokens: u64) {
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(prompt > 0, "{usage}");
    assert_eq!(usage["completion_tokens"], completion_tokens, "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(prompt + completion_tokens),
        "{usage}"
    );
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"].is_u64(),
        "{usage}"
    );
}

#[tokio::test]
async fn non_streaming_chat_over_http1_and_h2c() {
    let server = Server::start(quick()).await;
    for h2 in [false, true] {
        let client = client(h2);
        let resp = post_json(
            &client,
            &server.url("/v1/chat/completions"),
            &chat(5, false, false, "Hello there"),
            &[],
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.version(), version(h2));
        assert_eq!(resp.headers()["content-type"], "application/json");
        let v = body_json(resp).await;
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], "test-model");
        assert!(
            v["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("chatcmpl-")),
            "{v}"
        );
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let content = v["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        assert_eq!(content.split(' ').count(), 5, "{content:?}");
        assert_usage(&v["usage"], 5);
    }
    let versions: Vec<Version> = server
        .mock
        .recorder()
        .requests()
        .iter()
        .map(|r| r.version)
        .collect();
    assert_eq!(versions, [Version::HTTP_11, Version::HTTP_2]);
    server.shutdown().await;
}

#[tokio::test]
async fn streaming_chat_over_http1_and_h2c() {
    let server = Server::start(quick()).await;
    for (i, h2) in [false, true].into_iter().enumerate() {
        let client = client(h2);
        let resp = post_json(
            &client,
            &server.url("/v1/chat/completions"),
            &chat(7, true, true, "Stream please"),
            &[],
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.version(), version(h2));
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let events = sse_data(&body_bytes(resp).await);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| {
                serde_json::from_str(e).unwrap_or_else(|err| panic!("chunk is JSON ({err}): {e}"))
            })
            .collect();
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert!(
                c.as_object().is_some_and(|o| o.contains_key("usage")),
                "include_usage → usage on every chunk"
            );
        }
        let content: Vec<&Value> = chunks
            .iter()
            .filter(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            })
            .collect();
        assert_eq!(content.len(), 7, "one event per token");
        assert_eq!(content[0]["choices"][0]["delta"]["role"], "assistant");
        let finish = &chunks[chunks.len() - 2];
        assert_eq!(finish["choices"][0]["finish_reason"], "length");
        let usage = &chunks[chunks.len() - 1];
        assert_eq!(usage["choices"], json!([]));
        assert_usage(&usage["usage"], 7);
        assert_eq!(chunks.len(), 7 + 2);
        assert_eq!(server.mock.recorder().streams_completed(), i as u64 + 1);
    }
    assert_eq!(server.mock.recorder().streams_cancelled(), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn streaming_completions_without_usage() {
    let server = Server::start(quick()).await;
    let client = client(false);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 4, "stream": true});
    let resp = post_json(&client, &server.url("/v1/completions"), &body, &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let events = sse_data(&body_bytes(resp).await);
    assert_eq!(
        events.len(),
        4 + 1 + 1,
        "4 tokens, finish, [DONE]: {events:?}"
    );
    assert_eq!(events[5], "[DONE]");
    for e in &events[..4] {
        let c: Value = serde_json::from_str(e).expect("JSON chunk");
        assert_eq!(c["object"], "text_completion");
        assert!(c["choices"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty()));
        assert!(c.get("usage").is_none(), "no usage without include_usage");
    }
    let finish: Value = serde_json::from_str(&events[4]).expect("JSON chunk");
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    server.shutdown().await;
}

#[tokio::test]
async fn output_is_deterministic_and_max_completion_tokens_wins() {
    let server = Server::start(quick()).await;
    let client = client(false);
    let mut body = chat(3, false, false, "Same prompt");
    body["max_completion_tokens"] = json!(6);
    let a =
        body_json(post_json(&client, &server.url("/v1/chat/completions"), &body, &[]).await).await;
    let b =
        body_json(post_json(&client, &server.url("/v1/chat/completions"), &body, &[]).await).await;
    assert_eq!(a["choices"], b["choices"]);
    assert_eq!(a["usage"]["completion_tokens"], 6);
    server.shutdown().await;
}

#[tokio::test]
async fn prefix_cache_hits_on_repeat_and_misses_after_a_changed_start() {
    let server = Server::start(quick()).await;
    let client = client(false);
    let url = server.url("/v1/chat/completions");
    let cached = |v: &Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens")
    };

    let first = body_json(
        post_json(
            &client,
            &url,
            &chat(2, false, false, &long_prompt("Alpha")),
            &[],
        )
        .await,
    )
    .await;
    assert_eq!(cached(&first), 0);
    let prompt_tokens = first["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens");
    assert!(prompt_tokens > 256, "a long prompt: {prompt_tokens}");

    let again = post_json(
        &client,
        &url,
        &chat(2, false, false, &long_prompt("Alpha")),
        &[],
    )
    .await;
    let header = cached_header_value(&again);
    let again = body_json(again).await;
    assert!(cached(&again) > 0, "{again}");
    assert_eq!(
        header,
        cached(&again).to_string(),
        "x-mock-cached-tokens matches usage"
    );
    assert!(cached(&again) < prompt_tokens, "never the whole prompt");
    assert_eq!(cached(&again) % 16, 0, "whole blocks");

    let changed = body_json(
        post_json(
            &client,
            &url,
            &chat(2, false, false, &long_prompt("Omega")),
            &[],
        )
        .await,
    )
    .await;
    assert_eq!(cached(&changed), 0, "a changed start misses: {changed}");

    // Streaming usage reports the cache the same way.
    let streamed = post_json(
        &client,
        &url,
        &chat(2, true, true, &long_prompt("Omega")),
        &[],
    )
    .await;
    let events = sse_data(&body_bytes(streamed).await);
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).expect("usage chunk");
    assert!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .is_some_and(|c| c > 0),
        "{usage}"
    );
    server.shutdown().await;
}

fn cached_header_value(resp: &Response<Incoming>) -> String {
    resp.headers()
        .get("x-mock-cached-tokens")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn client_dropping_the_body_mid_stream_cancels_the_stream() {
    let server = Server::start(MockConfig {
        inter_token: Duration::from_millis(5),
        ..quick()
    })
    .await;
    for (i, h2) in [false, true].into_iter().enumerate() {
        let client = client(h2);
        let resp = post_json(
            &client,
            &server.url("/v1/chat/completions"),
            &chat(10_000, true, false, "long"),
            &[],
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        let first = timeout(GUARD, body.frame())
            .await
            .expect("first event in time");
        let first = first
            .expect("a frame")
            .expect("no error")
            .into_data()
            .expect("a data frame");
        assert!(first.starts_with(b"data: {"), "{first:?}");
        drop(body);
        drop(client);
        timeout(GUARD, server.mock.recorder().wait_cancelled(i as u64 + 1))
            .await
            .unwrap_or_else(|_| panic!("the mock saw the stream cancelled (h2: {h2})"));
    }
    let rec = server.mock.recorder();
    assert_eq!(
        (
            rec.streams_started(),
            rec.streams_completed(),
            rec.streams_cancelled()
        ),
        (2, 0, 2)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn client_leaving_during_the_first_token_delay_cancels_the_stream() {
    let server = Server::start(quick()).await;
    let client = client(false);
    let body = chat(3, true, false, "slow start");
    let pending = tokio::spawn({
        let client = client.clone();
        let url = server.url("/v1/chat/completions");
        async move { post_json(&client, &url, &body, &[("x-mock-first-token-delay", "30s")]).await }
    });
    // The stream is counted as started in the same poll that records the request (no await in between), so
    // once the request is recorded, leaving counts as a cancelled stream.
    timeout(GUARD, server.mock.recorder().wait_requests(1))
        .await
        .expect("request arrives");
    pending.abort();
    timeout(GUARD, server.mock.recorder().wait_cancelled(1))
        .await
        .expect("the stream counts as cancelled");
    server.shutdown().await;
}

#[tokio::test]
async fn recorder_keeps_exact_bytes_and_unknown_paths_and_methods() {
    let server = Server::start(quick()).await;
    let client = client(false);
    // Odd spacing, key order, number spelling and unicode must survive byte for byte.
    let raw = "{ \"stream\":false,\"messages\" :[{\"role\":\"user\",\"content\":\"h\u{e9}llo \\u00e9 \u{1f980}\"}],\n  \"max_tokens\":2, \"temperature\":1.0e0, \"zzz_unknown\":[1,2,3]}";
    let resp = send(
        &client,
        Method::POST,
        &server.url("/v1/chat/completions?api-version=1"),
        raw,
        &[("content-type", "application/json"), ("x-custom", "kept")],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let _ = body_bytes(resp).await;

    let resp = send(&client, Method::PUT, &server.url("/phase"), "warmup", &[]).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let err = body_json(resp).await;
    assert!(
        err["error"]["message"].is_string()
            && err["error"]["type"].is_string()
            && err["error"]["code"].is_string()
    );

    let resp = send(
        &client,
        Method::POST,
        &server.url("/v1/embeddings"),
        "{}",
        &[],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let _ = body_bytes(resp).await;

    let resp = send(
        &client,
        Method::DELETE,
        &server.url("/v1/chat/completions"),
        "",
        &[],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    let _ = body_bytes(resp).await;

    let resp = send(
        &client,
        Method::POST,
        &server.url("/v1/chat/completions"),
        "{not json",
        &[],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(body_json(resp).await["error"]["code"], "invalid_json");

    timeout(GUARD, server.mock.recorder().wait_requests(5))
        .await
        .expect("all recorded");
    let reqs = server.mock.recorder().requests();
    assert_eq!(reqs.len(), 5);
    assert_eq!(reqs[0].method, Method::POST);
    assert_eq!(reqs[0].uri, "/v1/chat/completions?api-version=1");
    assert_eq!(&reqs[0].body[..], raw.as_bytes());
    assert_eq!(reqs[0].headers["x-custom"], "kept");
    assert_eq!(reqs[0].version, Version::HTTP_11);
    assert_eq!(
        (&reqs[1].method, reqs[1].uri.path(), &reqs[1].body[..]),
        (&Method::PUT, "/phase", &b"warmup"[..])
    );
    assert_eq!(reqs[2].uri, "/v1/embeddings");
    assert_eq!(reqs[3].method, Method::DELETE);
    assert_eq!(&reqs[4].body[..], b"{not json");
    server.shutdown().await;
}

#[tokio::test]
async fn health_and_models() {
    let server = Server::start(quick()).await;
    for h2 in [false, true] {
        let client = client(h2);
        let resp = send(&client, Method::GET, &server.url("/health"), "", &[]).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(body_json(resp).await, json!({"status": "ok"}));
        let resp = send(&client, Method::GET, &server.url("/v1/models"), "", &[]).await;
        let v = body_json(resp).await;
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][0]["id"], "kvbust-mock");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn pacing_headers_delay_first_byte_and_space_tokens() {
    let server = Server::start(quick()).await;
    for h2 in [false, true] {
        let client = client(h2);
        let url = server.url("/v1/chat/completions");
        // Nothing, not even headers, before the first-token delay — streaming or not, on any route.
        for (path, body) in [
            ("/v1/chat/completions", chat(2, true, false, "x")),
            ("/health", json!({})),
        ] {
            let start = Instant::now();
            let resp = post_or_get(
                &client,
                &server.url(path),
                &body,
                &[("x-mock-first-token-delay", "300ms")],
            )
            .await;
            assert!(
                start.elapsed() >= Duration::from_millis(300),
                "{path}: headers after {:?}",
                start.elapsed()
            );
            let _ = body_bytes(resp).await;
        }
        // Tokens are spaced by the inter-token delay.
        let start = Instant::now();
        let resp = post_json(
            &client,
            &url,
            &chat(5, true, false, "x"),
            &[("x-mock-inter-token", "40ms")],
        )
        .await;
        let events = sse_data(&body_bytes(resp).await);
        assert_eq!(events.len(), 5 + 2);
        assert!(
            start.elapsed() >= Duration::from_millis(4 * 40),
            "5 tokens in {:?}",
            start.elapsed()
        );
        // A bad header value is a 400, not a panic or a hang.
        let resp = post_json(
            &client,
            &url,
            &chat(1, false, false, "x"),
            &[("x-mock-inter-token", "soonish")],
        )
        .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(body_json(resp).await["error"]["code"], "invalid_header");
    }
    server.shutdown().await;
}

async fn post_or_get(
    client: &TestClient,
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Response<Incoming> {
    if url.ends_with("/health") {
        send(client, Method::GET, url, "", headers).await
    } else {
        post_json(client, url, body, headers).await
    }
}

#[tokio::test]
async fn prefill_cost_makes_a_cache_miss_slower_than_its_floor() {
    let server = Server::start(MockConfig {
        prefill_per_token: Duration::from_micros(500),
        ..quick()
    })
    .await;
    let client = client(false);
    let url = server.url("/v1/chat/completions");
    let start = Instant::now();
    let resp = post_json(
        &client,
        &url,
        &chat(1, false, false, &long_prompt("Cold")),
        &[],
    )
    .await;
    let elapsed = start.elapsed();
    let v = body_json(resp).await;
    let uncached = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(
        elapsed >= Duration::from_micros(500 * uncached),
        "{uncached} uncached tokens took only {elapsed:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn graceful_shutdown_lets_in_flight_streams_finish() {
    let server = Server::start(MockConfig {
        inter_token: Duration::from_millis(20),
        ..quick()
    })
    .await;
    let mut readers = Vec::new();
    for h2 in [false, true] {
        let client = client(h2);
        let resp = post_json(
            &client,
            &server.url("/v1/chat/completions"),
            &chat(15, true, false, "bye"),
            &[],
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        readers.push(tokio::spawn(body_bytes(resp)));
    }
    let mock = server.mock.clone();
    let addr = server.addr;
    assert_eq!(mock.recorder().streams_in_flight(), 2);
    server.shutdown().await; // returns only once both connections are done
    for r in readers {
        let events = sse_data(&r.await.expect("reader"));
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        assert_eq!(events.len(), 15 + 2);
    }
    assert_eq!(
        (
            mock.recorder().streams_completed(),
            mock.recorder().streams_cancelled()
        ),
        (2, 0)
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

/// `event: NAME` / `data: JSON` pairs of an SSE body, in order; every event has both lines.
fn named_events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).expect("SSE is UTF-8");
    assert!(text.ends_with("\n\n"), "ends with a blank line: {text:?}");
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (head, data) = e
                .split_once('\n')
                .unwrap_or_else(|| panic!("two lines: {e:?}"));
            let name = head
                .strip_prefix("event: ")
                .unwrap_or_else(|| panic!("{e:?}"));
            let data = data
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("{e:?}"));
            let v: Value = serde_json::from_str(data).unwrap_or_else(|err| panic!("{err}: {data}"));
            assert_eq!(v["type"], name, "`type` names the event: {e:?}");
            (name.to_owned(), v)
        })
        .collect()
}

const SYSTEM: &str = "You answer questions about the camping shop's return policy. Tents can be returned within thirty days, sleeping bags within fourteen, and stoves only unused.";
const USER: &str = "Can I return a tent I bought three weeks ago?";

#[tokio::test]
async fn responses_stream_has_openais_event_sequence_and_usage() {
    let server = Server::start_qwen3(quick()).await;
    let client = client(false);
    let expected_prompt = qwen3_prompt(&[SYSTEM, USER]);
    let body = json!({
        "model": "gpt-test",
        "instructions": SYSTEM,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": USER}]}],
        "max_output_tokens": 5,
        "stream": true,
    });
    let resp = post_json(&client, &server.url("/v1/responses"), &body, &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = named_events(&body_bytes(resp).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(["response.output_text.delta"; 5]);
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, want);
    for (i, (_, v)) in events.iter().enumerate() {
        assert_eq!(v["sequence_number"], i, "{v}");
    }
    let deltas: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().expect("delta text").to_owned())
        .collect();
    assert_eq!(deltas.split(' ').count(), 5, "{deltas:?}");
    assert_eq!(events[9].1["text"], deltas.as_str());
    let done = &events[12].1["response"];
    assert_eq!(done["model"], "gpt-test");
    assert_eq!(done["status"], "incomplete", "stopped at max_output_tokens");
    assert_eq!(done["output"][0]["content"][0]["text"], deltas.as_str());
    let usage = &done["usage"];
    assert_eq!(usage["input_tokens"], expected_prompt, "{usage}");
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage["output_tokens"], 5);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(usage["total_tokens"], expected_prompt + 5);

    // The same request again, not streamed: one `response` object, its prefix read from the cache.
    let mut again = body.clone();
    again["stream"] = json!(false);
    let v = body_json(post_json(&client, &server.url("/v1/responses"), &again, &[]).await).await;
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(
        v["output"][0]["content"][0]["text"],
        deltas.as_str(),
        "deterministic"
    );
    assert_eq!(v["usage"]["input_tokens"], expected_prompt);
    assert_eq!(
        v["usage"]["input_tokens_details"]["cached_tokens"],
        repeat_hit(expected_prompt)
    );
    // Without a limit the mock stops on its own, and says the response is complete.
    let free = json!({"input": USER});
    let v = body_json(post_json(&client, &server.url("/v1/responses"), &free, &[]).await).await;
    assert_eq!(v["status"], "completed");
    assert_eq!(
        v["usage"]["output_tokens"],
        MockConfig::default().default_max_tokens
    );
    assert_eq!(v["usage"]["input_tokens"], qwen3_prompt(&[USER]));
    server.shutdown().await;
}

#[tokio::test]
async fn messages_stream_has_anthropics_event_sequence_and_usage() {
    let server = Server::start_qwen3(quick()).await;
    let client = client(true);
    let n = qwen3_prompt(&[SYSTEM, USER]);
    let body = json!({
        "model": "claude-test",
        "max_tokens": 4,
        "system": [{"type": "text", "text": SYSTEM}],
        "messages": [{"role": "user", "content": USER}],
        "stream": true,
    });
    let resp = post_json(&client, &server.url("/v1/messages"), &body, &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let events = named_events(&body_bytes(resp).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec!["message_start", "content_block_start", "ping"];
    want.extend(["content_block_delta"; 4]);
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, want);
    let start = &events[0].1["message"];
    assert_eq!(start["model"], "claude-test");
    assert_eq!(start["content"], json!([]));
    let u = &start["usage"];
    // A cold prompt: its full blocks are written to the cache, the tail is plain input.
    assert_eq!(u["cache_read_input_tokens"], 0, "{u}");
    assert_eq!(u["cache_creation_input_tokens"], n / 16 * 16, "{u}");
    assert_eq!(u["input_tokens"], n % 16, "{u}");
    let text: String = events[3..7]
        .iter()
        .map(|(_, v)| {
            assert_eq!(v["delta"]["type"], "text_delta");
            v["delta"]["text"].as_str().expect("text").to_owned()
        })
        .collect();
    assert_eq!(text.split(' ').count(), 4);
    let delta = &events[8].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 4);

    let mut again = body.clone();
    again["stream"] = json!(false);
    let v = body_json(post_json(&client, &server.url("/v1/messages"), &again, &[]).await).await;
    assert_eq!(
        (v["type"].as_str(), v["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(v["content"][0]["text"], text.as_str());
    let u = &v["usage"];
    let read = repeat_hit(n);
    assert_eq!(u["cache_read_input_tokens"], read, "{u}");
    assert_eq!(u["cache_creation_input_tokens"], 0, "{u}");
    assert_eq!(
        u["input_tokens"],
        n - read,
        "input_tokens excludes cached tokens: {u}"
    );
    assert_eq!(u["output_tokens"], 4);

    // Errors are Anthropic-shaped on this route.
    let bad = json!({"messages": [{"role": "user", "content": "x"}]});
    let resp = post_json(&client, &server.url("/v1/messages"), &bad, &[]).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let v = body_json(resp).await;
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_tokens")),
        "{v}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_prefix_is_cached_across_every_shape() {
    let server = Server::start_qwen3(quick()).await;
    let client = client(false);
    let n = qwen3_prompt(&[SYSTEM, USER]);
    let chat = json!({"max_tokens": 2, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]});
    let v =
        body_json(post_json(&client, &server.url("/v1/chat/completions"), &chat, &[]).await).await;
    assert_eq!(v["usage"]["prompt_tokens"], n);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let messages =
        json!({"max_tokens": 2, "system": SYSTEM, "messages": [{"role": "user", "content": USER}]});
    let v = body_json(post_json(&client, &server.url("/v1/messages"), &messages, &[]).await).await;
    let u = &v["usage"];
    assert_eq!(u["cache_read_input_tokens"], repeat_hit(n), "{u}");
    let total = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ]
    .iter()
    .map(|k| u[*k].as_u64().expect("count"))
    .sum::<u64>();
    assert_eq!(total, n, "{u}");
    let responses = json!({"instructions": SYSTEM, "input": USER, "max_output_tokens": 2});
    let v =
        body_json(post_json(&client, &server.url("/v1/responses"), &responses, &[]).await).await;
    assert_eq!(v["usage"]["input_tokens"], n);
    assert_eq!(
        v["usage"]["input_tokens_details"]["cached_tokens"],
        repeat_hit(n)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn reset_prefix_cache_empties_the_cache_as_vllms_does() {
    let server = Server::start(quick()).await;
    let client = client(false);
    let body = chat(2, false, false, &long_prompt("reset"));
    let cached = |v: &Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached")
    };
    let url = server.url("/v1/chat/completions");
    body_json(post_json(&client, &url, &body, &[]).await).await;
    let warm = body_json(post_json(&client, &url, &body, &[]).await).await;
    assert!(cached(&warm) > 0, "{warm}");

    let resp = send(
        &client,
        Method::POST,
        &server.url("/reset_prefix_cache"),
        "",
        &[],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().get("content-type").is_none(), "a bare 200");
    assert!(body_bytes(resp).await.is_empty());
    let cold = body_json(post_json(&client, &url, &body, &[]).await).await;
    assert_eq!(cached(&cold), 0, "{cold}");
    let warm_again = body_json(post_json(&client, &url, &body, &[]).await).await;
    assert_eq!(cached(&warm_again), cached(&warm));

    let ok = server.url("/reset_prefix_cache?reset_running_requests=true&reset_external=0");
    assert_eq!(
        send(&client, Method::POST, &ok, "", &[]).await.status(),
        StatusCode::OK
    );
    let bad = server.url("/reset_prefix_cache?reset_external=maybe");
    let resp = send(&client, Method::POST, &bad, "", &[]).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body_json(resp).await["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("reset_external")));
    let resp = send(
        &client,
        Method::GET,
        &server.url("/reset_prefix_cache"),
        "",
        &[],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(resp.headers()["allow"], "POST");
    server.shutdown().await;
}

#[tokio::test]
async fn a_token_exact_placeholder_prompt_is_counted_exactly_through_the_proxy() {
    let server = Server::start_qwen3(quick()).await;
    let h = crate::common::start_proxy(&server.url(""), |c| {
        c.synth.placeholder_seed = Some(11);
        c.synth.placeholder_prefetch = 0;
    })
    .await;
    let client = client(false);
    let body = json!({"model": "m", "max_tokens": 2,
        "messages": [{"role": "user", "content": "{{kvbust:prompt:1024}}"}]});
    let v = body_json(post_json(&client, &h.url("/v1/chat/completions"), &body, &[]).await).await;
    let sent: Value = serde_json::from_slice(
        &server
            .mock
            .recorder()
            .requests()
            .pop()
            .expect("forwarded")
            .body,
    )
    .expect("JSON");
    let prompt = sent["messages"][0]["content"].as_str().expect("expanded");
    assert_eq!(n_tokens(prompt), 1024, "the placeholder is token-exact");
    // 1024 + the chat template's 8 tokens around one user message.
    assert_eq!(v["usage"]["prompt_tokens"], 1024 + 8, "{}", v["usage"]);

    // The reset reaches the mock through the proxy, so the README's isolation demo can be run again.
    let resp = send(
        &client,
        Method::POST,
        &h.url("/reset_prefix_cache"),
        "",
        &[],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let last = server.mock.recorder().requests().pop().expect("forwarded");
    assert_eq!(last.uri, "/reset_prefix_cache");
    h.shutdown().await;
    server.shutdown().await;
}

#[tokio::test]
async fn the_recorder_keeps_bodies_within_its_byte_budget() {
    let cfg = quick();
    let budget = cfg.record_bytes.as_u64() as usize;
    assert_eq!(budget, 16 << 20, "the default budget");
    let server = Server::start(cfg).await;
    let client = client(false);
    const BODY: usize = 3 << 20;
    let mut digests = Vec::new();
    for i in 0..30u8 {
        let body = Bytes::from(vec![b'a' + i % 26; BODY]);
        digests.push(<[u8; 32]>::from(Sha256::digest(&body)));
        let resp = send(&client, Method::POST, &server.url("/upload"), body, &[]).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        body_bytes(resp).await;
    }
    let rec = server.mock.recorder();
    assert_eq!(rec.requests_total(), 30);
    let kept_bytes = rec.body_bytes();
    assert!(kept_bytes <= budget, "{kept_bytes} bytes kept");
    assert!(
        rec.held_bytes() <= budget,
        "{} bytes held",
        rec.held_bytes()
    );
    let got = rec.requests();
    assert_eq!(got.len(), 30, "every request is still listed");
    let kept: Vec<usize> = (0..30).filter(|&i| got[i].body_kept()).collect();
    // The newest bodies that fit: 16 MiB / 3 MiB = 5.
    assert_eq!(kept, (25..30).collect::<Vec<_>>());
    assert_eq!(kept_bytes, 5 * BODY);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.body_len, BODY);
        assert_eq!(r.body_sha256, digests[i], "digest of request {i}");
        assert_eq!(r.body.len(), if kept.contains(&i) { BODY } else { 0 });
    }
    server.shutdown().await;
}

/// `cache_salt` as vLLM 0.33 takes it, on every route that has one: the same prompt is cached
/// under the same salt and not under another (the salt joins the first block's hash); vLLM's
/// validation refusals, word for word, with a 400; a list (SGLang's type) refused by name.
#[tokio::test]
async fn cache_salt_isolates_the_prefix_cache_as_vllm_does() {
    let server = Server::start(quick()).await;
    let client = client(false);
    let prompt = long_prompt("salted");
    let bodies = [
        ("/v1/chat/completions", chat(1, false, false, &prompt)),
        (
            "/v1/completions",
            json!({"model": "test-model", "prompt": prompt, "max_tokens": 1}),
        ),
        (
            "/v1/responses",
            json!({"model": "test-model", "input": prompt, "max_output_tokens": 1}),
        ),
    ];
    for (route, body) in &bodies {
        let cached = |salt: Option<&str>| {
            let mut b = body.clone();
            if let Some(s) = salt {
                b["cache_salt"] = json!(s);
            }
            let (client, url) = (client.clone(), server.url(route));
            async move {
                let v = body_json(post_json(&client, &url, &b, &[]).await).await;
                let usage = &v["usage"];
                usage["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .or_else(|| usage["input_tokens_details"]["cached_tokens"].as_u64())
                    .unwrap_or_else(|| panic!("{route}: {v}"))
            }
        };
        let route_salt = format!("tenant-{}", route.len());
        assert_eq!(cached(Some(&route_salt)).await, 0, "{route} cold");
        let warm = cached(Some(&route_salt)).await;
        assert!(warm > 0, "{route}: the same salt is cached");
        assert_eq!(
            cached(Some("other")).await,
            0,
            "{route}: another salt is not"
        );
        assert_eq!(cached(Some("other")).await, warm, "{route}");
    }
    // vLLM's refusals, word for word.
    let long = "x".repeat(129);
    let fits = "é".repeat(128);
    let refusals = [
        (json!(""), "must be a non-empty string"),
        (json!(7), "must be a non-empty string"),
        (json!(["a", "b"]), "must be a non-empty string"),
        (json!(long), "at most 128"),
        (json!("a@b"), "at most 128"),
        (json!("a/b"), "at most 128"),
        (json!("a\\b"), "at most 128"),
        (json!("a\u{0}b"), "at most 128"),
    ];
    for (salt, says) in refusals {
        let mut b = chat(1, false, false, "hi");
        b["cache_salt"] = salt.clone();
        let resp = post_json(&client, &server.url("/v1/chat/completions"), &b, &[]).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{salt}");
        let v = body_json(resp).await;
        let msg = v["error"]["message"].as_str().unwrap();
        let want = if says.starts_with("must") {
            "Parameter 'cache_salt' must be a non-empty string if provided."
        } else {
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL."
        };
        assert_eq!(msg, want, "{salt}");
    }
    // 128 characters (not bytes) and `null` pass.
    for salt in [json!(fits), Value::Null] {
        let mut b = chat(1, false, false, "hi");
        b["cache_salt"] = salt;
        let resp = post_json(&client, &server.url("/v1/chat/completions"), &b, &[]).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = body_bytes(resp).await;
    }
    server.shutdown().await;
}
