//! Built-in mock model server (OpenAI chat/completions and Responses, Anthropic Messages) with a simulated
//! prefix cache. Never talks to the network except through the listener it is given.
//!
//! [`Mock::handle`] answers one request; [`serve`] runs it on a listener (HTTP/1.1 and h2c on one port, graceful
//! shutdown). Every request, on any path and with any method, is recorded by the [`Recorder`] (its head and
//! exact body bytes, copied, within `mock.record_bytes`; its size and sha256 while it is listed) before it is
//! answered.
//!
//! Prompt tokens are counted with the configured tokenizer ([`tokenize`]; the shipped Qwen3 one and its chat
//! template by default), and every shape goes through the same simulated vLLM-style prefix cache
//! ([`prefix_cache`]), so a prefix sent as a chat request is a cache hit for a Messages or Responses request.
//!
//! # Routes
//! - `POST /v1/chat/completions`, `POST /v1/completions`: deterministic completions of exactly `max_completion_tokens`
//!   / `max_tokens` words, one per token event (default [`MockConfig::default_max_tokens`]), `finish_reason:
//!   "length"`, with `usage.prompt_tokens`, `completion_tokens` (the mock tokenizer's tokens of the answer's text,
//!   as a client that re-tokenizes it counts), `total_tokens` and `prompt_tokens_details.cached_tokens`. The
//!   model reported is the request's `model`, else the configured one. With `"stream": true`:
//!   `text/event-stream`, one SSE event (one body frame) per token, the first chat chunk carrying
//!   `delta.role = "assistant"`, then a chunk with `finish_reason`, then (when `stream_options.include_usage` is
//!   true, in which case every chunk also has `"usage": null`) a chunk with empty `choices` and the `usage`,
//!   then `data: [DONE]`.
//! - `POST /v1/responses`: OpenAI Responses ([`responses`]): `max_output_tokens` tokens, `usage.input_tokens`,
//!   `input_tokens_details.cached_tokens`; streamed as `response.created` … `response.completed`.
//! - `POST /v1/messages`: Anthropic Messages ([`anthropic`]): `max_tokens` tokens, `usage.input_tokens`
//!   (uncached only), `cache_read_input_tokens`, `cache_creation_input_tokens`; streamed as `message_start` …
//!   `message_stop`; errors in Anthropic's shape.
//! - `POST /reset_prefix_cache`: empties the simulated prefix cache, as vLLM's (200, empty body; vLLM's
//!   `reset_running_requests` / `reset_external` query flags are accepted and have nothing more to do here).
//! - `GET /v1/models`: the configured model. `GET /health`: 200 `{"status":"ok"}`.
//! - Anything else: 404 (unknown path) or 405 (known path, wrong method), OpenAI-shaped
//!   `{"error":{"message","type","code"}}`; an unparseable or invalid body is 400, a body over `mock.max_body` (64 MiB) 413, and
//!   one past the buffer budget it shares with `kvbust serve`'s proxy (`limits.max_buffered_total`) 503.
//!
//! # Pacing
//! The first token is due `base_delay + prefill_per_token × uncached prompt tokens` after the request arrived, the
//! next ones `inter_token` apart on a fixed schedule. Streaming responses send their headers at once (as vLLM
//! does) and the first event when it is due; non-streaming responses are sent when the last token is due.
//!
//! # Request headers honoured (for tests)
//! - `x-mock-first-token-delay: 2s` — nothing at all (not even response headers) is sent until this long after
//!   the request arrived; it replaces the computed prefill delay, and the first token follows immediately.
//!   Honoured on every route, so it also makes `/health` or an unknown path slow (proxy timeout tests).
//! - `x-mock-inter-token: 50ms` — the delay between tokens for this request.
//!
//! Values are humantime durations (`"250ms"`, `"2s"`); an unparseable value is answered with 400.
//! Completion responses carry `x-mock-prompt-tokens` and `x-mock-cached-tokens` headers.

pub mod anthropic;
pub mod bounds;
pub mod chat;
pub mod config;
pub mod engine;
pub mod kv_events;
pub mod openai;
pub mod output;
pub mod prefix_cache;
pub mod recorder;
pub mod request;
pub mod responses;
mod server;
mod sse;
pub mod tokenize;

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use sha2::{Digest, Sha256};

use crate::budget::{BodyBudget, Reservation};
use tokio::time::Instant;

use crate::api::Shape;
pub use config::{MockConfig, MockTokenizerSetting};
use openai::ResponseMeta;
use prefix_cache::PrefixCache;
pub use recorder::{CapturedRequest, Recorder};
use request::{ApiError, GenRequest, Prompt, Usage};
use responses::{ResponseEvents, ResponseInfo};
pub use server::serve;
use sse::{after, Events, SseBody, StreamPlan};
use tokenize::Counted;
pub use tokenize::MockTokenizer;

/// Header: delay before anything is sent (see the module documentation).
pub const HEADER_FIRST_TOKEN_DELAY: &str = "x-mock-first-token-delay";
/// Header: per-request inter-token delay.
pub const HEADER_INTER_TOKEN: &str = "x-mock-inter-token";
/// Response header: prompt tokens of a completion.
pub const HEADER_PROMPT_TOKENS: &str = "x-mock-prompt-tokens";
/// Response header: cached prompt tokens of a completion.
pub const HEADER_CACHED_TOKENS: &str = "x-mock-cached-tokens";

/// Largest `mock.max_body` accepted (the largest request body the mock can be told to read).
pub const MAX_BODY_BYTES: usize = 256 << 20;

/// Prompt tokens the mock reads when `mock.max_model_len` is 0 (no context limit): a larger
/// prompt is a 400 `context_length_exceeded`, found by counting no further than this. As many as
/// the longest token-id `prompt` list the mock takes ([`bounds::MAX_PROMPT_ENTRIES`]).
pub const MAX_PROMPT_TOKENS: usize = bounds::MAX_PROMPT_ENTRIES;

/// `created` of every response and model: fixed, so output is fully deterministic (2025-01-01T00:00:00Z).
pub const CREATED: u64 = 1_735_689_600;

/// Prompts larger than this (in bytes) are rendered and tokenized on a blocking thread when a real tokenizer is
/// configured. Qwen3 encodes only about 1.5-2 MB/s on the shared 2-core test machine (release build: a 1 KB
/// completions prompt caps the mock at about 1,850 requests/s), so this bounds the time a prompt holds an async
/// worker (and delays other streams' events) to about half a millisecond; the hand-off costs tens of µs.
const BLOCKING_TOKENIZE_BYTES: usize = 1 << 10;

/// Bodies larger than this are hashed on a blocking thread (sha256 runs at several hundred MB/s).
const BLOCKING_DIGEST_BYTES: usize = 1 << 20;

/// The mock model server: configuration, tokenizer, simulated prefix cache and recorder.
pub struct Mock {
    cfg: MockConfig,
    tokenizer: MockTokenizer,
    /// The answer words: those the tokenizer keeps as one token ([`output::one_token_words`]).
    vocab: Arc<[&'static str]>,
    cache: Mutex<PrefixCache>,
    /// Served names, load, jitter, failures and the `vllm:` metrics ([`engine`]).
    engine: engine::Engine,
    recorder: Recorder,
    next_id: AtomicU64,
    /// The budget of buffered request bodies shared with the proxy in the same process
    /// (`limits.max_buffered_total`), once [`Mock::share_budget`] set it.
    budget: std::sync::OnceLock<Arc<BodyBudget>>,
    /// vLLM's KV cache events (`mock.kv_events`), once [`Mock::start_kv_events`] bound the socket.
    kv_events: std::sync::OnceLock<kv_events::Publisher>,
}

impl std::fmt::Debug for Mock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mock")
            .field("cfg", &self.cfg)
            .field("tokenizer", &self.tokenizer)
            .finish_non_exhaustive()
    }
}

/// Per-request overrides read from the `x-mock-*` headers.
#[derive(Debug, Default, Clone, Copy)]
struct Overrides {
    first_token_delay: Option<Duration>,
    inter_token: Option<Duration>,
}

impl Overrides {
    fn parse(headers: &HeaderMap) -> Result<Self, ApiError> {
        let get = |name: &'static str| -> Result<Option<Duration>, ApiError> {
            let Some(v) = headers.get(name) else {
                return Ok(None);
            };
            let bad = || {
                ApiError::bad_request(
                    "invalid_header",
                    format!(
                        "header `{name}` must be a duration such as \"250ms\" or \"2s\", got {v:?}"
                    ),
                )
            };
            let text = v.to_str().map_err(|_| bad())?;
            crate::units::duration::parse(text)
                .map(Some)
                .map_err(|_| bad())
        };
        Ok(Overrides {
            first_token_delay: get(HEADER_FIRST_TOKEN_DELAY)?,
            inter_token: get(HEADER_INTER_TOKEN)?,
        })
    }
}

/// A response body; its error cuts the connection (`mock.failure_rate`'s "reset").
type MockBody = BoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> MockBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

fn json_response(status: StatusCode, body: Bytes) -> Response<MockBody> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error_response(e: &ApiError) -> Response<MockBody> {
    json_response(e.status, e.body())
}

/// An error in the shape of `endpoint`'s API.
fn error_response_for(endpoint: Shape, e: &ApiError) -> Response<MockBody> {
    json_response(e.status, e.body_for(Some(endpoint)))
}

/// A vLLM/FastAPI boolean query value.
fn query_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Some(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

/// Checks the query of `POST /reset_prefix_cache`: vLLM's two flags must be booleans.
fn reset_query(query: Option<&str>) -> Result<(), ApiError> {
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if matches!(key, "reset_running_requests" | "reset_external") && query_bool(value).is_none()
        {
            return Err(ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                message: format!("query parameter `{key}` must be a boolean such as true or false"),
                kind: "invalid_request_error",
                code: "invalid_value",
            });
        }
    }
    Ok(())
}

/// sha256 of `body`, off the async threads when it is large.
async fn digest(body: &Bytes) -> [u8; 32] {
    if body.len() <= BLOCKING_DIGEST_BYTES {
        return Sha256::digest(body).into();
    }
    let owned = body.clone();
    match tokio::task::spawn_blocking(move || Sha256::digest(&owned).into()).await {
        Ok(d) => d,
        // Only if the blocking pool is shutting down: hash here rather than record a wrong digest.
        Err(_) => Sha256::digest(body).into(),
    }
}

/// Reads the whole body, up to `limit` bytes (`mock.max_body`), holding what it has read in
/// `held` when the mock shares a budget; returns what was read and the error that stopped it, if
/// any (413 past the limit, 503 past the budget).
async fn read_body<B>(
    body: B,
    limit: usize,
    mut held: Option<&mut Reservation<'_>>,
) -> (Bytes, Option<ApiError>)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Display,
{
    let mut body = std::pin::pin!(body);
    let mut only: Option<Bytes> = None; // the common one-frame body is kept without copying
    let mut buf = BytesMut::new();
    let mut len = 0usize;
    while let Some(frame) = body.as_mut().frame().await {
        let data = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => data,
                Err(_trailers) => continue,
            },
            Err(e) => {
                let read = only.take().unwrap_or_else(|| buf.split().freeze());
                let e = ApiError::bad_request(
                    "body_read_error",
                    format!("could not read the request body: {e}"),
                );
                return (read, Some(e));
            }
        };
        if len + data.len() > limit {
            let mut read = BytesMut::from(only.take().unwrap_or_else(|| buf.split().freeze()));
            read.extend_from_slice(&data[..limit - len]);
            let e = ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!(
                    "request body over the mock's limit of {limit} bytes (mock.max_body)"
                ),
                kind: "invalid_request_error",
                code: "body_too_large",
            };
            return (read.freeze(), Some(e));
        }
        if let Some(r) = held.as_deref_mut() {
            if !r.grow_to((len + data.len()) as u64) {
                let read = only.take().unwrap_or_else(|| buf.split().freeze());
                let e = ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    message: "too many request bodies are being buffered at once \
                              (limits.max_buffered_total); retry shortly"
                        .to_owned(),
                    kind: "server_error",
                    code: "buffer_budget_exhausted",
                };
                return (read, Some(e));
            }
        }
        len += data.len();
        match only.take() {
            None if buf.is_empty() => only = Some(data),
            None => buf.extend_from_slice(&data),
            Some(first) => {
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&data);
            }
        }
    }
    (only.unwrap_or_else(|| buf.freeze()), None)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Generate(Shape),
    ResetPrefixCache,
    Models,
    Health,
    Metrics,
    Unknown,
}

fn route(path: &str) -> Route {
    // The generation paths are the proxy's: one table, `Shape::path`.
    if let Some(shape) = Shape::from_path(path) {
        return Route::Generate(shape);
    }
    match path {
        "/reset_prefix_cache" => Route::ResetPrefixCache,
        crate::api::MODELS_PATH => Route::Models,
        "/health" => Route::Health,
        "/metrics" => Route::Metrics,
        _ => Route::Unknown,
    }
}

impl Mock {
    /// A mock with `cfg`, counting tokens with `tokenizer` or, when `None`, the built-in one
    /// ([`tokenize::builtin_pieces`]); `cfg.tokenizer` is not looked at (see [`Mock::from_config`]).
    pub fn new(cfg: MockConfig, tokenizer: Option<MockTokenizer>) -> Arc<Mock> {
        let budget = usize::try_from(cfg.record_bytes.as_u64()).unwrap_or(usize::MAX);
        Arc::new(Mock {
            cache: Mutex::new(PrefixCache::new(cfg.block_size, cfg.cache_blocks)),
            engine: engine::Engine::new(&cfg),
            recorder: Recorder::new(cfg.record_requests, budget),
            next_id: AtomicU64::new(0),
            vocab: {
                let t = tokenizer.as_ref().unwrap_or(&MockTokenizer::Builtin);
                output::one_token_words(|w| t.encode(w).len() == 1).into()
            },
            tokenizer: tokenizer.unwrap_or(MockTokenizer::Builtin),
            cfg,
            budget: std::sync::OnceLock::new(),
            kv_events: std::sync::OnceLock::new(),
        })
    }

    /// Starts publishing KV cache events when `mock.kv_events` enables them (binding or
    /// connecting the PUB socket as vLLM does); returns the endpoint, `None` when off. Once:
    /// later calls return the first endpoint.
    pub async fn start_kv_events(&self) -> Result<Option<String>, String> {
        if let Some(p) = self.kv_events.get() {
            return Ok(Some(p.endpoint().to_owned()));
        }
        let Some(json) = &self.cfg.kv_events else {
            return Ok(None);
        };
        let cfg = kv_events::EventsConfig::parse(json)?;
        if !cfg.publishes() {
            return Ok(None);
        }
        let publisher = kv_events::Publisher::start(&cfg).await?;
        let endpoint = publisher.endpoint().to_owned();
        tracing::info!(%endpoint, topic = %cfg.topic, "mock: publishing vLLM KV cache events");
        let _ = self.kv_events.set(publisher);
        Ok(Some(endpoint))
    }

    /// Serves `tokens` from the prefix cache: (cached, newly written) tokens; what the cache
    /// did goes out as KV events when they are on.
    fn admit(&self, tokens: &[u32], salt: Option<&str>) -> (usize, usize) {
        let Some(publisher) = self.kv_events.get() else {
            return crate::sync::lock(&self.cache).admit_salted(tokens, salt);
        };
        let mut events = Vec::new();
        let mut cache = crate::sync::lock(&self.cache);
        let got = cache.admit_with_events(tokens, salt, &mut events);
        // Under the lock: batches go out in the order the cache changed.
        publisher.publish(events);
        got
    }

    /// KV event batches handed to the socket so far (0 when events are off).
    pub fn kv_events_sent(&self) -> u64 {
        self.kv_events.get().map_or(0, kv_events::Publisher::sent)
    }

    /// KV event batches queued so far, sent or not yet (0 when events are off): the seq the
    /// next batch will carry.
    pub fn kv_events_queued(&self) -> u64 {
        self.kv_events.get().map_or(0, kv_events::Publisher::queued)
    }

    /// Charges the bodies this mock buffers to `budget` from now on (the proxy's, when both run in
    /// one process): a body that would go past it is a 503 at once. Set once; later calls do nothing.
    pub fn share_budget(&self, budget: Arc<BodyBudget>) {
        let _ = self.budget.set(budget);
    }

    /// A mock with `cfg`, counting tokens with the tokenizer `cfg.tokenizer` names. Blocking: loading a
    /// tokenizer reads and parses its `tokenizer.json` (the shipped Qwen3 one takes well under a second).
    pub fn from_config(cfg: MockConfig) -> Result<Arc<Mock>, crate::synth::error::SynthError> {
        let tokenizer = MockTokenizer::load_dated(&cfg.tokenizer, cfg.chat_template_date)?;
        Ok(Mock::new(cfg, Some(tokenizer)))
    }

    /// What the mock received and what happened to its streams.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// The configuration the mock runs with.
    pub fn config(&self) -> &MockConfig {
        &self.cfg
    }

    /// Empties the simulated prefix cache (as vLLM's `/reset_prefix_cache`).
    pub fn reset_prefix_cache(&self) {
        let mut cache = crate::sync::lock(&self.cache);
        *cache = PrefixCache::new(self.cfg.block_size, self.cfg.cache_blocks);
        if let Some(p) = self.kv_events.get() {
            p.publish(vec![kv_events::KvEvent::Cleared]);
        }
    }

    /// Hands the request (origin-form URI, headers, body and its digest) to the recorder.
    async fn record(&self, parts: &http::request::Parts, bytes: &Bytes) {
        let origin = parts
            .uri
            .path_and_query()
            .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
        self.recorder.record(CapturedRequest {
            method: parts.method.clone(),
            uri: origin,
            authority: parts.uri.authority().map(ToString::to_string),
            headers: parts.headers.clone(),
            body_len: bytes.len(),
            body_sha256: digest(bytes).await,
            body: bytes.clone(),
            version: parts.version,
        });
    }

    /// Answers one request. Never panics and never fails: every problem is an OpenAI-shaped error response.
    pub async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<MockBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Display,
    {
        let received = Instant::now();
        let (parts, body) = req.into_parts();
        let limit = usize::try_from(self.cfg.max_body.as_u64()).unwrap_or(MAX_BODY_BYTES);
        // Held until the answer's head is made: the body is in memory until then.
        let mut held = self.budget.get().map(|b| b.reservation());
        let (bytes, body_error) = read_body(body, limit.min(MAX_BODY_BYTES), held.as_mut()).await;
        self.record(&parts, &bytes).await;
        tracing::debug!(method = %parts.method, uri = %parts.uri, bytes = bytes.len(), "mock: request");
        let route = route(parts.uri.path());
        let shape_error = |e: &ApiError| route_error(route, e);
        if let Some(e) = body_error {
            return shape_error(&e);
        }
        let overrides = match Overrides::parse(&parts.headers) {
            Ok(o) => o,
            Err(e) => return shape_error(&e),
        };
        if let Route::Generate(endpoint) = route {
            if parts.method == Method::POST {
                return self.generate(endpoint, &bytes, overrides, received).await;
            }
        }
        if let Some(d) = overrides.first_token_delay {
            tokio::time::sleep_until(after(received, d)).await;
        }
        let is_get = parts.method == Method::GET || parts.method == Method::HEAD;
        match route {
            Route::Health if is_get => {
                json_response(StatusCode::OK, Bytes::from_static(br#"{"status":"ok"}"#))
            }
            Route::Models if is_get => json_response(StatusCode::OK, self.models_body()),
            Route::Metrics if is_get => {
                let mut resp = Response::new(full(self.engine.metrics_text()));
                resp.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                resp
            }
            Route::ResetPrefixCache if parts.method == Method::POST => {
                if let Err(e) = reset_query(parts.uri.query()) {
                    return error_response(&e);
                }
                self.reset_prefix_cache();
                tracing::info!("mock: prefix cache reset");
                // vLLM answers a bare 200 with no body.
                Response::new(Empty::new().map_err(|never| match never {}).boxed())
            }
            Route::Unknown => error_response(&ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("no route for {} {}", parts.method, parts.uri.path()),
                kind: "invalid_request_error",
                code: "not_found",
            }),
            Route::Health
            | Route::Models
            | Route::Metrics
            | Route::Generate(_)
            | Route::ResetPrefixCache => method_not_allowed(route, &parts),
        }
    }

    fn models_body(&self) -> Bytes {
        let data: Vec<serde_json::Value> = self
            .engine
            .listed_models(&self.cfg.model)
            .into_iter()
            .map(|id| {
                serde_json::json!({
                    "id": id,
                    "object": "model",
                    "created": CREATED,
                    "owned_by": "kvbust",
                    "max_model_len": self.cfg.max_model_len,
                })
            })
            .collect();
        let v = serde_json::json!({"object": "list", "data": data});
        Bytes::from(v.to_string())
    }

    /// The prompt's token ids, or a lower bound once it is known to hold more than `limit`
    /// ([`MockTokenizer::prompt_tokens_within`]); rendered and encoded on a blocking thread when
    /// that is expensive.
    async fn tokenize(&self, prompt: Prompt, limit: usize) -> Result<Counted, ApiError> {
        if !self.tokenizer.is_expensive()
            || MockTokenizer::prompt_bytes(&prompt) <= BLOCKING_TOKENIZE_BYTES
        {
            return self.tokenizer.prompt_tokens_within(&prompt, limit);
        }
        let tokenizer = self.tokenizer.clone();
        match tokio::task::spawn_blocking(move || tokenizer.prompt_tokens_within(&prompt, limit))
            .await
        {
            Ok(tokens) => tokens,
            Err(e) => Err(ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: format!("the mock's tokenizer task failed: {e}"),
                kind: "server_error",
                code: "tokenizer_failed",
            }),
        }
    }

    /// The most prompt tokens that fit beside `completion_tokens` of output: `mock.max_model_len`
    /// less the output, or [`MAX_PROMPT_TOKENS`] when `mock.max_model_len` is 0.
    fn prompt_room(&self, completion_tokens: u32) -> usize {
        match self.cfg.max_model_len {
            0 => MAX_PROMPT_TOKENS,
            max => max.saturating_sub(completion_tokens as usize),
        }
    }

    /// A 400 `context_length_exceeded` when the prompt plus the requested output would not fit
    /// `mock.max_model_len`, worded as vLLM words it; with no limit (0), when the prompt holds
    /// more than [`MAX_PROMPT_TOKENS`].
    fn check_context(&self, prompt_tokens: usize, completion_tokens: u32) -> Result<(), ApiError> {
        let over = match self.cfg.max_model_len {
            0 => prompt_tokens > MAX_PROMPT_TOKENS,
            max => prompt_tokens.saturating_add(completion_tokens as usize) > max,
        };
        if over {
            return Err(self.context_error(prompt_tokens, completion_tokens, ""));
        }
        Ok(())
    }

    /// The 400 for a prompt of `prompt_tokens` (`at_least` before the figures when counting
    /// stopped early) that does not fit beside `completion_tokens` of output.
    fn context_error(
        &self,
        prompt_tokens: usize,
        completion_tokens: u32,
        at_least: &str,
    ) -> ApiError {
        let message = match self.cfg.max_model_len {
            0 => format!(
                "This model's maximum context length is unlimited, but the mock reads at most {MAX_PROMPT_TOKENS} \
                 prompt tokens. However, you requested {at_least}{prompt_tokens} tokens in the messages. Please \
                 reduce the length of the messages."
            ),
            max => {
                let requested = prompt_tokens.saturating_add(completion_tokens as usize);
                format!(
                    "This model's maximum context length is {max} tokens. However, you requested {at_least}{requested} tokens \
                     ({at_least}{prompt_tokens} in the messages, {completion_tokens} in the completion). Please reduce the length of the \
                     messages or completion.",
                )
            }
        };
        ApiError::bad_request("context_length_exceeded", message)
    }

    /// The override, else the base delay plus prefill for the `uncached` prompt tokens: alone
    /// at `prefill_per_token`, or behind the others in the shared budget
    /// (`prefill_tokens_per_s`, reserved from `start`).
    fn time_to_first_token(&self, ov: &Overrides, uncached: usize, start: Instant) -> Duration {
        if let Some(d) = ov.first_token_delay {
            return d;
        }
        let prefill = self
            .engine
            .shared_prefill(uncached, start)
            .unwrap_or_else(|| {
                let uncached = u32::try_from(uncached).unwrap_or(u32::MAX);
                self.cfg
                    .prefill_per_token
                    .checked_mul(uncached)
                    .unwrap_or(Duration::MAX)
            });
        self.cfg.base_delay.saturating_add(prefill)
    }

    /// The SSE response for `plan`. With an explicit first-token delay the headers wait for it
    /// too, and the tokens are timed from when they are sent.
    async fn stream_response(
        &self,
        mut plan: StreamPlan,
        hold_headers: bool,
    ) -> Response<MockBody> {
        // Counted from here, so a client that leaves during the delay below counts as a cancelled stream.
        let guard = self.recorder.stream_started();
        if hold_headers {
            tokio::time::sleep_until(plan.first_token_at).await;
            plan.first_token_at = Instant::now();
        }
        let mut resp = Response::new(SseBody::new(plan, guard).boxed());
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        resp.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    }

    async fn generate(
        &self,
        endpoint: Shape,
        body: &[u8],
        ov: Overrides,
        received: Instant,
    ) -> Response<MockBody> {
        let mut req = match openai::parse_request(endpoint, body, self.cfg.default_model()) {
            Ok(r) => r,
            Err(e) => return error_response_for(endpoint, &e),
        };
        if let Err(e) = self.engine.check_model(&req.model) {
            return error_response_for(endpoint, &e);
        }
        let mut draws = self.engine.next_draws();
        let failure = self.engine.failure(&mut draws);
        if let Some(e) = failure.and_then(engine::failure_error) {
            let mut resp = error_response_for(endpoint, &e);
            if e.status != StatusCode::INTERNAL_SERVER_ERROR {
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            return resp;
        }
        let prompt = std::mem::replace(&mut req.prompt, Prompt::Raw(Vec::new()));
        let completion_tokens = req.max_tokens.unwrap_or(self.cfg.default_max_tokens).max(1);
        let room = self.prompt_room(completion_tokens);
        let tokens = match self.tokenize(prompt, room).await {
            Ok(Counted::Tokens(t)) => t,
            Ok(Counted::Over(n)) => {
                let e = self.context_error(n, completion_tokens, "at least ");
                return error_response_for(endpoint, &e);
            }
            Err(e) => return error_response_for(endpoint, &e),
        };
        if let Err(e) = self.check_context(tokens.len(), completion_tokens) {
            return error_response_for(endpoint, &e);
        }
        // Past `mock.max_num_seqs` this waits; the first token is then timed from admission.
        let (running, others) = self.engine.admit().await;
        let start = if self.cfg.max_num_seqs > 0 {
            Instant::now()
        } else {
            received
        };
        let cut = failure.map(|kind| sse::Cut {
            after: completion_tokens / 2,
            reset: kind == config::FailureKind::Reset,
        });
        let load = Load {
            start,
            queued: start.saturating_duration_since(received),
            others,
            draws,
            cut,
        };
        let resp = self
            .respond(endpoint, req, &tokens, completion_tokens, ov, load)
            .await;
        resp.map(|b| engine::Held::new(b, running).boxed())
    }

    /// The completion of an admitted request: the prefix cache, the usage, the schedule.
    async fn respond(
        &self,
        endpoint: Shape,
        req: GenRequest,
        tokens: &[u32],
        completion_tokens: u32,
        ov: Overrides,
        load: Load,
    ) -> Response<MockBody> {
        let salt = req.cache_salt.as_deref();
        let (cached, written) = self.admit(tokens, salt);
        let seed = output::seed(tokens);
        // The answer has `completion_tokens` words (one per event); the usage counts the tokens
        // the mock's tokenizer makes of it, as a client that re-tokenizes the text with the same
        // tokenizer does (equal when every answer word is one token). The built-in splitter is
        // no client's tokenizer: there a word is a token.
        let answer_tokens = match self.tokenizer {
            MockTokenizer::Builtin => completion_tokens as usize,
            _ => self
                .tokenizer
                .encode(&output::text(&self.vocab, seed, completion_tokens))
                .len(),
        };
        let usage = Usage {
            prompt_tokens: tokens.len(),
            completion_tokens: answer_tokens,
            cached_tokens: cached,
            cache_written: written,
        };
        let Load {
            start,
            queued,
            others,
            mut draws,
            cut,
        } = load;
        let uncached = tokens.len() - cached;
        let mut ttft = self.time_to_first_token(&ov, uncached, start);
        if ov.first_token_delay.is_none() {
            ttft = draws.jittered(ttft.saturating_add(self.engine.load_prefill(uncached, others)));
        }
        let first_token_at = after(start, ttft);
        self.engine
            .observe(tokens.len(), cached, queued.saturating_add(ttft));
        let inter_token = ov.inter_token.unwrap_or(self.cfg.inter_token);
        let seq = self.next_id.fetch_add(1, Ordering::Relaxed);
        let stream = req.stream;
        let shape = response_shape(
            endpoint,
            seq,
            req.model,
            stream && req.include_usage,
            req.instructions,
            req.max_tokens,
        );
        tracing::debug!(
            prompt = usage.prompt_tokens,
            cached,
            completion_tokens,
            stream,
            "mock: completion"
        );
        let plan = StreamPlan {
            shape,
            usage,
            seed,
            vocab: self.vocab.clone(),
            tokens: completion_tokens,
            first_token_at,
            inter_token,
            jitter: draws.for_stream(),
            decode: self.engine.decode_share(),
            cut,
        };
        let mut resp = if stream {
            self.stream_response(plan, ov.first_token_delay.is_some())
                .await
        } else {
            full_response(plan).await
        };
        resp.headers_mut()
            .insert(HEADER_PROMPT_TOKENS, HeaderValue::from(usage.prompt_tokens));
        resp.headers_mut()
            .insert(HEADER_CACHED_TOKENS, HeaderValue::from(usage.cached_tokens));
        resp
    }
}

/// What the engine decided for an admitted request: when its clock starts, how many others ran
/// beside it, its draws, and an injected failure that ends it early.
struct Load {
    start: Instant,
    /// How long it waited for a slot (`mock.max_num_seqs`).
    queued: Duration,
    others: usize,
    draws: engine::Draws,
    cut: Option<sse::Cut>,
}

/// The whole JSON response for `plan`, once its last token would have been generated. An
/// injected stall never answers; an injected reset cuts the connection instead of the body.
async fn full_response(mut plan: StreamPlan) -> Response<MockBody> {
    if plan.decode.is_some() {
        // The shared decode budget is read when decoding starts, at the first token.
        tokio::time::sleep_until(plan.first_token_at).await;
    }
    let generation = if plan.jitter.is_some() {
        (1..plan.tokens).fold(Duration::ZERO, |sum, _| sum.saturating_add(plan.gap()))
    } else {
        plan.gap().saturating_mul(plan.tokens - 1)
    };
    tokio::time::sleep_until(after(plan.first_token_at, generation)).await;
    match plan.cut {
        Some(sse::Cut { reset: false, .. }) => std::future::pending::<()>().await,
        Some(sse::Cut { reset: true, .. }) => return Response::new(engine::Reset.boxed()),
        None => {}
    }
    let text = output::text(&plan.vocab, plan.seed, plan.tokens);
    let usage = &plan.usage;
    let body = match &plan.shape {
        Events::OpenAi(meta) => openai::full_response(meta, &text, usage),
        Events::Responses(ev) => responses::full_response(ev.info(), &text, usage),
        Events::Messages { id, model } => anthropic::full_response(id, model, &text, usage),
    };
    json_response(StatusCode::OK, body)
}

/// `e` shaped as the route's API shapes errors (OpenAI's shape off the generation routes).
fn route_error(route: Route, e: &ApiError) -> Response<MockBody> {
    match route {
        Route::Generate(endpoint) => error_response_for(endpoint, e),
        _ => error_response(e),
    }
}

/// A 405 naming the methods `route` takes (also in `Allow`), shaped for the route's API.
fn method_not_allowed(route: Route, parts: &http::request::Parts) -> Response<MockBody> {
    let allow = if matches!(route, Route::Generate(_) | Route::ResetPrefixCache) {
        "POST"
    } else {
        "GET, HEAD"
    };
    let e = ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!(
            "{} is not allowed on {}; use {allow}",
            parts.method,
            parts.uri.path()
        ),
        kind: "invalid_request_error",
        code: "method_not_allowed",
    };
    let mut resp = route_error(route, &e);
    resp.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    resp
}

/// The response's id and the shape of its body for `endpoint`, request number `seq`.
fn response_shape(
    endpoint: Shape,
    seq: u64,
    model: String,
    include_usage: bool,
    instructions: Option<serde_json::Value>,
    max_tokens: Option<u32>,
) -> Events {
    let id = match endpoint {
        Shape::Chat => format!("chatcmpl-mock-{seq:08x}"),
        Shape::Completions => format!("cmpl-mock-{seq:08x}"),
        Shape::Responses => format!("resp_mock{seq:08x}"),
        Shape::Messages => format!("msg_mock{seq:08x}"),
    };
    match endpoint {
        Shape::Chat | Shape::Completions => Events::OpenAi(ResponseMeta {
            endpoint,
            id,
            created: CREATED,
            model,
            include_usage,
        }),
        Shape::Responses => Events::Responses(ResponseEvents::new(ResponseInfo {
            item_id: format!("msg_mock{seq:08x}"),
            id,
            created_at: CREATED,
            model,
            instructions,
            max_output_tokens: max_tokens,
        })),
        Shape::Messages => Events::Messages { id, model },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, path: &str, body: &'static str) -> Request<Full<Bytes>> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("valid request")
    }

    fn quick() -> MockConfig {
        MockConfig {
            base_delay: Duration::ZERO,
            prefill_per_token: Duration::ZERO,
            inter_token: Duration::ZERO,
            ..MockConfig::default()
        }
    }

    async fn body_json(resp: Response<MockBody>) -> serde_json::Value {
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
    }

    #[tokio::test]
    async fn routes_and_errors() {
        let mock = Mock::new(quick(), None);
        let resp = mock
            .clone()
            .handle(request(Method::GET, "/health", ""))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(body_json(resp).await["status"], "ok");

        let resp = mock
            .clone()
            .handle(request(Method::GET, "/v1/models", ""))
            .await;
        assert_eq!(body_json(resp).await["data"][0]["id"], "kvbust-mock");

        let resp = mock
            .clone()
            .handle(request(Method::PUT, "/nope?x=1", "abc"))
            .await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert_eq!(body_json(resp).await["error"]["code"], "not_found");

        let resp = mock
            .clone()
            .handle(request(Method::GET, "/v1/chat/completions", ""))
            .await;
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);

        let resp = mock
            .clone()
            .handle(request(Method::POST, "/v1/chat/completions", "{bad"))
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(body_json(resp).await["error"]["code"], "invalid_json");

        let mut req = request(Method::POST, "/v1/completions", r#"{"prompt":"x"}"#);
        req.headers_mut()
            .insert(HEADER_INTER_TOKEN, HeaderValue::from_static("soon"));
        let resp = mock.clone().handle(req).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

        let recorded = mock.recorder().requests();
        assert_eq!(recorded.len(), 6);
        assert_eq!(recorded[2].method, Method::PUT);
        assert_eq!(recorded[2].uri, "/nope?x=1");
        assert_eq!(&recorded[2].body[..], b"abc");
    }

    #[tokio::test]
    async fn a_configured_tokenizer_counts_prompt_tokens() {
        let tokenizer = MockTokenizer::hf(tokenize::tests::word_level()).expect("no template");
        let mock = Mock::new(quick(), Some(tokenizer));
        let body = r#"{"prompt":["hello world hello", [7, 8]],"max_tokens":1}"#;
        let resp = mock
            .clone()
            .handle(request(Method::POST, "/v1/completions", body))
            .await;
        assert_eq!(resp.headers()[HEADER_PROMPT_TOKENS], "5");
        assert_eq!(body_json(resp).await["usage"]["prompt_tokens"], 5);
    }

    /// Clients that re-tokenize the answer (inference-perf, sglang.bench_serving) count what the
    /// usage says: the tokens of the text, not its words (" meadow" is two Qwen3 tokens).
    #[tokio::test]
    async fn completion_tokens_are_the_tokenizers_tokens_of_the_answer() {
        let qwen = MockTokenizer::load(&crate::mock::config::MockTokenizerSetting::Qwen3).unwrap();
        let mock = Mock::new(quick(), Some(qwen.clone()));
        let body = r#"{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":40}"#;
        let resp = mock
            .clone()
            .handle(request(Method::POST, "/v1/chat/completions", body))
            .await;
        let v = body_json(resp).await;
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(text.split(' ').count(), 40, "one word per token event");
        let counted = qwen.encode(text).len();
        assert_eq!(v["usage"]["completion_tokens"], counted);
        // The answer's words are single Qwen3 tokens, so the count is also max_tokens.
        assert_eq!(counted, 40, "{text}");
        assert!(!text.contains("meadow"), "{text}");
        assert_eq!(
            v["usage"]["total_tokens"],
            v["usage"]["prompt_tokens"].as_u64().unwrap() + counted as u64
        );
    }

    #[tokio::test]
    async fn completion_usage_and_context_limit() {
        let mock = Mock::new(
            MockConfig {
                max_model_len: 40,
                ..quick()
            },
            None,
        );
        let body = r#"{"prompt":"one two three four five six seven eight nine ten eleven twelve","max_tokens":3}"#;
        let resp = mock
            .clone()
            .handle(request(Method::POST, "/v1/completions", body))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let v = body_json(resp).await;
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["usage"]["completion_tokens"], 3);
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(
            v["choices"][0]["text"]
                .as_str()
                .map(|t| t.split(' ').count()),
            Some(3)
        );

        let resp = mock
            .clone()
            .handle(request(
                Method::POST,
                "/v1/completions",
                r#"{"prompt":"x","max_tokens":100}"#,
            ))
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            body_json(resp).await["error"]["code"],
            "context_length_exceeded"
        );
    }

    fn owned(path: &str, body: String) -> Request<Full<Bytes>> {
        Request::builder()
            .method(Method::POST)
            .uri(path)
            .body(Full::new(Bytes::from(body)))
            .expect("valid request")
    }

    /// The figures of a `context_length_exceeded` message: (requested, in the messages).
    fn figures(message: &str) -> (usize, usize) {
        let numbers: Vec<usize> = message
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        (numbers[1], numbers[2])
    }

    #[tokio::test]
    async fn a_huge_chat_is_refused_after_counting_a_chunk_past_the_context() {
        let qwen = MockTokenizer::load(&crate::mock::config::MockTokenizerSetting::Qwen3).unwrap();
        let mock = Mock::new(quick(), Some(qwen.clone()));
        // 8 MiB of text in 2,048 messages: about 2 million tokens, 16 times the context.
        let content = "The quick brown fox jumps over the lazy dog. ".repeat(90);
        let message = serde_json::json!({"role": "user", "content": content}).to_string();
        let messages = vec![message; 2048].join(",");
        let body = format!(r#"{{"model":"m","max_tokens":7,"messages":[{messages}]}}"#);
        let resp = mock
            .clone()
            .handle(owned("/v1/chat/completions", body))
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let v = body_json(resp).await;
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        let text = v["error"]["message"].as_str().unwrap();
        assert!(text.starts_with("This model's maximum context length is 131072 tokens. However, you requested at least "), "{text}");
        let (requested, prompt) = figures(text);
        assert_eq!(requested, prompt + 7, "{text}");
        // Counting stopped within a chunk of text past the room for the prompt.
        assert!(
            prompt > 131_072 - 7 && prompt <= 131_072 + tokenize::COUNT_CHUNK_BYTES,
            "{text}"
        );

        // A prompt of more bytes than that room that still fits is counted exactly, as before.
        let fits = format!(
            r#"{{"model":"m","max_tokens":7,"messages":[{{"role":"user","content":"{}"}}]}}"#,
            content.repeat(40)
        );
        assert!(fits.len() > 131_072);
        let resp = mock
            .clone()
            .handle(owned("/v1/chat/completions", fits))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let all = qwen
            .prompt_tokens(&Prompt::Messages(vec![request::Message::new(
                "user",
                content.repeat(40),
            )]))
            .unwrap();
        assert_eq!(body_json(resp).await["usage"]["prompt_tokens"], all.len());
    }

    #[tokio::test]
    async fn with_no_context_limit_a_prompt_stops_at_the_ceiling() {
        let mock = Mock::new(
            MockConfig {
                max_model_len: 0,
                ..quick()
            },
            None,
        );
        // Built-in tokenizer: " a" is one token; 3 million of them are past the ceiling.
        let body = format!(
            r#"{{"prompt":"{}","max_tokens":1}}"#,
            " a".repeat(3_000_000)
        );
        let resp = mock.clone().handle(owned("/v1/completions", body)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let v = body_json(resp).await;
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        let text = v["error"]["message"].as_str().unwrap();
        assert!(text.contains(&format!("the mock reads at most {MAX_PROMPT_TOKENS} prompt tokens. However, you requested at least ")), "{text}");
        let n: usize = text
            .split("at least ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            n > MAX_PROMPT_TOKENS && n <= MAX_PROMPT_TOKENS + tokenize::COUNT_CHUNK_BYTES,
            "{text}"
        );
        // Up to the ceiling, a prompt is still read whole.
        let body = format!(
            r#"{{"prompt":"{}","max_tokens":1}}"#,
            " a".repeat(MAX_PROMPT_TOKENS)
        );
        let resp = mock.clone().handle(owned("/v1/completions", body)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            body_json(resp).await["usage"]["prompt_tokens"],
            MAX_PROMPT_TOKENS
        );
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;
    use crate::budget::BodyBudget;
    use http_body_util::StreamBody;

    type Chunks = tokio::sync::mpsc::Receiver<Bytes>;

    /// A request whose body arrives as the test sends chunks, and ends when the sender is dropped.
    fn streamed(
        path: &str,
        rx: Chunks,
    ) -> Request<
        StreamBody<
            impl futures_util::Stream<Item = Result<http_body::Frame<Bytes>, std::convert::Infallible>>,
        >,
    > {
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok(http_body::Frame::data(b)), rx))
        });
        Request::builder()
            .method(Method::POST)
            .uri(path)
            .body(StreamBody::new(stream))
            .expect("valid request")
    }

    fn full(path: &str, n: usize) -> Request<Full<Bytes>> {
        Request::builder()
            .method(Method::POST)
            .uri(path)
            .body(Full::new(Bytes::from(vec![b'x'; n])))
            .expect("valid request")
    }

    async fn error_of(resp: Response<MockBody>) -> (StatusCode, String, String) {
        let status = resp.status();
        let b = resp
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
        let s = |k: &str| v["error"][k].as_str().unwrap_or_default().to_owned();
        (status, s("code"), s("message"))
    }

    /// Issue 23 item 7: the in-process mock buffered each body up to 256 MiB on any route,
    /// outside `limits.max_buffered_total`. Each body is capped by `mock.max_body`, and what the
    /// mock buffers is charged to the budget it shares with the proxy while it holds it.
    #[tokio::test]
    async fn the_mock_caps_each_body_and_charges_the_shared_budget() {
        let mock = Mock::new(
            MockConfig {
                max_body: crate::config::ByteSize(1 << 20),
                ..MockConfig::default()
            },
            None,
        );
        let budget = Arc::new(BodyBudget::new(1_500_000));
        mock.share_budget(budget.clone());

        let (status, code, msg) = error_of(
            mock.clone()
                .handle(full("/v1/embeddings", (1 << 20) + 1))
                .await,
        )
        .await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
        );
        assert!(msg.contains("mock.max_body"), "{msg}");
        assert_eq!(budget.used(), 0);

        // A sends 900 kB and pauses: the mock holds it, and the budget says so.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let a = tokio::spawn(mock.clone().handle(streamed("/v1/embeddings", rx)));
        tx.send(Bytes::from(vec![b'x'; 900_000])).await.unwrap();
        while budget.used() < 900_000 {
            tokio::task::yield_now().await;
        }
        assert_eq!(budget.used(), 900_000);
        // B's 900 kB would go past 1.5 MB: refused at once.
        let (status, code, msg) =
            error_of(mock.clone().handle(full("/v1/embeddings", 900_000)).await).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "buffer_budget_exhausted")
        );
        assert!(msg.contains("limits.max_buffered_total"), "{msg}");
        // A ends: its share comes back, and B fits.
        drop(tx);
        let (status, ..) = error_of(a.await.unwrap()).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(budget.used(), 0);
        let (status, ..) =
            error_of(mock.clone().handle(full("/v1/embeddings", 900_000)).await).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(budget.used(), 0);
        assert_eq!(mock.recorder().requests_total(), 4);
    }
}

#[cfg(test)]
mod engine_tests;
