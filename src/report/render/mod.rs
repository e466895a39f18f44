//! The run report as a person reads it: a terminal table, GitHub markdown, or one self-contained
//! HTML page with charts. Pure: `&Report` in, `String` out. Every format renders the same
//! [`sheet::Sheet`] (facts, one row per phase × target, notes), so they cannot disagree. Never
//! fetches, writes or reads the environment (the command line decides colour and destination).

mod chart;
mod html;
mod markdown;
mod runs;
mod sheet;
mod sweep_chart;
mod table;

pub use runs::{render_runs, summary, sweep};
pub use table::{table, table_with};

use super::Report;

/// An output format of `kvbust report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for a terminal (coloured only on one).
    #[default]
    Table,
    /// The report as fetched, pretty-printed.
    Json,
    /// GitHub markdown tables.
    Markdown,
    /// One self-contained page: the table and charts of hit rate and TTFT over time.
    Html,
}

/// Whether the table may carry ANSI colour codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    Never,
    Ansi,
}

/// `report` in `format`; ends with a newline.
pub fn render(report: &Report, format: Format, colour: Colour) -> String {
    match format {
        Format::Table => table_with(report, colour),
        Format::Json => json(report),
        Format::Markdown => markdown::markdown(report),
        Format::Html => html::page(report),
    }
}

/// JSON text (one value) re-indented as serde_json's pretty printer would, byte for byte in every
/// string and number: `kvbust report --format json` shows what the admin port sent, numbers
/// and unknown fields included, not what this kvbust parsed of it.
pub fn pretty_json(raw: &str) -> String {
    fn newline(out: &mut String, depth: usize) {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    }
    let mut out = String::with_capacity(raw.len() * 2);
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                let close = if c == '{' { '}' } else { ']' };
                // An empty object or array stays on its line.
                if chars.peek() == Some(&close) {
                    chars.next();
                    out.push(close);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out.push('\n');
    out
}

/// The report pretty-printed, in the order of its fields.
pub fn json(report: &Report) -> String {
    // Plain data (strings, numbers, maps with string keys): serde_json cannot fail on it.
    let mut s = serde_json::to_string_pretty(report)
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot serialize the report: {e}\"}}"));
    s.push('\n');
    s
}

/// Text safe in HTML content and in double-quoted attributes.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `1234567` -> `1,234,567`.
pub(crate) fn int(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate in 0..=1 as a percentage with one decimal: `0.8123` -> `81.2%`.
pub(crate) fn pct(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

/// A ratio in 0..=1 as it is set (`cache_bust.hit_ratio = 0.25`): at most three decimals, no
/// trailing zeros: `0`, `0.25`, `1`, `0.417`.
pub(crate) fn ratio(v: f64) -> String {
    // `+ 0.0` turns -0 into 0, so no `-0` is shown.
    let text = format!("{:.3}", v + 0.0);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Milliseconds: one decimal under 10, whole (with thousands separators) above.
pub(crate) fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.1}")
    } else {
        // A latency is far below u64::MAX milliseconds; `as` saturates if not.
        int(v.round() as u64)
    }
}

/// A rate per second: one decimal under 100, whole (with thousands separators) above.
pub(crate) fn per_s(v: f64) -> String {
    if v < 100.0 {
        format!("{v:.1}")
    } else {
        int(v.round() as u64)
    }
}

/// Seconds as a person reads a run's length: `42.3 s`, `12m 03s`, `1h 02m 03s`.
pub(crate) fn duration(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "-".into();
    }
    if s < 60.0 {
        return format!("{s:.1} s");
    }
    let total = s.round() as u64;
    let (h, m, sec) = (total / 3600, total / 60 % 60, total % 60);
    if h > 0 {
        format!("{h}h {m:02}m {sec:02}s")
    } else {
        format!("{m}m {sec:02}s")
    }
}

#[cfg(test)]
pub(crate) mod fixtures;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_a_person_writes_them() {
        assert_eq!(int(0), "0");
        assert_eq!(int(999), "999");
        assert_eq!(int(1000), "1,000");
        assert_eq!(int(1_234_567), "1,234,567");
        assert_eq!(pct(0.8123), "81.2%");
        assert_eq!(pct(1.0), "100.0%");
        for (v, want) in [
            (0.0, "0"),
            (0.25, "0.25"),
            (0.5, "0.5"),
            (1.0, "1"),
            (0.41666, "0.417"),
        ] {
            assert_eq!(ratio(v), want);
        }
        assert_eq!(ratio(-0.0), "0");
        assert_eq!(ms(4.26), "4.3");
        assert_eq!(ms(1234.4), "1,234");
        assert_eq!(duration(42.34), "42.3 s");
        assert_eq!(duration(723.0), "12m 03s");
        assert_eq!(duration(3723.0), "1h 02m 03s");
        assert_eq!(duration(f64::NAN), "-");
    }

    #[test]
    fn pretty_json_is_serde_jsons_pretty_print_of_the_bytes_as_sent() {
        for r in [
            fixtures::two_phases(),
            fixtures::empty(),
            fixtures::silent_upstream(),
        ] {
            let compact = serde_json::to_string(&r).unwrap();
            assert_eq!(pretty_json(&compact), json(&r));
            // Already indented, or spaced otherwise: the same text.
            assert_eq!(pretty_json(&json(&r)), json(&r));
        }
        // Strings keep their bytes (escapes, brackets, colons); numbers their digits.
        let raw = r#"{"a" : ["x\"{,:}", 51.95000000000000001 ,{}, []],"b":{"c":null}}"#;
        let want = "{\n  \"a\": [\n    \"x\\\"{,:}\",\n    51.95000000000000001,\n    {},\n    []\n  ],\n  \"b\": {\n    \"c\": null\n  }\n}\n";
        assert_eq!(pretty_json(raw), want);
    }

    #[test]
    fn every_format_ends_with_a_newline() {
        let r = fixtures::two_phases();
        for f in [Format::Table, Format::Json, Format::Markdown, Format::Html] {
            assert!(render(&r, f, Colour::Never).ends_with('\n'), "{f:?}");
        }
    }
}
