//! Command-line definitions (clap): `serve`, `mock`, `synth`, `marker`, `config check|show`,
//! `healthcheck`.
//! Only describes flags; never does work.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::CliOverrides;

#[derive(Debug, Parser)]
#[command(
    name = "kvbust",
    version,
    about = "A transparent reverse proxy that controls an LLM server's KV prefix cache for benchmarking"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy (with no upstream configured, in front of the built-in mock model).
    Serve(ServeArgs),
    /// Run only the built-in mock model server.
    Mock(MockArgs),
    /// Write a synthetic dataset (JSONL) from the corpora, byte-identical to AIPerf 0.13.0's.
    Synth(Box<crate::synth::cli::SynthArgs>),
    /// Print the cache-bust marker for the given digest inputs.
    Marker(MarkerArgs),
    /// Validate or print the effective configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Exit 0 when the admin port answers 200 on /readyz (or --path), 1 otherwise: a probe for
    /// container images without curl. Finds the port from the same configuration as `serve`.
    Healthcheck(HealthcheckArgs),
}

#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    #[command(flatten)]
    pub flags: ConfigFlags,
    /// Admin path to request: /readyz (serving, not draining) or /healthz (alive).
    #[arg(long, default_value = "/readyz", value_name = "PATH")]
    pub path: String,
    /// Give up after this long, e.g. "2s".
    #[arg(long, default_value = "2s", value_name = "DURATION")]
    pub timeout: String,
}

#[derive(Debug, Args, Clone, Default)]
pub struct ConfigFlags {
    /// TOML or YAML configuration file.
    #[arg(long, env = "KVBUST_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data listener address [config: listen.addr].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin listener address [config: admin.addr].
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Upstream model server base URL [config: upstream.url].
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// Default cache-bust target [config: cache_bust.target].
    #[arg(long, value_name = "TARGET")]
    pub cache_bust: Option<String>,
    /// Default phase, warmup or profiling [config: cache_bust.default_phase].
    #[arg(long, value_name = "PHASE")]
    pub phase: Option<String>,
    /// Benchmark id for RID digests [config: cache_bust.benchmark_id].
    #[arg(long, value_name = "ID")]
    pub benchmark_id: Option<String>,
    /// TLS certificate (PEM) for the data listener [config: listen.tls.cert].
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<String>,
    /// TLS private key (PEM) for the data listener [config: listen.tls.key].
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<String>,
    /// Tokenizer for synthesis [config: synth.tokenizer].
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<String>,
}

impl ConfigFlags {
    pub fn overrides(&self) -> CliOverrides {
        CliOverrides {
            listen: self.listen.clone(),
            admin_listen: self.admin_listen.clone(),
            upstream: self.upstream.clone(),
            cache_bust: self.cache_bust.clone(),
            phase: self.phase.clone(),
            benchmark_id: self.benchmark_id.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            tokenizer: self.tokenizer.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub flags: ConfigFlags,
}

#[derive(Debug, Args)]
pub struct MockArgs {
    /// Address to serve the mock on.
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Configuration file; only its [mock] section is used.
    #[arg(long, env = "KVBUST_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Delay between tokens, e.g. "15ms" [config: mock.inter_token].
    #[arg(long, value_name = "DURATION")]
    pub inter_token: Option<String>,
    /// Prefill cost per uncached prompt token, e.g. "20us" [config: mock.prefill_per_token].
    #[arg(long, value_name = "DURATION")]
    pub prefill_per_token: Option<String>,
    /// Fixed delay before the first token [config: mock.base_delay].
    #[arg(long, value_name = "DURATION")]
    pub base_delay: Option<String>,
}

#[derive(Debug, Args)]
pub struct MarkerArgs {
    #[arg(long)]
    pub benchmark_id: String,
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub recycle_pass: i64,
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub trajectory_index: i64,
    #[arg(long)]
    pub trace_id: String,
    /// Cache-bust target.
    #[arg(long, default_value = "system_prefix")]
    pub target: String,
    /// Phase (matters only for the warmup_isolation targets).
    #[arg(long, default_value = "warmup")]
    pub phase: String,
    /// Print the marker's bytes as they are instead of as a JSON string.
    #[arg(long)]
    pub raw: bool,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the merged configuration; exit 64 naming the bad key.
    Check(ConfigFlags),
    /// Print the merged configuration as TOML (secrets redacted).
    Show(ConfigFlags),
}
