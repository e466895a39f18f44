//! Unit tests for the body rewrite: every payload vector, transparency, semantics, bad input.
// Test tables and end-to-end cases run long; the 80-line rule is for the library.
#![allow(clippy::too_many_lines)]

use super::super::marker::{build_marker, DigestInputs};
use super::super::target::{Phase, Target};
use super::*;
use serde_json::value::RawValue;
use serde_json::Value;

fn vectors() -> Value {
    serde_json::from_str(include_str!(
        "../../../tests/fixtures/cachebust/cachebust.json"
    ))
    .expect("fixture parses")
}

fn vector_inputs() -> DigestInputs {
    DigestInputs {
        benchmark_id: "0123456789ab".into(),
        recycle_pass: 0,
        trajectory_index: 0,
        trace_id: "session_000000".into(),
    }
}

/// Plan settings per vector scenario. A client-supplied body does not say which leading user
/// messages are user context or how AIPerf built a list of parts, so the proxy is told (header
/// `x-kvbust-user-context-messages`, config `list_parts`). This table is that knowledge for the
/// AIPerf scenarios; the engine itself has no notion of scenarios.
/// * `*user_context*`: AIPerf sent the per-session user context as its own leading user
///   message → `user_context_messages = 1`.
/// * `synthetic_multimodal_text_plus_image`: a synthetic turn with text + image; AIPerf puts the
///   marker inside the text string → `ListParts::InlineText`.
/// * `raw_messages_system_plus_conversation_system_message`: the system message is AIPerf's merge
///   of the verbatim `--system-prompt` ("Verbatim --system-prompt text.", 30 bytes) and the dataset
///   system message; the marker belongs to the former → `system_prompt_bytes = Some(30)` (the
///   `Option<usize>` column; it only changes where a *suffix* goes).
/// * everything else (plain synthetic turns, `raw_messages_*`): defaults (0, `OwnPart`, `None`).
type Settings = (&'static str, &'static str, usize, ListParts, Option<usize>);
const SCENARIOS: &[Settings] = &[
    (
        "chat",
        "synthetic_string_no_system",
        0,
        ListParts::OwnPart,
        None,
    ),
    (
        "chat",
        "synthetic_with_shared_system",
        0,
        ListParts::OwnPart,
        None,
    ),
    (
        "chat",
        "synthetic_with_system_and_user_context",
        1,
        ListParts::OwnPart,
        None,
    ),
    (
        "chat",
        "synthetic_user_context_only",
        1,
        ListParts::OwnPart,
        None,
    ),
    (
        "chat",
        "synthetic_multimodal_text_plus_image",
        0,
        ListParts::InlineText,
        None,
    ),
    (
        "chat",
        "raw_messages_system_string",
        0,
        ListParts::OwnPart,
        None,
    ),
    (
        "chat",
        "raw_messages_system_list_parts",
        0,
        ListParts::OwnPart,
        None,
    ),
    (
        "chat",
        "raw_messages_no_system_user_list_parts",
        0,
        ListParts::OwnPart,
        None,
    ),
    (
        "chat",
        "raw_messages_assistant_first_then_user",
        0,
        ListParts::OwnPart,
        None,
    ),
    (
        "chat",
        "raw_messages_system_plus_conversation_system_message",
        0,
        ListParts::OwnPart,
        Some(30),
    ),
    (
        "chat",
        "synthetic_multi_turn_3_no_system",
        0,
        ListParts::OwnPart,
        None,
    ),
    (
        "chat",
        "synthetic_multi_turn_3_with_system_and_user_context",
        1,
        ListParts::OwnPart,
        None,
    ),
    (
        "responses",
        "synthetic_with_system_and_user_context",
        1,
        ListParts::OwnPart,
        None,
    ),
    (
        "responses",
        "synthetic_string_no_system",
        0,
        ListParts::OwnPart,
        None,
    ),
    (
        "messages",
        "synthetic_with_system_and_user_context",
        1,
        ListParts::OwnPart,
        None,
    ),
    (
        "messages",
        "synthetic_string_no_system",
        0,
        ListParts::OwnPart,
        None,
    ),
];

type RawKey<'a> = (&'a str, &'a str, Target, Phase);

/// `(before, after)` of every payload vector request as raw JSON text, keys in AIPerf's order.
fn raw_payload_requests(
) -> std::collections::HashMap<RawKey<'static>, Vec<(&'static RawValue, &'static RawValue)>> {
    #[derive(serde::Deserialize)]
    struct File<'a> {
        #[serde(borrow)]
        payload_vectors: Vec<Case<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Case<'a> {
        endpoint: &'a str,
        scenario: &'a str,
        target: Target,
        phase: Phase,
        #[serde(borrow)]
        requests: Vec<Req<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Req<'a> {
        #[serde(borrow)]
        before: &'a RawValue,
        #[serde(borrow)]
        after: &'a RawValue,
    }
    let file: File<'static> = serde_json::from_str(include_str!(
        "../../../tests/fixtures/cachebust/cachebust.json"
    ))
    .unwrap();
    let mut map = std::collections::HashMap::new();
    for c in file.payload_vectors {
        let reqs = c.requests.iter().map(|r| (r.before, r.after)).collect();
        assert!(map
            .insert((c.endpoint, c.scenario, c.target, c.phase), reqs)
            .is_none());
    }
    map
}

/// JSON text without whitespace outside strings.
fn minify(json: &str) -> String {
    let (mut out, mut in_str, mut esc) = (String::with_capacity(json.len()), false, false);
    for ch in json.chars() {
        if in_str {
            out.push(ch);
            if esc {
                esc = false;
            } else if ch == '\\' {
                esc = true;
            } else if ch == '"' {
                in_str = false;
            }
        } else if !ch.is_ascii_whitespace() {
            in_str = ch == '"';
            out.push(ch);
        }
    }
    out
}

fn shape_of(endpoint: &str) -> Shape {
    match endpoint {
        "chat" => Shape::Chat,
        "responses" => Shape::Responses,
        "messages" => Shape::Messages,
        other => panic!("vector endpoint {other} has no shape"),
    }
}

fn has_system(shape: Shape, before: &Value) -> bool {
    match shape {
        Shape::Chat => before["messages"][0]["role"] == "system",
        Shape::Responses => before.get("instructions").is_some(),
        Shape::Messages => before.get("system").is_some(),
        Shape::Completions => false,
    }
}

#[test]
fn every_payload_vector() {
    let v = vectors();
    let cases = v["payload_vectors"].as_array().unwrap();
    assert_eq!(cases.len(), 124);
    let inputs = vector_inputs();
    let raw_requests = raw_payload_requests();
    let (mut vectors_passed, mut requests_checked, mut marked, mut unmarked) = (0, 0, 0, 0);
    for case in cases {
        let endpoint = case["endpoint"].as_str().unwrap();
        let scenario = case["scenario"].as_str().unwrap();
        let target: Target = case["target"].as_str().unwrap().parse().unwrap();
        let phase: Phase = case["phase"].as_str().unwrap().parse().unwrap();
        let shape = shape_of(endpoint);
        let &(_, _, ctx, list_parts, system_prompt_bytes) = SCENARIOS
            .iter()
            .find(|(e, s, ..)| *e == endpoint && *s == scenario)
            .unwrap_or_else(|| panic!("scenario {endpoint}/{scenario} missing from SCENARIOS"));
        let marker = build_marker(target, phase, &inputs);
        assert_eq!(
            marker.as_deref(),
            case["marker"].as_str(),
            "{endpoint}/{scenario}/{target}/{phase}"
        );
        let requests = case["requests"].as_array().unwrap();
        assert!(!requests.is_empty());
        for (turn, req) in requests.iter().enumerate() {
            let before = &req["before"];
            let after = &req["after"];
            let bytes = serde_json::to_vec(before).unwrap();
            let label = format!(
                "{endpoint}/{scenario}/{target}/{phase} turn {}",
                req["turn_index"]
            );
            let parsed = parse(shape, &bytes).unwrap_or_else(|e| panic!("{label}: {e}"));
            let Some(marker) = marker.as_deref() else {
                // No marker: the proxy forwards without parsing; the vector agrees.
                assert_eq!(before, after, "{label}");
                let none = parsed.apply(&Plan::new(Target::None, "x")).unwrap();
                assert_eq!(
                    none,
                    Outcome {
                        body: None,
                        location: None
                    }
                );
                unmarked += 1;
                requests_checked += 1;
                continue;
            };
            let plan = Plan {
                target,
                marker,
                user_context_messages: ctx,
                list_parts,
                system_prompt_bytes,
                max_prompts: usize::MAX,
            };
            let out = parsed
                .apply(&plan)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            let body = out
                .body
                .clone()
                .unwrap_or_else(|| panic!("{label}: nothing injected"));
            let got: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(&got, after, "{label}");
            // Stronger, on the wire: from the vector's own text with its key order (the
            // fixture's JSON, whitespace removed = orjson's compact form), the spliced bytes equal
            // AIPerf's `after` byte for byte.
            let raw = &raw_requests[&(endpoint, scenario, target, phase)][turn];
            let wire_in = minify(raw.0.get());
            let wire_out = parse(shape, wire_in.as_bytes())
                .unwrap()
                .apply(&plan)
                .unwrap();
            assert_eq!(
                std::str::from_utf8(wire_out.body.as_deref().unwrap()).unwrap(),
                minify(raw.1.get()),
                "{label}"
            );
            let want_loc = if !target.is_system() {
                Location::FirstUser
            } else if has_system(shape, before) {
                Location::System
            } else {
                Location::Fallthrough
            };
            assert_eq!(out.location, Some(want_loc), "{label}");
            // Idempotent: the marked body is left alone.
            let again = parse(shape, &body).unwrap().apply(&plan).unwrap();
            assert_eq!(
                again,
                Outcome {
                    body: None,
                    location: Some(want_loc)
                },
                "{label}"
            );
            // A marked and an unmarked history hash the same (session identity).
            assert_eq!(
                parse(shape, &body).unwrap().first_user_turn_hash(ctx),
                parsed.first_user_turn_hash(ctx),
                "{label}"
            );
            assert!(parsed.first_user_turn_hash(ctx).is_some(), "{label}");
            marked += 1;
            requests_checked += 1;
        }
        vectors_passed += 1;
    }
    assert_eq!(vectors_passed, 124);
    assert_eq!(requests_checked, 160);
    assert_eq!((marked, unmarked), (112, 48));
}

#[test]
fn multi_turn_history_hashes_to_one_session() {
    let v = vectors();
    for case in v["payload_vectors"].as_array().unwrap() {
        let scenario = case["scenario"].as_str().unwrap();
        if !scenario.starts_with("synthetic_multi_turn_3") {
            continue;
        }
        let ctx = usize::from(scenario.contains("user_context"));
        let hashes: Vec<Option<String>> = case["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let b = serde_json::to_vec(&r["before"]).unwrap();
                parse(Shape::Chat, &b).unwrap().first_user_turn_hash(ctx)
            })
            .collect();
        assert_eq!(hashes.len(), 3);
        assert!(hashes[0].is_some());
        assert!(hashes.iter().all(|h| h == &hashes[0]), "{scenario}");
    }
}

const RID_P: &str = "[rid:bec92e2bea5e]\n\n";
const RID_S: &str = "\n\n[rid:bec92e2bea5e]";
const RID_P_JSON: &str = r"[rid:bec92e2bea5e]\n\n";
const RID_S_JSON: &str = r"\n\n[rid:bec92e2bea5e]";

fn run(shape: Shape, body: &str, plan: &Plan) -> Outcome {
    parse(shape, body.as_bytes())
        .unwrap_or_else(|e| panic!("parse: {e}"))
        .apply(plan)
        .unwrap_or_else(|e| panic!("apply: {e}"))
}

fn out_str(o: &Outcome) -> &str {
    std::str::from_utf8(o.body.as_deref().expect("body changed")).unwrap()
}

/// Asserts `out == body[..at] + inserted + body[at..]` and returns `at`.
fn assert_single_insertion(body: &str, out: &str, inserted: &str) -> usize {
    assert_eq!(out.len(), body.len() + inserted.len(), "{out}");
    let at = body
        .bytes()
        .zip(out.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(body.len());
    // The insertion may start earlier than the first difference when it begins with bytes equal
    // to the ones it displaced; find the unique position that reproduces `out`.
    let candidates: Vec<usize> = (0..=at)
        .filter(|&i| body.is_char_boundary(i))
        .filter(|&i| format!("{}{inserted}{}", &body[..i], &body[i..]) == out)
        .collect();
    assert!(
        !candidates.is_empty(),
        "{out} is not {body} plus {inserted:?}"
    );
    candidates[0]
}

const GOLDEN: &str = "\t{ \"zeta\" :1.0e-7,\"n\\u00e9\":\"caf\\u00e9\\/x\",
  \"messages\" : [ {\"content\" :   \"Caf\\u00e9 \\\"q\\\" \\ud83d\\ude00\" , \"role\":\"system\", \"x\":123456789012345678901234567890},
    {\"name\":\"u\",\"role\" : \"user\",\"content\":[ {\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x/y.png\"}} ,{\"text\":\"t\\u00e9\",\"type\":\"text\"}   ] } ,
    {\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"1\"}]}],
  \"big\": 123456789012345678901234567890, \"neg\":-0.0E+00, \"f\":1e400,
  \"unknown\":{\"a\":[true,false,null,{}],\"b\":\"\\u0000\"} }\n";

#[test]
fn golden_transparency_system_string() {
    let o = run(Shape::Chat, GOLDEN, &Plan::new(Target::SystemPrefix, RID_P));
    assert_eq!(o.location, Some(Location::System));
    let out = out_str(&o);
    let at = assert_single_insertion(GOLDEN, out, RID_P_JSON);
    // Exactly after the opening quote of the system content, everything else byte-identical.
    let anchor = "{\"content\" :   \"";
    assert_eq!(at, GOLDEN.find(anchor).unwrap() + anchor.len());
    assert_eq!(&out[..at], &GOLDEN[..at]);
    assert_eq!(&out[at + RID_P_JSON.len()..], &GOLDEN[at..]);
    // (serde_json's Value cannot hold 1e400; the engine never needed to.)
    let v: Value = serde_json::from_str(&out.replace("1e400", "1")).unwrap();
    assert_eq!(v["messages"][0]["content"], format!("{RID_P}Café \"q\" 😀"));

    let o = run(Shape::Chat, GOLDEN, &Plan::new(Target::SystemSuffix, RID_S));
    let out = out_str(&o);
    let at = assert_single_insertion(GOLDEN, out, RID_S_JSON);
    let anchor = "\\ud83d\\ude00";
    assert_eq!(at, GOLDEN.find(anchor).unwrap() + anchor.len());
}

#[test]
fn golden_transparency_user_parts() {
    // First-turn suffix on a list of parts: a new compact part after the last element.
    let o = run(
        Shape::Chat,
        GOLDEN,
        &Plan::new(Target::FirstTurnSuffix, RID_S),
    );
    assert_eq!(o.location, Some(Location::FirstUser));
    let out = out_str(&o);
    let part = r#",{"type":"text","text":"[rid:bec92e2bea5e]"}"#;
    let at = assert_single_insertion(GOLDEN, out, part);
    let anchor = r#"{"text":"t\u00e9","type":"text"}"#;
    assert_eq!(at, GOLDEN.find(anchor).unwrap() + anchor.len());
    assert_eq!(&out[..at], &GOLDEN[..at]);
    assert_eq!(&out[at + part.len()..], &GOLDEN[at..]);

    // Prefix: before the first element, comma on the inner side.
    let o = run(
        Shape::Chat,
        GOLDEN,
        &Plan::new(Target::FirstTurnPrefix, RID_P),
    );
    let out = out_str(&o);
    let part = r#"{"type":"text","text":"[rid:bec92e2bea5e]"},"#;
    let at = assert_single_insertion(GOLDEN, out, part);
    assert_eq!(at, GOLDEN.find(r#"{"type":"image_url""#).unwrap());

    // Inline text: into the first *text* part's string, keeping its \u00e9 escape.
    let plan = Plan {
        list_parts: ListParts::InlineText,
        ..Plan::new(Target::FirstTurnSuffix, RID_S)
    };
    let o = run(Shape::Chat, GOLDEN, &plan);
    let out = out_str(&o);
    let at = assert_single_insertion(GOLDEN, out, RID_S_JSON);
    assert_eq!(at, GOLDEN.find(r#"t\u00e9""#).unwrap() + r"t\u00e9".len());
}

#[test]
fn transparency_other_shapes() {
    let body = r#"{"model":"m","system" : [ {"type":"text","text":"S","cache_control":{"type":"ephemeral"}} ],"messages":[{"role":"user","content":"hi"}],"max_tokens":1.50}"#;
    let o = run(
        Shape::Messages,
        body,
        &Plan::new(Target::SystemSuffix, RID_S),
    );
    assert_eq!(o.location, Some(Location::System));
    let part = r#",{"type":"text","text":"[rid:bec92e2bea5e]"}"#;
    let at = assert_single_insertion(body, out_str(&o), part);
    assert_eq!(at, body.find("} ]").unwrap() + 1);

    let body = r#"{"instructions":"Be \u0062rief","input":[{"role":"user","content":[{"type":"input_text","text":"Q"}]}],"x":1E2}"#;
    let o = run(
        Shape::Responses,
        body,
        &Plan::new(Target::SystemPrefix, RID_P),
    );
    let at = assert_single_insertion(body, out_str(&o), RID_P_JSON);
    assert_eq!(at, r#"{"instructions":""#.len());
    let o = run(
        Shape::Responses,
        body,
        &Plan::new(Target::FirstTurnPrefix, RID_P),
    );
    assert_single_insertion(
        body,
        out_str(&o),
        r#"{"type":"input_text","text":"[rid:bec92e2bea5e]"},"#,
    );

    let body = r#"{"prompt":["a", "b\u0021" ,"c"],"model":"m","seed":18446744073709551617}"#;
    let o = run(
        Shape::Completions,
        body,
        &Plan::new(Target::FirstTurnSuffix, RID_S),
    );
    assert_eq!(o.location, Some(Location::FirstUser));
    let out = out_str(&o);
    assert_eq!(
        out,
        format!(
            r#"{{"prompt":["a{RID_S_JSON}", "b\u0021{RID_S_JSON}" ,"c{RID_S_JSON}"],"model":"m","seed":18446744073709551617}}"#
        )
    );
    let o = run(
        Shape::Completions,
        body,
        &Plan::new(Target::SystemPrefix, RID_P),
    );
    assert_eq!(o.location, Some(Location::Fallthrough));
    let o2 = run(
        Shape::Completions,
        out_str(&o),
        &Plan::new(Target::SystemPrefix, RID_P),
    );
    assert_eq!(o2.body, None);
}

#[test]
fn chat_semantics() {
    let p = Plan::new(Target::SystemPrefix, RID_P);
    // developer counts as system
    let b = r#"{"messages":[{"role":"developer","content":"D"},{"role":"user","content":"U"}]}"#;
    let o = run(Shape::Chat, b, &p);
    assert_eq!(o.location, Some(Location::System));
    assert!(out_str(&o).contains(&format!(r#""{RID_P_JSON}D""#)));
    // a system message that is not first is not the system prompt (AIPerf: raw_messages[0])
    let b = r#"{"messages":[{"role":"user","content":"U"},{"role":"system","content":"S"}]}"#;
    let o = run(Shape::Chat, b, &p);
    assert_eq!(o.location, Some(Location::Fallthrough));
    assert!(out_str(&o).contains(&format!(r#""{RID_P_JSON}U""#)));
    // empty system string counts as present
    let b = r#"{"messages":[{"role":"system","content":""}]}"#;
    assert_eq!(
        out_str(&run(Shape::Chat, b, &p)),
        format!(r#"{{"messages":[{{"role":"system","content":"{RID_P_JSON}"}}]}}"#)
    );
    // empty parts array: the part goes in without a comma
    let b = r#"{"messages":[{"role":"user","content":[ ]}]}"#;
    let o = run(Shape::Chat, b, &Plan::new(Target::FirstTurnSuffix, RID_S));
    assert_eq!(
        out_str(&o),
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"[rid:bec92e2bea5e]"} ]}]}"#
    );
    // idempotent when the marker part is already last (or first) — either end counts
    let b = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"[rid:bec92e2bea5e]"},{"type":"text","text":"x"}]}]}"#;
    assert_eq!(
        run(Shape::Chat, b, &Plan::new(Target::FirstTurnSuffix, RID_S)).body,
        None
    );
    // a part with extra keys is not the marker part (Python dict equality)
    let b = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"[rid:bec92e2bea5e]","x":1}]}]}"#;
    assert!(run(Shape::Chat, b, &Plan::new(Target::FirstTurnPrefix, RID_P)).injected());
    // string idempotency: starts OR ends with the marker
    let b = format!(r#"{{"messages":[{{"role":"user","content":"x{RID_P_JSON}"}}]}}"#);
    assert_eq!(
        run(Shape::Chat, &b, &Plan::new(Target::FirstTurnPrefix, RID_P)).body,
        None
    );
    // the client spelled the marker's newlines differently: still recognised (decoded compare)
    let b = r#"{"messages":[{"role":"user","content":"[rid:bec92e2bea5e]\u000a\u000aHi"}]}"#;
    assert_eq!(
        run(Shape::Chat, b, &Plan::new(Target::FirstTurnPrefix, RID_P)).body,
        None
    );
    // user context: the second user message is the first turn; none left → nothing marked
    let b = r#"{"messages":[{"role":"user","content":"CTX"}]}"#;
    let plan = Plan {
        user_context_messages: 1,
        ..Plan::new(Target::FirstTurnPrefix, RID_P)
    };
    assert_eq!(
        run(Shape::Chat, b, &plan),
        Outcome {
            body: None,
            location: None
        }
    );
    // no messages at all
    assert_eq!(
        run(Shape::Chat, r#"{"messages":[]}"#, &p),
        Outcome {
            body: None,
            location: None
        }
    );
    // None target and empty marker never touch the body
    assert_eq!(
        run(Shape::Chat, b, &Plan::new(Target::None, RID_P)).location,
        None
    );
    assert_eq!(
        run(Shape::Chat, b, &Plan::new(Target::FirstTurnPrefix, "")).body,
        None
    );
    // a later message that is invalid is never read
    let b = r#"{"messages":[{"role":"user","content":"U"}, 7]}"#;
    assert!(run(Shape::Chat, b, &Plan::new(Target::FirstTurnPrefix, RID_P)).injected());
    // duplicate keys: the last `content` is the one the upstream reads, and the one marked
    let b = r#"{"messages":[{"role":"user","content":"A","content":"B"}]}"#;
    let o = run(Shape::Chat, b, &Plan::new(Target::FirstTurnPrefix, RID_P));
    assert_eq!(
        out_str(&o),
        format!(r#"{{"messages":[{{"role":"user","content":"A","content":"{RID_P_JSON}B"}}]}}"#)
    );
    // a lone surrogate is valid JSON syntax; marking still works and stays idempotent
    let b = r#"{"messages":[{"role":"user","content":"\ud800x"}]}"#;
    let o = run(Shape::Chat, b, &Plan::new(Target::FirstTurnSuffix, RID_S));
    let out = out_str(&o).to_owned();
    assert_eq!(
        out,
        format!(r#"{{"messages":[{{"role":"user","content":"\ud800x{RID_S_JSON}"}}]}}"#)
    );
    assert_eq!(
        run(
            Shape::Chat,
            &out,
            &Plan::new(Target::FirstTurnSuffix, RID_S)
        )
        .body,
        None
    );
}

#[test]
fn inline_text_without_text_part_and_warmup() {
    let plan = Plan {
        list_parts: ListParts::InlineText,
        ..Plan::new(Target::WarmupIsolationFirstTurn, "[warmup]\n\n")
    };
    let b = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}"#;
    let o = run(Shape::Chat, b, &plan);
    let out = out_str(&o).to_owned();
    assert_eq!(
        out,
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"[warmup]\n\n"},{"type":"image_url","image_url":{"url":"u"}}]}]}"#
    );
    assert_eq!(run(Shape::Chat, &out, &plan).body, None);
}

#[test]
fn responses_semantics() {
    // no instructions: an input[0] system/developer item is the system prompt
    let b = r#"{"input":[{"role":"developer","content":"D"},{"role":"user","content":"U"}]}"#;
    let o = run(Shape::Responses, b, &Plan::new(Target::SystemSuffix, RID_S));
    assert_eq!(o.location, Some(Location::System));
    assert!(out_str(&o).contains(&format!(r#""D{RID_S_JSON}""#)));
    // no system at all: fall through to the input string
    let b = r#"{"input":"Q","model":"m"}"#;
    let o = run(Shape::Responses, b, &Plan::new(Target::SystemPrefix, RID_P));
    assert_eq!(o.location, Some(Location::Fallthrough));
    assert_eq!(
        out_str(&o),
        format!(r#"{{"input":"{RID_P_JSON}Q","model":"m"}}"#)
    );
    // items without a role (tool outputs) are skipped
    let b = r#"{"input":[{"type":"function_call_output","output":"x"},{"type":"message","role":"user","content":"U"}]}"#;
    let o = run(
        Shape::Responses,
        b,
        &Plan::new(Target::FirstTurnPrefix, RID_P),
    );
    assert!(out_str(&o).contains(&format!(r#""{RID_P_JSON}U""#)));
    // stateful: the first turn lives on the server
    let b = r#"{"input":"next","previous_response_id":"resp_1"}"#;
    assert_eq!(
        run(
            Shape::Responses,
            b,
            &Plan::new(Target::FirstTurnPrefix, RID_P)
        ),
        Outcome {
            body: None,
            location: None
        }
    );
    assert_eq!(
        parse(Shape::Responses, b.as_bytes())
            .unwrap()
            .first_user_turn_hash(0),
        None
    );
    // instructions: null counts as absent
    let b = r#"{"instructions":null,"input":"Q"}"#;
    let o = run(Shape::Responses, b, &Plan::new(Target::SystemPrefix, RID_P));
    assert_eq!(o.location, Some(Location::Fallthrough));
}

#[test]
fn messages_semantics() {
    let b =
        r#"{"system":null,"messages":[{"role":"user","content":[{"type":"text","text":"U"}]}]}"#;
    let o = run(Shape::Messages, b, &Plan::new(Target::SystemPrefix, RID_P));
    assert_eq!(o.location, Some(Location::Fallthrough));
    assert_eq!(
        out_str(&o),
        r#"{"system":null,"messages":[{"role":"user","content":[{"type":"text","text":"[rid:bec92e2bea5e]"},{"type":"text","text":"U"}]}]}"#
    );
    let b = r#"{"system":"S","messages":[]}"#;
    let o = run(
        Shape::Messages,
        b,
        &Plan::new(Target::WarmupIsolationSystem, "[warmup]\n\n"),
    );
    assert_eq!(out_str(&o), r#"{"system":"[warmup]\n\nS","messages":[]}"#);
}

#[test]
fn first_user_turn_hash_ignores_markers() {
    let h = |shape, b: &str, ctx| {
        parse(shape, b.as_bytes())
            .unwrap()
            .first_user_turn_hash(ctx)
    };
    let plain = h(
        Shape::Chat,
        r#"{"messages":[{"role":"user","content":"Hi"}]}"#,
        0,
    )
    .unwrap();
    assert_eq!(plain.len(), 16);
    assert!(plain
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    for marked in [
        format!(r#"{{"messages":[{{"role":"user","content":"{RID_P_JSON}Hi"}}]}}"#),
        r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi\n\n[rid:0000000000ff]"}]}"#.to_owned(),
        r#"{"messages":[{"role":"user","content":"[warmup]\n\nHi"}],"model":"other"}"#.to_owned(),
    ] {
        assert_eq!(h(Shape::Chat, &marked, 0).as_deref(), Some(plain.as_str()), "{marked}");
    }
    assert_ne!(
        h(
            Shape::Chat,
            r#"{"messages":[{"role":"user","content":"Hi!"}]}"#,
            0
        )
        .unwrap(),
        plain
    );
    // user context skipped
    let ctx = r#"{"messages":[{"role":"user","content":"CTX"},{"role":"user","content":"Hi"}]}"#;
    assert_eq!(h(Shape::Chat, ctx, 1).as_deref(), Some(plain.as_str()));
    assert_ne!(h(Shape::Chat, ctx, 0).as_deref(), Some(plain.as_str()));
    assert_eq!(h(Shape::Chat, ctx, 2), None);
    // parts: marker parts and inline markers are ignored; key order does not matter
    let parts = h(Shape::Chat, r#"{"messages":[{"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{"url":"u"}}]}]}"#, 0).unwrap();
    for marked in [
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"[rid:bec92e2bea5e]"},{"type":"text","text":"A"},{"type":"image_url","image_url":{"url":"u"}}]}]}"#,
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"[warmup]"}]}]}"#,
        r#"{"messages":[{"role":"user","content":[{"text":"A\n\n[rid:bec92e2bea5e]","type":"text"},{"image_url":{"url":"u"},"type":"image_url"}]}]}"#,
    ] {
        assert_eq!(
            h(Shape::Chat, marked, 0).as_deref(),
            Some(parts.as_str()),
            "{marked}"
        );
    }
    // same first turn through other shapes
    assert_eq!(
        h(
            Shape::Messages,
            r#"{"messages":[{"role":"user","content":"Hi"}]}"#,
            0
        )
        .as_deref(),
        Some(plain.as_str())
    );
    assert_eq!(
        h(Shape::Responses, r#"{"input":"Hi"}"#, 0).as_deref(),
        Some(plain.as_str())
    );
    assert_eq!(
        h(Shape::Completions, r#"{"prompt":["Hi","x"]}"#, 0).as_deref(),
        Some(plain.as_str())
    );
    // no user turn / unusable content
    assert_eq!(
        h(
            Shape::Chat,
            r#"{"messages":[{"role":"assistant","content":"Hi"}]}"#,
            0
        ),
        None
    );
    assert_eq!(
        h(
            Shape::Chat,
            r#"{"messages":[{"role":"user","content":null}]}"#,
            0
        ),
        None
    );
}

/// Fuzz finding 7: `inline_text` turns an empty first text part into a part that is only the
/// marker, which the hash used to drop as a marker part while the unmarked copy kept the empty
/// part. Every blank-text layout, under both list-parts rules, every marking target, prefix and
/// suffix, once and stacked, in each shape with parts: the marked turn hashes as the unmarked one.
#[test]
fn blank_text_parts_keep_the_session_hash_under_every_list_parts_rule() {
    const IMG: &str = r#"{"type":"image_url","image_url":{"url":"u"}}"#;
    let layouts = [
        format!(r#"[{{"type":"text","text":""}},{IMG}]"#),
        format!(r#"[{IMG},{{"type":"text","text":""}}]"#),
        format!(r#"[{IMG}]"#),
        r#"[{"type":"text","text":""}]"#.to_owned(),
        r#"[]"#.to_owned(),
        r#"[{"type":"text","text":""},{"type":"text","text":""},{"type":"text","text":"A"}]"#
            .to_owned(),
        format!(r#"[{{"text":"","type":"text","cache_control":{{"type":"ephemeral"}}}},{IMG}]"#),
        r#"[{"type":"text","text":"[rid:0123456789ab]"},{"type":"text","text":"B"}]"#.to_owned(),
    ];
    let markers = [RID_P, RID_S, "[warmup]\n\n", "[rid:00000000ffff]\n\n"];
    let mut checked = 0;
    for shape in [Shape::Chat, Shape::Messages, Shape::Responses] {
        let part_type = shape.text_part_type();
        for layout in &layouts {
            let content = layout.replace(r#""type":"text""#, &format!(r#""type":"{part_type}""#));
            let root = if shape == Shape::Responses {
                "input"
            } else {
                "messages"
            };
            let body = format!(r#"{{"{root}":[{{"role":"user","content":{content}}}]}}"#);
            let want = parse(shape, body.as_bytes())
                .unwrap()
                .first_user_turn_hash(0);
            assert!(want.is_some(), "{body}");
            for list_parts in [ListParts::OwnPart, ListParts::InlineText] {
                for first in markers {
                    let target = if first.starts_with("\n") {
                        Target::FirstTurnSuffix
                    } else {
                        Target::FirstTurnPrefix
                    };
                    let plan = Plan {
                        list_parts,
                        ..Plan::new(target, first)
                    };
                    let once = run(shape, &body, &plan).body.unwrap_or(body.clone().into());
                    let ctx = format!("{list_parts:?} {first:?}: {body}");
                    checked += hash_kept_under_a_second_marker(
                        shape,
                        &once,
                        list_parts,
                        want.as_deref(),
                        &ctx,
                    );
                }
            }
        }
    }
    assert_eq!(checked, 3 * 8 * 2 * 4 * 2);
    // Dropping blank parts is the only new equivalence: text still counts.
    let h = |c: &str| {
        parse(
            Shape::Chat,
            format!(r#"{{"messages":[{{"role":"user","content":{c}}}]}}"#).as_bytes(),
        )
        .unwrap()
        .first_user_turn_hash(0)
    };
    assert_eq!(
        h(&format!(r#"[{{"type":"text","text":""}},{IMG}]"#)),
        h(&format!("[{IMG}]"))
    );
    assert_ne!(h(r#"[{"type":"text","text":" "}]"#), h("[]"));
    assert_ne!(
        h(r#"[{"type":"text","text":"A"}]"#),
        h(r#"[{"type":"text","text":"B"}]"#)
    );
}

#[test]
fn user_field() {
    let p = |b: &str| {
        parse(Shape::Chat, b.as_bytes())
            .unwrap()
            .user_field()
            .map(str::to_owned)
    };
    assert_eq!(
        p(r#"{"messages":[],"user":"alice"}"#).as_deref(),
        Some("alice")
    );
    assert_eq!(
        p(r#"{"messages":[],"user":"\u0062ob"}"#).as_deref(),
        Some("bob")
    );
    assert_eq!(p(r#"{"messages":[],"user":7}"#), None);
    assert_eq!(p(r#"{"messages":[]}"#), None);
}

fn err(shape: Shape, body: &str, plan: &Plan) -> RewriteError {
    match parse(shape, body.as_bytes()).and_then(|p| p.apply(plan)) {
        Ok(o) => panic!("{body}: expected an error, got {o:?}"),
        Err(e) => e,
    }
}

#[test]
fn bad_input_names_the_problem() {
    let fp = Plan::new(Target::FirstTurnPrefix, RID_P);
    let sp = Plan::new(Target::SystemPrefix, RID_P);
    let cases: Vec<(Shape, &str, &Plan, &str, &str)> = vec![
        (Shape::Chat, "", &fp, "invalid_json", "body is not valid JSON: EOF"),
        (Shape::Chat, "{\"messages\":[}", &fp, "invalid_json", "body is not valid JSON: "),
        (Shape::Chat, "{\"messages\":[]} x", &fp, "invalid_json", "trailing characters"),
        (Shape::Chat, "[1]", &fp, "body_not_object", "body must be a JSON object (found an array)"),
        (Shape::Chat, " \"s\" ", &fp, "body_not_object", "body must be a JSON object (found a string)"),
        (Shape::Chat, "nul", &fp, "invalid_json", "body is not valid JSON"),
        (Shape::Chat, "{}", &fp, "missing_field", "`messages` is missing: a chat request must have it"),
        (Shape::Chat, r#"{"messages":{"role":"user"}}"#, &fp, "invalid_field_type", "`messages` must be an array (found an object)"),
        (Shape::Chat, r#"{"messages":null}"#, &fp, "invalid_field_type", "`messages` must be an array (found null)"),
        (Shape::Chat, r#"{"messages":["hi"]}"#, &fp, "invalid_field_type", "`messages[0]` must be an object (found a string)"),
        (Shape::Chat, r#"{"messages":[{"role":1}]}"#, &fp, "invalid_field_type", "`messages[0].role` must be a string (found a number)"),
        (Shape::Chat, r#"{"messages":[{"role":"system","content":"S"},{"role":"assistant","content":"A"},{"role":"user","content":5}]}"#, &fp, "invalid_field_type", "`messages[2].content` must be a string or an array of content parts (found a number)"),
        (Shape::Chat, r#"{"messages":[{"role":"user"}]}"#, &fp, "invalid_field_type", "`messages[0].content` must be a string or an array of content parts (found no such field)"),
        (Shape::Chat, r#"{"messages":[{"role":"system","content":null}]}"#, &sp, "invalid_field_type", "`messages[0].content` must be a string or an array of content parts (found null)"),
        (Shape::Chat, r#"{"messages":[{"role":"user","content":{"text":"x"}}]}"#, &fp, "invalid_field_type", "(found an object)"),
        (Shape::Messages, r#"{"system":5,"messages":[]}"#, &fp, "invalid_field_type", "`system` must be a string or an array of content blocks (found a number)"),
        (Shape::Messages, r#"{"system":"S"}"#, &fp, "missing_field", "`messages` is missing: a messages request must have it"),
        (Shape::Responses, r#"{"instructions":["x"]}"#, &fp, "invalid_field_type", "`instructions` must be a string (found an array)"),
        (Shape::Responses, r#"{"input":3}"#, &fp, "invalid_field_type", "`input` must be a string or an array of input items (found a number)"),
        (Shape::Responses, r#"{"input":[1]}"#, &fp, "invalid_field_type", "`input[0]` must be an object (found a number)"),
        (Shape::Completions, r#"{"model":"m"}"#, &fp, "missing_field", "`prompt` is missing"),
        (Shape::Completions, r#"{"prompt":7}"#, &fp, "invalid_field_type", "`prompt` must be a string or an array of strings"),
        (Shape::Completions, r#"{"prompt":[1,2,3]}"#, &fp, "invalid_field_type", "`prompt[0]` must be a string or an array of strings to carry a cache-bust marker (found a number; token-id prompts cannot be marked)"),
        (Shape::Completions, r#"{"prompt":["a",[1]]}"#, &sp, "invalid_field_type", "`prompt[1]`"),
    ];
    for (shape, body, plan, code, msg) in cases {
        let e = err(shape, body, plan);
        assert_eq!(e.code(), code, "{body}: {e}");
        assert!(e.to_string().contains(msg), "{body}: `{e}` lacks `{msg}`");
        assert!(e.is_client_error());
    }
    // variants
    assert!(matches!(
        err(Shape::Chat, "{", &fp),
        RewriteError::InvalidJson(_)
    ));
    assert!(matches!(
        err(Shape::Chat, "1", &fp),
        RewriteError::NotAnObject { .. }
    ));
    assert!(matches!(
        err(Shape::Chat, "{}", &fp),
        RewriteError::MissingField {
            field: "messages",
            shape: Shape::Chat
        }
    ));
    assert!(matches!(
        err(Shape::Chat, r#"{"messages":1}"#, &fp),
        RewriteError::NotAnArray { .. }
    ));
    assert!(matches!(
        err(Shape::Chat, r#"{"messages":[1]}"#, &fp),
        RewriteError::ElementNotObject { .. }
    ));
    assert!(matches!(
        err(Shape::Chat, r#"{"messages":[{"role":[]}]}"#, &fp),
        RewriteError::NotAString { .. }
    ));
    assert!(matches!(
        err(
            Shape::Chat,
            r#"{"messages":[{"role":"user","content":true}]}"#,
            &fp
        ),
        RewriteError::ContentType { .. }
    ));
    assert!(matches!(
        err(Shape::Completions, r#"{"prompt":[1]}"#, &fp),
        RewriteError::PromptType { .. }
    ));
    assert!(matches!(
        err(Shape::Responses, r#"{"input":1}"#, &fp),
        RewriteError::WrongType { .. }
    ));
    // invalid UTF-8 is invalid JSON
    let e = parse(
        Shape::Chat,
        b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
    )
    .unwrap_err();
    assert!(matches!(e, RewriteError::InvalidJson(_)), "{e}");
}

#[test]
fn shape_and_location_names() {
    for s in Shape::ALL {
        assert_eq!(Shape::from_path(s.path()), Some(s));
    }
    assert_eq!(Shape::from_path("/v1/chat/completions/"), None);
    assert_eq!(Shape::from_path("/v1/models"), None);
    assert_eq!(Location::Fallthrough.to_string(), "fallthrough");
    assert_eq!(Location::FirstUser.as_str(), "first_user");
}

#[test]
fn merged_system_prompt() {
    let plan = Plan {
        system_prompt_bytes: Some(3),
        ..Plan::new(Target::SystemSuffix, RID_S)
    };
    // string: the suffix goes after the conversation prompt, before the join separator
    let b = r#"{"messages":[{"role":"system","content":"P\u00e9\n\nD"}],"x":1.0e-7}"#;
    let o = run(Shape::Chat, b, &plan);
    let out = out_str(&o).to_owned();
    assert_eq!(
        out,
        format!(
            r#"{{"messages":[{{"role":"system","content":"Pé{RID_S_JSON}\n\nD"}}],"x":1.0e-7}}"#
        )
    );
    assert_eq!(run(Shape::Chat, &out, &plan).body, None);
    // prefix: unaffected by the split
    let pre = Plan {
        target: Target::SystemPrefix,
        marker: RID_P,
        ..plan
    };
    assert_eq!(
        out_str(&run(Shape::Chat, b, &pre)),
        format!(
            r#"{{"messages":[{{"role":"system","content":"{RID_P_JSON}P\u00e9\n\nD"}}],"x":1.0e-7}}"#
        )
    );
    // list: AIPerf's merge puts the prompt in the first part; the marker goes into its text
    let b = r#"{"messages":[{"role":"system","content":[{"type":"text","text":"P"},{"type":"text","text":"D"}]}]}"#;
    assert_eq!(
        out_str(&run(Shape::Chat, b, &plan)),
        format!(
            r#"{{"messages":[{{"role":"system","content":[{{"type":"text","text":"P{RID_S_JSON}"}},{{"type":"text","text":"D"}}]}}]}}"#
        )
    );
    // not a character boundary / past the end: a plan mismatch, not a client error
    let b = r#"{"messages":[{"role":"system","content":"é"}]}"#;
    let bad = Plan {
        system_prompt_bytes: Some(1),
        ..plan
    };
    let e = parse(Shape::Chat, b.as_bytes())
        .unwrap()
        .apply(&bad)
        .unwrap_err();
    assert!(
        matches!(e, RewriteError::PlanMismatch(_)) && !e.is_client_error(),
        "{e}"
    );
    let bad = Plan {
        system_prompt_bytes: Some(9),
        ..plan
    };
    assert!(parse(Shape::Chat, b.as_bytes())
        .unwrap()
        .apply(&bad)
        .is_err());
    // no system message: the setting is irrelevant, normal fall-through
    let b = r#"{"messages":[{"role":"user","content":"U"}]}"#;
    assert_eq!(
        run(Shape::Chat, b, &plan).location,
        Some(Location::Fallthrough)
    );
}

/// Issue 23 item 11 (fuzz): parts of the *other* API's text type (`input_text` in a chat or
/// Anthropic turn, `text` in a Responses turn). The inline rule marks the first part of the
/// shape's own text type, which the hash used to skip for an earlier part of the other type, so
/// the marker stayed in the hashed form and moved the session. Every shape with parts, both
/// list-parts rules, prefix and suffix markers, once and stacked: the marked turn hashes as the
/// unmarked one, and marking again changes nothing.
#[test]
fn parts_of_the_other_text_type_keep_the_session_hash_under_every_list_parts_rule() {
    let layouts = [
        r#"[{"type":"OTHER","text":"user"},{"type":"OWN","text":"\n\n"}]"#,
        r#"[{"type":"OTHER","text":"user"},{"type":"OWN","text":"Hi"}]"#,
        r#"[{"type":"OTHER","text":""},{"type":"OWN","text":"Hi"}]"#,
        r#"[{"type":"OTHER","text":"a"}]"#,
        r#"[{"type":"OWN","text":"Hi"},{"type":"OTHER","text":"user"}]"#,
        r#"[{"type":"OTHER","text":"[rid:0123456789ab]\n\nx"},{"type":"OWN","text":"y"}]"#,
    ];
    let markers = [RID_P, RID_S, "[warmup]\n\n"];
    let mut checked = 0;
    for shape in [Shape::Chat, Shape::Messages, Shape::Responses] {
        let own = shape.text_part_type();
        let other = if own == "text" { "input_text" } else { "text" };
        let root = if shape == Shape::Responses {
            "input"
        } else {
            "messages"
        };
        for layout in layouts {
            let content = layout.replace("OWN", own).replace("OTHER", other);
            let body = format!(r#"{{"{root}":[{{"role":"user","content":{content}}}]}}"#);
            let want = parse(shape, body.as_bytes())
                .unwrap()
                .first_user_turn_hash(0);
            assert!(want.is_some(), "{body}");
            for list_parts in [ListParts::OwnPart, ListParts::InlineText] {
                for marker in markers {
                    let target = if marker.starts_with('\n') {
                        Target::FirstTurnSuffix
                    } else {
                        Target::FirstTurnPrefix
                    };
                    let plan = Plan {
                        list_parts,
                        ..Plan::new(target, marker)
                    };
                    let once = run(shape, &body, &plan).body.expect("marked");
                    let again = parse(shape, &once).unwrap().apply(&plan).unwrap();
                    assert_eq!(again.body, None, "not idempotent");
                    let ctx = format!("{shape} {list_parts:?} {marker:?}: {body}");
                    checked += hash_kept_under_a_second_marker(
                        shape,
                        &once,
                        list_parts,
                        want.as_deref(),
                        &ctx,
                    );
                }
            }
        }
    }
    assert_eq!(checked, 3 * 6 * 2 * 3 * 2);
}

/// `once` (a marked body) and the same with a second marker of another session on top (a client
/// echoing kvbust's bytes) both hash the first user turn to `want`. Returns the bodies checked.
fn hash_kept_under_a_second_marker(
    shape: Shape,
    once: &[u8],
    list_parts: ListParts,
    want: Option<&str>,
    ctx: &str,
) -> usize {
    let plan2 = Plan {
        list_parts,
        ..Plan::new(Target::FirstTurnPrefix, "[rid:0000000000aa]\n\n")
    };
    let twice = parse(shape, once).unwrap().apply(&plan2).unwrap();
    let twice = twice.body.map_or_else(|| once.to_vec(), |b| b.to_vec());
    for marked in [once, &twice[..]] {
        let got = parse(shape, marked).unwrap().first_user_turn_hash(0);
        assert_eq!(
            got.as_deref(),
            want,
            "{ctx} -> {}",
            String::from_utf8_lossy(marked)
        );
    }
    2
}

/// The first-user pick the session hash makes is kept for the marking: hashing first, with the
/// same or another `user_context_messages`, changes neither the outcome nor the hash, and an
/// error is given again each time it is asked.
#[test]
fn the_kept_first_user_pick_changes_nothing() {
    let bodies: &[(Shape, &str)] = &[
        (
            Shape::Chat,
            r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"a"},{"role":"user","content":["b",{"type":"text","text":"c"}]}]}"#,
        ),
        (
            Shape::Chat,
            r#"{"messages":[{"role":"user","content":"a","role":"assistant"},{"content":"b","role":"user"}]}"#,
        ),
        (
            Shape::Messages,
            r#"{"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"user","content":"b"}]}"#,
        ),
        (
            Shape::Responses,
            r#"{"input":[{"role":"developer","content":"d"},{"role":"user","content":"a"},{"role":"user","content":"b"}]}"#,
        ),
        (
            Shape::Chat,
            r#"{"messages":[{"role":"assistant","content":"x"}]}"#,
        ),
    ];
    for (shape, body) in bodies {
        for target in [
            Target::FirstTurnPrefix,
            Target::FirstTurnSuffix,
            Target::SystemPrefix,
        ] {
            let marker = if target.is_prefix() { RID_P } else { RID_S };
            for (hash_skip, skip) in [(0, 0), (1, 1), (0, 1), (1, 0), (5, 0)] {
                let plan = Plan {
                    user_context_messages: skip,
                    ..Plan::new(target, marker)
                };
                let fresh = run(*shape, body, &plan);
                let fresh_hash = parse(*shape, body.as_bytes())
                    .unwrap()
                    .first_user_turn_hash(skip);
                let parsed = parse(*shape, body.as_bytes()).unwrap();
                let _ = parsed.first_user_turn_hash(hash_skip);
                assert_eq!(parsed.apply(&plan).unwrap(), fresh, "{body} {target}");
                assert_eq!(parsed.first_user_turn_hash(skip), fresh_hash, "{body}");
            }
        }
    }
    // A message the rule must read that is not an object: the same error on every ask.
    let bad = r#"{"messages":[{"role":"user","content":"a"},7]}"#;
    let plan = Plan {
        user_context_messages: 1,
        ..Plan::new(Target::FirstTurnPrefix, RID_P)
    };
    let parsed = parse(Shape::Chat, bad.as_bytes()).unwrap();
    assert_eq!(parsed.first_user_turn_hash(1), None);
    for _ in 0..2 {
        let e = parsed.apply(&plan).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`messages[1]` must be an object (found a number)"
        );
    }
}

/// A JSON string literal as the parser hands it over.
fn lit(s: &str) -> Json<'_> {
    Json::at(s.as_bytes(), 0..s.len()).unwrap()
}

/// What [`already_marked`] must answer: the whole string decoded (its JSON spelling when it is
/// not decodable), as the marking decided before it read only the ends.
fn already_by_decoding(raw: Json<'_>, marker: &str) -> bool {
    let inner = json_string_inner(marker).unwrap();
    match json::string(raw) {
        Ok(s) => s.starts_with(marker) || s.ends_with(marker),
        Err(_) => {
            let body = &raw.get()[1..raw.get().len() - 1];
            body.starts_with(&inner) || body.ends_with(&inner)
        }
    }
}

/// Spellings of characters in a JSON string, escapes of every kind among them.
const PIECES: &[&str] = &[
    "a",
    "b",
    " ",
    "[",
    "]",
    "n",
    "u",
    "0",
    "f",
    "é",
    "😀",
    r"\n",
    r"\\",
    r#"\""#,
    r"\/",
    r"\u000a",
    r"\u000A",
    r"\u0041",
    r"\ud83d\ude00",
    r"\b",
    r"\t",
    r"\u005c",
    r"\u00e9",
];

/// Up to `max` random [`PIECES`].
fn random_spelling(rng: &mut impl rand::Rng, max: usize) -> String {
    let n = rng.random_range(0..max);
    (0..n)
        .map(|_| PIECES[rng.random_range(0..PIECES.len())])
        .collect()
}

/// The marking's "already marked" test reads only the string's ends when that gives the answer
/// decoding the whole string gives, and gives it for every kind of string: table first.
#[test]
fn already_marked_reads_the_ends_as_decoding_does() {
    let long = "x".repeat(400);
    let esc = r"ab\n\\c\u00e9\ud83d\ude00/".repeat(40);
    let cjk = "漢字かな".repeat(50);
    let rid = "[rid:0123456789ab]\n\n";
    let rid_s = "\n\n[rid:0123456789ab]";
    let warm = "[warmup]\n\n";
    // (literal, marker, already marked, read from the ends alone)
    let cases: Vec<(String, &str, bool, bool)> = vec![
        (format!(r#""{long}""#), rid, false, true),
        (format!(r#""{esc}""#), rid, false, true),
        (format!(r#""[rid:0123456789ab]\n\n{esc}""#), rid, true, true),
        (
            format!(r#""{esc}\n\n[rid:0123456789ab]""#),
            rid_s,
            true,
            true,
        ),
        (format!(r#""{esc}[warmup]\n\n""#), warm, true, true),
        (format!(r#""[warmup]\n\n{long}""#), warm, true, true),
        // Text without ASCII near the ends is cut between its characters.
        (format!(r#""[warmup]\n\n{cjk}""#), warm, true, true),
        (
            format!(r#""{cjk}\n\n[rid:0123456789ab]""#),
            rid_s,
            true,
            true,
        ),
        // Another spelling of the same text: marked, though the spelling differs.
        (
            format!(r#""[rid:0123456789ab]\u000a\n{esc}""#),
            rid,
            true,
            false,
        ),
        (
            format!(r#""{esc}\u000A\u000a[rid:0123456789ab]""#),
            rid_s,
            true,
            false,
        ),
        // Looks marked in JSON but is not: `\\n` is a backslash and an `n`.
        (
            format!(r#""{esc}\\n\n[rid:0123456789ab]""#),
            rid_s,
            false,
            false,
        ),
        (format!(r#""[warmup]\n\\n{esc}""#), warm, false, true),
        // A lone surrogate in the middle: the JSON spelling decides.
        (
            format!(r#""[warmup]\n\n{esc}\ud800{esc}""#),
            warm,
            true,
            true,
        ),
        (
            format!(r#""[warmup]\u000a\n{esc}\ud800{esc}""#),
            warm,
            false,
            false,
        ),
        (
            format!(r#""{esc}\udc00{esc}\u000a\u000a[rid:0123456789ab]""#),
            rid_s,
            false,
            false,
        ),
        // Short strings are decoded whole.
        (r#""[warmup]\n\nHi""#.to_owned(), warm, true, false),
        (r#""Hi""#.to_owned(), warm, false, false),
        (r#""""#.to_owned(), rid, false, false),
    ];
    for (l, marker, want, from_ends) in &cases {
        let inner = json_string_inner(marker).unwrap();
        assert_eq!(
            already_marked(lit(l), marker, &inner),
            *want,
            "{l} {marker:?}"
        );
        assert_eq!(already_by_decoding(lit(l), marker), *want, "{l} {marker:?}");
        let body = &l[1..l.len() - 1];
        let spelled = body.starts_with(&inner) || body.ends_with(&inner);
        let ends = ends_marked(body, marker);
        assert_eq!(
            ends == Some(spelled),
            *from_ends,
            "{l} {marker:?}: {ends:?}"
        );
    }
}

/// Many random strings with escapes crowding both ends (and a marker in some spelling at an end
/// now and then, a lone surrogate in the middle in a few): the answer is always the one decoding
/// the whole string gives, and long strings are almost always answered from their ends.
#[test]
fn already_marked_equals_decoding_on_random_strings() {
    use rand::{Rng as _, SeedableRng as _};
    let markers = [
        "[rid:0123456789ab]\n\n",
        "\n\n[rid:0123456789ab]",
        "[warmup]\n\n",
        "[rid:0123456789ab]",
    ];
    let spellings = |m: &str| -> Vec<String> {
        let inner = json_string_inner(m).unwrap();
        vec![
            inner.clone(),
            inner.replace(r"\n", r"\u000a"),
            inner.replacen(r"\n", r"\u000A", 1),
            inner.replacen(r"\n", r"\\n", 1),
            inner.replacen('[', r"\u005b", 1),
            inner
                .strip_suffix(r"\n")
                .unwrap_or(&inner[..inner.len() - 1])
                .to_owned(),
            inner[1..].to_owned(),
        ]
    };
    let mut rng = rand_pcg::Pcg64::seed_from_u64(33);
    // Spellings of the marker that are not serde's (the ends and the JSON spelling disagree).
    let odd_forms = [1, 2, 4];
    let (mut long, mut from_ends, mut marked) = (0, 0, 0);
    for round in 0..40_000 {
        let marker = markers[round % markers.len()];
        let forms = spellings(marker);
        let mut body = String::new();
        let mut odd = false;
        if rng.random_bool(0.4) {
            let f = rng.random_range(0..forms.len());
            odd |= odd_forms.contains(&f);
            body.push_str(&forms[f]);
        }
        body.push_str(&random_spelling(&mut rng, 40));
        if rng.random_bool(0.7) {
            body.push_str(&"plain text ".repeat(rng.random_range(0..40)));
        }
        if rng.random_bool(0.03) {
            odd = true;
            body.push_str([r"\ud800", r"\udc00", r"\udbff\u0041"][rng.random_range(0..3)]);
        }
        body.push_str(&random_spelling(&mut rng, 40));
        if rng.random_bool(0.4) {
            let f = rng.random_range(0..forms.len());
            odd |= odd_forms.contains(&f);
            body.push_str(&forms[f]);
        }
        let l = format!("\"{body}\"");
        serde_json::from_str::<&RawValue>(&l).expect("a JSON string");
        let inner = json_string_inner(marker).unwrap();
        let want = already_by_decoding(lit(&l), marker);
        assert_eq!(
            already_marked(lit(&l), marker, &inner),
            want,
            "{l} {marker:?}"
        );
        marked += usize::from(want);
        if body.len() > 400 && !odd {
            long += 1;
            let spelled = body.starts_with(&inner) || body.ends_with(&inner);
            from_ends += usize::from(ends_marked(&body, marker) == Some(spelled));
        }
    }
    assert!(
        marked > 5_000 && long > 5_000,
        "{marked} marked, {long} long"
    );
    assert!(
        from_ends * 100 >= long * 97,
        "{from_ends} of {long} from the ends"
    );
}

/// The string decoder the session hash uses gives what serde_json gives, text or refusal, for
/// random strings of every kind of escape, lone surrogates and broken escapes among them.
#[test]
fn decode_string_equals_serde() {
    use rand::{Rng as _, SeedableRng as _};
    let odd = [
        r"\ud800",
        r"\udfff",
        r"\ud800\u0041",
        r"\ud800\n",
        r"\ud800x",
        r"\udbff\udfff",
        r"\ud800\ud800",
        r"\u0000",
    ];
    let mut rng = rand_pcg::Pcg64::seed_from_u64(34);
    let mut buf = String::from("left over");
    let (mut text, mut refused) = (0, 0);
    for _ in 0..30_000 {
        let mut body = random_spelling(&mut rng, 30);
        if rng.random_bool(0.2) {
            let at = rng.random_range(0..=body.len());
            if body.is_char_boundary(at) {
                body.insert_str(at, odd[rng.random_range(0..odd.len())]);
            }
        }
        let l = format!("\"{body}\"");
        // The decoder is given what a parse accepted: well-formed escapes, no bare quote.
        if serde_json::from_str::<&RawValue>(&l).is_err() {
            continue;
        }
        let by_serde = serde_json::from_str::<String>(&l).ok();
        let mine = decode_string(&body, &mut buf).map(|()| buf.clone());
        assert_eq!(mine, by_serde, "{body}");
        if by_serde.is_some() {
            text += 1;
        } else {
            refused += 1;
        }
    }
    assert!(
        text > 20_000 && refused > 1_000,
        "{text} decoded, {refused} refused"
    );
}

/// The session hash of a string turn is SHA-256 over the documented bytes, whatever spelling the
/// client used: a fixed value, then random strings against the reference (serde decodes, markers
/// out, SHA-256).
#[test]
fn the_string_turn_hash_is_the_documented_digest() {
    use rand::SeedableRng as _;
    let reference = |text: &str| {
        let mut h = Sha256::new();
        h.update(b"kvbust-first-user-turn-v1\0s\0");
        h.update(unmarked(text).as_bytes());
        hex::encode(&h.finalize()[..8])
    };
    // sha256(b"kvbust-first-user-turn-v1\0s\0Hi")[:8], by Python's hashlib.
    assert_eq!(reference("Hi"), "a1888c97cc9ac7e4");
    for l in [r#""Hi""#, r#""\u0048i\n""#, r#""[warmup]\n\nH\u0069""#] {
        assert_eq!(
            Parsed::content_hash(lit(l)).as_deref(),
            Some("a1888c97cc9ac7e4"),
            "{l}"
        );
    }
    assert_eq!(Parsed::content_hash(lit(r#""a\ud800b""#)), None);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(35);
    for round in 0..5_000 {
        let mut body = random_spelling(&mut rng, 60);
        if round % 3 == 0 {
            body.insert_str(0, r"[rid:0123456789ab]\n\n");
        }
        if round % 5 == 0 {
            body.push_str(r"[warmup]\u000a");
        }
        let l = format!("\"{body}\"");
        let text: String = serde_json::from_str(&l).unwrap();
        assert_eq!(Parsed::content_hash(lit(&l)), Some(reference(&text)), "{l}");
    }
}

/// The per-thread memo of first turns keeps at most `ENTRIES` turns and `BUDGET` bytes of them,
/// letting the least recently used go first; a turn longer than the budget is hashed each time;
/// a kept turn is only ever matched byte for byte.
#[test]
fn the_first_turn_memo_keeps_long_turns_within_its_budget() {
    use std::cell::Cell;
    let computed = Cell::new(0);
    let hash = |turn: &str| {
        first_turns::hash(turn, || {
            computed.set(computed.get() + 1);
            Some(format!("h{}", turn.len()))
        })
    };
    let kb = 1 << 10;
    let mb = 1 << 20;
    let turn = |len: usize, fill: char| format!("\"{}\"", fill.to_string().repeat(len - 2));
    // A 300 KB turn (past the old 64 KB limit) sent again is not hashed again.
    let long = turn(300 * kb, 'a');
    assert_eq!(hash(&long).as_deref(), Some("h307200"));
    assert_eq!(hash(&long).as_deref(), Some("h307200"));
    assert_eq!(computed.get(), 1);
    // Same length, one byte different: a miss.
    let mut other = long.clone();
    other.replace_range(1000..1001, "b");
    hash(&other);
    assert_eq!(computed.get(), 2);
    // Nine small turns: the count bound lets the two long ones and the first small one go.
    let smalls: Vec<String> = (0..9).map(|i| turn(10 + i, 'c')).collect();
    for s in &smalls {
        hash(s);
    }
    first_turns::with_kept(|k| {
        let (lens, bytes) = k.lengths();
        assert_eq!(lens, (11..=18).rev().collect::<Vec<_>>());
        assert_eq!(bytes, (11..=18).sum::<usize>());
    });
    // Using the oldest makes it the newest: the next turn evicts another.
    hash(&smalls[1]);
    hash(&turn(100, 'd'));
    first_turns::with_kept(|k| assert_eq!(k.lengths().0[..3], [100, 11, 18]));
    let before = computed.get();
    hash(&smalls[1]);
    assert_eq!(computed.get(), before);
    hash(&smalls[2]);
    assert_eq!(computed.get(), before + 1);
    // Two 3 MB turns do not fit the 4 MB budget together: the older goes.
    let three_a = turn(3 * mb, 'e');
    let three_b = turn(3 * mb, 'f');
    hash(&three_a);
    hash(&three_b);
    first_turns::with_kept(|k| {
        let (lens, bytes) = k.lengths();
        assert_eq!(lens[0], 3 * mb);
        assert_eq!(lens.iter().filter(|&&l| l == 3 * mb).count(), 1);
        assert!(bytes <= first_turns::BUDGET && lens.len() <= first_turns::ENTRIES);
        assert_eq!(bytes, lens.iter().sum::<usize>());
    });
    let before = computed.get();
    hash(&three_a);
    assert_eq!(computed.get(), before + 1);
    // Past the budget: hashed every time, never kept.
    let huge = turn(first_turns::BUDGET + 1, 'g');
    hash(&huge);
    hash(&huge);
    assert_eq!(computed.get(), before + 3);
    first_turns::with_kept(|k| assert!(!k.lengths().0.contains(&huge.len())));
}
