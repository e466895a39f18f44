//! In-flight synthesis: fills a chat request's `messages` from the synthetic dataset
//! (`x-kvbust-synth: 1` or a synthetic route) and expands `{{kvbust:prompt:N[:corpus]}}`
//! placeholders in message content (never elsewhere); a `[synth.dataset]` naming a trace
//! (`input_file`) replays its entries in order. Splices into the client's bytes so every other
//! member stays as sent; builds the dataset and prompt streams once, off the async threads.
//! Never parses bodies that need neither.

use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use lru::LruCache;
use serde::de::{MapAccess, Visitor};
use serde::Deserializer as _;
use serde_json::value::RawValue;

use crate::cachebust::raw::{self, Kind};
use crate::config::{Config, SynthConfig};
use crate::error::ProxyError;
use crate::synth::corpus::sonnet::default_cache_dir;
use crate::synth::placeholders::PromptLanes;
use crate::synth::{
    Conversation, Dataset, PromptCorpus, RandomCorpusStyle, SynthParams, Tokenizer,
};

const PLACEHOLDER_OPEN: &[u8] = b"{{kvbust:";
/// Largest prompt one placeholder may ask for (the per-request total is configured).
const MAX_PLACEHOLDER_TOKENS: usize = 1 << 20;
/// Longest placeholder text between `{{kvbust:` and `}}`; what is longer is not a placeholder.
const MAX_PLACEHOLDER_INNER: usize = 64;

/// The byte ranges of a JSON object's members, in order. Keys are decoded; values stay raw.
struct Members {
    items: Vec<(String, Range<usize>)>,
    /// Offset of the closing `}`.
    close: usize,
}

fn members(body: &[u8]) -> Result<Members, ProxyError> {
    struct V<'a>(&'a [u8]);
    impl<'de> Visitor<'de> for V<'de> {
        type Value = Vec<(String, Range<usize>)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                // A borrowed RawValue is a slice of the body; its position is its offset.
                let start = v.get().as_ptr() as usize - self.0.as_ptr() as usize;
                out.push((k, start..start + v.get().len()));
            }
            Ok(out)
        }
    }
    let bad = |e: String| {
        ProxyError::bad_request(
            "invalid_body",
            format!("cannot synthesize into this body: {e}"),
        )
    };
    // serde_json quotes a whole string that is not an object ("invalid type: string ..."):
    // bound what reaches the client and the log.
    let quoted = |e: serde_json::Error| bad(crate::error::excerpt(e.to_string().as_bytes()));
    let mut de = serde_json::Deserializer::from_slice(body);
    let items = de.deserialize_map(V(body)).map_err(quoted)?;
    de.end().map_err(quoted)?;
    let close = body
        .iter()
        .rposition(|&b| b == b'}')
        .ok_or_else(|| bad("no closing brace".into()))?;
    Ok(Members { items, close })
}

/// One edit of the body: replace `range` with `text`.
struct Edit {
    range: Range<usize>,
    text: String,
}

fn splice(body: &[u8], mut edits: Vec<Edit>) -> Vec<u8> {
    edits.sort_by_key(|e| e.range.start);
    let mut out =
        Vec::with_capacity(body.len() + edits.iter().map(|e| e.text.len()).sum::<usize>());
    let mut at = 0;
    for e in edits {
        out.extend_from_slice(&body[at..e.range.start]);
        out.extend_from_slice(e.text.as_bytes());
        at = e.range.end;
    }
    out.extend_from_slice(&body[at..]);
    out
}

fn json_str(s: &str) -> String {
    // Serializing a &str cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

/// The `messages` for turn `k` of `conv`: system and user-context messages, the earlier user
/// turns each followed by the client's matching assistant message (when it sent one), then
/// user turn `k`. Returns the JSON array and how many user-context messages lead it.
pub fn conversation_messages(
    conv: &Conversation,
    k: usize,
    assistant: &[&RawValue],
) -> (String, usize) {
    let mut parts: Vec<String> = Vec::new();
    let msg = |role: &str, content: &str| {
        format!("{{\"role\":\"{role}\",\"content\":{}}}", json_str(content))
    };
    if let Some(s) = &conv.system_message {
        parts.push(msg("system", s));
    }
    let ctx = usize::from(conv.user_context_message.is_some());
    if let Some(c) = &conv.user_context_message {
        parts.push(msg("user", c));
    }
    for (i, turn) in conv.turns.iter().take(k + 1).enumerate() {
        parts.push(msg("user", &turn.text));
        if i < k {
            if let Some(a) = assistant.get(i) {
                parts.push(a.get().to_string());
            }
        }
    }
    (format!("[{}]", parts.join(",")), ctx)
}

/// Replaces `messages` (or adds it) and sets the output length from the entry's OSL: every
/// present `max_tokens` / `max_completion_tokens` is replaced, or `max_completion_tokens` added.
pub fn fill_body(
    body: &[u8],
    messages: &str,
    max_tokens: Option<u64>,
) -> Result<Vec<u8>, ProxyError> {
    let m = members(body)?;
    let mut edits = Vec::new();
    let mut has_messages = false;
    let mut has_max = false;
    for (k, r) in &m.items {
        match k.as_str() {
            "messages" => {
                has_messages = true;
                edits.push(Edit {
                    range: r.clone(),
                    text: messages.to_string(),
                });
            }
            "max_tokens" | "max_completion_tokens" => {
                if let Some(n) = max_tokens {
                    has_max = true;
                    edits.push(Edit {
                        range: r.clone(),
                        text: n.to_string(),
                    });
                }
            }
            _ => {}
        }
    }
    let mut tail = String::new();
    if !has_messages {
        tail.push_str(&format!("\"messages\":{messages}"));
    }
    if let (Some(n), false) = (max_tokens, has_max) {
        if !tail.is_empty() {
            tail.push(',');
        }
        tail.push_str(&format!("\"max_completion_tokens\":{n}"));
    }
    if !tail.is_empty() {
        let sep = if m.items.is_empty() { "" } else { "," };
        edits.push(Edit {
            range: m.close..m.close,
            text: format!("{sep}{tail}"),
        });
    }
    Ok(splice(body, edits))
}

/// A placeholder found in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    pub range: Range<usize>,
    pub tokens: usize,
    pub corpus: Option<PromptCorpus>,
}

/// Finds `{{kvbust:prompt:N}}` / `{{kvbust:prompt:N:corpus}}` in message content: the string
/// `content` of a message in the top-level `messages`, or the `text` of its `content` parts of
/// type `text` (`kvbust-contract.md`: "inside any message content"). Everything else (roles,
/// names, tool calls and their arguments, other part types, other members, member names) is
/// message metadata, not prompt text, and passes through as sent, placeholder or not. Duplicate
/// keys: the last `messages`, `content`, `type` and `text` count, as for the upstream's parser.
/// A placeholder is matched in the raw JSON, so one spelled with escapes (`\u007b…`) is text.
pub fn find_placeholders(body: &[u8]) -> Result<Vec<Placeholder>, ProxyError> {
    find_placeholders_limited(body, usize::MAX, usize::MAX)
}

/// [`find_placeholders`] that stops with a 400 as soon as there are more than `max_count`
/// placeholders or they ask for more than `max_tokens` tokens together. A placeholder is only
/// `[A-Za-z0-9:_-]` between the braces (so it always sits inside one JSON string); anything
/// else after `{{kvbust:` in message content is malformed, and the error quotes a bounded,
/// escaped excerpt of that string.
pub fn find_placeholders_limited(
    body: &[u8],
    max_count: usize,
    max_tokens: usize,
) -> Result<Vec<Placeholder>, ProxyError> {
    // Every chat body comes through here: one SIMD search decides for the many without any.
    if find_open(body).is_none() {
        return Ok(Vec::new());
    }
    scan_content(body, max_count, max_tokens)
}

/// [`find_placeholders_limited`] once the body holds `{{kvbust:`: kept out of line so the
/// common call stays a search and a return.
#[inline(never)]
fn scan_content(
    body: &[u8],
    max_count: usize,
    max_tokens: usize,
) -> Result<Vec<Placeholder>, ProxyError> {
    let mut scan = Scan {
        body,
        max_count,
        max_tokens,
        total: 0,
        out: Vec::new(),
    };
    for (i, message) in chat_messages(body)?.into_iter().enumerate() {
        // Only a message holding the text is decoded further (a second pass over its bytes).
        if Kind::of(message) != Kind::Object || find_open(message.get().as_bytes()).is_none() {
            continue;
        }
        let obj = raw::object(message).map_err(|e| invalid_body(&format!("messages[{i}]"), e))?;
        match obj.get("content") {
            Some(c) if Kind::of(c) == Kind::String => scan.string(c)?,
            Some(c) if Kind::of(c) == Kind::Array => {
                let parts = raw::array(c)
                    .map_err(|e| invalid_body(&format!("messages[{i}].content"), e))?;
                for (j, part) in parts.into_iter().enumerate() {
                    if Kind::of(part) != Kind::Object || find_open(part.get().as_bytes()).is_none()
                    {
                        continue;
                    }
                    let part = raw::object(part)
                        .map_err(|e| invalid_body(&format!("messages[{i}].content[{j}]"), e))?;
                    if let Some(text) = raw::part_text(&part, "text") {
                        scan.string(text)?;
                    }
                }
            }
            // No content, or content of another kind: nothing that is prompt text.
            _ => {}
        }
    }
    Ok(scan.out)
}

/// The top-level `messages` array's elements (the last `messages`); none when it is absent or
/// not an array (no message content to expand: the upstream judges such a body).
fn chat_messages(body: &[u8]) -> Result<Vec<&RawValue>, ProxyError> {
    if let Ok((_, messages)) = raw::object_with_array(body, "messages") {
        return Ok(messages.unwrap_or_default());
    }
    // The one-pass reader failed: not an object, invalid JSON (worded here), or some `messages`
    // is not an array. Only the last one counts: an earlier duplicate of another kind does not
    // hide the array the upstream reads.
    let top =
        serde_json::from_slice::<raw::RawObject>(body).map_err(|e| invalid_body("this body", e))?;
    match top.get("messages") {
        Some(m) if Kind::of(m) == Kind::Array => {
            raw::array(m).map_err(|e| invalid_body("messages", e))
        }
        _ => Ok(Vec::new()),
    }
}

/// A 400 for JSON the placeholder scan cannot read; serde_json may quote a whole string
/// ("invalid type: string …"), so the message is bounded and escaped.
fn invalid_body(what: &str, e: serde_json::Error) -> ProxyError {
    ProxyError::bad_request(
        "invalid_body",
        format!(
            "cannot expand placeholders in {what}: {}",
            crate::error::excerpt(e.to_string().as_bytes())
        ),
    )
}

/// The placeholders found so far, against the request's limits.
struct Scan<'a> {
    body: &'a [u8],
    max_count: usize,
    max_tokens: usize,
    total: usize,
    out: Vec<Placeholder>,
}

impl Scan<'_> {
    /// Every placeholder inside one JSON string literal of the body, in order.
    fn string(&mut self, literal: &RawValue) -> Result<(), ProxyError> {
        let body = self.body;
        // A RawValue borrowed from the body always lies in it; a string literal has its quotes.
        let Some(span) = raw::span(body, literal) else {
            return Err(ProxyError::Internal(
                "placeholder scan: a value outside the body".into(),
            ));
        };
        let end_of_text = span.end.saturating_sub(1);
        let mut at = span.start + 1;
        while let Some(i) = find_open(&body[at..end_of_text]) {
            let start = at + i;
            // No JSON escape holds `{`, `}` or ends in `[A-Za-z0-9:_-]` followed by `}}`, so a
            // match in the raw text is the literal text.
            let rest = &body[start..end_of_text];
            let inner = rest[PLACEHOLDER_OPEN.len()..]
                .iter()
                .take(MAX_PLACEHOLDER_INNER + 1)
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'-'))
                .count();
            let end = start + PLACEHOLDER_OPEN.len() + inner;
            if inner > MAX_PLACEHOLDER_INNER || !body[end..end_of_text].starts_with(b"}}") {
                return Err(malformed(
                    rest,
                    "it is not closed with `}}` after at most 64 characters of [A-Za-z0-9:_-]",
                ));
            }
            let end = end + 2;
            // Only ASCII was accepted above, so this is UTF-8.
            let text =
                std::str::from_utf8(&body[start..end]).map_err(|_| malformed(rest, "not UTF-8"))?;
            let p = parse_placeholder(text, start..end)?;
            self.push(p)?;
            at = end;
        }
        Ok(())
    }

    fn push(&mut self, p: Placeholder) -> Result<(), ProxyError> {
        self.total = self.total.saturating_add(p.tokens);
        if self.out.len() >= self.max_count {
            return Err(ProxyError::bad_request(
                "placeholder_limit",
                format!(
                    "the request holds more than synth.max_placeholders = {} \
                     placeholders; send fewer or raise the limit",
                    self.max_count
                ),
            ));
        }
        if self.total > self.max_tokens {
            return Err(ProxyError::bad_request(
                "placeholder_limit",
                format!(
                    "the placeholders ask for more than synth.max_placeholder_tokens = \
                     {} tokens together; ask for fewer or raise the limit",
                    self.max_tokens
                ),
            ));
        }
        self.out.push(p);
        Ok(())
    }
}

fn parse_placeholder(text: &str, range: Range<usize>) -> Result<Placeholder, ProxyError> {
    let inner = &text[PLACEHOLDER_OPEN.len()..text.len() - 2];
    let mut parts = inner.split(':');
    if parts.next() != Some("prompt") {
        return Err(malformed(text, "the only kind is `prompt`"));
    }
    let n = parts.next().unwrap_or("");
    let tokens: usize = n
        .parse()
        .map_err(|_| malformed(text, "N must be a positive integer"))?;
    if tokens == 0 || tokens > MAX_PLACEHOLDER_TOKENS {
        return Err(malformed(
            text,
            &format!("N must be between 1 and {MAX_PLACEHOLDER_TOKENS}"),
        ));
    }
    let corpus = match parts.next() {
        None => None,
        Some(name) => Some(
            name.parse::<PromptCorpus>()
                .map_err(|e| malformed(text, &e))?,
        ),
    };
    if parts.next().is_some() {
        return Err(malformed(text, "too many `:` fields"));
    }
    Ok(Placeholder {
        range,
        tokens,
        corpus,
    })
}

fn malformed(text: impl AsRef<[u8]>, why: &str) -> ProxyError {
    ProxyError::bad_request(
        "invalid_placeholder",
        format!(
            "malformed placeholder `{}`: {why}; write {{{{kvbust:prompt:N}}}} or {{{{kvbust:prompt:N:corpus}}}}",
            crate::error::excerpt(text.as_ref())
        ),
    )
}

/// SIMD substring search: every chat body is scanned for placeholders, so this is on the hot path.
/// The searcher is built once: `memmem::find` would build it again on every call.
fn find_open(hay: &[u8]) -> Option<usize> {
    static OPEN: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(PLACEHOLDER_OPEN));
    OPEN.find(hay)
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

struct Built {
    dataset: Dataset,
    next: usize,
    sessions: LruCache<String, (usize, usize)>,
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
    /// Placeholder prompts being made on demand now (bounded by `synth.placeholder_queue`).
    pending: Arc<AtomicUsize>,
}

/// One place in the on-demand queue, freed when the generation holding it ends (not when the
/// request goes away, so the bound counts work that is really running).
struct QueueSlot(Arc<AtomicUsize>);

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a synthetic fill produced.
pub struct Filled {
    pub body: Vec<u8>,
    pub user_context_messages: usize,
    pub session_id: String,
    /// The entry's trace `timestamp` (ms), for the `x-kvbust-trace-timestamp` response header.
    pub trace_timestamp: Option<String>,
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
            cfg,
            cache_bust,
            max_body,
            tokenizer: tokio::sync::OnceCell::new(),
            dataset: tokio::sync::OnceCell::new(),
            lanes: tokio::sync::OnceCell::new(),
            pending: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// A place in the on-demand queue, or a 503 when `synth.placeholder_queue` are taken.
    fn queue_slot(&self) -> Result<QueueSlot, ProxyError> {
        let before = self.pending.fetch_add(1, Ordering::AcqRel);
        let slot = QueueSlot(self.pending.clone());
        if before >= self.cfg.placeholder_queue {
            return Err(ProxyError::Overloaded {
                code: "placeholder_queue_full",
                message: format!(
                    "synth.placeholder_queue = {} placeholder prompts are being made; retry shortly",
                    self.cfg.placeholder_queue
                ),
                retry_after_s: 1,
            });
        }
        Ok(slot)
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
                blocking(move || {
                    let t0 = Instant::now();
                    let dataset = crate::synth::build_dataset_with(
                        &params,
                        &tok,
                        default_cache_dir().as_deref(),
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
                    tracing::info!(
                        conversations = dataset.conversations.len(),
                        elapsed = ?t0.elapsed(),
                        "synthetic dataset built"
                    );
                    let cap = NonZeroUsize::new(100_000).unwrap_or(NonZeroUsize::MIN);
                    Ok(Arc::new(Mutex::new(Built {
                        dataset,
                        next: 0,
                        sessions: LruCache::new(cap),
                    })))
                })
                .await
            })
            .await
            .cloned()
    }

    /// Builds the dataset now (at start, when `[synth.dataset]` is configured).
    pub async fn prewarm(&self) {
        if let Err(e) = self.built().await {
            tracing::error!("{e}");
        }
    }

    /// Fills a chat body with the next dataset entry (or the session's next turn).
    pub async fn fill(&self, body: &[u8], session: Option<&str>) -> Result<Filled, ProxyError> {
        let built = self.built().await?;
        let (conv, k) = {
            let mut b = built.lock().unwrap_or_else(|p| p.into_inner());
            let n = b.dataset.conversations.len();
            let known = session.and_then(|s| b.sessions.get(s).copied());
            let (ci, k) = match known {
                Some((ci, k)) if k < b.dataset.conversations[ci].turns.len() => (ci, k),
                _ => {
                    let ci = b.next % n;
                    b.next += 1;
                    (ci, 0)
                }
            };
            if let Some(s) = session {
                b.sessions.put(s.to_string(), (ci, k + 1));
            }
            (b.dataset.conversations[ci].clone(), k)
        };
        let turn = conv.turns.get(k);
        // A trace's verbatim `messages` replace the body's as they are.
        let (messages, ctx) = match turn.and_then(|t| t.raw_messages.as_ref()) {
            Some(raw) => (raw.get().to_owned(), 0),
            None => conversation_messages(&conv, k, &assistant_messages(body)),
        };
        let max = turn.and_then(|t| t.max_tokens);
        let trace_timestamp = turn
            .and_then(|t| t.timestamp.as_ref())
            .map(|n| n.to_string());
        Ok(Filled {
            body: fill_body(body, &messages, max)?,
            user_context_messages: ctx,
            session_id: conv.session_id,
            trace_timestamp,
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
                    default_cache_dir(),
                ))
            })
            .await
            .cloned()
    }

    /// Expands every placeholder in `messages`; `None` when there is none. Over
    /// `synth.max_placeholders` / `synth.max_placeholder_tokens` is a 400, an expanded body over
    /// `limits.max_body` a 413 (generation stops as soon as it would be).
    pub async fn expand(&self, body: &[u8]) -> Result<Option<Vec<u8>>, ProxyError> {
        let found = find_placeholders_limited(
            body,
            self.cfg.max_placeholders,
            self.cfg.max_placeholder_tokens,
        )?;
        if found.is_empty() {
            return Ok(None);
        }
        let lanes = self.lanes().await?;
        let default = self.cfg.placeholder_corpus;
        let too_large = || ProxyError::BodyTooLarge {
            limit: self.max_body,
        };
        let mut size = body.len() as u64;
        let mut edits = Vec::with_capacity(found.len());
        // One placeholder at a time, each on its own lane: nothing here waits for another
        // request's placeholders of other lengths, and a dropped request stops between two.
        for p in &found {
            let (corpus, n) = (p.corpus.unwrap_or(default), p.tokens);
            let text = match lanes.try_take(corpus, n) {
                Some(t) => t,
                None => {
                    let (lanes, slot) = (lanes.clone(), self.queue_slot()?);
                    blocking(move || {
                        let _slot = slot;
                        lanes.take(corpus, n).map_err(|e| {
                            ProxyError::Internal(format!(
                                "{} prompt of {n} tokens: {e}",
                                corpus.as_str()
                            ))
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
            edits.push(Edit {
                range: p.range.clone(),
                text: inner.to_string(),
            });
        }
        Ok(Some(splice(body, edits)))
    }
}

/// The contract's defaults for a dataset built on first use.
pub fn default_params() -> SynthParams {
    SynthParams {
        random_seed: Some(0),
        ..SynthParams::default()
    }
}

/// The client's assistant messages, raw, in order (the answers to earlier synthetic turns).
fn assistant_messages(body: &[u8]) -> Vec<&RawValue> {
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow, default)]
        messages: Vec<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Role<'a> {
        #[serde(borrow)]
        role: Option<&'a str>,
    }
    let Ok(b) = serde_json::from_slice::<Body>(body) else {
        return Vec::new();
    };
    b.messages
        .into_iter()
        .filter(|m| {
            serde_json::from_str::<Role>(m.get())
                .ok()
                .and_then(|r| r.role)
                == Some("assistant")
        })
        .collect()
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
        let held = s.queue_slot().unwrap();
        let err = s.expand(body).await.unwrap_err();
        assert_eq!(err.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.code(), "placeholder_queue_full");
        let resp = err.into_response::<bytes::Bytes>();
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "1");
        drop(held);
        assert!(s.expand(body).await.unwrap().is_some());
        assert_eq!(s.pending.load(Ordering::Acquire), 0);
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
