//! Request bodies that flow: with nothing to mark, a large body reaches the upstream while the
//! client is still sending it, and the steps that may edit it at its end (usage, placeholders)
//! still give the bytes a collected body gets.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::common::*;

/// A chat body of about `size` bytes whose user turn is varied text, with `extra` members
/// after `messages`.
pub(crate) fn big_chat(size: usize, extra: &str) -> String {
    let mut text = String::with_capacity(size);
    let mut i = 0u64;
    while text.len() < size {
        text.push_str(&format!("line {i} of a long agentic context; "));
        i += 1;
    }
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"be brief"}},{{"role":"user","content":"{text}"}}]{extra}}}"#
    )
}

/// What the raw upstream saw of one request.
pub(crate) struct Seen {
    pub head: String,
    pub body: Vec<u8>,
}

/// An upstream on port 0 that reads one request at a time, reports through `progress` once
/// `watch` body bytes have come (before it has the rest), and answers 200 with a small chat
/// completion once the body ends.
pub(crate) async fn raw_upstream(
    watch: usize,
) -> (String, mpsc::Receiver<usize>, mpsc::Receiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ptx, prx) = mpsc::channel(16);
    let (stx, srx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (ptx, stx) = (ptx.clone(), stx.clone());
            tokio::spawn(async move {
                let mut r = BufReader::new(sock);
                while let Some(seen) = read_request(&mut r, watch, &ptx).await {
                    let answer = br#"{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        answer.len()
                    );
                    let sock = r.get_mut();
                    if sock.write_all(head.as_bytes()).await.is_err()
                        || sock.write_all(answer).await.is_err()
                    {
                        return;
                    }
                    let _ = stx.send(seen).await;
                }
            });
        }
    });
    (format!("http://{addr}"), prx, srx)
}

/// Reads one request (content-length or chunked), reporting progress once `watch` bytes came.
async fn read_request(
    r: &mut BufReader<TcpStream>,
    watch: usize,
    progress: &mpsc::Sender<usize>,
) -> Option<Seen> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    let mut body = Vec::new();
    let mut told = false;
    let tell = |body: &Vec<u8>, told: &mut bool| {
        if !*told && body.len() >= watch {
            *told = true;
            let _ = progress.try_send(body.len());
        }
    };
    if head.contains("transfer-encoding: chunked") {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).await.ok()?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                let mut end = String::new();
                r.read_line(&mut end).await.ok()?;
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).await.ok()?;
            body.extend_from_slice(&chunk[..n]);
            tell(&body, &mut told);
        }
    } else {
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while body.len() < len {
            let mut buf = vec![0; (len - body.len()).min(16 * 1024)];
            let n = r.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            body.extend_from_slice(&buf[..n]);
            tell(&body, &mut told);
        }
    }
    Some(Seen { head, body })
}

/// Sends a POST to `/v1/chat/completions` on a raw connection: the head and the body's first
/// `split` bytes, then waits for `go` before sending the rest; returns the status line.
async fn raw_post(
    proxy: std::net::SocketAddr,
    body: Bytes,
    split: usize,
    go: oneshot::Receiver<()>,
) -> String {
    raw_post_with(proxy, "", body, split, go).await
}

/// [`raw_post`] with `headers` (lines ending in `\r\n`) added to the head.
pub(crate) async fn raw_post_with(
    proxy: std::net::SocketAddr,
    headers: &str,
    body: Bytes,
    split: usize,
    go: oneshot::Receiver<()>,
) -> String {
    let mut sock = TcpStream::connect(proxy).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(&body[..split]).await.unwrap();
    sock.flush().await.unwrap();
    if go.await.is_err() {
        return String::new();
    }
    sock.write_all(&body[split..]).await.unwrap();
    let mut r = BufReader::new(sock);
    let mut status = String::new();
    r.read_line(&mut status).await.unwrap();
    status
}

#[tokio::test]
async fn a_large_body_reaches_the_upstream_before_the_client_has_sent_it_all() {
    let (upstream, mut progress, mut seen) = raw_upstream(64 * 1024).await;
    // The defaults: placeholders, usage and the cache model all on, target none.
    let h = start_proxy(&upstream, |_| {}).await;
    let body = big_chat(512 * 1024, "");
    let (go, wait) = oneshot::channel();
    let client = tokio::spawn(raw_post(
        h.proxy_addr,
        body.clone().into(),
        200 * 1024,
        wait,
    ));
    // Had kvbust collected the body first, the upstream would see nothing until `go`: this
    // wait would end in the timeout, a failure, not a measurement.
    let got = tokio::time::timeout(Duration::from_secs(30), progress.recv())
        .await
        .expect("the upstream saw the body's start while the client held the rest back")
        .expect("the upstream reports");
    assert!((64 * 1024..=200 * 1024).contains(&got), "{got}");
    go.send(()).unwrap();
    let status = client.await.unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let seen = seen.recv().await.unwrap();
    // Unchanged, byte for byte; framed chunked, since a step at the end could have grown it.
    assert_eq!(seen.body, body.as_bytes());
    assert!(
        seen.head.contains("transfer-encoding: chunked"),
        "{}",
        seen.head
    );
    h.shutdown().await;
}

#[tokio::test]
async fn with_nothing_that_could_grow_it_a_flowing_body_keeps_its_length() {
    let (upstream, _progress, mut seen) = raw_upstream(usize::MAX).await;
    let h = start_proxy(&upstream, |c| {
        c.synth.placeholders = false;
        c.observe.request_usage = false;
    })
    .await;
    let body = big_chat(512 * 1024, r#","stream":true"#);
    let (go, wait) = oneshot::channel();
    go.send(()).unwrap();
    let status = raw_post(h.proxy_addr, body.clone().into(), 1000, wait).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let seen = seen.recv().await.unwrap();
    assert_eq!(seen.body, body.as_bytes());
    assert!(
        seen.head
            .contains(&format!("content-length: {}", body.len())),
        "{}",
        seen.head
    );
    h.shutdown().await;
}

/// Sends `body` in two writes, split after `split` bytes, and returns what the upstream got.
async fn through(h: &Harness, seen: &mut mpsc::Receiver<Seen>, body: &str, split: usize) -> Seen {
    let (go, wait) = oneshot::channel();
    go.send(()).unwrap();
    let status = raw_post(h.proxy_addr, body.to_string().into(), split, wait).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    seen.recv().await.unwrap()
}

#[tokio::test]
async fn a_flowing_body_gets_the_usage_edit_a_collected_one_gets() {
    let (upstream, _progress, mut seen) = raw_upstream(usize::MAX).await;
    let h = start_proxy(&upstream, |_| {}).await;
    let cases = [
        // stream on, no options: the member goes before the close.
        (
            r#","stream":true"#,
            Some(r#","stream":true,"stream_options":{"include_usage":true}"#),
        ),
        // options without include_usage: added inside them.
        (
            r#","stream_options":{"x":1},"stream":true"#,
            Some(r#","stream_options":{"x":1,"include_usage":true},"stream":true"#),
        ),
        // Already asked for, or not streamed: unchanged.
        (
            r#","stream":true,"stream_options":{"include_usage":true}"#,
            None,
        ),
        (r#","stream":false"#, None),
        ("", None),
    ];
    for (extra, edited) in cases {
        let body = big_chat(256 * 1024, extra);
        let want = match edited {
            Some(e) => big_chat(256 * 1024, e),
            None => body.clone(),
        };
        for split in [1000, body.len() - 3] {
            let got = through(&h, &mut seen, &body, split).await;
            assert!(got.body == want.as_bytes(), "{extra}, split at {split}");
        }
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_placeholder_in_a_flowing_body_is_expanded_and_the_rest_kept() {
    let (upstream, _progress, mut seen) = raw_upstream(usize::MAX).await;
    let h = start_proxy(&upstream, |_| {}).await;
    let body = big_chat(256 * 1024, "").replace(
        r#""be brief""#,
        r#""be brief","x":0},{"role":"user","content":"ask {{kvbust:prompt:16}} now""#,
    );
    let at = body.find("{{kvbust:").unwrap();
    for split in [1000, at + 4, body.len() - 1] {
        let got = through(&h, &mut seen, &body, split).await;
        let got = String::from_utf8(got.body).unwrap();
        assert!(!got.contains("{{kvbust:"), "not expanded (split {split})");
        assert_eq!(&got[..at], &body[..at]);
        let tail = &body[body.find(" now\"").unwrap()..];
        assert!(got.ends_with(tail), "the rest changed (split {split})");
        assert!(got.len() > body.len(), "nothing put in its place");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_flowing_body_past_max_body_is_a_413_and_never_reaches_the_upstream_whole() {
    let (upstream, _progress, mut seen) = raw_upstream(usize::MAX).await;
    let h = start_proxy(&upstream, |c| c.limits.max_body = "300KiB".parse().unwrap()).await;
    // Chunked from the client: no length to refuse it by up front.
    let body = big_chat(512 * 1024, "");
    let mut sock = TcpStream::connect(h.proxy_addr).await.unwrap();
    sock.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
    )
    .await
    .unwrap();
    for part in body.as_bytes().chunks(64 * 1024) {
        let frame = [format!("{:x}\r\n", part.len()).as_bytes(), part, b"\r\n"].concat();
        if sock.write_all(&frame).await.is_err() {
            break;
        }
    }
    let _ = sock.write_all(b"0\r\n\r\n").await;
    let mut r = BufReader::new(sock);
    let mut status = String::new();
    r.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    // The upstream got a start, never a whole request: the first whole one it reports is the
    // small request sent next.
    let small = big_chat(100, "");
    let got = through(&h, &mut seen, &small, 10).await;
    assert_eq!(
        got.body,
        small.as_bytes(),
        "the upstream got the cut body as a request"
    );
    h.shutdown().await;
}

/// An upstream that answers as soon as it has a request's head (nginx's `return`), then reads
/// and discards the body.
async fn early_upstream() -> String {
    early_upstream_watching(usize::MAX).await.0
}

/// [`early_upstream`], reporting through the receiver once `watch` body bytes of a request
/// have come.
pub(crate) async fn early_upstream_watching(watch: usize) -> (String, mpsc::Receiver<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ptx, prx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let ptx = ptx.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(sock);
                loop {
                    let answer = br#"{"id":"early","object":"chat.completion","choices":[]}"#;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        answer.len()
                    );
                    // Answer first: peek for the head, then reply before reading the body.
                    if r.fill_buf().await.map_or(true, |b| b.is_empty()) {
                        return;
                    }
                    let sock = r.get_mut();
                    if sock.write_all(head.as_bytes()).await.is_err()
                        || sock.write_all(answer).await.is_err()
                    {
                        return;
                    }
                    if read_request(&mut r, watch, &ptx).await.is_none() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), prx)
}

#[tokio::test]
async fn an_upstream_that_answers_early_still_gets_the_body_and_the_client_keeps_its_connection() {
    let upstream = early_upstream().await;
    let h = start_proxy(&upstream, |_| {}).await;
    let body = big_chat(512 * 1024, "");
    let mut sock = TcpStream::connect(h.proxy_addr).await.unwrap();
    let (head, rest) = body.as_bytes().split_at(100 * 1024);
    for round in 0..2 {
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        sock.write_all(req.as_bytes()).await.unwrap();
        sock.write_all(head).await.unwrap();
        sock.flush().await.unwrap();
        sock.write_all(rest).await.unwrap();
        // The response, whole: its status line, headers and content-length's worth of body.
        let (status, answer) = response(&mut sock).await;
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "round {round}: {status:?}"
        );
        assert!(answer.starts_with(r#"{"id":"early""#));
    }
    h.shutdown().await;
}

/// Reads a response's status line and its content-length body.
pub(crate) async fn response(sock: &mut TcpStream) -> (String, String) {
    let mut r = BufReader::new(sock);
    let mut status = String::new();
    r.read_line(&mut status).await.unwrap();
    let mut len = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length: ") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).await.unwrap();
    (status, String::from_utf8(body).unwrap())
}
