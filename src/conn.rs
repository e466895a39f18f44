//! Accepting connections and keeping each on a deadline: the listening sockets and the one accept
//! loop of the data, admin and mock ports (backing off on EMFILE instead of spinning), the cap
//! on open client connections and who is shed past it ([`ConnTable`], [`ConnCaps`]),
//! [`TimedIo`], which closes a connection that sits idle with no request in flight, and
//! [`BodyTimeout`], which fails a request body that pauses too long or takes too long in all.
//! Never reads, changes or holds the bytes it passes on.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// How long a connection may stay silent with no request in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnTimeouts {
    /// From accept to the first complete request head (covers the TLS handshake, the HTTP/2
    /// preface and a client that connects and sends nothing).
    pub first_request: Duration,
    /// From the end of the last response to the next request head (keep-alive idle).
    pub idle: Duration,
}

impl Default for ConnTimeouts {
    fn default() -> Self {
        Self {
            first_request: Duration::from_secs(30),
            idle: Duration::from_secs(60),
        }
    }
}

/// Accept-queue length of every listening socket, as nginx's (511) and uvicorn's (2048) are
/// long: a burst of connections (a benchmark opening 256 at once) must queue, not have SYNs
/// dropped and retried a second later. The kernel caps it at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: i32 = 4096;

/// A non-blocking listening socket on `addr` with [`LISTEN_BACKLOG`]; `reuse_port` lets
/// several sockets share the port (one per data worker).
pub fn bind_listener(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    #[cfg(unix)]
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// Accepts connections on `listener` until `stop` resolves and hands each to `on_conn` (with
/// `TCP_NODELAY` set). Errors about one connection are skipped; running out of descriptors
/// (EMFILE, ENFILE, ENOBUFS) pauses accepting with a growing back-off, logged once per streak.
/// `on_conn` returns true when it stopped another connection's task (shed it): the loop then
/// lets that task run, and close its socket, before accepting again, so a burst of accepts
/// cannot hold a shed connection's descriptor and a new one at once.
pub async fn accept_loop(
    listener: &TcpListener,
    port: &'static str,
    stop: impl Future<Output = ()>,
    mut on_conn: impl FnMut(TcpStream, SocketAddr) -> bool,
) {
    let mut backoff = AcceptBackoff::default();
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            biased;
            () = stop.as_mut() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    backoff.reset(port);
                    // Latency over batching: SSE events and small responses go out at once.
                    let _ = stream.set_nodelay(true);
                    if on_conn(stream, peer) {
                        tokio::task::yield_now().await;
                    }
                }
                Err(e) => backoff.failed(port, &e).await,
            },
        }
    }
}

#[derive(Default)]
struct AcceptBackoff {
    streak: u32,
}

impl AcceptBackoff {
    async fn failed(&mut self, port: &str, e: &io::Error) {
        use io::ErrorKind::*;
        if matches!(
            e.kind(),
            ConnectionRefused | ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
        ) {
            return;
        }
        if self.streak == 0 {
            tracing::warn!("{port} port: accept failed ({e}); backing off until it recovers");
        }
        self.streak = self.streak.saturating_add(1);
        // 20 ms, 40 ms, … capped at 640 ms: a full fd table is not polled in a tight loop.
        let pause = Duration::from_millis(10u64 << self.streak.min(6));
        tokio::time::sleep(pause).await;
    }

    fn reset(&mut self, port: &str) {
        if self.streak > 0 {
            tracing::info!(
                "{port} port: accepting again after {} failed tries",
                self.streak
            );
            self.streak = 0;
        }
    }
}

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Nanoseconds since a process-wide origin (never 0), so an instant fits one atomic; u64
/// nanoseconds last 584 years.
fn now_nanos() -> u64 {
    Instant::now()
        .saturating_duration_since(origin())
        .as_nanos() as u64
        + 1
}

fn from_nanos(n: u64) -> Instant {
    origin() + Duration::from_nanos(n - 1)
}

/// The descriptors kept back for everything but client and upstream connections: listeners,
/// event loops, log files, the upstream health probe's connection, the tokenizer's files. The
/// admin port's connections are reserved on top of it (`admin.max_connections`).
pub const FD_RESERVE: u64 = 64;

/// The process's soft open-file limit (RLIMIT_NOFILE), from `/proc/self/limits`; `None` when
/// unlimited or unknown.
pub fn fd_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What the connection caps are derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapsInput {
    /// `listen.max_connections` (0: derived).
    pub max_connections: usize,
    /// `upstream.max_connections_per_worker` (0: derived).
    pub per_worker: usize,
    /// Data workers.
    pub workers: usize,
    /// `admin.max_connections`, reserved before anything is split.
    pub admin: usize,
    /// Descriptors one upstream connection costs this process: 2 when the upstream is the
    /// built-in mock in the same process (it holds the other end), else 1.
    pub fds_per_upstream: u64,
    /// The open-file limit ([`fd_limit`]).
    pub fds: Option<u64>,
}

/// The caps on open connections, in force for this run. The open-file limit is shared out so
/// that no kind of connection can starve another: [`FD_RESERVE`] and the admin port's cap come
/// off the top, and client connections and upstream connections (each client connection may
/// need one) each get half of what is left. A configured cap is used as set unless the caps
/// together would need more descriptors than there are: then all are scaled down to fit
/// ([`ConnCaps::clamped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnCaps {
    /// Client connections on the data port, all workers together (`listen.max_connections`).
    pub clients: usize,
    /// Upstream connections one worker may have open (`upstream.max_connections_per_worker`).
    pub upstream_per_worker: usize,
    /// Connections on the admin port (`admin.max_connections`).
    pub admin: usize,
    /// Whether configured caps were lowered to fit the open-file limit.
    pub clamped: bool,
}

impl ConnCaps {
    pub fn new(i: CapsInput) -> Self {
        let workers = i.workers.max(1) as u64;
        let admin = i.admin.max(1);
        let cost = i.fds_per_upstream.max(1);
        let Some(fds) = i.fds else {
            let unbounded = 1 << 20;
            let pick = |n: usize, d: usize| if n > 0 { n } else { d };
            return Self {
                clients: pick(i.max_connections, unbounded),
                upstream_per_worker: pick(i.per_worker, unbounded),
                admin,
                clamped: false,
            };
        };
        // What clients and upstream connections may use together; at least one of each.
        let left = fds
            .saturating_sub(FD_RESERVE + admin as u64)
            .max(1 + cost * workers);
        let clients = match i.max_connections {
            0 => (left / 2).max(1),
            n => n as u64,
        };
        let per_worker = match i.per_worker {
            0 => (left / 2 / cost / workers).max(1),
            n => n as u64,
        };
        let need = clients.saturating_add(per_worker.saturating_mul(workers * cost));
        let (clients, per_worker, clamped) = if need > left {
            // Scaled by the same factor, so the proportions configured are kept.
            let scale = |n: u64| (u128::from(n) * u128::from(left) / u128::from(need)) as u64;
            (scale(clients).max(1), scale(per_worker).max(1), true)
        } else {
            (clients, per_worker, false)
        };
        Self {
            clients: usize::try_from(clients).unwrap_or(usize::MAX),
            upstream_per_worker: usize::try_from(per_worker).unwrap_or(usize::MAX),
            admin,
            clamped,
        }
    }

    /// One worker's share of [`ConnCaps::clients`] (rounded up).
    pub fn clients_per_worker(&self, workers: usize) -> usize {
        self.clients.div_ceil(workers.max(1))
    }
}

/// One open client connection, as the cap sees it.
struct Tracked {
    accepted: Instant,
    activity: Arc<Activity>,
    abort: tokio::task::AbortHandle,
}

/// Connections by state, for `kvbust_connections{state}`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ConnCounts {
    /// Accepted, no request yet.
    pub new: usize,
    /// A request in flight.
    pub active: usize,
    /// Between requests.
    pub idle: usize,
}

/// One data worker's open client connections, held to its share of `listen.max_connections`:
/// past it, the oldest connection with no request in flight (idle, or not yet requesting) is
/// closed to make room, as nginx and Envoy's overload manager shed; with every connection busy,
/// the new one is closed instead. Touched once per connection (accept and close), never per
/// request; the admin port reads the states at scrape.
pub struct ConnTable {
    cap: usize,
    conns: std::sync::Mutex<std::collections::HashMap<u64, Tracked>>,
    next: AtomicU64,
}

/// What the table did with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Room for it.
    Room,
    /// Room made by closing the oldest connection with nothing in flight.
    Shed,
    /// Every connection is busy: the new one must be closed.
    Full,
}

/// Removes its connection from the table when the connection's task ends or is aborted.
pub struct Slot {
    table: Arc<ConnTable>,
    id: u64,
}

impl Slot {
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.lock().remove(&self.id);
    }
}

impl ConnTable {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            conns: Default::default(),
            next: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Tracked>> {
        // The critical sections only insert, remove and read; the map stays valid on a panic.
        crate::sync::lock(&self.conns)
    }

    /// Makes room for one more connection if it can: closes the oldest connection with nothing
    /// in flight when the table is full.
    pub fn admit(&self) -> Admit {
        let mut conns = self.lock();
        if conns.len() < self.cap {
            return Admit::Room;
        }
        let oldest = conns
            .iter()
            .filter(|(_, t)| t.activity.in_flight.load(Ordering::Acquire) == 0)
            .min_by_key(|(_, t)| t.accepted)
            .map(|(id, _)| *id);
        match oldest.and_then(|id| conns.remove(&id)) {
            Some(victim) => {
                victim.abort.abort();
                Admit::Shed
            }
            None => Admit::Full,
        }
    }

    /// A new connection's place, to move into its task; [`ConnTable::insert`] records it once
    /// the task is spawned, and dropping it (the task ending, or aborted) removes it.
    pub fn slot(self: &Arc<Self>) -> Slot {
        Slot {
            table: self.clone(),
            id: self.next.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Records the connection of the slot `id`, served by the task `abort` stops. Called right after
    /// spawning, on the accepting thread of a current-thread runtime: the task cannot have run
    /// (and dropped its slot) yet.
    pub fn insert(&self, id: u64, activity: Arc<Activity>, abort: tokio::task::AbortHandle) {
        self.lock().insert(
            id,
            Tracked {
                accepted: Instant::now(),
                activity,
                abort,
            },
        );
    }

    /// Spawns a connection's task with `spawn` and records it, holding the table while it does:
    /// on a multi-thread runtime (the admin port's) the task may end before it is recorded, and
    /// its slot's removal must not come first and leave a stale entry behind.
    pub fn insert_spawned(
        &self,
        id: u64,
        activity: Arc<Activity>,
        spawn: impl FnOnce() -> tokio::task::AbortHandle,
    ) {
        let mut conns = self.lock();
        let abort = spawn();
        conns.insert(
            id,
            Tracked {
                accepted: Instant::now(),
                activity,
                abort,
            },
        );
    }

    /// The open connections by state.
    pub fn counts(&self) -> ConnCounts {
        let mut c = ConnCounts::default();
        for t in self.lock().values() {
            if t.activity.in_flight.load(Ordering::Acquire) > 0 {
                c.active += 1;
            } else if t.activity.idle_since.load(Ordering::Acquire) == 0 {
                c.new += 1;
            } else {
                c.idle += 1;
            }
        }
        c
    }
}

/// A connection's request bookkeeping, shared by its I/O (which times it out when idle) and its
/// requests (each holds a [`RequestGuard`] from head to the end of its response body).
#[derive(Debug, Default)]
pub struct Activity {
    in_flight: AtomicU32,
    /// When the last request ended ([`now_nanos`]); 0 while none has.
    idle_since: AtomicU64,
}

impl Activity {
    /// Marks a request as started; the connection is not idle until the guard drops.
    pub fn begin(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        RequestGuard(self.clone())
    }

    /// The instant this connection must be closed by if nothing changes; `None` while a request
    /// is in flight.
    fn deadline(&self, accepted: Instant, t: ConnTimeouts) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(match self.idle_since.load(Ordering::Acquire) {
            0 => accepted + t.first_request,
            n => from_nanos(n) + t.idle,
        })
    }
}

/// One request in flight on a connection; dropping it (when the response body ends or is
/// dropped) lets the connection's idle clock start.
#[derive(Debug)]
pub struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        // Store the time before the count drops, so the I/O never sees zero in flight with a
        // stale idle start.
        self.0.idle_since.store(now_nanos(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's byte stream with an idle deadline: a read that would wait past
/// [`ConnTimeouts`] while no request is in flight fails with `TimedOut`, and the HTTP server then
/// closes the connection. Bytes pass through untouched. The timer is armed once and only
/// re-armed when it fires, so a busy connection costs no timer work per request.
pub struct TimedIo<S> {
    io: S,
    activity: Arc<Activity>,
    timeouts: ConnTimeouts,
    accepted: Instant,
    timer: Pin<Box<Sleep>>,
}

impl<S> TimedIo<S> {
    pub fn new(io: S, activity: Arc<Activity>, timeouts: ConnTimeouts) -> Self {
        Self::accepted_at(io, activity, timeouts, Instant::now())
    }

    /// [`TimedIo::new`] for a connection accepted at `accepted` (its first-request deadline
    /// counts from then, not from when the stream was wrapped).
    pub fn accepted_at(
        io: S,
        activity: Arc<Activity>,
        timeouts: ConnTimeouts,
        accepted: Instant,
    ) -> Self {
        Self {
            io,
            activity,
            timeouts,
            accepted,
            timer: Box::pin(tokio::time::sleep_until(accepted + timeouts.first_request)),
        }
    }

    /// Called when a read would wait: `Ready(err)` once the connection has been idle too long.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            match self.activity.deadline(self.accepted, self.timeouts) {
                Some(d) if d <= now => {
                    return Poll::Ready(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "connection idle with no request in flight",
                    ))
                }
                Some(d) => self.timer.as_mut().reset(d),
                // Busy: look again one idle period from now.
                None => self.timer.as_mut().reset(now + self.timeouts.idle),
            }
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => this.poll_deadline(cx).map(Err),
            ready => ready,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A response body that keeps its request counted as in flight until it ends or is dropped.
pub struct Guarded<B> {
    body: B,
    _guard: RequestGuard,
}

impl<B> Guarded<B> {
    pub fn new(body: B, guard: RequestGuard) -> Self {
        Self {
            body,
            _guard: guard,
        }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body that did not arrive in time: no bytes for the configured gap
/// (`listen.body_read_timeout`), or not all of it by the whole-body deadline
/// (`listen.body_total_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyReadTimeout {
    #[error("the client sent no request body bytes for {} (listen.body_read_timeout)", humantime::format_duration(*.0))]
    Gap(Duration),
    #[error("the client did not send the whole request body within {} (listen.body_total_timeout)", humantime::format_duration(*.0))]
    Total(Duration),
}

// Here rather than in `error`: the conversion belongs to the type it converts, and `error`
// then needs nothing from `conn` (no conn ↔ error import circle).
impl From<BodyReadTimeout> for crate::error::ProxyError {
    fn from(t: BodyReadTimeout) -> Self {
        match t {
            BodyReadTimeout::Gap(after) => crate::error::ProxyError::ClientBodyTimeout { after },
            BodyReadTimeout::Total(after) => {
                crate::error::ProxyError::ClientBodyTotalTimeout { after }
            }
        }
    }
}

/// The deadlines a request body is read under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyDeadlines {
    /// Longest wait for the next frame.
    pub gap: Duration,
    /// Longest time from the first wait for body bytes to the end of the body.
    pub total: Duration,
}

/// A request body with a gap deadline and a whole-body deadline: waiting longer than `gap` for
/// its next frame, or past `total` since it was first waited for, fails it with
/// [`BodyReadTimeout`]. One timer serves both (armed at the nearer of the two), only while a
/// frame is awaited, and reused; a body that is never waited for reads no clock.
pub struct BodyTimeout<B> {
    body: B,
    limits: BodyDeadlines,
    /// When the body was first waited for: the whole-body clock starts there.
    since: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl<B> BodyTimeout<B> {
    pub fn new(body: B, limits: BodyDeadlines) -> Self {
        Self {
            body,
            limits,
            since: None,
            timer: None,
            armed: false,
        }
    }
}

impl<B> http_body::Body for BodyTimeout<B>
where
    B: http_body::Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.armed = false;
                // Marked as the client's, so an upstream exchange that fails on it is not
                // blamed on the upstream ([`client_fault_in`]).
                Poll::Ready(frame.map(|f| {
                    f.map_err(|e| -> Self::Error { Box::new(ClientBodyFailed(e.into())) })
                }))
            }
            Poll::Pending => {
                let limits = this.limits;
                if !this.armed {
                    let now = Instant::now();
                    let whole = *this.since.get_or_insert(now) + limits.total;
                    let deadline = (now + limits.gap).min(whole);
                    match &mut this.timer {
                        Some(t) => t.as_mut().reset(deadline),
                        None => this.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                    this.armed = true;
                }
                let Some(timer) = this.timer.as_mut() else {
                    return Poll::Pending; // set just above whenever not armed
                };
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        let since = this.since.unwrap_or_else(Instant::now);
                        let err = if Instant::now() >= since + limits.total {
                            BodyReadTimeout::Total(limits.total)
                        } else {
                            BodyReadTimeout::Gap(limits.gap)
                        };
                        Poll::Ready(Some(Err(Box::new(err))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body's own failure as it came from the client (bad chunked framing, fewer bytes
/// than its `content-length`, the connection cut), passed on inside whatever carried the body.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body failed")]
pub struct ClientBodyFailed(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// The client's fault in `err`, if `err` (or any error it wraps) is a request body that timed
/// out ([`BodyReadTimeout`]) or failed ([`ClientBodyFailed`]): a client that went away
/// (end of file before the body's length, a reset) is `ClientDisconnect`, bad framing is
/// `ClientBody`; both are 400s counted with `source="client"`.
pub fn client_fault_in(
    err: &(dyn std::error::Error + 'static),
) -> Option<crate::error::ProxyError> {
    use crate::error::{causes, error_chain, ProxyError};
    if let Some(t) = body_timeout_in(err) {
        return Some(t.into());
    }
    let failed = causes(err).find(|e| e.is::<ClientBodyFailed>())?;
    let inner = failed.source().unwrap_or(failed);
    let gone = causes(inner).any(|e| {
        e.downcast_ref::<io::Error>().is_some_and(|io| {
            use io::ErrorKind::*;
            matches!(
                io.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
            )
        })
    });
    let detail = error_chain(inner);
    Some(match gone {
        true => ProxyError::ClientDisconnect(detail),
        false => ProxyError::ClientBody(detail),
    })
}

/// The timeout that failed a request body, if `err` (or any error it wraps) is a
/// [`BodyReadTimeout`].
pub fn body_timeout_in(err: &(dyn std::error::Error + 'static)) -> Option<BodyReadTimeout> {
    crate::error::causes(err).find_map(|e| e.downcast_ref::<BodyReadTimeout>().copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const T: ConnTimeouts = ConnTimeouts {
        first_request: Duration::from_secs(5),
        idle: Duration::from_secs(20),
    };

    fn pair() -> (
        TimedIo<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        Arc<Activity>,
    ) {
        let (a, b) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        (TimedIo::new(a, activity.clone(), T), b, activity)
    }

    async fn read_outcome(io: &mut TimedIo<tokio::io::DuplexStream>) -> io::Result<usize> {
        let mut buf = [0u8; 8];
        io.read(&mut buf).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_times_out_at_the_first_request_deadline() {
        let (mut io, _peer, _) = pair();
        let start = Instant::now();
        let e = read_outcome(&mut io).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), T.first_request);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_pass_through_and_a_request_in_flight_holds_the_deadline_off() {
        let (mut io, mut peer, activity) = pair();
        peer.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        io.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
        let guard = activity.begin();
        // In flight for far longer than both timeouts: the read keeps waiting.
        let waited = tokio::time::timeout(Duration::from_secs(300), read_outcome(&mut io)).await;
        assert!(waited.is_err(), "no timeout while a request is in flight");
        drop(guard);
        let ended = Instant::now();
        let e = read_outcome(&mut io).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // Idle is counted from the end of the last request (to the timer's millisecond).
        let idle = ended.elapsed();
        assert!(
            idle >= T.idle && idle <= T.idle + Duration::from_millis(2),
            "{idle:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_pauses_too_long_fails_and_one_that_flows_does_not() {
        use http_body_util::BodyExt;
        // A body fed by a channel: frames arrive when the test sends them.
        struct Fed(tokio::sync::mpsc::Receiver<bytes::Bytes>);
        impl http_body::Body for Fed {
            type Data = bytes::Bytes;
            type Error = std::io::Error;
            fn poll_frame(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
                self.0
                    .poll_recv(cx)
                    .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
            }
        }
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let limits = BodyDeadlines {
            gap: Duration::from_secs(10),
            total: Duration::from_secs(3600),
        };
        let mut body = BodyTimeout::new(Fed(rx), limits);
        let feeder = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(9)).await;
                tx.send(bytes::Bytes::from_static(b"x")).await.unwrap();
            }
            // Then silence, with the sender still open.
            std::future::pending::<()>().await;
        });
        for _ in 0..3 {
            let f = body.frame().await.unwrap().unwrap();
            assert_eq!(f.into_data().unwrap(), "x");
        }
        let start = Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert_eq!(
            body_timeout_in(err.as_ref()),
            Some(BodyReadTimeout::Gap(Duration::from_secs(10)))
        );
        feeder.abort();
    }

    fn caps(max_connections: usize, per_worker: usize, workers: usize, fds: u64) -> ConnCaps {
        ConnCaps::new(CapsInput {
            max_connections,
            per_worker,
            workers,
            admin: 64,
            fds_per_upstream: 1,
            fds: Some(fds),
        })
    }

    #[test]
    fn caps_are_configured_or_half_the_descriptors_left_after_the_reserve_and_admin() {
        // ulimit -n 1024, two workers, 64 admin connections: 896 left, 448 client
        // connections, 224 upstream ones per worker.
        let c = caps(0, 0, 2, 1024);
        assert_eq!(
            (c.clients, c.upstream_per_worker, c.clamped),
            (448, 224, false)
        );
        assert_eq!(c.clients_per_worker(2), 224);
        assert_eq!(caps(7, 5, 2, 1024).clients_per_worker(2), 4);
        assert_eq!(caps(7, 5, 2, 1024).upstream_per_worker, 5);
        // A limit below the reserve still allows one of each.
        let tiny = caps(0, 0, 4, 10);
        assert_eq!((tiny.clients, tiny.upstream_per_worker), (1, 1));
        let unlimited = ConnCaps::new(CapsInput {
            max_connections: 0,
            per_worker: 0,
            workers: 1,
            admin: 64,
            fds_per_upstream: 1,
            fds: None,
        });
        assert!(unlimited.clients >= 1 << 20);
    }

    #[test]
    fn caps_never_promise_more_descriptors_than_the_limit_holds() {
        // ulimit -n 512 with the in-process mock (2 descriptors per upstream connection).
        let c = ConnCaps::new(CapsInput {
            max_connections: 0,
            per_worker: 0,
            workers: 2,
            admin: 64,
            fds_per_upstream: 2,
            fds: Some(512),
        });
        assert_eq!((c.clients, c.upstream_per_worker), (192, 48));
        let used = |c: &ConnCaps, cost: u64| {
            c.clients as u64 + c.upstream_per_worker as u64 * 2 * cost + c.admin as u64
        };
        assert!(used(&c, 2) + FD_RESERVE <= 512);
        // Configured caps past the limit are scaled down to fit, keeping their proportions.
        let c = caps(10_000, 10_000, 2, 512);
        assert!(c.clamped);
        assert!(used(&c, 1) + FD_RESERVE <= 512, "{c:?}");
        assert_eq!((c.clients, c.upstream_per_worker), (128, 128));
    }

    /// Opens a connection in `table`: a task that holds its slot until aborted.
    fn open(table: &Arc<ConnTable>, set: &mut tokio::task::JoinSet<()>) -> Arc<Activity> {
        let activity = Arc::new(Activity::default());
        let slot = table.slot();
        let id = slot.id();
        let abort = set.spawn(async move {
            let _slot = slot;
            std::future::pending::<()>().await
        });
        table.insert(id, activity.clone(), abort);
        activity
    }

    #[tokio::test]
    async fn the_oldest_connection_with_nothing_in_flight_is_shed_first() {
        let table = ConnTable::new(3);
        let mut set = tokio::task::JoinSet::new();
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(open(&table, &mut set));
            // Distinct accept instants, so "oldest" is well defined.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // The oldest is busy, the second idle, the third has sent nothing.
        let busy = conns[0].begin();
        drop(conns[1].begin());
        let c = |new, active, idle| ConnCounts { new, active, idle };
        assert_eq!(table.counts(), c(1, 1, 1));
        assert_eq!(table.admit(), Admit::Shed, "the idle second goes");
        assert_eq!(table.counts(), c(1, 1, 0));
        let gone = set.join_next().await.unwrap().unwrap_err();
        assert!(gone.is_cancelled(), "its task was stopped");
        // A new (busy) one takes the place; at the cap again, the silent third goes.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let newest = open(&table, &mut set);
        let _busy_newest = newest.begin();
        assert_eq!(table.counts(), c(1, 2, 0));
        assert_eq!(table.admit(), Admit::Shed);
        assert_eq!(table.counts(), c(0, 2, 0));
        // Every connection busy at the cap: the new one is refused.
        let third = open(&table, &mut set);
        let _busy_third = third.begin();
        assert_eq!(table.admit(), Admit::Full);
        assert_eq!(table.counts(), c(0, 3, 0));
        drop(busy);
        set.abort_all();
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_fails_at_the_whole_body_deadline() {
        use http_body_util::BodyExt;
        // One byte every 9 s never trips the 10 s gap, but 25 s in all is the limit.
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
        let body = http_body_util::StreamBody::new(Box::pin(futures_util::stream::unfold(
            rx,
            |mut rx| async {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, std::io::Error>(http_body::Frame::data(b)), rx))
            },
        )));
        let limits = BodyDeadlines {
            gap: Duration::from_secs(10),
            total: Duration::from_secs(25),
        };
        let mut body = BodyTimeout::new(body, limits);
        let feeder = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(9)).await;
                if tx.send(bytes::Bytes::from_static(b" ")).await.is_err() {
                    return;
                }
            }
        });
        let start = Instant::now();
        let mut frames = 0;
        let err = loop {
            match body.frame().await {
                Some(Ok(_)) => frames += 1,
                Some(Err(e)) => break e,
                None => panic!("the body does not end"),
            }
        };
        assert_eq!(frames, 2, "bytes at 9 s and 18 s pass");
        assert_eq!(start.elapsed(), Duration::from_secs(25));
        assert_eq!(
            body_timeout_in(err.as_ref()),
            Some(BodyReadTimeout::Total(Duration::from_secs(25)))
        );
        feeder.abort();
    }
}
