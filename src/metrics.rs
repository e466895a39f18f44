//! The one Prometheus registry and its metric families (prefix `kvbust_`). Owns names, labels and
//! buckets; never blocks and never allocates label sets that grow without bound.

use std::sync::Arc;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Buckets for LLM latencies: 1 ms … 10 min.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// Buckets for the proxy's own overhead: 10 µs … 1 s.
const OVERHEAD_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.1, 1.0,
];

/// The registry and its families. Cloning is one reference count: observers hold a clone per
/// exchange, and each family handle inside would otherwise be its own atomic increment.
#[derive(Clone)]
pub struct Metrics(Arc<Families>);

impl std::ops::Deref for Metrics {
    type Target = Families;
    fn deref(&self) -> &Families {
        &self.0
    }
}

pub struct Families {
    registry: Registry,
    pub requests: IntCounterVec,
    pub in_flight: IntGauge,
    pub errors: IntCounterVec,
    pub markers: IntCounterVec,
    pub ttft: HistogramVec,
    pub inter_token: HistogramVec,
    pub duration: HistogramVec,
    pub overhead: Histogram,
    pub prompt_tokens: IntCounterVec,
    pub cached_tokens: IntCounterVec,
    pub ledger_sessions: IntGauge,
    pub ledger_evictions: IntCounter,
    pub unparseable_passthrough: IntCounter,
    pub streams_aborted: IntCounterVec,
    pub shutdown_aborted_connections: IntCounter,
    pub tls_reloads: IntCounterVec,
    pub upstream_tls_insecure: IntGauge,
    pub upstream_up: IntGauge,
}

impl Metrics {
    pub fn new() -> Self {
        // Names and label sets below are static and valid, so registration cannot fail; a
        // failure would be a programming error caught by the first test that builds Metrics.
        fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
            r.register(Box::new(c.clone()))
                .expect("static metric definitions register once");
            c
        }
        fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
            reg(
                r,
                IntCounterVec::new(Opts::new(name, help), labels)
                    .expect("valid counter definition"),
            )
        }
        fn hist(r: &Registry, name: &str, help: &str, labels: &[&str], b: &[f64]) -> HistogramVec {
            reg(
                r,
                HistogramVec::new(HistogramOpts::new(name, help).buckets(b.to_vec()), labels)
                    .expect("valid histogram definition"),
            )
        }
        let r = Registry::new_custom(Some("kvbust".into()), None).expect("valid registry prefix");
        Self(Arc::new(Families {
            requests: counter(
                &r,
                "requests_total",
                "Requests by route, phase, target and status.",
                &["route", "phase", "target", "status"],
            ),
            in_flight: reg(
                &r,
                IntGauge::new(
                    "in_flight_requests",
                    "Requests (and their bodies) in flight.",
                )
                .expect("valid"),
            ),
            errors: counter(
                &r,
                "errors_total",
                "Errors answered or seen, by source and code.",
                &["source", "code"],
            ),
            markers: counter(
                &r,
                "markers_injected_total",
                "Cache-bust markers injected.",
                &["target", "phase", "location"],
            ),
            ttft: hist(
                &r,
                "time_to_first_token_seconds",
                "Time to the first SSE data event with content.",
                &["route"],
                LATENCY_BUCKETS,
            ),
            inter_token: hist(
                &r,
                "inter_token_seconds",
                "Gap between consecutive content events.",
                &["route"],
                LATENCY_BUCKETS,
            ),
            duration: hist(
                &r,
                "request_duration_seconds",
                "Request start to end of response body.",
                &["route"],
                LATENCY_BUCKETS,
            ),
            overhead: reg(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "proxy_overhead_seconds",
                        "Time spent in kvbust before forwarding.",
                    )
                    .buckets(OVERHEAD_BUCKETS.to_vec()),
                )
                .expect("valid"),
            ),
            prompt_tokens: counter(
                &r,
                "upstream_prompt_tokens_total",
                "Upstream-reported prompt tokens.",
                &["phase", "target"],
            ),
            cached_tokens: counter(
                &r,
                "upstream_cached_tokens_total",
                "Upstream-reported cached prompt tokens.",
                &["phase", "target"],
            ),
            ledger_sessions: reg(
                &r,
                IntGauge::new("ledger_sessions", "Sessions in the cache-bust ledger.")
                    .expect("valid"),
            ),
            ledger_evictions: reg(
                &r,
                IntCounter::new(
                    "ledger_evictions_total",
                    "Sessions evicted from the ledger (LRU).",
                )
                .expect("valid"),
            ),
            unparseable_passthrough: reg(
                &r,
                IntCounter::new(
                    "unparseable_passthrough_total",
                    "Bodies forwarded unchanged because they could not be parsed.",
                )
                .expect("valid"),
            ),
            streams_aborted: counter(
                &r,
                "streams_aborted_total",
                "Response bodies that ended early, by reason.",
                &["reason"],
            ),
            shutdown_aborted_connections: reg(
                &r,
                IntCounter::new(
                    "shutdown_aborted_connections_total",
                    "Connections closed when the shutdown grace ran out.",
                )
                .expect("valid"),
            ),
            tls_reloads: counter(
                &r,
                "tls_reloads_total",
                "Listener certificate reloads (SIGHUP or changed files), by result (ok, error).",
                &["result"],
            ),
            upstream_tls_insecure: reg(
                &r,
                IntGauge::new(
                    "upstream_tls_insecure_skip_verify",
                    "1 when the upstream's certificate is not verified (upstream.tls.insecure_skip_verify).",
                )
                .expect("valid"),
            ),
            upstream_up: reg(
                &r,
                IntGauge::new(
                    "upstream_up",
                    "1 while the upstream answers its health probe (upstream.health_path), 0 before it first does, after upstream.health_fail_threshold failures in a row, and when upstream.health_probe = false.",
                )
                .expect("valid"),
            ),
            registry: r,
        }))
    }

    pub fn error(&self, source: &str, code: &str) {
        self.errors.with_label_values(&[source, code]).inc();
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding into a Vec only fails on invalid metric families, which we never build.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_families_with_prefix() {
        let m = Metrics::new();
        m.requests
            .with_label_values(&["chat", "profiling", "none", "200"])
            .inc();
        m.error("client", "body_too_large");
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("kvbust_requests_total{phase=\"profiling\",route=\"chat\",status=\"200\",target=\"none\"} 1"));
        assert!(text.contains("kvbust_errors_total{code=\"body_too_large\",source=\"client\"} 1"));
        assert!(text.contains("kvbust_in_flight_requests 0"));
    }
}
