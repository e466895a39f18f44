//! Regressions found by the fuzz harnesses (`fuzz/`, see fuzz/README.md): each test is one
//! minimised finding, through the public API, failing before its fix.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use kvbust::config::Config;
use kvbust::metrics::Metrics;
use kvbust::proxy::rewrite::{decide, has_control_headers};
use kvbust::proxy::synthesize::find_placeholders;
use kvbust::runtime::SharedState;

/// Client text an error may quote (`MAX_EXCERPT`), plus the `…` that marks a cut.
const QUOTE_LIMIT: usize = 200 + '…'.len_utf8();

/// The longest run of `c` in `s`: how much of a client's `cccc…` an error repeated.
fn longest_run(s: &str, c: char) -> usize {
    s.split(|x| x != c).map(str::len).max().unwrap_or(0)
}

/// `placeholders`: a placeholder in a member *name* inside `messages` was expanded, turning a key
/// into a prompt. Only message content is prompt text (a string `content`, a text part's `text`).
#[test]
fn placeholder_in_an_object_key_is_not_expanded() {
    let body =
        br#"{"messages":[{"{{kvbust:prompt:7}}" :"user","content":"a {{kvbust:prompt:3}}"}]}"#;
    let found = find_placeholders(body).expect("valid body");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(&body[found[0].range.clone()], b"{{kvbust:prompt:3}}");
    // An escaped quote inside the key does not end it early.
    let body = br#"{"messages":[{"a\"{{kvbust:prompt:7}}\\":1,"content":"{{kvbust:prompt:2}}"}]}"#;
    let found = find_placeholders(body).expect("valid body");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].tokens, 2);
}

/// `placeholders`: a body that is one long JSON string holding `{{kvbust:` was answered with a
/// 400 repeating the whole string (serde_json's "invalid type: string …").
#[test]
fn a_string_body_is_not_echoed_whole() {
    let mut body = b"\"{{kvbust:".to_vec();
    body.extend(std::iter::repeat_n(b'y', 100_000));
    body.push(b'"');
    let e = find_placeholders(&body).expect_err("not an object");
    let msg = e.to_string();
    assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
    assert!(
        longest_run(&msg, 'y') < QUOTE_LIMIT,
        "{} bytes: {msg:.300}",
        msg.len()
    );
}

fn inputs() -> kvbust::cachebust::DigestInputs {
    kvbust::cachebust::DigestInputs {
        benchmark_id: "0123456789ab".into(),
        recycle_pass: 0,
        trajectory_index: 0,
        trace_id: "session_000000".into(),
    }
}

fn runtime() -> Arc<SharedState> {
    SharedState::new(Arc::new(Config::default()), Metrics::new())
}

/// `headers`: control headers with a bad value were quoted up to `limits.max_control_header`
/// (1 KiB) in the 400; the rule is at most 200 bytes of client text.
#[test]
fn bad_control_header_values_are_quoted_at_most_200_bytes() {
    let rt = runtime();
    let long = "z".repeat(1000);
    for name in [
        "x-kvbust-phase",
        "x-kvbust-target",
        "x-kvbust-user-context-messages",
        "x-kvbust-recycle-pass",
        "x-kvbust-trajectory-index",
    ] {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(&long).unwrap());
        h.insert("x-kvbust-trace-id", HeaderValue::from_static("t"));
        let control = has_control_headers(&h, &rt.config.headers);
        let e = decide(&h, control, &rt, &rt.cache_model.runs().current()).expect_err(name);
        let msg = e.to_string();
        assert_eq!(e.status(), http::StatusCode::BAD_REQUEST, "{name}: {msg}");
        assert!(msg.contains(name), "{msg}");
        assert!(longest_run(&msg, 'z') <= 200, "{name}: {msg:.300}");
    }
}

/// `rewrite_json` (finding 5): the first-user-turn session hash stripped one marker per end, so
/// a turn that already carried one (`[warmup]\n\n…`) hashed differently once kvbust stacked its
/// RID marker on it, against `first_user_turn_hash`'s doc ("a marked and an unmarked copy of
/// the same turn hash the same"). It now strips to a fixpoint.
#[test]
fn stacked_markers_keep_the_session_hash() {
    use kvbust::api::Shape;
    use kvbust::cachebust::{build_marker, parse, Phase, Plan, Target};
    let body = br#"{"messages":[{"role":"user","content":"[warmup]\n\nSummarise:"}]}"#;
    let target = Target::FirstTurnPrefix;
    let marker = build_marker(target, Phase::Profiling, &inputs()).unwrap();
    let parsed = parse(Shape::Chat, body).unwrap();
    let out = parsed.apply(&Plan::new(target, &marker)).unwrap();
    let marked = out.body.expect("marked");
    assert_eq!(
        parse(Shape::Chat, &marked).unwrap().first_user_turn_hash(0),
        parsed.first_user_turn_hash(0)
    );
}

/// `rewrite` (finding 7): with `list_parts = inline_text`, an empty first text part became a
/// part that is only the marker, which the first-user-turn hash dropped as a marker part while
/// the unmarked copy kept the empty part, so marking moved the session. The fuzzer's own inputs
/// (`fuzz/corpus/rewrite/regression-*`: 6 plan bytes as `check_rewrite` reads them, then the body).
#[test]
fn inline_text_on_an_empty_first_text_part_keeps_the_session_hash() {
    use kvbust::api::Shape;
    use kvbust::cachebust::{build_marker, parse, ListParts, Plan, Target};
    for input in [
        &include_bytes!("../../fuzz/corpus/rewrite/regression-inline-empty-text-000007")[..],
        include_bytes!("../../fuzz/corpus/rewrite/regression-inline-empty-text-000010"),
    ] {
        let (plan, body) = input.split_at(6);
        // Shape, target, phase, digest, user-context count, list parts, as the harness reads them.
        assert_eq!(Shape::ALL[plan[0] as usize % 4], Shape::Chat);
        let target = Target::ALL[plan[1] as usize % Target::ALL.len()];
        assert_eq!(target, Target::WarmupIsolationSystem);
        assert_eq!((plan[2] & 1, plan[4] % 3, plan[5] & 1), (1, 0, 1));
        let marker = build_marker(target, kvbust::cachebust::Phase::Warmup, &inputs()).unwrap();
        let parsed = parse(Shape::Chat, body).unwrap();
        let plan = Plan {
            list_parts: ListParts::InlineText,
            ..Plan::new(target, &marker)
        };
        let marked = parsed.apply(&plan).unwrap().body.expect("marked");
        let text = String::from_utf8_lossy(&marked);
        assert!(
            text.contains(r#"[{"type":"text","text":"[warmup]\n\n"},{"#),
            "{text}"
        );
        assert_eq!(
            parse(Shape::Chat, &marked).unwrap().first_user_turn_hash(0),
            parsed.first_user_turn_hash(0),
            "{text}"
        );
    }
}

/// `config`: a TOML parse error quoted the offending line, password and all, at start-up
/// (stderr, logs). Errors now redact URL credentials as `/config` does.
#[test]
fn config_parse_errors_do_not_show_url_passwords() {
    let dir = crate::common::test_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "[upstream]\nurl = \"http://user:s9bsetodtmz0td@127.0.0.1:3100/v1\"[cache_bust]\n",
    )
    .unwrap();
    let e = Config::load(Some(&path), &[], &kvbust::config::CliOverrides::default())
        .expect_err("not TOML");
    let msg = e.to_string();
    std::fs::remove_dir_all(&dir).ok();
    assert!(msg.contains("line 2"), "{msg}");
    assert!(!msg.contains("s9bsetodtmz0td"), "{msg}");
    assert!(
        msg.contains("http://user:<redacted>@127.0.0.1:3100/v1"),
        "{msg}"
    );
}

/// `rewrite`: a message whose member name holds a lone surrogate escape passed the first
/// (syntax) parse, then failed when names were decoded, as an internal error (a 500 that asks
/// to report a bug). It is the client's invalid JSON text: a client error.
#[test]
fn lone_surrogate_in_a_message_key_is_a_client_error() {
    use kvbust::api::Shape;
    use kvbust::cachebust::{parse, Plan, Target};
    for (shape, body) in [
        (
            Shape::Responses,
            &br#"{"input":[{"typ\uDDDDe":"x","role":"user","content":"Hi"}]}"#[..],
        ),
        (
            Shape::Chat,
            &br#"{"messages":[{"\uD800":1,"role":"user","content":"Hi"}]}"#[..],
        ),
    ] {
        let r = parse(shape, body).and_then(|p| {
            p.apply(&Plan::new(
                Target::FirstTurnPrefix,
                "[rid:0123456789ab]\n\n",
            ))
        });
        let e = r.expect_err("invalid text");
        assert!(e.is_client_error(), "{e}");
    }
}

/// `rewrite_json` (issue 23 item 11): with `list_parts = inline_text`, a `/v1/messages` turn
/// `[{"type":"input_text",…},{"type":"text","text":"\n\n"}]` got its marker in the `text` part
/// (the Anthropic text type) while the session hash stripped markers from the first part of
/// either type (`input_text`), so the marked copy hashed as another session. The fuzzer's input
/// (`fuzz/corpus/rewrite/regression-inline-other-part-type-*`: 6 plan bytes, then the body).
#[test]
fn inline_text_into_a_later_part_keeps_the_session_hash() {
    use kvbust::api::Shape;
    use kvbust::cachebust::{build_marker, parse, ListParts, Phase, Plan, Target};
    let input =
        include_bytes!("../../fuzz/corpus/rewrite/regression-inline-other-part-type-000001");
    let (plan, body) = input.split_at(6);
    assert_eq!(Shape::ALL[plan[0] as usize % 4], Shape::Messages);
    let target = Target::ALL[plan[1] as usize % Target::ALL.len()];
    assert_eq!(target, Target::FirstTurnPrefix);
    assert_eq!((plan[4] % 3, plan[5] & 1), (0, 1));
    let marker = build_marker(target, Phase::Profiling, &inputs()).unwrap();
    for list_parts in [ListParts::InlineText, ListParts::OwnPart] {
        let parsed = parse(Shape::Messages, body).unwrap();
        let plan = Plan {
            list_parts,
            ..Plan::new(target, &marker)
        };
        let marked = parsed.apply(&plan).unwrap().body.expect("marked");
        let text = String::from_utf8_lossy(&marked);
        let again = parse(Shape::Messages, &marked).unwrap();
        assert_eq!(
            again.first_user_turn_hash(0),
            parsed.first_user_turn_hash(0),
            "{list_parts:?}: {text}"
        );
        assert_eq!(again.apply(&plan).unwrap().body, None, "{text}");
    }
}

/// `rewrite_json` (issue 23 run, the session-hash check lifted to bodies with marker text): the
/// hash stripped one leading and one trailing marker per pass, and a `\n\n` can close a leading
/// marker or open a trailing one. `[warmup]\n\n[rid:…]` unmarked lost its `[warmup]`; with
/// kvbust's RID marker in front the same pass took the trailing `\n\n[rid:…]` instead, so the two
/// copies hashed apart. The input (`fuzz/corpus/rewrite/regression-marker-overlap-*`, as
/// `check_rewrite` reads it) and its mirror image for suffix markers, once and stacked.
#[test]
fn overlapping_marker_text_keeps_the_session_hash() {
    use kvbust::api::Shape;
    use kvbust::cachebust::{parse, ListParts, Plan, Target};
    let input = include_bytes!("../../fuzz/corpus/rewrite/regression-marker-overlap-000001");
    let (plan, body) = input.split_at(6);
    assert_eq!(Shape::ALL[plan[0] as usize % 4], Shape::Chat);
    assert_eq!(Target::ALL[plan[1] as usize % 7], Target::FirstTurnPrefix);
    let mirror = br#"{"messages":[{"role":"user","content":"[rid:0123456789ab]\n\n[warmup]"}]}"#;
    let parts = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"[warmup]\n\n[rid:0123456789ab]\n"}]}]}"#;
    for body in [body, &mirror[..], &parts[..]] {
        let want = parse(Shape::Chat, body).unwrap().first_user_turn_hash(0);
        for (target, marker) in [
            (Target::FirstTurnPrefix, "[rid:00000000ffff]\n\n"),
            (Target::FirstTurnSuffix, "\n\n[rid:00000000ffff]"),
            (Target::WarmupIsolationFirstTurn, "[warmup]\n\n"),
        ] {
            for list_parts in [ListParts::OwnPart, ListParts::InlineText] {
                let plan = Plan {
                    list_parts,
                    ..Plan::new(target, marker)
                };
                let mut marked = body.to_vec();
                for _ in 0..2 {
                    if let Some(b) = parse(Shape::Chat, &marked)
                        .unwrap()
                        .apply(&plan)
                        .unwrap()
                        .body
                    {
                        marked = b;
                    }
                    let got = parse(Shape::Chat, &marked).unwrap().first_user_turn_hash(0);
                    assert_eq!(
                        got,
                        want,
                        "{target} {list_parts:?}: {}",
                        String::from_utf8_lossy(&marked)
                    );
                }
            }
        }
    }
}
