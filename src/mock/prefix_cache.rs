//! Simulated vLLM automatic prefix caching: a hash chain over full token blocks held in a bounded LRU.
//! Owns only the cache bookkeeping (pure, synchronous, no I/O, no clocks); it never stores token data, only
//! 64-bit block hashes.
//!
//! Like vLLM: block `i` is identified by a hash of block `i-1`'s hash and block `i`'s tokens, so a block only
//! matches when the whole prefix before it matches; only full blocks are cached; a hit never covers the whole
//! prompt (at least the last token is recomputed, so a fully cached prompt reports one block fewer); and after a
//! request all its full blocks are (re)inserted tail first, so under pressure the tail of a prefix is evicted
//! before its head.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::num::NonZeroUsize;

use lru::LruCache;

use super::kv_events::{vllm_extra_keys, KvEvent, MEDIUM_GPU};

/// Parent hash of the first block of every prompt.
const ROOT_HASH: u64 = 0x6b76_6275_7374_2121; // "kvbust!!"

/// Hash of one full block given its parent's hash.
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The hash chain over the full blocks of `tokens` (a trailing partial block has no hash).
pub fn chain(tokens: &[u32], block_size: usize) -> Vec<u64> {
    chain_salted(tokens, block_size, None)
}

/// The hash chain over the full blocks of `tokens` continuing after the block `parent` (none:
/// from the start), as an engine's `BlockStored` event describes a run of blocks.
pub fn chain_after(parent: Option<u64>, tokens: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut prev = parent.unwrap_or(ROOT_HASH);
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            prev = block_hash(prev, block);
            prev
        })
        .collect()
}

/// [`chain`] for a request with a `cache_salt`: as vLLM 0.33 does (`kv_cache_utils`, the
/// extra keys of the block whose `start_token_idx == 0`), the salt joins the hash of the first
/// block only; every later block chains from its parent, so two salts share no block and one
/// salt shares exactly what an unsalted chain would. `None` (or empty, which vLLM never lets
/// through) is no salt.
pub fn chain_salted(tokens: &[u32], block_size: usize, salt: Option<&str>) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let salt = salt.filter(|s| !s.is_empty());
    let mut parent = ROOT_HASH;
    tokens
        .chunks_exact(block_size)
        .enumerate()
        .map(|(i, block)| {
            parent = match salt {
                Some(s) if i == 0 => {
                    let mut h = DefaultHasher::new();
                    parent.hash(&mut h);
                    block.hash(&mut h);
                    s.hash(&mut h);
                    h.finish()
                }
                _ => block_hash(parent, block),
            };
            parent
        })
        .collect()
}

/// A bounded LRU of block hashes.
#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    blocks: Option<LruCache<u64, ()>>,
}

impl PrefixCache {
    /// A cache of `capacity` blocks of `block_size` tokens; either being 0 disables caching.
    pub fn new(block_size: usize, capacity: usize) -> Self {
        let blocks = match NonZeroUsize::new(capacity) {
            Some(cap) if block_size > 0 => Some(LruCache::new(cap)),
            _ => None,
        };
        PrefixCache { block_size, blocks }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks currently cached.
    pub fn len(&self) -> usize {
        self.blocks.as_ref().map_or(0, LruCache::len)
    }

    /// Whether no block is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cached tokens for `tokens` without changing the cache.
    pub fn peek(&self, tokens: &[u32]) -> usize {
        let Some(blocks) = &self.blocks else { return 0 };
        let hashes = chain(tokens, self.block_size);
        let hit = hashes.iter().take_while(|h| blocks.contains(*h)).count();
        self.cap_hit(hit, tokens.len())
    }

    /// Serves one request: returns how many of its prompt tokens were cached, then caches all its full blocks
    /// (the hit blocks become most recently used, the prompt's first block most of all).
    pub fn admit(&mut self, tokens: &[u32]) -> usize {
        self.admit_counting_writes(tokens).0
    }

    /// [`PrefixCache::admit`], also returning how many prompt tokens this request newly wrote to the cache
    /// (its full blocks that were not cached before). `cached + written` never exceeds the prompt.
    pub fn admit_counting_writes(&mut self, tokens: &[u32]) -> (usize, usize) {
        self.admit_salted(tokens, None)
    }

    /// [`PrefixCache::admit_counting_writes`] for a request with `cache_salt` `salt`
    /// ([`chain_salted`]).
    pub fn admit_salted(&mut self, tokens: &[u32], salt: Option<&str>) -> (usize, usize) {
        let Some(blocks) = &mut self.blocks else {
            return (0, 0);
        };
        let hashes = chain_salted(tokens, self.block_size, salt);
        let hit = hashes.iter().take_while(|h| blocks.contains(*h)).count();
        // Blocks past the first miss may still be cached (a chain whose head was evicted): not a write.
        let written = hashes[hit..]
            .iter()
            .filter(|h| !blocks.contains(*h))
            .count();
        for h in hashes.iter().rev() {
            blocks.put(*h, ());
        }
        (self.cap_hit(hit, tokens.len()), written * self.block_size)
    }

    /// [`PrefixCache::admit_counting_writes`], also telling `events` what the cache did, as
    /// vLLM's block pool reports it: one `Stored` for the blocks past the cached prefix (their
    /// parent the last cached one; `extra_keys` carrying the salt on the prompt's first block),
    /// then a `Removed` per block evicted to make room.
    pub fn admit_with_events(
        &mut self,
        tokens: &[u32],
        salt: Option<&str>,
        events: &mut Vec<KvEvent>,
    ) -> (usize, usize) {
        let Some(blocks) = &mut self.blocks else {
            return (0, 0);
        };
        let bs = self.block_size;
        let hashes = chain_salted(tokens, bs, salt);
        let hit = hashes.iter().take_while(|h| blocks.contains(*h)).count();
        let written = hashes[hit..]
            .iter()
            .filter(|h| !blocks.contains(*h))
            .count();
        let mut removed = Vec::new();
        for h in hashes.iter().rev() {
            if let Some((old, ())) = blocks.push(*h, ()) {
                if old != *h {
                    removed.push(old);
                }
            }
        }
        // A block pushed out and put back within this request (its own cached head, least
        // recently used) is still cached.
        removed.retain(|h| !blocks.contains(h));
        if hit < hashes.len() {
            events.push(KvEvent::Stored {
                block_hashes: hashes[hit..].to_vec(),
                parent: hit.checked_sub(1).map(|i| hashes[i]),
                token_ids: tokens[hit * bs..hashes.len() * bs].to_vec(),
                block_size: u32::try_from(bs).unwrap_or(u32::MAX),
                medium: Some(MEDIUM_GPU.into()),
                lora_name: None,
                // The salt is the extra key of the prompt's first block, so it goes out only
                // when this run starts there (`hit == 0`), as in vLLM's `cache_full_blocks`.
                extra_keys: vllm_extra_keys(salt, hit, hashes.len() - hit),
            });
        }
        events.extend(removed.into_iter().map(|h| KvEvent::Removed {
            block_hashes: vec![h],
            medium: Some(MEDIUM_GPU.into()),
        }));
        (self.cap_hit(hit, tokens.len()), written * bs)
    }

    /// vLLM never serves the whole prompt from cache: at most `(n - 1) / block_size` full blocks count.
    fn cap_hit(&self, hit_blocks: usize, n_tokens: usize) -> usize {
        let max_blocks = n_tokens.saturating_sub(1) / self.block_size;
        hit_blocks.min(max_blocks) * self.block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's rule as a table: the salt is an extra key of block 0 only, and every later block
    /// hashes its parent; so (prompt, salt) pairs share exactly the blocks of a common prefix
    /// under the same salt, and none across salts.
    #[test]
    fn a_salt_joins_the_first_block_only_and_the_chain_carries_it() {
        let bs = 4;
        let p = toks(0..16);
        let plain = chain(&p, bs);
        let a = chain_salted(&p, bs, Some("a"));
        let b = chain_salted(&p, bs, Some("b"));
        assert_eq!(chain_salted(&p, bs, None), plain);
        assert_eq!(chain_salted(&p, bs, Some("")), plain, "empty is no salt");
        // Block 0: the salt's own key; block i > 0: block_hash(parent, tokens) with no salt.
        let mut h = DefaultHasher::new();
        ROOT_HASH.hash(&mut h);
        p[..4].hash(&mut h);
        "a".hash(&mut h);
        assert_eq!(a[0], h.finish());
        for i in 1..4 {
            assert_eq!(
                a[i],
                block_hash(a[i - 1], &p[i * bs..(i + 1) * bs]),
                "block {i}"
            );
            assert_eq!(
                b[i],
                block_hash(b[i - 1], &p[i * bs..(i + 1) * bs]),
                "block {i}"
            );
        }
        // No block is shared across salts (or with the unsalted chain).
        for (x, y) in [(&a, &b), (&a, &plain), (&b, &plain)] {
            assert!(x.iter().all(|h| !y.contains(h)));
        }
        // What a cache serves, as a table: (prompt, salt) after (prompt, salt) was cached.
        let q = [&p[..8], &[99, 98, 97, 96, 95, 94, 93, 92][..]].concat();
        type Row<'a> = (
            &'a [u32],
            Option<&'a str>,
            &'a [u32],
            Option<&'a str>,
            usize,
        );
        let table: [Row<'_>; 7] = [
            (&p, Some("a"), &p, Some("a"), 12),
            (&p, Some("a"), &p, Some("b"), 0),
            (&p, Some("a"), &p, None, 0),
            (&p, None, &p, None, 12),
            (&p, Some("a"), &q, Some("a"), 8),
            (&p, Some("a"), &q, Some("b"), 0),
            (&p[..3], Some("a"), &p, Some("a"), 0),
        ];
        for (first, s1, second, s2, want) in table {
            let mut c = PrefixCache::new(bs, 64);
            c.admit_salted(first, s1);
            assert_eq!(c.admit_salted(second, s2).0, want, "{s1:?} then {s2:?}");
        }
    }

    fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    #[test]
    fn chain_covers_full_blocks_and_depends_on_the_whole_prefix() {
        let a = toks(0..10);
        let h = chain(&a, 4);
        assert_eq!(h.len(), 2, "two full blocks, the partial third has no hash");
        // Same block content after a different prefix hashes differently.
        let mut b = a.clone();
        b[0] = 99;
        let hb = chain(&b, 4);
        assert_ne!(h[0], hb[0]);
        assert_ne!(h[1], hb[1], "block 1 is unchanged but its parent differs");
        assert_eq!(h[1], block_hash(h[0], &a[4..8]));
        assert_eq!(chain(&a, 0), Vec::<u64>::new());
    }

    #[test]
    fn second_request_hits_and_a_changed_start_misses() {
        let mut c = PrefixCache::new(4, 100);
        let p = toks(0..18); // 4 full blocks + 2 tokens
        assert_eq!(c.admit(&p), 0);
        assert_eq!(c.len(), 4);
        assert_eq!(c.admit(&p), 16);
        let mut q = p.clone();
        q[0] = 1000;
        assert_eq!(
            c.admit(&q),
            0,
            "a change in the first block invalidates the whole chain"
        );
        // A shared first 9 tokens → 2 full blocks hit.
        let mut r = toks(0..9);
        r.extend(500..520);
        assert_eq!(c.admit(&r), 8);
    }

    #[test]
    fn never_reports_the_whole_prompt_cached() {
        let mut c = PrefixCache::new(4, 100);
        let p = toks(0..16); // exactly 4 blocks
        assert_eq!(c.admit(&p), 0);
        assert_eq!(c.admit(&p), 12, "the last block is recomputed");
        assert_eq!(c.admit(&toks(0..4)), 0, "a one-block prompt never hits");
        assert_eq!(c.admit(&toks(0..5)), 4);
        assert_eq!(c.admit(&[]), 0);
    }

    #[test]
    fn lru_evicts_least_recently_used_and_tails_first() {
        let mut c = PrefixCache::new(2, 4);
        let a = toks(0..9); // 4 blocks
        let b = toks(100..109); // 4 other blocks
        assert_eq!(c.admit(&a), 0);
        assert_eq!(c.admit(&b), 0);
        assert_eq!(c.len(), 4);
        assert_eq!(c.peek(&a), 0, "a was evicted entirely");
        assert_eq!(c.peek(&b), 8);

        // Capacity pressure of one block evicts b's tail block, keeping its head usable.
        let d = toks(200..203); // 1 block
        assert_eq!(c.admit(&d), 0);
        assert_eq!(c.peek(&b), 6, "three head blocks of b survive");

        // Re-admitting b restores its tail block; d, now least recently used, is pushed out.
        assert_eq!(c.admit(&b), 6);
        assert_eq!(c.peek(&b), 8);
        assert_eq!(c.peek(&d), 0);
    }

    #[test]
    fn writes_count_only_blocks_not_cached_before() {
        let mut c = PrefixCache::new(4, 100);
        let p = toks(0..18); // 4 full blocks + 2 tokens
        assert_eq!(c.admit_counting_writes(&p), (0, 16));
        assert_eq!(c.admit_counting_writes(&p), (16, 0));
        let mut q = toks(0..8);
        q.extend(100..110); // 2 shared blocks, 2 new full blocks + 2 tokens
        assert_eq!(c.admit_counting_writes(&q), (8, 8));
        let full = toks(0..16); // all 4 blocks cached: the last is recomputed, not written
        assert_eq!(c.admit_counting_writes(&full), (12, 0));
        assert_eq!(PrefixCache::new(0, 10).admit_counting_writes(&p), (0, 0));
    }

    /// The events tell a reader exactly what is cached: replaying them gives the cache's blocks.
    #[test]
    fn events_replay_to_the_cache_contents() {
        use std::collections::HashSet;
        let mut c = PrefixCache::new(4, 6);
        let mut plain = PrefixCache::new(4, 6);
        let mut seen: HashSet<u64> = HashSet::new();
        let prompts = [
            toks(0..18),
            toks(0..10),
            toks(100..121),
            toks(0..18),
            toks(200..205),
        ];
        for p in &prompts {
            let mut events = Vec::new();
            let got = c.admit_with_events(p, None, &mut events);
            assert_eq!(got, plain.admit_counting_writes(p));
            for e in events {
                match e {
                    KvEvent::Stored {
                        block_hashes,
                        parent,
                        token_ids,
                        ..
                    } => {
                        // The hashes follow from the parent and the tokens.
                        let mut prev = parent.unwrap_or(ROOT_HASH);
                        for (h, block) in block_hashes.iter().zip(token_ids.chunks(4)) {
                            prev = block_hash(prev, block);
                            assert_eq!(*h, prev);
                            seen.insert(*h);
                        }
                    }
                    KvEvent::Removed { block_hashes, .. } => {
                        for h in block_hashes {
                            assert!(seen.remove(&h), "removed a block never stored");
                        }
                    }
                    KvEvent::Cleared => seen.clear(),
                }
            }
            let cached: HashSet<u64> = c
                .blocks
                .as_ref()
                .expect("on")
                .iter()
                .map(|(h, _)| *h)
                .collect();
            assert_eq!(seen, cached);
        }
    }

    /// A salted request's events as vLLM's: its first run (from block 0) carries the salt as
    /// the first block's only extra key and every other block's entry is `None`; a longer
    /// prompt under the same salt stores only its new blocks, after a parent, with no salt;
    /// an unsalted request's entries are all `None`. Each run's hashes follow from its parent
    /// (or the salt, for block 0) and its tokens.
    #[test]
    fn a_salted_requests_events_carry_its_salt_on_the_first_block_only() {
        use super::super::kv_events::ExtraKey;
        let bs = 4;
        let mut c = PrefixCache::new(bs, 64);
        let stored = |c: &mut PrefixCache, p: &[u32], salt| {
            let mut events = Vec::new();
            c.admit_with_events(p, salt, &mut events);
            events
                .into_iter()
                .find(|e| matches!(e, KvEvent::Stored { .. }))
                .expect("a run stored")
        };
        let first = stored(&mut c, &toks(0..17), Some("s1"));
        let KvEvent::Stored {
            block_hashes,
            parent: None,
            extra_keys: Some(keys),
            ..
        } = &first
        else {
            panic!("{first:?}")
        };
        assert_eq!(*block_hashes, chain_salted(&toks(0..17), bs, Some("s1")));
        assert_eq!(keys[0], Some(vec![ExtraKey::Text("s1".into())]));
        assert!(keys[1..].iter().all(Option::is_none) && keys.len() == 4);
        assert_eq!(first.first_block_salt(), Some("s1"));
        let longer = stored(&mut c, &toks(0..25), Some("s1"));
        let KvEvent::Stored {
            block_hashes,
            parent: Some(parent),
            token_ids,
            extra_keys: Some(keys),
            ..
        } = &longer
        else {
            panic!("{longer:?}")
        };
        let salted = chain_salted(&toks(0..25), bs, Some("s1"));
        assert_eq!(*parent, salted[3]);
        assert_eq!(*block_hashes, salted[4..]);
        assert_eq!(*token_ids, toks(16..24));
        assert_eq!(*keys, vec![None, None]);
        assert_eq!(longer.first_block_salt(), None);
        let plain = stored(&mut c, &toks(0..17), None);
        let KvEvent::Stored {
            parent: None,
            extra_keys: Some(keys),
            ..
        } = &plain
        else {
            panic!("{plain:?}")
        };
        assert_eq!(*keys, vec![None; 4]);
    }

    #[test]
    fn disabled_cache_never_hits() {
        for (bs, cap) in [(0, 10), (4, 0)] {
            let mut c = PrefixCache::new(bs, cap);
            let p = toks(0..40);
            assert_eq!(c.admit(&p), 0);
            assert_eq!(c.admit(&p), 0);
            assert!(c.is_empty());
        }
    }
}
