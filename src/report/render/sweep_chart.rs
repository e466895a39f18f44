//! The sweep's charts as inline SVG: TTFT p50 and p99 per run, and the cached share (reported,
//! predicted) per run, one series per target, the runs along the x axis in the order given; and,
//! for a sweep of hit rates (a dial, or runs whose caches served different shares), TTFT p50
//! and p99 against the reported hit rate, the curve such a sweep is run for. Each point carries
//! `data-run` and `data-value` (and `data-x` on the hit-rate chart). Pure; never scripts.

use std::fmt::Write as _;

use super::chart::{nice_step, percent_label, tick_label};
use super::{esc, ms, pct};
use crate::report::{Sweep, SweepLine};

const W: f64 = 760.0;
const H: f64 = 380.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = W - 20.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = H - 70.0;

const PALETTE: [&str; 6] = [
    "#2563eb", "#059669", "#7c3aed", "#db2777", "#d97706", "#4b5563",
];

/// One line: a target's figure over the runs.
struct Series {
    target: String,
    nth: usize,
    key: &'static str,
    dashed: bool,
    /// (x: the run's place among the runs, or its hit rate; run; value).
    points: Vec<(f64, String, f64)>,
}

/// What the x axis shows.
enum XAxis {
    /// The runs, in the order given, evenly spaced.
    Runs(Vec<String>),
    /// The reported hit rate, 0 to 100 %.
    HitRate,
}

impl XAxis {
    /// The drawing's x of `x` (a run's place, or a hit rate).
    fn at(&self, x: f64) -> f64 {
        match self {
            XAxis::Runs(runs) => LEFT + (RIGHT - LEFT) * (x + 0.5) / runs.len().max(1) as f64,
            // Inset, so a point at 0 % is not drawn on the y axis.
            XAxis::HitRate => LEFT + INSET + (RIGHT - LEFT - 2.0 * INSET) * x.clamp(0.0, 1.0),
        }
    }
}

/// How far in from the plot's edges the hit-rate axis's 0 % and 100 % are.
const INSET: f64 = 16.0;

fn runs(s: &Sweep) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in &s.lines {
        if !out.contains(&l.run) {
            out.push(l.run.clone());
        }
    }
    out
}

fn targets(s: &Sweep) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in s.lines.iter().filter(|l| !l.target.is_empty()) {
        if !out.contains(&l.target) {
            out.push(l.target.clone());
        }
    }
    out
}

type Pick = fn(&SweepLine) -> Option<f64>;

fn series(s: &Sweep, kinds: &[(&'static str, bool, Pick)]) -> Vec<Series> {
    let runs = runs(s);
    let mut out = Vec::new();
    for (nth, target) in targets(s).into_iter().enumerate() {
        for &(key, dashed, pick) in kinds {
            let points = s
                .lines
                .iter()
                .filter(|l| l.target == target)
                .filter_map(|l| {
                    let x = runs.iter().position(|r| *r == l.run)?;
                    pick(l)
                        .filter(|v| v.is_finite())
                        .map(|v| (x as f64, l.run.clone(), v))
                })
                .collect::<Vec<_>>();
            if !points.is_empty() {
                out.push(Series {
                    target: target.clone(),
                    nth,
                    key,
                    dashed,
                    points,
                });
            }
        }
    }
    out
}

/// A series' name as a person reads it.
fn label(key: &str) -> &'static str {
    match key {
        "ttft_p50" => "TTFT p50",
        "ttft_p99" => "TTFT p99",
        "cached_predicted" => "cached, predicted",
        _ => "cached, reported",
    }
}

fn y_of(v: f64, top: f64) -> f64 {
    BOTTOM - (BOTTOM - TOP) * (v / top).clamp(0.0, 1.0)
}

struct Axis<'a> {
    top: f64,
    step: f64,
    fmt: &'a dyn Fn(f64) -> String,
    title: &'a str,
    show: &'a dyn Fn(f64) -> String,
}

/// A whole chart: `id` on the `<svg>`.
fn chart(id: &str, label: &str, all: &[Series], x_axis: &XAxis, axis: &Axis) -> String {
    let points: usize = all.iter().map(|s| s.points.len()).sum();
    let mut out = format!(
        "<svg id=\"{id}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" \
         role=\"img\" aria-label=\"{}\" data-points=\"{points}\" font-family=\"system-ui, sans-serif\">\
         <g class=\"axes\" font-size=\"14\" fill=\"#374151\">",
        esc(label)
    );
    let ticks = (axis.top / axis.step).round() as u64;
    for i in 0..=ticks {
        let v = i as f64 * axis.step;
        let y = y_of(v, axis.top);
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{RIGHT}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e5e7eb\"/>\
             <text class=\"tick y\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 8.0,
            y + 4.0,
            esc(&(axis.fmt)(v))
        );
    }
    x_ticks(&mut out, x_axis);
    let _ = write!(
        out,
        "<line x1=\"{LEFT}\" x2=\"{RIGHT}\" y1=\"{BOTTOM}\" y2=\"{BOTTOM}\" stroke=\"#6b7280\"/>\
         <line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{BOTTOM}\" stroke=\"#6b7280\"/>\
         <text class=\"axis-title y\" transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\" font-size=\"15\">{}</text></g>",
        (TOP + BOTTOM) / 2.0,
        esc(axis.title)
    );
    if points == 0 {
        let _ = write!(
            out,
            "<text class=\"empty\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"15\" fill=\"#6b7280\">no figures in these runs</text>",
            (LEFT + RIGHT) / 2.0,
            (TOP + BOTTOM) / 2.0
        );
    }
    legend(&mut out, all);
    for s in all {
        plot(&mut out, s, x_axis, axis);
    }
    out.push_str("</svg>");
    out
}

/// The x axis's ticks: run names under their points, or the hit rate's percentages with
/// its title.
fn x_ticks(out: &mut String, x_axis: &XAxis) {
    match x_axis {
        // Run names under their points, slanted when there are many.
        XAxis::Runs(runs) => {
            let slant = runs.len() > 6;
            for (i, run) in runs.iter().enumerate() {
                let x = x_axis.at(i as f64);
                let (anchor, transform) = if slant {
                    (
                        "end",
                        format!(" transform=\"rotate(-35 {x:.1} {:.1})\"", BOTTOM + 16.0),
                    )
                } else {
                    ("middle", String::new())
                };
                let _ = write!(
                    out,
                    "<text class=\"tick x\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\"{transform}>{}</text>",
                    BOTTOM + 16.0,
                    esc(run)
                );
            }
        }
        XAxis::HitRate => {
            for i in 0..=5 {
                let v = f64::from(i) * 0.2;
                let x = x_axis.at(v);
                let _ = write!(
                    out,
                    "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{TOP}\" y2=\"{BOTTOM}\" stroke=\"#f3f4f6\"/>\
                     <text class=\"tick x\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                    BOTTOM + 18.0,
                    percent_label(v)
                );
            }
            let _ = write!(
                out,
                "<text class=\"axis-title x\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"15\">\
                 reported hit rate (cached / prompt tokens)</text>",
                (LEFT + RIGHT) / 2.0,
                BOTTOM + 44.0
            );
        }
    }
}

fn legend(out: &mut String, all: &[Series]) {
    out.push_str("<g class=\"legend\" font-size=\"14\" fill=\"#111827\">");
    let (mut x, mut y) = (LEFT, 20.0);
    for s in all {
        let text = format!("{} {}", s.target, label(s.key));
        // Text width estimated at 8 units a character at 14 px; a full line wraps.
        let width = 34.0 + 8.0 * text.chars().count() as f64 + 20.0;
        if x + width > RIGHT && x > LEFT {
            x = LEFT;
            y += 20.0;
        }
        let dash = if s.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let _ = write!(
            out,
            "<g class=\"legend-entry\" data-target=\"{}\" data-series=\"{}\">\
             <line x1=\"{x:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"2.5\"{dash}/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text></g>",
            esc(&s.target),
            s.key,
            x + 28.0,
            PALETTE[s.nth % PALETTE.len()],
            x + 34.0,
            y + 4.0,
            esc(&text)
        );
        x += width;
    }
    out.push_str("</g>");
}

fn plot(out: &mut String, s: &Series, x_axis: &XAxis, axis: &Axis) {
    let c = PALETTE[s.nth % PALETTE.len()];
    let dash = if s.dashed {
        " stroke-dasharray=\"6 4\""
    } else {
        ""
    };
    let d: Vec<String> = s
        .points
        .iter()
        .enumerate()
        .map(|(k, (i, _, v))| {
            let cmd = if k == 0 { 'M' } else { 'L' };
            format!("{cmd}{:.1} {:.1}", x_axis.at(*i), y_of(*v, axis.top))
        })
        .collect();
    let _ = write!(
        out,
        "<g class=\"series\" data-target=\"{}\" data-series=\"{}\" data-points=\"{}\">\
         <path d=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{dash}/>",
        esc(&s.target),
        s.key,
        s.points.len(),
        d.join(" ")
    );
    let fill = if s.dashed { "#ffffff" } else { c };
    for (x, run, v) in &s.points {
        // On the hit-rate axis the x is a figure too: kept exact, and said on hover.
        let (data_x, at) = match x_axis {
            XAxis::Runs(_) => (String::new(), String::new()),
            XAxis::HitRate => (format!(" data-x=\"{x}\""), format!(" at {} hit", pct(*x))),
        };
        let _ = write!(
            out,
            "<circle class=\"point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{fill}\" stroke=\"{c}\" stroke-width=\"1.5\" data-run=\"{}\"{data_x} data-value=\"{v}\">\
             <title>{} {} {}: {}{at}</title></circle>",
            x_axis.at(*x),
            y_of(*v, axis.top),
            esc(run),
            esc(run),
            esc(&s.target),
            label(s.key),
            esc(&(axis.show)(*v))
        );
    }
    // On the hit-rate axis a point's run is not on the axis: name it beside the solid
    // series' points, so a reader maps each point to its run without hovering.
    if matches!(x_axis, XAxis::HitRate) && !s.dashed {
        for (x, run, v) in &s.points {
            // Right of the point, or left near the right edge; below it, or above near the
            // x axis, where its tick labels are.
            let (anchor, dx) = if *x > 0.85 {
                ("end", -7.0)
            } else {
                ("start", 7.0)
            };
            let y = y_of(*v, axis.top);
            let dy = if y > BOTTOM - 24.0 { -9.0 } else { 16.0 };
            let _ = write!(
                out,
                "<text class=\"run-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\" font-size=\"12\" fill=\"#4b5563\">{}</text>",
                x_axis.at(*x) + dx,
                y + dy,
                esc(run)
            );
        }
    }
    out.push_str("</g>");
}

/// TTFT p50 and p99 per run.
pub(crate) fn ttft(s: &Sweep) -> String {
    let all = series(
        s,
        &[
            ("ttft_p50", false, |l| l.ttft_p50_ms),
            ("ttft_p99", true, |l| l.ttft_p99_ms),
        ],
    );
    let (top, step) = ttft_axis(&all);
    let show = |v: f64| format!("{} ms", ms(v));
    let axis = Axis {
        top,
        step,
        fmt: &tick_label,
        title: "TTFT (ms)",
        show: &show,
    };
    chart(
        "chart-sweep-ttft",
        "TTFT p50 and p99 per run",
        &all,
        &XAxis::Runs(runs(s)),
        &axis,
    )
}

/// A TTFT axis over `all`'s values: round steps, the top a step above the largest.
fn ttft_axis(all: &[Series]) -> (f64, f64) {
    let max = all
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.2))
        .fold(0.0, f64::max);
    let basis = if max > 0.0 { max } else { 100.0 };
    let step = nice_step(basis, 5.0);
    ((basis / step).ceil().max(1.0) * step, step)
}

/// Whether a sweep is one of hit rates, so TTFT against the hit rate says something: some
/// line ran under the dial, or one target's reported hit rate differs by 5 points or more
/// between runs (datasets that share more or less). A concurrency sweep at one hit rate gets no
/// such chart (its points would stand in one column), nor do targets that merely differ.
pub(crate) fn is_hit_rate_sweep(s: &Sweep) -> bool {
    let spread = |target: &str| {
        let rates = s
            .lines
            .iter()
            .filter(|l| l.target == target)
            .filter_map(|l| l.cached_share_reported);
        let (lo, hi) = rates.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        hi - lo
    };
    s.lines.iter().any(|l| l.hit_ratio.is_some()) || targets(s).iter().any(|t| spread(t) >= 0.05)
}

/// TTFT p50 and p99 against the reported hit rate, one point per run (and target), drawn in
/// the order of the hit rate.
pub(crate) fn ttft_by_hit_rate(s: &Sweep) -> String {
    let mut all = Vec::new();
    for (nth, target) in targets(s).into_iter().enumerate() {
        let kinds: [(&'static str, bool, Pick); 2] = [
            ("ttft_p50", false, |l| l.ttft_p50_ms),
            ("ttft_p99", true, |l| l.ttft_p99_ms),
        ];
        for (key, dashed, pick) in kinds {
            let mut points: Vec<(f64, String, f64)> = s
                .lines
                .iter()
                .filter(|l| l.target == target)
                .filter_map(|l| {
                    let x = l.cached_share_reported.filter(|x| x.is_finite())?;
                    let v = pick(l).filter(|v| v.is_finite())?;
                    Some((x, l.run.clone(), v))
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            if !points.is_empty() {
                all.push(Series {
                    target: target.clone(),
                    nth,
                    key,
                    dashed,
                    points,
                });
            }
        }
    }
    let (top, step) = ttft_axis(&all);
    let show = |v: f64| format!("{} ms", ms(v));
    let axis = Axis {
        top,
        step,
        fmt: &tick_label,
        title: "TTFT (ms)",
        show: &show,
    };
    chart(
        "chart-sweep-ttft-hit-rate",
        "TTFT p50 and p99 against the reported hit rate",
        &all,
        &XAxis::HitRate,
        &axis,
    )
}

/// The cached share of prompt tokens per run: reported, and predicted.
pub(crate) fn cached(s: &Sweep) -> String {
    let all = series(
        s,
        &[
            ("cached_predicted", false, |l| l.cached_share_predicted),
            ("cached_reported", true, |l| l.cached_share_reported),
        ],
    );
    let axis = Axis {
        top: 1.0,
        step: 0.2,
        fmt: &percent_label,
        title: "cached share of prompt tokens",
        show: &pct,
    };
    chart(
        "chart-sweep-cached",
        "cached share per run",
        &all,
        &XAxis::Runs(runs(s)),
        &axis,
    )
}
