//! Element-count bounds on a mock request body, checked before the body is parsed into anything:
//! one pass over the JSON that counts every list's entries, every object and every value, and
//! builds nothing (no DOM, no strings but object keys, one at a time). A body past a bound is a
//! 400 in OpenAI's shape naming the list, its count and the limit, so a 58 MB chat of two
//! million empty messages costs one scan, not gigabytes. Owns the limits only; never reads a
//! field's meaning and never panics on any input.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Entries one list may hold: `messages`, content parts, Responses `input` items, a prompt's
/// strings, any other list. Anthropic's Messages API takes at most 100,000 messages; no chat
/// template renders more in any context window the mock serves.
pub const MAX_ENTRIES: usize = 100_000;

/// Entries the `/v1/completions` `prompt` list (and each token-id list in it) may hold: token
/// ids come as numbers, one per token, and 2,097,152 covers a 2M-token context window.
pub const MAX_PROMPT_ENTRIES: usize = 1 << 21;

/// JSON values one body may hold in all (every string, number, list and object counts one).
pub const MAX_VALUES: usize = 1 << 22;

/// JSON objects one body may hold in all: an object costs far more memory once parsed than its
/// two bytes of text, so they are bounded apart from the other values.
pub const MAX_OBJECTS: usize = 1 << 18;

/// One step of the path to a value, for the error message.
enum Seg {
    Key(String),
    Index(usize),
}

/// The counts so far and the first bound that was broken.
#[derive(Default)]
struct Census {
    path: Vec<Seg>,
    values: usize,
    objects: usize,
    /// The first list or object past its limit: (path, entries, limit, "array" or "object").
    long_list: Option<(String, usize, usize, &'static str)>,
}

impl Census {
    fn path(&self) -> String {
        let mut out = String::new();
        for seg in &self.path {
            match seg {
                Seg::Key(k) if out.is_empty() => out.push_str(k),
                Seg::Key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Seg::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        if out.is_empty() {
            out.push_str("the body");
        }
        out
    }

    /// The limit on the list at the current path: the top-level `prompt` and the token-id
    /// lists inside it may be as long as a context window.
    fn list_limit(&self) -> usize {
        match self.path.as_slice() {
            [Seg::Key(k)] | [Seg::Key(k), Seg::Index(_)] if k == "prompt" => MAX_PROMPT_ENTRIES,
            _ => MAX_ENTRIES,
        }
    }
}

/// A bound the body broke: the OpenAI error `code` and a message naming the list (or the
/// body), its count and the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    pub code: &'static str,
    pub message: String,
}

/// Checks `body` against the bounds: `Ok` when it holds no list, object count or value count
/// past them, or when it is not JSON at all (the parser that follows says what is wrong).
pub fn check(body: &[u8]) -> Result<(), Exceeded> {
    let mut census = Census::default();
    let mut de = serde_json::Deserializer::from_slice(body);
    if Count(&mut census).deserialize(&mut de).is_err() {
        // Not JSON (or too deep): the full parse reports it in its own words.
        return Ok(());
    }
    if let Some((path, n, limit, kind)) = census.long_list {
        let message = match kind {
            "array" => format!(
                "Invalid '{path}': array too long. Expected an array with maximum length \
                 {limit}, but got an array with length {n} instead."
            ),
            _ => format!(
                "Invalid '{path}': object too large. Expected at most {limit} members, but got \
                 {n} instead."
            ),
        };
        return Err(Exceeded {
            code: "array_above_max_length",
            message,
        });
    }
    let too_many = |what: &str, n: usize, limit: usize| Exceeded {
        code: "too_many_json_values",
        message: format!(
            "The request body holds {n} JSON {what}; the mock accepts at most {limit}."
        ),
    };
    if census.objects > MAX_OBJECTS {
        return Err(too_many("objects", census.objects, MAX_OBJECTS));
    }
    if census.values > MAX_VALUES {
        return Err(too_many("values", census.values, MAX_VALUES));
    }
    Ok(())
}

/// Counts one value and everything in it.
struct Count<'a>(&'a mut Census);

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.0.values += 1;
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let census = self.0;
        let limit = census.list_limit();
        let mut n = 0;
        let mut mine = false;
        loop {
            if census.long_list.is_some() {
                // The answer is known: the rest is only counted, not looked into.
                match seq.next_element::<IgnoredAny>()? {
                    Some(_) => n += 1,
                    None => break,
                }
                continue;
            }
            census.path.push(Seg::Index(n));
            let more = seq.next_element_seed(Count(&mut *census))?;
            census.path.pop();
            if more.is_none() {
                break;
            }
            n += 1;
            if n > limit {
                census.long_list = Some((census.path(), n, limit, "array"));
                mine = true;
            }
        }
        if let (true, Some(list)) = (mine, &mut census.long_list) {
            // Its whole length, counted to the end.
            list.1 = n;
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let census = self.0;
        census.objects += 1;
        let mut n = 0;
        let mut mine = false;
        loop {
            if census.long_list.is_some() {
                match map.next_entry::<IgnoredAny, IgnoredAny>()? {
                    Some(_) => n += 1,
                    None => break,
                }
                continue;
            }
            let Some(key) = map.next_key::<String>()? else {
                break;
            };
            census.path.push(Seg::Key(key));
            map.next_value_seed(Count(&mut *census))?;
            census.path.pop();
            n += 1;
            if n > MAX_ENTRIES {
                census.long_list = Some((census.path(), n, MAX_ENTRIES, "object"));
                mine = true;
            }
        }
        if let (true, Some(list)) = (mine, &mut census.long_list) {
            list.1 = n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entry: &str, n: usize) -> String {
        vec![entry; n].join(",")
    }

    #[test]
    fn a_list_past_its_limit_is_named_with_its_whole_length() {
        let body = format!(r#"{{"messages":[{}]}}"#, list("{}", MAX_ENTRIES + 5));
        let e = check(body.as_bytes()).unwrap_err();
        assert_eq!(e.code, "array_above_max_length");
        assert!(
            e.message.contains(&format!(
                "Invalid 'messages': array too long. Expected an array with maximum length \
                 {MAX_ENTRIES}, but got an array with length {} instead.",
                MAX_ENTRIES + 5
            )),
            "{}",
            e.message
        );
        // At the limit: fine.
        let body = format!(r#"{{"messages":[{}]}}"#, list("{}", MAX_ENTRIES));
        assert_eq!(check(body.as_bytes()), Ok(()));
    }

    #[test]
    fn nested_content_parts_are_named_by_their_path() {
        let parts = list(r#"{"type":"text","text":"a"}"#, MAX_ENTRIES + 1);
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":"x"}},{{"role":"user","content":[{parts}]}}]}}"#
        );
        let e = check(body.as_bytes()).unwrap_err();
        assert!(
            e.message
                .starts_with("Invalid 'messages[1].content': array too long.")
                && e.message
                    .contains(&format!("length {} instead", MAX_ENTRIES + 1)),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_completions_prompt_may_be_as_long_as_a_context_window_and_no_longer() {
        let ids = list("1", MAX_ENTRIES * 3);
        assert_eq!(check(format!(r#"{{"prompt":[{ids}]}}"#).as_bytes()), Ok(()));
        // A list of token-id lists: each may be long, the outer list too.
        assert_eq!(
            check(format!(r#"{{"prompt":[[{ids}],[1]]}}"#).as_bytes()),
            Ok(())
        );
        let many = list("[1]", MAX_PROMPT_ENTRIES + 2);
        let e = check(format!(r#"{{"prompt":[{many}]}}"#).as_bytes()).unwrap_err();
        assert!(
            e.message.contains(&format!(
                "Invalid 'prompt': array too long. Expected an array with maximum length \
                 {MAX_PROMPT_ENTRIES}, but got an array with length {} instead.",
                MAX_PROMPT_ENTRIES + 2
            )),
            "{}",
            e.message
        );
        // The same length anywhere else is past the general limit.
        let e = check(format!(r#"{{"other":[{ids}]}}"#).as_bytes()).unwrap_err();
        assert!(
            e.message.starts_with("Invalid 'other': array too long."),
            "{}",
            e.message
        );
    }

    #[test]
    fn objects_and_values_are_bounded_in_all() {
        // 3 lists of 100,000 one-member objects: each list within its limit, the objects not.
        let objs = list(r#"{"a":1}"#, MAX_ENTRIES);
        let body = format!(r#"{{"a":[{objs}],"b":[{objs}],"c":[{objs}]}}"#);
        let e = check(body.as_bytes()).unwrap_err();
        assert_eq!(e.code, "too_many_json_values");
        assert!(
            e.message.contains(&format!(
                "holds {} JSON objects; the mock accepts at most {MAX_OBJECTS}",
                3 * MAX_ENTRIES + 1
            )),
            "{}",
            e.message
        );
        let ids = list("1", MAX_PROMPT_ENTRIES);
        let body = format!(r#"{{"prompt":[[{ids}],[{ids}],[1]]}}"#);
        let e = check(body.as_bytes()).unwrap_err();
        assert!(e.message.contains("JSON values"), "{}", e.message);
    }

    /// Issue 34 item 3: every route's parser (and the cache model, which uses them) refuses a
    /// body past the bounds with a 400 naming the count and the limit, before building it.
    #[test]
    fn every_mock_parser_refuses_a_body_past_the_bounds() {
        use crate::api::Shape;
        use crate::mock::openai::parse_request;
        let msgs = list(r#"{"role":"user","content":""}"#, MAX_ENTRIES + 1);
        let cases = [
            (
                Shape::Chat,
                format!(r#"{{"messages":[{msgs}]}}"#),
                "messages",
            ),
            (
                Shape::Messages,
                format!(r#"{{"max_tokens":1,"messages":[{msgs}]}}"#),
                "messages",
            ),
            (
                Shape::Responses,
                format!(r#"{{"input":[{msgs}]}}"#),
                "input",
            ),
            (
                Shape::Completions,
                format!(r#"{{"prompt":[{}]}}"#, list("[1]", MAX_PROMPT_ENTRIES + 1)),
                "prompt",
            ),
        ];
        for (endpoint, body, list_name) in cases {
            let e = parse_request(endpoint, body.as_bytes(), "m").unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.code, e.kind),
                (400, "array_above_max_length", "invalid_request_error"),
                "{endpoint:?}"
            );
            assert!(
                e.message
                    .starts_with(&format!("Invalid '{list_name}': array too long."))
                    && e.message.contains("but got an array with length"),
                "{endpoint:?}: {}",
                e.message
            );
        }
    }

    #[test]
    fn bodies_that_are_not_json_are_left_to_the_parser() {
        assert_eq!(check(b"{\"messages\": ["), Ok(()));
        assert_eq!(check(b"not json"), Ok(()));
    }
}
