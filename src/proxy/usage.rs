//! `observe.request_usage`: asks a chat or completions stream for its `usage` by splicing
//! `"stream_options":{"include_usage":true}` into the client's bytes, and takes out of the response
//! exactly what that adds (the usage-only chunk and the `"usage":null` members OpenAI-style servers
//! put on every other chunk), so the client receives what it asked for. Never touches a request
//! that already asks for usage, nor any byte it does not have to.

use std::ops::Range;

use bytes::{Bytes, BytesMut};

use crate::json::{self, Json, Kind, Layout};

/// The body with `include_usage` turned on, when `body` is a streaming request that does not ask
/// for usage itself; `None` leaves the request (and its response) alone.
pub fn add_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    if !may_stream(body) {
        return None;
    }
    let top = json::top_object(body).ok()?;
    add_include_usage_at(body, &Layout::of(body, &top)?)
}

/// Whether some member of `body` may have the value `true`: a `true` after a `:` (white space
/// between). A streaming request's `"stream": true` is one, so a body without one (most
/// non-streaming requests) is told apart by a scan instead of a parse. Keys with escapes make no
/// difference: only the value's bytes are looked for, and the literal `true` has no other
/// spelling.
fn may_stream(body: &[u8]) -> bool {
    memchr::memmem::find_iter(body, b"true").any(|at| {
        body[..at]
            .iter()
            .rev()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            == Some(&b':')
    })
}

/// [`add_include_usage`] reading `body` through the layout an earlier step made of it: no parse,
/// only the `stream_options` object, when there is one, is read.
pub(crate) fn add_include_usage_at(body: &[u8], layout: &Layout) -> Option<Vec<u8>> {
    let value = |key: &str| {
        layout
            .get(key)
            .map(|r| Json::at(body, r.clone()).map(|v| (r, v)))
    };
    if value("stream")??.1.get() != "true" {
        return None;
    }
    let (range, text): (Range<usize>, &str) = match value("stream_options") {
        None => {
            // "stream" is a member, so a comma is always needed before the new one.
            let close = layout.close();
            (close..close, r#","stream_options":{"include_usage":true}"#)
        }
        Some(found) => {
            let (r, v) = found?;
            match Kind::of(v) {
                Kind::Null => (r, r#"{"include_usage":true}"#),
                Kind::Object => include_in_options(v, r.start)?,
                // Not an object: the upstream will answer the client's mistake itself.
                _ => return None,
            }
        }
    };
    json::splice(body, &mut [(range, text)])
}

/// The edit that turns `include_usage` on in the `stream_options` object `v` (at `at` in the
/// body); `None` when it is on already.
fn include_in_options(v: Json<'_>, at: usize) -> Option<(Range<usize>, &'static str)> {
    let options = json::object(v).ok()?;
    let body = v.get().as_bytes();
    match options.get("include_usage") {
        Some(u) if u.get() == "true" => None,
        Some(u) => json::span(body, u).map(|r| (at + r.start..at + r.end, "true")),
        None => {
            let close = at + v.get().len() - 1;
            let text = if options.distinct_keys() == 0 {
                r#""include_usage":true"#
            } else {
                r#","include_usage":true"#
            };
            Some((close..close, text))
        }
    }
}

/// Removes from a response stream what `include_usage` added. Works on whole SSE events: a frame
/// that ends inside an event keeps that event's start until the rest arrives (servers write
/// whole events, so this is rare); a frame of whole events that needs no change is passed on as
/// it is, not copied.
#[derive(Default)]
pub struct UsageStrip {
    carry: Vec<u8>,
}

impl UsageStrip {
    /// What to send of `data`: its whole events, edited; at the `end` of the body, all of it.
    pub fn filter(&mut self, data: Bytes, end: bool) -> Bytes {
        let buf = if self.carry.is_empty() {
            data
        } else {
            let mut joined = std::mem::take(&mut self.carry);
            joined.extend_from_slice(&data);
            Bytes::from(joined)
        };
        let cut = if end { buf.len() } else { last_boundary(&buf) };
        if cut < buf.len() {
            self.carry = buf[cut..].to_vec();
        }
        strip_events(buf.slice(..cut))
    }

    /// Bytes held when the body ended inside an event.
    pub fn take_tail(&mut self) -> Option<Bytes> {
        (!self.carry.is_empty()).then(|| Bytes::from(std::mem::take(&mut self.carry)))
    }
}

/// The end of the blank line that ends the event starting at or after `from`.
fn next_boundary(b: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = memchr::memchr(b'\n', &b[at..]) {
        let nl = at + i;
        match &b[nl + 1..] {
            [b'\n', ..] => return Some(nl + 2),
            [b'\r', b'\n', ..] => return Some(nl + 3),
            _ => at = nl + 1,
        }
    }
    None
}

fn last_boundary(b: &[u8]) -> usize {
    let mut end = 0;
    while let Some(e) = next_boundary(b, end) {
        end = e;
    }
    end
}

/// `events` (whole events only) without the usage-only event and with `"usage":null` taken out.
fn strip_events(events: Bytes) -> Bytes {
    let mut out: Option<BytesMut> = None;
    let mut start = 0;
    while start < events.len() {
        let end = next_boundary(&events, start).unwrap_or(events.len());
        let event = &events[start..end];
        match edit_event(event) {
            None => {
                if let Some(o) = out.as_mut() {
                    o.extend_from_slice(event);
                }
            }
            Some(new) => out
                .get_or_insert_with(|| BytesMut::from(&events[..start]))
                .extend_from_slice(&new),
        }
        start = end;
    }
    out.map_or(events, BytesMut::freeze)
}

/// The event as the client should see it (empty: dropped), or `None` when it stays as it is.
fn edit_event(event: &[u8]) -> Option<Vec<u8>> {
    // One `data:` line holding a JSON object, as chat and completions chunks are.
    let mut data = event
        .split(|&b| b == b'\n')
        .filter(|l| l.starts_with(b"data:"));
    let line = data.next()?;
    if data.next().is_some() {
        return None;
    }
    let payload: Json<'_> = serde_json::from_slice(trim(&line[5..])).ok()?;
    if Kind::of(payload) != Kind::Object {
        return None;
    }
    let obj = json::object(payload).ok()?;
    let usage = obj.get("usage")?;
    if Kind::of(usage) != Kind::Null {
        let usage_only = obj
            .get("choices")
            .filter(|c| Kind::of(*c) == Kind::Array)
            .and_then(|c| json::array(c).ok())
            .is_some_and(|c| c.is_empty());
        return usage_only.then(Vec::new);
    }
    let member = member_span(event, json::span(event, usage)?)?;
    let mut out = Vec::with_capacity(event.len());
    out.extend_from_slice(&event[..member.start]);
    out.extend_from_slice(&event[member.end..]);
    Some(out)
}

/// The bytes to cut so that the `"usage"` member whose value is at `value` goes, with the comma
/// that joined it to its neighbour: `,"usage":null` after another member, `"usage":null,` first.
fn member_span(b: &[u8], value: Range<usize>) -> Option<Range<usize>> {
    let ws = |c: u8| matches!(c, b' ' | b'\t' | b'\n' | b'\r');
    let mut i = value.start;
    while i > 0 && ws(b[i - 1]) {
        i -= 1;
    }
    i = i.checked_sub(1).filter(|&j| b[j] == b':')?;
    while i > 0 && ws(b[i - 1]) {
        i -= 1;
    }
    let key = i.checked_sub(br#""usage""#.len())?;
    if &b[key..i] != br#""usage""# {
        return None;
    }
    let mut before = key;
    while before > 0 && ws(b[before - 1]) {
        before -= 1;
    }
    if before > 0 && b[before - 1] == b',' {
        return Some(before - 1..value.end);
    }
    // The first member: take the comma after it (and the space up to the next key) instead.
    let mut after = value.end;
    while after < b.len() && ws(b[after]) {
        after += 1;
    }
    if after < b.len() && b[after] == b',' {
        after += 1;
        while after < b.len() && ws(b[after]) {
            after += 1;
        }
        return Some(key..after);
    }
    Some(key..value.end)
}

fn trim(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_usage_is_spliced_into_the_clients_bytes() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                r#"{"model":"m", "stream":true ,"messages":[] }"#,
                Some(
                    r#"{"model":"m", "stream":true ,"messages":[] ,"stream_options":{"include_usage":true}}"#,
                ),
            ),
            (
                r#"{"stream":true,"stream_options":{}}"#,
                Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#),
            ),
            (
                r#"{"stream":true,"stream_options":{"continuous_usage_stats":false }}"#,
                Some(
                    r#"{"stream":true,"stream_options":{"continuous_usage_stats":false ,"include_usage":true}}"#,
                ),
            ),
            (
                r#"{"stream":true,"stream_options":{"include_usage": false}}"#,
                Some(r#"{"stream":true,"stream_options":{"include_usage": true}}"#),
            ),
            (
                r#"{"stream":true,"stream_options":null}"#,
                Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#),
            ),
            // Asked for already, not streaming, or not something kvbust should touch.
            (
                r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
                None,
            ),
            (r#"{"stream":false}"#, None),
            (r#"{"messages":[]}"#, None),
            (r#"{"stream":true,"stream_options":"x"}"#, None),
            (r#"[1]"#, None),
            (r#"{"stream":true"#, None),
        ];
        for (body, want) in cases {
            let got = add_include_usage(body.as_bytes()).map(|b| String::from_utf8(b).unwrap());
            assert_eq!(got.as_deref(), *want, "{body}");
        }
    }

    #[test]
    fn a_body_without_a_true_member_is_not_parsed() {
        let cases: &[(&str, bool)] = &[
            (
                r#"{"stream": false, "messages": [{"content": "true"}]}"#,
                false,
            ),
            (r#"{"stream":false,"x":[true]}"#, false),
            (r#"{"messages":"a: true"}"#, true),
            ("{\"str\\u0065am\" :\n\ttrue}", true),
            (r#"{"stream":true}"#, true),
        ];
        for (body, parsed) in cases {
            let before = crate::json::body_parses();
            let got = add_include_usage(body.as_bytes());
            assert_eq!(
                crate::json::body_parses() - before,
                usize::from(*parsed),
                "{body}"
            );
            // Whether parsed or not, the answer is the parse's.
            let parse = json::top_object(body.as_bytes())
                .ok()
                .and_then(|t| Layout::of(body.as_bytes(), &t))
                .and_then(|l| add_include_usage_at(body.as_bytes(), &l));
            assert_eq!(got, parse, "{body}");
        }
    }

    const WITH: &str = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"id\":\"x\",\"usage\":null}\n\n",
        "data: {\"usage\":null, \"choices\":[{\"delta\":{}}]}\n\n",
        "data: {\"choices\":[],\"id\":\"x\",\"usage\":{\"prompt_tokens\":3}}\n\n",
        "data: [DONE]\n\n",
    );
    const WITHOUT: &str = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"id\":\"x\"}\n\n",
        "data: {\"choices\":[{\"delta\":{}}]}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn strips_what_include_usage_added_whatever_the_framing() {
        for size in [1, 2, 3, 7, 16, 50, WITH.len()] {
            let mut s = UsageStrip::default();
            let mut out = Vec::new();
            let pieces: Vec<&[u8]> = WITH.as_bytes().chunks(size).collect();
            for (i, p) in pieces.iter().enumerate() {
                let end = i + 1 == pieces.len();
                out.extend_from_slice(&s.filter(Bytes::copy_from_slice(p), end));
            }
            assert!(s.take_tail().is_none());
            assert_eq!(String::from_utf8(out).unwrap(), WITHOUT, "pieces of {size}");
        }
    }

    #[test]
    fn unchanged_frames_are_not_copied_and_odd_events_pass() {
        let mut s = UsageStrip::default();
        let frame = Bytes::from_static(b"event: x\ndata: {\"choices\":[]}\n\ndata: not json\n\n");
        let out = s.filter(frame.clone(), false);
        assert_eq!(out, frame);
        assert_eq!(out.as_ptr(), frame.as_ptr());
        // A stream that ends inside an event hands the held bytes back.
        assert!(s
            .filter(Bytes::from_static(b"data: {\"us"), false)
            .is_empty());
        assert_eq!(s.take_tail().as_deref(), Some(&b"data: {\"us"[..]));
    }
}
