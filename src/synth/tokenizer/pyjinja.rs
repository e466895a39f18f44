//! What transformers gives a chat template beyond Jinja itself, made to behave as in Python:
//! the `tojson` filter (`json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)`,
//! not minijinja's HTML-safe one), `strftime_now(format)` on a configured day
//! ([`TemplateDate`]), and Python's float `repr`. Owns these helpers only; never renders a
//! template and never reads a clock except for `TemplateDate::Today`.

use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectExt, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// The day a template's `strftime_now` sees (`chat_template_date`): today (UTC, as a server
/// in a UTC container writes it), or a fixed day, at noon, so a test can pin the rendering.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TemplateDate {
    /// `"today"`: the day the prompt is rendered (the default).
    #[default]
    Today,
    /// `"YYYY-MM-DD"`.
    Fixed { year: i32, month: u32, day: u32 },
}

impl TemplateDate {
    /// Parses `"today"` or `"YYYY-MM-DD"` (a real calendar day).
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "today" {
            return Ok(TemplateDate::Today);
        }
        let bad = || format!("must be \"today\" or a date as YYYY-MM-DD, got {s:?}");
        let parts: Vec<&str> = s.split('-').collect();
        let [y, m, d] = parts.as_slice() else {
            return Err(bad());
        };
        if y.len() != 4 || m.len() != 2 || d.len() != 2 {
            return Err(bad());
        }
        let (year, month, day) = (
            y.parse::<i32>().map_err(|_| bad())?,
            m.parse::<u32>().map_err(|_| bad())?,
            d.parse::<u32>().map_err(|_| bad())?,
        );
        if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
            return Err(bad());
        }
        Ok(TemplateDate::Fixed { year, month, day })
    }

    /// The civil date and time this setting names now: a fixed day at 12:00:00, or the
    /// current UTC time.
    pub fn now(&self) -> DateTime {
        match *self {
            TemplateDate::Fixed { year, month, day } => DateTime {
                year,
                month,
                day,
                secs: 12 * 3600,
            },
            TemplateDate::Today => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let days = i64::try_from(secs / 86_400).unwrap_or(0);
                let (year, month, day) = civil_from_days(days);
                DateTime {
                    year,
                    month,
                    day,
                    secs: (secs % 86_400) as u32,
                }
            }
        }
    }
}

impl std::fmt::Display for TemplateDate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateDate::Today => f.write_str("today"),
            TemplateDate::Fixed { year, month, day } => write!(f, "{year:04}-{month:02}-{day:02}"),
        }
    }
}

impl serde::Serialize for TemplateDate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TemplateDate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        TemplateDate::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A civil date and the seconds into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    pub year: i32,
    pub month: u32,
    pub day: u32,
    pub secs: u32,
}

fn is_leap(y: i32) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i32, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's civil-from-days algorithm).
fn civil_from_days(z: i64) -> (i32, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (i32::try_from(y).unwrap_or(1970), m, d)
}

/// Day of the year, 1-based.
fn day_of_year(t: &DateTime) -> u32 {
    (1..t.month).map(|m| days_in_month(t.year, m)).sum::<u32>() + t.day
}

/// Day of the week, 0 = Monday (Python's `weekday()`).
fn weekday(t: &DateTime) -> u32 {
    // Days from 1970-01-01 (a Thursday) by the inverse of `civil_from_days`.
    let (y, m) = if t.month <= 2 {
        (i64::from(t.year) - 1, i64::from(t.month) + 9)
    } else {
        (i64::from(t.year), i64::from(t.month) - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let doy = (153 * m + 2) / 5 + i64::from(t.day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days + 3).rem_euclid(7)) as u32
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Python's `datetime.strftime(format)` for a naive date and time (C locale): the directives
/// `%a %A %b %B %d %H %I %j %m %M %p %S %w %y %Y %%`; `%z` and `%Z` are empty (naive), and
/// any other directive is left as written.
pub fn strftime(t: &DateTime, format: &str) -> String {
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    let (h, mi, s) = (t.secs / 3600, t.secs / 60 % 60, t.secs % 60);
    let month = MONTHS[(t.month as usize).clamp(1, 12) - 1];
    let day = DAYS[weekday(t) as usize];
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match d {
            'a' => write!(out, "{}", &day[..3]),
            'A' => write!(out, "{day}"),
            'b' | 'h' => write!(out, "{}", &month[..3]),
            'B' => write!(out, "{month}"),
            'd' => write!(out, "{:02}", t.day),
            'H' => write!(out, "{h:02}"),
            'I' => write!(out, "{:02}", if h % 12 == 0 { 12 } else { h % 12 }),
            'j' => write!(out, "{:03}", day_of_year(t)),
            'm' => write!(out, "{:02}", t.month),
            'M' => write!(out, "{mi:02}"),
            'p' => write!(out, "{}", if h < 12 { "AM" } else { "PM" }),
            'S' => write!(out, "{s:02}"),
            'w' => write!(out, "{}", (weekday(t) + 1) % 7),
            'y' => write!(out, "{:02}", t.year.rem_euclid(100)),
            'Y' => write!(out, "{}", t.year),
            'z' | 'Z' => Ok(()),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

/// Python's `repr(float)`: the shortest digits that read back to `x`, in fixed notation
/// between 1e-4 and 1e16 (always with a fraction, `1.0`) and in exponent notation outside
/// (`1e-05`, `1e+16`); `inf`/`nan` as `json.dumps` writes them.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // `{:e}` gives the shortest round-trip digits: "1.2345e20", "-5e-7", "0e0".
    let sci = format!("{:e}", x.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    let decpt = exp + 1;
    let sign = if x.is_sign_negative() { "-" } else { "" };
    let n = digits.len() as i32;
    if !(-4 < decpt && decpt <= 16) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    if decpt <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt < n {
        let (a, b) = digits.split_at(decpt as usize);
        format!("{sign}{a}.{b}")
    } else {
        format!("{sign}{digits}{}.0", "0".repeat((decpt - n) as usize))
    }
}

/// How [`to_json`] lays its output out.
struct Layout {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`. `indent` may be positional or a keyword.
pub fn tojson_filter(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = v.as_i64().ok_or_else(|| {
                    Error::new(ErrorKind::InvalidOperation, "indent must be an int or str")
                })?;
                Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
            }
        },
    };
    let separators: Option<Value> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let a = s.get_item_by_index(0)?;
            let b = s.get_item_by_index(1)?;
            (
                a.as_str().unwrap_or(",").to_owned(),
                b.as_str().unwrap_or(":").to_owned(),
            )
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    // `ensure_ascii` other than false is not supported: no template in use sets it.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let layout = Layout {
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    write_json(&mut out, value, &layout, 0)?;
    Ok(Value::from_safe_string(out))
}

/// `json.dumps(value, ensure_ascii=False)` with Python's default separators.
pub fn to_json(value: &Value) -> Result<String, Error> {
    let layout = Layout {
        indent: None,
        item_sep: ", ".into(),
        key_sep: ": ".into(),
        sort_keys: false,
    };
    let mut out = String::new();
    write_json(&mut out, value, &layout, 0)?;
    Ok(out)
}

fn newline(out: &mut String, layout: &Layout, depth: usize) {
    if let Some(ind) = &layout.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write_json(out: &mut String, v: &Value, layout: &Layout, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => {
            let _ = write!(out, "{v}");
        }
        ValueKind::Number => {
            let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
            out.push_str(&py_float_repr(f));
        }
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default()),
        ValueKind::Map => write_map(out, v, layout, depth)?,
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_seq(out, &items, layout, depth)?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {} is not JSON serializable", v.kind()),
            ))
        }
    }
    Ok(())
}

fn write_seq(
    out: &mut String,
    items: &[Value],
    layout: &Layout,
    depth: usize,
) -> Result<(), Error> {
    if items.is_empty() {
        out.push_str("[]");
        return Ok(());
    }
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&layout.item_sep);
        }
        newline(out, layout, depth + 1);
        write_json(out, item, layout, depth + 1)?;
    }
    newline(out, layout, depth);
    out.push(']');
    Ok(())
}

fn write_map(out: &mut String, v: &Value, layout: &Layout, depth: usize) -> Result<(), Error> {
    let mut keys: Vec<Value> = v.try_iter()?.collect();
    if keys.is_empty() {
        out.push_str("{}");
        return Ok(());
    }
    if layout.sort_keys {
        keys.sort_by_key(|k| k.to_string());
    }
    out.push('{');
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            out.push_str(&layout.item_sep);
        }
        newline(out, layout, depth + 1);
        match key.kind() {
            ValueKind::String => write_str(out, key.as_str().unwrap_or_default()),
            // Python writes int, float, bool and None keys as strings.
            _ => {
                let mut k = String::new();
                write_json(&mut k, key, layout, depth + 1)?;
                write_str(out, &k);
            }
        }
        out.push_str(&layout.key_sep);
        write_json(out, &v.get_item(key)?, layout, depth + 1)?;
    }
    newline(out, layout, depth);
    out.push('}');
    Ok(())
}

/// A JSON string as Python writes it with `ensure_ascii=False`: `"` and `\` escaped, the
/// control characters below U+0020 as `\n`, `\r`, `\t`, `\b`, `\f` or `\u00XX`, the rest as
/// they are.
fn write_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// A Python dict: keys in insertion order (minijinja's own maps sort them).
#[derive(Debug, Default)]
pub struct Dict(pub Vec<(Value, Value)>);

impl Dict {
    /// The dict as a template value.
    pub fn into_value(self) -> Value {
        Value::from_object(self)
    }

    /// Sets `key` (in place when present, last otherwise), as `d[key] = value` does.
    pub fn set(&mut self, key: impl Into<Value>, value: Value) {
        let key = key.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }
}

impl Object for Dict {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        self.0
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| Box::new(this.0.iter().map(|(k, _)| k.clone())))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// A JSON document read as Python's `json.loads` reads it: objects as [`Dict`]s in the order
/// written (a repeated key keeps its first place and its last value), integers as integers,
/// other numbers as floats.
#[derive(Debug, Clone)]
pub struct PyJson(pub Value);

impl<'de> serde::Deserialize<'de> for PyJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PyJsonVisitor).map(PyJson)
    }
}

struct PyJsonVisitor;

impl<'de> serde::de::Visitor<'de> for PyJsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(PyJson(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::from(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut dict = Dict::default();
        while let Some((k, PyJson(v))) = map.next_entry::<String, PyJson>()? {
            dict.set(k, v);
        }
        Ok(dict.into_value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_reads_and_writes_as_python_does() {
        let src =
            r#"{"z": 1, "a": [1.0, 2.5e-7, null, true, {"b": "x<y"}], "z": 3, "e": {}, "l": []}"#;
        let v = serde_json::from_str::<PyJson>(src).expect("valid JSON").0;
        assert_eq!(
            to_json(&v).expect("serialisable"),
            r#"{"z": 3, "a": [1.0, 2.5e-07, null, true, {"b": "x<y"}], "e": {}, "l": []}"#
        );
        let mut out = String::new();
        let layout = Layout {
            indent: Some("  ".into()),
            item_sep: ",".into(),
            key_sep: ": ".into(),
            sort_keys: true,
        };
        write_json(&mut out, &v, &layout, 0).expect("serialisable");
        assert!(out.starts_with("{\n  \"a\": [\n    1.0,\n"), "{out}");
        assert!(out.ends_with("\"z\": 3\n}"), "{out}");
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e20, "1.2345e+20"),
            (123.456, "123.456"),
            (2.5, "2.5"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(py_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn strings_escape_as_python_json_dumps() {
        let mut out = String::new();
        write_str(&mut out, "a\"b\\c\nd\te\u{1}f\u{7f}é😀<&>'");
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\te\\u0001f\u{7f}é😀<&>'\"");
    }

    #[test]
    fn dates_and_strftime() {
        let t = TemplateDate::parse("2025-03-07").expect("a date").now();
        assert_eq!(strftime(&t, "%d %b %Y"), "07 Mar 2025");
        assert_eq!(
            strftime(&t, "%A %B %j %H:%M:%S %p %y %w %%"),
            "Friday March 066 12:00:00 PM 25 5 %"
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_154), (2025, 3, 7));
        for bad in ["2025-02-30", "2025-3-07", "tomorrow", "2025-13-01", ""] {
            assert!(TemplateDate::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            TemplateDate::parse("2024-02-29").expect("leap").to_string(),
            "2024-02-29"
        );
        let today = TemplateDate::Today.now();
        assert!(today.year >= 2024 && (1..=12).contains(&today.month));
    }
}
