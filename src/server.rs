//! Listeners and lifecycle: accepts data connections (HTTP/1.1 + h2c, or TLS with ALPN), hands
//! requests to the proxy, runs the admin port, and drains gracefully on shutdown. Never looks
//! inside requests; that is the proxy's job.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::admin;
use crate::config::Config;
use crate::proxy::Proxy;
use crate::runtime::Runtime;
use crate::tls::ReloadingTls;

/// The two sockets `run` serves; bound by the caller so tests can use port 0.
pub struct Listeners {
    pub data: TcpListener,
    pub admin: TcpListener,
}

/// What happened during shutdown.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunReport {
    /// Connections still open when the grace period ran out, closed by force.
    pub aborted_connections: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("upstream: {0}")]
    Upstream(String),
}

/// Serves until `shutdown` resolves, then drains: readiness turns 503, no new connections are
/// accepted, in-flight requests get `shutdown.grace` to finish, the rest are closed and counted.
pub async fn run(
    rt: Arc<Runtime>,
    upstream_url: &str,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<RunReport, ServerError> {
    let config = rt.config.clone();
    let proxy = Proxy::new(rt.clone(), upstream_url).map_err(ServerError::Upstream)?;
    let tls = match &config.listen.tls {
        Some(files) => Some(Arc::new(ReloadingTls::new(files)?)),
        None => None,
    };
    // Reloads the certificate on SIGHUP or file change; stopped when `run` returns.
    let tls_watch = tls
        .as_ref()
        .map(|t| tokio::spawn(t.clone().watch(rt.metrics.clone())));
    let builder = Arc::new(data_builder(&config));
    if config.synth.dataset.is_some() {
        // Build the configured dataset now, off the accept loop; requests wait for it if early.
        let synth = proxy.synthesizer().clone();
        tokio::spawn(async move { synth.prewarm().await });
    }

    let (admin_stop_tx, admin_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let admin_task = tokio::spawn(admin::serve(listeners.admin, rt.clone(), async {
        let _ = admin_stop_rx.await;
    }));

    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    let data = listeners.data;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = data.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Usually EMFILE; back off briefly instead of spinning.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                while conns.try_join_next().is_some() {}
                conns.spawn(serve_connection(
                    stream, peer, proxy.clone(), builder.clone(),
                    tls.as_ref().map(|t| t.acceptor()), graceful.watcher(),
                ));
            }
        }
    }

    rt.start_draining();
    drop(data);
    let open = graceful.count();
    tracing::info!(open_connections = open, grace = ?config.shutdown.grace, "draining");
    let mut report = RunReport::default();
    if tokio::time::timeout(config.shutdown.grace, graceful.shutdown())
        .await
        .is_err()
    {
        while conns.try_join_next().is_some() {}
        report.aborted_connections = conns.len();
        rt.metrics
            .shutdown_aborted_connections
            .inc_by(conns.len() as u64);
        tracing::warn!(
            aborted = conns.len(),
            "shutdown grace period over; closing remaining connections"
        );
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
    if let Some(w) = tls_watch {
        w.abort();
    }
    let _ = admin_stop_tx.send(());
    let _ = admin_task.await;
    tracing::info!("stopped");
    Ok(report)
}

fn data_builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(60))
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.listen.http2_max_concurrent_streams)
        .initial_stream_window_size(config.listen.http2_stream_window.as_u64() as u32)
        .initial_connection_window_size(config.listen.http2_connection_window.as_u64() as u32)
        .max_send_buf_size(1 << 20)
        .keep_alive_interval(Duration::from_secs(30));
    b
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    proxy: Arc<Proxy>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    tls: Option<TlsAcceptor>,
    watcher: hyper_util::server::graceful::Watcher,
) {
    let is_tls = tls.is_some();
    let service = service_fn(move |req| {
        let proxy = proxy.clone();
        async move { Ok::<_, std::convert::Infallible>(proxy.handle(req, peer, is_tls).await) }
    });
    let result = match tls {
        None => {
            watcher
                .watch(
                    builder
                        .serve_connection(TokioIo::new(stream), service)
                        .into_owned(),
                )
                .await
        }
        Some(acceptor) => match acceptor.accept(stream).await {
            Ok(s) => {
                watcher
                    .watch(
                        builder
                            .serve_connection(TokioIo::new(s), service)
                            .into_owned(),
                    )
                    .await
            }
            Err(e) => {
                tracing::debug!(%peer, "TLS handshake failed: {e}");
                return;
            }
        },
    };
    if let Err(e) = result {
        tracing::debug!(%peer, "connection ended with an error: {e}");
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}
