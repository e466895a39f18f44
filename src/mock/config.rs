//! `MockConfig`: the mock model server's knobs (model name, pacing, prefix-cache geometry) with quick-start defaults.
//! Owns only the typed settings and their serde shape; it never reads files or the environment (the config layer does).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings of the built-in mock model server.
///
/// Serialised with durations as humantime strings (`"15ms"`); unknown keys are rejected and absent keys take
/// the defaults below.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MockConfig {
    /// Model id reported by `/v1/models` and in responses when the request names none (default `kvbust-mock`).
    pub model: String,
    /// Fixed cost before the first token of every completion (default `5ms`).
    #[serde(with = "super::duration_serde")]
    pub base_delay: Duration,
    /// Prefill cost per prompt token that is not served from the simulated prefix cache (default `20us`).
    #[serde(with = "super::duration_serde")]
    pub prefill_per_token: Duration,
    /// Delay between consecutive output tokens (default `15ms`).
    #[serde(with = "super::duration_serde")]
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
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            model: "kvbust-mock".to_owned(),
            base_delay: Duration::from_millis(5),
            prefill_per_token: Duration::from_micros(20),
            inter_token: Duration::from_millis(15),
            block_size: 16,
            cache_blocks: 16384,
            default_max_tokens: 16,
            max_model_len: 131_072,
            record_requests: 1024,
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(MockConfig::default().validate().is_ok());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = serde_json::from_str::<MockConfig>(r#"{"inter_tokens":"5ms"}"#)
            .expect_err("unknown key");
        assert!(e.to_string().contains("inter_tokens"), "{e}");
    }
}
