//! Prompt lanes for `{{kvbust:prompt:N[:corpus]}}`: one prompt stream per (corpus, length),
//! each with a small buffer generated ahead on the rayon pool, so a placeholder is usually a
//! pop instead of a generation. Owns lane state and the corpora it builds (reading or writing
//! only the corpus id cache); must never hold one lock across two lanes' work, so a small
//! placeholder never waits behind a large one of another length.
//!
//! Reproducible: with a root seed, lane (corpus, N) draws from its own stream seeded by
//! `derive_seed(root, "kvbust.placeholder.<corpus>.<N>")`, and hands its prompts out in the
//! order it made them, so the k-th N-token prompt of a corpus does not depend on other traffic.
//! A lane pushed out of the [`MAX_LANES`] kept is parked, stream and all, and picks up where it
//! stopped; past [`MAX_PARKED`] more a lane is dropped, and when its length comes back it draws
//! from a fresh stream (a new seed per rebirth), so within a run a prompt is never sent twice.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::lock;

use lru::LruCache;

use crate::synth::corpus::kvbust_coding::CodingCorpus;
use crate::synth::corpus::sonnet::SHAKESPEARE;
use crate::synth::corpus::PromptCorpus;
use crate::synth::corpus::{random, RandomCorpusStyle, RandomPools, TokenCorpus};
use crate::synth::error::SynthError;
use crate::synth::prompt::stream::PromptStream;
use crate::synth::rng::derive_seed;
use crate::synth::tokenizer::Tokenizer;

/// Lanes kept at once (least recently used parked first).
const MAX_LANES: usize = 32;
/// Lanes parked after eviction, streams kept (least recently used dropped first): bounds what
/// idle lengths hold (a coding lane holds its own pool).
pub const MAX_PARKED: usize = 96;
/// Longest prompt generated ahead; longer ones are made on demand only (bounds the buffers to
/// about `MAX_LANES × depth × 16k tokens`).
pub const MAX_PREFETCH_TOKENS: usize = 16 << 10;

struct Lane {
    tokens: usize,
    /// Generation is serialized per lane; this lock is never held across lanes.
    stream: Mutex<PromptStream>,
    /// Prompts made ahead, in the order the stream made them.
    ready: Mutex<VecDeque<String>>,
    refilling: AtomicBool,
}

impl Lane {
    /// The next prompt in stream order: a buffered one, else one made now.
    fn take(&self) -> Result<String, SynthError> {
        if let Some(p) = lock(&self.ready).pop_front() {
            return Ok(p);
        }
        let mut stream = lock(&self.stream);
        // A refill may have pushed while we waited for the stream: older prompts go first.
        if let Some(p) = lock(&self.ready).pop_front() {
            return Ok(p);
        }
        stream.prompt(self.tokens)
    }

    fn refill(&self, depth: usize) {
        loop {
            let mut stream = lock(&self.stream);
            if lock(&self.ready).len() >= depth {
                break;
            }
            match stream.prompt(self.tokens) {
                Ok(p) => lock(&self.ready).push_back(p),
                Err(e) => {
                    tracing::warn!(tokens = self.tokens, "placeholder prefetch stopped: {e}");
                    break;
                }
            }
        }
    }
}

/// The corpora lanes draw from, built on first use.
#[derive(Default)]
struct Corpora {
    sonnet: Mutex<Option<TokenCorpus>>,
    coding: Mutex<Option<TokenCorpus>>,
}

/// Placeholder prompt lanes over one tokenizer.
pub struct PromptLanes {
    tokenizer: Arc<Tokenizer>,
    style: RandomCorpusStyle,
    root: u64,
    /// The root is the configured seed (`synth.placeholder_seed`): the next process draws the
    /// same lane seeds, so an AIPerf coding pool built for a lane is worth a cache file. A drawn
    /// root's pools are never asked for again: caching them would only fill the disk (one file
    /// of megabytes per new prompt length).
    seeded: bool,
    /// The root seed of the coding-exact corpus: fixed when unseeded, so its build is cached.
    coding_root: u64,
    depth: usize,
    cache_dir: Option<PathBuf>,
    corpora: Corpora,
    lanes: Mutex<Lanes>,
    /// The random corpus's piece memo warm-up was started (once per lanes, with prefetch on).
    random_warm: AtomicBool,
}

type Key = (PromptCorpus, usize);

/// The lanes in use, the parked ones, and which lengths ever had a lane.
struct Lanes {
    live: LruCache<Key, Arc<Lane>>,
    parked: LruCache<Key, Arc<Lane>>,
    seen: Seen,
    /// Lanes made again after being dropped: each one's stream is seeded by its number.
    rebirths: u64,
}

impl Lanes {
    /// The lane of `key` when it has one: live, or parked (which makes it live again).
    fn existing(&mut self, key: Key) -> Option<Arc<Lane>> {
        if let Some(l) = self.live.get(&key) {
            return Some(l.clone());
        }
        let l = self.parked.pop(&key)?;
        self.insert(key, l.clone());
        Some(l)
    }

    /// Makes `lane` live; the lane it pushes out is parked, and the one that pushes out of the
    /// parked ones is dropped (its key stays in `seen`).
    fn insert(&mut self, key: Key, lane: Arc<Lane>) {
        self.seen.insert(key);
        if let Some((k, out)) = self.live.push(key, lane) {
            if k != key {
                self.parked.push(k, out);
            }
        }
    }
}

/// Which (corpus, length) keys ever had a lane: one bit per length up to
/// [`SEEN_BITMAP_TOKENS`] (128 KiB per corpus in use), a set beyond (lengths the proxy never
/// asks for).
#[derive(Default)]
struct Seen {
    bits: std::collections::HashMap<PromptCorpus, Vec<u64>>,
    beyond: std::collections::HashSet<Key>,
}

/// Lengths tracked by the bitmap (the proxy's placeholder limit is 2^20 tokens).
const SEEN_BITMAP_TOKENS: usize = 1 << 20;

impl Seen {
    fn insert(&mut self, (corpus, n): Key) {
        if n > SEEN_BITMAP_TOKENS {
            self.beyond.insert((corpus, n));
            return;
        }
        let bits = self
            .bits
            .entry(corpus)
            .or_insert_with(|| vec![0; SEEN_BITMAP_TOKENS / 64 + 1]);
        bits[n / 64] |= 1 << (n % 64);
    }

    fn contains(&self, (corpus, n): Key) -> bool {
        if n > SEEN_BITMAP_TOKENS {
            return self.beyond.contains(&(corpus, n));
        }
        self.bits
            .get(&corpus)
            .is_some_and(|b| b[n / 64] & (1 << (n % 64)) != 0)
    }
}

/// The root seed of lane (corpus, `tokens`) under the placeholder root seed: its k-th prompt is
/// the k-th of a [`PromptStream`] over that corpus with this seed.
pub fn lane_seed(root: u64, corpus: PromptCorpus, tokens: usize) -> u64 {
    derive_seed(
        root,
        &format!("kvbust.placeholder.{}.{tokens}", corpus.as_str()),
    )
}

impl PromptLanes {
    /// Lanes over `tokenizer`; `depth` prompts are made ahead per lane (0: none); `seed` None
    /// draws a random root; `cache_dir` holds corpus id caches.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        style: RandomCorpusStyle,
        seed: Option<u64>,
        depth: usize,
        cache_dir: Option<PathBuf>,
    ) -> Arc<Self> {
        Arc::new(PromptLanes {
            tokenizer,
            style,
            root: seed.unwrap_or_else(rand::random),
            seeded: seed.is_some(),
            coding_root: crate::synth::corpus::kvbust_coding::corpus_root(seed),
            depth,
            cache_dir,
            corpora: Corpora::default(),
            lanes: Mutex::new(Lanes {
                live: LruCache::new(NonZeroUsize::new(MAX_LANES).unwrap_or(NonZeroUsize::MIN)),
                parked: LruCache::new(NonZeroUsize::new(MAX_PARKED).unwrap_or(NonZeroUsize::MIN)),
                seen: Seen::default(),
                rebirths: 0,
            }),
            random_warm: AtomicBool::new(false),
        })
    }

    /// The corpus token array for sonnet and coding-exact lanes (built once, outside the lane
    /// map). AIPerf's `coding` pool depends on the stream's own seed, so its stream builds it.
    fn corpus(&self, corpus: PromptCorpus) -> Result<Option<TokenCorpus>, SynthError> {
        let slot = match corpus {
            PromptCorpus::Sonnet => &self.corpora.sonnet,
            PromptCorpus::CodingExact => &self.corpora.coding,
            PromptCorpus::Random | PromptCorpus::Coding => return Ok(None),
        };
        let mut slot = lock(slot);
        if let Some(c) = slot.as_ref() {
            return Ok(Some(c.clone()));
        }
        let t0 = std::time::Instant::now();
        let built = match corpus {
            PromptCorpus::CodingExact => CodingCorpus::for_root_seed_cached(
                self.coding_root,
                &self.tokenizer,
                self.cache_dir.as_deref(),
            )?
            .as_token_corpus()
            .clone(),
            _ => {
                TokenCorpus::build_cached(SHAKESPEARE, &self.tokenizer, self.cache_dir.as_deref())?
            }
        };
        tracing::info!(corpus = corpus.as_str(), elapsed = ?t0.elapsed(), "placeholder corpus ready");
        *slot = Some(built.clone());
        Ok(Some(built))
    }

    fn lane(&self, corpus: PromptCorpus, tokens: usize) -> Result<Arc<Lane>, SynthError> {
        let key = (corpus, tokens);
        let (seed, reborn) = {
            let mut lanes = lock(&self.lanes);
            if let Some(l) = lanes.existing(key) {
                return Ok(l);
            }
            if lanes.seen.contains(key) {
                // Its stream is gone: starting it again would send its prompts again.
                lanes.rebirths += 1;
                tracing::debug!(
                    corpus = corpus.as_str(),
                    tokens,
                    "placeholder lane made again on a fresh stream"
                );
                let seed = derive_seed(
                    lane_seed(self.root, corpus, tokens),
                    &format!("kvbust.placeholder.rebirth.{}", lanes.rebirths),
                );
                (seed, true)
            } else {
                (lane_seed(self.root, corpus, tokens), false)
            }
        };
        // A reborn lane's seed depends on this process's traffic: no later one asks for it.
        let pool_cache = self.cache_dir.as_deref().filter(|_| self.seeded && !reborn);
        let stream = PromptStream::new(
            self.tokenizer.clone(),
            corpus,
            self.style,
            self.corpus(corpus)?,
            Some(seed),
            pool_cache,
        )?;
        let lane = Arc::new(Lane {
            tokens,
            stream: Mutex::new(stream),
            ready: Mutex::new(VecDeque::new()),
            refilling: AtomicBool::new(false),
        });
        // Two first requests may race to create a lane: the one already stored wins.
        let mut lanes = lock(&self.lanes);
        if let Some(l) = lanes.existing(key) {
            return Ok(l);
        }
        lanes.insert(key, lane.clone());
        drop(lanes);
        if corpus == PromptCorpus::Random {
            self.warm_random();
        }
        Ok(lane)
    }

    /// Generating ahead for the random corpus: the first random lane warms the tokenizer's
    /// piece memo over the whole id cycle in the background, so even the first prompts of every
    /// random lane are mostly memo hits (prompts stay the same: the memo only holds exact
    /// re-encodes).
    fn warm_random(&self) {
        if self.depth == 0 || self.random_warm.swap(true, Ordering::AcqRel) {
            return;
        }
        let (tokenizer, style) = (self.tokenizer.clone(), self.style);
        let dir = self.cache_dir.clone();
        rayon::spawn(move || {
            let t0 = std::time::Instant::now();
            if dir
                .as_deref()
                .is_some_and(|d| random::load_piece_memo(&tokenizer, d))
            {
                tracing::info!(elapsed = ?t0.elapsed(), "random corpus piece memo read from the cache");
                return;
            }
            match RandomPools::new(&tokenizer, style).warm_piece_memo(&tokenizer) {
                Ok(()) => {
                    tracing::info!(elapsed = ?t0.elapsed(), "random corpus piece memo warm");
                    if let Some(d) = dir {
                        random::save_piece_memo(&tokenizer, &d);
                    }
                }
                Err(e) => tracing::warn!("random corpus piece memo warm-up stopped: {e}"),
            }
        });
    }

    /// A buffered prompt, without blocking on generation (None: none ready).
    pub fn try_take(&self, corpus: PromptCorpus, tokens: usize) -> Option<String> {
        let lane = lock(&self.lanes).live.get(&(corpus, tokens)).cloned()?;
        let p = lock(&lane.ready).pop_front()?;
        self.schedule_refill(&lane);
        Some(p)
    }

    /// The next `tokens`-token prompt of `corpus` (blocking: may build the corpus or generate);
    /// then schedules the lane's buffer to be topped up in the background.
    pub fn take(&self, corpus: PromptCorpus, tokens: usize) -> Result<String, SynthError> {
        let lane = self.lane(corpus, tokens)?;
        let p = lane.take()?;
        self.schedule_refill(&lane);
        Ok(p)
    }

    fn schedule_refill(&self, lane: &Arc<Lane>) {
        if self.depth == 0 || lane.tokens > MAX_PREFETCH_TOKENS {
            return;
        }
        if lane.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let (lane, depth) = (lane.clone(), self.depth);
        rayon::spawn(move || {
            lane.refill(depth);
            lane.refilling.store(false, Ordering::Release);
        });
    }

    /// Whether (corpus, tokens) has a lane now (live or parked): asking for it builds nothing.
    pub fn has_lane(&self, corpus: PromptCorpus, tokens: usize) -> bool {
        let lanes = lock(&self.lanes);
        lanes.live.contains(&(corpus, tokens)) || lanes.parked.contains(&(corpus, tokens))
    }

    /// Prompts currently buffered for (corpus, tokens).
    pub fn buffered(&self, corpus: PromptCorpus, tokens: usize) -> usize {
        let lanes = lock(&self.lanes);
        let key = (corpus, tokens);
        lanes
            .live
            .peek(&key)
            .or_else(|| lanes.parked.peek(&key))
            .map_or(0, |l| lock(&l.ready).len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok() -> Arc<Tokenizer> {
        static T: std::sync::OnceLock<Arc<Tokenizer>> = std::sync::OnceLock::new();
        T.get_or_init(|| Arc::new(Tokenizer::default_qwen3().unwrap()))
            .clone()
    }

    /// A coding lane's pool is cached only when the next process could ask for it again: with
    /// `synth.placeholder_seed` set. Unseeded, every new length wrote a file of megabytes that
    /// nothing ever read.
    #[test]
    fn only_a_seeded_coding_lane_writes_its_pool_to_the_cache() {
        let files = |dir: &std::path::Path| std::fs::read_dir(dir).map_or(0, |d| d.count());
        for (seed, written) in [(None, false), (Some(9), true)] {
            let dir =
                crate::test_support::test_dir().join(format!("lane-cache-{}", seed.is_some()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let lanes =
                PromptLanes::new(tok(), RandomCorpusStyle::Vllm, seed, 0, Some(dir.clone()));
            lanes.take(PromptCorpus::Coding, 30).unwrap();
            assert_eq!(files(&dir) > 0, written, "seed {seed:?}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn lanes_are_reproducible_and_independent_of_other_traffic() {
        // Without prefetch, and with prefetch plus other lengths interleaved: same sequence.
        let quiet = PromptLanes::new(tok(), RandomCorpusStyle::Vllm, Some(5), 0, None);
        let busy = PromptLanes::new(tok(), RandomCorpusStyle::Vllm, Some(5), 3, None);
        let mut a = Vec::new();
        let mut b = Vec::new();
        for i in 0..6 {
            a.push(quiet.take(PromptCorpus::Random, 40).unwrap());
            busy.take(PromptCorpus::Random, 7 + i).unwrap();
            b.push(busy.take(PromptCorpus::Random, 40).unwrap());
        }
        assert_eq!(a, b);
        for p in &a {
            assert_eq!(tok().encode(p).unwrap().len(), 40, "{p:?}");
        }
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), a.len(), "fresh prompts");
        // Another length of the same corpus is another stream, not a prefix of this one.
        let other = quiet.take(PromptCorpus::Random, 20).unwrap();
        assert!(!a[0].starts_with(&other));
    }

    /// Issue 23 item 5: past the live and parked lanes a lane is dropped; when its length comes
    /// back its stream is a fresh one, never the old one from the start again. 140 lengths, each
    /// used twice: 280 different prompts.
    #[test]
    fn a_dropped_lane_comes_back_on_a_fresh_stream() {
        let lanes = PromptLanes::new(tok(), RandomCorpusStyle::Vllm, Some(2), 0, None);
        let n = MAX_LANES + MAX_PARKED + 12;
        let mut seen = std::collections::HashSet::new();
        for round in 0..2 {
            for len in 1..=n {
                let p = lanes.take(PromptCorpus::Random, len).unwrap();
                assert!(
                    seen.insert(p),
                    "length {len} repeated a prompt in round {round}"
                );
            }
        }
        assert!(lock(&lanes.lanes).rebirths > 0);
    }

    #[test]
    fn a_busy_lane_does_not_hold_up_another() {
        let lanes = PromptLanes::new(tok(), RandomCorpusStyle::Vllm, Some(1), 0, None);
        let lane = lanes.lane(PromptCorpus::Random, 10).unwrap();
        // As if a large prompt were being made on that lane right now.
        let _busy = lock(&lane.stream);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| tx.send(lanes.take(PromptCorpus::Random, 12)));
            let got = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("another lane must not wait for a busy one");
            assert_eq!(tok().encode(&got.unwrap()).unwrap().len(), 12);
        });
    }

    #[test]
    fn a_lane_refills_in_the_background_up_to_its_depth() {
        let lanes = PromptLanes::new(tok(), RandomCorpusStyle::Vllm, Some(9), 4, None);
        assert!(lanes.try_take(PromptCorpus::Random, 30).is_none());
        lanes.take(PromptCorpus::Random, 30).unwrap();
        // The refill runs on the rayon pool; wait for it by polling its observable effect.
        let t0 = std::time::Instant::now();
        while lanes.buffered(PromptCorpus::Random, 30) < 4 {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "no refill"
            );
            std::thread::yield_now();
        }
        assert!(lanes.try_take(PromptCorpus::Random, 30).is_some());
        // Lengths past the prefetch bound are never buffered.
        let big = MAX_PREFETCH_TOKENS + 1;
        lanes.take(PromptCorpus::Random, big).unwrap();
        assert_eq!(lanes.buffered(PromptCorpus::Random, big), 0);
    }
}
