//! Isolation by `cache_salt` (`cache_bust.method = "salt"`, issue 40): the method, the salt a target and phase give, vLLM's limits on a salt, and the one edit that puts it into a body's top-level object. Never does I/O and never touches a byte of the prompt.
//!
//! vLLM (0.33, `validate_cache_salt`) and SGLang take a per-request `cache_salt` that joins the
//! hash of the prompt's first block only; every later block chains from it, so two salts share
//! no block. The salt therefore isolates exactly as AIPerf's marker does without changing a
//! token: the RID targets get `kvbust-<12 hex RID digest>`, the warm-up isolation targets
//! `kvbust-warmup-<benchmark_id>` on warm-up requests, `none` nothing. A client's own string
//! salt is kept as the tail (`kvbust-<digest>-<client salt>`), so two clients' namespaces stay
//! apart under kvbust's isolation too.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::target::{Phase, Target};

/// How a request is isolated (`cache_bust.method`, `x-kvbust-method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Method {
    /// AIPerf's marker text in the prompt, byte-exact.
    #[default]
    Marker,
    /// The body's `cache_salt`; the prompt goes as it came.
    Salt,
}

impl Method {
    pub const ALL: [Method; 2] = [Method::Marker, Method::Salt];

    /// The wire value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Marker => "marker",
            Method::Salt => "salt",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown method value; the message lists the valid ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown cache-bust method `{value}`; valid values are: marker, salt (case-insensitive)")]
pub struct ParseMethodError {
    pub value: String,
}

impl FromStr for Method {
    type Err = ParseMethodError;

    /// Case-insensitive; surrounding ASCII whitespace is ignored (headers, env values).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim_ascii();
        Method::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(t))
            .ok_or_else(|| ParseMethodError {
                value: s.to_owned(),
            })
    }
}

impl Serialize for Method {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Method {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Every salt kvbust writes starts with this.
pub const PREFIX: &str = "kvbust-";
/// vLLM's longest salt, in characters (Python's `len`: code points).
pub const MAX_CHARS: usize = 128;
/// The characters vLLM refuses in a salt.
pub const FORBIDDEN: [char; 4] = ['@', '/', '\\', '\0'];

/// The salt `target` gives a request in `phase`: `kvbust-<rid>` for the RID targets (`rid` is
/// the 12 hex digest), `kvbust-warmup-<benchmark_id>` for the warm-up isolation targets on
/// warm-up requests; `None` when the request is not isolated (`none`, warm-up isolation while
/// profiling, a RID target without a digest).
pub fn salt_for(
    target: Target,
    phase: Phase,
    rid: Option<&str>,
    benchmark_id: &str,
) -> Option<String> {
    match target {
        Target::None => None,
        t if t.is_warmup_isolation() => {
            (phase == Phase::Warmup).then(|| format!("{PREFIX}warmup-{benchmark_id}"))
        }
        _ => rid.map(|d| format!("{PREFIX}{d}")),
    }
}

/// Why a body cannot carry kvbust's salt: every one is the client's to fix (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaltError {
    #[error("`cache_salt` must be a string for kvbust to keep it as the tail of its own salt (found {found}); send a string or leave it out")]
    NotAString { found: &'static str },
    #[error("`cache_salt` is not valid JSON text: {0}")]
    Invalid(String),
    #[error("`cache_salt` would be {chars} characters with kvbust's salt `{head}-` before the client's: vLLM allows at most {MAX_CHARS}; send a client salt of at most {room} characters")]
    TooLong {
        chars: usize,
        head: String,
        room: usize,
    },
    #[error("`cache_salt` must not contain {what}: vLLM refuses '@', '/', '\\' and NUL in a salt")]
    Forbidden { what: &'static str },
}

impl SaltError {
    /// A stable snake_case code for the 400.
    pub fn code(&self) -> &'static str {
        match self {
            SaltError::NotAString { .. } | SaltError::Invalid(_) => "invalid_cache_salt",
            SaltError::TooLong { .. } => "cache_salt_too_long",
            SaltError::Forbidden { .. } => "cache_salt_forbidden_character",
        }
    }
}

/// The salt `head` with the client's `tail` (none or empty: `head` alone), checked against
/// vLLM's limits (at most [`MAX_CHARS`] characters, none of [`FORBIDDEN`]).
pub fn joined(head: &str, tail: Option<&str>) -> Result<String, SaltError> {
    let salt = match tail.filter(|t| !t.is_empty()) {
        Some(t) => format!("{head}-{t}"),
        None => head.to_string(),
    };
    if let Some(c) = salt.chars().find(|c| FORBIDDEN.contains(c)) {
        let what = match c {
            '@' => "'@'",
            '/' => "'/'",
            '\\' => "'\\'",
            _ => "NUL",
        };
        return Err(SaltError::Forbidden { what });
    }
    let chars = salt.chars().count();
    if chars > MAX_CHARS {
        let head_chars = head.chars().count() + 1;
        return Err(SaltError::TooLong {
            chars,
            head: head.to_string(),
            room: MAX_CHARS.saturating_sub(head_chars),
        });
    }
    Ok(salt)
}

/// The one edit that gives `body` (a JSON object) the salt `head`: the value of its last
/// top-level `cache_salt` (`value`, its span; `null` counts as absent) becomes `head-<client's
/// string>`, or, without one, `"cache_salt":"<head>"` goes in as the object's last member, just
/// before its closing brace at `close` (`members`: how many it has). Returns the range
/// replaced, the bytes that replace it and the salt. Nothing else of the body changes.
pub fn edit(
    body: &[u8],
    value: Option<Range<usize>>,
    close: usize,
    members: usize,
    head: &str,
) -> Result<(Range<usize>, Vec<u8>, String), SaltError> {
    let client = match value.clone().and_then(|r| body.get(r)) {
        None | Some(b"null") => None,
        Some(raw) if raw.first() == Some(&b'"') => Some(
            serde_json::from_slice::<String>(raw).map_err(|e| SaltError::Invalid(e.to_string()))?,
        ),
        Some(raw) => {
            let found = match raw.first() {
                Some(b'[') => "an array",
                Some(b'{') => "an object",
                Some(b't' | b'f') => "a boolean",
                _ => "a number",
            };
            return Err(SaltError::NotAString { found });
        }
    };
    let salt = joined(head, client.as_deref())?;
    // A string of JSON text: serde_json's spelling cannot fail.
    let quoted = serde_json::to_string(&salt).map_err(|e| SaltError::Invalid(e.to_string()))?;
    match value {
        Some(r) => Ok((r, quoted.into_bytes(), salt)),
        None => {
            let comma = if members > 0 { "," } else { "" };
            let member = format!("{comma}\"cache_salt\":{quoted}");
            Ok((close..close, member.into_bytes(), salt))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splice(body: &str, (r, b, _): &(Range<usize>, Vec<u8>, String)) -> String {
        let mut out = body.as_bytes()[..r.start].to_vec();
        out.extend_from_slice(b);
        out.extend_from_slice(&body.as_bytes()[r.end..]);
        String::from_utf8(out).unwrap()
    }

    fn top(body: &str) -> (Option<Range<usize>>, usize, usize) {
        let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(body).unwrap();
        let close = body.rfind('}').unwrap();
        let value = body.find("\"cache_salt\":").map(|k| {
            let start = k + "\"cache_salt\":".len();
            let end = body[start..].find([',', '}']).map_or(close, |e| start + e);
            start..end
        });
        (value, close, v.len())
    }

    #[test]
    fn every_target_and_phase_gets_the_contract_salt() {
        let rid = Some("0123456789ab");
        for t in Target::ALL {
            for p in Phase::ALL {
                let got = salt_for(t, p, rid, "bench0000001");
                let want = match t {
                    Target::None => None,
                    Target::WarmupIsolationSystem | Target::WarmupIsolationFirstTurn => {
                        (p == Phase::Warmup).then(|| "kvbust-warmup-bench0000001".to_string())
                    }
                    _ => Some("kvbust-0123456789ab".to_string()),
                };
                assert_eq!(got, want, "{t} {p}");
                if let Some(s) = got {
                    assert!(joined(&s, None).is_ok());
                }
            }
        }
    }

    #[test]
    fn an_absent_or_null_salt_is_added_and_nothing_else_moves() {
        for body in [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            "{\"messages\":[] ,\"n\":1.50 \n}",
            r#"{"cache_salt":null,"x":1}"#,
        ] {
            let (value, close, members) = top(body);
            let e = edit(
                body.as_bytes(),
                value,
                close,
                members,
                "kvbust-0123456789ab",
            )
            .unwrap();
            let out = splice(body, &e);
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["cache_salt"], "kvbust-0123456789ab", "{out}");
            // Only the member was added (or the null replaced).
            let without = out.replace(",\"cache_salt\":\"kvbust-0123456789ab\"", "");
            let without = without.replace("\"kvbust-0123456789ab\"", "null");
            assert_eq!(without, body);
        }
        let e = edit(b"{}", None, 1, 0, "kvbust-x").unwrap();
        assert_eq!(splice("{}", &e), r#"{"cache_salt":"kvbust-x"}"#);
    }

    #[test]
    fn a_client_salt_is_kept_as_the_tail() {
        let body = r#"{"cache_salt":"tenant-a","messages":[]}"#;
        let (value, close, members) = top(body);
        let e = edit(
            body.as_bytes(),
            value,
            close,
            members,
            "kvbust-0123456789ab",
        )
        .unwrap();
        assert_eq!(e.2, "kvbust-0123456789ab-tenant-a");
        assert_eq!(
            splice(body, &e),
            r#"{"cache_salt":"kvbust-0123456789ab-tenant-a","messages":[]}"#
        );
        // An escaped client salt is read as text.
        let body = r#"{"cache_salt":"t\u00e9","messages":[]}"#;
        let (value, close, members) = top(body);
        let e = edit(body.as_bytes(), value, close, members, "kvbust-w").unwrap();
        assert_eq!(e.2, "kvbust-w-té");
    }

    #[test]
    fn vllm_limits_are_named_in_the_refusal() {
        let head = "kvbust-0123456789ab";
        // 128 characters in all pass; 129 do not (characters, not bytes).
        let room = MAX_CHARS - head.len() - 1;
        assert!(joined(head, Some(&"é".repeat(room))).is_ok());
        let e = joined(head, Some(&"é".repeat(room + 1))).unwrap_err();
        assert_eq!(e.code(), "cache_salt_too_long");
        let msg = e.to_string();
        assert!(msg.contains("at most 128") && msg.contains("129"), "{msg}");
        assert!(msg.contains(&format!("at most {room} characters")), "{msg}");
        for (bad, what) in [
            ("a@b", "'@'"),
            ("a/b", "'/'"),
            ("a\\b", "'\\'"),
            ("a\0b", "NUL"),
        ] {
            let e = joined(head, Some(bad)).unwrap_err();
            assert_eq!(e.code(), "cache_salt_forbidden_character");
            assert!(e.to_string().contains(what), "{e}");
        }
        for (raw, found) in [("[\"a\"]", "array"), ("1", "number"), ("true", "boolean")] {
            let body = format!(r#"{{"cache_salt":{raw}}}"#);
            let (value, close, members) = top(&body);
            let e = edit(body.as_bytes(), value, close, members, head).unwrap_err();
            assert!(e.to_string().contains(found), "{e}");
        }
    }

    #[test]
    fn methods_parse_case_insensitively() {
        assert_eq!(" Salt ".parse::<Method>(), Ok(Method::Salt));
        assert_eq!("MARKER".parse::<Method>(), Ok(Method::Marker));
        let e = "pepper".parse::<Method>().unwrap_err().to_string();
        assert!(e.contains("`pepper`") && e.contains("marker, salt"), "{e}");
        assert_eq!(serde_json::to_string(&Method::Salt).unwrap(), "\"salt\"");
    }
}
