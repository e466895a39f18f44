//! The streaming scan against a whole-body parse: on a table of bodies and on generated ones,
//! split into chunks every way that matters, the facts it reports are the parse's, and it never
//! lets go of a byte an edit could land on.

use super::*;
use crate::json::{top_object, Layout};

/// The facts a whole-body parse gives: the layout the usage step reads, and the first
/// placeholder.
fn parsed(body: &[u8]) -> Option<(Layout, Option<usize>)> {
    let top = top_object(body).ok()?;
    let layout = Layout::of(body, &top)?;
    let placeholder = memchr::memmem::find(body, PLACEHOLDER_OPEN);
    Some((layout, placeholder))
}

/// Feeds `body` in chunks cut at `cuts`, checking at every step that nothing an edit may touch
/// was let go; returns the final facts.
fn scan(body: &[u8], cuts: &[usize], parse: Option<&(Layout, Option<usize>)>) -> TopFacts {
    let mut s = TopScan::reading_messages();
    let mut from = 0;
    let ends = cuts.iter().copied().chain([body.len()]);
    for end in ends.filter(|&e| e <= body.len()) {
        if end < from {
            continue;
        }
        s.feed(&body[from..end]);
        from = end;
        if let Some((layout, ph)) = parse {
            let safe = s.safe_len();
            assert!(safe <= end, "let go of bytes not yet fed");
            assert!(
                safe <= layout.close(),
                "let go of the close: {}",
                show(body)
            );
            if let Some(o) = layout.get("stream_options") {
                assert!(safe <= o.start, "let go of stream_options: {}", show(body));
            }
            if let Some(p) = ph {
                assert!(safe <= *p, "let go of a placeholder: {}", show(body));
            }
        }
    }
    s.finish().clone()
}

fn show(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

/// Every way of cutting a body in two (or every `stride`-th), and a few in many pieces.
fn cut_sets(len: usize, stride: usize) -> Vec<Vec<usize>> {
    let mut sets: Vec<Vec<usize>> = (0..=len).step_by(stride).map(|c| vec![c]).collect();
    for step in [1, 2, 3, 7] {
        sets.push((step..len).step_by(step).collect());
    }
    sets
}

fn check(body: &[u8], stride: usize) {
    let parse = parsed(body).expect("a valid object");
    for cuts in cut_sets(body.len(), stride) {
        let facts = scan(body, &cuts, Some(&parse));
        let (layout, ph) = &parse;
        assert!(
            !facts.doubtful,
            "doubtful on a plain object: {}",
            show(body)
        );
        assert_eq!(facts.close, Some(layout.close()), "close: {}", show(body));
        assert_eq!(
            facts.stream.as_ref().map(|(r, _)| r.clone()),
            layout.get("stream"),
            "stream: {}",
            show(body)
        );
        let is_true = layout.get("stream").is_some_and(|r| &body[r] == b"true");
        assert_eq!(facts.stream.as_ref().is_some_and(|s| s.1), is_true);
        assert_eq!(
            facts.options,
            layout.get("stream_options"),
            "{}",
            show(body)
        );
        assert_eq!(facts.placeholder, *ph, "placeholder: {}", show(body));
        assert_eq!(facts.members, layout.members(), "members: {}", show(body));
        assert_eq!(facts.user, layout.get("user"), "user: {}", show(body));
        let (first, count) = first_messages(body);
        // The plain scan leaves the conversation alone.
        let mut plain = TopScan::default();
        plain.feed(body);
        assert_eq!(
            (
                plain.facts().messages.as_ref(),
                plain.facts().messages_members
            ),
            (None, 0)
        );
        assert_eq!(facts.messages, first, "messages: {}", show(body));
        assert_eq!(facts.messages_members, count, "{}", show(body));
    }
}

/// What a whole-body parse says of the first top-level `messages` member: its elements up to
/// the first that is not an object, where it closes, whether it is an array of objects; and how
/// many `messages` members there are.
fn first_messages(body: &[u8]) -> (Option<Items>, usize) {
    use crate::json::{array, span, Kind};
    let top = top_object(body).expect("valid");
    let all: Vec<_> = top
        .object
        .members()
        .filter(|(k, _)| *k == "messages")
        .map(|(_, v)| v)
        .collect();
    let Some(raw) = all.first().copied() else {
        return (None, 0);
    };
    let whole = span(body, raw).expect("inside");
    let mut m = Items {
        open: whole.start,
        ..Items::default()
    };
    if Kind::of(raw) == Kind::Array {
        m.close = Some(whole.end - 1);
        for e in array(raw).expect("an array") {
            if Kind::of(e) != Kind::Object {
                m.odd = true;
                break;
            }
            m.items.push(span(body, e).expect("inside"));
        }
    } else {
        m.odd = true;
    }
    (Some(m), all.len())
}

#[test]
fn a_table_of_bodies_reads_as_the_parse_reads_them() {
    let bodies: &[&str] = &[
        r#"{}"#,
        r#" { } "#,
        r#"{"stream":true}"#,
        r#"{"stream" : true , "x":1}"#,
        r#"{"stream":false,"stream_options":{"include_usage":false}}"#,
        r#"{"stream_options":null,"stream":true}"#,
        r#"{"stream":true,"stream":false}"#,
        r#"{"stream":"true"}"#,
        r#"{"streams":true,"stream_option":{},"stream_optionsx":1}"#,
        r#"{"messages":[{"role":"user","content":"a \"}\" {{kvbust:prompt:5}} b"}],"stream":true}"#,
        r#"{"messages":[{"content":"\\"},{"content":"x\\\"y"}],"stream_options":{"a":[1,{"b":"}"}]}}"#,
        r#"{"m":"{{kvbus","n":"t:"}"#,
        r#"{"a":[[[]]],"b":{"c":{"d":"]]]}}}"}},"stream":1e5}"#,
        "{\n\t\"stream\"\r\n:\ttrue\n}\n",
        r#"{"a":"\\\\\\\"x\\\\","b":["\\\"]\\\\"],"stream":true}"#,
        r#"{"messages":[ {"role":"system","content":[{"type":"text","text":"]}"}]} , {"a":{}} ]}"#,
        r#"{"messages":[{"a":1},"x",{"b":2}],"messages":[{}]}"#,
        r#"{"messages":{"role":"user"},"x":[{"messages":[]}]}"#,
        r#"{"messages":[],"stream":true}"#,
    ];
    for b in bodies {
        check(b.as_bytes(), 1);
    }
}

#[test]
fn what_is_not_a_plain_object_is_doubtful_and_held() {
    for (body, held) in [
        (r#"[1,2]"#, 0),
        (r#"  "x""#, 2),
        (r#"{"a":1} x"#, 7),
        (r#"{"str\u0065am":true}"#, 1),
        (r#"{"a":1,}"#, 7),
        (r#"{"a":1"#, 6),
    ] {
        let mut s = TopScan::default();
        s.feed(body.as_bytes());
        let facts = s.finish().clone();
        assert!(facts.doubtful, "{body}");
        assert!(s.safe_len() <= held, "{body}: {}", s.safe_len());
    }
}

#[test]
fn a_placeholder_cut_anywhere_is_found_and_held_whole() {
    let body = br#"{"messages":[{"role":"user","content":"xx {{kvbust:prompt:9}}"}]}"#;
    let at = memchr::memmem::find(body, PLACEHOLDER_OPEN).expect("in the body");
    for cut in 0..body.len() {
        let mut s = TopScan::default();
        s.feed(&body[..cut]);
        // Not yet seen whole: not one byte of it goes.
        assert!(s.safe_len() <= at, "cut {cut}: {}", s.safe_len());
        s.feed(&body[cut..]);
        assert_eq!(s.facts().placeholder, Some(at), "cut {cut}");
    }
    // A near miss is let go once it is known not to be one.
    let mut s = TopScan::default();
    s.feed(br#"{"a":"{{kvbus"#);
    assert_eq!(s.safe_len(), 6);
    s.feed(br#"x","#);
    assert_eq!(s.safe_len(), 16);
}

/// A small deterministic generator (xorshift): no crate needed for reproducible bodies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn ws(r: &mut Rng, out: &mut String) {
    for _ in 0..r.below(3) {
        out.push([' ', '\n', '\t', '\r'][r.below(4) as usize]);
    }
}

fn string(r: &mut Rng, out: &mut String) {
    const PIECES: [&str; 12] = [
        "a",
        "\\\"",
        "\\\\",
        "}",
        "{",
        "]",
        "[",
        ",",
        ":",
        "{{kvbust:prompt:3}}",
        "é",
        "\\u0041",
    ];
    out.push('"');
    for _ in 0..r.below(6) {
        out.push_str(PIECES[r.below(PIECES.len() as u64) as usize]);
    }
    out.push('"');
}

fn value(r: &mut Rng, depth: u32, out: &mut String) {
    let pick = if depth > 3 { r.below(4) } else { r.below(6) };
    match pick {
        0 => out.push_str(["true", "false", "null"][r.below(3) as usize]),
        1 => out.push_str(["0", "-1.5e3", "42", "1E+2"][r.below(4) as usize]),
        2 | 3 => string(r, out),
        4 => {
            out.push('[');
            for i in 0..r.below(4) {
                if i > 0 {
                    out.push(',');
                }
                ws(r, out);
                value(r, depth + 1, out);
                ws(r, out);
            }
            out.push(']');
        }
        _ => object(r, depth + 1, out),
    }
}

fn object(r: &mut Rng, depth: u32, out: &mut String) {
    const KEYS: [&str; 7] = [
        "stream",
        "stream_options",
        "messages",
        "x",
        "streams",
        "s",
        "user",
    ];
    out.push('{');
    for i in 0..r.below(5) {
        if i > 0 {
            out.push(',');
        }
        ws(r, out);
        out.push('"');
        out.push_str(KEYS[r.below(KEYS.len() as u64) as usize]);
        out.push('"');
        ws(r, out);
        out.push(':');
        ws(r, out);
        value(r, depth, out);
        ws(r, out);
    }
    out.push('}');
}

#[test]
fn generated_bodies_read_as_the_parse_reads_them() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..3000 {
        let mut body = String::new();
        ws(&mut r, &mut body);
        object(&mut r, 0, &mut body);
        ws(&mut r, &mut body);
        assert!(
            serde_json::from_str::<serde_json::Value>(&body).is_ok(),
            "the generator made invalid JSON: {body}"
        );
        // Every fifth cut and the multi-piece ones: cuts at every byte are the table's.
        check(body.as_bytes(), 5);
    }
}
