//! The proxy, the mock, the cache-bust engine and the binary as users run it: one test binary
//! with a module per area (as ripgrep keeps its tests), so the library and its assets are linked
//! once instead of once per file. Tests that change process-wide state live apart:
//! `tests/emfile.rs` (the descriptor limit), `tests/observe.rs` (the global log subscriber and
//! access-log sink), `tests/tls.rs` (raises SIGHUP at its own process) and `tests/robustness.rs`
//! (measures the process's resident memory).
// Test code: a panic is the failure report (Cargo.toml denies these in the library).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

#[path = "../common/mod.rs"]
mod common;

mod cache_model;
mod cachebust_proxy;
mod cachebust_vectors;
mod capture;
mod cli;
mod compaction;
mod deploy;
mod dial;
mod first_day;
mod first_steps;
mod fuzz_regressions;
mod hardening_42;
mod hardening_server;
mod hardening_synth;
mod inflow;
mod inmark;
mod mock_server;
mod monitoring;
mod probe;
mod proxy;
mod real_upstream;
mod report_cli;
mod run_cli;
mod runs;
mod salt;
mod startup;
mod stream_usage;
mod upstream_health;
