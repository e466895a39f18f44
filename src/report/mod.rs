//! The run report: the JSON shape of `GET /report` (what the cache model and the observer learned
//! about the run so far, per phase × target), shared by the admin port that writes it and
//! `kvbust report` that reads and renders it. Owns the shape only; never counts anything itself
//! (`cache_model::ledger` does) and never does I/O.

use serde::{Deserialize, Serialize};

pub mod render;
pub mod verdict;

/// The report's schema version: bumped when a field changes meaning or goes away (2: runs,
/// the verdict, the client's summary per row, errors).
pub const SCHEMA: u32 = 2;

/// One run's report, as `GET /report` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: u32,
    pub run: Run,
    /// The one sentence a person reads first, and the figures behind it.
    pub verdict: Verdict,
    pub cache_model: ModelFacts,
    pub upstream: UpstreamFacts,
    /// One row per phase × target that saw a request, warmup first, targets in their order.
    pub rows: Vec<Row>,
    /// The run in time buckets of equal width, per phase: what the HTML page plots.
    pub timeline: Timeline,
}

/// What the run is called, when it started and ended, and whether its report is whole.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The run's name (`POST /runs`, `x-kvbust-run`, `kvbust run --name`, or generated).
    pub name: String,
    /// How the run was opened: `start`, `admin`, `header`, `idle_gap`.
    pub opened_by: String,
    /// The benchmark id in force (the RID digests' first input).
    pub benchmark_id: String,
    /// RFC 3339, UTC, millisecond precision.
    pub started_at: String,
    /// RFC 3339, UTC: when the run closed; `None` while it is open.
    pub ended_at: Option<String>,
    /// RFC 3339, UTC: when this report was taken.
    pub generated_at: String,
    /// Seconds from `started_at` to `ended_at` (or to `generated_at` while open).
    pub elapsed_s: f64,
    /// Every request of the run answered and modelled. `false` names why in `unaccounted`.
    pub complete: bool,
    /// Requests not (yet) in the figures, by reason: `in_flight` (not answered or not modelled
    /// yet), and the model's reasons (`queue_full`, `too_large`, ...).
    pub unaccounted: std::collections::BTreeMap<String, u64>,
    /// `warmup` requests of the run by count (`auto_warmup_requests` or the run's own).
    pub warmup_requests: Option<u64>,
    /// What happened to the upstream's cache during the run (resets), in order.
    pub events: Vec<RunEvent>,
    /// The client command, when `kvbust run` started the run.
    pub command: Option<Vec<String>>,
}

/// Something that happened during a run, on its time line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    /// Seconds from the run's start.
    pub at_s: f64,
    /// `cache_reset`: the upstream's prefix cache was emptied, and the model's index with it.
    pub kind: String,
    /// Who did it: `forwarded POST /reset_prefix_cache`, `admin`, `run open`.
    pub by: String,
}

/// Whether isolation held: the sentence every report opens with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub isolation: Isolation,
    /// Profiling prompt tokens served from blocks warmup put there: past the isolation point
    /// (a breach) under isolation, all of them under target `none`.
    pub reused_from_warmup_tokens: u64,
    /// Prompt tokens served past the isolation point from blocks another session put there.
    pub cross_session_tokens: u64,
    /// Under target `none`: the share of profiling prompt tokens served from warmup's cache.
    pub warmup_share: Option<f64>,
    /// The sentence.
    pub message: String,
}

/// The verdict's word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Isolation was requested and no token crossed it.
    Held,
    /// Tokens crossed it (or two conversations shared one session key).
    Breached,
    /// Target `none`: nothing was isolated.
    #[default]
    NotRequested,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Held => "held",
            Isolation::Breached => "breached",
            Isolation::NotRequested => "not_requested",
        }
    }
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
    /// The engine's KV cache events the model follows (`cache_model.kv_events`); absent when
    /// off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<KvEventsFacts>,
}

/// What following the engine's KV cache events did this process's lifetime (not reset with
/// a run: the engine's cache is not).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEventsFacts {
    /// `cache_model.kv_events`.
    pub endpoint: String,
    /// Event batches received.
    pub batches: u64,
    /// Batches lost (gaps in `seq`): the model missed what the engine did then.
    pub lost_batches: u64,
    /// The `seq` of the last batch received.
    pub last_seq: Option<u64>,
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub cleared: u64,
    /// Removed blocks the model held: misses the engine evicted, not misses the model failed
    /// to expect.
    pub evicted_in_model: u64,
    /// Stored blocks the model could not match to its own (unknown parent, other block size).
    pub unmatched_blocks: u64,
    /// No batch lost or unreadable: the model saw everything the engine did.
    pub complete: bool,
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
    /// Sessions cut back to an earlier prefix once and grown from there (agentic compaction):
    /// counted, not breaches.
    pub compactions: u64,
    /// Latencies measured on the wire, milliseconds.
    pub latency: Latency,
    /// Over the row's duration (first arrival to last response end).
    pub throughput: Throughput,
    /// Failed requests: never counted as accounted successes.
    pub errors: Errors,
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

/// A client's latency summary, measured on the wire by kvbust.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Time to first token (first content event of a stream; a whole response's end).
    pub ttft_ms: Stats,
    /// Inter-token latency: the gaps between content events of streamed responses.
    pub itl_ms: Stats,
    /// Time per output token after the first: (e2e - ttft) / (output tokens - 1), per request.
    pub tpot_ms: Stats,
    /// Request latency: arrival to the response's end.
    pub e2e_ms: Stats,
}

/// Summary statistics of one latency, milliseconds; `None` without samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub count: u64,
    pub avg: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub std: Option<f64>,
}

/// Requests and output tokens per second over a row's duration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Seconds from the row's first arrival to its last response's end.
    pub duration_s: f64,
    /// Successful requests per second.
    pub requests_per_s: Option<f64>,
    /// Output tokens of successful requests per second.
    pub output_tokens_per_s: Option<f64>,
    /// Output tokens of successful requests (usage, else content events).
    pub output_tokens: u64,
    /// Requests answered 2xx whose body ended normally.
    pub successful_requests: u64,
}

/// Failed requests by status and by side.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Errors {
    pub count: u64,
    /// HTTP status (`"502"`), or `"aborted"` for a response cut off after its status.
    pub by_status: std::collections::BTreeMap<String, u64>,
    /// `client`, `upstream` or `kvbust` (internal).
    pub by_side: std::collections::BTreeMap<String, u64>,
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

    /// The dial the row ran under, when some of its requests did ([`Row::hit_ratio`] with
    /// [`Row::dialled_requests`] above 0).
    pub fn dial(&self) -> Option<f64> {
        self.hit_ratio.filter(|_| self.dialled_requests > 0)
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

/// One run in `GET /runs`: enough to pick it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub name: String,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub complete: bool,
    pub verdict: Isolation,
    pub message: String,
    pub requests: u64,
}

/// A closed run as `run.results_dir` saves it: the report, and what produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFile {
    /// [`RUN_FILE_SCHEMA`].
    pub kvbust_run: u32,
    /// sha256 of the effective configuration (secrets redacted), hex.
    pub config_digest: String,
    pub report: Report,
}

/// The run file's schema version.
pub const RUN_FILE_SCHEMA: u32 = 1;

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

/// Runs side by side (`kvbust report FILE…`, `kvbust report --runs`): one line per run and
/// profiling target (a run without profiling rows: per row; a run without rows: one line).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    pub lines: Vec<SweepLine>,
}

/// One run × phase × target of a [`Sweep`]: its verdict and a client's key figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepLine {
    pub run: String,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub complete: bool,
    pub isolation: Isolation,
    /// The run's verdict sentence.
    pub verdict: String,
    /// Under target `none`: the share of profiling prompt tokens served from warmup's cache.
    pub warmup_share: Option<f64>,
    /// Empty for a run without rows.
    pub phase: String,
    pub target: String,
    pub requests: u64,
    pub errors: u64,
    pub requests_per_s: Option<f64>,
    pub output_tokens_per_s: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub e2e_p50_ms: Option<f64>,
    /// The cache-hit dial the line's requests ran under ([`Row::hit_ratio`]); `None` without
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_ratio: Option<f64>,
    /// Reported cached / prompt tokens (0..=1); `None` when the upstream did not say.
    pub cached_share_reported: Option<f64>,
    /// Predicted cached / prompt tokens (0..=1).
    pub cached_share_predicted: Option<f64>,
    /// The client command, when `kvbust run` started the run.
    pub command: Option<Vec<String>>,
}
