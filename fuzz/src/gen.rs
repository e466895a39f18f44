//! Structure-aware generators: the fuzzer's bytes are read as decisions, and the result is a
//! JSON body written the many ways clients write JSON (whitespace, escapes, key order, duplicate
//! keys, numbers), so the fuzzer spends its time on bodies the rewrite reads rather than on
//! syntax errors. Never panics: an exhausted input reads as zeros.

use kvbust::cachebust::Shape;

/// The fuzzer's bytes as a stream of decisions.
pub struct Src<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Src<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Src { data, pos: 0 }
    }
    pub fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    /// A number below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n
    }
    pub fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }
    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let r = self.data.get(self.pos..).unwrap_or(&[]);
        self.pos = self.data.len();
        r
    }
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
}

const TEXTS: [&str; 16] = [
    "",
    "Hello there, model.",
    "[rid:bec92e2bea5e]",
    "[rid:bec92e2bea5e]\n\nHi",
    "Hi\n\n[rid:0123456789ab]",
    "[warmup]\n\n",
    "[warmup]",
    "[warmup]\n\nSummarise:",
    "é😀 \u{0} \u{1f}\u{7f}\"\\/",
    "\n\n",
    "{{kvbust:prompt:12}}",
    "line\r\nbreak\ttab",
    "[rid:bec92e2bea5e]\n\n[rid:bec92e2bea5e]",
    "\u{2028}\u{feff}",
    "system",
    "user",
];

const ROLES: [&str; 8] = [
    "user",
    "user",
    "system",
    "developer",
    "assistant",
    "tool",
    "User",
    "",
];

const WS: [&str; 6] = ["", "", " ", "\n", "\t ", "\r\n  "];

fn ws(s: &mut Src) -> &'static str {
    WS[s.below(WS.len())]
}

/// Text from the table, or a few of the fuzzer's own bytes (lossy UTF-8).
fn text(s: &mut Src) -> String {
    let c = s.byte();
    if c < 200 {
        return TEXTS[c as usize % TEXTS.len()].to_owned();
    }
    let n = s.below(12);
    let bytes: Vec<u8> = (0..n).map(|_| s.byte()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A JSON string literal in one of several legal spellings.
fn lit(s: &mut Src, t: &str) -> String {
    match s.below(4) {
        0 | 1 => serde_json::to_string(t).unwrap_or_default(),
        2 => {
            // ASCII-only with \u escapes (Python json.dumps' default), `/` escaped too.
            let mut out = String::from("\"");
            for ch in t.chars() {
                match ch {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '/' => out.push_str("\\/"),
                    c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                        let mut buf = [0u16; 2];
                        for unit in c.encode_utf16(&mut buf) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        _ => serde_json::to_string(t)
            .unwrap_or_default()
            .replace("\\n", "\\u000A"),
    }
}

fn string(s: &mut Src) -> String {
    let t = text(s);
    lit(s, &t)
}

fn any_value(s: &mut Src, depth: u32) -> String {
    match s.below(if depth > 2 { 6 } else { 8 }) {
        0 => "null".into(),
        1 => "true".into(),
        2 => [
            "0",
            "-0",
            "1.0e-7",
            "123456789012345678901234567890",
            "-12.5E+3",
            "3.14",
        ][s.below(6)]
        .into(),
        3..=5 => string(s),
        6 => {
            let items: Vec<String> = (0..s.below(4)).map(|_| any_value(s, depth + 1)).collect();
            array(s, items)
        }
        _ => {
            let n = s.below(4);
            let entries = (0..n)
                .map(|_| (string(s), any_value(s, depth + 1)))
                .collect();
            object(s, entries)
        }
    }
}

fn array(s: &mut Src, items: Vec<String>) -> String {
    let w = ws(s);
    let inner: Vec<String> = items.into_iter().map(|v| format!("{w}{v}{w}")).collect();
    format!("[{}]", inner.join(","))
}

fn object(s: &mut Src, mut entries: Vec<(String, String)>) -> String {
    // Shuffle by the input's choice, then sometimes repeat an entry (duplicate key).
    for i in (1..entries.len()).rev() {
        let j = s.below(i + 1);
        entries.swap(i, j);
    }
    if !entries.is_empty() && s.below(8) == 0 {
        let i = s.below(entries.len());
        let dup = (entries[i].0.clone(), any_value(s, 3));
        let at = s.below(entries.len() + 1);
        entries.insert(at, dup);
    }
    let w = ws(s);
    let inner: Vec<String> = entries
        .into_iter()
        .map(|(k, v)| format!("{w}{k}{w}:{w}{v}"))
        .collect();
    format!("{{{}{w}}}", inner.join(","))
}

fn key(s: &mut Src, name: &str) -> String {
    lit(s, name)
}

fn part(s: &mut Src, shape: Shape) -> String {
    match s.below(8) {
        0..=3 => {
            let ty = match s.below(4) {
                0 => "image_url",
                1 => "input_text",
                _ => shape.text_part_type(),
            };
            let entries = vec![(key(s, "type"), lit(s, ty)), (key(s, "text"), string(s))];
            object(s, entries)
        }
        4 => r#"{"type":"text","text":"[rid:bec92e2bea5e]"}"#.into(),
        5 => r#"{"text":"[warmup]","type":"input_text"}"#.into(),
        6 => r#"{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}"#.into(),
        _ => any_value(s, 2),
    }
}

fn content(s: &mut Src, shape: Shape) -> Option<String> {
    match s.below(10) {
        0..=4 => Some(string(s)),
        5..=7 => {
            let parts = (0..s.below(4)).map(|_| part(s, shape)).collect();
            Some(array(s, parts))
        }
        8 => Some(any_value(s, 1)),
        _ => None,
    }
}

fn message(s: &mut Src, shape: Shape) -> String {
    let mut entries = Vec::new();
    match s.below(10) {
        0..=7 => {
            let r = ROLES[s.below(ROLES.len())];
            entries.push((key(s, "role"), lit(s, r)));
        }
        8 => entries.push((key(s, "role"), any_value(s, 2))),
        _ => {}
    }
    if let Some(c) = content(s, shape) {
        entries.push((key(s, "content"), c));
    }
    for _ in 0..s.below(3) {
        entries.push((string(s), any_value(s, 2)));
    }
    object(s, entries)
}

fn messages(s: &mut Src, shape: Shape) -> String {
    if s.below(10) == 0 {
        return any_value(s, 1);
    }
    let n = s.below(6);
    let items = (0..n).map(|_| message(s, shape)).collect();
    array(s, items)
}

/// A request body for `shape` (sometimes with another shape's fields, sometimes not an object
/// or cut short).
pub fn gen_rewrite_body(s: &mut Src, shape: Shape) -> String {
    let mut entries = Vec::new();
    let want = |s: &mut Src, p: usize| s.below(10) < p;
    let main_p = 9;
    if want(
        s,
        if matches!(shape, Shape::Chat | Shape::Messages) {
            main_p
        } else {
            2
        },
    ) {
        entries.push((key(s, "messages"), messages(s, shape)));
    }
    if want(s, if shape == Shape::Responses { main_p } else { 1 }) {
        let v = if s.flag() {
            string(s)
        } else {
            messages(s, shape)
        };
        entries.push((key(s, "input"), v));
    }
    if want(s, if shape == Shape::Responses { 5 } else { 1 }) {
        let v = if s.below(5) > 0 {
            string(s)
        } else {
            any_value(s, 1)
        };
        entries.push((key(s, "instructions"), v));
    }
    if want(s, if shape == Shape::Messages { 6 } else { 1 }) {
        let v = match s.below(5) {
            0 | 1 => string(s),
            2 | 3 => {
                let parts = (0..s.below(3)).map(|_| part(s, shape)).collect();
                array(s, parts)
            }
            _ => any_value(s, 1),
        };
        entries.push((key(s, "system"), v));
    }
    if want(
        s,
        if shape == Shape::Completions {
            main_p
        } else {
            1
        },
    ) {
        let v = match s.below(5) {
            0 | 1 => string(s),
            2 | 3 => {
                let items = (0..s.below(4)).map(|_| string(s)).collect();
                array(s, items)
            }
            _ => any_value(s, 1),
        };
        entries.push((key(s, "prompt"), v));
    }
    if want(s, 3) {
        entries.push((key(s, "user"), string(s)));
    }
    if want(s, 1) {
        entries.push((key(s, "previous_response_id"), any_value(s, 2)));
    }
    if want(s, 5) {
        entries.push((key(s, "model"), lit(s, "test-model")));
    }
    for _ in 0..s.below(3) {
        entries.push((string(s), any_value(s, 1)));
    }
    let w = ws(s);
    let body = format!("{w}{}{w}", object(s, entries));
    match s.below(16) {
        0 => any_value(s, 0),
        1 => {
            // Cut short at a char boundary.
            let mut p = s.below(body.len() + 1);
            while !body.is_char_boundary(p) {
                p -= 1;
            }
            body[..p].to_owned()
        }
        _ => body,
    }
}

/// A placeholder, well-formed or not.
fn placeholder(s: &mut Src) -> String {
    let n = [
        "1",
        "12",
        "1024",
        "0",
        "x",
        "131072",
        "1048577",
        "99999999999999999999",
        "",
    ][s.below(9)];
    let corpus = [
        "",
        ":sonnet",
        ":random",
        ":coding",
        ":coding-exact",
        ":poems",
        ":sonnet:x",
    ][s.below(7)];
    let close = ["}}", "}}", "}}", "}", "", "\\u007d}"][s.below(6)];
    let kind = ["prompt", "prompt", "prompt", "other", ""][s.below(5)];
    format!("{{{{kvbust:{kind}:{n}{corpus}{close}")
}

/// Text with placeholders in it, sometimes long (for the bounded-excerpt check).
fn ph_text(s: &mut Src) -> String {
    let mut t = String::new();
    for _ in 0..s.below(4) {
        match s.below(4) {
            0 => t.push_str(&placeholder(s)),
            1 => t.push_str(&text(s)),
            2 => t.push_str(&"x\n".repeat(s.below(4) * 400)),
            _ => t.push_str(&placeholder(s)),
        }
    }
    t
}

fn ph_string(s: &mut Src) -> String {
    let t = ph_text(s);
    lit(s, &t)
}

/// A chat body with placeholders in content, in keys, in roles, in other members and at the
/// top level; sometimes broken.
pub fn gen_chat_with_placeholders(s: &mut Src) -> String {
    let mut msgs = Vec::new();
    for _ in 0..s.below(4) {
        let mut entries = Vec::new();
        let role = if s.below(6) == 0 {
            ph_string(s)
        } else {
            let r = ROLES[s.below(ROLES.len())];
            lit(s, r)
        };
        entries.push((key(s, "role"), role));
        let c = match s.below(4) {
            0 | 1 => ph_string(s),
            2 => {
                let parts = (0..s.below(3))
                    .map(|_| {
                        let e = vec![
                            (key(s, "type"), lit(s, "text")),
                            (key(s, "text"), ph_string(s)),
                        ];
                        object(s, e)
                    })
                    .collect();
                array(s, parts)
            }
            _ => any_value(s, 1),
        };
        entries.push((key(s, "content"), c));
        if s.below(4) == 0 {
            entries.push((ph_string(s), any_value(s, 2)));
        }
        msgs.push(object(s, entries));
    }
    let mut entries = vec![(key(s, "messages"), array(s, msgs))];
    if s.flag() {
        entries.push((key(s, "model"), ph_string(s)));
    }
    if s.below(4) == 0 {
        entries.push((ph_string(s), ph_string(s)));
    }
    if s.below(6) == 0 {
        entries.push((key(s, "messages"), ph_string(s)));
    }
    let body = object(s, entries);
    match s.below(12) {
        0 => ph_string(s),
        1 => {
            let mut p = s.below(body.len() + 1);
            while !body.is_char_boundary(p) {
                p -= 1;
            }
            body[..p].to_owned()
        }
        _ if s.done() => body,
        _ => body,
    }
}
