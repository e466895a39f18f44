//! What makes the mock behave like an inference engine (issue 31, llm-d-inference-sim being the
//! reference users know): the served model names, the running and waiting requests with the
//! `mock.max_num_seqs` queue, the load-dependent prefill, the delay jitter, failure injection and
//! the `vllm:`-named metrics. Every knob is off by default, and then it changes no output.
//! Owns the draws and the counts; never parses a request body and never writes a response's
//! content (the mock's handler does both).

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use rand::{Rng, SeedableRng};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::config::{FailureKind, MockConfig};
use super::request::ApiError;

/// At most this many distinct unknown model names are remembered (and logged once each):
/// clients choose the names, so the set must not grow without bound.
const MAX_SEEN_MODELS: usize = 1024;

/// vLLM's buckets for `vllm:time_to_first_token_seconds`.
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// The metrics a vLLM engine exports under these names, labelled `model_name` as vLLM does.
/// Counters carry the `_total` suffix vLLM's Prometheus client adds to them.
struct EngineMetrics {
    registry: Registry,
    queries: IntCounterVec,
    hits: IntCounterVec,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    ttft: HistogramVec,
}

impl EngineMetrics {
    #[allow(clippy::expect_used)] // fixed, valid names and labels: registering them cannot fail
    fn new() -> Self {
        let registry = Registry::new();
        let labels = &["model_name"];
        let counter = |name: &str, help: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("registered once");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
            registry
                .register(Box::new(g.clone()))
                .expect("registered once");
            g
        };
        let queries = counter(
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
        );
        let hits = counter(
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
        );
        let running = gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
        );
        let waiting = gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
        );
        let ttft = HistogramVec::new(
            HistogramOpts::new(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
            )
            .buckets(TTFT_BUCKETS.to_vec()),
            labels,
        )
        .expect("valid histogram");
        registry
            .register(Box::new(ttft.clone()))
            .expect("registered once");
        EngineMetrics {
            registry,
            queries,
            hits,
            running,
            waiting,
            ttft,
        }
    }
}

/// A request's draws from the seeded stream: its jitter and whether (and how) it fails.
#[derive(Debug)]
pub struct Draws {
    rng: rand_pcg::Pcg64,
    jitter: Duration,
}

impl Draws {
    /// `d` plus a normal jitter of standard deviation `mock.jitter`, never below zero.
    pub fn jittered(&mut self, d: Duration) -> Duration {
        if self.jitter.is_zero() {
            return d;
        }
        // Box-Muller: one standard normal from two uniforms (the first kept off zero).
        let u1: f64 = 1.0 - self.rng.random::<f64>();
        let u2: f64 = self.rng.random::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let secs = d.as_secs_f64() + z * self.jitter.as_secs_f64();
        Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(d)
    }

    /// The stream's own jitter source for its token gaps (`None` without jitter).
    pub fn for_stream(self) -> Option<Draws> {
        (!self.jitter.is_zero()).then_some(self)
    }
}

/// A request admitted to generate: counted as running until dropped (with its response body).
pub struct Running {
    gauge: prometheus::IntGauge,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Counted as waiting until dropped (also when the client leaves while queued).
struct Waiting(prometheus::IntGauge);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The mock's engine state (see the module documentation).
pub struct Engine {
    served: Vec<String>,
    /// Model names seen while `served` is empty (each logged once).
    seen: Mutex<HashSet<String>>,
    slots: Option<Arc<Semaphore>>,
    jitter: Duration,
    prefill_per_running: Duration,
    /// `mock.prefill_tokens_per_s`, and when the shared prefill is next free.
    prefill_per_s: Option<u64>,
    prefill_free: Mutex<Option<Instant>>,
    decode_per_s: Option<u64>,
    failure_rate: f64,
    failure_kinds: Vec<FailureKind>,
    seed: u64,
    /// Requests drawn for so far: the n-th gets the n-th stream of `seed`.
    drawn: std::sync::atomic::AtomicU64,
    label: String,
    metrics: EngineMetrics,
}

impl Engine {
    pub fn new(cfg: &MockConfig) -> Engine {
        Engine {
            served: cfg.served_model_names.clone(),
            seen: Mutex::new(HashSet::new()),
            slots: (cfg.max_num_seqs > 0).then(|| Arc::new(Semaphore::new(cfg.max_num_seqs))),
            jitter: cfg.jitter,
            prefill_per_running: cfg.prefill_per_running,
            prefill_per_s: cfg.prefill_tokens_per_s.filter(|&r| r > 0),
            prefill_free: Mutex::new(None),
            decode_per_s: cfg.decode_tokens_per_s.filter(|&r| r > 0),
            failure_rate: cfg.failure_rate,
            failure_kinds: cfg.failure_kinds.clone(),
            seed: cfg.seed.unwrap_or_else(rand::random),
            drawn: std::sync::atomic::AtomicU64::new(0),
            label: cfg.default_model().to_owned(),
            metrics: EngineMetrics::new(),
        }
    }

    /// The names `/v1/models` lists: the served ones, else `fallback` (`mock.model`).
    pub fn listed_models<'a>(&'a self, fallback: &'a str) -> Vec<&'a str> {
        if self.served.is_empty() {
            vec![fallback]
        } else {
            self.served.iter().map(String::as_str).collect()
        }
    }

    /// Refuses a model not served, as vLLM does (404); with no served names set, accepts it and
    /// logs each name the first time it is seen, so a mismatch shows before a real engine
    /// refuses it.
    pub fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if self.served.is_empty() {
            let mut seen = crate::sync::lock(&self.seen);
            if seen.len() < MAX_SEEN_MODELS && seen.insert(model.to_owned()) {
                tracing::info!(
                    model,
                    "mock: first request for model {model:?}; any name is accepted because \
                     mock.served_model_names is unset, but a real engine serves only its own \
                     (set mock.served_model_names to refuse the others)"
                );
            }
            return Ok(());
        }
        if self.served.iter().any(|m| m == model) {
            return Ok(());
        }
        Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            kind: "NotFoundError",
            code: "model_not_found",
        })
    }

    /// The draws of request number `seq` (deterministic for a given `mock.seed`).
    pub fn draws(&self, seq: u64) -> Draws {
        let stream = self.seed ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Draws {
            rng: rand_pcg::Pcg64::seed_from_u64(stream),
            jitter: self.jitter,
        }
    }

    /// The draws of the next request.
    pub fn next_draws(&self) -> Draws {
        self.draws(
            self.drawn
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Whether this request fails on purpose, and how (`mock.failure_rate`).
    pub fn failure(&self, draws: &mut Draws) -> Option<FailureKind> {
        if self.failure_rate <= 0.0 || self.failure_kinds.is_empty() {
            return None;
        }
        if draws.rng.random::<f64>() >= self.failure_rate {
            return None;
        }
        let i = draws.rng.random_range(0..self.failure_kinds.len());
        self.failure_kinds.get(i).copied()
    }

    /// Waits for a generation slot (`mock.max_num_seqs`; at once without a limit); returns the
    /// running guard and how many other requests were running when this one started.
    pub async fn admit(&self) -> (Running, usize) {
        let waiting = self.metrics.waiting.with_label_values(&[&self.label]);
        waiting.inc();
        let queued = Waiting(waiting);
        let slot = match &self.slots {
            // The semaphore is never closed, so acquiring only fails if it were.
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        };
        drop(queued);
        let gauge = self.metrics.running.with_label_values(&[&self.label]);
        let others = usize::try_from(gauge.get()).unwrap_or(0);
        gauge.inc();
        (Running { gauge, _slot: slot }, others)
    }

    /// The extra prefill of `uncached` tokens while `others` requests run
    /// (`mock.prefill_per_running`).
    pub fn load_prefill(&self, uncached: usize, others: usize) -> Duration {
        let per_token = self
            .prefill_per_running
            .checked_mul(u32::try_from(others).unwrap_or(u32::MAX))
            .unwrap_or(Duration::MAX);
        per_token
            .checked_mul(u32::try_from(uncached).unwrap_or(u32::MAX))
            .unwrap_or(Duration::MAX)
    }

    /// With `mock.prefill_tokens_per_s`: how long after `start` this request's `uncached` tokens
    /// are prefilled, behind every prefill reserved before it (first come first served, one
    /// budget for all); `None` without it (each request then prefills alone).
    pub fn shared_prefill(&self, uncached: usize, start: Instant) -> Option<Duration> {
        let rate = self.prefill_per_s?;
        let nanos = (uncached as u128 * 1_000_000_000) / u128::from(rate);
        let work = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let mut free = crate::sync::lock(&self.prefill_free);
        let begin = free.map_or(start, |f| f.max(start));
        let end = begin.checked_add(work).unwrap_or(begin);
        *free = Some(end);
        Some(end.saturating_duration_since(start))
    }

    /// `mock.decode_tokens_per_s`, shared by the running requests (`None` without it).
    pub fn decode_share(&self) -> Option<DecodeShare> {
        Some(DecodeShare {
            running: self.metrics.running.with_label_values(&[&self.label]),
            per_s: self.decode_per_s?,
        })
    }

    /// Counts a generation: its prompt and cached tokens, and the TTFT it was given.
    pub fn observe(&self, prompt_tokens: usize, cached: usize, ttft: Duration) {
        let l = [self.label.as_str()];
        self.metrics
            .queries
            .with_label_values(&l)
            .inc_by(prompt_tokens as u64);
        self.metrics
            .hits
            .with_label_values(&l)
            .inc_by(cached as u64);
        self.metrics
            .ttft
            .with_label_values(&l)
            .observe(ttft.as_secs_f64());
    }

    /// The metrics in Prometheus's text format.
    pub fn metrics_text(&self) -> Bytes {
        // Make the gauges appear (at 0) before the first request, as vLLM's do.
        let l = [self.label.as_str()];
        let _ = self.metrics.running.with_label_values(&l);
        let _ = self.metrics.waiting.with_label_values(&l);
        let mut out = Vec::new();
        if let Err(e) =
            prometheus::TextEncoder::new().encode(&self.metrics.registry.gather(), &mut out)
        {
            tracing::warn!("mock: cannot encode /metrics: {e}");
        }
        Bytes::from(out)
    }
}

/// The decode budget (`mock.decode_tokens_per_s`) as a running request sees it.
#[derive(Debug, Clone)]
pub struct DecodeShare {
    running: prometheus::IntGauge,
    per_s: u64,
}

impl DecodeShare {
    /// The gap before a request's next token: `inter_token`, or longer when the running
    /// requests together would exceed the budget (running / budget per token each).
    pub fn gap(&self, inter_token: Duration) -> Duration {
        let running = u128::try_from(self.running.get().max(1)).unwrap_or(1);
        let nanos = running * 1_000_000_000 / u128::from(self.per_s);
        inter_token.max(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        ))
    }
}

/// The error response of an injected status failure.
pub fn failure_error(kind: FailureKind) -> Option<ApiError> {
    let (status, kind, code, message) = match kind {
        FailureKind::TooManyRequests => (
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "rate_limit_exceeded",
            "mock.failure_rate: injected 429 (too many requests); retry later",
        ),
        FailureKind::Internal => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_server_error",
            "mock.failure_rate: injected 500 (internal server error)",
        ),
        FailureKind::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "service_unavailable",
            "mock.failure_rate: injected 503 (service unavailable); retry later",
        ),
        FailureKind::Reset | FailureKind::Stall => return None,
    };
    Some(ApiError {
        status,
        message: message.to_owned(),
        kind,
        code,
    })
}

/// A response body that holds its request's [`Running`] guard until it ends or is dropped.
pub struct Held<B> {
    inner: B,
    _running: Running,
}

impl<B> Held<B> {
    pub fn new(inner: B, running: Running) -> Self {
        Held {
            inner,
            _running: running,
        }
    }
}

impl<B: Body + Unpin> Body for Held<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that fails at its first poll: the server cuts the connection (an injected
/// reset of a non-streaming request).
pub struct Reset;

impl Body for Reset {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(Some(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "mock.failure_rate: injected reset",
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(cfg: MockConfig) -> Engine {
        Engine::new(&cfg)
    }

    #[test]
    fn draws_are_deterministic_for_a_seed_and_jitter_stays_non_negative() {
        let cfg = MockConfig {
            jitter: Duration::from_millis(5),
            seed: Some(42),
            ..MockConfig::default()
        };
        let e = engine(cfg.clone());
        let a: Vec<Duration> = (0..50)
            .map(|_| e.draws(3).jittered(Duration::from_millis(2)))
            .collect();
        assert!(a.iter().all(|d| *d == a[0]), "one request, one draw");
        let mut d = e.draws(3);
        let spread: Vec<Duration> = (0..2000)
            .map(|_| d.jittered(Duration::from_millis(2)))
            .collect();
        assert!(spread.iter().any(|x| x.is_zero()), "clamped at zero");
        assert!(spread.iter().any(|x| *x > Duration::from_millis(7)));
        let mean = spread.iter().map(Duration::as_secs_f64).sum::<f64>() / 2000.0;
        // The clamp lifts the mean of N(2ms, 5ms) to about 3.9 ms.
        assert!((0.0030..0.0048).contains(&mean), "{mean}");
        // Same seed, same draws; without jitter, no change at all.
        let again = engine(cfg);
        assert_eq!(again.draws(3).jittered(Duration::from_millis(2)), a[0]);
        let off = engine(MockConfig::default());
        assert_eq!(
            off.draws(9).jittered(Duration::from_millis(2)),
            Duration::from_millis(2)
        );
        assert!(off.draws(9).for_stream().is_none());
    }

    #[test]
    fn failures_follow_the_rate_and_kinds() {
        let e = engine(MockConfig {
            failure_rate: 0.25,
            failure_kinds: vec![FailureKind::Internal, FailureKind::Stall],
            seed: Some(1),
            ..MockConfig::default()
        });
        let drawn: Vec<Option<FailureKind>> =
            (0..4000).map(|i| e.failure(&mut e.draws(i))).collect();
        let failed = drawn.iter().filter(|f| f.is_some()).count();
        assert!((850..1150).contains(&failed), "{failed} of 4000 at 0.25");
        assert!(drawn.contains(&Some(FailureKind::Internal)));
        assert!(drawn.contains(&Some(FailureKind::Stall)));
        assert!(!drawn.contains(&Some(FailureKind::Reset)));
        let off = engine(MockConfig::default());
        assert!((0..1000).all(|i| off.failure(&mut off.draws(i)).is_none()));
        assert_eq!(
            failure_error(FailureKind::TooManyRequests).map(|e| e.status),
            Some(StatusCode::TOO_MANY_REQUESTS)
        );
        assert!(failure_error(FailureKind::Reset).is_none());
    }

    #[test]
    fn served_names_refuse_other_models_and_unset_accepts_any() {
        let e = engine(MockConfig {
            served_model_names: vec!["qwen".into(), "qwen-lora".into()],
            ..MockConfig::default()
        });
        assert!(e.check_model("qwen-lora").is_ok());
        let err = e.check_model("gpt-4o").unwrap_err();
        assert_eq!(err.status, StatusCode::NOT_FOUND);
        assert_eq!(err.message, "The model `gpt-4o` does not exist.");
        assert_eq!(e.listed_models("kvbust-mock"), ["qwen", "qwen-lora"]);
        let any = engine(MockConfig::default());
        assert!(any.check_model("gpt-4o").is_ok());
        assert_eq!(any.listed_models("kvbust-mock"), ["kvbust-mock"]);
    }

    #[test]
    fn prefill_grows_with_the_running_requests() {
        let e = engine(MockConfig {
            prefill_per_running: Duration::from_micros(2),
            ..MockConfig::default()
        });
        assert_eq!(e.load_prefill(100, 0), Duration::ZERO);
        assert_eq!(e.load_prefill(100, 3), Duration::from_micros(600));
        assert_eq!(
            engine(MockConfig::default()).load_prefill(100, 3),
            Duration::ZERO
        );
    }

    #[tokio::test]
    async fn admission_counts_running_and_waiting_and_queues_past_max_num_seqs() {
        let e = Arc::new(engine(MockConfig {
            max_num_seqs: 1,
            ..MockConfig::default()
        }));
        let (first, others) = e.admit().await;
        assert_eq!(others, 0);
        let e2 = e.clone();
        let mut second = tokio::spawn(async move { e2.admit().await.1 });
        // The second waits while the first runs (it is queued: the gauge says so).
        let text = loop {
            tokio::task::yield_now().await;
            let t = String::from_utf8(e.metrics_text().to_vec()).unwrap();
            if t.contains("vllm:num_requests_waiting{model_name=\"kvbust-mock\"} 1") {
                break t;
            }
        };
        assert!(
            text.contains("vllm:num_requests_running{model_name=\"kvbust-mock\"} 1"),
            "{text}"
        );
        assert!(still_pending(&mut second).await);
        drop(first);
        assert_eq!(second.await.unwrap(), 0, "admitted once the first ended");
        let text = String::from_utf8(e.metrics_text().to_vec()).unwrap();
        assert!(
            text.contains("vllm:num_requests_waiting{model_name=\"kvbust-mock\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("vllm:num_requests_running{model_name=\"kvbust-mock\"} 0"),
            "{text}"
        );
    }

    /// Whether `task` is still pending after the scheduler has run everything else it can.
    async fn still_pending<T>(task: &mut tokio::task::JoinHandle<T>) -> bool {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        !task.is_finished()
    }
}
