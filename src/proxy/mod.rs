//! The request path, read top to bottom: classify the route → decide phase and target → (collect,
//! parse once, mark) → forward → stream the response back through the observer. Bodies that need
//! no change are never collected or parsed; response bodies are never collected.

pub mod budget;
pub mod forward;
pub mod observe;
pub mod rewrite;
pub mod synthesize;
pub mod usage;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response};
use http_body::Body as HttpBody;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

use crate::cachebust::Shape;
use crate::conn::{Activity, BodyTimeout, RequestGuard};
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::runtime::Runtime;
use forward::{Affinity, Upstream, UpstreamClient};
use observe::{Observed, Observer};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type on both sides of the proxy.
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full_body(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// The API routes kvbust understands; everything else is `Other` and passes through untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completions,
    Responses,
    Messages,
    Other,
}

impl Route {
    pub fn classify(method: &Method, path: &str) -> Route {
        if method != Method::POST {
            return Route::Other;
        }
        match path.trim_end_matches('/') {
            "/v1/chat/completions" => Route::Chat,
            "/v1/completions" => Route::Completions,
            "/v1/responses" => Route::Responses,
            "/v1/messages" => Route::Messages,
            _ => Route::Other,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Completions => "completions",
            Route::Responses => "responses",
            Route::Messages => "messages",
            Route::Other => "other",
        }
    }

    pub fn shape(self) -> Option<Shape> {
        match self {
            Route::Chat => Some(Shape::Chat),
            Route::Completions => Some(Shape::Completions),
            Route::Responses => Some(Shape::Responses),
            Route::Messages => Some(Shape::Messages),
            Route::Other => None,
        }
    }
}

/// What the proxy knows of the client connection a request came on; one per connection.
pub struct Downstream {
    pub peer: SocketAddr,
    pub tls: bool,
    /// The connection's own upstream connection, for its HTTP/1.1 requests.
    pub affinity: Affinity,
    /// Its requests in flight, which hold the connection's idle deadline off.
    pub activity: Arc<Activity>,
}

impl Downstream {
    pub fn new(peer: SocketAddr, tls: bool) -> Self {
        Self {
            peer,
            tls,
            affinity: Affinity::default(),
            activity: Arc::default(),
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

pub struct Proxy {
    rt: Arc<Runtime>,
    client: UpstreamClient,
    upstream: Upstream,
    synth: Arc<synthesize::Synthesizer>,
}

/// Labels and facts carried from the request to its response.
struct Exchange {
    route: Route,
    phase: &'static str,
    target: &'static str,
    rid: Option<String>,
    /// The synthesized entry's trace timestamp (ms), when it has one.
    trace_timestamp: Option<String>,
    /// The access-log line in the making (`log.access`).
    log: Option<crate::access_log::Entry>,
    /// kvbust added `include_usage` (`observe.request_usage`): take it out of the response.
    strip_usage: bool,
}

impl Proxy {
    /// One worker's proxy: `client` is that worker's pool; `synth` is shared by all workers.
    pub fn new(
        rt: Arc<Runtime>,
        upstream: Upstream,
        client: UpstreamClient,
        synth: Arc<synthesize::Synthesizer>,
    ) -> Arc<Self> {
        Arc::new(Self {
            rt,
            client,
            upstream,
            synth,
        })
    }

    /// Serves one request that came on the connection `client`. Never fails: errors become
    /// OpenAI-shaped responses.
    pub fn handle<B>(
        self: Arc<Self>,
        req: Request<B>,
        client: Arc<Downstream>,
    ) -> Pin<Box<dyn Future<Output = Response<Body>> + Send + 'static>>
    where
        B: HttpBody<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        // Erase the body type up front; boxing the future pins its Send-ness to concrete
        // lifetimes (hyper's service bounds trip rustc's higher-ranked inference otherwise).
        let gap = self.rt.config.listen.body_read_timeout;
        let req = req.map(|b| BodyTimeout::new(b, gap).boxed());
        Box::pin(self.handle_erased(req, client))
    }

    async fn handle_erased(
        self: Arc<Self>,
        req: Request<Body>,
        client: Arc<Downstream>,
    ) -> Response<Body> {
        let start = Instant::now();
        let in_flight = InFlight::begin(&self.rt.metrics, Some(client.activity.begin()));
        let route = Route::classify(req.method(), req.uri().path());
        let mut req = req;
        let log = crate::access_log::Entry::begin(&self.rt.config.log, &mut req, route.label());
        let mut ex = Exchange {
            route,
            phase: "none",
            target: "none",
            rid: None,
            trace_timestamp: None,
            log,
            strip_usage: false,
        };
        // HTTP/2 streams share their connection: they go through the worker's pool.
        let affinity = (req.version() < http::Version::HTTP_2).then_some(&client.affinity);
        let result = self
            .forward(req, &client, affinity, start, in_flight, &mut ex)
            .await;
        let resp = match result {
            Ok(resp) => resp,
            Err(err) => {
                let fault = err.fault().as_str();
                if err.status().is_server_error() {
                    tracing::warn!(
                        route = route.label(),
                        source = fault,
                        code = err.code(),
                        "{err}"
                    );
                } else {
                    tracing::info!(
                        route = route.label(),
                        source = fault,
                        code = err.code(),
                        "{err}"
                    );
                }
                self.rt.metrics.error(fault, err.code());
                let code = err.code();
                let mut resp = err.into_response::<Full<Bytes>>();
                if let Some(log) = ex.log.take() {
                    log.failed(&mut resp, (ex.phase, ex.target, ex.rid.take()), code, start);
                }
                resp.map(|b| b.map_err(|never| match never {}).boxed())
            }
        };
        self.rt
            .metrics
            .requests
            .with_label_values(&[route.label(), ex.phase, ex.target, resp.status().as_str()])
            .inc();
        resp
    }

    async fn forward(
        &self,
        req: Request<Body>,
        client: &Downstream,
        affinity: Option<&Affinity>,
        start: Instant,
        in_flight: InFlight,
        ex: &mut Exchange,
    ) -> Result<Response<Body>, ProxyError> {
        let cfg = &self.rt.config;
        let (mut parts, body) = req.into_parts();
        let affinity = affinity.filter(|_| self.upstream.uses_affinity(cfg.upstream.http2));
        let uri = match affinity {
            Some(_) => self.upstream.origin_form(parts.uri.path_and_query())?,
            None => self.upstream.join(parts.uri.path_and_query())?,
        };

        // Decide what this request needs from the headers alone; collect the body only if so.
        let mut upstream_body = body;
        // Buffered bytes held against limits.max_buffered_total until the upstream answers.
        let mut buffered = self.rt.bodies.reservation();
        if let Some(shape) = ex.route.shape() {
            let control = rewrite::has_control_headers(&parts.headers, &cfg.headers);
            let mut decision = rewrite::decide(&parts.headers, control, &self.rt)?;
            ex.phase = decision.phase.as_str();
            ex.target = decision.target.as_str();
            let synth =
                synthesize::wants_synthesis(&parts.headers, control, parts.uri.path(), cfg)?;
            if synth && shape != Shape::Chat {
                return Err(ProxyError::bad_request(
                    "synthesis_unsupported",
                    format!("{} works on /v1/chat/completions only", cfg.headers.synth),
                ));
            }
            let scan = shape == Shape::Chat && cfg.synth.placeholders;
            let usage =
                cfg.observe.request_usage && matches!(shape, Shape::Chat | Shape::Completions);
            if decision.needs_body() || synth || scan || usage {
                let mut bytes = collect_limited(
                    upstream_body,
                    &parts.headers,
                    cfg.limits.max_body.as_u64(),
                    &mut buffered,
                )
                .await?;
                if let Some(log) = ex.log.as_mut() {
                    log.bytes_in = Some(bytes.len() as u64);
                }
                let mut changed = false;
                let mut session = None;
                if synth {
                    let key = rewrite::header_session_key(
                        &cfg.cache_bust.session_sources,
                        &parts.headers,
                        &cfg.headers,
                        cfg.limits.control_header_len(),
                    )?;
                    let filled = self.synth.fill(&bytes, key.as_deref()).await?;
                    // AIPerf's placement: first-turn targets skip the user-context message.
                    decision.user_context_messages = filled.user_context_messages;
                    session = Some(key.unwrap_or(filled.session_id));
                    ex.trace_timestamp = filled.trace_timestamp;
                    bytes = Bytes::from(filled.body);
                    changed = true;
                }
                if scan {
                    if let Some(b) = self.synth.expand(&bytes).await? {
                        bytes = Bytes::from(b);
                        changed = true;
                    }
                }
                if decision.needs_body() {
                    let out = rewrite::apply(
                        &decision,
                        shape,
                        &bytes,
                        &parts.headers,
                        &self.rt,
                        session.as_deref(),
                    )?;
                    ex.rid = out.rid;
                    if let Some(b) = out.body {
                        bytes = b;
                        changed = true;
                    }
                }
                if usage {
                    if let Some(b) = usage::add_include_usage(&bytes) {
                        bytes = Bytes::from(b);
                        changed = true;
                        ex.strip_usage = true;
                    }
                }
                if changed {
                    reserve(&mut buffered, bytes.len() as u64)?;
                    parts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                }
                upstream_body = full_body(bytes);
            }
        }

        forward::upstream_request_headers(
            &mut parts.headers,
            client.peer,
            client.tls,
            cfg.upstream.keep_host,
            &cfg.headers.control(),
        );
        parts.uri = uri;
        // The client picks the wire version per connection (ALPN / prior knowledge).
        parts.version = http::Version::HTTP_11;
        let upstream_req = Request::from_parts(parts, upstream_body);

        let overhead = start.elapsed();
        self.rt.metrics.overhead.observe(overhead.as_secs_f64());
        // Headers must come within first_byte_timeout, and within what is left of the total.
        let (timeout, stage, after) = match cfg.upstream.total_timeout {
            Some(total) if total.saturating_sub(overhead) < cfg.upstream.first_byte_timeout => (
                total.saturating_sub(overhead),
                "respond (upstream.total_timeout)",
                total,
            ),
            _ => (
                cfg.upstream.first_byte_timeout,
                "send response headers",
                cfg.upstream.first_byte_timeout,
            ),
        };
        let sent = async {
            match affinity {
                Some(a) => {
                    forward::send_with_affinity(a, &self.upstream, &cfg.upstream, upstream_req)
                        .await
                }
                None => self.client.request(upstream_req).await.map_err(|e| {
                    forward::classify(e, &self.upstream, cfg.upstream.connect_timeout)
                }),
            }
        };
        let resp = match tokio::time::timeout(timeout, sent).await {
            Err(_) => return Err(ProxyError::UpstreamTimeout { stage, after }),
            Ok(result) => result?,
        };
        // The body went out with the request: its bytes are no longer held here.
        drop(buffered);

        let (mut rparts, rbody) = resp.into_parts();
        forward::strip_hop_by_hop(&mut rparts.headers);
        let log = ex
            .log
            .take()
            .map(|log| log.responded(&mut rparts, (ex.phase, ex.target, ex.rid.clone())));
        if ex.route != Route::Other && cfg.cache_bust.response_headers {
            let h = &mut rparts.headers;
            let rid = ex.rid.as_deref().unwrap_or("none");
            // Digests are hex and phases are fixed words, so these are always valid values.
            if let Ok(v) = HeaderValue::from_str(rid) {
                h.insert(HeaderName::from_static("x-kvbust-rid"), v);
            }
            // On API routes the phase was decided before forwarding.
            h.insert(
                HeaderName::from_static("x-kvbust-phase"),
                HeaderValue::from_static(ex.phase),
            );
            h.insert(
                HeaderName::from_static("x-kvbust-overhead-us"),
                HeaderValue::from(overhead.as_micros() as u64),
            );
        }
        // The trace's schedule, for a client that wants to follow it (a number: a valid value).
        if let Some(v) = ex.trace_timestamp.as_deref() {
            if let Ok(v) = HeaderValue::from_str(v) {
                rparts
                    .headers
                    .insert(HeaderName::from_static("x-kvbust-trace-timestamp"), v);
            }
        }
        let content_type = rparts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let labels = observe::Labels {
            route: ex.route.label(),
            phase: ex.phase,
            target: ex.target,
        };
        let scan_limit =
            (ex.route != Route::Other).then(|| cfg.observe.max_usage_scan.as_u64() as usize);
        let observer = Observer::new(
            self.rt.metrics.clone(),
            labels,
            start,
            content_type,
            scan_limit,
        )
        .holding(in_flight)
        .logging(log);
        let body = Observed::new(
            rbody,
            cfg.upstream.idle_timeout,
            cfg.upstream.total_timeout.map(|t| (t, start)),
            observer,
        )
        .stripping_usage(ex.strip_usage)
        .boxed();
        Ok(Response::from_parts(rparts, body))
    }
}

/// Holds `n` bytes of the buffered-body budget, or refuses the request at once.
fn reserve(r: &mut budget::Reservation<'_>, n: u64) -> Result<(), ProxyError> {
    if r.grow_to(n) {
        return Ok(());
    }
    Err(ProxyError::Overloaded {
        code: "buffer_budget_exhausted",
        message: "too many request bodies are being buffered at once (limits.max_buffered_total); retry shortly".into(),
        retry_after_s: 1,
    })
}

/// Collects a request body that must be rewritten, refusing more than `limit` bytes and holding
/// its size in `buffered`. A body that arrives in one frame (the usual case for a small chat
/// request) is kept as it is, not copied.
async fn collect_limited(
    body: Body,
    headers: &http::HeaderMap,
    limit: u64,
    buffered: &mut budget::Reservation<'_>,
) -> Result<Bytes, ProxyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    reserve(buffered, declared.unwrap_or(0))?;
    // A plain loop rather than `Limited`: its boxed error type trips rustc's Send inference
    // for this future.
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| match crate::conn::body_timeout_in(e.as_ref()) {
            Some(after) => ProxyError::ClientBodyTimeout { after },
            None => ProxyError::ClientBody(crate::error::error_chain(e.as_ref())),
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if total > limit {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        reserve(buffered, total)?;
        if let Some(buf) = joined.as_mut() {
            buf.extend_from_slice(&data);
        } else if let Some(head) = first.take() {
            let cap = declared.unwrap_or(total).max(total).min(limit) as usize;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_post_only_and_exact() {
        let cases = [
            (Method::POST, "/v1/chat/completions", Route::Chat),
            (Method::POST, "/v1/chat/completions/", Route::Chat),
            (Method::POST, "/v1/completions", Route::Completions),
            (Method::POST, "/v1/responses", Route::Responses),
            (Method::POST, "/v1/messages", Route::Messages),
            (Method::GET, "/v1/chat/completions", Route::Other),
            (Method::POST, "/v1/chat/completions/extra", Route::Other),
            (Method::POST, "/v1/embeddings", Route::Other),
        ];
        for (m, p, r) in cases {
            assert_eq!(Route::classify(&m, p), r, "{m} {p}");
        }
    }
}
