//! AIPerf's RID digest, the exact marker strings, base trace ids and marker recognition. Never looks at a request body or keeps state.

use std::borrow::Cow;

use sha2::{Digest as _, Sha256};

use super::target::{Phase, Target};

/// The warm-up isolation marker (`WARMUP_ISOLATION_MARKER` in AIPerf).
pub const WARMUP_ISOLATION_MARKER: &str = "[warmup]\n\n";

/// Length of a digest: 12 lowercase hex characters (48 bits).
pub const DIGEST_LEN: usize = 12;

/// The four inputs of AIPerf's RID digest (`aiperf-semantics.md` §1.3).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DigestInputs {
    pub benchmark_id: String,
    pub recycle_pass: i64,
    pub trajectory_index: i64,
    pub trace_id: String,
}

impl DigestInputs {
    /// The exact string AIPerf hashes: `"{benchmark_id}:{recycle_pass}:{trajectory_index}:{trace_id}"`,
    /// no escaping (colons inside the ids pass through).
    pub fn unique_str(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.benchmark_id, self.recycle_pass, self.trajectory_index, self.trace_id
        )
    }
}

/// First 12 lowercase hex characters of `sha256(utf8(unique_str))`.
pub fn digest(inputs: &DigestInputs) -> String {
    // The bytes of `unique_str`, fed to the hasher piece by piece: one per request, so the
    // string is not built (its `format!` was a third of this function's cost).
    let mut pass = itoa::Buffer::new();
    let mut index = itoa::Buffer::new();
    let hash = Sha256::new()
        .chain_update(inputs.benchmark_id.as_bytes())
        .chain_update(b":")
        .chain_update(pass.format(inputs.recycle_pass).as_bytes())
        .chain_update(b":")
        .chain_update(index.format(inputs.trajectory_index).as_bytes())
        .chain_update(b":")
        .chain_update(inputs.trace_id.as_bytes())
        .finalize();
    let mut out = hex::encode(&hash[..DIGEST_LEN / 2]);
    out.truncate(DIGEST_LEN);
    out
}

/// The RID marker for a digest: `"[rid:D]\n\n"` when `prefix`, `"\n\n[rid:D]"` otherwise.
pub fn rid_marker(digest: &str, prefix: bool) -> String {
    // Pushed, not `format!`ted: one per marked request, and the pieces are fixed.
    let mut m = String::with_capacity("\n\n[rid:]".len() + digest.len());
    if !prefix {
        m.push_str("\n\n");
    }
    m.push_str("[rid:");
    m.push_str(digest);
    m.push(']');
    if prefix {
        m.push_str("\n\n");
    }
    m
}

/// AIPerf's `build_cache_bust_marker` plus the credit issuer's phase gating (§1.2, §1.5):
/// `None` for target `none`; for warm-up isolation targets `"[warmup]\n\n"` in the warm-up phase
/// and `None` in profiling (no digest is computed); otherwise the RID marker. The phase never
/// changes an RID marker.
pub fn build_marker(target: Target, phase: Phase, inputs: &DigestInputs) -> Option<String> {
    let rid = (!target.is_none() && !target.is_warmup_isolation()).then(|| digest(inputs));
    marker_for_digest(target, phase, rid.as_deref())
}

/// [`build_marker`] for a caller that already holds the RID digest (it reports it too);
/// `digest` is only read for the RID targets, where `None` gives no marker.
pub fn marker_for_digest(target: Target, phase: Phase, digest: Option<&str>) -> Option<String> {
    match target {
        Target::None => None,
        Target::WarmupIsolationSystem | Target::WarmupIsolationFirstTurn => match phase {
            Phase::Warmup => Some(WARMUP_ISOLATION_MARKER.to_owned()),
            Phase::Profiling => None,
        },
        Target::SystemPrefix
        | Target::SystemSuffix
        | Target::FirstTurnPrefix
        | Target::FirstTurnSuffix => digest.map(|d| rid_marker(d, target.is_prefix())),
    }
}

/// AIPerf's base trace id: everything before the first `"::"` (only the double colon separates).
pub fn base_trace_id(conversation_id: &str) -> &str {
    match conversation_id.split_once("::") {
        Some((base, _)) => base,
        None => conversation_id,
    }
}

/// A fresh benchmark id: 12 random lowercase hex characters (like AIPerf's `uuid4().hex[:12]`).
pub fn random_benchmark_id() -> String {
    let bytes: [u8; DIGEST_LEN / 2] = rand::random();
    hex::encode(bytes)
}

fn is_digest(s: &str) -> bool {
    s.len() == DIGEST_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// True when `s` is a stripped marker as it appears in its own part: `[rid:<12 hex>]` or `[warmup]`.
pub fn is_stripped_marker(s: &str) -> bool {
    s == "[warmup]"
        || s.strip_prefix("[rid:")
            .and_then(|r| r.strip_suffix(']'))
            .is_some_and(is_digest)
}

/// True when `s` is any marker kvbust or AIPerf could have produced, full or stripped.
pub fn is_any_marker(s: &str) -> bool {
    let core = s
        .strip_suffix("\n\n")
        .or_else(|| s.strip_prefix("\n\n"))
        .unwrap_or(s);
    is_stripped_marker(core)
}

/// Removes one leading prefix marker (`[rid:<12 hex>]\n\n` or `[warmup]\n\n`) and one trailing
/// suffix marker (`\n\n[rid:<12 hex>]`) if present, whatever their digest. Used to compute a
/// marker-independent identity of a user turn.
pub fn strip_any_marker(s: &str) -> &str {
    let mut out = s;
    if let Some(rest) = out.strip_prefix(WARMUP_ISOLATION_MARKER) {
        out = rest;
    } else if let Some(rest) = out.strip_prefix("[rid:") {
        if let Some(rest) = rest.get(DIGEST_LEN..) {
            if is_digest(&out[5..5 + DIGEST_LEN]) {
                if let Some(rest) = rest.strip_prefix("]\n\n") {
                    out = rest;
                }
            }
        }
    }
    let tail = "\n\n[rid:".len() + DIGEST_LEN + 1;
    if out.len() >= tail && out.is_char_boundary(out.len() - tail) {
        let (head, t) = out.split_at(out.len() - tail);
        if t.starts_with("\n\n[rid:") && t.ends_with(']') && is_digest(&t[7..7 + DIGEST_LEN]) {
            out = head;
        }
    }
    out
}

/// [`strip_any_marker`] until nothing more comes off, so a text that already carried a marker
/// when the client sent it (`[warmup]\n\nHi`) and the same text with kvbust's marker added on
/// top reduce to the same thing (`Hi`): the session hash must not change when kvbust marks.
pub fn strip_all_markers(s: &str) -> &str {
    let mut out = s;
    loop {
        let next = strip_any_marker(out);
        if next.len() == out.len() {
            return out;
        }
        out = next;
    }
}

/// A turn's text with every marker taken out, for the session hash: each `[rid:<12 hex>]` and
/// `[warmup]` removed wherever it is (one left-to-right pass), then the newlines at both ends
/// trimmed. Unlike stripping markers from the ends one at a time, this cannot be misled by a
/// `\n\n` that could close a leading marker or open a trailing one (`[warmup]\n\n[rid:…]`): for
/// any text `s` and any marker `m`, `m + s` and `s + m` give what `s` gives, stacked or not, since
/// a marker's `\n\n` goes with the trim and no marker match can cross into the `\n\n`.
pub fn unmarked(s: &str) -> Cow<'_, str> {
    const RID: &str = "[rid:";
    let trim = |t: &str| t.trim_matches('\n').to_owned();
    if !s.contains(RID) && !s.contains("[warmup]") {
        return Cow::Borrowed(s.trim_matches('\n'));
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..i]);
        let at = &rest[i..];
        let len = if at.starts_with(WARMUP_ISOLATION_MARKER.trim_end()) {
            "[warmup]".len()
        } else if at.starts_with(RID)
            && at
                .get(RID.len()..RID.len() + DIGEST_LEN)
                .is_some_and(is_digest)
            && at.as_bytes().get(RID.len() + DIGEST_LEN) == Some(&b']')
        {
            RID.len() + DIGEST_LEN + 1
        } else {
            out.push('[');
            1
        };
        rest = &at[len..];
    }
    out.push_str(rest);
    Cow::Owned(trim(&out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn vectors() -> Value {
        serde_json::from_str(include_str!(
            "../../tests/fixtures/cachebust/cachebust.json"
        ))
        .expect("fixture parses")
    }

    fn inputs_of(v: &Value) -> DigestInputs {
        DigestInputs {
            benchmark_id: v["benchmark_id"].as_str().unwrap().to_owned(),
            recycle_pass: v["recycle_pass"].as_i64().unwrap(),
            trajectory_index: v["trajectory_index"].as_i64().unwrap(),
            trace_id: v["trace_id"].as_str().unwrap().to_owned(),
        }
    }

    #[test]
    fn every_marker_vector() {
        let v = vectors();
        let cases = v["marker_vectors"].as_array().unwrap();
        assert_eq!(cases.len(), 22);
        let mut checked = 0;
        for case in cases {
            let inputs = inputs_of(case);
            let unique = inputs.unique_str();
            assert_eq!(unique, case["digest_input"].as_str().unwrap());
            assert_eq!(
                hex::encode(unique.as_bytes()),
                case["digest_input_utf8_hex"].as_str().unwrap()
            );
            let full = case["sha256_hex_full"].as_str().unwrap();
            assert_eq!(digest(&inputs), full[..12], "{unique}");
            let markers = case["markers"].as_object().unwrap();
            assert_eq!(markers.len(), 7);
            for t in Target::ALL {
                let want = markers[t.as_str()].as_str();
                // RID markers are phase-agnostic; warm-up isolation markers are the warm-up
                // phase's (profiling gives none, checked below).
                assert_eq!(
                    build_marker(t, Phase::Warmup, &inputs).as_deref(),
                    want,
                    "{unique} {t}"
                );
                if !t.is_warmup_isolation() {
                    assert_eq!(build_marker(t, Phase::Profiling, &inputs).as_deref(), want);
                } else {
                    assert_eq!(build_marker(t, Phase::Profiling, &inputs), None);
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 22 * 7);
        assert_eq!(
            v["warmup_isolation_marker"].as_str(),
            Some(WARMUP_ISOLATION_MARKER)
        );
    }

    #[test]
    fn every_base_trace_id_vector() {
        let v = vectors();
        let cases = v["base_trace_id_vectors"].as_array().unwrap();
        assert_eq!(cases.len(), 9);
        for case in cases {
            assert_eq!(
                base_trace_id(case["conversation_id"].as_str().unwrap()),
                case["base_trace_id"].as_str().unwrap(),
                "{case}"
            );
        }
    }

    #[test]
    fn spec_example_and_negative_numbers() {
        let i = DigestInputs {
            benchmark_id: "0123456789ab".into(),
            recycle_pass: 0,
            trajectory_index: 0,
            trace_id: "session_000000".into(),
        };
        assert_eq!(digest(&i), "bec92e2bea5e");
        let neg = DigestInputs {
            recycle_pass: -3,
            ..i
        };
        assert_eq!(neg.unique_str(), "0123456789ab:-3:0:session_000000");
    }

    /// The digest hashes exactly `unique_str`'s bytes, whatever the ids hold.
    #[test]
    fn the_digest_is_the_hash_of_the_unique_string() {
        for (bench, pass, index, trace) in [
            ("0123456789ab", 0, 0, "session_000000"),
            ("", i64::MIN, i64::MAX, ""),
            ("a:b", -1, 10, "c::d"),
            ("bench", 7, -42, "tr\u{e9}ce \u{1f600}\\n"),
        ] {
            let inputs = DigestInputs {
                benchmark_id: bench.into(),
                recycle_pass: pass,
                trajectory_index: index,
                trace_id: trace.into(),
            };
            let whole = hex::encode(Sha256::digest(inputs.unique_str().as_bytes()));
            assert_eq!(digest(&inputs), whole[..DIGEST_LEN], "{inputs:?}");
        }
    }

    #[test]
    fn random_ids_are_12_lowercase_hex() {
        let a = random_benchmark_id();
        let b = random_benchmark_id();
        assert!(is_digest(&a) && is_digest(&b), "{a} {b}");
        assert_ne!(a, b);
    }

    #[test]
    fn marker_recognition_and_stripping() {
        assert!(is_stripped_marker("[rid:bec92e2bea5e]"));
        assert!(is_stripped_marker("[warmup]"));
        assert!(!is_stripped_marker("[rid:BEC92E2BEA5E]"));
        assert!(!is_stripped_marker("[rid:bec92e2bea5]"));
        assert!(is_any_marker("[rid:bec92e2bea5e]\n\n"));
        assert!(is_any_marker("\n\n[rid:bec92e2bea5e]"));
        assert!(is_any_marker("[warmup]\n\n"));
        assert!(!is_any_marker("hello"));
        assert_eq!(strip_any_marker("[rid:bec92e2bea5e]\n\nHi"), "Hi");
        assert_eq!(strip_any_marker("Hi\n\n[rid:bec92e2bea5e]"), "Hi");
        assert_eq!(strip_any_marker("[warmup]\n\nHi"), "Hi");
        assert_eq!(
            strip_all_markers("[rid:bec92e2bea5e]\n\n[warmup]\n\nHi\n\n[rid:bec92e2bea5e]"),
            "Hi"
        );
        assert_eq!(strip_all_markers("Hi"), "Hi");
        assert_eq!(strip_any_marker("[rid:bec92e2bea5e]\n\n"), "");
        assert_eq!(strip_any_marker("\n\n[rid:bec92e2bea5e]"), "");
        assert_eq!(strip_any_marker("[rid:zzz]\n\nHi"), "[rid:zzz]\n\nHi");
        assert_eq!(strip_any_marker("é\n\n[rid:bec92e2bea5e]"), "é");
        assert_eq!(
            strip_any_marker("ééééééééééééééééééééé"),
            "ééééééééééééééééééééé"
        );
        assert_eq!(strip_any_marker("[rid:ééééééé]\n\n"), "[rid:ééééééé]\n\n");
    }

    #[test]
    fn unmarked_text_ignores_markers_anywhere_and_end_newlines() {
        assert_eq!(unmarked("Hi"), "Hi");
        assert_eq!(unmarked("\n\nHi\n"), "Hi");
        assert_eq!(
            unmarked("[rid:bec92e2bea5e]\n\n[warmup]\n\nHi\n\n[rid:bec92e2bea5e]"),
            "Hi"
        );
        assert_eq!(unmarked("[warmup]\n\n[rid:0123456789ab]"), "");
        assert_eq!(unmarked("a [warmup] b"), "a  b");
        assert_eq!(
            unmarked("[rid:zzz] [ [rid:0123456789AB]"),
            "[rid:zzz] [ [rid:0123456789AB]"
        );
        assert_eq!(unmarked("é[rid:0123456789ab]é["), "éé[");
        for s in [
            "",
            "x",
            "[warmup]\n\n[rid:0123456789ab]\n",
            "\n[rid:0123456789ab",
            "]\n\n",
        ] {
            for m in ["[rid:bec92e2bea5e]\n\n", "[warmup]\n\n"] {
                assert_eq!(unmarked(&format!("{m}{s}")), unmarked(s), "{m:?}{s:?}");
            }
            let m = "\n\n[rid:bec92e2bea5e]";
            assert_eq!(unmarked(&format!("{s}{m}")), unmarked(s), "{s:?}{m:?}");
        }
    }
}
