//! Cache-bust engine through its public API: a session's flow (ledger → marker → rewrite) against
//! the multi-turn AIPerf vectors, and a property test of the rewrite on arbitrary JSON-ish bodies.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::num::NonZeroUsize;
use std::time::Instant;

use kvbust::api::Shape;
use kvbust::cachebust::{build_marker, parse, Ledger, ListParts, Location, Phase, Plan, Target};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/cachebust/cachebust.json"
    );
    serde_json::from_slice(&std::fs::read(path).expect("fixture readable")).expect("fixture JSON")
}

/// AIPerf's multi-turn sessions as a proxy sees them: three requests with one correlation id,
/// each carrying the client's *unmarked* history. The ledger mints the session once (the trace id
/// is the vector's conversation id, as when the client sends `x-kvbust-trace-id` or kvbust
/// synthesised the conversation), every request gets the same marker, and the bodies equal the
/// vectors' `after`, in which AIPerf's mark persisted on the first user turn.
#[test]
fn multi_turn_session_flow() {
    let v = fixture();
    let mut ledger = Ledger::new(NonZeroUsize::new(8).unwrap());
    let mut sessions = 0;
    for case in v["payload_vectors"].as_array().unwrap() {
        let scenario = case["scenario"].as_str().unwrap();
        if !scenario.starts_with("synthetic_multi_turn_3") {
            continue;
        }
        let target: Target = case["target"].as_str().unwrap().parse().unwrap();
        let phase: Phase = case["phase"].as_str().unwrap().parse().unwrap();
        let ctx = usize::from(scenario.contains("user_context"));
        // A fresh ledger per vector: each vector is AIPerf's first session (counter 0).
        ledger = Ledger::new(ledger.capacity());
        let correlation_id = format!("corr-{scenario}-{target}-{phase}");
        for req in case["requests"].as_array().unwrap() {
            let r = ledger.resolve(&correlation_id);
            assert_eq!(r.counter, 0);
            assert_eq!(r.new_session, req["turn_index"] == 0);
            let inputs = r.digest_inputs("0123456789ab", "session_000000");
            let marker = build_marker(target, phase, &inputs);
            assert_eq!(marker.as_deref(), case["marker"].as_str());
            let before = serde_json::to_vec(&req["before"]).unwrap();
            let got: Value = match marker.as_deref() {
                None => serde_json::from_slice(&before).unwrap(),
                Some(m) => {
                    let plan = Plan {
                        user_context_messages: ctx,
                        ..Plan::new(target, m)
                    };
                    let out = parse(Shape::Chat, &before).unwrap().apply(&plan).unwrap();
                    let want = if target.is_system() && ctx == 1 {
                        Location::System
                    } else if target.is_system() {
                        Location::Fallthrough
                    } else {
                        Location::FirstUser
                    };
                    assert_eq!(out.location, Some(want));
                    serde_json::from_slice(&out.body.expect("marked")).unwrap()
                }
            };
            assert_eq!(got, req["after"], "{scenario} {target} {phase}");
        }
        sessions += 1;
    }
    assert_eq!(sessions, 18);
    assert_eq!(ledger.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Property test: arbitrary JSON-ish bodies, written with odd whitespace, escapes and numbers.

fn ws() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "", " ", "\n", "\t ", "\r\n  "])
}

fn raw_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z0-9 .,\"\\\\/\n\t\u{0}\u{1f}\u{7f}é😀]{0,12}",
        1 => Just("[rid:bec92e2bea5e]".to_owned()),
        1 => Just("[rid:bec92e2bea5e]\n\nHi".to_owned()),
        1 => Just("Hi\n\n[rid:0123456789ab]".to_owned()),
        1 => Just("[warmup]\n\n".to_owned()),
        1 => Just("[warmup]".to_owned()),
    ]
}

/// A JSON string literal for `s`, in one of several legal spellings.
fn encode(s: &str, style: u8) -> String {
    match style % 3 {
        0 => serde_json::to_string(s).unwrap(),
        1 => {
            // ASCII-only with \u escapes (Python json.dumps' default), `/` escaped too.
            let mut out = String::from("\"");
            for ch in s.chars() {
                match ch {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '/' => out.push_str("\\/"),
                    c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                        let mut buf = [0u16; 2];
                        for unit in c.encode_utf16(&mut buf) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        _ => serde_json::to_string(s).unwrap().replace("\\n", "\\u000A"),
    }
}

fn string_lit() -> impl Strategy<Value = String> {
    (raw_text(), any::<u8>()).prop_map(|(s, style)| encode(&s, style))
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "-0",
            "1.0e-7",
            "123456789012345678901234567890",
            "-12.5E+3",
            "1e400",
            "3.14159",
        ])
        .prop_map(str::to_owned),
        any::<i64>().prop_map(|n| n.to_string()),
    ]
}

fn array_text(items: Vec<(&'static str, String, &'static str)>) -> String {
    let inner: Vec<String> = items
        .into_iter()
        .map(|(a, v, b)| format!("{a}{v}{b}"))
        .collect();
    format!("[{}]", inner.join(","))
}

fn object_text(entries: Vec<(String, &'static str, String)>) -> String {
    let inner: Vec<String> = entries
        .into_iter()
        .map(|(k, w, v)| format!("{k}{w}:{w}{v}"))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn key(name: &'static str) -> impl Strategy<Value = String> {
    any::<u8>().prop_map(move |style| encode(name, style))
}

fn any_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        number(),
        string_lit(),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec((ws(), inner.clone(), ws()), 0..4).prop_map(array_text),
            prop::collection::vec((string_lit(), ws(), inner), 0..4).prop_map(object_text),
        ]
    })
}

fn part() -> impl Strategy<Value = String> {
    let text_part = (
        prop::sample::select(vec!["text", "input_text", "image_url"]),
        string_lit(),
    )
        .prop_map(|(t, s)| format!(r#"{{"type":"{t}","text":{s}}}"#));
    prop_oneof![
        4 => text_part,
        1 => Just(r#"{"type":"text","text":"[rid:bec92e2bea5e]"}"#.to_owned()),
        1 => Just(r#"{"text":"[warmup]","type":"text"}"#.to_owned()),
        1 => Just(r#"{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}"#.to_owned()),
        1 => any_value(),
    ]
}

fn content() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => string_lit().prop_map(Some),
        3 => prop::collection::vec((ws(), part(), ws()), 0..4).prop_map(|p| Some(array_text(p))),
        1 => any_value().prop_map(Some),
        1 => Just(None),
    ]
}

fn message() -> impl Strategy<Value = String> {
    let role = prop_oneof![
        6 => prop::sample::select(vec!["\"user\"", "\"user\"", "\"system\"", "\"developer\"", "\"assistant\"", "\"tool\"", "\"\\u0075ser\""])
            .prop_map(|r| Some(r.to_owned())),
        1 => any_value().prop_map(Some),
        1 => Just(None),
    ];
    (
        role,
        content(),
        prop::collection::vec((string_lit(), any_value()), 0..2),
        key("role"),
        key("content"),
        ws(),
    )
        .prop_flat_map(|(role, content, extra, rk, ck, w)| {
            let mut entries: Vec<(String, &'static str, String)> = Vec::new();
            if let Some(r) = role {
                entries.push((rk, w, r));
            }
            if let Some(c) = content {
                entries.push((ck, w, c));
            }
            entries.extend(extra.into_iter().map(|(k, v)| (k, w, v)));
            Just(entries).prop_shuffle().prop_map(object_text)
        })
}

fn messages() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::collection::vec((ws(), message(), ws()), 0..5).prop_map(array_text),
        1 => any_value(),
    ]
}

fn body() -> impl Strategy<Value = String> {
    let field = |name: &'static str, value: BoxedStrategy<String>| {
        prop::option::weighted(0.6, (key(name), ws(), value))
    };
    let prompt = prop_oneof![
        3 => string_lit(),
        3 => prop::collection::vec((ws(), string_lit(), ws()), 0..4).prop_map(array_text),
        1 => any_value(),
    ];
    let system = prop_oneof![
        2 => string_lit(),
        2 => prop::collection::vec((ws(), part(), ws()), 0..3).prop_map(array_text),
        1 => any_value(),
    ];
    let object = (
        prop::option::weighted(0.9, (key("messages"), ws(), messages())),
        field("input", prop_oneof![string_lit(), messages()].boxed()),
        field(
            "instructions",
            prop_oneof![string_lit(), any_value()].boxed(),
        ),
        field("system", system.boxed()),
        field("prompt", prompt.boxed()),
        field("user", string_lit().boxed()),
        prop::option::weighted(0.1, (key("previous_response_id"), ws(), string_lit())),
        prop::collection::vec((string_lit(), ws(), any_value()), 0..3),
        ws(),
    )
        .prop_flat_map(|(m, i, ins, s, p, u, prev, extra, w)| {
            let entries: Vec<(String, &'static str, String)> = [m, i, ins, s, p, u, prev]
                .into_iter()
                .flatten()
                .chain(extra)
                .collect();
            Just(entries)
                .prop_shuffle()
                .prop_map(move |e| format!("{w}{}{w}", object_text(e)))
        });
    prop_oneof![
        12 => object,
        1 => any_value(),
        // truncated / corrupted JSON
        1 => (any_value(), any::<prop::sample::Index>()).prop_map(|(v, i)| {
            let cut = i.index(v.len() + 1);
            let mut p = cut.min(v.len());
            while !v.is_char_boundary(p) {
                p -= 1;
            }
            v[..p].to_owned()
        }),
    ]
}

fn plan_parts() -> impl Strategy<Value = (Shape, Target, String, usize, ListParts)> {
    (
        prop::sample::select(Shape::ALL.to_vec()),
        prop::sample::select(Target::ALL[1..].to_vec()),
        prop::sample::select(vec!["session_000000", "corr-1", "é::x"]),
        0usize..3,
        prop::sample::select(vec![ListParts::OwnPart, ListParts::InlineText]),
    )
        .prop_map(|(shape, target, trace, ctx, lp)| {
            let inputs = kvbust::cachebust::DigestInputs {
                benchmark_id: "0123456789ab".into(),
                recycle_pass: 0,
                trajectory_index: 0,
                trace_id: trace.into(),
            };
            let marker = build_marker(target, Phase::Warmup, &inputs).expect("non-none target");
            (shape, target, marker, ctx, lp)
        })
}

/// True when `small` is a subsequence of `big`: every input byte survives, in order.
fn is_subsequence(small: &[u8], big: &[u8]) -> bool {
    let mut it = big.iter();
    small.iter().all(|b| it.any(|c| c == b))
}

#[test]
fn apply_never_panics_is_idempotent_and_only_inserts() {
    let cases: u32 = std::env::var("KVBUST_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        // The inputs are deep; full shrinking can take minutes. A partly shrunk case is enough.
        max_shrink_iters: 4096,
        ..Config::default()
    });
    let stats = std::cell::Cell::new([0u32; 4]); // [cases, errors, injected, unchanged]
    let bump = |i: usize| {
        let mut s = stats.get();
        s[i] += 1;
        stats.set(s);
    };
    let start = Instant::now();
    let result = runner.run(
        &(body(), plan_parts()),
        |(body, (shape, target, marker, ctx, list_parts))| {
            bump(0);
            let plan = Plan {
                user_context_messages: ctx,
                list_parts,
                ..Plan::new(target, &marker)
            };
            let first = parse(shape, body.as_bytes()).and_then(|p| p.apply(&plan));
            let out = match first {
                Err(e) => {
                    bump(1);
                    prop_assert!(!e.to_string().is_empty());
                    prop_assert!(e.is_client_error(), "engine error {e} on {body}");
                    return Ok(());
                }
                Ok(o) => o,
            };
            if let Some(loc) = out.location {
                let system_loc = matches!(loc, Location::System | Location::Fallthrough);
                prop_assert_eq!(system_loc, target.is_system());
            }
            let Some(new) = out.body else {
                bump(3);
                return Ok(());
            };
            bump(2);
            prop_assert!(out.location.is_some());
            // Valid JSON, and every input byte is still there in order (only insertions).
            prop_assert!(
                serde_json::from_slice::<&serde_json::value::RawValue>(&new).is_ok(),
                "invalid JSON out: {}",
                String::from_utf8_lossy(&new)
            );
            prop_assert!(is_subsequence(body.as_bytes(), &new));
            prop_assert!(String::from_utf8_lossy(&new).contains(marker.trim()));
            // Idempotent: applying again changes nothing and reports the same location.
            let again = parse(shape, &new).and_then(|p| p.apply(&plan));
            prop_assert!(again.is_ok(), "second apply failed: {:?}", again);
            let again = again.unwrap();
            prop_assert_eq!(again.body, None, "not idempotent on {}", body);
            prop_assert_eq!(again.location, out.location);
            Ok(())
        },
    );
    let elapsed = start.elapsed();
    let [n, errors, injected, unchanged] = stats.get();
    eprintln!(
        "cachebust proptest: {n} cases in {elapsed:.2?} ({errors} errors, {injected} injected, {unchanged} unchanged)"
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(n >= cases);
    // The generator must exercise the interesting path, not just errors.
    assert!(injected > n / 5, "only {injected} of {n} cases injected");
    assert!(errors > n / 50, "only {errors} of {n} cases were errors");
}
