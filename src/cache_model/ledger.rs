//! One run's counting: per phase × target, what was sent, what the upstream said and what the
//! model predicted, the client's summary measured on the wire (latencies, throughput, errors),
//! and a time line from the run's start. Fed one finished request at a time
//! ([`Acc::record`]); read as a [`crate::report::Report`] by [`super::runs`]. Owns the counting
//! only; never tokenizes, never does I/O.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use crate::cachebust::{Phase, Target};
use crate::report::verdict::BreachTokens;
use crate::report::{self, Breaches, Bucket, Pair, Reuse, Row, Stats, Timeline};
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
    /// Tokens of the hit past the isolation point, by whose blocks they were.
    pub breach_tokens: BreachTokens,
    /// This request cut its session's context back to an earlier point (agentic compaction).
    pub compaction: bool,
}

/// What the response said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub tokens: Tokens,
    pub ttft: Option<Duration>,
    /// A 2xx response whose body ended normally.
    pub complete: bool,
    /// Streamed events that carried generated content (the output length when the server
    /// reported no usage).
    pub content_events: u64,
    /// When the response ended (or was cut off).
    pub ended: Option<Instant>,
    /// Why a body ended early (`client_disconnect`, `upstream_error`, ...).
    pub aborted: Option<&'static str>,
    /// The gaps between a stream's content events, milliseconds (inter-token latency).
    pub gaps_ms: Vec<f32>,
}

/// Who a failed request's failure belongs to (the report's `errors.by_side`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Upstream,
    Kvbust,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
            Side::Kvbust => "kvbust",
        }
    }
}

/// A request that failed: its status (or `aborted`) and whose fault it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: String,
    pub side: Side,
}

/// One finished request.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub at: Option<Instant>,
    pub phase: Option<Phase>,
    pub target: Option<Target>,
    pub prediction: Option<Prediction>,
    pub outcome: Option<Outcome>,
    /// The request failed before or instead of a successful response.
    pub failure: Option<Failure>,
    /// The request was handed to the model; with no prediction, why it was not modelled.
    pub submitted: bool,
    pub unaccounted: Option<&'static str>,
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

impl Record {
    /// The failure this record stands for: one set outright, else a response that did not end
    /// well (an error status, a body cut off).
    fn failed(&self) -> Option<Failure> {
        if let Some(f) = &self.failure {
            return Some(f.clone());
        }
        let o = self.outcome.as_ref()?;
        if o.complete {
            return None;
        }
        let side = match o.aborted {
            Some("client_disconnect") => Side::Client,
            _ => Side::Upstream,
        };
        Some(Failure {
            status: "aborted".into(),
            side,
        })
    }
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

/// A latency's summary: the histogram for quantiles (within 2%), exact count, sum, squares,
/// least and most. Bounded whatever the number of samples.
#[derive(Debug, Clone, Default)]
struct Summary {
    hist: LogHistogram,
    sum: f64,
    squares: f64,
    min: f64,
    max: f64,
}

impl Summary {
    fn add(&mut self, ms: f64) {
        if !ms.is_finite() {
            return;
        }
        if self.hist.n == 0 || ms < self.min {
            self.min = ms;
        }
        if self.hist.n == 0 || ms > self.max {
            self.max = ms;
        }
        self.hist.add(ms);
        self.sum += ms;
        self.squares += ms * ms;
    }

    fn stats(&self) -> Stats {
        let n = self.hist.n;
        if n == 0 {
            return Stats::default();
        }
        let avg = self.sum / n as f64;
        // Population deviation, as numpy's std (AIPerf, vLLM) computes it.
        let var = (self.squares / n as f64 - avg * avg).max(0.0);
        let q = |p| self.hist.quantile(p).map(|v| v.clamp(self.min, self.max));
        Stats {
            count: n,
            avg: Some(avg),
            min: Some(self.min),
            max: Some(self.max),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            std: Some(var.sqrt()),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct RowAcc {
    row: Row,
    ttft: Summary,
    itl: Summary,
    tpot: Summary,
    e2e: Summary,
    first_at: Option<Instant>,
    last_end: Option<Instant>,
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

/// One run's figures, accumulating.
#[derive(Debug, Clone)]
pub struct Acc {
    started: Instant,
    rows: BTreeMap<(usize, usize), RowAcc>,
    bucket: Duration,
    /// Per phase (warmup, profiling).
    timeline: [Vec<BucketAcc>; 2],
    breach_tokens: BreachTokens,
    /// Requests handed to the model that it did not account for, by reason.
    unaccounted: BTreeMap<&'static str, u64>,
}

/// Whether the upstream reports cached tokens (process-wide: a new run does not forget it).
#[derive(Debug, Default)]
pub struct Silence {
    pub with_usage: u64,
    pub reported: bool,
    pub warned: bool,
}

impl Silence {
    /// Notes one response; `Some(true)` the first time a cached-token field is seen, `Some(false)`
    /// when the upstream is first judged silent (the caller sets the metric and warns).
    pub fn watch(&mut self, o: &Outcome) -> Option<bool> {
        if !o.complete || o.tokens.prompt.is_none() {
            return None;
        }
        self.with_usage += 1;
        if o.tokens.cached.is_some() {
            let first = !self.reported;
            self.reported = true;
            return first.then_some(true);
        }
        if !self.reported && !self.warned && self.with_usage >= SILENT_AFTER {
            self.warned = true;
            return Some(false);
        }
        None
    }

    pub fn facts(&self) -> report::UpstreamFacts {
        report::UpstreamFacts {
            reports_cached_tokens: if self.reported {
                Some(true)
            } else if self.with_usage >= SILENT_AFTER {
                Some(false)
            } else {
                None
            },
            responses_with_usage: self.with_usage,
            hint: (!self.reported && self.with_usage >= SILENT_AFTER)
                .then(|| CACHED_TOKENS_HINT.to_string()),
        }
    }
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

impl Acc {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            rows: BTreeMap::new(),
            bucket: Duration::from_secs(1),
            timeline: [Vec::new(), Vec::new()],
            breach_tokens: BreachTokens::default(),
            unaccounted: BTreeMap::new(),
        }
    }

    /// Counts one finished request; returns the divergence direction when the upstream's
    /// cached tokens differ from the prediction (for the metric).
    pub fn record(&mut self, r: &Record) -> Option<&'static str> {
        let (phase, target) = (r.phase?, r.target?);
        if r.submitted && r.prediction.is_none() {
            *self
                .unaccounted
                .entry(r.unaccounted.unwrap_or("not_modelled"))
                .or_default() += 1;
        }
        if let Some(p) = &r.prediction {
            self.breach_tokens.cross_session += p.breach_tokens.cross_session;
            self.breach_tokens.warmup_reuse += p.breach_tokens.warmup_reuse;
        }
        let acc = self
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
        let divergence = count_row(acc, r);
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
        let at = r.at.map_or(Duration::ZERO, |t| {
            t.saturating_duration_since(self.started)
        });
        add_to_timeline(self, phase, at, r);
        divergence
    }

    /// Whether no request was counted.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Requests handed to the model that it did not account for, by reason.
    pub fn unaccounted(&self) -> &BTreeMap<&'static str, u64> {
        &self.unaccounted
    }

    /// The rows, the verdict and the time line as the report shows them.
    pub fn figures(&self) -> (Vec<Row>, report::Verdict, Timeline) {
        let rows: Vec<Row> = self.rows.values().map(finish_row).collect();
        let verdict = report::verdict::judge(&rows, self.breach_tokens);
        (rows, verdict, timeline(self))
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
    if let Some(at) = r.at {
        acc.first_at = Some(acc.first_at.map_or(at, |f| f.min(at)));
    }
    if let Some(p) = &r.prediction {
        let row = &mut acc.row;
        row.accounted_requests += 1;
        row.prompt_tokens.predicted += p.prompt_tokens;
        row.cached_tokens.predicted += p.cached;
        row.reuse.same_session += p.reuse.same_session;
        row.reuse.other_session += p.reuse.other_session;
        row.reuse.warmup += p.reuse.warmup;
        row.compactions += u64::from(p.compaction);
        for b in &p.breaches {
            attribution::count(&mut row.breaches, *b);
        }
    }
    if let Some(f) = r.failed() {
        let e = &mut acc.row.errors;
        e.count += 1;
        *e.by_status.entry(f.status).or_default() += 1;
        *e.by_side.entry(f.side.as_str().into()).or_default() += 1;
    }
    let o = r.outcome.as_ref()?;
    if let Some(end) = o.ended {
        acc.last_end = Some(acc.last_end.map_or(end, |l| l.max(end)));
    }
    if o.complete && r.failure.is_none() {
        count_success(acc, r.at, o);
    }
    let row = &mut acc.row;
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

/// A successful request's latencies and output, as a client's summary counts them: TTFT to
/// the first content, ITL every gap between content events, TPOT (e2e - TTFT) / (output - 1)
/// per request with more than one output token, e2e arrival to end.
fn count_success(acc: &mut RowAcc, at: Option<Instant>, o: &Outcome) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let output = o.tokens.completion.unwrap_or(o.content_events);
    let t = &mut acc.row.throughput;
    t.successful_requests += 1;
    t.output_tokens += output;
    if let Some(ttft) = o.ttft {
        acc.ttft.add(ms(ttft));
    }
    for g in &o.gaps_ms {
        acc.itl.add(f64::from(*g));
    }
    let e2e = at.zip(o.ended).map(|(a, e)| e.saturating_duration_since(a));
    if let Some(e2e) = e2e {
        acc.e2e.add(ms(e2e));
        if let (Some(ttft), true) = (o.ttft, output > 1) {
            acc.tpot
                .add(ms(e2e.saturating_sub(ttft)) / (output - 1) as f64);
        }
    }
}

fn add_reported(pair: &mut Pair, v: Option<u64>) {
    if let Some(v) = v {
        pair.reported = Some(pair.reported.unwrap_or(0) + v);
    }
}

fn finish_row(acc: &RowAcc) -> Row {
    let mut row = acc.row.clone();
    row.latency = report::Latency {
        ttft_ms: acc.ttft.stats(),
        itl_ms: acc.itl.stats(),
        tpot_ms: acc.tpot.stats(),
        e2e_ms: acc.e2e.stats(),
    };
    let t = &mut row.throughput;
    if let (Some(a), Some(b)) = (acc.first_at, acc.last_end) {
        t.duration_s = b.saturating_duration_since(a).as_secs_f64();
    }
    if t.duration_s > 0.0 {
        t.requests_per_s = Some(t.successful_requests as f64 / t.duration_s);
        t.output_tokens_per_s = Some(t.output_tokens as f64 / t.duration_s);
    }
    row
}

fn add_to_timeline(run: &mut Acc, phase: Phase, at: Duration, r: &Record) {
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

fn timeline(run: &Acc) -> Timeline {
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
