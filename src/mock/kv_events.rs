//! vLLM's KV cache events (`--kv-events-config`, vLLM 0.33 `vllm/distributed/kv_events.py`):
//! the settings ([`EventsConfig`], the JSON vLLM takes), the events ([`KvEvent`]), their
//! MessagePack as msgspec writes it ([`encode_batch`]) and a reader of it ([`decode_batch`],
//! also for the older array-shaped events), and the mock's ZMQ PUB [`Publisher`]: multipart
//! `[topic, seq as 8-byte big-endian, payload]`, seq from 0 up.
//!
//! The payload is a `KVEventBatch`: an `array_like` struct `[ts, events, data_parallel_rank]`
//! (`omit_defaults`: the rank is there, the publisher sets it). Each event is a tagged struct
//! written as a map, the tag first (`{"type": "BlockStored", ...}`), every field without a
//! default always (nulls too), a defaulted one only when it differs: `BlockStored`
//! (`block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium`,
//! `lora_name`, then `extra_keys`: one entry per block, and `group_idx`), `BlockRemoved`
//! (`block_hashes`, `medium`, `group_idx`), `AllBlocksCleared`. Block hashes are 64-bit
//! integers (vLLM's default `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`). `extra_keys` is filled as
//! vLLM 0.33's block pool fills it ([`vllm_extra_keys`]): `None` per block without keys, and
//! a request's `cache_salt` as the only key of the prompt's first block; a reader finds the
//! salt again with [`KvEvent::first_block_salt`].
//!
//! Owns the wire format and the publishing socket; never touches the prefix cache itself (the
//! mock hands it what its cache did) and never blocks a request (publishing is a channel send).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;

/// The medium every mock event reports (vLLM's `MEDIUM_GPU`).
pub const MEDIUM_GPU: &str = "GPU";

/// `mock.kv_events`: vLLM's `KVEventsConfig`, as its `--kv-events-config` JSON spells it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    pub enable_kv_cache_events: bool,
    /// `"zmq"` or `"null"`; unset: `"zmq"` when events are enabled.
    pub publisher: Option<String>,
    /// `tcp://*:5557` binds (any `*` or `::`, as vLLM decides); `tcp://host:port` connects.
    pub endpoint: String,
    /// vLLM's replay ROUTER socket: not served by the mock (accepted, logged).
    pub replay_endpoint: Option<String>,
    pub buffer_steps: u64,
    pub hwm: u64,
    pub max_queue_size: u64,
    pub topic: String,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

impl EventsConfig {
    /// Parses the JSON of `--kv-events-config`; the error names the problem and the fix.
    pub fn parse(json: &str) -> Result<Self, String> {
        let c: EventsConfig = serde_json::from_str(json).map_err(|e| {
            format!("mock.kv_events is not vLLM's --kv-events-config JSON ({e}); e.g. '{{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}}'")
        })?;
        match c.publisher.as_deref() {
            None | Some("zmq") | Some("null") => {}
            Some(other) => {
                return Err(format!(
                "mock.kv_events: publisher {other:?} is not one vLLM has; use \"zmq\" or \"null\""
            ))
            }
        }
        if c.publishes() && !c.endpoint.starts_with("tcp://") {
            return Err(format!(
                "mock.kv_events: endpoint {:?} is not a tcp:// endpoint (the mock publishes over TCP only); e.g. \"tcp://*:5557\"",
                c.endpoint
            ));
        }
        Ok(c)
    }

    /// Whether events go out: enabled, and the publisher is ZMQ.
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref().unwrap_or("zmq") == "zmq"
    }

    /// Whether vLLM binds this endpoint (else it connects to it).
    pub fn binds(&self) -> bool {
        self.endpoint.contains('*') || self.endpoint.contains("::")
    }

    /// The endpoint as the socket takes it (`*` is every interface).
    fn socket_endpoint(&self) -> String {
        self.endpoint.replace("//*:", "//0.0.0.0:")
    }
}

/// One entry of a block's `extra_keys` as vLLM 0.33 publishes them, untagged
/// (`kv_cache_utils::to_event_extra_keys`): the LoRA name and the `cache_salt` as bare strings,
/// a multimodal key as an `(identifier, offset)` pair, a prompt-embeddings digest as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraKey {
    /// A bare string: the LoRA name (first, when the event has a `lora_name`) or the salt.
    Text(String),
    /// Any other key, kept as its MessagePack bytes: kvbust reads none of them, and a decoded
    /// event encodes back to what the engine sent.
    Other(Vec<u8>),
}

/// A stored block's extra keys: `None` when its hash had none.
pub type BlockExtraKeys = Option<Vec<ExtraKey>>;

/// `extra_keys` for `n` stored blocks of a request with `cache_salt` `salt`, the first of them
/// block `first` of the prompt, as vLLM 0.33 fills them: `generate_block_hash_extra_keys` adds
/// `("cache_salt", salt)` to the block whose `start_token_idx == 0` only (and only for a
/// non-empty salt), gives `None` to a block without keys, and `to_event_extra_keys` publishes
/// the list untagged (the salt as a 1-tuple of its string), one entry per block, or `None` for
/// no blocks. An unsalted request's blocks are therefore `[None, None, ...]`, not `None`.
pub fn vllm_extra_keys(salt: Option<&str>, first: usize, n: usize) -> Option<Vec<BlockExtraKeys>> {
    let salt = salt.filter(|s| !s.is_empty());
    (n > 0).then(|| {
        (first..first + n)
            .map(|i| match salt {
                Some(s) if i == 0 => Some(vec![ExtraKey::Text(s.to_owned())]),
                _ => None,
            })
            .collect()
    })
}

/// One cache event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks stored, in chain order, after the block `parent` (none: from the start).
    Stored {
        block_hashes: Vec<u64>,
        parent: Option<u64>,
        /// Every stored block's tokens, one after another.
        token_ids: Vec<u32>,
        block_size: u32,
        medium: Option<String>,
        /// The request's LoRA adapter (its name is then the first of each block's extra keys).
        lora_name: Option<String>,
        /// One entry per block in `block_hashes` (`None`: the field was absent).
        extra_keys: Option<Vec<BlockExtraKeys>>,
    },
    /// Blocks evicted.
    Removed {
        block_hashes: Vec<u64>,
        medium: Option<String>,
    },
    /// The whole cache emptied (`/reset_prefix_cache`).
    Cleared,
}

impl KvEvent {
    /// The `cache_salt` of a stored run that starts at the prompt's first block (no parent):
    /// the first bare string of that block's extra keys after the LoRA name, if any (vLLM's
    /// order: LoRA name, multimodal pairs, the salt, embedding digests). A run with a parent
    /// carries no salt: its blocks chain from a parent whose hash already holds it.
    pub fn first_block_salt(&self) -> Option<&str> {
        let KvEvent::Stored {
            parent: None,
            lora_name,
            extra_keys: Some(keys),
            ..
        } = self
        else {
            return None;
        };
        keys.first()?
            .as_ref()?
            .iter()
            .filter_map(|k| match k {
                ExtraKey::Text(s) => Some(s.as_str()),
                ExtraKey::Other(_) => None,
            })
            .nth(usize::from(lora_name.is_some()))
    }
}

/// One `KVEventBatch`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub data_parallel_rank: Option<i64>,
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = rmp::encode::write_str(buf, s);
}

fn put_uint(buf: &mut Vec<u8>, n: u64) {
    let _ = rmp::encode::write_uint(buf, n);
}

fn put_uints(buf: &mut Vec<u8>, items: impl ExactSizeIterator<Item = u64>) {
    let _ = rmp::encode::write_array_len(buf, items.len() as u32);
    for n in items {
        put_uint(buf, n);
    }
}

fn put_opt_str(buf: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_str(buf, s),
        None => {
            let _ = rmp::encode::write_nil(buf);
        }
    }
}

/// The batch's MessagePack, byte for byte as msgspec encodes vLLM's `KVEventBatch`.
pub fn encode_batch(batch: &Batch) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    // Every field, the rank too when it is None: msgspec omits no default of an `array_like`
    // struct (msgspec 0.23 writes `[ts, events, nil]`).
    let _ = rmp::encode::write_array_len(&mut buf, 3);
    let _ = rmp::encode::write_f64(&mut buf, batch.ts);
    let _ = rmp::encode::write_array_len(&mut buf, batch.events.len() as u32);
    for e in &batch.events {
        encode_event(&mut buf, e);
    }
    match batch.data_parallel_rank {
        Some(rank) => {
            let _ = rmp::encode::write_sint(&mut buf, rank);
        }
        None => {
            let _ = rmp::encode::write_nil(&mut buf);
        }
    }
    buf
}

/// A map header as msgspec writes it for a struct under `omit_defaults`: sized for every field
/// the struct has (the count is patched in once the omitted ones are known), so a struct of 16
/// fields or more (`BlockStored`: 15 and its tag) gets a 16-bit header whatever it holds.
fn put_struct_map_len(buf: &mut Vec<u8>, n: u16) {
    buf.push(0xde);
    buf.extend_from_slice(&n.to_be_bytes());
}

fn encode_event(buf: &mut Vec<u8>, e: &KvEvent) {
    match e {
        KvEvent::Stored {
            block_hashes,
            parent,
            token_ids,
            block_size,
            medium,
            lora_name,
            extra_keys,
        } => {
            // The tag, seven fields without a default, `extra_keys` unless it is the default
            // (None) and `group_idx` (which vLLM always sets).
            put_struct_map_len(buf, 9 + u16::from(extra_keys.is_some()));
            put_str(buf, "type");
            put_str(buf, "BlockStored");
            put_str(buf, "block_hashes");
            put_uints(buf, block_hashes.iter().copied());
            put_str(buf, "parent_block_hash");
            match parent {
                Some(p) => put_uint(buf, *p),
                None => {
                    let _ = rmp::encode::write_nil(buf);
                }
            }
            put_str(buf, "token_ids");
            put_uints(buf, token_ids.iter().map(|&t| u64::from(t)));
            put_str(buf, "block_size");
            put_uint(buf, u64::from(*block_size));
            put_str(buf, "lora_id");
            put_opt_str(buf, None);
            put_str(buf, "medium");
            put_opt_str(buf, medium.as_deref());
            put_str(buf, "lora_name");
            put_opt_str(buf, lora_name.as_deref());
            if let Some(keys) = extra_keys {
                put_str(buf, "extra_keys");
                let _ = rmp::encode::write_array_len(buf, keys.len() as u32);
                for block in keys {
                    let Some(block) = block else {
                        let _ = rmp::encode::write_nil(buf);
                        continue;
                    };
                    // A tuple: msgspec writes it as an array.
                    let _ = rmp::encode::write_array_len(buf, block.len() as u32);
                    for key in block {
                        match key {
                            ExtraKey::Text(s) => put_str(buf, s),
                            ExtraKey::Other(raw) => buf.extend_from_slice(raw),
                        }
                    }
                }
            }
            put_str(buf, "group_idx");
            put_uint(buf, 0);
        }
        KvEvent::Removed {
            block_hashes,
            medium,
        } => {
            let _ = rmp::encode::write_map_len(buf, 4);
            put_str(buf, "type");
            put_str(buf, "BlockRemoved");
            put_str(buf, "block_hashes");
            put_uints(buf, block_hashes.iter().copied());
            put_str(buf, "medium");
            put_opt_str(buf, medium.as_deref());
            put_str(buf, "group_idx");
            put_uint(buf, 0);
        }
        KvEvent::Cleared => {
            let _ = rmp::encode::write_map_len(buf, 1);
            put_str(buf, "type");
            put_str(buf, "AllBlocksCleared");
        }
    }
}

/// A block hash: an integer, or (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`) bytes, folded to 64
/// bits (only a hash's identity matters to a reader).
fn hash_of(v: &rmpv::Value) -> Result<u64, String> {
    match v {
        rmpv::Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|n| n as u64))
            .ok_or_else(|| "a block hash is not a 64-bit integer".into()),
        rmpv::Value::Binary(b) => Ok(b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
            (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
        })),
        other => Err(format!("a block hash is {other}, not an integer or bytes")),
    }
}

fn list<'a>(v: Option<&'a rmpv::Value>, what: &str) -> Result<&'a [rmpv::Value], String> {
    v.and_then(rmpv::Value::as_array)
        .map(Vec::as_slice)
        .ok_or_else(|| format!("{what} is not a list"))
}

fn opt_string(v: Option<&rmpv::Value>) -> Option<String> {
    v.and_then(rmpv::Value::as_str).map(str::to_owned)
}

/// `extra_keys`: absent or nil, or a list with a nil or a tuple (an array) per block.
fn extra_keys(v: Option<&rmpv::Value>) -> Result<Option<Vec<BlockExtraKeys>>, String> {
    let entries = match v {
        None | Some(rmpv::Value::Nil) => return Ok(None),
        Some(rmpv::Value::Array(entries)) => entries,
        Some(other) => return Err(format!("extra_keys is {other}, not a list")),
    };
    let key = |k: &rmpv::Value| match k.as_str() {
        Some(text) => ExtraKey::Text(text.to_owned()),
        None => {
            let mut raw = Vec::new();
            let _ = rmpv::encode::write_value(&mut raw, k);
            ExtraKey::Other(raw)
        }
    };
    let block = |e: &rmpv::Value| match e {
        rmpv::Value::Nil => Ok(None),
        rmpv::Value::Array(keys) => Ok(Some(keys.iter().map(key).collect())),
        other => Err(format!("a block's extra keys are {other}, not a tuple")),
    };
    entries
        .iter()
        .map(block)
        .collect::<Result<_, _>>()
        .map(Some)
}

/// Reads one `KVEventBatch` (vLLM 0.33's map-shaped events, or the older array-shaped ones
/// `["BlockStored", hashes, parent, tokens, block_size, lora_id, medium]`).
pub fn decode_batch(payload: &[u8]) -> Result<Batch, String> {
    let v = rmpv::decode::read_value(&mut &payload[..]).map_err(|e| e.to_string())?;
    let top = v.as_array().ok_or("the batch is not an array")?;
    let ts = top
        .first()
        .and_then(rmpv::Value::as_f64)
        .ok_or("the batch has no timestamp")?;
    let events = list(top.get(1), "the batch's events")?
        .iter()
        .map(decode_event)
        .collect::<Result<Vec<_>, _>>()?;
    let data_parallel_rank = top.get(2).and_then(rmpv::Value::as_i64);
    Ok(Batch {
        ts,
        events,
        data_parallel_rank,
    })
}

fn decode_event(v: &rmpv::Value) -> Result<KvEvent, String> {
    // Field names in order, for the array shape.
    const STORED: [&str; 6] = [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ];
    const REMOVED: [&str; 2] = ["block_hashes", "medium"];
    let (tag, fields): (&str, Vec<(&str, &rmpv::Value)>) = match v {
        rmpv::Value::Map(entries) => {
            let mut tag = "";
            let mut fields = Vec::with_capacity(entries.len());
            for (k, val) in entries {
                let k = k.as_str().ok_or("an event's key is not a string")?;
                if k == "type" {
                    tag = val.as_str().ok_or("an event's type is not a string")?;
                } else {
                    fields.push((k, val));
                }
            }
            (tag, fields)
        }
        rmpv::Value::Array(items) => {
            let tag = items
                .first()
                .and_then(rmpv::Value::as_str)
                .ok_or("an event has no tag")?;
            let names: &[&str] = match tag {
                "BlockStored" => &STORED,
                "BlockRemoved" => &REMOVED,
                _ => &[],
            };
            (
                tag,
                names.iter().copied().zip(items.iter().skip(1)).collect(),
            )
        }
        other => return Err(format!("an event is {other}, not a map or an array")),
    };
    let get = |name: &str| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    match tag {
        "BlockStored" => {
            let block_hashes = list(get("block_hashes"), "block_hashes")?
                .iter()
                .map(hash_of)
                .collect::<Result<_, _>>()?;
            let parent = match get("parent_block_hash") {
                None | Some(rmpv::Value::Nil) => None,
                Some(p) => Some(hash_of(p)?),
            };
            let token_ids = list(get("token_ids"), "token_ids")?
                .iter()
                .map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect::<Option<_>>()
                .ok_or("a token id is not a 32-bit integer")?;
            let block_size = get("block_size")
                .and_then(rmpv::Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("block_size is not an integer")?;
            Ok(KvEvent::Stored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                medium: opt_string(get("medium")),
                lora_name: opt_string(get("lora_name")),
                extra_keys: extra_keys(get("extra_keys"))?,
            })
        }
        "BlockRemoved" => Ok(KvEvent::Removed {
            block_hashes: list(get("block_hashes"), "block_hashes")?
                .iter()
                .map(hash_of)
                .collect::<Result<_, _>>()?,
            medium: opt_string(get("medium")),
        }),
        "AllBlocksCleared" => Ok(KvEvent::Cleared),
        other => Err(format!("unknown event type {other:?}")),
    }
}

/// The seconds since the epoch, as Python's `time.time()`.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The mock's publisher: a task owning the PUB socket, fed through an unbounded channel (a
/// request only pushes its events), numbering batches from 0.
pub struct Publisher {
    tx: tokio::sync::mpsc::UnboundedSender<Vec<KvEvent>>,
    endpoint: String,
    sent: Arc<AtomicU64>,
    queued: AtomicU64,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Binds (or connects) the PUB socket as vLLM would and starts the sending task.
    pub async fn start(cfg: &EventsConfig) -> Result<Self, String> {
        use zeromq::Socket as _;
        let mut socket = zeromq::PubSocket::new();
        let endpoint = if cfg.binds() {
            socket
                .bind(&cfg.socket_endpoint())
                .await
                .map(|e| e.to_string())
                .map_err(|e| format!("mock.kv_events: cannot bind {}: {e}", cfg.endpoint))?
        } else {
            socket
                .connect(&cfg.endpoint)
                .await
                .map_err(|e| format!("mock.kv_events: cannot connect to {}: {e}", cfg.endpoint))?;
            cfg.endpoint.clone()
        };
        if let Some(r) = &cfg.replay_endpoint {
            tracing::warn!(replay_endpoint = %r, "mock.kv_events: the mock serves no replay socket; subscribers see gaps as lost events");
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<KvEvent>>();
        let sent = Arc::new(AtomicU64::new(0));
        let topic = Bytes::from(cfg.topic.clone().into_bytes());
        let counter = sent.clone();
        tokio::spawn(async move {
            use zeromq::SocketSend as _;
            let mut seq: u64 = 0;
            while let Some(events) = rx.recv().await {
                let batch = Batch {
                    ts: now(),
                    events,
                    data_parallel_rank: Some(0),
                };
                let payload = Bytes::from(encode_batch(&batch));
                let frames = vec![
                    topic.clone(),
                    Bytes::copy_from_slice(&seq.to_be_bytes()),
                    payload,
                ];
                if let Ok(msg) = zeromq::ZmqMessage::try_from(frames) {
                    if let Err(e) = socket.send(msg).await {
                        tracing::debug!(error = %e, "mock.kv_events: send failed");
                    }
                }
                seq += 1;
                counter.store(seq, Ordering::Release);
            }
        });
        Ok(Publisher {
            tx,
            endpoint,
            sent,
            queued: AtomicU64::new(0),
        })
    }

    /// Queues one batch of events (nothing when empty).
    pub fn publish(&self, events: Vec<KvEvent>) {
        if !events.is_empty() && self.tx.send(events).is_ok() {
            self.queued.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Batches queued so far (sent or about to be): the seq of the next one.
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Acquire)
    }

    /// The endpoint the socket is bound or connected to (a bound port 0 resolved).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Batches handed to the socket so far (the next batch's seq).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> KvEvent {
        KvEvent::Stored {
            block_hashes: vec![1, u64::MAX, 300],
            parent: Some(0xdead_beef_cafe),
            token_ids: (0..12).chain([70_000]).collect(),
            block_size: 4,
            medium: Some(MEDIUM_GPU.into()),
            lora_name: None,
            extra_keys: vllm_extra_keys(None, 5, 3),
        }
    }

    /// A salted request's first stored run: the salt is the first block's only extra key (a
    /// 1-tuple, msgspec's array), every later block's entry is nil; the bytes read back to the
    /// same event, whose salt is found; a run with a parent carries no salt, and neither does
    /// an unsalted request's run.
    #[test]
    fn a_salt_is_the_first_blocks_extra_key_only() {
        let salted = KvEvent::Stored {
            block_hashes: vec![11, 12, 13],
            parent: None,
            token_ids: (0..12).collect(),
            block_size: 4,
            medium: Some(MEDIUM_GPU.into()),
            lora_name: None,
            extra_keys: vllm_extra_keys(Some("salt"), 0, 3),
        };
        let bytes = encode_batch(&Batch {
            ts: 0.0,
            events: vec![salted.clone()],
            data_parallel_rank: None,
        });
        // As msgspec encodes vLLM's classes (checked against msgspec 0.23 and vLLM 0.33's
        // `BlockStored(..., extra_keys=[("salt",), None, None], group_idx=0)`), the batch's
        // rank (None) last.
        let want = b"\xaaextra_keys\x93\x91\xa4salt\xc0\xc0\xa9group_idx\x00\xc0";
        assert!(bytes.ends_with(want), "{bytes:02x?}");
        assert_eq!(bytes[11..14], [0xde, 0, 10]);
        let back = decode_batch(&bytes).expect("reads").events;
        assert_eq!(back, std::slice::from_ref(&salted));
        assert_eq!(back[0].first_block_salt(), Some("salt"));
        // The salt's run continued by a later request: no block starts at token 0.
        assert_eq!(vllm_extra_keys(Some("salt"), 3, 2), Some(vec![None, None]));
        assert_eq!(vllm_extra_keys(Some(""), 0, 1), Some(vec![None]));
        assert_eq!(vllm_extra_keys(Some("salt"), 0, 0), None);
        assert_eq!(stored().first_block_salt(), None);
        let KvEvent::Stored { extra_keys, .. } = &salted else {
            unreachable!()
        };
        let unsalted = KvEvent::Stored {
            block_hashes: vec![11],
            parent: None,
            token_ids: (0..4).collect(),
            block_size: 4,
            medium: None,
            lora_name: None,
            extra_keys: vllm_extra_keys(None, 0, 1),
        };
        assert_eq!(unsalted.first_block_salt(), None);
        assert_eq!(extra_keys.as_ref().map(Vec::len), Some(3));
    }

    /// A real engine's keys in vLLM's order: the LoRA name, a multimodal pair, the salt, an
    /// embeddings digest. The salt is the bare string after the LoRA name; the pair and the
    /// digest survive a decode and encode byte for byte; without `extra_keys` (msgspec's
    /// default, omitted) the event has one field fewer.
    #[test]
    fn the_salt_is_found_among_a_real_engines_keys() {
        let mut pair = Vec::new();
        let _ = rmp::encode::write_array_len(&mut pair, 2);
        put_str(&mut pair, "img-1");
        put_uint(&mut pair, 3);
        let mut digest = Vec::new();
        let _ = rmp::encode::write_bin(&mut digest, &[7; 32]);
        let event = KvEvent::Stored {
            block_hashes: vec![1, 2],
            parent: None,
            token_ids: (0..8).collect(),
            block_size: 4,
            medium: None,
            lora_name: Some("adapter".into()),
            extra_keys: Some(vec![
                Some(vec![
                    ExtraKey::Text("adapter".into()),
                    ExtraKey::Other(pair),
                    ExtraKey::Text("tenant-7".into()),
                    ExtraKey::Other(digest),
                ]),
                Some(vec![ExtraKey::Text("adapter".into())]),
            ]),
        };
        let batch = Batch {
            ts: 3.0,
            events: vec![event],
            data_parallel_rank: Some(1),
        };
        let bytes = encode_batch(&batch);
        let back = decode_batch(&bytes).expect("reads");
        assert_eq!(back, batch);
        assert_eq!(encode_batch(&back), bytes);
        assert_eq!(back.events[0].first_block_salt(), Some("tenant-7"));
        let bare = KvEvent::Stored {
            block_hashes: vec![1],
            parent: None,
            token_ids: (0..4).collect(),
            block_size: 4,
            medium: None,
            lora_name: None,
            extra_keys: None,
        };
        let bytes = encode_batch(&Batch {
            ts: 0.0,
            events: vec![bare.clone()],
            data_parallel_rank: None,
        });
        assert_eq!(bytes[11..14], [0xde, 0, 9]);
        assert!(!bytes.windows(10).any(|w| w == b"extra_keys"));
        assert_eq!(decode_batch(&bytes).expect("reads").events, [bare]);
    }

    /// The bytes msgspec writes for vLLM's classes, spelled out by hand from the format:
    /// fixarray(3), float64, the events (fixmaps here; `BlockStored`'s is a map16), positive
    /// fixint 0.
    #[test]
    fn batches_encode_as_msgspec_does() {
        let batch = Batch {
            ts: 1.5,
            events: vec![KvEvent::Cleared],
            data_parallel_rank: Some(0),
        };
        let mut want = vec![0x93, 0xcb];
        want.extend(1.5f64.to_be_bytes());
        want.push(0x91);
        want.push(0x81);
        want.extend(b"\xa4type\xb0AllBlocksCleared");
        want.push(0x00);
        assert_eq!(encode_batch(&batch), want);
        let removed = encode_batch(&Batch {
            ts: 0.0,
            events: vec![KvEvent::Removed {
                block_hashes: vec![u64::MAX],
                medium: Some("GPU".into()),
            }],
            data_parallel_rank: None,
        });
        let mut want = vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x84];
        want.extend(b"\xa4type\xacBlockRemoved\xacblock_hashes\x91\xcf");
        want.extend(u64::MAX.to_be_bytes());
        want.extend(b"\xa6medium\xa3GPU\xa9group_idx\x00\xc0");
        assert_eq!(removed, want);
        let stored = encode_batch(&Batch {
            ts: 0.0,
            events: vec![stored()],
            data_parallel_rank: None,
        });
        assert_eq!(stored[11..14], [0xde, 0, 10]);
    }

    #[test]
    fn every_event_reads_back() {
        let batch = Batch {
            ts: 1_733_390_000.25,
            events: vec![
                stored(),
                KvEvent::Removed {
                    block_hashes: vec![7, 8],
                    medium: None,
                },
                KvEvent::Cleared,
            ],
            data_parallel_rank: Some(0),
        };
        assert_eq!(decode_batch(&encode_batch(&batch)), Ok(batch));
        assert!(decode_batch(b"\x93").is_err());
        assert!(decode_batch(b"\xc0").is_err());
    }

    /// vLLM before 0.10 wrote events as arrays, the tag first.
    #[test]
    fn array_shaped_events_read_too() {
        let mut buf = Vec::new();
        let _ = rmp::encode::write_array_len(&mut buf, 2);
        let _ = rmp::encode::write_f64(&mut buf, 2.0);
        let _ = rmp::encode::write_array_len(&mut buf, 1);
        let _ = rmp::encode::write_array_len(&mut buf, 7);
        put_str(&mut buf, "BlockStored");
        put_uints(&mut buf, [5u64].into_iter());
        let _ = rmp::encode::write_nil(&mut buf);
        put_uints(&mut buf, [1u64, 2].into_iter());
        put_uint(&mut buf, 2);
        let _ = rmp::encode::write_nil(&mut buf);
        put_str(&mut buf, "GPU");
        let got = decode_batch(&buf).expect("reads");
        assert_eq!(
            got.events,
            [KvEvent::Stored {
                block_hashes: vec![5],
                parent: None,
                token_ids: vec![1, 2],
                block_size: 2,
                medium: Some("GPU".into()),
                lora_name: None,
                extra_keys: None,
            }]
        );
    }

    #[test]
    fn the_config_is_vllms_json() {
        let c = EventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"}"#,
        )
        .expect("valid");
        assert!(c.publishes() && c.binds());
        assert_eq!(c.socket_endpoint(), "tcp://0.0.0.0:5557");
        assert!(!EventsConfig::parse(r#"{"enable_kv_cache_events": false}"#)
            .expect("valid")
            .publishes());
        let c = EventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "endpoint": "tcp://router:5557"}"#,
        )
        .expect("valid");
        assert!(c.publishes() && !c.binds());
        for bad in [
            r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#,
            r#"{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/x"}"#,
            r#"{"enable": true}"#,
            "not json",
        ] {
            let e = EventsConfig::parse(bad).expect_err(bad);
            assert!(e.starts_with("mock.kv_events"), "{e}");
        }
    }
}
