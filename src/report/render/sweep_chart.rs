//! The sweep's two charts as inline SVG: TTFT p50 and p99 per run, and the cached share
//! (reported, predicted) per run, one series per target, the runs along the x axis in the order
//! given. Each point carries `data-run` and `data-value`. Pure; never scripts.

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
    /// (run's place on the x axis, run, value).
    points: Vec<(usize, String, f64)>,
}

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
                        .map(|v| (x, l.run.clone(), v))
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

fn x_of(i: usize, n: usize) -> f64 {
    LEFT + (RIGHT - LEFT) * (i as f64 + 0.5) / n.max(1) as f64
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
fn chart(s: &Sweep, id: &str, label: &str, all: &[Series], axis: &Axis) -> String {
    let runs = runs(s);
    let n = runs.len();
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
    // Run names under their points, slanted when there are many.
    let slant = n > 6;
    for (i, run) in runs.iter().enumerate() {
        let x = x_of(i, n);
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
        plot(&mut out, s, n, axis);
    }
    out.push_str("</svg>");
    out
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

fn plot(out: &mut String, s: &Series, n: usize, axis: &Axis) {
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
            format!("{cmd}{:.1} {:.1}", x_of(*i, n), y_of(*v, axis.top))
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
    for (i, run, v) in &s.points {
        let _ = write!(
            out,
            "<circle class=\"point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{fill}\" stroke=\"{c}\" stroke-width=\"1.5\" data-run=\"{}\" data-value=\"{v}\">\
             <title>{} {} {}: {}</title></circle>",
            x_of(*i, n),
            y_of(*v, axis.top),
            esc(run),
            esc(run),
            esc(&s.target),
            label(s.key),
            esc(&(axis.show)(*v))
        );
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
    let max = all
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.2))
        .fold(0.0, f64::max);
    let basis = if max > 0.0 { max } else { 100.0 };
    let step = nice_step(basis, 5.0);
    let top = (basis / step).ceil().max(1.0) * step;
    let show = |v: f64| format!("{} ms", ms(v));
    let axis = Axis {
        top,
        step,
        fmt: &tick_label,
        title: "TTFT (ms)",
        show: &show,
    };
    chart(
        s,
        "chart-sweep-ttft",
        "TTFT p50 and p99 per run",
        &all,
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
    chart(s, "chart-sweep-cached", "cached share per run", &all, &axis)
}
