//! The sonnet corpus: `shakespeare.txt` split into ~10,000-character chunks, each encoded
//! without special tokens, concatenated into one [`TokenCorpus`] (AIPerf's `_initialize_corpus`).
//! Owns chunking, tokenization and the on-disk id cache; must never draw random numbers.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::tokens::{parse_cache, read_cache, write_cache, TokenCorpus};
use crate::synth::error::SynthError;
use crate::synth::tokenizer::Tokenizer;

/// The shipped corpus text (AIPerf 0.13.0's `assets/shakespeare.txt`).
pub const SHAKESPEARE: &str = include_str!("../../../assets/shakespeare.txt");

/// The sonnet corpus ids for the shipped Qwen3 tokenizer, precomputed (cache-file format;
/// regenerated and checked by `tests/synth/corpus_assets.rs`).
const QWEN3_SONNET_IDS: &[u8] = include_bytes!("../../../assets/sonnet-qwen3-ids.bin");

/// sha256 of the shipped Qwen3 `tokenizer.json`.
const QWEN3_TOKENIZER_SHA256: &str =
    "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4";

/// A chunk closes once its stripped lines hold at least this many characters.
const CHUNK_CHARS: usize = 10_000;

/// Python's `str.isspace` for `str.strip()`: Unicode White_Space plus U+001C..U+001F.
fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Groups corpus lines into AIPerf's chunks: non-empty stripped lines (universal newlines),
/// a chunk closing when the characters of its stripped lines reach 10,000.
pub fn chunk_lines(text: &str) -> Vec<Vec<String>> {
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut chunks = Vec::new();
    let mut buf: Vec<String> = Vec::new();
    let mut count = 0usize;
    for line in text.split('\n') {
        let stripped = line.trim_matches(py_is_space);
        if stripped.is_empty() {
            continue;
        }
        buf.push(stripped.to_owned());
        count += stripped.chars().count();
        if count >= CHUNK_CHARS {
            chunks.push(std::mem::take(&mut buf));
            count = 0;
        }
    }
    if !buf.is_empty() {
        chunks.push(buf);
    }
    chunks
}

/// The chunk texts AIPerf encodes: each chunk's lines joined by one space.
pub fn chunk_text(text: &str) -> Vec<String> {
    chunk_lines(text).into_iter().map(|c| c.join(" ")).collect()
}

/// The sonnet corpus's constructors.
impl TokenCorpus {
    /// Tokenizes `text` chunk by chunk (in parallel) and concatenates the ids.
    pub fn build(text: &str, tokenizer: &Tokenizer) -> Result<Self, SynthError> {
        let per_chunk = tokenizer.encode_batch(chunk_text(text))?;
        let total = per_chunk.iter().map(Vec::len).sum();
        let mut tokens = Vec::with_capacity(total);
        let mut joins = Vec::with_capacity(per_chunk.len());
        for ids in per_chunk {
            if !tokens.is_empty() {
                joins.push(tokens.len());
            }
            tokens.extend_from_slice(&ids);
        }
        Ok(Self::from_parts(tokens, joins))
    }

    /// The precomputed corpus for the shipped corpus text and Qwen3 tokenizer, if those are
    /// what is asked for.
    pub fn shipped(text: &str, tokenizer: &Tokenizer) -> Option<Self> {
        if tokenizer.fingerprint() != QWEN3_TOKENIZER_SHA256 || text != SHAKESPEARE {
            return None;
        }
        parse_cache(QWEN3_SONNET_IDS)
    }

    /// Like [`TokenCorpus::build`], but first uses the shipped ids (default tokenizer), then
    /// looks in `cache_dir` for ids built earlier from the
    /// same tokenizer file and corpus text, and stores them there after a build. Cache problems
    /// never fail the build: an unreadable or malformed entry is rebuilt.
    pub fn build_cached(
        text: &str,
        tokenizer: &Tokenizer,
        cache_dir: Option<&Path>,
    ) -> Result<Self, SynthError> {
        if let Some(corpus) = Self::shipped(text, tokenizer) {
            return Ok(corpus);
        }
        let Some(dir) = cache_dir else {
            return Self::build(text, tokenizer);
        };
        let path = cache_path(dir, text, tokenizer);
        if let Some(corpus) = read_cache(&path) {
            return Ok(corpus);
        }
        let corpus = Self::build(text, tokenizer)?;
        write_cache(&path, &corpus);
        Ok(corpus)
    }
}

fn cache_path(dir: &Path, text: &str, tokenizer: &Tokenizer) -> PathBuf {
    let text_hash = hex::encode(Sha256::digest(text.as_bytes()));
    dir.join(format!(
        "sonnet-ids-v2-{}-{}.bin",
        &tokenizer.fingerprint()[..16],
        &text_hash[..16]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunking_matches_aiperf_facts() {
        let chunks = chunk_lines(SHAKESPEARE);
        assert_eq!(chunks.len(), 486);
        let lines: Vec<usize> = chunks[..5].iter().map(Vec::len).collect();
        assert_eq!(lines, [260, 257, 260, 264, 262]);
        let chars: Vec<usize> = chunks[..5]
            .iter()
            .map(|c| c.iter().map(|l| l.chars().count()).sum())
            .collect();
        assert_eq!(chars, [10037, 10025, 10034, 10029, 10040]);
        assert!(chunk_text(SHAKESPEARE)[0]
            .starts_with("THE SONNETS 1 From fairest creatures we desire increase"));
    }

    #[test]
    fn chunk_closes_at_threshold() {
        let line = "x".repeat(6_000);
        let text = format!("{line}\n\n  {line}  \n{line}\n");
        let chunks = chunk_text(&text);
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].len(), 12_001);
        assert_eq!(chunks[1].len(), 6_000);
    }
}
