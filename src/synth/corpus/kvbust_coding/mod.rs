//! kvbust's own agentic-coding prompt corpus (`--prompt-corpus coding-exact`): seeded generators of
//! code, ML code and configs, shell sessions and logs, JSON payloads, errors, SQL, diffs/configs/
//! docs/test output and user requests, in a fixed mix by block count; the blocks are shuffled,
//! joined with blank lines and tokenized once into a flat token array that prompts are cut from
//! exactly like the sonnet corpus (window with wrap, then the BPE fix-up loop, so every prompt
//! re-encodes to exactly the requested length). Owns the mix, block assembly and the token
//! array; must never touch the network, the clock or OS entropy, never read or write files other
//! than the id cache of [`CodingCorpus::build_cached`], and never port AIPerf's templates or text.
//!
//! Mix contract: the share of each [`Category`] is by **block count** ([`Category::share`] of
//! [`BLOCK_COUNT`] blocks, exact per seed). Token shares differ (code blocks are longer than user
//! prompts); [`CodingCorpus::stats`] reports both. Measured with Qwen3: 3600 distinct blocks,
//! about 1.16M tokens (token shares: code 32%, ML 14%, shell 27%, JSON 9%, errors 7%, SQL 1.5%,
//! other 7%, user prompts 3%).

/// `writeln!` into a `String`, which cannot fail.
macro_rules! w {
    ($s:expr) => {
        $s.push('\n')
    };
    ($s:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        // Writing into a String never returns an error.
        let _ = writeln!($s, $($arg)*);
    }};
}

mod code;
mod draw;
mod errors;
mod json;
mod ml;
mod other;
mod prompts;
mod shell;
mod sql;
mod vocab;

use std::collections::HashSet;
use std::path::Path;

use rand::Rng;
use rayon::prelude::*;

use crate::synth::corpus::cache;
use crate::synth::corpus::TokenCorpus;
use crate::synth::error::SynthError;
use crate::synth::rng::derive_seed;
use crate::synth::tokenizer::reencode::Pieces;
use crate::synth::tokenizer::Tokenizer;

use draw::{sub_seed, Draw};

/// Blocks in one corpus.
pub const BLOCK_COUNT: usize = 3600;

/// What joins two blocks.
pub const SEPARATOR: &str = "\n\n";

/// Blocks are tokenized in this many consecutive groups (in parallel), each but the last ending
/// with its trailing separator; a fixed number so that the recorded group joins do not depend on
/// the machine. With Qwen3's and Llama-3's pre-tokenizers a group boundary (right after a blank
/// line, before a non-blank character) is always a pre-token boundary, so the result equals
/// encoding the whole text at once.
pub const TOKENIZE_GROUPS: usize = 32;

/// The derived-stream name that turns a dataset's root seed into the coding corpus's seed.
pub const SEED_STREAM: &str = "dataset.coding_content.template";

/// The root seed whose corpus an unseeded run samples from. Its sampling is random all the
/// same; a fixed corpus lets the tokenized corpus (about 5 s to build) be cached, as a seeded
/// run's is.
pub const UNSEEDED_CORPUS_ROOT: u64 = 0;

/// The root seed of the corpus for a run seeded with `seed` (or not).
pub fn corpus_root(seed: Option<u64>) -> u64 {
    seed.unwrap_or(UNSEEDED_CORPUS_ROOT)
}

/// A kind of content in the coding corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// Python, Go, Rust and TypeScript: functions, types, modules and tests.
    Code,
    /// Training loops, inference servers, data/tokenizer code, YAML/JSON training configs.
    Ml,
    /// Shell sessions with output, training logs, CI logs, `pip install` output.
    Shell,
    /// API requests/responses, tool calls, REST resources, error bodies, webhooks.
    Json,
    /// Python tracebacks, CUDA OOM and NCCL errors, Rust compiler errors, Go panics.
    Error,
    /// DDL, queries, upserts, `EXPLAIN` output.
    Sql,
    /// Git diffs/logs, TOML/Dockerfile/Kubernetes configs, markdown docs, test-runner output.
    Other,
    /// Agentic-coding requests and short multi-turn exchanges.
    UserPrompt,
}

impl Category {
    /// Every category, in generation order.
    pub const ALL: [Category; 8] = [
        Category::Code,
        Category::Ml,
        Category::Shell,
        Category::Json,
        Category::Error,
        Category::Sql,
        Category::Other,
        Category::UserPrompt,
    ];

    /// Target share of the corpus's blocks (the shares add up to 1).
    pub fn share(self) -> f64 {
        match self {
            Category::Code => 0.28,
            Category::Ml => 0.11,
            Category::Shell => 0.20,
            Category::Json => 0.11,
            Category::Error => 0.09,
            Category::Sql => 0.03,
            Category::Other => 0.10,
            Category::UserPrompt => 0.08,
        }
    }

    /// Short lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Code => "code",
            Category::Ml => "ml",
            Category::Shell => "shell",
            Category::Json => "json",
            Category::Error => "error",
            Category::Sql => "sql",
            Category::Other => "other",
            Category::UserPrompt => "user_prompt",
        }
    }

    /// How many of the [`BLOCK_COUNT`] blocks are of this category.
    pub fn block_count(self) -> usize {
        (self.share() * BLOCK_COUNT as f64).round() as usize
    }

    fn generate(self, d: &mut Draw) -> String {
        match self {
            Category::Code => code::block(d),
            Category::Ml => ml::block(d),
            Category::Shell => shell::block(d),
            Category::Json => json::block(d),
            Category::Error => errors::block(d),
            Category::Sql => sql::block(d),
            Category::Other => other::block(d),
            Category::UserPrompt => prompts::block(d),
        }
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One generated piece of content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub category: Category,
    /// Never empty; starts and ends with a non-whitespace character.
    pub text: String,
}

/// The corpus's blocks for `seed`, already shuffled: the same seed always gives the same blocks
/// in the same order. Each block draws from its own PRNG stream, so generation runs in parallel.
pub fn blocks(seed: u64) -> Vec<Block> {
    let plan: Vec<Category> = Category::ALL
        .iter()
        .flat_map(|&c| std::iter::repeat_n(c, c.block_count()))
        .collect();
    let mut out: Vec<Block> = plan
        .par_iter()
        .enumerate()
        .map(|(i, &category)| {
            let mut d = Draw::new(sub_seed(seed, 1, i as u64));
            let text = category.generate(&mut d);
            let text = text.trim();
            let text = if text.is_empty() {
                category.as_str().to_owned()
            } else {
                text.to_owned()
            };
            Block { category, text }
        })
        .collect();
    Draw::new(sub_seed(seed, 2, 0)).shuffle(&mut out);
    out
}

/// The corpus text: the blocks joined with [`SEPARATOR`].
pub fn corpus_text(blocks: &[Block]) -> String {
    let mut out = String::with_capacity(blocks.iter().map(|b| b.text.len() + 2).sum());
    for (i, b) in blocks.iter().enumerate() {
        if i > 0 {
            out.push_str(SEPARATOR);
        }
        out.push_str(&b.text);
    }
    out
}

/// Figures about one built corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct CorpusStats {
    pub blocks: usize,
    /// The number of different block texts.
    pub distinct_blocks: usize,
    pub bytes: usize,
    pub tokens: usize,
    /// Per category: (blocks, tokens of its blocks' texts encoded alone).
    pub per_category: Vec<(Category, usize, usize)>,
}

/// The coding corpus's flat token array for one seed and tokenizer.
#[derive(Debug, Clone)]
pub struct CodingCorpus {
    seed: u64,
    corpus: TokenCorpus,
    blocks: Vec<Block>,
}

impl CodingCorpus {
    /// Generates the blocks for `seed`, joins them and tokenizes the text once (in groups split
    /// right after a separator, in parallel; the group starts are recorded as joins).
    pub fn build(seed: u64, tokenizer: &Tokenizer) -> Result<Self, SynthError> {
        Self::from_blocks(seed, blocks(seed), tokenizer)
    }

    /// The corpus for a dataset's root seed (the seed comes from the [`SEED_STREAM`] stream).
    pub fn for_root_seed(root_seed: u64, tokenizer: &Tokenizer) -> Result<Self, SynthError> {
        Self::build(derive_seed(root_seed, SEED_STREAM), tokenizer)
    }

    /// Like [`CodingCorpus::build`], but reuses the token array cached in `cache_dir` for the
    /// same tokenizer file and corpus text, and stores it there after a build. Cache problems
    /// never fail the build.
    pub fn build_cached(
        seed: u64,
        tokenizer: &Tokenizer,
        cache_dir: Option<&Path>,
    ) -> Result<Self, SynthError> {
        let blocks = blocks(seed);
        let Some(dir) = cache_dir else {
            return Self::from_blocks(seed, blocks, tokenizer);
        };
        let path = cache::path(dir, tokenizer.fingerprint(), &corpus_text(&blocks));
        if let Some((tokens, joins)) = cache::read(&path) {
            return Ok(CodingCorpus {
                seed,
                corpus: TokenCorpus::from_parts(tokens, joins),
                blocks,
            });
        }
        let corpus = Self::from_blocks(seed, blocks, tokenizer)?;
        cache::write(&path, &corpus.corpus);
        Ok(corpus)
    }

    /// [`CodingCorpus::for_root_seed`] through the cache of [`CodingCorpus::build_cached`].
    pub fn for_root_seed_cached(
        root_seed: u64,
        tokenizer: &Tokenizer,
        cache_dir: Option<&Path>,
    ) -> Result<Self, SynthError> {
        Self::build_cached(derive_seed(root_seed, SEED_STREAM), tokenizer, cache_dir)
    }

    fn from_blocks(
        seed: u64,
        blocks: Vec<Block>,
        tokenizer: &Tokenizer,
    ) -> Result<Self, SynthError> {
        let per_group = blocks.len().div_ceil(TOKENIZE_GROUPS).max(1);
        let groups: Vec<String> = blocks
            .chunks(per_group)
            .enumerate()
            .map(|(g, chunk)| {
                let mut text = corpus_text(chunk);
                if (g + 1) * per_group < blocks.len() {
                    text.push_str(SEPARATOR);
                }
                text
            })
            .collect();
        let encoded = tokenizer.encode_batch(groups)?;
        let mut tokens = Vec::with_capacity(encoded.iter().map(Vec::len).sum());
        let mut joins = Vec::with_capacity(encoded.len());
        for ids in encoded {
            if !tokens.is_empty() {
                joins.push(tokens.len());
            }
            tokens.extend_from_slice(&ids);
        }
        Ok(CodingCorpus {
            seed,
            corpus: TokenCorpus::from_parts(tokens, joins),
            blocks,
        })
    }

    /// The seed the blocks were generated from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The shuffled blocks the token array was built from.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The flat token array.
    pub fn tokens(&self) -> &[u32] {
        self.corpus.tokens()
    }

    /// Token indices where tokenization groups 1, 2, … begin.
    pub fn joins(&self) -> &[usize] {
        self.corpus.joins()
    }

    /// Number of tokens in the pool.
    pub fn len(&self) -> usize {
        self.corpus.len()
    }

    /// Whether the pool is empty (never, for a built corpus).
    pub fn is_empty(&self) -> bool {
        self.corpus.is_empty()
    }

    /// The token array (with its group joins) in the sonnet corpus's shape, so the sonnet
    /// sampling path, its fix-up loop and its local re-encode serve it.
    pub fn as_token_corpus(&self) -> &TokenCorpus {
        &self.corpus
    }

    /// The `n`-token window starting at `start` (taken modulo the pool size), wrapping past
    /// the end, with the joins it contains; capped at the pool size.
    pub fn window(&self, start: usize, n: usize) -> Pieces {
        if self.corpus.is_empty() {
            return Pieces::default();
        }
        self.corpus.window(start % self.corpus.len(), n)
    }

    /// The prompt at `start`: the `n`-token window there, through the BPE fix-up loop (top-ups
    /// are further windows drawn from a stream seeded by the corpus seed and `start`), so the
    /// text re-encodes to exactly `n` tokens. Deterministic in `(corpus, start, n)`.
    pub fn prompt_at(
        &self,
        tokenizer: &Tokenizer,
        start: usize,
        n: usize,
    ) -> Result<String, SynthError> {
        if n == 0 {
            return Ok(String::new());
        }
        let mut gen = self.generator(tokenizer, sub_seed(self.seed, 3, start as u64));
        gen.decode_to_exact_len(self.window(start, n), n)
    }

    /// A prompt of exactly `n` tokens at a window start drawn from `rng`.
    pub fn prompt<R: Rng + ?Sized>(
        &self,
        tokenizer: &Tokenizer,
        rng: &mut R,
        n: usize,
    ) -> Result<String, SynthError> {
        let start = rng.random_range(0..self.len().max(1));
        self.prompt_at(tokenizer, start, n)
    }

    /// Block, distinct-block, byte and token counts, per category too (each category's tokens
    /// are counted by encoding its blocks alone, so they add up to about the pool size).
    pub fn stats(&self, tokenizer: &Tokenizer) -> Result<CorpusStats, SynthError> {
        let texts: Vec<String> = self.blocks.iter().map(|b| b.text.clone()).collect();
        let lens = tokenizer.encode_batch(texts)?;
        let per_category = Category::ALL
            .iter()
            .map(|&c| {
                let (n, t) = self
                    .blocks
                    .iter()
                    .zip(&lens)
                    .filter(|(b, _)| b.category == c)
                    .fold((0, 0), |(n, t), (_, ids)| (n + 1, t + ids.len()));
                (c, n, t)
            })
            .collect();
        Ok(CorpusStats {
            blocks: self.blocks.len(),
            distinct_blocks: distinct(&self.blocks),
            bytes: self.blocks.iter().map(|b| b.text.len()).sum::<usize>()
                + SEPARATOR.len() * self.blocks.len().saturating_sub(1),
            tokens: self.len(),
            per_category,
        })
    }
}

/// Number of different block texts.
pub fn distinct(blocks: &[Block]) -> usize {
    blocks
        .iter()
        .map(|b| b.text.as_str())
        .collect::<HashSet<_>>()
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up() {
        let total: usize = Category::ALL.iter().map(|c| c.block_count()).sum();
        assert_eq!(total, BLOCK_COUNT);
        let share: f64 = Category::ALL.iter().map(|c| c.share()).sum();
        assert!((share - 1.0).abs() < 1e-9);
    }

    #[test]
    fn blocks_are_trimmed_and_nonempty() {
        for b in blocks(3) {
            assert!(!b.text.is_empty());
            assert_eq!(b.text.trim(), b.text);
        }
    }
}
