//! Session identity: the bounded ledger that reproduces AIPerf's per-session marker counter. Never reads requests, headers or clocks; keeps a fixed-size digest of each key, never the key.
//!
//! AIPerf's `ConversationSource` keeps one counter per benchmark (shared by warm-up and
//! profiling): every new session *instance* mints `c = 0, 1, 2, …` and is marked with digest
//! inputs `(benchmark_id, c, c, conversation_id)`; every later turn of that instance reuses them.
//! The proxy cannot see AIPerf's session objects, only a session key (by default the
//! `x-correlation-id` header, which AIPerf sends fresh per session instance). So here a session
//! instance *is* its key: the first sight of a key mints the next counter, later sights reuse it.
//! A client that replays a conversation as a new instance must send a new key (AIPerf does: a new
//! `X-Correlation-ID`), otherwise the replay is treated as the same session and gets the same
//! marker. The ledger is bounded (LRU); a session evicted and seen again is a new session with a
//! new counter, so the capacity must exceed the number of sessions alive at once. Each entry
//! holds a 128-bit SHA-256 prefix of its key, not the key, so a session's memory does not grow
//! with its key (a 100 KB `x-correlation-id` costs what a short one does).
//!
//! The counter lives in one process. With `cache_bust.ledger = "stateless"` the proxy keeps no
//! ledger and uses counter 0 for every session, so replicas agree (the `runtime` decides).

use std::num::NonZeroUsize;

use lru::LruCache;
use sha2::{Digest, Sha256};

use super::marker::DigestInputs;

/// What the ledger knows about a session key after [`Ledger::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution {
    /// The session's counter `c` (used as both `recycle_pass` and `trajectory_index`).
    pub counter: u64,
    /// True when this call minted `counter` (first sight of the key, or first since eviction).
    pub new_session: bool,
    /// True when minting pushed the least recently used session out of the ledger.
    pub evicted: bool,
}

impl Resolution {
    /// Digest inputs `(benchmark_id, c, c, trace_id)`. The proxy passes the session key as the
    /// trace id; AIPerf passes the dataset conversation id.
    pub fn digest_inputs(&self, benchmark_id: &str, trace_id: &str) -> DigestInputs {
        // A counter beyond i64::MAX would need 9.2e18 sessions; saturate rather than wrap.
        let c = i64::try_from(self.counter).unwrap_or(i64::MAX);
        DigestInputs {
            benchmark_id: benchmark_id.to_owned(),
            recycle_pass: c,
            trajectory_index: c,
            trace_id: trace_id.to_owned(),
        }
    }
}

/// A session key's identity in the ledger: the first 128 bits of its SHA-256. Two keys share
/// an entry only on a collision, which at 2^-128 per pair does not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyDigest([u8; 16]);

impl KeyDigest {
    /// Computed by the caller, outside any lock the ledger sits behind.
    pub fn of(key: &str) -> Self {
        let hash = Sha256::digest(key.as_bytes());
        let mut d = [0u8; 16];
        d.copy_from_slice(&hash[..16]);
        KeyDigest(d)
    }
}

/// Bounded LRU map `session key -> counter`, with the counter that mints new sessions.
/// Not synchronised: the proxy wraps it in a mutex (each call is O(1)).
#[derive(Debug)]
pub struct Ledger {
    sessions: LruCache<KeyDigest, u64>,
    next: u64,
    evictions: u64,
}

impl Ledger {
    /// An empty ledger holding at most `capacity` sessions; the counter starts at 0.
    pub fn new(capacity: NonZeroUsize) -> Self {
        Ledger {
            sessions: LruCache::new(capacity),
            next: 0,
            evictions: 0,
        }
    }

    /// Looks `key` up: a known key reuses its counter (and becomes most recently used); an
    /// unknown key mints the next counter. The counter counts for the ledger's whole life,
    /// across phases; it never restarts.
    pub fn resolve(&mut self, key: &str) -> Resolution {
        self.resolve_digest(KeyDigest::of(key))
    }

    /// [`Ledger::resolve`] for a key already digested with [`KeyDigest::of`].
    pub fn resolve_digest(&mut self, key: KeyDigest) -> Resolution {
        if let Some(&counter) = self.sessions.get(&key) {
            return Resolution {
                counter,
                new_session: false,
                evicted: false,
            };
        }
        let counter = self.next;
        self.next = self.next.saturating_add(1);
        // `push` only returns an entry here when it evicted one: the key is known to be absent.
        let evicted = self.sessions.push(key, counter).is_some();
        if evicted {
            self.evictions += 1;
        }
        Resolution {
            counter,
            new_session: true,
            evicted,
        }
    }

    /// Sessions currently held.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// True when no session is held.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// The bound given to [`Ledger::new`].
    pub fn capacity(&self) -> NonZeroUsize {
        self.sessions.cap()
    }

    /// Sessions pushed out by newer ones since the ledger was made.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Counters minted so far (= the next counter).
    pub fn minted(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::super::marker::{build_marker, digest};
    use super::super::target::{Phase, Target};
    use super::*;
    use serde_json::Value;

    fn cap(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    /// `conversation_source_sequence`: AIPerf runs five session *instances* of the conversations
    /// session_000000, 000001, 000002, 000000, 000001 and mints counters 0..4; instance 3 reuses
    /// conversation session_000000 but is a new instance, so it gets counter 3. In the proxy an
    /// instance is identified by its session key (AIPerf sends a fresh `X-Correlation-ID` per
    /// instance), so the ledger is driven with one key per instance; the dataset conversation id
    /// is the trace id of the digest (what a client sends in `x-kvbust-trace-id`, or what the
    /// proxy uses when it synthesised the conversation itself).
    #[test]
    fn conversation_source_sequence_via_ledger() {
        let v: Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/cachebust/cachebust.json"
        ))
        .unwrap();
        let seq = v["conversation_source_sequence"].as_array().unwrap();
        assert_eq!(seq.len(), 5);
        let mut ledger = Ledger::new(cap(16));
        let mut checked = 0;
        for (pass, case) in seq.iter().enumerate() {
            let n = case["session_number"].as_u64().unwrap();
            let conv = case["conversation_id"].as_str().unwrap();
            // First request of the instance (e.g. warm-up), then a later turn (profiling):
            // the counter keeps counting across phases and later turns reuse it.
            let key = format!("x-correlation-id-of-instance-{n}");
            let first = ledger.resolve(&key);
            assert!(first.new_session && !first.evicted);
            assert_eq!(first.counter, n);
            assert_eq!(first.counter, pass as u64);
            let inputs = first.digest_inputs("0123456789ab", conv);
            assert_eq!(
                inputs.unique_str(),
                case["expected_digest_input"].as_str().unwrap()
            );
            let want = case["marker"].as_str().unwrap();
            for phase in Phase::ALL {
                assert_eq!(
                    build_marker(Target::FirstTurnPrefix, phase, &inputs).as_deref(),
                    Some(want)
                );
            }
            let again = ledger.resolve(&key);
            assert_eq!(
                again,
                Resolution {
                    counter: n,
                    new_session: false,
                    evicted: false
                }
            );
            checked += 1;
        }
        assert_eq!(checked, 5);
        assert_eq!(ledger.len(), 5);
        assert_eq!(ledger.minted(), 5);

        // Keyed by the conversation id instead (a client replaying a conversation under the same
        // key), instance 3 would be the *same* session as instance 0: counter 0, not 3. That is
        // the documented difference, and why the default key is the per-instance correlation id.
        let mut by_conv = Ledger::new(cap(16));
        let counters: Vec<u64> = seq
            .iter()
            .map(|c| {
                by_conv
                    .resolve(c["conversation_id"].as_str().unwrap())
                    .counter
            })
            .collect();
        assert_eq!(counters, [0, 1, 2, 0, 1]);
    }

    #[test]
    fn bounded_with_lru_eviction() {
        let mut l = Ledger::new(cap(2));
        assert!(l.is_empty());
        assert_eq!(l.resolve("a").counter, 0);
        assert_eq!(l.resolve("b").counter, 1);
        assert_eq!(l.resolve("a").counter, 0); // a is now most recent
        let c = l.resolve("c");
        assert_eq!(
            c,
            Resolution {
                counter: 2,
                new_session: true,
                evicted: true
            }
        );
        assert_eq!(l.evictions(), 1);
        assert_eq!(l.len(), 2);
        assert_eq!(l.resolve("a").counter, 0); // survived: b was the LRU
        let b = l.resolve("b"); // evicted earlier: a new session now
        assert!(b.new_session && b.evicted);
        assert_eq!(b.counter, 3);
        assert_eq!(l.evictions(), 2);
        assert_eq!(l.capacity().get(), 2);
    }

    #[test]
    fn digest_inputs_use_counter_twice() {
        let mut l = Ledger::new(cap(4));
        l.resolve("x");
        let r = l.resolve("session_000001");
        let i = r.digest_inputs("0123456789ab", "session_000001");
        assert_eq!(i.unique_str(), "0123456789ab:1:1:session_000001");
        assert_eq!(digest(&i), "66125f5d7dc1");
    }
}
