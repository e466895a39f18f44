//! `serve`: runs a [`Mock`] on a TCP listener, HTTP/1.1 and h2c (prior knowledge) on one port, with graceful
//! shutdown. Owns the connection lifecycle only (the accept loop is [`crate::conn::accept_loop`]); it never interprets requests (that is
//! [`Mock::handle`]) and never binds a socket itself.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use super::Mock;
use crate::conn::{Activity, ConnTimeouts, Guarded, TimedIo};

/// Serves `mock` on `listener` until `shutdown` resolves; then stops accepting, lets in-flight requests and
/// streams finish (HTTP/1.1 connections close after their current response, HTTP/2 connections get GOAWAY),
/// and returns once every connection is closed. Callers who want a deadline wrap this in a timeout.
pub async fn serve(
    listener: TcpListener,
    mock: Arc<Mock>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    if let Err(e) = mock.start_kv_events().await {
        return Err(std::io::Error::other(e));
    }
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // `TimedIo` holds connections to their deadlines, as on the proxy's ports.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(1024)
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20);
    let graceful = GracefulShutdown::new();
    let timeouts = ConnTimeouts::default();
    crate::conn::accept_loop(&listener, "mock", shutdown, |stream, peer| {
        let activity = Arc::new(Activity::default());
        let stream = TimedIo::new(stream, activity.clone(), timeouts);
        let mock = mock.clone();
        let service = service_fn(move |req| {
            let mock = mock.clone();
            let guard = activity.begin();
            async move {
                // The guard lives as long as the response body (a stream may run for minutes).
                let resp = mock.handle(req).await;
                Ok::<_, Infallible>(resp.map(|b| Guarded::new(b, guard)))
            }
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
        false
    })
    .await;
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
