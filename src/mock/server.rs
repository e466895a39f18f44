//! `serve`: runs a [`Mock`] on a TCP listener, HTTP/1.1 and h2c (prior knowledge) on one port, with graceful
//! shutdown. Owns the accept loop and connection lifecycle only; it never interprets requests (that is
//! [`Mock::handle`]) and never binds a socket itself.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use super::Mock;

/// Accept errors that concern one connection only (the listener itself is fine).
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused
            | ConnectionAborted
            | ConnectionReset
            | Interrupted
            | WouldBlock
            | TimedOut
    )
}

/// Serves `mock` on `listener` until `shutdown` resolves; then stops accepting, lets in-flight requests and
/// streams finish (HTTP/1.1 connections close after their current response, HTTP/2 connections get GOAWAY),
/// and returns once every connection is closed. Callers who want a deadline wrap this in a timeout.
pub async fn serve(
    listener: TcpListener,
    mock: Arc<Mock>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(1024)
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = shutdown.as_mut() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Typically EMFILE: back off briefly instead of spinning, keep serving what we have.
                    tracing::warn!(error = %e, "mock: accept failed; retrying shortly");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, %peer, "mock: could not set TCP_NODELAY");
        }
        let mock = mock.clone();
        let service = service_fn(move |req| {
            let mock = mock.clone();
            async move { Ok::<_, Infallible>(mock.handle(req).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "mock: connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
