//! kvbust sees the cache: a model of the upstream's prefix cache built from the bytes kvbust
//! forwards. Each generation request's final body is handed, through a bounded queue, to one
//! worker thread that tokenizes it as the engine would ([`tokens`]), serves it against a block
//! index kept as vLLM keeps its cache ([`index`]), attributes the hit and checks the isolation
//! promise of the request's target ([`attribution`]); the response's usage and TTFT meet the
//! prediction in a [`Ticket`], and the finished pair is counted in the run's [`ledger`].
//!
//! Never on the request path: the request side only clones the body's `Bytes` into the queue
//! (or counts the request as unaccounted when the queue is full) and never waits for the model.
//! The index sees requests in forwarding order, the order the engine does: one worker serves
//! them, and with `cache_model.threads` > 1 the tokenizing before it is spread over that many
//! threads ([`pipeline`]) and put back in order.

pub mod attribution;
pub mod dial;
pub mod events;
pub mod index;
pub mod ledger;
mod pipeline;
mod priority;
pub mod runs;
pub mod tokens;
#[cfg(test)]
mod vectors;
mod worker;

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::api::Shape;
use crate::cachebust::{Phase, Target};
use crate::capture::{self, Capture};
use crate::config::{CacheModelConfig, ChatTemplateMode, Config, SessionSource, Topology};
use crate::metrics::Metrics;
use crate::mock::MockTokenizerSetting;
use crate::report;
pub use ledger::{Failure, Outcome, Prediction, Side};
pub use runs::{RunCell, RunSpec, Runs};

/// How a request's session is known, for attribution (the session key of
/// `cache_bust.session_sources`, even when explicit RID headers are sent). Keys travel as
/// digests ([`session_digest`]): a header may be long, and the model needs only its identity.
#[derive(Debug, Clone, Default)]
pub struct SessionHint {
    /// A key given outright (a synthesized conversation's), with the source that gave it.
    pub known: Option<(u64, &'static str)>,
    /// Each configured source, in order, with a header source's digest (body sources: `None`,
    /// read by the worker from the body).
    pub sources: Vec<(SessionSource, Option<u64>)>,
}

/// A session key's identity in the model. Anonymous sessions (no key) count down from
/// `u64::MAX`, so keyed ones stay below them.
pub fn session_digest(key: &str) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish() >> 1
}

/// One request for the model.
pub struct Job {
    pub shape: Shape,
    /// The body as forwarded (after synthesis and marking).
    pub body: Bytes,
    pub phase: Phase,
    pub target: Target,
    /// Where the marker kvbust put in starts to differ from other requests' (see
    /// [`tokens::IsoHint::Marker`]); `None` when it put none.
    pub marker: Option<tokens::IsoHint>,
    /// Leading user messages that are user context (where first-turn marks skip to).
    pub user_context_messages: usize,
    pub session: SessionHint,
    pub ticket: Ticket,
    /// The body as the workload sent it (after synthesis, before the marker), when capture is
    /// on and the marker changed it; `None`: `body` is that body.
    pub workload: Option<Bytes>,
}

impl Job {
    /// Bytes the job holds in the queue.
    pub fn bytes(&self) -> u64 {
        (self.body.len() + self.workload.as_ref().map_or(0, Bytes::len)) as u64
    }
}

/// A job in the worker's queue, with when it was submitted: the upstream cache resets before it
/// ([`CacheModel::cache_reset`]'s epoch: the worker empties its index between the jobs before a
/// reset and those after) and the engine's event batches received before it
/// ([`events::EventStats::handed`]: what the engine had done when the request went to it).
pub(crate) struct Queued {
    pub job: Job,
    pub epoch: u64,
    pub events: u64,
}

/// Where a request's prediction and its response's outcome meet: whichever side lets go of
/// the ticket last counts the pair in the run ledger (a request that got no response counts
/// with no outcome; one the model could not take, with no prediction).
#[derive(Clone)]
pub struct Ticket(Arc<TicketInner>);

struct TicketInner {
    runs: Arc<Runs>,
    /// The run the request arrived in: it counts there, whenever it is counted.
    run: Arc<RunCell>,
    record: Mutex<ledger::Record>,
    open: Arc<OpenTickets>,
    /// The writer, looked up when the ticket is counted (a ticket made before the writer
    /// started still hands its row in).
    capture: Arc<OnceLock<Option<Arc<Capture>>>>,
    /// The request's access-log line, written with the prediction when the ticket is counted.
    log: Mutex<Option<(crate::access_log::Entry, crate::access_log::Outcome)>>,
}

impl Drop for TicketInner {
    fn drop(&mut self) {
        let mut record = std::mem::take(self.record.get_mut().unwrap_or_else(|p| p.into_inner()));
        let capture = self.capture.get().cloned().flatten();
        if let (Some(c), Some(pending)) = (capture, record.capture.take()) {
            let output = match &record.outcome {
                Some(o) if o.complete => Ok(o.tokens.completion.unwrap_or(o.content_events)),
                Some(_) => Err(capture::Left::Cancelled),
                None => Err(capture::Left::Failed),
            };
            // The response's end, not this drop's: the model may take the request well after
            // its answer ended, and a later turn's delay counts from the answer.
            let end = record
                .outcome
                .as_ref()
                .and_then(|o| o.ended)
                .unwrap_or_else(Instant::now);
            c.finished(capture::Done {
                pending,
                at: record.at.unwrap_or(end),
                end,
                output,
            });
        }
        let log = self.log.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((entry, mut outcome)) = log {
            outcome.run = Some(self.run.name.clone());
            outcome.predicted = record.prediction.as_ref().map(|p| {
                let r = &p.reuse;
                let source = [
                    (r.same_session, "same_session"),
                    (r.other_session, "other_session"),
                    (r.warmup, "warmup"),
                ]
                .into_iter()
                .filter(|(n, _)| *n > 0)
                .max_by_key(|(n, _)| *n)
                .map_or("none", |(_, s)| s);
                crate::access_log::Predicted {
                    cached_tokens: p.cached,
                    source,
                }
            });
            entry.write(&outcome);
        }
        self.runs.record(&self.run, record);
        self.open.close();
        self.run.open.close();
    }
}

/// Tickets not yet counted: requests in flight or waiting for the model. `GET /report?wait=`
/// waits for none to be left, so a report taken right after a benchmark has every request.
#[derive(Default)]
pub(crate) struct OpenTickets {
    n: AtomicU64,
    settled: tokio::sync::Notify,
}

impl OpenTickets {
    /// Waits until none is open, or `limit` passes; whether none is.
    async fn settle(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.n.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return false;
            }
        }
    }

    fn open(self: &Arc<Self>) -> Arc<Self> {
        self.n.fetch_add(1, Ordering::AcqRel);
        self.clone()
    }

    fn close(&self) {
        if self.n.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.notify_waiters();
        }
    }
}

impl Ticket {
    fn with(&self, f: impl FnOnce(&mut ledger::Record)) {
        f(&mut crate::sync::lock(&self.0.record));
    }

    /// The model's prediction.
    pub fn predict(&self, p: Prediction) {
        self.with(|r| r.prediction = Some(p));
    }

    /// The response's usage, latencies and end.
    pub fn outcome(&self, outcome: Outcome) {
        self.with(|r| r.outcome = Some(outcome));
    }

    /// The request failed (an error answer, kvbust's or the upstream's): an error in the
    /// run's figures, never an accounted success.
    pub fn fail(&self, status: u16, side: Side) {
        self.with(|r| {
            r.failure = Some(Failure {
                status: status.to_string(),
                side,
            })
        });
    }

    /// Writes the request's access line when the ticket is counted, with the prediction.
    pub fn log_when_counted(
        &self,
        entry: crate::access_log::Entry,
        outcome: crate::access_log::Outcome,
    ) {
        *crate::sync::lock(&self.0.log) = Some((entry, outcome));
    }

    /// The run the request belongs to.
    pub fn run(&self) -> &Arc<RunCell> {
        &self.0.run
    }

    /// The model's prediction so far, for the access log (`None` until the model took it).
    pub fn prediction(&self) -> Option<Prediction> {
        crate::sync::lock(&self.0.record).prediction.clone()
    }

    /// The request asked for salt isolation on a route without a salt and was marked instead.
    pub fn salt_fallback(&self) {
        self.with(|r| r.salt_fallback = true);
    }

    /// The request was isolated by `cache_salt`.
    pub fn salted(&self) {
        self.with(|r| r.salted = true);
    }

    /// The cache-hit dial the request ran under.
    pub fn dial(&self, hit_ratio: f64) {
        self.with(|r| r.hit_ratio = Some(hit_ratio));
    }

    /// The request's capture row (written when the response ends).
    pub fn capture(&self, row: capture::Pending) {
        self.with(|r| r.capture = Some(row));
    }
}

/// What the report says about the model, fixed at start.
struct Facts {
    enabled: bool,
    block_size: usize,
    tokenizer: String,
    chat_template: ChatTemplateMode,
    capacity_blocks: u64,
    max_memory: u64,
    topology: Topology,
}

/// Counters the worker keeps for the report (read at any time).
#[derive(Default)]
pub(crate) struct Stats {
    /// Capture is on: a request the model cannot take is a row lost too.
    capturing: bool,
    indexed_blocks: AtomicU64,
    evicted_blocks: AtomicU64,
    memory: AtomicU64,
    unaccounted: Mutex<BTreeMap<&'static str, u64>>,
}

/// The model's settings, resolved from the configuration.
#[derive(Clone)]
pub(crate) struct Settings {
    pub tokenizer: MockTokenizerSetting,
    pub template: ChatTemplateMode,
    /// `cache_model.chat_template_date`.
    pub date: crate::synth::tokenizer::pyjinja::TemplateDate,
    pub block_size: usize,
    /// Blocks the index holds: `capacity_blocks`, within half of `max_memory`.
    pub capacity: NonZeroUsize,
    /// Tokens the memo holds: a quarter of `max_memory`.
    pub memo_tokens: usize,
    /// `cache_model.max_prompt_bytes`.
    pub max_prompt_bytes: usize,
    /// Sessions whose last prompt is remembered (for collisions).
    pub sessions: NonZeroUsize,
    /// The model's threads' nice value (`cache_model.nice`).
    pub nice: i32,
    /// Threads that tokenize (`cache_model.threads`); 1: the worker does everything.
    pub threads: usize,
}

/// The queue to the model: one worker's, or the inlet of its prepare threads.
enum Queue {
    One(SyncSender<Queued>),
    Fanned(pipeline::Inlet<Queued>),
}

/// The model and the run ledger.
pub struct CacheModel {
    facts: Facts,
    settings: Settings,
    metrics: Metrics,
    runs: Arc<Runs>,
    /// Bumped by each upstream cache reset; every job carries the value it was submitted under,
    /// so the worker empties its index between the jobs before a reset and those after.
    epoch: AtomicU64,
    stats: Arc<Stats>,
    /// The queue to the worker, made (and the worker started) by the first job.
    queue: OnceLock<Option<Queue>>,
    queue_len: usize,
    queued_bytes: Arc<AtomicU64>,
    /// Bytes of bodies the queue may hold: a quarter of `max_memory`.
    queue_budget: u64,
    open: Arc<OpenTickets>,
    /// The engine's events (`cache_model.kv_events`): the endpoint, the subscription's
    /// counters, and the receiving end the worker takes when it starts.
    kv_events: Option<(String, Arc<events::EventStats>)>,
    kv_events_rx: Mutex<Option<std::sync::mpsc::Receiver<Vec<crate::mock::kv_events::KvEvent>>>>,
    /// `[capture]`'s settings when it is on; the writer, once started.
    capture_settings: Option<capture::Settings>,
    capture: Arc<OnceLock<Option<Arc<Capture>>>>,
    /// The cache-hit dial's prompt counter, loaded by the first request with a dial.
    dialer: OnceLock<Result<Arc<dial::Dialer>, String>>,
}

impl CacheModel {
    /// The cache-hit dial's prompt counter: the model's tokenizer, chat template mode and block
    /// size (loaded on first use; loading the tokenizer blocks for its parse).
    pub fn dialer(&self) -> Result<Arc<dial::Dialer>, String> {
        self.dialer
            .get_or_init(|| {
                let s = &self.settings;
                let t = crate::mock::tokenize::MockTokenizer::load(&s.tokenizer).map_err(|e| {
                    format!("cannot load the cache model's tokenizer for the dial: {e}")
                })?;
                let use_template = s.template == ChatTemplateMode::Auto;
                Ok(Arc::new(dial::Dialer::new(t, use_template, s.block_size)))
            })
            .clone()
    }

    /// The model for `config` (no thread and no tokenizer until the first request).
    pub fn new(config: &Config, metrics: Metrics, benchmark_id: String) -> Self {
        let c = &config.cache_model;
        let tokenizer = c
            .tokenizer
            .clone()
            .unwrap_or_else(|| match &config.synth.tokenizer {
                Some(p) => MockTokenizerSetting::Path(p.clone()),
                None => MockTokenizerSetting::Qwen3,
            });
        let max_memory = c.max_memory.as_u64();
        let by_memory = (max_memory / 2) / index::BYTES_PER_BLOCK as u64;
        let capacity = match c.capacity_blocks {
            0 => by_memory,
            n => n.min(by_memory),
        };
        let settings = Settings {
            tokenizer: tokenizer.clone(),
            template: c.chat_template,
            date: c.chat_template_date,
            block_size: c.block_size.max(1),
            capacity: NonZeroUsize::new(usize::try_from(capacity).unwrap_or(usize::MAX))
                .unwrap_or(NonZeroUsize::MIN),
            memo_tokens: usize::try_from(max_memory / 4 / 4).unwrap_or(usize::MAX),
            max_prompt_bytes: usize::try_from(c.max_prompt_bytes.as_u64()).unwrap_or(usize::MAX),
            sessions: NonZeroUsize::new(config.cache_bust.ledger_capacity.max(1))
                .unwrap_or(NonZeroUsize::MIN),
            nice: c.nice,
            threads: c.threads.max(1),
        };
        let capture_settings = capture_settings(config, &tokenizer);
        let (kv_events, kv_events_rx) = match c.kv_events.clone().filter(|_| c.enabled) {
            Some(endpoint) => {
                let stats = Arc::new(events::EventStats::default());
                let (tx, rx) = std::sync::mpsc::channel();
                events::spawn(endpoint.clone(), tx, stats.clone());
                (Some((endpoint, stats)), Some(rx))
            }
            None => (None, None),
        };
        Self {
            kv_events,
            kv_events_rx: Mutex::new(kv_events_rx),
            facts: Facts {
                enabled: c.enabled,
                block_size: settings.block_size,
                tokenizer: tokenizer.to_string(),
                chat_template: c.chat_template,
                capacity_blocks: capacity,
                max_memory,
                topology: resolve_topology(c, config),
            },
            settings,
            runs: Arc::new(Runs::new(
                metrics.clone(),
                runs::RunSettings {
                    idle_gap: config.run.idle_gap,
                    keep: config.run.keep,
                    auto_warmup: config.cache_bust.auto_warmup_requests,
                },
                benchmark_id,
            )),
            epoch: AtomicU64::new(0),
            metrics,
            stats: Arc::new(Stats {
                capturing: capture_settings.is_some(),
                ..Stats::default()
            }),
            capture_settings,
            capture: Arc::default(),
            queue: OnceLock::new(),
            queue_len: c.queue,
            queued_bytes: Arc::new(AtomicU64::new(0)),
            queue_budget: max_memory / 4,
            open: Arc::default(),
            dialer: OnceLock::new(),
        }
    }

    /// Waits until every request seen so far is counted (its response ended and the model
    /// took it), or `limit` passes; returns whether everything was counted.
    pub async fn settle(&self, limit: Duration) -> bool {
        self.open.settle(limit).await
    }

    /// The runs.
    pub fn runs(&self) -> &Arc<Runs> {
        &self.runs
    }

    /// The upstream's prefix cache was emptied (`by` says who asked): the model empties its
    /// index before the next request it takes, and the open runs note it.
    pub fn cache_reset(&self, by: &'static str) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.runs.note("cache_reset", by);
        self.metrics.cache_resets.with_label_values(&[by]).inc();
        tracing::info!(
            by,
            "the upstream's prefix cache was reset: the cache model forgets its index"
        );
    }

    /// Whether requests are captured (`[capture]`): the model then also needs the body as the
    /// workload sent it, before the marker.
    pub fn capturing(&self) -> bool {
        self.capture_settings.is_some()
    }

    /// Whether request bodies are handed to the model.
    pub fn enabled(&self) -> bool {
        self.facts.enabled
    }

    /// A ticket for one generation request of `run`, arrived at `at`.
    pub fn ticket(&self, at: Instant, phase: Phase, target: Target, run: Arc<RunCell>) -> Ticket {
        run.open.open();
        Ticket(Arc::new(TicketInner {
            capture: self.capture.clone(),
            open: self.open.open(),
            runs: self.runs.clone(),
            run,
            log: Mutex::new(None),
            record: Mutex::new(ledger::Record {
                at: Some(at),
                phase: Some(phase),
                target: Some(target),
                ..ledger::Record::default()
            }),
        }))
    }

    /// Starts the worker (it loads the tokenizer on its own thread) so that it is ready before
    /// the first requests, not a second after them with its queue full; `kvbust serve` calls
    /// it at start. Without it the first request starts the worker.
    pub fn start(&self) {
        if self.facts.enabled {
            self.queue.get_or_init(|| self.start_worker());
        }
    }

    /// The capture writer, started with the worker when `[capture]` is on.
    fn capture(&self) -> Option<Arc<Capture>> {
        self.capture
            .get_or_init(|| {
                let settings = self.capture_settings.clone()?;
                match Capture::start(settings, self.metrics.clone()) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::error!("{e}; capture is off");
                        None
                    }
                }
            })
            .clone()
    }

    /// Finishes the open capture file (at shutdown, once every request has ended).
    pub async fn finish_capture(&self) {
        if let Some(c) = self.capture.get().cloned().flatten() {
            let _ = tokio::task::spawn_blocking(move || c.finish()).await;
        }
    }

    /// Whether the queue's byte budget could take a job of `size` bytes now (a hint, read
    /// without a claim: [`CacheModel::submit`] decides). Lets a caller skip building a body
    /// the queue would refuse.
    pub fn has_room(&self, size: u64) -> bool {
        self.facts.enabled && self.queued_bytes.load(Ordering::Acquire) + size <= self.queue_budget
    }

    /// Counts the request `ticket` stands for as unaccounted (`queue_full`) without a job, as
    /// [`CacheModel::submit`] counts one the full queue refuses.
    pub fn refuse_full(&self, ticket: &Ticket) {
        if !self.facts.enabled {
            return;
        }
        ticket.with(|r| r.submitted = true);
        self.refuse(ticket, "queue_full");
    }

    /// Counts a submitted request as unaccounted for `reason`, on its ticket and in the metric.
    fn refuse(&self, ticket: &Ticket, reason: &'static str) {
        ticket.with(|r| r.unaccounted = Some(reason));
        self.unaccounted(reason);
    }

    /// Hands `job` to the worker; when the queue is full, counts it as unaccounted instead.
    /// Never blocks.
    pub fn submit(&self, job: Job) {
        if !self.facts.enabled {
            return;
        }
        let size = job.bytes();
        let ticket = job.ticket.clone();
        ticket.with(|r| r.submitted = true);
        let queued = self.queued_bytes.fetch_add(size, Ordering::AcqRel) + size;
        if queued > self.queue_budget {
            self.queued_bytes.fetch_sub(size, Ordering::AcqRel);
            return self.refuse(&ticket, "queue_full");
        }
        let refused = match self.queue.get_or_init(|| self.start_worker()) {
            Some(Queue::One(tx)) => match tx.try_send(Queued {
                job,
                epoch: self.epoch.load(Ordering::Acquire),
                events: self.events_mark(),
            }) {
                Ok(()) => None,
                Err(TrySendError::Full(_)) => Some("queue_full"),
                Err(TrySendError::Disconnected(_)) => Some("model_stopped"),
            },
            Some(Queue::Fanned(inlet)) => inlet
                .try_send(lane_key(&job.session), || Queued {
                    // Read as the job takes its number: in forwarding order.
                    epoch: self.epoch.load(Ordering::Acquire),
                    events: self.events_mark(),
                    job,
                })
                .err()
                .map(pipeline::Refused::reason),
            None => Some("model_stopped"),
        };
        if let Some(reason) = refused {
            self.queued_bytes.fetch_sub(size, Ordering::AcqRel);
            self.refuse(&ticket, reason);
        }
        self.metrics
            .model_queue
            .set(i64::try_from(self.queued_bytes.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
    }

    fn unaccounted(&self, reason: &'static str) {
        unaccounted(&self.metrics, &self.stats, reason);
    }

    /// The engine's event batches received so far: the worker applies exactly these before
    /// the job submitted now (what the engine had done when the request went to it).
    fn events_mark(&self) -> u64 {
        self.kv_events
            .as_ref()
            .map_or(0, |(_, s)| s.handed.load(Ordering::Acquire))
    }

    /// Starts the model's thread (`kvbust-cache-model`), which loads the tokenizer and, with
    /// `cache_model.threads` > 1, starts the prepare threads; the queue to it.
    fn start_worker(&self) -> Option<Queue> {
        let model = worker::Worker::new(
            self.settings.clone(),
            self.metrics.clone(),
            self.stats.clone(),
            self.queued_bytes.clone(),
            self.capture(),
            crate::sync::lock(&self.kv_events_rx)
                .take()
                .zip(self.kv_events.as_ref().map(|(_, s)| s.clone())),
        );
        let nice = self.settings.nice;
        let (queue, run): (Queue, Box<dyn FnOnce() + Send>) = match self.settings.threads {
            0 | 1 => {
                let (tx, rx) = sync_channel(self.queue_len);
                (Queue::One(tx), Box::new(move || model.run(rx)))
            }
            n => {
                let (inlet, outlet) = pipeline::channel(n, self.queue_len);
                (
                    Queue::Fanned(inlet),
                    Box::new(move || model.run_fanned(outlet)),
                )
            }
        };
        let spawned = std::thread::Builder::new()
            .name("kvbust-cache-model".into())
            .spawn(move || {
                // Set from inside: a nice value is the thread's own, and taking it before the
                // tokenizer loads keeps even that off the data workers' CPU.
                priority::lower_this_thread(nice);
                run()
            });
        match spawned {
            Ok(_) => Some(queue),
            Err(e) => {
                tracing::error!("cannot start the cache model's thread: {e}; the model is off");
                None
            }
        }
    }

    /// The current run's report.
    pub fn report(&self) -> report::Report {
        self.report_of(&self.runs.current())
    }

    /// `run`'s report now.
    pub fn report_of(&self, run: &RunCell) -> report::Report {
        self.runs.report(run, self.facts())
    }

    fn facts(&self) -> report::ModelFacts {
        let s = &self.stats;
        let unaccounted = crate::sync::lock(&s.unaccounted)
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let f = &self.facts;
        let note = (f.topology == Topology::Shared).then(|| {
            "the upstream may be several engine replicas (a Service): predictions assume one \
             shared cache, so they overstate hits a replica could not see; run kvbust as a \
             sidecar of each engine for exact figures"
                .to_string()
        });
        report::ModelFacts {
            enabled: f.enabled,
            block_size: f.block_size,
            tokenizer: f.tokenizer.clone(),
            chat_template: f.chat_template.as_str().into(),
            capacity_blocks: f.capacity_blocks,
            max_memory: f.max_memory,
            indexed_blocks: s.indexed_blocks.load(Ordering::Relaxed),
            evicted_blocks: s.evicted_blocks.load(Ordering::Relaxed),
            unaccounted,
            topology: f.topology.as_str().into(),
            kv_events: self.kv_events.as_ref().map(|(e, s)| s.facts(e)),
            note,
        }
    }
}

/// The key that keeps a session's jobs on one prepare thread, when the request side knows it:
/// the session given outright, else the first header source's digest. Only a hint for the
/// memo: the model resolves the session itself.
fn lane_key(hint: &SessionHint) -> Option<u64> {
    hint.known
        .map(|(key, _)| key)
        .or_else(|| hint.sources.iter().find_map(|(_, digest)| *digest))
}

/// Counts one request the model did not account for.
pub(crate) fn unaccounted(metrics: &Metrics, stats: &Stats, reason: &'static str) {
    metrics.model_unaccounted.with_label_values(&[reason]).inc();
    *crate::sync::lock(&stats.unaccounted)
        .entry(reason)
        .or_default() += 1;
    if stats.capturing {
        metrics
            .capture_dropped
            .with_label_values(&["unaccounted"])
            .inc();
    }
}

/// `[capture]` resolved, when it is on (the key was checked by the configuration's validation;
/// a key that went missing since is an error logged here, and capture stays off).
fn capture_settings(
    config: &Config,
    tokenizer: &MockTokenizerSetting,
) -> Option<capture::Settings> {
    let c = &config.capture;
    if !c.enabled || !config.cache_model.enabled {
        return None;
    }
    let key = match &c.key_file {
        Some(p) => match capture::Key::load(p) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::error!("capture.key_file: {e}; capture is off");
                return None;
            }
        },
        None => None,
    };
    Some(capture::Settings {
        dir: c.dir.clone(),
        block_size: c.block_size.max(1),
        rendering: match c.chat_template {
            ChatTemplateMode::None => capture::Rendering::Contents,
            ChatTemplateMode::Auto => capture::Rendering::AsModel,
        },
        rotate: c.rotate,
        rotate_rows: c.rotate_rows.max(1),
        min_sessions: c.min_sessions_per_shared_block.max(1),
        hash_key: key.clone().unwrap_or_else(capture::Key::random),
        key,
        flush: c.flush,
        tokenizer: tokenizer.to_string(),
    })
}

/// `cache_model.topology`, with `auto` decided: one engine on this host (or the built-in mock)
/// is a sidecar; anything else may be a Service of several replicas.
fn resolve_topology(c: &CacheModelConfig, config: &Config) -> Topology {
    if c.topology != Topology::Auto {
        return c.topology;
    }
    let local = match config.upstream_url() {
        Ok(None) => true,
        Ok(Some(url)) => {
            let host = url.host().host();
            host == "localhost"
                || host
                    .trim_matches(|c| c == '[' || c == ']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        Err(_) => false,
    };
    if local {
        Topology::Sidecar
    } else {
        Topology::Shared
    }
}
