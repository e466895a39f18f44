//! `kvbust run … -- COMMAND`: one benchmark client's run as one named kvbust run. Opens the run on
//! the admin port, runs COMMAND with the terminal as it is (its output passes through), forwards
//! SIGTERM (and SIGINT when no terminal sent it) to it, closes the run, prints the verdict and a
//! short summary to standard error, saves the run file, and picks the exit status. Never reads
//! the environment (the caller hands over the token) and never renders more than the summary.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use clap::{Args, ValueEnum};
use sha2::{Digest, Sha256};

use crate::admin_client::{Admin, FetchError, Fetched, OpenRun};
use crate::report::{render, Isolation, Report, RunFile, RUN_FILE_SCHEMA};

/// The exit status of a run whose verdict fails `--fail-on`.
pub const EXIT_VERDICT: u8 = 3;

/// `kvbust run`'s flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The run's name, `[A-Za-z0-9._-]{1,64}` (default: COMMAND's name and the time, e.g.
    /// `aiperf-20261205T074600Z`).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The admin port's URL, e.g. http://127.0.0.1:9090 (default: admin.addr from the
    /// configuration, a wildcard address read as loopback).
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    /// TOML or YAML configuration file (its admin.addr and admin.token reach the port).
    #[arg(long, env = "KVBUST_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The first N requests of the run without a phase header are warmup (default: the
    /// server's cache_bust.auto_warmup_requests).
    #[arg(long, value_name = "N")]
    pub warmup_requests: Option<u64>,
    /// Empty the upstream's prefix cache as the run opens (AIPerf's --reset-kv-cache).
    #[arg(long)]
    pub reset_upstream_cache: bool,
    /// Which verdict makes the exit status 3: `breach` (isolation breached), `contamination`
    /// (also: isolation not requested and profiling served from warmup's cache), `never`.
    #[arg(long, value_enum, default_value_t = FailOn::Breach, value_name = "WHEN")]
    pub fail_on: FailOn,
    /// Save the closed run as DIR/NAME.json (the report, the configuration's digest, COMMAND);
    /// `kvbust report DIR/*.json` lays saved runs side by side.
    #[arg(long, value_name = "DIR")]
    pub results_dir: Option<PathBuf>,
    /// Give up on one admin call after this long (closing waits for the run's last requests to
    /// be answered and modelled), e.g. "120s".
    #[arg(long, default_value = "120s", value_name = "DURATION")]
    pub timeout: String,
    /// The benchmark client and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// When a run's verdict fails the command (exit 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum FailOn {
    /// Isolation was requested and breached.
    #[default]
    Breach,
    /// Breached, or not requested and profiling prompt tokens came from warmup's cache.
    Contamination,
    /// Never: the exit status is COMMAND's.
    Never,
}

impl FailOn {
    /// Whether `report`'s verdict fails this setting.
    pub fn fails(self, report: &Report) -> bool {
        let v = &report.verdict;
        match self {
            FailOn::Never => false,
            FailOn::Breach => v.isolation == Isolation::Breached,
            FailOn::Contamination => {
                v.isolation == Isolation::Breached
                    || (v.isolation == Isolation::NotRequested
                        && v.warmup_share.is_some_and(|s| s > 0.0))
            }
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            FailOn::Breach => "breach",
            FailOn::Contamination => "contamination",
            FailOn::Never => "never",
        }
    }
}

/// Everything a run needs, decided before it starts.
#[derive(Debug, Clone)]
pub struct Plan {
    pub admin: Admin,
    pub token: Option<String>,
    pub name: String,
    pub warmup_requests: Option<u64>,
    pub reset_upstream_cache: bool,
    pub fail_on: FailOn,
    pub results_dir: Option<PathBuf>,
    pub command: Vec<String>,
    pub timeout: Duration,
    /// Pass SIGINT on to COMMAND. Off when a terminal is attached: its Ctrl-C already reached
    /// COMMAND, which shares kvbust's process group, and a second one would cut its clean-up.
    pub forward_sigint: bool,
}

impl Plan {
    /// COMMAND's program, as given.
    fn program(&self) -> &str {
        self.command.first().map_or("", String::as_str)
    }
}

/// How a run ended: the exit status, and why when it is not 0.
#[derive(Debug)]
pub struct Outcome {
    pub code: u8,
    pub why: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot open run `{name}`: {source}")]
    Open { name: String, source: FetchError },
    #[error("run `{name}`: cannot start `{command}`: {source}")]
    Spawn {
        name: String,
        command: String,
        source: std::io::Error,
    },
}

/// A run name as the contract allows it: `[A-Za-z0-9._-]{1,64}`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The name of a run started at `now` for `command`: its program's file name (characters a name
/// may not carry dropped) and the time, `aiperf-20261205T074600Z`.
pub fn default_name(command: &[String], now: std::time::SystemTime) -> String {
    let program = command
        .first()
        .map(|c| {
            Path::new(c)
                .file_name()
                .map_or(c.as_str(), |f| f.to_str().unwrap_or(""))
        })
        .unwrap_or("run");
    let mut base: String = program
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(40)
        .collect();
    if base.is_empty() {
        base = "run".into();
    }
    let stamp: String = humantime::format_rfc3339_seconds(now)
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    format!("{base}-{stamp}")
}

/// Opens the run, runs COMMAND, closes the run, prints, saves: the exit status to end with.
pub async fn execute(plan: &Plan) -> Result<Outcome, RunError> {
    let open = OpenRun {
        name: Some(plan.name.clone()),
        warmup_requests: plan.warmup_requests,
        reset_upstream_cache: plan.reset_upstream_cache,
    };
    plan.admin
        .open_run(&open, plan.token.as_deref(), plan.timeout)
        .await
        .map_err(|source| RunError::Open {
            name: plan.name.clone(),
            source,
        })?;
    let status = match spawn_and_wait(plan).await {
        Ok(status) => status,
        Err(source) => {
            // The run is open on the server: close it, so the next one does not inherit it.
            let _ = close(plan).await;
            return Err(RunError::Spawn {
                name: plan.name.clone(),
                command: plan.command.join(" "),
                source,
            });
        }
    };
    let child_code = exit_code(status);
    let closed = close(plan).await;
    let report = match closed {
        Ok(fetched) => fetched.report,
        Err(e) => {
            let why = format!("cannot close run `{}`: {e}", plan.name);
            return Ok(match child_code {
                Some(code) => Outcome {
                    code,
                    why: Some(format!("`{}` failed (exit {code}); {why}", plan.program())),
                },
                None => Outcome {
                    code: 1,
                    why: Some(why),
                },
            });
        }
    };
    let mut lines = render::summary(&report);
    if let Some(dir) = &plan.results_dir {
        match save(plan, dir, report.clone()).await {
            Ok(path) => lines.push_str(&format!("  saved {}\n", path.display())),
            Err(e) => lines.push_str(&format!("  ! not saved: {e}\n")),
        }
    }
    eprint!("{lines}");
    Ok(judge(plan, child_code, &report))
}

/// The exit status: COMMAND's when it failed, else [`EXIT_VERDICT`] when the verdict fails
/// `--fail-on`, else 0.
fn judge(plan: &Plan, child_code: Option<u8>, report: &Report) -> Outcome {
    if let Some(code) = child_code {
        return Outcome {
            code,
            why: Some(format!("`{}` failed (exit {code})", plan.program())),
        };
    }
    if plan.fail_on.fails(report) {
        return Outcome {
            code: EXIT_VERDICT,
            why: Some(format!(
                "run `{}`: isolation {} (--fail-on {})",
                plan.name,
                report.verdict.isolation.as_str().replace('_', " "),
                plan.fail_on.as_str()
            )),
        };
    }
    Outcome { code: 0, why: None }
}

/// COMMAND's exit status when it failed: its code, or 128 + the signal that ended it, as a
/// shell reports it. `None` when it succeeded.
fn exit_code(status: ExitStatus) -> Option<u8> {
    if status.success() {
        return None;
    }
    if let Some(code) = status.code() {
        // Codes are 0..=255 on Unix; a wider one (Windows) still fails.
        return Some(u8::try_from(code).unwrap_or(1).max(1));
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return Some(u8::try_from(128 + sig).unwrap_or(255));
        }
    }
    Some(1)
}

async fn close(plan: &Plan) -> Result<Fetched, FetchError> {
    plan.admin
        .close_run(&plan.name, plan.token.as_deref(), plan.timeout)
        .await
}

/// Runs COMMAND with kvbust's standard streams until it exits, passing signals on.
#[cfg(unix)]
async fn spawn_and_wait(plan: &Plan) -> std::io::Result<ExitStatus> {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed before COMMAND starts and for as long as kvbust lives: a signal never ends
    // kvbust before COMMAND, so the run is always closed and judged.
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut child = command(plan).spawn()?;
    loop {
        tokio::select! {
            status = child.wait() => return status,
            Some(()) = int.recv() => {
                if plan.forward_sigint {
                    pass_on(&child, Forward::Interrupt);
                }
            }
            Some(()) = term.recv() => pass_on(&child, Forward::Terminate),
        }
    }
}

#[cfg(not(unix))]
async fn spawn_and_wait(plan: &Plan) -> std::io::Result<ExitStatus> {
    command(plan).spawn()?.wait().await
}

fn command(plan: &Plan) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(plan.program());
    c.args(plan.command.iter().skip(1));
    c
}

#[cfg(unix)]
#[derive(Debug, Clone, Copy)]
enum Forward {
    Interrupt,
    Terminate,
}

#[cfg(unix)]
fn pass_on(child: &tokio::process::Child, sig: Forward) {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{kill_process, Pid, Signal};
        let signal = match sig {
            Forward::Interrupt => Signal::INT,
            Forward::Terminate => Signal::TERM,
        };
        // A child already reaped has no id: nothing to tell.
        if let Some(pid) = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw)
        {
            let _ = kill_process(pid, signal);
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (child, sig);
    }
}

/// Writes the run file `dir/NAME.json` (through a temporary name, so a reader never sees half
/// of it); its path.
async fn save(plan: &Plan, dir: &Path, mut report: Report) -> Result<PathBuf, String> {
    // The digest of the configuration as the admin port shows it (secrets redacted).
    let config = plan
        .admin
        .config(plan.timeout)
        .await
        .map_err(|e| format!("cannot read the configuration for its digest: {e}"))?;
    if report.run.command.is_none() {
        report.run.command = Some(plan.command.clone());
    }
    let file = RunFile {
        kvbust_run: RUN_FILE_SCHEMA,
        config_digest: hex::encode(Sha256::digest(&config)),
        report,
    };
    let mut text = serde_json::to_string_pretty(&file)
        .map_err(|e| format!("cannot serialize the run file: {e}"))?;
    text.push('\n');
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{}.json", plan.name));
    let tmp = dir.join(format!(".{}.json.tmp", plan.name));
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render::fixtures;

    #[test]
    fn names() {
        for ok in ["c8", "a.b_c-D", &"x".repeat(64)] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_796_456_760);
        let cmd = |s: &str| vec![s.to_string(), "profile".to_string()];
        let name = default_name(&cmd("/usr/bin/aiperf"), t);
        assert_eq!(name, "aiperf-20261205T074600Z");
        assert!(valid_name(&name));
        assert_eq!(default_name(&cmd("/x/ä b"), t), "b-20261205T074600Z");
        assert_eq!(default_name(&cmd("ä"), t), "run-20261205T074600Z");
    }

    #[test]
    fn fail_on_reads_the_verdict() {
        let mut r = fixtures::one_phase();
        let all = [FailOn::Breach, FailOn::Contamination, FailOn::Never];
        let fails = |r: &Report| all.map(|f| f.fails(r));
        r.verdict.isolation = Isolation::Held;
        assert_eq!(fails(&r), [false, false, false]);
        r.verdict.isolation = Isolation::Breached;
        assert_eq!(fails(&r), [true, true, false]);
        r.verdict.isolation = Isolation::NotRequested;
        r.verdict.warmup_share = Some(0.0);
        assert_eq!(fails(&r), [false, false, false]);
        r.verdict.warmup_share = Some(0.97);
        assert_eq!(fails(&r), [false, true, false]);
        r.verdict.warmup_share = None;
        assert_eq!(fails(&r), [false, false, false]);
    }
}
