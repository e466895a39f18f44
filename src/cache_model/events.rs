//! Following an engine's KV cache events (`cache_model.kv_events = "tcp://HOST:PORT"`): a
//! task subscribes to the engine's ZMQ PUB socket (SUB, connect, every topic), reads each
//! `KVEventBatch` ([`crate::mock::kv_events::decode_batch`]), counts seq gaps as lost batches
//! and hands the events to the worker, which applies them to its index before the next
//! request ([`Follow::apply`]): a stored block is matched to the model's own block by its
//! token ids and its parent chain (a run from the prompt's first block by its `cache_salt`
//! too, which the engine publishes in that block's `extra_keys`, as the model keys its own
//! first block by it), a removed one leaves the index, a clear empties it.
//! Matching maps the engine's hash to the model's; the model's index gets a block when it
//! serves the request that carries it, as without events.
//! Owns the subscription, its counters and the engine-to-model block map; never touches the
//! request path and never blocks the worker (it drains a channel).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use crate::mock::kv_events::{decode_batch, KvEvent};
use crate::mock::prefix_cache::{chain_after, chain_salted};

use super::index::BlockIndex;

/// What the subscription saw, for the run report.
#[derive(Debug, Default)]
pub struct EventStats {
    /// Batches received.
    pub batches: AtomicU64,
    /// Batches lost: gaps in `seq` (the engine sent them, kvbust never saw them).
    pub lost_batches: AtomicU64,
    /// The last `seq` received (meaningful once `batches` > 0).
    pub last_seq: AtomicU64,
    /// Batches that did not decode.
    pub undecodable: AtomicU64,
    /// Blocks the engine reported stored, removed; clears.
    pub stored_blocks: AtomicU64,
    pub removed_blocks: AtomicU64,
    pub cleared: AtomicU64,
    /// Removed blocks the model held: hits it would have predicted that the engine evicted.
    pub evicted_in_model: AtomicU64,
    /// Stored blocks the model could not place (unknown parent, another block size).
    pub unmatched_blocks: AtomicU64,
    /// Batches handed to the worker's channel (each job notes how many came before it).
    pub handed: AtomicU64,
    /// Whether the subscription is connected.
    pub connected: AtomicBool,
}

impl EventStats {
    /// The report's view.
    pub fn facts(&self, endpoint: &str) -> crate::report::KvEventsFacts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        crate::report::KvEventsFacts {
            endpoint: endpoint.to_owned(),
            batches: get(&self.batches),
            lost_batches: get(&self.lost_batches),
            last_seq: (get(&self.batches) > 0).then(|| get(&self.last_seq)),
            stored_blocks: get(&self.stored_blocks),
            removed_blocks: get(&self.removed_blocks),
            cleared: get(&self.cleared),
            evicted_in_model: get(&self.evicted_in_model),
            unmatched_blocks: get(&self.unmatched_blocks),
            complete: get(&self.lost_batches) == 0 && get(&self.undecodable) == 0,
        }
    }

    /// Counts batch `seq`: a jump past the next expected one is that many lost batches (the
    /// first batch seen sets the start: a subscriber joins a running engine).
    fn saw(&self, seq: u64) {
        let n = self.batches.fetch_add(1, Ordering::AcqRel);
        if n > 0 {
            let last = self.last_seq.load(Ordering::Acquire);
            if seq > last.wrapping_add(1) {
                self.lost_batches
                    .fetch_add(seq - last - 1, Ordering::AcqRel);
            }
        }
        self.last_seq.store(seq, Ordering::Release);
    }
}

/// Subscribes to `endpoint` on the current tokio runtime (none: a warning, no events) and
/// sends each batch's events to `tx` until the worker is gone. Reconnects after a failure.
pub fn spawn(endpoint: String, tx: Sender<Vec<KvEvent>>, stats: Arc<EventStats>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(%endpoint, "cache_model.kv_events: no runtime to subscribe from; events are off");
        return;
    };
    rt.spawn(async move {
        loop {
            match subscribe(&endpoint, &tx, &stats).await {
                Ok(()) => return,
                Err(e) => {
                    stats.connected.store(false, Ordering::Release);
                    tracing::warn!(%endpoint, "cache_model.kv_events: {e}; reconnecting in 1s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
}

/// One subscription: `Ok` when the worker is gone, `Err` when the socket failed.
async fn subscribe(
    endpoint: &str,
    tx: &Sender<Vec<KvEvent>>,
    stats: &EventStats,
) -> Result<(), String> {
    use zeromq::{Socket as _, SocketRecv as _};
    let mut sub = zeromq::SubSocket::new();
    sub.connect(endpoint).await.map_err(|e| e.to_string())?;
    sub.subscribe("").await.map_err(|e| e.to_string())?;
    stats.connected.store(true, Ordering::Release);
    tracing::info!(%endpoint, "cache model: following the engine's KV cache events");
    loop {
        let msg = sub.recv().await.map_err(|e| e.to_string())?;
        let frames = msg.into_vec();
        let [_topic, seq, payload] = frames.as_slice() else {
            stats.undecodable.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let Ok(seq) = <[u8; 8]>::try_from(seq.as_ref()).map(u64::from_be_bytes) else {
            stats.undecodable.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        match decode_batch(payload) {
            Ok(batch) => {
                // Handed over before counted: whoever sees the count finds the events queued.
                if tx.send(batch.events).is_err() {
                    return Ok(());
                }
                stats.handed.fetch_add(1, Ordering::AcqRel);
                stats.saw(seq);
            }
            Err(e) => {
                stats.saw(seq);
                stats.undecodable.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("cache_model.kv_events: batch {seq} does not decode: {e}");
            }
        }
    }
}

/// The worker's side: the engine's block hashes mapped to the model's, to apply events.
#[derive(Debug, Default)]
pub struct Follow {
    engine_to_model: HashMap<u64, u64>,
}

impl Follow {
    /// Applies `events` to `index`, counting into `stats`.
    pub fn apply(&mut self, index: &mut BlockIndex, events: Vec<KvEvent>, stats: &EventStats) {
        for e in events {
            let salt = e.first_block_salt().map(str::to_owned);
            match e {
                KvEvent::Stored {
                    block_hashes,
                    parent,
                    token_ids,
                    block_size,
                    ..
                } => self.stored(
                    index,
                    &block_hashes,
                    (parent, salt.as_deref()),
                    &token_ids,
                    block_size,
                    stats,
                ),
                KvEvent::Removed { block_hashes, .. } => {
                    stats
                        .removed_blocks
                        .fetch_add(block_hashes.len() as u64, Ordering::Relaxed);
                    for h in block_hashes {
                        let Some(model) = self.engine_to_model.remove(&h) else {
                            continue;
                        };
                        if index.remove(model) {
                            stats.evicted_in_model.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                KvEvent::Cleared => {
                    stats.cleared.fetch_add(1, Ordering::Relaxed);
                    self.engine_to_model.clear();
                    index.clear();
                }
            }
        }
    }

    /// A stored run of blocks: each is the model's block whose hash follows from its parent's
    /// and its tokens (the parent found through the map, or the chain's root and the run's
    /// `salt`: the salt the engine published for the prompt's first block).
    fn stored(
        &mut self,
        index: &mut BlockIndex,
        hashes: &[u64],
        (parent, salt): (Option<u64>, Option<&str>),
        tokens: &[u32],
        block_size: u32,
        stats: &EventStats,
    ) {
        let n = hashes.len() as u64;
        stats.stored_blocks.fetch_add(n, Ordering::Relaxed);
        let parent = match parent {
            None => Some(None),
            Some(p) => self.engine_to_model.get(&p).map(|m| Some(*m)),
        };
        let bs = index.block_size();
        let (Some(parent), true) = (parent, block_size as usize == bs) else {
            stats.unmatched_blocks.fetch_add(n, Ordering::Relaxed);
            return;
        };
        // Mapped, not inserted: the model caches the blocks of what it forwards when it serves
        // the request, and this event may arrive before the worker reaches that request (an
        // insert now would predict the request's own blocks as a hit). Blocks other traffic
        // stored (a shared engine) stay unknown to the model.
        let model = match parent {
            // From the prompt's start: the model's first block is keyed by the request's salt
            // (worker: `chain_salted`), so an unsalted chain would map a salted engine block to
            // a block the model never has, and its eviction would never reach the index.
            None => chain_salted(tokens, bs, salt),
            Some(_) => chain_after(parent, tokens, bs),
        };
        for (engine, model) in hashes.iter().zip(&model) {
            self.engine_to_model.insert(*engine, *model);
        }
        let placed = model.len().min(hashes.len()) as u64;
        stats
            .unmatched_blocks
            .fetch_add(n - placed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::prefix_cache::PrefixCache;
    use std::num::NonZeroUsize;

    /// The mock's cache, told through its events to an index that also serves the requests
    /// itself: the index holds exactly the mock's blocks after every request, though its own
    /// capacity is far larger; with engine hashes that are not the model's (a real vLLM's),
    /// the blocks are still found by their tokens and parents; and with requests under
    /// `cache_salt`s (the model keys their first block by the salt, the engine publishes it in
    /// that block's `extra_keys`), each salted block is still the model's own.
    #[test]
    fn events_keep_a_larger_index_equal_to_the_engines_cache() {
        for salted in [false, true] {
            for scramble in [0u64, 0x9e37_79b9_7f4a_7c15] {
                let what = format!("salted {salted}, scramble {scramble:x}");
                let bs = 4;
                let mut engine = PrefixCache::new(bs, 10);
                let mut index = BlockIndex::new(bs, NonZeroUsize::new(1000).expect("non-zero"));
                let mut follow = Follow::default();
                let stats = EventStats::default();
                let owner = |_| super::super::index::Owner {
                    session: 1,
                    phase: crate::cachebust::Phase::Profiling,
                    past_iso: false,
                };
                for i in 0..60u32 {
                    let tokens: Vec<u32> =
                        (0..(4 + i % 7) * 4).map(|t| t + (i % 5) * 1000).collect();
                    let salt = [Some("tenant-a"), Some("tenant-b"), None][i as usize % 3]
                        .filter(|_| salted);
                    let hashes = chain_salted(&tokens, bs, salt);
                    let hit = index.serve(&hashes, tokens.len(), owner);
                    let mut events = Vec::new();
                    let (cached, _) = engine.admit_with_events(&tokens, salt, &mut events);
                    assert_eq!(hit.owners.len() * bs, cached, "{what}: request {i}");
                    let events = events.into_iter().map(|e| rehash(e, scramble)).collect();
                    follow.apply(&mut index, events, &stats);
                    assert_eq!(index.len(), engine.len(), "{what}: request {i}");
                }
                assert!(stats.removed_blocks.load(Ordering::Relaxed) > 0, "{what}");
                assert_eq!(stats.unmatched_blocks.load(Ordering::Relaxed), 0, "{what}");
                follow.apply(&mut index, vec![KvEvent::Cleared], &stats);
                assert!(index.is_empty());
            }
        }
    }

    /// An engine's own hashes: the mock's, scrambled (0: unchanged).
    fn rehash(e: KvEvent, k: u64) -> KvEvent {
        let f = |h: u64| h ^ k;
        match e {
            KvEvent::Stored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                medium,
                lora_name,
                extra_keys,
            } => KvEvent::Stored {
                block_hashes: block_hashes.into_iter().map(f).collect(),
                parent: parent.map(f),
                token_ids,
                block_size,
                medium,
                lora_name,
                extra_keys,
            },
            KvEvent::Removed {
                block_hashes,
                medium,
            } => KvEvent::Removed {
                block_hashes: block_hashes.into_iter().map(f).collect(),
                medium,
            },
            KvEvent::Cleared => KvEvent::Cleared,
        }
    }

    #[test]
    fn seq_gaps_count_lost_batches() {
        let s = EventStats::default();
        for seq in [5, 6, 7, 10, 11, 15] {
            s.saw(seq);
        }
        assert_eq!(s.batches.load(Ordering::Relaxed), 6);
        assert_eq!(s.lost_batches.load(Ordering::Relaxed), 2 + 3);
        assert!(!s.facts("x").complete);
    }
}
