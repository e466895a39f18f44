//! Block ids of a captured trace: a chain hash per block of prompt tokens (every full block and
//! the partial last one, as mooncake's `hash_ids` count them), keyed with HMAC-SHA256 when a
//! capture key is set; and the renaming a finished file gets (dense ids in first-seen order,
//! and a fresh id per session for blocks too few sessions share). Pure: no files, no clock.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Ids stay below 2^53, so every JSON reader (JavaScript's too) reads them exactly.
const ID_BITS: u32 = 53;

/// The capture key: a secret of at least 16 bytes, read from `capture.key_file`.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.fingerprint())
    }
}

impl Key {
    /// Reads the key file (surrounding whitespace, such as a trailing newline, is not key).
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read {}: {e}; point it at a secret file (e.g. `head -c 32 /dev/urandom > key`)", path.display()))?;
        Self::new(bytes.trim_ascii().to_vec()).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A key for this process alone (capture without `capture.key_file`): its ids mean nothing
    /// outside it, and a file finished with it is renamed dense.
    pub fn random() -> Self {
        Self(rand::random::<[u8; 32]>().to_vec())
    }

    pub fn new(bytes: Vec<u8>) -> Result<Self, String> {
        if bytes.len() < 16 {
            return Err(format!(
                "a capture key needs at least 16 bytes, this one has {}",
                bytes.len()
            ));
        }
        Ok(Self(bytes))
    }

    /// Names the key without revealing it: the first 8 bytes of a hash of it, in hex. Files
    /// captured under one key carry one fingerprint, which `kvbust trace merge` compares.
    pub fn fingerprint(&self) -> String {
        let d = Sha256::new()
            .chain_update(b"kvbust capture key fingerprint\0")
            .chain_update(&self.0)
            .finalize();
        d[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// HMAC-SHA256 (RFC 2104) of the concatenated `parts`.
    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        const BLOCK: usize = 64;
        let mut k = [0u8; BLOCK];
        if self.0.len() > BLOCK {
            k[..32].copy_from_slice(&Sha256::digest(&self.0));
        } else {
            k[..self.0.len()].copy_from_slice(&self.0);
        }
        let pad = |byte: u8| k.map(|b| b ^ byte);
        let mut inner = Sha256::new().chain_update(pad(0x36));
        for p in parts {
            inner.update(p);
        }
        let inner = inner.finalize();
        Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize()
            .into()
    }

    fn id(&self, parts: &[&[u8]]) -> u64 {
        let m = self.mac(parts);
        let mut first = [0u8; 8];
        first.copy_from_slice(&m[..8]);
        u64::from_be_bytes(first) >> (64 - ID_BITS)
    }
}

/// One hash per block of `block_size` tokens (the last one may be partial), each covering its
/// parent and its tokens, so two prompts share a hash exactly where they share the prefix up to
/// and including that block. Keyed: HMAC-SHA256 under `key`, below 2^53 (capture keys with the
/// capture key, else a key made for the process: [`Key::random`]). Unkeyed: SipHash with fixed
/// keys, for tests only (anyone can compute those).
pub fn chain(tokens: &[u32], block_size: usize, key: Option<&Key>) -> Vec<u64> {
    chain_in(tokens, block_size, key, None)
}

/// [`chain`] in a client's `cache_salt` namespace: the salt is the first block's parent, so two
/// clients' equal prompts under different salts share no id (as the engine shares no block),
/// and without a salt the ids are [`chain`]'s.
pub fn chain_in(
    tokens: &[u32],
    block_size: usize,
    key: Option<&Key>,
    namespace: Option<&str>,
) -> Vec<u64> {
    let mut parent = match (namespace.filter(|n| !n.is_empty()), key) {
        (None, _) => 0u64,
        (Some(n), Some(k)) => k.id(&[b"cache_salt\0", n.as_bytes()]),
        (Some(n), None) => {
            let mut h = DefaultHasher::new();
            ("cache_salt", n).hash(&mut h);
            h.finish()
        }
    };
    tokens
        .chunks(block_size.max(1))
        .map(|block| {
            let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
            parent = match key {
                Some(k) => k.id(&[b"block\0", &parent.to_le_bytes(), &bytes]),
                None => {
                    let mut h = DefaultHasher::new();
                    (parent, block).hash(&mut h);
                    h.finish()
                }
            };
            parent
        })
        .collect()
}

/// A session's id in a trace: keyed, the same on every replica with the key; else dense
/// within the file ([`Renamer::session`]).
pub fn keyed_session(key: &Key, digest: u64) -> u64 {
    key.id(&[b"session\0", &digest.to_le_bytes()])
}

/// Who saw a block in one file: up to `k + 1` distinct sessions (more need not be told apart).
/// A block seen by `k` or fewer sessions is rare: with k = 2, a block one pair of sessions
/// shares is split, while a system prompt every session sends keeps its id. With k = 1
/// nothing changes (a block one session sends has one id either way), so nothing is kept.
#[derive(Debug, Default)]
pub struct Sharing {
    k: usize,
    seen: HashMap<u64, Vec<u64>>,
}

impl Sharing {
    pub fn new(k: usize) -> Self {
        Self {
            k: k.max(1),
            seen: HashMap::new(),
        }
    }

    /// Notes that `session` sent `block`.
    pub fn note(&mut self, block: u64, session: u64) {
        if self.k <= 1 {
            self.seen.entry(block).or_default();
            return;
        }
        let s = self.seen.entry(block).or_default();
        if s.len() <= self.k && !s.contains(&session) {
            s.push(session);
        }
    }

    /// Distinct blocks noted (the file's memory bound is counted in these).
    pub fn blocks(&self) -> usize {
        self.seen.len()
    }

    /// Whether `block` is shared by more than `k` sessions (always, with k = 1).
    fn common(&self, block: u64) -> bool {
        self.k <= 1 || self.seen.get(&block).is_some_and(|s| s.len() > self.k)
    }
}

/// Renames a finished file's raw block hashes and session keys into the ids it is written with.
pub struct Renamer<'a> {
    sharing: &'a Sharing,
    key: Option<&'a Key>,
    dense: HashMap<u64, u64>,
    fresh: HashMap<(u64, u64), u64>,
    sessions: HashMap<String, u64>,
    used: HashSet<u64>,
}

impl<'a> Renamer<'a> {
    pub fn new(sharing: &'a Sharing, key: Option<&'a Key>) -> Self {
        Self {
            sharing,
            key,
            dense: HashMap::new(),
            fresh: HashMap::new(),
            sessions: HashMap::new(),
            used: HashSet::new(),
        }
    }

    /// The id of `block` as `session` sent it. Keyed: the keyed hash itself (dense after
    /// `kvbust trace merge`), or for a rare block a keyed hash of the block and the session.
    /// Unkeyed: dense in first-seen order, rare blocks one fresh id per session.
    pub fn block(&mut self, block: u64, session: u64) -> u64 {
        let common = self.sharing.common(block);
        match self.key {
            Some(_) if common => block,
            Some(k) => k.id(&[b"rare\0", &block.to_le_bytes(), &session.to_le_bytes()]),
            None => {
                let next = self.used.len() as u64;
                let slot = if common {
                    self.dense.entry(block).or_insert(next)
                } else {
                    self.fresh.entry((block, session)).or_insert(next)
                };
                self.used.insert(*slot);
                *slot
            }
        }
    }

    /// A session's opaque id in this file, from its keyed id in the partial: that id itself
    /// (keyed with the capture key, the same on every replica), or its first-seen index.
    pub fn session(&mut self, partial: &str) -> String {
        match self.key {
            Some(_) => partial.to_string(),
            None => {
                let next = self.sessions.len() as u64;
                let at = self.sessions.entry(partial.to_string()).or_insert(next);
                format!("s{at}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Key {
        Key::new(vec![b; 32]).unwrap()
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        // RFC 4231 test case 2 has a 4-byte key; the type refuses short keys, so build it here.
        let k = Key(b"Jefe".to_vec());
        let mac = k.mac(&[b"what do ya want ", b"for nothing?"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn chains_share_exactly_the_common_prefix_blocks() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[25] = 999; // inside the third block of 10
        for key in [None, Some(key(7))] {
            let (ha, hb) = (chain(&a, 10, key.as_ref()), chain(&b, 10, key.as_ref()));
            assert_eq!(ha.len(), 4);
            assert_eq!(ha[..2], hb[..2]);
            assert!(ha[2..].iter().zip(&hb[2..]).all(|(x, y)| x != y));
        }
        // The partial last block counts, and its length matters.
        assert_eq!(chain(&a[..35], 10, None).len(), 4);
        assert_ne!(chain(&a[..35], 10, None)[3], chain(&a[..36], 10, None)[3]);
    }

    #[test]
    fn a_client_salt_is_a_namespace_of_the_ids() {
        let t: Vec<u32> = (0..40).collect();
        for key in [None, Some(key(3))] {
            let k = key.as_ref();
            assert_eq!(chain_in(&t, 10, k, None), chain(&t, 10, k));
            assert_eq!(chain_in(&t, 10, k, Some("")), chain(&t, 10, k));
            let (a, b) = (
                chain_in(&t, 10, k, Some("a")),
                chain_in(&t, 10, k, Some("b")),
            );
            assert_eq!(a, chain_in(&t, 10, k, Some("a")));
            let plain = chain(&t, 10, k);
            assert!(a.iter().all(|h| !b.contains(h) && !plain.contains(h)));
            assert!(a.iter().all(|&h| h < 1 << 53) || k.is_none());
        }
    }

    #[test]
    fn keys_give_different_ids_and_stay_below_2_53() {
        let t: Vec<u32> = (0..100).collect();
        let (x, y) = (chain(&t, 16, Some(&key(1))), chain(&t, 16, Some(&key(2))));
        assert!(x.iter().zip(&y).all(|(a, b)| a != b));
        assert!(x.iter().all(|&h| h < 1 << 53));
        assert_ne!(key(1).fingerprint(), key(2).fingerprint());
        assert!(Key::new(vec![1; 15]).is_err());
    }

    #[test]
    fn rare_blocks_get_a_fresh_id_per_session_and_common_ones_keep_theirs() {
        // Block 1: a system prompt all three sessions send. Block 2: sent by sessions 10 and 11
        // only. Block 3: session 12 alone, twice.
        let sent = [
            (1, 10),
            (2, 10),
            (1, 11),
            (2, 11),
            (1, 12),
            (3, 12),
            (3, 12),
        ];
        let mut sharing = Sharing::new(2);
        for (b, s) in sent {
            sharing.note(b, s);
        }
        let mut r = Renamer::new(&sharing, None);
        let ids: Vec<u64> = sent.iter().map(|&(b, s)| r.block(b, s)).collect();
        assert_eq!(ids[0], ids[2]);
        assert_eq!(ids[0], ids[4]);
        assert_ne!(
            ids[1], ids[3],
            "one pair of sessions is not more than k = 2"
        );
        assert_eq!(ids[5], ids[6], "a session keeps its own id");
        assert_eq!(ids, vec![0, 1, 0, 2, 0, 3, 3]);
        // k = 1: nothing is split.
        let mut all = Sharing::new(1);
        for (b, s) in sent {
            all.note(b, s);
        }
        let mut r = Renamer::new(&all, None);
        let ids: Vec<u64> = sent.iter().map(|&(b, s)| r.block(b, s)).collect();
        assert_eq!(ids, vec![0, 1, 0, 1, 0, 2, 2]);
    }

    #[test]
    fn sessions_are_opaque() {
        let sharing = Sharing::new(1);
        let mut r = Renamer::new(&sharing, None);
        assert_eq!(r.session("00000000003039"), "s0");
        assert_eq!(r.session("000000000003e7"), "s1");
        assert_eq!(r.session("00000000003039"), "s0");
        let k = key(3);
        let partial = format!("{:014x}", keyed_session(&k, 12345));
        let mut r = Renamer::new(&sharing, Some(&k));
        assert_eq!(r.session(&partial), partial);
        // A keyed id: a key of its own per process gives another, and neither shows the digest.
        let other = format!("{:014x}", keyed_session(&Key::random(), 12345));
        assert_ne!(other, partial);
        assert!(!partial.contains("3039") || !other.contains("3039"));
    }
}
