//! Python's text formatting as AIPerf's templates use it: `format(value, spec)` for the specs
//! they contain, `str()`/`repr()` of floats, `str.title()` and `str.format`/`format_map` fields.
//! Owns these string rules only; must never draw random numbers.

/// A parsed format spec: `[[fill]align][sign][#][0][width][,|_][.precision][type]`.
#[derive(Debug, Default, PartialEq)]
struct Spec {
    fill: Option<char>,
    align: Option<char>,
    sign: Option<char>,
    zero: bool,
    width: usize,
    grouping: Option<char>,
    precision: Option<usize>,
    ty: Option<char>,
}

fn parse_spec(spec: &str) -> Result<Spec, String> {
    let chars: Vec<char> = spec.chars().collect();
    let mut s = Spec::default();
    let mut i = 0;
    let is_align = |c: char| matches!(c, '<' | '>' | '^' | '=');
    if chars.len() >= 2 && is_align(chars[1]) {
        s.fill = Some(chars[0]);
        s.align = Some(chars[1]);
        i = 2;
    } else if !chars.is_empty() && is_align(chars[0]) {
        s.align = Some(chars[0]);
        i = 1;
    }
    if i < chars.len() && matches!(chars[i], '+' | '-' | ' ') {
        s.sign = Some(chars[i]);
        i += 1;
    }
    if i < chars.len() && chars[i] == '#' {
        return Err(format!("format spec {spec:?}: '#' is not supported"));
    }
    if i < chars.len() && chars[i] == '0' {
        s.zero = true;
        i += 1;
    }
    while i < chars.len() && chars[i].is_ascii_digit() {
        s.width = s.width * 10 + chars[i].to_digit(10).unwrap_or(0) as usize;
        i += 1;
    }
    if i < chars.len() && matches!(chars[i], ',' | '_') {
        s.grouping = Some(chars[i]);
        i += 1;
    }
    if i < chars.len() && chars[i] == '.' {
        i += 1;
        let mut p = 0;
        let start = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            p = p * 10 + chars[i].to_digit(10).unwrap_or(0) as usize;
            i += 1;
        }
        if i == start {
            return Err(format!("format spec {spec:?}: missing precision"));
        }
        s.precision = Some(p);
    }
    if i < chars.len() {
        s.ty = Some(chars[i]);
        i += 1;
    }
    if i != chars.len() {
        return Err(format!("invalid format spec {spec:?}"));
    }
    Ok(s)
}

/// A value as `format()` sees it.
pub enum Arg<'a> {
    Str(&'a str),
    Int(i64),
    Float(f64),
}

/// `format(value, spec)`.
pub fn format_value(arg: Arg<'_>, spec: &str) -> Result<String, String> {
    if spec.is_empty() {
        return Ok(match arg {
            Arg::Str(s) => s.to_owned(),
            Arg::Int(i) => i.to_string(),
            Arg::Float(f) => float_repr(f),
        });
    }
    let s = parse_spec(spec)?;
    let (body, negative, numeric) = match (arg, s.ty) {
        (Arg::Str(v), None | Some('s')) => {
            let v: String = match s.precision {
                Some(p) => v.chars().take(p).collect(),
                None => v.to_owned(),
            };
            (v, false, false)
        }
        (Arg::Int(i), None | Some('d')) => (
            group(&i.unsigned_abs().to_string(), s.grouping),
            i < 0,
            true,
        ),
        (Arg::Int(i), Some('x')) => (format!("{:x}", i.unsigned_abs()), i < 0, true),
        (Arg::Int(i), Some(t @ ('f' | 'e'))) => float_body(i as f64, t, s.precision, s.grouping)?,
        (Arg::Float(f), Some(t @ ('f' | 'e'))) => float_body(f, t, s.precision, s.grouping)?,
        (Arg::Float(f), None) if s.precision.is_none() => {
            let r = float_repr(f.abs());
            (r, f.is_sign_negative(), true)
        }
        _ => {
            return Err(format!(
                "format spec {spec:?} is not supported for this value"
            ))
        }
    };
    let sign = match (negative, s.sign) {
        (true, _) => "-",
        (false, Some('+')) => "+",
        (false, Some(' ')) => " ",
        _ => "",
    };
    let len = sign.chars().count() + body.chars().count();
    let pad = s.width.saturating_sub(len);
    let (fill, align) = if s.zero && s.align.is_none() && numeric {
        ('0', '=')
    } else {
        (
            s.fill.unwrap_or(' '),
            s.align.unwrap_or(if numeric { '>' } else { '<' }),
        )
    };
    let fills = |n: usize| std::iter::repeat_n(fill, n).collect::<String>();
    Ok(match align {
        '<' => format!("{sign}{body}{}", fills(pad)),
        '^' => format!("{}{sign}{body}{}", fills(pad / 2), fills(pad - pad / 2)),
        '=' => format!("{sign}{}{body}", fills(pad)),
        _ => format!("{}{sign}{body}", fills(pad)),
    })
}

fn float_body(
    f: f64,
    ty: char,
    precision: Option<usize>,
    grouping: Option<char>,
) -> Result<(String, bool, bool), String> {
    let p = precision.unwrap_or(6);
    let neg = f.is_sign_negative();
    let a = f.abs();
    let body = if ty == 'f' {
        // Rust rounds the exact binary value half to even, as Python does.
        let t = format!("{a:.p$}");
        match t.split_once('.') {
            Some((i, frac)) => format!("{}.{frac}", group(i, grouping)),
            None => group(&t, grouping),
        }
    } else {
        // Rust writes `1.23e5`; Python `1.23e+05`.
        let t = format!("{a:.p$e}");
        let (m, e) = t
            .split_once('e')
            .ok_or("float formatting without exponent")?;
        let e: i32 = e.parse().map_err(|_| "bad exponent")?;
        format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    };
    Ok((body, neg, true))
}

fn group(digits: &str, sep: Option<char>) -> String {
    let Some(sep) = sep else {
        return digits.to_owned();
    };
    let n = digits.len();
    let mut out = String::with_capacity(n + n / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (n - i) % 3 == 0 {
            out.push(sep);
        }
        out.push(c);
    }
    out
}

/// `repr(float)` (= `str(float)`): the shortest round-trip digits, fixed notation for decimal
/// exponents in `[-4, 16)`, else scientific with a signed two-digit exponent.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let sci = format!("{:e}", f.abs());
    let (m, e) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = e.parse().unwrap_or(0);
    let digits: String = m.chars().filter(char::is_ascii_digit).collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else if exp + 1 >= n {
            format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
        } else {
            let (a, b) = digits.split_at((exp + 1) as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{body}")
    } else {
        let mant = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        format!(
            "{sign}{mant}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

/// `str.title()`: a cased character after an uncased one is upper-cased, others lower-cased.
pub fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_cased = false;
    for c in s.chars() {
        let cased = c.is_lowercase() || c.is_uppercase();
        if cased {
            if prev_cased {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
        } else {
            out.push(c);
        }
        prev_cased = cased;
    }
    out
}

/// One piece of a `str.format` template.
pub enum Piece<'a> {
    Text(&'a str),
    Field { name: &'a str, spec: &'a str },
}

/// Splits a `str.format` template into literal text (`{{`/`}}` unescaped) and `{name[:spec]}`
/// fields; conversions (`!r`) and nested fields are rejected.
pub fn parse_template(t: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let b = t.as_bytes();
    let (mut i, mut lit) = (0, 0);
    while i < b.len() {
        match b[i] {
            b'{' | b'}' if b.get(i + 1) == Some(&b[i]) => {
                out.push(Piece::Text(&t[lit..=i]));
                i += 2;
                lit = i;
            }
            b'{' => {
                out.push(Piece::Text(&t[lit..i]));
                let end = t[i..]
                    .find('}')
                    .map(|e| i + e)
                    .ok_or_else(|| format!("unclosed '{{' in template {t:?}"))?;
                let field = &t[i + 1..end];
                if field.contains('{') || field.contains('!') {
                    return Err(format!("unsupported field {{{field}}} in template {t:?}"));
                }
                let (name, spec) = field.split_once(':').unwrap_or((field, ""));
                out.push(Piece::Field { name, spec });
                i = end + 1;
                lit = i;
            }
            b'}' => return Err(format!("single '}}' in template {t:?}")),
            _ => i += 1,
        }
    }
    out.push(Piece::Text(&t[lit..]));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected strings are what CPython 3.11 prints for the same calls.
    #[test]
    fn specs() {
        let f = |a, s| format_value(a, s).unwrap();
        assert_eq!(f(Arg::Float(0.125), ".2f"), "0.12");
        assert_eq!(f(Arg::Float(2.675), ".2f"), "2.67");
        assert_eq!(f(Arg::Float(12.5), ">8.2f"), "   12.50");
        assert_eq!(f(Arg::Float(0.045), ".2e"), "4.50e-02");
        assert_eq!(f(Arg::Float(123456.0), ".2e"), "1.23e+05");
        assert_eq!(f(Arg::Int(1_000_000), "07x"), "00f4240");
        assert_eq!(f(Arg::Int(255), "x"), "ff");
        assert_eq!(f(Arg::Int(42), ">6"), "    42");
        assert_eq!(f(Arg::Int(3), ".1f"), "3.0");
        assert_eq!(f(Arg::Str("ab"), "<5"), "ab   ");
        assert_eq!(f(Arg::Str("ab"), ">5"), "   ab");
        assert_eq!(f(Arg::Int(1234567), ","), "1,234,567");
    }

    #[test]
    fn float_reprs() {
        assert_eq!(float_repr(1.0), "1.0");
        assert_eq!(float_repr(0.1), "0.1");
        assert_eq!(float_repr(1e-5), "1e-05");
        assert_eq!(float_repr(0.0001), "0.0001");
        assert_eq!(float_repr(1e16), "1e+16");
        assert_eq!(float_repr(123456789000000.0), "123456789000000.0");
        assert_eq!(float_repr(1.5e-7), "1.5e-07");
        assert_eq!(float_repr(-2.5), "-2.5");
    }

    #[test]
    fn titles() {
        assert_eq!(title("get_user"), "Get_User");
        assert_eq!(title("load2fa"), "Load2Fa");
        assert_eq!(title("hELLO wORLD"), "Hello World");
    }

    #[test]
    fn templates() {
        let p = parse_template("a {{b}} {c} {d:>3}").unwrap();
        assert_eq!(p.len(), 7);
        assert!(matches!(p[0], Piece::Text("a {")));
        assert!(matches!(p[1], Piece::Text("b}")));
        assert!(matches!(p[2], Piece::Text(" ")));
        assert!(matches!(
            p[3],
            Piece::Field {
                name: "c",
                spec: ""
            }
        ));
        assert!(parse_template("x }").is_err());
    }
}
