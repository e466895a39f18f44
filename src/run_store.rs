//! Finishing runs: a closed run waits (within `run.close_wait`) for its requests to be
//! answered and modelled, then its report is taken and, with `run.results_dir`, saved as one
//! JSON file; the ticker that closes idle runs; the upstream cache reset a run may open with.
//! Owns those edges of runs; never decides which run a request belongs to
//! (`cache_model::runs` does).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::cache_model::RunCell;
use crate::report::{Report, RunFile, RUN_FILE_SCHEMA};
use crate::runtime::SharedState;

/// How long a reset call to the upstream may take.
const RESET_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits for `cell`'s requests (within `run.close_wait`), then returns its report, saved to
/// `run.results_dir` when set (a failure to save is logged; the report is still returned).
pub async fn finish(rt: &SharedState, cell: &Arc<RunCell>) -> Report {
    let wait = rt.config.run.close_wait;
    if !cell.settle(wait).await {
        tracing::warn!(
            run = cell.name,
            in_flight = cell.in_flight(),
            "run closed with requests still open after {wait:?} (run.close_wait): its report \
             says complete: false"
        );
    }
    let report = rt.cache_model.report_of(cell);
    // A run that saw no request (the one kvbust started with, before the first POST /runs)
    // is not worth a file.
    let empty = report.rows.is_empty() && report.run.events.is_empty();
    if let (Some(dir), false) = (&rt.config.run.results_dir, empty) {
        let file = RunFile {
            kvbust_run: RUN_FILE_SCHEMA,
            config_digest: config_digest(rt),
            report: report.clone(),
        };
        let dir = dir.clone();
        let name = cell.name.clone();
        let saved = tokio::task::spawn_blocking(move || save(&dir, &name, &file)).await;
        match saved {
            Ok(Ok(path)) => tracing::info!(run = cell.name, file = %path.display(), "run saved"),
            Ok(Err(e)) => tracing::error!(run = cell.name, "cannot save the run: {e}"),
            Err(e) => tracing::error!(run = cell.name, "cannot save the run: {e}"),
        }
    }
    tracing::info!(
        run = cell.name,
        verdict = report.verdict.isolation.as_str(),
        "{}",
        report.verdict.message
    );
    report
}

/// sha256 of the effective configuration, secrets redacted (hex).
pub fn config_digest(rt: &SharedState) -> String {
    hex::encode(Sha256::digest(rt.config.redacted().to_toml().as_bytes()))
}

/// Writes `file` as `dir/NAME.json` (`NAME-2.json`, ... when taken), atomically.
fn save(dir: &Path, name: &str, file: &RunFile) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let text = serde_json::to_vec_pretty(file).map_err(std::io::Error::other)?;
    let path = (1..)
        .map(|i| match i {
            1 => dir.join(format!("{name}.json")),
            i => dir.join(format!("{name}-{i}.json")),
        })
        .find(|p| !p.exists())
        .unwrap_or_else(|| dir.join(format!("{name}.json")));
    let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
    std::fs::write(&tmp, &text)?;
    std::fs::rename(&tmp, &path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(path)
}

/// Asks the upstream to empty its prefix cache and, when it did, has the model forget its
/// index (`by`: who asked, for the metric and the run's time line).
pub async fn reset_upstream(rt: &SharedState, by: &'static str) -> Result<&'static str, String> {
    let Some((upstream, client)) = rt.upstream_reset.get() else {
        return Err("kvbust is not serving yet".into());
    };
    let path = crate::upstream::reset::reset_cache(client, upstream, RESET_TIMEOUT).await?;
    rt.cache_model.cache_reset(by);
    Ok(path)
}

/// Closes runs as they go idle (header runs after their gap, the current run after
/// `run.idle_gap`) and finishes each, every second, until `stop` turns true.
pub fn spawn_ticker(
    rt: Arc<SharedState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tick.tick() => {}
            }
            for cell in rt.cache_model.runs().expire(Instant::now()) {
                let rt = rt.clone();
                tokio::spawn(async move { finish(&rt, &cell).await });
            }
        }
    })
}

/// Closes and finishes every open run (at shutdown, after the requests drained).
pub async fn close_all(rt: &SharedState) -> Vec<Report> {
    let mut out = Vec::new();
    for cell in rt.cache_model.runs().close_all() {
        out.push(finish(rt, &cell).await);
    }
    out
}
