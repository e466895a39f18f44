//! The sonnet corpus: `shakespeare.txt` split into ~10,000-character chunks, each encoded
//! without special tokens, concatenated into one flat token array (AIPerf's `_initialize_corpus`).
//! Owns chunking, tokenization and the on-disk id cache; must never draw random numbers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::synth::error::SynthError;
use crate::synth::tokenizer::Tokenizer;

/// The shipped corpus text (AIPerf 0.13.0's `assets/shakespeare.txt`).
pub const SHAKESPEARE: &str = include_str!("../../../assets/shakespeare.txt");

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

/// The flat token array of the sonnet corpus for one tokenizer.
#[derive(Debug, Clone)]
pub struct SonnetCorpus {
    tokens: Arc<Vec<u32>>,
}

impl SonnetCorpus {
    /// Wraps an already-built token array.
    pub fn from_tokens(tokens: Vec<u32>) -> Self {
        SonnetCorpus {
            tokens: Arc::new(tokens),
        }
    }

    /// Tokenizes `text` chunk by chunk (in parallel) and concatenates the ids.
    pub fn build(text: &str, tokenizer: &Tokenizer) -> Result<Self, SynthError> {
        let per_chunk = tokenizer.encode_batch(chunk_text(text))?;
        let total = per_chunk.iter().map(Vec::len).sum();
        let mut tokens = Vec::with_capacity(total);
        for ids in per_chunk {
            tokens.extend_from_slice(&ids);
        }
        Ok(Self::from_tokens(tokens))
    }

    /// Like [`SonnetCorpus::build`], but first looks in `cache_dir` for ids built earlier from the
    /// same tokenizer file and corpus text, and stores them there after a build. Cache problems
    /// never fail the build: an unreadable or malformed entry is rebuilt.
    pub fn build_cached(
        text: &str,
        tokenizer: &Tokenizer,
        cache_dir: Option<&Path>,
    ) -> Result<Self, SynthError> {
        let Some(dir) = cache_dir else {
            return Self::build(text, tokenizer);
        };
        let path = cache_path(dir, text, tokenizer);
        if let Some(tokens) = read_ids(&path) {
            return Ok(Self::from_tokens(tokens));
        }
        let corpus = Self::build(text, tokenizer)?;
        write_ids(&path, &corpus.tokens);
        Ok(corpus)
    }

    /// The token ids.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the corpus holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// The default cache folder: `$KVBUST_CACHE_DIR`, else `$XDG_CACHE_HOME/kvbust`, else
/// `$HOME/.cache/kvbust`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KVBUST_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("kvbust"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("kvbust"))
}

fn cache_path(dir: &Path, text: &str, tokenizer: &Tokenizer) -> PathBuf {
    let text_hash = hex::encode(Sha256::digest(text.as_bytes()));
    dir.join(format!(
        "sonnet-ids-{}-{}.u32le",
        &tokenizer.fingerprint()[..16],
        &text_hash[..16]
    ))
}

/// File layout: 32-byte sha256 of the id bytes, then the ids as little-endian u32.
fn read_ids(path: &Path) -> Option<Vec<u32>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < 32 || (bytes.len() - 32) % 4 != 0 {
        return None;
    }
    let (sum, body) = bytes.split_at(32);
    if Sha256::digest(body).as_slice() != sum {
        return None;
    }
    Some(
        body.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

fn write_ids(path: &Path, ids: &[u32]) {
    let mut body = Vec::with_capacity(ids.len() * 4);
    for id in ids {
        body.extend_from_slice(&id.to_le_bytes());
    }
    let mut bytes = Sha256::digest(&body).to_vec();
    bytes.extend_from_slice(&body);
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, &bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
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
