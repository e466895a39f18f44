//! The cache model's tokenizer: a request's prompt, as the engine parses it
//! ([`Prompt`], the same parse the built-in mock makes), into the token ids the engine sees,
//! and the token index of its isolation point. Chat prompts are rendered through the chat
//! template and cut at the template's special tokens (where the tokenizer itself cuts, so the
//! pieces tokenize to exactly the whole); each piece's ids are remembered, so a multi-turn or
//! agentic context that grows by a message costs only that message. Owns tokenization and its
//! memo; never touches the block index, the network or a clock.

use std::sync::{Arc, OnceLock};

use lru::LruCache;
use memchr::memmem;

use crate::mock::request::ChatOptions;
use crate::mock::request::{Message, Prompt, PromptPart};
use crate::mock::tokenize::{builtin_encode, builtin_pieces, plain_render, render_chat};
use crate::synth::tokenizer::bpe::ByteLevelBpe;
use crate::synth::tokenizer::chat_template::ChatTemplate;
use crate::synth::tokenizer::pyjinja::TemplateDate;
use crate::synth::tokenizer::Tokenizer;

/// Where the isolation point is, in the prompt's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsoHint {
    /// No isolation point (target `none`, or nothing to isolate).
    None,
    /// Just after the first occurrence of the marker `text` (stripped: `[rid:…]`,
    /// `[warmup]`). Two markers may share their first bytes (every RID starts `[rid:`, and two
    /// digests may share a first hex digit), so a block that ends inside a marker can be the
    /// same for two sessions by chance; a block that holds anything past the marker cannot,
    /// unless the whole marker is the same.
    Marker(String),
    /// At the start of message `index`'s content (where a warmup marker sat in the warmup
    /// phase; profiling requests of the `warmup_isolation_*` targets carry none).
    MessageStart(usize),
}

/// A prompt as tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    /// Index of the first token at or after the isolation point; `None` without one, or when
    /// it could not be found in the rendered text.
    pub iso: Option<usize>,
}

/// Why a prompt could not be tokenized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("the chat template refused the messages: {0}")]
    Template(String),
    #[error("the tokenizer failed: {0}")]
    Tokenizer(String),
    /// The prompt's text is longer than `cache_model.max_prompt_bytes`: not tokenized at all
    /// (a tokenizer's working memory grows with its input, far past the input's own size).
    #[error("the prompt's {bytes} bytes of text pass cache_model.max_prompt_bytes ({max})")]
    TooLarge { bytes: usize, max: usize },
}

impl IsoHint {
    /// The isolation point of a RID marker with this digest.
    pub fn rid(digest: &str) -> Self {
        IsoHint::Marker(format!("[rid:{digest}]"))
    }

    /// The isolation point of the warmup marker.
    pub fn warmup() -> Self {
        IsoHint::Marker(crate::cachebust::WARMUP_ISOLATION_MARKER.trim().to_string())
    }
}

impl EncodeError {
    /// The `reason` label of `kvbust_cache_model_unaccounted_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            EncodeError::Template(_) => "template_error",
            EncodeError::Tokenizer(_) => "tokenizer_error",
            EncodeError::TooLarge { .. } => "too_large",
        }
    }
}

/// The tokenizer the model counts with.
pub enum Vocab {
    Hf {
        tokenizer: Arc<Tokenizer>,
        /// `None`: `chat_template = "none"` or a tokenizer without one.
        template: Option<Box<ChatTemplate>>,
        /// The special tokens the template writes, with their ids: the safe cut points.
        cuts: Cuts,
        /// The byte-level encoder, where it reproduces `tokenizer`: decided at load, filled in by
        /// a builder thread when ready (`tokenizers` counts the same ids until then).
        fast: FastSlot,
    },
    Builtin,
}

impl Vocab {
    /// `tokenizer` with its chat template (when `use_template` and it has one).
    pub fn hf(tokenizer: Arc<Tokenizer>, use_template: bool) -> Result<Self, EncodeError> {
        Self::hf_dated(tokenizer, use_template, TemplateDate::Today)
    }

    /// [`Vocab::hf`] with the template's `strftime_now` reading `date`
    /// (`cache_model.chat_template_date`).
    pub fn hf_dated(
        tokenizer: Arc<Tokenizer>,
        use_template: bool,
        date: TemplateDate,
    ) -> Result<Self, EncodeError> {
        let template = if use_template {
            ChatTemplate::for_tokenizer(&tokenizer)
                .map_err(|e| EncodeError::Template(e.to_string()))?
                .map(|t| Box::new(t.with_date(date)))
        } else {
            None
        };
        let cuts = match (&template, tokenizer.chat_template()) {
            (Some(_), Some(source)) => cut_tokens(&tokenizer, source),
            _ => Cuts::default(),
        };
        let fast = FastSlot::default();
        match ByteLevelBpe::already_built(&tokenizer) {
            Some(built) => fast.fill(built),
            None => {
                let (t, slot) = (tokenizer.clone(), fast.clone());
                let spawned = std::thread::Builder::new()
                    .name("kvbust-bpe-build".into())
                    .spawn(move || slot.fill(ByteLevelBpe::shared(&t)));
                if let Err(e) = spawned {
                    tracing::warn!(
                        "cache model: tokenizing with `tokenizers` (no builder thread: {e})"
                    );
                }
            }
        }
        Ok(Vocab::Hf {
            tokenizer,
            template,
            cuts,
            fast,
        })
    }

    /// Whether text is tokenized by the byte-level encoder (not `tokenizers`) by now.
    pub fn is_fast(&self) -> bool {
        matches!(self, Vocab::Hf { fast, .. } if fast.get().is_some())
    }
}

/// Where the byte-level encoder arrives once built (empty: `tokenizers` counts).
#[derive(Clone, Default)]
pub struct FastSlot(Arc<OnceLock<Arc<ByteLevelBpe>>>);

impl FastSlot {
    fn get(&self) -> Option<&ByteLevelBpe> {
        self.0.get().map(|b| &**b)
    }

    /// Installs the build's result, and logs which encoder the model counts with.
    fn fill(&self, built: Result<Arc<ByteLevelBpe>, crate::synth::tokenizer::bpe::Unsupported>) {
        match built {
            Ok(bpe) => {
                tracing::info!("cache model: tokenizing with the byte-level BPE encoder");
                // Filled once: a slot belongs to one load.
                let _ = self.0.set(bpe);
            }
            Err(why) => tracing::info!("cache model: tokenizing with `tokenizers` ({why})"),
        }
    }
}

/// Text to ids: the byte-level encoder when it reproduces the tokenizer, else `tokenizers`.
#[derive(Clone, Copy)]
struct Text<'a> {
    tokenizer: &'a Tokenizer,
    fast: Option<&'a ByteLevelBpe>,
}

impl<'a> Text<'a> {
    fn new(tokenizer: &'a Tokenizer, fast: &'a FastSlot) -> Self {
        Text {
            tokenizer,
            fast: fast.get(),
        }
    }

    /// `encode(text, add_special_tokens = special)`.
    fn encode(self, text: &str, special: bool) -> Result<Vec<u32>, EncodeError> {
        match self.fast {
            Some(f) if special => Ok(f.encode_special(text)),
            Some(f) => Ok(f.encode(text)),
            None => hf_encode(self.tokenizer, text, special),
        }
    }

    /// Tokens of `piece` that end at or before byte `at`, and the piece's ids.
    fn before(self, piece: &str, at: usize) -> Result<(usize, Vec<u32>), EncodeError> {
        match self.fast.and_then(|f| f.encode_point(piece, at)) {
            Some(got) => Ok(got),
            None => tokens_before(self.tokenizer, piece, at),
        }
    }

    /// [`Text::before`] with `add_special_tokens = true`: the special tokens around the text
    /// count as before the point where `tokenizers`' offsets put them (a BOS has the empty
    /// span (0, 0): it ends before any byte).
    fn before_special(self, text: &str, at: usize) -> Result<(usize, Vec<u32>), EncodeError> {
        if let Some(got) = self.fast.and_then(|f| f.encode_special_point(text, at)) {
            return Ok(got);
        }
        let enc = self
            .tokenizer
            .inner()
            .encode(text, true)
            .map_err(|e| EncodeError::Tokenizer(e.to_string()))?;
        let before = enc
            .get_offsets()
            .iter()
            .zip(enc.get_special_tokens_mask())
            .take_while(|(o, s)| **s == 1 || o.1 <= at)
            .count();
        Ok((before, enc.get_ids().to_vec()))
    }
}

/// The added tokens the template's source names that the tokenizer matches as they are (not
/// normalized, no stripping of neighbours, not word-bound): the tokenizer splits its input at
/// each of them before anything else, so the text between two of them tokenizes on its own to
/// the very ids it gets inside the whole.
fn cut_tokens(tokenizer: &Tokenizer, template_source: &str) -> Cuts {
    let mut cuts: Vec<(String, u32)> = tokenizer
        .inner()
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| {
            t.special
                && !t.normalized
                && !t.lstrip
                && !t.rstrip
                && !t.single_word
                && t.content.len() >= 3
                && template_source.contains(t.content.as_str())
        })
        .map(|(id, t)| (t.content, id))
        .collect();
    cuts.sort();
    Cuts::new(cuts)
}

/// The cut tokens, found in one pass over the text: a scan for the bytes they begin with, then
/// a comparison at each such byte. One `memmem` search per token per piece (the first way)
/// built a searcher each time: 6,000 instructions a 1 KB chat request, more than the search.
#[derive(Debug, Clone, Default)]
pub struct Cuts {
    /// Longest first, so the first match at a position is the longest there.
    tokens: Vec<(String, u32)>,
    /// The distinct first bytes of the tokens.
    firsts: Vec<u8>,
    /// `firsts` as a table, for more than three of them.
    starts: Option<Box<[bool; 256]>>,
}

impl Cuts {
    fn new(mut tokens: Vec<(String, u32)>) -> Self {
        tokens.retain(|(t, _)| !t.is_empty());
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        let mut firsts: Vec<u8> = tokens.iter().map(|(t, _)| t.as_bytes()[0]).collect();
        firsts.sort_unstable();
        firsts.dedup();
        let starts = (firsts.len() > 3).then(|| {
            let mut table = Box::new([false; 256]);
            for &b in &firsts {
                table[usize::from(b)] = true;
            }
            table
        });
        Self {
            tokens,
            firsts,
            starts,
        }
    }

    /// The tokens, longest first.
    pub fn iter(&self) -> impl Iterator<Item = &(String, u32)> {
        self.tokens.iter()
    }

    /// The earliest cut token at or after `from` (the longest, where two begin there).
    fn next<'c>(&'c self, text: &str, from: usize) -> Option<(usize, &'c str, u32)> {
        let bytes = text.as_bytes();
        let mut at = from;
        while at < bytes.len() {
            let hay = &bytes[at..];
            let found = match (&self.starts, self.firsts.as_slice()) {
                (Some(table), _) => hay.iter().position(|&b| table[usize::from(b)]),
                (None, [a]) => memchr::memchr(*a, hay),
                (None, [a, b]) => memchr::memchr2(*a, *b, hay),
                (None, [a, b, c]) => memchr::memchr3(*a, *b, *c, hay),
                (None, _) => None,
            };
            let p = at + found?;
            let rest = &bytes[p..];
            if let Some((t, id)) = self
                .tokens
                .iter()
                .find(|(t, _)| rest.starts_with(t.as_bytes()))
            {
                return Some((p, t.as_str(), *id));
            }
            at = p + 1;
        }
        None
    }
}

/// The tokenization's state: text pieces' ids, remembered by the piece's length and hash (and,
/// for the piece that holds a marker, the marker's offset in it, with the tokens before it),
/// bounded in tokens; and the bound on the text one prompt may make the tokenizer read.
pub struct Memo {
    pieces: LruCache<PieceKey, (Arc<[u32]>, usize)>,
    tokens: usize,
    max_tokens: usize,
    /// `cache_model.max_prompt_bytes`: a prompt with more text is [`EncodeError::TooLarge`].
    max_prompt_bytes: usize,
    pub hits: u64,
    pub misses: u64,
}

impl Memo {
    pub fn new(max_tokens: usize) -> Self {
        Self {
            pieces: LruCache::unbounded(),
            tokens: 0,
            max_tokens,
            max_prompt_bytes: usize::MAX,
            hits: 0,
            misses: 0,
        }
    }

    /// The memo, refusing prompts of more than `max` bytes of text.
    pub fn bounded(mut self, max: usize) -> Self {
        self.max_prompt_bytes = max;
        self
    }

    /// `Err(TooLarge)` when `bytes` of text is more than one prompt may have tokenized.
    fn admit(&self, bytes: usize) -> Result<(), EncodeError> {
        admit(bytes, self.max_prompt_bytes)
    }

    /// Bytes the memo holds, roughly (ids, keys and the LRU's links).
    pub fn bytes(&self) -> usize {
        self.tokens * 4 + self.pieces.len() * 64
    }

    fn get_or_encode(
        &mut self,
        piece: &str,
        encode: impl FnOnce(&str) -> Result<Vec<u32>, EncodeError>,
    ) -> Result<Arc<[u32]>, EncodeError> {
        let (ids, _) = self.get_or_encode_at(piece, None, |p| Ok((0, encode(p)?)))?;
        Ok(ids)
    }

    /// The piece's ids and, for a point `at` in it, how many of them end at or before it.
    fn get_or_encode_at(
        &mut self,
        piece: &str,
        at: Option<usize>,
        encode: impl FnOnce(&str) -> Result<(usize, Vec<u32>), EncodeError>,
    ) -> Result<(Arc<[u32]>, usize), EncodeError> {
        let key = PieceKey {
            len: piece.len(),
            hash: text_hash(piece),
            at,
        };
        if let Some((ids, before)) = self.pieces.get(&key) {
            self.hits += 1;
            return Ok((ids.clone(), *before));
        }
        self.misses += 1;
        let (before, ids) = encode(piece)?;
        let ids: Arc<[u32]> = ids.into();
        if ids.len() <= self.max_tokens {
            self.tokens += ids.len();
            self.pieces.put(key, (ids.clone(), before));
            while self.tokens > self.max_tokens {
                match self.pieces.pop_lru() {
                    Some((_, (old, _))) => self.tokens -= old.len(),
                    None => break,
                }
            }
        }
        Ok((ids, before))
    }
}

/// A remembered piece: its length and hash, and where in it a marker's point was (`None`: no
/// marker in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PieceKey {
    len: usize,
    hash: u64,
    at: Option<usize>,
}

/// `Err(TooLarge)` when `bytes` of text is more than `max` (`cache_model.max_prompt_bytes`): the
/// check [`encode`] and [`encode_contents`] make first, for text whose pieces were tokenized
/// apart and are put together later.
pub fn admit(bytes: usize, max: usize) -> Result<(), EncodeError> {
    if bytes > max {
        return Err(EncodeError::TooLarge { bytes, max });
    }
    Ok(())
}

/// A piece's hash for the memo. foldhash, not SipHash: a piece is up to a whole agent context
/// (a marked first turn of 100 KB to 1 MB, hashed on every turn), and SipHash's 1.3
/// instructions a byte were most of a memo hit's cost there; the key also holds the length.
fn text_hash(s: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0x6b76_6275_7374).hash_one(s)
}

/// Encodes `prompt` as the engine would, with the isolation point `iso`.
pub fn encode(
    vocab: &Vocab,
    memo: &mut Memo,
    prompt: &Prompt,
    iso: &IsoHint,
) -> Result<Encoded, EncodeError> {
    // Decided before any rendering or tokenizing: the text the prompt holds, as the mock
    // measures it (a template only adds to a chat's).
    memo.admit(crate::mock::tokenize::MockTokenizer::prompt_bytes(prompt))?;
    match prompt.chat() {
        Some((messages, options)) => encode_messages(vocab, memo, messages, options, iso),
        None => match prompt {
            Prompt::Raw(parts) => encode_raw(vocab, parts, iso),
            _ => Ok(Encoded {
                ids: Vec::new(),
                iso: None,
            }),
        },
    }
}

fn encode_messages(
    vocab: &Vocab,
    memo: &mut Memo,
    messages: &[Message],
    options: &ChatOptions,
    iso: &IsoHint,
) -> Result<Encoded, EncodeError> {
    let text = match vocab {
        Vocab::Hf {
            template: Some(t), ..
        } => render_chat(t, messages, options).map_err(|e| EncodeError::Template(e.0))?,
        _ => plain_render(messages),
    };
    // What the template added counts too: many short messages render long.
    memo.admit(text.len())?;
    if options.add_special_tokens && matches!(vocab, Vocab::Hf { .. }) {
        // Rare (a body's `add_special_tokens: true`): the tokenizer's own special tokens (a
        // BOS) around the whole text, as a completions prompt is tokenized.
        return encode_raw(vocab, &[PromptPart::Text(text)], iso);
    }
    let at = iso_offset(&text, messages, iso);
    match vocab {
        Vocab::Builtin => Ok(builtin_with_iso(&text, at)),
        Vocab::Hf {
            tokenizer,
            cuts,
            fast,
            ..
        } => encode_cut(Text::new(tokenizer, fast), cuts, memo, &text, at),
    }
}

/// The messages' texts, each tokenized on its own (no role, no template, no special tokens),
/// one after another: what `capture.chat_template = "none"` records, so that a single-message
/// prompt counts exactly as its text does when synthesis replays it. From the memo where it can.
pub fn encode_contents<'m>(
    vocab: &Vocab,
    memo: &mut Memo,
    messages: impl IntoIterator<Item = &'m Message>,
) -> Result<Vec<u32>, EncodeError> {
    let messages: Vec<&Message> = messages.into_iter().collect();
    memo.admit(messages.iter().map(|m| m.content.len()).sum())?;
    let mut ids = Vec::new();
    for m in messages {
        match vocab {
            Vocab::Builtin => ids.extend(builtin_encode(&m.content)),
            Vocab::Hf {
                tokenizer, fast, ..
            } => {
                let text = Text::new(tokenizer, fast);
                let got = memo.get_or_encode(&m.content, |p| text.encode(p, false))?;
                ids.extend_from_slice(&got);
            }
        }
    }
    Ok(ids)
}

/// The byte offset of the isolation point in the rendered `text`.
fn iso_offset(text: &str, messages: &[Message], iso: &IsoHint) -> Option<usize> {
    match iso {
        IsoHint::None => None,
        IsoHint::Marker(m) if m.is_empty() => None,
        IsoHint::Marker(m) => memmem::find(text.as_bytes(), m.as_bytes()).map(|at| at + m.len()),
        IsoHint::MessageStart(k) => {
            // Contents appear in the rendered text in order: find each up to the k-th.
            let mut from = 0;
            let mut found = None;
            for m in messages.get(..=*k)? {
                let at = from + memmem::find(&text.as_bytes()[from..], m.content.as_bytes())?;
                from = at + m.content.len();
                found = Some(at);
            }
            found
        }
    }
}

fn builtin_with_iso(text: &str, at: Option<usize>) -> Encoded {
    let pieces = builtin_pieces(text);
    let iso = at.map(|at| {
        let mut end = 0;
        pieces
            .iter()
            .take_while(|p| {
                end += p.len();
                end <= at
            })
            .count()
    });
    Encoded {
        ids: builtin_encode(text),
        iso,
    }
}

/// Tokenizes `text` piece by piece between the cut tokens, from the memo where it can.
fn encode_cut(
    text_encoder: Text<'_>,
    cuts: &Cuts,
    memo: &mut Memo,
    text: &str,
    at: Option<usize>,
) -> Result<Encoded, EncodeError> {
    let mut ids = Vec::with_capacity(text.len() / 3 + 8);
    let mut iso = None;
    let mut start = 0;
    let mut cx = Pieces {
        encoder: text_encoder,
        memo,
        text,
        at,
    };
    while let Some((pos, content, id)) = cuts.next(text, start) {
        cx.push(&mut ids, &mut iso, start..pos)?;
        if iso.is_none() && at.is_some_and(|a| a >= pos && a < pos + content.len()) {
            iso = Some(ids.len());
        }
        ids.push(id);
        start = pos + content.len();
    }
    cx.push(&mut ids, &mut iso, start..text.len())?;
    Ok(Encoded { ids, iso })
}

/// What [`encode_cut`] tokenizes its pieces with.
struct Pieces<'a> {
    encoder: Text<'a>,
    memo: &'a mut Memo,
    text: &'a str,
    at: Option<usize>,
}

impl Pieces<'_> {
    /// Appends the ids of `text[range]`, and the isolation point when it falls inside it.
    fn push(
        &mut self,
        ids: &mut Vec<u32>,
        iso: &mut Option<usize>,
        range: std::ops::Range<usize>,
    ) -> Result<(), EncodeError> {
        if range.is_empty() {
            return Ok(());
        }
        let piece = &self.text[range.clone()];
        // Pieces come in order, so the first one that ends past the point holds it.
        if let Some(at) = self.at.filter(|&a| iso.is_none() && a < range.end) {
            // One encoding with offsets gives both the point and the ids. The piece holds the
            // request's marker, which a conversation sends again with every turn (its first
            // user turn, or its system prompt): remembered with the point's place, a long
            // first turn is tokenized once a conversation, not once a turn.
            let off = at.saturating_sub(range.start);
            let encoder = self.encoder;
            let (got, before) = self
                .memo
                .get_or_encode_at(piece, Some(off), |p| encoder.before(p, off))?;
            *iso = Some(ids.len() + before);
            ids.extend_from_slice(&got);
            return Ok(());
        }
        let encoder = self.encoder;
        let got = self
            .memo
            .get_or_encode(piece, |p| encoder.encode(p, false))?;
        ids.extend_from_slice(&got);
        Ok(())
    }
}

/// Tokens of `piece` that end at or before byte `at` (the first token past them holds `at`),
/// and the piece's ids.
fn tokens_before(
    tokenizer: &Tokenizer,
    piece: &str,
    at: usize,
) -> Result<(usize, Vec<u32>), EncodeError> {
    let enc = tokenizer
        .inner()
        .encode(piece, false)
        .map_err(|e| EncodeError::Tokenizer(e.to_string()))?;
    let before = enc.get_offsets().iter().take_while(|o| o.1 <= at).count();
    Ok((before, enc.get_ids().to_vec()))
}

fn hf_encode(tokenizer: &Tokenizer, text: &str, special: bool) -> Result<Vec<u32>, EncodeError> {
    tokenizer
        .inner()
        .encode_fast(text, special)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| EncodeError::Tokenizer(e.to_string()))
}

/// Completions: text with the tokenizer's special tokens (a BOS where it adds one), ids as they
/// are; the isolation point in the first text part that holds the marker.
fn encode_raw(vocab: &Vocab, parts: &[PromptPart], iso: &IsoHint) -> Result<Encoded, EncodeError> {
    let marker = match iso {
        IsoHint::Marker(text) if !text.is_empty() => Some(text.as_str()),
        _ => None,
    };
    let from_start = matches!(iso, IsoHint::MessageStart(_));
    let mut ids = Vec::new();
    let mut at_tok = None;
    for part in parts {
        match part {
            PromptPart::Tokens(t) => ids.extend_from_slice(t),
            PromptPart::Text(t) => {
                let found = marker
                    .filter(|_| at_tok.is_none())
                    .and_then(|m| memmem::find(t.as_bytes(), m.as_bytes()).map(|at| at + m.len()));
                match vocab {
                    Vocab::Builtin => {
                        let e = builtin_with_iso(t, found);
                        at_tok = at_tok.or(e.iso.map(|i| ids.len() + i));
                        ids.extend(e.ids);
                    }
                    Vocab::Hf {
                        tokenizer, fast, ..
                    } => {
                        let text = Text::new(tokenizer, fast);
                        match found {
                            Some(at) => {
                                let (before, got) = text.before_special(t, at)?;
                                at_tok = Some(ids.len() + before);
                                ids.extend(got);
                            }
                            None => ids.extend(text.encode(t, true)?),
                        }
                    }
                }
            }
        }
    }
    // A warmup-isolated completions prompt: the point is its start.
    let at_tok = at_tok.or(from_start.then_some(0));
    Ok(Encoded { ids, iso: at_tok })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::tokenize::MockTokenizer;
    use crate::mock::MockTokenizerSetting;

    fn qwen() -> Arc<Tokenizer> {
        Arc::new(Tokenizer::default_qwen3().expect("shipped tokenizer"))
    }

    fn msgs(pairs: &[(&str, &str)]) -> Vec<Message> {
        pairs.iter().map(|(r, c)| Message::new(*r, *c)).collect()
    }

    /// The piece that holds a request's marker is tokenized with offsets (the point and the ids
    /// together) and gives the ids the unmarked path gives. It is remembered with the point's
    /// place: the conversation's next turn (the same marked first turn) is a memo hit with the
    /// same point, while another conversation's marker, or the same text with the point
    /// elsewhere, is tokenized anew.
    #[test]
    fn the_marked_piece_is_remembered_with_its_point() {
        let vocab = Vocab::hf(qwen(), true).expect("template");
        let long = "tool output line with numbers 12345 and words; ".repeat(200);
        let turn = |rid: &str| format!("[rid:{rid}]\n\n{long}");
        let first = msgs(&[("system", "Be brief."), ("user", &turn("0123456789ab"))]);
        let mut second = first.clone();
        second.extend(msgs(&[("assistant", "Done."), ("user", "And now?")]));
        let mut plain = Memo::new(1 << 20);
        let a = encode(
            &vocab,
            &mut plain,
            &Prompt::Messages(first.clone()),
            &IsoHint::None,
        )
        .expect("encodes");
        let mut memo = Memo::new(1 << 20);
        let rid = IsoHint::rid("0123456789ab");
        let b = encode(&vocab, &mut memo, &Prompt::Messages(first), &rid).expect("encodes");
        assert_eq!(a.ids, b.ids);
        let point = b.iso.expect("a point");
        let misses = memo.misses;
        let c = encode(&vocab, &mut memo, &Prompt::Messages(second), &rid).expect("encodes");
        assert_eq!(c.iso, Some(point));
        assert_eq!(c.ids[..b.ids.len() - 2], b.ids[..b.ids.len() - 2]);
        // The long marked turn came back from the memo: only the new short pieces missed.
        assert!(
            memo.misses - misses <= 3,
            "{} new misses",
            memo.misses - misses
        );
        let tokens_after_two = memo.bytes();
        // Another conversation's marker: a piece of its own, tokenized anew.
        let other = msgs(&[("system", "Be brief."), ("user", &turn("ba9876543210"))]);
        let misses = memo.misses;
        let d = encode(
            &vocab,
            &mut memo,
            &Prompt::Messages(other),
            &IsoHint::rid("ba9876543210"),
        )
        .expect("encodes");
        assert_eq!(d.iso, Some(point));
        assert!(memo.misses > misses);
        assert!(
            memo.bytes() > tokens_after_two + 4 * 2000,
            "{}",
            memo.bytes()
        );
        // The same text with the point elsewhere is not the remembered entry.
        let e = encode(
            &vocab,
            &mut memo,
            &Prompt::Messages(msgs(&[
                ("system", "Be brief."),
                ("user", &turn("0123456789ab")),
            ])),
            &IsoHint::Marker("[rid:0123".into()),
        )
        .expect("encodes");
        assert_eq!(e.ids, b.ids);
        let earlier = e.iso.expect("a point");
        assert!(earlier < point, "{earlier} {point}");
    }

    /// The one-pass search finds what one search per token finds: the earliest token, and the
    /// longest of those beginning there; with one, two, three first bytes (`memchr`) and more
    /// (the table).
    #[test]
    fn cuts_are_found_earliest_then_longest() {
        fn naive<'c>(
            cuts: &'c [(String, u32)],
            text: &str,
            from: usize,
        ) -> Option<(usize, &'c str, u32)> {
            cuts.iter()
                .filter_map(|(c, id)| {
                    text[from..]
                        .find(c.as_str())
                        .map(|p| (from + p, c.as_str(), *id))
                })
                .min_by_key(|(p, c, _)| (*p, std::cmp::Reverse(c.len())))
        }
        let sets: [&[&str]; 4] = [
            &["<|im_start|>", "<|im_end|>"],
            &["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|im"],
            &["<tool_call>", "[INST]", "{{x}}"],
            &["<a>", "[b]", "{c}", "(d)", "!e!", "<a>>"],
        ];
        let texts = [
            "",
            "plain text, no token at all",
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
            "<|im<|im_start|><think>\n\n</think>\n\n<|im_end|>",
            "[INST] x [/INST] {{x}} <tool_call>{}</tool_call> {{x}",
            "<a>> <a> [b] {c} (d) !e! <<a>> [[b]] {{c}} ((d)) !!e!!",
            "é <|im_end|> 😀 <a>> ZWJ 👩‍💻 [b]",
        ];
        for set in sets {
            let cuts: Vec<(String, u32)> = set
                .iter()
                .enumerate()
                .map(|(i, t)| (t.to_string(), i as u32))
                .collect();
            let fast = Cuts::new(cuts.clone());
            for text in texts {
                let mut from = 0;
                loop {
                    let (got, want) = (fast.next(text, from), naive(&cuts, text, from));
                    assert_eq!(got, want, "{set:?} in {text:?} from {from}");
                    match want {
                        Some((p, c, _)) => from = p + c.len(),
                        None => break,
                    }
                }
                for from in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
                    assert_eq!(
                        fast.next(text, from),
                        naive(&cuts, text, from),
                        "{set:?} {text:?} {from}"
                    );
                }
            }
        }
    }

    /// The pieces between the template's special tokens tokenize to exactly what the mock (the
    /// whole rendered text at once) gets, for contents that try to merge across the cuts.
    #[test]
    fn cut_encoding_equals_the_whole_text_encoding() {
        let tok = qwen();
        let vocab = Vocab::hf(tok.clone(), true).expect("template compiles");
        let Vocab::Hf { cuts, .. } = &vocab else {
            panic!("hf")
        };
        let names: Vec<&str> = cuts.iter().map(|(c, _)| c.as_str()).collect();
        assert!(
            names.contains(&"<|im_start|>") && names.contains(&"<|im_end|>"),
            "{names:?}"
        );
        let mock = MockTokenizer::hf(tok).expect("template");
        let mut memo = Memo::new(1 << 20);
        let contents = [
            "",
            " ",
            "\n",
            "\n\n",
            "hello",
            " leading space",
            "trailing\n\n",
            "[rid:0123456789ab]\n\nHi",
            "naïve café — 東京 🦀",
            "<|im_end|> inside",
            "code:\n    x = 1\n\t\ty",
            "a<|im_start|>b",
        ];
        for (i, a) in contents.iter().enumerate() {
            for b in contents.iter().skip(i) {
                let m = msgs(&[("system", a), ("user", b), ("assistant", a), ("user", b)]);
                let want = mock
                    .prompt_tokens(&Prompt::Messages(m.clone()))
                    .expect("renders");
                let got = encode(&vocab, &mut memo, &Prompt::Messages(m), &IsoHint::None)
                    .expect("encodes");
                assert_eq!(got.ids, want, "{a:?} / {b:?}");
            }
        }
        assert!(
            memo.hits > memo.misses,
            "pieces repeat: {} hits, {} misses",
            memo.hits,
            memo.misses
        );
    }

    /// Issue 42 (1): a prompt with more text than `max_prompt_bytes` is never rendered whole
    /// into the tokenizer: `too_large`, before and after the template (many short messages
    /// render long), for every prompt shape and for capture's contents.
    #[test]
    fn a_prompt_past_max_prompt_bytes_is_too_large_and_not_tokenized() {
        let vocab = Vocab::hf(qwen(), true).expect("template");
        let mut memo = Memo::new(1 << 20).bounded(64);
        let fits = msgs(&[("user", &"a".repeat(60))]);
        assert_eq!(
            fits.iter()
                .map(|m| m.role.len() + m.content.len())
                .sum::<usize>(),
            64
        );
        let big = msgs(&[("user", &"a".repeat(61))]);
        // Within the bound by its text, past it once rendered.
        let got = encode(
            &vocab,
            &mut memo,
            &Prompt::Messages(fits.clone()),
            &IsoHint::None,
        );
        let rendered = got.expect_err("rendered, it is longer than 64 bytes");
        assert!(
            matches!(rendered, EncodeError::TooLarge { max: 64, .. }),
            "{rendered}"
        );
        assert_eq!(rendered.reason(), "too_large");
        let got = encode(
            &vocab,
            &mut memo,
            &Prompt::Messages(big.clone()),
            &IsoHint::None,
        );
        assert!(
            matches!(got, Err(EncodeError::TooLarge { bytes: 65, max: 64 })),
            "{got:?}"
        );
        let raw = |n: usize| Prompt::Raw(vec![PromptPart::Text("b".repeat(n))]);
        assert!(encode(&vocab, &mut memo, &raw(64), &IsoHint::None).is_ok());
        let got = encode(&Vocab::Builtin, &mut memo, &raw(65), &IsoHint::None);
        assert!(matches!(got, Err(EncodeError::TooLarge { .. })), "{got:?}");
        assert!(encode_contents(&vocab, &mut memo, &fits).is_ok());
        let got = encode_contents(&vocab, &mut memo, &msgs(&[("user", &"c".repeat(65))]));
        assert!(matches!(got, Err(EncodeError::TooLarge { .. })), "{got:?}");
        // Unbounded, the same prompts tokenize.
        let mut open = Memo::new(1 << 20);
        assert!(encode(&vocab, &mut open, &Prompt::Messages(big), &IsoHint::None).is_ok());
    }

    #[test]
    fn a_growing_conversation_tokenizes_only_its_new_messages() {
        let vocab = Vocab::hf(qwen(), true).expect("template");
        let mut memo = Memo::new(1 << 20);
        let mut m = msgs(&[
            ("system", "You are terse."),
            ("user", "Tell me about the sea."),
        ]);
        encode(
            &vocab,
            &mut memo,
            &Prompt::Messages(m.clone()),
            &IsoHint::None,
        )
        .expect("encodes");
        let before = memo.misses;
        m.push(Message::new("assistant", "It is wet."));
        m.push(Message::new("user", "And the sky?"));
        encode(&vocab, &mut memo, &Prompt::Messages(m), &IsoHint::None).expect("encodes");
        // Two new message pieces; the rest (system, first user, the separators) were seen.
        assert_eq!(memo.misses - before, 2);
    }

    #[test]
    fn the_isolation_point_is_the_first_token_past_the_marker() {
        let tok = qwen();
        let vocab = Vocab::hf(tok.clone(), true).expect("template");
        let mut memo = Memo::new(1 << 20);
        let marker = "[rid:0123456789ab]";
        let rid = IsoHint::rid("0123456789ab");
        let m = msgs(&[
            ("system", "Be brief."),
            ("user", &format!("{marker}\n\nWhat is BPE?")),
        ]);
        let got =
            encode(&vocab, &mut memo, &Prompt::Messages(m), &IsoHint::warmup()).expect("encodes");
        assert_eq!(got.iso, None, "no warmup marker in it");
        let m = msgs(&[
            ("system", "Be brief."),
            ("user", "[warmup]\n\nWhat is BPE?"),
        ]);
        let got =
            encode(&vocab, &mut memo, &Prompt::Messages(m), &IsoHint::warmup()).expect("encodes");
        let at = got.iso.expect("found");
        let text = tok.decode(&got.ids[at..]).expect("decodes");
        // Qwen3 spells `]\n\n` as one token: the first token that reaches past the marker.
        assert!(text.starts_with("]\n\nWhat is BPE?"), "{text:?}");
        let head = tok.decode(&got.ids[..at]).expect("decodes");
        assert!(head.ends_with("user\n[warmup"), "{head:?}");
        // A RID marker: the point is the first token past it.
        let m = msgs(&[
            ("system", "Be brief."),
            ("user", &format!("{marker}\n\nWhat is BPE?")),
        ]);
        let got = encode(&vocab, &mut memo, &Prompt::Messages(m), &rid).expect("encodes");
        let head = tok
            .decode(&got.ids[..got.iso.expect("found")])
            .expect("decodes");
        assert!(head.ends_with("user\n[rid:0123456789ab"), "{head:?}");
        // Where the warmup marker sat, found from the message's start (a profiling request
        // under warmup isolation carries none).
        let m = msgs(&[("system", "Be brief."), ("user", "What is BPE?")]);
        let got = encode(
            &vocab,
            &mut memo,
            &Prompt::Messages(m),
            &IsoHint::MessageStart(1),
        )
        .expect("encodes");
        let head = tok
            .decode(&got.ids[..got.iso.expect("found")])
            .expect("decodes");
        assert!(head.ends_with("<|im_start|>user\n"), "{head:?}");
        // A suffix marker: the point is where the marker starts, after the content.
        let m = msgs(&[("user", &format!("What is BPE?\n\n{marker}"))]);
        let got = encode(&vocab, &mut memo, &Prompt::Messages(m), &rid).expect("encodes");
        let tail = tok
            .decode(&got.ids[got.iso.expect("found")..])
            .expect("decodes");
        assert_eq!(tail, "<|im_end|>\n<|im_start|>assistant\n");
        let none = msgs(&[("user", "no marker here")]);
        let got = encode(&vocab, &mut memo, &Prompt::Messages(none), &rid).expect("encodes");
        assert_eq!(got.iso, None);
    }

    /// The byte-level encoder is chosen for Qwen3 and Llama 3.2 and gives what `tokenizers`
    /// gives through the whole model path: chat prompts cut at the template's tokens, the
    /// isolation point of every hint, contents alone (capture) and completions with a BOS.
    #[test]
    fn the_byte_level_encoder_counts_as_tokenizers_does() {
        let llama = Tokenizer::from_path(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/synth/tokenizers/llama-3.2"),
        )
        .expect("llama fixture");
        let marker = "[rid:0123456789ab]";
        let contents = [
            format!("{marker}\n\nWhat is BPE?"),
            format!("Long context.  \r\n\tcode();\n\n{marker}"),
            format!("naïve café — 東京 🦀 {marker} <think>x</think>"),
            "[warmup]\n\nhello   there".to_string(),
            "cafe\u{301} combining, <|im_end|> inside".to_string(),
        ];
        let hints = [
            IsoHint::None,
            IsoHint::rid("0123456789ab"),
            IsoHint::warmup(),
            IsoHint::MessageStart(1),
        ];
        for tok in [qwen(), Arc::new(llama)] {
            // Built first, so the model finds it at load.
            ByteLevelBpe::shared(&tok).expect("a byte-level tokenizer");
            let fast = Vocab::hf(tok.clone(), true).expect("template");
            assert!(fast.is_fast());
            let Vocab::Hf {
                tokenizer,
                template,
                cuts,
                ..
            } = Vocab::hf(tok, true).expect("template")
            else {
                panic!("hf")
            };
            let slow = Vocab::Hf {
                tokenizer,
                template,
                cuts,
                fast: FastSlot::default(),
            };
            let (mut m1, mut m2) = (Memo::new(1 << 20), Memo::new(1 << 20));
            for c in &contents {
                let m = msgs(&[("system", "Be brief."), ("user", c), ("assistant", c)]);
                for hint in &hints {
                    let p = Prompt::Messages(m.clone());
                    let want = encode(&slow, &mut m2, &p, hint).expect("encodes");
                    assert_eq!(encode(&fast, &mut m1, &p, hint), Ok(want), "{c:?} {hint:?}");
                    let raw = Prompt::Raw(vec![
                        PromptPart::Text(c.clone()),
                        PromptPart::Tokens(vec![1, 2]),
                        PromptPart::Text(c.clone()),
                    ]);
                    let want = encode(&slow, &mut m2, &raw, hint).expect("encodes");
                    assert_eq!(
                        encode(&fast, &mut m1, &raw, hint),
                        Ok(want),
                        "{c:?} {hint:?}"
                    );
                }
                let want = encode_contents(&slow, &mut m2, &m).expect("encodes");
                assert_eq!(encode_contents(&fast, &mut m1, &m), Ok(want));
            }
        }
    }

    #[test]
    fn builtin_and_raw_prompts_match_the_mock() {
        let mut memo = Memo::new(1024);
        let mock = MockTokenizer::load(&MockTokenizerSetting::Builtin).expect("builtin");
        let m = msgs(&[("user", "[warmup]\n\nhello there")]);
        let want = mock
            .prompt_tokens(&Prompt::Messages(m.clone()))
            .expect("counts");
        let got = encode(
            &Vocab::Builtin,
            &mut memo,
            &Prompt::Messages(m),
            &IsoHint::warmup(),
        )
        .expect("encodes");
        assert_eq!(got.ids, want);
        assert_eq!(got.iso, Some(builtin_pieces("user\n[warmup]").len()));
        let vocab = Vocab::hf(qwen(), true).expect("template");
        let qmock = MockTokenizer::load(&MockTokenizerSetting::Qwen3).expect("qwen3");
        let raw = Prompt::Raw(vec![
            PromptPart::Text("Once upon [rid:0123456789ab] a time".into()),
            PromptPart::Tokens(vec![1, 2, 3]),
        ]);
        let got = encode(&vocab, &mut memo, &raw, &IsoHint::rid("0123456789ab")).expect("encodes");
        assert_eq!(got.ids, qmock.prompt_tokens(&raw).expect("counts"));
        let at = got.iso.expect("found");
        let head = qwen().decode(&got.ids[..at]).expect("decodes");
        // Here `]` stands alone: the point is the token after it.
        assert!(head.ends_with("Once upon [rid:0123456789ab]"), "{head:?}");
    }
}
