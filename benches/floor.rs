//! The floor of the proxy benchmark: the least an HTTP/1.1 reverse proxy on hyper 1 and tokio
//! does, laid out as kvbust's data port is (one thread per core, each with a current-thread
//! runtime and its own `SO_REUSEPORT` listening socket). Each accepted client connection opens
//! one upstream HTTP/1.1 connection and forwards that connection's requests on it, bodies
//! streamed both ways. No rewriting, no metrics, no log, no timeouts, no header hygiene.
//! `benches/proxy.sh` runs it beside kvbust so that the gap between them is what kvbust adds.
//!
//! ```text
//! floor LISTEN_ADDR UPSTREAM_ADDR [WORKERS]   # e.g. floor 127.0.0.1:18112 127.0.0.1:18100
//! ```
//!
//! hyper's own settings, to measure what each is worth (issue 21 item 3; unset: hyper's defaults):
//! `FLOOR_WRITEV=0|1` (vectored writes, both sides), `FLOOR_MAX_BUF=BYTES` (`max_buf_size`, both
//! sides), `FLOOR_SAME_TASK=1` (drive the upstream connection in the client connection's task
//! instead of spawning it).
// Run by hand: a failed expect is this tool's error report (Cargo.toml denies it in the library).
#![allow(clippy::expect_used)]
// A bench tool configured by its environment; the library reads it only in app.rs.
#![allow(clippy::disallowed_methods)]
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

/// hyper settings from the environment (see the module comment).
#[derive(Clone, Copy, Default)]
struct Knobs {
    writev: Option<bool>,
    max_buf: Option<usize>,
    same_task: bool,
}

impl Knobs {
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok();
        Knobs {
            writev: var("FLOOR_WRITEV").map(|v| v == "1"),
            max_buf: var("FLOOR_MAX_BUF").and_then(|v| v.parse().ok()),
            same_task: var("FLOOR_SAME_TASK").is_some_and(|v| v == "1"),
        }
    }
}

fn main() {
    let knobs = Knobs::from_env();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = |i: usize| -> SocketAddr {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
            eprintln!("usage: floor LISTEN_ADDR UPSTREAM_ADDR [WORKERS]");
            std::process::exit(2)
        })
    };
    let (listen, upstream) = (addr(0), addr(1));
    let workers = args
        .get(2)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let socket = listener(listen).expect("binds the listening address");
            std::thread::spawn(move || worker(socket, upstream, knobs))
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// One of the workers' listening sockets, all on `addr` (`SO_REUSEPORT`).
fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(s.into())
}

fn worker(socket: std::net::TcpListener, upstream: SocketAddr, knobs: Knobs) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime starts");
    rt.block_on(async move {
        let listener = TcpListener::from_std(socket).expect("registers the socket");
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(connection(client, upstream, knobs));
        }
    });
}

/// Serves one client connection over its own upstream connection.
async fn connection(client: TcpStream, upstream: SocketAddr, knobs: Knobs) {
    let _ = client.set_nodelay(true);
    let Ok(up) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = up.set_nodelay(true);
    let mut up_builder = hyper::client::conn::http1::Builder::new();
    if let Some(v) = knobs.writev {
        up_builder.writev(v);
    }
    if let Some(n) = knobs.max_buf {
        up_builder.max_buf_size(n);
    }
    let Ok((send, conn)) = up_builder.handshake(TokioIo::new(up)).await else {
        return;
    };
    // Same task: the upstream connection is polled beside the client connection (it ends when
    // the client connection's service, and with it the sender, is dropped).
    let mut upstream_conn = None;
    if knobs.same_task {
        upstream_conn = Some(conn);
    } else {
        tokio::spawn(conn);
    }
    // HTTP/1.1 serves one request at a time, so the sender is taken for a request and put back
    // once that request is on its way.
    let send = Arc::new(Mutex::new(Some(send)));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let send = send.clone();
        async move {
            let taken = send.lock().expect("not poisoned").take();
            let mut sender: SendRequest<Incoming> = taken.ok_or(Failed::Lost)?;
            sender.ready().await.map_err(Failed::Upstream)?;
            let response = sender.send_request(req);
            *send.lock().expect("not poisoned") = Some(sender);
            response.await.map_err(Failed::Upstream)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    if let Some(v) = knobs.writev {
        builder.writev(v);
    }
    if let Some(n) = knobs.max_buf {
        builder.max_buf_size(n);
    }
    let served = builder.serve_connection(TokioIo::new(client), service);
    match upstream_conn {
        Some(conn) => {
            let _ = tokio::join!(served, conn);
        }
        None => {
            let _ = served.await;
        }
    }
}

/// Why a request could not be forwarded; hyper then closes the client connection.
#[derive(Debug)]
enum Failed {
    /// An earlier request on this connection failed and took the upstream connection with it.
    Lost,
    Upstream(hyper::Error),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Lost => f.write_str("the upstream connection is gone"),
            Failed::Upstream(e) => write!(f, "upstream: {e}"),
        }
    }
}

impl std::error::Error for Failed {}
