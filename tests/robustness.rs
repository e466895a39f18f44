//! Hostile and careless clients and upstreams (issue 14): silent connections, stalled bodies,
//! oversized and non-ASCII session ids, buffered-body budget, in-flight accounting, secrets in
//! URLs, many streams at once, an upstream dying mid-stream. Loopback only, port 0, bounded.
//! Alone in its test binary because one test measures the whole process's resident memory,
//! which tests running beside it in the same process would inflate.
// Test code: a panic is the failure report (Cargo.toml denies these in the library).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::*;

/// Short connection deadlines so a test waits a fraction of a second, not the defaults.
const FIRST: Duration = Duration::from_millis(400);
const IDLE: Duration = Duration::from_millis(700);
const BODY_GAP: Duration = Duration::from_millis(500);

fn short_timeouts(c: &mut kvbust::config::Config) {
    c.listen.header_read_timeout = FIRST;
    c.listen.idle_timeout = IDLE;
    c.listen.body_read_timeout = BODY_GAP;
}

/// Reads until the server closes the connection; returns what it sent and when it closed.
async fn read_until_closed(tcp: &mut TcpStream) -> (Vec<u8>, Instant) {
    let mut buf = Vec::new();
    // The guard only keeps a regression from hanging the suite.
    let r = tokio::time::timeout(HANG, tcp.read_to_end(&mut buf))
        .await
        .expect("the server closed the connection");
    // A reset instead of a FIN is also a close.
    if let Err(e) = r {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
    (buf, Instant::now())
}

#[tokio::test]
async fn silent_connections_are_cut_at_the_configured_timeout_on_both_ports() {
    let h = start(short_timeouts).await;
    for addr in [h.proxy_addr, h.admin_addr] {
        // Nothing at all.
        let start = Instant::now();
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let (got, closed) = read_until_closed(&mut tcp).await;
        assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
        let after = closed - start;
        assert!(
            after >= FIRST && after < FIRST * 5,
            "{addr}: closed after {after:?}"
        );

        // Half an HTTP/2 preface.
        let start = Instant::now();
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        let (_, closed) = read_until_closed(&mut tcp).await;
        let after = closed - start;
        assert!(
            after >= FIRST && after < FIRST * 5,
            "{addr}: closed after {after:?}"
        );

        // Request headers that never end.
        let start = Instant::now();
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let (got, closed) = read_until_closed(&mut tcp).await;
        assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
        let after = closed - start;
        assert!(
            after >= FIRST && after < FIRST * 5,
            "{addr}: closed after {after:?}"
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_after_the_idle_timeout_not_before() {
    let h = start(short_timeouts).await;
    let mut tcp = TcpStream::connect(h.proxy_addr).await.unwrap();
    tcp.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Read the whole response (content-length framed) before starting the idle clock.
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = Vec::new();
    loop {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the response was complete");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("content-length");
            if body.len() >= len {
                break;
            }
        }
    }
    assert!(got.starts_with(b"HTTP/1.1 200"));
    let idle_from = Instant::now();
    let (rest, closed) = read_until_closed(&mut tcp).await;
    assert!(rest.is_empty());
    let after = closed - idle_from;
    // The idle deadline (700 ms) applies now, not the first-request one (400 ms).
    assert!(
        after >= IDLE - Duration::from_millis(50) && after < IDLE * 5,
        "closed after {after:?}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_stream_longer_than_the_idle_timeout_is_never_cut() {
    let mock = kvbust::mock::MockConfig {
        inter_token: Duration::from_millis(40),
        ..quick_mock()
    };
    let h = start_with_mock(mock, short_timeouts).await;
    for (name, client) in clients() {
        // 40 tokens × 40 ms ≈ 1.6 s, over twice the idle timeout, with no client bytes meanwhile.
        let resp = chat(&client, &h, chat_body("hi", true, 40)).await;
        assert_eq!(resp.status(), 200, "{name}");
        let body = body_bytes(resp).await;
        let events = sse_data(&body);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{name}");
        let content = events.iter().filter(|e| e.contains("\"content\"")).count();
        assert_eq!(content, 40, "{name}: every token arrived");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_body_that_stalls_on_a_rewritten_route_gets_408_and_nothing_is_forwarded() {
    let h = start(|c| {
        short_timeouts(c);
        c.cache_bust.target = kvbust::cachebust::Target::FirstTurnPrefix;
    })
    .await;
    let body = chat_body("hello", false, 4);
    let mut tcp = TcpStream::connect(h.proxy_addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body.as_bytes()[..10]).await.unwrap();
    let start = Instant::now();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(HANG, tcp.read(&mut buf))
        .await
        .expect("answered")
        .unwrap();
    let waited = start.elapsed();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"request_body_timeout\""), "{text}");
    assert!(waited >= BODY_GAP && waited < BODY_GAP * 5, "{waited:?}");
    assert!(
        h.mock.recorder().requests().is_empty(),
        "nothing reached the upstream"
    );
    let m = metrics_text(&h).await;
    assert!(
        m.contains("kvbust_errors_total{code=\"request_body_timeout\",source=\"client\"} 1"),
        "{m}"
    );
    h.shutdown().await;
}

/// The `x-kvbust-rid` a request gets with `x-correlation-id: id` (raw header bytes).
async fn rid_for(h: &Harness, id: &[u8]) -> (u16, Option<String>, Bytes) {
    let mut req = post(
        &h.url("/v1/chat/completions"),
        chat_body("same first turn", false, 2),
        &[],
    );
    req.headers_mut().insert(
        "x-correlation-id",
        http::HeaderValue::from_bytes(id).unwrap(),
    );
    let resp = send(&h1(), req).await;
    let status = resp.status().as_u16();
    let rid = resp
        .headers()
        .get("x-kvbust-rid")
        .map(|v| v.to_str().unwrap().to_string());
    (status, rid, body_bytes(resp).await)
}

#[tokio::test]
async fn non_ascii_session_ids_get_their_own_rids_and_non_text_ones_a_400() {
    let h = start(|c| c.cache_bust.target = kvbust::cachebust::Target::FirstTurnPrefix).await;
    let (s1, r1, _) = rid_for(&h, "séssion-1".as_bytes()).await;
    let (s2, r2, _) = rid_for(&h, "séssion-2".as_bytes()).await;
    let (s1b, r1b, _) = rid_for(&h, "séssion-1".as_bytes()).await;
    assert_eq!((s1, s2, s1b), (200, 200, 200));
    assert_ne!(r1, r2, "distinct sessions, distinct markers");
    assert_eq!(r1, r1b, "the same session keeps its marker");
    // The RID is AIPerf's digest of (benchmark id, counter, counter, the id as text).
    let want = kvbust::cachebust::digest(&kvbust::cachebust::DigestInputs {
        benchmark_id: "0123456789ab".into(),
        recycle_pass: 0,
        trajectory_index: 0,
        trace_id: "séssion-1".into(),
    });
    assert_eq!(r1.as_deref(), Some(want.as_str()));
    // Latin-1 bytes are not text: a clear 400, not a silent fall-back to the first-turn hash.
    let (status, _, body) = rid_for(&h, b"s\xe9ssion-3").await;
    assert_eq!(status, 400);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "invalid_header");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("x-correlation-id"));
    h.shutdown().await;
}

#[tokio::test]
async fn an_oversized_session_header_is_a_400_naming_the_limit() {
    let h = start(|c| c.cache_bust.target = kvbust::cachebust::Target::FirstTurnPrefix).await;
    let (status, _, body) = rid_for(&h, &vec![b'a'; 1025]).await;
    assert_eq!(status, 400);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "header_too_long");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("limits.max_control_header"));
    assert!(h.mock.recorder().requests().is_empty());
    h.shutdown().await;
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_sessions_with_100_kb_ids_keep_memory_bounded() {
    // Ids this long need the header limit raised; the ledger must still hold digests only.
    // The mock keeps few requests (their headers hold the ids): only the proxy is measured.
    let mock = kvbust::mock::MockConfig {
        record_requests: 16,
        ..quick_mock()
    };
    let h = start_with_mock(mock, |c| {
        c.cache_bust.target = kvbust::cachebust::Target::FirstTurnPrefix;
        c.limits.max_control_header = kvbust::config::ByteSize(128 << 10);
    })
    .await;
    let client = h1();
    let body = Bytes::from(chat_body("x", false, 1));
    let id_tail = "x".repeat(100 * 1024 - 16);
    let send_batch = |from: usize, to: usize| {
        let client = client.clone();
        let url = h.url("/v1/chat/completions");
        let body = body.clone();
        let id_tail = id_tail.clone();
        async move {
            for i in from..to {
                let id = format!("{i:016}{id_tail}");
                let req = post(&url, body.clone(), &[("x-correlation-id", &id)]);
                let resp = send(&client, req).await;
                assert_eq!(resp.status(), 200);
                body_bytes(resp).await;
            }
        }
    };
    // Warm up allocator arenas and pools before the baseline.
    futures_util::future::join_all((0..8).map(|k| send_batch(k * 100, k * 100 + 100))).await;
    let before = rss_bytes();
    futures_util::future::join_all(
        (0..8).map(|k| send_batch(1000 + k * 2500, 1000 + k * 2500 + 2500)),
    )
    .await;
    let grown = rss_bytes().saturating_sub(before);
    let sessions = h.runtime.metrics.ledger_sessions.get();
    assert_eq!(sessions, 20_800, "every id is its own session");
    assert!(
        grown < 50 << 20,
        "RSS grew {} MB for 20,000 sessions",
        grown >> 20
    );
    h.shutdown().await;
}

/// Waits (bounded) until `cond` holds, checking the state it names; not a timed sleep.
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn buffered_bodies_share_one_budget_and_past_it_get_503_at_once() {
    let h = start(|c| {
        c.cache_bust.target = kvbust::cachebust::Target::FirstTurnPrefix;
        c.limits.max_body = kvbust::config::ByteSize(64 << 10);
        c.limits.max_buffered_total = kvbust::config::ByteSize(64 << 10);
    })
    .await;
    // A: declares 60,000 bytes, sends 59,000 and pauses; what it sent is held (what it only
    // declared is not: issue 23).
    let mut a = TcpStream::connect(h.proxy_addr).await.unwrap();
    a.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 60000\r\n\r\n{\"messages\":")
        .await
        .unwrap();
    a.write_all(&vec![b' '; 59_000 - 12]).await.unwrap();
    wait_for("A's reservation", || h.runtime.bodies.used() == 59_000).await;
    // B: 10 KB more would pass 64 KiB: refused at once, counted, nothing forwarded.
    let big = chat_body(&"y".repeat(10_000), false, 1);
    let resp = chat(&h1(), &h, big.clone()).await;
    assert_eq!(resp.status(), 503);
    // Not queued behind A: B was answered while A still held its bytes.
    assert_eq!(h.runtime.bodies.used(), 59_000, "not queued");
    assert_eq!(resp.headers()["retry-after"], "1");
    let v = json(resp).await;
    assert_eq!(v["error"]["code"], "buffer_budget_exhausted");
    assert!(h.mock.recorder().requests().is_empty());
    // A's client goes away: its share comes back, and B's request now goes through.
    drop(a);
    wait_for("A's reservation to be given back", || {
        h.runtime.bodies.used() == 0
    })
    .await;
    let resp = chat(&h1(), &h, big).await;
    assert_eq!(resp.status(), 200);
    body_bytes(resp).await;
    assert_eq!(h.runtime.bodies.used(), 0);
    let m = metrics_text(&h).await;
    assert!(
        m.contains("kvbust_errors_total{code=\"buffer_budget_exhausted\",source=\"internal\"} 1"),
        "{m}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_request_waiting_for_upstream_headers_is_in_flight() {
    // An upstream that takes the request and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let (mut s, _) = silent.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf).await;
        std::future::pending::<()>().await;
    });
    let h = start_proxy(&url, |c| {
        c.upstream.first_byte_timeout = Duration::from_millis(800)
    })
    .await;
    let client = h1();
    let req = post(
        &h.url("/v1/chat/completions"),
        chat_body("hi", false, 1),
        &[],
    );
    let pending = tokio::spawn(async move { send(&client, req).await.status() });
    let gauge = h.runtime.metrics.in_flight.clone();
    wait_for("the request to be counted", || gauge.get() == 1).await;
    assert_eq!(pending.await.unwrap(), 504);
    wait_for("the count to drop", || gauge.get() == 0).await;
    held.abort();
    h.shutdown().await;
}

#[tokio::test]
async fn a_password_in_the_upstream_url_is_never_shown_nor_sent_as_host() {
    let ml = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = ml.local_addr().unwrap();
    let mock = kvbust::mock::Mock::new(quick_mock(), None);
    tokio::spawn(kvbust::mock::serve(
        ml,
        mock.clone(),
        std::future::pending(),
    ));
    let h = start_proxy(&format!("http://user:s3cret@{addr}"), |_| {}).await;
    let config = body_bytes(send(&h1(), get(&h.admin_url("/config"))).await).await;
    let config = String::from_utf8_lossy(&config);
    assert!(config.contains("user:<redacted>@"), "{config}");
    assert!(!config.contains("s3cret"), "{config}");
    for (name, client) in clients() {
        let resp = chat(&client, &h, chat_body("hi", false, 1)).await;
        assert_eq!(resp.status(), 200, "{name}");
        body_bytes(resp).await;
    }
    for r in mock.recorder().requests() {
        let host = r
            .headers
            .get("host")
            .map(|v| v.to_str().unwrap().to_string())
            .or(r.authority.clone())
            .unwrap();
        assert_eq!(host, addr.to_string());
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_thousand_concurrent_streams_all_complete() {
    let h = start(|_| {}).await;
    let client = h2c();
    let url = h.url("/v1/chat/completions");
    let body = Bytes::from(chat_body("hi", true, 8));
    let streams = (0..1000).map(|_| {
        let client = client.clone();
        let req = post(&url, body.clone(), &[]);
        async move {
            let resp = send(&client, req).await;
            assert_eq!(resp.status(), 200);
            sse_data(&body_bytes(resp).await)
        }
    });
    let all = futures_util::future::join_all(streams).await;
    for events in &all {
        assert_eq!(
            events.iter().filter(|e| e.contains("\"content\"")).count(),
            8
        );
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    }
    assert_eq!(h.mock.recorder().requests_total(), 1000);
    assert_eq!(h.runtime.metrics.in_flight.get(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn an_upstream_killed_mid_stream_is_counted_and_the_client_stream_ends() {
    // An upstream that sends two events and then dies without ending the chunked body.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let events = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n";
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = vec![0u8; 8192];
            let _ = s.read(&mut buf).await;
            let msg = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n",
                events.len()
            );
            s.write_all(msg.as_bytes()).await.unwrap();
            // Dropped here: the body ends without its last chunk.
        }
    });
    let h = start_proxy(&url, |_| {}).await;
    for (name, client) in clients() {
        let resp = chat(&client, &h, chat_body("hi", true, 8)).await;
        assert_eq!(resp.status(), 200, "{name}");
        let mut body = resp.into_body();
        let mut got = Vec::new();
        let ended_with_error = loop {
            match tokio::time::timeout(
                Duration::from_secs(20),
                http_body_util::BodyExt::frame(&mut body),
            )
            .await
            .expect("the client's stream ends, it does not hang")
            {
                Some(Ok(f)) => {
                    got.extend_from_slice(f.data_ref().map(|d| &d[..]).unwrap_or_default())
                }
                Some(Err(_)) => break true,
                None => break false,
            }
        };
        assert_eq!(
            String::from_utf8_lossy(&got),
            events,
            "{name}: what came before is intact"
        );
        assert!(
            ended_with_error,
            "{name}: the client can tell the stream was cut"
        );
    }
    let m = metrics_text(&h).await;
    assert!(
        m.contains("kvbust_errors_total{code=\"upstream_body_error\",source=\"upstream\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("kvbust_streams_aborted_total{reason=\"upstream_error\"} 2"),
        "{m}"
    );
    assert_eq!(h.runtime.metrics.in_flight.get(), 0);
    h.shutdown().await;
}

/// Issue 23 item 1: sixteen bodies that declare 64 MiB and send one byte hold one byte each of
/// `limits.max_buffered_total`, not 64 MiB each, so another client's rewritten request is served.
#[tokio::test]
async fn slow_bodies_declaring_64_mib_do_not_fill_the_buffer_budget() {
    // Defaults: limits.max_body 64 MiB, limits.max_buffered_total 1 GiB (16 x 64 MiB).
    let h = start(|c| c.cache_bust.target = kvbust::cachebust::Target::FirstTurnPrefix).await;
    let mut slow = Vec::new();
    for _ in 0..16 {
        let mut s = TcpStream::connect(h.proxy_addr).await.unwrap();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 67108864\r\n\r\n{")
            .await
            .unwrap();
        slow.push(s);
    }
    let gauge = h.runtime.metrics.in_flight.clone();
    wait_for("the 16 slow bodies to be read", || gauge.get() == 16).await;
    for (name, client) in clients() {
        let resp = chat(&client, &h, chat_body("a legitimate request", false, 2)).await;
        let status = resp.status();
        let body = body_bytes(resp).await;
        assert_eq!(status, 200, "{name}: {}", String::from_utf8_lossy(&body));
    }
    wait_for("one byte held per slow body", || {
        h.runtime.bodies.used() == 16
    })
    .await;
    drop(slow);
    wait_for("the slow bodies' bytes given back", || {
        h.runtime.bodies.used() == 0
    })
    .await;
    h.shutdown().await;
}

/// Issue 23 item 8: a stalled `PUT /phase` body on the admin port (no token set) is timed out
/// like a data-port body: 408, and the connection closes.
#[tokio::test]
async fn a_stalled_admin_body_is_timed_out() {
    let h = start(short_timeouts).await;
    let mut tcp = TcpStream::connect(h.admin_addr).await.unwrap();
    tcp.write_all(b"PUT /phase HTTP/1.1\r\nHost: x\r\ncontent-length: 10\r\n\r\nwa")
        .await
        .unwrap();
    let (got, _) = read_until_closed(&mut tcp).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"request_body_timeout\""), "{text}");
    assert_eq!(
        h.runtime.default_phase(),
        kvbust::cachebust::Phase::Profiling
    );
    h.shutdown().await;
}

/// Issue 23 item 9: an `x-request-id` over 128 bytes, or not visible ASCII, is replaced by a
/// new one, on the response and upstream alike; one that fits is kept.
#[tokio::test]
async fn an_oversized_or_invisible_request_id_is_replaced() {
    let h = start(|_| {}).await;
    let long = "r".repeat(300);
    for (given, kept) in [
        (long.as_str(), false),
        ("with space", false),
        ("ok-id_128.x", true),
    ] {
        let req = post(
            &h.url("/v1/chat/completions"),
            chat_body("hi", false, 1),
            &[("x-request-id", given)],
        );
        let resp = send(&h1(), req).await;
        assert_eq!(resp.status(), 200);
        let echoed = resp.headers()["x-request-id"].to_str().unwrap().to_string();
        body_bytes(resp).await;
        let upstream = h.mock.recorder().requests();
        let sent = upstream.last().unwrap().headers["x-request-id"]
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(sent, echoed, "the upstream sees the id the client gets");
        if kept {
            assert_eq!(echoed, given);
        } else {
            assert_eq!(echoed.len(), 16, "{given}: replaced by a new id");
            assert!(echoed.bytes().all(|b| b.is_ascii_hexdigit()));
        }
    }
    h.shutdown().await;
}

/// Issue 23 item 1: a body trickled just under `listen.body_read_timeout` is cut at
/// `listen.body_total_timeout`: 408 `request_body_total_timeout`, on a rewritten route and on a
/// pass-through one.
#[tokio::test]
async fn a_trickled_body_is_cut_at_the_whole_body_deadline() {
    let h = start(|c| {
        c.cache_bust.target = kvbust::cachebust::Target::FirstTurnPrefix;
        c.listen.body_read_timeout = Duration::from_secs(20);
        c.listen.body_total_timeout = Duration::from_millis(800);
    })
    .await;
    for path in ["/v1/chat/completions", "/v1/embeddings"] {
        let mut tcp = TcpStream::connect(h.proxy_addr).await.unwrap();
        let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{");
        tcp.write_all(head.as_bytes()).await.unwrap();
        // One byte every 100 ms: far inside the 20 s gap, never finishing the 1000 bytes.
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let guard = Instant::now() + Duration::from_secs(20);
        while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"}") {
            assert!(Instant::now() < guard, "{path}: no answer");
            tokio::select! {
                n = tcp.read(&mut buf) => {
                    let n = n.unwrap();
                    assert!(n > 0, "{path}: closed with {}", String::from_utf8_lossy(&got));
                    got.extend_from_slice(&buf[..n]);
                }
                _ = tick.tick() => { let _ = tcp.write_all(b" ").await; }
            }
        }
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text}");
        assert!(
            text.contains("\"code\":\"request_body_total_timeout\""),
            "{path}: {text}"
        );
        assert!(text.contains("listen.body_total_timeout"), "{path}: {text}");
    }
    let m = metrics_text(&h).await;
    assert!(
        m.contains("kvbust_errors_total{code=\"request_body_total_timeout\",source=\"client\"} 2"),
        "{m}"
    );
    h.shutdown().await;
}

/// Waits (bounded) until `/metrics` shows `line`; returns the exposition.
async fn wait_for_metric(h: &Harness, line: &str) -> String {
    let deadline = Instant::now() + HANG;
    loop {
        let m = metrics_text(h).await;
        if m.contains(line) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {line}: {m}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Issue 23 item 12: past `listen.max_connections`, a new client is served and the oldest
/// connection that has sent nothing is closed to make room; with every connection busy, the
/// new one is closed instead. Counted in `kvbust_shed_total`, states in `kvbust_connections`.
#[tokio::test]
async fn past_max_connections_the_oldest_silent_connection_is_shed() {
    let h = start(|c| {
        c.listen.workers = 1;
        c.listen.max_connections = 4;
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(h.proxy_addr).await.unwrap());
    }
    wait_for_metric(&h, "kvbust_connections{state=\"new\"} 4").await;
    // A fifth, a real client: served, and the oldest silent connection closed for it.
    let resp = send(&h1(), get(&h.url("/v1/models"))).await;
    assert_eq!(resp.status(), 200);
    body_bytes(resp).await;
    let (got, _) = read_until_closed(&mut silent[0]).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let m = metrics_text(&h).await;
    assert!(m.contains("kvbust_shed_total 1\n"), "{m}");
    assert!(m.contains("kvbust_connections{state=\"new\"} 3\n"), "{m}");
    // The younger silent connections are still open: nothing was cut but the one.
    for s in &mut silent[1..] {
        s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"HTTP/1.1 200");
    }
    h.shutdown().await;

    // Every connection busy (a request body in flight on each): the new one is closed.
    let h = start(|c| {
        c.listen.workers = 1;
        c.listen.max_connections = 4;
    })
    .await;
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(h.proxy_addr).await.unwrap();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{")
            .await
            .unwrap();
        busy.push(s);
    }
    let gauge = h.runtime.metrics.in_flight.clone();
    wait_for("four requests in flight", || gauge.get() == 4).await;
    let mut extra = TcpStream::connect(h.proxy_addr).await.unwrap();
    let _ = extra
        .write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let (got, _) = read_until_closed(&mut extra).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let m = wait_for_metric(&h, "kvbust_shed_total 1\n").await;
    assert!(
        m.contains("kvbust_connections{state=\"active\"} 4\n"),
        "{m}"
    );
    drop(busy);
    h.shutdown().await;
}

/// Issue 34 item 1: the admin port holds at most `admin.max_connections`; past it a new client
/// is served and the oldest admin connection that has sent nothing is closed for it, so silent
/// connections cannot take every descriptor. Counted in `kvbust_admin_shed_total`.
#[tokio::test]
async fn past_admin_max_connections_the_oldest_silent_admin_connection_is_shed() {
    let h = start(|c| c.admin.max_connections = 4).await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(h.admin_addr).await.unwrap());
    }
    // A fifth, a scrape: served, and the oldest silent connection closed for it (connections
    // are accepted in the order they were made, so the four are in the table first).
    let m = metrics_text(&h).await;
    assert!(m.contains("kvbust_admin_shed_total 1\n"), "{m}");
    let (got, _) = read_until_closed(&mut silent[0]).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    // The younger ones are still open and served.
    for s in &mut silent[1..] {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"HTTP/1.1 200");
    }
    // The data port's count is its own.
    assert!(m.contains("kvbust_shed_total 0\n"), "{m}");
    h.shutdown().await;
}

/// An HTTP/1.1 upstream that counts the connections it accepts and answers each request once
/// it has read the whole body.
async fn counting_upstream() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let service =
                hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async {
                    let body = http_body_util::BodyExt::collect(req.into_body()).await?;
                    let n = body.to_bytes().len();
                    Ok::<_, hyper::Error>(http::Response::new(http_body_util::Full::new(
                        Bytes::from(format!("{{\"read\":{n}}}")),
                    )))
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), service),
            );
        }
    });
    (url, accepted)
}

/// A request body that sends its first bytes and then nothing, forever.
struct HalfSent(Option<Bytes>);

impl http_body::Body for HalfSent {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.0.take() {
            Some(b) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(b)))),
            None => std::task::Poll::Pending,
        }
    }
}

type H2Body = http_body_util::Either<HalfSent, http_body_util::Full<Bytes>>;

fn h2c_streaming(
) -> hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, H2Body>
{
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

fn embeddings(h: &Harness, body: H2Body) -> http::Request<H2Body> {
    http::Request::post(h.url("/v1/embeddings"))
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

/// Sends `n` half-sent streams on one HTTP/2 connection; returns the statuses and error codes
/// of the first `answered` to be answered (the rest hold their upstream connections).
async fn half_sent_streams(h: &Harness, n: usize, answered: usize) -> Vec<(u16, String)> {
    let client = h2c_streaming();
    // One whole request first, so every stream shares one client connection.
    let full = http_body_util::Either::Right(http_body_util::Full::new(Bytes::from("{}")));
    let resp = client.request(embeddings(h, full)).await.unwrap();
    assert_eq!(resp.status(), 200);
    http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..n {
        let (client, tx) = (client.clone(), tx.clone());
        let half = http_body_util::Either::Left(HalfSent(Some(Bytes::from_static(b"{\"input\":"))));
        let req = embeddings(h, half);
        tokio::spawn(async move {
            let resp = client.request(req).await.unwrap();
            let status = resp.status().as_u16();
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
            let _ = tx.send((
                status,
                v["error"]["code"].as_str().unwrap_or("").to_string(),
            ));
        });
    }
    let mut got = Vec::new();
    while got.len() < answered {
        let r = tokio::time::timeout(HANG, rx.recv()).await;
        got.push(r.expect("answered").expect("a status"));
    }
    // Kept alive: its streams hold their upstream connections until the test ends.
    std::mem::forget(client);
    got
}

/// Starts a one-worker proxy in front of a counting upstream with `bound` applied to its
/// config, sends `sent` half-sent streams on one h2c connection and checks that the `refused`
/// ones past the bound got 503 `upstream_connections_exhausted`. Returns the harness and how
/// many connections the upstream accepted.
async fn refused_past_the_bound(
    bound: impl FnOnce(&mut kvbust::config::Config),
    sent: usize,
    refused: usize,
) -> (Harness, usize) {
    use std::sync::atomic::Ordering;
    let (url, accepted) = counting_upstream().await;
    let h = start_proxy(&url, |c| {
        c.listen.workers = 1;
        c.upstream.connect_timeout = Duration::from_millis(300);
        // The held streams are still in flight at the end: no need to wait them out.
        c.shutdown.grace = Duration::from_millis(100);
        bound(c);
    })
    .await;
    let got = half_sent_streams(&h, sent, refused).await;
    for (status, code) in &got {
        assert_eq!(
            (*status, code.as_str()),
            (503, "upstream_connections_exhausted")
        );
    }
    (h, accepted.load(Ordering::SeqCst))
}

/// Issue 23 item 2: the half-sent HTTP/2 streams of one client connection hold at most
/// `upstream.max_connections_per_client` upstream connections; a stream past it waits up to
/// `upstream.connect_timeout` and gets 503, and a request on another connection is served.
#[tokio::test]
async fn half_sent_h2_streams_open_at_most_the_per_client_bound_of_upstream_connections() {
    let (h, accepted) =
        refused_past_the_bound(|c| c.upstream.max_connections_per_client = 4, 12, 8).await;
    assert_eq!(accepted, 4, "the bound, no more");
    // A legitimate request on its own connection still works.
    let req = post(&h.url("/v1/embeddings"), "{\"input\":\"x\"}", &[]);
    let resp = send(&h1(), req).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(&body_bytes(resp).await[..], b"{\"read\":13}");
    h.shutdown().await;
}

/// Issue 23 item 2: a worker opens at most `upstream.max_connections_per_worker` upstream
/// connections, whatever its clients ask.
#[tokio::test]
async fn a_worker_opens_at_most_its_bound_of_upstream_connections() {
    let (h, accepted) =
        refused_past_the_bound(|c| c.upstream.max_connections_per_worker = 3, 8, 5).await;
    assert_eq!(accepted, 3, "the bound, no more");
    h.shutdown().await;
}

/// Opens `conns` HTTP/2 connections (one whole request first on each, so its streams share
/// it) and sends `per_conn` half-sent streams on each; answers (status, error code, message)
/// come on the receiver as they are given. The streams that are never answered hold their
/// upstream connections until the test ends.
async fn half_sent_on(
    h: &Harness,
    conns: usize,
    per_conn: usize,
) -> tokio::sync::mpsc::UnboundedReceiver<(u16, String, String)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // Every connection opened (by a whole request) before any stream holds a slot.
    let mut clients = Vec::new();
    for _ in 0..conns {
        let client = h2c_streaming();
        let full = http_body_util::Either::Right(http_body_util::Full::new(Bytes::from("{}")));
        let resp = client.request(embeddings(h, full)).await.unwrap();
        assert_eq!(resp.status(), 200);
        http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap();
        clients.push(client);
    }
    for client in &clients {
        for _ in 0..per_conn {
            let (client, tx) = (client.clone(), tx.clone());
            let half =
                http_body_util::Either::Left(HalfSent(Some(Bytes::from_static(b"{\"input\":"))));
            let req = embeddings(h, half);
            tokio::spawn(async move {
                let resp = client.request(req).await.unwrap();
                let status = resp.status().as_u16();
                let body = http_body_util::BodyExt::collect(resp.into_body())
                    .await
                    .unwrap();
                let v: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
                let field = |k: &str| v["error"][k].as_str().unwrap_or("").to_string();
                let _ = tx.send((status, field("code"), field("message")));
            });
        }
    }
    // Kept alive: their streams hold their upstream connections until the test ends.
    std::mem::forget(clients);
    rx
}

async fn next_answer(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(u16, String, String)>,
) -> (u16, String, String) {
    // The guard only keeps a regression from hanging the suite.
    tokio::time::timeout(HANG, rx.recv())
        .await
        .expect("answered")
        .expect("a status")
}

/// Issue 34 item 5: the streams of one source address's HTTP/2 connections together hold at
/// most `upstream.max_connections_per_source` upstream connections, however many connections
/// it opens; past it a stream waits `upstream.connect_timeout`, then 503 naming the key.
#[tokio::test]
async fn one_source_holds_at_most_its_bound_of_upstream_connections_over_many_connections() {
    use std::sync::atomic::Ordering;
    let (url, accepted) = counting_upstream().await;
    let h = start_proxy(&url, |c| {
        c.listen.workers = 1;
        c.upstream.max_connections_per_client = 4;
        c.upstream.max_connections_per_source = 4;
        c.upstream.connect_timeout = Duration::from_millis(300);
        c.shutdown.grace = Duration::from_millis(100);
    })
    .await;
    // Three connections of three streams each: each connection within its own bound, the
    // source not.
    let mut rx = half_sent_on(&h, 3, 3).await;
    for _ in 0..5 {
        let (status, code, message) = next_answer(&mut rx).await;
        assert_eq!(
            (status, code.as_str()),
            (503, "upstream_connections_exhausted")
        );
        assert!(
            message.contains("upstream.max_connections_per_source"),
            "{message}"
        );
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 4, "the bound, no more");
    // Another source is not held back by it: the same request from 127.0.0.2.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = sock.connect(h.proxy_addr).await.unwrap();
    other
        .write_all(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    other.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    h.shutdown().await;
}

/// Issue 34 item 5: whatever its clients do, the model server sees at most
/// `upstream.max_connections_per_worker` × workers connections from kvbust: here 4 HTTP/2
/// connections of 3 half-sent streams each, 2 workers of 2 connections.
#[tokio::test]
async fn the_upstream_sees_at_most_the_per_worker_bound_times_the_workers() {
    use std::sync::atomic::Ordering;
    let (url, accepted) = counting_upstream().await;
    let h = start_proxy(&url, |c| {
        c.listen.workers = 2;
        c.upstream.max_connections_per_worker = 2;
        c.upstream.max_connections_per_source = 0;
        c.upstream.connect_timeout = Duration::from_millis(300);
        c.shutdown.grace = Duration::from_millis(100);
    })
    .await;
    let sent = 12;
    let mut rx = half_sent_on(&h, 4, 3).await;
    // Every stream either holds an upstream connection or is refused.
    let mut refused = 0;
    while refused + accepted.load(Ordering::SeqCst) < sent {
        let (status, code, message) = next_answer(&mut rx).await;
        assert_eq!(
            (status, code.as_str()),
            (503, "upstream_connections_exhausted")
        );
        assert!(
            message.contains("upstream.max_connections_per_worker"),
            "{message}"
        );
        refused += 1;
    }
    assert!(accepted.load(Ordering::SeqCst) <= 4, "{accepted:?}");
    h.shutdown().await;
}

/// Issue 34 item 5: by default one client connection's HTTP/2 streams hold at most 64 upstream
/// connections (what a connection has in flight in practice), not the stream limit of 256.
#[tokio::test]
async fn by_default_one_h2_connection_holds_at_most_64_upstream_connections() {
    let (h, accepted) = refused_past_the_bound(|_| {}, 70, 6).await;
    assert_eq!(accepted, 64, "the default bound, no more");
    h.shutdown().await;
}
