//! Typed configuration: defaults < file < `KVBUST_*` env < CLI flags, layered by figment and
//! validated once at start. Owns no I/O beyond reading the config file; never reads config on the
//! request path.
//!
//! This file holds the types (every section, its defaults and serde shape, [`ConfigError`]);
//! [`load`](Config::load) layers them (`load.rs`), [`validate`](Config::validate) checks them
//! (`validate.rs`), and sizes and durations are [`crate::units`]'.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cachebust::{Method, Phase, Target};
use crate::mock::MockConfig;

mod load;
mod upstream_url;
mod validate;
pub use crate::units::ByteSize;
pub use load::{edit_distance, redact_url, redact_urls_in};
pub use upstream_url::UpstreamUrl;
pub use validate::{parse_target, MIN_ADMIN_TOKEN_LEN};

/// The whole effective configuration. Every section rejects unknown keys so a typo fails loudly.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: ListenConfig,
    pub admin: AdminConfig,
    pub upstream: UpstreamConfig,
    pub limits: LimitsConfig,
    pub shutdown: ShutdownConfig,
    pub cache_bust: CacheBustConfig,
    pub observe: ObserveConfig,
    pub mock: MockConfig,
    pub synth: SynthConfig,
    pub cache_model: CacheModelConfig,
    pub capture: CaptureConfig,
    pub run: RunConfig,
    pub headers: HeaderNames,
    pub log: LogConfig,
    /// Changes kvbust made to the loaded values at start (e.g. [`Config::fit_memory_limit`]),
    /// each a sentence; shown as comments at the top of `GET /config`.
    #[serde(skip)]
    pub adjustments: Vec<String>,
}

/// Runs (`[run]`): a benchmark run as a named, judged, saved object (see the contract's "Runs").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Opens a new current run after this long without a request (`0s`: off, the default).
    /// Header-named runs close after it without a request of their own (60 s when off).
    #[serde(with = "crate::units::duration")]
    pub idle_gap: Duration,
    /// Runs held (open and closed); past it the oldest closed run is forgotten.
    pub keep: usize,
    /// Writes each closed run as one JSON file here (none by default).
    pub results_dir: Option<PathBuf>,
    /// Empties the upstream's prefix cache (and the model's index) when a run opens.
    pub reset_upstream_cache: bool,
    /// How long closing a run waits for its requests to be answered and modelled.
    #[serde(with = "crate::units::duration")]
    pub close_wait: Duration,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            idle_gap: Duration::ZERO,
            keep: 64,
            results_dir: None,
            reset_upstream_cache: false,
            close_wait: Duration::from_secs(30),
        }
    }
}

/// The data listener (`[listen]`): address, workers, connection caps and timeouts, HTTP/2 settings, TLS.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    pub addr: SocketAddr,
    pub tls: Option<TlsFiles>,
    /// Max concurrent HTTP/2 streams per client connection.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2 per-stream receive window; generous so many SSE streams share a connection well.
    pub http2_stream_window: ByteSize,
    /// HTTP/2 per-connection receive window.
    pub http2_connection_window: ByteSize,
    /// Data-port worker threads, each with its own runtime and upstream pool; 0: one per core.
    pub workers: usize,
    /// From accept to a complete first request head (TLS handshake, HTTP/2 preface included).
    /// Both ports.
    #[serde(with = "crate::units::duration")]
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight (from the end of its last
    /// response to the next complete request head). Both ports.
    #[serde(with = "crate::units::duration")]
    pub idle_timeout: Duration,
    /// Longest gap while reading a request body, on every route.
    #[serde(with = "crate::units::duration")]
    pub body_read_timeout: Duration,
    /// Longest time to read a whole request body (from the first wait for its bytes), on every
    /// route: a body trickled just under `body_read_timeout` is cut here (408).
    #[serde(with = "crate::units::duration")]
    pub body_total_timeout: Duration,
    /// Client connections open at once on the data port, all workers together; past it the
    /// oldest connection with no request in flight is closed to make room (or, when every one
    /// is busy, the new one). 0: half of the open-file limit left after a reserve of 64.
    pub max_connections: usize,
}

impl ListenConfig {
    /// The number of data workers to start: `workers`, or one per available core.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// The deadlines every request body (data and admin port) is read under.
    pub fn body_deadlines(&self) -> crate::conn::BodyDeadlines {
        crate::conn::BodyDeadlines {
            gap: self.body_read_timeout,
            total: self.body_total_timeout,
        }
    }

    /// The idle deadlines every connection (data and admin) is held to.
    pub fn conn_timeouts(&self) -> crate::conn::ConnTimeouts {
        crate::conn::ConnTimeouts {
            first_request: self.header_read_timeout,
            idle: self.idle_timeout,
        }
    }
}

impl Default for ListenConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            tls: None,
            http2_max_concurrent_streams: 256,
            http2_stream_window: ByteSize(1 << 20),
            http2_connection_window: ByteSize(16 << 20),
            workers: 0,
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            body_read_timeout: Duration::from_secs(60),
            body_total_timeout: Duration::from_secs(300),
            max_connections: 0,
        }
    }
}

/// The data listener's TLS files (`[listen.tls]`), reloaded when they change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA bundle (PEM): when set, clients must present a certificate it signed (mTLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// How often the files are checked for changes (reloaded when changed; SIGHUP reloads at
    /// once). Zero: on SIGHUP only.
    #[serde(default = "default_tls_watch", with = "crate::units::duration")]
    pub watch_interval: Duration,
}

fn default_tls_watch() -> Duration {
    Duration::from_secs(10)
}

/// The admin port (`[admin]`): phase switch, metrics, health, report; its address, token and connection cap.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub addr: SocketAddr,
    /// Bearer token required by mutating admin calls (`PUT /phase`). Redacted in `config show`.
    pub token: Option<String>,
    /// Serve a non-loopback admin address without a token. Off: such a start is refused, since
    /// anyone who reaches the port could flip the phase of a running benchmark.
    pub allow_unauthenticated: bool,
    /// Connections open at once on the admin port; past it the oldest with no request in flight
    /// is closed for the new one (all busy: the new one is closed). Reserved from the open-file
    /// limit before the data port's and the upstream's shares.
    pub max_connections: usize,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 9090)),
            token: None,
            allow_unauthenticated: false,
            max_connections: 64,
        }
    }
}

/// How kvbust speaks to the upstream (`upstream.http2`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Http2Mode {
    /// HTTP/2 when TLS ALPN offers it, HTTP/1.1 otherwise (plain `http` upstreams).
    #[default]
    Auto,
    /// HTTP/2 with prior knowledge (h2c for `http` upstreams).
    Always,
    /// HTTP/1.1 only.
    Never,
}

/// Where the upstream's TLS roots come from (`upstream.tls.roots`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RootStore {
    #[default]
    Webpki,
    Native,
}

/// The model server kvbust forwards to (`[upstream]`): its URL, pools, timeouts, health probe.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Base URL of the model server; none → the built-in mock is started in-process.
    pub url: Option<String>,
    /// Forward the client's `Host` header instead of the upstream's authority.
    pub keep_host: bool,
    pub http2: Http2Mode,
    #[serde(with = "crate::units::duration")]
    pub connect_timeout: Duration,
    /// Time from sending the request to receiving response headers. Non-streaming generations
    /// answer only when done, so this is generous by default.
    #[serde(with = "crate::units::duration")]
    pub first_byte_timeout: Duration,
    /// Longest allowed gap between two response body frames.
    #[serde(with = "crate::units::duration")]
    pub idle_timeout: Duration,
    /// Whole-request limit; none by default because long generations are normal.
    #[serde(with = "crate::units::duration::option")]
    pub total_timeout: Option<Duration>,
    #[serde(with = "crate::units::duration")]
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    /// Plain-HTTP/1.1 upstream connections one data worker may have open (in use and idle);
    /// a request that needs one more waits up to `connect_timeout` for one to close, then 503.
    /// 0: the other half of the open-file limit left after a reserve of 64, shared by the workers.
    pub max_connections_per_worker: usize,
    /// Upstream connections the HTTP/2 streams of one client connection may hold at once (each
    /// stream to an HTTP/1.1 upstream needs its own while its request and response are under
    /// way; through the pooled client, TLS or HTTP/2 upstreams, it bounds the streams in flight
    /// the same way); a stream past it waits up to `connect_timeout`, then 503. 0: as many as
    /// `listen.http2_max_concurrent_streams`. The default, 64, is what one client connection
    /// has in flight in practice (a benchmark spreads its concurrency over connections), not
    /// the stream limit.
    pub max_connections_per_client: usize,
    /// Upstream connections the requests of one source address (all its client connections,
    /// HTTP/1.1 and HTTP/2, on every worker) may hold at once; a request past it waits up to
    /// `connect_timeout`, then 503. 0: no bound per source (the per-worker bound still holds).
    pub max_connections_per_source: usize,
    /// `Host` (HTTP/1.1) and `:authority` (HTTP/2) sent upstream instead of the URL's authority;
    /// connections still go to the URL's address, and SNI stays `tls.server_name` or the URL's
    /// host. For an upstream reached by IP or a port-forward that routes by virtual host.
    pub authority: Option<String>,
    /// Probe the upstream so `/readyz` answers 503 until it is up and after it goes down. Off:
    /// readiness ignores the upstream (for servers without any health route).
    pub health_probe: bool,
    /// The probe's path. Not set: `/health`, then `/v1/models` when the server answers `/health`
    /// with 404 or 405. Set: that path only.
    pub health_path: Option<String>,
    /// Time between two probes (from the end of one to the start of the next).
    #[serde(with = "crate::units::duration")]
    pub health_interval: Duration,
    /// Longest a probe may take (connect, response and its body); longer counts as a failure.
    #[serde(with = "crate::units::duration")]
    pub health_timeout: Duration,
    /// Failed probes in a row that turn an up upstream down.
    pub health_fail_threshold: u32,
    /// Successful probes in a row that turn a starting or down upstream up.
    pub health_success_threshold: u32,
    pub tls: UpstreamTls,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            url: None,
            keep_host: false,
            http2: Http2Mode::Auto,
            connect_timeout: Duration::from_secs(5),
            first_byte_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(300),
            total_timeout: None,
            pool_idle_timeout: Duration::from_secs(4),
            pool_max_idle_per_host: 256,
            max_connections_per_worker: 0,
            max_connections_per_client: 64,
            max_connections_per_source: 1024,
            authority: None,
            health_probe: true,
            health_path: None,
            health_interval: Duration::from_secs(5),
            health_timeout: Duration::from_secs(5),
            health_fail_threshold: 3,
            health_success_threshold: 1,
            tls: UpstreamTls::default(),
        }
    }
}

/// TLS towards the upstream (`[upstream.tls]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTls {
    pub roots: RootStore,
    pub ca_file: Option<PathBuf>,
    pub insecure_skip_verify: bool,
    /// Certificate chain (PEM) presented to an upstream that requires client certificates.
    pub client_cert: Option<PathBuf>,
    /// The private key (PEM) of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// The name sent as SNI and checked against the upstream's certificate, instead of the
    /// host of `upstream.url` (for an upstream reached by IP or through another name).
    pub server_name: Option<String>,
}

/// Bounds on what clients may send (`[limits]`): body size, control-header size, buffered bytes in total.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest body accepted on routes that are rewritten (the rest streams unbounded).
    pub max_body: ByteSize,
    /// Memory all request bodies buffered at once (for rewriting) may take together; a request
    /// that would go past it is answered 503 at once instead of queueing.
    pub max_buffered_total: ByteSize,
    /// Longest value of a control (`x-kvbust-*`) or session header (`x-correlation-id`, …).
    pub max_control_header: ByteSize,
}

impl LimitsConfig {
    /// `max_control_header` in bytes, as header lengths are measured.
    pub fn control_header_len(&self) -> usize {
        usize::try_from(self.max_control_header.as_u64()).unwrap_or(usize::MAX)
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_body: ByteSize(64 << 20),
            max_buffered_total: ByteSize(1 << 30),
            max_control_header: ByteSize(1 << 10),
        }
    }
}

/// Graceful shutdown (`[shutdown]`): how long in-flight requests may finish.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// How long in-flight requests and streams may run after SIGTERM/SIGINT.
    #[serde(with = "crate::units::duration")]
    pub grace: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(30),
        }
    }
}

/// What to do with an API body kvbust cannot parse (`cache_bust.on_unparseable`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnUnparseable {
    /// Answer 400 with an OpenAI-shaped error.
    #[default]
    Reject,
    /// Forward the body unchanged (counted in `kvbust_unparseable_passthrough_total`).
    Passthrough,
}

/// Where a marker goes in a list-of-parts content (`cache_bust.list_parts`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ListPartsMode {
    /// The marker becomes its own `{"type":"text"}` part (AIPerf's rule for raw messages).
    #[default]
    OwnPart,
    /// The marker joins the first text part's string (AIPerf's rule for synthetic multimodal turns).
    InlineText,
}

/// One source of a session key for the RID digest (`cache_bust.session_sources`, tried in order).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum SessionSource {
    /// `x-correlation-id` request header (AIPerf sends one per session).
    XCorrelationId,
    /// `x-session-id` request header.
    XSessionId,
    /// The body's `user` field.
    BodyUser,
    /// A hash of the first user turn's (unmarked) content.
    FirstUserTurn,
}

/// Where a session's marker counter comes from.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LedgerMode {
    /// AIPerf's counter: each new session key mints the next counter in this process's ledger.
    /// Byte-identical to AIPerf, but replicas that see one session's turns disagree.
    #[default]
    Local,
    /// No counter: the digest inputs are `(benchmark_id, 0, 0, session_key)`, a function of the
    /// request alone, so any number of replicas agree without shared state or sticky routing.
    Stateless,
}

/// Marking (`[cache_bust]`): the default target and phase, session identity, header and body handling.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheBustConfig {
    pub target: Target,
    pub default_phase: Phase,
    /// 12 lowercase hex by default, chosen at start and logged. Any string is accepted.
    pub benchmark_id: Option<String>,
    /// Honour `x-kvbust-target` per request.
    pub allow_target_header: bool,
    /// Treat the first N requests as warmup when they carry no phase header.
    pub auto_warmup_requests: Option<u64>,
    /// Leading user messages that are user context (AIPerf's `--user-context-prompt-length`).
    pub user_context_messages: usize,
    pub list_parts: ListPartsMode,
    pub session_sources: Vec<SessionSource>,
    /// `local` (AIPerf's per-process counter) or `stateless` (replicas agree).
    pub ledger: LedgerMode,
    /// Sessions remembered by the ledger (LRU); evictions are counted.
    pub ledger_capacity: usize,
    /// Most strings of a completions `prompt` list one request may have marked (each gets the
    /// marker, so the list is how far one body grows): a 400 above.
    pub max_marked_prompts: usize,
    pub on_unparseable: OnUnparseable,
    /// Add `x-kvbust-rid`, `x-kvbust-phase` and `x-kvbust-overhead-us` to responses.
    pub response_headers: bool,
    /// Place a chat body's marker as the body flows, once the messages it depends on have
    /// come, when the session is known by then (a header, or the first user turn), instead
    /// of collecting the body first.
    pub mark_in_flight: bool,
    /// How a request is isolated: `marker` (AIPerf's marker text) or `salt` (the body's
    /// `cache_salt`; the prompt goes unchanged; Anthropic Messages, which has no salt, falls
    /// back to the marker). `x-kvbust-method` overrides it per request.
    pub method: Method,
    /// The cache-hit dial: a request-unique text marker at the first block boundary at or
    /// after this share of each prompt's tokens (counted with the cache model's tokenizer and
    /// block size), so at most that much of it can come from the cache. `x-kvbust-hit-ratio`
    /// sets it per request. None: no dial.
    pub hit_ratio: Option<f64>,
}

impl Default for CacheBustConfig {
    fn default() -> Self {
        Self {
            target: Target::None,
            default_phase: Phase::Profiling,
            benchmark_id: None,
            allow_target_header: true,
            auto_warmup_requests: None,
            user_context_messages: 0,
            list_parts: ListPartsMode::OwnPart,
            session_sources: vec![
                SessionSource::XCorrelationId,
                SessionSource::XSessionId,
                SessionSource::BodyUser,
                SessionSource::FirstUserTurn,
            ],
            ledger: LedgerMode::Local,
            ledger_capacity: 100_000,
            max_marked_prompts: 4096,
            on_unparseable: OnUnparseable::Reject,
            response_headers: true,
            mark_in_flight: true,
            method: Method::Marker,
            hit_ratio: None,
        }
    }
}

/// Reading responses (`[observe]`): usage, TTFT and inter-token timings, the scan limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ObserveConfig {
    /// Copy at most this much of a non-streaming JSON response to read its `usage` (the bytes
    /// are forwarded immediately either way).
    pub max_usage_scan: ByteSize,
    /// Add `stream_options.include_usage` to chat and completions streams that do not ask for
    /// it, count the usage, and remove the usage chunk (and the `"usage":null` members) from
    /// what the client receives. On by default: otherwise such streams (the OpenAI SDK's
    /// default) are never measured. Such requests' bodies are then buffered (up to
    /// `limits.max_body`) and parsed (its cost: benches/README.md).
    pub request_usage: bool,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        Self {
            max_usage_scan: ByteSize(1 << 20),
            request_usage: true,
        }
    }
}

/// `cache_model.max_prompt_bytes`'s default: 2 MiB of text, about 500k tokens, past the
/// context of the models kvbust is benchmarked with; its tokenization peaks at about 90 MiB
/// (benches/README.md, issue 42).
pub const DEFAULT_MAX_PROMPT_BYTES: u64 = 2 << 20;

/// `[cache_model]`: kvbust's own model of the upstream's prefix cache, built from the bytes it
/// forwards (`crate::cache_model`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheModelConfig {
    /// Model the cache (on by default; off: no body is handed to the model, `/report` still
    /// counts requests, tokens and TTFT from the upstream's usage).
    pub enabled: bool,
    /// `"qwen3"` (the shipped tokenizer), `"builtin"` (the mock's cheap splitter) or a path to a
    /// `tokenizer.json` file or folder; none: `synth.tokenizer`, else the shipped Qwen3 one.
    /// Must be the engine's tokenizer for exact predictions.
    pub tokenizer: Option<crate::mock::MockTokenizerSetting>,
    /// `auto`: render chat-shaped prompts through the tokenizer's chat template, as the engine
    /// does; `none`: count `role\ncontent\n` per message (a tokenizer without a template too).
    pub chat_template: ChatTemplateMode,
    /// The day a chat template's `strftime_now` reads (Llama 3.x writes "Today Date: …" into
    /// every prompt): `"today"` (UTC, as the engine's clock) or a fixed `"YYYY-MM-DD"`, to
    /// match an engine whose clock is pinned, or a test.
    pub chat_template_date: crate::synth::tokenizer::pyjinja::TemplateDate,
    /// Tokens per KV block (vLLM's default, 16).
    pub block_size: usize,
    /// Blocks the index holds, evicted least recently used; 0: as many as `max_memory` allows.
    pub capacity_blocks: u64,
    /// Memory for the index, the session table, the token memo and queued bodies together.
    pub max_memory: ByteSize,
    /// The most text of one prompt the model tokenizes (its messages' roles and contents, and
    /// again once rendered through the chat template); a larger prompt is counted as
    /// unaccounted (`too_large`) and not tokenized: a tokenizer's working memory is many times
    /// its input, outside `max_memory`.
    pub max_prompt_bytes: ByteSize,
    /// Requests waiting for the model; past it (or past a quarter of `max_memory` in queued
    /// bodies) a request is counted as unaccounted and forwarded all the same.
    pub queue: usize,
    /// `auto`: `sidecar` when the upstream is on this host (or the built-in mock), else `shared`
    /// (a Service that may spread requests over several engine replicas).
    pub topology: Topology,
    /// Follow the engine's KV cache events: `"tcp://HOST:PORT"`, the endpoint of vLLM's
    /// `--kv-events-config` (a ZMQ PUB socket). The model then drops the blocks the engine
    /// evicts, empties on a reset and learns blocks other traffic stored; lost batches are
    /// counted in the report. None: predict from forwarded traffic alone.
    pub kv_events: Option<String>,
    /// The model's thread's nice value (Linux), 0 to 19; 0: as the process. Higher: the thread
    /// gets only the CPU the data workers leave, so a saturated proxy drops model jobs
    /// (`queue_full`) instead of forwarding slower.
    pub nice: i32,
    /// Threads that parse and tokenize the bodies, 1 to 64 (each at `nice`, each with its share
    /// of the token memo); the index still sees requests in forwarding order, on one thread. 1:
    /// one thread does it all.
    pub threads: usize,
}

impl Default for CacheModelConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            tokenizer: None,
            chat_template: ChatTemplateMode::Auto,
            chat_template_date: Default::default(),
            block_size: 16,
            capacity_blocks: 0,
            max_memory: ByteSize(256 << 20),
            max_prompt_bytes: ByteSize(DEFAULT_MAX_PROMPT_BYTES),
            queue: 1024,
            topology: Topology::Auto,
            kv_events: None,
            nice: 19,
            threads: 1,
        }
    }
}

/// `[capture]`: a replayable hash-id trace (mooncake rows) of the traffic kvbust forwards,
/// written by the cache model's worker from the tokens it already has (`crate::capture`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Write traces (off by default).
    pub enabled: bool,
    /// Where finished files go (made at start when missing).
    pub dir: PathBuf,
    /// Tokens per hash id (mooncake's 512).
    pub block_size: usize,
    /// `none`: each message's text tokenized on its own, no role or template, so the trace
    /// replays through AIPerf's and kvbust's synthesis; `auto`: the whole prompt through the
    /// tokenizer's chat template (sessions are then not split into turns).
    pub chat_template: ChatTemplateMode,
    /// A file is finished and a new one started after this long…
    #[serde(with = "crate::units::duration")]
    pub rotate: Duration,
    /// …or after this many rows.
    pub rotate_rows: u64,
    /// A block seen by this many distinct sessions or fewer in a file gets a fresh id in each
    /// of them (1: every shared block keeps its id).
    pub min_sessions_per_shared_block: usize,
    /// A secret (at least 16 bytes): ids become keyed hashes, comparable across replicas with
    /// the same key, and `kvbust trace merge` makes them dense.
    pub key_file: Option<PathBuf>,
    /// Rows reach the file being written (a hidden partial of finished mooncake rows) within
    /// this long: a crash loses no more than the rows of the last `flush`.
    #[serde(with = "crate::units::duration")]
    pub flush: Duration,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            dir: PathBuf::from("kvbust-captures"),
            block_size: 512,
            chat_template: ChatTemplateMode::None,
            rotate: Duration::from_secs(3600),
            rotate_rows: 100_000,
            min_sessions_per_shared_block: 1,
            key_file: None,
            flush: Duration::from_secs(1),
        }
    }
}

/// `cache_model.chat_template`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatTemplateMode {
    Auto,
    None,
}

impl ChatTemplateMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ChatTemplateMode::Auto => "auto",
            ChatTemplateMode::None => "none",
        }
    }
}

/// `cache_model.topology`: what one model stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    Auto,
    /// One engine behind kvbust: the model is that engine's cache.
    Sidecar,
    /// Several replicas may answer: predictions assume one shared cache.
    Shared,
}

impl Topology {
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Auto => "auto",
            Topology::Sidecar => "sidecar",
            Topology::Shared => "shared",
        }
    }
}

/// Synthesis in flight (`[synth]`): routes, tokenizer, placeholders and the served dataset.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SynthConfig {
    /// `tokenizer.json` file or a folder with `tokenizer.json` + `tokenizer_config.json`;
    /// none → the shipped Qwen3 tokenizer.
    pub tokenizer: Option<PathBuf>,
    /// Routes whose every request gets a synthetic body (e.g. `["/v1/chat/completions"]`).
    pub routes: Vec<String>,
    /// Expand `{{kvbust:prompt:N[:corpus]}}` in chat messages. Chat bodies are then buffered
    /// (up to `limits.max_body`) and scanned, never parsed unless a placeholder is found.
    pub placeholders: bool,
    /// Corpus of placeholders that name none.
    pub placeholder_corpus: crate::synth::PromptCorpus,
    /// Seed of the placeholder prompt streams; none → random at start.
    pub placeholder_seed: Option<u64>,
    /// Most placeholders one request may hold; more is a 400.
    pub max_placeholders: usize,
    /// Most tokens all placeholders of one request may ask for together; more is a 400.
    pub max_placeholder_tokens: usize,
    /// Prompts generated ahead per (corpus, length) once that placeholder has been seen
    /// (lengths up to 16384 tokens); 0 → each prompt is made when a request asks for it.
    pub placeholder_prefetch: usize,
    /// Placeholder prompts being made on demand at once, across all requests; a request that
    /// would pass it is answered 503 with `retry-after` at once.
    pub placeholder_queue: usize,
    /// Of those, most one client (peer address) may have at once: a client past it gets the 503,
    /// so one client's flood cannot take every place.
    pub placeholder_queue_per_client: usize,
    /// Of the `placeholder_queue` places and of the cores, the share that making new lanes
    /// (lengths not asked for before, or dropped) may take; the rest is kept for lengths that
    /// have a lane, so those never wait behind new ones, whatever the number of clients.
    pub placeholder_build_share: f64,
    /// CPU-seconds per second that making new lanes may use, averaged over
    /// `placeholder_build_window`; past it new lanes wait (in their queue places) for the window.
    pub placeholder_build_cpu: f64,
    /// The window `placeholder_build_cpu` is averaged over: after an idle window, new lanes may
    /// spend `placeholder_build_cpu` × window CPU-seconds at once.
    #[serde(with = "crate::units::duration")]
    pub placeholder_build_window: Duration,
    /// What a placeholder of a `coding` length with no lane yet adds to its request's cost against
    /// `max_placeholder_tokens`: such a lane builds AIPerf's coding pool (~0.13 CPU-s).
    pub new_coding_lane_tokens: usize,
    /// Corpora loaded at start (with the synthesis tokenizer), before `/readyz` answers 200.
    pub preload: Vec<crate::synth::PromptCorpus>,
    /// The dataset served to synthetic requests, with `kvbust synth`'s parameters (snake_case).
    /// Set → built at start; not set → built on first use with the defaults (sonnet, ISL 550,
    /// 100 entries, seed 0).
    pub dataset: Option<crate::synth::SynthParams>,
    /// Where corpus token caches go (not a key: `app` sets it from `KVBUST_CACHE_DIR`,
    /// `XDG_CACHE_HOME` or `HOME`; none → no cache).
    #[serde(skip)]
    pub cache_dir: Option<PathBuf>,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            tokenizer: None,
            routes: Vec::new(),
            placeholders: true,
            placeholder_corpus: crate::synth::PromptCorpus::Sonnet,
            placeholder_seed: None,
            max_placeholders: 64,
            max_placeholder_tokens: 131_072,
            placeholder_prefetch: 4,
            placeholder_queue: 64,
            placeholder_queue_per_client: 8,
            placeholder_build_share: 0.5,
            placeholder_build_cpu: 0.5,
            placeholder_build_window: Duration::from_secs(10),
            new_coding_lane_tokens: 16384,
            preload: Vec::new(),
            dataset: None,
            cache_dir: None,
        }
    }
}

/// Names of the headers kvbust reads on requests and sets on responses (`response_*`). The
/// kvbust request ones (and every `x-kvbust-*` header) are removed before forwarding; the two
/// session headers pass through.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HeaderNames {
    pub phase: String,
    pub target: String,
    pub benchmark_id: String,
    pub trace_id: String,
    pub recycle_pass: String,
    pub trajectory_index: String,
    pub user_context_messages: String,
    pub synth: String,
    /// Names the dataset conversation a synthetic request gets (a child conversation the
    /// client was told to spawn), percent-encoded as the response headers spell ids.
    pub synth_conversation: String,
    /// The run a request belongs to (`x-kvbust-run: NAME`; a name not seen opens it).
    pub run: String,
    /// Per-request isolation method (`marker` or `salt`), overriding `cache_bust.method`.
    pub method: String,
    /// Per-request cache-hit dial, 0 to 1 (overrides `cache_bust.hit_ratio`).
    pub hit_ratio: String,
    pub correlation_id: String,
    pub session_id: String,
    /// The RID digest of the request, or `none` (with `cache_bust.response_headers`).
    pub response_rid: String,
    /// The phase the request was marked for (with `cache_bust.response_headers`).
    pub response_phase: String,
    /// Microseconds kvbust spent before sending the request upstream (likewise).
    pub response_overhead_us: String,
    /// A synthesized trace entry's timestamp (ms), for a client following a trace.
    pub response_trace_timestamp: String,
    /// The dataset conversation id a synthesized response served (percent-encoded).
    pub response_synth_conversation: String,
    /// The turn index (from 0) within that conversation.
    pub response_synth_turn: String,
    /// The branches the served turn starts once it completes: `branch=child,child
    /// start_ms=T [background]`, `; `-separated (only when it starts any).
    pub response_synth_spawn: String,
    /// The index of the conversation's next turn, or `none` when the served turn is its last.
    pub response_synth_next_turn: String,
    /// How long (ms) to wait after this response completes before sending the next turn.
    pub response_synth_next_delay_ms: String,
    /// The branch ids whose children must all complete before the next turn (SPAWN_JOIN),
    /// comma-separated (only when it waits for any).
    pub response_synth_next_after: String,
    /// Answer a request that carries an `x-kvbust-*` header kvbust does not read (a typo such
    /// as `x-kvbust-phas`) with a 400 naming the nearest valid header. Off: such headers are
    /// removed before forwarding and otherwise ignored.
    pub reject_unknown: bool,
}

impl Default for HeaderNames {
    fn default() -> Self {
        let s = |v: &str| v.to_string();
        Self {
            phase: s("x-kvbust-phase"),
            target: s("x-kvbust-target"),
            benchmark_id: s("x-kvbust-benchmark-id"),
            trace_id: s("x-kvbust-trace-id"),
            recycle_pass: s("x-kvbust-recycle-pass"),
            trajectory_index: s("x-kvbust-trajectory-index"),
            user_context_messages: s("x-kvbust-user-context-messages"),
            synth: s("x-kvbust-synth"),
            synth_conversation: s("x-kvbust-synth-conversation"),
            run: s("x-kvbust-run"),
            method: s("x-kvbust-method"),
            hit_ratio: s("x-kvbust-hit-ratio"),
            correlation_id: s("x-correlation-id"),
            session_id: s("x-session-id"),
            response_rid: s("x-kvbust-rid"),
            response_phase: s("x-kvbust-phase"),
            response_overhead_us: s("x-kvbust-overhead-us"),
            response_trace_timestamp: s("x-kvbust-trace-timestamp"),
            response_synth_conversation: s("x-kvbust-synth-conversation"),
            response_synth_turn: s("x-kvbust-synth-turn"),
            response_synth_spawn: s("x-kvbust-synth-spawn"),
            response_synth_next_turn: s("x-kvbust-synth-next-turn"),
            response_synth_next_delay_ms: s("x-kvbust-synth-next-delay-ms"),
            response_synth_next_after: s("x-kvbust-synth-next-after"),
            reject_unknown: true,
        }
    }
}

impl HeaderNames {
    fn all(&self) -> [(&'static str, &String); 24] {
        [
            ("phase", &self.phase),
            ("target", &self.target),
            ("benchmark_id", &self.benchmark_id),
            ("trace_id", &self.trace_id),
            ("recycle_pass", &self.recycle_pass),
            ("trajectory_index", &self.trajectory_index),
            ("user_context_messages", &self.user_context_messages),
            ("synth", &self.synth),
            ("synth_conversation", &self.synth_conversation),
            ("run", &self.run),
            ("method", &self.method),
            ("hit_ratio", &self.hit_ratio),
            ("correlation_id", &self.correlation_id),
            ("session_id", &self.session_id),
            ("response_rid", &self.response_rid),
            ("response_phase", &self.response_phase),
            ("response_overhead_us", &self.response_overhead_us),
            ("response_trace_timestamp", &self.response_trace_timestamp),
            (
                "response_synth_conversation",
                &self.response_synth_conversation,
            ),
            ("response_synth_turn", &self.response_synth_turn),
            ("response_synth_spawn", &self.response_synth_spawn),
            ("response_synth_next_turn", &self.response_synth_next_turn),
            (
                "response_synth_next_delay_ms",
                &self.response_synth_next_delay_ms,
            ),
            ("response_synth_next_after", &self.response_synth_next_after),
        ]
    }

    /// The kvbust control headers, which never reach the upstream.
    pub fn control(&self) -> [&str; 12] {
        [
            &self.phase,
            &self.target,
            &self.benchmark_id,
            &self.trace_id,
            &self.recycle_pass,
            &self.trajectory_index,
            &self.user_context_messages,
            &self.synth,
            &self.synth_conversation,
            &self.run,
            &self.method,
            &self.hit_ratio,
        ]
    }
}

/// How log lines are written (`log.format`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Logging (`[log]`): level, format and the access log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter directive, e.g. `info` or `kvbust=debug`; `RUST_LOG` wins when set.
    pub level: String,
    pub format: LogFormat,
    /// One access-log line per data-port request (marked `access_log`), whatever `level`
    /// says; a request id (`x-request-id`, the client's or a new one) goes with it.
    pub access: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
            access: true,
        }
    }
}

/// A configuration problem, naming the key and how to fix it. Maps to exit code 64.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Values given on the command line; `None` leaves lower layers in charge.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CliOverrides {
    #[serde(skip_serializing_if = "Option::is_none", rename = "listen.addr")]
    pub listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "admin.addr")]
    pub admin_listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "upstream.url")]
    pub upstream: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "cache_bust.target")]
    pub cache_bust: Option<String>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        rename = "cache_bust.default_phase"
    )]
    pub phase: Option<String>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        rename = "cache_bust.benchmark_id"
    )]
    pub benchmark_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "cache_bust.method")]
    pub cache_bust_method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "listen.tls.cert")]
    pub tls_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "listen.tls.key")]
    pub tls_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", rename = "synth.tokenizer")]
    pub tokenizer: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::validate::validate_header_names;
    use super::*;
    use std::path::Path;

    /// A token kvbust accepts (24 characters or more, no placeholder).
    const TOKEN: &str = "s3cret-0123456789abcdef-xyz";

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::load(None, &[], &CliOverrides::default()).unwrap();
        assert_eq!(c.listen.addr.to_string(), "0.0.0.0:8080");
        assert_eq!(c.admin.addr.to_string(), "127.0.0.1:9090");
        assert_eq!(c.upstream.url, None);
        assert_eq!(c.cache_bust.target, Target::None);
        assert_eq!(c.cache_bust.default_phase, Phase::Profiling);
        assert_eq!(c.limits.max_body, ByteSize(64 << 20));
        assert_eq!(c.shutdown.grace, Duration::from_secs(30));
    }

    #[test]
    fn capture_settings_are_checked_at_start_naming_the_key() {
        let dir = crate::test_support::test_dir();
        let key = dir.join("short.key");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&key, "too short\n").unwrap();
        let d = dir.join("traces").to_string_lossy().into_owned();
        let k = key.to_string_lossy().into_owned();
        let err = |pairs: &[(&str, &str)]| {
            let mut all = vec![
                ("KVBUST_CAPTURE__ENABLED", "true"),
                ("KVBUST_CAPTURE__DIR", d.as_str()),
            ];
            // A pair given replaces the default one of that name.
            all.retain(|(k, _)| pairs.iter().all(|(p, _)| p != k));
            all.extend_from_slice(pairs);
            Config::load(None, &env(&all), &CliOverrides::default())
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        for (pairs, key_named) in [
            (
                &[("KVBUST_CACHE_MODEL__ENABLED", "false")][..],
                "capture.enabled",
            ),
            (
                &[("KVBUST_CAPTURE__KEY_FILE", k.as_str())][..],
                "capture.key_file",
            ),
            (
                &[("KVBUST_CAPTURE__BLOCK_SIZE", "0")][..],
                "capture.block_size",
            ),
            (
                &[("KVBUST_CAPTURE__ROTATE_ROWS", "0")][..],
                "capture.rotate_rows",
            ),
            (
                &[("KVBUST_CAPTURE__MIN_SESSIONS_PER_SHARED_BLOCK", "0")][..],
                "capture.min_sessions_per_shared_block",
            ),
            (&[("KVBUST_CAPTURE__FLUSH", "0s")][..], "capture.flush"),
            // Issue 42 (2): a folder that exists but takes no file (root ignores modes: /proc
            // refuses files to anyone) is caught at start, not row by row.
            (&[("KVBUST_CAPTURE__DIR", "/proc")][..], "capture.dir"),
            (
                &[("KVBUST_CACHE_MODEL__MAX_PROMPT_BYTES", "100B")][..],
                "cache_model.max_prompt_bytes",
            ),
        ] {
            let e = err(pairs).expect_err("refused");
            assert!(e.contains(key_named), "{e}");
        }
        // Valid: the folder is made.
        err(&[]).unwrap();
        assert!(dir.join("traces").is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The configuration with one environment variable set.
    fn load_one(key: &str, value: &str) -> Result<Config, ConfigError> {
        Config::load(None, &env(&[(key, value)]), &CliOverrides::default())
    }

    #[test]
    fn cache_model_nice_is_layered_and_checked_at_start_naming_the_key() {
        let load = |v: &str| load_one("KVBUST_CACHE_MODEL__NICE", v);
        assert_eq!(Config::default().cache_model.nice, 19);
        assert_eq!(load("0").unwrap().cache_model.nice, 0);
        assert_eq!(load("7").unwrap().cache_model.nice, 7);
        assert_eq!(load("19").unwrap().cache_model.nice, 19);
        for bad in ["20", "-1"] {
            let e = load(bad).expect_err("out of range").to_string();
            assert!(e.contains("cache_model.nice"), "{e}");
            assert!(
                e.contains("0 (the model's thread runs as the process) to 19"),
                "{e}"
            );
        }
    }

    #[test]
    fn cache_model_threads_is_layered_and_checked_at_start_naming_the_key() {
        let load = |v: &str| load_one("KVBUST_CACHE_MODEL__THREADS", v);
        assert_eq!(Config::default().cache_model.threads, 1);
        assert_eq!(load("1").unwrap().cache_model.threads, 1);
        assert_eq!(load("4").unwrap().cache_model.threads, 4);
        assert_eq!(load("64").unwrap().cache_model.threads, 64);
        for bad in ["0", "65"] {
            let e = load(bad).expect_err("out of range");
            assert_eq!(e.key, "cache_model.threads");
            let e = e.to_string();
            assert!(e.contains("cache_model.threads"), "{e}");
            assert!(e.contains(&format!("{bad} is not a thread count")), "{e}");
            assert!(
                e.contains("use 1 (one thread tokenizes and serves, the default) to 64"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_method_and_the_dial_layer_and_are_checked() {
        let c = Config::load(
            None,
            &env(&[("KVBUST_CACHE_BUST__METHOD", "SALT")]),
            &CliOverrides::default(),
        )
        .unwrap();
        assert_eq!(c.cache_bust.method, Method::Salt);
        let cli = CliOverrides {
            cache_bust_method: Some("marker".into()),
            ..Default::default()
        };
        let c = Config::load(None, &env(&[("KVBUST_CACHE_BUST__METHOD", "salt")]), &cli).unwrap();
        assert_eq!(c.cache_bust.method, Method::Marker, "the flag wins");
        let e = Config::load(
            None,
            &env(&[("KVBUST_CACHE_BUST__METHOD", "pepper")]),
            &CliOverrides::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("marker, salt"), "{e}");
        let c = Config::load(
            None,
            &env(&[("KVBUST_CACHE_BUST__HIT_RATIO", "0.25")]),
            &CliOverrides::default(),
        )
        .unwrap();
        assert_eq!(c.cache_bust.hit_ratio, Some(0.25));
        let e = Config::load(
            None,
            &env(&[("KVBUST_CACHE_BUST__HIT_RATIO", "1.5")]),
            &CliOverrides::default(),
        )
        .unwrap_err();
        assert_eq!(e.key, "cache_bust.hit_ratio");
        assert!(e.to_string().contains("between 0 and 1"), "{e}");
    }

    #[test]
    fn layers_file_then_env_then_cli() {
        let dir = crate::test_support::test_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("k.toml");
        std::fs::write(
            &file,
            "[upstream]\nurl = \"http://file:1\"\nconnect_timeout = \"250ms\"\n[cache_bust]\ntarget = \"SYSTEM_PREFIX\"\n[listen]\naddr = \"127.0.0.1:1\"\n",
        )
        .unwrap();
        let e = env(&[
            ("KVBUST_UPSTREAM__URL", "http://env:2"),
            ("KVBUST_LISTEN__ADDR", "127.0.0.1:2"),
            ("KVBUST_CONFIG", "ignored"),
            ("OTHER", "x"),
        ]);
        let cli = CliOverrides {
            listen: Some("127.0.0.1:3".into()),
            ..Default::default()
        };
        let c = Config::load(Some(&file), &e, &cli).unwrap();
        assert_eq!(c.upstream.url.as_deref(), Some("http://env:2"));
        assert_eq!(c.upstream.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.cache_bust.target, Target::SystemPrefix);
        assert_eq!(c.listen.addr.to_string(), "127.0.0.1:3");
    }

    #[test]
    fn errors_name_the_key() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("KVBUST_UPSTREAM__URL", "ftp://x")], "upstream.url"),
            (
                &[("KVBUST_UPSTREAM__CONNECT_TIMEOUT", "soon")],
                "upstream.connect_timeout",
            ),
            (
                &[("KVBUST_LIMITS__MAX_BODY", "12 parsecs")],
                "limits.max_body",
            ),
            (
                &[("KVBUST_CACHE_BUST__TARGET", "everything")],
                "cache_bust.target",
            ),
            (
                &[("KVBUST_CACHE_BUST__PHASEE", "warmup")],
                "cache_bust.phasee",
            ),
            (&[("KVBUST_LISTEN__ADDR", "nope")], "listen.addr"),
        ];
        for (pairs, key) in cases {
            let err = Config::load(None, &env(pairs), &CliOverrides::default()).unwrap_err();
            assert_eq!(&err.key, key, "{err}");
        }
    }

    #[test]
    fn yaml_files_work_and_unknown_keys_fail() {
        let dir = crate::test_support::test_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("k.yaml");
        std::fs::write(&good, "shutdown:\n  grace: 2s\nlimits:\n  max_body: 1KiB\n").unwrap();
        let c = Config::load(Some(&good), &[], &CliOverrides::default()).unwrap();
        assert_eq!(c.shutdown.grace, Duration::from_secs(2));
        assert_eq!(c.limits.max_body, ByteSize(1024));
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "upstream:\n  urll: http://x\n").unwrap();
        let err = Config::load(Some(&bad), &[], &CliOverrides::default()).unwrap_err();
        assert_eq!(err.key, "upstream.urll");
    }

    #[test]
    fn the_synth_conversation_header_is_a_request_header_kvbust_reads() {
        let h = HeaderNames::default();
        assert!(h.control().contains(&"x-kvbust-synth-conversation"));
        // Renamed, the new name is the known one.
        let renamed = HeaderNames {
            synth_conversation: "x-kvbust-conv".into(),
            ..HeaderNames::default()
        };
        assert!(renamed.control().contains(&"x-kvbust-conv"));
        assert!(validate_header_names(&HeaderNames {
            response_synth_spawn: "X-Spawn".into(),
            ..HeaderNames::default()
        })
        .is_err_and(|e| e.key == "headers.response_synth_spawn"));
    }

    #[test]
    fn shipped_config_file_is_valid_and_equals_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/kvbust.toml");
        let c = Config::load(Some(&path), &[], &CliOverrides::default()).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn a_public_admin_port_needs_a_token_or_an_explicit_opt_out() {
        let load = |pairs: &[(&str, &str)]| Config::load(None, &env(pairs), &Default::default());
        for addr in ["0.0.0.0:9090", "10.0.0.7:9090"] {
            let a = ("KVBUST_ADMIN__ADDR", addr);
            assert_eq!(load(&[a]).unwrap_err().key, "admin.token", "{addr}");
            assert!(load(&[a, ("KVBUST_ADMIN__TOKEN", TOKEN)]).is_ok());
            assert!(load(&[a, ("KVBUST_ADMIN__ALLOW_UNAUTHENTICATED", "true")]).is_ok());
        }
        let cli = |addr: &str| CliOverrides {
            admin_listen: Some(addr.into()),
            ..Default::default()
        };
        let err = Config::load(None, &[], &cli("[::]:9090")).unwrap_err();
        assert_eq!(err.key, "admin.token");
        for addr in ["127.0.0.1:9090", "127.0.0.2:1", "[::1]:9090"] {
            assert!(Config::load(None, &[], &cli(addr)).is_ok(), "{addr}");
        }
    }

    #[test]
    fn kubernetes_service_link_variables_get_a_hint() {
        for (var, key) in [
            ("KVBUST_SERVICE_HOST", "service_host"),
            ("KVBUST_PORT", "port"),
            (
                "KVBUST_GATEWAY_SERVICE_PORT_HTTP",
                "gateway_service_port_http",
            ),
            (
                "KVBUST_GATEWAY_PORT_80_TCP_ADDR",
                "gateway_port_80_tcp_addr",
            ),
        ] {
            let err =
                Config::load(None, &env(&[(var, "10.0.0.1")]), &Default::default()).unwrap_err();
            assert_eq!(err.key, key);
            assert!(err.message.contains("enableServiceLinks: false"), "{err}");
            assert!(err.message.contains(var), "{err}");
        }
        let err = Config::load(
            None,
            &env(&[("KVBUST_UPSTREAM_URL", "x")]),
            &Default::default(),
        )
        .unwrap_err();
        assert!(!err.message.contains("enableServiceLinks"), "{err}");
    }

    #[test]
    fn an_unknown_key_names_its_variable_and_the_nearest_valid_key() {
        let load = |pairs: &[(&str, &str)]| Config::load(None, &env(pairs), &Default::default());
        let err = load(&[("KVBUST_CACHE_BUST__TARGETT", "none")]).unwrap_err();
        assert_eq!(err.key, "cache_bust.targett");
        assert!(
            err.message
                .contains("set by the environment variable KVBUST_CACHE_BUST__TARGETT"),
            "{err}"
        );
        assert!(
            err.message
                .contains("did you mean KVBUST_CACHE_BUST__TARGET (cache_bust.target)?"),
            "{err}"
        );
        // A name nothing is near gets no guess, only the list.
        let err = load(&[("KVBUST_CACHE_BUST__QQQQQQQQQ", "1")]).unwrap_err();
        assert!(!err.message.contains("did you mean"), "{err}");
        assert!(err.message.contains("valid keys here are: "), "{err}");
        // From a file: the key, no variable.
        let dir = std::env::temp_dir().join(format!("kvbust-cfg-near-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("typo.toml");
        std::fs::write(&file, "[upstream]\nurll = \"http://x\"\n").unwrap();
        let err = Config::load(Some(&file), &[], &Default::default()).unwrap_err();
        assert_eq!(err.key, "upstream.urll");
        assert!(err.message.contains("did you mean upstream.url?"), "{err}");
        assert!(!err.message.contains("environment variable"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn stateless_ledger_needs_a_shared_benchmark_id() {
        let load = |pairs: &[(&str, &str)]| Config::load(None, &env(pairs), &Default::default());
        let stateless = ("KVBUST_CACHE_BUST__LEDGER", "stateless");
        assert_eq!(
            load(&[stateless]).unwrap_err().key,
            "cache_bust.benchmark_id"
        );
        let c = load(&[stateless, ("KVBUST_CACHE_BUST__BENCHMARK_ID", "run-7")]).unwrap();
        assert_eq!(c.cache_bust.ledger, LedgerMode::Stateless);
        assert_eq!(
            load(&[("KVBUST_CACHE_BUST__LEDGER", "shared")])
                .unwrap_err()
                .key,
            "cache_bust.ledger"
        );
    }

    #[test]
    fn an_upstream_url_with_a_v1_path_is_refused_with_the_root_to_use() {
        let load = |url: &str| {
            Config::load(
                None,
                &env(&[("KVBUST_UPSTREAM__URL", url)]),
                &Default::default(),
            )
        };
        for (url, root, sent) in [
            (
                "http://127.0.0.1:8000/v1",
                "http://127.0.0.1:8000",
                "/v1/v1/chat/completions",
            ),
            (
                "http://h:8000/v1/",
                "http://h:8000",
                "/v1/v1/chat/completions",
            ),
            (
                "https://gw.example/openai/v1",
                "https://gw.example/openai",
                "/openai/v1/v1/chat/completions",
            ),
            (
                "http://u:s3cret@h/v1/chat/completions",
                "http://h",
                "/v1/chat/completions/v1/chat/completions",
            ),
        ] {
            let err = load(url).unwrap_err();
            assert_eq!(err.key, "upstream.url", "{url}: {err}");
            assert!(
                err.message.contains(&format!("set it to {root}")),
                "{url}: {err}"
            );
            assert!(err.message.contains(sent), "{url}: {err}");
            assert!(!err.message.contains("s3cret"), "{err}");
        }
        // A base path that does not repeat the route prefix is kept, as is a bare host.
        for url in [
            "http://h:8000",
            "http://h:8000/",
            "https://gw/model-a",
            "http://h/v1beta",
        ] {
            assert!(load(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn health_probe_keys_parse_as_durations_and_bad_values_name_the_key() {
        let load = |pairs: &[(&str, &str)]| Config::load(None, &env(pairs), &Default::default());
        let d = Config::default().upstream;
        assert!(d.health_probe);
        assert_eq!(d.health_path, None);
        assert_eq!(d.health_interval, Duration::from_secs(5));
        assert_eq!(d.health_timeout, Duration::from_secs(5));
        assert_eq!(
            (d.health_fail_threshold, d.health_success_threshold),
            (3, 1)
        );
        let c = load(&[
            ("KVBUST_UPSTREAM__HEALTH_INTERVAL", "250ms"),
            ("KVBUST_UPSTREAM__HEALTH_TIMEOUT", "1m 30s"),
            ("KVBUST_UPSTREAM__HEALTH_PATH", "/ready"),
            ("KVBUST_UPSTREAM__HEALTH_FAIL_THRESHOLD", "5"),
            ("KVBUST_UPSTREAM__HEALTH_PROBE", "false"),
        ])
        .unwrap();
        assert_eq!(c.upstream.health_interval, Duration::from_millis(250));
        assert_eq!(c.upstream.health_timeout, Duration::from_secs(90));
        assert_eq!(c.upstream.health_path.as_deref(), Some("/ready"));
        assert_eq!(c.upstream.health_fail_threshold, 5);
        assert!(!c.upstream.health_probe);
        for (pairs, key, hint) in [
            (
                ("KVBUST_UPSTREAM__HEALTH_INTERVAL", "soon"),
                "upstream.health_interval",
                "like \"5s\"",
            ),
            (
                ("KVBUST_UPSTREAM__HEALTH_INTERVAL", "0s"),
                "upstream.health_interval",
                "health_probe = false",
            ),
            (
                ("KVBUST_UPSTREAM__HEALTH_TIMEOUT", "0ms"),
                "upstream.health_timeout",
                "greater than zero",
            ),
            (
                ("KVBUST_UPSTREAM__HEALTH_PATH", "health"),
                "upstream.health_path",
                "like \"/health\"",
            ),
            (
                ("KVBUST_UPSTREAM__HEALTH_FAIL_THRESHOLD", "0"),
                "upstream.health_fail_threshold",
                "at least 1",
            ),
            (
                ("KVBUST_UPSTREAM__HEALTH_SUCCESS_THRESHOLD", "0"),
                "upstream.health_success_threshold",
                "at least 1",
            ),
        ] {
            let err = load(&[pairs]).unwrap_err();
            assert_eq!(err.key, key, "{err}");
            assert!(err.message.contains(hint), "{err}");
        }
    }

    #[test]
    fn the_authority_override_must_be_a_bare_authority_beside_a_url() {
        let url = ("KVBUST_UPSTREAM__URL", "http://10.0.0.5:8000");
        let load = |pairs: &[(&str, &str)]| Config::load(None, &env(pairs), &Default::default());
        for ok in [
            "model.example.com",
            "model.example.com:8443",
            "[::1]:80",
            "10.1.2.3",
        ] {
            let c = load(&[url, ("KVBUST_UPSTREAM__AUTHORITY", ok)]).unwrap();
            assert_eq!(c.upstream.authority.as_deref(), Some(ok));
        }
        for bad in ["user:pw@host", "host/path", "ho st", "host:port", ""] {
            let err = load(&[url, ("KVBUST_UPSTREAM__AUTHORITY", bad)]).unwrap_err();
            assert_eq!(err.key, "upstream.authority", "{bad}: {err}");
            assert!(err.message.contains("host:port"), "{bad}: {err}");
        }
        let err = load(&[("KVBUST_UPSTREAM__AUTHORITY", "m.example")]).unwrap_err();
        assert!(err.message.contains("needs upstream.url"), "{err}");
        let err = load(&[
            url,
            ("KVBUST_UPSTREAM__AUTHORITY", "m.example"),
            ("KVBUST_UPSTREAM__KEEP_HOST", "true"),
        ])
        .unwrap_err();
        assert!(err.message.contains("keep_host"), "{err}");
    }

    #[test]
    fn url_passwords_are_redacted_and_everything_else_kept() {
        let cases = [
            (
                "http://u:s3cret@host:8000/v1",
                "http://u:<redacted>@host:8000/v1",
            ),
            ("https://u:p%40ss@h/x?y#z", "https://u:<redacted>@h/x?y#z"),
            ("http://u:a:b@h", "http://u:<redacted>@h"),
            ("http://user@host", "http://user@host"),
            ("http://host:1/a@b", "http://host:1/a@b"),
            ("http://host", "http://host"),
            ("not a url", "not a url"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
        let mut c = Config::default();
        c.upstream.url = Some("http://u:s3cret@h:1".into());
        assert!(!c.redacted().to_toml().contains("s3cret"));
        c.upstream.url = Some("ftp://u:s3cret@h:1".into());
        let e = c.validate().unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn connection_bounds_of_issue_34_are_validated_naming_the_key() {
        let mut c = Config::default();
        assert_eq!(c.admin.max_connections, 64);
        assert_eq!(c.upstream.max_connections_per_client, 64);
        assert_eq!(c.upstream.max_connections_per_source, 1024);
        c.admin.max_connections = 0;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("admin.max_connections") && e.contains("set 1 to 4096"),
            "{e}"
        );
        c.admin.max_connections = 8;
        c.upstream.max_connections_per_source = 16;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("upstream.max_connections_per_source")
                && e.contains("below upstream.max_connections_per_client (64)"),
            "{e}"
        );
        c.upstream.max_connections_per_client = 16;
        c.validate()
            .expect("a source bound equal to the client bound is fine");
    }

    /// Issue 34 item 4: the placeholder build budget's keys are checked, each error naming its
    /// key and a value that works.
    #[test]
    fn the_placeholder_build_budget_is_validated_naming_the_key() {
        type Set = fn(&mut SynthConfig);
        let bad: [(&str, Set); 5] = [
            ("synth.placeholder_build_share", |s| {
                s.placeholder_build_share = 0.0
            }),
            ("synth.placeholder_build_share", |s| {
                s.placeholder_build_share = 1.5
            }),
            ("synth.placeholder_build_cpu", |s| {
                s.placeholder_build_cpu = 0.0
            }),
            ("synth.placeholder_build_cpu", |s| {
                s.placeholder_build_cpu = f64::NAN
            }),
            ("synth.placeholder_build_window", |s| {
                s.placeholder_build_window = Duration::from_millis(10);
            }),
        ];
        for (key, set) in bad {
            let mut c = Config::default();
            set(&mut c.synth);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("e.g."), "{key}: {e}");
        }
        let mut c = Config::default();
        c.synth.placeholder_build_share = 1.0;
        c.synth.placeholder_build_cpu = 8.0;
        c.validate()
            .expect("a share of 1 and several cores are fine");
    }

    #[test]
    fn a_password_in_a_broken_url_line_is_hidden_in_the_parse_error() {
        // Fuzz finding (fuzz/open/config): a second `url = "` inside the string cuts the
        // scheme off the word that holds the password, and TOML's error quotes the line.
        let text = "[upstream]\nurl = \"http://usurl = \"her:s3cretpassw0rd@127.0.0.1:80009v;\"\n";
        let err = toml::from_str::<toml::Value>(text).unwrap_err().to_string();
        assert!(
            err.contains("s3cretpassw0rd"),
            "the raw error quotes it: {err}"
        );
        let shown = redact_urls_in(&err);
        assert!(!shown.contains("s3cretpassw0rd"), "{shown}");
        assert!(shown.contains("her:<redacted>@127.0.0.1"), "{shown}");
        for kept in ["no url here", "mail me at a@b", "path/a:b@c", "http://h/x"] {
            assert_eq!(redact_urls_in(kept), kept);
        }
    }

    #[test]
    fn redaction_hides_the_admin_token() {
        let e = env(&[("KVBUST_ADMIN__TOKEN", TOKEN)]);
        let c = Config::load(None, &e, &CliOverrides::default()).unwrap();
        assert!(!c.redacted().to_toml().contains("s3cret"));
    }

    #[test]
    fn buffered_bodies_are_fitted_into_half_the_memory_limit() {
        let mut c = Config::default();
        assert!(c.fit_memory_limit(None).is_empty());
        assert!(
            c.fit_memory_limit(Some(4 << 30)).is_empty(),
            "2GiB >= 1GiB and 1GiB >= 256MiB: unchanged"
        );
        assert_eq!(c.limits.max_buffered_total, ByteSize(1 << 30));

        let notes = c.fit_memory_limit(Some(512 << 20));
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(c.limits.max_buffered_total, ByteSize(256 << 20));
        assert_eq!(c.limits.max_body, ByteSize(64 << 20), "still below");
        assert!(notes[0].starts_with("limits.max_buffered_total lowered from 1GiB to 256MiB, half the cgroup memory limit (512MiB)"), "{notes:?}");
        assert_eq!(c.cache_model.max_memory, ByteSize(128 << 20));
        assert!(
            notes[1].starts_with("cache_model.max_memory lowered from 256MiB to 128MiB, a quarter"),
            "{notes:?}"
        );
        c.validate().unwrap();
        // GET /config says so, above the lowered values.
        let shown = c.redacted().to_toml();
        let head = format!(
            "# adjusted at start: {}\n# adjusted at start: {}\n",
            notes[0], notes[1]
        );
        assert!(shown.starts_with(&head), "{shown}");
        assert!(shown.contains("max_buffered_total = \"256MiB\""), "{shown}");

        // A limit so small that max_body must come down too, so the result stays valid.
        let mut c = Config::default();
        let notes = c.fit_memory_limit(Some(64 << 20));
        assert_eq!(c.limits.max_body, ByteSize(32 << 20));
        assert!(notes[0].contains("limits.max_body from 64MiB"), "{notes:?}");
        c.validate().unwrap();
        // With the model off, its memory is not touched.
        let mut c = Config::default();
        c.cache_model.enabled = false;
        assert_eq!(c.fit_memory_limit(Some(512 << 20)).len(), 1);
        assert_eq!(c.cache_model.max_memory, ByteSize(256 << 20));
    }

    #[test]
    fn warmup_isolation_system_needs_a_system_prompt_in_the_synth_dataset() {
        let load = |pairs: &[(&str, &str)]| Config::load(None, &env(pairs), &Default::default());
        let t = ("KVBUST_CACHE_BUST__TARGET", "warmup_isolation_system");
        let n = ("KVBUST_SYNTH__DATASET__NUM_DATASET_ENTRIES", "2");
        let e = load(&[t, n]).unwrap_err();
        assert_eq!(e.key, "synth.dataset");
        assert!(e.message.contains("shared_system_prompt_length"), "{e}");
        assert!(load(&[
            t,
            n,
            ("KVBUST_SYNTH__DATASET__SHARED_SYSTEM_PROMPT_LENGTH", "8")
        ])
        .is_ok());
        assert!(load(&[t, n, ("KVBUST_SYNTH__DATASET__SYSTEM_PROMPT", "Be brief.")]).is_ok());
        let first_turn = ("KVBUST_CACHE_BUST__TARGET", "warmup_isolation_first_turn");
        assert!(load(&[first_turn, n]).is_ok());
        assert!(load(&[t]).is_ok(), "no [synth.dataset]: nothing to check");
    }

    #[test]
    fn short_and_placeholder_admin_tokens_are_refused() {
        let load = |t: &str| {
            Config::load(
                None,
                &env(&[("KVBUST_ADMIN__TOKEN", t)]),
                &Default::default(),
            )
        };
        for t in [
            "REPLACE-ME-before-applying",
            "please-replace-me-0123456789abcdef",
            "CHANGEME-0123456789abcdef0123",
        ] {
            let e = load(t).unwrap_err();
            assert_eq!(e.key, "admin.token");
            assert!(e.message.contains("placeholder"), "{t}: {e}");
        }
        let e = load("t0ken").unwrap_err();
        assert!(e.message.contains("5 characters, shorter than 24"), "{e}");
        assert!(load(&"x".repeat(23)).is_err());
        assert!(load(&"x".repeat(24)).is_ok());
        assert!(load(TOKEN).is_ok());
    }
}
