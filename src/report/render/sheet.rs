//! What every format shows, decided once: the run's facts, one line of cells per phase × target
//! (text and the exact figure behind it), and the notes a person must not miss (a silent
//! upstream, the shared-cache assumption, unaccounted requests, breaches). Never lays anything
//! out: the table, markdown and HTML renderers do.

use super::{duration, int, ms, pct};
use crate::report::{Report, Row};

/// A column of the rows, in display order ([`Col::ALL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Col {
    Phase,
    Target,
    Requests,
    PromptReported,
    PromptCounted,
    CachedReported,
    CachedPredicted,
    HitReported,
    HitPredicted,
    ReuseSame,
    ReuseOther,
    ReuseWarmup,
    Breaches,
    Divergent,
    TtftP50,
    TtftP99,
}

impl Col {
    pub(crate) const ALL: [Col; 16] = [
        Col::Phase,
        Col::Target,
        Col::Requests,
        Col::PromptReported,
        Col::PromptCounted,
        Col::CachedReported,
        Col::CachedPredicted,
        Col::HitReported,
        Col::HitPredicted,
        Col::ReuseSame,
        Col::ReuseOther,
        Col::ReuseWarmup,
        Col::Breaches,
        Col::Divergent,
        Col::TtftP50,
        Col::TtftP99,
    ];

    /// A stable name for machines (the HTML page's `data-col`).
    pub(crate) fn key(self) -> &'static str {
        match self {
            Col::Phase => "phase",
            Col::Target => "target",
            Col::Requests => "requests",
            Col::PromptReported => "prompt_reported",
            Col::PromptCounted => "prompt_counted",
            Col::CachedReported => "cached_reported",
            Col::CachedPredicted => "cached_predicted",
            Col::HitReported => "hit_reported",
            Col::HitPredicted => "hit_predicted",
            Col::ReuseSame => "reuse_same_session",
            Col::ReuseOther => "reuse_other_session",
            Col::ReuseWarmup => "reuse_warmup",
            Col::Breaches => "breaches",
            Col::Divergent => "divergent",
            Col::TtftP50 => "ttft_p50_ms",
            Col::TtftP99 => "ttft_p99_ms",
        }
    }

    /// The heading over a run of columns ("" for none), and the column's own heading.
    pub(crate) fn heading(self) -> (&'static str, &'static str) {
        match self {
            Col::Phase => ("", "phase"),
            Col::Target => ("", "target"),
            Col::Requests => ("requests", "accounted/all"),
            Col::PromptReported => ("prompt tokens", "reported"),
            Col::PromptCounted => ("prompt tokens", "counted"),
            Col::CachedReported => ("cached tokens", "reported"),
            Col::CachedPredicted => ("cached tokens", "predicted"),
            Col::HitReported => ("hit rate", "reported"),
            Col::HitPredicted => ("hit rate", "predicted"),
            Col::ReuseSame => ("predicted reuse from", "same session"),
            Col::ReuseOther => ("predicted reuse from", "other session"),
            Col::ReuseWarmup => ("predicted reuse from", "warmup"),
            Col::Breaches => ("", "breaches"),
            Col::Divergent => ("", "divergent"),
            Col::TtftP50 => ("TTFT ms", "p50"),
            Col::TtftP99 => ("TTFT ms", "p99"),
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

/// The whole report, ready to lay out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sheet {
    pub facts: Vec<Fact>,
    pub lines: Vec<Line>,
    pub notes: Vec<Note>,
}

impl Sheet {
    pub(crate) fn of(r: &Report) -> Sheet {
        Sheet {
            facts: facts(r),
            lines: r.rows.iter().map(line).collect(),
            notes: notes(r),
        }
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
    let cells = Col::ALL
        .iter()
        .map(|c| match c {
            Col::Phase => Cell::name(&row.phase),
            Col::Target => Cell::name(&row.target),
            Col::Requests => requests.clone(),
            Col::PromptReported => opt_count(row.prompt_tokens.reported),
            Col::PromptCounted => Cell::count(row.prompt_tokens.predicted),
            Col::CachedReported => opt_count(row.cached_tokens.reported),
            Col::CachedPredicted => Cell::count(row.cached_tokens.predicted),
            Col::HitReported => Cell::maybe(row.reported_hit_rate(), pct),
            Col::HitPredicted => Cell::maybe(row.predicted_hit_rate(), pct),
            Col::ReuseSame => Cell::count(row.reuse.same_session),
            Col::ReuseOther => Cell::count(row.reuse.other_session),
            Col::ReuseWarmup => Cell::count(row.reuse.warmup),
            Col::Breaches => flag(row.breaches.total(), Tone::Bad),
            Col::Divergent => flag(row.divergent_requests, Tone::Warn),
            Col::TtftP50 => Cell::maybe(row.latency.ttft_ms.p50, ms),
            Col::TtftP99 => Cell::maybe(row.latency.ttft_ms.p99, ms),
        })
        .collect();
    Line {
        phase: row.phase.clone(),
        target: row.target.clone(),
        cells,
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
    vec![
        fact("benchmark_id", "benchmark", r.run.benchmark_id.clone()),
        fact("started_at", "run started", r.run.started_at.clone()),
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
    ]
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
        let reasons: Vec<String> = r
            .cache_model
            .unaccounted
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(why, n)| format!("{} {why}", int(*n)))
            .collect();
        note(
            "unaccounted",
            Tone::Warn,
            format!(
                "{} requests unaccounted by the cache model ({}): predictions leave them out",
                int(unaccounted),
                reasons.join(", ")
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
    notes
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
    }

    #[test]
    fn an_empty_run_says_so() {
        let s = Sheet::of(&fixtures::empty());
        assert!(s.lines.is_empty());
        assert_eq!(s.notes[0].key, "empty");
    }
}
