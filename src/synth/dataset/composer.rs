//! AIPerf 0.13.0's `SyntheticDatasetComposer` pipeline (§2.9 order): compensation facts, the
//! prompt generator and shared system prompt, preseed, prefix pool, conversations, then
//! user-context prompts. Owns the order of every draw; `compose` never does I/O (only the
//! `build_dataset*` conveniences read or write the corpus id cache).

use crate::synth::tokenizer::chat_template::{estimate_overheads, ChatTemplateOverheads};
use std::sync::Arc;

use crate::synth::corpus::aiperf_coding::{self, CodingPool};
use crate::synth::corpus::kvbust_coding::CodingCorpus;
use crate::synth::corpus::sonnet::SHAKESPEARE;
use crate::synth::corpus::PromptCorpus;
use crate::synth::corpus::{random, RandomCorpusStyle, RandomPools, TokenCorpus};
use crate::synth::dataset::marker::marker_token_cost;
use crate::synth::dataset::params::{SynthParams, DEFAULT_ISL};
use crate::synth::dataset::{Conversation, Dataset, Turn};
use crate::synth::error::SynthError;
use crate::synth::prompt::generator::{CorpusSource, PreseedRng, PromptGenerator};
use crate::synth::rng::uuid::uuid4;
use crate::synth::rng::GeneratorRngs;
use crate::synth::rng::{fold_seed_to_u32, DerivedRng, NumpyGenerator, PyRandom, RandomState};
use crate::synth::tokenizer::Tokenizer;

/// Conversations whose first fix-up round is computed ahead in one parallel batch.
const SPECULATION_BATCH: usize = 32;

/// Token accounting fixed before any prompt is drawn (AIPerf `_init_isl_compensation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Compensation {
    pub marker_cost: usize,
    pub marker_on_system_prompt: bool,
    pub chat_template: ChatTemplateOverheads,
    pub first_turn_adjustment: u64,
    pub subsequent_turn_adjustment: u64,
    /// The length the shared system prompt is generated with (after the marker shrink).
    pub shared_system_length: Option<usize>,
}

/// Computes the marker cost, chat-template overheads and per-turn adjustments.
pub fn compensation(
    params: &SynthParams,
    tokenizer: &Tokenizer,
) -> Result<Compensation, SynthError> {
    let target = params.cache_bust;
    let marker_cost = marker_token_cost(target, tokenizer)?;
    let has_system = params.shared_system_prompt_length.is_some() || params.system_prompt.is_some();
    let marker_on_system_prompt = target.is_system() && has_system;
    let first_turn_marker = if marker_on_system_prompt {
        0
    } else {
        marker_cost
    };
    let chat_template = if params.apply_chat_template {
        match estimate_overheads(tokenizer) {
            Ok(o) => o.unwrap_or_default(),
            Err(e) => {
                tracing::warn!("chat-template overheads not applied (AIPerf falls back to 0): {e}");
                ChatTemplateOverheads::default()
            }
        }
    } else {
        ChatTemplateOverheads::default()
    };
    let shared_system_length = params.shared_system_prompt_length.map(|s| {
        if marker_on_system_prompt {
            s.saturating_sub(marker_cost).max(1)
        } else {
            s
        }
    });
    Ok(Compensation {
        marker_cost,
        marker_on_system_prompt,
        chat_template,
        first_turn_adjustment: (chat_template.fixed + chat_template.wrap).max(0) as u64
            + first_turn_marker as u64,
        subsequent_turn_adjustment: chat_template.wrap.max(0) as u64,
        shared_system_length,
    })
}

/// Inclusive ISL/OSL bounds of a range ratio (AIPerf `RangeRatioDistribution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RatioBounds {
    pub input: (i64, i64),
    pub output: (i64, i64),
}

/// The bounds for a style; `isl`/`osl` are the means, `num_special` the tokenizer's BOS count.
pub fn ratio_bounds(
    style: RandomCorpusStyle,
    isl: u64,
    osl: u64,
    r_in: f64,
    r_out: f64,
    num_special: u64,
) -> RatioBounds {
    let (isl_f, osl_f) = (isl as f64, osl as f64);
    match style {
        RandomCorpusStyle::Vllm => {
            let adj = isl.saturating_sub(num_special) as f64;
            RatioBounds {
                input: (
                    ((adj * (1.0 - r_in)).floor() as i64).max(0),
                    (adj * (1.0 + r_in)).ceil() as i64,
                ),
                output: (
                    ((osl_f * (1.0 - r_out)).floor() as i64).max(1),
                    ((osl_f * (1.0 + r_out)).ceil() as i64).max(1),
                ),
            }
        }
        RandomCorpusStyle::Sglang => RatioBounds {
            input: (((isl_f * r_in) as i64).max(1), isl as i64),
            output: (((osl_f * r_out) as i64).max(1), osl as i64),
        },
    }
}

/// Where turn lengths come from.
enum Lengths {
    Ratio {
        bounds: RatioBounds,
        style: RandomCorpusStyle,
        num_special: i64,
        isl_cache: Vec<i64>,
        osl_cache: Vec<i64>,
        cursor: usize,
        live: NumpyGenerator,
    },
    Normal {
        isl_mean: u64,
        osl: Option<u64>,
        max_tokens_rng: Box<PyRandom>,
    },
}

impl Lengths {
    /// `(isl, max_tokens, exact_length)` for the next turn.
    fn next(&mut self, params: &SynthParams) -> (u64, Option<u64>, bool) {
        match self {
            Lengths::Ratio {
                bounds,
                style,
                num_special,
                isl_cache,
                osl_cache,
                cursor,
                live,
            } => {
                let (isl, osl) = if *cursor < isl_cache.len() {
                    *cursor += 1;
                    (isl_cache[*cursor - 1], osl_cache[*cursor - 1])
                } else {
                    let isl = live.integers(bounds.input.0, bounds.input.1 + 1);
                    let osl = live.integers(bounds.output.0, bounds.output.1 + 1);
                    let isl = match style {
                        RandomCorpusStyle::Sglang => (isl - *num_special).max(1),
                        RandomCorpusStyle::Vllm => isl,
                    };
                    (isl, osl)
                };
                let max_tokens = (osl > 0).then_some(osl as u64);
                (isl.max(0) as u64, max_tokens, true)
            }
            Lengths::Normal {
                isl_mean,
                osl,
                max_tokens_rng,
            } => {
                let max_tokens = osl.map(|m| {
                    max_tokens_rng.sample_positive_normal_integer(m as f64, params.osl_stddev)
                });
                (*isl_mean, max_tokens, false)
            }
        }
    }
}

/// Builds the dataset AIPerf 0.13.0 would build for `params` with `tokenizer`, tokenizing the
/// sonnet corpus when needed (shipped ids for the default tokenizer; otherwise built, with no
/// corpus cache: [`build_dataset_with`] takes the folder).
pub fn build_dataset(params: &SynthParams, tokenizer: &Tokenizer) -> Result<Dataset, SynthError> {
    build_dataset_with(params, tokenizer, None, &mut |_, _| {})
}

/// [`build_dataset`] with an explicit corpus cache folder (`None`: no cache) and progress
/// callback `(done, total)` per conversation.
pub fn build_dataset_with(
    params: &SynthParams,
    tokenizer: &Tokenizer,
    cache_dir: Option<&std::path::Path>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Dataset, SynthError> {
    params.validate()?;
    if params.input_file.is_some() {
        return crate::synth::dataset::trace::build_from_params(params, tokenizer, cache_dir);
    }
    let source = match (params.corpus(), params.random_seed) {
        (PromptCorpus::Sonnet, _) => Some(CorpusSource::Sonnet(TokenCorpus::build_cached(
            SHAKESPEARE,
            tokenizer,
            cache_dir,
        )?)),
        (PromptCorpus::Coding, Some(seed)) => Some(CorpusSource::Coding(Arc::new(
            CodingPool::build_cached(seed, tokenizer, cache_dir)?,
        ))),
        // Unseeded runs sample from a fixed corpus, so it is cached too.
        (PromptCorpus::CodingExact, seed) => Some(CorpusSource::Sonnet(
            CodingCorpus::for_root_seed_cached(
                crate::synth::corpus::kvbust_coding::corpus_root(seed),
                tokenizer,
                cache_dir,
            )?
            .as_token_corpus()
            .clone(),
        )),
        _ => None,
    };
    // The random corpus's piece memo (every seed's windows come from the same id cycle) is
    // cached beside the corpus id caches: read before, written after a run that had none.
    let memo_dir = cache_dir.filter(|_| params.corpus() == PromptCorpus::Random);
    let memo_loaded = memo_dir.is_some_and(|d| random::load_piece_memo(tokenizer, d));
    let dataset = compose_from(params, tokenizer, source, progress)?;
    if let Some(dir) = memo_dir.filter(|_| !memo_loaded) {
        random::save_piece_memo(tokenizer, dir);
    }
    Ok(dataset)
}

/// Builds the dataset AIPerf 0.13.0 would build for `params` and `tokenizer`. The sonnet corpus
/// must be given when `params.prompt_corpus` is sonnet (see [`TokenCorpus::build`]); for
/// coding-exact, a prebuilt [`CodingCorpus`]'s token array may be given, else it is built from
/// the root seed; for coding, `sonnet` is ignored and AIPerf's pool is built from the root seed.
/// `progress` is told after each conversation `(done, total)`.
pub fn compose(
    params: &SynthParams,
    tokenizer: &Tokenizer,
    sonnet: Option<&TokenCorpus>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Dataset, SynthError> {
    let source = sonnet.map(|s| CorpusSource::Sonnet(s.clone()));
    compose_from(params, tokenizer, source, progress)
}

/// [`compose`] with the corpus given as a prompt source: [`CorpusSource::Sonnet`] for sonnet
/// and coding-exact, [`CorpusSource::Coding`] for a prebuilt coding pool (used when it was
/// built for the same root seed), `None` to build what is needed.
pub fn compose_from(
    params: &SynthParams,
    tokenizer: &Tokenizer,
    source: Option<CorpusSource>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Dataset, SynthError> {
    check_composable(params, tokenizer)?;
    let n_conv = params.entries();
    let root_seed = params.random_seed.unwrap_or_else(rand::random);
    let num_special = tokenizer.num_special_tokens_to_add() as u64;

    // 1. Compensation facts (no draws).
    let comp = compensation(params, tokenizer)?;

    // 1b. Sequence distribution (no draws; checked before any prompt is made).
    let mut lengths = length_distribution(params, root_seed, num_special)?;

    // 1c. Prompt generator and the shared system prompt.
    let corpus = corpus_source(params, tokenizer, source, root_seed)?;
    let is_random = matches!(corpus, CorpusSource::Random(_));
    let is_coding = matches!(corpus, CorpusSource::Coding(_));
    // The coding pool draws on its own `dataset.coding_content.*` streams.
    let rngs = if is_coding {
        GeneratorRngs::derive_under(root_seed, aiperf_coding::STREAM_PREFIX)
    } else {
        GeneratorRngs::derive(root_seed)
    };
    let mut gen = PromptGenerator::new(tokenizer, corpus, rngs);
    let shared_system = match comp.shared_system_length {
        Some(len) => Some(gen.generate_prompt(len, None)?),
        None => None,
    };

    // 2. Preseed (random corpus with a range ratio).
    if is_random {
        preseed(&mut lengths, &mut gen, n_conv, root_seed, tokenizer);
    }

    // 3. Prefix pool.
    let prefix_pool = if params.prefix_pool_enabled() {
        build_prefix_pool(params, tokenizer, &mut gen, is_coding, is_random)?
    } else {
        Vec::new()
    };

    // 4. Conversations.
    let mut conversations = Composer {
        params,
        comp: &comp,
        lengths: &mut lengths,
        prefix_pool: &prefix_pool,
    }
    .conversations(&mut gen, root_seed, is_random, progress)?;

    // 5. Finalize: system messages, then user-context prompts in session order.
    let system_message = params.system_prompt.clone().or(shared_system);
    for conv in &mut conversations {
        conv.system_message = system_message.clone();
    }
    if let Some(len) = params.user_context_prompt_length {
        for conv in &mut conversations {
            conv.user_context_message = Some(gen.generate_prompt(len, None)?);
        }
    }
    Ok(Dataset { conversations })
}

/// Refuses what `compose` cannot build: invalid parameters, a trace, an empty vocabulary.
fn check_composable(params: &SynthParams, tokenizer: &Tokenizer) -> Result<(), SynthError> {
    params.validate()?;
    if params.input_file.is_some() {
        return Err(SynthError::invalid(
            "compose builds synthetic datasets; build a trace with build_dataset or synth::dataset::trace",
        ));
    }
    if tokenizer.vocab_size() == 0 {
        return Err(SynthError::invalid("the tokenizer has an empty vocabulary"));
    }
    Ok(())
}

/// The input/output length distribution: the range ratio's bounds when `--random-range-ratio`,
/// `--isl` and `--osl` are all given (refusing bounds that allow an empty input), else normal
/// lengths around `--isl`.
fn length_distribution(
    params: &SynthParams,
    root_seed: u64,
    num_special: u64,
) -> Result<Lengths, SynthError> {
    let (Some(r), Some(isl), Some(osl)) = (params.range_ratio, params.isl, params.osl) else {
        let mut isl_mean = params.isl.unwrap_or(DEFAULT_ISL);
        if isl_mean > 0 {
            isl_mean = isl_mean.saturating_sub(num_special);
        }
        return Ok(Lengths::Normal {
            isl_mean,
            osl: params.osl,
            max_tokens_rng: Box::new(DerivedRng::derive(root_seed, "composer.turn.max_tokens").py),
        });
    };
    let bounds = ratio_bounds(
        params.random_corpus_style,
        isl,
        osl,
        r.input,
        r.output,
        num_special,
    );
    if params.random_corpus_style == RandomCorpusStyle::Vllm {
        let prefix = if params.prefix_pool_enabled() {
            params.prefix_prompt_length as i64
        } else {
            0
        };
        if prefix + bounds.input.0 < 1 {
            return Err(SynthError::invalid(format!(
                "--random-range-ratio {} with --isl {isl} produces a minimum input of {} \
                 tokens; raise --isl or lower the ratio",
                r.input, bounds.input.0
            )));
        }
    }
    Ok(Lengths::Ratio {
        bounds,
        style: params.random_corpus_style,
        num_special: num_special as i64,
        isl_cache: Vec::new(),
        osl_cache: Vec::new(),
        cursor: 0,
        live: DerivedRng::derive(root_seed, "models.range_ratio.distribution").np,
    })
}

/// The prompt source for `--prompt-corpus`: `source` when it fits, else built here.
fn corpus_source(
    params: &SynthParams,
    tokenizer: &Tokenizer,
    source: Option<CorpusSource>,
    root_seed: u64,
) -> Result<CorpusSource, SynthError> {
    Ok(match (params.corpus(), source) {
        (PromptCorpus::Sonnet, Some(s @ CorpusSource::Sonnet(_))) => s,
        (PromptCorpus::Sonnet, _) => {
            return Err(SynthError::invalid("the sonnet corpus was not provided"))
        }
        (PromptCorpus::Random, _) => {
            CorpusSource::Random(RandomPools::new(tokenizer, params.random_corpus_style))
        }
        // AIPerf's coding pool: windows decoded as is, on the `dataset.coding_content.*` streams.
        (PromptCorpus::Coding, Some(CorpusSource::Coding(p))) if p.root_seed() == root_seed => {
            CorpusSource::Coding(p)
        }
        (PromptCorpus::Coding, _) => {
            CorpusSource::Coding(Arc::new(CodingPool::build(root_seed, tokenizer)?))
        }
        // kvbust's own coding corpus, served by the sonnet path (windows + fix-up).
        (PromptCorpus::CodingExact, Some(s @ CorpusSource::Sonnet(_))) => s,
        (PromptCorpus::CodingExact, _) => CorpusSource::Sonnet(
            CodingCorpus::for_root_seed(root_seed, tokenizer)?
                .as_token_corpus()
                .clone(),
        ),
    })
}

/// The random corpus's preseed with a range ratio: every conversation's input and output
/// length, then its corpus offset, drawn up front from the tool's own generator, which the
/// prompt generator then continues. Nothing to do with normal lengths.
fn preseed(
    lengths: &mut Lengths,
    gen: &mut PromptGenerator<&Tokenizer>,
    n_conv: usize,
    root_seed: u64,
    tokenizer: &Tokenizer,
) {
    let Lengths::Ratio {
        bounds,
        style,
        num_special,
        isl_cache,
        osl_cache,
        ..
    } = lengths
    else {
        return;
    };
    let mut g = match style {
        RandomCorpusStyle::Vllm => PreseedRng::Pcg(NumpyGenerator::new(u128::from(root_seed))),
        RandomCorpusStyle::Sglang => {
            PreseedRng::Legacy(Box::new(RandomState::new(fold_seed_to_u32(root_seed))))
        }
    };
    *isl_cache = (0..n_conv)
        .map(|_| g.integers(bounds.input.0, bounds.input.1 + 1))
        .map(|v| match style {
            RandomCorpusStyle::Sglang => (v - *num_special).max(1),
            RandomCorpusStyle::Vllm => v,
        })
        .collect();
    *osl_cache = (0..n_conv)
        .map(|_| g.integers(bounds.output.0, bounds.output.1 + 1))
        .collect();
    let vocab = tokenizer.vocab_size() as i64;
    let offsets = (0..n_conv).map(|_| g.integers(0, vocab)).collect();
    gen.set_preseed(g, offsets);
}

/// The `--num-prefix-prompts` prefixes of `--prefix-prompt-length` tokens each.
fn build_prefix_pool(
    params: &SynthParams,
    tokenizer: &Tokenizer,
    gen: &mut PromptGenerator<&Tokenizer>,
    is_coding: bool,
    is_random: bool,
) -> Result<Vec<Vec<u32>>, SynthError> {
    let len = params.prefix_prompt_length;
    let mut pool = Vec::with_capacity(params.num_prefix_prompts);
    for _ in 0..params.num_prefix_prompts {
        if is_coding {
            // AIPerf's coding generator keeps the raw window ids (built in its constructor,
            // before the shared system prompt; the two are never combined).
            pool.push(gen.sample_pieces(len).tokens);
            continue;
        }
        let tokens = if is_random {
            gen.random_prefix_tokens(len)
        } else {
            gen.sample_pieces(len)
        };
        let text = gen.decode_to_exact_len(tokens, len)?;
        pool.push(tokenizer.encode(&text)?);
    }
    Ok(pool)
}

/// What every conversation's turns are made from.
struct Composer<'a> {
    params: &'a SynthParams,
    comp: &'a Compensation,
    lengths: &'a mut Lengths,
    prefix_pool: &'a [Vec<u32>],
}

impl Composer<'_> {
    /// Every conversation in session order, telling `progress` after each.
    fn conversations(
        &mut self,
        gen: &mut PromptGenerator<&Tokenizer>,
        root_seed: u64,
        is_random: bool,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<Conversation>, SynthError> {
        let n_conv = self.params.entries();
        let seeded = self.params.random_seed.is_some();
        let turn_rng = DerivedRng::derive(root_seed, "composer.conversation.turn_count");
        let mut turn_rng = turn_rng.py;
        let mut conversations = Vec::with_capacity(n_conv);
        // Random corpus, preseeded, single-turn, no prefix: every body is known in advance (the
        // request index, the cached offset and length), so round one of the fix-up loop is
        // computed ahead in parallel, a batch at a time.
        let speculate = is_random
            && self.prefix_pool.is_empty()
            && self.params.session_turns_mean == 1.0
            && self.params.session_turns_stddev <= 0.0;
        let first_index = gen.request_index();
        for i in 0..n_conv {
            if speculate && i % SPECULATION_BATCH == 0 {
                self.speculate(gen, i, n_conv, first_index)?;
            }
            let session_id = if seeded {
                format!("session_{i:06}")
            } else {
                uuid4()
            };
            let num_turns = turn_rng.sample_positive_normal_integer(
                self.params.session_turns_mean,
                self.params.session_turns_stddev,
            ) as usize;
            conversations.push(Conversation {
                session_id,
                system_message: None,
                user_context_message: None,
                turns: self.conversation(gen, num_turns)?,
                agentic: None,
            });
            progress(i + 1, n_conv);
        }
        Ok(conversations)
    }

    /// Computes round one of the fix-up loop for the batch of conversations from `i` ahead, in
    /// parallel (only called when every body is known in advance).
    fn speculate(
        &self,
        gen: &mut PromptGenerator<&Tokenizer>,
        i: usize,
        n_conv: usize,
        first_index: u64,
    ) -> Result<(), SynthError> {
        let Lengths::Ratio { isl_cache, .. } = &*self.lengths else {
            return Ok(());
        };
        let offsets = gen.remaining_offsets().to_vec();
        let batch: Vec<Vec<u32>> = (i..(i + SPECULATION_BATCH).min(n_conv))
            .filter_map(|c| {
                let isl = (*isl_cache.get(c)?).max(0) as u64;
                let len = isl.saturating_sub(self.comp.first_turn_adjustment).max(1) as usize;
                let offset = *offsets.get(c - i)?;
                gen.random_body(offset, first_index + c as u64, len)
            })
            .collect();
        gen.prefetch_reencodes(batch)
    }

    /// One conversation's `num_turns` turns; the first takes a prefix when there is a pool.
    fn conversation(
        &mut self,
        gen: &mut PromptGenerator<&Tokenizer>,
        num_turns: usize,
    ) -> Result<Vec<Turn>, SynthError> {
        let mut turns = Vec::with_capacity(num_turns);
        for t in 0..num_turns {
            let (isl, max_tokens, exact) = self.lengths.next(self.params);
            let with_prefix = t == 0 && !self.prefix_pool.is_empty();
            let adjustment = if t == 0 {
                self.comp.first_turn_adjustment
            } else {
                self.comp.subsequent_turn_adjustment
            };
            let floor = if with_prefix { 0 } else { 1 };
            let isl = isl.saturating_sub(adjustment).max(floor);
            let prefix = if with_prefix {
                let k = gen.prefix_choice(self.prefix_pool.len());
                Some(self.prefix_pool[k].as_slice())
            } else {
                None
            };
            let body_len = if exact {
                isl as usize
            } else {
                gen.sample_length(isl as f64, self.params.isl_stddev)
            };
            let text = gen.generate_prompt(body_len, prefix)?;
            turns.push(Turn {
                text,
                max_tokens,
                ..Turn::default()
            });
        }
        Ok(turns)
    }
}
