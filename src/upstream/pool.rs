//! Plain-HTTP/1.1 upstream connections kvbust holds itself, with no dispatch through hyper-util's
//! pooled client: a client connection's own ([`Affinity`]) and each worker's idle pool
//! ([`H1Pool`]) for the streams of HTTP/2 clients, and the bounds on how many may be open
//! (per worker) or held by one client connection's streams ([`acquire`]). Never inspects or
//! buffers bodies.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::client::{broken, Upstream};
use crate::body::Body;
use crate::config::UpstreamConfig;
use crate::error::{error_chain, ProxyError};
use crate::sync::lock;

type Sender = SendRequest<Body>;

/// A client connection's own upstream connection. HTTP/1.1 requests on one client connection
/// come one after another, so a single upstream connection serves them all with no pool
/// look-up, no dispatch channel hop and no shared state, as nginx's keep-alive proxying and the
/// thread-per-core design want.
#[derive(Default)]
pub struct Affinity(Mutex<Option<Sender>>);

/// Idle upstream connections of one data worker, for requests that have no connection of their
/// own (the streams of HTTP/2 clients). The most recently used is reused first, so a busy
/// worker keeps a few hot connections and the rest age out; at most `upstream.pool_max_idle_per_host`
/// are kept, none longer than `upstream.pool_idle_timeout`. A connection comes back when its
/// response body has been read to the end ([`UpstreamBody`]); one whose body was cut is closed.
pub struct H1Pool {
    idle: Mutex<VecDeque<(Sender, Instant)>>,
    /// Connections this worker may still open (`upstream.max_connections_per_worker`); each
    /// open connection's task holds one until the connection closes, in use or idle.
    open: Arc<Semaphore>,
    max_idle: usize,
    idle_timeout: Duration,
    /// A task closes aged connections while any are idle (see [`H1Pool::reap`]).
    reaping: AtomicBool,
}

impl H1Pool {
    pub fn new(cfg: &UpstreamConfig, max_open: usize) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(VecDeque::new()),
            open: Arc::new(Semaphore::new(max_open.max(1))),
            max_idle: cfg.pool_max_idle_per_host,
            idle_timeout: cfg.pool_idle_timeout,
            reaping: AtomicBool::new(false),
        })
    }

    /// The most recently returned connection still young enough; older ones are closed.
    fn take(&self) -> Option<Sender> {
        let mut idle = lock(&self.idle);
        self.close_aged(&mut idle, Instant::now());
        idle.pop_back().map(|(send, _)| send)
    }

    /// Closes the longest-idle connection, so that its slot comes free for a new one.
    fn close_oldest_idle(&self) {
        drop(lock(&self.idle).pop_front());
    }

    /// Closes the connections idle for `upstream.pool_idle_timeout`; returns when the oldest
    /// left will be.
    fn close_aged(&self, idle: &mut VecDeque<(Sender, Instant)>, now: Instant) -> Option<Instant> {
        // Returned in time order: the aged ones are at the front.
        while let Some((_, since)) = idle.front() {
            let due = *since + self.idle_timeout;
            if due > now {
                return Some(due);
            }
            idle.pop_front();
        }
        None
    }

    fn put(self: &Arc<Self>, send: Sender) {
        if send.is_closed() || self.max_idle == 0 {
            return;
        }
        {
            let mut idle = lock(&self.idle);
            if idle.len() >= self.max_idle {
                idle.pop_front();
            }
            idle.push_back((send, Instant::now()));
        }
        // After the push: a reaper that found the pool empty cleared the flag under the lock.
        if !self.reaping.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(Self::reap(Arc::downgrade(self)))),
                Err(_) => self.reaping.store(false, Ordering::Release),
            }
        }
    }

    /// Closes idle connections as they age, so a quiet worker holds none for longer than
    /// `upstream.pool_idle_timeout`; ends when the pool is empty (the next `put` starts another)
    /// or gone.
    async fn reap(pool: Weak<Self>) {
        loop {
            let next = {
                let Some(pool) = pool.upgrade() else { return };
                let mut idle = lock(&pool.idle);
                match pool.close_aged(&mut idle, Instant::now()) {
                    Some(due) => due,
                    None => {
                        pool.reaping.store(false, Ordering::Release);
                        return;
                    }
                }
            };
            tokio::time::sleep_until(next.into()).await;
        }
    }
}

/// Where a request's upstream connection comes from and goes back to.
pub enum Keep<'a> {
    Own(&'a Affinity),
    Pool(&'a Arc<H1Pool>),
}

impl Keep<'_> {
    fn take(&self) -> Option<Sender> {
        match self {
            Keep::Own(a) => lock(&a.0).take(),
            Keep::Pool(p) => p.take(),
        }
    }
}

/// The upstream's response body, which gives its connection back to the worker's pool once it
/// has been read to the end. Dropped before that, it closes the connection: hyper cannot reuse
/// one with a response half read.
pub struct UpstreamBody {
    inner: Incoming,
    lease: Option<(Arc<H1Pool>, Sender)>,
    /// The client connection's and the source address's upstream slots this exchange holds,
    /// given back with the connection.
    slot: Slots,
}

impl UpstreamBody {
    pub fn new(inner: Incoming) -> Self {
        Self {
            inner,
            lease: None,
            slot: Slots::default(),
        }
    }

    /// Holds `slot` until the response has been read to the end or dropped.
    pub fn holding(mut self, slot: Slots) -> Self {
        self.slot = slot;
        self
    }

    /// The response has been read to the end: the connection can take the next request.
    fn release(&mut self) {
        if let Some((pool, send)) = self.lease.take() {
            pool.put(send);
        }
        self.slot = Slots::default();
    }
}

/// The upstream slots one exchange holds from its send to the end of its response: its client
/// connection's (HTTP/2 streams, `upstream.max_connections_per_client`) and its source
/// address's (`upstream.max_connections_per_source`).
#[derive(Default)]
pub struct Slots {
    pub client: Option<OwnedSemaphorePermit>,
    pub source: Option<OwnedSemaphorePermit>,
}

/// The upstream connections the requests of each source address may hold at once
/// (`upstream.max_connections_per_source`), over all its client connections and every worker:
/// one source with many HTTP/2 connections cannot take the model server's connections from
/// the others. Looked up once per client connection, which holds its source's semaphore for
/// its life; an address with no connection left is forgotten at the next prune.
pub struct SourceSlots {
    cap: usize,
    /// Each source's semaphore (weakly: its connections hold it) and the table size at which
    /// dead entries are pruned next.
    by_ip: Mutex<(
        std::collections::HashMap<std::net::IpAddr, Weak<Semaphore>>,
        usize,
    )>,
}

impl SourceSlots {
    /// `cap` 0: no bound per source.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            by_ip: Mutex::new((Default::default(), 1024)),
        })
    }

    /// The slots of `ip`, shared with its other connections; `None` when sources are unbounded.
    pub fn of(&self, ip: std::net::IpAddr) -> Option<Arc<Semaphore>> {
        if self.cap == 0 {
            return None;
        }
        let mut guard = lock(&self.by_ip);
        let (map, prune_at) = &mut *guard;
        if let Some(s) = map.get(&ip).and_then(Weak::upgrade) {
            return Some(s);
        }
        if map.len() >= *prune_at {
            // Amortized: a prune at most once per doubling of the live entries.
            map.retain(|_, w| w.strong_count() > 0);
            *prune_at = (map.len() * 2).max(1024);
        }
        let s = Arc::new(Semaphore::new(self.cap));
        map.insert(ip, Arc::downgrade(&s));
        Some(s)
    }
}

/// One of the upstream slots of `slots`, waiting up to `wait` (`upstream.connect_timeout`) for
/// one to come free; past that a 503 naming `key`, the bound that was reached.
pub async fn acquire(
    slots: &Arc<Semaphore>,
    wait: Duration,
    key: &'static str,
) -> Result<OwnedSemaphorePermit, ProxyError> {
    if let Ok(p) = slots.clone().try_acquire_owned() {
        return Ok(p);
    }
    match tokio::time::timeout(wait, slots.clone().acquire_owned()).await {
        Ok(Ok(p)) => Ok(p),
        _ => Err(ProxyError::Overloaded {
            code: "upstream_connections_exhausted",
            message: format!(
                "every upstream connection {key} allows is in use and none came free within \
                 upstream.connect_timeout ({}); retry shortly, or raise {key}",
                humantime::format_duration(wait)
            ),
            retry_after_s: 1,
        }),
    }
}

/// [`acquire`] when there is a bound: `None` when `slots` is.
pub async fn acquire_if(
    slots: Option<&Arc<Semaphore>>,
    wait: Duration,
    key: &'static str,
) -> Result<Option<OwnedSemaphorePermit>, ProxyError> {
    match slots {
        None => Ok(None),
        Some(s) => acquire(s, wait, key).await.map(Some),
    }
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.release(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.release(),
            Poll::Ready(Some(Err(_))) => self.lease = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// On a response whose request opened a new upstream connection: how long the connect (and
/// name resolution) took. Known for the connections this module opens.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamConnect(pub Duration);

/// Sends `req` on a kept connection, or on a new one when there is none or every kept one was
/// closed. A request that was never written to a kept connection (the upstream closed it while
/// idle) is tried on the next one; nothing is retried after any of it was sent. The
/// connection goes back where it came from: at once to its client connection, or to the pool
/// when the response body ends.
pub async fn send(
    keep: Keep<'_>,
    pool: &Arc<H1Pool>,
    slot: Slots,
    upstream: &Upstream,
    cfg: &UpstreamConfig,
    mut req: http::Request<Body>,
) -> Result<http::Response<UpstreamBody>, ProxyError> {
    if !req.headers().contains_key(header::HOST) {
        // The pooled client derives Host from an absolute URI; here the target is origin-form.
        req.headers_mut()
            .insert(header::HOST, upstream.host_header.clone());
    }
    while let Some(mut kept) = keep.take() {
        if kept.ready().await.is_err() {
            continue;
        }
        match kept.try_send_request(req).await {
            Ok(resp) => return Ok(give_back(keep, kept, resp, slot)),
            Err(mut e) => match e.take_message() {
                Some(unsent) => req = unsent,
                None => return Err(broken(e.error())),
            },
        }
    }
    let opened = Instant::now();
    let open = match pool.open.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            // At the worker's bound: an idle pooled connection gives its slot up first.
            pool.close_oldest_idle();
            acquire(
                &pool.open,
                cfg.connect_timeout,
                "upstream.max_connections_per_worker",
            )
            .await?
        }
    };
    let mut fresh = connect(upstream, cfg, open).await?;
    let connect = UpstreamConnect(opened.elapsed());
    let mut resp = fresh.send_request(req).await.map_err(|e| broken(&e))?;
    resp.extensions_mut().insert(connect);
    Ok(give_back(keep, fresh, resp, slot))
}

fn give_back(
    keep: Keep<'_>,
    send: Sender,
    resp: http::Response<Incoming>,
    slot: Slots,
) -> http::Response<UpstreamBody> {
    resp.map(|inner| {
        let mut body = UpstreamBody::new(inner).holding(slot);
        match keep {
            Keep::Own(a) => *lock(&a.0) = Some(send),
            Keep::Pool(p) => {
                body.lease = Some((p.clone(), send));
                // A body that is empty from the start never polls to its end.
                if body.inner.is_end_stream() {
                    body.release();
                }
            }
        }
        body
    })
}

/// Opens a plain HTTP/1.1 connection to the upstream and runs it on this worker; the
/// connection's task holds `open`, its worker slot, until the connection closes.
async fn connect(
    upstream: &Upstream,
    cfg: &UpstreamConfig,
    open: OwnedSemaphorePermit,
) -> Result<Sender, ProxyError> {
    let host = upstream.authority.host();
    // `Authority::host` keeps an IPv6 literal's brackets; the resolver wants it bare.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = upstream.authority.port_u16().unwrap_or(80);
    let connect = async {
        let mut last = None;
        for addr in tokio::net::lookup_host((host, port)).await? {
            match tokio::net::TcpStream::connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the host name resolved to no address",
            )
        }))
    };
    let stream = match tokio::time::timeout(cfg.connect_timeout, connect).await {
        Err(_) => {
            return Err(ProxyError::UpstreamTimeout {
                stage: "accept the connection",
                after: cfg.connect_timeout,
            })
        }
        Ok(Err(e)) => {
            return Err(ProxyError::UpstreamConnect {
                upstream: upstream.display.clone(),
                detail: e.to_string(),
            })
        }
        Ok(Ok(s)) => s,
    };
    let _ = stream.set_nodelay(true);
    // Vectored writes towards the upstream: a request body (an agent's context: 100 KB to
    // 1 MB) goes out from its own buffer; flattened, hyper would copy all of it into its write
    // buffer first (10% of kvbust's CPU on a 227 KB body). The client side stays flattened
    // (`server::data_builder`): its responses are small frames.
    let (send, conn) = hyper::client::conn::http1::Builder::new()
        .writev(true)
        .handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| ProxyError::UpstreamConnect {
            upstream: upstream.display.clone(),
            detail: error_chain(&e),
        })?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("upstream connection ended: {e}");
        }
        drop(open);
    });
    Ok(send)
}
