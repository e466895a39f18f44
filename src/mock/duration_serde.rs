//! Serde helpers for human-readable durations written with a unit ("15ms", "2s", "20us", "1m 30s") via humantime.
//! Owns only (de)serialisation of `Duration`; it never accepts bare numbers, because a unit-less number is ambiguous.
//!
//! Use with `#[serde(with = "crate::mock::duration_serde")]` on a `Duration` field, or
//! `#[serde(with = "crate::mock::duration_serde::option")]` on an `Option<Duration>` field.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

const EXPECTING: &str = "a duration string with a unit, such as \"15ms\", \"2s\" or \"20us\"";

/// Parses a human-readable duration ("15ms", "2s", "1m 30s"); surrounding whitespace is ignored.
pub fn parse(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text.trim())
}

/// Formats a duration the way [`parse`] reads it back ("15ms", "1s 500ms", "0s").
pub fn format(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Serialises a `Duration` as a humantime string.
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_duration(*d))
}

/// Deserialises a `Duration` from a humantime string.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_str(DurationVisitor)
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTING)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse(v).map_err(|e| {
            E::custom(format!(
                "invalid duration {v:?} ({e}); expected {EXPECTING}"
            ))
        })
    }
}

/// The same for `Option<Duration>`: `None` serialises as nothing/null, and null or absent deserialises as `None`
/// (pair it with `#[serde(default)]` so an absent key is accepted).
pub mod option {
    use super::*;

    /// Serialises `Some(d)` as a humantime string and `None` as none/null.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    /// Deserialises null as `None` and a humantime string as `Some`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        d.deserialize_option(OptionVisitor)
    }

    struct OptionVisitor;

    impl<'de> Visitor<'de> for OptionVisitor {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "nothing, or {EXPECTING}")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            super::deserialize(d).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

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
            let t: T = serde_json::from_str(&format!(r#"{{"d":"{text}"}}"#)).expect("parses");
            assert_eq!(t, T { d, o: None });
            let back = serde_json::to_string(&t).expect("serialises");
            assert_eq!(back, format!(r#"{{"d":"{text}","o":null}}"#));
        }
        let t: T = serde_json::from_str(r#"{"d":"1ms","o":"3s"}"#).expect("parses");
        assert_eq!(t.o, Some(Duration::from_secs(3)));
    }

    #[test]
    fn rejects_numbers_and_garbage_with_a_helpful_message() {
        let e = serde_json::from_str::<T>(r#"{"d":15}"#).expect_err("bare number rejected");
        assert!(e.to_string().contains("\"15ms\""), "{e}");
        let e = serde_json::from_str::<T>(r#"{"d":"fast"}"#).expect_err("garbage rejected");
        assert!(e.to_string().contains("invalid duration \"fast\""), "{e}");
    }
}
