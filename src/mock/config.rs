//! `MockConfig`: the mock model server's knobs (model name, tokenizer, pacing, prefix-cache geometry, recorder
//! budget) with quick-start defaults. Owns only the typed settings, their serde shape and their validation; it
//! never loads a tokenizer or reads the environment (the config layer and [`super::Mock::from_config`] do).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::mock::MAX_BODY_BYTES;
use crate::synth::tokenizer::pyjinja::TemplateDate;
use crate::units::ByteSize;

/// Which tokenizer the mock counts prompt tokens with (`mock.tokenizer`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum MockTokenizerSetting {
    /// `"qwen3"`: the shipped Qwen3 tokenizer and its chat template (the default).
    #[default]
    Qwen3,
    /// `"builtin"`: a cheap deterministic BPE-like splitter, no chat template (fastest).
    Builtin,
    /// Any other string: a `tokenizer.json` file, or a folder with `tokenizer.json` (+ `tokenizer_config.json`
    /// for the chat template).
    Path(PathBuf),
}

impl fmt::Display for MockTokenizerSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MockTokenizerSetting::Qwen3 => f.write_str("qwen3"),
            MockTokenizerSetting::Builtin => f.write_str("builtin"),
            MockTokenizerSetting::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

impl MockTokenizerSetting {
    /// Whether a path setting names a `tokenizer.json` file or a folder holding one (the
    /// built-in settings always exist).
    pub fn exists(&self) -> bool {
        match self {
            MockTokenizerSetting::Path(p) if p.is_dir() => p.join("tokenizer.json").is_file(),
            MockTokenizerSetting::Path(p) => p.is_file(),
            _ => true,
        }
    }
}

impl From<&str> for MockTokenizerSetting {
    fn from(s: &str) -> Self {
        match s {
            "qwen3" => MockTokenizerSetting::Qwen3,
            "builtin" => MockTokenizerSetting::Builtin,
            path => MockTokenizerSetting::Path(PathBuf::from(path)),
        }
    }
}

impl Serialize for MockTokenizerSetting {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MockTokenizerSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.trim().is_empty() {
            return Err(serde::de::Error::custom(
                "must be \"qwen3\", \"builtin\" or a path to a tokenizer.json file or folder",
            ));
        }
        Ok(MockTokenizerSetting::from(s.as_str()))
    }
}

/// What an injected failure does (`mock.failure_kinds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// 429 `rate_limit_exceeded`, with `retry-after`, as a saturated engine or gateway answers.
    #[serde(rename = "429")]
    TooManyRequests,
    /// 500 `internal_server_error`.
    #[serde(rename = "500")]
    Internal,
    /// 503 `service_unavailable`, with `retry-after`.
    #[serde(rename = "503")]
    Unavailable,
    /// The connection is cut after half the tokens (a stream) or before any byte of the body.
    #[serde(rename = "reset")]
    Reset,
    /// Nothing more is sent after half the tokens (a stream), or nothing at all: the client's
    /// timeout has to end it.
    #[serde(rename = "stall")]
    Stall,
}

impl FailureKind {
    pub const ALL: [FailureKind; 5] = [
        FailureKind::TooManyRequests,
        FailureKind::Internal,
        FailureKind::Unavailable,
        FailureKind::Reset,
        FailureKind::Stall,
    ];
}

/// Largest `mock.record_bytes` accepted: the recorder is for tests and diagnostics, not an archive.
pub const MAX_RECORD_BYTES: u64 = 4 << 30;

/// Settings of the built-in mock model server.
///
/// Serialised with durations as humantime strings (`"15ms"`); unknown keys are rejected and absent keys take
/// the defaults below.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MockConfig {
    /// Model id reported by `/v1/models` and in responses when the request names none (default `kvbust-mock`).
    pub model: String,
    /// Tokenizer prompt tokens are counted with (default `"qwen3"`, the shipped one; `"builtin"` is cheaper but
    /// counts differently; or a path). Chat-shaped prompts are rendered through its chat template first.
    pub tokenizer: MockTokenizerSetting,
    /// The day a chat template's `strftime_now` reads (Llama 3.x writes "Today Date: …" into
    /// every prompt): `"today"` (UTC, the default) or a fixed `"YYYY-MM-DD"`.
    pub chat_template_date: TemplateDate,
    /// Fixed cost before the first token of every completion (default `5ms`).
    #[serde(with = "crate::units::duration")]
    pub base_delay: Duration,
    /// Prefill cost per prompt token that is not served from the simulated prefix cache (default `20us`).
    #[serde(with = "crate::units::duration")]
    pub prefill_per_token: Duration,
    /// Delay between consecutive output tokens (default `15ms`).
    #[serde(with = "crate::units::duration")]
    pub inter_token: Duration,
    /// Tokens per KV block of the simulated prefix cache (default 16, as vLLM). 0 disables the cache.
    pub block_size: usize,
    /// Capacity of the simulated prefix cache in blocks, evicted least recently used (default 16384). 0 disables it.
    pub cache_blocks: usize,
    /// Completion length when the request sets neither `max_tokens` nor `max_completion_tokens` (default 16).
    pub default_max_tokens: u32,
    /// Context length: a request whose prompt plus requested output tokens exceed it is rejected with 400, as
    /// vLLM does (default 131072). 0 means no limit.
    pub max_model_len: usize,
    /// How many of the most recent requests the recorder keeps with headers and body (default 1024); counters
    /// are always kept. Bounds memory when the mock serves a long benchmark.
    pub record_requests: usize,
    /// Byte budget for all the recorder keeps, heads and bodies (default 16 MiB): past it, the oldest kept
    /// bodies are dropped (their size and sha256 stay), then the oldest requests; a body larger than the
    /// budget is never kept.
    pub record_bytes: ByteSize,
    /// Largest request body the mock reads, on any route (default 64 MiB, at most 256 MiB): 413 above. Run
    /// inside `kvbust serve`, what it buffers also counts against `limits.max_buffered_total`.
    pub max_body: ByteSize,
    /// The model names served, as vLLM's `--served-model-name` (default: none). Set: a request
    /// for another model gets vLLM's 404 and `/v1/models` lists exactly these; a request without
    /// a model gets the first. Unset: any model is accepted, each new name logged once.
    pub served_model_names: Vec<String>,
    /// Requests generating at once, as vLLM's `--max-num-seqs` (default 0: no limit); the rest
    /// wait in a queue, first come first served, and their TTFT counts the wait.
    pub max_num_seqs: usize,
    /// Standard deviation of a normal jitter added to each delay (the first token's and every
    /// gap between tokens; never below zero) (default 0: none).
    #[serde(with = "crate::units::duration")]
    pub jitter: Duration,
    /// Prefill cost per uncached prompt token added for each other request running when this
    /// one starts, so TTFT rises with load as on an engine (default 0: none).
    #[serde(with = "crate::units::duration")]
    pub prefill_per_running: Duration,
    /// Uncached prompt tokens the engine prefills per second, one budget shared by every request,
    /// first come first served, as one GPU prefills (default: none, each request prefills alone
    /// at `prefill_per_token`). Set, it replaces `prefill_per_token`: a request's first token
    /// waits for the prefills admitted before it, so TTFT grows with load and uncached tokens.
    pub prefill_tokens_per_s: Option<u64>,
    /// Output tokens per second shared by the running requests (within `max_num_seqs`) (default:
    /// none). Set, each gap between a request's tokens is at least running requests / this, and
    /// never below `inter_token`.
    pub decode_tokens_per_s: Option<u64>,
    /// Share of generation requests (0 to 1) that fail on purpose (default 0: none), each with
    /// a kind drawn from `failure_kinds`.
    pub failure_rate: f64,
    /// The failures drawn from when `failure_rate` > 0 (default: all of "429", "500", "503",
    /// "reset", "stall").
    pub failure_kinds: Vec<FailureKind>,
    /// Seed of the jitter and failure draws (default: none, a random one per process); set,
    /// the n-th request gets the same draws every run.
    pub seed: Option<u64>,
    /// vLLM's KV cache events (default: none): the JSON of vLLM's `--kv-events-config`, e.g.
    /// `{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}`.
    /// The mock then publishes a `BlockStored` per request's new blocks, a `BlockRemoved` per
    /// block evicted (`cache_blocks` bounds the cache) and `AllBlocksCleared` on
    /// `/reset_prefix_cache`, on a ZMQ PUB socket as vLLM 0.33 does.
    pub kv_events: Option<String>,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            model: "kvbust-mock".to_owned(),
            tokenizer: MockTokenizerSetting::Qwen3,
            chat_template_date: TemplateDate::Today,
            base_delay: Duration::from_millis(5),
            prefill_per_token: Duration::from_micros(20),
            inter_token: Duration::from_millis(15),
            block_size: 16,
            cache_blocks: 16384,
            default_max_tokens: 16,
            max_model_len: 131_072,
            record_requests: 1024,
            record_bytes: ByteSize(16 << 20),
            max_body: ByteSize(64 << 20),
            served_model_names: Vec::new(),
            max_num_seqs: 0,
            jitter: Duration::ZERO,
            prefill_per_running: Duration::ZERO,
            prefill_tokens_per_s: None,
            decode_tokens_per_s: None,
            failure_rate: 0.0,
            failure_kinds: FailureKind::ALL.to_vec(),
            seed: None,
            kv_events: None,
        }
    }
}

impl MockConfig {
    /// Checks values that deserialise fine but make no sense; the error names the key and the fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.model.trim().is_empty() {
            return Err(
                "mock.model must not be empty; set a model id such as \"kvbust-mock\"".to_owned(),
            );
        }
        if self.default_max_tokens == 0 {
            return Err("mock.default_max_tokens must be at least 1; the default is 16".to_owned());
        }
        if self.record_bytes.0 > MAX_RECORD_BYTES {
            return Err(format!(
                "mock.record_bytes must be at most 4GiB (got {}); the default is 16MiB",
                self.record_bytes
            ));
        }
        if self.max_body.0 == 0 || self.max_body.0 > MAX_BODY_BYTES as u64 {
            return Err(format!(
                "mock.max_body must be between 1B and 256MiB (got {}); the default is 64MiB",
                self.max_body
            ));
        }
        self.validate_engine()?;
        if let Some(json) = &self.kv_events {
            crate::mock::kv_events::EventsConfig::parse(json)?;
        }
        if let MockTokenizerSetting::Path(p) = &self.tokenizer {
            if !self.tokenizer.exists() {
                return Err(format!(
                    "mock.tokenizer {} is neither a tokenizer.json file nor a folder holding one; use \"qwen3\", \"builtin\" or a valid path",
                    p.display()
                ));
            }
        }
        Ok(())
    }
}

impl MockConfig {
    /// The engine-like knobs (issue 31): names, failure rate and kinds.
    fn validate_engine(&self) -> Result<(), String> {
        for (i, name) in self.served_model_names.iter().enumerate() {
            if name.trim().is_empty() {
                return Err(format!(
                    "mock.served_model_names[{i}] is empty; list the model ids to serve, e.g. [\"Qwen/Qwen3-0.6B\"]"
                ));
            }
            if self.served_model_names[..i].contains(name) {
                return Err(format!(
                    "mock.served_model_names lists {name:?} twice; list each once"
                ));
            }
        }
        for (key, rate) in [
            ("prefill_tokens_per_s", self.prefill_tokens_per_s),
            ("decode_tokens_per_s", self.decode_tokens_per_s),
        ] {
            if rate == Some(0) {
                return Err(format!(
                    "mock.{key} must be at least 1 token per second; leave it unset for no shared budget"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.failure_rate) {
            return Err(format!(
                "mock.failure_rate must be between 0 and 1 (got {}); e.g. 0.05 fails one request in 20",
                self.failure_rate
            ));
        }
        if self.failure_rate > 0.0 && self.failure_kinds.is_empty() {
            return Err(
                "mock.failure_kinds is empty while mock.failure_rate > 0; list some of \"429\", \"500\", \"503\", \"reset\", \"stall\""
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// The model a request without one gets: the first served name, else `mock.model`.
    pub fn default_model(&self) -> &str {
        self.served_model_names.first().unwrap_or(&self.model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_shared_budget_is_refused_by_name() {
        for (cfg, key) in [
            (
                MockConfig {
                    prefill_tokens_per_s: Some(0),
                    ..MockConfig::default()
                },
                "mock.prefill_tokens_per_s",
            ),
            (
                MockConfig {
                    decode_tokens_per_s: Some(0),
                    ..MockConfig::default()
                },
                "mock.decode_tokens_per_s",
            ),
        ] {
            let e = cfg.validate().expect_err("zero refused");
            assert!(e.starts_with(key), "{e}");
        }
        let set = MockConfig {
            prefill_tokens_per_s: Some(16_000),
            decode_tokens_per_s: Some(4_000),
            ..MockConfig::default()
        };
        assert_eq!(set.validate(), Ok(()));
        assert_eq!(MockConfig::default().prefill_tokens_per_s, None);
    }

    #[test]
    fn defaults_apply_to_absent_keys_and_durations_are_strings() {
        let c: MockConfig =
            serde_json::from_str(r#"{"inter_token":"50ms","block_size":4}"#).expect("parses");
        assert_eq!(c.inter_token, Duration::from_millis(50));
        assert_eq!(c.block_size, 4);
        assert_eq!(c.base_delay, MockConfig::default().base_delay);
        let v = serde_json::to_value(MockConfig::default()).expect("serialises");
        assert_eq!(v["inter_token"], "15ms");
        assert_eq!(v["prefill_per_token"], "20us");
        assert_eq!(v["model"], "kvbust-mock");
        assert_eq!(v["tokenizer"], "qwen3");
        assert_eq!(v["record_bytes"], "16MiB");
        assert!(MockConfig::default().validate().is_ok());
    }

    #[test]
    fn tokenizer_and_record_bytes_parse_and_validate() {
        let c: MockConfig =
            serde_json::from_str(r#"{"tokenizer":"builtin","record_bytes":"1KiB"}"#)
                .expect("parses");
        assert_eq!(c.tokenizer, MockTokenizerSetting::Builtin);
        assert_eq!(c.record_bytes, ByteSize(1024));
        let c: MockConfig =
            serde_json::from_str(r#"{"tokenizer":"/nowhere/tokenizer.json"}"#).expect("parses");
        let e = c.validate().expect_err("missing file");
        assert!(e.starts_with("mock.tokenizer "), "{e}");
        assert!(e.contains("/nowhere/tokenizer.json"), "{e}");
        let c = MockConfig {
            record_bytes: ByteSize(MAX_RECORD_BYTES + 1),
            ..MockConfig::default()
        };
        let e = c.validate().expect_err("too large");
        assert!(e.starts_with("mock.record_bytes "), "{e}");
        assert!(serde_json::from_str::<MockConfig>(r#"{"tokenizer":""}"#).is_err());
        let c: MockConfig =
            serde_json::from_str(r#"{"chat_template_date":"2025-03-07"}"#).expect("parses");
        assert_eq!(c.chat_template_date.to_string(), "2025-03-07");
        assert_eq!(
            MockConfig::default().chat_template_date,
            TemplateDate::Today
        );
        let e = serde_json::from_str::<MockConfig>(r#"{"chat_template_date":"07/03/2025"}"#)
            .expect_err("not a date");
        assert!(e.to_string().contains("YYYY-MM-DD"), "{e}");
        assert!(serde_json::from_str::<MockConfig>(r#"{"record_bytes":"lots"}"#).is_err());
    }

    #[test]
    fn engine_knobs_are_off_by_default_and_validated() {
        let d = MockConfig::default();
        assert!(d.served_model_names.is_empty() && d.max_num_seqs == 0);
        assert_eq!(
            (d.jitter, d.prefill_per_running),
            (Duration::ZERO, Duration::ZERO)
        );
        assert_eq!(d.failure_rate, 0.0);
        let c: MockConfig = serde_json::from_str(
            r#"{"served_model_names":["a","b"],"max_num_seqs":2,"jitter":"3ms","failure_rate":0.5,"failure_kinds":["429","reset"],"seed":7}"#,
        )
        .expect("parses");
        assert_eq!(
            c.failure_kinds,
            [FailureKind::TooManyRequests, FailureKind::Reset]
        );
        assert_eq!((c.default_model(), c.seed), ("a", Some(7)));
        assert!(c.validate().is_ok());
        for (bad, key) in [
            (r#"{"failure_rate":1.5}"#, "mock.failure_rate "),
            (
                r#"{"failure_rate":0.1,"failure_kinds":[]}"#,
                "mock.failure_kinds ",
            ),
            (
                r#"{"served_model_names":["a","a"]}"#,
                "mock.served_model_names ",
            ),
            (
                r#"{"served_model_names":[" "]}"#,
                "mock.served_model_names[0] ",
            ),
        ] {
            let c: MockConfig = serde_json::from_str(bad).expect("parses");
            let e = c.validate().expect_err(bad);
            assert!(e.starts_with(key), "{e}");
        }
        assert!(serde_json::from_str::<MockConfig>(r#"{"failure_kinds":["404"]}"#).is_err());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = serde_json::from_str::<MockConfig>(r#"{"inter_tokens":"5ms"}"#)
            .expect_err("unknown key");
        assert!(e.to_string().contains("inter_tokens"), "{e}");
    }
}
