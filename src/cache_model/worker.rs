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

use super::attribution::{self, Breach, Requester};
use super::index::{chain_salted, BlockIndex, Owner, BYTES_PER_BLOCK};
use super::tokens::{self, IsoHint, Memo, Vocab};
use super::{session_digest, unaccounted, Job, Prediction, SessionHint, Settings, Stats};

/// What the model remembers of a session: the block its next request must share, and whether
/// its breach was logged.
struct SessionState {
    check: Option<attribution::Continuation>,
    logged: bool,
}

/// Memory one remembered session costs (its key, state and LRU links).
const BYTES_PER_SESSION: usize = 80;

pub(super) struct Worker {
    settings: Settings,
    metrics: Metrics,
    stats: Arc<Stats>,
    queued_bytes: Arc<AtomicU64>,
    capture: Option<Arc<Capture>>,
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
}

impl Worker {
    pub(super) fn new(
        settings: Settings,
        metrics: Metrics,
        stats: Arc<Stats>,
        queued_bytes: Arc<AtomicU64>,
        capture: Option<Arc<Capture>>,
    ) -> Self {
        Self {
            settings,
            metrics,
            stats,
            queued_bytes,
            capture,
        }
    }

    /// Serves jobs until every sender is gone.
    pub(super) fn run(self, jobs: Receiver<Job>) {
        let mut model = match self.load() {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::error!("cache model: {e}; requests are counted as unaccounted");
                None
            }
        };
        for job in jobs {
            let size = job.bytes();
            match model.as_mut() {
                Some(m) => self.serve(m, job),
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
                Vocab::hf(Arc::new(t), use_template).map_err(|e| e.to_string())?
            }
        };
        Ok(Model {
            vocab,
            memo: Memo::new(s.memo_tokens),
            index: BlockIndex::new(s.block_size, s.capacity),
            sessions: LruCache::new(s.sessions),
            anonymous: 0,
            turns: Turns::new(s.sessions),
            seq: 0,
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
            Err(_) => return unaccounted(&self.metrics, &self.stats, "unparseable"),
        };
        let iso = iso_hint(&job, &prompt);
        let encoded = match tokens::encode(&m.vocab, &mut m.memo, &prompt, &iso) {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!("cache model: {e}");
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
        let collided = source.is_some() && collided(m, session, &encoded.ids, &hashes, bs);
        if collided && attribution::guards_sessions(target) {
            breaches.push(Breach::SessionCollision);
        }
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
        job.ticket.predict(Prediction {
            prompt_tokens: encoded.ids.len() as u64,
            cached,
            reuse,
            breaches,
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
        (Rendering::Contents, Prompt::Messages(ms)) => {
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
            c.settings.key.as_ref(),
            namespace,
        ),
        session,
        follows,
    })
}

/// Whether `session`'s request does not extend the session's previous one (two conversations
/// under one key); remembers this request as the session's last.
fn collided(m: &mut Model, session: u64, ids: &[u32], hashes: &[u64], bs: usize) -> bool {
    let check = attribution::continuation(ids, hashes, bs);
    match m.sessions.get_mut(&session) {
        Some(prev) => {
            let extends = attribution::extends(ids, hashes, bs, prev.check);
            prev.check = check;
            !extends
        }
        None => {
            m.sessions.put(
                session,
                SessionState {
                    check,
                    logged: false,
                },
            );
            false
        }
    }
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
    let Prompt::Messages(messages) = prompt else {
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
