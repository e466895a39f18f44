//! Durations as people write them (`"5s"`, `"250ms"`, `"1m 30s"`, via humantime): parsing,
//! formatting and serde for `Duration` and `Option<Duration>`, used by the configuration, the
//! mock, the CLI and headers alike. Never accepts a bare number: a unit-less duration is ambiguous.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Parses `"15ms"`, `"2s"`, `"1m 30s"`; surrounding whitespace is ignored.
pub fn parse(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text.trim())
}

/// `text` as a duration, or a message that quotes it and shows what a duration looks like.
pub fn parse_or_explain(text: &str) -> Result<Duration, String> {
    parse(text).map_err(|e| format!("`{text}` is not a duration like \"5s\" or \"250ms\": {e}"))
}

/// Formats a duration the way [`parse`] reads it back (`"15ms"`, `"1s 500ms"`, `"0s"`).
pub fn format(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The text of a duration value; a bare number gets a message saying which unit to add.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        S(String),
        N(f64),
    }
    match Raw::deserialize(d)? {
        Raw::S(s) => Ok(s),
        Raw::N(n) => Err(serde::de::Error::custom(format!(
            "`{n}` has no unit; write a duration like \"{n}s\" or \"{n}ms\""
        ))),
    }
}

/// `#[serde(with = "crate::units::duration")]` on a `Duration` field.
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_duration(*d))
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    parse_or_explain(&text(d)?).map_err(serde::de::Error::custom)
}

/// `#[serde(with = "crate::units::duration::option")]` on an `Option<Duration>` field: `"none"` (or an
/// absent key, with `#[serde(default)]`) is no limit.
pub mod option {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_str("none"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s = text(d)?;
        if s.trim().eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        parse(&s).map(Some).map_err(|e| {
            serde::de::Error::custom(format!(
                "`{s}` is not a duration like \"30m\" (or \"none\"): {e}"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct T {
        #[serde(with = "super")]
        d: Duration,
        #[serde(with = "super::option", default)]
        o: Option<Duration>,
    }

    #[test]
    fn round_trips_humantime_strings() {
        for (text, d) in [
            ("15ms", Duration::from_millis(15)),
            ("20us", Duration::from_micros(20)),
            ("2s", Duration::from_secs(2)),
            ("0s", Duration::ZERO),
            ("1s 500ms", Duration::from_millis(1500)),
        ] {
            let t: T = serde_json::from_str(&format!(r#"{{"d":" {text} "}}"#)).expect("parses");
            assert_eq!(t, T { d, o: None });
            let back = serde_json::to_string(&t).expect("serialises");
            assert_eq!(back, format!(r#"{{"d":"{text}","o":"none"}}"#));
            assert_eq!(format(d), text);
        }
        let t: T = serde_json::from_str(r#"{"d":"1ms","o":"3s"}"#).expect("parses");
        assert_eq!(t.o, Some(Duration::from_secs(3)));
        let t: T = serde_json::from_str(r#"{"d":"1ms","o":"None"}"#).expect("parses");
        assert_eq!(t.o, None);
    }

    #[test]
    fn rejects_numbers_and_garbage_with_a_helpful_message() {
        let e = serde_json::from_str::<T>(r#"{"d":15}"#).expect_err("bare number rejected");
        assert!(e.to_string().contains("\"15ms\""), "{e}");
        let e = serde_json::from_str::<T>(r#"{"d":"fast"}"#).expect_err("garbage rejected");
        assert!(
            e.to_string()
                .contains("`fast` is not a duration like \"5s\""),
            "{e}"
        );
        let e = serde_json::from_str::<T>(r#"{"d":"1s","o":"soon"}"#).expect_err("rejected");
        assert!(e.to_string().contains("(or \"none\")"), "{e}");
    }
}
