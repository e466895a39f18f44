//! Issue 34's server items on the data port, against real bytes on loopback: a second
//! `x-request-id` (item 7), `CONNECT` (item 8), client framing errors (item 9) and the
//! conversation header's length (item 12).

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::*;

/// An HTTP/1.1 upstream that records the head of every request it reads and answers `200 ok`
/// once the body (by `content-length`, or chunked to its last chunk) is in.
async fn recording_upstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    seen.lock().unwrap().push(head.clone());
                    let mut rest = buf.split_off(end + 4);
                    let done = |r: &[u8]| match head.split("content-length: ").nth(1) {
                        Some(n) => r.len() >= n.lines().next().unwrap().trim().parse().unwrap(),
                        None if head.contains("transfer-encoding: chunked") => {
                            r.windows(5).any(|w| w == b"0\r\n\r\n")
                        }
                        None => true,
                    };
                    while !done(&rest) {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => rest.extend_from_slice(&chunk[..n]),
                        }
                    }
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await
                        .is_err()
                    {
                        return;
                    }
                    buf.clear();
                }
            });
        }
    });
    (url, heads)
}

/// Sends `bytes` on a new connection (closing its write side when `close` is set) and reads
/// the response head and body: up to the connection's end, or the first `content-length` body.
async fn raw(h: &Harness, bytes: &[u8], close: bool) -> String {
    let mut s = TcpStream::connect(h.proxy_addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if close {
        s.shutdown().await.unwrap();
    }
    let mut got = Vec::new();
    let read = async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&got).to_lowercase();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .split("content-length: ")
                    .nth(1)
                    .and_then(|n| n.lines().next()?.trim().parse::<usize>().ok());
                if len.is_some_and(|n| body.len() >= n) {
                    break;
                }
            }
        }
    };
    // The guard only keeps a regression from hanging the suite.
    tokio::time::timeout(HANG, read)
        .await
        .expect("kvbust answered");
    String::from_utf8_lossy(&got).into_owned()
}

fn error_count(metrics: &str, code: &str, source: &str) -> u64 {
    let line = format!("kvbust_errors_total{{code=\"{code}\",source=\"{source}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |n| n.parse().unwrap())
}

/// Item 7: of two `x-request-id` headers only the first, checked one reaches the upstream.
#[tokio::test]
async fn a_second_request_id_never_reaches_the_upstream() {
    let (url, heads) = recording_upstream().await;
    let h = start_proxy(&url, |_| {}).await;
    let resp = raw(
        &h,
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nx-request-id: good-1\r\nx-request-id: second-unchecked\r\n\r\n",
        false,
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let ids: Vec<&str> = heads[0]
        .lines()
        .filter(|l| l.starts_with("x-request-id:"))
        .collect();
    assert_eq!(ids, ["x-request-id: good-1"]);
    h.shutdown().await;
}

/// Item 8: `CONNECT` is answered 405 `method_not_allowed` (with `allow`) and never forwarded;
/// the error is the client's.
#[tokio::test]
async fn connect_is_answered_405_and_never_forwarded() {
    let (url, heads) = recording_upstream().await;
    let h = start_proxy(&url, |_| {}).await;
    let resp = raw(
        &h,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
        // Kept open: hyper closes a connection whose read side ends, which can race the answer.
        false,
    )
    .await;
    let lower = resp.to_lowercase();
    assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");
    assert!(lower.contains("\"code\":\"method_not_allowed\""), "{resp}");
    assert!(lower.contains("\r\nallow: get, head, post"), "{resp}");
    // Had it been forwarded, the upstream would have read it before kvbust could answer.
    assert!(heads.lock().unwrap().is_empty());
    let m = metrics_text(&h).await;
    assert_eq!(error_count(&m, "method_not_allowed", "client"), 1, "{m}");
    h.shutdown().await;
}

/// Item 9: a body with a bad chunk size, LF-only chunk lines or fewer bytes than its
/// `content-length` is the client's error (400, `source="client"`), not the upstream's, on a
/// streamed route and on a rewritten one.
#[tokio::test]
async fn client_framing_errors_are_counted_as_the_clients() {
    let (url, _heads) = recording_upstream().await;
    let h = start_proxy(&url, |c| {
        c.cache_bust.target = kvbust::cachebust::Target::SystemPrefix;
    })
    .await;
    let cases: [(&[u8], &str); 3] = [
        (
            b"transfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            "client_body_error",
        ),
        (
            b"transfer-encoding: chunked\r\n\r\n3\nabc\n0\n\n",
            "client_body_error",
        ),
        (b"content-length: 100\r\n\r\n{\"a\":1}", "client_disconnect"),
    ];
    for path in ["/v1/embeddings", "/v1/chat/completions"] {
        for (rest, code) in cases {
            let mut req =
                format!("POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n")
                    .into_bytes();
            req.extend_from_slice(rest);
            let resp = raw(&h, &req, true).await;
            assert!(resp.starts_with("HTTP/1.1 400"), "{path} {code}: {resp}");
            assert!(
                resp.contains(&format!("\"code\":\"{code}\"")),
                "{path} {code}: {resp}"
            );
        }
    }
    let m = metrics_text(&h).await;
    assert_eq!(error_count(&m, "client_body_error", "client"), 4, "{m}");
    assert_eq!(error_count(&m, "client_disconnect", "client"), 2, "{m}");
    assert!(!m.contains("source=\"upstream\""), "{m}");
    h.shutdown().await;
}

/// Item 12: `x-kvbust-synth-conversation` is held to `limits.max_control_header`.
#[tokio::test]
async fn a_long_conversation_header_is_header_too_long() {
    let (url, heads) = recording_upstream().await;
    let h = start_proxy(&url, |_| {}).await;
    let long = "a".repeat(2048);
    let req = post(
        &h.url("/v1/chat/completions"),
        r#"{"messages":[]}"#,
        &[
            ("x-kvbust-synth", "1"),
            ("x-kvbust-synth-conversation", &long),
        ],
    );
    let resp = send(&h1(), req).await;
    assert_eq!(resp.status(), 400);
    let v = json(resp).await;
    assert_eq!(v["error"]["code"], "header_too_long", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-kvbust-synth-conversation is 2048 bytes, over limits.max_control_header (1024 bytes)"),
        "{v}"
    );
    assert!(heads.lock().unwrap().is_empty());
    h.shutdown().await;
}
