//! Command-line definitions (clap): `serve`, `mock`, `synth`, `marker`, `config check|show`,
//! `healthcheck`, `report`, `probe`, `trace merge`.
//! Only describes flags; never does work (but [`synth`], the offline commands' own runner).

pub mod run;
pub mod synth;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::CliOverrides;
use crate::report::render::Format;

/// The command line: one subcommand.
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

/// kvbust's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy (with no upstream configured, in front of the built-in mock model).
    Serve(ServeArgs),
    /// Run only the built-in mock model server.
    Mock(MockArgs),
    /// Write a synthetic dataset (JSONL) from the corpora, byte-identical to AIPerf 0.13.0's.
    Synth(Box<crate::cli::synth::SynthCommand>),
    /// Print a trace's ISL/OSL/context-length distributions and theoretical (infinite-cache)
    /// hit rates, as `aiperf analyze-trace` does; `--output-file` writes them as its JSON.
    AnalyzeTrace(crate::cli::synth::AnalyzeArgs),
    /// Tools for hash-id traces kvbust captured (`[capture]`).
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Print the cache-bust marker for the given digest inputs.
    Marker(MarkerArgs),
    /// Validate or print the effective configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Exit 0 when the admin port answers 200 on /readyz (or --path), 1 otherwise: a probe for
    /// container images without curl. Finds the port from the same configuration as `serve`.
    Healthcheck(HealthcheckArgs),
    /// Print the run report from a running kvbust's admin port (GET /report), or runs side by
    /// side.
    ///
    /// Opens with the verdict; then per phase and target: requests, errors, prompt tokens,
    /// cached tokens reported and predicted, hit rates (beside the dial, when one was set),
    /// reuse by source, isolation breaches, TTFT, ITL, TPOT, end-to-end latency and throughput;
    /// as a table, JSON, markdown, or one self-contained HTML page with charts of hit rate and
    /// TTFT over time. With one RUN_FILE, that saved run's report; with several, or --runs
    /// (every run the admin port holds), the runs side by side, the HTML page with sweep
    /// charts (TTFT p50/p99 and the cached share per run; over different hit rates, TTFT
    /// against the reported hit rate). Finds the admin port from the same configuration as `serve` unless --admin
    /// names it. Exit 1 when it cannot be reached, answers no kvbust report, or a file is not
    /// a run file.
    Report(ReportArgs),
    /// Run a benchmark client as one named run: open the run on the admin port (POST /runs),
    /// run COMMAND (its output passes through; SIGTERM, and SIGINT when no terminal sent it, are
    /// passed on), close the run (POST /runs/NAME/close), print its verdict and a short summary
    /// to standard error, and save the run file with --results-dir.
    ///
    /// Exit status: COMMAND's own when it failed (128 + the signal when one ended it; 127 when
    /// it cannot be found, 126 when it cannot be run), 3 when the verdict fails --fail-on, 1
    /// when the run cannot be opened (COMMAND is then not started) or closed, else 0. The admin
    /// token comes from the configuration (admin.token, KVBUST_ADMIN__TOKEN).
    ///
    /// A sweep: `for c in 1 8 64; do kvbust run --name c$c --results-dir runs -- aiperf profile
    /// … --concurrency $c || break; done; kvbust report runs/*.json`.
    Run(Box<crate::cli::run::RunArgs>),
    /// Tell whether an upstream's prefix cache is on and reported: lists /v1/models, sends a
    /// ~2k-token chat prompt twice and a third sharing only its first half, and prints each
    /// answer's prompt and cached tokens, the block size they imply, and the engine flag to add
    /// when nothing is reported. Exit 0: on and reported; 1: off, not reported, or unreachable;
    /// 2: usage error (a --model the server does not serve, a bad --upstream).
    Probe(ProbeArgs),
    /// Print a shell completion script, e.g. `kvbust completions bash > ~/.local/share/bash-completion/completions/kvbust`.
    Completions(CompletionsArgs),
}

/// `kvbust trace …`: tools for captured traces.
#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Merge the captures of several replicas into one trace: rows by time (rebased to the
    /// earliest file's start), keyed ids made dense, sessions renamed. Refuses files captured
    /// under different keys or block sizes. Exit 2 on unreadable or mismatched input.
    Merge(MergeArgs),
}

/// `kvbust trace merge`: captured trace files in, one trace out.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Capture files (`capture-*.jsonl`, each with its `.meta.json` beside it).
    #[arg(required = true, value_name = "FILE")]
    pub inputs: Vec<PathBuf>,
    /// The merged trace (its `.meta.json` is written beside it).
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: PathBuf,
}

/// `kvbust completions`: a shell completion script.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// `kvbust probe`: what an upstream serves and whether its prefix cache answers.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The model server's root, e.g. http://127.0.0.1:8000 (not the /v1 base URL).
    #[arg(long, value_name = "URL")]
    pub upstream: String,
    /// The model to ask (one /v1/models lists); default: the first it lists.
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// Give up on one request after this long, e.g. "300s" (a cold 2k-token prompt on a CPU
    /// server takes tens of seconds).
    #[arg(long, default_value = "300s", value_name = "DURATION")]
    pub timeout: String,
}

/// `kvbust healthcheck`: the container health check against the admin port.
#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// TOML or YAML configuration file (its admin.addr is the port asked).
    #[arg(long, env = "KVBUST_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Admin listener address to ask [config: admin.addr].
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Admin path to request: /readyz (serving, not draining) or /healthz (alive).
    #[arg(long, default_value = "/readyz", value_name = "PATH")]
    pub path: String,
    /// Give up after this long, e.g. "2s".
    #[arg(long, default_value = "2s", value_name = "DURATION")]
    pub timeout: String,
}

/// `kvbust report`: the run report from a running kvbust, or saved runs side by side.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run files (`kvbust run --results-dir`, `run.results_dir`) to read instead of the admin
    /// port: one is shown whole, several side by side.
    #[arg(value_name = "RUN_FILE", conflicts_with = "runs")]
    pub files: Vec<PathBuf>,
    /// Every run the admin port holds (GET /runs, then GET /runs/NAME each), side by side.
    #[arg(long)]
    pub runs: bool,
    #[command(flatten)]
    pub flags: ConfigFlags,
    /// The admin port's URL, e.g. http://127.0.0.1:9090 or 127.0.0.1:9090 (default: admin.addr
    /// from the configuration, a wildcard address read as loopback).
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    /// How to print the report.
    #[arg(long, value_enum, default_value_t = Format::Table, value_name = "FORMAT")]
    pub format: Format,
    /// Write the report to FILE instead of standard output (never coloured).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Give up on the admin port after this long, e.g. "10s".
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub timeout: String,
}

/// The flags every configured command takes: each overrides one config key (named in its help).
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
    /// The model server's root, e.g. http://127.0.0.1:8000 (not the /v1 base URL: clients'
    /// paths, /v1/... included, are appended to it). None: the built-in mock [config:
    /// upstream.url].
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    #[arg(long, value_name = "TARGET", help = format!(
        "Default cache-bust target: {} [config: cache_bust.target]",
        crate::cachebust::Target::names()
    ))]
    pub cache_bust: Option<String>,
    /// Default phase, warmup or profiling [config: cache_bust.default_phase].
    #[arg(long, value_name = "PHASE")]
    pub phase: Option<String>,
    /// Benchmark id for RID digests [config: cache_bust.benchmark_id].
    #[arg(long, value_name = "ID")]
    pub benchmark_id: Option<String>,
    /// How requests are isolated: marker (AIPerf's marker text) or salt (the body's
    /// cache_salt; the prompt goes unchanged) [config: cache_bust.method].
    #[arg(long, value_name = "METHOD")]
    pub cache_bust_method: Option<String>,
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
            cache_bust_method: self.cache_bust_method.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            tokenizer: self.tokenizer.clone(),
        }
    }
}

/// `kvbust serve`: the proxy.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub flags: ConfigFlags,
}

/// `kvbust mock`: only the built-in mock model server.
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

/// `kvbust marker`: the marker kvbust would inject for given digest inputs.
#[derive(Debug, Args)]
pub struct MarkerArgs {
    /// The benchmark id, the first digest input (kvbust's cache_bust.benchmark_id, AIPerf's
    /// benchmark id).
    #[arg(long, value_name = "ID")]
    pub benchmark_id: String,
    /// The recycle pass, the second digest input (a session's counter c in kvbust's ledger).
    #[arg(
        long,
        default_value_t = 0,
        allow_hyphen_values = true,
        value_name = "N"
    )]
    pub recycle_pass: i64,
    /// The trajectory index, the third digest input (the same counter c in kvbust's ledger).
    #[arg(
        long,
        default_value_t = 0,
        allow_hyphen_values = true,
        value_name = "N"
    )]
    pub trajectory_index: i64,
    /// The trace id, the last digest input (the session key, or the x-kvbust-trace-id header).
    #[arg(long, value_name = "ID")]
    pub trace_id: String,
    #[arg(long, default_value = "system_prefix", value_name = "TARGET", help = format!(
        "Cache-bust target: {}",
        crate::cachebust::Target::names()
    ))]
    pub target: String,
    /// Phase, warmup or profiling (matters only for the warmup_isolation targets).
    #[arg(long, default_value = "warmup", value_name = "PHASE")]
    pub phase: String,
    /// Print the marker's bytes as they are instead of as a JSON string.
    #[arg(long)]
    pub raw: bool,
}

/// `kvbust config …`: check or show the layered configuration.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the merged configuration; exit 64 naming the bad key.
    Check(ConfigFlags),
    /// Print the merged configuration as TOML (secrets redacted).
    Show(ConfigFlags),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn help(path: &[&str]) -> String {
        let mut cmd = Cli::command();
        for sub in path {
            cmd = cmd.find_subcommand(sub).expect("subcommand").clone();
        }
        cmd.render_long_help().to_string()
    }

    #[test]
    fn serve_and_marker_help_list_every_target_and_describe_every_flag() {
        for path in [&["serve"][..], &["marker"]] {
            let text = help(path);
            for t in crate::cachebust::Target::ALL {
                assert!(
                    text.contains(t.as_str()),
                    "{path:?} help lacks {}: {text}",
                    t.as_str()
                );
            }
        }
        assert!(help(&["serve"]).contains("not the /v1 base URL"));
        // Every marker flag says what it is.
        let marker = Cli::command().find_subcommand("marker").unwrap().clone();
        for arg in marker.get_arguments() {
            if arg.get_id() != "help" {
                assert!(
                    arg.get_help().is_some(),
                    "marker --{} has no help",
                    arg.get_id()
                );
            }
        }
    }

    #[test]
    fn report_flags_parse_and_bad_ones_are_refused() {
        let cli = Cli::try_parse_from([
            "kvbust",
            "report",
            "--admin",
            "http://127.0.0.1:9",
            "--format",
            "html",
            "-o",
            "r.html",
        ])
        .unwrap();
        let Command::Report(args) = cli.command else {
            panic!("not report");
        };
        assert_eq!(args.format, Format::Html);
        assert_eq!(args.admin.as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(args.output, Some(PathBuf::from("r.html")));
        let Command::Report(args) = Cli::try_parse_from(["kvbust", "report"]).unwrap().command
        else {
            panic!("not report");
        };
        assert_eq!((args.format, args.admin), (Format::Table, None));
        let err = Cli::try_parse_from(["kvbust", "report", "--format", "pdf"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        for f in ["table", "json", "markdown", "html"] {
            assert!(text.contains(f), "{text}");
        }
        let help = help(&["report"]);
        assert!(
            help.contains("--admin <URL>") && help.contains("-o, --output <FILE>"),
            "{help}"
        );
        assert!(help.contains("self-contained"), "{help}");
    }

    #[test]
    fn run_takes_the_command_after_the_double_dash_untouched() {
        let cli = Cli::try_parse_from([
            "kvbust",
            "run",
            "--name",
            "c8",
            "--fail-on",
            "contamination",
            "--warmup-requests",
            "4",
            "--",
            "aiperf",
            "profile",
            "--name",
            "--help",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run");
        };
        assert_eq!(args.name.as_deref(), Some("c8"));
        assert_eq!(args.fail_on, crate::cli::run::FailOn::Contamination);
        assert_eq!(args.warmup_requests, Some(4));
        assert!(!args.reset_upstream_cache);
        assert_eq!(args.command, ["aiperf", "profile", "--name", "--help"]);
        // Without `--`, or without a command: refused.
        for bad in [&["kvbust", "run", "aiperf"][..], &["kvbust", "run", "--"]] {
            assert_eq!(
                Cli::try_parse_from(bad).unwrap_err().exit_code(),
                2,
                "{bad:?}"
            );
        }
        let Command::Report(args) = Cli::try_parse_from(["kvbust", "report", "a.json", "b.json"])
            .unwrap()
            .command
        else {
            panic!("not report");
        };
        assert_eq!(
            args.files,
            [PathBuf::from("a.json"), PathBuf::from("b.json")]
        );
        assert!(Cli::try_parse_from(["kvbust", "report", "--runs", "a.json"]).is_err());
    }

    #[test]
    fn healthcheck_help_shows_only_its_own_flags() {
        let text = help(&["healthcheck"]);
        for own in ["--config", "--admin-listen", "--path", "--timeout"] {
            assert!(text.contains(own), "{own}: {text}");
        }
        for other in [
            "--upstream",
            "--cache-bust",
            "--tls-cert",
            "--tokenizer",
            "--phase",
        ] {
            assert!(!text.contains(other), "{other}: {text}");
        }
    }

    #[test]
    fn completions_parse_for_each_shell() {
        for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
            let cli = Cli::try_parse_from(["kvbust", "completions", shell]).unwrap();
            assert!(matches!(cli.command, Command::Completions(_)));
        }
        assert!(Cli::try_parse_from(["kvbust", "completions", "tcsh"]).is_err());
    }
}
