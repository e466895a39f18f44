//! AIPerf 0.13.0's coding corpus (`--prompt-corpus coding`, `CodingContentGenerator`): the
//! tool pool (790 template blocks drawn from `dataset.coding_content.template`, shuffled with
//! its numpy side, joined with `"\n\n"`, tokenized once), its windows (no BPE fix-up: a prompt
//! is the decoded window, exactly as AIPerf does it) and the hash-id blocks of trace replay.
//! Owns the pool and the coding streams' draws; must never hold template text (that is
//! `assets/aiperf-coding/templates.json`, see [`interp`]), and never touch the network or the
//! clock; it reads or writes files only through the id cache of [`CodingPool::build_cached`].

mod encode;
pub mod interp;
mod pyfmt;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::synth::corpus::hash_blocks::{self, HashBlocks, LayoutError};
use crate::synth::corpus::TokenCorpus;
use crate::synth::error::SynthError;
use crate::synth::rng::{derive_seed, DerivedRng, GeneratorRngs, PyRandom};
use crate::synth::tokenizer::Tokenizer;

/// The prefix of the coding corpus's four derived streams (`.template`, `.corpus`, `.length`,
/// `.prefix`).
pub const STREAM_PREFIX: &str = "dataset.coding_content";

/// The stream the template blocks and their shuffle draw from.
pub const TEMPLATE_STREAM: &str = "dataset.coding_content.template";

/// The stream windows (and the hash-id base seed) come from.
pub const CORPUS_STREAM: &str = "dataset.coding_content.corpus";

/// What joins two blocks of the pool.
pub const SEPARATOR: &str = "\n\n";

/// FNV-1a: the keys hashed here (names, pre-tokens) are short, and SipHash would cost more
/// than the lookups save. No key comes from outside the process.
#[derive(Default)]
pub(crate) struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// A hash map with [`Fnv`] hashing.
pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Fnv>>;

fn template_error(generator: &str, e: interp::Error) -> SynthError {
    SynthError::invalid(format!(
        "coding corpus template {generator} failed: {e} (assets/aiperf-coding/templates.json \
         does not match the interpreter; regenerate it with tools/extract_aiperf_coding.py)"
    ))
}

/// The tool pool's blocks for a root seed, shuffled: `int(count × pool_scale)` blocks of each
/// generator in AIPerf's order from the template stream's Python side, then numpy's shuffle on
/// its numpy side. AIPerf's default `pool_scale` is 1.0 (790 blocks).
pub fn pool_blocks(root_seed: u64, pool_scale: f64) -> Result<Vec<String>, SynthError> {
    let DerivedRng { mut py, mut np, .. } = DerivedRng::derive(root_seed, TEMPLATE_STREAM);
    let counts = &interp::templates().tool_pool_block_counts;
    let mut blocks = Vec::new();
    let mut it = interp::Interp::new(&mut py);
    for (name, count) in counts {
        for _ in 0..(*count as f64 * pool_scale) as usize {
            blocks.push(it.generate(name).map_err(|e| template_error(name, e))?);
        }
    }
    np.shuffle(&mut blocks);
    Ok(blocks)
}

/// `tokenizer.encode(text)` for the pool's text, through [`encode::encode`]'s exact shortcut
/// where the tokenizer is eligible.
pub fn encode_large(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, SynthError> {
    encode::encode(tokenizer, text)
}

/// The id of the model's unknown token, if it has one.
fn unk_id(tokenizer: &Tokenizer) -> Option<u32> {
    let inner = tokenizer.inner();
    match inner.get_model() {
        // The common models expose it directly (serializing a large BPE model costs far more).
        tokenizers::ModelWrapper::BPE(bpe) => {
            return bpe.unk_token.as_deref().and_then(|t| inner.token_to_id(t))
        }
        tokenizers::ModelWrapper::WordPiece(wp) => return inner.token_to_id(&wp.unk_token),
        _ => {}
    }
    let model = serde_json::to_value(inner.get_model()).ok()?;
    if let Some(id) = model.get("unk_id").and_then(serde_json::Value::as_u64) {
        return u32::try_from(id).ok();
    }
    let unk = model.get("unk_token")?.as_str()?;
    tokenizer.inner().token_to_id(unk)
}

/// Rejects a pool the tokenizer could not represent: no tokens at all, or unknown-token ids
/// (the text has characters outside the vocabulary, so windows would decode to `<unk>`).
fn check_encodable(tokenizer: &Tokenizer, text: &str, ids: &[u32]) -> Result<(), SynthError> {
    if ids.is_empty() {
        return Err(SynthError::invalid(
            "the tokenizer encodes the coding corpus to no tokens at all; use a tokenizer \
             whose vocabulary covers ASCII text and code (for example the default Qwen3)",
        ));
    }
    let Some(unk) = unk_id(tokenizer) else {
        return Ok(());
    };
    let Some(first) = ids.iter().position(|&id| id == unk) else {
        return Ok(());
    };
    let count = ids.iter().filter(|&&id| id == unk).count();
    let context = tokenizer
        .decode(&ids[first.saturating_sub(8)..(first + 8).min(ids.len())])
        .unwrap_or_default();
    let missing: String = text
        .chars()
        .filter(|c| {
            let mut buf = [0u8; 4];
            tokenizer
                .encode(c.encode_utf8(&mut buf))
                .is_ok_and(|e| e.contains(&unk))
        })
        .take(8)
        .collect();
    Err(SynthError::invalid(format!(
        "the tokenizer's vocabulary cannot encode the coding corpus: {count} of {} tokens are \
         the unknown token (id {unk}), first near {context:?}; characters it lacks include \
         {missing:?}. Use a tokenizer with byte-level fallback (for example the default Qwen3) \
         or another --prompt-corpus",
        ids.len()
    )))
}

/// The coding corpus's flat token array (AIPerf's `_tool_pool`) for one root seed and tokenizer.
#[derive(Debug, Clone)]
pub struct CodingPool {
    root_seed: u64,
    tokens: TokenCorpus,
}

impl CodingPool {
    /// Generates the blocks for `root_seed`, joins them and tokenizes the text once.
    pub fn build(root_seed: u64, tokenizer: &Tokenizer) -> Result<Self, SynthError> {
        Self::build_cached(root_seed, tokenizer, None)
    }

    /// Like [`CodingPool::build`], but reuses the ids cached in `cache_dir` for the same
    /// tokenizer file and pool text (the text is always generated and hashed, so a cache
    /// entry can never serve another seed or template version), and stores them after a build.
    /// Cache problems never fail the build.
    pub fn build_cached(
        root_seed: u64,
        tokenizer: &Tokenizer,
        cache_dir: Option<&Path>,
    ) -> Result<Self, SynthError> {
        let text = pool_blocks(root_seed, 1.0)?.join(SEPARATOR);
        let path =
            cache_dir.map(|d| crate::synth::corpus::cache::path(d, tokenizer.fingerprint(), &text));
        if let Some((tokens, _)) = path.as_deref().and_then(crate::synth::corpus::cache::read) {
            return Ok(CodingPool {
                root_seed,
                tokens: TokenCorpus::from_parts(tokens, Vec::new()),
            });
        }
        let ids = encode_large(tokenizer, &text)?;
        check_encodable(tokenizer, &text, &ids)?;
        let pool = CodingPool {
            root_seed,
            tokens: TokenCorpus::from_parts(ids, Vec::new()),
        };
        if let Some(p) = &path {
            crate::synth::corpus::cache::write(p, &pool.tokens);
        }
        Ok(pool)
    }

    /// The root seed the pool was built for.
    pub fn root_seed(&self) -> u64 {
        self.root_seed
    }

    /// The flat token array as a shared corpus (a cheap handle: cloning shares the ids).
    pub fn corpus(&self) -> &TokenCorpus {
        &self.tokens
    }

    /// The flat token array.
    pub fn tokens(&self) -> &[u32] {
        self.tokens.tokens()
    }

    /// Number of tokens in the pool.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the pool is empty (never, for a built pool).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// AIPerf's window of the pool (see [`hash_blocks::window`]).
    pub fn window(&self, start: usize, n: usize) -> Vec<u32> {
        hash_blocks::window(self.tokens(), start, n)
    }

    /// `_sample_tokens(n)`: a window at `corpus.randrange(len)` (no draw for `n == 0`).
    pub fn sample(&self, corpus: &mut PyRandom, n: usize) -> Vec<u32> {
        if n == 0 || self.is_empty() {
            return Vec::new();
        }
        let start = corpus.randrange(self.len() as u64) as usize;
        self.window(start, n)
    }
}

/// Prompts from the coding corpus as AIPerf's `CodingContentGenerator` makes them: windows
/// from the `.corpus` stream, decoded without any fix-up, lengths from `.length`, prefix
/// choices from `.prefix`, hash-id blocks cached per id. This is the API trace replay calls.
pub struct CodingPrompts {
    pool: Arc<CodingPool>,
    rngs: GeneratorRngs,
    /// AIPerf's `HashIdRandomGenerator` over the `.corpus` stream's seed, with its block cache
    /// and `block_separation_token_id` (BOS, else EOS, else none).
    blocks: HashBlocks,
}

impl CodingPrompts {
    /// The generator over `pool` with the coding streams derived from the pool's root seed.
    pub fn new(pool: Arc<CodingPool>, tokenizer: &Tokenizer) -> Self {
        let root = pool.root_seed();
        CodingPrompts {
            rngs: GeneratorRngs::derive_under(root, STREAM_PREFIX),
            blocks: HashBlocks::new(
                derive_seed(root, CORPUS_STREAM),
                String::new(),
                tokenizer.bos_token_id().or(tokenizer.eos_token_id()),
            ),
            pool,
        }
    }

    /// The pool prompts come from.
    pub fn pool(&self) -> &CodingPool {
        &self.pool
    }

    /// `set_trace_id` of the hash-id generator (the trace file's identity).
    pub fn set_trace_id(&mut self, trace_id: &str) {
        self.blocks.set_trace_id(trace_id);
    }

    /// `calculate_num_tokens(mean, stddev)` on the `.length` stream.
    pub fn sample_length(&mut self, mean: f64, stddev: f64) -> usize {
        self.rngs
            .length
            .py
            .sample_positive_normal_integer(mean, stddev) as usize
    }

    /// A prefix-pool slot on the `.prefix` stream.
    pub fn prefix_choice(&mut self, pool_size: usize) -> usize {
        self.rngs.prefix.py.choice_index(pool_size)
    }

    /// `_sample_tokens(n)` on the `.corpus` stream.
    pub fn sample_tokens(&mut self, n: usize) -> Vec<u32> {
        self.pool.sample(&mut self.rngs.corpus.py, n)
    }

    /// `generate_prompt(n, prefix)`: the prefix ids, then an `n`-token window, decoded as is.
    pub fn prompt(
        &mut self,
        tokenizer: &Tokenizer,
        n: usize,
        prefix: Option<&[u32]>,
    ) -> Result<String, SynthError> {
        let body = self.sample_tokens(n);
        match prefix {
            Some(p) if !p.is_empty() => {
                let mut ids = p.to_vec();
                ids.extend_from_slice(&body);
                tokenizer.decode(&ids)
            }
            _ => tokenizer.decode(&body),
        }
    }

    /// `_build_token_sequence(num_tokens, hash_ids, block_size)`: one block per hash id
    /// (the separator token, then a window drawn from the hash id's own generator; cached, so
    /// an id always stands for the same tokens), the last block partial when the ids cover more
    /// than `num_tokens`, and any uncovered tail sampled from the `.corpus` stream.
    pub fn hash_id_tokens(
        &mut self,
        num_tokens: usize,
        hash_ids: &[u64],
        block_size: usize,
    ) -> Result<Vec<u32>, SynthError> {
        let ids = hash_ids
            .iter()
            .map(|&h| i64::try_from(h))
            .collect::<Result<Vec<i64>, _>>()
            .map_err(|_| {
                SynthError::invalid(format!(
                    "hash ids {hash_ids:?}: a hash id must be at most {} (AIPerf reads them as \
                     64-bit signed integers)",
                    i64::MAX
                ))
            })?;
        let (pool, rngs) = (&self.pool, &mut self.rngs);
        let mut tail = |n| pool.sample(&mut rngs.corpus.py, n);
        let n = i64::try_from(num_tokens).unwrap_or(i64::MAX);
        self.blocks
            .token_sequence(pool.tokens(), n, &ids, block_size, 0, &mut tail)
            .map_err(|e| match e {
                LayoutError::NotPositive => SynthError::invalid(format!(
                    "input length {num_tokens} with block size {block_size}: both must be \
                     greater than 0 (hash ids {hash_ids:?})"
                )),
                LayoutError::FinalBlock { final_size } => SynthError::invalid(format!(
                    "input length {num_tokens}, hash ids {hash_ids:?} and block size \
                     {block_size} are not compatible: the final block would hold {final_size} \
                     tokens (it must be between 1 and {block_size})"
                )),
                LayoutError::SizeConflict {
                    hash_id,
                    size,
                    first_size,
                    ..
                } => SynthError::invalid(format!(
                    "hash id {hash_id} requested at {size} tokens but already made at \
                     {first_size} tokens; a hash id must stand for one block size (a corrupt \
                     trace, or a block size that disagrees with the trace)"
                )),
            })
    }

    /// [`CodingPrompts::hash_id_tokens`] decoded (special tokens kept).
    pub fn hash_id_prompt(
        &mut self,
        tokenizer: &Tokenizer,
        num_tokens: usize,
        hash_ids: &[u64],
        block_size: usize,
    ) -> Result<String, SynthError> {
        let ids = self.hash_id_tokens(num_tokens, hash_ids, block_size)?;
        tokenizer.decode(&ids)
    }
}
