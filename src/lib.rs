//! kvbust: a transparent reverse proxy that controls an LLM server's KV prefix cache.
//! The library owns every piece; `main.rs` only parses the command line and calls in here.
//!
//! # Module map
//!
//! By layer, lowest first (`tools/layers.py` checks that every import points down, and that
//! no two folders import each other):
//!
//! | layer | modules |
//! |---|---|
//! | plain types and leaves | [`units`], [`error`] (who is at fault, and the status), [`body`], [`metrics`], [`cgroup`], [`healthcheck`], [`api`] (the four APIs as one `Shape`), [`json`] (the span toolkit), [`sync`], [`cachebust`] (the pure marking engine), [`budget`], [`report`] |
//! | libraries | [`synth`] (corpora, RNG ports, datasets, traces), [`conn`] (accepting, deadlines), [`usage`] |
//! | capture and the mock | [`capture`] (hash-id trace files), [`mock`] (the built-in model server) |
//! | configuration | [`config`] (figment layers, validation) |
//! | transport | [`tls`], [`upstream`] (one `Transport::send` per worker), [`access_log`], then [`health`] |
//! | seeing the cache | [`cache_model`] (the upstream's prefix cache, the run ledger) |
//! | shared state | [`runtime`] |
//! | the request path and the admin port | [`proxy`] (one phase per method of `Proxy::forward`), [`admin`], [`run_store`] (finishing and saving runs), [`probe`], [`served_models`] |
//! | edges | [`server`] (listeners, lifecycle), [`cli`] (flags; `cli::synth` runs the offline commands), [`admin_client`] |
//! | entry | [`app`] (runs a command) |
//!
//! `src/main.rs` parses the command line (`cli`) and calls `app::run`, which layers the
//! configuration (`config`: the typed sections; `config::load`: defaults < file < `KVBUST_*` <
//! flags; `config::validate`: every rule, each error naming the key and the fix; `units` for sizes and
//! durations) and runs a command. `kvbust serve` binds the ports and calls
//! `server::run(rt, upstream, listeners, shutdown)` (`rt`: the `runtime::SharedState`).
//!
//! # A request, module by module
//!
//! 1. **Accept** (`server`, `conn`): one worker thread per core, each with its own
//!    `SO_REUSEPORT` socket, current-thread runtime and upstream connections. `conn` holds every
//!    connection to its deadlines (first request, idle, request-body gaps) and backs off when out of
//!    descriptors.
//! 2. **Classify** (`api::Route`): one of the four API routes (named by its body `api::Shape`,
//!    the one name every layer matches on), or anything else, which streams through untouched.
//! 3. **Decide** (`proxy::rewrite::decide`): phase and target from the headers, the default and the
//!    admin's `PUT /phase` (`runtime::SharedState`); whether the body needs synthesis, placeholders,
//!    a marker or a usage request. Nothing else needs the body, so nothing else reads it.
//! 4. **Prepare the body** (`proxy::Proxy::prepare_body`): a marked or synthesized body, or one
//!    that came whole in its first chunk, is collected within `limits.*` (charged to `budget` by
//!    `proxy::exchange`); any other flows upstream as it arrives (`proxy::inflow`, reading it as it
//!    passes with `json::stream::TopScan` for the first place a step could edit, and holding only
//!    from there), and the same steps run at its end. Then the body steps (`proxy::body_steps`): `proxy::synthesize` (`fill`:
//!    a synthetic conversation's `messages`; `scan`: `{{kvbust:...}}` placeholders, expanded from
//!    `synth`'s prompt lanes), `proxy::rewrite` (the session, its RID and the marker, through
//!    `cachebust`: `identity` for sessions, `marker` for the marker text, `inject` for where it goes)
//!    and `proxy::usage` (asking for `usage`). The body is parsed once, by the first step that must
//!    read it; `json` holds the one JSON span reader and splice, and the `Layout` each step
//!    hands the next: the body's member and message spans, moved over the step's own splice, so no
//!    step parses again what one before read.
//! 5. **Upstream request and send** (`upstream`): `upstream::headers` takes hop-by-hop and control
//!    headers out and puts `x-forwarded-*` in; `upstream::transport::Transport::send` then picks
//!    the connection, holding the client's and the source's upstream slots: to a plain-HTTP
//!    upstream the request goes on the
//!    client connection's own upstream connection (HTTP/1.1 clients) or one from the worker's idle
//!    pool (HTTP/2 clients' streams; it comes back when its response body ends), both in
//!    `upstream::pool`; to a TLS or HTTP/2 upstream, through hyper-util's pooled client in
//!    `upstream::client`; `Proxy::send` holds it to the upstream timeouts. `proxy::Proxy::forward` is the pipeline that
//!    calls all of these, on one screen.
//! 6. **Response headers** (`proxy::Proxy::response_headers`): `x-request-id`, and on API routes
//!    the RID, phase and overhead; on a synthesized response the conversation, turn and topology
//!    headers (`proxy::topology`, which also picks the conversation a synthetic request gets).
//! 7. **Observe** (`proxy::observe`): the response body (`observe::body`, with the idle and total
//!    timeouts) streams back frame by frame; the observer times it (TTFT, gaps), reads `usage`
//!    (`observe::wire`: each API's spelling) into `usage::Tokens`, counts into `metrics`, and
//!    at the end writes the `access_log` line.
//! 8. **Model the cache** (`cache_model`), off the request path: step 4 hands the body as forwarded
//!    to the model's queue (a `Bytes` clone, never a wait); its one worker thread parses it as the
//!    engine does, tokenizes it (`cache_model::tokens`: chat template, pieces between special
//!    tokens remembered), serves it against the block index (`cache_model::index`), attributes
//!    the hit and checks isolation (`cache_model::attribution`). The observer hands the response's
//!    usage and TTFT to the same `Ticket`; the last of the two to let go counts the pair in the run
//!    ledger (`cache_model::ledger`) that `GET /report` reads.
//!
//! Errors anywhere are one `error::ProxyError`, tagged client, upstream or internal, turned into
//! an OpenAI-shaped response in one place. The admin port (`admin`: health, readiness from `health`,
//! `/metrics`, `/phase`, `/config`) runs beside the workers. `mock` is the built-in model server:
//! `mock::request` is the request model every API shape (`openai`, `responses`, `anthropic`) parses
//! into, `prefix_cache` the simulated KV cache, `sse` the paced stream.
//!
//! # A prompt, layer by layer
//!
//! `synth` is laid out in layers, each importing only those below it:
//!
//! 1. **`synth::rng`**: bit-exact ports of the generators AIPerf, vLLM and SGLang draw from
//!    (CPython's Mersenne Twister, numpy's PCG64 and legacy generator, seed derivation, `uuid4`).
//! 2. **`synth::tokenizer`**: a Hugging Face tokenizer as AIPerf sees it, the exact local re-encode
//!    (`reencode`, with its `piece_memo`), and chat-template rendering (`chat_template`).
//! 3. **`synth::corpus`**: the token arrays prompts are cut from: `sonnet`, `random`'s pools,
//!    `aiperf_coding` (AIPerf's coding corpus, a port: `--prompt-corpus coding`) and `kvbust_coding`
//!    (kvbust's own, token-exact: `coding-exact`), their on-disk `cache`, and the trace replay's
//!    `hash_blocks`.
//! 4. **`synth::prompt`**: `generator` (AIPerf's `PromptGenerator`: a window of the corpus, then the
//!    fix-up loop until it re-encodes to exactly N tokens), `stream` (a long-lived source of fresh
//!    N-token prompts) and `placeholders` (one stream per corpus and length, filled ahead on the
//!    rayon pool).
//! 5. **`synth::dataset`**: `params` (AIPerf's flags), `composer` (its pipeline: shared system
//!    prompt, prefix pool, conversations, user context), `trace` (hash-id and agentic trace replay),
//!    `export` (vLLM, SGLang, AIPerf and OpenAI-body formats).
//!    `trace` is one table of loaders (`trace::LOADERS`: detection and dispatch read the same
//!    rows): `hash_ids` (mooncake, bailian), `burst` (BurstGPT) and `agentic` (Weka, TraceLab).
//! 6. **Edges**: `synth::bench` (vLLM's and SGLang's random datasets). The command line,
//!    `kvbust synth`, is `cli::synth`, above the library, so `synth` never reads `config`.
//!
//! So a `{{kvbust:prompt:1024:sonnet}}` placeholder in a chat body is found by
//! `proxy::synthesize`'s scan, which pops a prompt from the sonnet lane of length 1024
//! (`prompt::placeholders`); that lane's `prompt::stream` drew it as AIPerf does: a window of the
//! sonnet `corpus::tokens` at offsets from `rng`, decoded and re-encoded by `tokenizer` until it is
//! exactly 1024 tokens. A synthetic conversation (`x-kvbust-synth: 1`) is a turn of the `dataset`
//! the `composer` built once from the same layers, written into `messages` by
//! `proxy::synthesize`'s fill; `kvbust synth` writes the same dataset to a file.
#![forbid(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod admin_client;
pub mod api;
pub mod app;
pub mod body;
pub mod budget;
pub mod cache_model;
pub mod cachebust;
pub mod capture;
pub mod cgroup;
pub mod cli;
pub mod config;
pub mod conn;
pub mod error;
pub mod health;
pub mod healthcheck;
pub mod json;
pub mod metrics;
pub mod mock;
pub mod probe;
pub mod proxy;
pub mod report;
pub mod run_store;
pub mod runtime;
pub mod served_models;
pub mod server;
pub mod sync;
pub mod synth;
pub mod tls;
pub mod units;
pub mod upstream;
pub mod usage;

#[cfg(test)]
mod test_support;
