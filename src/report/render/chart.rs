//! The HTML page's two charts as inline SVG, from the report's timeline: hit rate per phase over
//! time (predicted, and reported where the upstream said) and mean TTFT per phase over time.
//! Axes with ticks and labels, a legend, one marked point per bucket (`data-index`,
//! `data-value`, a hover title). Pure; never scripts, never loads anything.

use std::fmt::Write as _;

use super::{duration, esc, ms, pct};
use crate::report::{Bucket, Report};

/// The drawing's size (viewBox units) and the plot area inside it.
const W: f64 = 1160.0;
const H: f64 = 330.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = W - 24.0;
const TOP: f64 = 48.0;
const BOTTOM: f64 = H - 52.0;

/// Line colours by phase: warmup amber, profiling blue, anything else from the rest.
fn colour(phase: &str, nth: usize) -> &'static str {
    const OTHERS: [&str; 4] = ["#059669", "#7c3aed", "#db2777", "#4b5563"];
    match phase {
        "warmup" => "#d97706",
        "profiling" => "#2563eb",
        _ => OTHERS[nth % OTHERS.len()],
    }
}

/// Which figure a series plots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Predicted,
    Reported,
    TtftMean,
}

impl Kind {
    fn key(self) -> &'static str {
        match self {
            Kind::Predicted => "predicted",
            Kind::Reported => "reported",
            Kind::TtftMean => "ttft_mean",
        }
    }

    fn value(self, b: &Bucket) -> Option<f64> {
        match self {
            Kind::Predicted => b.predicted_hit_rate(),
            Kind::Reported => b.reported_hit_rate(),
            Kind::TtftMean => b.ttft_ms_mean,
        }
    }

    fn show(self, v: f64) -> String {
        match self {
            Kind::Predicted | Kind::Reported => pct(v),
            Kind::TtftMean => format!("{} ms", ms(v)),
        }
    }
}

/// One line: a phase's figure over its buckets, (bucket index, value), by index.
struct Series {
    phase: String,
    nth: usize,
    kind: Kind,
    points: Vec<(u64, f64)>,
}

/// Phases in the order a person expects them: warmup, profiling, then others as they come.
fn phases(r: &Report) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let seen = r
        .rows
        .iter()
        .map(|row| row.phase.as_str())
        .chain(r.timeline.buckets.iter().map(|b| b.phase.as_str()));
    for p in seen {
        if !out.iter().any(|o| o == p) {
            out.push(p.to_string());
        }
    }
    let rank = |p: &str| match p {
        "warmup" => 0,
        "profiling" => 1,
        _ => 2,
    };
    out.sort_by_key(|p| rank(p.as_str()));
    out
}

fn series(r: &Report, kinds: &[Kind]) -> Vec<Series> {
    let mut out = Vec::new();
    for (nth, phase) in phases(r).into_iter().enumerate() {
        for &kind in kinds {
            let mut points: Vec<(u64, f64)> = r
                .timeline
                .buckets
                .iter()
                .filter(|b| b.phase == phase)
                .filter_map(|b| {
                    kind.value(b)
                        .filter(|v| v.is_finite())
                        .map(|v| (b.index, v))
                })
                .collect();
            points.sort_by_key(|p| p.0);
            // A reported line only where the upstream reported; predictions always draw.
            if kind == Kind::Reported && points.is_empty() {
                continue;
            }
            out.push(Series {
                phase: phase.clone(),
                nth,
                kind,
                points,
            });
        }
    }
    out
}

/// A step of 1, 2, 2.5 or 5 × 10^k giving about `count` ticks over `0..=max`.
pub(super) fn nice_step(max: f64, count: f64) -> f64 {
    let raw = (max / count).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let m = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .find(|m| norm <= *m)
        .unwrap_or(10.0);
    m * mag
}

/// A tick label: no trailing zeros (`2.5`, `10`).
pub(super) fn tick_label(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A tick of the hit-rate axis: `0.4` -> `40%`.
pub(super) fn percent_label(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

/// The time axis: its end in seconds, and the unit its ticks are labelled in.
struct TimeAxis {
    end_s: f64,
    unit: (&'static str, f64),
}

impl TimeAxis {
    fn of(r: &Report) -> TimeAxis {
        // Bucket 0 starts at the run's start (the ledger counts from it): the axis starts there
        // too, and ends with the last bucket or the last event on the run's time line.
        let last = r.timeline.buckets.iter().map(|b| b.index + 1).max();
        let end_s = last.map_or(0.0, |n| n as f64 * r.timeline.bucket_s);
        let end_s = r
            .run
            .events
            .iter()
            .map(|e| e.at_s)
            .filter(|t| t.is_finite())
            .fold(end_s, f64::max);
        let end_s = if end_s.is_finite() && end_s > 0.0 {
            end_s
        } else {
            60.0
        };
        let unit = if end_s >= 2.0 * 3600.0 {
            ("h", 3600.0)
        } else if end_s >= 180.0 {
            ("min", 60.0)
        } else {
            ("s", 1.0)
        };
        TimeAxis { end_s, unit }
    }

    fn x(&self, t: f64) -> f64 {
        LEFT + (RIGHT - LEFT) * t / self.end_s
    }
}

fn y_of(v: f64, top: f64) -> f64 {
    BOTTOM - (BOTTOM - TOP) * (v / top).clamp(0.0, 1.0)
}

/// The frame: grid lines and ticks on both axes, their labels, and the axis titles.
fn axes(
    out: &mut String,
    t: &TimeAxis,
    y_top: f64,
    y_step: f64,
    y_fmt: &dyn Fn(f64) -> String,
    y_title: &str,
) {
    let _ = write!(out, "<g class=\"axes\" font-size=\"12\" fill=\"#374151\">");
    let ticks = (y_top / y_step).round() as u64;
    for i in 0..=ticks {
        let v = i as f64 * y_step;
        let y = y_of(v, y_top);
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{RIGHT}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e5e7eb\"/>\
             <text class=\"tick y\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 8.0,
            y + 4.0,
            esc(&y_fmt(v))
        );
    }
    let (unit, per) = t.unit;
    let step = nice_step(t.end_s / per, 8.0);
    let mut v = 0.0;
    while v <= t.end_s / per + step * 1e-9 {
        let x = t.x(v * per);
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{BOTTOM}\" y2=\"{:.1}\" stroke=\"#6b7280\"/>\
             <text class=\"tick x\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            BOTTOM + 5.0,
            BOTTOM + 19.0,
            tick_label(v)
        );
        v += step;
    }
    let _ = write!(
        out,
        "<line x1=\"{LEFT}\" x2=\"{RIGHT}\" y1=\"{BOTTOM}\" y2=\"{BOTTOM}\" stroke=\"#6b7280\"/>\
         <line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{BOTTOM}\" stroke=\"#6b7280\"/>\
         <text class=\"axis-title x\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\">time since the run started ({unit})</text>\
         <text class=\"axis-title y\" transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">{}</text></g>",
        (LEFT + RIGHT) / 2.0,
        H - 10.0,
        (TOP + BOTTOM) / 2.0,
        esc(y_title)
    );
}

fn legend(out: &mut String, series: &[Series], label: &dyn Fn(&Series) -> String) {
    let _ = write!(
        out,
        "<g class=\"legend\" font-size=\"13\" fill=\"#111827\">"
    );
    let mut x = LEFT;
    for s in series {
        let dash = if s.kind == Kind::Reported {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let text = label(s);
        let _ = write!(
            out,
            "<g class=\"legend-entry\" data-phase=\"{}\" data-series=\"{}\">\
             <line x1=\"{x:.1}\" x2=\"{:.1}\" y1=\"20\" y2=\"20\" stroke=\"{}\" stroke-width=\"2.5\"{dash}/>\
             <text x=\"{:.1}\" y=\"24\">{}</text></g>",
            esc(&s.phase),
            s.kind.key(),
            x + 28.0,
            colour(&s.phase, s.nth),
            x + 34.0,
            esc(&text)
        );
        // Text width estimated at 7.5 units a character at 13 px: legends never overlap.
        x += 34.0 + 7.5 * text.chars().count() as f64 + 24.0;
    }
    let _ = write!(out, "</g>");
}

/// One series: its line (broken where buckets are missing) and a marked point per bucket.
fn plot(out: &mut String, s: &Series, t: &TimeAxis, bucket_s: f64, y_top: f64) {
    let c = colour(&s.phase, s.nth);
    let dash = if s.kind == Kind::Reported {
        " stroke-dasharray=\"6 4\""
    } else {
        ""
    };
    let at = |(i, v): (u64, f64)| (t.x((i as f64 + 0.5) * bucket_s), y_of(v, y_top));
    let mut d = String::new();
    let mut prev: Option<u64> = None;
    for &(i, v) in &s.points {
        let (x, y) = at((i, v));
        let cmd = if prev.is_some_and(|p| p + 1 == i) {
            'L'
        } else {
            'M'
        };
        let _ = write!(d, "{cmd}{x:.1} {y:.1} ");
        prev = Some(i);
    }
    let _ = write!(
        out,
        "<g class=\"series\" data-phase=\"{}\" data-series=\"{}\" data-points=\"{}\">\
         <path d=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{dash}/>",
        esc(&s.phase),
        s.kind.key(),
        s.points.len(),
        d.trim_end()
    );
    let fill = if s.kind == Kind::Reported {
        "#ffffff"
    } else {
        c
    };
    for &(i, v) in &s.points {
        let (x, y) = at((i, v));
        let _ = write!(
            out,
            "<circle class=\"point\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{fill}\" stroke=\"{c}\" stroke-width=\"1.5\" data-index=\"{i}\" data-value=\"{v}\">\
             <title>{} {}, {}–{}: {}</title></circle>",
            esc(&s.phase),
            s.kind.key(),
            duration(i as f64 * bucket_s),
            duration((i + 1) as f64 * bucket_s),
            esc(&s.kind.show(v))
        );
    }
    let _ = write!(out, "</g>");
}

/// The run's events (the upstream's cache emptied) as dashed vertical lines where they
/// happened.
fn events(out: &mut String, r: &Report, t: &TimeAxis) {
    for e in &r.run.events {
        let x = t.x(e.at_s.clamp(0.0, t.end_s));
        let _ = write!(
            out,
            "<g class=\"event\" data-kind=\"{}\" data-at=\"{}\">\
             <line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{TOP}\" y2=\"{BOTTOM}\" stroke=\"#dc2626\" stroke-width=\"1.5\" stroke-dasharray=\"3 3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#dc2626\">{}</text>\
             <title>{} at {} (by {})</title></g>",
            esc(&e.kind),
            e.at_s,
            x + 4.0,
            TOP + 12.0,
            esc(&e.kind.replace('_', " ")),
            esc(&e.kind.replace('_', " ")),
            duration(e.at_s),
            esc(&e.by)
        );
    }
}

/// A whole chart: `id` on the `<svg>`, the series of `kinds` per phase.
fn chart(r: &Report, id: &str, kinds: &[Kind], label: &str) -> String {
    let series = series(r, kinds);
    let t = TimeAxis::of(r);
    let (y_top, y_step, y_fmt, y_title): (f64, f64, &dyn Fn(f64) -> String, &str) =
        if kinds.contains(&Kind::TtftMean) {
            let max = series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1))
                .fold(0.0, f64::max);
            // Without samples, an axis of 0..100 ms rather than a lone tick.
            let basis = if max > 0.0 { max } else { 100.0 };
            let step = nice_step(basis, 5.0);
            let top = (basis / step).ceil().max(1.0) * step;
            (top, step, &tick_label, "mean TTFT (ms)")
        } else {
            (
                1.0,
                0.2,
                &percent_label,
                "hit rate (cached / prompt tokens)",
            )
        };
    let points: usize = series.iter().map(|s| s.points.len()).sum();
    let mut out = format!(
        "<svg id=\"{id}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" \
         role=\"img\" aria-label=\"{}\" data-points=\"{points}\" font-family=\"system-ui, sans-serif\">",
        esc(label)
    );
    axes(&mut out, &t, y_top, y_step, y_fmt, y_title);
    if points == 0 {
        let _ = write!(
            out,
            "<text class=\"empty\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"15\" fill=\"#6b7280\">no data in this run yet</text>",
            (LEFT + RIGHT) / 2.0,
            (TOP + BOTTOM) / 2.0
        );
    }
    let label_of = |s: &Series| match s.kind {
        Kind::TtftMean => s.phase.clone(),
        k => format!("{} {}", s.phase, k.key()),
    };
    legend(&mut out, &series, &label_of);
    events(&mut out, r, &t);
    for s in &series {
        plot(&mut out, s, &t, r.timeline.bucket_s, y_top);
    }
    out.push_str("</svg>");
    out
}

/// Hit rate per phase over time: predicted, and reported where the upstream said.
pub(crate) fn hit_rate(r: &Report) -> String {
    chart(
        r,
        "chart-hit-rate",
        &[Kind::Predicted, Kind::Reported],
        "hit rate per phase over time",
    )
}

/// Mean TTFT per phase over time.
pub(crate) fn ttft(r: &Report) -> String {
    chart(
        r,
        "chart-ttft",
        &[Kind::TtftMean],
        "mean TTFT per phase over time",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render::fixtures;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(120.0, 8.0), 20.0);
        assert_eq!(nice_step(60.0, 8.0), 10.0);
        assert_eq!(nice_step(9.0, 8.0), 2.0);
        assert_eq!(nice_step(180.0, 5.0), 50.0);
        assert_eq!(nice_step(11.0, 5.0), 2.5);
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(10.0), "10");
    }

    #[test]
    fn one_point_per_bucket_and_series_per_phase() {
        let r = fixtures::two_phases();
        let svg = hit_rate(&r);
        // 10 warmup and 50 profiling buckets, predicted and reported: 120 points.
        assert_eq!(svg.matches("<circle class=\"point\"").count(), 120);
        assert!(svg.contains("data-phase=\"warmup\" data-series=\"predicted\" data-points=\"10\""));
        assert!(
            svg.contains("data-phase=\"profiling\" data-series=\"reported\" data-points=\"50\"")
        );
        // Each phase's line is one run: a single move, then lines.
        assert_eq!(svg.matches("d=\"M").count(), 4);
        assert!(!svg.contains(" M"), "no break in consecutive buckets");
        let ttft = ttft(&r);
        assert_eq!(ttft.matches("<circle class=\"point\"").count(), 60);
        assert!(ttft.contains(">mean TTFT (ms)</text>"));
        // 120 s of buckets: ticks in seconds, every 20.
        assert!(svg.contains(">time since the run started (s)</text>"));
        assert!(svg.contains(">120</text>") && svg.contains(">100%</text>"));
    }

    #[test]
    fn a_gap_breaks_the_line_and_silence_drops_the_reported_line() {
        let mut r = fixtures::silent_upstream();
        r.timeline.buckets.retain(|b| b.index != 5);
        let svg = hit_rate(&r);
        assert!(!svg.contains("data-series=\"reported\""), "{svg}");
        let profiling = svg
            .split("data-phase=\"profiling\" data-series=\"predicted\"")
            .nth(2)
            .unwrap();
        let path = profiling
            .split("d=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(path.matches('M').count(), 2, "{path}");
    }

    #[test]
    fn the_time_axis_starts_at_the_runs_start_and_marks_its_events() {
        let mut r = fixtures::one_phase();
        // A 1.4-second run: 14 buckets of 0.1 s, the first at the run's start.
        r.timeline.bucket_s = 0.1;
        r.timeline.buckets = fixtures::buckets("profiling", 0, 14, 0.6, true);
        r.run.events = vec![crate::report::RunEvent {
            at_s: 0.5,
            kind: "cache_reset".into(),
            by: "admin".into(),
        }];
        let svg = hit_rate(&r);
        // Bucket 0's point sits half a bucket from the axis's left end, not at the right edge.
        let x0 = LEFT + (RIGHT - LEFT) * 0.05 / 1.4;
        assert!(
            svg.contains(&format!("cx=\"{x0:.1}\" ")) && svg.contains("data-index=\"0\""),
            "{svg}"
        );
        assert!(svg.contains(&format!(
            "<text class=\"tick x\" x=\"{LEFT:.1}\" y=\"{:.1}\" text-anchor=\"middle\">0</text>",
            BOTTOM + 19.0
        )));
        let x = LEFT + (RIGHT - LEFT) * 0.5 / 1.4;
        assert!(svg.contains(&format!(
            "<g class=\"event\" data-kind=\"cache_reset\" data-at=\"0.5\"><line x1=\"{x:.1}\" x2=\"{x:.1}\""
        )), "{svg}");
        assert!(svg.contains("<title>cache reset at 0.5 s (by admin)</title>"));
    }

    #[test]
    fn an_empty_run_draws_axes_and_says_so() {
        let svg = hit_rate(&fixtures::empty());
        assert!(svg.contains("data-points=\"0\""));
        assert!(svg.contains("no data in this run yet"));
        assert!(svg.contains(">0%</text>"));
        let svg = ttft(&fixtures::empty());
        assert_eq!(
            svg.matches("class=\"tick y\"").count(),
            6,
            "0 to 100 ms by 20: {svg}"
        );
    }
}
