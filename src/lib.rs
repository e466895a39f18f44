//! kvbust: a transparent reverse proxy that controls an LLM server's KV prefix cache.
//! The library owns every piece; `main.rs` only parses the command line and calls in here.
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
pub mod metrics;
pub mod mock;
pub mod probe;
pub mod proxy;
pub mod report;
pub mod runtime;
pub mod served_models;
pub mod server;
pub mod synth;
pub mod tls;
pub mod units;
pub mod upstream;
pub mod usage;
