//! A fast, exact `encode` of the coding pool's text for the byte-level BPE tokenizers whose split
//! regex is Qwen2's or Llama-3's ([`crate::synth::tokenizer::split_pattern`]). The text is cut at
//! line starts (after `\n`, before a printable ASCII character: always a pre-token boundary, see
//! [`line_starts`]); a pure-ASCII segment without added-token text is pre-tokenized by a direct
//! port of the split regex for ASCII and each distinct pre-token is run through the model's BPE
//! once (memoized); any other segment goes through the full `tokenizers` pipeline. Owns this
//! shortcut; must never return anything but what `Tokenizer::encode` returns (the tests compare
//! the two on the pools and on random ASCII).

use rayon::prelude::*;
use tokenizers::Model;

use super::FastMap;
use crate::synth::error::SynthError;
use crate::synth::tokenizer::{byte_level_alphabet, Tokenizer};

type Memo<'t> = FastMap<&'t [u8], Vec<u32>>;

/// Where `text` may be cut: after a `\n`, before a printable ASCII character. No alternative of
/// either split regex carries a newline into a following non-space character, NFC cannot
/// compose across an ASCII character, and (checked by the caller) no added token holds a `\n`.
pub fn is_line_start(b: &[u8], p: usize) -> bool {
    p > 0 && p < b.len() && b[p - 1] == b'\n' && b[p].is_ascii_graphic()
}

/// Every line start of `text`, in order.
fn line_starts(text: &str) -> impl Iterator<Item = usize> + '_ {
    let b = text.as_bytes();
    (1..b.len()).filter(move |&p| is_line_start(b, p))
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0B | 0x0C)
}

fn is_punct(c: u8) -> bool {
    !is_space(c) && !c.is_ascii_alphanumeric()
}

/// The end of the pre-token starting at `i` under
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
///  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` on ASCII text (leftmost alternative
/// first, each greedy with backtracking).
fn pre_token_end(s: &[u8], i: usize, max_digits: usize) -> usize {
    let n = s.len();
    let c = s[i];
    if c == b'\'' {
        for suffix in ["s", "t", "re", "ve", "m", "ll", "d"] {
            let end = i + 1 + suffix.len();
            if end <= n && s[i + 1..end].eq_ignore_ascii_case(suffix.as_bytes()) {
                return end;
            }
        }
    }
    let letters = |mut j: usize| {
        while j < n && s[j].is_ascii_alphabetic() {
            j += 1;
        }
        j
    };
    if c != b'\r'
        && c != b'\n'
        && !c.is_ascii_alphanumeric()
        && i + 1 < n
        && s[i + 1].is_ascii_alphabetic()
    {
        return letters(i + 1);
    }
    if c.is_ascii_alphabetic() {
        return letters(i);
    }
    if c.is_ascii_digit() {
        let mut j = i + 1;
        while j < n && j - i < max_digits && s[j].is_ascii_digit() {
            j += 1;
        }
        return j;
    }
    let start = if c == b' ' && i + 1 < n && is_punct(s[i + 1]) {
        i + 1
    } else {
        i
    };
    if is_punct(s[start]) {
        let mut j = start;
        while j < n && is_punct(s[j]) {
            j += 1;
        }
        while j < n && (s[j] == b'\r' || s[j] == b'\n') {
            j += 1;
        }
        return j;
    }
    // A whitespace run.
    let mut e = i;
    while e < n && is_space(s[e]) {
        e += 1;
    }
    if let Some(k) = (i..e).rev().find(|&k| s[k] == b'\r' || s[k] == b'\n') {
        return k + 1;
    }
    if e == n || e - i == 1 {
        e
    } else {
        e - 1
    }
}

/// The fast path's inputs: the BPE model, the byte alphabet and the digit-run limit.
struct Fast<'a> {
    bpe: &'a tokenizers::models::bpe::BPE,
    alphabet: [char; 256],
    max_digits: usize,
}

impl Fast<'_> {
    fn encode_ascii<'t>(
        &self,
        seg: &'t [u8],
        memo: &mut Memo<'t>,
        out: &mut Vec<u32>,
    ) -> Result<(), SynthError> {
        let mut i = 0;
        while i < seg.len() {
            let end = pre_token_end(seg, i, self.max_digits);
            let word = &seg[i..end];
            if let Some(ids) = memo.get(word) {
                out.extend_from_slice(ids);
            } else {
                let mapped: String = word.iter().map(|&b| self.alphabet[b as usize]).collect();
                let ids: Vec<u32> = self
                    .bpe
                    .tokenize(&mapped)
                    .map_err(|e| SynthError::Tokenize {
                        op: "encode",
                        message: e.to_string(),
                    })?
                    .into_iter()
                    .map(|t| t.id)
                    .collect();
                out.extend_from_slice(&ids);
                memo.insert(word, ids);
            }
            i = end;
        }
        Ok(())
    }
}

fn plain_ascii(seg: &[u8]) -> bool {
    seg.iter()
        .all(|&c| (0x20..0x7f).contains(&c) || matches!(c, b'\t' | b'\n' | b'\r' | 0x0B | 0x0C))
}

/// `tokenizer.encode(text)`, through the fast path when the tokenizer is eligible.
pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, SynthError> {
    let inner = tokenizer.inner();
    let pattern = crate::synth::tokenizer::split_pattern(inner);
    let bpe = match inner.get_model() {
        tokenizers::ModelWrapper::BPE(bpe) => Some(bpe),
        _ => None,
    };
    let added: Vec<String> = inner
        .get_added_tokens_decoder()
        .values()
        .map(|t| t.content.clone())
        .collect();
    let (Some(pattern), Some(bpe)) = (pattern, bpe) else {
        return tokenizer.encode(text);
    };
    if added.iter().any(|a| a.contains('\n') || a.is_empty()) {
        return tokenizer.encode(text);
    }
    // Added-token text in the pool (never in AIPerf's templates) sends its segment to the
    // full pipeline, which splits added tokens out first.
    let present: Vec<&str> = added
        .iter()
        .map(String::as_str)
        .filter(|a| text.contains(a))
        .collect();
    let fast = Fast {
        bpe,
        alphabet: byte_level_alphabet(),
        max_digits: if pattern.contains(r"\p{N}{1,3}") {
            3
        } else {
            1
        },
    };
    // A few pieces at line starts, one per worker, each with its own memo.
    let mut cuts = vec![0];
    let step = text.len() / 8 + 1;
    let mut next = step;
    for p in line_starts(text) {
        if p >= next {
            cuts.push(p);
            next = p + step;
        }
    }
    cuts.push(text.len());
    let parts: Vec<Vec<u32>> = cuts
        .par_windows(2)
        .map(|w| {
            let piece = &text[w[0]..w[1]];
            let mut memo = Memo::default();
            let mut out = Vec::with_capacity(piece.len() / 3);
            let mut start = 0;
            let bounds = line_starts(piece).chain(std::iter::once(piece.len()));
            for end in bounds {
                let seg = &piece[start..end];
                if plain_ascii(seg.as_bytes()) && !present.iter().any(|a| seg.contains(a)) {
                    fast.encode_ascii(seg.as_bytes(), &mut memo, &mut out)?;
                } else {
                    out.extend(tokenizer.encode(seg)?);
                }
                start = end;
            }
            Ok(out)
        })
        .collect::<Result<_, SynthError>>()?;
    Ok(parts.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(tok: &Tokenizer, text: &str) {
        assert_eq!(
            encode(tok, text).unwrap(),
            tok.encode(text).unwrap(),
            "{text:?}"
        );
    }

    #[test]
    fn equals_the_full_pipeline_on_tricky_ascii() {
        let tok = Tokenizer::default_qwen3().unwrap();
        for t in [
            "",
            "a",
            "  foo\n\n  bar\t(baz) 'S 'll 'sam don't",
            "x = 12345 + 6.0e10;\r\n\r\n\tif (a) {{\n    }}\n\n\n",
            "   \n  \n x\n",
            "end with spaces   ",
            " ?! ..\n\n\n### Title\n- item: `code`\n",
            "tab\t\ttab\x0bvt\x0cff",
            "unicode — ✓ done\nnext line ascii\n✗ fail",
            "<|im_end|> and <think>\nline\n",
        ] {
            check(&tok, t);
        }
    }

    #[test]
    fn equals_the_full_pipeline_on_random_ascii() {
        let llama = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/synth/tokenizers/llama-3.2");
        for tok in [
            Tokenizer::default_qwen3().unwrap(),
            Tokenizer::from_path(&llama).unwrap(),
        ] {
            random_ascii(&tok);
        }
    }

    fn random_ascii(tok: &Tokenizer) {
        let alphabet = b"ab Z09'\n\r\t .,:;(){}[]\"'sStTlLdDmM-_=+*/\\#<>|&^%$@!?~`\x0b\x0c";
        let mut rng = crate::synth::rng::PyRandom::new(5);
        for len in [1usize, 2, 3, 5, 8, 13, 40, 200] {
            for _ in 0..300 {
                let t: String = (0..len)
                    .map(|_| alphabet[rng.choice_index(alphabet.len())] as char)
                    .collect();
                check(tok, &t);
            }
        }
    }
}
