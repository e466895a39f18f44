//! What one exchange holds across the pipeline's steps: the client connection it came on
//! ([`Downstream`]), its place in the in-flight gauge ([`InFlight`]), and the buffered-body
//! budget its collected body is charged to ([`reserve`], [`collect_limited`]). Leaves of the
//! pipeline: never decides anything about a request.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header;
use http_body_util::BodyExt;

use crate::body::Body;
use crate::budget;
use crate::conn::{Activity, RequestGuard};
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::upstream::pool::Affinity;

use super::turn_timer;

/// What the proxy knows of the client connection a request came on; one per connection.
pub struct Downstream {
    pub peer: SocketAddr,
    pub tls: bool,
    /// The connection's own upstream connection, for its HTTP/1.1 requests.
    pub affinity: Affinity,
    /// Its requests in flight, which hold the connection's idle deadline off.
    pub activity: Arc<Activity>,
    /// Upstream connections its HTTP/2 streams may still take
    /// (`upstream.max_connections_per_client`).
    pub upstream_streams: Arc<tokio::sync::Semaphore>,
    /// Upstream connections the requests of its source address may still take, shared with
    /// the address's other connections (`upstream.max_connections_per_source`; `None`: no bound).
    pub source: Option<Arc<tokio::sync::Semaphore>>,
    /// `upstream.first_byte_timeout` and `upstream.idle_timeout` for its HTTP/1.1 requests,
    /// which come one at a time: one timer each, registered once per connection.
    pub first_byte: turn_timer::TurnTimer,
    pub response_idle: turn_timer::TurnTimer,
}

impl Downstream {
    pub fn new(
        peer: SocketAddr,
        tls: bool,
        activity: Arc<Activity>,
        max_upstream: usize,
        source: Option<Arc<tokio::sync::Semaphore>>,
    ) -> Self {
        Self {
            peer,
            tls,
            affinity: Affinity::default(),
            activity,
            upstream_streams: Arc::new(tokio::sync::Semaphore::new(max_upstream)),
            source,
            first_byte: turn_timer::TurnTimer::default(),
            response_idle: turn_timer::TurnTimer::default(),
        }
    }
}

/// One request in `kvbust_in_flight_requests` (and in its connection's activity), from its
/// arrival to the end of its response body, or to its error response.
pub struct InFlight {
    gauge: prometheus::IntGauge,
    _request: Option<RequestGuard>,
}

impl InFlight {
    pub fn begin(metrics: &Metrics, request: Option<RequestGuard>) -> Self {
        metrics.in_flight.inc();
        Self {
            gauge: metrics.in_flight.clone(),
            _request: request,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Holds `n` bytes of the buffered-body budget, or refuses the request at once.
pub(crate) fn reserve(r: &mut budget::Reservation<'_>, n: u64) -> Result<(), ProxyError> {
    if r.grow_to(n) {
        return Ok(());
    }
    Err(ProxyError::Overloaded {
        code: "buffer_budget_exhausted",
        message: "too many request bodies are being buffered at once (limits.max_buffered_total); retry shortly".into(),
        retry_after_s: 1,
    })
}

/// The length the client declared (`content-length`), when it is a number.
pub(crate) fn declared_len(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// The body's first chunk of data (`None`: it has none), refusing at once a body declared or
/// found larger than `limit`.
pub(crate) async fn first_chunk(
    body: &mut Body,
    headers: &http::HeaderMap,
    limit: u64,
) -> Result<Option<Bytes>, ProxyError> {
    if declared_len(headers).is_some_and(|n| n > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(client_body_error)?.into_data() {
            if data.len() as u64 > limit {
                return Err(ProxyError::BodyTooLarge { limit });
            }
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// A client body's read error, as the exchange reports it.
pub(crate) fn client_body_error(e: crate::body::BoxError) -> ProxyError {
    crate::conn::client_fault_in(e.as_ref())
        .unwrap_or_else(|| ProxyError::ClientBody(crate::error::error_chain(e.as_ref())))
}

/// Collects a request body that must be rewritten (its `first` chunk already read), refusing
/// more than `limit` bytes and holding the bytes received so far in `buffered`. A body that
/// arrives in one frame (the usual case for a small chat request) is kept as it is, not copied.
pub(crate) async fn collect_limited(
    first: Option<Bytes>,
    body: Body,
    headers: &http::HeaderMap,
    limit: u64,
    buffered: &mut budget::Reservation<'_>,
) -> Result<Bytes, ProxyError> {
    let declared = declared_len(headers);
    if declared.is_some_and(|n| n > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    // The budget is charged for bytes received, never for bytes promised: a client that
    // declares 64 MiB and sends one byte holds one byte of it.
    // A plain loop rather than `Limited`: its boxed error type trips rustc's Send inference
    // for this future.
    let mut body = body;
    let mut pending = first;
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    let mut total = 0u64;
    loop {
        let data = match pending.take() {
            Some(data) => data,
            None => match body.frame().await {
                None => break,
                Some(frame) => match frame.map_err(client_body_error)?.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
            },
        };
        total += data.len() as u64;
        if total > limit {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        reserve(buffered, total)?;
        if let Some(buf) = joined.as_mut() {
            buf.extend_from_slice(&data);
        } else if let Some(head) = first.take() {
            // Room for the declared size, but at most 1 MiB beyond what has come: a promise
            // alone allocates little (the buffer grows as bytes come).
            let cap = declared
                .unwrap_or(total)
                .max(total)
                .min(limit)
                .min(total + (1 << 20)) as usize;
            let mut buf = bytes::BytesMut::with_capacity(cap);
            buf.extend_from_slice(&head);
            buf.extend_from_slice(&data);
            joined = Some(buf);
        } else {
            first = Some(data);
        }
    }
    Ok(match joined {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
    })
}
