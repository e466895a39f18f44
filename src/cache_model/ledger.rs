//! The run ledger behind `GET /report`: per phase × target, what was sent, what the upstream
//! said and what the model predicted, with TTFT quantiles and a time line; the run's start and
//! benchmark id; and whether the upstream reports cached tokens at all. Fed one finished
//! request at a time ([`RunLedger::record`]); read as a [`crate::report::Report`]. Owns the
//! counting only; never tokenizes, never does I/O beyond one warning log line.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::cachebust::{Phase, Target};
use crate::metrics::Metrics;
use crate::report::{self, Breaches, Bucket, Pair, Quantiles, Reuse, Row, Timeline};
use crate::usage::Tokens;

use super::attribution::{self, Breach};

/// Successful responses with usage but no cached-token field after which the upstream is
/// taken not to report cached tokens.
pub const SILENT_AFTER: u64 = 8;

/// The engine flags that make a server report cached tokens.
pub const CACHED_TOKENS_HINT: &str = "the upstream reports usage without cached tokens: start vLLM with \
--enable-prompt-tokens-details, SGLang with --enable-cache-report (llama.cpp's server reports them as is)";

/// At most this many time buckets per phase: past it, the width doubles.
const MAX_BUCKETS: usize = 240;

/// What the model predicted for one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prediction {
    pub prompt_tokens: u64,
    pub cached: u64,
    pub reuse: Reuse,
    pub breaches: Vec<Breach>,
}

/// What the response said.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Outcome {
    pub tokens: Tokens,
    pub ttft: Option<Duration>,
    /// A 2xx response whose body ended normally.
    pub complete: bool,
    /// Streamed events that carried generated content (the output length when the server
    /// reported no usage).
    pub content_events: u64,
}

/// One finished request.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub at: Option<Instant>,
    pub phase: Option<Phase>,
    pub target: Option<Target>,
    /// An explicit benchmark id the request carried (a new one starts a new run).
    pub benchmark_id: Option<String>,
    pub prediction: Option<Prediction>,
    pub outcome: Option<Outcome>,
    /// The request's capture row, waiting for its response.
    pub capture: Option<crate::capture::Pending>,
    /// It asked for `cache_bust.method = "salt"` on a route without a salt (Anthropic
    /// Messages) and was marked instead.
    pub salt_fallback: bool,
    /// The cache-hit dial it ran under (`cache_bust.hit_ratio`, `x-kvbust-hit-ratio`).
    pub hit_ratio: Option<f64>,
    /// kvbust isolated it by `cache_salt` (the model's index is keyed by the salt).
    pub salted: bool,
}

/// Time to first token in log buckets 4% wide from 10 µs: about 460 counters cover 10 minutes.
#[derive(Debug, Clone, Default)]
struct LogHistogram {
    counts: Vec<u64>,
    n: u64,
}

const HIST_BASE_MS: f64 = 0.01;
const HIST_STEP: f64 = 1.04;

impl LogHistogram {
    fn add(&mut self, ms: f64) {
        let i = if ms <= HIST_BASE_MS {
            0
        } else {
            ((ms / HIST_BASE_MS).ln() / HIST_STEP.ln()).floor() as usize + 1
        };
        let i = i.min(600);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        self.n += 1;
    }

    /// The `q` quantile, as the geometric middle of its bucket (within 2%).
    fn quantile(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                if i == 0 {
                    return Some(HIST_BASE_MS);
                }
                let lo = HIST_BASE_MS * HIST_STEP.powi(i as i32 - 1);
                return Some(lo * HIST_STEP.sqrt());
            }
        }
        None
    }
}

#[derive(Debug, Clone, Default)]
struct RowAcc {
    row: Row,
    ttft: LogHistogram,
}

/// One phase's time line bucket, accumulating.
#[derive(Debug, Clone, Default)]
struct BucketAcc {
    requests: u64,
    prompt_tokens: u64,
    predicted_cached: u64,
    reported_cached: Option<u64>,
    reported_prompt: Option<u64>,
    ttft_ms_sum: f64,
    ttft_n: u64,
}

impl BucketAcc {
    fn merge(&mut self, o: &BucketAcc) {
        self.requests += o.requests;
        self.prompt_tokens += o.prompt_tokens;
        self.predicted_cached += o.predicted_cached;
        self.reported_cached = add_opt(self.reported_cached, o.reported_cached);
        self.reported_prompt = add_opt(self.reported_prompt, o.reported_prompt);
        self.ttft_ms_sum += o.ttft_ms_sum;
        self.ttft_n += o.ttft_n;
    }
}

fn add_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

struct Run {
    benchmark_id: String,
    started: Instant,
    started_wall: SystemTime,
    rows: BTreeMap<(usize, usize), RowAcc>,
    bucket: Duration,
    /// Per phase (warmup, profiling).
    timeline: [Vec<BucketAcc>; 2],
}

impl Run {
    fn new(benchmark_id: String) -> Self {
        Self {
            benchmark_id,
            started: Instant::now(),
            started_wall: SystemTime::now(),
            rows: BTreeMap::new(),
            bucket: Duration::from_secs(1),
            timeline: [Vec::new(), Vec::new()],
        }
    }
}

/// Whether the upstream reports cached tokens (process-wide: a run reset does not forget it).
#[derive(Default)]
struct Silence {
    with_usage: u64,
    reported: bool,
    warned: bool,
}

/// The run ledger: the current run, and the upstream's reporting.
pub struct RunLedger {
    metrics: Metrics,
    inner: Mutex<(Run, Silence)>,
}

fn phase_index(p: Phase) -> usize {
    match p {
        Phase::Warmup => 0,
        Phase::Profiling => 1,
    }
}

fn target_index(t: Target) -> usize {
    Target::ALL.iter().position(|x| *x == t).unwrap_or(0)
}

impl RunLedger {
    pub fn new(metrics: Metrics, benchmark_id: String) -> Self {
        Self {
            metrics,
            inner: Mutex::new((Run::new(benchmark_id), Silence::default())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Run, Silence)> {
        // A panic while counting leaves counts, not broken invariants: keep serving.
        crate::sync::lock(&self.inner)
    }

    /// Starts a new run (`POST /report/reset`), under `benchmark_id` or the current one, and
    /// returns the report of the run it closed (taken under the same lock: no request is lost
    /// between the two).
    pub fn reset(&self, benchmark_id: Option<String>, model: report::ModelFacts) -> report::Report {
        let mut g = self.lock();
        let closed = report_of(&g.0, &g.1, model);
        let id = benchmark_id.unwrap_or_else(|| g.0.benchmark_id.clone());
        g.0 = Run::new(id);
        closed
    }

    /// Counts one finished request.
    pub fn record(&self, r: Record) {
        let (Some(phase), Some(target)) = (r.phase, r.target) else {
            return;
        };
        let mut g = self.lock();
        let (run, silence) = &mut *g;
        if let Some(id) = r
            .benchmark_id
            .as_deref()
            .filter(|id| *id != run.benchmark_id)
        {
            tracing::info!(
                benchmark_id = id,
                "a new benchmark id: the report starts a new run"
            );
            *run = Run::new(id.to_string());
        }
        if let Some(o) = &r.outcome {
            self.watch_silence(silence, o);
        }
        let acc = run
            .rows
            .entry((phase_index(phase), target_index(target)))
            .or_insert_with(|| RowAcc {
                row: Row {
                    phase: phase.as_str().into(),
                    target: target.as_str().into(),
                    ..Row::default()
                },
                ..RowAcc::default()
            });
        let divergence = count_row(acc, &r);
        if r.salted && divergence == Some("reported_higher") {
            // More reuse than salts allow: the upstream seems to ignore `cache_salt`.
            acc.row.salt_ignored += 1;
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "cache_bust.method = salt: the upstream reported more cached tokens than \
                     salt isolation allows, so it seems to ignore cache_salt and isolation \
                     cannot be trusted; check with `kvbust probe`, or use cache_bust.method = \
                     marker (said once; counted per row as salt_ignored)"
                );
            });
        }
        if let Some(direction) = divergence {
            self.metrics
                .model_divergence
                .with_label_values(&[phase.as_str(), target.as_str(), direction])
                .inc();
        }
        let at =
            r.at.map_or(Duration::ZERO, |t| t.saturating_duration_since(run.started));
        add_to_timeline(run, phase, at, &r);
    }

    fn watch_silence(&self, s: &mut Silence, o: &Outcome) {
        if !o.complete || o.tokens.prompt.is_none() {
            return;
        }
        s.with_usage += 1;
        if o.tokens.cached.is_some() {
            if !s.reported {
                s.reported = true;
                self.metrics.upstream_reports_cached.set(1);
            }
            return;
        }
        if !s.reported && !s.warned && s.with_usage >= SILENT_AFTER {
            s.warned = true;
            self.metrics.upstream_reports_cached.set(0);
            tracing::warn!(
                responses = s.with_usage,
                "{CACHED_TOKENS_HINT}; until then kvbust's report shows only the cache model's predictions"
            );
        }
    }

    /// The report of the run so far (model facts are the caller's: see `CacheModel::report`).
    pub fn snapshot(&self, model: report::ModelFacts) -> report::Report {
        let g = self.lock();
        report_of(&g.0, &g.1, model)
    }
}

fn report_of(run: &Run, silence: &Silence, model: report::ModelFacts) -> report::Report {
    {
        let now = SystemTime::now();
        let rows = run.rows.values().map(finish_row).collect();
        report::Report {
            schema: report::SCHEMA,
            run: report::Run {
                benchmark_id: run.benchmark_id.clone(),
                started_at: rfc3339(run.started_wall),
                generated_at: rfc3339(now),
                elapsed_s: run.started.elapsed().as_secs_f64(),
            },
            cache_model: model,
            upstream: report::UpstreamFacts {
                reports_cached_tokens: if silence.reported {
                    Some(true)
                } else if silence.with_usage >= SILENT_AFTER {
                    Some(false)
                } else {
                    None
                },
                responses_with_usage: silence.with_usage,
                hint: (!silence.reported && silence.with_usage >= SILENT_AFTER)
                    .then(|| CACHED_TOKENS_HINT.to_string()),
            },
            rows,
            timeline: timeline(run),
        }
    }
}

/// Adds `r` to its row; returns the divergence direction when the upstream's cached tokens
/// differ from the prediction.
fn count_row(acc: &mut RowAcc, r: &Record) -> Option<&'static str> {
    let row = &mut acc.row;
    row.requests += 1;
    row.salt_fallbacks += u64::from(r.salt_fallback);
    if let Some(dial) = r.hit_ratio {
        // The row's dial is the mean of its requests' (one value when they agree).
        let n = row.dialled_requests as f64;
        row.hit_ratio = Some((row.hit_ratio.unwrap_or(0.0) * n + dial) / (n + 1.0));
        row.dialled_requests += 1;
    }
    if let Some(p) = &r.prediction {
        row.accounted_requests += 1;
        row.prompt_tokens.predicted += p.prompt_tokens;
        row.cached_tokens.predicted += p.cached;
        row.reuse.same_session += p.reuse.same_session;
        row.reuse.other_session += p.reuse.other_session;
        row.reuse.warmup += p.reuse.warmup;
        for b in &p.breaches {
            attribution::count(&mut row.breaches, *b);
        }
    }
    let o = r.outcome.as_ref()?;
    if let Some(t) = o.ttft {
        acc.ttft.add(t.as_secs_f64() * 1000.0);
    }
    let tokens = o.tokens;
    add_reported(&mut row.prompt_tokens, tokens.prompt);
    add_reported(&mut row.cached_tokens, tokens.cached);
    let (reported, p) = (tokens.cached?, r.prediction.as_ref()?);
    if reported == p.cached {
        return None;
    }
    row.divergent_requests += 1;
    Some(if reported > p.cached {
        "reported_higher"
    } else {
        "reported_lower"
    })
}

fn add_reported(pair: &mut Pair, v: Option<u64>) {
    if let Some(v) = v {
        pair.reported = Some(pair.reported.unwrap_or(0) + v);
    }
}

fn finish_row(acc: &RowAcc) -> Row {
    let mut row = acc.row.clone();
    row.ttft_ms = Quantiles {
        count: acc.ttft.n,
        p50: acc.ttft.quantile(0.5),
        p99: acc.ttft.quantile(0.99),
    };
    row
}

fn add_to_timeline(run: &mut Run, phase: Phase, at: Duration, r: &Record) {
    let mut i = (at.as_nanos() / run.bucket.as_nanos().max(1)) as usize;
    while i >= MAX_BUCKETS {
        // Twice as wide: merge neighbours in every phase.
        run.bucket *= 2;
        for line in &mut run.timeline {
            let merged = line
                .chunks(2)
                .map(|pair| {
                    let mut b = pair[0].clone();
                    if let Some(second) = pair.get(1) {
                        b.merge(second);
                    }
                    b
                })
                .collect();
            *line = merged;
        }
        i /= 2;
    }
    let line = &mut run.timeline[phase_index(phase)];
    if line.len() <= i {
        line.resize(i + 1, BucketAcc::default());
    }
    let b = &mut line[i];
    b.requests += 1;
    if let Some(p) = &r.prediction {
        b.prompt_tokens += p.prompt_tokens;
        b.predicted_cached += p.cached;
    }
    if let Some(o) = &r.outcome {
        if let (Some(c), Some(p)) = (o.tokens.cached, o.tokens.prompt) {
            b.reported_cached = Some(b.reported_cached.unwrap_or(0) + c);
            b.reported_prompt = Some(b.reported_prompt.unwrap_or(0) + p);
        }
        if let Some(t) = o.ttft {
            b.ttft_ms_sum += t.as_secs_f64() * 1000.0;
            b.ttft_n += 1;
        }
    }
}

fn timeline(run: &Run) -> Timeline {
    let mut buckets = Vec::new();
    for phase in Phase::ALL {
        for (i, b) in run.timeline[phase_index(phase)].iter().enumerate() {
            if b.requests == 0 {
                continue;
            }
            buckets.push(Bucket {
                index: i as u64,
                phase: phase.as_str().into(),
                requests: b.requests,
                prompt_tokens: b.prompt_tokens,
                predicted_cached: b.predicted_cached,
                reported_cached: b.reported_cached,
                reported_prompt_tokens: b.reported_prompt,
                ttft_ms_mean: (b.ttft_n > 0).then(|| b.ttft_ms_sum / b.ttft_n as f64),
            });
        }
    }
    Timeline {
        bucket_s: run.bucket.as_secs_f64(),
        buckets,
    }
}

/// `2026-12-02T02:31:47.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Breaches of `b`, for the log line.
pub fn breach_list(b: &Breaches) -> Vec<&'static str> {
    Breach::ALL
        .iter()
        .filter(|k| match k {
            Breach::CrossSession => b.cross_session > 0,
            Breach::WarmupReuse => b.warmup_reuse > 0,
            Breach::SessionCollision => b.session_collision > 0,
        })
        .map(|k| k.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> report::ModelFacts {
        report::ModelFacts {
            enabled: true,
            block_size: 16,
            tokenizer: "qwen3".into(),
            chat_template: "auto".into(),
            capacity_blocks: 0,
            max_memory: 1 << 28,
            indexed_blocks: 0,
            evicted_blocks: 0,
            unaccounted: BTreeMap::new(),
            topology: "sidecar".into(),
            note: None,
        }
    }

    fn rec(
        phase: Phase,
        pred: Option<(u64, u64)>,
        reported: Option<(u64, Option<u64>)>,
        ttft_ms: Option<u64>,
    ) -> Record {
        Record {
            at: Some(Instant::now()),
            phase: Some(phase),
            target: Some(Target::FirstTurnPrefix),
            benchmark_id: None,
            prediction: pred.map(|(prompt, cached)| Prediction {
                prompt_tokens: prompt,
                cached,
                ..Prediction::default()
            }),
            capture: None,
            salt_fallback: false,
            hit_ratio: None,
            salted: false,
            outcome: reported.map(|(p, c)| Outcome {
                content_events: 0,
                tokens: Tokens {
                    prompt: Some(p),
                    cached: c,
                    completion: Some(1),
                },
                ttft: ttft_ms.map(Duration::from_millis),
                complete: true,
            }),
        }
    }

    #[test]
    fn rows_sum_reported_and_predicted_and_count_divergence() {
        let m = Metrics::new();
        let l = RunLedger::new(m.clone(), "bid".into());
        l.record(rec(
            Phase::Warmup,
            Some((100, 0)),
            Some((100, Some(0))),
            Some(10),
        ));
        l.record(rec(
            Phase::Profiling,
            Some((100, 96)),
            Some((100, Some(96))),
            Some(5),
        ));
        l.record(rec(
            Phase::Profiling,
            Some((100, 96)),
            Some((100, Some(80))),
            Some(7),
        ));
        l.record(rec(Phase::Profiling, None, Some((50, Some(0))), None));
        let r = l.snapshot(facts());
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.rows[0].phase, "warmup");
        let p = &r.rows[1];
        assert_eq!((p.requests, p.accounted_requests), (3, 2));
        assert_eq!(
            p.prompt_tokens,
            Pair {
                reported: Some(250),
                predicted: 200
            }
        );
        assert_eq!(
            p.cached_tokens,
            Pair {
                reported: Some(176),
                predicted: 192
            }
        );
        assert_eq!(p.divergent_requests, 1);
        assert_eq!(p.ttft_ms.count, 2);
        let p50 = p.ttft_ms.p50.expect("samples");
        assert!((p50 - 5.0).abs() / 5.0 < 0.03, "{p50}");
        let text = String::from_utf8(m.render()).expect("utf-8");
        assert!(text.contains("kvbust_cache_model_divergence_total{direction=\"reported_lower\",phase=\"profiling\",target=\"first_turn_prefix\"} 1"), "{text}");
        assert_eq!(r.run.benchmark_id, "bid");
        assert_eq!(r.upstream.reports_cached_tokens, Some(true));
        let buckets: u64 = r.timeline.buckets.iter().map(|b| b.requests).sum();
        assert_eq!(buckets, 4);
    }

    #[test]
    fn a_silent_upstream_is_named_after_enough_responses() {
        let m = Metrics::new();
        let l = RunLedger::new(m.clone(), "bid".into());
        for i in 0..SILENT_AFTER {
            assert_eq!(
                l.snapshot(facts()).upstream.reports_cached_tokens,
                None,
                "after {i}"
            );
            l.record(rec(Phase::Profiling, Some((10, 0)), Some((10, None)), None));
        }
        let r = l.snapshot(facts());
        assert_eq!(r.upstream.reports_cached_tokens, Some(false));
        assert!(r
            .upstream
            .hint
            .as_deref()
            .is_some_and(|h| h.contains("--enable-prompt-tokens-details")
                && h.contains("--enable-cache-report")));
        assert!(String::from_utf8(m.render())
            .expect("utf-8")
            .contains("kvbust_upstream_reports_cached_tokens 0"));
        assert_eq!(r.rows[0].cached_tokens.reported, None);
    }

    #[test]
    fn reset_and_a_new_benchmark_id_start_a_new_run() {
        let l = RunLedger::new(Metrics::new(), "one".into());
        l.record(rec(Phase::Profiling, Some((1, 0)), None, None));
        let closed = l.reset(None, facts());
        assert_eq!(closed.rows[0].requests, 1);
        let r = l.snapshot(facts());
        assert!(r.rows.is_empty());
        assert_eq!(r.run.benchmark_id, "one");
        l.record(rec(Phase::Profiling, Some((1, 0)), None, None));
        let mut other = rec(Phase::Profiling, Some((1, 0)), None, None);
        other.benchmark_id = Some("two".into());
        l.record(other);
        let r = l.snapshot(facts());
        assert_eq!(r.run.benchmark_id, "two");
        assert_eq!(r.rows[0].requests, 1);
    }

    #[test]
    fn the_time_line_widens_instead_of_growing() {
        let l = RunLedger::new(Metrics::new(), "b".into());
        {
            let mut g = l.lock();
            let (run, _) = &mut *g;
            for s in 0..1000u64 {
                let r = rec(Phase::Profiling, Some((10, 5)), None, None);
                add_to_timeline(run, Phase::Profiling, Duration::from_secs(s), &r);
            }
        }
        let t = l.snapshot(facts()).timeline;
        assert_eq!(t.bucket_s, 8.0);
        assert!(t.buckets.len() <= MAX_BUCKETS);
        assert_eq!(t.buckets.iter().map(|b| b.requests).sum::<u64>(), 1000);
        assert_eq!(t.buckets[0].predicted_cached, 40);
    }

    #[test]
    fn rfc3339_dates() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_178_707_123);
        assert_eq!(rfc3339(t), "2026-12-02T02:31:47.123Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }
}
