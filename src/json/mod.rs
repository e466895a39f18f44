//! The JSON span toolkit every request step shares (marking, placeholders, synthesis, usage):
//! borrowed, order-preserving views of raw JSON (objects as `(key, Json)` pairs, arrays as
//! `Json` lists), byte spans into the request body, the [`Layout`] that carries a body's spans
//! from one request step to the next across splices, and the one [`splice`]. A leaf: knows no
//! API and no marker. Never re-serialises or copies a value it does not decode on request.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

mod check;
pub(crate) mod stream;

/// A JSON value's text, borrowed from the bytes it sits in: valid JSON with no surrounding
/// whitespace, because a parse of those bytes produced it ([`RawValue`]) or a [`Layout`] of
/// them points at it. The second way needs no parse: only the UTF-8 of the range is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Json<'a>(&'a str);

impl<'a> Json<'a> {
    pub(crate) fn get(self) -> &'a str {
        self.0
    }

    /// The value a [`Layout`] of `body` puts at `range`; `None` when the range is outside
    /// `body` or not UTF-8 (neither happens for a layout of these bytes).
    pub(crate) fn at(body: &'a [u8], range: Range<usize>) -> Option<Json<'a>> {
        std::str::from_utf8(body.get(range)?).ok().map(Json)
    }
}

impl<'a> From<&'a RawValue> for Json<'a> {
    fn from(raw: &'a RawValue) -> Self {
        Json(raw.get())
    }
}

impl fmt::Debug for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'de RawValue>::deserialize(d).map(Json::from)
    }
}

/// The JSON type of a raw value, read from its first byte (a [`Json`] is valid JSON with no
/// surrounding whitespace, so the first byte decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

impl Kind {
    pub(crate) fn of(raw: Json<'_>) -> Kind {
        match raw.0.as_bytes().first() {
            Some(b'{') => Kind::Object,
            Some(b'[') => Kind::Array,
            Some(b'"') => Kind::String,
            Some(b't' | b'f') => Kind::Bool,
            Some(b'n') => Kind::Null,
            _ => Kind::Number,
        }
    }

    /// For error messages: "found an object", ...
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::Bool => "a boolean",
            Kind::Null => "null",
        }
    }
}

/// A JSON string decoded without copying when it has no escapes.
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// An object's members in document order, duplicates kept. Lookups take the **last** member
/// with a key, as serde_json's `Value`, Python's `json` and therefore the upstream server do.
pub(crate) struct RawObject<'a> {
    entries: Vec<(Cow<'a, str>, Json<'a>)>,
}

impl<'a> RawObject<'a> {
    pub(crate) fn get(&self, key: &str) -> Option<Json<'a>> {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
    }

    /// Like [`RawObject::get`] but a JSON `null` counts as absent.
    pub(crate) fn get_non_null(&self, key: &str) -> Option<Json<'a>> {
        self.get(key).filter(|v| Kind::of(*v) != Kind::Null)
    }

    /// Number of distinct keys.
    pub(crate) fn distinct_keys(&self) -> usize {
        let mut n = 0;
        for (i, (k, _)) in self.entries.iter().enumerate() {
            if !self.entries[..i].iter().any(|(k2, _)| k2 == k) {
                n += 1;
            }
        }
        n
    }

    /// How many members have the key `key`.
    pub(crate) fn count(&self, key: &str) -> usize {
        self.entries.iter().filter(|(k, _)| k == key).count()
    }

    /// Every member, in document order.
    pub(crate) fn members(&self) -> impl Iterator<Item = (&str, Json<'a>)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_ref(), *v))
    }
}

impl<'de> Deserialize<'de> for RawObject<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawObject<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8).min(64));
                while let Some(Str(k)) = map.next_key::<Str<'de>>()? {
                    let v: Json<'de> = map.next_value()?;
                    entries.push((k, v));
                }
                Ok(RawObject { entries })
            }
        }
        d.deserialize_map(V)
    }
}

/// An array's elements, failing on any other JSON type.
struct ArrayOnly<'a>(Vec<Json<'a>>);

impl<'de> Deserialize<'de> for ArrayOnly<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ArrayOnly<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(16).min(1024));
                while let Some(item) = seq.next_element::<Json<'de>>()? {
                    items.push(item);
                }
                Ok(ArrayOnly(items))
            }
        }
        d.deserialize_seq(V)
    }
}

/// A body's top-level object, read in one pass: its members, except the array `field` when one
/// was split out ([`object_with_array`]).
pub(crate) struct Top<'a> {
    pub(crate) object: RawObject<'a>,
    /// The member split out (`""`: none).
    field: &'static str,
    /// The last `field` member's elements.
    pub(crate) array: Option<Vec<Json<'a>>>,
    /// Where that array's brackets are; `None` when its key was spelled with escapes.
    pub(crate) array_span: Option<Range<usize>>,
    /// How many `field` members there were (each one an array).
    pub(crate) array_members: usize,
}

#[derive(Clone, Copy)]
struct TopSeed<'b> {
    field: &'static str,
    body: &'b [u8],
}

impl<'de> DeserializeSeed<'de> for TopSeed<'de> {
    type Value = Top<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'de> {
    type Value = Top<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::with_capacity(16);
        let mut top = Top {
            object: RawObject {
                entries: Vec::new(),
            },
            field: self.field,
            array: None,
            array_span: None,
            array_members: 0,
        };
        while let Some(Str(k)) = map.next_key::<Str<'de>>()? {
            if k == self.field {
                let items = map.next_value::<ArrayOnly<'de>>()?.0;
                // An unescaped key is a slice of the body: the array follows its closing quote.
                top.array_span = match &k {
                    Cow::Borrowed(key) => array_after_key(self.body, key, &items),
                    Cow::Owned(_) => None,
                };
                top.array = Some(items);
                top.array_members += 1;
            } else {
                entries.push((k, map.next_value::<Json<'de>>()?));
            }
        }
        top.object.entries = entries;
        Ok(top)
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The byte after the whitespace from `at` on, when it is `want`: its offset.
fn expect_after_ws(body: &[u8], mut at: usize, want: u8) -> Option<usize> {
    while body.get(at).copied().is_some_and(is_ws) {
        at += 1;
    }
    (body.get(at) == Some(&want)).then_some(at)
}

/// The span of the array whose member key `key` (borrowed from `body`, unescaped) precedes it:
/// `"key"` ws `:` ws `[` … `]`, the syntax a successful parse has already checked.
fn array_after_key(body: &[u8], key: &str, items: &[Json<'_>]) -> Option<Range<usize>> {
    let key_end = (key.as_ptr() as usize).checked_sub(body.as_ptr() as usize)? + key.len();
    let colon = expect_after_ws(body, key_end + 1, b':')?;
    let open = expect_after_ws(body, colon + 1, b'[')?;
    let last = match items.last() {
        Some(item) => span(body, *item)?.end,
        None => open + 1,
    };
    let close = expect_after_ws(body, last, b']')?;
    Some(open..close + 1)
}

#[cfg(test)]
thread_local! {
    static BODY_PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Test-only: how many whole request bodies this thread has parsed ([`object_with_array`],
/// [`top_object`]); decoding a value inside one (a message, a string) is not counted.
#[cfg(test)]
pub(crate) fn body_parses() -> usize {
    BODY_PARSES.with(std::cell::Cell::get)
}

fn count_body_parse() {
    #[cfg(test)]
    BODY_PARSES.with(|n| n.set(n.get() + 1));
}

/// The fast path for the common body: the top-level object's members, except `field`, whose
/// value (the last occurrence) is returned as its elements; one pass over the body instead of
/// two. Fails when the body is not an object, is invalid, or `field` is present but not an array
/// (every occurrence must be one): the caller then takes the general path, which also words the
/// error. `field` is absent from the returned object.
pub(crate) fn object_with_array<'a>(
    body: &'a [u8],
    field: &'static str,
) -> serde_json::Result<Top<'a>> {
    count_body_parse();
    // The common body is read and checked in one scan; anything it leaves, serde reads (and
    // words the error).
    match check::top(body, field) {
        Some(top) => Ok(top),
        None => serde_object_with_array(body, field),
    }
}

/// [`object_with_array`] by serde alone.
fn serde_object_with_array<'a>(body: &'a [u8], field: &'static str) -> serde_json::Result<Top<'a>> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let out = TopSeed { field, body }.deserialize(&mut de)?;
    de.end()?;
    Ok(out)
}

/// The general path: the top-level object's members, all of them.
pub(crate) fn top_object(body: &[u8]) -> serde_json::Result<Top<'_>> {
    count_body_parse();
    Ok(Top {
        object: serde_json::from_slice(body)?,
        field: "",
        array: None,
        array_span: None,
        array_members: 0,
    })
}

/// A whole body as one raw value (to say what a body that is not an object is).
pub(crate) fn top_value(body: &[u8]) -> serde_json::Result<Json<'_>> {
    count_body_parse();
    serde_json::from_slice(body)
}

/// Members of a raw value known (by [`Kind::of`]) to be an object.
pub(crate) fn object(raw: Json<'_>) -> serde_json::Result<RawObject<'_>> {
    serde_json::from_str(raw.0)
}

/// Members of a raw value known to be an object **that a validating parse produced** (every
/// `Json` of the body is one): read by [`scan_object`] when it can, which walks the text once
/// without checking it again, else by [`object`]. The two give the same members; the serde path
/// is the one that words an error (a key with a lone surrogate escape).
pub(crate) fn object_of_valid(raw: Json<'_>) -> serde_json::Result<RawObject<'_>> {
    match scan_object(raw) {
        Some(obj) => Ok(obj),
        None => object(raw),
    }
}

/// The members of `raw`, an object's text already validated, found by skipping over it: keys
/// by `memchr` for `"` and `\`, values' strings by `memchr` for `"` ([`string_end`]), containers
/// by depth counting. `None` (the caller parses) when a
/// key holds a backslash escape, since decoding it could fail or change it, or when the text
/// is not the shape valid JSON has; it never checks what a parse already checked (escapes,
/// UTF-8, control characters, numbers' grammar).
pub(crate) fn scan_object(raw: Json<'_>) -> Option<RawObject<'_>> {
    let s = raw.0;
    let b = s.as_bytes();
    if b.first() != Some(&b'{') {
        return None;
    }
    let mut entries = Vec::with_capacity(8);
    let end = members(s, 0, string_close, |key, start| {
        let end = value_end(b, start)?;
        entries.push((Cow::Borrowed(key), Json(s.get(start..end)?)));
        Some(end)
    })?;
    (end == b.len()).then_some(RawObject { entries })
}

/// Finds the end of the string opening at an offset: its closing quote, and whether it holds
/// a backslash escape.
pub(crate) type StringClose = fn(&[u8], usize) -> Option<(usize, bool)>;

/// Walks the members of the object whose `{` is at `open` in `text`: each key's string closed
/// by `close` (the trusting [`string_close`] on text already validated, the validating one of
/// [`check`] on a body not yet parsed), then `member(key, value_start)`, which returns where its
/// value ends. The offset just past the closing `}`, or `None` when the text is not the shape
/// of an object, or a key holds a backslash escape (decoding it could fail or change it: left
/// to serde), or `member` gives up.
pub(crate) fn members<'a>(
    text: &'a str,
    open: usize,
    close: StringClose,
    mut member: impl FnMut(&'a str, usize) -> Option<usize>,
) -> Option<usize> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, open + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let (end_quote, escaped) = close(b, i)?;
        if escaped {
            return None;
        }
        let key = text.get(i + 1..end_quote)?;
        i = skip_ws(b, end_quote + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let end = member(key, skip_ws(b, i + 1))?;
        i = skip_ws(b, end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Some(i + 1),
            _ => return None,
        }
    }
}

/// The first offset from `at` on that is not JSON whitespace.
fn skip_ws(b: &[u8], mut at: usize) -> usize {
    while b.get(at).copied().is_some_and(is_ws) {
        at += 1;
    }
    at
}

/// For the string opening at `open`: the offset of its closing quote, and whether it holds a
/// backslash escape. The byte after a backslash is skipped, so `\"` does not close it (a `\u`
/// escape's four hex digits hold no quote or backslash).
fn string_close(b: &[u8], open: usize) -> Option<(usize, bool)> {
    let mut at = open + 1;
    let mut escaped = false;
    loop {
        let k = at + memchr::memchr2(b'"', b'\\', b.get(at..)?)?;
        if b.get(k) == Some(&b'"') {
            return Some((k, escaped));
        }
        escaped = true;
        at = k + 2;
    }
}

/// The closing quote of the string opening at `open`, in text already validated: the first `"`
/// after an even run of backslashes (none, or escaped backslashes). The byte before a run of
/// backslashes ends a character or an escape (no escape holds a backslash past its first byte
/// but `\\`), so the run is escaped backslashes, and one more if it is odd, which escapes the
/// quote. A value's text (a first turn of hundreds of KB) has a backslash every few dozen bytes
/// but a quote every hundred or more: looking for quotes alone makes far fewer `memchr` calls.
fn string_end(b: &[u8], open: usize) -> Option<usize> {
    let mut at = open + 1;
    loop {
        let quote = at + memchr::memchr(b'"', b.get(at..)?)?;
        let before = b.get(open + 1..quote)?;
        let run = before.iter().rev().take_while(|&&c| c == b'\\').count();
        if run % 2 == 0 {
            return Some(quote);
        }
        at = quote + 1;
    }
}

/// The offset just past the value starting at `at`.
fn value_end(b: &[u8], at: usize) -> Option<usize> {
    match *b.get(at)? {
        b'"' => string_end(b, at).map(|close| close + 1),
        b'{' | b'[' => {
            // Brackets inside strings are skipped with the strings; valid JSON nests them right,
            // so counting depth without telling `{` from `[` finds the matching close.
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match *b.get(i)? {
                    b'"' => i = string_end(b, i)?,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        first => {
            // A number or a literal: up to the next delimiter, and not empty.
            let rest = b.get(at..)?;
            let len = rest
                .iter()
                .position(|&c| matches!(c, b',' | b'}' | b']') || is_ws(c))
                .unwrap_or(rest.len());
            let word = rest.get(..len)?;
            let ok = match first {
                b't' => word == b"true",
                b'f' => word == b"false",
                b'n' => word == b"null",
                b'-' | b'0'..=b'9' => word
                    .iter()
                    .all(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')),
                _ => false,
            };
            ok.then_some(at + len)
        }
    }
}

/// Elements of a raw value known to be an array.
pub(crate) fn array(raw: Json<'_>) -> serde_json::Result<Vec<Json<'_>>> {
    serde_json::from_str(raw.0)
}

/// The first `n` elements of a raw value known to be an array, and whether it has more: reads
/// no further than element `n + 1`, so a 22-million-element array is not split into a
/// 22-million-entry vector to look at its head or to be refused.
pub(crate) fn array_head(raw: Json<'_>, n: usize) -> serde_json::Result<(Vec<Json<'_>>, bool)> {
    /// The error that stops the read; told apart from a syntax error by this exact text.
    const MORE: &str = "kvbust: the array has more elements";
    struct Head<'v, 'de>(&'v mut Vec<Json<'de>>, usize);
    impl<'de> Visitor<'de> for Head<'_, 'de> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(e) = seq.next_element::<Json<'de>>()? {
                if self.0.len() == self.1 {
                    return Err(serde::de::Error::custom(MORE));
                }
                self.0.push(e);
            }
            Ok(())
        }
    }
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_str(raw.0);
    match de.deserialize_seq(Head(&mut out, n)) {
        Ok(()) => Ok((out, false)),
        Err(e) if e.is_data() && e.to_string().starts_with(MORE) => Ok((out, true)),
        Err(e) => Err(e),
    }
}

/// The decoded text of a raw value known to be a string. Fails only on escapes that are not
/// Unicode (lone surrogates such as `"\ud800"`), which JSON syntax allows.
pub(crate) fn string(raw: Json<'_>) -> serde_json::Result<Cow<'_, str>> {
    // A literal without a backslash is its text between the quotes (the parse that produced it
    // refused raw control characters): one `memchr` instead of a second pass through serde.
    if let Some(inner) = raw.0.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
            return Ok(Cow::Borrowed(inner));
        }
    }
    serde_json::from_str::<Str<'_>>(raw.0).map(|s| s.0)
}

/// The decoded text when `raw` is a string (and decodable); `None` otherwise.
pub(crate) fn as_str(raw: Json<'_>) -> Option<Cow<'_, str>> {
    if Kind::of(raw) == Kind::String {
        string(raw).ok()
    } else {
        None
    }
}

/// The `text` string of a content part `{"type": text_type, "text": "…", …}` (the last member of
/// each key, as everywhere); `None` for any other part. Chat and Anthropic text parts use
/// `text_type = "text"`, Responses input parts `"input_text"`.
pub(crate) fn part_text<'a>(part: &RawObject<'a>, text_type: &str) -> Option<Json<'a>> {
    let is_text = part
        .get("type")
        .and_then(as_str)
        .is_some_and(|t| t == text_type);
    let text = part.get("text")?;
    (is_text && Kind::of(text) == Kind::String).then_some(text)
}

/// Byte range of `raw` inside `base`, when `raw` was borrowed from `base` (always the case for
/// values parsed from the body; `None` would be an engine bug, reported, never a panic).
pub(crate) fn span(base: &[u8], raw: Json<'_>) -> Option<Range<usize>> {
    let start = (raw.0.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    let end = start.checked_add(raw.0.len())?;
    (end <= base.len()).then_some(start..end)
}

/// One change to a body: the bytes at `.0` replaced by `.1` (an empty range inserts).
pub(crate) type Edit<B> = (Range<usize>, B);

/// `body` with `edits` made (in any order; they must not overlap). `None` when an edit does not
/// fit the body, which would be a bug of the step that made it.
pub(crate) fn splice<B: AsRef<[u8]>>(body: &[u8], edits: &mut [Edit<B>]) -> Option<Vec<u8>> {
    edits.sort_by_key(|(r, _)| (r.start, r.end));
    let extra: usize = edits.iter().map(|(_, b)| b.as_ref().len()).sum();
    let mut out = Vec::with_capacity(body.len() + extra);
    let mut pos = 0;
    for (range, bytes) in edits.iter() {
        out.extend_from_slice(body.get(pos..range.start)?);
        out.extend_from_slice(bytes.as_ref());
        pos = range.end;
    }
    out.extend_from_slice(body.get(pos..)?);
    Some(out)
}

/// The top-level members whose last value a [`Layout`] keeps: what the request steps after the
/// first read of a chat or completions body.
const LAYOUT_KEYS: [&str; 5] = ["messages", "stream", "stream_options", "user", "cache_salt"];

/// One parse of a JSON object body, kept as byte ranges: where the values of the members the
/// later request steps read are ([`LAYOUT_KEYS`], the last member of each), where the object
/// closes, and, when a step needs them, where the elements of `messages` are. It borrows nothing,
/// so it outlives the bytes it was made from: a step that splices the body moves it onto the new
/// bytes ([`Layout::shift`]) and the next step reads those through it instead of parsing them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    values: [Option<Range<usize>>; LAYOUT_KEYS.len()],
    /// Offset of the closing `}`.
    close: usize,
    /// How many members the object has.
    members: usize,
    /// The elements of the last `messages`, when it is an array and a step asked for them.
    items: Option<Vec<Range<usize>>>,
}

impl Layout {
    /// The layout of `body`, read from its parse `top` (without `messages`'s elements: see
    /// [`Layout::with_items`]). `None` only if a value lay outside `body` (a bug, never a panic).
    pub(crate) fn of(body: &[u8], top: &Top<'_>) -> Option<Layout> {
        let mut values: [Option<Range<usize>>; LAYOUT_KEYS.len()] = Default::default();
        for (k, v) in top.object.members() {
            if let Some(i) = LAYOUT_KEYS.iter().position(|key| *key == k) {
                values[i] = Some(span(body, v)?);
            }
        }
        if top.field == LAYOUT_KEYS[0] && top.array.is_some() {
            values[0] = top.array_span.clone();
        }
        Some(Layout {
            values,
            close: body.iter().rposition(|&b| b == b'}')?,
            members: top.object.entries.len() + top.array_members,
            items: None,
        })
    }

    /// The layout with the elements `elems` (of the last `messages`, borrowed from `body`).
    pub(crate) fn with_items(mut self, body: &[u8], elems: &[Json<'_>]) -> Option<Layout> {
        self.items = Some(
            elems
                .iter()
                .map(|e| span(body, *e))
                .collect::<Option<_>>()?,
        );
        Some(self)
    }

    /// The range of the value of the last member named `key` (one of [`LAYOUT_KEYS`]).
    pub(crate) fn get(&self, key: &str) -> Option<Range<usize>> {
        let i = LAYOUT_KEYS.iter().position(|k| *k == key)?;
        self.values[i].clone()
    }

    /// Offset of the object's closing `}`.
    pub(crate) fn close(&self) -> usize {
        self.close
    }

    /// How many members the object has.
    pub(crate) fn members(&self) -> usize {
        self.members
    }

    /// A step added a member to the object (the salt): the next one to add one needs a comma.
    pub(crate) fn member_added(&mut self) {
        self.members += 1;
    }

    /// The elements of the last `messages`, when the layout knows them.
    pub(crate) fn items(&self) -> Option<&[Range<usize>]> {
        self.items.as_deref()
    }

    /// Records what a step that wrote the body knows: `messages`'s value and its elements.
    pub(crate) fn set_messages(&mut self, value: Range<usize>, items: Option<Vec<Range<usize>>>) {
        self.values[0] = Some(value);
        self.items = items;
    }

    /// Moves the layout onto the bytes [`splice`] makes of its body with `edits`. An edit inside
    /// a value moves that value's end; one before it moves the whole value. An insertion right
    /// at a value's end is outside it, one right at its start is before it. Members and elements
    /// of `messages` the edits add or remove are not counted: synthesis, which adds them, records
    /// what it wrote ([`Layout::set_messages`]); usage, which adds a member, is the last step.
    pub(crate) fn shift<B: AsRef<[u8]>>(&mut self, edits: &[Edit<B>]) {
        let delta = |e: &Edit<B>| e.1.as_ref().len() as isize - e.0.len() as isize;
        let start = |pos: usize| {
            let d: isize = edits.iter().filter(|e| e.0.end <= pos).map(delta).sum();
            pos.saturating_add_signed(d)
        };
        let end = |pos: usize| {
            let inside = |e: &&Edit<B>| e.0.end < pos || (e.0.end == pos && e.0.start < pos);
            let d: isize = edits.iter().filter(inside).map(delta).sum();
            pos.saturating_add_signed(d)
        };
        let range = |r: &mut Range<usize>| *r = start(r.start)..end(r.end);
        self.values.iter_mut().flatten().for_each(range);
        self.items.iter_mut().flatten().for_each(range);
        self.close = start(self.close);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_keep_order_duplicates_and_borrow() {
        let body = br#" {"b":1, "a" : [1,2] ,"b":"x\u00e9","k\u0041":null} "#;
        let top: &RawValue = serde_json::from_slice(body).unwrap();
        let o = object(top.into()).unwrap();
        let keys: Vec<&str> = o.entries.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(keys, ["b", "a", "b", "kA"]);
        assert_eq!(o.distinct_keys(), 3);
        let b = o.get("b").unwrap();
        assert_eq!(b.get(), r#""x\u00e9""#);
        assert_eq!(string(b).unwrap(), "xé");
        assert!(o.get_non_null("kA").is_none());
        assert!(o.get("kA").is_some());
        let a = o.get("a").unwrap();
        let r = span(body, a).unwrap();
        assert_eq!(&body[r], b"[1,2]");
        let els = array(a).unwrap();
        assert_eq!(&body[span(body, els[1]).unwrap()], b"2");
        assert!(span(b"[1,2]", a).is_none());
    }

    #[test]
    fn fast_path_splits_the_array_field() {
        let body = br#"{"a":1,"messages":[ {"x":1} , 2 ],"b":"c","messages":[3]}"#;
        let Top {
            object: o,
            array: arr,
            ..
        } = object_with_array(body, "messages").unwrap();
        assert!(o.get("messages").is_none());
        assert_eq!(o.distinct_keys(), 2);
        let arr = arr.unwrap();
        assert_eq!(arr.len(), 1);
        assert_eq!(&body[span(body, arr[0]).unwrap()], b"3");
        let none = object_with_array(br#"{"a":1}"#, "messages").unwrap();
        assert!(none.array.is_none());
        for bad in [
            &br#"{"messages":"x"}"#[..],
            br#"{"messages":null}"#,
            b"[1]",
            b"{} x",
            br#"{"messages":[1e400], "m":1e400}"#,
        ] {
            let ok = object_with_array(bad, "messages").is_ok();
            assert_eq!(
                ok,
                bad.starts_with(br#"{"messages":[1e400]"#),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// The scan gives the members serde gives, for every spelling a client may send; it leaves
    /// escaped keys to serde.
    #[test]
    fn the_scan_reads_what_serde_reads() {
        let cases: &[(&str, bool)] = &[
            // (object text as sent, whether the scan reads it itself)
            (r#"{}"#, true),
            (" {\t}\n", true),
            (r#"{"role":"user","content":"hi"}"#, true),
            (
                "{ \"role\" :\n\t\"user\" ,\r\n \"content\" : \"hi\" }",
                true,
            ),
            // duplicate keys: both kept in order, the last one is what `get` finds
            (r#"{"role":"system","content":"a","role":"user"}"#, true),
            // the key's name inside strings, nested objects and arrays is not a member
            (
                r#"{"content":"say \"role\": \"user\"","role":"assistant"}"#,
                true,
            ),
            (
                r#"{"meta":{"role":"user","x":[{"role":"user"}]},"role":"tool"}"#,
                true,
            ),
            (
                r#"{"content":[{"type":"text","text":"]}{\"role\":\"user\"}"}],"n":1}"#,
                true,
            ),
            // escaped backslashes right before a closing quote, braces in strings
            (r#"{"content":"a\\","role":"user","x":"\\\"}"}"#, true),
            (r#"{"k":"\u00e9\ud83d\ude00 é 😀 \n\t\/"}"#, true),
            // every kind of value, with and without surrounding whitespace
            (
                r#"{"a":-1.5e+3,"b":true ,"c":false, "d":null,"e":0,"f":[ ],"g":{ },"h":[[1],[2,[3]]]}"#,
                true,
            ),
            (r#"{"a":1E-2}"#, true),
            // escaped keys: serde decodes them
            (r#"{"r\u006fle":"user"}"#, false),
            (r#"{"role":"user","k\"ey":1}"#, false),
            (r#"{"\\":1}"#, false),
        ];
        for (text, scanned) in cases {
            let raw: &RawValue = serde_json::from_str(text).unwrap();
            let raw = Json::from(raw);
            let by_serde = object(raw).unwrap();
            let by_scan = scan_object(raw);
            assert_eq!(by_scan.is_some(), *scanned, "{text}");
            let got = object_of_valid(raw).unwrap();
            let want: Vec<_> = by_serde.members().collect();
            assert_eq!(got.members().collect::<Vec<_>>(), want, "{text}");
            assert_eq!(got.get("role"), by_serde.get("role"), "{text}");
            assert_eq!(got.get("content"), by_serde.get("content"), "{text}");
        }
        let dup = scan_object(Json(r#"{"role":"system","role":"user"}"#)).unwrap();
        assert_eq!(dup.get("role").unwrap().get(), r#""user""#);
        assert_eq!(dup.count("role"), 2);
    }

    /// Escapes at every position of keys and values of every length up to 40 bytes (one
    /// `memchr` window and more): the scan reads what serde reads, or leaves it to serde.
    #[test]
    fn the_scan_reads_strings_of_every_length() {
        for n in 0..40 {
            for p in 0..=n {
                for special in ["x", "\\\"", "\\\\", "\\u00e9", "é", "\\/"] {
                    let text = format!("{}{special}{}", "a".repeat(p), "b".repeat(n - p));
                    for (body, in_key) in [
                        (format!(r#"{{"role":"{text}","content":"{text}"}}"#), false),
                        (format!(r#"{{"{text}":"user","role":["{text}"]}}"#), true),
                    ] {
                        let raw: &RawValue = serde_json::from_str(&body).unwrap();
                        let raw = Json::from(raw);
                        let by_serde = object(raw).unwrap();
                        let got = object_of_valid(raw).unwrap();
                        let want: Vec<_> = by_serde.members().collect();
                        assert_eq!(got.members().collect::<Vec<_>>(), want, "{body}");
                        let key_escaped = in_key && special.starts_with('\\');
                        assert_eq!(scan_object(raw).is_none(), key_escaped, "{body}");
                    }
                }
            }
        }
    }

    /// Long values dense with escapes, runs of backslashes before quotes among them, as strings
    /// and inside nested containers: the scan finds the members serde finds.
    #[test]
    fn the_scan_skips_long_escaped_values_as_serde_does() {
        use rand::{Rng as _, SeedableRng as _};
        let pieces = [
            "a",
            "text ",
            r#"\""#,
            r"\\",
            r#"\\\""#,
            r#"\\\\\""#,
            r"\n",
            r"\/",
            r"\u005c",
            r"\u0022",
            r"\ud83d\ude00",
            "é",
            "}",
            "]",
            "{",
            "[",
            ",",
            ":",
        ];
        let mut rng = rand_pcg::Pcg64::seed_from_u64(33);
        for _ in 0..3_000 {
            let mut text = String::new();
            for _ in 0..rng.random_range(0..150) {
                text.push_str(pieces[rng.random_range(0..pieces.len())]);
            }
            if rng.random_bool(0.5) {
                text.push_str(r"\\");
            }
            let body = format!(
                r#"{{"role":"user","content":"{text}","x":[{{"t":"{text}"}},"{text}"],"n":1}}"#
            );
            let raw: &RawValue = serde_json::from_str(&body).unwrap();
            let raw = Json::from(raw);
            let by_serde = object(raw).unwrap();
            let by_scan = scan_object(raw).unwrap();
            let want: Vec<_> = by_serde.members().collect();
            assert_eq!(by_scan.members().collect::<Vec<_>>(), want, "{body}");
        }
    }

    /// Text that is not an object's valid JSON (never the case for a parsed value) is left to
    /// serde, which words the error, rather than read wrong.
    #[test]
    fn the_scan_refuses_what_is_not_valid() {
        for text in [
            "",
            "[]",
            "\"x\"",
            "{",
            "{\"a\"}",
            "{\"a\" 1}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{\"a\":1 \"b\":2}",
            "{\"a\":tru}",
            "{\"a\":nul}",
            "{\"a\":x}",
            "{\"a\":\"x}",
            "{\"a\":[1,2}",
            "{\"a\":1}}",
            "{\"a\":1} ",
            "{\"a\":{\"b\":[}",
            "{\"a\":\"\\",
        ] {
            assert!(scan_object(Json(text)).is_none(), "{text}");
        }
    }

    #[test]
    fn kinds() {
        for (s, k) in [
            ("{}", Kind::Object),
            ("[]", Kind::Array),
            ("\"\"", Kind::String),
            ("-1", Kind::Number),
            ("true", Kind::Bool),
            ("false", Kind::Bool),
            ("null", Kind::Null),
        ] {
            let raw: &RawValue = serde_json::from_str(s).unwrap();
            assert_eq!(Kind::of(raw.into()), k, "{s}");
        }
    }

    /// Strings decode as serde decodes them, with and without escapes; other values fail.
    #[test]
    fn strings_decode_as_serde_decodes_them() {
        for text in [
            r#""""#,
            r#""plain text, {braces} [brackets] and 'quotes'""#,
            r#""é 😀 \u00e9""#,
            r#""a\"b\\c\/d\n\t\r\b\f""#,
            r#""\\""#,
            r#""\ud83d\ude00""#,
            r#""ends with a backslash pair \\\\""#,
        ] {
            let raw: &RawValue = serde_json::from_str(text).unwrap();
            let want: String = serde_json::from_str(text).unwrap();
            assert_eq!(string(raw.into()).unwrap(), want, "{text}");
            let borrowed = matches!(string(raw.into()).unwrap(), Cow::Borrowed(_));
            assert_eq!(borrowed, !text.contains('\\'), "{text}");
        }
        for text in ["1", "null", "[\"a\"]", "{}"] {
            let raw: &RawValue = serde_json::from_str(text).unwrap();
            assert!(string(raw.into()).is_err(), "{text}");
        }
    }

    #[test]
    fn lone_surrogates_are_json_but_not_text() {
        let raw: &RawValue = serde_json::from_str(r#""\ud800""#).unwrap();
        assert!(string(raw.into()).is_err());
        assert!(as_str(raw.into()).is_none());
    }

    fn laid_out(body: &[u8]) -> Layout {
        let top = object_with_array(body, "messages").unwrap();
        let items = top.array.clone().unwrap_or_default();
        Layout::of(body, &top)
            .unwrap()
            .with_items(body, &items)
            .unwrap()
    }

    /// A layout moved over a splice is the layout a parse of the spliced bytes gives: edits
    /// before, inside, at either edge of and after the members it tracks.
    #[test]
    fn a_shifted_layout_is_the_layout_of_the_new_bytes() {
        let body = br#" {"model":"m", "messages" : [ {"role":"user","content":"ab"} ,{"x":[]}], "stream":true,"stream_options":null ,"user":"u"} "#;
        let at = |needle: &str| {
            body.windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap()
        };
        let cases: Vec<Vec<Edit<&str>>> = vec![
            vec![(at("\"m\"")..at("\"m\"") + 3, "\"longer model\"")],
            vec![(at("ab") + 1..at("ab") + 1, "[rid]")],
            vec![(at("[]}") + 1..at("[]}") + 1, r#"{"type":"x"}"#)],
            vec![(at("]}") + 1..at("]}") + 1, r#","y":1"#)],
            vec![(at("null")..at("null") + 4, r#"{"include_usage":true}"#)],
            vec![
                (at("\"u\"")..at("\"u\"") + 3, "\"\""),
                (at("ab")..at("ab") + 2, ""),
                (at("} ")..at("} "), r#","n":1"#),
            ],
        ];
        for mut edits in cases {
            let out = splice(body, &mut edits).unwrap();
            let mut moved = laid_out(body);
            moved.shift(&edits);
            assert_eq!(moved, laid_out(&out), "{}", String::from_utf8_lossy(&out));
        }
    }

    #[test]
    fn a_layout_knows_the_last_members_and_a_plain_keys_array() {
        let body = br#"{"stream":false,"messages" :[1, 2 ],"stream":true}"#;
        let l = laid_out(body);
        assert_eq!(&body[l.get("stream").unwrap()], b"true");
        assert_eq!(&body[l.get("messages").unwrap()], b"[1, 2 ]");
        assert_eq!(l.items().unwrap().len(), 2);
        assert_eq!((l.close(), l.members()), (body.len() - 1, 3));
        // An escaped key: the elements are known, the brackets are not.
        let top = object_with_array(br#"{"m\u0065ssages":[]}"#, "messages").unwrap();
        assert!(top.array.is_some() && top.array_span.is_none());
        let empty = br#"{"messages": [ ] }"#;
        assert_eq!(&empty[laid_out(empty).get("messages").unwrap()], b"[ ]");
    }
}
