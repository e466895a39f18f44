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
// Run by hand: a failed expect is this tool's error report (Cargo.toml denies it in the library).
#![allow(clippy::expect_used)]
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

fn main() {
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
            std::thread::spawn(move || worker(socket, upstream))
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

fn worker(socket: std::net::TcpListener, upstream: SocketAddr) {
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
            tokio::spawn(connection(client, upstream));
        }
    });
}

/// Serves one client connection over its own upstream connection.
async fn connection(client: TcpStream, upstream: SocketAddr) {
    let _ = client.set_nodelay(true);
    let Ok(up) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = up.set_nodelay(true);
    let Ok((send, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(up)).await else {
        return;
    };
    tokio::spawn(conn);
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
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), service)
        .await;
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
