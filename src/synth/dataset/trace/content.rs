//! Where a hash-id trace's prompt text comes from ([`TraceContent`]): AIPerf's sonnet and
//! coding generators, and kvbust's token-exact coding content. Owns drawing tokens and text in
//! AIPerf's stream order; never reads a trace.

use std::collections::HashMap;
use std::sync::Arc;

use crate::synth::corpus::aiperf_coding::{self, CodingPool, CodingPrompts};
use crate::synth::corpus::hash_blocks;
use crate::synth::corpus::TokenCorpus;
use crate::synth::error::SynthError;
use crate::synth::prompt::generator::{CorpusSource, PromptGenerator};
use crate::synth::rng::{derive_seed, DerivedRng, GeneratorRngs};
use crate::synth::tokenizer::Tokenizer;

/// Where prompt content comes from: AIPerf's `PromptGenerator` for sonnet (and, once ported,
/// its coding generator). The hash-id blocks are cut from `tokens`.
pub trait TraceContent {
    /// The flat token array blocks are cut from (a cheap shared handle).
    fn block_corpus(&self) -> TokenCorpus;
    /// The seed of the generator's corpus stream (it seeds `HashIdRandomGenerator`).
    fn corpus_seed(&self) -> u64;
    /// `_sample_tokens(n)` on the corpus stream (a prefix-only line's tail).
    fn sample_tokens(&mut self, n: usize) -> Vec<u32>;
    /// `generate(mean=input_length, stddev=0)` for a line without hash ids.
    fn plain_prompt(&mut self, input_length: i64) -> Result<String, SynthError>;
}

/// The sonnet corpus through AIPerf's `PromptGenerator` streams.
pub struct SonnetContent<'t> {
    gen: PromptGenerator<&'t Tokenizer>,
    corpus: TokenCorpus,
    seed: u64,
}

impl<'t> SonnetContent<'t> {
    /// The generator a trace loader gets under `root_seed`.
    pub fn new(tokenizer: &'t Tokenizer, corpus: TokenCorpus, root_seed: u64) -> Self {
        SonnetContent {
            gen: PromptGenerator::new(
                tokenizer,
                CorpusSource::Sonnet(corpus.clone()),
                GeneratorRngs::derive(root_seed),
            ),
            corpus,
            seed: derive_seed(root_seed, "dataset.prompt.corpus"),
        }
    }
}

impl TraceContent for SonnetContent<'_> {
    fn block_corpus(&self) -> TokenCorpus {
        self.corpus.clone()
    }
    fn corpus_seed(&self) -> u64 {
        self.seed
    }
    fn sample_tokens(&mut self, n: usize) -> Vec<u32> {
        self.gen.sample_tokens(n)
    }
    fn plain_prompt(&mut self, input_length: i64) -> Result<String, SynthError> {
        // sample_positive_normal_integer(mean, 0) = max(1, round(mean)), no draw.
        self.gen.generate_prompt(input_length.max(1) as usize, None)
    }
}

/// AIPerf's coding corpus (`CodingContentGenerator`): blocks cut from its tool pool, plain
/// prompts decoded as sampled (no fix-up), tails on its `.corpus` stream.
pub struct CodingContent<'t> {
    prompts: CodingPrompts,
    tokenizer: &'t Tokenizer,
    seed: u64,
}

impl<'t> CodingContent<'t> {
    /// The generator a trace loader gets for `pool` (built for the run's root seed).
    pub fn new(tokenizer: &'t Tokenizer, pool: Arc<CodingPool>) -> Self {
        let seed = derive_seed(pool.root_seed(), aiperf_coding::CORPUS_STREAM);
        CodingContent {
            prompts: CodingPrompts::new(pool, tokenizer),
            tokenizer,
            seed,
        }
    }
}

impl TraceContent for CodingContent<'_> {
    fn block_corpus(&self) -> TokenCorpus {
        // The pool's own array: a shared handle, not a copy of its ids.
        self.prompts.pool().corpus().clone()
    }
    fn corpus_seed(&self) -> u64 {
        self.seed
    }
    fn sample_tokens(&mut self, n: usize) -> Vec<u32> {
        self.prompts.sample_tokens(n)
    }
    fn plain_prompt(&mut self, input_length: i64) -> Result<String, SynthError> {
        let ids = self.prompts.sample_tokens(input_length.max(1) as usize);
        self.tokenizer.decode(&ids)
    }
}

/// kvbust's token-exact content for hash-id traces (`--prompt-corpus coding-exact`, a kvbust
/// extension AIPerf cannot reproduce): blocks are cut, as AIPerf cuts them, from the tokens of
/// kvbust's coding corpus that are whole words (a space and ASCII letters, one token each).
/// Such tokens are each one pre-token of the tokenizer, so any run of them decodes to text that
/// re-encodes to exactly the same ids, blocks joined included: a replayed trace tokenizes back
/// to its own blocks, which is what a capture round trip needs.
pub struct ExactContent<'t> {
    corpus: TokenCorpus,
    tokenizer: &'t Tokenizer,
    rng: DerivedRng,
    seed: u64,
}

impl<'t> ExactContent<'t> {
    /// The content for `root_seed`, from `coding` (kvbust's coding corpus for that seed).
    pub fn new(
        tokenizer: &'t Tokenizer,
        coding: &[u32],
        root_seed: u64,
    ) -> Result<Self, SynthError> {
        let mut verdict: HashMap<u32, bool> = HashMap::new();
        let mut words = Vec::new();
        for &id in coding {
            let keep = match verdict.get(&id) {
                Some(k) => *k,
                None => {
                    let text = tokenizer.decode(&[id])?;
                    let letters = text.strip_prefix(' ').unwrap_or("");
                    let k = letters.len() >= 2
                        && letters.bytes().all(|b| b.is_ascii_alphabetic())
                        && tokenizer.encode(&text)? == [id];
                    verdict.insert(id, k);
                    k
                }
            };
            if keep {
                words.push(id);
            }
        }
        if words.is_empty() {
            return Err(SynthError::invalid(
                "--prompt-corpus coding-exact: this tokenizer has no single-token words to build \
                 exact blocks from; use --prompt-corpus sonnet",
            ));
        }
        let rng = DerivedRng::derive(root_seed, "kvbust.trace.exact");
        Ok(Self {
            corpus: TokenCorpus::from_parts(words, Vec::new()),
            tokenizer,
            seed: rng.seed,
            rng,
        })
    }
}

impl TraceContent for ExactContent<'_> {
    fn block_corpus(&self) -> TokenCorpus {
        self.corpus.clone()
    }
    fn corpus_seed(&self) -> u64 {
        self.seed
    }
    fn sample_tokens(&mut self, n: usize) -> Vec<u32> {
        let start = self.rng.py.randrange(self.corpus.len() as u64) as usize;
        hash_blocks::window(self.corpus.tokens(), start, n)
    }
    fn plain_prompt(&mut self, input_length: i64) -> Result<String, SynthError> {
        let ids = self.sample_tokens(input_length.max(1) as usize);
        self.tokenizer.decode(&ids)
    }
}
