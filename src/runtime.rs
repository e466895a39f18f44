//! Run-time state shared by the data path and the admin port: the default phase switch, the
//! draining flag, the upstream's health status, the session ledger (absent in stateless mode), the benchmark id and the
//! metrics, and the budget for buffered request bodies ([`crate::budget`]). Holds no I/O handles.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::budget;
use crate::cachebust::{Ledger, Phase};
use crate::config::{Config, LedgerMode};
use crate::metrics::Metrics;

/// kvbust's state while it runs, one per process, shared by every data worker, the admin port
/// and the health probe. (Not `Runtime`: that is tokio's executor, used beside it.)
pub struct SharedState {
    pub config: Arc<Config>,
    pub metrics: Metrics,
    pub benchmark_id: String,
    /// This instance's `via` pseudonym ([`crate::upstream::loop_guard`]).
    pub via: String,
    /// What the health probe knows about the upstream; `/readyz` follows it.
    pub upstream_health: Arc<crate::health::Readiness>,
    /// Request bodies buffered for rewriting, all workers together (`limits.max_buffered_total`).
    /// Shared (`Arc`) with the in-process mock of `kvbust serve`, whose buffering counts too.
    pub bodies: Arc<budget::BodyBudget>,
    /// Each data worker's open client connections (`listen.max_connections`), read at scrape.
    pub conn_tables: Mutex<Vec<Arc<crate::conn::ConnTable>>>,
    default_phase: AtomicU8,
    draining: AtomicBool,
    /// `synth.preload` is still loading: not ready yet. Set from the start when configured.
    preloading: AtomicBool,
    preloaded: tokio::sync::Notify,
    /// `[synth.dataset]` is being built ([`DATASET_BUILDING`]) or failed to ([`DATASET_FAILED`]):
    /// not ready. Set from the start when a dataset is configured.
    dataset: AtomicU8,
    /// `None` in `cache_bust.ledger = "stateless"` mode, which keeps no per-session state.
    ledger: Option<Mutex<Ledger>>,
    /// The model of the upstream's prefix cache, and the runs behind `/report` and `/runs`.
    pub cache_model: crate::cache_model::CacheModel,
    /// The upstream and a client for it, for the admin port's cache resets (set when serving).
    pub upstream_reset: std::sync::OnceLock<(
        crate::upstream::client::Upstream,
        crate::upstream::client::UpstreamClient,
    )>,
}

impl SharedState {
    pub fn new(config: Arc<Config>, metrics: Metrics) -> Arc<Self> {
        let benchmark_id = config
            .cache_bust
            .benchmark_id
            .clone()
            .unwrap_or_else(crate::cachebust::random_benchmark_id);
        metrics
            .buffered_limit
            .set(i64::try_from(config.limits.max_buffered_total.as_u64()).unwrap_or(i64::MAX));
        metrics
            .upstream_tls_insecure
            .set(i64::from(config.upstream.tls.insecure_skip_verify));
        // `validate` rejects a zero capacity, so the fallback is never used.
        let cap = NonZeroUsize::new(config.cache_bust.ledger_capacity).unwrap_or(NonZeroUsize::MIN);
        Arc::new(Self {
            upstream_health: Arc::new(crate::health::Readiness::new(config.upstream.health_probe)),
            bodies: Arc::new(budget::BodyBudget::new(
                config.limits.max_buffered_total.as_u64(),
            )),
            conn_tables: Mutex::new(Vec::new()),
            default_phase: AtomicU8::new(phase_to_u8(config.cache_bust.default_phase)),
            draining: AtomicBool::new(false),
            preloading: AtomicBool::new(!config.synth.preload.is_empty()),
            preloaded: tokio::sync::Notify::new(),
            dataset: AtomicU8::new(if config.synth.dataset.is_some() {
                DATASET_BUILDING
            } else {
                DATASET_READY
            }),
            ledger: match config.cache_bust.ledger {
                LedgerMode::Local => Some(Mutex::new(Ledger::new(cap))),
                LedgerMode::Stateless => None,
            },
            cache_model: crate::cache_model::CacheModel::new(
                &config,
                metrics.clone(),
                benchmark_id.clone(),
            ),
            benchmark_id,
            upstream_reset: std::sync::OnceLock::new(),
            via: crate::upstream::loop_guard::via_token(rand::random()),
            metrics,
            config,
        })
    }

    /// Sets `kvbust_connections{state}` from every worker's table (at scrape).
    pub fn count_connections(&self) {
        let tables = crate::sync::lock(&self.conn_tables);
        let mut all = crate::conn::ConnCounts::default();
        for t in tables.iter() {
            let c = t.counts();
            all.new += c.new;
            all.active += c.active;
            all.idle += c.idle;
        }
        for (state, n) in [("new", all.new), ("active", all.active), ("idle", all.idle)] {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.metrics.connections.with_label_values(&[state]).set(n);
        }
    }

    pub fn default_phase(&self) -> Phase {
        u8_to_phase(self.default_phase.load(Ordering::Relaxed))
    }

    /// Sets the default phase, returning the previous one.
    pub fn set_default_phase(&self, p: Phase) -> Phase {
        u8_to_phase(self.default_phase.swap(phase_to_u8(p), Ordering::Relaxed))
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// `Ok` when `/readyz` should answer 200; else why not (draining, or the upstream).
    pub fn readiness(&self) -> Result<(), String> {
        if self.is_draining() {
            return Err("draining".into());
        }
        if self.preloading.load(Ordering::Acquire) {
            return Err("loading the synth.preload corpora".into());
        }
        match self.dataset.load(Ordering::Acquire) {
            DATASET_BUILDING => return Err("building the [synth.dataset] dataset".into()),
            DATASET_FAILED => {
                return Err("the [synth.dataset] dataset failed to build (see the log)".into())
            }
            _ => {}
        }
        match self.upstream_health.status().not_ready_reason() {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }

    /// `synth.preload` is done (or failed, logged): readiness no longer waits for it.
    pub fn preload_done(&self) {
        self.preloading.store(false, Ordering::Release);
        self.preloaded.notify_waiters();
    }

    /// The `[synth.dataset]` build ended: readiness follows the upstream again when it was built,
    /// and stays 503 when it failed (every synthetic request would fail).
    pub fn dataset_built(&self, ok: bool) {
        let state = if ok { DATASET_READY } else { DATASET_FAILED };
        self.dataset.store(state, Ordering::Release);
    }

    /// Resolves once `synth.preload` is done (at once when nothing is being preloaded).
    pub async fn wait_preloaded(&self) {
        loop {
            let notified = self.preloaded.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.preloading.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Resolves a session key to its counter: minted by the ledger in `local` mode (AIPerf's
    /// `_cache_bust_pass`); always 0 in `stateless` mode, so the marker depends on the request
    /// alone and every replica computes the same one.
    pub fn resolve_session(&self, key: &str) -> u64 {
        let Some(ledger) = &self.ledger else {
            return 0;
        };
        // A poisoned lock means a panic elsewhere while holding it; the ledger's state is still
        // a valid LRU, so keep serving rather than failing every later request.
        let key = crate::cachebust::KeyDigest::of(key);
        let mut ledger = crate::sync::lock(ledger);
        let r = ledger.resolve_digest(key);
        if r.evicted {
            self.metrics.ledger_evictions.inc();
        }
        self.metrics.ledger_sessions.set(ledger.len() as i64);
        r.counter
    }
}

/// States of [`SharedState`]'s dataset flag.
const DATASET_READY: u8 = 0;
const DATASET_BUILDING: u8 = 1;
const DATASET_FAILED: u8 = 2;

fn phase_to_u8(p: Phase) -> u8 {
    match p {
        Phase::Warmup => 0,
        Phase::Profiling => 1,
    }
}

fn u8_to_phase(v: u8) -> Phase {
    if v == 0 {
        Phase::Warmup
    } else {
        Phase::Profiling
    }
}
