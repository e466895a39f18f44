//! The request path, one phase per method, in the order [`Proxy::forward`] shows on one screen:
//! classify the route (`handle`) → decide (phase, target, and what the body needs, from the
//! headers alone) → prepare the body (collect it within the limits; synthesize, expand
//! placeholders, mark, ask for usage) → upstream request → send → response headers → observe
//! (stream back; time, count, log). A request body is collected only on an API route where a
//! step must read it before any of it goes (synthesis, a marker whose place or session the
//! first messages cannot settle: [`inmark`]) or when it came whole in its first chunk; any
//! other body on an API route flows upstream as it arrives ([`inflow`]), its marker spliced in
//! once its first messages are read, and the steps run at its end, on what was held back. The
//! body is parsed once: the first step that must read it parses it, and every step hands the
//! next the body's layout (`json::Layout`), moved over its own splice, so no step parses bytes
//! a step before already read; one that finds nothing to do copies nothing. Everything else
//! streams through. Never collects a response body.

pub mod exchange;
mod inflow;
mod inmark;
pub mod observe;
pub mod rewrite;
pub mod synthesize;
pub mod topology;
pub mod turn_timer;
pub mod usage;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Full};

use crate::api::{Route, Shape};
use crate::body::{full_body, Body, BoxError};
use crate::budget;
use crate::cachebust::{salt, Phase, Target};
use crate::conn::BodyTimeout;
use crate::error::ProxyError;
use crate::json::stream::{TopFacts, TopScan};
use crate::metrics::Metrics;
use crate::runtime::SharedState;
use crate::upstream::client::{Upstream, UpstreamClient};
use crate::upstream::headers;
use crate::upstream::pool::{self, Affinity, UpstreamBody};
use crate::upstream::transport::{Bounds, Transport};
use exchange::{collect_limited, reserve};
pub use exchange::{Downstream, InFlight};
use observe::{Observed, Observer};

pub struct Proxy {
    rt: Arc<SharedState>,
    transport: Transport,
    synth: Arc<synthesize::Synthesizer>,
    response_headers: ResponseHeaders,
}

/// Labels and facts carried from the request to its response.
struct Exchange {
    route: Route,
    /// Decided on API routes only; `None` elsewhere (label `none`).
    phase: Option<Phase>,
    target: Target,
    rid: Option<String>,
    /// The synthesized entry's trace timestamp (ms), when it has one.
    trace_timestamp: Option<String>,
    /// The synthesized conversation turn, for the `x-kvbust-synth-*` response headers.
    served: Option<topology::Served>,
    /// The access-log line in the making (`log.access`).
    log: Option<crate::access_log::Entry>,
    /// kvbust added `include_usage` (`observe.request_usage`): take it out of the response.
    strip_usage: bool,
    /// The client connection whose timer times the response's idle gaps (HTTP/1.1).
    idle_turn: Option<Arc<Downstream>>,
    /// Where the cache model's prediction meets the response's usage (API routes).
    ticket: Option<crate::cache_model::Ticket>,
    /// A client's `POST /reset_prefix_cache` or `/flush_cache`: when the upstream answers 2xx,
    /// the cache model forgets its index as the engine did.
    resets_cache: bool,
}

impl Exchange {
    fn phase_label(&self) -> &'static str {
        self.phase.map_or("none", Phase::as_str)
    }

    /// Phase, target and RID, as the access log takes them.
    fn log_labels(&mut self) -> crate::access_log::Labels {
        (self.phase_label(), self.target.as_str(), self.rid.take())
    }
}

/// What a request on an API route needs done to its body, decided from its headers alone.
struct BodyWork {
    shape: Shape,
    decision: rewrite::Decision,
    /// Synthesize the body (`x-kvbust-synth`).
    synth: bool,
    /// The dataset conversation the request names (`x-kvbust-synth-conversation`), decoded.
    conversation: Option<String>,
    /// Expand `{{kvbust:...}}` placeholders.
    placeholders: bool,
    /// Ask for `usage` on the client's behalf (`observe.request_usage`).
    usage: bool,
    /// The client's address: whose share of the placeholder queue its generations take.
    client: Option<std::net::IpAddr>,
    /// Hand the forwarded body to the cache model (`cache_model.enabled`).
    model: bool,
    /// The marker was placed as the body flowed ([`inmark`]): the steps at the end leave it.
    marked: bool,
    /// The body before that marker, for capture (which records the workload, not the busting).
    unmarked: Option<Bytes>,
}

impl BodyWork {
    fn needs_body(&self) -> bool {
        self.decision.needs_body()
            || self.decision.hit_ratio.is_some()
            || self.synth
            || self.placeholders
            || self.usage
            || self.model
    }

    /// The body must be read whole before any of it goes: synthesis, or the dial (which counts
    /// the whole prompt).
    fn collects(&self) -> bool {
        self.synth || self.decision.hit_ratio.is_some()
    }
}

/// A body that flows: the pump, the first chunk it read, and what the steps at its end need.
struct Flow {
    inflow: inflow::Inflow,
    first: Bytes,
    work: BodyWork,
    /// The client's headers, for the cache model's session hints.
    headers: http::HeaderMap,
}

/// The response header names, parsed once (`headers.response_*`, validated at start).
struct ResponseHeaders {
    rid: HeaderName,
    phase: HeaderName,
    overhead_us: HeaderName,
    trace_timestamp: HeaderName,
    synth_conversation: HeaderName,
    synth_turn: HeaderName,
    synth_spawn: HeaderName,
    synth_next_turn: HeaderName,
    synth_next_delay_ms: HeaderName,
    synth_next_after: HeaderName,
}

impl ResponseHeaders {
    fn new(names: &crate::config::HeaderNames) -> Self {
        // `Config::validate` checked every name; a name that still fails falls back to the
        // default, which is valid.
        let parse = |name: &str, default: &'static str| {
            HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|_| HeaderName::from_static(default))
        };
        Self {
            rid: parse(&names.response_rid, "x-kvbust-rid"),
            phase: parse(&names.response_phase, "x-kvbust-phase"),
            overhead_us: parse(&names.response_overhead_us, "x-kvbust-overhead-us"),
            trace_timestamp: parse(&names.response_trace_timestamp, "x-kvbust-trace-timestamp"),
            synth_conversation: parse(
                &names.response_synth_conversation,
                "x-kvbust-synth-conversation",
            ),
            synth_turn: parse(&names.response_synth_turn, "x-kvbust-synth-turn"),
            synth_spawn: parse(&names.response_synth_spawn, "x-kvbust-synth-spawn"),
            synth_next_turn: parse(&names.response_synth_next_turn, "x-kvbust-synth-next-turn"),
            synth_next_delay_ms: parse(
                &names.response_synth_next_delay_ms,
                "x-kvbust-synth-next-delay-ms",
            ),
            synth_next_after: parse(
                &names.response_synth_next_after,
                "x-kvbust-synth-next-after",
            ),
        }
    }
}

impl Proxy {
    /// One worker's proxy: `client` is that worker's pool; `synth` is shared by all workers.
    pub fn new(
        rt: Arc<SharedState>,
        upstream: Upstream,
        client: UpstreamClient,
        synth: Arc<synthesize::Synthesizer>,
        max_upstream: usize,
        sources: Arc<pool::SourceSlots>,
    ) -> Arc<Self> {
        Arc::new(Self {
            response_headers: ResponseHeaders::new(&rt.config.headers),
            transport: Transport::new(&rt.config.upstream, upstream, client, max_upstream, sources),
            rt,
            synth,
        })
    }

    pub fn metrics(&self) -> &Metrics {
        &self.rt.metrics
    }

    /// The semaphore of `ip`'s upstream slots (`upstream.max_connections_per_source`).
    pub fn source_slots(&self, ip: std::net::IpAddr) -> Option<Arc<tokio::sync::Semaphore>> {
        self.transport.source_slots(ip)
    }

    /// `upstream.max_connections_per_client`, for each new client connection (0: the HTTP/2
    /// streams a client connection is granted, `listen.http2_max_concurrent_streams`).
    pub fn max_upstream_per_client(&self) -> usize {
        let c = &self.rt.config;
        match c.upstream.max_connections_per_client {
            0 => c.listen.http2_max_concurrent_streams as usize,
            n => n,
        }
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
        let limits = self.rt.config.listen.body_deadlines();
        let req = req.map(|b| BodyTimeout::new(b, limits).boxed());
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
        let resets_cache = crate::upstream::reset::is_reset(req.method(), req.uri().path());
        let mut req = req;
        let log = crate::access_log::Entry::begin(
            &self.rt.config.log,
            &mut req,
            client.peer,
            route.label(),
        );
        let mut ex = Exchange {
            route,
            phase: None,
            target: Target::None,
            rid: None,
            trace_timestamp: None,
            served: None,
            log,
            strip_usage: false,
            idle_turn: None,
            ticket: None,
            resets_cache,
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
                if let Some(t) = ex.ticket.take() {
                    t.fail(err.status().as_u16(), side_of(err.fault()));
                }
                let code = err.code();
                let mut resp = err.into_response::<Full<Bytes>>();
                if let Some(log) = ex.log.take() {
                    log.failed(&mut resp, ex.log_labels(), code, start);
                }
                resp.map(|b| b.map_err(|never| match never {}).boxed())
            }
        };
        self.rt.metrics.count_request(
            [route.label(), ex.phase_label(), ex.target.as_str()],
            resp.status(),
        );
        resp
    }

    /// The phases of one request, in order; each is a method below with one job.
    async fn forward(
        &self,
        req: Request<Body>,
        client: &Arc<Downstream>,
        affinity: Option<&Affinity>,
        start: Instant,
        in_flight: InFlight,
        ex: &mut Exchange,
    ) -> Result<Response<Body>, ProxyError> {
        let (mut parts, body) = req.into_parts();
        if parts.method == http::Method::CONNECT {
            // A tunnel request: forwarded, the upstream would see `CONNECT /` and the client a
            // connection that ends with no status. Answered here, never sent on.
            return Err(ProxyError::MethodNotAllowed {
                method: parts.method.to_string(),
            });
        }
        // Buffered bytes held against limits.max_buffered_total until the upstream answers.
        let mut buffered = self.rt.bodies.reservation();
        rewrite::reject_unknown(&parts.headers, &self.rt.config.headers)?;
        if crate::upstream::loop_guard::seen(&parts.headers, &self.rt.via) {
            return Err(ProxyError::Loop {
                via: self.rt.via.clone(),
            });
        }
        let (body, flowing) = match self.decide(&parts, ex, client.peer.ip(), start)? {
            Some(work) => {
                self.prepare_body(work, &mut parts, body, ex, &mut buffered)
                    .await?
            }
            None => (body, None),
        };
        let req = self.upstream_request(parts, body, client)?;
        let overhead = start.elapsed();
        self.rt.metrics.overhead.observe(overhead.as_secs_f64());
        // An HTTP/2 client's stream (no connection of its own) takes one of its connection's
        // upstream slots; HTTP/1.1 requests come one at a time, so the connection's own timer
        // serves each in turn.
        let streams = affinity.is_none().then_some(&client.upstream_streams);
        let turn = affinity.is_some().then_some(&client.first_byte);
        let bounds = Bounds {
            streams,
            source: client.source.as_ref(),
        };
        let sent = self
            .transport
            .send(req, affinity, bounds, &self.rt.config.upstream);
        let resp = match flowing {
            None => self.first_byte_within(sent, turn, overhead).await?,
            Some(flow) => {
                // Boxed: inline, its state (the steps' futures among it) would grow every
                // request's future, which `handle` copies into its box, flowing or not.
                let refused = AtomicBool::new(false);
                let pump = Box::pin(self.pump(flow, ex, &mut buffered, &refused));
                self.send_flowing(sent, pump, turn, overhead, &refused)
                    .await?
            }
        };
        // The body went out with the request: its bytes are no longer held here.
        drop(buffered);
        let (mut parts, body) = resp.into_parts();
        let log = self.response_headers(&mut parts, ex, overhead);
        // HTTP/1.1: the response's idle gaps are timed on the connection's timer, in turn.
        ex.idle_turn = affinity.is_some().then(|| client.clone());
        Ok(self.observe(parts, body, ex, log, start, in_flight))
    }

    /// Decide: on an API route, the phase and target (into `ex`) and what the body needs, from
    /// the headers alone; `None` when the body goes through as it came.
    fn decide(
        &self,
        parts: &http::request::Parts,
        ex: &mut Exchange,
        client: std::net::IpAddr,
        start: Instant,
    ) -> Result<Option<BodyWork>, ProxyError> {
        let cfg = &self.rt.config;
        let Some(shape) = ex.route.shape() else {
            return Ok(None);
        };
        let control = rewrite::has_control_headers(&parts.headers, &cfg.headers);
        // The run is stamped at arrival: the request counts there whenever it is answered
        // and modelled, and the run's own warmup count decides an unmarked phase.
        let model = &self.rt.cache_model;
        let name = rewrite::run_name(&parts.headers, control, &self.rt)?;
        let run = model.runs().arrive(name, start);
        let asked = rewrite::decide(&parts.headers, control, &self.rt, &run)?;
        let salt_asked = asked.method;
        let mut decision = asked.for_shape(shape, &self.rt);
        if !matches!(shape, Shape::Chat | Shape::Completions)
            && decision.hit_ratio == cfg.cache_bust.hit_ratio
        {
            // The configured dial covers the routes it works on; a header asks for it here.
            decision.hit_ratio = None;
        }
        ex.phase = Some(decision.phase);
        ex.target = decision.target;
        let ticket = model.ticket(start, decision.phase, decision.target, run);
        if salt_asked != decision.method {
            ticket.salt_fallback();
        }
        if decision.method == crate::cachebust::Method::Salt && decision.needs_body() {
            ticket.salted();
        }
        if let Some(r) = decision.hit_ratio {
            if !matches!(shape, Shape::Chat | Shape::Completions) {
                return Err(ProxyError::bad_request(
                    "dial_unsupported",
                    format!(
                        "{}: the cache-hit dial works on /v1/chat/completions and \
                         /v1/completions only",
                        cfg.headers.hit_ratio
                    ),
                ));
            }
            ticket.dial(r);
        }
        ex.ticket = Some(ticket);
        let synth = synthesize::wants_synthesis(&parts.headers, control, parts.uri.path(), cfg)?;
        if synth && shape != Shape::Chat {
            return Err(ProxyError::bad_request(
                "synthesis_unsupported",
                format!("{} works on /v1/chat/completions only", cfg.headers.synth),
            ));
        }
        let conversation = synth_conversation(
            &parts.headers,
            synth,
            &cfg.headers,
            cfg.limits.control_header_len(),
        )?;
        let work = BodyWork {
            shape,
            decision,
            synth,
            conversation,
            placeholders: shape == Shape::Chat && cfg.synth.placeholders,
            usage: cfg.observe.request_usage && matches!(shape, Shape::Chat | Shape::Completions),
            client: Some(client),
            model: model.enabled(),
            marked: false,
            unmarked: None,
        };
        Ok(work.needs_body().then_some(work))
    }

    /// Prepare the body. One that came whole in its first chunk, or that a step must read
    /// before any of it goes (a marker, synthesis), is collected (within the limits) and run
    /// through the [`body_steps`]; a changed body gets its new `content-length`. Any other
    /// flows ([`inflow`]): the upstream request carries a piped body, and the returned [`Flow`]
    /// is the pump [`Proxy::pump`] runs while the request is sent.
    async fn prepare_body(
        &self,
        mut work: BodyWork,
        parts: &mut http::request::Parts,
        mut body: Body,
        ex: &mut Exchange,
        buffered: &mut budget::Reservation<'_>,
    ) -> Result<(Body, Option<Flow>), ProxyError> {
        let cfg = &self.rt.config;
        let limit = cfg.limits.max_body.as_u64();
        let first = exchange::first_chunk(&mut body, &parts.headers, limit).await?;
        let whole = first.as_ref().is_none_or(|_| body.is_end_stream());
        let scanned = !work.collects() && !work.decision.needs_body();
        if scanned && whole {
            let data = first.unwrap_or_default();
            return self.scan_whole(work, parts, data, ex, buffered).await;
        }
        // A marker that can be placed as the body flows lets a body still coming flow; one
        // that came whole is read the same way, unless it is small: that is parsed whole for
        // less than reading its first messages apart costs (the scan, the roles, a body of
        // their own; `benches/instructions.sh`, 1 KB: 78.2k instructions against 86.9k).
        const WHOLE_APART_FROM: usize = 16 << 10;
        let small = whole && first.as_ref().is_none_or(|b| b.len() < WHOLE_APART_FROM);
        let mark = (!scanned && !work.collects() && !small)
            .then(|| {
                let (d, shape, rt) = (&work.decision, work.shape, &self.rt);
                inmark::InMark::for_request(d, shape, &parts.headers, rt, whole)
            })
            .flatten();
        if whole {
            if let Some(m) = mark {
                let data = first.unwrap_or_default();
                return Box::pin(self.mark_whole(work, parts, data, m, ex, buffered)).await;
            }
        }
        if scanned || mark.is_some() {
            let first = first.unwrap_or_default();
            // A step may lengthen the body (a marker, usage, placeholders): then it goes
            // chunked; otherwise with the client's length.
            let may_grow = work.usage || work.placeholders || mark.is_some();
            if may_grow {
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            let len = (!may_grow)
                .then(|| exchange::declared_len(&parts.headers))
                .flatten();
            let (mut inflow, piped) = inflow::Inflow::new(body, limit, len);
            if let Some(m) = mark {
                inflow = inflow.with_mark(m);
            }
            let flow = Flow {
                inflow,
                first,
                work,
                headers: parts.headers.clone(),
            };
            return Ok((piped.boxed(), Some(flow)));
        }
        let original = collect_limited(first, body, &parts.headers, limit, buffered).await?;
        if let Some(log) = ex.log.as_mut() {
            log.bytes_in = Some(original.len() as u64);
        }
        // Boxed: the steps' state (synthesis among it) would otherwise size every request's
        // future, which `handle` copies into its box.
        let (bytes, changed) = Box::pin(body_steps(
            &self.rt,
            &self.synth,
            &mut work,
            &parts.headers,
            original,
            ex,
            buffered,
        ))
        .await?;
        stepped(parts, (bytes, changed), buffered)
    }

    /// A body with nothing to mark that came whole in one chunk: read by the scan, as a
    /// flowing one is, so the steps parse it only where the scan cannot settle an edit.
    async fn scan_whole(
        &self,
        mut work: BodyWork,
        parts: &mut http::request::Parts,
        data: Bytes,
        ex: &mut Exchange,
        buffered: &mut budget::Reservation<'_>,
    ) -> Result<(Body, Option<Flow>), ProxyError> {
        let facts = scanned(TopScan::default(), &data, ex, buffered)?;
        if !facts.may_edit(work.usage, work.placeholders) {
            if work.model {
                submit_to_model(&self.rt, &work, &parts.headers, (&data, None), None, ex);
            }
            return Ok((full_body(data), None));
        }
        // Boxed, as the pump is: the rare path's state stays out of every request's future.
        let edited =
            Box::pin(self.scanned_steps(&mut work, &parts.headers, &data, &facts, ex, buffered))
                .await?;
        let body = match edited {
            Some(bytes) => resized(parts, bytes),
            None => full_body(data),
        };
        Ok((body, None))
    }

    /// A body to mark that came whole in one chunk (16 KiB or more), when its marker can be
    /// placed as a flowing body's is: read the same way (the scan, then the engine on its first
    /// messages only), so what kvbust reads and validates of it does not depend on how it
    /// arrived.
    async fn mark_whole(
        &self,
        mut work: BodyWork,
        parts: &mut http::request::Parts,
        data: Bytes,
        mut mark: inmark::InMark,
        ex: &mut Exchange,
        buffered: &mut budget::Reservation<'_>,
    ) -> Result<(Body, Option<Flow>), ProxyError> {
        let facts = scanned(TopScan::reading_messages(), &data, ex, buffered)?;
        let edits = mark
            .after_chunk(&facts, std::slice::from_ref(&data))?
            .unwrap_or_default();
        mark.at_end();
        if *mark.stage() != inmark::Stage::Placed {
            // Not settled from its first messages: marked whole, as a collected body is.
            let (bytes, changed) = body_steps(
                &self.rt,
                &self.synth,
                &mut work,
                &parts.headers,
                data,
                ex,
                buffered,
            )
            .await?;
            return stepped(parts, (bytes, changed), buffered);
        }
        mark.check_end(&facts, || data.clone())?;
        ex.rid = mark.rid.take();
        work.marked = true;
        let max_body = self.rt.config.limits.max_body.as_u64();
        let output = inflow::edited(data.clone(), &edits);
        if output.len() as u64 > max_body {
            return Err(ProxyError::BodyTooLarge { limit: max_body });
        }
        if !edits.is_empty() {
            reserve(buffered, (data.len() + output.len()) as u64)?;
            if work.model && self.rt.cache_model.capturing() {
                work.unmarked = Some(data.clone());
            }
        }
        let facts = inflow::shifted(&facts, &edits);
        let mut changed = !edits.is_empty();
        let (output, facts) = match mark.salt.take() {
            Some(head) => {
                let (salted, facts) = salt_at_end(&head, &output, &facts, max_body)?;
                reserve(buffered, (data.len() + salted.len()) as u64)?;
                if work.model && self.rt.cache_model.capturing() {
                    work.unmarked = Some(data);
                }
                changed = true;
                (salted, facts)
            }
            None => (output, facts),
        };
        if !facts.may_edit(work.usage, work.placeholders) {
            if work.model {
                let unmarked = work.unmarked.take();
                submit_to_model(
                    &self.rt,
                    &work,
                    &parts.headers,
                    (&output, unmarked),
                    None,
                    ex,
                );
            }
        } else if let Some(bytes) =
            Box::pin(self.scanned_steps(&mut work, &parts.headers, &output, &facts, ex, buffered))
                .await?
        {
            return Ok((resized(parts, bytes), None));
        }
        Ok((
            if changed {
                resized(parts, output)
            } else {
                full_body(output)
            },
            None,
        ))
    }

    /// Runs a flowing body's pump to the body's end, then the steps a collected body gets on
    /// it, and sends what lies past what already went. `Ok` also when the upstream stopped
    /// reading: its own answer (or error) is what the exchange reports. `refused` is set when
    /// the end check failed a body a marker already went into: that error stands even against
    /// an answer the upstream gave early.
    async fn pump(
        &self,
        flow: Flow,
        ex: &mut Exchange,
        buffered: &mut budget::Reservation<'_>,
        refused: &AtomicBool,
    ) -> Result<(), ProxyError> {
        let Flow {
            inflow,
            first,
            mut work,
            headers,
        } = flow;
        let Ok(received) = inflow.run(first, buffered).await? else {
            return Ok(());
        };
        if let Some(log) = ex.log.as_mut() {
            log.bytes_in = Some(received.len() as u64);
        }
        if let Some(mark) = &received.mark {
            if *mark.stage() != inmark::Stage::Placed {
                // Not settled as it flowed: marked whole, as a collected body is.
                return Box::pin(self.collect_end(received, work, &headers, ex, buffered)).await;
            }
            if let Err(e) = mark.check_end(&received.received_facts, || received.whole()) {
                refused.store(true, Ordering::Release);
                return Err(e);
            }
            ex.rid = mark.rid.clone();
            work.marked = true;
            if work.model && self.rt.cache_model.capturing() && !received.unedited() {
                work.unmarked = Some(received.whole());
            }
            if let Some(head) = mark.salt.clone() {
                return Box::pin(self.salt_end(received, &head, work, &headers, ex, buffered))
                    .await;
            }
        }
        if received.facts.may_edit(work.usage, work.placeholders) {
            let whole = received.output();
            let facts = received.facts.clone();
            let edited = self
                .scanned_steps(&mut work, &headers, &whole, &facts, ex, buffered)
                .await?;
            return received.send_edited(&whole, edited.as_ref()).await;
        }
        // Nothing to edit: the held bytes go first, the cache model's copy after, and only when
        // its queue has room: a body that came in chunks, or was marked, is copied whole for it.
        let _ = received.send_held().await;
        if work.model {
            let unmarked = work.unmarked.take();
            let size = received.len() + unmarked.as_ref().map_or(0, Bytes::len);
            if self.rt.cache_model.has_room(size as u64) {
                let whole = received.output();
                submit_to_model(&self.rt, &work, &headers, (&whole, unmarked), None, ex);
            } else if let Some(ticket) = &ex.ticket {
                self.rt.cache_model.refuse_full(ticket);
            }
        }
        Ok(())
    }

    /// The end of a flowing body isolated by `cache_salt` (`cache_bust.method = "salt"`): the
    /// salt `head` goes into the body's `cache_salt` where the scan held the body back (its
    /// close, or the client's own salt), then the steps a scanned body gets; what went already is
    /// the client's bytes, unchanged.
    async fn salt_end(
        &self,
        received: inflow::Received,
        head: &str,
        mut work: BodyWork,
        headers: &http::HeaderMap,
        ex: &mut Exchange,
        buffered: &mut budget::Reservation<'_>,
    ) -> Result<(), ProxyError> {
        let base = received.output();
        let max_body = self.rt.config.limits.max_body.as_u64();
        let (salted, facts) = salt_at_end(head, &base, &received.facts, max_body)?;
        reserve(buffered, (base.len() + salted.len()) as u64)?;
        if work.model && self.rt.cache_model.capturing() {
            work.unmarked = Some(received.whole());
        }
        if facts.may_edit(work.usage, work.placeholders) {
            let edited = self
                .scanned_steps(&mut work, headers, &salted, &facts, ex, buffered)
                .await?;
            let out = edited.unwrap_or(salted);
            return received.send_edited(&base, Some(&out)).await;
        }
        received.send_edited(&base, Some(&salted)).await?;
        if work.model {
            let unmarked = work.unmarked.take();
            submit_to_model(&self.rt, &work, headers, (&salted, unmarked), None, ex);
        }
        Ok(())
    }

    /// The end of a flowing body whose marker could not be placed as it flowed: the steps a
    /// collected body gets, marking among them, on the whole body; nothing they may edit went.
    async fn collect_end(
        &self,
        received: inflow::Received,
        mut work: BodyWork,
        headers: &http::HeaderMap,
        ex: &mut Exchange,
        buffered: &mut budget::Reservation<'_>,
    ) -> Result<(), ProxyError> {
        let whole = received.whole();
        let (bytes, changed) = body_steps(
            &self.rt,
            &self.synth,
            &mut work,
            headers,
            whole.clone(),
            ex,
            buffered,
        )
        .await?;
        if changed {
            reserve(buffered, (whole.len() + bytes.len()) as u64)?;
        }
        received
            .send_edited(&whole, changed.then_some(&bytes))
            .await
    }

    /// The steps at the end of a body read by the scan (flowing, or whole in one chunk), when
    /// [`TopFacts::may_edit`]: what the scan could not settle (a placeholder, a body it could
    /// not follow) goes through the [`body_steps`] as a collected body; otherwise the usage step
    /// reads only the scan's layout. Hands the body to the cache model. `Some`: the new body.
    async fn scanned_steps(
        &self,
        work: &mut BodyWork,
        headers: &http::HeaderMap,
        whole: &Bytes,
        facts: &TopFacts,
        ex: &mut Exchange,
        buffered: &mut budget::Reservation<'_>,
    ) -> Result<Option<Bytes>, ProxyError> {
        if (work.placeholders && facts.placeholder.is_some()) || facts.doubtful {
            let (bytes, changed) = body_steps(
                &self.rt,
                &self.synth,
                work,
                headers,
                whole.clone(),
                ex,
                buffered,
            )
            .await?;
            if changed {
                reserve(buffered, (whole.len() + bytes.len()) as u64)?;
            }
            return Ok(changed.then_some(bytes));
        }
        if work.model {
            let unmarked = work.unmarked.take();
            submit_to_model(&self.rt, work, headers, (whole, unmarked), None, ex);
        }
        let edited = facts
            .usage_layout()
            .and_then(|l| usage::add_include_usage_at(whole, &l))
            .map(Bytes::from);
        if let Some(b) = &edited {
            ex.strip_usage = true;
            reserve(buffered, (whole.len() + b.len()) as u64)?;
        }
        Ok(edited)
    }

    /// Sends a request whose body is still flowing: its response waits for the pump; the
    /// upstream's first-byte window opens once the body is sent, so a slow client is not the
    /// upstream's timeout. An upstream that answers before the body ended gets the rest of it
    /// too, then its answer goes to the client.
    async fn send_flowing<S, P>(
        &self,
        sent: S,
        pump: P,
        turn: Option<&turn_timer::TurnTimer>,
        overhead: std::time::Duration,
        refused: &AtomicBool,
    ) -> Result<Response<UpstreamBody>, ProxyError>
    where
        S: Future<Output = Result<Response<UpstreamBody>, ProxyError>>,
        P: Future<Output = Result<(), ProxyError>>,
    {
        tokio::pin!(sent, pump);
        let early = tokio::select! {
            biased;
            pumped = &mut pump => {
                pumped?;
                None
            }
            resp = &mut sent => Some(resp),
        };
        match early {
            Some(resp) => {
                // Answered before the body ended (nginx's `return`, an auth error): the rest
                // still goes, so the client's connection and the upstream's stay usable, as
                // nginx does; an upstream that stops reading holds it `upstream.idle_timeout` at
                // most. What the pump then finds wrong is moot: the answer stands, unless a
                // marker went into a body whose end the check refused (the upstream may read
                // another `messages` than the one marked): that request fails.
                let idle = self.rt.config.upstream.idle_timeout;
                if let Ok(Err(e)) = tokio::time::timeout(idle, pump).await {
                    if refused.load(Ordering::Acquire) {
                        return Err(e);
                    }
                }
                resp
            }
            None => self.first_byte_within(sent, turn, overhead).await,
        }
    }

    /// The upstream request: the target in the form the connection wants, the forwarded
    /// headers (hop-by-hop and control headers out, `x-forwarded-*` in), HTTP/1.1 semantics
    /// (the client picks the wire version per connection: ALPN or prior knowledge).
    fn upstream_request(
        &self,
        mut parts: http::request::Parts,
        body: Body,
        client: &Downstream,
    ) -> Result<Request<Body>, ProxyError> {
        let cfg = &self.rt.config;
        if cfg.upstream.keep_host && !parts.headers.contains_key(header::HOST) {
            // An HTTP/2 client names the host in `:authority`, which the new URI drops.
            if let Some(host) = parts.uri.authority().map(|a| a.as_str()) {
                if let Ok(v) = HeaderValue::from_str(host) {
                    parts.headers.insert(header::HOST, v);
                }
            }
        }
        parts.uri = self.transport.target(parts.uri.path_and_query())?;
        headers::upstream_request_headers(
            &mut parts.headers,
            client.peer,
            client.tls,
            cfg.upstream.keep_host,
            &cfg.headers.control(),
        );
        crate::upstream::loop_guard::add(&mut parts.headers, &self.rt.via);
        parts.version = http::Version::HTTP_11;
        Ok(Request::from_parts(parts, body))
    }

    /// The upstream's answer to `sent`, with the response headers due within
    /// `upstream.first_byte_timeout` and within what is left of `upstream.total_timeout` after
    /// kvbust's own `overhead`.
    async fn first_byte_within<S>(
        &self,
        sent: S,
        turn: Option<&turn_timer::TurnTimer>,
        overhead: std::time::Duration,
    ) -> Result<Response<UpstreamBody>, ProxyError>
    where
        S: Future<Output = Result<Response<UpstreamBody>, ProxyError>>,
    {
        let cfg = &self.rt.config.upstream;
        let (timeout, stage, after) = match cfg.total_timeout {
            Some(total) if total.saturating_sub(overhead) < cfg.first_byte_timeout => (
                total.saturating_sub(overhead),
                "respond (upstream.total_timeout)",
                total,
            ),
            _ => (
                cfg.first_byte_timeout,
                "send response headers",
                cfg.first_byte_timeout,
            ),
        };
        let timed_out = match turn {
            Some(timer) => {
                let deadline = tokio::time::Instant::now() + timeout;
                timer.timeout_at(deadline, sent).await.map_err(|_| ())
            }
            None => tokio::time::timeout(timeout, sent).await.map_err(|_| ()),
        };
        match timed_out {
            Err(()) => Err(ProxyError::UpstreamTimeout { stage, after }),
            Ok(result) => result,
        }
    }

    /// Response headers: hop-by-hop ones out; the request id, and on API routes the RID, phase
    /// and overhead (`cache_bust.response_headers`) and a trace entry's timestamp, in. Returns
    /// the access-log entry, now knowing the upstream's answer.
    fn response_headers(
        &self,
        parts: &mut http::response::Parts,
        ex: &mut Exchange,
        overhead: std::time::Duration,
    ) -> Option<crate::access_log::Entry> {
        headers::strip_hop_by_hop(&mut parts.headers);
        let labels = (ex.phase_label(), ex.target.as_str(), ex.rid.clone());
        let log = ex.log.take().map(|log| log.responded(parts, labels));
        let names = &self.response_headers;
        let h = &mut parts.headers;
        if ex.route != Route::Other && self.rt.config.cache_bust.response_headers {
            // Digests are hex and phases are fixed words, so these are always valid values.
            let rid = match ex.rid.as_deref() {
                Some(rid) => HeaderValue::from_str(rid).ok(),
                None => Some(HeaderValue::from_static("none")),
            };
            if let Some(v) = rid {
                h.insert(names.rid.clone(), v);
            }
            h.insert(
                names.phase.clone(),
                HeaderValue::from_static(ex.phase_label()),
            );
            h.insert(
                names.overhead_us.clone(),
                HeaderValue::from(overhead.as_micros() as u64),
            );
        }
        // The trace's schedule, for a client that wants to follow it (a number: a valid value).
        if let Some(v) = ex.trace_timestamp.as_deref() {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.insert(names.trace_timestamp.clone(), v);
            }
        }
        if let Some(s) = ex.served.take() {
            synth_headers(h, names, s);
        }
        log
    }

    /// Observe: the response body streams back through the observer, which times it, reads
    /// its usage, keeps the request in flight until it ends, and writes the access line.
    fn observe(
        &self,
        parts: http::response::Parts,
        body: UpstreamBody,
        ex: &mut Exchange,
        log: Option<crate::access_log::Entry>,
        start: Instant,
        in_flight: InFlight,
    ) -> Response<Body> {
        let cfg = &self.rt.config;
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let labels = observe::Labels {
            route: ex.route,
            phase: ex.phase_label(),
            target: ex.target.as_str(),
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
        .logging(log)
        .meeting(
            parts
                .status
                .is_success()
                .then(|| ex.ticket.take())
                .flatten(),
        );
        if ex.resets_cache && parts.status.is_success() {
            self.rt.cache_model.cache_reset("forwarded");
        }
        if let Some(t) = ex.ticket.take() {
            // The upstream answered with an error: the run counts it as one, by whose fault.
            let side = if parts.status.is_client_error() {
                crate::cache_model::Side::Client
            } else {
                crate::cache_model::Side::Upstream
            };
            t.fail(parts.status.as_u16(), side);
        }
        let body = Observed::with_idle_timer(
            body,
            cfg.upstream.idle_timeout,
            cfg.upstream.total_timeout.map(|t| (t, start)),
            observer,
            ex.idle_turn.take(),
        )
        .stripping_usage(ex.strip_usage)
        .boxed();
        Response::from_parts(parts, body)
    }
}

/// A changed body, whole, with its new `content-length`.
fn resized(parts: &mut http::request::Parts, bytes: Bytes) -> Body {
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    full_body(bytes)
}

/// The conversation a synthetic request names (`headers.synth_conversation`), percent-decoded;
/// a 400 when it cannot be decoded or the request is not synthetic (it would be ignored).
fn synth_conversation(
    headers: &http::HeaderMap,
    synth: bool,
    names: &crate::config::HeaderNames,
    limit: usize,
) -> Result<Option<String>, ProxyError> {
    let name = names.synth_conversation.as_str();
    // Held to limits.max_control_header like every other control header (400 header_too_long).
    let Some(v) = rewrite::header(headers, name, limit)? else {
        return Ok(None);
    };
    if !synth {
        return Err(ProxyError::bad_request(
            "invalid_header",
            format!(
                "{name} names a conversation of the synthetic dataset: send it with {}: 1",
                names.synth
            ),
        ));
    }
    match topology::decode_id(v.as_bytes()) {
        Some(id) if !id.is_empty() => Ok(Some(id)),
        _ => Err(ProxyError::bad_request(
            "invalid_header",
            format!(
                "{name} must be a conversation id, percent-encoded as the response headers \
                 spell it: `{}`",
                crate::error::excerpt(v.as_bytes())
            ),
        )),
    }
}

/// The `x-kvbust-synth-*` response headers for the turn served (ids are percent-encoded and
/// numbers are ASCII, so every value is valid; one that is not is left out).
fn synth_headers(h: &mut http::HeaderMap, names: &ResponseHeaders, s: topology::Served) {
    let mut set = |name: &HeaderName, v: String| {
        if let Ok(v) = HeaderValue::try_from(v) {
            h.insert(name.clone(), v);
        }
    };
    let next_turn = s.next_turn();
    set(&names.synth_conversation, s.conversation);
    set(&names.synth_turn, s.turn.to_string());
    if let Some(spawn) = s.spawn {
        set(&names.synth_spawn, spawn);
    }
    set(&names.synth_next_turn, next_turn);
    if let Some(next) = s.next {
        set(&names.synth_next_delay_ms, next.delay_ms);
        if let Some(after) = next.after {
            set(&names.synth_next_after, after);
        }
    }
}

/// A body read whole by `scan`: charged to the buffered budget, counted in the access line,
/// and what the scan saw of it.
fn scanned(
    mut scan: TopScan,
    data: &Bytes,
    ex: &mut Exchange,
    buffered: &mut budget::Reservation<'_>,
) -> Result<TopFacts, ProxyError> {
    reserve(buffered, data.len() as u64)?;
    if let Some(log) = ex.log.as_mut() {
        log.bytes_in = Some(data.len() as u64);
    }
    scan.feed(data);
    Ok(scan.finish().clone())
}

/// `body` (read by the scan as `facts`, in its own offsets) with the salt `head` in its
/// `cache_salt` (the client's own kept as the tail), and the facts moved over that edit. A body
/// the scan could not follow is read whole for it. A salt past vLLM's limits is a 400; a body
/// past `max_body` a 413.
fn salt_at_end(
    head: &str,
    body: &Bytes,
    facts: &TopFacts,
    max_body: u64,
) -> Result<(Bytes, TopFacts), ProxyError> {
    let spot = match facts.close {
        Some(close) if !facts.doubtful => (facts.salt.clone(), close, facts.members),
        _ => {
            let top = crate::json::top_object(body).map_err(|e| {
                ProxyError::bad_request(
                    "invalid_body",
                    format!("cannot set the body's cache_salt: {e}"),
                )
            })?;
            let l = crate::json::Layout::of(body, &top)
                .ok_or_else(|| ProxyError::Internal("a body's layout lies outside it".into()))?;
            (l.get("cache_salt"), l.close(), l.members())
        }
    };
    let (range, bytes, _) =
        salt::edit(body, spot.0, spot.1, spot.2, head).map_err(rewrite::salt_error)?;
    if (body.len() + bytes.len()) as u64 > max_body {
        return Err(ProxyError::BodyTooLarge { limit: max_body });
    }
    let added = range.is_empty();
    let edits = [(range, Bytes::from(bytes))];
    let out = inflow::edited(body.clone(), &edits);
    let mut facts = inflow::shifted(facts, &edits);
    if added {
        facts.members += 1;
    }
    Ok((out, facts))
}

/// The body [`body_steps`] left: as it came, or changed (its new length declared, its bytes
/// charged).
fn stepped(
    parts: &mut http::request::Parts,
    (bytes, changed): (Bytes, bool),
    buffered: &mut budget::Reservation<'_>,
) -> Result<(Body, Option<Flow>), ProxyError> {
    if !changed {
        return Ok((full_body(bytes), None));
    }
    reserve(buffered, bytes.len() as u64)?;
    Ok((resized(parts, bytes), None))
}

/// The body steps on a collected body, in order: synthesize, expand placeholders, mark, ask for
/// usage. The first step that reads the body parses it, once; it and every step after hand the
/// next one the body's layout (`json::Layout`, moved over their own splices), so no step parses what one
/// before already read. Returns the body to send and whether it changed.
async fn body_steps(
    rt: &SharedState,
    synth: &synthesize::Synthesizer,
    work: &mut BodyWork,
    headers: &http::HeaderMap,
    mut bytes: Bytes,
    ex: &mut Exchange,
    buffered: &mut budget::Reservation<'_>,
) -> Result<(Bytes, bool), ProxyError> {
    let cfg = &rt.config;
    let mut layout = None;
    let mut changed = false;
    let mut session = None;
    if work.synth {
        let limit = cfg.limits.control_header_len();
        let sources = &cfg.cache_bust.session_sources;
        let key = rewrite::header_session_key(sources, headers, &cfg.headers, limit)?;
        let named = work.conversation.as_deref().map(|id| synthesize::Named {
            id,
            header: &cfg.headers.synth_conversation,
        });
        let filled = synth.fill(&bytes, key.as_deref(), named).await?;
        // AIPerf's placement: first-turn targets skip the user-context message.
        work.decision.user_context_messages = filled.user_context_messages;
        session = Some(key.unwrap_or(filled.session_id));
        ex.trace_timestamp = filled.trace_timestamp;
        ex.served = Some(filled.served);
        layout = filled.layout;
        bytes = Bytes::from(filled.body);
        changed = true;
    }
    if work.placeholders {
        if let Some(b) = synth.expand_from(&bytes, &mut layout, work.client).await? {
            bytes = Bytes::from(b);
            changed = true;
        }
    }
    // Capture records the workload, not kvbust's busting: the body before its marker.
    let mut workload = work.unmarked.take();
    if work.decision.needs_body() && !work.marked {
        let before = (work.model && rt.cache_model.capturing()).then(|| bytes.clone());
        let (d, shape, session) = (&work.decision, work.shape, session.as_deref());
        let out = rewrite::apply_laid_out(
            d,
            shape,
            &bytes,
            (headers, rt, session),
            &mut layout,
            Some(buffered),
        )?;
        ex.rid = out.rid;
        if let Some(b) = out.body {
            workload = before;
            bytes = b;
            changed = true;
            // The body it was built from is gone: only the marked one is held now.
            buffered.shrink_to(bytes.len() as u64);
        }
    }
    if let Some(ratio) = work.decision.hit_ratio {
        if let Some(b) = dialled(rt, work.shape, &bytes, ratio).await? {
            if let Some(l) = layout.as_mut() {
                l.shift(&[b.1]);
            }
            if rt.cache_model.capturing() {
                workload = workload.or_else(|| Some(bytes.clone()));
            }
            bytes = b.0;
            changed = true;
        }
    }
    if work.model {
        submit_to_model(rt, work, headers, (&bytes, workload), session, ex);
    }
    if work.usage {
        let added = match &layout {
            Some(l) => usage::add_include_usage_at(&bytes, l),
            None => usage::add_include_usage(&bytes),
        };
        if let Some(b) = added {
            bytes = Bytes::from(b);
            changed = true;
            ex.strip_usage = true;
        }
    }
    Ok((bytes, changed))
}

/// The body with the cache-hit dial's marker placed for `ratio` ([`crate::cache_model::dial`]),
/// counted off the async threads; `None` when nothing is capped. The edit made comes along, for
/// the layout.
async fn dialled(
    rt: &SharedState,
    shape: Shape,
    body: &Bytes,
    ratio: f64,
) -> Result<Option<(Bytes, (std::ops::Range<usize>, Vec<u8>))>, ProxyError> {
    let dialer = rt.cache_model.dialer().map_err(ProxyError::Internal)?;
    let marker = format!("[dial:{:016x}]", rand::random::<u64>());
    let data = body.clone();
    let placed = tokio::task::spawn_blocking(move || dialer.place(shape, &data, ratio, &marker))
        .await
        .map_err(|e| ProxyError::Internal(format!("the dial's count failed: {e}")))?
        .map_err(|e| ProxyError::bad_request("dial_unplaceable", e.to_string()))?;
    let Some(p) = placed else {
        return Ok(None);
    };
    let mut edits = [p.edit.clone()];
    let out = crate::json::splice(body, &mut edits)
        .ok_or_else(|| ProxyError::Internal("the dial's marker does not fit the body".into()))?;
    Ok(Some((Bytes::from(out), p.edit)))
}

/// Hands the body as it will be forwarded (marked; `include_usage` is not part of the prompt) to
/// the cache model, with what it needs to attribute the request. Never waits.
fn submit_to_model(
    rt: &SharedState,
    work: &BodyWork,
    headers: &http::HeaderMap,
    (bytes, workload): (&Bytes, Option<Bytes>),
    session: Option<String>,
    ex: &Exchange,
) {
    let Some(ticket) = ex.ticket.clone() else {
        return;
    };
    let d = &work.decision;
    use crate::cache_model::tokens::IsoHint;
    let marker = match (&ex.rid, d.target.is_warmup_isolation() && d.needs_body()) {
        (Some(rid), _) => Some(IsoHint::rid(rid)),
        (None, true) => Some(IsoHint::warmup()),
        (None, false) => None,
    };
    let cfg = &rt.config;
    let session = crate::cache_model::SessionHint {
        known: session.map(|k| {
            let digest = crate::cache_model::session_digest(&k);
            (digest, "synthesized_conversation")
        }),
        sources: rewrite::session_hint(
            &cfg.cache_bust.session_sources,
            headers,
            &cfg.headers,
            cfg.limits.control_header_len(),
        ),
    };
    rt.cache_model.submit(crate::cache_model::Job {
        shape: work.shape,
        body: bytes.clone(),
        phase: d.phase,
        target: d.target,
        marker,
        user_context_messages: d.user_context_messages,
        session,
        ticket,
        workload,
    });
}

/// The run report's side of a fault.
fn side_of(fault: crate::error::Fault) -> crate::cache_model::Side {
    match fault {
        crate::error::Fault::Client => crate::cache_model::Side::Client,
        crate::error::Fault::Upstream => crate::cache_model::Side::Upstream,
        crate::error::Fault::Internal => crate::cache_model::Side::Kvbust,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn routes_are_post_only_and_exact() {
        let cases = [
            (
                Method::POST,
                "/v1/chat/completions",
                Route::Api(Shape::Chat),
            ),
            (
                Method::POST,
                "/v1/chat/completions/",
                Route::Api(Shape::Chat),
            ),
            (
                Method::POST,
                "/v1/completions",
                Route::Api(Shape::Completions),
            ),
            (Method::POST, "/v1/responses", Route::Api(Shape::Responses)),
            (Method::POST, "/v1/messages", Route::Api(Shape::Messages)),
            (Method::GET, "/v1/chat/completions", Route::Other),
            (Method::POST, "/v1/chat/completions/extra", Route::Other),
            (Method::POST, "/v1/embeddings", Route::Other),
            // Routed as the engine routes them: percent-decoded (issue 42, 6).
            (
                Method::POST,
                "/v1/chat%2Fcompletions",
                Route::Api(Shape::Chat),
            ),
            (
                Method::POST,
                "/v1/chat%2fcompletions/",
                Route::Api(Shape::Chat),
            ),
            (
                Method::POST,
                "/v1/%63ompletions",
                Route::Api(Shape::Completions),
            ),
            (Method::POST, "/v1/chat%2Xcompletions", Route::Other),
            (Method::POST, "/v1/chat%2", Route::Other),
        ];
        for (m, p, r) in cases {
            assert_eq!(Route::classify(&m, p), r, "{m} {p}");
        }
    }

    /// One mix of body steps: what the request asks for.
    struct Steps {
        synth: bool,
        /// `Some(at)`: a placeholder in the body, in message `content` or in `model`.
        placeholder: Option<&'static str>,
        /// The client's body has no `messages` (nor `max_tokens`): synthesis adds them.
        bare: bool,
        /// Synthesis replays a trace's verbatim `messages`.
        trace: bool,
        /// Synthesis serves an agentic (Weka) trace's turn: context and model written.
        agentic: bool,
        mark: bool,
        usage: bool,
    }

    impl Steps {
        fn from_words(words: &str) -> Steps {
            let has = |w: &str| words.split(' ').any(|x| x == w);
            Steps {
                synth: has("synth"),
                placeholder: match (has("placeholder"), has("placeholder-text")) {
                    (true, _) => Some("content"),
                    (_, true) => Some("model"),
                    _ => None,
                },
                bare: has("bare"),
                trace: has("trace"),
                agentic: has("agentic"),
                mark: has("mark"),
                usage: has("usage"),
            }
        }
    }

    /// Each mix of steps, and how many parses of a whole body (passes of serde_json over it) it
    /// takes. Before the steps shared a layout: usage 2, mark + usage 3, placeholder + mark +
    /// usage 4, synth 2, synth + mark + usage 5. `placeholder-text`: `{{kvbust:` outside message
    /// content, which the scan must parse the body to tell.
    const STEPS: &[(&str, usize)] = &[
        ("", 0),
        ("usage", 1),
        ("mark", 1),
        ("mark usage", 1),
        ("placeholder", 1),
        ("placeholder mark usage", 1),
        ("placeholder-text mark usage", 1),
        ("synth", 1),
        ("synth usage", 1),
        ("synth mark usage", 1),
        ("synth bare mark usage", 1),
        ("synth trace mark usage", 1),
        ("synth agentic mark usage", 1),
        ("synth placeholder-text mark usage", 1),
    ];

    fn trace_path() -> std::path::PathBuf {
        crate::test_support::test_dir().join("parse-once-trace.jsonl")
    }

    /// A folder holding one Weka trace (agentic_traces.json's compaction case).
    fn weka_dir() -> std::path::PathBuf {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/synth/agentic_traces.json");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        let dir = crate::test_support::test_dir().join("parse-once-weka");
        std::fs::create_dir_all(&dir).unwrap();
        let trace = &v["cases"]["weka_compaction"]["input"]["files"]["trace-d.json"];
        std::fs::write(dir.join("trace-d.json"), trace.to_string()).unwrap();
        dir
    }

    fn runtime(s: &Steps) -> (Arc<SharedState>, Arc<synthesize::Synthesizer>) {
        let mut c = crate::config::Config::default();
        c.cache_bust.benchmark_id = Some("0123456789ab".into());
        c.cache_bust.target = if s.mark {
            Target::FirstTurnPrefix
        } else {
            Target::None
        };
        c.observe.request_usage = s.usage;
        c.synth.placeholder_seed = Some(5);
        let trace = s.trace.then(|| {
            let line = r#"{"timestamp":1,"messages":[{"role":"system","content":"T"},{"role":"user","content":[{"type":"text","text":"q"}]}],"output_length":4}"#;
            std::fs::write(trace_path(), format!("{line}\n")).unwrap();
            trace_path()
        });
        let params = match trace {
            _ if s.agentic => crate::synth::SynthParams {
                input_file: Some(weka_dir()),
                custom_dataset_type: Some(crate::synth::dataset::trace_kind::TraceKind::WekaTrace),
                random_seed: Some(3),
                ..crate::synth::SynthParams::default()
            },
            Some(path) => crate::synth::SynthParams {
                input_file: Some(path),
                random_seed: Some(3),
                ..crate::synth::SynthParams::default()
            },
            None => crate::synth::SynthParams {
                isl: Some(40),
                osl: Some(9),
                num_dataset_entries: Some(2),
                random_seed: Some(3),
                shared_system_prompt_length: Some(20),
                user_context_prompt_length: Some(10),
                ..crate::synth::SynthParams::default()
            },
        };
        c.synth.dataset = Some(params);
        let synth = synthesize::Synthesizer::new(c.synth.clone(), c.cache_bust.target);
        (SharedState::new(Arc::new(c), Metrics::new()), synth)
    }

    fn body(s: &Steps) -> String {
        let p = "{{kvbust:prompt:3:random}}";
        let (model, content) = match s.placeholder {
            Some("content") => ("m", format!("hi {p}")),
            Some(_) => (p, "hi".to_string()),
            None => ("m", "hi".to_string()),
        };
        if s.bare {
            return format!(r#"{{"model":"{model}","stream":true,"user":"u1"}}"#);
        }
        format!(
            r#"{{"model":"{model}", "messages":[{{"role":"system","content":"S"}},{{"role":"assistant","content":"a"}},{{"role":"user","content":"{content}"}}],"stream":true,"max_tokens":5,"user":"u1"}}"#
        )
    }

    /// The same steps the way they ran before the layout: each on the bytes alone.
    async fn each_step_alone(s: &Steps, headers: &http::HeaderMap) -> Vec<u8> {
        let (rt, synth) = runtime(s);
        let mut bytes = Bytes::from(body(s));
        let mut d = rewrite::decide(headers, false, &rt, &rt.cache_model.runs().current()).unwrap();
        let mut session = None;
        if s.synth {
            let filled = synth.fill(&bytes, None, None).await.unwrap();
            d.user_context_messages = filled.user_context_messages;
            session = Some(filled.session_id);
            bytes = Bytes::from(filled.body);
        }
        if let Some(b) = synth.expand(&bytes).await.unwrap() {
            bytes = Bytes::from(b);
        }
        if d.needs_body() {
            let out = rewrite::apply(&d, Shape::Chat, &bytes, headers, &rt, session.as_deref());
            if let Some(b) = out.unwrap().body {
                bytes = b;
            }
        }
        if s.usage {
            if let Some(b) = usage::add_include_usage(&bytes) {
                bytes = Bytes::from(b);
            }
        }
        bytes.to_vec()
    }

    /// Each mix of steps parses the client's body once at most (synthesis's own body: never),
    /// and makes the very bytes the steps make each on its own, parsing as it goes.
    #[tokio::test]
    async fn a_body_is_parsed_once_whatever_the_steps() {
        let headers = http::HeaderMap::new();
        for (name, want) in STEPS {
            let s = &Steps::from_words(name);
            let (rt, synth) = runtime(s);
            let decision =
                rewrite::decide(&headers, false, &rt, &rt.cache_model.runs().current()).unwrap();
            let mut work = BodyWork {
                shape: Shape::Chat,
                decision,
                synth: s.synth,
                conversation: None,
                placeholders: true,
                usage: s.usage,
                client: None,
                model: false,
                marked: false,
                unmarked: None,
            };
            let mut ex = Exchange {
                route: Route::Api(Shape::Chat),
                phase: None,
                target: Target::None,
                rid: None,
                trace_timestamp: None,
                served: None,
                log: None,
                strip_usage: false,
                idle_turn: None,
                ticket: None,
                resets_cache: false,
            };
            let client = Bytes::from(body(s));
            let before = crate::json::body_parses();
            let (out, changed) = body_steps(
                &rt,
                &synth,
                &mut work,
                &headers,
                client.clone(),
                &mut ex,
                &mut rt.bodies.reservation(),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let parses = crate::json::body_parses() - before;
            assert_eq!(parses, *want, "{name}");
            assert_eq!(changed, out != client, "{name}");
            let want = each_step_alone(s, &headers).await;
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&want),
                "{name}"
            );
            assert_eq!(ex.strip_usage, s.usage, "{name}");
            assert_eq!(ex.rid.is_some(), s.mark, "{name}");
        }
        std::fs::remove_file(trace_path()).unwrap();
        std::fs::remove_dir_all(weka_dir()).unwrap();
    }
}
