//! Runs side by side (`kvbust report FILE…`, `kvbust report --runs`) as a terminal table, JSON,
//! markdown or one HTML page with the sweep charts; and the few lines `kvbust run` prints after
//! its client. Each opens with the verdict. Pure: reports in, text out; never fetches or reads
//! files.

use std::fmt::Write as _;

use super::sheet::{headline, verdict_sentence, Tone};
use super::{esc, int, ms, pct, per_s, ratio, sweep_chart, Colour, Format};
use crate::report::{Isolation, Report, Row, Sweep, SweepLine};

/// The lines a sweep compares: per run, its profiling rows (all its rows when it has none; one
/// empty line when it has no rows at all).
pub fn sweep(reports: &[Report]) -> Sweep {
    let mut lines = Vec::new();
    for r in reports {
        let profiling: Vec<&Row> = r.rows.iter().filter(|w| w.phase == "profiling").collect();
        let rows: Vec<&Row> = if profiling.is_empty() {
            r.rows.iter().collect()
        } else {
            profiling
        };
        let base = SweepLine {
            run: r.run.name.clone(),
            started_at: r.run.started_at.clone(),
            ended_at: r.run.ended_at.clone(),
            complete: r.run.complete,
            isolation: r.verdict.isolation,
            verdict: verdict_sentence(&r.verdict),
            warmup_share: r.verdict.warmup_share,
            command: r.run.command.clone(),
            ..SweepLine::default()
        };
        if rows.is_empty() {
            lines.push(base);
            continue;
        }
        for w in rows {
            lines.push(SweepLine {
                phase: w.phase.clone(),
                target: w.target.clone(),
                requests: w.requests,
                errors: w.errors.count,
                requests_per_s: w.throughput.requests_per_s,
                output_tokens_per_s: w.throughput.output_tokens_per_s,
                ttft_p50_ms: w.latency.ttft_ms.p50,
                ttft_p99_ms: w.latency.ttft_ms.p99,
                itl_p50_ms: w.latency.itl_ms.p50,
                e2e_p50_ms: w.latency.e2e_ms.p50,
                hit_ratio: w.dial(),
                cached_share_reported: w.reported_hit_rate(),
                cached_share_predicted: w.predicted_hit_rate(),
                ..base.clone()
            });
        }
    }
    Sweep { lines }
}

/// `reports` side by side in `format`; ends with a newline.
pub fn render_runs(reports: &[Report], format: Format, colour: Colour) -> String {
    let s = sweep(reports);
    match format {
        Format::Table => table(reports, &s, colour),
        Format::Json => {
            // Plain data: serde_json cannot fail on it.
            let mut text = serde_json::to_string_pretty(&s).unwrap_or_default();
            text.push('\n');
            text
        }
        Format::Markdown => markdown(reports, &s),
        Format::Html => html(reports, &s),
    }
}

/// A column of the sweep: heading, and whether it is a number (right-aligned).
const COLS: [(&str, bool); 12] = [
    ("run", false),
    ("target", false),
    ("verdict", false),
    ("requests", true),
    ("errors", true),
    ("req/s", true),
    ("TTFT p50 ms", true),
    ("TTFT p99 ms", true),
    ("ITL p50 ms", true),
    ("dial", true),
    ("cached reported", true),
    ("cached predicted", true),
];

/// Machine names of [`COLS`] (the HTML page's `data-col`).
const KEYS: [&str; 12] = [
    "run",
    "target",
    "isolation",
    "requests",
    "errors",
    "requests_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "hit_ratio",
    "cached_share_reported",
    "cached_share_predicted",
];

/// [`COLS`]' place of the dial.
const DIAL: usize = 9;

/// The columns (places in [`COLS`]) a sweep shows: the dial only when some line ran under it,
/// so a concurrency sweep gets no column of dashes.
fn shown(s: &Sweep) -> Vec<usize> {
    let dialled = s.lines.iter().any(|l| l.hit_ratio.is_some());
    (0..COLS.len()).filter(|&i| i != DIAL || dialled).collect()
}

/// A line's cells in [`COLS`] order: text, exact figure, tone.
fn cells(l: &SweepLine) -> Vec<(String, Option<f64>, Tone)> {
    let opt = |v: Option<f64>, show: fn(f64) -> String| match v {
        Some(v) => (show(v), Some(v), Tone::Plain),
        None => ("-".to_string(), None, Tone::Missing),
    };
    let target = match l.phase.as_str() {
        "profiling" | "" => l.target.clone(),
        phase => format!("{} ({phase})", l.target),
    };
    // As the run's verdict stands out: a breach bad; warmup's cache serving profiling without
    // isolation, or a report not whole, worth a look. Not under a dial, which asked for it.
    let tone = match l.isolation {
        Isolation::Breached => Tone::Bad,
        Isolation::NotRequested
            if l.hit_ratio.is_none() && l.warmup_share.is_some_and(|s| s > 0.0) =>
        {
            Tone::Warn
        }
        _ if !l.complete => Tone::Warn,
        _ => Tone::Plain,
    };
    let word = l.isolation.as_str().replace('_', " ");
    let word = if l.complete {
        word
    } else {
        format!("{word} (incomplete)")
    };
    vec![
        (l.run.clone(), None, Tone::Plain),
        (target, None, Tone::Plain),
        (word, None, tone),
        (int(l.requests), Some(l.requests as f64), Tone::Plain),
        (
            int(l.errors),
            Some(l.errors as f64),
            if l.errors > 0 {
                Tone::Warn
            } else {
                Tone::Plain
            },
        ),
        opt(l.requests_per_s, per_s),
        opt(l.ttft_p50_ms, ms),
        opt(l.ttft_p99_ms, ms),
        opt(l.itl_p50_ms, ms),
        opt(l.hit_ratio, ratio),
        opt(l.cached_share_reported, pct),
        opt(l.cached_share_predicted, pct),
    ]
}

/// The sentence a sweep opens with: how many runs, how many held, breached, not requested.
fn opening(reports: &[Report]) -> (Tone, String) {
    let count = |i: Isolation| reports.iter().filter(|r| r.verdict.isolation == i).count();
    let (held, breached, none) = (
        count(Isolation::Held),
        count(Isolation::Breached),
        count(Isolation::NotRequested),
    );
    let mut parts = Vec::new();
    for (n, word) in [
        (held, "isolation held"),
        (breached, "isolation breached"),
        (none, "isolation not requested"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {word}"));
        }
    }
    let tone = if breached > 0 {
        Tone::Bad
    } else if reports.iter().any(|r| headline(r).tone == Tone::Warn) {
        Tone::Warn
    } else {
        Tone::Plain
    };
    let runs = if reports.len() == 1 { "run" } else { "runs" };
    (
        tone,
        format!("{} {runs}: {}", reports.len(), parts.join(", ")),
    )
}

fn paint(colour: Colour, tone: Tone, text: &str) -> String {
    let code = match (colour, tone) {
        (Colour::Never, _) | (_, Tone::Plain) => return text.to_string(),
        (Colour::Ansi, Tone::Missing) => "2",
        (Colour::Ansi, Tone::Warn) => "33",
        (Colour::Ansi, Tone::Bad) => "1;31",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

fn table(reports: &[Report], s: &Sweep, colour: Colour) -> String {
    let (tone, first) = opening(reports);
    let mut out = paint(colour, tone, &first);
    out.push_str("\n\n");
    let cols = shown(s);
    let rows: Vec<Vec<(String, Option<f64>, Tone)>> = s.lines.iter().map(cells).collect();
    let w: Vec<usize> = (0..COLS.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].0.chars().count())
                .chain([COLS[i].0.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let pad = |text: &str, i: usize| {
        let n = w[i];
        if COLS[i].1 {
            format!("{text:>n$}")
        } else {
            format!("{text:<n$}")
        }
    };
    let head: Vec<String> = cols.iter().map(|&i| pad(COLS[i].0, i)).collect();
    out.push_str(head.join("  ").trim_end());
    out.push('\n');
    for r in &rows {
        let line: Vec<String> = cols
            .iter()
            .map(|&i| {
                let (text, _, tone) = &r[i];
                paint(colour, *tone, &pad(text, i))
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out.push('\n');
    for r in reports {
        let h = headline(r);
        let _ = writeln!(
            out,
            "{}",
            paint(colour, h.tone, &format!("{}: {}", r.run.name, h.text))
        );
    }
    out
}

fn md_esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace(['\n', '\r'], " ")
}

fn markdown(reports: &[Report], s: &Sweep) -> String {
    let (tone, first) = opening(reports);
    let mark = match tone {
        Tone::Bad => "❌ ",
        Tone::Warn => "⚠️ ",
        Tone::Plain | Tone::Missing => "",
    };
    let mut out = format!(
        "## kvbust runs side by side\n\n**{mark}{}**\n\n",
        md_esc(&first)
    );
    let cols = shown(s);
    let head: Vec<&str> = cols.iter().map(|&i| COLS[i].0).collect();
    let align: Vec<&str> = cols
        .iter()
        .map(|&i| if COLS[i].1 { "---:" } else { "---" })
        .collect();
    let _ = write!(out, "| {} |\n|{}|\n", head.join(" | "), align.join("|"));
    for l in &s.lines {
        let all = cells(l);
        let row: Vec<String> = cols
            .iter()
            .map(|&i| {
                let text = &all[i].0;
                if COLS[i].1 {
                    md_esc(text)
                } else {
                    format!("`{}`", md_esc(&text.replace('`', "'")))
                }
            })
            .collect();
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out.push('\n');
    for r in reports {
        let _ = writeln!(
            out,
            "- `{}`: {}",
            md_esc(&r.run.name.replace('`', "'")),
            md_esc(&headline(r).text)
        );
    }
    out
}

const STYLE: &str = "
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#111827;background:#fff;margin:0;padding:20px 24px;line-height:1.4}
h1{font-size:24px;margin:0 0 12px}
h2{font-size:17px;margin:28px 0 8px}
h3{font-size:15px;font-weight:600;margin:0 0 6px;color:#374151}
p.verdict{font-size:17px;font-weight:600;margin:0 0 16px;padding:10px 14px;border-left:6px solid #16a34a;background:#f0fdf4}
p.verdict.warn{border-color:#d97706;background:#fffbeb}
p.verdict.bad{border-color:#dc2626;background:#fef2f2;color:#991b1b}
ul.verdicts{list-style:none;padding:0;margin:12px 0;font-size:14px}
ul.verdicts li{padding:6px 10px;margin:4px 0;border-left:4px solid #16a34a;background:#f9fafb}
ul.verdicts li.warn{border-color:#d97706;background:#fffbeb}
ul.verdicts li.bad{border-color:#dc2626;background:#fef2f2}
p.verdict.none,ul.verdicts li[data-isolation=not_requested]:not(.warn){border-color:#9ca3af;background:#f9fafb}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums}
th,td{padding:4px 8px;border-bottom:1px solid #e5e7eb;white-space:nowrap}
thead th{background:#f3f4f6;font-weight:600;vertical-align:bottom}
th.num,td.num{text-align:right}
th.name,td.name{text-align:left}
td.missing{color:#9ca3af}
td.warn{color:#b45309;font-weight:600}
td.bad{color:#b91c1c;background:#fef2f2;font-weight:700}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(600px,100%),1fr));gap:16px}
svg.chart{width:100%;height:auto;display:block;border:1px solid #e5e7eb;border-radius:6px}
";

fn tone_class(t: Tone) -> &'static str {
    match t {
        Tone::Plain => "",
        Tone::Missing => " missing",
        Tone::Warn => " warn",
        Tone::Bad => " bad",
    }
}

fn html(reports: &[Report], s: &Sweep) -> String {
    let (tone, first) = opening(reports);
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\
         <title>kvbust runs side by side</title><style>{STYLE}</style></head>\n<body>\n\
         <h1>kvbust runs side by side</h1>\n<p class=\"verdict{}\" id=\"verdict\">{}</p>\n",
        // Grey, not the green of isolation held, when no run asked for isolation.
        if tone == Tone::Plain
            && reports
                .iter()
                .all(|r| r.verdict.isolation == Isolation::NotRequested)
        {
            " none"
        } else {
            tone_class(tone)
        },
        esc(&first)
    );
    let cols = shown(s);
    out.push_str("<div class=\"scroll\"><table id=\"runs\"><thead><tr>");
    for &i in &cols {
        let (head, numeric) = COLS[i];
        let class = if numeric { "num" } else { "name" };
        let _ = write!(out, "<th class=\"{class}\">{}</th>", esc(head));
    }
    out.push_str("</tr></thead><tbody>");
    for l in &s.lines {
        let _ = write!(
            out,
            "<tr class=\"run\" data-run=\"{}\" data-phase=\"{}\" data-target=\"{}\">",
            esc(&l.run),
            esc(&l.phase),
            esc(&l.target)
        );
        let all = cells(l);
        for &i in &cols {
            let (text, value, tone) = &all[i];
            let class = if COLS[i].1 { "num" } else { "name" };
            let value = value
                .map(|v| format!(" data-value=\"{v}\""))
                .unwrap_or_default();
            let _ = write!(
                out,
                "<td class=\"{class}{}\" data-col=\"{}\"{value}>{}</td>",
                tone_class(*tone),
                KEYS[i],
                esc(text)
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>\n");
    charts(&mut out, s);
    out.push_str("<h2>Verdicts</h2>\n<ul class=\"verdicts\" id=\"verdicts\">");
    for r in reports {
        let h = headline(r);
        let _ = write!(
            out,
            "<li class=\"run{}\" data-run=\"{}\" data-isolation=\"{}\"><b>{}</b>: {}</li>",
            tone_class(h.tone),
            esc(&r.run.name),
            h.key,
            esc(&r.run.name),
            esc(&h.text)
        );
    }
    out.push_str("</ul>\n</body></html>\n");
    out
}

/// The sweep's charts, each under its title.
fn charts(out: &mut String, s: &Sweep) {
    // A sweep of hit rates leads with the curve it was run for. Each chart under its own
    // title: the two TTFT charts look alike but for their x axes.
    let mut charts = Vec::new();
    if sweep_chart::is_hit_rate_sweep(s) {
        charts.push((
            "TTFT against the reported hit rate",
            sweep_chart::ttft_by_hit_rate(s),
        ));
    }
    charts.push(("TTFT per run", sweep_chart::ttft(s)));
    charts.push((
        "Cached share of prompt tokens per run",
        sweep_chart::cached(s),
    ));
    out.push_str("<h2>The sweep</h2>\n<div class=\"charts\">");
    for (title, svg) in charts {
        let _ = write!(out, "<section><h3>{}</h3>{svg}</section>", esc(title));
    }
    out.push_str("</div>\n");
}

/// What `kvbust run` prints after its client: the verdict, then per row its requests, errors,
/// TTFT and cached share, then why the report is incomplete when it is.
pub fn summary(r: &Report) -> String {
    let h = headline(r);
    let mut out = format!("kvbust run {}: {}\n", r.run.name, h.text);
    for w in &r.rows {
        let share = match (w.reported_hit_rate(), w.predicted_hit_rate()) {
            (Some(rep), Some(pred)) => {
                format!("cached {} reported, {} predicted", pct(rep), pct(pred))
            }
            (None, Some(pred)) => format!("cached {} predicted", pct(pred)),
            (Some(rep), None) => format!("cached {} reported", pct(rep)),
            (None, None) => "cached -".to_string(),
        };
        // The dial first, so what was asked stands before what came.
        let share = match w.dial() {
            Some(r) => format!("dial {}: {share}", ratio(r)),
            None => share,
        };
        let opt_ms =
            |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{} ms", ms(v)));
        let _ = writeln!(
            out,
            "  {} × {}: {} requests, {} errors, {} req/s; TTFT p50 {}, p99 {}; {share}",
            w.phase,
            w.target,
            int(w.requests),
            int(w.errors.count),
            w.throughput
                .requests_per_s
                .map_or_else(|| "-".to_string(), per_s),
            opt_ms(w.latency.ttft_ms.p50),
            opt_ms(w.latency.ttft_ms.p99),
        );
    }
    if r.rows.is_empty() {
        out.push_str("  no generation requests in this run\n");
    }
    if !r.run.complete {
        let open: u64 = r.run.unaccounted.values().sum();
        let reasons: Vec<String> = r
            .run
            .unaccounted
            .iter()
            .map(|(why, n)| format!("{} {why}", int(*n)))
            .collect();
        let _ = writeln!(
            out,
            "  ! incomplete: {} requests not in the figures ({})",
            int(open),
            reasons.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render::fixtures;

    #[test]
    fn a_sweep_compares_profiling_rows_and_keeps_empty_runs() {
        let mut a = fixtures::two_phases();
        a.run.name = "a".into();
        let mut b = fixtures::empty();
        b.run.name = "b".into();
        let mut c = fixtures::one_phase();
        c.run.name = "c".into();
        c.rows[0].phase = "warmup".into();
        let s = sweep(&[a.clone(), b, c]);
        let got: Vec<(&str, &str, &str)> = s
            .lines
            .iter()
            .map(|l| (l.run.as_str(), l.phase.as_str(), l.target.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "profiling", "system_prefix"),
                ("a", "profiling", "first_turn_prefix"),
                ("b", "", ""),
                ("c", "warmup", "system_prefix"),
            ]
        );
        let row = &a.rows[3];
        let l = &s.lines[1];
        assert_eq!(l.errors, row.errors.count);
        assert_eq!(l.ttft_p99_ms, row.latency.ttft_ms.p99);
        assert_eq!(l.cached_share_reported, row.reported_hit_rate());
        assert_eq!(l.isolation, Isolation::Breached);
        assert_eq!(l.verdict, a.verdict.message);
        let table = render_runs(&[a], Format::Table, Colour::Never);
        assert!(
            table.starts_with("1 run: 1 isolation breached\n"),
            "{table}"
        );
    }

    #[test]
    fn the_summary_opens_with_the_verdict_and_says_what_is_missing() {
        let mut r = fixtures::two_phases();
        r.run.name = "c8".into();
        r.run.complete = false;
        r.run.unaccounted = std::collections::BTreeMap::from([("in_flight".to_string(), 3)]);
        let text = summary(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("kvbust run c8: {}", r.verdict.message));
        assert_eq!(lines.len(), 1 + r.rows.len() + 1, "{text}");
        assert!(
            lines[4].starts_with(
                "  profiling × first_turn_prefix: 300 requests, 5 errors, 4.0 req/s; TTFT p50 46.2 ms, p99 180.5 ms"
            ) || lines[4].contains("TTFT p50 46 ms"),
            "{text}"
        );
        assert!(lines[4].contains("cached 55."), "{text}");
        assert_eq!(
            lines[5],
            "  ! incomplete: 3 requests not in the figures (3 in_flight)"
        );
        assert!(summary(&fixtures::empty()).contains("no generation requests in this run"));
    }

    /// Five runs of a dial sweep (R = 0 to 1): TTFT falling as the hit rate rises.
    fn dial_sweep() -> Vec<Report> {
        [0.0, 0.25, 0.5, 0.75, 1.0]
            .iter()
            .map(|&r| {
                let mut rep = fixtures::dialled();
                rep.run.name = format!("r{}", ratio(r));
                let row = &mut rep.rows[1];
                *row = fixtures::row("profiling", "none", 60, r, true);
                row.hit_ratio = Some(r);
                row.dialled_requests = 60;
                row.latency.ttft_ms.p50 = Some(200.0 * (1.0 - r) + 5.0);
                row.latency.ttft_ms.p99 = Some(260.0 * (1.0 - r) + 9.0);
                rep.verdict.warmup_share = Some(r);
                rep
            })
            .collect()
    }

    /// Issue 40 (5): runs side by side show each run's dial beside its reported and predicted
    /// hit rate, in every format.
    #[test]
    fn a_dial_sweep_shows_the_dial_beside_the_hit_rates() {
        let reports = dial_sweep();
        let s = sweep(&reports);
        let dials: Vec<Option<f64>> = s.lines.iter().map(|l| l.hit_ratio).collect();
        assert_eq!(
            dials,
            [0.0, 0.25, 0.5, 0.75, 1.0].map(Some),
            "profiling lines only"
        );
        let table = render_runs(&reports, Format::Table, Colour::Never);
        let head = table.lines().nth(2).unwrap();
        assert!(
            head.contains("ITL p50 ms  dial  cached reported  cached predicted"),
            "{table}"
        );
        for (line, rep) in table.lines().skip(3).zip(&reports) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let row = &rep.rows[1];
            assert_eq!(f[0], rep.run.name);
            assert_eq!(f[f.len() - 3], ratio(row.hit_ratio.unwrap()), "{line}");
            assert_eq!(f[f.len() - 2], pct(row.reported_hit_rate().unwrap()));
            assert_eq!(f[f.len() - 1], pct(row.predicted_hit_rate().unwrap()));
        }
        let md = render_runs(&reports, Format::Markdown, Colour::Never);
        assert!(md.contains("| ITL p50 ms | dial | cached reported | cached predicted |"));
        assert!(md.contains("| 0.25 | "), "{md}");
        let page = render_runs(&reports, Format::Html, Colour::Never);
        assert!(page.contains("data-col=\"hit_ratio\" data-value=\"0.75\">0.75</td>"));
    }

    /// (run, x, value) of each point of a series' SVG.
    fn circles(series: &str) -> Vec<(String, f64, f64)> {
        let attr = |c: &str, k: &str| -> String {
            c.split(&format!(" {k}=\""))
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .into()
        };
        series
            .split("<circle ")
            .skip(1)
            .map(|c| {
                (
                    attr(c, "data-run"),
                    attr(c, "data-x").parse().unwrap(),
                    attr(c, "data-value").parse().unwrap(),
                )
            })
            .collect()
    }

    /// Issue 40 (6): a dial sweep's page plots TTFT p50 and p99 against the reported hit rate,
    /// each point at its run's reported share and named by its run; a concurrency sweep at one
    /// hit rate has no such chart.
    #[test]
    fn a_dial_sweep_plots_ttft_against_the_reported_hit_rate() {
        let reports = dial_sweep();
        let page = render_runs(&reports, Format::Html, Colour::Never);
        // The points in the order of the hit rate, each at its run's reported share.
        let chart = page
            .split("<svg id=\"chart-sweep-ttft-hit-rate\"")
            .nth(1)
            .expect("the hit-rate chart")
            .split("</svg>")
            .next()
            .unwrap();
        assert!(chart.contains("reported hit rate (cached / prompt tokens)"));
        let p50 = chart
            .split("data-series=\"ttft_p50\" data-points=\"5\">")
            .nth(1)
            .unwrap()
            .split("</g>")
            .next()
            .unwrap();
        let points = circles(p50);
        let want: Vec<(String, f64, f64)> = reports
            .iter()
            .map(|r| {
                let row = &r.rows[1];
                (
                    r.run.name.clone(),
                    row.reported_hit_rate().unwrap(),
                    row.latency.ttft_ms.p50.unwrap(),
                )
            })
            .collect();
        assert_eq!(points, want);
        // Each point named by its run, and the chart titled; it leads the charts.
        for r in &reports {
            assert!(
                chart.contains(&format!(">{}</text>", r.run.name)),
                "{}",
                r.run.name
            );
        }
        assert!(page.contains("<section><h3>TTFT against the reported hit rate</h3><svg id=\"chart-sweep-ttft-hit-rate\""));
        assert!(page.find("chart-sweep-ttft-hit-rate") < page.find("id=\"chart-sweep-ttft\""));
        // Warmup's cache serving dialled requests is what the dial asked for: no warning, and
        // grey, not the green of isolation held.
        assert!(!page.contains(" warn"), "{page}");
        assert!(page.contains(
            "<p class=\"verdict none\" id=\"verdict\">5 runs: 5 isolation not requested</p>"
        ));
    }

    /// A concurrency sweep at one hit rate: no dial column, no hit-rate chart; one target's
    /// cache serving more in one run makes it a hit-rate sweep.
    #[test]
    fn a_sweep_at_one_hit_rate_has_neither() {
        let mut plain = fixtures::two_phases();
        plain.run.name = "c1".into();
        let mut other = plain.clone();
        other.run.name = "c8".into();
        let both = [plain, other];
        let table = render_runs(&both, Format::Table, Colour::Never);
        assert!(!table.contains("dial"), "{table}");
        let page = render_runs(&both, Format::Html, Colour::Never);
        assert!(!page.contains("chart-sweep-ttft-hit-rate"));
        assert!(!page.contains("hit_ratio"));
        // The same runs, one target's cache serving more in one of them: a hit-rate sweep.
        let mut more = both.clone();
        more[1].rows[2].cached_tokens.reported = Some(more[1].rows[2].prompt_tokens.predicted);
        assert!(sweep_chart::is_hit_rate_sweep(&sweep(&more)));
    }

    #[test]
    fn the_summary_puts_the_dial_before_the_hit_rates() {
        let r = fixtures::dialled();
        let text = summary(&r);
        let lines: Vec<&str> = text.lines().collect();
        let row = &r.rows[1];
        assert!(
            lines[2].ends_with(&format!(
                "; dial 0.5: cached {} reported, {} predicted",
                pct(row.reported_hit_rate().unwrap()),
                pct(row.predicted_hit_rate().unwrap())
            )),
            "{text}"
        );
        assert!(!lines[1].contains("dial"), "warmup ran without one: {text}");
    }
}
