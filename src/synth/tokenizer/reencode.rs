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
//!
//! The second kind of safe position lies inside a pre-token: between two dense letters (CJK,
//! kana, Hangul syllables; [`crate::synth::tokenizer::is_dense_letter`]) where no vocabulary
//! token can lie across the boundary ([`Tokenizer::letter_cut`]). The split regex matches the
//! letter run the same up to the cut from the left and from the cut onwards from the right
//! (only `\p{L}+` consumes those letters; nothing looks across them), NFC never composes onto a
//! dense letter, and with no token across it no BPE merge joins symbols across the cut, so the
//! pre-token's BPE is its two sides' BPE, concatenated. Long runs of such letters (a quarter
//! of Qwen3's id cycle, in stretches of hundreds of ids) otherwise make one pre-token per
//! window that no memo can serve, each merged from scratch.
//!
//! The same fact makes the re-encode of any span a concatenation of the re-encodes of its
//! sub-pieces between safe positions, which are pure functions of their ids: the tokenizer's
//! [`PieceMemo`](crate::synth::tokenizer::piece_memo::PieceMemo) keeps them, so the random corpus (whose windows are all cut from one cycle of ids) re-encodes
//! each piece of that cycle once per process instead of once per prompt.

use crate::synth::error::SynthError;
use crate::synth::tokenizer::{
    Tokenizer, ENDS_WITH_DENSE, ENDS_WITH_LETTER, STARTS_WITH_DENSE, STARTS_WITH_SPACE,
};

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

/// Appends `encode(decode(x[a..b]))` to `out`, where `a` and `b` are safe positions or ends of
/// `x`: piece by piece between the safe positions inside, from the memo where known; each run
/// of unknown pieces is re-encoded in one call and cut back into pieces by the decoded length of
/// every output id (a cut that does not land on a piece boundary falls back to one call per
/// piece, so the result never depends on the cut).
fn span(
    tokenizer: &Tokenizer,
    x: &[u32],
    (a, b): (usize, usize),
    safe: &dyn Fn(usize) -> bool,
    out: &mut Vec<u32>,
) -> Result<(), SynthError> {
    let memo = tokenizer.piece_memo();
    let mut cuts = Vec::with_capacity((b - a) / 3 + 2);
    cuts.push(a);
    cuts.extend((a + 1..b).filter(|&i| safe(i)));
    cuts.push(b);
    let pieces: Vec<&[u32]> = cuts.windows(2).map(|w| &x[w[0]..w[1]]).collect();
    let mut i = 0;
    while i < pieces.len() {
        if memo.extend_into(pieces[i], out) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < pieces.len() && !memo.contains(pieces[j]) {
            j += 1;
        }
        encode_run(tokenizer, &pieces[i..j], out)?;
        i = j;
    }
    Ok(())
}

/// Re-encodes consecutive pieces in one call, memoizing each piece's share.
fn encode_run(
    tokenizer: &Tokenizer,
    pieces: &[&[u32]],
    out: &mut Vec<u32>,
) -> Result<(), SynthError> {
    let memo = tokenizer.piece_memo();
    let texts: Vec<String> = pieces
        .iter()
        .map(|p| tokenizer.decode(p))
        .collect::<Result<_, _>>()?;
    let encoded = tokenizer.encode(&texts.concat())?;
    let mut shares: Vec<&[u32]> = Vec::with_capacity(pieces.len());
    let mut at = 0;
    let mut aligned = true;
    for text in &texts {
        let (mut bytes, start) = (0, at);
        while bytes < text.len() && at < encoded.len() {
            // An id that decodes to nothing could sit on either side of a cut: no shares then.
            let len = tokenizer.token_len(encoded[at]);
            aligned &= len > 0;
            bytes += len;
            at += 1;
        }
        if !aligned || bytes != text.len() {
            aligned = false;
            break;
        }
        shares.push(&encoded[start..at]);
    }
    if !aligned || at != encoded.len() {
        for p in pieces {
            let e = full(tokenizer, p)?;
            memo.insert(p, &e);
            out.extend_from_slice(&e);
        }
        return Ok(());
    }
    for (p, share) in pieces.iter().zip(shares) {
        memo.insert(p, share);
    }
    out.extend_from_slice(&encoded);
    Ok(())
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
    let safe = |i: usize| {
        let (l, r) = (flag(x[i - 1]), flag(x[i]));
        (l & ENDS_WITH_LETTER != 0 && r & STARTS_WITH_SPACE != 0)
            || (l & ENDS_WITH_DENSE != 0
                && r & STARTS_WITH_DENSE != 0
                && tokenizer.letter_cut(x[i - 1], x[i]))
    };
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
    let mut out = Vec::with_capacity(n + 8);
    let mut pos = 0;
    for (a, b) in merged {
        out.extend_from_slice(&x[pos..a]);
        if b > a {
            span(tokenizer, x, (a, b), &safe, &mut out)?;
        }
        pos = b;
    }
    out.extend_from_slice(&x[pos..]);
    Ok(out)
}
