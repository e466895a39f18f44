//! A corpus as a flat token array with the places where separately encoded runs meet (the sonnet
//! corpus's chunks, the coding corpora's blocks), its windows and its id-cache file format.
//! Owns that array and the cache layout; must never tokenize text or draw random numbers.

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::synth::tokenizer::reencode::Pieces;

/// A flat token array made of separately encoded runs (chunks, blocks), with where each run
/// after the first starts.
#[derive(Debug, Clone)]
pub struct TokenCorpus {
    tokens: Arc<Vec<u32>>,
    /// Ascending token indices at which run 1, 2, … begin (run 0 begins at 0).
    joins: Arc<Vec<usize>>,
}

impl TokenCorpus {
    /// Wraps an already-built token array and its chunk starts (`joins`, ascending, excluding 0).
    pub fn from_parts(tokens: Vec<u32>, joins: Vec<usize>) -> Self {
        TokenCorpus {
            tokens: Arc::new(tokens),
            joins: Arc::new(joins),
        }
    }

    /// The `k`-token window starting at `start`, wrapping past the end, with the chunk joins
    /// (and the wrap point) it contains. `k` is capped at the corpus size.
    pub fn window(&self, start: usize, k: usize) -> Pieces {
        let size = self.tokens.len();
        let k = k.min(size);
        let mut tokens = Vec::with_capacity(k);
        let mut joins = Vec::new();
        let first = (start + k).min(size);
        tokens.extend_from_slice(&self.tokens[start..first]);
        let inner = |lo: usize, hi: usize, shift: usize, joins: &mut Vec<usize>| {
            let from = self.joins.partition_point(|&j| j <= lo);
            for &j in &self.joins[from..] {
                if j >= hi {
                    break;
                }
                joins.push(j - lo + shift);
            }
        };
        inner(start, first, 0, &mut joins);
        if start + k > size {
            let rest = start + k - size;
            joins.push(tokens.len());
            let shift = tokens.len();
            tokens.extend_from_slice(&self.tokens[..rest]);
            inner(0, rest, shift, &mut joins);
        }
        Pieces {
            tokens,
            joins,
            start_clean: false,
            end_clean: false,
            dirty: Vec::new(),
        }
    }

    /// The bytes of the id-cache format for this corpus.
    pub fn to_cache_bytes(&self) -> Vec<u8> {
        let mut words = Vec::with_capacity(self.tokens.len() + self.joins.len() + 1);
        words.push(self.joins.len() as u32);
        words.extend(self.joins.iter().map(|&j| j as u32));
        words.extend_from_slice(&self.tokens);
        checked_bytes(&words)
    }

    /// Token indices where chunks 1.. begin.
    pub fn joins(&self) -> &[usize] {
        &self.joins
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

/// File layout: 32-byte sha256 of the rest, then little-endian u32s: the number of joins, the
/// joins, then the ids.
pub(crate) fn read_cache(path: &Path) -> Option<TokenCorpus> {
    parse_cache(&std::fs::read(path).ok()?)
}

pub(crate) fn parse_cache(bytes: &[u8]) -> Option<TokenCorpus> {
    let words = checked_words(bytes)?;
    let n_joins = *words.first()? as usize;
    if words.len() < 1 + n_joins {
        return None;
    }
    let joins = words[1..1 + n_joins].iter().map(|&j| j as usize).collect();
    Some(TokenCorpus::from_parts(
        words[1 + n_joins..].to_vec(),
        joins,
    ))
}

/// The cache files' framing: a 32-byte sha256 of the rest, then `words` as little-endian u32s.
pub(crate) fn checked_bytes(words: &[u32]) -> Vec<u8> {
    let body: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut bytes = Sha256::digest(&body).to_vec();
    bytes.extend_from_slice(&body);
    bytes
}

/// The words of a [`checked_bytes`] file; `None` when it is damaged or holds no word.
pub(crate) fn checked_words(bytes: &[u8]) -> Option<Vec<u32>> {
    if bytes.len() < 36 || (bytes.len() - 32) % 4 != 0 {
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

/// Writes an entry atomically (temp file + rename); failures are ignored (it is only a cache).
pub(crate) fn write_cache(path: &Path, corpus: &TokenCorpus) {
    write_bytes_atomically(path, &corpus.to_cache_bytes());
}

/// Writes a cache file atomically (temp file + rename); failures are ignored.
pub(crate) fn write_bytes_atomically(path: &Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    // A temporary name of this write's own: two threads (tests, lanes) may write one entry at
    // once, and a shared name let one rename the other's half-written file into place.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
