//! The one Prometheus registry and its metric families (prefix `kvbust_`). Owns names, labels and
//! buckets; never blocks and never allocates label sets that grow without bound.

use std::sync::Arc;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
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

/// Labels of the latency histograms. Bounded: 5 route values (4 API routes and `other`) × 3
/// phases (`warmup`, `profiling`, `none` off the API routes) × 8 targets (7 and `none`).
pub const EXCHANGE_LABELS: &[&str] = &["route", "phase", "target"];

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
    /// The standard `process_*` families (no `kvbust_` prefix, as every exporter names them).
    process: Registry,
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
    pub completion_tokens: IntCounterVec,
    pub ledger_sessions: IntGauge,
    pub ledger_evictions: IntCounter,
    pub unparseable_passthrough: IntCounter,
    /// Requests asked to isolate by `cache_salt` on a route without one (Anthropic
    /// Messages), marked with the marker instead (`cache_bust.method`).
    pub salt_fallback: IntCounter,
    pub streams_aborted: IntCounterVec,
    pub shutdown_aborted_connections: IntCounter,
    pub tls_reloads: IntCounterVec,
    pub upstream_tls_insecure: IntGauge,
    pub upstream_up: IntGauge,
    pub buffered_bytes: IntGauge,
    pub buffered_limit: IntGauge,
    pub connections: IntGaugeVec,
    pub shed: IntCounter,
    pub admin_shed: IntCounter,
    pub model_unaccounted: IntCounterVec,
    pub capture_rows: IntCounter,
    pub capture_dropped: IntCounterVec,
    pub capture_files: IntCounter,
    pub predicted_cached_tokens: IntCounterVec,
    pub reuse_tokens: IntCounterVec,
    pub isolation_breaches: IntCounterVec,
    pub model_compactions: IntCounterVec,
    pub model_divergence: IntCounterVec,
    pub upstream_reports_cached: IntGauge,
    pub model_blocks: IntGauge,
    pub model_memory: IntGauge,
    pub model_queue: IntGauge,
    pub run_info: IntGaugeVec,
    pub cache_resets: IntCounterVec,
}

/// The labelled series the request path counts on every request, kept per thread: a
/// `with_label_values` hashes every label and takes the family's lock, about 200 instructions,
/// where a look here compares a few pointers. Keyed by the registry (the entry holds it, so its
/// address is not reused while kept), the family and the labels' addresses: kvbust's labels are
/// `&'static str`s, and two copies of one label only cost two entries for one series. At most
/// [`SERIES_KEPT`] entries (the label sets are bounded; a full cache starts again).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Requests,
    Duration,
    PromptTokens,
    CachedTokens,
    CompletionTokens,
}

#[derive(Clone, Copy)]
struct Key {
    family: Family,
    labels: [&'static str; 3],
    status: u16,
}

impl Key {
    fn same(&self, other: &Key) -> bool {
        self.family == other.family
            && self.status == other.status
            && self
                .labels
                .iter()
                .zip(&other.labels)
                .all(|(a, b)| std::ptr::eq(*a, *b))
    }
}

#[derive(Clone)]
enum Series {
    Counter(IntCounter),
    Histogram(Histogram),
    /// Never kept: what [`Metrics::series`] answers should its `resolve` already have run.
    None,
}

impl Series {
    fn inc(&self) {
        self.inc_by(1);
    }

    fn inc_by(&self, n: u64) {
        if let Series::Counter(c) = self {
            c.inc_by(n);
        }
    }
}

struct Cached {
    owner: Metrics,
    key: Key,
    series: Series,
}

const SERIES_KEPT: usize = 64;

thread_local! {
    static SERIES: std::cell::RefCell<Vec<Cached>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One family's name (before the `kvbust_` prefix), help text and label names (none for a plain
/// counter, gauge or histogram). Kept as a table so `Metrics::new` reads as the list of families.
struct Def {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

const REQUESTS: Def = Def {
    name: "requests_total",
    help: "Requests by route, phase, target and status.",
    labels: &["route", "phase", "target", "status"],
};
const IN_FLIGHT: Def = Def {
    name: "in_flight_requests",
    help: "Requests (and their bodies) in flight.",
    labels: &[],
};
const ERRORS: Def = Def {
    name: "errors_total",
    help: "Errors answered or seen, by source and code.",
    labels: &["source", "code"],
};
const MARKERS: Def = Def {
    name: "markers_injected_total",
    help: "Cache-bust markers injected.",
    labels: &["target", "phase", "location"],
};
const TTFT: Def = Def {
    name: "time_to_first_token_seconds",
    help: "Time to the first SSE data event with content.",
    labels: EXCHANGE_LABELS,
};
const INTER_TOKEN: Def = Def {
    name: "inter_token_seconds",
    help: "Gap between consecutive content events.",
    labels: EXCHANGE_LABELS,
};
const DURATION: Def = Def {
    name: "request_duration_seconds",
    help: "Request start to end of response body.",
    labels: EXCHANGE_LABELS,
};
const OVERHEAD: Def = Def {
    name: "proxy_overhead_seconds",
    help: "Time spent in kvbust before forwarding.",
    labels: &[],
};
const PROMPT_TOKENS: Def = Def {
    name: "upstream_prompt_tokens_total",
    help: "Upstream-reported prompt tokens (Anthropic: input + cache read + cache creation).",
    labels: &["phase", "target"],
};
const CACHED_TOKENS: Def = Def {
    name: "upstream_cached_tokens_total",
    help: "Upstream-reported cached prompt tokens (Responses: input_tokens_details.cached_tokens; Anthropic: cache_read_input_tokens).",
    labels: &["phase", "target"],
};
const COMPLETION_TOKENS: Def = Def {
    name: "upstream_completion_tokens_total",
    help: "Upstream-reported generated tokens (completion_tokens, Responses and Anthropic output_tokens).",
    labels: &["phase", "target"],
};
const LEDGER_SESSIONS: Def = Def {
    name: "ledger_sessions",
    help: "Sessions in the cache-bust ledger.",
    labels: &[],
};
const LEDGER_EVICTIONS: Def = Def {
    name: "ledger_evictions_total",
    help: "Sessions evicted from the ledger (LRU).",
    labels: &[],
};
const UNPARSEABLE_PASSTHROUGH: Def = Def {
    name: "unparseable_passthrough_total",
    help: "Bodies forwarded unchanged because they could not be parsed.",
    labels: &[],
};
const SALT_FALLBACK: Def = Def {
    name: "salt_fallback_total",
    help: "Requests asked to isolate by cache_salt on a route that has none (Anthropic Messages), marked with the marker instead.",
    labels: &[],
};
const STREAMS_ABORTED: Def = Def {
    name: "streams_aborted_total",
    help: "Response bodies that ended early, by reason.",
    labels: &["reason"],
};
const SHUTDOWN_ABORTED: Def = Def {
    name: "shutdown_aborted_connections_total",
    help: "Connections closed when the shutdown grace ran out.",
    labels: &[],
};
const TLS_RELOADS: Def = Def {
    name: "tls_reloads_total",
    help: "Listener certificate reloads (SIGHUP or changed files), by result (ok, error).",
    labels: &["result"],
};
const UPSTREAM_TLS_INSECURE: Def = Def {
    name: "upstream_tls_insecure_skip_verify",
    help: "1 when the upstream's certificate is not verified (upstream.tls.insecure_skip_verify).",
    labels: &[],
};
const BUFFERED_BYTES: Def = Def {
    name: "buffered_body_bytes",
    help: "Request body bytes buffered for rewriting right now, all workers together (read at scrape).",
    labels: &[],
};
const BUFFERED_LIMIT: Def = Def {
    name: "buffered_body_limit_bytes",
    help: "limits.max_buffered_total in force (lowered to half the cgroup memory limit when it was above that).",
    labels: &[],
};
const CONNECTIONS: Def = Def {
    name: "connections",
    help: "Open data-port client connections by state: new (no request yet), active (a request in flight), idle (between requests); read at scrape.",
    labels: &["state"],
};
const SHED: Def = Def {
    name: "shed_total",
    help: "Client connections closed because listen.max_connections was reached: the oldest with no request in flight, or the new one when every connection was busy.",
    labels: &[],
};
const CAPTURE_ROWS: Def = Def {
    name: "capture_rows_total",
    help: "Capture rows on disk ([capture]): written to the file being captured (within capture.flush of their response's end).",
    labels: &[],
};
const CAPTURE_DROPPED: Def = Def {
    name: "capture_dropped_total",
    help: "Generation requests left out of the capture, by reason (failed: a non-2xx answer or none; cancelled: the response did not end normally; unaccounted: the cache model could not take the request; late: its row came after 65,536 newer ones; io_error: the file could not be written or started; vanished: the file being written was removed with capture.dir, its rows on disk are lost).",
    labels: &["reason"],
};
const CAPTURE_FILES: Def = Def {
    name: "capture_files_total",
    help: "Capture files finished and renamed into capture.dir.",
    labels: &[],
};
const ADMIN_SHED: Def = Def {
    name: "admin_shed_total",
    help: "Admin-port connections closed because admin.max_connections was reached: the oldest with no request in flight, or the new one when every connection was busy.",
    labels: &[],
};
const MODEL_UNACCOUNTED: Def = Def {
    name: "cache_model_unaccounted_total",
    help: "Generation requests the cache model did not account for, by reason (queue_full, unparseable, template_error, tokenizer_error, too_large: more text than cache_model.max_prompt_bytes, disabled_shape).",
    labels: &["reason"],
};
const PREDICTED_CACHED: Def = Def {
    name: "predicted_cached_tokens_total",
    help: "Prompt tokens the cache model predicts the upstream served from its prefix cache.",
    labels: &["phase", "target"],
};
const REUSE_TOKENS: Def = Def {
    name: "reuse_tokens_total",
    help: "Predicted cached tokens by who put the reused blocks in the cache: same_session, other_session, warmup.",
    labels: &["phase", "target", "source"],
};
const ISOLATION_BREACHES: Def = Def {
    name: "isolation_breaches_total",
    help: "Requests whose predicted cache hit crossed their isolation point, by kind: cross_session, warmup_reuse, session_collision.",
    labels: &["phase", "target", "kind"],
};
const MODEL_COMPACTIONS: Def = Def {
    name: "cache_model_compactions_total",
    help: "Requests that cut their session's context back to an earlier point and go on from there (agentic compaction): counted, not breaches.",
    labels: &["phase", "target"],
};
const MODEL_DIVERGENCE: Def = Def {
    name: "cache_model_divergence_total",
    help: "Requests whose upstream-reported cached tokens differ from the cache model's prediction, by direction (reported_higher, reported_lower).",
    labels: &["phase", "target", "direction"],
};
const UPSTREAM_REPORTS_CACHED: Def = Def {
    name: "upstream_reports_cached_tokens",
    help: "1 once the upstream's usage carried a cached-token field; 0 after enough responses with usage and none (-1 until then).",
    labels: &[],
};
const RUN_INFO: Def = Def {
    name: "run_info",
    help: "1 for the current run (its name in `run`), for dashboards to annotate run boundaries.",
    labels: &["run"],
};
const CACHE_RESETS: Def = Def {
    name: "cache_resets_total",
    help: "Upstream prefix-cache resets the cache model followed, by who asked: forwarded (a client's POST /reset_prefix_cache or /flush_cache), admin, run_open.",
    labels: &["by"],
};
const MODEL_BLOCKS: Def = Def {
    name: "cache_model_blocks",
    help: "Blocks in the cache model's index.",
    labels: &[],
};
const MODEL_MEMORY: Def = Def {
    name: "cache_model_memory_bytes",
    help: "Memory the cache model accounts for: its block index, session table, token memo and queued bodies.",
    labels: &[],
};
const MODEL_QUEUE: Def = Def {
    name: "cache_model_queue_bytes",
    help: "Request body bytes waiting in the cache model's queue.",
    labels: &[],
};
const BUILD_INFO: Def = Def {
    name: "build_info",
    help: "Always 1; its labels name the running build: the crate version and the source revision (git commit, or VCS_REF at build time; \"unknown\" without either).",
    labels: &["version", "revision"],
};
const UPSTREAM_UP: Def = Def {
    name: "upstream_up",
    help: "1 while the upstream answers its health probe (upstream.health_path), 0 before it first does, after upstream.health_fail_threshold failures in a row, and when upstream.health_probe = false.",
    labels: &[],
};

// Names and label sets in the table are static and valid, so registration cannot fail; a failure
// would be a programming error caught by the first test that builds Metrics.
#[allow(clippy::expect_used)] // static definitions: see above
fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone()))
        .expect("static metric definitions register once");
    c
}

#[allow(clippy::expect_used)] // static, valid definitions (see `reg`)
fn counter_vec(r: &Registry, d: &Def) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(d.name, d.help), d.labels);
    reg(r, c.expect("valid counter definition"))
}

#[allow(clippy::expect_used)] // static, valid definitions (see `reg`)
fn counter(r: &Registry, d: &Def) -> IntCounter {
    reg(r, IntCounter::new(d.name, d.help).expect("valid"))
}

#[allow(clippy::expect_used)] // static, valid definitions (see `reg`)
fn gauge_vec(r: &Registry, d: &Def) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(d.name, d.help), d.labels);
    reg(r, g.expect("valid gauge definition"))
}

#[allow(clippy::expect_used)] // static, valid definitions (see `reg`)
fn gauge(r: &Registry, d: &Def) -> IntGauge {
    reg(r, IntGauge::new(d.name, d.help).expect("valid"))
}

#[allow(clippy::expect_used)] // static, valid definitions (see `reg`)
fn histogram_vec(r: &Registry, d: &Def, buckets: &[f64]) -> HistogramVec {
    let opts = HistogramOpts::new(d.name, d.help).buckets(buckets.to_vec());
    reg(
        r,
        HistogramVec::new(opts, d.labels).expect("valid histogram definition"),
    )
}

#[allow(clippy::expect_used)] // static, valid definitions (see `reg`)
fn histogram(r: &Registry, d: &Def, buckets: &[f64]) -> Histogram {
    let opts = HistogramOpts::new(d.name, d.help).buckets(buckets.to_vec());
    reg(r, Histogram::with_opts(opts).expect("valid"))
}

/// The source revision this binary was built from (build.rs).
pub const REVISION: &str = env!("BUILD_REVISION");

/// A registry with the standard `process_*` collector (resident and virtual memory, CPU
/// seconds, open and max fds, threads, start time), read from /proc at each scrape.
#[allow(clippy::expect_used)] // static, valid definitions (see `reg`)
fn process_registry() -> Registry {
    let r = Registry::new();
    #[cfg(target_os = "linux")]
    r.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))
    .expect("the process collector registers once");
    r
}

impl Metrics {
    #[allow(clippy::expect_used)] // static, valid definitions (see `reg`)
    pub fn new() -> Self {
        let r = Registry::new_custom(Some("kvbust".into()), None).expect("valid registry prefix");
        let build_info = gauge_vec(&r, &BUILD_INFO);
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), REVISION])
            .set(1);
        Self(Arc::new(Families {
            requests: counter_vec(&r, &REQUESTS),
            in_flight: gauge(&r, &IN_FLIGHT),
            errors: counter_vec(&r, &ERRORS),
            markers: counter_vec(&r, &MARKERS),
            ttft: histogram_vec(&r, &TTFT, LATENCY_BUCKETS),
            inter_token: histogram_vec(&r, &INTER_TOKEN, LATENCY_BUCKETS),
            duration: histogram_vec(&r, &DURATION, LATENCY_BUCKETS),
            overhead: histogram(&r, &OVERHEAD, OVERHEAD_BUCKETS),
            prompt_tokens: counter_vec(&r, &PROMPT_TOKENS),
            cached_tokens: counter_vec(&r, &CACHED_TOKENS),
            completion_tokens: counter_vec(&r, &COMPLETION_TOKENS),
            ledger_sessions: gauge(&r, &LEDGER_SESSIONS),
            ledger_evictions: counter(&r, &LEDGER_EVICTIONS),
            unparseable_passthrough: counter(&r, &UNPARSEABLE_PASSTHROUGH),
            salt_fallback: counter(&r, &SALT_FALLBACK),
            streams_aborted: counter_vec(&r, &STREAMS_ABORTED),
            shutdown_aborted_connections: counter(&r, &SHUTDOWN_ABORTED),
            tls_reloads: counter_vec(&r, &TLS_RELOADS),
            upstream_tls_insecure: gauge(&r, &UPSTREAM_TLS_INSECURE),
            upstream_up: gauge(&r, &UPSTREAM_UP),
            buffered_bytes: gauge(&r, &BUFFERED_BYTES),
            buffered_limit: gauge(&r, &BUFFERED_LIMIT),
            connections: {
                let g = gauge_vec(&r, &CONNECTIONS);
                // Every state shows from the start, at 0.
                for state in ["new", "active", "idle"] {
                    g.with_label_values(&[state]).set(0);
                }
                g
            },
            shed: counter(&r, &SHED),
            admin_shed: counter(&r, &ADMIN_SHED),
            model_unaccounted: counter_vec(&r, &MODEL_UNACCOUNTED),
            capture_rows: counter(&r, &CAPTURE_ROWS),
            capture_dropped: counter_vec(&r, &CAPTURE_DROPPED),
            capture_files: counter(&r, &CAPTURE_FILES),
            predicted_cached_tokens: counter_vec(&r, &PREDICTED_CACHED),
            reuse_tokens: counter_vec(&r, &REUSE_TOKENS),
            isolation_breaches: counter_vec(&r, &ISOLATION_BREACHES),
            model_compactions: counter_vec(&r, &MODEL_COMPACTIONS),
            model_divergence: counter_vec(&r, &MODEL_DIVERGENCE),
            run_info: gauge_vec(&r, &RUN_INFO),
            cache_resets: counter_vec(&r, &CACHE_RESETS),
            upstream_reports_cached: {
                let g = gauge(&r, &UPSTREAM_REPORTS_CACHED);
                g.set(-1);
                g
            },
            model_blocks: gauge(&r, &MODEL_BLOCKS),
            model_memory: gauge(&r, &MODEL_MEMORY),
            model_queue: gauge(&r, &MODEL_QUEUE),
            registry: r,
            process: process_registry(),
        }))
    }

    /// `requests_total{route, phase, target, status}` + 1.
    pub fn count_request(
        &self,
        [route, phase, target]: [&'static str; 3],
        status: http::StatusCode,
    ) {
        let key = Key {
            family: Family::Requests,
            labels: [route, phase, target],
            status: status.as_u16(),
        };
        self.series(key, || {
            Series::Counter(self.requests.with_label_values(&[
                route,
                phase,
                target,
                status.as_str(),
            ]))
        })
        .inc();
    }

    /// The `request_duration_seconds{route, phase, target}` series.
    pub fn duration_of(&self, labels: [&'static str; 3]) -> Histogram {
        let key = Key {
            family: Family::Duration,
            labels,
            status: 0,
        };
        match self.series(key, || {
            Series::Histogram(self.duration.with_label_values(&labels))
        }) {
            Series::Histogram(h) => h,
            // Only a histogram is ever kept under `Family::Duration`.
            _ => self.duration.with_label_values(&labels),
        }
    }

    /// Adds the upstream-reported tokens (prompt, cached, completion) to
    /// `upstream_*_tokens_total{phase, target}`. Plain numbers: metrics sit below `usage`.
    pub fn count_tokens(
        &self,
        [phase, target]: [&'static str; 2],
        [prompt, cached, completion]: [Option<u64>; 3],
    ) {
        for (n, family) in [
            (prompt, Family::PromptTokens),
            (cached, Family::CachedTokens),
            (completion, Family::CompletionTokens),
        ] {
            let Some(n) = n else { continue };
            let key = Key {
                family,
                labels: [phase, target, ""],
                status: 0,
            };
            let vec = match family {
                Family::PromptTokens => &self.prompt_tokens,
                Family::CachedTokens => &self.cached_tokens,
                _ => &self.completion_tokens,
            };
            self.series(key, || {
                Series::Counter(vec.with_label_values(&[phase, target]))
            })
            .inc_by(n);
        }
    }

    /// The series `key` names, from this thread's cache, or `resolve`d and kept there.
    fn series(&self, key: Key, resolve: impl FnOnce() -> Series) -> Series {
        let mut resolve = Some(resolve);
        let mut resolved = || resolve.take().map(|r| r());
        let found = SERIES.try_with(|cache| {
            let mut cache = cache.borrow_mut();
            if let Some(hit) = cache
                .iter()
                .find(|c| Arc::ptr_eq(&c.owner.0, &self.0) && c.key.same(&key))
            {
                return Some(hit.series.clone());
            }
            let series = resolved()?;
            if cache.len() >= SERIES_KEPT {
                cache.clear();
            }
            cache.push(Cached {
                owner: self.clone(),
                key,
                series: series.clone(),
            });
            Some(series)
        });
        // `resolve` runs once: in the cache, or here while the thread's locals are torn down.
        match found {
            Ok(Some(series)) => series,
            _ => resolved().unwrap_or(Series::None),
        }
    }

    pub fn error(&self, source: &str, code: &str) {
        self.errors.with_label_values(&[source, code]).inc();
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding into a Vec only fails on invalid metric families, which we never build.
        let mut families = self.registry.gather();
        families.extend(self.process.gather());
        let _ = TextEncoder::new().encode(&families, &mut out);
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

    #[test]
    fn build_info_and_process_families_are_exported() {
        let text = String::from_utf8(Metrics::new().render()).unwrap();
        let info = format!(
            "kvbust_build_info{{revision=\"{REVISION}\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&info), "{text}");
        assert!(!REVISION.is_empty());
        if cfg!(target_os = "linux") {
            for name in [
                "process_resident_memory_bytes ",
                "process_cpu_seconds_total ",
                "process_open_fds ",
                "process_start_time_seconds ",
            ] {
                assert!(
                    text.lines().any(|l| l.starts_with(name)),
                    "{name}missing: {text}"
                );
            }
        }
    }
}
