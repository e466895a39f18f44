//! A byte-level BPE encoder for the `tokenizer.json` pipelines of Qwen2/Qwen3, Llama 3 and other
//! GPT-style tokenizers: the ids `tokenizers` gives (`encode(text, add_special_tokens)`), built
//! from the file's own vocabulary, merges, added tokens, normalizer and split regex, at about ten
//! times its speed (no offsets, alignments or per-piece strings). Owns that encoder and the
//! decision, at load, whether a tokenizer is one it reproduces (the pipeline
//! [`split_pattern`](super::split_pattern) accepts, then a built-in sample encoded both ways);
//! never chooses a fallback itself: a caller keeps `tokenizers` when [`ByteLevelBpe::new`]
//! declines.
//!
//! The steps are `tokenizers`' own, in its order: added tokens split out of the raw text
//! (leftmost-longest), NFC where the file asks for it, added tokens declared `normalized` split
//! out of the normalized text, the split regex (isolated pieces), then BPE on each piece's bytes:
//! the adjacent pair of lowest merge rank merged first, the leftmost of equal ones.

use std::borrow::Cow;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use aho_corasick::{AhoCorasick, MatchKind};
use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};
use serde::Deserialize;
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use super::{byte_level_alphabet, split_pattern, Tokenizer};

/// Why a tokenizer is left to `tokenizers`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

/// The tail every accepted split regex ends with. `regex-automata` has no look-around, so it
/// runs `\s+` there and [`ByteLevelBpe::pieces`] gives back the last character where the
/// original's `\s+(?!\S)` would have stopped one short.
const LOOKAHEAD_TAIL: &str = r"|\s+(?!\S)|\s+";

/// Pieces up to this many bytes merge in place on the stack; longer ones through a heap.
const SHORT_PIECE: usize = 64;

/// Pieces up to this many bytes are remembered with their ids (words repeat: most of a text's
/// pieces are then one lookup, not a merge loop).
const CACHED_PIECE: usize = 24;
/// Pieces remembered before the cache is emptied (a few MB at most).
const CACHE_ENTRIES: usize = 1 << 16;

/// Text the encoder must reproduce `tokenizers` on before it is used (with every added token
/// of the tokenizer appended): prose, code, digits, contractions, whitespace runs, CRLF,
/// composed and decomposed accents, CJK, emoji with joiners and a replacement character.
const SAMPLE: &str = "Hello, world! It's the user's turn; THEY'LL see 12345 apples (3.14159) \
    at 09:35.\r\n\r\n  fn main() {\n\tlet x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n\n\n   \
    \u{a0}trailing   \nnaïve café / nai\u{308}ve cafe\u{301} — 東京タワー、こんにちは 한국어 \
    Ελληνικά русский عربى 👩\u{200d}💻 🏳\u{fe0f}\u{200d}🌈 \u{fffd}\u{fffd} 'S 'Ll 'ſ   \t \u{3000}x \
    1\u{2028}2\u{85}3 ";

/// Short pieces' bytes → their ids.
type PieceCache = HashMap<Box<[u8]>, Box<[u32]>, BuildHasherDefault<PairHasher>>;

/// Encoders a thread keeps piece caches for; past it, the oldest cache goes.
const CACHES_PER_THREAD: usize = 4;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Each thread's short-piece caches, by encoder (a piece's ids are a pure function of its
    /// bytes, so a hit is always exact). Per thread, not one behind a lock: the model's
    /// prepare threads encode at once, and an uncontended lock per piece was a sixth of a
    /// piece's cost already.
    static PIECES: RefCell<Vec<(u64, PieceCache)>> = const { RefCell::new(Vec::new()) };
}

/// A byte-level BPE tokenizer, ready to encode.
pub struct ByteLevelBpe {
    /// Added tokens matched in the raw text (`normalized: false`), leftmost-longest as
    /// `tokenizers` matches them, and their ids.
    raw_added: Option<(AhoCorasick, Vec<u32>)>,
    /// Added tokens matched in the normalized text, by their normalized content.
    normalized_added: Option<(AhoCorasick, Vec<u32>)>,
    nfc: bool,
    split: Regex,
    /// The split pattern's digit run: 1 (`\p{N}`, Qwen) or 3 (`\p{N}{1,3}`, Llama 3).
    digits: usize,
    byte_ids: [u32; 256],
    /// `(left << 32 | right)` → `(rank << 32 | merged id)`.
    merges: HashMap<u64, u64, BuildHasherDefault<PairHasher>>,
    /// `ignore_merges`: a piece that is a token is that token.
    whole: Option<HashMap<Box<[u8]>, u32>>,
    /// Bytes per id (where the text's tokens end, for an isolation point).
    lens: Vec<u32>,
    /// What `add_special_tokens` adds around a single sequence (Llama 3's BOS).
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    /// This encoder's key among a thread's piece caches ([`PIECES`]).
    id: u64,
}

impl std::fmt::Debug for ByteLevelBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteLevelBpe")
            .field("nfc", &self.nfc)
            .field("merges", &self.merges.len())
            .field("prefix", &self.prefix)
            .field("suffix", &self.suffix)
            .finish()
    }
}

/// The model as `tokenizers` serializes it (merges in rank order).
#[derive(Deserialize)]
struct ModelJson {
    vocab: HashMap<String, u32>,
    merges: Vec<(String, String)>,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
}

fn unsupported(why: impl Into<String>) -> Unsupported {
    Unsupported(why.into())
}

/// The encoders built in this process, by tokenizer file (its sha256), or why none was.
type Built = HashMap<String, Result<Arc<ByteLevelBpe>, Unsupported>>;

/// Built once per tokenizer file and shared: every model (and every test harness) that loads the
/// same file gets the same encoder, so the build (a fraction of a second optimized, seconds in
/// an unoptimized test build) is paid once per process.
fn built() -> &'static Mutex<Built> {
    static BUILT: OnceLock<Mutex<Built>> = OnceLock::new();
    BUILT.get_or_init(Mutex::default)
}

impl ByteLevelBpe {
    /// The process's encoder for `tok`'s file, built now if it was not yet (one build at a time).
    pub fn shared(tok: &Tokenizer) -> Result<Arc<Self>, Unsupported> {
        let mut map = crate::sync::lock(built());
        if let Some(r) = map.get(tok.fingerprint()) {
            return r.clone();
        }
        let r = Self::new(tok).map(Arc::new);
        map.insert(tok.fingerprint().to_owned(), r.clone());
        r
    }

    /// The process's encoder for `tok`'s file if it was built already (`None`: not yet).
    pub fn already_built(tok: &Tokenizer) -> Option<Result<Arc<Self>, Unsupported>> {
        crate::sync::lock(built()).get(tok.fingerprint()).cloned()
    }

    /// The encoder for `tok`, or why it does not reproduce `tok` (then use `tokenizers`).
    pub fn new(tok: &Tokenizer) -> Result<Self, Unsupported> {
        let inner = tok.inner();
        let pattern = split_pattern(inner)
            .ok_or_else(|| unsupported("not a byte-level BPE pipeline with a known split regex"))?;
        if inner.get_truncation().is_some() || inner.get_padding().is_some() {
            return Err(unsupported("the tokenizer truncates or pads"));
        }
        let head = pattern
            .strip_suffix(LOOKAHEAD_TAIL)
            .ok_or_else(|| unsupported("the split regex does not end in \\s+(?!\\S)|\\s+"))?;
        let split = Regex::new(&format!(r"{head}|\s+"))
            .map_err(|e| unsupported(format!("the split regex: {e}")))?;
        let normalizer = serde_json::to_value(inner.get_normalizer()).unwrap_or_default();
        let nfc = normalizer["type"] == "NFC";
        let mut bpe = Self::from_model(inner, split, nfc)?;
        bpe.digits = if head.contains(r"\p{N}{1,3}") { 3 } else { 1 };
        bpe.added_tokens(inner)?;
        bpe.special_frame(inner)?;
        bpe.check(inner)?;
        Ok(bpe)
    }

    fn from_model(
        inner: &tokenizers::Tokenizer,
        split: Regex,
        nfc: bool,
    ) -> Result<Self, Unsupported> {
        let tokenizers::ModelWrapper::BPE(model) = inner.get_model() else {
            return Err(unsupported("not a BPE model"));
        };
        let json = serde_json::to_vec(model).map_err(|e| unsupported(e.to_string()))?;
        let m: ModelJson = serde_json::from_slice(&json).map_err(|e| unsupported(e.to_string()))?;
        let empty = |s: &Option<String>| s.as_deref().is_none_or(str::is_empty);
        if m.byte_fallback || !empty(&m.continuing_subword_prefix) || !empty(&m.end_of_word_suffix)
        {
            return Err(unsupported(
                "byte fallback or a subword prefix or suffix in the model",
            ));
        }
        let alphabet = byte_level_alphabet();
        let mut byte_ids = [0u32; 256];
        for (b, c) in alphabet.iter().enumerate() {
            byte_ids[b] = *m
                .vocab
                .get(c.encode_utf8(&mut [0; 4]) as &str)
                .ok_or_else(|| unsupported(format!("byte {b:#04x} has no token")))?;
        }
        let mut merges = HashMap::with_capacity_and_hasher(m.merges.len(), Default::default());
        for (rank, (a, b)) in m.merges.iter().enumerate() {
            let id = |t: &str| {
                m.vocab.get(t).copied().ok_or_else(|| {
                    unsupported(format!("merge token {t:?} is not in the vocabulary"))
                })
            };
            let merged = id(&format!("{a}{b}"))?;
            merges.insert(
                pair_key(id(a)?, id(b)?),
                (rank as u64) << 32 | u64::from(merged),
            );
        }
        let inverse = inverse_alphabet(&alphabet);
        let max_id = m.vocab.values().copied().max().unwrap_or(0) as usize;
        let mut lens = vec![0u32; max_id + 1];
        let mut whole = m.ignore_merges.then(HashMap::new);
        for (token, &id) in &m.vocab {
            let bytes = token_bytes(token, &inverse);
            lens[id as usize] = bytes.len() as u32;
            if let Some(w) = whole.as_mut() {
                w.insert(bytes.into_boxed_slice(), id);
            }
        }
        Ok(ByteLevelBpe {
            raw_added: None,
            normalized_added: None,
            nfc,
            split,
            digits: 1,
            byte_ids,
            merges,
            whole,
            lens,
            prefix: Vec::new(),
            suffix: Vec::new(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The added tokens' matchers, as `tokenizers` builds its two tries.
    fn added_tokens(&mut self, inner: &tokenizers::Tokenizer) -> Result<(), Unsupported> {
        let mut raw: Vec<(String, u32)> = Vec::new();
        let mut normalized: Vec<(String, u32)> = Vec::new();
        let mut added: Vec<(u32, tokenizers::AddedToken)> =
            inner.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        for (id, t) in added {
            let len = self.lens.len().max(id as usize + 1);
            self.lens.resize(len, 0);
            self.lens[id as usize] = t.content.len() as u32;
            if t.normalized {
                normalized.push((self.normalize(&t.content).into_owned(), id));
            } else {
                raw.push((t.content, id));
            }
        }
        let build = |tokens: Vec<(String, u32)>| -> Result<_, Unsupported> {
            if tokens.is_empty() {
                return Ok(None);
            }
            let ac = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(tokens.iter().map(|(c, _)| c.as_str()))
                .map_err(|e| unsupported(format!("added tokens: {e}")))?;
            Ok(Some((ac, tokens.into_iter().map(|(_, id)| id).collect())))
        };
        self.raw_added = build(raw)?;
        self.normalized_added = build(normalized)?;
        Ok(())
    }

    /// What `add_special_tokens` puts around a text: read off `tokenizers`' encoding of a probe.
    fn special_frame(&mut self, inner: &tokenizers::Tokenizer) -> Result<(), Unsupported> {
        let probe = "probe";
        let hf = |special| {
            inner
                .encode_fast(probe, special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| unsupported(e.to_string()))
        };
        let (bare, framed) = (hf(false)?, hf(true)?);
        let at = (0..=framed.len().saturating_sub(bare.len()))
            .find(|&i| framed[i..].starts_with(&bare))
            .ok_or_else(|| unsupported("the post-processor changes the text's own ids"))?;
        self.prefix = framed[..at].to_vec();
        self.suffix = framed[at + bare.len()..].to_vec();
        Ok(())
    }

    /// The built-in sample, with every added token in it, encodes as `tokenizers` encodes it.
    fn check(&self, inner: &tokenizers::Tokenizer) -> Result<(), Unsupported> {
        let mut sample = SAMPLE.to_string();
        for t in inner.get_added_tokens_decoder().values() {
            sample.push_str(&t.content);
            sample.push_str(" x");
        }
        for special in [false, true] {
            let want = inner
                .encode_fast(sample.as_str(), special)
                .map_err(|e| unsupported(e.to_string()))?;
            let got = if special {
                self.encode_special(&sample)
            } else {
                self.encode(&sample)
            };
            if got != want.get_ids() {
                return Err(unsupported(
                    "its ids differ from tokenizers' on the built-in sample",
                ));
            }
        }
        Ok(())
    }

    /// `encode(text, add_special_tokens=false)`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 4 + 8);
        self.encode_into(text, &mut out, None);
        out
    }

    /// `encode(text, add_special_tokens=true)`.
    pub fn encode_special(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 4 + 8 + self.prefix.len());
        out.extend_from_slice(&self.prefix);
        self.encode_into(text, &mut out, None);
        out.extend_from_slice(&self.suffix);
        out
    }

    /// [`ByteLevelBpe::encode`], and how many of the ids end at or before byte `at` of `text`
    /// (as `tokenizers`' offsets count them); `None` when normalization changed the text, so
    /// that its offsets are not the text's bytes (rare: the caller asks `tokenizers`).
    pub fn encode_point(&self, text: &str, at: usize) -> Option<(usize, Vec<u32>)> {
        let mut out = Vec::with_capacity(text.len() / 4 + 8);
        let mut ends = Vec::with_capacity(out.capacity());
        if !self.encode_into(text, &mut out, Some(&mut ends)) {
            return None;
        }
        Some((ends.iter().take_while(|&&e| e <= at).count(), out))
    }

    /// [`ByteLevelBpe::encode_point`] with `add_special_tokens=true`: the frame's leading ids
    /// count as before the point, and so do its trailing ones when every text id does.
    pub fn encode_special_point(&self, text: &str, at: usize) -> Option<(usize, Vec<u32>)> {
        let (before, ids) = self.encode_point(text, at)?;
        let all = before == ids.len();
        let mut out = Vec::with_capacity(ids.len() + self.prefix.len() + self.suffix.len());
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(&ids);
        out.extend_from_slice(&self.suffix);
        let tail = if all { self.suffix.len() } else { 0 };
        Some((self.prefix.len() + before + tail, out))
    }

    /// Appends `text`'s ids (and each id's end in `text`, when asked); false when normalization
    /// changed the text (the ends are then not `text`'s).
    fn encode_into(
        &self,
        text: &str,
        out: &mut Vec<u32>,
        mut ends: Option<&mut Vec<usize>>,
    ) -> bool {
        let mut exact = true;
        let mut last = 0;
        if let Some((ac, ids)) = &self.raw_added {
            for m in ac.find_iter(text) {
                if m.start() > last {
                    exact &=
                        self.normalized(&text[last..m.start()], last, out, ends.as_deref_mut());
                }
                out.push(ids[m.pattern().as_usize()]);
                if let Some(e) = ends.as_deref_mut() {
                    e.push(m.end());
                }
                last = m.end();
            }
        }
        if last < text.len() {
            exact &= self.normalized(&text[last..], last, out, ends);
        }
        exact
    }

    fn normalize<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if !self.nfc || is_nfc_quick(text.chars()) == IsNormalized::Yes {
            return Cow::Borrowed(text);
        }
        let nfc: String = text.nfc().map(|(c, _)| c).collect();
        if nfc == text {
            Cow::Borrowed(text)
        } else {
            Cow::Owned(nfc)
        }
    }

    /// A stretch between raw added tokens, at byte `base` of the text: normalized, then split at
    /// the normalized added tokens. False when normalization changed it.
    fn normalized(
        &self,
        text: &str,
        base: usize,
        out: &mut Vec<u32>,
        mut ends: Option<&mut Vec<usize>>,
    ) -> bool {
        let norm = self.normalize(text);
        let mut last = 0;
        if let Some((ac, ids)) = &self.normalized_added {
            for m in ac.find_iter(norm.as_ref()) {
                if m.start() > last {
                    self.pieces(
                        &norm[last..m.start()],
                        base + last,
                        out,
                        ends.as_deref_mut(),
                    );
                }
                out.push(ids[m.pattern().as_usize()]);
                if let Some(e) = ends.as_deref_mut() {
                    e.push(base + m.end());
                }
                last = m.end();
            }
        }
        if last < norm.len() {
            self.pieces(&norm[last..], base + last, out, ends);
        }
        matches!(norm, Cow::Borrowed(_))
    }

    /// Splits `text` (at byte `base`) with the split regex and encodes each piece.
    fn pieces(&self, text: &str, base: usize, out: &mut Vec<u32>, ends: Option<&mut Vec<usize>>) {
        PIECES.with_borrow_mut(|caches| {
            let at = match caches.iter().position(|(id, _)| *id == self.id) {
                Some(at) => at,
                None => {
                    if caches.len() >= CACHES_PER_THREAD {
                        caches.remove(0);
                    }
                    caches.push((self.id, PieceCache::default()));
                    caches.len() - 1
                }
            };
            self.pieces_with(&mut caches[at].1, text, base, out, ends);
        });
    }

    fn pieces_with(
        &self,
        cache: &mut PieceCache,
        text: &str,
        base: usize,
        out: &mut Vec<u32>,
        mut ends: Option<&mut Vec<usize>>,
    ) {
        let mut pos = 0;
        while pos < text.len() {
            let end = match ascii_piece(text.as_bytes(), pos, self.digits) {
                Some(end) => end,
                None => self.regex_piece(text, pos),
            };
            let first = out.len();
            self.bpe(cache, &text.as_bytes()[pos..end], out);
            if let Some(e) = ends.as_deref_mut() {
                let mut at = base + pos;
                for &id in &out[first..] {
                    at += self.lens.get(id as usize).copied().unwrap_or(0) as usize;
                    e.push(at);
                }
            }
            pos = end;
        }
    }

    /// The end of the piece the split regex matches at `pos` (`pos < text.len()`).
    fn regex_piece(&self, text: &str, pos: usize) -> usize {
        let input = Input::new(text).range(pos..).anchored(Anchored::Yes);
        match self.split.search_half(&input) {
            Some(m) if m.offset() > pos => self.lookahead(text, pos, m.offset()),
            // Every character matches one of the alternatives, so this is not reached with the
            // accepted regexes; `tokenizers` keeps an unmatched stretch as a piece.
            _ => self
                .split
                .search(&Input::new(text).range(pos..))
                .map_or(text.len(), |m| m.start())
                .max(pos + text[pos..].chars().next().map_or(1, char::len_utf8)),
        }
    }

    /// `\s+(?!\S)`: a run of whitespace (no line break in it, or the line-break alternative
    /// would have matched first) followed by a non-space stops one character short, unless it
    /// is one character long (then the final `\s+` takes it whole).
    fn lookahead(&self, text: &str, start: usize, end: usize) -> usize {
        let piece = &text[start..end];
        let mut rev = piece.chars().rev();
        match (rev.next(), rev.next()) {
            (Some(c), Some(_))
                if end < text.len() && c.is_whitespace() && c != '\r' && c != '\n' =>
            {
                end - c.len_utf8()
            }
            _ => end,
        }
    }

    fn pair(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.merges
            .get(&pair_key(left, right))
            .map(|&v| ((v >> 32) as u32, v as u32))
    }

    /// One piece's ids, from the cache when it is short.
    fn bpe(&self, cache: &mut PieceCache, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() < 2 || piece.len() > CACHED_PIECE {
            return self.bpe_uncached(piece, out);
        }
        if let Some(ids) = cache.get(piece) {
            out.extend_from_slice(ids);
            return;
        }
        let first = out.len();
        self.bpe_uncached(piece, out);
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(piece.into(), out[first..].into());
    }

    fn bpe_uncached(&self, piece: &[u8], out: &mut Vec<u32>) {
        match piece {
            [] => {}
            [b] => out.push(self.byte_ids[*b as usize]),
            _ => {
                if let Some(id) = self.whole.as_ref().and_then(|w| w.get(piece)) {
                    out.push(*id);
                } else if piece.len() <= SHORT_PIECE {
                    self.merge_short(piece, out);
                } else {
                    self.merge_long(piece, out);
                }
            }
        }
    }

    /// Merges in place: the lowest rank, the leftmost of equal ones, until no pair merges.
    fn merge_short(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        let mut ids = [0u32; SHORT_PIECE];
        // `ranks[i]`/`merged[i]`: the pair (ids[i], ids[i + 1]).
        let mut ranks = [u32::MAX; SHORT_PIECE];
        let mut merged = [0u32; SHORT_PIECE];
        for (slot, &b) in ids.iter_mut().zip(piece) {
            *slot = self.byte_ids[b as usize];
        }
        let rate = |ids: &[u32], i: usize| self.pair(ids[i], ids[i + 1]).unwrap_or((u32::MAX, 0));
        for i in 0..n - 1 {
            (ranks[i], merged[i]) = rate(&ids, i);
        }
        let mut len = n;
        loop {
            let mut best = u32::MAX;
            let mut at = 0;
            for (i, &r) in ranks[..len - 1].iter().enumerate() {
                if r < best {
                    best = r;
                    at = i;
                }
            }
            if best == u32::MAX {
                break;
            }
            ids[at] = merged[at];
            ids.copy_within(at + 2..len, at + 1);
            ranks.copy_within(at + 1..len - 1, at);
            merged.copy_within(at + 1..len - 1, at);
            len -= 1;
            if at + 1 < len {
                (ranks[at], merged[at]) = rate(&ids, at);
            } else {
                ranks[at] = u32::MAX;
            }
            if at > 0 {
                (ranks[at - 1], merged[at - 1]) = rate(&ids, at - 1);
            }
            if len == 1 {
                break;
            }
        }
        out.extend_from_slice(&ids[..len]);
    }

    /// The same merges for a long piece: a heap of (rank, position) over a linked list, so a
    /// piece of n bytes costs O(n log n), not O(n²).
    fn merge_long(&self, piece: &[u8], out: &mut Vec<u32>) {
        const NONE: usize = usize::MAX;
        let n = piece.len();
        let mut ids: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut next: Vec<usize> = (1..=n).map(|i| if i == n { NONE } else { i }).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.checked_sub(1).unwrap_or(NONE)).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            if let Some((r, m)) = self.pair(ids[i], ids[i + 1]) {
                heap.push(Reverse((r, i, m)));
            }
        }
        while let Some(Reverse((rank, i, m))) = heap.pop() {
            let j = next[i];
            if !alive[i] || j == NONE || self.pair(ids[i], ids[j]) != Some((rank, m)) {
                continue;
            }
            ids[i] = m;
            alive[j] = false;
            next[i] = next[j];
            if next[j] != NONE {
                prev[next[j]] = i;
            }
            if prev[i] != NONE {
                let p = prev[i];
                if let Some((r, m)) = self.pair(ids[p], ids[i]) {
                    heap.push(Reverse((r, p, m)));
                }
            }
            if next[i] != NONE {
                if let Some((r, m)) = self.pair(ids[i], ids[next[i]]) {
                    heap.push(Reverse((r, i, m)));
                }
            }
        }
        let mut k = 0;
        while k != NONE {
            out.push(ids[k]);
            k = next[k];
        }
    }
}

fn pair_key(left: u32, right: u32) -> u64 {
    u64::from(left) << 32 | u64::from(right)
}

/// The byte-level alphabet inverted: char → byte (every alphabet char is below U+0200).
fn inverse_alphabet(alphabet: &[char; 256]) -> [Option<u8>; 0x200] {
    let mut inverse = [None; 0x200];
    for (b, c) in alphabet.iter().enumerate() {
        inverse[*c as usize] = Some(b as u8);
    }
    inverse
}

/// A vocabulary token's bytes: its alphabet chars mapped back, or (a token outside the
/// alphabet, which no merge of bytes can make) its own UTF-8.
fn token_bytes(token: &str, inverse: &[Option<u8>; 0x200]) -> Vec<u8> {
    let mapped: Option<Vec<u8>> = token
        .chars()
        .map(|c| inverse.get(c as usize).copied().flatten())
        .collect();
    mapped.unwrap_or_else(|| token.as_bytes().to_vec())
}

/// A hasher for the packed id pairs: one folded multiply mixes both halves into every bit.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Eight bytes a step (a piece's length is hashed apart, so zero padding is harmless).
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let p = u128::from(self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
        self.0 = (p >> 64) as u64 ^ p as u64;
    }
}

/// What the split patterns tell apart in an ASCII byte: `\p{L}`, `\p{N}`, `\s` without and
/// with the line breaks, and the rest; a byte of a longer character is `Wide`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Digit,
    Space,
    Break,
    Other,
    Wide,
}

fn class(b: u8) -> Class {
    match b {
        b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
        b'0'..=b'9' => Class::Digit,
        b'\r' | b'\n' => Class::Break,
        // Unicode's White_Space in ASCII (`\s`): not 0x1C..=0x1F.
        b'\t' | 0x0B | 0x0C | b' ' => Class::Space,
        0x80.. => Class::Wide,
        _ => Class::Other,
    }
}

/// The end of the piece both known split patterns match at `pos` (`pos < text.len()`), where
/// the match depends on ASCII bytes alone; `None` where it depends on a wider character (a
/// letter, number, space or case fold outside ASCII), for the regex to decide. The regex's
/// search cost 500 instructions a piece, most of the encoder's time; this costs tens.
///
/// The alternatives, in the patterns' order (the first that matches wins):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)`, `[^\r\n\p{L}\p{N}]?\p{L}+`, `\p{N}` (Llama 3: `{1,3}`),
/// ` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`.
fn ascii_piece(text: &[u8], pos: usize, digits: usize) -> Option<usize> {
    let class_at = |i: usize| text.get(i).map(|&b| class(b));
    let run = |from: usize, keep: &dyn Fn(Class) -> bool| {
        from + text[from..].iter().take_while(|&&b| keep(class(b))).count()
    };
    // A run that stops at a wide character might have gone on through it.
    let settled = |end: usize| (class_at(end) != Some(Class::Wide)).then_some(end);
    let c = class(text[pos]);
    if text[pos] == b'\'' {
        let next = text.get(pos + 1).map(u8::to_ascii_lowercase);
        let after = text.get(pos + 2).map(u8::to_ascii_lowercase);
        match (next, after) {
            // `ſ` folds to `s`.
            (Some(n), _) if n >= 0x80 => return None,
            (Some(b's' | b't' | b'm' | b'd'), _) => return Some(pos + 2),
            (Some(b'r' | b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => return Some(pos + 3),
            _ => {}
        }
    }
    match c {
        Class::Wide => return None,
        Class::Letter => return settled(run(pos, &|k| k == Class::Letter)),
        Class::Space | Class::Other => match class_at(pos + 1) {
            Some(Class::Letter) => return settled(run(pos + 1, &|k| k == Class::Letter)),
            Some(Class::Wide) => return None,
            _ => {}
        },
        Class::Digit => {
            let end = pos
                + 1
                + text[pos + 1..]
                    .iter()
                    .take(digits - 1)
                    .take_while(|&&b| class(b) == Class::Digit)
                    .count();
            return if end - pos < digits {
                settled(end)
            } else {
                Some(end)
            };
        }
        Class::Break => {}
    }
    let punct = match c {
        Class::Other => Some(pos),
        _ if text[pos] == b' ' && class_at(pos + 1) == Some(Class::Other) => Some(pos + 1),
        _ => None,
    };
    if let Some(from) = punct {
        let end = settled(run(from, &|k| k == Class::Other))?;
        return Some(run(end, &|k| k == Class::Break));
    }
    // A run of spaces and breaks: up to its last break, else all of it but the last space
    // before a non-space (a single one stays whole).
    let end = settled(run(pos, &|k| matches!(k, Class::Space | Class::Break)))?;
    if let Some(last) = (pos..end).rev().find(|&i| class(text[i]) == Class::Break) {
        return Some(last + 1);
    }
    Some(if end == text.len() || end - pos == 1 {
        end
    } else {
        end - 1
    })
}

#[cfg(test)]
mod tests;
