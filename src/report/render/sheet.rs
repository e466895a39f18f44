//! What every format shows, decided once: the run's facts, one line of cells per phase × target
//! (text and the exact figure behind it), and the notes a person must not miss (a silent
//! upstream, the shared-cache assumption, unaccounted requests, breaches). Never lays anything
//! out: the table, markdown and HTML renderers do.

use super::{duration, int, ms, pct, per_s, ratio};
use crate::report::{Isolation, Report, Row, Verdict};

/// A column of the rows, in the order of [`Col::ALL`]; each view ([`Col::TERMINAL`],
/// [`Col::CACHE`], [`Col::CLIENT`]) shows some of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Col {
    Phase,
    Target,
    Requests,
    Ok,
    Errors,
    PromptReported,
    PromptCounted,
    CachedReported,
    CachedPredicted,
    Dial,
    HitReported,
    HitPredicted,
    ReuseSame,
    ReuseOther,
    ReuseWarmup,
    Breaches,
    Compactions,
    Divergent,
    RequestsPerS,
    TokensPerS,
    TtftAvg,
    TtftP50,
    TtftP90,
    TtftP99,
    ItlAvg,
    ItlP50,
    ItlP99,
    TpotAvg,
    TpotP50,
    TpotP99,
    E2eAvg,
    E2eP50,
    E2eP90,
    E2eP99,
}

impl Col {
    pub(crate) const ALL: [Col; 34] = [
        Col::Phase,
        Col::Target,
        Col::Requests,
        Col::Ok,
        Col::Errors,
        Col::PromptReported,
        Col::PromptCounted,
        Col::CachedReported,
        Col::CachedPredicted,
        Col::Dial,
        Col::HitReported,
        Col::HitPredicted,
        Col::ReuseSame,
        Col::ReuseOther,
        Col::ReuseWarmup,
        Col::Breaches,
        Col::Compactions,
        Col::Divergent,
        Col::RequestsPerS,
        Col::TokensPerS,
        Col::TtftAvg,
        Col::TtftP50,
        Col::TtftP90,
        Col::TtftP99,
        Col::ItlAvg,
        Col::ItlP50,
        Col::ItlP99,
        Col::TpotAvg,
        Col::TpotP50,
        Col::TpotP99,
        Col::E2eAvg,
        Col::E2eP50,
        Col::E2eP90,
        Col::E2eP99,
    ];

    /// What a terminal shows: the key figures of both views, narrow enough for a laptop's
    /// terminal (the markdown and HTML forms show every column). [`Col::Dial`] only when a
    /// row ran under the dial ([`Sheet::view`]).
    pub(crate) const TERMINAL: [Col; 14] = [
        Col::Phase,
        Col::Target,
        Col::Requests,
        Col::Errors,
        Col::Dial,
        Col::HitReported,
        Col::HitPredicted,
        Col::Breaches,
        Col::TtftP50,
        Col::TtftP99,
        Col::ItlP50,
        Col::E2eP50,
        Col::RequestsPerS,
        Col::TokensPerS,
    ];

    /// The cache's view: tokens, hit rates (beside the dial, when one was set), reuse and
    /// isolation.
    pub(crate) const CACHE: [Col; 16] = [
        Col::Phase,
        Col::Target,
        Col::Requests,
        Col::PromptReported,
        Col::PromptCounted,
        Col::CachedReported,
        Col::CachedPredicted,
        Col::Dial,
        Col::HitReported,
        Col::HitPredicted,
        Col::ReuseSame,
        Col::ReuseOther,
        Col::ReuseWarmup,
        Col::Breaches,
        Col::Compactions,
        Col::Divergent,
    ];

    /// A client's summary, measured on the wire: outcomes, throughput, latencies.
    pub(crate) const CLIENT: [Col; 20] = [
        Col::Phase,
        Col::Target,
        Col::Ok,
        Col::Errors,
        Col::RequestsPerS,
        Col::TokensPerS,
        Col::TtftAvg,
        Col::TtftP50,
        Col::TtftP90,
        Col::TtftP99,
        Col::ItlAvg,
        Col::ItlP50,
        Col::ItlP99,
        Col::TpotAvg,
        Col::TpotP50,
        Col::TpotP99,
        Col::E2eAvg,
        Col::E2eP50,
        Col::E2eP90,
        Col::E2eP99,
    ];

    /// The column's place in [`Col::ALL`] (and in a line's cells).
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// A stable name for machines (the HTML page's `data-col`).
    pub(crate) fn key(self) -> &'static str {
        match self {
            Col::Phase => "phase",
            Col::Target => "target",
            Col::Requests => "requests",
            Col::Ok => "ok",
            Col::Errors => "errors",
            Col::PromptReported => "prompt_reported",
            Col::PromptCounted => "prompt_counted",
            Col::CachedReported => "cached_reported",
            Col::CachedPredicted => "cached_predicted",
            Col::Dial => "hit_ratio",
            Col::HitReported => "hit_reported",
            Col::HitPredicted => "hit_predicted",
            Col::ReuseSame => "reuse_same_session",
            Col::ReuseOther => "reuse_other_session",
            Col::ReuseWarmup => "reuse_warmup",
            Col::Breaches => "breaches",
            Col::Compactions => "compactions",
            Col::Divergent => "divergent",
            Col::RequestsPerS => "requests_per_s",
            Col::TokensPerS => "output_tokens_per_s",
            Col::TtftAvg => "ttft_avg_ms",
            Col::TtftP50 => "ttft_p50_ms",
            Col::TtftP90 => "ttft_p90_ms",
            Col::TtftP99 => "ttft_p99_ms",
            Col::ItlAvg => "itl_avg_ms",
            Col::ItlP50 => "itl_p50_ms",
            Col::ItlP99 => "itl_p99_ms",
            Col::TpotAvg => "tpot_avg_ms",
            Col::TpotP50 => "tpot_p50_ms",
            Col::TpotP99 => "tpot_p99_ms",
            Col::E2eAvg => "e2e_avg_ms",
            Col::E2eP50 => "e2e_p50_ms",
            Col::E2eP90 => "e2e_p90_ms",
            Col::E2eP99 => "e2e_p99_ms",
        }
    }

    /// The heading over a run of columns ("" for none), and the column's own heading.
    pub(crate) fn heading(self) -> (&'static str, &'static str) {
        match self {
            Col::Phase => ("", "phase"),
            Col::Target => ("", "target"),
            // Spaced, so a narrow page may break the heading over two lines.
            Col::Requests => ("requests", "accounted / all"),
            Col::Ok => ("", "ok"),
            Col::Errors => ("", "errors"),
            Col::PromptReported => ("prompt tokens", "reported"),
            Col::PromptCounted => ("prompt tokens", "counted"),
            Col::CachedReported => ("cached tokens", "reported"),
            Col::CachedPredicted => ("cached tokens", "predicted"),
            // The dial leads its hit-rate group: what was asked, then what came.
            Col::Dial => ("hit rate", "dial"),
            Col::HitReported => ("hit rate", "reported"),
            Col::HitPredicted => ("hit rate", "predicted"),
            Col::ReuseSame => ("predicted reuse from", "same session"),
            Col::ReuseOther => ("predicted reuse from", "other session"),
            Col::ReuseWarmup => ("predicted reuse from", "warmup"),
            Col::Breaches => ("", "breaches"),
            Col::Compactions => ("", "compactions"),
            Col::Divergent => ("", "divergent"),
            Col::RequestsPerS => ("per second", "req"),
            Col::TokensPerS => ("per second", "out tok"),
            Col::TtftAvg => ("TTFT ms", "avg"),
            Col::TtftP50 => ("TTFT ms", "p50"),
            Col::TtftP90 => ("TTFT ms", "p90"),
            Col::TtftP99 => ("TTFT ms", "p99"),
            Col::ItlAvg => ("ITL ms", "avg"),
            Col::ItlP50 => ("ITL ms", "p50"),
            Col::ItlP99 => ("ITL ms", "p99"),
            Col::TpotAvg => ("TPOT ms", "avg"),
            Col::TpotP50 => ("TPOT ms", "p50"),
            Col::TpotP99 => ("TPOT ms", "p99"),
            Col::E2eAvg => ("e2e ms", "avg"),
            Col::E2eP50 => ("e2e ms", "p50"),
            Col::E2eP90 => ("e2e ms", "p90"),
            Col::E2eP99 => ("e2e ms", "p99"),
        }
    }

    /// [`Col::heading`] in the terminal's narrower grouping: ITL and e2e under one "p50 ms".
    pub(crate) fn terminal_heading(self) -> (&'static str, &'static str) {
        match self {
            Col::Requests => ("requests", "accounted/all"),
            Col::ItlP50 => ("p50 ms", "ITL"),
            Col::E2eP50 => ("p50 ms", "e2e"),
            c => c.heading(),
        }
    }

    /// Numbers align right; names left.
    pub(crate) fn numeric(self) -> bool {
        !matches!(self, Col::Phase | Col::Target)
    }
}

/// How a cell or note should stand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tone {
    Plain,
    /// Nothing to show (`-`): dimmed.
    Missing,
    /// Worth a look (a silent upstream, unaccounted requests).
    Warn,
    /// Wrong (breaches).
    Bad,
}

/// One cell: what a person reads, and the exact figure behind it (hit rates as 0..=1).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cell {
    pub text: String,
    pub value: Option<f64>,
    pub tone: Tone,
}

impl Cell {
    fn name(s: &str) -> Cell {
        Cell {
            text: s.to_string(),
            value: None,
            tone: Tone::Plain,
        }
    }

    fn count(n: u64) -> Cell {
        Cell {
            text: int(n),
            value: Some(n as f64),
            tone: Tone::Plain,
        }
    }

    fn missing() -> Cell {
        Cell {
            text: "-".into(),
            value: None,
            tone: Tone::Missing,
        }
    }

    fn maybe(v: Option<f64>, show: fn(f64) -> String) -> Cell {
        v.map_or_else(Cell::missing, |v| Cell {
            text: show(v),
            value: Some(v),
            tone: Tone::Plain,
        })
    }
}

/// One phase × target.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Line {
    pub phase: String,
    pub target: String,
    /// In [`Col::ALL`] order.
    pub cells: Vec<Cell>,
}

impl Line {
    pub(crate) fn cell(&self, c: Col) -> &Cell {
        &self.cells[c.index()]
    }
}

/// A labelled fact about the run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fact {
    pub key: &'static str,
    pub label: &'static str,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Note {
    pub key: &'static str,
    pub tone: Tone,
    pub text: String,
}

/// The verdict: the sentence every form opens with, and how it should stand out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Headline {
    /// `held`, `breached`, `not_requested`.
    pub key: &'static str,
    pub tone: Tone,
    pub text: String,
}

/// The whole report, ready to lay out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sheet {
    pub verdict: Headline,
    pub facts: Vec<Fact>,
    pub lines: Vec<Line>,
    pub notes: Vec<Note>,
    /// Some row ran under the cache-hit dial: only then is [`Col::Dial`] shown.
    pub dialled: bool,
}

impl Sheet {
    pub(crate) fn of(r: &Report) -> Sheet {
        Sheet {
            verdict: headline(r),
            facts: facts(r),
            lines: r.rows.iter().map(line).collect(),
            notes: notes(r),
            dialled: r.rows.iter().any(dialled),
        }
    }

    /// The columns of `view` this report shows: all of them but [`Col::Dial`] when no row ran
    /// under the dial (a column of dashes in every report without one says nothing).
    pub(crate) fn view(&self, view: &[Col]) -> Vec<Col> {
        view.iter()
            .copied()
            .filter(|c| *c != Col::Dial || self.dialled)
            .collect()
    }
}

/// Whether some request of `row` ran under the dial.
fn dialled(row: &Row) -> bool {
    row.dial().is_some()
}

/// The dial a row ran under, as set (`0.25`); a warning tone when only some of its requests
/// did, since its hit rates then mix dialled and undialled requests (a note says how many).
fn dial(row: &Row) -> Cell {
    match row.dial() {
        Some(r) => Cell {
            text: ratio(r),
            value: Some(r),
            tone: if row.dialled_requests < row.requests {
                Tone::Warn
            } else {
                Tone::Plain
            },
        },
        None => Cell::missing(),
    }
}

fn line(row: &Row) -> Line {
    let requests = Cell {
        text: format!("{}/{}", int(row.accounted_requests), int(row.requests)),
        value: Some(row.requests as f64),
        tone: if row.accounted_requests < row.requests {
            Tone::Warn
        } else {
            Tone::Plain
        },
    };
    let opt_count = |v: Option<u64>| v.map_or_else(Cell::missing, Cell::count);
    let flag = |n: u64, tone: Tone| Cell {
        tone: if n > 0 { tone } else { Tone::Plain },
        ..Cell::count(n)
    };
    let lat = &row.latency;
    let cells = Col::ALL
        .iter()
        .map(|c| match c {
            Col::Phase => Cell::name(&row.phase),
            Col::Target => Cell::name(&row.target),
            Col::Requests => requests.clone(),
            Col::Ok => Cell::count(row.throughput.successful_requests),
            Col::Errors => flag(row.errors.count, Tone::Warn),
            Col::PromptReported => opt_count(row.prompt_tokens.reported),
            Col::PromptCounted => Cell::count(row.prompt_tokens.predicted),
            Col::CachedReported => opt_count(row.cached_tokens.reported),
            Col::CachedPredicted => Cell::count(row.cached_tokens.predicted),
            Col::Dial => dial(row),
            Col::HitReported => Cell::maybe(row.reported_hit_rate(), pct),
            Col::HitPredicted => Cell::maybe(row.predicted_hit_rate(), pct),
            Col::ReuseSame => Cell::count(row.reuse.same_session),
            Col::ReuseOther => Cell::count(row.reuse.other_session),
            Col::ReuseWarmup => Cell::count(row.reuse.warmup),
            Col::Breaches => flag(row.breaches.total(), Tone::Bad),
            Col::Compactions => Cell::count(row.compactions),
            Col::Divergent => flag(row.divergent_requests, Tone::Warn),
            Col::RequestsPerS => Cell::maybe(row.throughput.requests_per_s, per_s),
            Col::TokensPerS => Cell::maybe(row.throughput.output_tokens_per_s, per_s),
            Col::TtftAvg => Cell::maybe(lat.ttft_ms.avg, ms),
            Col::TtftP50 => Cell::maybe(lat.ttft_ms.p50, ms),
            Col::TtftP90 => Cell::maybe(lat.ttft_ms.p90, ms),
            Col::TtftP99 => Cell::maybe(lat.ttft_ms.p99, ms),
            Col::ItlAvg => Cell::maybe(lat.itl_ms.avg, ms),
            Col::ItlP50 => Cell::maybe(lat.itl_ms.p50, ms),
            Col::ItlP99 => Cell::maybe(lat.itl_ms.p99, ms),
            Col::TpotAvg => Cell::maybe(lat.tpot_ms.avg, ms),
            Col::TpotP50 => Cell::maybe(lat.tpot_ms.p50, ms),
            Col::TpotP99 => Cell::maybe(lat.tpot_ms.p99, ms),
            Col::E2eAvg => Cell::maybe(lat.e2e_ms.avg, ms),
            Col::E2eP50 => Cell::maybe(lat.e2e_ms.p50, ms),
            Col::E2eP90 => Cell::maybe(lat.e2e_ms.p90, ms),
            Col::E2eP99 => Cell::maybe(lat.e2e_ms.p99, ms),
        })
        .collect();
    Line {
        phase: row.phase.clone(),
        target: row.target.clone(),
        cells,
    }
}

/// The verdict's sentence and tone: a breach is bad; warmup's cache serving profiling without
/// isolation is worth a look, unless every profiling request ran under the dial, which asked
/// for exactly that; isolation held is plain.
pub(crate) fn headline(r: &Report) -> Headline {
    let v = &r.verdict;
    let profiling: Vec<&Row> = r.rows.iter().filter(|w| w.phase == "profiling").collect();
    let dial_asked = !profiling.is_empty()
        && profiling
            .iter()
            .all(|w| dialled(w) && w.dialled_requests == w.requests);
    let tone = match v.isolation {
        Isolation::Held => Tone::Plain,
        Isolation::Breached => Tone::Bad,
        Isolation::NotRequested if dial_asked => Tone::Plain,
        Isolation::NotRequested if v.warmup_share.is_some_and(|s| s > 0.0) => Tone::Warn,
        Isolation::NotRequested => Tone::Plain,
    };
    Headline {
        key: v.isolation.as_str(),
        tone,
        text: verdict_sentence(v),
    }
}

/// The server's sentence; one made from the figures when it sent none.
pub(crate) fn verdict_sentence(v: &Verdict) -> String {
    let message = v.message.trim();
    if !message.is_empty() {
        return message.to_string();
    }
    match v.isolation {
        Isolation::Held => "isolation held: no profiling token came from warmup's blocks past \
                            the isolation point, none from another session's"
            .into(),
        Isolation::Breached => format!(
            "isolation breached: {} prompt tokens from warmup's blocks and {} from other \
             sessions' past the isolation point",
            int(v.reused_from_warmup_tokens),
            int(v.cross_session_tokens)
        ),
        Isolation::NotRequested => match v.warmup_share {
            Some(share) => format!(
                "isolation not requested (target none): {} of profiling prompt tokens were \
                 served from warmup's cache",
                pct(share)
            ),
            None => "isolation not requested (target none)".into(),
        },
    }
}

fn facts(r: &Report) -> Vec<Fact> {
    let m = &r.cache_model;
    let model = if m.enabled {
        format!(
            "tokenizer {}, block size {} tokens, chat template {}, topology {}",
            m.tokenizer, m.block_size, m.chat_template, m.topology
        )
    } else {
        "disabled (cache_model.enabled = false): no predictions".to_string()
    };
    let capacity = if m.capacity_blocks == 0 {
        format!("bounded by max_memory ({} bytes)", int(m.max_memory))
    } else {
        format!("{} blocks", int(m.capacity_blocks))
    };
    let u = &r.upstream;
    let upstream = match u.reports_cached_tokens {
        Some(true) => "reports cached tokens",
        Some(false) => "does not report cached tokens",
        None => "not yet known whether it reports cached tokens",
    };
    let fact = |key, label, text: String| Fact { key, label, text };
    let ended = match &r.run.ended_at {
        Some(at) => at.clone(),
        None => "open".to_string(),
    };
    let mut out = vec![
        fact("run", "run", r.run.name.clone()),
        fact("benchmark_id", "benchmark", r.run.benchmark_id.clone()),
        fact("started_at", "run started", r.run.started_at.clone()),
        fact("ended_at", "run ended", ended),
        fact("elapsed", "elapsed", duration(r.run.elapsed_s)),
        fact("generated_at", "report taken", r.run.generated_at.clone()),
        fact("cache_model", "cache model", model),
        fact(
            "index",
            "model index",
            format!(
                "{} blocks indexed, {} evicted; capacity {capacity}",
                int(m.indexed_blocks),
                int(m.evicted_blocks)
            ),
        ),
        fact(
            "upstream",
            "upstream",
            format!(
                "{upstream} ({} responses with usage)",
                int(u.responses_with_usage)
            ),
        ),
    ];
    if let Some(command) = &r.run.command {
        out.push(fact("command", "command", command.join(" ")));
    }
    out
}

fn notes(r: &Report) -> Vec<Note> {
    let mut notes = Vec::new();
    let mut note = |key, tone, text: String| notes.push(Note { key, tone, text });
    if r.rows.is_empty() {
        note(
            "empty",
            Tone::Plain,
            "no generation requests in this run yet".into(),
        );
    }
    if r.upstream.reports_cached_tokens == Some(false) {
        let hint = r.upstream.hint.as_deref().unwrap_or(
            "turn on the engine's cached-token report (vLLM: --enable-prompt-tokens-details; \
             SGLang: --enable-cache-report)",
        );
        note(
            "upstream_silent",
            Tone::Warn,
            format!(
                "the upstream does not report cached tokens, so only predictions are shown: {hint}"
            ),
        );
    }
    if let Some(n) = &r.cache_model.note {
        note("assumption", Tone::Warn, n.clone());
    }
    let unaccounted: u64 = r.cache_model.unaccounted.values().sum();
    if unaccounted > 0 {
        note(
            "unaccounted",
            Tone::Warn,
            format!(
                "{} requests unaccounted by the cache model ({}): predictions leave them out",
                int(unaccounted),
                counts(&r.cache_model.unaccounted)
            ),
        );
    }
    run_notes(r, &mut notes);
    row_notes(r, &mut notes);
    notes
}

/// `3 queue_full, 1 too_large`: the non-zero counts of a map.
fn counts(m: &std::collections::BTreeMap<String, u64>) -> String {
    m.iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{} {k}", int(*n)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `502: 3, aborted: 2`: the non-zero counts of a map keyed by a name that may be a number.
fn keyed(m: &std::collections::BTreeMap<String, u64>) -> String {
    m.iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k}: {}", int(*n)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An incomplete report, and what happened on the run's time line.
fn run_notes(r: &Report, notes: &mut Vec<Note>) {
    let mut note = |key, tone, text: String| notes.push(Note { key, tone, text });
    if !r.run.complete {
        let open: u64 = r.run.unaccounted.values().sum();
        note(
            "incomplete",
            Tone::Warn,
            format!(
                "the report is not complete: {} requests of the run are not in its figures ({})",
                int(open),
                counts(&r.run.unaccounted)
            ),
        );
    }
    for e in &r.run.events {
        note(
            "event",
            Tone::Plain,
            format!(
                "{} at {} from the run's start (by {})",
                e.kind.replace('_', " "),
                duration(e.at_s),
                e.by
            ),
        );
    }
}

/// Per row: its failed requests, its breaches.
fn row_notes(r: &Report, notes: &mut Vec<Note>) {
    let mut note = |key, tone, text: String| notes.push(Note { key, tone, text });
    for row in r.rows.iter().filter(|row| row.errors.count > 0) {
        note(
            "errors",
            Tone::Warn,
            format!(
                "{} failed requests in {} × {} (by status: {}; by side: {}), none counted as a success",
                int(row.errors.count),
                row.phase,
                row.target,
                keyed(&row.errors.by_status),
                keyed(&row.errors.by_side)
            ),
        );
    }
    for row in r
        .rows
        .iter()
        .filter(|row| dialled(row) && row.dialled_requests < row.requests)
    {
        note(
            "dial_partial",
            Tone::Warn,
            format!(
                "{} of {} requests in {} × {} ran under the dial ({}, their mean): the row's hit \
                 rates count the others too",
                int(row.dialled_requests),
                int(row.requests),
                row.phase,
                row.target,
                ratio(row.hit_ratio.unwrap_or_default())
            ),
        );
    }
    for row in r.rows.iter().filter(|row| row.breaches.total() > 0) {
        let b = &row.breaches;
        let kinds: Vec<String> = [
            ("cross_session", b.cross_session),
            ("warmup_reuse", b.warmup_reuse),
            ("session_collision", b.session_collision),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(kind, n)| format!("{} {kind}", int(*n)))
        .collect();
        note(
            "breaches",
            Tone::Bad,
            format!(
                "isolation breached in {} × {}: {} (the log names each session and the fix)",
                row.phase,
                row.target,
                kinds.join(", ")
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render::fixtures;

    fn cell(line: &Line, col: Col) -> &Cell {
        let i = Col::ALL.iter().position(|c| *c == col).unwrap();
        &line.cells[i]
    }

    #[test]
    fn cells_carry_the_rows_figures() {
        let r = fixtures::two_phases();
        let s = Sheet::of(&r);
        assert_eq!(s.lines.len(), r.rows.len());
        for (line, row) in s.lines.iter().zip(&r.rows) {
            assert_eq!(line.cells.len(), Col::ALL.len());
            let hit = row.cached_tokens.predicted as f64 / row.prompt_tokens.predicted as f64;
            assert_eq!(cell(line, Col::HitPredicted).value, Some(hit));
            assert_eq!(
                cell(line, Col::Requests).text,
                format!("{}/{}", int(row.accounted_requests), int(row.requests))
            );
            assert_eq!(
                cell(line, Col::Breaches).value,
                Some(row.breaches.total() as f64)
            );
            assert_eq!(cell(line, Col::TtftP99).value, row.latency.ttft_ms.p99);
        }
    }

    #[test]
    fn a_silent_upstream_shows_dashes_and_its_hint() {
        let r = fixtures::silent_upstream();
        let s = Sheet::of(&r);
        for line in &s.lines {
            for col in [Col::CachedReported, Col::HitReported] {
                assert_eq!(cell(line, col).text, "-");
                assert_eq!(cell(line, col).tone, Tone::Missing);
            }
        }
        let silent = s.notes.iter().find(|n| n.key == "upstream_silent").unwrap();
        assert!(silent.text.contains(r.upstream.hint.as_deref().unwrap()));
    }

    #[test]
    fn breaches_and_unaccounted_requests_are_noted() {
        let s = Sheet::of(&fixtures::two_phases());
        let breaches: Vec<_> = s.notes.iter().filter(|n| n.key == "breaches").collect();
        assert_eq!(breaches.len(), 1);
        assert_eq!(breaches[0].tone, Tone::Bad);
        assert!(breaches[0].text.contains("3 cross_session"), "{breaches:?}");
        assert!(breaches[0].text.contains("1 session_collision"));
        assert!(!breaches[0].text.contains("warmup_reuse"));
        let un = s.notes.iter().find(|n| n.key == "unaccounted").unwrap();
        assert!(un.text.contains("12 requests"), "{}", un.text);
        assert!(
            un.text.contains("10 queue_full, 2 unparseable"),
            "{}",
            un.text
        );
        assert!(s.notes.iter().any(|n| n.key == "assumption"));
        let errors = s.notes.iter().find(|n| n.key == "errors").unwrap();
        assert_eq!(
            errors.text,
            "5 failed requests in profiling × first_turn_prefix (by status: 502: 3, aborted: 2; \
             by side: client: 2, upstream: 3), none counted as a success"
        );
    }

    #[test]
    fn an_empty_run_says_so() {
        let s = Sheet::of(&fixtures::empty());
        assert!(s.lines.is_empty());
        assert_eq!(s.notes[0].key, "empty");
    }

    /// Issue 40 (5): a row that ran under the dial shows it beside its hit rates; a row without
    /// one a dash; a report without any dialled row has no dial column at all.
    #[test]
    fn the_dial_stands_beside_the_hit_rates_only_where_one_was_set() {
        let r = fixtures::dialled();
        let s = Sheet::of(&r);
        assert!(s.dialled);
        let (warmup, profiling) = (&s.lines[0], &s.lines[1]);
        assert_eq!(cell(profiling, Col::Dial).text, "0.5");
        assert_eq!(cell(profiling, Col::Dial).value, Some(0.5));
        assert_eq!(cell(profiling, Col::Dial).tone, Tone::Plain);
        assert_eq!(
            cell(profiling, Col::HitPredicted).value,
            r.rows[1].predicted_hit_rate()
        );
        assert_eq!(
            cell(profiling, Col::HitReported).value,
            r.rows[1].reported_hit_rate()
        );
        assert_eq!(cell(warmup, Col::Dial).text, "-");
        assert_eq!(cell(warmup, Col::Dial).tone, Tone::Missing);
        let view = s.view(&Col::TERMINAL);
        let at = |c| view.iter().position(|v| *v == c).unwrap();
        assert_eq!(at(Col::Dial) + 1, at(Col::HitReported), "{view:?}");
        assert_eq!(view.len(), Col::TERMINAL.len());
        assert!(!s.notes.iter().any(|n| n.key == "dial_partial"));
        // Warmup's cache serving dialled requests is what the dial asked for: no warning.
        assert_eq!(s.verdict.tone, Tone::Plain, "{:?}", s.verdict);
        // Without a dial, no column of dashes.
        let plain = Sheet::of(&fixtures::two_phases());
        assert!(!plain.dialled);
        for v in [&Col::TERMINAL[..], &Col::CACHE, &Col::CLIENT] {
            assert!(!plain.view(v).contains(&Col::Dial));
        }
        // A dial on some requests only: a warning and a note that says how many.
        let mut r = fixtures::dialled();
        r.rows[1].dialled_requests = 20;
        r.rows[1].hit_ratio = Some(0.25);
        let s = Sheet::of(&r);
        assert_eq!(cell(&s.lines[1], Col::Dial).text, "0.25");
        assert_eq!(cell(&s.lines[1], Col::Dial).tone, Tone::Warn);
        let note = s.notes.iter().find(|n| n.key == "dial_partial").unwrap();
        assert_eq!(
            s.verdict.tone,
            Tone::Warn,
            "warmup's cache served undialled requests"
        );
        assert_eq!(
            note.text,
            "20 of 60 requests in profiling × none ran under the dial (0.25, their mean): the \
             row's hit rates count the others too"
        );
    }
}
