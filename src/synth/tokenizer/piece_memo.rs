//! A bounded, sharded memo from token-id slices to token-id slices: the re-encodes of pieces
//! that [`crate::synth::tokenizer::reencode`] proved independent of their neighbours. Owns the storage and
//! its bounds; must never decide what may be stored (its callers only store pure functions of
//! the key, so a hit is always exact).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A multiply-rotate hasher for short id slices and packed integer keys (SipHash costs more
/// than the lookup saves; keys are never attacker-chosen).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Id slices hash as their bytes (`u32::hash_slice`): one step per id, as `write_u32`
        // takes them, not one per byte (the memo hashes every piece it is asked for; a
        // slice's length is hashed apart, so the zero padding of a short tail is harmless).
        for chunk in bytes.chunks(4) {
            let mut word = [0u8; 4];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u32(u32::from_le_bytes(word));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

type Shard = HashMap<Box<[u32]>, Box<[u32]>, BuildHasherDefault<IdHasher>>;

/// Shards of the memo (so parallel prompt builders rarely wait on each other).
const MEMO_SHARDS: usize = 16;
/// Entries kept before a shard is emptied (bounds the memory at a few tens of MB).
const MEMO_MAX_ENTRIES: usize = 1 << 18;
/// Longer pieces are re-encoded every time (costly to hash and keep; with dense-letter cuts,
/// no stretch of Qwen3's id cycle without a safe position is longer than about 520 ids).
const MEMO_MAX_PIECE: usize = 640;

/// `encode(decode(piece))` for pieces that start and end at safe positions or text ends, kept per
/// tokenizer. A pure function of the ids, so a hit is always exact.
pub struct PieceMemo {
    shards: Vec<Mutex<Shard>>,
    entries: AtomicUsize,
}

impl Default for PieceMemo {
    fn default() -> Self {
        PieceMemo {
            shards: (0..MEMO_SHARDS).map(|_| Mutex::default()).collect(),
            entries: AtomicUsize::new(0),
        }
    }
}

impl PieceMemo {
    fn shard(&self, key: &[u32]) -> std::sync::MutexGuard<'_, Shard> {
        let mut h = IdHasher::default();
        for &id in key {
            h.write_u32(id);
        }
        let i = (h.finish() >> 59) as usize % MEMO_SHARDS;
        // A panic while holding a shard cannot leave a half-written entry: keep using it.
        crate::sync::lock(&self.shards[i])
    }

    /// Appends the memoized re-encode of `key` to `out`; false when it is not known.
    pub fn extend_into(&self, key: &[u32], out: &mut Vec<u32>) -> bool {
        if key.len() > MEMO_MAX_PIECE {
            return false;
        }
        match self.shard(key).get(key) {
            Some(v) => {
                out.extend_from_slice(v);
                true
            }
            None => false,
        }
    }

    pub fn contains(&self, key: &[u32]) -> bool {
        key.len() <= MEMO_MAX_PIECE && self.shard(key).contains_key(key)
    }

    pub fn insert(&self, key: &[u32], value: &[u32]) {
        if key.len() > MEMO_MAX_PIECE {
            return;
        }
        let mut shard = self.shard(key);
        if self.entries.load(Ordering::Relaxed) >= MEMO_MAX_ENTRIES {
            self.entries.fetch_sub(shard.len(), Ordering::Relaxed);
            shard.clear();
        }
        if shard.insert(key.into(), value.into()).is_none() {
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Number of memoized pieces.
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    /// Whether nothing is memoized.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry as u32 words (for a cache file): the entry count, then per entry the key
    /// length, the value length, the key, the value.
    pub fn to_words(&self) -> Vec<u32> {
        let mut words: Vec<u32> = vec![0];
        let mut count = 0u32;
        for shard in &self.shards {
            let shard = crate::sync::lock(shard);
            for (k, v) in shard.iter() {
                words.extend([k.len() as u32, v.len() as u32]);
                words.extend_from_slice(k);
                words.extend_from_slice(v);
                count += 1;
            }
        }
        words[0] = count;
        words
    }

    /// Adds the entries of [`PieceMemo::to_words`] output; false (nothing added) when the words
    /// are not such a list, whole. The caller must only pass entries made with the same
    /// tokenizer: they are trusted as exact.
    pub fn load_words(&self, words: &[u32]) -> bool {
        let Some(&count) = words.first() else {
            return false;
        };
        // Parse everything before inserting anything, so a malformed list adds nothing.
        let mut entries = Vec::new();
        let mut at = 1;
        for _ in 0..count {
            let Some(&[k, v]) = words.get(at..at + 2) else {
                return false;
            };
            let (k, v) = (k as usize, v as usize);
            let Some(kv) = words.get(at + 2..at + 2 + k + v) else {
                return false;
            };
            entries.push(kv.split_at(k));
            at += 2 + k + v;
        }
        if at != words.len() {
            return false;
        }
        for (k, v) in entries {
            self.insert(k, v);
        }
        true
    }
}
