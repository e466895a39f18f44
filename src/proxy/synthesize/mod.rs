//! In-flight synthesis: fills a chat request's `messages` from the synthetic dataset
//! (`x-kvbust-synth: 1` or a synthetic route) and expands `{{kvbust:prompt:N[:corpus]}}`
//! placeholders in message content (never elsewhere); a `[synth.dataset]` naming a trace
//! (`input_file`) replays its entries in order; an agentic dataset's turn sends its whole
//! accumulated context and its model, and a client names the child conversations it spawns
//! (which conversation and turn a request gets, and what the response tells the client, are
//! [`super::topology`]'s). Splices into the client's bytes so every other member stays as sent;
//! builds the dataset and prompt streams once, off the async threads. Reads the client's body
//! once and hands on the layout of the body it writes; never parses bodies that need neither.
//!
//! In three parts: [`fill`] writes a synthetic conversation into the body, [`scan`] finds the
//! placeholders, and this file is the synthesizer itself (the dataset, the prompt lanes and the
//! on-demand queue, built once) that drives both; [`queue`] decides which generations run.

mod fill;
mod queue;
mod scan;

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use lru::LruCache;

use crate::cachebust::KeyDigest;
use crate::config::{Config, SynthConfig};
use crate::error::ProxyError;
use crate::json::{self, Json, Layout};
use crate::proxy::topology::{self, Cursor, Served};
use crate::synth::prompt::placeholders::PromptLanes;
use crate::synth::{
    Conversation, Dataset, PromptCorpus, RandomCorpusStyle, SynthParams, Tokenizer,
};
use fill::{
    assistant_messages, client_top, fill_top, json_str, write_agentic, write_messages, Fill,
};
pub use fill::{conversation_messages, fill_body};
use scan::find_placeholders_at;
pub use scan::{find_placeholders, find_placeholders_limited, Placeholder};

fn internal(what: &str) -> ProxyError {
    ProxyError::Internal(format!("synthesis: {what}"))
}

/// Whether this request asks for a synthetic body (`control`: it carries kvbust headers).
pub fn wants_synthesis(
    headers: &http::HeaderMap,
    control: bool,
    path: &str,
    config: &Config,
) -> Result<bool, ProxyError> {
    let (cfg, name) = (&config.synth, config.headers.synth.as_str());
    if !control && cfg.routes.is_empty() {
        return Ok(false);
    }
    match headers.get(name).map(|v| v.to_str().map(str::trim)) {
        Some(Ok("1" | "true" | "yes")) => return Ok(true),
        Some(Ok("0" | "false" | "no")) => return Ok(false),
        Some(_) => {
            return Err(ProxyError::bad_request(
                "invalid_header",
                format!("{name} must be 1 or 0"),
            ));
        }
        None => {}
    }
    Ok(cfg
        .routes
        .iter()
        .any(|r| r.trim_end_matches('/') == path.trim_end_matches('/')))
}

/// Where each message of one verbatim `messages` array is, within its text.
type MessageSpans = Arc<[Range<usize>]>;

struct Built {
    /// The dataset's conversations, shared with the requests serving them.
    convs: Vec<Arc<Conversation>>,
    /// Where each message of a trace turn's verbatim `messages` is (by conversation, then
    /// turn), found once here so that no request parses them.
    raw_items: Vec<Vec<Option<MessageSpans>>>,
    /// Each conversation's index by its id (the first, should two share one).
    ids: HashMap<String, usize>,
    /// The conversations a new session may start ([`topology::is_root`]), in dataset order.
    roots: Vec<usize>,
    /// Roots handed out so far.
    next: usize,
    /// Each session's place, by the digest of its key (fixed size, whatever the key's length).
    sessions: LruCache<KeyDigest, Cursor>,
}

impl Built {
    /// The first-turn timestamps (ms) of the children the branches of `conv`'s turn `k` start
    /// (for their dispatch offsets); empty for a turn that starts none.
    fn children_first_ms(&self, conv: &Conversation, k: usize) -> Vec<(String, Option<f64>)> {
        let spawned = conv
            .turns
            .get(k)
            .and_then(|t| t.agentic.as_ref())
            .map(|i| &i.branch_ids[..])
            .unwrap_or(&[]);
        let Some(topology) = conv.agentic.as_ref().filter(|_| !spawned.is_empty()) else {
            return Vec::new();
        };
        topology
            .branches
            .iter()
            .filter(|b| spawned.contains(&b.branch_id))
            .flat_map(|b| &b.child_conversation_ids)
            .map(|id| {
                let first = self
                    .ids
                    .get(id)
                    .and_then(|&i| self.convs.get(i))
                    .and_then(|c| c.turns.first())
                    .and_then(|t| t.timestamp.as_ref())
                    .and_then(serde_json::Number::as_f64);
                (id.clone(), first)
            })
            .collect()
    }

    fn new(dataset: Dataset) -> Built {
        let raw_items = raw_items(&dataset);
        let convs: Vec<Arc<Conversation>> =
            dataset.conversations.into_iter().map(Arc::new).collect();
        let mut ids = HashMap::with_capacity(convs.len());
        for (i, c) in convs.iter().enumerate() {
            ids.entry(c.session_id.clone()).or_insert(i);
        }
        let roots = (0..convs.len())
            .filter(|&i| topology::is_root(&convs[i]))
            .collect();
        let cap = NonZeroUsize::new(100_000).unwrap_or(NonZeroUsize::MIN);
        Built {
            convs,
            raw_items,
            ids,
            roots,
            next: 0,
            sessions: LruCache::new(cap),
        }
    }

    /// The turn this request gets (see [`topology::choose`]), the session moved past it.
    fn take_turn(
        &mut self,
        session: Option<KeyDigest>,
        named: Option<Named<'_>>,
    ) -> Result<Cursor, ProxyError> {
        let named = match named {
            Some(n) => Some(
                *self
                    .ids
                    .get(n.id)
                    .ok_or_else(|| unknown_conversation(n, self))?,
            ),
            None => None,
        };
        let bound = session.and_then(|s| self.sessions.get(&s).copied());
        let convs = &self.convs;
        let (ci, k) = match topology::choose(bound, named, |ci| convs[ci].turns.len()) {
            Some(at) => at,
            None => {
                let ci = topology::next_root(&self.roots, &mut self.next)
                    .ok_or_else(|| internal("the dataset has no root conversation"))?;
                (ci, 0)
            }
        };
        if let Some(s) = session {
            self.sessions.put(s, (ci, k + 1));
        }
        Ok((ci, k))
    }
}

/// A conversation a request names by id, and the header it came in (for the error).
#[derive(Debug, Clone, Copy)]
pub struct Named<'a> {
    pub id: &'a str,
    pub header: &'a str,
}

/// The 400 for a conversation id the dataset does not hold.
fn unknown_conversation(n: Named<'_>, b: &Built) -> ProxyError {
    ProxyError::bad_request(
        "unknown_conversation",
        format!(
            "{} names no conversation of the synthetic dataset: `{}` (it holds {} \
             conversations, {} of them roots); send an id a response's synth spawn header \
             listed, or leave the header out to get the next root conversation",
            n.header,
            crate::error::excerpt(n.id.as_bytes()),
            b.convs.len(),
            b.roots.len()
        ),
    )
}

/// [`Built::raw_items`] of `dataset`; `None` for a turn without verbatim `messages` (or with
/// `messages` that are not an array: the marking step then parses the body and says so).
fn raw_items(dataset: &Dataset) -> Vec<Vec<Option<MessageSpans>>> {
    let items = |raw: &crate::synth::dataset::RawJson| {
        let elems = json::array(Json::from(&*raw.0)).ok()?;
        let base = raw.get().as_bytes();
        elems.iter().map(|e| json::span(base, *e)).collect()
    };
    let turns = |c: &Conversation| {
        c.turns
            .iter()
            .map(|t| t.raw_messages.as_ref().and_then(items))
            .collect()
    };
    dataset.conversations.iter().map(turns).collect()
}

/// The synthesis state of one proxy: tokenizer, dataset, placeholder prompt lanes, built on
/// first use.
pub struct Synthesizer {
    cfg: SynthConfig,
    cache_bust: crate::cachebust::Target,
    /// `limits.max_body`, re-checked on the body after placeholder expansion.
    max_body: u64,
    tokenizer: tokio::sync::OnceCell<Arc<Tokenizer>>,
    dataset: tokio::sync::OnceCell<Arc<Mutex<Built>>>,
    lanes: tokio::sync::OnceCell<Arc<PromptLanes>>,
    /// Placeholder prompts being made on demand: the places, permits and build budget.
    gate: Arc<queue::Gate>,
}

/// Runs `work` unless the request it is for has gone (`alive` is held by the request's future):
/// work queued for the blocking pool is not started for a client that left.
fn unless_gone<T>(
    alive: &std::sync::Weak<()>,
    work: impl FnOnce() -> Result<T, ProxyError>,
) -> Result<T, ProxyError> {
    if alive.strong_count() == 0 {
        return Err(ProxyError::bad_request(
            "client_gone",
            "the request was dropped before its placeholder prompt was made",
        ));
    }
    work()
}

/// What a synthetic fill produced.
pub struct Filled {
    pub body: Vec<u8>,
    /// The layout of `body`, for the steps after synthesis (they parse nothing).
    pub(crate) layout: Option<Layout>,
    pub user_context_messages: usize,
    pub session_id: String,
    /// The entry's trace `timestamp` (ms), for the `x-kvbust-trace-timestamp` response header.
    pub trace_timestamp: Option<String>,
    /// The conversation and turn served, and what the client needs to follow it (the
    /// `x-kvbust-synth-*` response headers).
    pub served: Served,
}

impl Synthesizer {
    /// A synthesizer with the default `limits.max_body`; see [`Synthesizer::with_max_body`].
    pub fn new(cfg: SynthConfig, cache_bust: crate::cachebust::Target) -> Arc<Self> {
        let max_body = crate::config::LimitsConfig::default().max_body.as_u64();
        Self::with_max_body(cfg, cache_bust, max_body)
    }

    /// A synthesizer whose expanded bodies must stay within `max_body` bytes (`limits.max_body`).
    pub fn with_max_body(
        cfg: SynthConfig,
        cache_bust: crate::cachebust::Target,
        max_body: u64,
    ) -> Arc<Self> {
        Arc::new(Self {
            cache_bust,
            max_body,
            tokenizer: tokio::sync::OnceCell::new(),
            dataset: tokio::sync::OnceCell::new(),
            lanes: tokio::sync::OnceCell::new(),
            gate: queue::Gate::new(&cfg),
            cfg,
        })
    }

    async fn tokenizer(&self) -> Result<Arc<Tokenizer>, ProxyError> {
        self.tokenizer
            .get_or_try_init(|| async {
                let path = self.cfg.tokenizer.clone();
                blocking(move || {
                    let t0 = Instant::now();
                    let t = match &path {
                        Some(p) => Tokenizer::from_path(p),
                        None => Tokenizer::default_qwen3(),
                    }
                    .map_err(|e| ProxyError::Internal(format!("synth.tokenizer: {e}")))?;
                    tracing::info!(elapsed = ?t0.elapsed(), "synthesis tokenizer loaded");
                    Ok(Arc::new(t))
                })
                .await
            })
            .await
            .cloned()
    }

    fn params(&self) -> SynthParams {
        let mut p = self.cfg.dataset.clone().unwrap_or_else(default_params);
        // Compensate the marker cost as AIPerf does when the proxy will add markers.
        if p.cache_bust.is_none() {
            p.cache_bust = self.cache_bust;
        }
        p
    }

    async fn built(&self) -> Result<Arc<Mutex<Built>>, ProxyError> {
        self.dataset
            .get_or_try_init(|| async {
                let tok = self.tokenizer().await?;
                let params = self.params();
                let cache_dir = self.cfg.cache_dir.clone();
                blocking(move || {
                    let t0 = Instant::now();
                    let dataset = crate::synth::build_dataset_with(
                        &params,
                        &tok,
                        cache_dir.as_deref(),
                        &mut |_, _| {},
                    )
                    .map_err(|e| {
                        ProxyError::Internal(format!("building the synthetic dataset: {e}"))
                    })?;
                    if dataset.conversations.is_empty() {
                        return Err(ProxyError::Internal(
                            "the synthetic dataset is empty".into(),
                        ));
                    }
                    if !dataset.conversations.iter().any(topology::is_root) {
                        return Err(ProxyError::Internal(
                            "the synthetic dataset has no root conversation to start".into(),
                        ));
                    }
                    tracing::info!(
                        conversations = dataset.conversations.len(),
                        elapsed = ?t0.elapsed(),
                        "synthetic dataset built"
                    );
                    Ok(Arc::new(Mutex::new(Built::new(dataset))))
                })
                .await
            })
            .await
            .cloned()
    }

    /// The models the built dataset's requests name (an agentic turn sends its own), sorted,
    /// each once; empty when no dataset is built or its turns keep the client's model.
    pub async fn models(&self) -> Vec<String> {
        let Ok(built) = self.built().await else {
            return Vec::new();
        };
        let b = crate::sync::lock(&built);
        let names: std::collections::BTreeSet<String> = b
            .convs
            .iter()
            .flat_map(|c| c.turns.iter())
            .filter_map(|t| t.agentic.as_ref()?.model.clone())
            .collect();
        names.into_iter().collect()
    }

    /// Builds the dataset now (at start, when `[synth.dataset]` is configured); false when it
    /// failed (logged).
    pub async fn prewarm(&self) -> bool {
        match self.built().await {
            Ok(_) => true,
            Err(e) => {
                tracing::error!("{e}");
                false
            }
        }
    }

    /// Fills a chat body with the session's next turn: of the conversation the request names
    /// (`named`), else of the session's conversation, else turn 0 of the next root
    /// conversation. An agentic turn sends its whole accumulated context and its model.
    pub async fn fill(
        &self,
        body: &[u8],
        session: Option<&str>,
        named: Option<Named<'_>>,
    ) -> Result<Filled, ProxyError> {
        let built = self.built().await?;
        // Hashed before the lock, which every synthesised request takes.
        let session = session.map(KeyDigest::of);
        let (conv, k, raw_items, children_first_ms) = {
            let mut b = crate::sync::lock(&built);
            let (ci, k) = b.take_turn(session, named)?;
            let raw_items = b.raw_items.get(ci).and_then(|c| c.get(k)).cloned();
            let conv = b
                .convs
                .get(ci)
                .cloned()
                .ok_or_else(|| internal("a conversation outside the dataset"))?;
            let first = b.children_first_ms(&conv, k);
            (conv, k, raw_items.flatten(), first)
        };
        let turn = conv.turns.get(k);
        let agentic = turn.and_then(|t| t.agentic.as_deref());
        // The client's body is read once, here; the steps after read the body made through
        // its layout.
        let top = client_top(body)?;
        let written;
        let (messages, items, ctx) = match (turn.and_then(|t| t.raw_messages.as_ref()), agentic) {
            // A trace's verbatim `messages` replace the body's as they are.
            (Some(raw), _) => (raw.get().as_bytes(), raw_items.as_deref(), 0),
            // An agentic turn: what the client would have accumulated (no user context).
            (None, Some(_)) => {
                written = write_agentic(&conv, k);
                (&written.0[..], Some(&written.1[..]), 0)
            }
            (None, None) => {
                let (bytes, items, ctx) = write_messages(&conv, k, &assistant_messages(&top));
                written = (bytes, items);
                (&written.0[..], Some(&written.1[..]), ctx)
            }
        };
        let fill = Fill {
            messages,
            items,
            max_tokens: turn.and_then(|t| t.max_tokens),
            // An agentic turn's own (mapped) model; any other turn the dataset's `model`, as
            // AIPerf's --model names every request's model (validation refuses a list there).
            model: agentic
                .and_then(|i| i.model.as_deref())
                .or_else(|| self.cfg.dataset.as_ref().and_then(|d| d.model.as_deref())),
        };
        let trace_timestamp = turn
            .and_then(|t| t.timestamp.as_ref())
            .map(|n| n.to_string());
        let (body, layout) = fill_top(body, &top, &fill)?;
        Ok(Filled {
            body,
            layout: Some(layout),
            user_context_messages: ctx,
            session_id: conv.session_id.clone(),
            trace_timestamp,
            served: topology::served(&conv, k, &|id| {
                children_first_ms
                    .iter()
                    .find(|(c, _)| c == id)
                    .and_then(|(_, t)| *t)
            }),
        })
    }

    async fn lanes(&self) -> Result<Arc<PromptLanes>, ProxyError> {
        self.lanes
            .get_or_try_init(|| async {
                let tok = self.tokenizer().await?;
                let style = self
                    .cfg
                    .dataset
                    .as_ref()
                    .map(|d| d.random_corpus_style)
                    .unwrap_or(RandomCorpusStyle::Vllm);
                Ok(PromptLanes::new(
                    tok,
                    style,
                    self.cfg.placeholder_seed,
                    self.cfg.placeholder_prefetch,
                    self.cfg.cache_dir.clone(),
                ))
            })
            .await
            .cloned()
    }

    /// Expands every placeholder in `messages`; `None` when there is none. Over
    /// `synth.max_placeholders` / `synth.max_placeholder_tokens` is a 400, an expanded body over
    /// `limits.max_body` a 413 (generation stops as soon as it would be).
    pub async fn expand(&self, body: &[u8]) -> Result<Option<Vec<u8>>, ProxyError> {
        self.expand_from(body, &mut None, None).await
    }

    /// [`Synthesizer::expand`] reading `body` through `layout` when an earlier step left one
    /// (else parsing it only when it holds `{{kvbust:`); `layout` is left as the view of the
    /// body handed on.
    /// `client` (the peer's address) is whose share of the on-demand queue the generation takes.
    pub(crate) async fn expand_from(
        &self,
        body: &[u8],
        layout: &mut Option<Layout>,
        client: Option<IpAddr>,
    ) -> Result<Option<Vec<u8>>, ProxyError> {
        let found = find_placeholders_at(
            body,
            layout,
            self.cfg.max_placeholders,
            self.cfg.max_placeholder_tokens,
        )?;
        if found.is_empty() {
            return Ok(None);
        }
        let lanes = self.lanes().await?;
        let default = self.cfg.placeholder_corpus;
        self.within_budget(&found, &lanes)?;
        let too_large = || ProxyError::BodyTooLarge {
            limit: self.max_body,
        };
        // Dropped with this future: generations not yet started for it are then skipped.
        let alive = Arc::new(());
        let mut size = body.len() as u64;
        let mut edits = Vec::with_capacity(found.len());
        // One placeholder at a time, each on its own lane: nothing here waits for another
        // request's placeholders of other lengths, and a dropped request stops between two.
        for p in &found {
            let (corpus, n) = (p.corpus.unwrap_or(default), p.tokens);
            let text = match lanes.try_take(corpus, n) {
                Some(t) => t,
                None => {
                    // A length with a lane never queues behind new ones (see [`queue`]).
                    let class = if lanes.has_lane(corpus, n) {
                        queue::Class::Built
                    } else {
                        queue::Class::New
                    };
                    let (lanes, place) = (lanes.clone(), self.gate.place(client, class)?);
                    let alive = Arc::downgrade(&alive);
                    // Waiting here, not on a blocking thread: a request dropped now never runs.
                    let turn = self.gate.turn(class).await?;
                    blocking(move || {
                        let _place = place;
                        turn.run(|| {
                            unless_gone(&alive, || {
                                lanes.take(corpus, n).map_err(|e| {
                                    ProxyError::Internal(format!(
                                        "{} prompt of {n} tokens: {e}",
                                        corpus.as_str()
                                    ))
                                })
                            })
                        })
                    })
                    .await?
                }
            };
            let quoted = json_str(&text);
            let inner = &quoted[1..quoted.len() - 1];
            size = size
                .saturating_add(inner.len() as u64)
                .saturating_sub(p.range.len() as u64);
            if size > self.max_body {
                return Err(too_large());
            }
            edits.push((p.range.clone(), inner.to_string()));
        }
        let out = json::splice(body, &mut edits).ok_or_else(|| internal("overlapping edits"))?;
        if let Some(layout) = layout {
            layout.shift(&edits);
        }
        Ok(Some(out))
    }
}

impl Synthesizer {
    /// The request's cost against `synth.max_placeholder_tokens`: the tokens it asks for plus,
    /// for each `coding` length with no lane yet, `synth.new_coding_lane_tokens` (AIPerf's coding
    /// corpus builds a pool per stream, ~0.13 CPU-s, where sonnet or random lanes cost ~nothing).
    /// A lane that appears or goes between this check and its use changes the cost by one pool
    /// at most per placeholder, which `synth.max_placeholders` bounds.
    fn within_budget(&self, found: &[Placeholder], lanes: &PromptLanes) -> Result<(), ProxyError> {
        let default = self.cfg.placeholder_corpus;
        let tokens: usize = found.iter().map(|p| p.tokens).sum();
        let mut new: Vec<usize> = found
            .iter()
            .filter(|p| p.corpus.unwrap_or(default) == PromptCorpus::Coding)
            .map(|p| p.tokens)
            .filter(|&n| !lanes.has_lane(PromptCorpus::Coding, n))
            .collect();
        new.sort_unstable();
        new.dedup();
        let cost = tokens.saturating_add(new.len().saturating_mul(self.cfg.new_coding_lane_tokens));
        if cost > self.cfg.max_placeholder_tokens {
            return Err(ProxyError::bad_request(
                "placeholder_limit",
                format!(
                    "the placeholders cost {cost} tokens: {tokens} asked for, plus {} new coding \
                     lengths at synth.new_coding_lane_tokens = {} each, more than \
                     synth.max_placeholder_tokens = {}; reuse lengths already asked for, ask \
                     for fewer, or raise the limit",
                    new.len(),
                    self.cfg.new_coding_lane_tokens,
                    self.cfg.max_placeholder_tokens
                ),
            ));
        }
        Ok(())
    }
}

/// The contract's defaults for a dataset built on first use.
pub fn default_params() -> SynthParams {
    SynthParams {
        random_seed: Some(0),
        ..SynthParams::default()
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ProxyError> + Send + 'static,
) -> Result<T, ProxyError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ProxyError::Internal(format!("synthesis task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::Turn;
    use serde_json::value::RawValue;

    fn conv(system: Option<&str>, ctx: Option<&str>, turns: &[&str]) -> Conversation {
        Conversation {
            session_id: "session_000000".into(),
            system_message: system.map(Into::into),
            user_context_message: ctx.map(Into::into),
            turns: turns
                .iter()
                .map(|t| Turn {
                    text: t.to_string(),
                    max_tokens: Some(7),
                    ..Turn::default()
                })
                .collect(),
            agentic: None,
        }
    }

    #[test]
    fn fill_replaces_messages_and_lengths_and_keeps_every_other_byte() {
        let body = br#"{ "model":"m", "messages" : [{"role":"user","content":"x"}], "max_tokens":1, "seed":1.0e-7, "z":{"b":1,"a":2} }"#;
        let out = fill_body(body, r#"[{"role":"user","content":"y"}]"#, Some(9)).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{ "model":"m", "messages" : [{"role":"user","content":"y"}], "max_tokens":9, "seed":1.0e-7, "z":{"b":1,"a":2} }"#
        );
        let out = fill_body(br#"{"model":"m"}"#, "[]", Some(3)).unwrap();
        assert_eq!(
            out,
            br#"{"model":"m","messages":[],"max_completion_tokens":3}"#
        );
        let out = fill_body(b"{}", "[]", None).unwrap();
        assert_eq!(out, br#"{"messages":[]}"#);
        assert!(fill_body(b"[1]", "[]", None).is_err());
        assert!(fill_body(b"{} x", "[]", None).is_err());
    }

    #[test]
    fn an_agentic_fill_replaces_or_adds_the_model_and_keeps_the_rest() {
        let run = |body: &[u8]| {
            let top = client_top(body).unwrap();
            let fill = Fill {
                messages: b"[]",
                items: None,
                max_tokens: Some(4),
                model: Some("m\"2"),
            };
            String::from_utf8(fill_top(body, &top, &fill).unwrap().0).unwrap()
        };
        assert_eq!(
            run(br#"{"model" : "x","messages":[1], "n":1.50}"#),
            r#"{"model" : "m\"2","messages":[], "n":1.50,"max_completion_tokens":4}"#
        );
        assert_eq!(
            run(br#"{"n":1}"#),
            r#"{"n":1,"model":"m\"2","messages":[],"max_completion_tokens":4}"#
        );
        assert_eq!(
            run(b"{}"),
            r#"{"model":"m\"2","messages":[],"max_completion_tokens":4}"#
        );
    }

    #[test]
    fn conversation_turns_carry_history_and_answers() {
        let c = conv(Some("S"), Some("C"), &["t0", "t1", "t2"]);
        let a0 =
            RawValue::from_string(r#"{"role":"assistant","content":"a0","x":1}"#.into()).unwrap();
        let (m, ctx) = conversation_messages(&c, 0, &[]);
        assert_eq!(ctx, 1);
        assert_eq!(
            m,
            r#"[{"role":"system","content":"S"},{"role":"user","content":"C"},{"role":"user","content":"t0"}]"#
        );
        let (m, _) = conversation_messages(&c, 1, &[&a0]);
        assert_eq!(
            m,
            r#"[{"role":"system","content":"S"},{"role":"user","content":"C"},{"role":"user","content":"t0"},{"role":"assistant","content":"a0","x":1},{"role":"user","content":"t1"}]"#
        );
    }

    #[test]
    fn placeholders_parse_or_fail_with_the_text() {
        let body = br#"{"messages":[{"role":"user","content":"A {{kvbust:prompt:12}} B {{kvbust:prompt:3:random}}"}],"user":"{{kvbust:prompt:5}}"}"#;
        let found = find_placeholders(body).unwrap();
        assert_eq!(found.len(), 2, "only inside messages");
        assert_eq!((found[0].tokens, found[0].corpus), (12, None));
        assert_eq!(
            (found[1].tokens, found[1].corpus),
            (3, Some(PromptCorpus::Random))
        );
        assert_eq!(&body[found[0].range.clone()], b"{{kvbust:prompt:12}}");
        for bad in [
            "{{kvbust:prompt:}}",
            "{{kvbust:prompt:x}}",
            "{{kvbust:prompt:0}}",
            "{{kvbust:prompt:5:poems}}",
            "{{kvbust:prompt:5:sonnet:x}}",
            "{{kvbust:image:5}}",
            "{{kvbust:prompt:5",
        ] {
            let body = format!(r#"{{"messages":[{{"role":"user","content":"{bad}"}}]}}"#);
            let err = find_placeholders(body.as_bytes()).unwrap_err();
            assert_eq!(err.code(), "invalid_placeholder", "{bad}");
            assert!(err.to_string().contains(&bad[..bad.len().min(16)]), "{err}");
        }
        assert!(find_placeholders(br#"{"messages":[]}"#).unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_full_placeholder_queue_is_a_503_with_retry_after() {
        let cfg = SynthConfig {
            placeholder_queue: 1,
            ..SynthConfig::default()
        };
        let s = Synthesizer::new(cfg, crate::cachebust::Target::None);
        let body = br#"{"messages":[{"role":"user","content":"{{kvbust:prompt:3:random}}"}]}"#;
        let held = s.gate.place(None, queue::Class::Built).unwrap();
        let err = s.expand(body).await.unwrap_err();
        assert_eq!(err.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.code(), "placeholder_queue_full");
        let resp = err.into_response::<bytes::Bytes>();
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "1");
        drop(held);
        assert!(s.expand(body).await.unwrap().is_some());
        assert_eq!(s.gate.places.lock().unwrap().total, 0);
    }

    #[test]
    fn placeholder_count_and_total_tokens_are_limited() {
        let body = br#"{"messages":[{"role":"user","content":"{{kvbust:prompt:100}} {{kvbust:prompt:100}} {{kvbust:prompt:1}}"}]}"#;
        assert_eq!(find_placeholders_limited(body, 3, 201).unwrap().len(), 3);
        let err = find_placeholders_limited(body, 2, 1000).unwrap_err();
        assert_eq!(err.code(), "placeholder_limit");
        assert!(
            err.to_string().contains("synth.max_placeholders = 2"),
            "{err}"
        );
        let err = find_placeholders_limited(body, 64, 150).unwrap_err();
        assert_eq!(err.code(), "placeholder_limit");
        assert!(
            err.to_string()
                .contains("synth.max_placeholder_tokens = 150"),
            "{err}"
        );
    }

    #[test]
    fn a_malformed_placeholder_is_quoted_short_and_on_one_line() {
        // `{{kvbust:` at the end of one content string, `}}` megabytes later in another, raw
        // newlines between: the placeholder ends with its string, so only that is quoted.
        let filler = "x".repeat(5 << 20);
        let body = format!(
            "{{\"messages\":[{{\"role\":\"user\",\"content\":\"{{{{kvbust:prompt:5\"}},\n\r{{\"role\":\"user\",\"content\":\"{filler}}}}}\"}}]}}"
        );
        assert!(serde_json::from_str::<serde_json::Value>(&body).is_ok());
        let err = find_placeholders(body.as_bytes()).unwrap_err();
        assert_eq!(err.code(), "invalid_placeholder");
        let msg = err.to_string();
        assert!(
            msg.contains("`{{kvbust:prompt:5`: it is not closed"),
            "{msg}"
        );
        // Megabytes of one string after `{{kvbust:`: at most 200 bytes of it, escaped.
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":"{{{{kvbust:prompt:5 \n\u001b{filler}"}}]}}"#
        );
        let msg = find_placeholders(body.as_bytes()).unwrap_err().to_string();
        assert!(msg.len() < 600, "{} bytes", msg.len());
        assert!(!msg.contains('\n') && !msg.contains('\r'), "{msg}");
        assert!(msg.contains(r"{{kvbust:prompt:5 \n\u001bxx"), "{msg}");
        assert!(msg.contains('…'));
        assert_eq!(crate::error::excerpt(b"a\x1b[2Jb"), "a\\u{1b}[2Jb");
    }

    /// Which strings under `messages` are message content: a placeholder anywhere else (roles,
    /// names, tool calls, other parts, member names, duplicates the upstream ignores) stays as
    /// sent, even a malformed one; content strings and `text` parts expand.
    #[allow(clippy::too_many_lines)] // a table of cases
    #[test]
    fn placeholders_expand_only_in_message_content() {
        let cases: &[(&str, &str, &[usize])] = &[
            (
                "content string",
                r#"[{"role":"user","content":"a {{kvbust:prompt:1}} b"}]"#,
                &[1],
            ),
            (
                "role",
                r#"[{"role":"{{kvbust:prompt:2}}","content":"x"}]"#,
                &[],
            ),
            (
                "name",
                r#"[{"role":"user","name":"{{kvbust:prompt:3}}","content":"x"}]"#,
                &[],
            ),
            (
                "tool call arguments",
                r#"[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"{{kvbust:prompt:4}}","arguments":"{\"q\":\"{{kvbust:prompt:4}}\"}"}}]}]"#,
                &[],
            ),
            (
                "legacy function_call arguments",
                r#"[{"role":"assistant","function_call":{"name":"f","arguments":"{{kvbust:prompt:5}}"}}]"#,
                &[],
            ),
            (
                "tool result: its content counts, its call id does not",
                r#"[{"role":"tool","tool_call_id":"{{kvbust:prompt:6}}","content":"r {{kvbust:prompt:7}}"}]"#,
                &[7],
            ),
            (
                "parts: only `text` of type text",
                r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"{{kvbust:prompt:8}}"}},{"text":"{{kvbust:prompt:9}}","type":"text"},{"type":"input_text","text":"{{kvbust:prompt:10}}"},{"text":"{{kvbust:prompt:11}}"},{"type":"text","text":"t","cache_control":"{{kvbust:prompt:12}}"},{"type":"text","text":{"x":"{{kvbust:prompt:13}}"}},"{{kvbust:prompt:14}}",{"type":"text","text":"{{kvbust:prompt:15}}{{kvbust:prompt:16}}"}]}]"#,
                &[9, 15, 16],
            ),
            (
                "member names",
                r#"[{"{{kvbust:prompt:17}}":"user","content":[{"type":"text","{{kvbust:prompt:18}}":1,"text":"y"}]}]"#,
                &[],
            ),
            (
                "duplicate content: the last counts",
                r#"[{"role":"user","content":"{{kvbust:prompt:19}}","content":"{{kvbust:prompt:20}}"}]"#,
                &[20],
            ),
            (
                "content of another kind",
                r#"[{"role":"user","content":{"text":"{{kvbust:prompt:21}}"}},{"role":"user"},"{{kvbust:prompt:22}}",["{{kvbust:prompt:23}}"]]"#,
                &[],
            ),
            (
                "malformed outside content",
                r#"[{"role":"user","name":"{{kvbust:nope","content":"{{kvbust:prompt:24}}"}]"#,
                &[24],
            ),
            (
                "escapes around it",
                r#"[{"role":"user","content":"\"\\{{kvbust:prompt:25}}\u00e9 \u007b{kvbust:prompt:26}}"}]"#,
                &[25],
            ),
            ("messages not an array", r#""{{kvbust:prompt:27}}""#, &[]),
        ];
        for (what, messages, want) in cases {
            let body = format!(
                r#"{{"model":"{{{{kvbust:prompt:90}}}}","messages":{messages},"user":"{{{{kvbust:prompt:91}}}}"}}"#
            );
            let found =
                find_placeholders(body.as_bytes()).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got: Vec<usize> = found.iter().map(|p| p.tokens).collect();
            assert_eq!(&got, want, "{what}: {body}");
            for p in &found {
                assert_eq!(
                    &body.as_bytes()[p.range.clone()],
                    format!("{{{{kvbust:prompt:{}}}}}", p.tokens).as_bytes(),
                    "{what}"
                );
            }
        }
        // The last `messages` is the one the upstream reads, whatever the earlier ones are (a
        // fuzz finding: a string before the array hid it).
        for body in [
            &br#"{"messages":[{"content":"{{kvbust:prompt:1}}"}],"messages":[{"content":"{{kvbust:prompt:2}}"}]}"#[..],
            br#"{"messages":"{{kvbust:prompt:1}}","messages":[{"content":"{{kvbust:prompt:2}}"}]}"#,
        ] {
            let found = find_placeholders(body).unwrap();
            assert_eq!(found.iter().map(|p| p.tokens).collect::<Vec<_>>(), [2]);
        }
        let body = br#"{"messages":[{"content":"{{kvbust:prompt:1}}"}],"messages":null}"#;
        assert!(find_placeholders(body).unwrap().is_empty());
        // Not JSON, or not an object: a bounded 400.
        for bad in [&b"{{kvbust:prompt:1}}"[..], br#"["{{kvbust:prompt:1}}"]"#] {
            let e = find_placeholders(bad).unwrap_err();
            assert_eq!(
                (e.status(), e.code()),
                (http::StatusCode::BAD_REQUEST, "invalid_body")
            );
        }
    }
}

#[cfg(test)]
mod session_map_tests {
    use super::*;
    use crate::cachebust::KeyDigest;
    use crate::synth::Turn;

    /// Issue 23 item 10: the session map kept each raw session key (up to
    /// `limits.max_control_header` bytes, 100,000 sessions). It keeps the key's digest, as the
    /// config docs say, and a long key still finds its session again.
    #[test]
    fn the_session_map_keeps_digests_not_keys() {
        let conv = |id: &str| Conversation {
            session_id: id.into(),
            system_message: None,
            user_context_message: None,
            turns: vec![Turn::default(), Turn::default(), Turn::default()],
            agentic: None,
        };
        let mut built = Built::new(Dataset {
            conversations: vec![conv("a"), conv("b")],
        });
        let long = "k".repeat(1000);
        let mut turn = |key: &str| built.take_turn(Some(KeyDigest::of(key)), None).unwrap();
        assert_eq!(turn(&long), (0, 0));
        assert_eq!(turn("other"), (1, 0));
        assert_eq!(turn(&long), (0, 1));
        let kept: Vec<KeyDigest> = built.sessions.iter().map(|(k, _)| *k).collect();
        assert_eq!(kept, [KeyDigest::of(&long), KeyDigest::of("other")]);
        assert_eq!(std::mem::size_of::<KeyDigest>(), 16);
    }
}

#[cfg(test)]
mod fairness_tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    const A: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    const B: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));

    /// Issue 23 item 4: one queue shared by all clients let one client's flood 503 another's
    /// small request. A client holds at most `synth.placeholder_queue_per_client` places; others
    /// still get theirs.
    #[tokio::test]
    async fn one_client_cannot_take_the_whole_queue() {
        let cfg = SynthConfig {
            placeholder_queue: 4,
            placeholder_queue_per_client: 2,
            ..SynthConfig::default()
        };
        let s = Synthesizer::new(cfg, crate::cachebust::Target::None);
        let a1 = s.gate.place(A, queue::Class::Built).unwrap();
        let _a2 = s.gate.place(A, queue::Class::Built).unwrap();
        let e = s
            .gate
            .place(A, queue::Class::Built)
            .err()
            .expect("A is at its share");
        assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.code(), "placeholder_queue_full");
        assert!(
            e.to_string()
                .contains("synth.placeholder_queue_per_client = 2"),
            "{e}"
        );
        // B's small request is served while A's flood holds its share.
        let body = br#"{"messages":[{"role":"user","content":"{{kvbust:prompt:3}}"}]}"#;
        let out = s.expand_from(body, &mut None, B).await.unwrap().unwrap();
        assert!(!String::from_utf8(out).unwrap().contains("{{kvbust:"));
        drop(a1);
        let _a3 = s.gate.place(A, queue::Class::Built).unwrap();
        // The places a client no longer holds are forgotten.
        drop(_a2);
        drop(_a3);
        assert!(s.gate.places.lock().unwrap().per_client.is_empty());
    }

    /// Item 4: a request's placeholder budget (`synth.max_placeholder_tokens`) counts the pool
    /// each new `coding` length builds (`synth.new_coding_lane_tokens`), so 64 new lengths in one
    /// small request are a 400, not ~9 CPU-s; nothing is built for a refused request.
    #[tokio::test]
    async fn new_coding_lengths_count_against_the_token_budget() {
        let cfg = SynthConfig {
            new_coding_lane_tokens: 50_000,
            ..SynthConfig::default()
        };
        let s = Synthesizer::new(cfg, crate::cachebust::Target::None);
        let body = br#"{"messages":[{"role":"user","content":"{{kvbust:prompt:10:coding}} {{kvbust:prompt:11:coding}} {{kvbust:prompt:12:coding}} {{kvbust:prompt:12:coding}}"}]}"#;
        let e = s.expand(body).await.unwrap_err();
        assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
        assert_eq!(e.code(), "placeholder_limit");
        let msg = e.to_string();
        assert!(msg.contains("synth.new_coding_lane_tokens"), "{msg}");
        assert!(msg.contains("150045"), "3 new lengths + 45 tokens: {msg}");
        let lanes = s.lanes().await.unwrap();
        assert!(!lanes.has_lane(PromptCorpus::Coding, 10));
    }

    /// Item 4: generations run one per core; a request that goes away while its generation
    /// waits for a turn never starts it, and its place in the queue is freed at once.
    #[tokio::test]
    async fn a_request_dropped_while_waiting_never_starts_its_generation() {
        use futures_util::FutureExt;
        let s = Synthesizer::new(SynthConfig::default(), crate::cachebust::Target::None);
        let lanes = s.lanes().await.unwrap();
        // A new length: it waits for a build thread, all held here.
        let builds = s.gate.building.available_permits() as u32;
        let busy = s
            .gate
            .building
            .clone()
            .acquire_many_owned(builds)
            .await
            .unwrap();
        let body = br#"{"messages":[{"role":"user","content":"{{kvbust:prompt:7:random}}"}]}"#;
        // One poll: it takes its place in the queue and waits for a turn; then the client goes.
        let mut layout = None;
        assert!(s.expand_from(body, &mut layout, A).now_or_never().is_none());
        assert_eq!(s.gate.places.lock().unwrap().total, 0);
        assert!(!lanes.has_lane(PromptCorpus::Random, 7), "nothing was made");
        drop(busy);
        assert!(s.expand_from(body, &mut None, A).await.unwrap().is_some());
        assert!(lanes.has_lane(PromptCorpus::Random, 7));
    }

    /// Item 4: a generation whose request has gone is not started (the queue holds work only
    /// for clients still waiting).
    #[test]
    fn work_for_a_gone_request_is_not_started() {
        let alive = Arc::new(());
        let weak = Arc::downgrade(&alive);
        let mut ran = false;
        assert_eq!(
            unless_gone(&weak, || {
                ran = true;
                Ok(1)
            })
            .unwrap(),
            1
        );
        assert!(ran);
        drop(alive);
        let mut ran = false;
        let e = unless_gone(&weak, || {
            ran = true;
            Ok(1)
        })
        .unwrap_err();
        assert!(!ran);
        assert_eq!(e.code(), "client_gone");
    }
}
