//! The model's block index: the upstream's prefix cache as vLLM keeps it — a chain hash per full
//! block of prompt tokens (the mock's own [`chain`]), held in an LRU — with, for every block, who
//! first put it there. Pure and synchronous: a request is served against it exactly as the mock
//! serves one (the longest cached prefix, never the whole prompt; then every full block
//! (re)inserted tail first), so with the same geometry the two agree block for block. Never
//! tokenizes, never counts for the report.

use std::num::NonZeroUsize;

use lru::LruCache;

use crate::cachebust::Phase;
pub use crate::mock::prefix_cache::{chain, chain_salted};

/// Who first put a block in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The session key's digest (a request without a key is a session of its own).
    pub session: u64,
    pub phase: Phase,
    /// The block holds the inserting request's isolation point or what follows it: it is
    /// private to that request's session.
    pub past_iso: bool,
}

/// Memory one indexed block costs: the LRU's entry (key, owner, two links: 48 bytes, boxed by
/// the allocator into 64) and its hash-table slot with spare capacity (about 16); the
/// `cache_model` flood benchmark checks the figure against the process's resident memory.
pub const BYTES_PER_BLOCK: usize = 80;

/// The hit of one request: how many leading blocks were cached, and their owners.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hit {
    /// Owners of the hit blocks, in order (after vLLM's cap: never the whole prompt).
    pub owners: Vec<Owner>,
    /// Blocks evicted to make room for this request's.
    pub evicted: usize,
}

/// The index.
pub struct BlockIndex {
    blocks: LruCache<u64, Owner>,
    block_size: usize,
    evicted: u64,
}

impl BlockIndex {
    /// An index of at most `capacity` blocks of `block_size` tokens.
    pub fn new(block_size: usize, capacity: NonZeroUsize) -> Self {
        Self {
            blocks: LruCache::new(capacity),
            block_size: block_size.max(1),
            evicted: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks evicted since the index was made.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Drops block `hash` (the engine evicted it); whether it was cached.
    pub fn remove(&mut self, hash: u64) -> bool {
        self.blocks.pop(&hash).is_some()
    }

    /// Drops every block (the engine's cache was reset).
    pub fn clear(&mut self) {
        self.blocks.clear();
    }

    /// Serves one request of `n_tokens` whose full blocks hash to `hashes`: returns the cached
    /// prefix (at most `(n_tokens - 1) / block_size` blocks, as vLLM always computes the last
    /// token), then caches every full block, tail first, so that under pressure a prefix loses
    /// its tail before its head. A block already cached keeps its first owner; a new one is
    /// owned by `owner(i)`.
    pub fn serve(
        &mut self,
        hashes: &[u64],
        n_tokens: usize,
        owner: impl Fn(usize) -> Owner,
    ) -> Hit {
        let found = hashes
            .iter()
            .take_while(|h| self.blocks.contains(*h))
            .count();
        let cap = n_tokens.saturating_sub(1) / self.block_size;
        let owners = hashes[..found.min(cap)]
            .iter()
            .filter_map(|h| self.blocks.peek(h).copied())
            .collect();
        let mut evicted = 0;
        for (i, h) in hashes.iter().enumerate().rev() {
            if self.blocks.get(h).is_none() {
                if let Some((old, _)) = self.blocks.push(*h, owner(i)) {
                    evicted += usize::from(old != *h);
                }
            }
        }
        self.evicted += evicted as u64;
        Hit { owners, evicted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::prefix_cache::PrefixCache;

    fn owner(session: u64) -> impl Fn(usize) -> Owner {
        move |_| Owner {
            session,
            phase: Phase::Profiling,
            past_iso: false,
        }
    }

    fn cap(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).expect("non-zero")
    }

    /// Random prompts over a small alphabet of prefixes, served by the mock's cache and by the
    /// index with the same geometry: the same hit every time, evictions included.
    #[test]
    fn the_index_hits_exactly_as_the_mock_cache_does() {
        let mut rng = rand_pcg::Pcg64::new(7, 11);
        use rand::Rng;
        for (bs, capacity) in [(4, 10), (16, 64), (1, 50), (8, 1_000_000)] {
            let mut mock = PrefixCache::new(bs, capacity);
            let mut index = BlockIndex::new(bs, cap(capacity));
            for _ in 0..2000 {
                let head: u32 = rng.random_range(0..4);
                let len = rng.random_range(0..(bs * 12));
                let tail: u32 = rng.random_range(0..3);
                let tokens: Vec<u32> = (0..len as u32)
                    .map(|i| {
                        if i < (len as u32) / 2 {
                            head * 1000 + i
                        } else {
                            tail * 7 + i
                        }
                    })
                    .collect();
                let want = mock.admit(&tokens);
                let hit = index.serve(&chain(&tokens, bs), tokens.len(), owner(1));
                assert_eq!(hit.owners.len() * bs, want, "bs {bs} cap {capacity}");
                assert_eq!(index.len(), mock.len());
            }
        }
    }

    #[test]
    fn a_block_keeps_its_first_owner() {
        let mut index = BlockIndex::new(2, cap(100));
        let a: Vec<u32> = (0..9).collect();
        assert!(index
            .serve(&chain(&a, 2), a.len(), owner(1))
            .owners
            .is_empty());
        let hit = index.serve(&chain(&a, 2), a.len(), owner(2));
        assert_eq!(
            hit.owners.iter().map(|o| o.session).collect::<Vec<_>>(),
            [1, 1, 1, 1]
        );
        // Exactly four blocks: the last is recomputed, so three hit.
        let b: Vec<u32> = (0..8).collect();
        let hit = index.serve(&chain(&b, 2), b.len(), owner(3));
        assert_eq!(hit.owners.len(), 3);
        assert_eq!(index.evicted(), 0);
    }

    #[test]
    fn eviction_is_counted() {
        let mut index = BlockIndex::new(1, cap(3));
        let hit = index.serve(&chain(&[1, 2, 3, 4, 5], 1), 5, owner(1));
        assert_eq!(hit.evicted, 2);
        assert_eq!(index.len(), 3);
        assert_eq!(index.evicted(), 2);
    }
}
