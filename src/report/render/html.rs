//! The report as one self-contained HTML page: inline CSS, the table, the notes and two inline
//! SVG charts. No script, no font, no image, nothing loaded from anywhere: the page opens the
//! same offline, from a CI artifact or an email. Elements a test (or a person with devtools)
//! looks for carry stable ids and `data-*` attributes holding the exact figures.

use std::fmt::Write as _;

use super::chart;
use super::esc;
use super::sheet::{Col, Sheet, Tone};
use crate::report::Report;

const STYLE: &str = "
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#111827;background:#fff;margin:0;padding:20px 24px;line-height:1.4}
h1{font-size:24px;margin:0 0 12px}
p.verdict{font-size:17px;font-weight:600;margin:0 0 16px;padding:10px 14px;border-left:6px solid #16a34a;background:#f0fdf4}
p.verdict.warn{border-color:#d97706;background:#fffbeb}
p.verdict[data-isolation=not_requested]{border-color:#9ca3af;background:#f9fafb}
p.verdict.bad{border-color:#dc2626;background:#fef2f2;color:#991b1b}
h2{font-size:17px;margin:28px 0 8px}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:0;font-size:14px}
dl.facts dt{color:#6b7280}
dl.facts dd{margin:0}
ul.notes{list-style:none;padding:0;margin:16px 0;font-size:14px}
ul.notes li{padding:6px 10px;margin:4px 0;border-left:4px solid #9ca3af;background:#f9fafb}
ul.notes li.warn{border-color:#d97706;background:#fffbeb}
ul.notes li.bad{border-color:#dc2626;background:#fef2f2}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums}
th,td{padding:4px 5px;border-bottom:1px solid #e5e7eb}
td{white-space:nowrap}
thead th{background:#f3f4f6;font-weight:600;vertical-align:bottom}
thead tr.groups th{border-bottom:none;color:#374151}
thead tr.groups th:not(:empty){border-bottom:1px solid #d1d5db}
th.num,td.num{text-align:right}
th.name,td.name{text-align:left}
td.missing{color:#9ca3af}
td.warn{color:#b45309;font-weight:600}
td.bad{color:#b91c1c;background:#fef2f2;font-weight:700}
svg.chart{width:100%;height:auto;display:block;border:1px solid #e5e7eb;border-radius:6px}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(720px,100%),1fr));gap:0 20px}
footer{margin-top:24px;color:#9ca3af;font-size:12px}
@media (max-width:1400px){body{padding:16px}table{font-size:12px}th,td{padding:3px 4px}}
";

/// The whole page.
pub(crate) fn page(report: &Report) -> String {
    let sheet = Sheet::of(report);
    let mut out = String::with_capacity(64 << 10);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\
         <title>kvbust run report: {}</title><style>{STYLE}</style></head>\n<body>\n\
         <h1>kvbust run report: {}</h1>\n<p class=\"verdict{}\" id=\"verdict\" data-isolation=\"{}\">{}</p>\n",
        esc(&report.run.name),
        esc(&report.run.name),
        tone_class(sheet.verdict.tone),
        sheet.verdict.key,
        esc(&sheet.verdict.text)
    );
    out.push_str("<dl class=\"facts\" id=\"facts\">");
    for f in &sheet.facts {
        let _ = write!(
            out,
            "<dt>{}</dt><dd data-fact=\"{}\">{}</dd>",
            esc(f.label),
            f.key,
            esc(&f.text)
        );
    }
    out.push_str("</dl>\n");
    notes(&mut out, &sheet);
    out.push_str("<h2>Cache and isolation, per phase and target</h2>\n");
    if sheet.lines.is_empty() {
        out.push_str("<p id=\"no-rows\">No generation requests in this run yet.</p>\n");
    } else {
        rows(&mut out, &sheet, "report-rows", &sheet.view(&Col::CACHE));
        out.push_str("<h2>Client's summary, measured on the wire</h2>\n");
        rows(&mut out, &sheet, "report-client", &sheet.view(&Col::CLIENT));
    }
    let _ = write!(
        out,
        "<div class=\"charts\"><section><h2>Hit rate per phase over time</h2>\n{}</section>\n\
         <section><h2>Mean time to first token per phase over time</h2>\n{}</section></div>\n\
         <footer>{}Predicted: kvbust's model of the upstream's prefix cache; reported: the \
         upstream's usage. Generated {} by kvbust report.</footer>\n</body></html>\n",
        chart::hit_rate(report),
        chart::ttft(report),
        if report.timeline.buckets.is_empty() {
            String::new()
        } else {
            format!("One point per {}-second bucket. ", report.timeline.bucket_s)
        },
        esc(&report.run.generated_at)
    );
    out
}

fn tone_class(t: Tone) -> &'static str {
    match t {
        Tone::Plain => "",
        Tone::Missing => " missing",
        Tone::Warn => " warn",
        Tone::Bad => " bad",
    }
}

fn notes(out: &mut String, sheet: &Sheet) {
    if sheet.notes.iter().all(|n| n.key == "empty") {
        return;
    }
    out.push_str("<ul class=\"notes\" id=\"notes\">");
    // An empty run is said where the rows would be.
    for n in sheet.notes.iter().filter(|n| n.key != "empty") {
        let _ = write!(
            out,
            "<li class=\"note{}\" data-note=\"{}\">{}</li>",
            tone_class(n.tone),
            n.key,
            esc(&n.text)
        );
    }
    out.push_str("</ul>\n");
}

fn rows(out: &mut String, sheet: &Sheet, id: &str, cols: &[Col]) {
    let _ = write!(
        out,
        "<div class=\"scroll\"><table id=\"{id}\"><thead><tr class=\"groups\">"
    );
    // Runs of columns under one heading become one cell spanning them.
    let mut i = 0;
    while i < cols.len() {
        let group = cols[i].heading().0;
        let span = cols[i..]
            .iter()
            .take_while(|c| !group.is_empty() && c.heading().0 == group)
            .count()
            .max(1);
        let _ = write!(out, "<th colspan=\"{span}\">{}</th>", esc(group));
        i += span;
    }
    out.push_str("</tr><tr>");
    for c in cols {
        let class = if c.numeric() { "num" } else { "name" };
        let _ = write!(out, "<th class=\"{class}\">{}</th>", esc(c.heading().1));
    }
    out.push_str("</tr></thead><tbody>");
    for line in &sheet.lines {
        let _ = write!(
            out,
            "<tr class=\"row\" data-phase=\"{}\" data-target=\"{}\">",
            esc(&line.phase),
            esc(&line.target)
        );
        for c in cols {
            let cell = line.cell(*c);
            let class = if c.numeric() { "num" } else { "name" };
            let value = cell
                .value
                .map(|v| format!(" data-value=\"{v}\""))
                .unwrap_or_default();
            let _ = write!(
                out,
                "<td class=\"{class}{}\" data-col=\"{}\"{value}>{}</td>",
                tone_class(cell.tone),
                c.key(),
                esc(&cell.text)
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render::fixtures;

    /// The `data-value` of the cell of `col` in the row of `phase` × `target`.
    fn value(page: &str, phase: &str, target: &str, col: &str) -> Option<f64> {
        let start = format!("data-phase=\"{phase}\" data-target=\"{target}\">");
        // The row's line in whichever table shows the column.
        let cell = page
            .split(&start)
            .skip(1)
            .filter_map(|rest| rest.split("</tr>").next())
            .find_map(|row| row.split(&format!("data-col=\"{col}\"")).nth(1))?;
        let tag = cell.split('>').next()?;
        tag.split("data-value=\"")
            .nth(1)?
            .split('"')
            .next()?
            .parse()
            .ok()
    }

    #[test]
    fn the_page_is_self_contained() {
        let page = page(&fixtures::two_phases());
        assert!(page.starts_with("<!DOCTYPE html>"));
        for banned in ["<script", "src=", "href=", "@import", "url("] {
            assert!(!page.contains(banned), "{banned}");
        }
        assert_eq!(page.matches("<svg ").count(), 2);
        // The page takes the window's width: no cap that would hide columns at 1920 px.
        assert!(!page.contains("max-width:1200px"));
        assert!(page.contains("id=\"chart-hit-rate\"") && page.contains("id=\"chart-ttft\""));
    }

    #[test]
    fn cells_carry_exact_figures() {
        let r = fixtures::two_phases();
        let page = page(&r);
        for row in &r.rows {
            let v = |col| value(&page, &row.phase, &row.target, col);
            assert_eq!(v("hit_predicted"), row.predicted_hit_rate());
            assert_eq!(v("hit_reported"), row.reported_hit_rate());
            assert_eq!(
                v("cached_reported"),
                row.cached_tokens.reported.map(|n| n as f64)
            );
            assert_eq!(v("breaches"), Some(row.breaches.total() as f64));
            assert_eq!(v("ttft_p50_ms"), row.latency.ttft_ms.p50);
            assert_eq!(v("e2e_p90_ms"), row.latency.e2e_ms.p90);
            assert_eq!(v("tpot_avg_ms"), row.latency.tpot_ms.avg);
            assert_eq!(v("errors"), Some(row.errors.count as f64));
            assert_eq!(v("requests_per_s"), row.throughput.requests_per_s);
        }
        assert!(
            page.contains("<td class=\"num bad\" data-col=\"breaches\" data-value=\"4\">4</td>")
        );
        assert!(page.contains("<th colspan=\"2\">hit rate</th>"));
        assert!(page.contains("data-note=\"breaches\""));
        assert!(page.contains("data-note=\"errors\""));
        // The verdict opens the page, right under the title.
        let body = page.split("<body>\n").nth(1).unwrap();
        let verdict = body.split('\n').nth(1).unwrap();
        assert_eq!(
            verdict,
            format!(
                "<p class=\"verdict bad\" id=\"verdict\" data-isolation=\"breached\">{}</p>",
                esc(&r.verdict.message)
            )
        );
        assert_eq!(page.matches("<tr class=\"row\"").count(), 2 * r.rows.len());
    }

    #[test]
    fn names_are_escaped() {
        let mut r = fixtures::one_phase();
        r.rows[0].target = "<b>\"x\"</b>".into();
        r.run.name = "a&b".into();
        let page = page(&r);
        assert!(!page.contains("<b>"));
        assert!(page.contains("data-target=\"&lt;b&gt;&quot;x&quot;&lt;/b&gt;\""));
        assert!(page.contains("<title>kvbust run report: a&amp;b</title>"));
    }

    #[test]
    fn silent_upstream_and_empty_run() {
        let page = page(&fixtures::silent_upstream());
        assert!(page.contains("<li class=\"note warn\" data-note=\"upstream_silent\">"));
        assert!(page.contains("data-col=\"hit_reported\">-</td>"));
        let page = super::page(&fixtures::empty());
        assert!(page.contains("id=\"no-rows\""));
        assert_eq!(
            page.matches("No generation requests in this run yet")
                .count(),
            1
        );
        assert!(!page.contains("id=\"notes\""), "nothing else to note");
        assert!(!page.contains("id=\"report-rows\""));
        assert_eq!(page.matches("no data in this run yet").count(), 2);
    }

    /// Issue 40 (5): the page's cache table shows the dial under "hit rate", with its exact
    /// value; rows without a dial a dash; a report without a dial no such column.
    #[test]
    fn a_dialled_run_shows_the_dial_beside_the_hit_rates() {
        let r = fixtures::dialled();
        let page = page(&r);
        assert_eq!(value(&page, "profiling", "none", "hit_ratio"), Some(0.5));
        assert_eq!(
            value(&page, "profiling", "none", "hit_reported"),
            r.rows[1].reported_hit_rate()
        );
        assert_eq!(
            value(&page, "profiling", "none", "hit_predicted"),
            r.rows[1].predicted_hit_rate()
        );
        assert!(page.contains("<td class=\"num missing\" data-col=\"hit_ratio\">-</td>"));
        assert!(
            page.contains("<th colspan=\"3\">hit rate</th>"),
            "dial, reported, predicted"
        );
        assert!(page.contains("<th class=\"num\">dial</th>"));
        assert!(!super::page(&fixtures::two_phases()).contains("hit_ratio"));
    }
}
