//! The model's worker: takes jobs in forwarding order, and for each parses the body as the
//! engine does, resolves its session, tokenizes it ([`prepare`]: order-independent, run on
//! `cache_model.threads` threads at once when there are several), then serves it against the
//! index, attributes the hit, checks the session's continuity and hands the prediction to the
//! request's ticket ([`Worker::apply`]: strictly in forwarding order, on one thread). Owns the
//! model's state (tokenizer, memos, index, session table); never touches the network and never
//! blocks a request (it only ever waits for its own queues).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use lru::LruCache;

use crate::api::Shape;
use crate::cachebust::{Phase, Target};
use crate::config::{ChatTemplateMode, SessionSource};
use crate::metrics::Metrics;
use crate::mock::request::Prompt;
use crate::mock::MockTokenizerSetting;
use crate::synth::tokenizer::Tokenizer;

use crate::capture::turns::{Seen, Turns};
use crate::capture::{self, Capture, Rendering};

use super::attribution::{self, Breach, Requester, Turn};
use super::events::{EventStats, Follow};
use super::index::{chain_salted, BlockIndex, Owner, BYTES_PER_BLOCK};
use super::pipeline::Outlet;
use super::tokens::{self, EncodeError, Encoded, IsoHint, Memo, Vocab};
use super::{session_digest, unaccounted, Job, Prediction, Queued, SessionHint, Settings, Stats};
use crate::mock::kv_events::KvEvent;

/// What the model remembers of a session: its context's branches (what its next request must
/// share), and whether its breach was logged.
#[derive(Default)]
struct SessionState {
    branches: attribution::Branches,
    logged: bool,
}

/// Memory one remembered session costs: its key, state, and the LRU's links and map entry.
const BYTES_PER_SESSION: usize =
    std::mem::size_of::<u64>() + std::mem::size_of::<SessionState>() + 32;

pub(super) struct Worker {
    settings: Settings,
    metrics: Metrics,
    stats: Arc<Stats>,
    queued_bytes: Arc<AtomicU64>,
    capture: Option<Arc<Capture>>,
    /// The engine's KV cache events and the subscription's counters, when followed.
    events: Option<(Receiver<Vec<KvEvent>>, Arc<EventStats>)>,
}

/// What every prepare stage reads: the tokenizer (loaded once, on the model's thread: it takes
/// a moment) and the settings preparing needs.
pub(super) struct Shared {
    vocab: Vocab,
    block_size: usize,
    /// How capture counts a row's tokens, when capture is on.
    capture: Option<Rendering>,
}

/// The ordered state: what the apply stage keeps from one job to the next.
struct Model {
    index: BlockIndex,
    sessions: LruCache<u64, SessionState>,
    anonymous: u64,
    /// Capture's view of each session's turns, and the next row's number.
    turns: Turns,
    seq: u64,
    /// The engine's block hashes mapped to the index's (`cache_model.kv_events`).
    follow: Follow,
    /// The upstream cache's epoch the index is of, and the engine's event batches applied.
    epoch: u64,
    applied: u64,
    /// Bytes of each prepare thread's memo, as its last job left it.
    memos: Vec<usize>,
}

/// A job as the prepare stage left it for the apply stage.
pub(super) struct Prepared {
    job: Job,
    epoch: u64,
    events: u64,
    work: Result<Work, Skip>,
    /// The prepare thread's number and its memo's bytes after this job.
    memo: (usize, usize),
}

/// Why a job is not served.
#[derive(Debug)]
enum Skip {
    /// The tokenizer did not load: `tokenizer_error`, for every job.
    NoModel,
    /// Unaccounted for this reason (`unparseable`, `too_large`, ...), marked on the ticket.
    Unaccounted(&'static str),
}

/// The order-independent part of serving a job.
struct Work {
    encoded: Encoded,
    /// `encoded`'s block hashes, keyed by the body's `cache_salt`.
    hashes: Vec<u64>,
    /// The session key's digest and source; `None`: an anonymous session.
    session: Option<(u64, &'static str)>,
    /// Capture's tokens (when capture is on), or why there are none.
    capture: Option<Result<RowTokens, String>>,
}

/// A capture row's tokens as far as they are known before the job's turn.
struct RowTokens {
    /// The hash ids' namespace: the workload's own `cache_salt`.
    namespace: Option<String>,
    ids: RowIds,
}

enum RowIds {
    /// A chat counted by its messages' contents: each message's fingerprint, bytes and ids.
    /// Which messages the row counts, the session's earlier turns decide (in order).
    Contents {
        seen: Vec<Seen>,
        bytes: Vec<usize>,
        ids: Vec<Result<Vec<u32>, EncodeError>>,
    },
    /// The model's own ids: nothing changed the prompt in between.
    Model,
    /// The workload's prompt, tokenized as the model tokenizes.
    Own(Vec<u32>),
}

impl Worker {
    pub(super) fn new(
        settings: Settings,
        metrics: Metrics,
        stats: Arc<Stats>,
        queued_bytes: Arc<AtomicU64>,
        capture: Option<Arc<Capture>>,
        events: Option<(Receiver<Vec<KvEvent>>, Arc<EventStats>)>,
    ) -> Self {
        Self {
            settings,
            metrics,
            stats,
            queued_bytes,
            capture,
            events,
        }
    }

    /// Applies the engine's event batches up to `mark` (those received before this job was
    /// submitted): the index then holds what the engine held when the request went to it, as
    /// far as the engine told, however far the worker lags behind.
    fn follow(&self, m: &mut Model, mark: u64) {
        let Some((rx, stats)) = &self.events else {
            return;
        };
        while m.applied < mark {
            // Counted only once sent: the batch is in the channel.
            let Ok(events) = rx.recv() else {
                return;
            };
            m.follow.apply(&mut m.index, events, stats);
            m.applied += 1;
        }
    }

    /// `cache_model.threads = 1`: prepares and applies each job in turn on this thread, until
    /// every sender is gone.
    pub(super) fn run(self, jobs: Receiver<Queued>) {
        let shared = self.load();
        let mut memo = self.memo(1);
        let mut model = self.model(1);
        for queued in jobs {
            let prepared = prepare(shared.as_ref(), &mut memo, queued);
            self.apply(&mut model, prepared);
        }
    }

    /// `cache_model.threads` > 1: prepares on the outlet's threads (each with its share of the
    /// memo) and applies here, in forwarding order, until the inlet is gone and all is drained.
    pub(super) fn run_fanned(self, jobs: Outlet<Queued>) {
        let shared = self.load();
        let n = jobs.threads();
        let memos = (0..n).map(|k| (k, self.memo(n))).collect();
        let mut model = self.model(n);
        let nice = self.settings.nice;
        jobs.run(
            nice,
            memos,
            |(k, memo): &mut (usize, Memo), queued| {
                let mut prepared = prepare(shared.as_ref(), memo, queued);
                prepared.memo.0 = *k;
                prepared
            },
            |prepared| self.apply(&mut model, prepared),
        );
    }

    /// The shared tokenizer; `None` (logged) when it does not load: every job is then counted
    /// as unaccounted.
    fn load(&self) -> Option<Shared> {
        let s = &self.settings;
        let use_template = s.template == ChatTemplateMode::Auto;
        let tokenizer = match &s.tokenizer {
            MockTokenizerSetting::Builtin => None,
            MockTokenizerSetting::Qwen3 => Some(Tokenizer::default_qwen3()),
            MockTokenizerSetting::Path(p) => Some(Tokenizer::from_path(p)),
        };
        let vocab = match tokenizer {
            None => Ok(Vocab::Builtin),
            Some(Err(e)) => Err(format!("cannot load cache_model.tokenizer: {e}")),
            Some(Ok(t)) => {
                Vocab::hf_dated(Arc::new(t), use_template, s.date).map_err(|e| e.to_string())
            }
        };
        match vocab {
            Ok(vocab) => Some(Shared {
                vocab,
                block_size: s.block_size,
                capture: self.capture.as_ref().map(|c| c.settings.rendering),
            }),
            Err(e) => {
                tracing::error!("cache model: {e}; requests are counted as unaccounted");
                None
            }
        }
    }

    /// One prepare thread's memo, of `threads`: its share of the memo's tokens.
    fn memo(&self, threads: usize) -> Memo {
        let s = &self.settings;
        Memo::new(s.memo_tokens / threads.max(1)).bounded(s.max_prompt_bytes)
    }

    fn model(&self, threads: usize) -> Model {
        let s = &self.settings;
        Model {
            index: BlockIndex::new(s.block_size, s.capacity),
            sessions: LruCache::new(s.sessions),
            anonymous: 0,
            turns: Turns::new(s.sessions),
            seq: 0,
            follow: Follow::default(),
            epoch: 0,
            applied: 0,
            memos: vec![0; threads.max(1)],
        }
    }

    /// The order-dependent part of a job, in forwarding order: the cache resets and the
    /// engine's events before it, then serving it (or counting why not); then its bytes leave
    /// the queue.
    fn apply(&self, m: &mut Model, p: Prepared) {
        let size = p.job.bytes();
        let loaded = !matches!(p.work, Err(Skip::NoModel));
        if loaded {
            if p.epoch != m.epoch {
                // The upstream's cache was emptied between the last job and this one.
                m.epoch = p.epoch;
                let s = &self.settings;
                m.index = BlockIndex::new(s.block_size, s.capacity);
            }
            self.follow(m, p.events);
            if let Some(bytes) = m.memos.get_mut(p.memo.0) {
                *bytes = p.memo.1;
            }
        }
        match p.work {
            Ok(w) => self.serve(m, p.job, w),
            // Counted in the model's figures only, as ever: the ticket says `not_modelled`.
            Err(Skip::NoModel) => unaccounted(&self.metrics, &self.stats, "tokenizer_error"),
            Err(Skip::Unaccounted(reason)) => {
                p.job.ticket.with(|r| r.unaccounted = Some(reason));
                unaccounted(&self.metrics, &self.stats, reason);
            }
        }
        self.queued_bytes.fetch_sub(size, Ordering::AcqRel);
        if loaded {
            self.publish(m);
        }
    }

    fn publish(&self, m: &Model) {
        let s = &self.stats;
        s.indexed_blocks
            .store(m.index.len() as u64, Ordering::Relaxed);
        s.evicted_blocks.store(m.index.evicted(), Ordering::Relaxed);
        let bytes = m.index.len() * BYTES_PER_BLOCK
            + m.sessions.len() * BYTES_PER_SESSION
            + m.memos.iter().sum::<usize>()
            + self.queued_bytes.load(Ordering::Relaxed) as usize;
        s.memory.store(bytes as u64, Ordering::Relaxed);
        self.metrics
            .model_blocks
            .set(i64::try_from(m.index.len()).unwrap_or(i64::MAX));
        self.metrics
            .model_memory
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.metrics
            .model_queue
            .set(i64::try_from(self.queued_bytes.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
    }

    /// Serves a prepared job against the index, attributes the hit, follows its session, and
    /// hands the prediction (and capture row) to its ticket.
    fn serve(&self, m: &mut Model, job: Job, w: Work) {
        let Work {
            encoded,
            hashes,
            session,
            capture,
        } = w;
        let (session, source) = match session {
            Some((key, source)) => (key, Some(source)),
            None => {
                // No key: a session of its own, never remembered.
                m.anonymous += 1;
                (u64::MAX - m.anonymous, None)
            }
        };
        let bs = self.settings.block_size;
        let iso_block = encoded.iso.map(|t| t / bs);
        let (phase, target) = (job.phase, job.target);
        let hit = m.index.serve(&hashes, encoded.ids.len(), |i| Owner {
            session,
            phase,
            past_iso: iso_block.is_some_and(|b| i >= b),
        });
        let me = Requester {
            session,
            phase,
            target,
            iso_block,
        };
        let (reuse, mut breaches) = attribution::attribute(&hit.owners, bs, &me);
        let breach_tokens = attribution::breach_tokens(&hit.owners, bs, &me);
        let turn = match source {
            Some(_) => follow(&mut m.sessions, session, &encoded.ids, &hashes, bs),
            None => Turn::Extends,
        };
        if turn == Turn::Collision && attribution::guards_sessions(target) {
            breaches.push(Breach::SessionCollision);
        }
        let compaction = turn == Turn::Compaction;
        if !breaches.is_empty() {
            self.log_breaches(m, session, source, &job, &breaches);
        }
        if let Some(tokens) = capture {
            self.capture(
                m,
                &job,
                tokens,
                &encoded.ids,
                source.is_some().then_some(session),
            );
        }
        let cached = (hit.owners.len() * bs) as u64;
        self.count(phase, target, cached, &reuse, &breaches);
        if compaction {
            self.metrics
                .model_compactions
                .with_label_values(&[phase.as_str(), target.as_str()])
                .inc();
        }
        job.ticket.predict(Prediction {
            prompt_tokens: encoded.ids.len() as u64,
            cached,
            reuse,
            breaches,
            breach_tokens,
            compaction,
        });
    }

    /// Hands the request's capture row to its ticket, when capture is on.
    fn capture(
        &self,
        m: &mut Model,
        job: &Job,
        tokens: Result<RowTokens, String>,
        ids: &[u32],
        session: Option<u64>,
    ) {
        let Some(c) = &self.capture else {
            return;
        };
        let max = self.settings.max_prompt_bytes;
        match tokens.and_then(|t| capture_row(m, c, t, ids, session, max)) {
            Ok(row) => job.ticket.capture(row),
            Err(e) => {
                tracing::debug!("capture: {e}");
                self.metrics
                    .capture_dropped
                    .with_label_values(&["unaccounted"])
                    .inc();
            }
        }
    }

    fn count(
        &self,
        phase: Phase,
        target: Target,
        cached: u64,
        reuse: &crate::report::Reuse,
        breaches: &[Breach],
    ) {
        let labels = [phase.as_str(), target.as_str()];
        self.metrics
            .predicted_cached_tokens
            .with_label_values(&labels)
            .inc_by(cached);
        for (source, n) in [
            ("same_session", reuse.same_session),
            ("other_session", reuse.other_session),
            ("warmup", reuse.warmup),
        ] {
            if n > 0 {
                self.metrics
                    .reuse_tokens
                    .with_label_values(&[labels[0], labels[1], source])
                    .inc_by(n);
            }
        }
        for b in breaches {
            self.metrics
                .isolation_breaches
                .with_label_values(&[labels[0], labels[1], b.as_str()])
                .inc();
        }
    }

    /// One warning per session (the first breach of it), naming the session-key source and the fix.
    fn log_breaches(
        &self,
        m: &mut Model,
        session: u64,
        source: Option<&'static str>,
        job: &Job,
        breaches: &[Breach],
    ) {
        if let Some(s) = m.sessions.get_mut(&session) {
            if s.logged {
                return;
            }
            s.logged = true;
        }
        let source = source.unwrap_or("none (each request its own session)");
        for b in breaches {
            let fix = match b {
                Breach::SessionCollision => "two conversations share this session key, so they share one RID and one cache path: send a distinct x-correlation-id per conversation, or put a finer source first in cache_bust.session_sources",
                Breach::CrossSession => "another session put these blocks there with the same marker: give each conversation its own explicit RID inputs (x-kvbust-trace-id, x-kvbust-trajectory-index) or session key",
                Breach::WarmupReuse => "warmup requests put these blocks there unmarked: send warmup with x-kvbust-phase: warmup and without an x-kvbust-target override",
            };
            tracing::warn!(
                kind = b.as_str(),
                phase = job.phase.as_str(),
                target = job.target.as_str(),
                session = format!("{session:016x}"),
                session_source = source,
                "isolation breach: {fix}"
            );
        }
    }
}

/// The order-independent part of a job: parses the body, tokenizes it (from `memo`), resolves
/// its session key and hashes its blocks, and tokenizes what capture needs. Reads no state a
/// job leaves for the next (`memo` only saves work: its ids are those the tokenizer gives), so
/// jobs may be prepared on any thread, in any order. `shared` is `None` when the tokenizer did
/// not load.
fn prepare(shared: Option<&Shared>, memo: &mut Memo, queued: Queued) -> Prepared {
    let Queued { job, epoch, events } = queued;
    let work = match shared {
        Some(s) => work(s, memo, &job),
        None => Err(Skip::NoModel),
    };
    Prepared {
        job,
        epoch,
        events,
        work,
        memo: (0, memo.bytes()),
    }
}

fn work(s: &Shared, memo: &mut Memo, job: &Job) -> Result<Work, Skip> {
    // The body's `cache_salt` (kvbust's, or the client's own) keys the index as it keys the
    // engine's cache: it joins the first block's hash.
    let (prompt, salt) = match crate::mock::openai::parse_request(job.shape, &job.body, "") {
        Ok(req) => (req.prompt, req.cache_salt),
        Err(_) => return Err(Skip::Unaccounted("unparseable")),
    };
    let iso = iso_hint(job, &prompt);
    let encoded = tokens::encode(&s.vocab, memo, &prompt, &iso).map_err(|e| {
        tracing::debug!("cache model: {e}");
        Skip::Unaccounted(e.reason())
    })?;
    let session = resolve_session(
        &job.session,
        job.shape,
        &job.body,
        job.user_context_messages,
    );
    let hashes = chain_salted(&encoded.ids, s.block_size, salt.as_deref());
    let capture = s
        .capture
        .map(|rendering| row_tokens(s, memo, rendering, job, &prompt, salt));
    Ok(Work {
        encoded,
        hashes,
        session,
        capture,
    })
}

/// The capture row's tokens of `job`: the workload's prompt (before kvbust's marker or salt)
/// as capture counts it. A client's own `cache_salt` is part of the workload: the namespace of
/// its hash ids (`salt`: the forwarded body's, which is the client's when kvbust changed
/// nothing). A chat counted by contents has each message tokenized on its own, so the apply
/// stage can pick the ones the session's turns leave to count (its earlier messages come from
/// the memo).
fn row_tokens(
    s: &Shared,
    memo: &mut Memo,
    rendering: Rendering,
    job: &Job,
    prompt: &Prompt,
    salt: Option<String>,
) -> Result<RowTokens, String> {
    let parsed;
    let (workload, namespace) = match &job.workload {
        Some(body) => {
            parsed = crate::mock::openai::parse_request(job.shape, body, "")
                .map_err(|_| "the body before the marker does not parse".to_string())?;
            (&parsed.prompt, parsed.cache_salt.clone())
        }
        None => (prompt, salt),
    };
    let ids = match (rendering, workload) {
        (Rendering::Contents, Prompt::Messages(_) | Prompt::Chat(_)) => {
            let ms = workload.messages().unwrap_or_default();
            RowIds::Contents {
                seen: ms.iter().map(|x| Seen::new(&x.role, &x.content)).collect(),
                bytes: ms.iter().map(|x| x.content.len()).collect(),
                ids: ms
                    .iter()
                    .map(|x| tokens::encode_contents(&s.vocab, memo, [x]))
                    .collect(),
            }
        }
        _ if job.workload.is_none() => RowIds::Model,
        _ => RowIds::Own(
            tokens::encode(&s.vocab, memo, workload, &IsoHint::None)
                .map_err(|e| e.to_string())?
                .ids,
        ),
    };
    Ok(RowTokens { namespace, ids })
}

/// The capture row of a job, in forwarding order: the messages its session's turns leave to
/// count (a chat counted by contents; at most `max` bytes of them, as one prompt), or its whole
/// prompt, reusing the model's ids where they are the same tokens; then its block hashes.
fn capture_row(
    m: &mut Model,
    c: &Capture,
    tokens: RowTokens,
    model_ids: &[u32],
    session: Option<u64>,
    max: usize,
) -> Result<capture::Pending, String> {
    let (ids, session, follows) = match tokens.ids {
        RowIds::Contents { seen, bytes, ids } => {
            let plan = m.turns.plan(session, &seen);
            let picked = plan.messages.iter().filter_map(|&i| bytes.get(i)).sum();
            tokens::admit(picked, max).map_err(|e| e.to_string())?;
            let mut row = Vec::new();
            for got in plan.messages.iter().filter_map(|&i| ids.get(i)) {
                row.extend_from_slice(got.as_ref().map_err(|e| e.to_string())?);
            }
            (row, plan.session, plan.follows)
        }
        RowIds::Model => (model_ids.to_vec(), None, false),
        RowIds::Own(ids) => (ids, None, false),
    };
    let seq = m.seq;
    m.seq += 1;
    Ok(capture::Pending {
        seq,
        input_length: ids.len() as u64,
        blocks: capture::ids::chain_in(
            &ids,
            c.settings.block_size,
            Some(&c.settings.hash_key),
            tokens.namespace.as_deref(),
        ),
        session,
        follows,
    })
}

/// What `session`'s request did to its context (extends it, cut it back, or a second
/// conversation under the key); remembers it as the end of the branch it follows. A session
/// the table forgot (least recently used) starts again.
fn follow(
    sessions: &mut LruCache<u64, SessionState>,
    session: u64,
    ids: &[u32],
    hashes: &[u64],
    bs: usize,
) -> Turn {
    sessions
        .get_or_insert_mut(session, SessionState::default)
        .branches
        .follow(ids, hashes, bs)
}

/// Where the request's isolation point is: at the marker kvbust put in (`Job::marker`); for a
/// profiling request of a `warmup_isolation_*` target (it carries no marker), where the warmup
/// marker sat.
fn iso_hint(job: &Job, prompt: &Prompt) -> IsoHint {
    if let Some(m) = &job.marker {
        return m.clone();
    }
    if !job.target.is_warmup_isolation() {
        return IsoHint::None;
    }
    let Some(messages) = prompt.messages() else {
        return IsoHint::MessageStart(0);
    };
    let is_system = |r: &str| r == "system" || r == "developer";
    if job.target.is_system() && messages.first().is_some_and(|m| is_system(&m.role)) {
        return IsoHint::MessageStart(0);
    }
    messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == "user")
        .nth(job.user_context_messages)
        .map_or(IsoHint::None, |(i, _)| IsoHint::MessageStart(i))
}

/// The session key's digest and the name of the source that gave it: the first configured
/// source with a value (body sources read from the forwarded body).
fn resolve_session(
    hint: &SessionHint,
    shape: Shape,
    body: &[u8],
    user_context: usize,
) -> Option<(u64, &'static str)> {
    if let Some((key, source)) = hint.known {
        return Some((key, source));
    }
    let mut parsed = None;
    for (source, value) in &hint.sources {
        let key = match source {
            SessionSource::XCorrelationId | SessionSource::XSessionId => *value,
            SessionSource::BodyUser | SessionSource::FirstUserTurn => {
                let p = parsed.get_or_insert_with(|| crate::cachebust::parse(shape, body).ok());
                p.as_ref().and_then(|p| match source {
                    SessionSource::BodyUser => p
                        .user_field()
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(session_digest),
                    _ => p
                        .first_user_turn_hash(user_context)
                        .as_deref()
                        .map(session_digest),
                })
            }
        };
        if let Some(key) = key {
            return Some((key, source_name(*source)));
        }
    }
    None
}

/// A session source as a log line names it.
pub(crate) fn source_name(s: SessionSource) -> &'static str {
    match s {
        SessionSource::XCorrelationId => "x_correlation_id",
        SessionSource::XSessionId => "x_session_id",
        SessionSource::BodyUser => "body_user",
        SessionSource::FirstUserTurn => "first_user_turn",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sessions are judged apart, and the table is bounded: a session it forgot (least
    /// recently used) starts again, so its next request opens it rather than cutting it back.
    /// (session, prompt's messages of 8 tokens) → what the request did.
    #[test]
    fn each_session_follows_its_own_branches_within_the_table() {
        use Turn::{Collision as X, Compaction as C, Extends as E};
        let bs = 4;
        let conv = |m: &[u32]| -> Vec<u32> { m.iter().flat_map(|m| m * 8..m * 8 + 8).collect() };
        type Case = (&'static str, usize, Vec<(u64, Vec<u32>)>, Vec<Turn>);
        let cases: Vec<Case> = vec![
            (
                "one session cuts back while another grows: its own compaction only",
                2,
                vec![
                    (1, vec![0, 1]),
                    (2, vec![0, 5]),
                    (1, vec![0, 1, 2]),
                    (2, vec![0, 5, 6]),
                    (1, vec![0, 9]),
                    (2, vec![0, 5, 6, 7]),
                    (1, vec![0, 9, 10]),
                ],
                vec![E, E, E, E, C, E, E],
            ),
            (
                "two first turns under one key: a collision",
                2,
                vec![(1, vec![0, 1]), (1, vec![0, 5]), (1, vec![0, 1, 2])],
                vec![E, X, X],
            ),
            (
                "a forgotten session opens again: no compaction, no collision",
                1,
                vec![
                    (1, vec![0, 1]),
                    (1, vec![0, 1, 2]),
                    (2, vec![0, 5]),
                    (1, vec![0, 9]),
                ],
                vec![E, E, E, E],
            ),
        ];
        for (name, capacity, requests, want) in cases {
            let cap = std::num::NonZeroUsize::new(capacity).unwrap_or(std::num::NonZeroUsize::MIN);
            let mut sessions = LruCache::new(cap);
            let got: Vec<Turn> = requests
                .iter()
                .map(|(s, m)| {
                    let ids = conv(m);
                    follow(&mut sessions, *s, &ids, &chain_salted(&ids, bs, None), bs)
                })
                .collect();
            assert_eq!(got, want, "{name}");
            assert!(sessions.len() <= capacity, "{name}");
        }
    }
}

/// `cache_model.threads`: the same jobs, tokenized on one thread or on four and put back in
/// order, get the same predictions, the same unaccounted reasons and the same capture rows.
#[cfg(test)]
mod threads {
    use std::sync::mpsc::sync_channel;
    use std::time::Instant;

    use bytes::Bytes;
    use serde_json::json;

    use super::super::{lane_key, pipeline, CacheModel, Ticket};
    use super::*;
    use crate::config::Config;
    use crate::units::ByteSize;

    /// One step of a benchmark as the model sees it: a job, or the upstream's cache emptied.
    enum Step {
        Job(Spec),
        Reset,
    }

    struct Spec {
        shape: Shape,
        body: serde_json::Value,
        phase: Phase,
        target: Target,
        /// The RID marker kvbust put at the start of the first user message.
        rid: Option<&'static str>,
        session: SessionHint,
    }

    const TEAM: &str = "You are a careful coding assistant. Answer with short, tested code, \
                        name every assumption, and prefer the standard library. ";

    /// Six conversations of four turns, interleaved ([`turn`]), after warmup requests; between
    /// rounds the odd jobs ([`odd`]); the upstream's cache is reset halfway.
    fn script() -> Vec<Step> {
        let mut steps = Vec::new();
        for w in 0..3 {
            steps.push(Step::Job(Spec {
                shape: Shape::Chat,
                body: json!({"model": "m", "messages": [
                    {"role": "system", "content": system(4)},
                    {"role": "user", "content": format!("warm up {w}")},
                ]}),
                phase: Phase::Warmup,
                target: Target::WarmupIsolationSystem,
                rid: None,
                session: SessionHint::default(),
            }));
        }
        for round in 0..4 {
            if round == 2 {
                steps.push(Step::Reset);
            }
            steps.extend((0..6).map(|c| Step::Job(turn(c, round))));
            steps.extend(odd(round).map(Step::Job));
        }
        steps
    }

    /// Conversation `c`'s system prompt (2 starts as 1 does).
    fn system(c: usize) -> String {
        let team = if c == 2 { 1 } else { c % 2 };
        format!("{}Team {team}. {}", TEAM.repeat(6), TEAM)
    }

    /// Conversation `c`'s request of `round`: a session key given outright (0), by header (1,
    /// 4), in the body (2) and none (3); 1 and 2 open alike under one RID (a cross-session
    /// breach), 5 is a second conversation under 0's key (a collision), 4 runs under warmup
    /// isolation with the warmup requests' system prompt (warmup reuse).
    fn turn(c: usize, round: usize) -> Spec {
        let key = |c: usize| session_digest(&format!("conversation {c}"));
        let (target, rid) = match c {
            0 => (Target::FirstTurnPrefix, Some("00000000000a")),
            1 | 2 => (Target::FirstTurnPrefix, Some("0000000000bb")),
            3 => (Target::None, None),
            4 => (Target::WarmupIsolationSystem, None),
            _ => (Target::FirstTurnPrefix, Some("00000000000c")),
        };
        let (known, sources) = match c {
            0 | 5 => (Some((key(0), "synthesized_conversation")), Vec::new()),
            1 | 4 => (None, vec![(SessionSource::XCorrelationId, Some(key(c)))]),
            2 => (
                None,
                vec![
                    (SessionSource::XCorrelationId, None),
                    (SessionSource::BodyUser, None),
                ],
            ),
            _ => (None, Vec::new()),
        };
        let opening = format!("Write a parser for format {}.", if c == 2 { 1 } else { c });
        let mut messages = vec![
            json!({"role": "system", "content": system(c)}),
            json!({"role": "user", "content": opening}),
        ];
        for t in 0..round {
            let answer = format!("Step {t} of {c}: {}", "fn step() {}\n".repeat(20 + t));
            messages.push(json!({"role": "assistant", "content": answer}));
            messages.push(json!({"role": "user", "content": format!("Now turn {}.", t + 1)}));
        }
        Spec {
            shape: Shape::Chat,
            body: json!({"model": "m", "messages": messages, "user": format!("user {c}")}),
            phase: Phase::Profiling,
            target,
            rid,
            session: SessionHint { known, sources },
        }
    }

    /// The jobs between two rounds: a distinct 16 KB prompt, a completions prompt, and a body
    /// that does not parse (even rounds) or one past `max_prompt_bytes` (odd ones).
    fn odd(round: usize) -> impl Iterator<Item = Spec> {
        let distinct = (0..400)
            .map(|i| format!("line {i} of distinct prompt {round}: {}", i * 7919 + round))
            .collect::<Vec<_>>()
            .join("\n");
        let last = match round % 2 {
            0 => (Shape::Chat, json!("not a request")),
            _ => (
                Shape::Chat,
                json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(70_000)}]}),
            ),
        };
        [
            (
                Shape::Chat,
                json!({"model": "m", "messages": [{"role": "user", "content": distinct}]}),
            ),
            (
                Shape::Completions,
                json!({"model": "m", "prompt": format!("{TEAM} completion {round}")}),
            ),
            last,
        ]
        .into_iter()
        .map(|(shape, body)| Spec {
            shape,
            body,
            phase: Phase::Profiling,
            target: Target::None,
            rid: None,
            session: SessionHint::default(),
        })
    }

    /// The job of `spec`: its body with the RID marker put in (and the body before it, for
    /// capture), and its ticket.
    fn job(model: &CacheModel, spec: Spec) -> Job {
        let workload = Bytes::from(spec.body.to_string());
        let (body, workload) = match spec.rid {
            Some(rid) => {
                let mut marked = spec.body.clone();
                let first = &mut marked["messages"][1]["content"];
                let text = first.as_str().unwrap_or_default().to_string();
                *first = json!(format!("[rid:{rid}]\n\n{text}"));
                (Bytes::from(marked.to_string()), Some(workload))
            }
            None => (workload, None),
        };
        let run = model.runs().current();
        Job {
            shape: spec.shape,
            body,
            phase: spec.phase,
            target: spec.target,
            marker: spec.rid.map(IsoHint::rid),
            user_context_messages: 0,
            session: spec.session,
            ticket: model.ticket(Instant::now(), spec.phase, spec.target, run),
            workload,
        }
    }

    type Got = (
        Option<Prediction>,
        Option<&'static str>,
        Option<capture::Pending>,
    );

    /// The script through a worker of `threads` (its own model state; `model`'s tickets,
    /// capture writer and key), run on this thread until every job is applied.
    fn run(model: &CacheModel, threads: usize) -> Vec<Got> {
        let mut queued = Vec::new();
        let mut epoch = 0;
        for step in script() {
            match step {
                Step::Reset => epoch += 1,
                Step::Job(spec) => queued.push(Queued {
                    job: job(model, spec),
                    epoch,
                    events: 0,
                }),
            }
        }
        let tickets: Vec<Ticket> = queued.iter().map(|q| q.job.ticket.clone()).collect();
        let bytes = Arc::new(AtomicU64::new(queued.iter().map(|q| q.job.bytes()).sum()));
        let mut settings = model.settings.clone();
        settings.threads = threads;
        let worker = Worker::new(
            settings,
            model.metrics.clone(),
            model.stats.clone(),
            bytes.clone(),
            model.capture(),
            None,
        );
        let n = queued.len();
        if threads == 1 {
            let (tx, rx) = sync_channel(n);
            for q in queued {
                tx.try_send(q).expect("room for every job");
            }
            drop(tx);
            worker.run(rx);
        } else {
            let (inlet, outlet) = pipeline::channel(threads, n);
            for q in queued {
                let lane = lane_key(&q.job.session);
                inlet.try_send(lane, || q).expect("room for every job");
            }
            drop(inlet);
            worker.run_fanned(outlet);
        }
        assert_eq!(bytes.load(Ordering::Acquire), 0, "every job left the queue");
        tickets
            .iter()
            .map(|t| {
                let r = crate::sync::lock(&t.0.record);
                (r.prediction.clone(), r.unaccounted, r.capture.clone())
            })
            .collect()
    }

    #[test]
    fn four_threads_predict_exactly_what_one_does() {
        let mut config = Config::default();
        let c = &mut config.cache_model;
        c.tokenizer = Some(MockTokenizerSetting::Qwen3);
        c.max_prompt_bytes = ByteSize(64 << 10);
        config.capture.enabled = true;
        config.capture.dir = crate::test_support::test_dir().join("threads-capture");
        let model = CacheModel::new(&config, Metrics::new(), "threads".into());
        let one = run(&model, 1);
        let four = run(&model, 4);
        assert_eq!(one.len(), four.len());
        for (i, (a, b)) in one.iter().zip(&four).enumerate() {
            assert_eq!(a, b, "job {i}");
        }
        // The script exercises what it means to.
        let predictions: Vec<&Prediction> = one.iter().filter_map(|s| s.0.as_ref()).collect();
        let unaccounted: Vec<&str> = one.iter().filter_map(|s| s.1).collect();
        assert_eq!(
            unaccounted,
            ["unparseable", "too_large", "unparseable", "too_large"]
        );
        assert_eq!(predictions.len() + 4, one.len());
        let sum = |f: fn(&Prediction) -> u64| predictions.iter().map(|p| f(p)).sum::<u64>();
        assert!(sum(|p| p.reuse.same_session) > 0);
        assert!(sum(|p| p.reuse.other_session) > 0);
        assert!(sum(|p| p.reuse.warmup) > 0);
        for kind in Breach::ALL {
            assert!(
                predictions.iter().any(|p| p.breaches.contains(&kind)),
                "no {kind:?}"
            );
        }
        let rows: Vec<&capture::Pending> = one.iter().filter_map(|s| s.2.as_ref()).collect();
        assert_eq!(rows.len(), predictions.len());
        assert!(rows.iter().any(|r| r.follows));
    }
}
