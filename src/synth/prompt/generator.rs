//! AIPerf's `PromptGenerator`: window/offset sampling from a corpus, the BPE fix-up loop that
//! makes a decoded prompt re-encode to exactly the target length, and top-ups.
//! Owns the per-prompt random draws in AIPerf's order; must never reorder or skip a draw.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use rayon::prelude::*;

use crate::synth::corpus::aiperf_coding::CodingPool;
use crate::synth::corpus::kvbust_coding::CodingCorpus;
use crate::synth::corpus::{RandomPools, TokenCorpus};
use crate::synth::error::SynthError;
use crate::synth::rng::{GeneratorRngs, NumpyGenerator, RandomState};
use crate::synth::tokenizer::reencode::{reencode, Pieces};
use crate::synth::tokenizer::Tokenizer;

/// A token sequence and its `encode(decode(..))`.
type SeqAndReencode = (Vec<u32>, Vec<u32>);

/// Rounds of decode → re-encode → adjust before a prompt is returned unverified.
pub const MAX_FIXUP_ROUNDS: usize = 10;

/// The generator the random corpus's preseed drew from; prefix-pool draws and top-ups continue it.
#[derive(Clone)]
pub enum PreseedRng {
    /// vLLM style: `numpy.random.default_rng(run_seed)`.
    Pcg(NumpyGenerator),
    /// SGLang style: `RandomState(fold(run_seed))`.
    Legacy(Box<RandomState>),
}

/// `k` ids drawn uniformly from `pool` (`pool[G.integers(0, len(pool))]`), `G` being the preseed
/// generator when installed, else `np` (the numpy side of `dataset.prompt.corpus`).
fn draw_ids(
    pool: &[u32],
    k: usize,
    mut preseed: Option<&mut PreseedRng>,
    np: &mut NumpyGenerator,
) -> Pieces {
    let n = pool.len() as i64;
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let i = match preseed.as_deref_mut() {
            Some(g) => g.integers(0, n),
            None => np.integers(0, n),
        };
        out.push(pool[i as usize]);
    }
    Pieces::opaque(out)
}

impl PreseedRng {
    /// A draw in `[low, high)` with this generator's own bounded method.
    pub fn integers(&mut self, low: i64, high: i64) -> i64 {
        match self {
            PreseedRng::Pcg(g) => g.integers(low, high),
            PreseedRng::Legacy(g) => g.randint(low, high),
        }
    }
}

/// Which corpus prompts come from.
#[derive(Clone)]
pub enum CorpusSource {
    /// Token windows of the sonnet corpus.
    Sonnet(TokenCorpus),
    /// Consecutive ids of the random corpus's pool.
    Random(RandomPools),
    /// Windows of AIPerf's coding pool, decoded without the fix-up loop.
    Coding(Arc<CodingPool>),
}

/// The prompt side of kvbust's coding corpus, here so the corpus layer never imports the
/// prompt layer above it.
impl CodingCorpus {
    /// A prompt-generator source over this corpus (sonnet-style windows and top-ups).
    pub fn source(&self) -> CorpusSource {
        CorpusSource::Sonnet(self.as_token_corpus().clone())
    }

    /// A prompt generator over this corpus with the streams derived from `root_seed`.
    pub fn generator<'t>(
        &self,
        tokenizer: &'t Tokenizer,
        root_seed: u64,
    ) -> PromptGenerator<&'t Tokenizer> {
        PromptGenerator::new(tokenizer, self.source(), GeneratorRngs::derive(root_seed))
    }
}

/// Prompt generation state: streams, the random corpus's request index and preseed caches.
/// `T` is how the tokenizer is held: `&Tokenizer` for a one-off dataset, `Arc<Tokenizer>` for a
/// long-lived prompt source.
pub struct PromptGenerator<T: Deref<Target = Tokenizer>> {
    tokenizer: T,
    corpus: CorpusSource,
    rngs: GeneratorRngs,
    request_index: u64,
    offset_cache: Vec<i64>,
    offset_cursor: usize,
    preseed: Option<PreseedRng>,
    /// Re-encodes computed ahead of time (in parallel), keyed by the exact token sequence.
    speculative: HashMap<Vec<u32>, Vec<u32>>,
}

impl<T: Deref<Target = Tokenizer>> PromptGenerator<T> {
    /// A generator over `corpus` with the given streams.
    pub fn new(tokenizer: T, corpus: CorpusSource, rngs: GeneratorRngs) -> Self {
        PromptGenerator {
            tokenizer,
            corpus,
            rngs,
            request_index: 0,
            offset_cache: Vec::new(),
            offset_cursor: 0,
            preseed: None,
            speculative: HashMap::new(),
        }
    }

    /// The tokenizer prompts are made with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The corpus prompts come from.
    pub fn corpus(&self) -> &CorpusSource {
        &self.corpus
    }

    /// Installs the preseed generator and its offset cache (random corpus with a range ratio).
    pub fn set_preseed(&mut self, rng: PreseedRng, offsets: Vec<i64>) {
        self.preseed = Some(rng);
        self.offset_cache = offsets;
        self.offset_cursor = 0;
    }

    /// The random corpus's next request index.
    pub fn request_index(&self) -> u64 {
        self.request_index
    }

    /// The preseeded offsets not yet consumed.
    pub fn remaining_offsets(&self) -> &[i64] {
        &self.offset_cache[self.offset_cursor..]
    }

    /// The random-corpus body `_sample_tokens` would produce for `offset`, request `index` and
    /// `k` tokens (no draws).
    pub fn random_body(&self, offset: i64, index: u64, k: usize) -> Option<Vec<u32>> {
        let CorpusSource::Random(pools) = &self.corpus else {
            return None;
        };
        let n = pools.allowed.len();
        if n == 0 {
            return None;
        }
        let base = (offset as u64 + index) as usize;
        Some((0..k).map(|j| pools.allowed[(base + j) % n]).collect())
    }

    /// Computes `encode(decode(seq))` for sequences that are expected to be prompt bodies soon,
    /// in parallel. A prediction that does not come true costs time, never correctness: a
    /// result is only used for a sequence equal to its key.
    pub fn prefetch_reencodes(&mut self, seqs: Vec<Vec<u32>>) -> Result<(), SynthError> {
        let tok: &Tokenizer = &self.tokenizer;
        let done: Result<Vec<SeqAndReencode>, SynthError> = seqs
            .into_par_iter()
            .map(|seq| {
                let encoded = reencode(tok, &Pieces::opaque(seq.clone()))?;
                Ok((seq, encoded))
            })
            .collect();
        // Earlier predictions that never came true are dropped here, which bounds the memory.
        self.speculative.clear();
        self.speculative.extend(done?);
        Ok(())
    }

    /// The preseed generator, if installed.
    pub fn preseed_mut(&mut self) -> Option<&mut PreseedRng> {
        self.preseed.as_mut()
    }

    /// The CPython side of `dataset.prompt.prefix` (prefix-pool choice).
    pub fn prefix_choice(&mut self, pool_size: usize) -> usize {
        self.rngs.prefix.py.choice_index(pool_size)
    }

    /// A length from `sample_positive_normal_integer(mean, stddev)` on `dataset.prompt.length`.
    pub fn sample_length(&mut self, mean: f64, stddev: f64) -> usize {
        self.rngs
            .length
            .py
            .sample_positive_normal_integer(mean, stddev) as usize
    }

    /// `_sample_tokens(k)`: a corpus window (sonnet) or `k` consecutive pool ids (random).
    pub fn sample_tokens(&mut self, k: usize) -> Vec<u32> {
        self.sample_pieces(k).tokens
    }

    /// `_sample_tokens(k)` with the window's structure (chunk joins, cut edges) kept.
    pub fn sample_pieces(&mut self, k: usize) -> Pieces {
        match &self.corpus {
            CorpusSource::Sonnet(corpus) => {
                let size = corpus.len();
                if size == 0 {
                    return Pieces::default();
                }
                let start = self.rngs.corpus.py.randrange(size as u64) as usize;
                corpus.window(start, k)
            }
            CorpusSource::Random(pools) => {
                let n = pools.allowed.len();
                if n == 0 {
                    return Pieces::default();
                }
                let offset = if self.offset_cursor < self.offset_cache.len() {
                    self.offset_cursor += 1;
                    self.offset_cache[self.offset_cursor - 1]
                } else {
                    self.rngs.corpus.np.integers(0, n as i64)
                };
                let idx = self.request_index;
                self.request_index += 1;
                let base = (offset as u64 + idx) as usize;
                Pieces::opaque((0..k).map(|j| pools.allowed[(base + j) % n]).collect())
            }
            CorpusSource::Coding(pool) => Pieces::opaque(pool.sample(&mut self.rngs.corpus.py, k)),
        }
    }

    /// Random-corpus prefix-pool tokens: `allowed[G.integers(0, len(allowed))]`, `G` being the
    /// preseed generator when installed, else the numpy side of `dataset.prompt.corpus`.
    pub fn random_prefix_tokens(&mut self, k: usize) -> Pieces {
        let CorpusSource::Random(pools) = &self.corpus else {
            return self.sample_pieces(k);
        };
        draw_ids(
            &pools.allowed,
            k,
            self.preseed.as_mut(),
            &mut self.rngs.corpus.np,
        )
    }

    /// Extra tokens for a prompt that re-encoded short.
    fn topup(&mut self, n: usize) -> Pieces {
        match &self.corpus {
            CorpusSource::Sonnet(_) | CorpusSource::Coding(_) => self.sample_pieces(n),
            CorpusSource::Random(pools) => draw_ids(
                &pools.topup,
                n,
                self.preseed.as_mut(),
                &mut self.rngs.corpus.np,
            ),
        }
    }

    /// `_decode_to_exact_len(tokens, target)`: decode, re-encode, truncate or top up, at most
    /// ten rounds; returns the text whose encoding had exactly `target` tokens (or the last
    /// decode when the rounds ran out). The re-encode is computed locally where that is exact.
    pub fn decode_to_exact_len(
        &mut self,
        mut pieces: Pieces,
        target: usize,
    ) -> Result<String, SynthError> {
        for _ in 0..MAX_FIXUP_ROUNDS {
            let encoded = match self.speculative.remove(&pieces.tokens) {
                Some(e) => e,
                None => reencode(&self.tokenizer, &pieces)?,
            };
            if encoded.len() == target {
                return self.tokenizer.decode(&pieces.tokens);
            }
            let mut next = Pieces::canonical(encoded);
            if next.tokens.len() > target {
                next.truncate(target);
            } else {
                let more = self.topup(target - next.tokens.len());
                next.append(more);
            }
            pieces = next;
        }
        self.tokenizer.decode(&pieces.tokens)
    }

    /// `generate_prompt(num_tokens, prefix_tokens)`: a body window, the prefix joined at the
    /// token level, then one fix-up on the whole sequence.
    pub fn generate_prompt(
        &mut self,
        num_tokens: usize,
        prefix: Option<&[u32]>,
    ) -> Result<String, SynthError> {
        let prefix = prefix.unwrap_or(&[]);
        if let CorpusSource::Coding(_) = self.corpus {
            // AIPerf's coding generator decodes the window as is: no fix-up, and 0 tokens
            // make an empty prompt.
            let mut ids = prefix.to_vec();
            ids.extend(self.sample_pieces(num_tokens).tokens);
            return self.tokenizer.decode(&ids);
        }
        if num_tokens == 0 && prefix.is_empty() {
            return Err(SynthError::invalid(
                "a prompt of 0 tokens without a prefix was requested; raise the input length",
            ));
        }
        let body = self.sample_pieces(num_tokens);
        let mut pieces = Pieces::canonical(prefix.to_vec());
        pieces.append(body);
        self.decode_to_exact_len(pieces, num_tokens + prefix.len())
    }
}
