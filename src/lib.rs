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
//! | the request path and the admin port | [`proxy`] (one phase per method of `Proxy::forward`), [`admin`], [`probe`], [`served_models`] |
//! | edges | [`server`] (listeners, lifecycle), [`cli`] (flags; `cli::synth` runs the offline commands), [`admin_client`] |
//! | entry | [`app`] (runs a command) |
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
pub mod runtime;
pub mod served_models;
pub mod server;
pub mod sync;
pub mod synth;
pub mod tls;
pub mod units;
pub mod upstream;
pub mod usage;
