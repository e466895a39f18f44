//! Runs the chosen command: loads configuration, sets up logging, binds sockets, starts the
//! proxy or the mock, and maps failures to exit codes. The only place that reads the process
//! environment; never handles requests itself.
// The edge: this module reads the environment (Cargo.toml denies it everywhere else).
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::cachebust::{build_marker, digest, DigestInputs, Phase, Target};
use crate::cli::{
    Cli, Command, ConfigCommand, ConfigFlags, HealthcheckArgs, MarkerArgs, MockArgs, ProbeArgs,
    ReportArgs,
};
use crate::config::{Config, ConfigError};
use crate::metrics::Metrics;
use crate::runtime::SharedState;
use crate::server::{self, Listeners};

/// Exit codes from the contract.
pub const EXIT_CONFIG: u8 = 64;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
    /// A status of its own (`kvbust run`: the client's, or 3 for the verdict), and why.
    #[error("{message}")]
    Exit { code: u8, message: String },
}

impl AppError {
    pub fn exit_code(&self) -> ExitCode {
        match self {
            AppError::Config(_) => ExitCode::from(EXIT_CONFIG),
            AppError::Usage(_) => ExitCode::from(2),
            AppError::Other(_) => ExitCode::from(1),
            AppError::Exit { code, .. } => ExitCode::from(*code),
        }
    }
}

pub fn run(cli: Cli) -> Result<(), AppError> {
    match cli.command {
        Command::Serve(args) => {
            let mut config = load(&args.flags)?;
            check_input_files(&config)?;
            config.synth.cache_dir = default_cache_dir();
            let _flush = init_logging(&config);
            let cgroup = std::path::Path::new(crate::cgroup::CGROUP_ROOT);
            for warning in config.fit_memory_limit(crate::cgroup::memory_limit(cgroup)) {
                tracing::warn!("{warning}");
            }
            runtime()?.block_on(serve(config))
        }
        Command::Mock(args) => {
            let config = mock_config(&args)?;
            let _flush = init_logging(&config);
            runtime()?.block_on(mock(config, args.listen))
        }
        Command::Synth(cmd) => match cmd.tool {
            Some(crate::cli::synth::SynthTool::AgenticCode(a)) => {
                crate::cli::synth::run_agentic_code(&a).map_err(synth_error)
            }
            None => {
                let mut args = cmd.args;
                if args.corpus_cache_dir.is_none() {
                    args.corpus_cache_dir = default_cache_dir();
                }
                crate::cli::synth::run_then_exit(&args).map_err(synth_error)
            }
        },
        Command::AnalyzeTrace(args) => crate::cli::synth::run_analyze(&args).map_err(synth_error),
        Command::Trace(crate::cli::TraceCommand::Merge(args)) => trace_merge(&args),
        Command::Marker(args) => marker(&args),
        Command::Config(ConfigCommand::Check(flags)) => {
            let c = load(&flags)?;
            check_input_files(&c)?;
            println!(
                "configuration is valid (upstream: {})",
                c.upstream
                    .url
                    .as_deref()
                    .unwrap_or("none, the built-in mock")
            );
            Ok(())
        }
        Command::Config(ConfigCommand::Show(flags)) => {
            let c = load(&flags)?;
            print!("{}", c.redacted().to_toml());
            Ok(())
        }
        Command::Healthcheck(args) => healthcheck(&args),
        Command::Report(args) => report(&args),
        Command::Run(args) => run_client(&args),
        Command::Probe(args) => probe(&args),
        Command::Completions(args) => completions(args.shell),
    }
}

/// The exit code of a synthesis command's error: a request the output format cannot carry is a
/// configuration error (exit 64); flag mistakes and bad trace input are usage errors (exit 2);
/// everything else is a failure.
fn synth_error(e: anyhow::Error) -> AppError {
    let e = match e.downcast::<ConfigError>() {
        Ok(c) => return AppError::Config(c),
        Err(e) => e,
    };
    match e.downcast_ref::<crate::synth::SynthError>() {
        Some(
            crate::synth::SynthError::InvalidParams(_)
            | crate::synth::SynthError::TokenizerMissing { .. }
            | crate::synth::SynthError::Trace(_)
            | crate::synth::SynthError::Agentic(_),
        ) => AppError::Usage(format!("{e:#}")),
        _ => AppError::Other(e),
    }
}

fn healthcheck(args: &HealthcheckArgs) -> Result<(), AppError> {
    if !args.path.starts_with('/') {
        return Err(AppError::Usage(format!(
            "--path `{}` must start with / (e.g. /readyz)",
            args.path
        )));
    }
    let timeout = crate::units::duration::parse_or_explain(&args.timeout)
        .map_err(|e| AppError::Usage(format!("--timeout {e}")))?;
    let flags = ConfigFlags {
        config: args.config.clone(),
        admin_listen: args.admin_listen.clone(),
        ..ConfigFlags::default()
    };
    let config = load(&flags)?;
    let addr = crate::healthcheck::probe_addr(config.admin.addr);
    let line = crate::healthcheck::check(addr, &args.path, timeout)
        .map_err(|e| AppError::Other(e.into()))?;
    println!("{line}");
    Ok(())
}

/// `kvbust report`: fetch `GET /report` from the admin port (or read run files, or every run
/// the port holds), render it, print or write it.
fn report(args: &ReportArgs) -> Result<(), AppError> {
    use crate::report::render::{self, Colour, Format};
    use std::io::{IsTerminal, Write};
    let timeout = crate::units::duration::parse_or_explain(&args.timeout)
        .map_err(|e| AppError::Usage(format!("--timeout {e}")))?;
    // Colour for a person at a terminal only (and not when NO_COLOR asks otherwise).
    let colour = if args.output.is_none()
        && args.format == Format::Table
        && std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
    {
        Colour::Ansi
    } else {
        Colour::Never
    };
    let text = match args.files.as_slice() {
        [one] => render::render(&read_run_file(one)?, args.format, colour),
        [] if !args.runs => {
            let fetched = block_on(crate::admin_client::fetch(
                // Half the time for the requests still open to be counted, half for the answer.
                &report_url(args)?.waiting(timeout / 2),
                timeout,
            ))?;
            match args.format {
                // The JSON as the admin port sent it, indented (not what this kvbust parsed).
                Format::Json => render::pretty_json(&fetched.json),
                f => render::render(&fetched.report, f, colour),
            }
        }
        [] => {
            let admin = report_url(args)?.admin();
            let reports = block_on(async {
                let mut out = Vec::new();
                for run in admin.runs(timeout).await? {
                    out.push(admin.run_report(&run.name, timeout).await?.report);
                }
                Ok::<_, crate::admin_client::FetchError>(out)
            })?;
            render::render_runs(&reports, args.format, colour)
        }
        files => {
            let reports = files
                .iter()
                .map(|f| read_run_file(f))
                .collect::<Result<Vec<_>, _>>()?;
            render::render_runs(&reports, args.format, colour)
        }
    };
    match &args.output {
        Some(path) => std::fs::write(path, &text).map_err(|e| {
            AppError::Other(anyhow::anyhow!(
                "-o {}: cannot write the report: {e}",
                path.display()
            ))
        }),
        None => match std::io::stdout().lock().write_all(text.as_bytes()) {
            // A reader that stopped early (`| head`) is not a failure.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(AppError::Other(
                anyhow::anyhow!("cannot write the report to standard output: {e}"),
            )),
            _ => Ok(()),
        },
    }
}

/// The report's URL: --admin, else the configuration's admin.addr.
fn report_url(args: &ReportArgs) -> Result<crate::admin_client::ReportUrl, AppError> {
    use crate::admin_client::ReportUrl;
    match &args.admin {
        Some(admin) => ReportUrl::parse(admin).map_err(|e| AppError::Usage(format!("--admin {e}"))),
        None => Ok(ReportUrl::of_listener(load(&args.flags)?.admin.addr)),
    }
}

/// Runs `f` to its end on a runtime of the calling thread; its error as a failure (exit 1).
fn block_on<T, E>(f: impl std::future::Future<Output = Result<T, E>>) -> Result<T, AppError>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AppError::Other(anyhow::anyhow!("cannot start the async runtime: {e}")))?;
    rt.block_on(f).map_err(|e| AppError::Other(e.into()))
}

/// A saved run (a run file, or a bare report) read from `path`.
fn read_run_file(path: &std::path::Path) -> Result<crate::report::Report, AppError> {
    let bytes = std::fs::read(path)
        .map_err(|e| AppError::Other(anyhow::anyhow!("{}: cannot read it: {e}", path.display())))?;
    crate::admin_client::read_run_file(&bytes)
        .map_err(|e| AppError::Other(anyhow::anyhow!("{}: {e}", path.display())))
}

/// `kvbust run`: open a run, run the client, close, judge, save.
fn run_client(args: &crate::cli::run::RunArgs) -> Result<(), AppError> {
    use crate::admin_client::ReportUrl;
    use crate::cli::run::{self, Plan, RunError};
    use std::io::IsTerminal;
    let timeout = crate::units::duration::parse_or_explain(&args.timeout)
        .map_err(|e| AppError::Usage(format!("--timeout {e}")))?;
    if let Some(name) = args.name.as_deref().filter(|n| !run::valid_name(n)) {
        return Err(AppError::Usage(format!(
            "--name `{name}`: a run name is 1 to 64 of A-Z a-z 0-9 . _ -"
        )));
    }
    let flags = ConfigFlags {
        config: args.config.clone(),
        ..ConfigFlags::default()
    };
    let config = load(&flags)?;
    let admin = match &args.admin {
        Some(a) => ReportUrl::parse(a).map_err(|e| AppError::Usage(format!("--admin {e}")))?,
        None => ReportUrl::of_listener(config.admin.addr),
    }
    .admin();
    let plan = Plan {
        admin,
        token: config.admin.token.clone(),
        name: args
            .name
            .clone()
            .unwrap_or_else(|| run::default_name(&args.command, std::time::SystemTime::now())),
        warmup_requests: args.warmup_requests,
        reset_upstream_cache: args.reset_upstream_cache,
        fail_on: args.fail_on,
        results_dir: args.results_dir.clone(),
        command: args.command.clone(),
        timeout,
        // A terminal's Ctrl-C reaches the client directly (one process group).
        forward_sigint: !std::io::stdin().is_terminal(),
    };
    let outcome = block_on(async {
        run::execute(&plan).await.or_else(|e| match e {
            // No client ran: the shell's codes for "not found" and "cannot run".
            RunError::Spawn { ref source, .. } => Ok(run::Outcome {
                code: match source.kind() {
                    std::io::ErrorKind::NotFound => 127,
                    std::io::ErrorKind::PermissionDenied => 126,
                    _ => 1,
                },
                why: Some(e.to_string()),
            }),
            e => Err(e),
        })
    })?;
    match outcome.code {
        0 => Ok(()),
        code => Err(AppError::Exit {
            code,
            message: outcome.why.unwrap_or_default(),
        }),
    }
}

/// `kvbust completions SHELL`: the script on standard output. Generated into memory first:
/// clap_complete panics on a failed write, and a reader that stops early (`| head`) is not a
/// failure.
fn completions(shell: clap_complete::Shell) -> Result<(), AppError> {
    use clap::CommandFactory;
    use std::io::Write;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "kvbust", &mut script);
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(AppError::Other(
            anyhow::anyhow!("cannot write the completions to standard output: {e}"),
        )),
        _ => Ok(()),
    }
}

/// `kvbust probe`: prints the findings; a verdict other than "on and reported" is exit 1.
fn probe(args: &ProbeArgs) -> Result<(), AppError> {
    use crate::probe::{ProbeError, Verdict};
    let timeout = crate::units::duration::parse_or_explain(&args.timeout)
        .map_err(|e| AppError::Usage(format!("--timeout {e}")))?;
    let opts = crate::probe::Options {
        upstream: args.upstream.clone(),
        model: args.model.clone(),
        timeout,
        nonce: rand::random(),
    };
    let findings = runtime()?
        .block_on(crate::probe::run(&opts))
        .map_err(|e| match e {
            ProbeError::Usage(m) => AppError::Usage(m),
            ProbeError::Failed(m) => AppError::Other(anyhow::anyhow!(m)),
        })?;
    print!("{}", crate::probe::verdict::render(&findings));
    if Verdict::of(&findings.observations).is_success() {
        Ok(())
    } else {
        Err(AppError::Other(anyhow::anyhow!(
            "probe: prefix caching is off or not reported (see the verdict above)"
        )))
    }
}

/// The files the configuration names that start-up would otherwise read only at the first
/// request: `[synth.dataset] input_file` (exists, its type, its first record).
fn check_input_files(config: &Config) -> Result<(), ConfigError> {
    let Some(params) = &config.synth.dataset else {
        return Ok(());
    };
    crate::synth::dataset::trace::precheck::check_input_file(params).map_err(|e| ConfigError {
        key: "synth.dataset.input_file".into(),
        message: format!(
            "{e} (fix the file, or point synth.dataset.input_file at a mooncake_trace,              bailian_trace, weka_trace, tracelab or burst_gpt_trace file)"
        ),
    })?;
    Ok(())
}

fn env_snapshot() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("KVBUST_"))
        .collect()
}

fn load(flags: &ConfigFlags) -> Result<Config, ConfigError> {
    Config::load(flags.config.as_deref(), &env_snapshot(), &flags.overrides())
}

fn mock_config(args: &MockArgs) -> Result<Config, AppError> {
    let mut c = Config::load(args.config.as_deref(), &env_snapshot(), &Default::default())?;
    for (key, v, slot) in [
        ("--inter-token", &args.inter_token, &mut c.mock.inter_token),
        (
            "--prefill-per-token",
            &args.prefill_per_token,
            &mut c.mock.prefill_per_token,
        ),
        ("--base-delay", &args.base_delay, &mut c.mock.base_delay),
    ] {
        if let Some(v) = v {
            *slot = crate::units::duration::parse_or_explain(v).map_err(|message| ConfigError {
                key: key.into(),
                message,
            })?;
        }
    }
    Ok(c)
}

fn runtime() -> Result<tokio::runtime::Runtime, AppError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| AppError::Other(anyhow::anyhow!("cannot start the async runtime: {e}")))
}

/// Sets up logging; the returned guard flushes the lines still queued when it is dropped, so
/// it must live until the command ends.
fn init_logging(config: &Config) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    use std::io::IsTerminal;
    // Lines (one per request with the access log) go to a background thread that writes them
    // to stderr in batches: written on the request path, each would cost a `write` system call
    // and could block a worker on a slow terminal or pipe. Lossy: past 128k queued lines new ones
    // are dropped rather than blocking requests.
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .thread_name("kvbust-log")
        .finish(std::io::BufWriter::with_capacity(
            64 << 10,
            std::io::stderr(),
        ));
    let rust_log = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    // Colour codes only for a person at a terminal, never into a file or a log collector.
    let ansi = std::io::stderr().is_terminal();
    // Access lines come in batches from the data workers and take the same way out.
    let access = writer.clone();
    crate::access_log::install(move |lines| {
        use std::io::Write;
        let _ = access.clone().write_all(lines);
    });
    let subscriber = crate::access_log::subscriber(&config.log, rust_log.as_deref(), writer, ansi);
    tracing::subscriber::set_global_default(subscriber).ok()?;
    Some(guard)
}

fn bind(addr: std::net::SocketAddr, what: &str, key: &str) -> Result<TcpListener, AppError> {
    crate::conn::bind_listener(addr, false)
        .and_then(TcpListener::from_std)
        .map_err(|e| {
            AppError::Other(anyhow::anyhow!(
                "cannot listen on {addr} for the {what}: {e} (change {key} or free the port)"
            ))
        })
}

async fn serve(config: Config) -> Result<(), AppError> {
    let config = Arc::new(config);
    let data = server::DataListener::bind(config.listen.addr, config.listen.worker_count())
        .map_err(|e| {
            AppError::Other(anyhow::anyhow!(
                "cannot listen on {} for the data port: {e} (change listen.addr / --listen or free the port)",
                config.listen.addr
            ))
        })?;
    let admin = bind(
        config.admin.addr,
        "admin port",
        "admin.addr / --admin-listen",
    )?;

    let rt = SharedState::new(config.clone(), Metrics::new());
    // No upstream: run the built-in mock on a loopback port so the quick start works anywhere.
    let mut mock_task = None;
    let upstream = match config.upstream_url()? {
        Some(u) => {
            refuse_own_address(&u, data.local_addr()).await?;
            u
        }
        None => {
            let l = bind(([127, 0, 0, 1], 0).into(), "built-in mock", "upstream.url")?;
            let addr = l.local_addr().map_err(|e| AppError::Other(e.into()))?;
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let mock = load_mock(&config.mock).await?;
            // One process, one memory: what the mock buffers counts against the proxy's budget.
            mock.share_budget(rt.bodies.clone());
            let task = tokio::spawn(crate::mock::serve(l, mock, async {
                let _ = rx.await;
            }));
            mock_task = Some((tx, task));
            let url = format!("http://{addr}");
            tracing::info!("no upstream.url configured: serving the built-in mock model at {url} (set --upstream to proxy a real server)");
            crate::config::UpstreamUrl::parse(&url)?
        }
    };

    tracing::info!(
        data = %config.listen.addr,
        admin = %config.admin.addr,
        upstream = %upstream.display(),
        target = config.cache_bust.target.as_str(),
        phase = rt.default_phase().as_str(),
        benchmark_id = %rt.benchmark_id,
        "kvbust serving"
    );
    let report = server::run(
        rt,
        &upstream,
        Listeners { data, admin },
        server::shutdown_signal(),
    )
    .await
    .map_err(|e| AppError::Other(e.into()))?;
    if let Some((tx, task)) = mock_task {
        let _ = tx.send(());
        let _ = task.await;
    }
    if report.aborted_connections > 0 {
        tracing::warn!(
            aborted = report.aborted_connections,
            "some connections were cut at the end of the grace period"
        );
    }
    Ok(())
}

/// Refuses an upstream that resolves to kvbust's own data port: every request would come back
/// to kvbust and fan out until something broke. A name that does not resolve is left to the
/// health probe (it may come up later).
async fn refuse_own_address(
    upstream: &crate::config::UpstreamUrl,
    listen: std::net::SocketAddr,
) -> Result<(), ConfigError> {
    use crate::upstream::loop_guard;
    let host = upstream.host();
    let default_port = if upstream.scheme().as_str() == "https" {
        443
    } else {
        80
    };
    let port = host.port_u16().unwrap_or(default_port);
    // `host()` keeps an IPv6 literal's brackets, which lookup_host does not take.
    let name = host.host().trim_start_matches('[').trim_end_matches(']');
    let Ok(resolved) = tokio::net::lookup_host((name, port)).await else {
        return Ok(());
    };
    let resolved: Vec<_> = resolved.collect();
    match loop_guard::own_address(listen, &resolved, loop_guard::is_local_ip) {
        None => Ok(()),
        Some(own) => Err(ConfigError {
            key: "upstream.url".into(),
            message: format!(
                "`{}` resolves to {own}, kvbust's own data port (listen.addr {listen}): every \
                 request would loop back into kvbust; set upstream.url / --upstream to the \
                 model server's address, or omit it to use the built-in mock",
                upstream.display()
            ),
        }),
    }
}

/// The mock with its configured tokenizer, loaded off the async threads.
async fn load_mock(cfg: &crate::mock::MockConfig) -> Result<Arc<crate::mock::Mock>, AppError> {
    let cfg = cfg.clone();
    tokio::task::spawn_blocking(move || {
        let setting = cfg.tokenizer.clone();
        let t0 = std::time::Instant::now();
        let mock = crate::mock::Mock::from_config(cfg)
            .map_err(|e| AppError::Other(anyhow::anyhow!("mock.tokenizer = {setting}: {e}")))?;
        tracing::info!(tokenizer = %setting, elapsed = ?t0.elapsed(), "mock tokenizer loaded");
        Ok(mock)
    })
    .await
    .map_err(|e| AppError::Other(e.into()))?
}

async fn mock(config: Config, listen: std::net::SocketAddr) -> Result<(), AppError> {
    // Tokenizer first: a port that accepts before the mock can answer would charge the load to the first requests.
    let mock = load_mock(&config.mock).await?;
    let l = bind(listen, "mock model server", "--listen")?;
    // The names /v1/models lists: mock.served_model_names when set (only those are accepted),
    // else mock.model (any name is accepted).
    let served = &config.mock.served_model_names;
    let models = if served.is_empty() {
        config.mock.model.clone()
    } else {
        served.join(",")
    };
    tracing::info!(addr = %listen, model = %models, tokenizer = %config.mock.tokenizer, "kvbust mock model server");
    crate::mock::serve(l, mock, server::shutdown_signal())
        .await
        .map_err(|e| AppError::Other(e.into()))
}

/// `kvbust trace merge`: merges the captures and ends with the summary line.
fn trace_merge(args: &crate::cli::MergeArgs) -> Result<(), AppError> {
    let started = std::time::Instant::now();
    let m = crate::capture::merge::merge(&args.inputs, &args.output).map_err(AppError::Usage)?;
    let rows = format!(
        "merged {} file(s): {} rows, {} input tokens, {} output tokens, {} distinct \
         block ids, {} sessions",
        m.files, m.rows, m.input_tokens, m.output_tokens, m.distinct_ids, m.sessions
    );
    let line = crate::cli::synth::summary_line(
        "trace merge",
        &rows,
        m.bytes,
        Some(&args.output),
        started.elapsed(),
    );
    eprintln!("{line}");
    if m.unkeyed && m.files > 1 {
        eprintln!(
            "note: the files carry no key, so a block shared across files gets one id per \
             file; set capture.key_file on every replica to keep that sharing"
        );
    }
    Ok(())
}

fn marker(args: &MarkerArgs) -> Result<(), AppError> {
    let target: Target = args
        .target
        .parse()
        .map_err(|e| AppError::Usage(format!("--target: {e}")))?;
    let phase: Phase = args
        .phase
        .parse()
        .map_err(|e| AppError::Usage(format!("--phase: {e}")))?;
    let inputs = DigestInputs {
        benchmark_id: args.benchmark_id.clone(),
        recycle_pass: args.recycle_pass,
        trajectory_index: args.trajectory_index,
        trace_id: args.trace_id.clone(),
    };
    let marker = build_marker(target, phase, &inputs);
    if args.raw {
        print!("{}", marker.unwrap_or_default());
    } else {
        let out = serde_json::json!({
            "digest_input": format!("{}:{}:{}:{}", inputs.benchmark_id, inputs.recycle_pass, inputs.trajectory_index, inputs.trace_id),
            "digest": digest(&inputs),
            "target": target.as_str(),
            "phase": phase.as_str(),
            "marker": marker,
        });
        println!("{out}");
    }
    Ok(())
}

/// The default folder for corpus token caches, read here at the edge (synthesis and the proxy
/// take it as a value): `$KVBUST_CACHE_DIR`, else `$XDG_CACHE_HOME/kvbust`, else
/// `$HOME/.cache/kvbust`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KVBUST_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("kvbust"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("kvbust"))
}
