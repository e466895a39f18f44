//! The benchmark's own load client for what wrk cannot measure: SSE streams (TTFT, gap between
//! events, events per stream, lost events), many idle open streams (for RSS), and the proxy's
//! reported rewrite overhead at large bodies. Driven by `benches/proxy.sh`; never part of tests.
//!
//! ```text
//! loadgen stream   URL CONCURRENCY SECONDS MAX_TOKENS   # prints one JSON line of stream figures
//! loadgen hold     URL STREAMS h1|h2                    # opens STREAMS streams, prints "ready N", holds until stdin closes
//! loadgen overhead URL BODY_BYTES REQUESTS              # median/p99 of x-kvbust-overhead-us
//! loadgen fixed    URL BODY_FILE REQUESTS CONNECTIONS   # exactly REQUESTS POSTs, as wrk sends them
//! ```
//!
//! In `fixed`, each `@SEQ@` in the body becomes the request's number (distinct prompts, for the
//! capture benchmark); a body without it is sent as it is.
//!
//! `fixed` is for instruction counts (`valgrind --tool=callgrind` on the proxy): a run of a known
//! number of requests, where wrk only runs for a time.
// Run by hand: a failed expect is this tool's error report (Cargo.toml denies it in the library).
#![allow(clippy::expect_used)]
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::Mutex;

type Sender = http1::SendRequest<Full<Bytes>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime starts");
    let arg = |i: usize| -> &str {
        args.get(i).map(String::as_str).unwrap_or_else(|| {
            eprintln!("usage: see the module docs of benches/loadgen.rs");
            std::process::exit(2)
        })
    };
    let num = |i: usize| -> usize {
        arg(i).parse().unwrap_or_else(|_| {
            eprintln!("argument {} must be a number", i + 1);
            std::process::exit(2)
        })
    };
    match arg(0) {
        "stream" => rt.block_on(stream(
            arg(1).parse().expect("URL"),
            num(2),
            Duration::from_secs(num(3) as u64),
            num(4),
        )),
        "hold" => rt.block_on(hold(arg(1).parse().expect("URL"), num(2), arg(3) == "h2")),
        "overhead" => rt.block_on(overhead(arg(1).parse().expect("URL"), num(2), num(3))),
        "fixed" => rt.block_on(fixed(
            arg(1).parse().expect("URL"),
            std::fs::read(arg(2)).expect("the body file reads"),
            num(3),
            num(4),
        )),
        other => {
            eprintln!("unknown mode {other}; see the module docs of benches/loadgen.rs");
            std::process::exit(2)
        }
    }
}

/// A TCP connection to the URL's address (an IP literal), with Nagle off.
async fn tcp_connect(uri: &Uri) -> TcpStream {
    let addr: SocketAddr = format!(
        "{}:{}",
        uri.host().expect("host"),
        uri.port_u16().unwrap_or(80)
    )
    .parse()
    .expect("the URL names an IP address");
    let tcp = TcpStream::connect(addr).await.expect("connects");
    tcp.set_nodelay(true).ok();
    tcp
}

async fn connect(uri: &Uri) -> Sender {
    let tcp = tcp_connect(uri).await;
    let (send, conn) = http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    send
}

fn chat_body(content: &str, stream: bool, max_tokens: usize) -> Bytes {
    let body = serde_json::json!({
        "model": "bench",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": content},
        ],
        "max_tokens": max_tokens,
        "stream": stream,
    });
    Bytes::from(serde_json::to_vec(&body).expect("serialises"))
}

fn request(uri: &Uri, body: Bytes, session: usize) -> Request<Full<Bytes>> {
    Request::post(uri.path())
        .header("host", uri.authority().expect("authority").as_str())
        .header("content-type", "application/json")
        .header("x-correlation-id", format!("bench-{session}"))
        .body(Full::new(body))
        .expect("a valid request")
}

#[derive(Default)]
struct StreamStats {
    ttft_us: Vec<u64>,
    /// TTFT of every stream but each connection's first (whose time includes opening the
    /// connection through every hop): the steady state.
    ttft_warm_us: Vec<u64>,
    gap_us: Vec<u64>,
    events: Vec<u64>,
    streams: u64,
    failed: u64,
}

/// Reads one SSE response, counting `data:` events and timing them from the request's start.
async fn read_stream(
    resp: hyper::Response<hyper::body::Incoming>,
    start: Instant,
    warm: bool,
    stats: &mut StreamStats,
) {
    let mut body = resp.into_body();
    let mut carry: Vec<u8> = Vec::new();
    let mut last: Option<Instant> = None;
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            stats.failed += 1;
            return;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let now = Instant::now();
        carry.extend_from_slice(&data);
        // Events end with a blank line; count each complete `data:` event once.
        while let Some(end) = find(&carry, b"\n\n") {
            let event = &carry[..end];
            if event.starts_with(b"data:") {
                n += 1;
                match last {
                    None => {
                        let us = now.duration_since(start).as_micros() as u64;
                        stats.ttft_us.push(us);
                        if warm {
                            stats.ttft_warm_us.push(us);
                        }
                    }
                    Some(prev) => stats
                        .gap_us
                        .push(now.duration_since(prev).as_micros() as u64),
                }
                last = Some(now);
            }
            carry.drain(..end + 2);
        }
    }
    stats.events.push(n);
    stats.streams += 1;
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn stream(uri: Uri, concurrency: usize, dur: Duration, max_tokens: usize) {
    let stats = Arc::new(Mutex::new(StreamStats::default()));
    let deadline = Instant::now() + dur;
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let uri = uri.clone();
        let stats = stats.clone();
        tasks.push(tokio::spawn(async move {
            let mut send = connect(&uri).await;
            let mut local = StreamStats::default();
            let mut i = 0;
            while Instant::now() < deadline {
                let body = chat_body(&format!("stream {c} request {i}"), true, max_tokens);
                i += 1;
                if send.ready().await.is_err() {
                    send = connect(&uri).await;
                }
                let start = Instant::now();
                match send.send_request(request(&uri, body, c)).await {
                    Ok(resp) => read_stream(resp, start, i > 1, &mut local).await,
                    Err(_) => local.failed += 1,
                }
            }
            let mut s = stats.lock().await;
            s.ttft_us.extend(local.ttft_us);
            s.ttft_warm_us.extend(local.ttft_warm_us);
            s.gap_us.extend(local.gap_us);
            s.events.extend(local.events);
            s.streams += local.streams;
            s.failed += local.failed;
        }));
    }
    for t in tasks {
        t.await.expect("a stream task finishes");
    }
    let mut s = stats.lock().await;
    s.ttft_us.sort_unstable();
    s.ttft_warm_us.sort_unstable();
    s.gap_us.sort_unstable();
    let min_ev = s.events.iter().min().copied().unwrap_or(0);
    let max_ev = s.events.iter().max().copied().unwrap_or(0);
    let out = serde_json::json!({
        "streams": s.streams,
        "failed": s.failed,
        "ttft_p50_ms": pct(&s.ttft_us, 0.50) as f64 / 1000.0,
        "ttft_p99_ms": pct(&s.ttft_us, 0.99) as f64 / 1000.0,
        "ttft_warm_p50_ms": pct(&s.ttft_warm_us, 0.50) as f64 / 1000.0,
        "ttft_warm_p99_ms": pct(&s.ttft_warm_us, 0.99) as f64 / 1000.0,
        "gap_p50_ms": pct(&s.gap_us, 0.50) as f64 / 1000.0,
        "gap_p99_ms": pct(&s.gap_us, 0.99) as f64 / 1000.0,
        "events_min": min_ev,
        "events_max": max_ev,
        "events_total": s.events.iter().sum::<u64>(),
    });
    println!("{out}");
}

fn pct(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

/// Opens `n` streaming requests, waits for each one's first bytes, then holds them open until
/// standard input closes, so the caller can read the proxy's memory with all of them open.
/// Over HTTP/1.1 each stream has its own connection; over h2c, 100 streams share one.
async fn hold(uri: Uri, n: usize, h2: bool) {
    const PER_H2_CONN: usize = 100;
    let mut h2_send = None;
    let mut held = Vec::with_capacity(n);
    let mut opening = tokio::task::JoinSet::new();
    let batch = 500;
    let mut started = 0;
    while started < n {
        let end = (started + batch).min(n);
        for i in started..end {
            let uri = uri.clone();
            let req = request(&uri, chat_body(&format!("hold {i}"), true, 4), i);
            if h2 {
                if i % PER_H2_CONN == 0 {
                    h2_send = Some(connect_h2(&uri).await);
                }
                let mut send = h2_send.clone().expect("a connection was opened above");
                opening.spawn(async move {
                    let resp = send.send_request(req).await.expect("a response");
                    let mut body = resp.into_body();
                    // The first frame proves the stream is open end to end.
                    let _ = body.frame().await;
                    Box::new(body) as Box<dyn std::any::Any + Send>
                });
            } else {
                opening.spawn(async move {
                    let mut send = connect(&uri).await;
                    let resp = send.send_request(req).await.expect("a response");
                    let mut body = resp.into_body();
                    let _ = body.frame().await;
                    Box::new((send, body)) as Box<dyn std::any::Any + Send>
                });
            }
        }
        while let Some(r) = opening.join_next().await {
            held.push(r.expect("opens"));
        }
        started = end;
    }
    println!("ready {}", held.len());
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    drop(held);
}

async fn connect_h2(uri: &Uri) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = tcp_connect(uri).await;
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(TokioIo::new(tcp))
            .await
            .expect("h2c handshake");
    tokio::spawn(conn);
    send
}

/// Sends `n` chat requests of about `size` bytes one at a time; reports the proxy's own
/// `x-kvbust-overhead-us` (time from the request's arrival to sending it upstream).
async fn overhead(uri: Uri, size: usize, n: usize) {
    let mut send = connect(&uri).await;
    let filler = "All the world's a stage, and all the men and women merely players. ";
    let mut content = String::with_capacity(size);
    while content.len() < size {
        content.push_str(filler);
    }
    content.truncate(size.saturating_sub(150));
    let mut us = Vec::with_capacity(n);
    for i in 0..n {
        let body = chat_body(&content, false, 8);
        send.ready().await.expect("connection stays open");
        let resp = send
            .send_request(request(&uri, body, i))
            .await
            .expect("a response");
        if let Some(v) = resp.headers().get("x-kvbust-overhead-us") {
            if let Some(x) = v.to_str().ok().and_then(|s| s.parse().ok()) {
                us.push(x);
            }
        }
        let _ = resp.into_body().collect().await;
    }
    us.sort_unstable();
    let out = serde_json::json!({
        "body_bytes": size,
        "requests": n,
        "overhead_p50_us": pct(&us, 0.5),
        "overhead_p99_us": pct(&us, 0.99),
    });
    println!("{out}");
}

/// Sends exactly `n` POSTs of `body` over `conns` keep-alive connections, with the headers wrk's
/// `benches/nginx/chat.lua` sends; prints how many answered 2xx and how long it took.
async fn fixed(uri: Uri, body: Vec<u8>, n: usize, conns: usize) {
    let body = Bytes::from(body);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..conns.max(1) {
        let share = n / conns.max(1) + usize::from(c < n % conns.max(1));
        let (uri, body) = (uri.clone(), body.clone());
        let numbered = body.windows(5).any(|w| w == b"@SEQ@");
        tasks.push(tokio::spawn(async move {
            let mut send = connect(&uri).await;
            let mut ok = 0usize;
            for i in 0..share {
                send.ready().await.expect("connection stays open");
                let body = if numbered {
                    let text = String::from_utf8_lossy(&body).replace("@SEQ@", &format!("{c}-{i}"));
                    Bytes::from(text)
                } else {
                    body.clone()
                };
                let req = Request::post(uri.path())
                    .header("host", uri.authority().expect("authority").as_str())
                    .header("content-type", "application/json")
                    .body(Full::new(body))
                    .expect("a valid request");
                let resp = send.send_request(req).await.expect("a response");
                ok += usize::from(resp.status().is_success());
                let _ = resp.into_body().collect().await;
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.expect("a connection task finishes");
    }
    let out = serde_json::json!({
        "requests": n,
        "non_2xx": n - ok,
        "seconds": started.elapsed().as_secs_f64(),
    });
    println!("{out}");
}
