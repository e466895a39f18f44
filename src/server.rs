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
use crate::conn::{Activity, Admit, ConnTable, ConnTimeouts, Slot, TimedIo};
use crate::proxy::synthesize::Synthesizer;
use crate::proxy::{Downstream, Proxy};
use crate::runtime::SharedState;
use crate::tls::ReloadingTls;
use crate::upstream::client::{self, Upstream};

/// The sockets `run` serves; bound by the caller so tests can use port 0.
pub struct Listeners {
    pub data: DataListener,
    pub admin: TcpListener,
}

/// The data port: one listening socket per worker, all bound to one address with `SO_REUSEPORT`,
/// so the kernel spreads new connections over the workers (as nginx's `reuseport` does). A
/// single shared socket would not: the first worker to wake takes every connection of a burst.
pub struct DataListener {
    sockets: Vec<std::net::TcpListener>,
    addr: SocketAddr,
}

impl DataListener {
    /// Binds `workers` sockets to `addr` (port 0: one free port for all). Fails with "address in
    /// use" when anything already listens there, even another reuseport group, which could
    /// otherwise silently share the port with a second kvbust.
    pub fn bind(addr: SocketAddr, workers: usize) -> std::io::Result<Self> {
        if addr.port() != 0 {
            // A plain bind cannot join a reuseport group: it fails if the port is taken at all.
            drop(std::net::TcpListener::bind(addr)?);
        }
        let first = crate::conn::bind_listener(addr, true)?;
        let addr = first.local_addr()?;
        let mut sockets = vec![first];
        for _ in 1..workers.max(1) {
            sockets.push(crate::conn::bind_listener(addr, true)?);
        }
        Ok(Self { sockets, addr })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
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
    #[error(transparent)]
    Upstream(#[from] client::UpstreamSetupError),
    #[error("data listener: {0}")]
    Listener(std::io::Error),
    #[error("data worker {0} cannot start: {1}")]
    Worker(usize, std::io::Error),
}

/// Starts what the synthesizer does before the first request: building a configured dataset
/// (requests wait for it if early; `/readyz` answers 503 until done) and loading the `synth.preload` corpora (`/readyz` answers
/// 503 until done). Both run on the caller's runtime, off the data path.
fn start_synth(synth: &Arc<Synthesizer>, rt: &Arc<SharedState>) {
    if rt.config.synth.dataset.is_some() {
        // Build the configured dataset now, off the data path; requests wait for it if early.
        // /readyz answers 503 until it is built.
        let (synth, rt) = (synth.clone(), rt.clone());
        tokio::spawn(async move { rt.dataset_built(synth.prewarm().await) });
    }
    if !rt.config.synth.preload.is_empty() {
        // Load the tokenizer and each corpus now (a one-token placeholder builds its corpus);
        // /readyz answers 503 until done.
        let (synth, rt) = (synth.clone(), rt.clone());
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            for corpus in &rt.config.synth.preload {
                let body = format!(
                    r#"{{"messages":[{{"role":"user","content":"{{{{kvbust:prompt:1:{}}}}}"}}]}}"#,
                    corpus.as_str()
                );
                if let Err(e) = synth.expand(body.as_bytes()).await {
                    tracing::error!(corpus = corpus.as_str(), "synth.preload: {e}");
                }
            }
            tracing::info!(elapsed = ?t0.elapsed(), "synth.preload corpora loaded");
            rt.preload_done();
        });
    }
}

/// Serves until `shutdown` resolves, then drains: readiness turns 503, no new connections are
/// accepted, in-flight requests get `shutdown.grace` to finish, the rest are closed and counted.
///
/// The data port is served thread-per-core, as nginx's workers are: one OS thread per socket of
/// the [`DataListener`], each with its own current-thread runtime, its own socket, its own
/// upstream connection pool and its own timers. A request lives on the worker that accepted its
/// connection from start to end, so the hot path has no cross-thread wake-ups and no shared pool.
/// The admin port (and a configured dataset's build) runs on the caller's runtime.
pub async fn run(
    rt: Arc<SharedState>,
    upstream_url: &crate::config::UpstreamUrl,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<RunReport, ServerError> {
    let config = rt.config.clone();
    // Everything that can fail is set up before any worker starts, so a mistake is one clear error.
    let upstream = Upstream::from_url(upstream_url)
        .and_then(|u| u.with_authority(config.upstream.authority.as_deref()))?;
    let client_tls = Arc::new(client::tls_config(&config.upstream)?);
    let tls = match &config.listen.tls {
        Some(files) => Some(Arc::new(ReloadingTls::new(files)?)),
        None => None,
    };
    // Reloads the certificate on SIGHUP or file change, on the caller's runtime; every worker
    // takes the newest configuration for its next connection. Stopped when `run` returns.
    let tls_watch = tls
        .as_ref()
        .map(|t| tokio::spawn(t.clone().watch(rt.metrics.clone())));
    let synth = Synthesizer::with_max_body(
        config.synth.clone(),
        config.cache_bust.target,
        config.limits.max_body.as_u64(),
    );
    start_synth(&synth, &rt);
    rt.cache_model.start();
    let workers = listeners.data.sockets.len();
    let caps = conn_caps(&config, workers);
    let parts = WorkerParts {
        rt: rt.clone(),
        upstream,
        client_tls,
        tls,
        synth,
        caps,
        workers,
        sources: crate::upstream::pool::SourceSlots::new(
            config.upstream.max_connections_per_source,
        ),
    };

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Where to point clients and probes (with port 0, the only place to learn the ports).
    let admin_addr = listeners
        .admin
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(
        data = %listeners.data.local_addr(),
        admin = %admin_addr,
        cache_model = rt.cache_model.enabled(),
        "listening"
    );
    let workers = start_workers(&parts, listeners.data, &stop_tx, &stop_rx).await?;

    // The upstream health probe (readiness): one task here, not one per worker, with a client
    // built like the workers' (same TLS and authority). Ends when draining starts.
    let health = crate::health::spawn(
        &config.upstream,
        rt.upstream_health.clone(),
        rt.metrics.clone(),
        parts.upstream.clone(),
        client::build_client(&config.upstream, parts.client_tls.clone(), &parts.upstream),
        stop_rx.clone(),
    );

    let models_check = spawn_models_check(&parts);
    let ticker = start_runs(&rt, &parts, stop_rx.clone());

    let (admin_stop_tx, admin_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let admin_task = tokio::spawn(admin::serve(
        listeners.admin,
        rt.clone(),
        parts.caps.admin,
        async {
            let _ = admin_stop_rx.await;
        },
    ));

    shutdown.await;

    let report = drain(&rt, &stop_tx, health, workers).await;
    for t in [models_check, tls_watch].into_iter().flatten() {
        t.abort();
    }
    let _ = ticker.await;
    log_report(&rt).await;
    rt.cache_model.finish_capture().await;
    let _ = admin_stop_tx.send(());
    let _ = admin_task.await;
    tracing::info!("stopped");
    Ok(report)
}

/// The connection caps of this run, from the configuration and the open-file limit (logged, and
/// a warning when configured caps had to be lowered to fit the limit).
fn conn_caps(config: &Config, workers: usize) -> crate::conn::ConnCaps {
    let fds = crate::conn::fd_limit();
    let caps = crate::conn::ConnCaps::new(crate::conn::CapsInput {
        max_connections: config.listen.max_connections,
        per_worker: config.upstream.max_connections_per_worker,
        workers,
        admin: config.admin.max_connections,
        // The built-in mock runs in this process: it holds the other end of each upstream connection.
        fds_per_upstream: if matches!(config.upstream_url(), Ok(None)) {
            2
        } else {
            1
        },
        fds,
    });
    tracing::info!(
        max_connections = caps.clients,
        upstream_connections_per_worker = caps.upstream_per_worker,
        admin_connections = caps.admin,
        "connection caps (listen.max_connections, upstream.max_connections_per_worker; 0: from the open-file limit)"
    );
    if caps.clamped {
        tracing::warn!(
            open_file_limit = fds,
            max_connections = caps.clients,
            upstream_connections_per_worker = caps.upstream_per_worker,
            "listen.max_connections and upstream.max_connections_per_worker need more descriptors than the open-file limit leaves after admin.max_connections and a reserve of 64: lowered to fit; raise `ulimit -n` or lower them"
        );
    }
    caps
}

/// Once the dataset is built and the upstream is up: a warning for each model the dataset
/// sends that the upstream does not serve (`[synth.dataset]` only). Like the health probe it
/// is a request of kvbust's own to the upstream, so it is sent only with `upstream.health_probe`
/// on: with it off, the upstream sees the clients' requests and nothing else.
fn spawn_models_check(parts: &WorkerParts) -> Option<tokio::task::JoinHandle<()>> {
    let config = &parts.rt.config;
    config.synth.dataset.as_ref()?;
    if !config.upstream.health_probe {
        return None;
    }
    let (synth, rt, upstream) = (
        parts.synth.clone(),
        parts.rt.clone(),
        parts.upstream.clone(),
    );
    let client = client::build_client(&config.upstream, parts.client_tls.clone(), &parts.upstream);
    Some(tokio::spawn(async move {
        let models = synth.models().await;
        crate::served_models::warn_unserved(rt, upstream, client, models).await;
    }))
}

/// What every data worker is built from, set up once by `run`.
struct WorkerParts {
    rt: Arc<SharedState>,
    upstream: Upstream,
    client_tls: Arc<rustls::ClientConfig>,
    tls: Option<Arc<ReloadingTls>>,
    synth: Arc<Synthesizer>,
    caps: crate::conn::ConnCaps,
    workers: usize,
    /// Each source address's upstream slots, shared by every worker.
    sources: Arc<crate::upstream::pool::SourceSlots>,
}

impl WorkerParts {
    /// One worker's own proxy, with its own upstream connection pool.
    fn worker(&self) -> Worker {
        let config = &self.rt.config;
        let client =
            client::build_client(&config.upstream, self.client_tls.clone(), &self.upstream);
        let proxy = Proxy::new(
            self.rt.clone(),
            self.upstream.clone(),
            client,
            self.synth.clone(),
            self.caps.upstream_per_worker,
            self.sources.clone(),
        );
        let table = ConnTable::new(self.caps.clients_per_worker(self.workers));
        crate::sync::lock(&self.rt.conn_tables).push(table.clone());
        Worker {
            proxy,
            table,
            builders: DataBuilders::new(config),
            tls: self.tls.clone(),
            grace: config.shutdown.grace,
            timeouts: config.listen.conn_timeouts(),
        }
    }
}

/// Starts one worker per data socket (`DataListener::bind` made `listen.workers` of them) and
/// waits until each serves.
///
/// A worker that cannot start (no descriptor left for its event loop, say) stops the whole
/// server with that error, rather than leaving a port that accepts and never answers. Only
/// once every worker serves does the admin port (and so readiness) come up.
async fn start_workers(
    parts: &WorkerParts,
    data: DataListener,
    stop_tx: &tokio::sync::watch::Sender<bool>,
    stop_rx: &tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<Done>, ServerError> {
    let mut workers = Vec::new();
    let mut starting = Vec::new();
    for (i, listener) in data.sockets.into_iter().enumerate() {
        let (started_rx, done_rx) = spawn_worker(i, listener, parts.worker(), stop_rx.clone())?;
        starting.push(started_rx);
        workers.push(done_rx);
    }
    for (i, started) in starting.into_iter().enumerate() {
        let failed = match started.await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(_) => std::io::Error::other("its thread ended before it started"),
        };
        let _ = stop_tx.send(true);
        for done in workers {
            let _ = done.await;
        }
        return Err(ServerError::Worker(i, failed));
    }
    Ok(workers)
}

/// Answers once a worker serves, or with why it could not start.
type Started = tokio::sync::oneshot::Receiver<std::io::Result<()>>;
/// Answers when a worker has stopped, with the number of connections it closed by force.
type Done = tokio::sync::oneshot::Receiver<usize>;

/// Runs `worker` on its own thread with its own current-thread runtime.
fn spawn_worker(
    i: usize,
    listener: std::net::TcpListener,
    worker: Worker,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(Started, Done), ServerError> {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<std::io::Result<()>>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<usize>();
    std::thread::Builder::new()
        .name(format!("kvbust-worker-{i}"))
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            // This worker's access lines leave in batches; the rest on its way out.
            crate::access_log::hold_lines_on_this_thread();
            let aborted = runtime.block_on(async move {
                tokio::spawn(crate::access_log::flush_periodically());
                // Registering needs the worker's own reactor, so it happens on its thread.
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return 0;
                    }
                };
                let _ = started_tx.send(Ok(()));
                worker.serve(listener, stop).await
            });
            drop(runtime);
            crate::access_log::flush_this_thread();
            let _ = done_tx.send(aborted);
        })
        .map_err(ServerError::Listener)?;
    Ok((started_rx, done_rx))
}

/// Logs the run's report table once, when the run saw a generation request: what a person
/// reads at the end of a benchmark, in the log of a container that is going away. Waits a
/// moment for the cache model to count the last requests.
/// The runs' side of serving: the admin port's cache resets reach the upstream as requests
/// do, and the ticker closes idle runs.
fn start_runs(
    rt: &Arc<SharedState>,
    parts: &WorkerParts,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let config = &rt.config;
    let _ = rt.upstream_reset.set((
        parts.upstream.clone(),
        client::build_client(&config.upstream, parts.client_tls.clone(), &parts.upstream),
    ));
    crate::run_store::spawn_ticker(rt.clone(), stop)
}

/// Closes the open runs (each waits for its requests within `run.close_wait`, and is saved
/// with `run.results_dir`) and logs each one that saw requests.
async fn log_report(rt: &SharedState) {
    for report in crate::run_store::close_all(rt).await {
        if report.rows.is_empty() {
            continue;
        }
        tracing::info!(
            "run {}'s report (kvbust report):\n{}",
            report.run.name,
            crate::report::render::table(&report)
        );
    }
}

/// Turns readiness 503, tells every worker to stop accepting and waits for them to drain;
/// counts the connections they had to close when the grace ran out.
async fn drain(
    rt: &SharedState,
    stop_tx: &tokio::sync::watch::Sender<bool>,
    health: Option<tokio::task::JoinHandle<()>>,
    workers: Vec<Done>,
) -> RunReport {
    rt.start_draining();
    let _ = stop_tx.send(true);
    tracing::info!(grace = ?rt.config.shutdown.grace, "draining");
    if let Some(h) = health {
        let _ = h.await;
    }
    let mut report = RunReport::default();
    for done in workers {
        match done.await {
            Ok(aborted) => report.aborted_connections += aborted,
            Err(_) => tracing::error!("a worker thread ended without reporting"),
        }
    }
    if report.aborted_connections > 0 {
        rt.metrics
            .shutdown_aborted_connections
            .inc_by(report.aborted_connections as u64);
        tracing::warn!(
            aborted = report.aborted_connections,
            "shutdown grace period over; closed the remaining connections"
        );
    }
    report
}

/// What one data worker owns: its proxy (with its own upstream pool), its HTTP settings and the
/// listener TLS, shared with the reloader. Everything else is used on the worker's thread only.
struct Worker {
    proxy: Arc<Proxy>,
    /// This worker's open client connections, held to its share of `listen.max_connections`.
    table: Arc<ConnTable>,
    builders: DataBuilders,
    tls: Option<Arc<ReloadingTls>>,
    grace: Duration,
    timeouts: ConnTimeouts,
}

impl Worker {
    /// Accepts and serves connections until `stop` turns true, then drains its own connections
    /// for up to `grace`. Returns how many it had to close by force.
    async fn serve(
        self,
        listener: TcpListener,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> usize {
        let builders = Arc::new(self.builders);
        let graceful = GracefulShutdown::new();
        let mut conns = JoinSet::new();
        let timeouts = self.timeouts;
        // Each connection's own copy: one that has not sent a byte when draining begins is closed.
        let conn_stop = stop.clone();
        let stopped = async {
            let _ = stop.wait_for(|s| *s).await;
        };
        let metrics = self.proxy.metrics().clone();
        let mut warned = false;
        crate::conn::accept_loop(&listener, "data", stopped, |stream, peer| {
            while conns.try_join_next().is_some() {}
            let admit = self.table.admit();
            if admit != Admit::Room {
                metrics.shed.inc();
                // Once per worker at warn; every shed is counted in kvbust_shed_total.
                let what = match admit {
                    Admit::Full => "every connection is busy: closing the new one",
                    _ => "closed the oldest connection with no request in flight",
                };
                if warned {
                    tracing::debug!(%peer, "listen.max_connections reached; {what}");
                } else {
                    warned = true;
                    tracing::warn!(%peer, "listen.max_connections reached; {what} (counted in kvbust_shed_total; logged once per worker)");
                }
                if admit == Admit::Full {
                    return false;
                }
            }
            let activity = Arc::new(Activity::default());
            let slot = self.table.slot();
            let id = slot.id();
            let abort = conns.spawn(serve_connection(
                stream,
                peer,
                self.proxy.clone(),
                builders.clone(),
                self.tls.as_ref().map(|t| t.acceptor()),
                timeouts,
                (graceful.watcher(), conn_stop.clone()),
                (activity.clone(), slot),
            ));
            self.table.insert(id, activity, abort);
            admit == Admit::Shed
        })
        .await;
        drop(listener);
        let mut aborted = 0;
        if tokio::time::timeout(self.grace, graceful.shutdown())
            .await
            .is_err()
        {
            while conns.try_join_next().is_some() {}
            aborted = conns.len();
        }
        conns.abort_all();
        while conns.join_next().await.is_some() {}
        aborted
    }
}

/// The data port's HTTP servers. `any` tells HTTP/1.1 from h2c by reading the connection's
/// first bytes into a buffer of its own and handing them back to hyper; hyper's first read then
/// gets only those 24 bytes, and growing past them doubles its read buffer to 16 KiB for the
/// connection's life (issue 21 item 5). So a plain connection's version is read by [`sniff`]
/// without taking the bytes, and the matching single-version server reads them itself; `any`
/// is for TLS (ALPN and the first bytes after the handshake) and for the rare plain connection
/// whose first bytes do not decide it yet (a preface split across segments).
struct DataBuilders {
    any: auto::Builder<TokioExecutor>,
    h1: auto::Builder<TokioExecutor>,
    h2: auto::Builder<TokioExecutor>,
}

impl DataBuilders {
    fn new(config: &Config) -> Self {
        let any = data_builder(config);
        Self {
            h1: any.clone().http1_only(),
            h2: any.clone().http2_only(),
            any,
        }
    }

    /// The server for a plain connection of the `sniffed` version.
    fn plain(&self, sniffed: Option<Sniffed>) -> &auto::Builder<TokioExecutor> {
        match sniffed {
            Some(Sniffed::Http1) => &self.h1,
            Some(Sniffed::H2c) => &self.h2,
            None => &self.any,
        }
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4), which an h2c client sends first.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sniffed {
    Http1,
    H2c,
}

/// What the first bytes `peeked` say: a byte off the preface is HTTP/1.1, the whole preface
/// h2c, and a part of it (or nothing) is not known yet.
fn sniffed(peeked: &[u8]) -> Option<Sniffed> {
    if peeked.is_empty() {
        None
    } else if !H2_PREFACE.starts_with(peeked) {
        Some(Sniffed::Http1)
    } else if peeked.len() == H2_PREFACE.len() {
        Some(Sniffed::H2c)
    } else {
        None
    }
}

/// The version of a plain connection, from its first bytes, left in the socket. Waits for the
/// first bytes no longer than the connection's first-request deadline; `None` (undecided, timed
/// out, closed or failed) leaves the connection to the detecting server, which also applies
/// that deadline through `TimedIo`.
async fn sniff(stream: &tokio::net::TcpStream, wait: Duration) -> Option<Sniffed> {
    let mut first = [0u8; 24];
    let n = tokio::time::timeout(wait, stream.peek(&mut first))
        .await
        .ok()?
        .ok()?;
    sniffed(&first[..n])
}

fn data_builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        // `TimedIo` holds every connection to listen.header_read_timeout / idle_timeout; hyper's
        // own head timer would add a timer per request and cut keep-alive at 30 s.
        .header_read_timeout(None)
        // Flattened writes: a response's head and its (small, usually one) body frame are
        // copied into one buffer and sent in one write, not queued for a vectored one; fewer
        // instructions per request (issue 21 item 3, benches/README.md).
        .writev(false)
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

#[allow(
    clippy::too_many_arguments,
    reason = "one connection's whole context, moved into its task once; a struct would be built per connection only to be taken apart here"
)]
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    proxy: Arc<Proxy>,
    builders: Arc<DataBuilders>,
    tls: Option<TlsAcceptor>,
    timeouts: ConnTimeouts,
    (watcher, stop): (
        hyper_util::server::graceful::Watcher,
        tokio::sync::watch::Receiver<bool>,
    ),
    (activity, _slot): (Arc<Activity>, Slot),
) {
    let per_client = proxy.max_upstream_per_client();
    let source = proxy.source_slots(peer.ip());
    let client = Arc::new(Downstream::new(
        peer,
        tls.is_some(),
        activity,
        per_client,
        source,
    ));
    let accepted = tokio::time::Instant::now();
    // Until hyper has the connection, the graceful watcher cannot end it: a connection still
    // silent (or mid-handshake) when draining begins is closed here, not held until its
    // first-request deadline.
    let sniffed = match tls {
        None => tokio::select! {
            sniffed = sniff(&stream, timeouts.first_request) => sniffed,
            () = draining(stop.clone()) => return,
        },
        Some(_) => None,
    };
    // Below TLS, so a stalled handshake is timed out like a silent connection.
    let stream = TimedIo::accepted_at(stream, client.activity.clone(), timeouts, accepted);
    let service = service_fn(move |req| {
        let proxy = proxy.clone();
        let client = client.clone();
        async move { Ok::<_, std::convert::Infallible>(proxy.handle(req, client).await) }
    });
    let result = match tls {
        None => {
            watcher
                .watch(
                    builders
                        .plain(sniffed)
                        .serve_connection(TokioIo::new(stream), service)
                        .into_owned(),
                )
                .await
        }
        // Boxed: the TLS session's state is large, and inline it would size every plain
        // connection's task as well (memory per idle stream, issue 21 item 5).
        Some(acceptor) => {
            let served = Box::pin(async move {
                let handshake = tokio::select! {
                    done = acceptor.accept(stream) => done,
                    () = draining(stop) => return None,
                };
                match handshake {
                    Ok(s) => Some(
                        watcher
                            .watch(
                                builders
                                    .any
                                    .serve_connection(TokioIo::new(s), service)
                                    .into_owned(),
                            )
                            .await,
                    ),
                    Err(e) => {
                        tracing::debug!(%peer, "TLS handshake failed: {e}");
                        None
                    }
                }
            });
            match served.await {
                Some(result) => result,
                None => return,
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, "connection ended with an error: {e}");
    }
}

/// Resolves once the worker's `stop` turns true (or its sender is gone).
async fn draining(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_decide_the_version_only_when_they_can() {
        let preface: &[u8] = H2_PREFACE;
        for (peeked, want) in [
            (&b""[..], None),
            (b"GET / HTTP/1.1\r\n", Some(Sniffed::Http1)),
            (
                b"POST /v1/chat/completions HTTP/1.1\r\n",
                Some(Sniffed::Http1),
            ),
            // "P" and "PRI * HTTP/2" could still be either.
            (b"P", None),
            (&preface[..12], None),
            (&preface[..23], None),
            (preface, Some(Sniffed::H2c)),
            // One byte off anywhere is HTTP/1.1 (hyper answers what it makes of it).
            (b"PRI * HTTP/1.1\r\n", Some(Sniffed::Http1)),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\r", Some(Sniffed::Http1)),
        ] {
            assert_eq!(
                sniffed(peeked),
                want,
                "{:?}",
                String::from_utf8_lossy(peeked)
            );
        }
    }

    #[test]
    fn data_listener_binds_one_port_for_every_worker_and_refuses_a_taken_port() {
        let l = DataListener::bind("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        assert_eq!(l.sockets.len(), 3);
        for s in &l.sockets {
            assert_eq!(s.local_addr().unwrap(), l.local_addr());
        }
        let taken = DataListener::bind(l.local_addr(), 2)
            .err()
            .expect("the port is taken");
        assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse);
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = DataListener::bind(plain.local_addr().unwrap(), 1).err();
        assert_eq!(taken.map(|e| e.kind()), Some(std::io::ErrorKind::AddrInUse));
    }
}
