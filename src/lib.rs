//! kvbust: a transparent reverse proxy that controls an LLM server's KV prefix cache.
//! The library owns every piece; `main.rs` only parses the command line and calls in here.
#![forbid(unsafe_code)]

pub mod cachebust;
pub mod mock;
pub mod synth;
