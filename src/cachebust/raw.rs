//! Borrowed, order-preserving views of raw JSON (objects as `(key, &RawValue)` pairs, arrays as `&RawValue` lists) and byte spans into the request body. Never re-serialises or copies a value it does not decode on request.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The JSON type of a raw value, read from its first byte (a `RawValue` is validated JSON with
/// no surrounding whitespace, so the first byte decides).
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
    pub(crate) fn of(raw: &RawValue) -> Kind {
        match raw.get().as_bytes().first() {
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
    entries: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> RawObject<'a> {
    pub(crate) fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
    }

    /// Like [`RawObject::get`] but a JSON `null` counts as absent.
    pub(crate) fn get_non_null(&self, key: &str) -> Option<&'a RawValue> {
        self.get(key).filter(|v| Kind::of(v) != Kind::Null)
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
                    let v: &'de RawValue = map.next_value()?;
                    entries.push((k, v));
                }
                Ok(RawObject { entries })
            }
        }
        d.deserialize_map(V)
    }
}

/// An array's elements, failing on any other JSON type.
struct ArrayOnly<'a>(Vec<&'a RawValue>);

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
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    items.push(item);
                }
                Ok(ArrayOnly(items))
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Clone, Copy)]
struct TopSeed(&'static str);

type TopParts<'a> = (RawObject<'a>, Option<Vec<&'a RawValue>>);

impl<'de> DeserializeSeed<'de> for TopSeed {
    type Value = TopParts<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopSeed {
    type Value = TopParts<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::with_capacity(16);
        let mut array = None;
        while let Some(Str(k)) = map.next_key::<Str<'de>>()? {
            if k == self.0 {
                array = Some(map.next_value::<ArrayOnly<'de>>()?.0);
            } else {
                entries.push((k, map.next_value::<&'de RawValue>()?));
            }
        }
        Ok((RawObject { entries }, array))
    }
}

/// The fast path for the common body: the top-level object's members, except `field`, whose
/// value (the last occurrence) is returned as its elements; one pass over the body instead of
/// two. Fails when the body is not an object, is invalid, or `field` is present but not an array
/// (every occurrence must be one): the caller then takes the general path, which also words the
/// error. `field` is absent from the returned object.
pub(crate) fn object_with_array<'a>(
    body: &'a [u8],
    field: &'static str,
) -> serde_json::Result<TopParts<'a>> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let out = TopSeed(field).deserialize(&mut de)?;
    de.end()?;
    Ok(out)
}

/// Members of a raw value known (by [`Kind::of`]) to be an object.
pub(crate) fn object<'a>(raw: &'a RawValue) -> serde_json::Result<RawObject<'a>> {
    serde_json::from_str(raw.get())
}

/// Elements of a raw value known to be an array.
pub(crate) fn array(raw: &RawValue) -> serde_json::Result<Vec<&RawValue>> {
    serde_json::from_str(raw.get())
}

/// The decoded text of a raw value known to be a string. Fails only on escapes that are not
/// Unicode (lone surrogates such as `"\ud800"`), which JSON syntax allows.
pub(crate) fn string<'a>(raw: &'a RawValue) -> serde_json::Result<Cow<'a, str>> {
    serde_json::from_str::<Str<'a>>(raw.get()).map(|s| s.0)
}

/// The decoded text when `raw` is a string (and decodable); `None` otherwise.
pub(crate) fn as_str<'a>(raw: &'a RawValue) -> Option<Cow<'a, str>> {
    if Kind::of(raw) == Kind::String {
        string(raw).ok()
    } else {
        None
    }
}

/// The `text` string of a content part `{"type": text_type, "text": "…", …}` (the last member of
/// each key, as everywhere); `None` for any other part. Chat and Anthropic text parts use
/// `text_type = "text"`, Responses input parts `"input_text"`.
pub(crate) fn part_text<'a>(part: &RawObject<'a>, text_type: &str) -> Option<&'a RawValue> {
    let is_text = part
        .get("type")
        .and_then(as_str)
        .is_some_and(|t| t == text_type);
    let text = part.get("text")?;
    (is_text && Kind::of(text) == Kind::String).then_some(text)
}

/// Byte range of `raw` inside `base`, when `raw` was borrowed from `base` (always the case for
/// values parsed from the body; `None` would be an engine bug, reported, never a panic).
pub(crate) fn span(base: &[u8], raw: &RawValue) -> Option<Range<usize>> {
    let start = (raw.get().as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    let end = start.checked_add(raw.get().len())?;
    (end <= base.len()).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_keep_order_duplicates_and_borrow() {
        let body = br#" {"b":1, "a" : [1,2] ,"b":"x\u00e9","k\u0041":null} "#;
        let top: &RawValue = serde_json::from_slice(body).unwrap();
        let o = object(top).unwrap();
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
        let (o, arr) = object_with_array(body, "messages").unwrap();
        assert!(o.get("messages").is_none());
        assert_eq!(o.distinct_keys(), 2);
        let arr = arr.unwrap();
        assert_eq!(arr.len(), 1);
        assert_eq!(&body[span(body, arr[0]).unwrap()], b"3");
        let (_, none) = object_with_array(br#"{"a":1}"#, "messages").unwrap();
        assert!(none.is_none());
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
            assert_eq!(Kind::of(raw), k, "{s}");
        }
    }

    #[test]
    fn lone_surrogates_are_json_but_not_text() {
        let raw: &RawValue = serde_json::from_str(r#""\ud800""#).unwrap();
        assert!(string(raw).is_err());
        assert!(as_str(raw).is_none());
    }
}
