//! AIPerf 0.13.0's hash-id blocks: `HashIdRandomGenerator` (one CPython generator re-seeded
//! per `(base seed, trace file, hash id)`), `sample_tokens_from_corpus` with the block
//! separator, one block cache per dataset, and `_build_token_sequence`'s three layouts.
//! Owns block content and its cache; must never draw from any other stream than the one
//! passed in for tails.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::synth::rng::PyRandom;

/// `int.from_bytes(sha256(f"{base}:{trace_id}:{hash_id}")[:8], "big")`.
pub fn hash_id_seed(base_seed: u64, trace_id: &str, hash_id: i64) -> u64 {
    let digest = Sha256::digest(format!("{base_seed}:{trace_id}:{hash_id}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The per-file scope AIPerf gives hash ids: the first 16 hex digits of the file's sha256.
pub fn trace_id(file_bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(file_bytes))[..16].to_owned()
}

/// AIPerf's window `corpus[start:start+n]`, and when that runs past the end `corpus[:start+n-len]`
/// appended once (so a window longer than the corpus is not repeated further, exactly as
/// AIPerf slices); `start` is taken modulo the corpus length.
pub fn window(corpus: &[u32], start: usize, n: usize) -> Vec<u32> {
    let len = corpus.len();
    if len == 0 || n == 0 {
        return Vec::new();
    }
    let start = start % len;
    let end = start + n;
    let mut out = Vec::with_capacity(n.min(2 * len));
    out.extend_from_slice(&corpus[start..end.min(len)]);
    if end > len {
        out.extend_from_slice(&corpus[..(end - len).min(len)]);
    }
    out
}

/// `sample_tokens_from_corpus(corpus, n, rng, sep)`: the separator (taking one slot), then a
/// [`window`] at `rng.randrange(len(corpus))`.
fn sample_block(corpus: &[u32], n: usize, rng: &mut PyRandom, sep: Option<u32>) -> Vec<u32> {
    let mut out = Vec::with_capacity(n);
    let mut n = n;
    if let Some(s) = sep {
        out.push(s);
        n = n.saturating_sub(1);
    }
    if corpus.is_empty() {
        return out;
    }
    let start = rng.randrange(corpus.len() as u64) as usize;
    out.extend(window(corpus, start, n));
    out
}

/// Why a token sequence cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutError {
    /// `input_length <= 0` (or block size 0).
    NotPositive,
    /// The last block would hold `final_size` tokens, outside `1..=block_size`.
    FinalBlock { final_size: i64 },
    /// The hash id was built at another size before (on `first_line`).
    SizeConflict {
        hash_id: i64,
        size: usize,
        first_size: usize,
        first_line: usize,
    },
}

/// Block tokens [`HashBlocks`] keeps for reuse: a block is a pure function of its seed, so
/// one dropped is drawn again, identical, when next needed. 4M tokens is 16 MB of ids; without
/// a bound a trace of a million distinct 512-token blocks held 2 GB.
const CACHED_TOKENS: usize = 4 << 20;

/// The block cache of one dataset.
pub struct HashBlocks {
    base_seed: u64,
    trace_id: String,
    separator: Option<u32>,
    /// hash id → (size, line that built it): kept for every id, for AIPerf's size check.
    sizes: HashMap<i64, (usize, usize)>,
    /// hash id → tokens, for the ids seen lately (at most [`CACHED_TOKENS`] in all).
    cache: HashMap<i64, Vec<u32>>,
    cached_tokens: usize,
    /// Whether a dropped block can be drawn again: not once [`Self::set_trace_id`] changed
    /// the scope, since the blocks cached before keep the old one.
    evictable: bool,
}

impl HashBlocks {
    /// Blocks seeded from `base_seed` (the corpus stream's seed) for the file `trace_id`;
    /// `separator` starts every block (AIPerf: BOS, else EOS; `None` for the extension).
    pub fn new(base_seed: u64, trace_id: String, separator: Option<u32>) -> Self {
        HashBlocks {
            base_seed,
            trace_id,
            separator,
            sizes: HashMap::new(),
            cache: HashMap::new(),
            cached_tokens: 0,
            evictable: true,
        }
    }

    /// `set_trace_id`: scopes the hash ids that are not cached yet to another trace file.
    pub fn set_trace_id(&mut self, trace_id: &str) {
        if trace_id != self.trace_id && !self.cache.is_empty() {
            self.evictable = false;
        }
        trace_id.clone_into(&mut self.trace_id);
    }

    /// `_build_token_sequence(num_tokens, hash_ids, block_size)`: exact tile, last block
    /// partial, or prefix only with a tail from `tail(n)` (all tail when `hash_ids` is empty).
    pub fn token_sequence(
        &mut self,
        corpus: &[u32],
        num_tokens: i64,
        hash_ids: &[i64],
        block_size: usize,
        line: usize,
        tail: &mut dyn FnMut(usize) -> Vec<u32>,
    ) -> Result<Vec<u32>, LayoutError> {
        if num_tokens <= 0 || block_size == 0 {
            return Err(LayoutError::NotPositive);
        }
        let m = hash_ids.len() as i64;
        let bs = block_size as i64;
        let final_size = if m * bs > num_tokens {
            let f = num_tokens - (m - 1) * bs;
            if f <= 0 || f > bs {
                return Err(LayoutError::FinalBlock { final_size: f });
            }
            f as usize
        } else {
            block_size
        };
        let mut out = Vec::with_capacity(num_tokens as usize);
        for (i, &h) in hash_ids.iter().enumerate() {
            let size = if i + 1 == hash_ids.len() {
                final_size
            } else {
                block_size
            };
            match self.sizes.get(&h) {
                Some(&(first_size, first_line)) if first_size != size => {
                    return Err(LayoutError::SizeConflict {
                        hash_id: h,
                        size,
                        first_size,
                        first_line,
                    })
                }
                Some(_) => {}
                None => {
                    self.sizes.insert(h, (size, line));
                }
            }
            match self.cache.get(&h) {
                Some(b) => out.extend_from_slice(b),
                None => {
                    let mut rng = PyRandom::new(hash_id_seed(self.base_seed, &self.trace_id, h));
                    let b = sample_block(corpus, size, &mut rng, self.separator);
                    out.extend_from_slice(&b);
                    if self.evictable && self.cached_tokens + b.len() > CACHED_TOKENS {
                        self.cache.clear();
                        self.cached_tokens = 0;
                    }
                    self.cached_tokens += b.len();
                    self.cache.insert(h, b);
                }
            }
        }
        let have = out.len() as i64;
        if num_tokens > have {
            out.extend(tail((num_tokens - have) as usize));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Vec<u32> {
        (0..1000).collect()
    }

    #[test]
    fn layouts_and_cache() {
        let c = corpus();
        let mut b = HashBlocks::new(7, "abc".into(), Some(9999));
        let mut no_tail = |_: usize| -> Vec<u32> { panic!("no tail expected") };
        // Exact tile: 2 blocks of 4, each starting with the separator.
        let s = b
            .token_sequence(&c, 8, &[1, 2], 4, 1, &mut no_tail)
            .unwrap();
        assert_eq!(s.len(), 8);
        assert_eq!((s[0], s[4]), (9999, 9999));
        // The same id reuses its block; the last block is partial (6 - 4 = 2 tokens).
        let t = b
            .token_sequence(&c, 6, &[1, 3], 4, 2, &mut no_tail)
            .unwrap();
        assert_eq!(&t[..4], &s[..4]);
        assert_eq!(t.len(), 6);
        // Prefix only: the tail comes from the caller's stream.
        let mut tail = |n: usize| vec![5u32; n];
        let u = b.token_sequence(&c, 11, &[1], 4, 3, &mut tail).unwrap();
        assert_eq!(&u[4..], &[5; 7]);
        // Same id at another size: AIPerf's check, naming where it was first built.
        let e = b
            .token_sequence(&c, 3, &[3], 4, 4, &mut no_tail)
            .unwrap_err();
        assert_eq!(
            e,
            LayoutError::SizeConflict {
                hash_id: 3,
                size: 3,
                first_size: 2,
                first_line: 2
            }
        );
    }

    #[test]
    fn layout_errors() {
        let c = corpus();
        let mut b = HashBlocks::new(7, "abc".into(), None);
        let mut no_tail = |_: usize| -> Vec<u32> { Vec::new() };
        assert_eq!(
            b.token_sequence(&c, 0, &[1], 4, 1, &mut no_tail),
            Err(LayoutError::NotPositive)
        );
        assert_eq!(
            b.token_sequence(&c, 4, &[1, 2], 4, 1, &mut no_tail),
            Err(LayoutError::FinalBlock { final_size: 0 })
        );
        // Without a separator a block is all corpus tokens, a window of the corpus.
        let s = b.token_sequence(&c, 4, &[5], 4, 1, &mut no_tail).unwrap();
        assert_eq!(s[1], s[0] + 1);
    }

    #[test]
    fn seeds_follow_the_formula() {
        const SEED_7_ABC_1: u64 = 1_255_829_016_790_058_206;
        const RANDRANGE_7_ABC_1: u64 = 782;
        // int.from_bytes(hashlib.sha256(b"7:abc:1").digest()[:8], "big") in Python, and
        // random.Random(that).randrange(1000).
        let seed = hash_id_seed(7, "abc", 1);
        assert_eq!(seed, SEED_7_ABC_1);
        assert_eq!(PyRandom::new(seed).randrange(1000), RANDRANGE_7_ABC_1);
        assert_eq!(trace_id(b"").len(), 16);
        assert_eq!(trace_id(b""), "e3b0c44298fc1c14");
        // HashIdRandomGenerator(123); set_trace_id("trace"); reseed_for_hash_id(7);
        // randrange(1000000) twice, printed by AIPerf 0.13.0.
        let mut r = PyRandom::new(hash_id_seed(123, "trace", 7));
        assert_eq!(r.randrange(1_000_000), 186_972);
        assert_eq!(r.randrange(1_000_000), 89_867);
    }

    #[test]
    fn windows_slice_like_aiperf() {
        let pool: Vec<u32> = (0..10).collect();
        assert_eq!(window(&pool, 8, 4), [8, 9, 0, 1]);
        assert_eq!(window(&pool, 3, 2), [3, 4]);
        assert_eq!(window(&pool, 13, 2), [3, 4]);
        assert!(window(&pool, 3, 0).is_empty() && window(&[], 3, 2).is_empty());
        // Longer than the pool: the wrap is appended once, capped at the pool.
        assert_eq!(window(&pool, 5, 25).len(), 5 + 10);
    }

    /// The block cache is bounded: past [`CACHED_TOKENS`] it starts over, and a block drawn
    /// again is the one drawn first (it is a pure function of its seed), while a size conflict
    /// is still caught on an id whose tokens were dropped.
    #[test]
    fn a_dropped_block_is_drawn_again_identical() {
        let c = corpus();
        let mut none = |_: usize| -> Vec<u32> { panic!("no tail expected") };
        let mut b = HashBlocks::new(7, "abc".into(), Some(9999));
        let first = b.token_sequence(&c, 4, &[1], 4, 1, &mut none).unwrap();
        // Enough other blocks to drop block 1 (64 tokens each).
        let ids: Vec<i64> = (100..100 + (CACHED_TOKENS / 64) as i64 + 10).collect();
        let n = ids.len() as i64 * 64;
        b.token_sequence(&c, n, &ids, 64, 2, &mut none).unwrap();
        assert!(b.cached_tokens <= CACHED_TOKENS);
        assert!(!b.cache.contains_key(&1), "block 1 was not dropped");
        let again = b.token_sequence(&c, 4, &[1], 4, 3, &mut none).unwrap();
        assert_eq!(again, first);
        let e = b.token_sequence(&c, 3, &[1], 4, 4, &mut none).unwrap_err();
        assert_eq!(
            e,
            LayoutError::SizeConflict {
                hash_id: 1,
                size: 3,
                first_size: 4,
                first_line: 1
            }
        );
    }
}
