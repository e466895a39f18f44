//! What kvbust measures for every API shape, through the proxy on port 0 in front of an
//! in-process upstream that serves real Responses, Anthropic Messages and chat/completions
//! bytes (`tests/fixtures/observe/`): per-phase histograms and token counters from `/metrics`,
//! the access log (captured as JSON), request ids, and `observe.request_usage`'s removal of the
//! usage chunk, byte for byte against the same request sent straight to the upstream.
// Test code: a panic is the failure report (Cargo.toml denies these in the library).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use common::*;
use http::{HeaderMap, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, StreamBody};
use hyper::body::Frame;

use kvbust::config::{LogConfig, LogFormat};

// ---------------------------------------------------------------------------------------------
// The access log, captured from every worker thread of every proxy in this test binary.

struct Logs {
    text: Mutex<String>,
    written: tokio::sync::Notify,
}

#[derive(Clone)]
struct LogWriter(Arc<Logs>);

impl std::io::Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .text
            .lock()
            .unwrap()
            .push_str(&String::from_utf8_lossy(b));
        self.0.written.notify_waiters();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for LogWriter {
    type Writer = LogWriter;
    fn make_writer(&'w self) -> LogWriter {
        self.clone()
    }
}

/// The process's log, JSON as `log.format = "json"` writes it.
fn logs() -> Arc<Logs> {
    static LOGS: OnceLock<Arc<Logs>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Logs {
            text: Mutex::new(String::new()),
            written: tokio::sync::Notify::new(),
        });
        let cfg = LogConfig {
            level: "warn".into(),
            format: LogFormat::Json,
            access: true,
        };
        let sub = kvbust::access_log::subscriber(&cfg, None, LogWriter(logs.clone()), false);
        tracing::subscriber::set_global_default(sub).expect("the only subscriber");
        let access = LogWriter(logs.clone());
        let access = Mutex::new(access);
        assert!(kvbust::access_log::install(move |b| {
            use std::io::Write;
            let _ = access.lock().unwrap().write_all(b);
        }));
        logs
    })
    .clone()
}

fn access_lines(logs: &Logs) -> Vec<serde_json::Value> {
    logs.text
        .lock()
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "access_log")
        .map(|v| v["fields"].clone())
        .collect()
}

/// The access line of request `id`, once it is written (when the response body is dropped).
async fn access_line(id: &str) -> serde_json::Value {
    let logs = logs();
    tokio::time::timeout(HANG, async {
        loop {
            let written = logs.written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            if let Some(v) = access_lines(&logs)
                .into_iter()
                .find(|v| v["request_id"] == id)
            {
                return v;
            }
            written.await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no access line for request {id}"))
}

// ---------------------------------------------------------------------------------------------
// The upstream.

type UpBody = BoxBody<Bytes, Infallible>;

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>);

impl Seen {
    fn last(&self) -> (String, HeaderMap, Bytes) {
        self.0.lock().unwrap().last().cloned().expect("a request")
    }
}

fn fixture(name: &str) -> Bytes {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/observe")
        .join(name);
    Bytes::from(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// One frame per SSE event, as servers write them.
fn events(all: &[u8]) -> Vec<Bytes> {
    let text = String::from_utf8_lossy(all);
    text.split_inclusive("\n\n")
        .map(|e| Bytes::from(e.to_string()))
        .collect()
}

/// A chat or completions stream as OpenAI-style servers write it: with `include_usage`, every
/// chunk carries `"usage":null` and a usage-only chunk comes before `[DONE]`.
fn openai_stream(completions: bool, include_usage: bool) -> Vec<Bytes> {
    let object = if completions {
        "text_completion"
    } else {
        "chat.completion.chunk"
    };
    let null = if include_usage {
        r#","usage":null"#
    } else {
        ""
    };
    let chunk = |choices: String, tail: &str| {
        format!(
            r#"data: {{"id":"cmpl-7","object":"{object}","created":1700000000,"model":"m","choices":[{choices}]{tail}}}"#
        ) + "\n\n"
    };
    let choice = |piece: &str, finish: &str| {
        if completions {
            format!(r#"{{"index":0,"text":"{piece}","logprobs":null,"finish_reason":{finish}}}"#)
        } else if piece.is_empty() {
            format!(r#"{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":{finish}}}"#)
        } else {
            format!(
                r#"{{"index":0,"delta":{{"content":"{piece}"}},"logprobs":null,"finish_reason":{finish}}}"#
            )
        }
    };
    let mut out: Vec<String> = ["Hel", "lo", " world"]
        .iter()
        .map(|p| chunk(choice(p, "null"), null))
        .collect();
    out.push(chunk(choice("", "\"length\""), null));
    if include_usage {
        out.push(format!(
            r#"data: {{"id":"cmpl-7","object":"{object}","created":1700000000,"model":"m","choices":[],"usage":{{"prompt_tokens":50,"completion_tokens":3,"total_tokens":53,"prompt_tokens_details":{{"cached_tokens":48}}}}}}"#
        ) + "\n\n");
    }
    out.push("data: [DONE]\n\n".into());
    out.into_iter().map(Bytes::from).collect()
}

const OPENAI_JSON: &str = r#"{"id":"cmpl-7","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello world"},"finish_reason":"length"}],"usage":{"prompt_tokens":50,"completion_tokens":3,"total_tokens":53,"prompt_tokens_details":{"cached_tokens":48}}}"#;

/// Answers each API route with its fixture (streamed when the body says `"stream": true`),
/// records every request, and with `x-test-split: N` re-cuts the stream into N-byte frames.
/// `x-test-hang: 1`: one event, then nothing.
async fn upstream() -> (String, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Seen::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let record = record.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let record = record.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body: Bytes = body.collect().await.unwrap().to_bytes();
                            let path = parts.uri.path().to_string();
                            record.0.lock().unwrap().push((
                                path.clone(),
                                parts.headers.clone(),
                                body.clone(),
                            ));
                            Ok::<_, Infallible>(answer(&path, &parts.headers, &body))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), seen)
}

fn answer(path: &str, headers: &HeaderMap, body: &[u8]) -> http::Response<UpBody> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let stream = v["stream"] == true;
    let include_usage = v["stream_options"]["include_usage"] == true;
    let (json, frames) = match path {
        "/v1/responses" => (fixture("responses.json"), events(&fixture("responses.sse"))),
        "/v1/messages" => (fixture("messages.json"), events(&fixture("messages.sse"))),
        "/v1/chat/completions" => (
            Bytes::from_static(OPENAI_JSON.as_bytes()),
            openai_stream(false, include_usage),
        ),
        "/v1/completions" => (
            Bytes::from_static(OPENAI_JSON.as_bytes()),
            openai_stream(true, include_usage),
        ),
        _ => (Bytes::from_static(b"{}"), Vec::new()),
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (content_type, body): (&str, UpBody) = if !stream {
        ("application/json", http_body_util::Full::new(json).boxed())
    } else {
        let frames = match header("x-test-split").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => frames
                .concat()
                .chunks(n)
                .map(Bytes::copy_from_slice)
                .collect(),
            None => frames,
        };
        let body = if header("x-test-hang").is_some() {
            let first = frames.into_iter().take(1).map(|b| Ok(Frame::data(b)));
            StreamBody::new(futures_util::StreamExt::chain(
                futures_util::stream::iter(first),
                futures_util::stream::pending(),
            ))
            .boxed()
        } else {
            StreamBody::new(futures_util::stream::iter(
                frames.into_iter().map(|b| Ok(Frame::data(b))),
            ))
            .boxed()
        };
        ("text/event-stream", body)
    };
    let mut resp = http::Response::new(body);
    resp.headers_mut()
        .insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
    resp
}

fn body_for(path: &str, stream: bool) -> String {
    match path {
        "/v1/responses" => serde_json::json!({
            "model": "m", "instructions": "Be brief.", "input": "Hi", "stream": stream,
        }),
        "/v1/messages" => serde_json::json!({
            "model": "m", "max_tokens": 16, "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hi"}], "stream": stream,
        }),
        "/v1/completions" => serde_json::json!({"model": "m", "prompt": "Hi", "stream": stream}),
        _ => serde_json::json!({
            "model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": stream,
        }),
    }
    .to_string()
}

fn expected_bytes(path: &str, stream: bool) -> Bytes {
    let file = |ext: &str| fixture(&format!("{}.{ext}", path.trim_start_matches("/v1/")));
    match (path, stream) {
        ("/v1/chat/completions", true) => Bytes::from(openai_stream(false, true).concat()),
        ("/v1/chat/completions", false) => Bytes::from_static(OPENAI_JSON.as_bytes()),
        (_, true) => file("sse"),
        (_, false) => file("json"),
    }
}

/// The value of `name{labels}` in a Prometheus text exposition.
fn sample(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    let key = format!("{name}{{{labels}}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(|v| v.trim().parse().unwrap())
}

// ---------------------------------------------------------------------------------------------

/// Prompt, cached and completion tokens of one response.
type Tokens = (u64, u64, u64);

/// (route, label, content events per stream, tokens per response)
const SHAPES: [(&str, &str, u64, Tokens); 3] = [
    ("/v1/responses", "responses", 3, (2006, 1920, 3)),
    ("/v1/messages", "messages", 4, (2012, 1700, 7)),
    ("/v1/chat/completions", "chat", 3, (50, 48, 3)),
];

#[tokio::test]
async fn every_shape_is_measured_per_phase_and_logged() {
    logs();
    let (up, seen) = upstream().await;
    for (path, route, content, (p, c, g)) in SHAPES {
        let h = start_proxy(&up, |c| c.log.format = LogFormat::Json).await;
        let client = h1();
        let mut ids = Vec::new();
        // Two requests per phase: a stream and a plain response; the warmup ones with a target.
        for (phase, target) in [("warmup", "first_turn_prefix"), ("profiling", "none")] {
            for stream in [true, false] {
                let id = format!("{route}-{phase}-{stream}");
                // A chat stream reports usage only when asked.
                let body = body_for(path, stream).replace(
                    "\"stream\":true",
                    "\"stream\":true,\"stream_options\":{\"include_usage\":true}",
                );
                let resp = send(
                    &client,
                    post(
                        &h.url(path),
                        body.clone(),
                        &[
                            ("x-kvbust-phase", phase),
                            ("x-kvbust-target", target),
                            ("x-request-id", &id),
                        ],
                    ),
                )
                .await;
                assert_eq!(resp.status(), StatusCode::OK, "{id}");
                assert_eq!(resp.headers()["x-request-id"], id.as_str());
                let got = body_bytes(resp).await;
                // Every observer on, the bytes are the upstream's.
                assert_eq!(got, expected_bytes(path, stream), "{id}: body changed");
                let (_, up_headers, up_body) = seen.last();
                assert_eq!(up_headers["x-request-id"], id.as_str(), "{id}");
                if target == "none" {
                    assert_eq!(up_body, body.as_bytes(), "{id}");
                } else {
                    assert!(up_body.len() > body.len(), "{id}: marked");
                }
                ids.push((id, phase, target, stream, body.len(), got.len()));
            }
        }
        for (i, (id, phase, target, stream, bytes_in, bytes_out)) in ids.iter().enumerate() {
            let line = access_line(id).await;
            let what = format!("{id}: {line}");
            assert_eq!(line["method"], "POST", "{what}");
            assert_eq!(line["path"], path, "{what}");
            assert_eq!(line["route"], route, "{what}");
            assert_eq!(line["status"], 200, "{what}");
            assert_eq!(line["upstream_status"], 200, "{what}");
            assert_eq!(line["phase"], *phase, "{what}");
            assert_eq!(line["target"], *target, "{what}");
            assert_eq!(line["rid"].is_string(), *target != "none", "{what}");
            assert_eq!(line["bytes_in"], *bytes_in as u64, "{what}");
            assert_eq!(line["bytes_out"], *bytes_out as u64, "{what}");
            assert_eq!(line["prompt_tokens"], p, "{what}");
            assert_eq!(line["cached_tokens"], c, "{what}");
            assert_eq!(line["completion_tokens"], g, "{what}");
            assert_eq!(line["end"], "complete", "{what}");
            assert!(line["duration_us"].as_u64().is_some(), "{what}");
            assert_eq!(line["ttft_us"].is_u64(), *stream, "{what}");
            assert_eq!(line["events"].is_u64(), *stream, "{what}");
            // One client connection keeps one upstream connection: only the first request
            // opened it.
            assert_eq!(line["upstream_connect_us"].is_u64(), i == 0, "{what}");
        }
        let m = metrics_text(&h).await;
        for (phase, target) in [("warmup", "first_turn_prefix"), ("profiling", "none")] {
            let l = format!("phase=\"{phase}\",route=\"{route}\",target=\"{target}\"");
            let count = |name: &str| sample(&m, name, &l).unwrap_or(-1.0);
            assert_eq!(
                count("kvbust_time_to_first_token_seconds_count"),
                1.0,
                "{l}\n{m}"
            );
            assert_eq!(
                count("kvbust_inter_token_seconds_count"),
                (content - 1) as f64,
                "{l}"
            );
            assert_eq!(count("kvbust_request_duration_seconds_count"), 2.0, "{l}");
            let t = format!("phase=\"{phase}\",target=\"{target}\"");
            for (family, n) in [
                ("kvbust_upstream_prompt_tokens_total", p),
                ("kvbust_upstream_cached_tokens_total", c),
                ("kvbust_upstream_completion_tokens_total", g),
            ] {
                assert_eq!(
                    sample(&m, family, &t),
                    Some(2.0 * n as f64),
                    "{family}{{{t}}}"
                );
            }
        }
        h.shutdown().await;
    }
}

#[tokio::test]
async fn request_ids_are_made_when_missing_and_errors_are_logged() {
    let logs = logs();
    let (up, seen) = upstream().await;
    let h = start_proxy(&up, |c| c.log.format = LogFormat::Json).await;
    let resp = send(
        &h1(),
        post(
            &h.url("/v1/responses"),
            body_for("/v1/responses", false),
            &[],
        ),
    )
    .await;
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 16, "{id}");
    body_bytes(resp).await;
    assert_eq!(
        seen.last().1["x-request-id"],
        id.as_str(),
        "the upstream saw it"
    );
    let line = access_line(&id).await;
    assert_eq!(line["route"], "responses");

    // An error kvbust answers itself: logged with its code, no upstream status.
    let resp = send(
        &h1(),
        post(
            &h.url("/v1/chat/completions"),
            body_for("/v1/chat/completions", false),
            &[
                ("x-kvbust-phase", "warmpu"),
                ("x-request-id", "bad-phase-1"),
            ],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(resp.headers()["x-request-id"], "bad-phase-1");
    body_bytes(resp).await;
    let line = access_line("bad-phase-1").await;
    assert_eq!(line["status"], 400, "{line}");
    assert_eq!(line["error"], "invalid_phase", "{line}");
    assert!(line.get("upstream_status").is_none(), "{line}");
    assert!(line["bytes_out"].as_u64().unwrap() > 0, "{line}");

    // A client that hangs up mid-stream: the line says so, written when the body is dropped.
    let resp = send(
        &h1(),
        post(
            &h.url("/v1/messages"),
            body_for("/v1/messages", true),
            &[("x-test-hang", "1"), ("x-request-id", "hang-up-1")],
        ),
    )
    .await;
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(body);
    let line = access_line("hang-up-1").await;
    assert_eq!(line["end"], "client_disconnect", "{line}");
    assert_eq!(line["events"], 1, "{line}");
    // message_start's usage was seen before the hang-up.
    assert_eq!(line["prompt_tokens"], 2012, "{line}");
    h.shutdown().await;

    // log.access = false: no id added, no line.
    let h = start_proxy(&up, |c| c.log.access = false).await;
    let resp = send(&h1(), get(&h.url("/access-log-off-probe"))).await;
    assert!(!resp.headers().contains_key("x-request-id"));
    body_bytes(resp).await;
    assert!(!seen.last().1.contains_key("x-request-id"));
    h.shutdown().await;
    assert!(!logs.text.lock().unwrap().contains("/access-log-off-probe"));
}

#[tokio::test]
async fn request_usage_counts_usage_and_the_client_gets_exactly_what_it_asked_for() {
    logs();
    let (up, seen) = upstream().await;
    let h = start_proxy(&up, |c| {
        c.observe.request_usage = true;
        c.log.format = LogFormat::Json;
    })
    .await;
    let direct = h1();
    let mut streams = 0.0;
    for path in ["/v1/chat/completions", "/v1/completions"] {
        // Whole events per frame, and frames cut across events.
        for split in [None, Some("7"), Some("50")] {
            let body = body_for(path, true);
            let mut headers = vec![("x-request-id", "")];
            if let Some(n) = split {
                headers.push(("x-test-split", n));
            }
            let id = format!("usage-{path}-{split:?}");
            headers[0].1 = &id;
            let via =
                body_bytes(send(&h1(), post(&h.url(path), body.clone(), &headers)).await).await;
            let spliced = seen.last().2;
            let want = format!(
                "{},\"stream_options\":{{\"include_usage\":true}}}}",
                &body[..body.len() - 1]
            );
            assert_eq!(
                spliced,
                want.as_bytes(),
                "{id}: the upstream got the client's bytes plus include_usage"
            );
            let straight = body_bytes(
                send(
                    &direct,
                    post(&format!("{up}{path}"), body.clone(), &headers),
                )
                .await,
            )
            .await;
            assert!(!straight.windows(7).any(|w| w == b"\"usage\""), "{id}");
            assert_eq!(
                String::from_utf8_lossy(&via),
                String::from_utf8_lossy(&straight),
                "{id}: the client must see what it asked for"
            );
            let line = access_line(&id).await;
            assert_eq!(line["cached_tokens"], 48, "{line}");
            assert_eq!(line["bytes_out"], via.len() as u64, "{line}");
            streams += 1.0;
        }
        // A client that asks for usage itself gets everything, untouched.
        let own = body_for(path, true).replace(
            "\"stream\":true",
            "\"stream\":true,\"stream_options\":{\"include_usage\":true}",
        );
        let via = body_bytes(send(&h1(), post(&h.url(path), own.clone(), &[])).await).await;
        assert_eq!(seen.last().2, own.as_bytes());
        let straight =
            body_bytes(send(&direct, post(&format!("{up}{path}"), own.clone(), &[])).await).await;
        assert!(straight.windows(8).any(|w| w == b"\"usage\":"));
        assert_eq!(via, straight, "{path}: asked for usage itself");
        streams += 1.0;
        // Not a stream: not touched.
        let plain = body_for(path, false);
        body_bytes(send(&h1(), post(&h.url(path), plain.clone(), &[])).await).await;
        assert_eq!(seen.last().2, plain.as_bytes());
    }
    let m = metrics_text(&h).await;
    // Every stream's usage was counted, plus the two plain responses.
    let t = "phase=\"profiling\",target=\"none\"";
    assert_eq!(
        sample(&m, "kvbust_upstream_cached_tokens_total", t),
        Some(48.0 * (streams + 2.0)),
        "{m}"
    );
    h.shutdown().await;
}

/// A response with no body (vLLM's `POST /reset_prefix_cache`, a `HEAD` probe) is never polled:
/// it ended complete, not with a client disconnect. The line says who asked (address, agent).
#[tokio::test]
async fn empty_body_responses_are_logged_complete_with_the_client_and_its_agent() {
    let logs = logs();
    let _ = &logs;
    let h = start(|c| c.log.format = LogFormat::Json).await;
    let c = h1();
    let reset = http::Request::post(h.url("/reset_prefix_cache"))
        .header("x-request-id", "empty-reset-1")
        .header("user-agent", "kvbust-test/1.0")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let resp = send(&c, reset).await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    let head = http::Request::head(h.url("/health"))
        .header("x-request-id", "empty-head-1")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let resp = send(&c, head).await;
    body_bytes(resp).await;
    for id in ["empty-reset-1", "empty-head-1"] {
        let line = access_line(id).await;
        assert_eq!(line["end"], "complete", "{line}");
        let client = line["client"].as_str().unwrap();
        assert!(client.starts_with("127.0.0.1:"), "{line}");
    }
    let line = access_line("empty-reset-1").await;
    assert_eq!(line["user_agent"], "kvbust-test/1.0", "{line}");
    assert_eq!(line["bytes_out"], 0, "{line}");
    let m = metrics_text(&h).await;
    assert!(!m.contains("reason=\"client_disconnect\""), "{m}");
    h.shutdown().await;
}

/// A generation request's access line carries its run and the cache model's prediction beside
/// the server's figure (issue 39 item 8): the second of two equal prompts is predicted to hit
/// what the mock reports, from the same session.
#[tokio::test]
async fn access_lines_carry_the_run_and_the_prediction_beside_the_servers_figure() {
    let logs = logs();
    let _ = &logs;
    let h = start(|c| c.log.format = LogFormat::Json).await;
    let c = h1();
    let text =
        "the same prompt twice, long enough to fill a few blocks of the mock's cache ".repeat(4);
    let body = serde_json::json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]});
    for id in ["pred-1", "pred-2"] {
        let req = http::Request::post(h.url("/v1/chat/completions"))
            .header("x-request-id", id)
            .header("x-kvbust-run", "logged")
            .header("x-correlation-id", "one-session")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = send(&c, req).await;
        assert_eq!(resp.status(), StatusCode::OK);
        body_bytes(resp).await;
    }
    let first = access_line("pred-1").await;
    assert_eq!(first["run"], "logged", "{first}");
    assert_eq!(first["predicted_cached_tokens"], 0, "{first}");
    assert_eq!(first["reuse_source"], "none", "{first}");
    let second = access_line("pred-2").await;
    assert_eq!(second["run"], "logged", "{second}");
    assert!(second["cached_tokens"].as_u64().unwrap() > 0, "{second}");
    assert_eq!(
        second["predicted_cached_tokens"], second["cached_tokens"],
        "{second}"
    );
    assert_eq!(second["reuse_source"], "same_session", "{second}");
    h.shutdown().await;
}
