//! The transparent proxy core against the built-in mock, over real HTTP/1.1 and h2c on port 0.

use std::time::Duration;

use crate::common::*;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};

/// A body with odd spacing, key order, big numbers and escapes: it must arrive byte for byte.
const ODD_BODY: &str = "{ \"stream\":STREAM ,\"model\":\"kvbust-mock\",\n \"messages\":[{\"role\":\"user\",\"content\":\"caf\\u00e9 \\/ na\u{ef}ve\"}],\"max_tokens\":4,\"seed\":123456789012345678901234567890,\"temperature\":1.0e-7,\"x_unknown\":{\"b\":1,\"a\":[true,null]}}";

#[tokio::test]
async fn chat_passes_through_byte_for_byte_over_h1_and_h2c() {
    let h = start(|_| {}).await;
    let mut n = 0;
    for (name, client) in clients() {
        for stream in [false, true] {
            let body = ODD_BODY.replace("STREAM", if stream { "true" } else { "false" });
            let resp = send(
                &client,
                post(
                    &h.url("/v1/chat/completions"),
                    body.clone(),
                    &[("x-kvbust-phase", "warmup")],
                ),
            )
            .await;
            assert_eq!(resp.status(), StatusCode::OK, "{name} stream={stream}");
            assert_eq!(resp.headers()["x-kvbust-phase"], "warmup");
            assert_eq!(resp.headers()["x-kvbust-rid"], "none");
            let bytes = body_bytes(resp).await;
            if stream {
                let data = sse_data(&bytes);
                assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{name}");
            } else {
                let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(v["object"], "chat.completion");
            }
            n += 1;
            let got = h.mock.recorder().requests();
            assert_eq!(got.len(), n);
            let last = got.last().unwrap();
            // A stream that does not ask for usage gets it asked for (observe.request_usage, on
            // by default): the one member added before the closing brace; not a byte else moves.
            let want = if stream {
                format!(
                    "{},\"stream_options\":{{\"include_usage\":true}}}}",
                    &body[..body.len() - 1]
                )
            } else {
                body.clone()
            };
            assert_eq!(
                last.body.as_ref(),
                want.as_bytes(),
                "{name} stream={stream}: body changed in transit"
            );
            assert!(
                !last.headers.contains_key("x-kvbust-phase"),
                "x-kvbust-* headers are not forwarded"
            );
            assert_eq!(last.headers["x-forwarded-for"], "127.0.0.1");
            assert_eq!(
                last.headers["host"],
                h.mock_addr.to_string().as_str(),
                "Host is the upstream's"
            );
        }
    }
    h.shutdown().await;
}

#[tokio::test]
async fn each_upstream_event_reaches_the_client_separately_and_on_time() {
    let h = start(|_| {}).await;
    for (name, client) in clients() {
        let req = post(
            &h.url("/v1/chat/completions"),
            chat_body("pace me", true, 6),
            &[("x-mock-inter-token", "120ms")],
        );
        let resp = send(&client, req).await;
        let frames = frames(resp).await;
        // One SSE event per frame: no coalescing anywhere on the way.
        // (HTTP/2 may end with an empty DATA frame carrying END_STREAM.)
        for (_, f) in frames.iter().filter(|(_, f)| !f.is_empty()) {
            assert_eq!(
                f.windows(2).filter(|w| w == b"\n\n").count(),
                1,
                "{name}: frame {:?}",
                String::from_utf8_lossy(f)
            );
        }
        let content: Vec<_> = frames
            .iter()
            .filter(|(_, f)| f.windows(9).any(|w| w == b"\"content\""))
            .collect();
        assert!(
            content.len() >= 6,
            "{name}: {} content events",
            content.len()
        );
        // Arrival gaps follow the upstream's 120 ms pacing (a buffering proxy would deliver
        // them together at the end).
        let gaps: Vec<Duration> = content.windows(2).map(|w| w[1].0 - w[0].0).collect();
        let spread = content.last().unwrap().0 - content.first().unwrap().0;
        assert!(
            spread >= Duration::from_millis(500),
            "{name}: events arrived within {spread:?}: {gaps:?}"
        );
        assert!(
            gaps.iter()
                .filter(|g| **g >= Duration::from_millis(60))
                .count()
                >= 4,
            "{name}: gaps {gaps:?}"
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_the_upstream_stream() {
    let h = start(|_| {}).await;
    for (i, (name, client)) in clients().into_iter().enumerate() {
        let req = post(
            &h.url("/v1/chat/completions"),
            chat_body("long answer", true, 500),
            &[("x-mock-inter-token", "50ms")],
        );
        let resp = send(&client, req).await;
        let mut body = resp.into_body();
        // Wait for the first event so the stream is really under way, then hang up.
        let first = tokio::time::timeout(HANG, body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(first.is_data());
        drop(body);
        drop(client);
        tokio::time::timeout(
            Duration::from_secs(10),
            h.mock.recorder().wait_cancelled(i as u64 + 1),
        )
        .await
        .unwrap_or_else(|_| panic!("{name}: upstream stream was not cancelled"));
    }
    assert_eq!(h.mock.recorder().streams_completed(), 0);
    let m = metrics_text(&h).await;
    assert!(
        m.contains("kvbust_streams_aborted_total{reason=\"client_disconnect\"} 2"),
        "{m}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_twenty_in_flight_streams_finish() {
    let mut h = start(|c| c.shutdown.grace = Duration::from_secs(30)).await;
    let client = h2c();
    let mut streams = Vec::new();
    for i in 0..20 {
        let req = post(
            &h.url("/v1/chat/completions"),
            chat_body(&format!("stream {i}"), true, 15),
            &[("x-mock-inter-token", "40ms")],
        );
        let resp = send(&client, req).await;
        let mut body = resp.into_body();
        // Each stream has produced its first event before shutdown starts.
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        streams.push(tokio::spawn(async move {
            let mut all = first.to_vec();
            while let Some(f) = body.frame().await {
                all.extend_from_slice(&f.expect("stream not cut").into_data().unwrap_or_default());
            }
            all
        }));
    }
    let drained = h.begin_shutdown();
    // While draining, readiness reports 503.
    let ready = send(&h1(), get(&h.admin_url("/readyz"))).await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    for s in streams {
        let all = s.await.unwrap();
        let data = sse_data(&all);
        assert_eq!(
            data.last().map(String::as_str),
            Some("[DONE]"),
            "stream completed"
        );
        assert_eq!(
            data.iter().filter(|d| d.contains("\"content\"")).count(),
            15
        );
    }
    let report = drained.await.unwrap();
    assert_eq!(report.aborted_connections, 0);
    // The listener is closed: new connections are refused.
    assert!(tokio::net::TcpStream::connect(h.proxy_addr).await.is_err());
}

#[tokio::test]
async fn shutdown_cuts_streams_that_outlive_the_grace_period() {
    let mut h = start(|c| c.shutdown.grace = Duration::from_millis(300)).await;
    let client = h1();
    let req = post(
        &h.url("/v1/chat/completions"),
        chat_body("never ends", true, 10_000),
        &[("x-mock-inter-token", "50ms")],
    );
    let resp = send(&client, req).await;
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    let report = h.begin_shutdown().await.unwrap();
    assert_eq!(report.aborted_connections, 1);
    let mut cut = false;
    while let Some(f) = tokio::time::timeout(HANG, body.frame()).await.unwrap() {
        if f.is_err() {
            cut = true;
            break;
        }
    }
    assert!(cut, "the stream ended early with an error");
}

#[tokio::test]
async fn shutdown_closes_a_connection_that_never_sent_a_byte() {
    // A grace shorter than the first-request deadline: waiting on the silent connection would
    // end in the grace running out and the connection counted as closed by force.
    let mut h = start(|c| {
        c.listen.workers = 1;
        c.listen.header_read_timeout = Duration::from_secs(120);
        c.shutdown.grace = Duration::from_secs(20);
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(h.proxy_addr).await.unwrap();
    // One worker accepts in order: once a later connection is answered, the silent one is open.
    let resp = chat(&h1(), &h, chat_body("hi", false, 1)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    drop(resp);
    let report = h.begin_shutdown().await.unwrap();
    assert_eq!(report.aborted_connections, 0);
    let mut buf = [0u8; 16];
    let n = tokio::io::AsyncReadExt::read(&mut silent, &mut buf)
        .await
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without a response");
}

#[tokio::test]
async fn upstream_down_is_a_502_json_error() {
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let h = start_proxy(&format!("http://{dead_addr}"), |_| {}).await;
    for (name, client) in clients() {
        let resp = chat(&client, &h, chat_body("hi", false, 1)).await;
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "{name}");
        assert_eq!(resp.headers()["content-type"], "application/json");
        let v = json(resp).await;
        assert_eq!(v["error"]["code"], "upstream_unreachable");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&dead_addr.to_string()));
    }
    let m = metrics_text(&h).await;
    assert!(
        m.contains("kvbust_errors_total{code=\"upstream_unreachable\",source=\"upstream\"} 2"),
        "{m}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn slow_upstream_is_a_504_json_error() {
    let h = start(|c| c.upstream.first_byte_timeout = Duration::from_millis(200)).await;
    let req = post(
        &h.url("/v1/chat/completions"),
        chat_body("slow", false, 1),
        &[("x-mock-first-token-delay", "3s")],
    );
    let resp = send(&h1(), req).await;
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    let v = json(resp).await;
    assert_eq!(v["error"]["code"], "upstream_timeout");
    assert_eq!(v["error"]["type"], "upstream_error");
    // The abandoned upstream request is cancelled, not left generating.
    tokio::time::timeout(HANG, h.mock.recorder().wait_requests(1))
        .await
        .unwrap();
    h.shutdown().await;
}

#[tokio::test]
async fn oversized_body_on_a_rewritten_route_is_a_413() {
    let h = start(|c| {
        c.limits.max_body = kvbust::config::ByteSize(1024);
        c.cache_bust.target = kvbust::cachebust::Target::FirstTurnPrefix;
    })
    .await;
    let big = chat_body(&"x".repeat(4096), false, 1);
    for (name, client) in clients() {
        let resp = chat(&client, &h, big.clone()).await;
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE, "{name}");
        let v = json(resp).await;
        assert_eq!(v["error"]["code"], "body_too_large");
    }
    assert!(
        h.mock.recorder().requests().is_empty(),
        "nothing reached the upstream"
    );
    // Other routes stream without a limit.
    let resp = send(&h1(), post(&h.url("/v1/embeddings"), big.clone(), &[])).await;
    assert_eq!(
        resp.status(),
        StatusCode::NOT_FOUND,
        "the mock's own answer"
    );
    assert_eq!(
        h.mock.recorder().requests()[0].body.as_ref(),
        big.as_bytes()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn other_paths_and_methods_pass_through_untouched() {
    let h = start(|_| {}).await;
    let client = h1();
    let resp = send(&client, get(&h.url("/v1/models"))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers().get("x-kvbust-rid").is_none(),
        "no kvbust headers off the API routes"
    );
    let v = json(resp).await;
    assert_eq!(v["data"][0]["id"], "kvbust-mock");
    for method in [Method::PUT, Method::DELETE, Method::PATCH, Method::POST] {
        let req = Request::builder()
            .method(method.clone())
            .uri(h.url("/custom/path?q=1&r=%20x"))
            .header("x-custom", "kept")
            .body(Full::new(bytes::Bytes::from_static(
                b"not json at all \x00\xff",
            )))
            .unwrap();
        let resp = send(&client, req).await;
        assert_eq!(
            resp.status(),
            StatusCode::NOT_FOUND,
            "{method}: the upstream's status comes back"
        );
        let got = h.mock.recorder().requests().pop().unwrap();
        assert_eq!(got.method, method);
        assert_eq!(got.uri.to_string(), "/custom/path?q=1&r=%20x");
        assert_eq!(got.headers["x-custom"], "kept");
        assert_eq!(got.body.as_ref(), b"not json at all \x00\xff");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn mock_prefix_cache_is_visible_through_the_proxy() {
    let h = start(|_| {}).await;
    let client = h2c();
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(40);
    let cached = |v: &serde_json::Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let ask = |content: String| {
        let req = post(
            &h.url("/v1/chat/completions"),
            chat_body(&content, false, 2),
            &[],
        );
        let client = client.clone();
        async move { json(send(&client, req).await).await }
    };
    let first = ask(long.clone()).await;
    let second = ask(long.clone()).await;
    let changed = format!("XX{}", &long[2..]);
    let third = ask(changed).await;
    assert_eq!(cached(&first), 0);
    assert!(
        cached(&second) > 0 && cached(&second) < second["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(cached(&third), 0);
    // The proxy read the usage and counted it.
    let m = metrics_text(&h).await;
    assert!(
        m.contains(&format!(
            "kvbust_upstream_cached_tokens_total{{phase=\"profiling\",target=\"none\"}} {}",
            cached(&second)
        )),
        "{m}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn admin_endpoints_and_phase_switch() {
    let h = start(|c| c.admin.token = Some("t0k-0123456789abcdef01234".into())).await;
    let c = h1();
    assert_eq!(
        send(&c, get(&h.admin_url("/healthz"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&c, get(&h.admin_url("/readyz"))).await.status(),
        StatusCode::OK
    );
    let v = json(send(&c, get(&h.admin_url("/phase"))).await).await;
    assert_eq!(v["phase"], "profiling");
    let put = |auth: Option<&str>, body: &'static str| {
        let mut b = Request::builder()
            .method(Method::PUT)
            .uri(h.admin_url("/phase"));
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        b.body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    assert_eq!(
        send(&c, put(None, "warmup")).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&c, put(Some("Bearer nope"), "warmup")).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let bad = send(
        &c,
        put(Some("Bearer t0k-0123456789abcdef01234"), "cooldown"),
    )
    .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let v = json(send(&c, put(Some("Bearer t0k-0123456789abcdef01234"), "WARMUP")).await).await;
    assert_eq!(
        (v["old"].as_str(), v["new"].as_str()),
        (Some("profiling"), Some("warmup"))
    );
    // The default phase now applies to requests without the header.
    let resp = chat(&c, &h, chat_body("hi", false, 1)).await;
    assert_eq!(resp.headers()["x-kvbust-phase"], "warmup");
    let cfg = String::from_utf8(
        body_bytes(send(&c, get(&h.admin_url("/config"))).await)
            .await
            .to_vec(),
    )
    .unwrap();
    assert!(cfg.contains("<redacted>") && !cfg.contains("t0k-0123456789abcdef01234"));
    let m = metrics_text(&h).await;
    assert!(m.contains("kvbust_requests_total{phase=\"warmup\",route=\"chat\",status=\"200\",target=\"none\"} 1"), "{m}");
    h.shutdown().await;
}

#[tokio::test]
async fn bad_phase_header_is_a_400() {
    let h = start(|_| {}).await;
    let resp = send(
        &h1(),
        post(
            &h.url("/v1/chat/completions"),
            chat_body("hi", false, 1),
            &[("x-kvbust-phase", "later")],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let v = json(resp).await;
    assert_eq!(v["error"]["code"], "invalid_phase");
    assert!(h.mock.recorder().requests().is_empty());
    h.shutdown().await;
}

/// A misspelt control header would otherwise be stripped and the request run as profiling.
#[tokio::test]
async fn an_unknown_kvbust_header_is_a_400_naming_the_nearest_valid_one() {
    let h = start(|_| {}).await;
    let c = h1();
    for (path, body) in [
        ("/v1/chat/completions", chat_body("hi", false, 1)),
        ("/v1/models", String::new()),
    ] {
        let resp = send(&c, post(&h.url(path), body, &[("x-kvbust-phas", "warmup")])).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{path}");
        let v = json(resp).await;
        assert_eq!(v["error"]["code"], "unknown_header");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("did you mean x-kvbust-phase?"), "{msg}");
    }
    assert!(h.mock.recorder().requests().is_empty());
    let m = metrics_text(&h).await;
    assert!(
        m.contains("kvbust_errors_total{code=\"unknown_header\",source=\"client\"} 2"),
        "{m}"
    );
    h.shutdown().await;

    // headers.reject_unknown = false: removed and ignored, as before.
    let h = start(|c| c.headers.reject_unknown = false).await;
    let resp = send(
        &c,
        post(
            &h.url("/v1/chat/completions"),
            chat_body("hi", false, 1),
            &[("x-kvbust-phas", "warmup")],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-kvbust-phase"], "profiling");
    body_bytes(resp).await;
    let got = h.mock.recorder().requests();
    assert!(got[0].headers.get("x-kvbust-phas").is_none());
    h.shutdown().await;
}

#[tokio::test]
async fn total_timeout_cuts_a_stream_and_bounds_the_wait_for_headers() {
    let h = start(|c| c.upstream.total_timeout = Some(Duration::from_millis(400))).await;
    let req = post(
        &h.url("/v1/chat/completions"),
        chat_body("long", true, 200),
        &[("x-mock-inter-token", "50ms")],
    );
    let resp = send(&h1(), req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut events = 0;
    let cut = loop {
        match tokio::time::timeout(HANG, body.frame()).await.unwrap() {
            Some(Ok(_)) => events += 1,
            Some(Err(_)) => break true,
            None => break false,
        }
    };
    assert!(cut, "the stream was cut");
    assert!(events > 1 && events < 200, "{events} events before the cut");
    let resp = send(
        &h1(),
        post(
            &h.url("/v1/chat/completions"),
            chat_body("x", false, 1),
            &[("x-mock-first-token-delay", "3s")],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    let m = metrics_text(&h).await;
    assert!(
        m.contains("kvbust_streams_aborted_total{reason=\"total_timeout\"} 1"),
        "{m}"
    );
    h.shutdown().await;
}

type TestBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

/// An HTTP/1.1 upstream on port 0 that counts the connections it accepts, answers request `i`
/// (counted over all connections, from 0) with `answer(i)`, and sends on `closed`, when given,
/// each time a connection ends.
async fn counting_server(
    answer: impl Fn(usize) -> http::Response<TestBody> + Send + Sync + 'static,
    closed: Option<tokio::sync::mpsc::UnboundedSender<()>>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let requests = std::sync::Arc::new(AtomicUsize::new(0));
    let answer = std::sync::Arc::new(answer);
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            let (closed, requests, answer) = (closed.clone(), requests.clone(), answer.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    let resp = answer(requests.fetch_add(1, Ordering::SeqCst));
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                if let Some(closed) = closed {
                    let _ = closed.send(());
                }
            });
        }
    });
    (format!("http://{addr}"), accepted)
}

/// A fixed chat completion.
fn chat_completion() -> http::Response<TestBody> {
    let mut resp = http::Response::new(
        Full::new(bytes::Bytes::from_static(
            br#"{"choices":[{"message":{"role":"assistant","content":"ok"}}]}"#,
        ))
        .boxed(),
    );
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// A tiny upstream that counts the connections it accepts and answers every request with a
/// fixed chat completion; with `close`, it ends each connection after one response.
async fn counting_upstream(
    close: bool,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    counting_upstream_telling_closes(close, None).await
}

/// [`counting_upstream`], also sending on `closed` each time a connection ends.
async fn counting_upstream_telling_closes(
    close: bool,
    closed: Option<tokio::sync::mpsc::UnboundedSender<()>>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let answer = move |_| {
        let mut resp = chat_completion();
        if close {
            resp.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        resp
    };
    counting_server(answer, closed).await
}

/// Sends `n` chat requests one after another on one HTTP/1.1 client connection.
async fn sequential_on_one_connection(h: &Harness, n: usize) {
    let tcp = tokio::net::TcpStream::connect(h.proxy_addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    for i in 0..n {
        send.ready().await.unwrap();
        let req = Request::post("/v1/chat/completions")
            .header("host", "kvbust")
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(chat_body(
                &format!("turn {i}"),
                false,
                4,
            ))))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "request {i}");
        resp.into_body().collect().await.unwrap();
    }
}

#[tokio::test]
async fn an_http1_client_connection_keeps_one_upstream_connection() {
    use std::sync::atomic::Ordering;
    let (url, accepted) = counting_upstream(false).await;
    let h = start_proxy(&url, |_| {}).await;
    sequential_on_one_connection(&h, 5).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "five requests, one upstream connection"
    );
    sequential_on_one_connection(&h, 2).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "a second client connection gets its own"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn an_upstream_that_closes_after_each_response_gets_a_fresh_connection_each_time() {
    use std::sync::atomic::Ordering;
    let (url, accepted) = counting_upstream(true).await;
    let h = start_proxy(&url, |_| {}).await;
    sequential_on_one_connection(&h, 4).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 4);
    h.shutdown().await;
}

/// Sends `n` chat requests one after another as streams of one h2c client connection.
async fn sequential_h2c_streams(h: &Harness, n: usize) {
    let client = h2c();
    for i in 0..n {
        let resp = chat(&client, h, chat_body(&format!("turn {i}"), false, 4)).await;
        assert_eq!(resp.status(), StatusCode::OK, "stream {i}");
        body_bytes(resp).await;
    }
}

#[tokio::test]
async fn h2c_streams_reuse_the_workers_idle_upstream_connections() {
    use std::sync::atomic::Ordering;
    let (url, accepted) = counting_upstream(false).await;
    let h = start_proxy(&url, |_| {}).await;
    sequential_h2c_streams(&h, 5).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "five streams one after another, one upstream connection"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn h2c_streams_keep_no_idle_connection_when_the_pool_holds_none() {
    use std::sync::atomic::Ordering;
    let (url, accepted) = counting_upstream(false).await;
    let h = start_proxy(&url, |c| c.upstream.pool_max_idle_per_host = 0).await;
    sequential_h2c_streams(&h, 3).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    h.shutdown().await;
}

#[tokio::test]
async fn h2c_streams_get_a_fresh_connection_from_an_upstream_that_closes_each() {
    use std::sync::atomic::Ordering;
    let (url, accepted) = counting_upstream(true).await;
    let h = start_proxy(&url, |_| {}).await;
    sequential_h2c_streams(&h, 4).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 4);
    h.shutdown().await;
}

/// An upstream whose first response sends one SSE event and then nothing (until its connection
/// closes); every later request gets a whole chat completion. Counts connections.
async fn stalling_first_upstream() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let answer = |i| {
        if i > 0 {
            return chat_completion();
        }
        let event =
            bytes::Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
        let frames = futures_util::StreamExt::chain(
            futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
                hyper::body::Frame::data(event),
            )]),
            futures_util::stream::pending(),
        );
        http::Response::new(http_body_util::StreamBody::new(frames).boxed())
    };
    counting_server(answer, None).await
}

#[tokio::test]
async fn an_h2c_stream_keeps_its_upstream_connection_until_its_body_ends() {
    use std::sync::atomic::Ordering;
    let (url, accepted) = stalling_first_upstream().await;
    let h = start_proxy(&url, |_| {}).await;
    let client = h2c();
    let resp = chat(&client, &h, chat_body("stalls", true, 4)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some_and(|d| d.starts_with(b"data: ")));
    // That stream's response is still open: the next stream must not queue behind it on its
    // upstream connection, but get one of its own.
    let next = || {
        post(
            &h.url("/v1/chat/completions"),
            chat_body("next", false, 4),
            &[],
        )
    };
    let resp = send_within(&client, next(), Duration::from_secs(20)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    // The client gives up on the first stream: its connection, with a response half read,
    // is not reused; the finished one is.
    drop(body);
    let resp = send_within(&client, next(), Duration::from_secs(20)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn an_idle_pooled_connection_is_closed_after_the_pool_idle_timeout() {
    let (tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let (url, _) = counting_upstream_telling_closes(false, Some(tx)).await;
    let h = start_proxy(&url, |c| {
        c.upstream.pool_idle_timeout = Duration::from_millis(100);
    })
    .await;
    sequential_h2c_streams(&h, 1).await;
    // Nothing else happens: kvbust itself must close the idle connection (the test upstream
    // never times a connection out).
    tokio::time::timeout(HANG, closed.recv())
        .await
        .expect("the idle upstream connection is closed")
        .unwrap();
    // And a later stream still gets served, on a new connection.
    sequential_h2c_streams(&h, 1).await;
    h.shutdown().await;
}

#[tokio::test]
async fn keep_host_forwards_the_clients_host_over_http1_and_h2c() {
    let h = start(|c| c.upstream.keep_host = true).await;
    for (name, client) in clients() {
        let resp = chat(&client, &h, chat_body("which host", false, 2)).await;
        assert_eq!(resp.status(), StatusCode::OK, "{name}");
        body_bytes(resp).await;
        let got = h.mock.recorder().requests();
        let last = got.last().unwrap();
        // HTTP/1.1: the client's Host header; h2c: its :authority. Both name the proxy.
        assert_eq!(
            last.headers["host"],
            h.proxy_addr.to_string().as_str(),
            "{name}"
        );
    }
    h.shutdown().await;
}

/// HTTP/1.1 requests on one client connection share its first-byte timer in turn: each is held
/// to its own deadline, whatever the turn before it left the timer set to.
#[tokio::test]
async fn each_request_on_a_kept_alive_connection_has_its_own_first_byte_timeout() {
    let h = start(|c| c.upstream.first_byte_timeout = Duration::from_millis(300)).await;
    let client = h1();
    let url = h.url("/v1/chat/completions");
    let fast = || post(&url, chat_body("fast", false, 1), &[]);
    let slow = || {
        post(
            &url,
            chat_body("slow", false, 1),
            &[("x-mock-first-token-delay", "5s")],
        )
    };
    for (i, (req, want)) in [
        (fast(), StatusCode::OK),
        (slow(), StatusCode::GATEWAY_TIMEOUT),
        (fast(), StatusCode::OK),
        (slow(), StatusCode::GATEWAY_TIMEOUT),
    ]
    .into_iter()
    .enumerate()
    {
        let resp = send(&client, req).await;
        assert_eq!(resp.status(), want, "request {i}");
        let v = json(resp).await;
        if want == StatusCode::GATEWAY_TIMEOUT {
            assert_eq!(v["error"]["code"], "upstream_timeout", "request {i}");
        }
    }
    h.shutdown().await;
}

/// A stream whose upstream stalls is cut at `upstream.idle_timeout`, also after a stream on the
/// same HTTP/1.1 connection (whose timer it takes over) ended in time.
#[tokio::test]
async fn a_stalled_stream_after_a_complete_one_is_cut_at_the_idle_timeout() {
    let h = start(|c| c.upstream.idle_timeout = Duration::from_millis(300)).await;
    let client = h1();
    let url = h.url("/v1/chat/completions");
    let ok = send(&client, post(&url, chat_body("quick", true, 3), &[])).await;
    assert_eq!(ok.status(), StatusCode::OK);
    let body = body_bytes(ok).await;
    assert_eq!(sse_data(&body).last().map(String::as_str), Some("[DONE]"));
    let stalled = send(
        &client,
        post(
            &url,
            chat_body("stalled", true, 3),
            &[("x-mock-inter-token", "30s")],
        ),
    )
    .await;
    assert_eq!(stalled.status(), StatusCode::OK);
    let cut = tokio::time::timeout(Duration::from_secs(20), stalled.into_body().collect())
        .await
        .expect("cut well before the upstream's next token");
    assert!(cut.is_err(), "the stalled stream ends in an error");
    let m = metrics_text(&h).await;
    assert!(
        m.contains("kvbust_errors_total{code=\"upstream_idle_timeout\",source=\"upstream\"} 1"),
        "{m}"
    );
    h.shutdown().await;
}

/// Writes `parts` one write each on a fresh connection, then reads until `want` bytes came.
async fn raw_exchange(h: &Harness, parts: &[&[u8]], want: usize) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(h.proxy_addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    for part in parts {
        tcp.write_all(part).await.unwrap();
        tcp.flush().await.unwrap();
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < want {
        let n = tokio::time::timeout(HANG, tcp.read(&mut buf))
            .await
            .expect("the proxy answers")
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// The data port tells h2c from HTTP/1.1 by peeking at the first bytes; first bytes that do not
/// decide it yet (a preface, or a "P", split from the rest) still reach the right server.
#[tokio::test]
async fn the_version_is_found_however_the_first_bytes_are_split() {
    let h = start(|_| {}).await;
    let preface: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    // An empty SETTINGS frame: what an h2c client sends after the preface.
    let settings: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    for split in [1, 12, 23, 24] {
        let got = raw_exchange(&h, &[&preface[..split], &preface[split..], settings], 9).await;
        // The server's first frame is its SETTINGS (type 4 on stream 0), not an HTTP/1.1 error.
        assert!(got.len() >= 9, "split at {split}: {got:?}");
        assert_eq!(
            got[3],
            4,
            "split at {split}: {:?}",
            String::from_utf8_lossy(&got)
        );
        assert_eq!(&got[5..9], &[0, 0, 0, 0], "split at {split}");
    }
    let body = chat_body("split head", false, 2);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: kvbust\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    for split in [1, 3, head.len()] {
        let got = raw_exchange(
            &h,
            &[&head.as_bytes()[..split], &head.as_bytes()[split..]],
            usize::MAX,
        )
        .await;
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 200 OK\r\n"),
            "split at {split}: {text}"
        );
        assert!(text.contains("chat.completion"), "split at {split}: {text}");
    }
    h.shutdown().await;
}
