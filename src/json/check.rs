//! A body's top-level object read and validated in one scan, for the common body only: it accepts nothing serde_json's parse rejects, and gives exactly the members that parse gives. Never words an error: whatever it does not accept (invalid JSON, an escaped top-level key, deep nesting, `field` not an array) goes to serde's path, which decides and words it.
//!
//! What serde_json (`from_slice`, a `RawValue` per member) accepts, and so what this checks:
//! the body is UTF-8 (serde checks each string and raw value; outside strings only ASCII is
//! JSON); strings hold no raw control character and only the escapes `\" \\ \/ \b \f \n \r \t`
//! and `\u` with four hex digits (a lone surrogate is syntax serde accepts in a raw value);
//! numbers follow JSON's grammar (one leading zero, digits after `.` and after the exponent);
//! `true`, `false`, `null`; nothing but whitespace after the object.

use std::borrow::Cow;
use std::ops::Range;

use super::{is_ws, Json, RawObject, Top};

/// Deeper nesting is left to serde (which accepts any depth inside a member's raw value), so
/// this scan's recursion stays shallow.
const MAX_DEPTH: usize = 64;

/// The body's top-level object as [`super::object_with_array`] reads it, or `None` when the
/// scan leaves the body to serde (see the module docs).
pub(super) fn top<'a>(body: &'a [u8], field: &'static str) -> Option<Top<'a>> {
    let text = std::str::from_utf8(body).ok()?;
    let b = body;
    let mut top = Top {
        object: RawObject {
            entries: Vec::with_capacity(16),
        },
        field,
        array: None,
        array_span: None,
        array_members: 0,
    };
    let open = skip_ws(b, 0);
    if b.get(open) != Some(&b'{') {
        return None;
    }
    // serde decodes a top-level key (a lone surrogate fails there): `members` leaves an
    // escaped one to it.
    let end = super::members(text, open, string, |key, start| {
        if key == field {
            let (items, span) = items(b, text, start)?;
            let end = span.end;
            top.array = Some(items);
            top.array_span = Some(span);
            top.array_members += 1;
            Some(end)
        } else {
            let end = value(b, start, 1)?;
            top.object
                .entries
                .push((Cow::Borrowed(key), Json(text.get(start..end)?)));
            Some(end)
        }
    })?;
    (skip_ws(b, end) == b.len()).then_some(top)
}

/// The elements of the array opening at `open`, and the span of its brackets.
fn items<'a>(b: &[u8], text: &'a str, open: usize) -> Option<(Vec<Json<'a>>, Range<usize>)> {
    if b.get(open) != Some(&b'[') {
        return None;
    }
    let mut items = Vec::with_capacity(16);
    let mut i = skip_ws(b, open + 1);
    if b.get(i) == Some(&b']') {
        return Some((items, open..i + 1));
    }
    loop {
        let end = value(b, i, 2)?;
        items.push(Json(text.get(i..end)?));
        i = skip_ws(b, end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b']') => return Some((items, open..i + 1)),
            _ => return None,
        }
    }
}

fn skip_ws(b: &[u8], mut at: usize) -> usize {
    while b.get(at).copied().is_some_and(is_ws) {
        at += 1;
    }
    at
}

/// Bytes [`next_special`] tests at once: one SSE2 register, so a chunk's test compiles to a few
/// wide compares.
const LANES: usize = 16;
/// Chunks [`next_special`] tests before it takes the rest of a run to `memchr2`.
const SHORT_RUN_CHUNKS: usize = 4;

/// A byte that ends a run of a string's plain text: the closing quote, an escape's backslash, or
/// a control character (which JSON forbids raw). Bitwise, not short-circuit, so that a fold of it
/// over a chunk has no branch.
fn is_special(c: u8) -> bool {
    (c == b'"') | (c == b'\\') | (c < 0x20)
}

/// No byte below 0x20. Written as a fold, not `any`, so it compiles to wide compares.
fn no_control(s: &[u8]) -> bool {
    s.iter().fold(true, |ok, &c| ok & (c >= 0x20))
}

/// The offset of the first [`is_special`] byte of `rest`. Agentic text has an escape every few
/// dozen bytes (newlines, quotes in code): runs too short for a `memchr2` call to pay for itself,
/// and each run then needed a second pass for control characters. So the first chunks are
/// tested for all three at once (the chunk that holds the hit then byte by byte); a run longer
/// than that (prose) goes to `memchr2` and a pass for control characters, faster per byte.
fn next_special(rest: &[u8]) -> Option<usize> {
    let mut chunks = rest.chunks_exact(LANES);
    let mut base = 0;
    for chunk in (&mut chunks).take(SHORT_RUN_CHUNKS) {
        if chunk.iter().fold(false, |hit, &c| hit | is_special(c)) {
            return chunk.iter().position(|&c| is_special(c)).map(|i| base + i);
        }
        base += LANES;
    }
    let rest = rest.get(base..)?;
    let end = memchr::memchr2(b'"', b'\\', rest);
    let run = rest.get(..end.unwrap_or(rest.len()))?;
    if no_control(run) {
        return end.map(|k| base + k);
    }
    run.iter().position(|&c| c < 0x20).map(|i| base + i)
}

/// The string opening at `open`, checked: the offset of its closing quote and whether it holds
/// an escape. (The body's UTF-8 was checked whole, before the scan.)
fn string(b: &[u8], open: usize) -> Option<(usize, bool)> {
    let mut at = open + 1;
    let mut escaped = false;
    loop {
        let q = at + next_special(b.get(at..)?)?;
        match *b.get(q)? {
            b'"' => return Some((q, escaped)),
            b'\\' => escaped = true,
            // A raw control character.
            _ => return None,
        }
        at = match *b.get(q + 1)? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => q + 2,
            b'u' if b.get(q + 2..q + 6)?.iter().all(u8::is_ascii_hexdigit) => q + 6,
            _ => return None,
        };
    }
}

/// The offset just past the value starting at `at`, checked; `depth` containers enclose it.
fn value(b: &[u8], at: usize, depth: usize) -> Option<usize> {
    match *b.get(at)? {
        b'"' => string(b, at).map(|(close, _)| close + 1),
        open @ (b'{' | b'[') => {
            if depth >= MAX_DEPTH {
                return None;
            }
            let close = if open == b'{' { b'}' } else { b']' };
            let mut i = skip_ws(b, at + 1);
            if b.get(i) == Some(&close) {
                return Some(i + 1);
            }
            loop {
                if open == b'{' {
                    if b.get(i) != Some(&b'"') {
                        return None;
                    }
                    i = skip_ws(b, string(b, i)?.0 + 1);
                    if b.get(i) != Some(&b':') {
                        return None;
                    }
                    i = skip_ws(b, i + 1);
                }
                i = skip_ws(b, value(b, i, depth + 1)?);
                match b.get(i) {
                    Some(b',') => i = skip_ws(b, i + 1),
                    Some(&c) if c == close => return Some(i + 1),
                    _ => return None,
                }
            }
        }
        b't' => literal(b, at, b"true"),
        b'f' => literal(b, at, b"false"),
        b'n' => literal(b, at, b"null"),
        b'-' | b'0'..=b'9' => number(b, at),
        _ => None,
    }
}

fn literal(b: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    (b.get(at..at + word.len())? == word).then_some(at + word.len())
}

/// The end of the digits from `at` on.
fn digits(b: &[u8], mut at: usize) -> usize {
    while b.get(at).is_some_and(u8::is_ascii_digit) {
        at += 1;
    }
    at
}

/// JSON's number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
fn number(b: &[u8], at: usize) -> Option<usize> {
    let mut i = at + usize::from(b.get(at) == Some(&b'-'));
    i = match *b.get(i)? {
        b'0' => i + 1,
        b'1'..=b'9' => digits(b, i + 1),
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        let end = digits(b, i + 1);
        if end == i + 1 {
            return None;
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(b, i);
        if end == i {
            return None;
        }
        i = end;
    }
    // A digit right after a leading zero ("01") is not a number; serde says so too.
    (!b.get(i).is_some_and(u8::is_ascii_digit)).then_some(i)
}

#[cfg(test)]
mod tests;
