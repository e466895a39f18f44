//! The report as aligned plain text: what a person reads in a terminal at the end of a benchmark,
//! and what the server logs once on SIGTERM. ANSI colour only when the caller asks for it (the
//! command line does on a terminal); never decides that itself.

use super::sheet::{Col, Sheet, Tone};
use super::Colour;
use crate::report::Report;

/// Columns are this far apart.
const GAP: &str = "  ";

/// The report as plain aligned text, no colour: for logs, files and pipes.
pub fn table(report: &Report) -> String {
    table_with(report, Colour::Never)
}

/// The report as aligned text, coloured when `colour` says so (widths ignore the codes).
pub fn table_with(report: &Report, colour: Colour) -> String {
    let mut sheet = Sheet::of(report);
    // Texts a client chose (a benchmark id, a tokenizer path) reach a terminal: no character
    // of theirs may move the cursor, recolour it or reorder what follows.
    for f in &mut sheet.facts {
        f.text = escaped(&f.text);
    }
    for c in sheet.lines.iter_mut().flat_map(|l| l.cells.iter_mut()) {
        c.text = escaped(&c.text);
    }
    for n in &mut sheet.notes {
        n.text = escaped(&n.text);
    }
    let paint = |tone: Tone, text: &str| -> String {
        let code = match (colour, tone) {
            (Colour::Never, _) | (_, Tone::Plain) => return text.to_string(),
            (Colour::Ansi, Tone::Missing) => "2",
            (Colour::Ansi, Tone::Warn) => "33",
            (Colour::Ansi, Tone::Bad) => "1;31",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    };
    // The verdict first: the one line a person must read.
    let mut out = paint(sheet.verdict.tone, &sheet.verdict.text);
    out.push_str("\n\n");
    out.push_str(&bold(colour, "kvbust run report"));
    out.push('\n');
    let label_w = sheet.facts.iter().map(|f| f.label.len()).max().unwrap_or(0);
    for f in &sheet.facts {
        out.push_str(&format!("  {:<label_w$}  {}\n", f.label, f.text));
    }
    if !sheet.lines.is_empty() {
        out.push('\n');
        out.push_str(&grid(&sheet, colour, &paint));
    }
    if !sheet.notes.is_empty() {
        out.push('\n');
    }
    for n in &sheet.notes {
        let mark = if n.tone == Tone::Plain { " " } else { "!" };
        out.push_str(&paint(n.tone, &format!("{mark} {}", n.text)));
        out.push('\n');
    }
    out
}

/// `text` with control characters (C0, DEL, C1: U+009B opens a terminal command as ESC [
/// does) and bidirectional formatting characters (U+202E turns what follows around) written
/// as `\u{…}`; everything else as it is.
fn escaped(text: &str) -> String {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hidden) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            out.push_str(&format!("\\u{{{:04x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn bold(colour: Colour, text: &str) -> String {
    match colour {
        Colour::Never => text.to_string(),
        Colour::Ansi => format!("\x1b[1m{text}\x1b[0m"),
    }
}

fn width(s: &str) -> usize {
    s.chars().count()
}

/// Pads `text` to `w` (right-aligned for numbers), then paints it, so codes never shift columns.
fn pad(text: &str, w: usize, right: bool) -> String {
    if right {
        format!("{text:>w$}")
    } else {
        format!("{text:<w$}")
    }
}

/// Runs of adjacent columns under one heading: (first column, last column, heading).
fn spans(cols: &[Col]) -> Vec<(usize, usize, &'static str)> {
    let mut out: Vec<(usize, usize, &'static str)> = Vec::new();
    for (i, c) in cols.iter().enumerate() {
        let (group, _) = c.terminal_heading();
        match out.last_mut() {
            Some(last) if !group.is_empty() && last.2 == group => last.1 = i,
            _ => out.push((i, i, group)),
        }
    }
    out
}

/// Column widths: the widest of the heading and the cells, widened so a run's heading fits.
fn widths(sheet: &Sheet, cols: &[Col]) -> Vec<usize> {
    let mut w: Vec<usize> = cols
        .iter()
        .map(|c| {
            sheet
                .lines
                .iter()
                .map(|l| width(&l.cell(*c).text))
                .chain([width(c.terminal_heading().1)])
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (a, b, group) in spans(cols) {
        let have: usize = w[a..=b].iter().sum::<usize>() + GAP.len() * (b - a);
        // A heading over several columns gets a dash and a space either side.
        let need = width(group) + if a < b { 4 } else { 0 };
        if !group.is_empty() && have < need {
            // Shared out over the run, the first columns taking the remainder.
            let (extra, n) = (need - have, b - a + 1);
            for (k, col) in w[a..=b].iter_mut().enumerate() {
                *col += extra / n + usize::from(k < extra % n);
            }
        }
    }
    w
}

fn grid(sheet: &Sheet, colour: Colour, paint: &dyn Fn(Tone, &str) -> String) -> String {
    // The terminal's columns, the dial among them only when a row ran under it.
    let cols = sheet.view(&Col::TERMINAL);
    let w = widths(sheet, &cols);
    let mut groups = Vec::new();
    for (a, b, group) in spans(&cols) {
        let span: usize = w[a..=b].iter().sum::<usize>() + GAP.len() * (b - a);
        groups.push(if group.is_empty() {
            " ".repeat(span)
        } else if a == b {
            pad(group, span, cols[a].numeric())
        } else {
            let label = format!(" {group} ");
            let dashes = span - width(&label);
            let left = dashes / 2;
            format!("{}{label}{}", "-".repeat(left), "-".repeat(dashes - left))
        });
    }
    let names: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| bold(colour, &pad(c.terminal_heading().1, w[i], c.numeric())))
        .collect();
    let mut out = String::new();
    for row in [groups.join(GAP), names.join(GAP)] {
        out.push_str(row.trim_end());
        out.push('\n');
    }
    for line in &sheet.lines {
        let cells: Vec<String> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let cell = line.cell(*c);
                paint(cell.tone, &pad(&cell.text, w[i], c.numeric()))
            })
            .collect();
        out.push_str(cells.join(GAP).trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render::{fixtures, int, ms, pct};

    /// The data lines of a plain table: those after the two heading lines of the grid.
    fn data_lines(text: &str, rows: usize) -> Vec<&str> {
        let lines: Vec<&str> = text.lines().collect();
        let head = lines
            .iter()
            .position(|l| l.trim_start().starts_with("phase"))
            .expect("a heading line");
        lines[head + 1..head + 1 + rows].to_vec()
    }

    /// The byte offset where the `k`-th whitespace-separated field of `line` ends.
    fn field_end(line: &str, k: usize) -> usize {
        let mut fields = 0;
        let mut in_field = false;
        for (i, c) in line.char_indices() {
            if c.is_whitespace() && in_field {
                if fields == k + 1 {
                    return i;
                }
                in_field = false;
            } else if !c.is_whitespace() && !in_field {
                fields += 1;
                in_field = true;
            }
        }
        line.len()
    }

    /// Issue 42 (9): a benchmark id a client chose with terminal controls (CSI as U+009B, ESC)
    /// and a right-to-left override comes out escaped, in plain and coloured tables alike.
    #[test]
    fn client_chosen_text_cannot_control_the_terminal() {
        let mut r = fixtures::two_phases();
        r.run.benchmark_id = "evil\u{9b}2J\u{1b}[31m\u{202e}gnp.exe\u{2069}\n".into();
        for colour in [Colour::Never, Colour::Ansi] {
            let text = table_with(&r, colour);
            for c in ['\u{9b}', '\u{202e}', '\u{2069}'] {
                assert!(!text.contains(c), "{c:?} in {text}");
            }
            assert!(
                text.contains("evil\\u{009b}2J\\u{001b}[31m\\u{202e}gnp.exe\\u{2069}\\u{000a}"),
                "{text}"
            );
        }
        assert!(!table(&r).contains('\x1b'), "no ESC at all without colour");
    }

    #[test]
    fn one_aligned_line_per_row_with_its_figures() {
        let r = fixtures::two_phases();
        let text = table(&r);
        assert!(!text.contains('\x1b'), "no colour unless asked");
        let head = text.lines().find(|l| l.starts_with("phase")).unwrap();
        let lines = data_lines(&text, r.rows.len());
        for (line, row) in lines.iter().zip(&r.rows) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), Col::TERMINAL.len() - 1, "no dial: {line}");
            assert_eq!(fields[0], row.phase);
            assert_eq!(fields[1], row.target);
            assert_eq!(
                fields[2],
                format!("{}/{}", int(row.accounted_requests), int(row.requests))
            );
            assert_eq!(fields[3], int(row.errors.count));
            assert_eq!(fields[4], pct(row.reported_hit_rate().unwrap()));
            assert_eq!(fields[5], pct(row.predicted_hit_rate().unwrap()));
            assert_eq!(fields[6], row.breaches.total().to_string());
            assert_eq!(fields[7], ms(row.latency.ttft_ms.p50.unwrap()));
            assert_eq!(fields[8], ms(row.latency.ttft_ms.p99.unwrap()));
            assert_eq!(fields[9], ms(row.latency.itl_ms.p50.unwrap()));
            assert_eq!(fields[10], ms(row.latency.e2e_ms.p50.unwrap()));
            // Right-aligned numbers end where their heading ends.
            assert_eq!(field_end(line, 5), head.rfind("predicted").unwrap() + 9);
        }
        // Every data line is as wide as the heading (the last column is right-aligned).
        for line in &lines {
            assert_eq!(line.len(), head.len(), "{line}\n{head}");
        }
        assert!(text.contains("- hit rate -"), "{text}");
        assert!(text.contains("! isolation breached in profiling × first_turn_prefix"));
        assert!(text.contains("! 12 requests unaccounted"));
        assert!(text.contains(r.cache_model.note.as_deref().unwrap()));
        assert!(text.contains("benchmark     bench-7f3a"), "{text}");
        // The verdict first.
        assert_eq!(text.lines().next(), Some(r.verdict.message.as_str()));
        // Narrow enough for a laptop's terminal.
        assert!(head.len() <= 124, "{} wide: {head}", head.len());
        assert!(text.contains("1h 02m 03s"));
    }

    #[test]
    fn colour_only_when_asked_and_only_around_cells() {
        let r = fixtures::two_phases();
        let plain = table(&r);
        let coloured = table_with(&r, Colour::Ansi);
        assert!(coloured.contains("\x1b[1;31m"), "breaches in red");
        // Without its codes, the coloured table is the plain one.
        let mut stripped = String::new();
        let mut rest = coloured.as_str();
        while let Some(i) = rest.find('\x1b') {
            stripped.push_str(&rest[..i]);
            let end = rest[i..].find('m').unwrap();
            rest = &rest[i + end + 1..];
        }
        stripped.push_str(rest);
        assert_eq!(stripped, plain);
    }

    #[test]
    fn a_silent_upstream_gets_dashes_and_the_hint() {
        let r = fixtures::silent_upstream();
        let text = table(&r);
        for line in data_lines(&text, 2) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields[4], "-", "hit reported: {line}");
        }
        assert!(text.contains("! the upstream does not report cached tokens"));
        assert!(text.contains("--enable-prompt-tokens-details"));
    }

    #[test]
    fn the_verdict_opens_and_a_breach_is_red() {
        let mut r = fixtures::two_phases();
        r.verdict.isolation = crate::report::Isolation::Breached;
        r.verdict.message = String::new();
        r.verdict.reused_from_warmup_tokens = 1234;
        let plain = table(&r);
        let first = plain.lines().next().unwrap();
        assert!(
            first.starts_with("isolation breached: 1,234 prompt tokens"),
            "{plain}"
        );
        let coloured = table_with(&r, Colour::Ansi);
        assert!(
            coloured.starts_with(&format!("\x1b[1;31m{first}\x1b[0m\n")),
            "{coloured}"
        );
    }

    #[test]
    fn an_empty_run_has_no_grid() {
        let text = table(&fixtures::empty());
        assert!(!text.contains("phase"), "{text}");
        assert!(text.contains("no generation requests in this run yet"));
        assert!(text.contains("not yet known whether it reports cached tokens"));
    }

    #[test]
    fn one_phase_only() {
        let r = fixtures::one_phase();
        let text = table(&r);
        let lines = data_lines(&text, 1);
        assert!(lines[0].starts_with("profiling  system_prefix"), "{text}");
        let after: Vec<&str> = text.lines().skip_while(|l| *l != lines[0]).collect();
        assert!(after.get(1).is_none_or(|l| l.is_empty()), "one row: {text}");
        assert!(!text.contains('!'), "nothing to warn about: {text}");
    }

    /// Issue 40 (5): a dialled run's table shows the dial first in the hit-rate group, then
    /// the reported and predicted hit rate; a row without a dial a dash.
    #[test]
    fn a_dialled_run_shows_the_dial_beside_the_hit_rates() {
        let r = fixtures::dialled();
        let text = table(&r);
        let head = text.lines().find(|l| l.starts_with("phase")).unwrap();
        let names: Vec<&str> = head.split_whitespace().collect();
        let dial = names
            .iter()
            .position(|n| *n == "dial")
            .expect("a dial column");
        assert_eq!(&names[dial..dial + 3], ["dial", "reported", "predicted"]);
        let lines = data_lines(&text, 2);
        for (line, row) in lines.iter().zip(&r.rows) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), Col::TERMINAL.len(), "{line}");
            // phase, target, requests, errors, then the hit-rate group.
            let want = row
                .hit_ratio
                .map_or("-".to_string(), crate::report::render::ratio);
            assert_eq!(fields[4], want, "{line}");
            assert_eq!(fields[5], pct(row.reported_hit_rate().unwrap()));
            assert_eq!(fields[6], pct(row.predicted_hit_rate().unwrap()));
            assert_eq!(line.len(), head.len(), "{line}\n{head}");
        }
        assert_eq!(lines[1].split_whitespace().nth(4), Some("0.5"));
        // The group's heading spans the dial too: its dashes start over the dial column.
        let groups = text.lines().find(|l| l.contains(" hit rate ")).unwrap();
        let dial_at = head.find("dial").unwrap();
        let dashes_at = groups.find("-").unwrap();
        assert!(dashes_at <= dial_at, "{groups}\n{head}");
        assert!(head.len() <= 130, "{} wide: {head}", head.len());
    }
}
