//! The model's worker thread: takes jobs in forwarding order, and for each parses the body as
//! the engine does, resolves its session, tokenizes it, serves it against the index, attributes
//! the hit, checks the session's continuity and hands the prediction to the request's ticket.
//! Owns the model's state (tokenizer, memo, index, session table); never touches the network
//! and never blocks a request (it only ever waits for its own queue).

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
use super::tokens::{self, IsoHint, Memo, Vocab};
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

/// The model's state, made on the worker thread (loading a tokenizer takes a moment).
struct Model {
    vocab: Vocab,
    memo: Memo,
    index: BlockIndex,
    sessions: LruCache<u64, SessionState>,
    anonymous: u64,
    /// Capture's view of each session's turns, and the next row's number.
    turns: Turns,
    seq: u64,
    /// The engine's block hashes mapped to the index's (`cache_model.kv_events`).
    follow: Follow,
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
    /// submitted; `applied` so far): the index then holds what the engine held when the
    /// request went to it, as far as the engine told, however far the worker lags behind.
    fn follow(&self, m: &mut Model, applied: &mut u64, mark: u64) {
        let Some((rx, stats)) = &self.events else {
            return;
        };
        while *applied < mark {
            // Counted only once sent: the batch is in the channel.
            let Ok(events) = rx.recv() else {
                return;
            };
            m.follow.apply(&mut m.index, events, stats);
            *applied += 1;
        }
    }

    /// Serves jobs until every sender is gone.
    pub(super) fn run(self, jobs: Receiver<Queued>) {
        let mut model = match self.load() {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::error!("cache model: {e}; requests are counted as unaccounted");
                None
            }
        };
        let (mut epoch, mut applied) = (0, 0);
        for Queued {
            job,
            epoch: submitted_in,
            events: mark,
        } in jobs
        {
            let size = job.bytes();
            if submitted_in != epoch {
                // The upstream's cache was emptied between the last job and this one.
                epoch = submitted_in;
                if let Some(m) = model.as_mut() {
                    let s = &self.settings;
                    m.index = BlockIndex::new(s.block_size, s.capacity);
                }
            }
            match model.as_mut() {
                Some(m) => {
                    self.follow(m, &mut applied, mark);
                    self.serve(m, job);
                }
                None => unaccounted(&self.metrics, &self.stats, "tokenizer_error"),
            }
            self.queued_bytes.fetch_sub(size, Ordering::AcqRel);
            if let Some(m) = &model {
                self.publish(m);
            }
        }
    }

    fn load(&self) -> Result<Model, String> {
        let s = &self.settings;
        let use_template = s.template == ChatTemplateMode::Auto;
        let tokenizer = match &s.tokenizer {
            MockTokenizerSetting::Builtin => None,
            MockTokenizerSetting::Qwen3 => Some(Tokenizer::default_qwen3()),
            MockTokenizerSetting::Path(p) => Some(Tokenizer::from_path(p)),
        };
        let vocab = match tokenizer {
            None => Vocab::Builtin,
            Some(t) => {
                let t = t.map_err(|e| format!("cannot load cache_model.tokenizer: {e}"))?;
                Vocab::hf_dated(Arc::new(t), use_template, s.date).map_err(|e| e.to_string())?
            }
        };
        Ok(Model {
            vocab,
            memo: Memo::new(s.memo_tokens).bounded(s.max_prompt_bytes),
            index: BlockIndex::new(s.block_size, s.capacity),
            sessions: LruCache::new(s.sessions),
            anonymous: 0,
            turns: Turns::new(s.sessions),
            seq: 0,
            follow: Follow::default(),
        })
    }

    fn publish(&self, m: &Model) {
        let s = &self.stats;
        s.indexed_blocks
            .store(m.index.len() as u64, Ordering::Relaxed);
        s.evicted_blocks.store(m.index.evicted(), Ordering::Relaxed);
        let bytes = m.index.len() * BYTES_PER_BLOCK
            + m.sessions.len() * BYTES_PER_SESSION
            + m.memo.bytes()
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

    fn serve(&self, m: &mut Model, job: Job) {
        let endpoint = job.shape;
        // The body's `cache_salt` (kvbust's, or the client's own) keys the index as it keys
        // the engine's cache: it joins the first block's hash.
        let (prompt, salt) = match crate::mock::openai::parse_request(endpoint, &job.body, "") {
            Ok(req) => (req.prompt, req.cache_salt),
            Err(_) => {
                job.ticket.with(|r| r.unaccounted = Some("unparseable"));
                return unaccounted(&self.metrics, &self.stats, "unparseable");
            }
        };
        let iso = iso_hint(&job, &prompt);
        let encoded = match tokens::encode(&m.vocab, &mut m.memo, &prompt, &iso) {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!("cache model: {e}");
                job.ticket.with(|r| r.unaccounted = Some(e.reason()));
                return unaccounted(&self.metrics, &self.stats, e.reason());
            }
        };
        let (session, source) = match resolve_session(
            &job.session,
            job.shape,
            &job.body,
            job.user_context_messages,
        ) {
            Some((key, source)) => (key, Some(source)),
            None => {
                // No key: a session of its own, never remembered.
                m.anonymous += 1;
                (u64::MAX - m.anonymous, None)
            }
        };
        let bs = self.settings.block_size;
        let hashes = chain_salted(&encoded.ids, bs, salt.as_deref());
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
        self.capture(
            m,
            (&job, salt.as_deref()),
            &prompt,
            &encoded.ids,
            source.is_some().then_some(session),
        );
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
        job: (&Job, Option<&str>),
        prompt: &Prompt,
        ids: &[u32],
        session: Option<u64>,
    ) {
        let Some(c) = &self.capture else {
            return;
        };
        match capture_row(m, c, job, prompt, ids, session) {
            Ok(row) => job.0.ticket.capture(row),
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

/// The capture row of `job`: the workload's prompt (before kvbust's marker or salt) as capture
/// counts it, reusing the model's ids where they are the same tokens, then its block hashes. A
/// client's own `cache_salt` is part of the workload: the namespace of its hash ids (`salt`:
/// the forwarded body's, which is the client's when kvbust changed nothing).
fn capture_row(
    m: &mut Model,
    c: &Capture,
    (job, salt): (&Job, Option<&str>),
    prompt: &Prompt,
    model_ids: &[u32],
    session: Option<u64>,
) -> Result<capture::Pending, String> {
    let parsed;
    let (workload, namespace) = match &job.workload {
        Some(body) => {
            parsed = crate::mock::openai::parse_request(job.shape, body, "")
                .map_err(|_| "the body before the marker does not parse".to_string())?;
            (&parsed.prompt, parsed.cache_salt.as_deref())
        }
        None => (prompt, salt),
    };
    let (ids, session, follows) = match (c.settings.rendering, workload) {
        (Rendering::Contents, Prompt::Messages(_) | Prompt::Chat(_)) => {
            let ms = workload.messages().unwrap_or_default();
            let seen: Vec<Seen> = ms.iter().map(|x| Seen::new(&x.role, &x.content)).collect();
            let plan = m.turns.plan(session, &seen);
            let picked = plan.messages.iter().map(|&i| &ms[i]);
            let ids = tokens::encode_contents(&m.vocab, &mut m.memo, picked)
                .map_err(|e| e.to_string())?;
            (ids, plan.session, plan.follows)
        }
        // The model's own tokens, when nothing was changed in between.
        _ if job.workload.is_none() => (model_ids.to_vec(), None, false),
        _ => {
            let e = tokens::encode(&m.vocab, &mut m.memo, workload, &IsoHint::None)
                .map_err(|e| e.to_string())?;
            (e.ids, None, false)
        }
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
            namespace,
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
