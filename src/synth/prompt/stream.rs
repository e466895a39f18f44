//! A long-lived source of fresh N-token prompts from a corpus (for the proxy's
//! `{{kvbust:prompt:N}}` placeholders), drawing exactly as AIPerf's prompt generator does.
//! Owns that generator's state; must never block on I/O.

use std::sync::Arc;

use crate::synth::corpus::aiperf_coding::{self, CodingPool};
use crate::synth::corpus::kvbust_coding::CodingCorpus;
use crate::synth::corpus::PromptCorpus;
use crate::synth::corpus::{RandomCorpusStyle, RandomPools, TokenCorpus};
use crate::synth::error::SynthError;
use crate::synth::prompt::generator::{CorpusSource, PromptGenerator};
use crate::synth::rng::GeneratorRngs;
use crate::synth::tokenizer::Tokenizer;

/// Successive prompts of requested lengths; with the same root seed, the n-th prompt equals the
/// n-th `generate_prompt` of AIPerf's generator under that seed.
pub struct PromptStream {
    gen: PromptGenerator<Arc<Tokenizer>>,
}

impl PromptStream {
    /// A stream over `corpus` (the sonnet corpus must be given for `PromptCorpus::Sonnet`; for
    /// `PromptCorpus::CodingExact` a built [`CodingCorpus`]'s token array may be, else one is
    /// built; AIPerf's coding pool is built here, through the id cache in `cache_dir` if any);
    /// `seed` None draws a random root seed.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        corpus: PromptCorpus,
        style: RandomCorpusStyle,
        sonnet: Option<TokenCorpus>,
        seed: Option<u64>,
        cache_dir: Option<&std::path::Path>,
    ) -> Result<Self, SynthError> {
        let root = seed.unwrap_or_else(rand::random);
        let source = match corpus {
            PromptCorpus::Sonnet => CorpusSource::Sonnet(sonnet.ok_or_else(|| {
                SynthError::invalid("a sonnet prompt stream needs the sonnet corpus")
            })?),
            PromptCorpus::Random => CorpusSource::Random(RandomPools::new(&tokenizer, style)),
            PromptCorpus::Coding => CorpusSource::Coding(std::sync::Arc::new(
                CodingPool::build_cached(root, &tokenizer, cache_dir)?,
            )),
            // kvbust's coding corpus (pass its token array as `sonnet` to reuse a built one).
            PromptCorpus::CodingExact => CorpusSource::Sonnet(match sonnet {
                Some(c) => c,
                None => CodingCorpus::for_root_seed(root, &tokenizer)?
                    .as_token_corpus()
                    .clone(),
            }),
        };
        let rngs = match corpus {
            PromptCorpus::Coding => GeneratorRngs::derive_under(root, aiperf_coding::STREAM_PREFIX),
            _ => GeneratorRngs::derive(root),
        };
        Ok(PromptStream {
            gen: PromptGenerator::new(tokenizer, source, rngs),
        })
    }

    /// The next prompt: re-encoding to exactly `num_tokens` tokens, except for AIPerf's coding
    /// corpus, whose prompt is the decoded `num_tokens`-token window (empty for 0).
    pub fn prompt(&mut self, num_tokens: usize) -> Result<String, SynthError> {
        if num_tokens == 0 {
            return Ok(String::new());
        }
        self.gen.generate_prompt(num_tokens, None)
    }
}
