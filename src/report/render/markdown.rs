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
    let mut out = String::from("## kvbust run report\n\n| | |\n|---|---|\n");
    for f in &sheet.facts {
        let text = if f.key == "benchmark_id" {
            code(&f.text)
        } else {
            esc(&f.text)
        };
        out.push_str(&format!("| {} | {text} |\n", f.label));
    }
    if !sheet.lines.is_empty() {
        out.push('\n');
        let head: Vec<String> = Col::ALL
            .iter()
            .map(|c| match c.heading() {
                ("", name) => name.to_string(),
                (group, name) => format!("{group} {name}"),
            })
            .collect();
        let align: Vec<&str> = Col::ALL
            .iter()
            .map(|c| if c.numeric() { "---:" } else { "---" })
            .collect();
        out.push_str(&format!(
            "| {} |\n|{}|\n",
            head.join(" | "),
            align.join("|")
        ));
        for line in &sheet.lines {
            let cells: Vec<String> = Col::ALL
                .iter()
                .zip(&line.cells)
                .map(|(c, cell)| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render::{fixtures, int, ms, pct};

    /// The cells of each markdown table row (unescaped pipes split cells).
    fn rows(md: &str) -> Vec<Vec<String>> {
        md.lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                l.trim_matches('|')
                    .split(" | ")
                    .map(|c| c.trim().to_string())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn one_table_row_per_report_row_with_its_figures() {
        let r = fixtures::two_phases();
        let md = markdown(&r);
        let rows = rows(&md);
        assert_eq!(rows.len(), r.rows.len(), "{md}");
        for (cells, row) in rows.iter().zip(&r.rows) {
            assert_eq!(cells.len(), Col::ALL.len());
            assert_eq!(cells[0], format!("`{}`", row.phase));
            assert_eq!(cells[1], format!("`{}`", row.target));
            assert_eq!(cells[4], int(row.prompt_tokens.predicted));
            assert_eq!(cells[7], pct(row.reported_hit_rate().unwrap()));
            assert_eq!(cells[12], row.breaches.total().to_string());
            assert_eq!(cells[14], ms(row.latency.ttft_ms.p50.unwrap()));
        }
        // The heading and the alignment row have as many cells as the rows.
        let head = md.lines().find(|l| l.starts_with("| phase")).unwrap();
        assert_eq!(head.matches(" | ").count() + 1, Col::ALL.len());
        assert!(head.contains("hit rate predicted"));
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
        assert_eq!(rows(&md)[0].len(), Col::ALL.len());
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
}
