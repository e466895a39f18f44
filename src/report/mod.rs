//! The run report: the JSON shape of `GET /report` (what the cache model and the observer learned
//! about the run so far, per phase × target), shared by the admin port that writes it and
//! `kvbust report` that reads and renders it. Owns the shape only; never counts anything itself
//! (`cache_model::ledger` does) and never does I/O.

use serde::{Deserialize, Serialize};

pub mod render;

/// The report's schema version: bumped when a field changes meaning or goes away.
pub const SCHEMA: u32 = 1;

/// One run's report, as `GET /report` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: u32,
    pub run: Run,
    pub cache_model: ModelFacts,
    pub upstream: UpstreamFacts,
    /// One row per phase × target that saw a request, warmup first, targets in their order.
    pub rows: Vec<Row>,
    /// The run in time buckets of equal width, per phase: what the HTML page plots.
    pub timeline: Timeline,
}

/// When the run started and what it is called.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The benchmark id in force (a new one starts a new run).
    pub benchmark_id: String,
    /// RFC 3339, UTC, millisecond precision.
    pub started_at: String,
    /// RFC 3339, UTC: when this report was taken.
    pub generated_at: String,
    /// Seconds from `started_at` to `generated_at`.
    pub elapsed_s: f64,
}

/// How the cache model is set up, and what its figures assume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelFacts {
    pub enabled: bool,
    /// Tokens per block (`cache_model.block_size`).
    pub block_size: usize,
    /// The tokenizer, as configured (`cache_model.tokenizer`, else `synth.tokenizer`).
    pub tokenizer: String,
    /// `auto` or `none` (`cache_model.chat_template`).
    pub chat_template: String,
    /// `cache_model.capacity_blocks` (0: bounded by `max_memory` only).
    pub capacity_blocks: u64,
    /// `cache_model.max_memory`, bytes.
    pub max_memory: u64,
    /// Blocks in the model's index now.
    pub indexed_blocks: u64,
    /// Blocks the model evicted this run.
    pub evicted_blocks: u64,
    /// Requests the model could not account for, by reason (`queue_full`, `unparseable`,
    /// `template_error`, ...).
    pub unaccounted: std::collections::BTreeMap<String, u64>,
    /// `sidecar`: one model stands for one engine, exact. `shared`: the upstream is a Service
    /// that may spread requests over several replicas; predictions assume one shared cache.
    pub topology: String,
    /// What the figures assume, in a sentence, when that matters (the gateway case).
    pub note: Option<String>,
}

/// What the upstream told kvbust about its cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamFacts {
    /// `Some(true)`: usage carried a cached-token field; `Some(false)`: enough responses had
    /// usage without one; `None`: too few responses with usage to say.
    pub reports_cached_tokens: Option<bool>,
    /// Successful generation responses that carried usage this run.
    pub responses_with_usage: u64,
    /// The fix, when the upstream does not report cached tokens: the engine flags to add.
    pub hint: Option<String>,
}

/// One phase × target of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `warmup` or `profiling`.
    pub phase: String,
    /// The cache-bust target the requests ran under.
    pub target: String,
    /// Generation requests forwarded.
    pub requests: u64,
    /// Requests the cache model accounted for (tokenized and looked up).
    pub accounted_requests: u64,
    /// Prompt tokens: as the upstream reported them (`usage`), and as the model counted them.
    pub prompt_tokens: Pair,
    /// Cached prompt tokens: the upstream's report and the model's prediction.
    pub cached_tokens: Pair,
    /// The predicted hit, split by who put the reused blocks there.
    pub reuse: Reuse,
    /// Isolation breaches, by kind.
    pub breaches: Breaches,
    /// Requests whose reported cached tokens differ from the prediction.
    pub divergent_requests: u64,
    /// Time to first token, milliseconds (streamed responses).
    pub ttft_ms: Quantiles,
    /// Requests that asked for `cache_bust.method = "salt"` on a route without a salt
    /// (Anthropic Messages) and were isolated with the marker instead.
    #[serde(default)]
    pub salt_fallbacks: u64,
    /// The cache-hit dial (`cache_bust.hit_ratio`, `x-kvbust-hit-ratio`) the row's requests ran
    /// under (their mean when they differ); `None` without a dial. Compare it with
    /// [`Row::predicted_hit_rate`] and [`Row::reported_hit_rate`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_ratio: Option<f64>,
    /// Requests of the row that ran under a dial.
    #[serde(default)]
    pub dialled_requests: u64,
    /// Requests isolated by `cache_salt` whose upstream reported more cached tokens than salt
    /// isolation allows: the upstream seems to ignore the salt, and the row's isolation cannot
    /// be trusted (`serve` warns once).
    #[serde(default)]
    pub salt_ignored: u64,
}

/// A reported figure beside the modelled one. `reported` is `None` when no response of the row
/// carried the field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    pub reported: Option<u64>,
    pub predicted: u64,
}

/// Predicted reused tokens by source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reuse {
    /// Blocks the same session put there.
    pub same_session: u64,
    /// Blocks another session put there.
    pub other_session: u64,
    /// Blocks warmup requests put there (for profiling requests).
    pub warmup: u64,
}

/// Isolation breaches by kind (requests that breached, each counted once per kind).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaches {
    pub cross_session: u64,
    pub warmup_reuse: u64,
    pub session_collision: u64,
}

impl Breaches {
    pub fn total(&self) -> u64 {
        self.cross_session + self.warmup_reuse + self.session_collision
    }
}

/// `part / whole`, `None` when `whole` is 0 (no tokens: no rate, rather than 0 %).
fn rate(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

impl Row {
    /// Predicted cached / prompt tokens as the model counted them (0..=1).
    pub fn predicted_hit_rate(&self) -> Option<f64> {
        rate(self.cached_tokens.predicted, self.prompt_tokens.predicted)
    }

    /// Reported cached / reported prompt tokens (0..=1); `None` when the upstream reported no
    /// cached tokens for the row. Without reported prompt tokens, the model's count stands in.
    pub fn reported_hit_rate(&self) -> Option<f64> {
        let cached = self.cached_tokens.reported?;
        let prompt = self
            .prompt_tokens
            .reported
            .unwrap_or(self.prompt_tokens.predicted);
        rate(cached, prompt)
    }
}

impl Bucket {
    /// Predicted cached / prompt tokens in the bucket (0..=1).
    pub fn predicted_hit_rate(&self) -> Option<f64> {
        rate(self.predicted_cached, self.prompt_tokens)
    }

    /// Reported cached / prompt tokens of the requests whose usage said (0..=1).
    pub fn reported_hit_rate(&self) -> Option<f64> {
        rate(self.reported_cached?, self.reported_prompt_tokens?)
    }
}

/// Quantiles of a latency, milliseconds; `None` without samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub count: u64,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

/// Equal-width time buckets from the run's start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Width of one bucket, seconds (it doubles as the run grows, so there are never more than
    /// a few hundred).
    pub bucket_s: f64,
    pub buckets: Vec<Bucket>,
}

/// One bucket of one phase: bucket `index` covers `[index * bucket_s, (index + 1) * bucket_s)`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub index: u64,
    pub phase: String,
    pub requests: u64,
    /// Prompt tokens the model counted for the bucket's accounted requests.
    pub prompt_tokens: u64,
    pub predicted_cached: u64,
    /// Cached tokens the upstream reported (only requests whose usage said).
    pub reported_cached: Option<u64>,
    /// Prompt tokens of the requests whose usage reported cached tokens (the denominator of
    /// the reported hit rate).
    pub reported_prompt_tokens: Option<u64>,
    /// Mean time to first token, milliseconds.
    pub ttft_ms_mean: Option<f64>,
}
