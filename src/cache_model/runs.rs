//! The runs: which run a request belongs to (stamped when it arrives), opening and closing
//! runs (by the admin port, a header, an idle gap), each run's own warmup count and figures,
//! and its report. Bounded: at most `run.keep` runs are held. Owns run membership and the
//! reports; never does I/O (a closed run's file is written by the caller) and never waits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::cachebust::Phase;
use crate::metrics::Metrics;
use crate::report::{self, Report, RunEvent, RunSummary};

use super::ledger::{rfc3339, Acc, Record, Silence, CACHED_TOKENS_HINT};
use super::OpenTickets;

/// How header-named runs close when `run.idle_gap` is off.
pub const HEADER_RUN_IDLE: Duration = Duration::from_secs(60);

/// Who opened a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opener {
    /// The run kvbust starts with.
    Start,
    /// `POST /runs`, `POST /report/reset`, `kvbust run`.
    Admin,
    /// The first request naming it in `x-kvbust-run`.
    Header,
    /// `run.idle_gap` passed without a request.
    IdleGap,
}

impl Opener {
    pub fn as_str(self) -> &'static str {
        match self {
            Opener::Start => "start",
            Opener::Admin => "admin",
            Opener::Header => "header",
            Opener::IdleGap => "idle_gap",
        }
    }
}

/// What a new run is asked to be (`POST /runs`' body).
#[derive(Debug, Clone, Default)]
pub struct RunSpec {
    pub name: Option<String>,
    pub warmup_requests: Option<u64>,
    pub command: Option<Vec<String>>,
}

/// Whether `name` is a run name (`[A-Za-z0-9._-]{1,64}`).
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The settings runs follow (`[run]`, `cache_bust.auto_warmup_requests`).
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub idle_gap: Duration,
    pub keep: usize,
    pub auto_warmup: Option<u64>,
}

/// One run.
pub struct RunCell {
    pub name: String,
    opener: Opener,
    started: Instant,
    started_wall: SystemTime,
    /// Requests without a phase header that are warmup: the first N of this run.
    warmup_requests: Option<u64>,
    unphased: AtomicU64,
    /// This run's requests not yet counted (in flight, or waiting for the model).
    pub(super) open: Arc<OpenTickets>,
    state: Mutex<CellState>,
}

struct CellState {
    acc: Acc,
    ended: Option<(Instant, SystemTime)>,
    last_arrival: Instant,
    events: Vec<RunEvent>,
    command: Option<Vec<String>>,
}

impl RunCell {
    fn new(name: String, opener: Opener, warmup_requests: Option<u64>, now: Instant) -> Self {
        Self {
            name,
            opener,
            started: now,
            started_wall: SystemTime::now() - now.elapsed(),
            warmup_requests,
            unphased: AtomicU64::new(0),
            open: Arc::default(),
            state: Mutex::new(CellState {
                acc: Acc::new(now),
                ended: None,
                last_arrival: now,
                events: Vec::new(),
                command: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CellState> {
        // A panic while counting leaves counts, not broken invariants: keep serving.
        crate::sync::lock(&self.state)
    }

    /// The phase of this run's request that carried no phase header: warmup for the run's
    /// first `warmup_requests`, else `default`.
    pub fn unphased_phase(&self, default: Phase) -> Phase {
        if let Some(n) = self.warmup_requests {
            if self.unphased.fetch_add(1, Ordering::Relaxed) < n {
                return Phase::Warmup;
            }
        }
        default
    }

    pub fn is_closed(&self) -> bool {
        self.lock().ended.is_some()
    }

    fn close(&self, at: Instant) -> bool {
        let mut s = self.lock();
        if s.ended.is_some() {
            return false;
        }
        s.ended = Some((at, SystemTime::now() - at.elapsed()));
        true
    }

    /// Requests of this run not yet counted.
    pub fn in_flight(&self) -> u64 {
        self.open.n.load(Ordering::Acquire)
    }

    /// Waits until every request of this run is counted, or `limit` passes; whether all were.
    pub async fn settle(&self, limit: Duration) -> bool {
        self.open.settle(limit).await
    }

    /// Sets the client command `kvbust run` started the run with.
    pub fn set_command(&self, command: Vec<String>) {
        self.lock().command = Some(command);
    }

    fn note(&self, kind: &str, by: &str, at: Instant) {
        let mut s = self.lock();
        if s.ended.is_none() {
            let at_s = at.saturating_duration_since(self.started).as_secs_f64();
            s.events.push(RunEvent {
                at_s,
                kind: kind.into(),
                by: by.into(),
            });
        }
    }
}

struct Registry {
    current: Arc<RunCell>,
    /// Open runs named by header (each closes after its own idle gap).
    by_header: Vec<Arc<RunCell>>,
    /// Every run held, oldest first.
    all: VecDeque<Arc<RunCell>>,
    /// Runs closed on the request path, waiting for [`Runs::expire`] to hand them over.
    closed: Vec<Arc<RunCell>>,
    seq: u64,
}

/// The runs and the upstream's reporting (process-wide).
pub struct Runs {
    metrics: Metrics,
    settings: RunSettings,
    benchmark_id: String,
    inner: Mutex<Registry>,
    silence: Mutex<Silence>,
}

impl Runs {
    pub fn new(metrics: Metrics, settings: RunSettings, benchmark_id: String) -> Self {
        let first = Arc::new(RunCell::new(
            "run-1".into(),
            Opener::Start,
            settings.auto_warmup,
            Instant::now(),
        ));
        metrics.run_info.with_label_values(&[&first.name]).set(1);
        Self {
            metrics,
            settings,
            benchmark_id,
            inner: Mutex::new(Registry {
                current: first.clone(),
                by_header: Vec::new(),
                all: VecDeque::from([first]),
                closed: Vec::new(),
                seq: 1,
            }),
            silence: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        crate::sync::lock(&self.inner)
    }

    /// The run a request arriving `now` belongs to: the open run `name` names (opened by
    /// this request when there is none), else the current run (a new one after
    /// `run.idle_gap` without requests).
    pub fn arrive(&self, name: Option<&str>, now: Instant) -> Arc<RunCell> {
        let mut g = self.lock();
        if let Some(name) = name {
            if let Some(cell) = g.by_header.iter().find(|c| c.name == name).cloned() {
                cell.lock().last_arrival = now;
                return cell;
            }
            let cell = Arc::new(RunCell::new(
                name.to_string(),
                Opener::Header,
                self.settings.auto_warmup,
                now,
            ));
            tracing::info!(run = name, "run opened by its first request (header)");
            g.by_header.push(cell.clone());
            self.hold(&mut g, cell.clone());
            return cell;
        }
        let gap = self.settings.idle_gap;
        let idle = {
            let s = g.current.lock();
            !gap.is_zero() && now.saturating_duration_since(s.last_arrival) >= gap
        };
        if idle && (g.current.in_flight() > 0 || !g.current.lock().acc.is_empty()) {
            let spec = RunSpec::default();
            let (closed, _) = self.switch(&mut g, spec, Opener::IdleGap, now);
            tracing::info!(
                run = closed.name,
                "run closed after run.idle_gap without requests"
            );
            g.closed.push(closed);
        }
        let cell = g.current.clone();
        cell.lock().last_arrival = now;
        cell
    }

    /// Closes the current run and opens one as `spec` says; returns (closed, opened). A name
    /// already held by an open run is refused.
    pub fn open(&self, spec: RunSpec) -> Result<(Arc<RunCell>, Arc<RunCell>), String> {
        let mut g = self.lock();
        if let Some(name) = &spec.name {
            if !valid_name(name) {
                return Err(format!(
                    "run name `{}` must be 1 to 64 of A-Z a-z 0-9 . _ -",
                    crate::error::excerpt(name.as_bytes())
                ));
            }
            let open = |c: &Arc<RunCell>| c.name == *name && !c.is_closed();
            if g.by_header.iter().any(open) || open(&g.current) {
                return Err(format!(
                    "run {name} is open; close it first (POST /runs/{name}/close)"
                ));
            }
        }
        Ok(self.switch(&mut g, spec, Opener::Admin, Instant::now()))
    }

    fn switch(
        &self,
        g: &mut Registry,
        spec: RunSpec,
        opener: Opener,
        now: Instant,
    ) -> (Arc<RunCell>, Arc<RunCell>) {
        g.seq += 1;
        let name = spec.name.unwrap_or_else(|| format!("run-{}", g.seq));
        let warmup = spec.warmup_requests.or(self.settings.auto_warmup);
        let cell = Arc::new(RunCell::new(name, opener, warmup, now));
        if let Some(c) = spec.command {
            cell.set_command(c);
        }
        let closed = std::mem::replace(&mut g.current, cell.clone());
        closed.close(now);
        let info = &self.metrics.run_info;
        let _ = info.remove_label_values(&[&closed.name]);
        info.with_label_values(&[&cell.name]).set(1);
        self.hold(g, cell.clone());
        (closed, cell)
    }

    /// Holds `cell`, forgetting the oldest closed runs past `run.keep`.
    fn hold(&self, g: &mut Registry, cell: Arc<RunCell>) {
        g.all.push_back(cell);
        while g.all.len() > self.settings.keep.max(1) {
            let Some(i) = g.all.iter().position(|c| c.is_closed()) else {
                break;
            };
            g.all.remove(i);
        }
    }

    /// Closes the open run `name` (the current one: a new current run opens); `None` when no
    /// open run has that name.
    pub fn close(&self, name: &str) -> Option<Arc<RunCell>> {
        let mut g = self.lock();
        if g.current.name == name {
            let (closed, _) =
                self.switch(&mut g, RunSpec::default(), Opener::Admin, Instant::now());
            return Some(closed);
        }
        let i = g.by_header.iter().position(|c| c.name == name)?;
        let cell = g.by_header.remove(i);
        cell.close(Instant::now());
        Some(cell)
    }

    /// Runs that closed since the last call: header runs idle past their gap (closed here),
    /// and current runs the idle gap closed. The caller waits for and saves each.
    pub fn expire(&self, now: Instant) -> Vec<Arc<RunCell>> {
        let mut g = self.lock();
        let gap = match self.settings.idle_gap {
            Duration::ZERO => HEADER_RUN_IDLE,
            g => g,
        };
        let mut done = std::mem::take(&mut g.closed);
        g.by_header.retain(|c| {
            let idle = now.saturating_duration_since(c.lock().last_arrival) >= gap;
            if idle && c.in_flight() == 0 {
                c.close(now);
                tracing::info!(run = c.name, "run closed after {gap:?} without a request");
                done.push(c.clone());
            }
            !(idle && c.in_flight() == 0)
        });
        done
    }

    /// Closes every open run (at shutdown), with those closed but not yet handed over.
    pub fn close_all(&self) -> Vec<Arc<RunCell>> {
        let mut g = self.lock();
        let now = Instant::now();
        let mut done = std::mem::take(&mut g.closed);
        done.append(&mut g.by_header);
        done.push(g.current.clone());
        for c in &done {
            c.close(now);
        }
        done
    }

    pub fn current(&self) -> Arc<RunCell> {
        self.lock().current.clone()
    }

    /// The latest run called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<RunCell>> {
        self.lock()
            .all
            .iter()
            .rev()
            .find(|c| c.name == name)
            .cloned()
    }

    /// Every run held, oldest first.
    pub fn all(&self) -> Vec<Arc<RunCell>> {
        self.lock().all.iter().cloned().collect()
    }

    /// Notes an event on every open run's time line (a cache reset).
    pub fn note(&self, kind: &str, by: &str) {
        let g = self.lock();
        let now = Instant::now();
        g.current.note(kind, by, now);
        for c in &g.by_header {
            c.note(kind, by, now);
        }
    }

    /// Counts one finished request in `cell`.
    pub fn record(&self, cell: &RunCell, r: Record) {
        if let Some(o) = &r.outcome {
            let seen = crate::sync::lock(&self.silence).watch(o);
            match seen {
                Some(true) => self.metrics.upstream_reports_cached.set(1),
                Some(false) => {
                    self.metrics.upstream_reports_cached.set(0);
                    tracing::warn!(
                        "{CACHED_TOKENS_HINT}; until then kvbust's report shows only the cache \
                         model's predictions"
                    );
                }
                None => {}
            }
        }
        let divergence = cell.lock().acc.record(&r);
        if let (Some(direction), Some(phase), Some(target)) = (divergence, r.phase, r.target) {
            self.metrics
                .model_divergence
                .with_label_values(&[phase.as_str(), target.as_str(), direction])
                .inc();
        }
    }

    /// `cell`'s report now (the model's facts are the caller's: see `CacheModel::facts`).
    pub fn report(&self, cell: &RunCell, model: report::ModelFacts) -> Report {
        let upstream = crate::sync::lock(&self.silence).facts();
        let s = cell.lock();
        let (rows, verdict, timeline) = s.acc.figures();
        let mut unaccounted: std::collections::BTreeMap<String, u64> = s
            .acc
            .unaccounted()
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let in_flight = cell.in_flight();
        if in_flight > 0 {
            unaccounted.insert("in_flight".into(), in_flight);
        }
        let now = SystemTime::now();
        let elapsed = match s.ended {
            Some((at, _)) => at.saturating_duration_since(cell.started),
            None => cell.started.elapsed(),
        };
        Report {
            schema: report::SCHEMA,
            run: report::Run {
                name: cell.name.clone(),
                opened_by: cell.opener.as_str().into(),
                benchmark_id: self.benchmark_id.clone(),
                started_at: rfc3339(cell.started_wall),
                ended_at: s.ended.map(|(_, wall)| rfc3339(wall)),
                generated_at: rfc3339(now),
                elapsed_s: elapsed.as_secs_f64(),
                complete: unaccounted.is_empty(),
                unaccounted,
                warmup_requests: cell.warmup_requests,
                events: s.events.clone(),
                command: s.command.clone(),
            },
            verdict,
            cache_model: model,
            upstream,
            rows,
            timeline,
        }
    }

    /// `GET /runs`' line for `cell`.
    pub fn summary(&self, cell: &RunCell) -> RunSummary {
        let s = cell.lock();
        let (rows, verdict, _) = s.acc.figures();
        let unaccounted = !s.acc.unaccounted().is_empty() || cell.in_flight() > 0;
        RunSummary {
            name: cell.name.clone(),
            started_at: rfc3339(cell.started_wall),
            ended_at: s.ended.map(|(_, wall)| rfc3339(wall)),
            complete: !unaccounted,
            verdict: verdict.isolation,
            message: verdict.message,
            requests: rows.iter().map(|r| r.requests).sum(),
        }
    }
}
