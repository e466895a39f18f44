//! The random corpus's token pools (AIPerf `--prompt-corpus random`): the body pool per style
//! and the top-up pool. Owns pool construction and warming the piece memo for the body pool's
//! cycle; must never draw random numbers.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::synth::corpus::tokens::{checked_bytes, checked_words, write_bytes_atomically};
use crate::synth::error::SynthError;
use crate::synth::tokenizer::reencode::{reencode, Pieces};
use crate::synth::tokenizer::Tokenizer;

/// Ids per chunk when warming the piece memo (long enough that chunk edges cut few pieces).
const WARM_CHUNK: usize = 4096;

/// `--random-corpus-style`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RandomCorpusStyle {
    /// vLLM `--dataset-name random`: non-special ids below `vocab_size`, PCG64 preseed.
    #[default]
    Vllm,
    /// SGLang `random-ids`: every id below `vocab_size`, legacy MT19937 preseed.
    Sglang,
}

impl std::str::FromStr for RandomCorpusStyle {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "vllm" => Ok(Self::Vllm),
            "sglang" => Ok(Self::Sglang),
            other => Err(format!(
                "unknown random corpus style {other:?}; use vllm or sglang"
            )),
        }
    }
}

/// Body and top-up pools.
#[derive(Debug, Clone)]
pub struct RandomPools {
    /// Ids bodies are drawn from (ascending).
    pub allowed: Vec<u32>,
    /// Ids top-ups are drawn from: always `0..vocab_size`.
    pub topup: Vec<u32>,
}

impl RandomPools {
    /// AIPerf's `_build_allowed_tokens` for a style.
    pub fn new(tokenizer: &Tokenizer, style: RandomCorpusStyle) -> Self {
        let vocab = tokenizer.vocab_size() as u32;
        let topup: Vec<u32> = (0..vocab).collect();
        let allowed = match style {
            RandomCorpusStyle::Sglang => topup.clone(),
            RandomCorpusStyle::Vllm => {
                let specials = tokenizer.all_special_ids();
                (0..vocab).filter(|id| !specials.contains(id)).collect()
            }
        };
        RandomPools { allowed, topup }
    }

    /// Re-encodes the body pool's whole cycle once, in chunks on the rayon pool, so the
    /// tokenizer's piece memo holds every piece a body window can contain (except those cut by
    /// a chunk edge). Every prompt from this pool is then mostly memo hits; without it, the first
    /// cycle's worth of prompts re-encode their pieces as they go. Output never depends on it:
    /// a memo entry is a pure function of its key.
    pub fn warm_piece_memo(&self, tokenizer: &Tokenizer) -> Result<(), SynthError> {
        let ids = &self.allowed;
        let n = ids.len();
        (0..n.div_ceil(WARM_CHUNK))
            .into_par_iter()
            .try_for_each(|c| {
                // The last chunk runs on across the wrap, as windows do.
                let chunk = (c * WARM_CHUNK..(c + 1) * WARM_CHUNK)
                    .map(|j| ids[j % n])
                    .collect();
                reencode(tokenizer, &Pieces::opaque(chunk)).map(drop)
            })
    }
}

/// The piece memo's cache file for `tokenizer` in `dir`.
fn memo_cache_path(dir: &Path, tokenizer: &Tokenizer) -> PathBuf {
    dir.join(format!(
        "piece-memo-v1-{}.bin",
        &tokenizer.fingerprint()[..16]
    ))
}

/// Fills the tokenizer's piece memo from the cache file in `dir` (written by
/// [`save_piece_memo`] for a tokenizer with the same `tokenizer.json` bytes); false when there
/// is none or it is damaged (the memo is then filled as prompts are made, as without a cache).
pub fn load_piece_memo(tokenizer: &Tokenizer, dir: &Path) -> bool {
    std::fs::read(memo_cache_path(dir, tokenizer))
        .ok()
        .and_then(|bytes| checked_words(&bytes))
        .is_some_and(|words| tokenizer.piece_memo().load_words(&words))
}

/// Writes the tokenizer's piece memo to its cache file in `dir` (failures are ignored: it is
/// only a cache). The random corpus's pieces are the same for every seed and style, so the next
/// run skips re-encoding the id cycle's pieces.
pub fn save_piece_memo(tokenizer: &Tokenizer, dir: &Path) {
    let memo = tokenizer.piece_memo();
    if !memo.is_empty() {
        let bytes = checked_bytes(&memo.to_words());
        write_bytes_atomically(&memo_cache_path(dir, tokenizer), &bytes);
    }
}
