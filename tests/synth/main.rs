//! Prompt synthesis against AIPerf's, vLLM's and SGLang's own outputs (vectors and golden
//! digests), `kvbust synth` and its exports, and synthesis inside the proxy: one test binary with
//! a module per area, so the library and its assets are linked once instead of once per file.
// Test code: a panic is the failure report (Cargo.toml denies these in the library).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

#[path = "../common/mod.rs"]
mod common;

mod agentic_code;
mod agentic_common;
mod synth_common;

mod agentic;
mod aiperf_extra;
mod bench;
mod cli;
mod coding;
mod coding_exact;
mod coding_golden;
mod corpus_assets;
mod export;
mod export_guards;
mod hostile;
mod perf;
mod prompts;
mod proxy;
mod reencode;
mod rng;
mod signals;
mod streaming;
mod trace_fuzz;
mod trace_tools;
mod tracelab;
mod traces;
