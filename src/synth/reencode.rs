//! Exact `encode(decode(tokens))` without re-encoding everything: a token sequence made of
//! canonical runs (corpus chunk encodings, earlier re-encodes) only changes around the places
//! where runs meet or were cut. Owns that proof-carrying shortcut and its eligibility test;
//! must never return anything but what the full decode → encode returns.
//!
//! Why it is exact: with a GPT-style byte-level BPE whose split regex is Llama-3's or Qwen2's,
//! a position in text where an ASCII letter is followed by a space is always a pre-token
//! boundary, matching there is independent of the rest of the text (no look-behind; the only
//! look-ahead sees a space or the end alike), NFC cannot compose across it and no added token
//! spans it. So `encode(T)` is the concatenation of the encodings of the pieces between such
//! "safe" positions, and a piece lying inside one canonical run, cut at safe positions of that
//! run, re-encodes to itself. Only pieces touching a join or a cut edge are re-encoded.
//! Tokenizers that do not match those facts exactly get the full path.

use crate::synth::error::SynthError;
use crate::synth::tokenizer::Tokenizer;

/// Split regexes for which the safe-position argument holds (Qwen2/Qwen3 and Llama-3).
const KNOWN_SPLIT_PATTERNS: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Per-id flag: the token's bytes start with a space (computed by the tokenizer's byte table;
/// added tokens get no flags, so they never border a safe position).
pub const STARTS_WITH_SPACE: u8 = 1;
/// Per-id flag: the token's bytes end with an ASCII letter.
pub const ENDS_WITH_LETTER: u8 = 2;

/// Whether the tokenizer's pipeline is one the shortcut is proven for.
pub fn eligible(tok: &tokenizers::Tokenizer) -> bool {
    split_pattern(tok).is_some()
}

/// The known split regex of an [`eligible`] tokenizer (Qwen2's, or Llama-3's with `\p{N}{1,3}`).
pub fn split_pattern(tok: &tokenizers::Tokenizer) -> Option<&'static str> {
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.unwrap_or_default();
    let normalizer = json(serde_json::to_value(tok.get_normalizer()));
    let normalizer_ok = normalizer.is_null() || normalizer["type"] == "NFC";
    let pre = json(serde_json::to_value(tok.get_pre_tokenizer()));
    let pattern = KNOWN_SPLIT_PATTERNS
        .into_iter()
        .find(|&p| pre["pretokenizers"][0]["pattern"]["Regex"].as_str() == Some(p));
    let pre_ok = pre["type"] == "Sequence"
        && pre["pretokenizers"].as_array().is_some_and(|steps| {
            steps.len() == 2
                && steps[0]["type"] == "Split"
                && steps[0]["behavior"] == "Isolated"
                && steps[0]["invert"] == false
                && steps[0]["pattern"]["Regex"]
                    .as_str()
                    .is_some_and(|p| KNOWN_SPLIT_PATTERNS.contains(&p))
                && steps[1]["type"] == "ByteLevel"
                && steps[1]["add_prefix_space"] == false
                && steps[1]["use_regex"] == false
        });
    let decoder = json(serde_json::to_value(tok.get_decoder()));
    let decoder_ok = decoder["type"] == "ByteLevel";
    let model_ok =
        matches!(tok.get_model(), tokenizers::ModelWrapper::BPE(bpe) if bpe.dropout.is_none());
    let added_ok = tok.get_added_tokens_decoder().values().all(|t| {
        let b = t.content.as_bytes();
        !t.lstrip
            && !t.rstrip
            && !t.single_word
            && !b
                .windows(2)
                .any(|w| w[0].is_ascii_alphabetic() && w[1] == b' ')
    });
    (normalizer_ok && pre_ok && decoder_ok && model_ok && added_ok)
        .then_some(pattern)
        .flatten()
}

/// A token sequence with what is known about its structure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pieces {
    pub tokens: Vec<u32>,
    /// Indices `0 < i < len` where two canonical runs meet.
    pub joins: Vec<usize>,
    /// The sequence starts at the true start of a canonical run's text.
    pub start_clean: bool,
    /// The sequence ends at the true end of a canonical run's text.
    pub end_clean: bool,
    /// Token ranges `[a, b)` that are not canonical at all (e.g. random-corpus ids).
    pub dirty: Vec<(usize, usize)>,
}

impl Pieces {
    /// The re-encoding of a whole text: canonical end to end.
    pub fn canonical(tokens: Vec<u32>) -> Self {
        Pieces {
            tokens,
            joins: Vec::new(),
            start_clean: true,
            end_clean: true,
            dirty: Vec::new(),
        }
    }

    /// Tokens with no known structure.
    pub fn opaque(tokens: Vec<u32>) -> Self {
        let n = tokens.len();
        Pieces {
            tokens,
            dirty: vec![(0, n)],
            ..Self::default()
        }
    }

    /// Appends `other`, recording the join.
    pub fn append(&mut self, other: Pieces) {
        if other.tokens.is_empty() {
            return;
        }
        if self.tokens.is_empty() {
            *self = other;
            return;
        }
        let at = self.tokens.len();
        self.joins.push(at);
        self.joins.extend(other.joins.iter().map(|j| j + at));
        self.dirty
            .extend(other.dirty.iter().map(|&(a, b)| (a + at, b + at)));
        self.tokens.extend_from_slice(&other.tokens);
        self.end_clean = other.end_clean;
    }

    /// Keeps the first `n` tokens; the new end is a cut.
    pub fn truncate(&mut self, n: usize) {
        if n < self.tokens.len() {
            self.tokens.truncate(n);
            self.joins.retain(|&j| j < n);
            self.dirty.retain(|&(a, _)| a < n);
            for range in &mut self.dirty {
                range.1 = range.1.min(n);
            }
            self.end_clean = false;
        }
    }
}

fn full(tokenizer: &Tokenizer, tokens: &[u32]) -> Result<Vec<u32>, SynthError> {
    tokenizer.encode(&tokenizer.decode(tokens)?)
}

/// `encode(decode(pieces.tokens))`, re-encoding only the neighbourhoods that can change.
pub fn reencode(tokenizer: &Tokenizer, pieces: &Pieces) -> Result<Vec<u32>, SynthError> {
    let x = &pieces.tokens;
    let n = x.len();
    let flags = match tokenizer.boundary_flags() {
        Some(f) if n > 0 => f,
        _ => return full(tokenizer, x),
    };
    let flag = |id: u32| flags.get(id as usize).copied().unwrap_or(0);
    let safe =
        |i: usize| flag(x[i - 1]) & ENDS_WITH_LETTER != 0 && flag(x[i]) & STARTS_WITH_SPACE != 0;
    let prev_safe = |mut i: usize| {
        while i > 0 {
            i -= 1;
            if i == 0 || safe(i) {
                return i;
            }
        }
        0
    };
    let next_safe = |mut i: usize| {
        while i < n {
            i += 1;
            if i == n || safe(i) {
                return i;
            }
        }
        n
    };
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(pieces.joins.len() + 2);
    if !pieces.start_clean {
        spans.push((0, next_safe(0)));
    }
    for &d in &pieces.joins {
        if d > 0 && d < n {
            spans.push((prev_safe(d), next_safe(d)));
        }
    }
    if !pieces.end_clean {
        spans.push((prev_safe(n), n));
    }
    for &(a, b) in &pieces.dirty {
        let a = a.min(n);
        let b = b.min(n);
        if a < b {
            let l = if a == 0 || safe(a) { a } else { prev_safe(a) };
            let r = if b == n || safe(b) { b } else { next_safe(b) };
            spans.push((l, r));
        }
    }
    spans.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match merged.last_mut() {
            Some(last) if a < last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    if merged.len() == 1 && merged[0] == (0, n) {
        return full(tokenizer, x);
    }
    let mut out = Vec::with_capacity(n + 8);
    let mut pos = 0;
    for (a, b) in merged {
        out.extend_from_slice(&x[pos..a]);
        if b > a {
            out.extend(full(tokenizer, &x[a..b])?);
        }
        pos = b;
    }
    out.extend_from_slice(&x[pos..]);
    Ok(out)
}
