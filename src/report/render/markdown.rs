//! The report as GitHub markdown: the run's facts and the rows as tables, the notes as a list.
//! Same content as the terminal table; never adds figures of its own.

use super::sheet::{Col, Sheet, Tone};
use crate::report::Report;

/// Cell text safe inside a GitHub table: no pipe ends the cell, no newline ends the row, no
/// angle bracket opens an HTML tag.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace(['\n', '\r'], " ")
}

/// A name as inline code (backticks in it dropped: names never carry them).
fn code(s: &str) -> String {
    format!("`{}`", esc(&s.replace('`', "'")))
}

pub(crate) fn markdown(report: &Report) -> String {
    let sheet = Sheet::of(report);
    let mark = match sheet.verdict.tone {
        Tone::Bad => "❌ ",
        Tone::Warn => "⚠️ ",
        Tone::Plain | Tone::Missing => "",
    };
    let mut out = format!(
        "## kvbust run report: {}\n\n**{mark}{}**\n\n| | |\n|---|---|\n",
        code(&report.run.name),
        esc(&sheet.verdict.text)
    );
    for f in &sheet.facts {
        let text = if matches!(f.key, "benchmark_id" | "run" | "command") {
            code(&f.text)
        } else {
            esc(&f.text)
        };
        out.push_str(&format!("| {} | {text} |\n", f.label));
    }
    if !sheet.lines.is_empty() {
        out.push_str("\n### Cache and isolation\n\n");
        grid(&mut out, &sheet, &sheet.view(&Col::CACHE));
        out.push_str("\n### Client's summary, measured on the wire\n\n");
        grid(&mut out, &sheet, &sheet.view(&Col::CLIENT));
    }
    if !sheet.notes.is_empty() {
        out.push('\n');
    }
    for n in &sheet.notes {
        let mark = match n.tone {
            Tone::Bad => "**breach:** ",
            Tone::Warn => "**note:** ",
            Tone::Plain | Tone::Missing => "",
        };
        out.push_str(&format!("- {mark}{}\n", esc(&n.text)));
    }
    out
}

/// One table of `cols`, a row per line.
fn grid(out: &mut String, sheet: &Sheet, cols: &[Col]) {
    let head: Vec<String> = cols
        .iter()
        .map(|c| match c.heading() {
            ("", name) => name.to_string(),
            (group, name) => format!("{group} {name}"),
        })
        .collect();
    let align: Vec<&str> = cols
        .iter()
        .map(|c| if c.numeric() { "---:" } else { "---" })
        .collect();
    out.push_str(&format!(
        "| {} |\n|{}|\n",
        head.join(" | "),
        align.join("|")
    ));
    for line in &sheet.lines {
        let cells: Vec<String> = cols
            .iter()
            .map(|c| {
                let cell = line.cell(*c);
                if c.numeric() {
                    esc(&cell.text)
                } else {
                    code(&cell.text)
                }
            })
            .collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render::{fixtures, int, ms, pct};

    /// The cells of each row of the `nth` table of rows (0: cache, 1: client; unescaped
    /// pipes split cells).
    fn rows_of(md: &str, nth: usize) -> Vec<Vec<String>> {
        let table = md.split("\n### ").nth(nth + 1).unwrap_or("");
        table
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                l.trim_matches('|')
                    .split(" | ")
                    .map(|c| c.trim().to_string())
                    .collect()
            })
            .collect()
    }

    fn rows(md: &str) -> Vec<Vec<String>> {
        rows_of(md, 0)
    }

    #[test]
    fn one_table_row_per_report_row_with_its_figures() {
        let r = fixtures::two_phases();
        let md = markdown(&r);
        let rows = rows(&md);
        assert_eq!(rows.len(), r.rows.len(), "{md}");
        for (cells, row) in rows.iter().zip(&r.rows) {
            assert_eq!(cells.len(), Col::CACHE.len() - 1, "no dial column");
            assert_eq!(cells[0], format!("`{}`", row.phase));
            assert_eq!(cells[1], format!("`{}`", row.target));
            assert_eq!(cells[4], int(row.prompt_tokens.predicted));
            assert_eq!(cells[7], pct(row.reported_hit_rate().unwrap()));
            assert_eq!(cells[12], row.breaches.total().to_string());
            assert_eq!(cells[13], int(row.compactions));
        }
        let client = rows_of(&md, 1);
        assert_eq!(client.len(), r.rows.len(), "{md}");
        for (cells, row) in client.iter().zip(&r.rows) {
            assert_eq!(cells.len(), Col::CLIENT.len());
            assert_eq!(cells[1], format!("`{}`", row.target));
            assert_eq!(cells[2], int(row.throughput.successful_requests));
            assert_eq!(cells[3], int(row.errors.count));
            assert_eq!(cells[7], ms(row.latency.ttft_ms.p50.unwrap()));
            assert_eq!(cells[9], ms(row.latency.ttft_ms.p99.unwrap()));
            assert_eq!(cells[11], ms(row.latency.itl_ms.p50.unwrap()));
            assert_eq!(cells[19], ms(row.latency.e2e_ms.p99.unwrap()));
        }
        // The verdict opens, under the title.
        let first: Vec<&str> = md.lines().filter(|l| !l.is_empty()).take(2).collect();
        assert_eq!(first[0], "## kvbust run report: `run-1`");
        assert_eq!(first[1], format!("**❌ {}**", esc(&r.verdict.message)));
        // The heading and the alignment row have as many cells as the rows.
        let head = md.lines().find(|l| l.starts_with("| phase")).unwrap();
        assert_eq!(head.matches(" | ").count() + 1, Col::CACHE.len() - 1);
        assert!(head.contains("hit rate predicted"));
        assert!(!head.contains("dial"), "no row ran under the dial: {head}");
        assert!(md.contains("|---|---|---:|"));
        assert!(md.contains("- **breach:** isolation breached in profiling × first_turn_prefix"));
        assert!(md.contains("| benchmark | `bench-7f3a` |"));
    }

    #[test]
    fn pipes_and_tags_cannot_break_the_table() {
        let mut r = fixtures::one_phase();
        r.rows[0].target = "a|b<script>".into();
        let md = markdown(&r);
        assert!(md.contains("`a\\|b&lt;script&gt;`"), "{md}");
        assert_eq!(rows(&md)[0].len(), Col::CACHE.len() - 1);
    }

    #[test]
    fn silent_upstream_empty_run_and_one_phase() {
        let md = markdown(&fixtures::silent_upstream());
        assert!(md.contains("- **note:** the upstream does not report cached tokens"));
        for cells in rows(&md) {
            assert_eq!((&*cells[5], &*cells[7]), ("-", "-"));
        }
        let md = markdown(&fixtures::empty());
        assert!(rows(&md).is_empty());
        assert!(!md.contains("| phase"));
        assert!(md.contains("- no generation requests in this run yet"));
        let md = markdown(&fixtures::one_phase());
        assert_eq!(rows(&md).len(), 1);
        assert!(
            !md.contains("**note:**") && !md.contains("**breach:**"),
            "{md}"
        );
    }

    /// Issue 40 (5): the cache table of a dialled run carries the dial before the hit rates.
    #[test]
    fn a_dialled_run_shows_the_dial_beside_the_hit_rates() {
        let r = fixtures::dialled();
        let md = markdown(&r);
        let head = md.lines().find(|l| l.starts_with("| phase")).unwrap();
        assert!(
            head.contains("| hit rate dial | hit rate reported | hit rate predicted |"),
            "{head}"
        );
        let rows = rows(&md);
        assert_eq!(rows[0].len(), Col::CACHE.len());
        assert_eq!(rows[0][7], "-", "warmup ran without a dial");
        assert_eq!(rows[1][7], "0.5");
        assert_eq!(rows[1][8], pct(r.rows[1].reported_hit_rate().unwrap()));
        assert_eq!(rows[1][9], pct(r.rows[1].predicted_hit_rate().unwrap()));
        // The client's table has no hit rates, so no dial.
        assert_eq!(rows_of(&md, 1)[0].len(), Col::CLIENT.len());
    }
}
