//! Synthesis in the proxy, through the running proxy with the mock upstream capturing bodies:
//! dataset entries in order, multi-turn sessions, markers on top, and `{{kvbust:prompt:N}}`.

use std::sync::OnceLock;

use crate::common::*;
use http::StatusCode;
use kvbust::cachebust::{build_marker, DigestInputs, Phase, Target};
use kvbust::synth::{
    build_dataset, CacheBustTarget, Dataset, PromptCorpus, PromptStream, RandomCorpusStyle,
    SynthParams, Tokenizer,
};
use serde_json::Value;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::default_qwen3().unwrap())
}

fn params() -> SynthParams {
    SynthParams {
        isl: Some(60),
        osl: Some(11),
        num_dataset_entries: Some(3),
        random_seed: Some(7),
        shared_system_prompt_length: Some(25),
        user_context_prompt_length: Some(15),
        session_turns_mean: 2.0,
        ..SynthParams::default()
    }
}

/// What `kvbust synth` builds for the same parameters (with the marker-cost compensation the
/// proxy applies for its configured target).
fn expected(target: CacheBustTarget) -> Dataset {
    build_dataset(
        &SynthParams {
            cache_bust: target,
            ..params()
        },
        tokenizer(),
    )
    .unwrap()
}

fn rid_marker(c: i64, key: &str) -> String {
    let inputs = DigestInputs {
        benchmark_id: "0123456789ab".into(),
        recycle_pass: c,
        trajectory_index: c,
        trace_id: key.into(),
    };
    build_marker(Target::FirstTurnPrefix, Phase::Profiling, &inputs).unwrap()
}

const CLIENT_BODY: &str = r#"{"model":"my-model","temperature":0.25,"messages":[{"role":"user","content":"replace me"}],"max_tokens":999,"x_extra":{"b":[1,2.50],"a":null},"stream":false}"#;

#[tokio::test]
async fn synthetic_requests_get_dataset_entries_in_order_with_markers_on_top() {
    let h = start(|c| {
        c.synth.dataset = Some(params());
        c.cache_bust.target = Target::FirstTurnPrefix;
    })
    .await;
    let ds = expected(CacheBustTarget::FirstTurnPrefix);
    let client = h1();
    // Four new sessions: entries 0, 1, 2, then wrap to 0.
    for (i, key) in ["s-a", "s-b", "s-c", "s-d"].iter().enumerate() {
        let resp = send(
            &client,
            post(
                &h.url("/v1/chat/completions"),
                CLIENT_BODY,
                &[("x-kvbust-synth", "1"), ("x-correlation-id", key)],
            ),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        // Synthetic entries have no trace timestamp to report.
        assert!(resp.headers().get("x-kvbust-trace-timestamp").is_none());
        body_bytes(resp).await;
        let got = h.mock.recorder().requests().pop().unwrap();
        let v: Value = serde_json::from_slice(&got.body).unwrap();
        let conv = &ds.conversations[i % 3];
        let msgs = v["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3, "system, user context, first turn");
        assert_eq!(msgs[0]["role"], "system");
        assert_eq!(msgs[0]["content"], conv.system_message.as_deref().unwrap());
        // The user-context message is skipped by first-turn targets, as in AIPerf.
        assert_eq!(
            msgs[1]["content"],
            conv.user_context_message.as_deref().unwrap()
        );
        let marked = format!("{}{}", rid_marker(i as i64, key), conv.turns[0].text);
        assert_eq!(msgs[2]["content"], marked.as_str(), "entry {i}");
        // Output length from the entry; the client's other fields kept, in order, as sent.
        assert_eq!(v["max_tokens"], conv.turns[0].max_tokens.unwrap());
        let text = String::from_utf8(got.body.to_vec()).unwrap();
        assert!(
            text.starts_with(r#"{"model":"my-model","temperature":0.25,"messages":["#),
            "{text}"
        );
        assert!(
            text.ends_with(r#","max_tokens":11,"x_extra":{"b":[1,2.50],"a":null},"stream":false}"#),
            "{text}"
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_session_walks_its_conversation_turn_by_turn_with_the_upstreams_answers() {
    let h = start(|c| {
        c.synth.dataset = Some(params());
        c.synth.routes = vec!["/v1/chat/completions".into()];
    })
    .await;
    let ds = expected(CacheBustTarget::None);
    let conv = &ds.conversations[0];
    assert_eq!(conv.turns.len(), 2);
    let client = h2c();
    let url = h.url("/v1/chat/completions");
    let first = json(
        send(
            &client,
            post(&url, CLIENT_BODY, &[("x-session-id", "walk")]),
        )
        .await,
    )
    .await;
    let answer = first["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // The client sends its history with the upstream's answer, as a chat client would.
    let body = serde_json::json!({
        "model": "my-model",
        "messages": [{"role": "user", "content": "whatever"}, {"role": "assistant", "content": answer}],
    })
    .to_string();
    body_bytes(send(&client, post(&url, body, &[("x-session-id", "walk")])).await).await;
    let got: Value =
        serde_json::from_slice(&h.mock.recorder().requests().pop().unwrap().body).unwrap();
    let msgs = got["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "user", "assistant", "user"]);
    assert_eq!(msgs[2]["content"], conv.turns[0].text.as_str());
    assert_eq!(msgs[3]["content"], answer.as_str());
    assert_eq!(msgs[4]["content"], conv.turns[1].text.as_str());
    assert_eq!(
        got["max_completion_tokens"],
        conv.turns[1].max_tokens.unwrap()
    );
    // A third request of the finished session starts the next conversation.
    body_bytes(
        send(
            &client,
            post(&url, CLIENT_BODY, &[("x-session-id", "walk")]),
        )
        .await,
    )
    .await;
    let got: Value =
        serde_json::from_slice(&h.mock.recorder().requests().pop().unwrap().body).unwrap();
    assert_eq!(
        got["messages"][2]["content"],
        ds.conversations[1].turns[0].text.as_str()
    );
    h.shutdown().await;
}

/// The prompt between `<<` and `>>` in a captured body's first message.
fn between(v: &Value, open: &str, close: &str) -> String {
    let s = v["messages"][0]["content"].as_str().unwrap();
    let a = s.find(open).unwrap() + open.len();
    let b = s[a..].find(close).unwrap() + a;
    s[a..b].to_string()
}

#[tokio::test]
async fn placeholders_become_fresh_token_exact_prompts_from_each_corpus() {
    let h = start(|c| c.synth.placeholder_seed = Some(3)).await;
    let client = h1();
    let body = r#"{"model":"m","messages":[{"role":"user","content":"A<<{{kvbust:prompt:50}}>>B<<{{kvbust:prompt:33:random}}>>C<<{{kvbust:prompt:40:coding-exact}}>>D<<{{kvbust:prompt:40:coding}}>>E"}],"max_tokens":2}"#;
    // AIPerf's coding corpus is not token-exact: its prompts are the decoded windows of
    // AIPerf's generator under the seed of the (coding, 40) placeholder lane, in order.
    let mut aiperf_coding = PromptStream::new(
        std::sync::Arc::new(Tokenizer::default_qwen3().unwrap()),
        PromptCorpus::Coding,
        RandomCorpusStyle::Vllm,
        None,
        Some(kvbust::synth::prompt::placeholders::lane_seed(
            3,
            PromptCorpus::Coding,
            40,
        )),
        kvbust::app::default_cache_dir().as_deref(),
    )
    .unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let resp = send(&client, post(&h.url("/v1/chat/completions"), body, &[])).await;
        assert_eq!(resp.status(), StatusCode::OK);
        body_bytes(resp).await;
        let v: Value =
            serde_json::from_slice(&h.mock.recorder().requests().pop().unwrap().body).unwrap();
        let (a, b, c) = (
            between(&v, "A<<", ">>B"),
            between(&v, "B<<", ">>C"),
            between(&v, "C<<", ">>D"),
        );
        let d = between(&v, "D<<", ">>E");
        assert_eq!(d, aiperf_coding.prompt(40).unwrap());
        for (text, n) in [(&a, 50), (&b, 33), (&c, 40)] {
            assert_eq!(tokenizer().encode(text).unwrap().len(), n, "{text:?}");
        }
        seen.push((a, b, c));
    }
    assert_ne!(seen[0].0, seen[1].0, "each request gets a fresh prompt");
    assert_ne!(seen[0].2, seen[1].2);
    h.shutdown().await;
}

/// Only message content is prompt text: a placeholder in a role, a name, a tool call's
/// arguments, an image URL, a part of another type or a member name reaches the upstream byte
/// for byte (even a malformed one); the content string and the text part are expanded, and every
/// byte around them is the client's.
#[tokio::test]
async fn placeholders_expand_in_message_content_and_nowhere_else() {
    let h = start(|c| c.synth.placeholder_seed = Some(5)).await;
    let client = h1();
    let pieces = [
        r#"{"model":"m","user":"{{kvbust:prompt:9}}","messages":[{"role":"system","name":"{{kvbust:prompt:8}}","content":"S<<"#,
        r#">>"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"{{kvbust:prompt:7}}"}},{"type":"text","{{kvbust:prompt:6}}":1,"text":"T<<"#,
        r#">>"},{"type":"refusal","refusal":"{{kvbust:prompt:5}}"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"{{kvbust:prompt:4}}","type":"function","function":{"name":"f","arguments":"{\"q\": \"{{kvbust:prompt:3}}\", \"bad\": \"{{kvbust:oops\"}"}}]},{"role":"tool","tool_call_id":"{{kvbust:prompt:2}}","content":"ok"}],"max_tokens":2}"#,
    ];
    let placeholders = ["{{kvbust:prompt:30:random}}", "{{kvbust:prompt:20:random}}"];
    let body = format!(
        "{}{}{}{}{}",
        pieces[0], placeholders[0], pieces[1], placeholders[1], pieces[2]
    );
    let resp = send(&client, post(&h.url("/v1/chat/completions"), body, &[])).await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    let got = h.mock.recorder().requests().pop().unwrap().body;
    let got = std::str::from_utf8(&got).unwrap();
    // The forwarded body is the client's pieces with a prompt in each gap.
    let rest = got.strip_prefix(pieces[0]).expect(got);
    let (first, rest) = rest.split_once(pieces[1]).expect(got);
    let second = rest.strip_suffix(pieces[2]).expect(got);
    let v: Value = serde_json::from_str(got).unwrap();
    let decoded = |pointer: &str| {
        let s = v.pointer(pointer).unwrap().as_str().unwrap();
        s[3..s.len() - 2].to_string()
    };
    for (raw, pointer, n) in [
        (first, "/messages/0/content", 30),
        (second, "/messages/1/content/1/text", 20),
    ] {
        assert!(!raw.contains("kvbust"), "{raw}");
        let text = decoded(pointer);
        assert_eq!(tokenizer().encode(&text).unwrap().len(), n, "{text:?}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn malformed_placeholders_and_synthesis_off_chat_are_400() {
    let h = start(|_| {}).await;
    let client = h1();
    for bad in [
        "{{kvbust:prompt:lots}}",
        "{{kvbust:prompt:5:poetry}}",
        "{{kvbust:prompt:7",
    ] {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"x {bad} y"}}]}}"#);
        let resp = send(&client, post(&h.url("/v1/chat/completions"), body, &[])).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
        let v = json(resp).await;
        assert_eq!(v["error"]["code"], "invalid_placeholder");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(&bad[..14]),
            "{v}"
        );
    }
    let resp = send(
        &client,
        post(
            &h.url("/v1/completions"),
            r#"{"prompt":"x"}"#,
            &[("x-kvbust-synth", "1")],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json(resp).await["error"]["code"], "synthesis_unsupported");
    assert_eq!(h.mock.recorder().requests_total(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn placeholder_amplifiers_are_refused_and_nothing_is_forwarded() {
    let h = start(|c| c.limits.max_body = kvbust::config::ByteSize(16 << 10)).await;
    let client = h1();
    let ask = |content: String| {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{content}"}}]}}"#);
        post(&h.url("/v1/chat/completions"), body, &[])
    };
    let cases = [
        // More placeholders than synth.max_placeholders (64).
        (
            "{{kvbust:prompt:1:random}}".repeat(65),
            StatusCode::BAD_REQUEST,
            "placeholder_limit",
            "synth.max_placeholders",
        ),
        // More tokens together than synth.max_placeholder_tokens (131072).
        (
            "{{kvbust:prompt:100000:random}} {{kvbust:prompt:40000:random}}".into(),
            StatusCode::BAD_REQUEST,
            "placeholder_limit",
            "synth.max_placeholder_tokens",
        ),
        // Within both, but the expanded body would pass limits.max_body (16 KiB).
        (
            "{{kvbust:prompt:6000:random}} {{kvbust:prompt:6000:random}}".into(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "limits.max_body",
        ),
    ];
    for (content, status, code, names) in cases {
        let resp = send(&client, ask(content)).await;
        assert_eq!(resp.status(), status, "{names}");
        let v = json(resp).await;
        assert_eq!(v["error"]["code"], code);
        assert!(
            v["error"]["message"].as_str().unwrap().contains(names),
            "{v}"
        );
    }
    assert_eq!(h.mock.recorder().requests_total(), 0);
    // A small placeholder still goes through.
    let resp = send(&client, ask("{{kvbust:prompt:20:random}}".into())).await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    assert_eq!(h.mock.recorder().requests_total(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn a_trace_dataset_replays_its_entries_in_order_with_their_timestamps() {
    let trace = crate::common::test_dir().join("proxy-trace.jsonl");
    std::fs::write(
        &trace,
        concat!(
            "{\"timestamp\": 5, \"input_length\": 40, \"output_length\": 6, \"hash_ids\": [1, 2, 3]}\n",
            "{\"timestamp\": 7.5, \"input_length\": 36, \"output_length\": 4, \"hash_ids\": [1, 2, 4]}\n",
        ),
    )
    .unwrap();
    let p = SynthParams {
        input_file: Some(trace.clone()),
        isl_block_size: Some(16),
        random_seed: Some(3),
        ..SynthParams::default()
    };
    let ds = build_dataset(&p, tokenizer()).unwrap();
    let h = start(|c| c.synth.dataset = Some(p.clone())).await;
    let client = h1();
    for (i, stamp) in ["5", "7.5", "5"].iter().enumerate() {
        let resp = send(
            &client,
            post(
                &h.url("/v1/chat/completions"),
                CLIENT_BODY,
                &[("x-kvbust-synth", "1")],
            ),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["x-kvbust-trace-timestamp"], *stamp);
        body_bytes(resp).await;
        let got = h.mock.recorder().requests().pop().unwrap();
        let v: Value = serde_json::from_slice(&got.body).unwrap();
        let turn = &ds.conversations[i % 2].turns[0];
        assert_eq!(v["messages"][0]["content"], turn.text.as_str(), "entry {i}");
        assert_eq!(v["max_tokens"], turn.max_tokens.unwrap());
    }
    // The two entries share their first two blocks, as the trace says.
    let (a, b) = (
        &ds.conversations[0].turns[0].text,
        &ds.conversations[1].turns[0].text,
    );
    let shared = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    assert!(shared > 40, "{shared}");
    h.shutdown().await;
    std::fs::remove_file(&trace).unwrap();
}

/// One agentic_traces.json case's Weka traces written to a folder of their own, and the
/// `[synth.dataset]` that replays them (as `aiperf profile --input-file DIR
/// --custom-dataset-type weka_trace --random-seed S` builds it).
fn agentic_params(case: &str, seed: u64) -> SynthParams {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/synth/agentic_traces.json");
    let vectors: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let dir = crate::common::test_dir().join(format!("proxy-agentic-{case}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, trace) in vectors["cases"][case]["input"]["files"]
        .as_object()
        .unwrap()
    {
        std::fs::write(dir.join(file), trace.to_string()).unwrap();
    }
    SynthParams {
        input_file: Some(dir),
        custom_dataset_type: Some(kvbust::synth::dataset::trace_kind::TraceKind::WekaTrace),
        random_seed: Some(seed),
        ..SynthParams::default()
    }
}

fn conversation<'a>(ds: &'a Dataset, id: &str) -> &'a kvbust::synth::Conversation {
    ds.conversations
        .iter()
        .find(|c| c.session_id == id)
        .unwrap_or_else(|| panic!("no conversation {id}"))
}

/// A response header as text, `None` when absent.
fn header<'a>(resp: &'a http::Response<hyper::body::Incoming>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

/// The x-kvbust-synth-* headers of a response, in a fixed order, absent ones as `None`.
fn synth_headers(resp: &http::Response<hyper::body::Incoming>) -> [Option<String>; 7] {
    [
        "x-kvbust-synth-conversation",
        "x-kvbust-synth-turn",
        "x-kvbust-synth-spawn",
        "x-kvbust-synth-next-turn",
        "x-kvbust-synth-next-delay-ms",
        "x-kvbust-synth-next-after",
        "x-kvbust-trace-timestamp",
    ]
    .map(|n| header(resp, n).map(str::to_owned))
}

/// An agentic root conversation's turns and one child it spawns, through the proxy in the order
/// a replaying client sends them: each request reaches the upstream with the turn's whole
/// accumulated context (`agentic::context`, a reset turn starting over), the turn's model and
/// output length, and the client's other members byte for byte; each response names the
/// conversation and turn, the branch the turn spawns and what the next turn waits for.
#[tokio::test]
async fn agentic_turns_send_their_whole_context_and_tell_the_topology() {
    // trace-d: turn 0 spawns flatspawn:0 (child fa:000, two turns), turn 1 joins it, turn 2
    // resets the context after a compaction.
    let p = agentic_params("weka_compaction", 3);
    let ds = build_dataset(&p, tokenizer()).unwrap();
    let h = start(|c| c.synth.dataset = Some(p.clone())).await;
    let client = h1();
    let url = h.url("/v1/chat/completions");
    let root = conversation(&ds, "trace-d");
    let child = conversation(&ds, "trace-d::fa:000");
    let some = |s: &str| Some(s.to_owned());

    // What the upstream must receive for turn `k` of `conv`: the client's body with messages,
    // model and max_tokens of the turn, every other byte as sent.
    let expect = |conv: &kvbust::synth::Conversation, k: usize| {
        let turn = &conv.turns[k];
        let info = turn.agentic.as_deref().unwrap();
        let context = kvbust::synth::dataset::trace::agentic::context(conv, k);
        assert!(!context.is_empty());
        format!(
            r#"{{"model":{},"temperature":0.25,"messages":{},"max_tokens":{},"x_extra":{{"b":[1,2.50],"a":null}},"stream":false}}"#,
            serde_json::to_string(info.model.as_deref().unwrap()).unwrap(),
            serde_json::to_string(&context).unwrap(),
            turn.max_tokens.unwrap(),
        )
    };
    let ask = |session: &str, named: Option<&str>| {
        let mut headers = vec![("x-kvbust-synth", "1"), ("x-correlation-id", session)];
        headers.extend(named.map(|n| ("x-kvbust-synth-conversation", n)));
        post(&url, CLIENT_BODY, &headers)
    };
    let upstream_body = || {
        let got = h.mock.recorder().requests().pop().unwrap().body;
        String::from_utf8(got.to_vec()).unwrap()
    };

    // Root, turn 0: spawns the child's branch; turn 1 waits for it.
    let resp = send(&client, ask("root-1", None)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let branch = &root.agentic.as_ref().unwrap().branches[0];
    assert_eq!(branch.branch_id, "trace-d:flatspawn:0");
    assert_eq!(branch.child_conversation_ids, ["trace-d::fa:000"]);
    assert!(!branch.is_background);
    assert_eq!(
        root.turns[1].agentic.as_ref().unwrap().prerequisites,
        ["trace-d:flatspawn:0"]
    );
    assert_eq!(
        synth_headers(&resp),
        [
            some("trace-d"),
            some("0"),
            // The child's first request is at the branch start: offset 0.
            some("trace-d:flatspawn:0=trace-d::fa:000 start_ms=3363 offsets_ms=0"),
            some("1"),
            // The joining turn goes out when its branch completes, without its recorded
            // 12,243 ms delay (AIPerf's join rule).
            some("0"),
            some("trace-d:flatspawn:0"),
            some("1827.0"),
        ]
    );
    body_bytes(resp).await;
    let got = upstream_body();
    assert_eq!(got, expect(root, 0));
    let v: Value = serde_json::from_str(&got).unwrap();
    assert_eq!(v["model"], "claude-opus");
    assert_eq!(v["max_tokens"], 210);
    assert_eq!(v["messages"].as_array().unwrap().len(), 2, "system, user");

    // The child, as its own session naming its conversation: its two turns in order.
    let resp = send(&client, ask("child-1", Some("trace-d::fa:000"))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        synth_headers(&resp),
        [
            some("trace-d::fa:000"),
            some("0"),
            None,
            some("1"),
            some("4189"),
            None,
            some("3363.0"),
        ]
    );
    body_bytes(resp).await;
    assert_eq!(upstream_body(), expect(child, 0));
    let forwarded = h.mock.recorder().requests().pop().unwrap().headers;
    assert!(
        forwarded
            .keys()
            .all(|k| !k.as_str().starts_with("x-kvbust-")),
        "the conversation header is kvbust's: {forwarded:?}"
    );
    // The session goes on in its conversation without the header; named again after its last
    // turn, the child starts over (a re-run), then goes on as named.
    let last = [
        some("trace-d::fa:000"),
        some("1"),
        None,
        some("none"),
        None,
        None,
        some("8991.0"),
    ];
    for (named, turn) in [
        (None, 1),
        (Some("trace-d::fa:000"), 0),
        (Some("trace-d::fa:000"), 1),
    ] {
        let resp = send(&client, ask("child-1", named)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            header(&resp, "x-kvbust-synth-turn"),
            Some(&*turn.to_string())
        );
        if turn == 1 {
            assert_eq!(synth_headers(&resp), last);
        }
        body_bytes(resp).await;
        assert_eq!(upstream_body(), expect(child, turn), "{named:?} {turn}");
    }

    // Root, turn 1 (the joining turn): turn 0's and turn 1's deltas.
    let resp = send(&client, ask("root-1", None)).await;
    assert_eq!(
        synth_headers(&resp),
        [
            some("trace-d"),
            some("1"),
            None,
            some("2"),
            some("1314"),
            None,
            some("15158.0"),
        ]
    );
    body_bytes(resp).await;
    let got = upstream_body();
    assert_eq!(got, expect(root, 1));
    let v: Value = serde_json::from_str(&got).unwrap();
    let roles: Vec<&str> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(v["max_tokens"], 396);

    // Root, turn 2 resets the context (a compaction): only its own messages; it spawns a
    // background branch that no turn joins.
    assert!(root.turns[2].agentic.as_ref().unwrap().reset_context);
    let resp = send(&client, ask("root-1", None)).await;
    assert_eq!(
        synth_headers(&resp),
        [
            some("trace-d"),
            some("2"),
            some("trace-d:flatspawn:1=trace-d::fa:001 start_ms=24850 offsets_ms=0 background"),
            some("3"),
            some("5838"),
            None,
            some("18367.0"),
        ]
    );
    body_bytes(resp).await;
    let got = upstream_body();
    assert_eq!(got, expect(root, 2));
    let v: Value = serde_json::from_str(&got).unwrap();
    assert_eq!(v["messages"].as_array().unwrap().len(), 2);
    h.shutdown().await;
}

/// New sessions only ever start root conversations (round-robin), a named child is served to
/// the session that names it (percent-encoded or not), and a name the dataset does not hold is
/// an OpenAI-shaped 400 that reaches no upstream.
#[tokio::test]
async fn new_sessions_get_roots_and_unknown_conversations_are_400() {
    // trace-b and trace-c, with eleven children between them.
    let p = agentic_params("weka_subagents", 7);
    let ds = build_dataset(&p, tokenizer()).unwrap();
    let roots: Vec<&str> = ds
        .conversations
        .iter()
        .filter(|c| c.agentic.as_ref().unwrap().is_root)
        .map(|c| c.session_id.as_str())
        .collect();
    assert_eq!(roots, ["trace-b", "trace-c"]);
    assert_eq!(ds.conversations.len(), 13);
    let h = start(|c| c.synth.dataset = Some(p.clone())).await;
    let client = h1();
    let url = h.url("/v1/chat/completions");
    let mut served = Vec::new();
    for i in 0..5 {
        let session = format!("new-{i}");
        let resp = send(
            &client,
            post(
                &url,
                CLIENT_BODY,
                &[("x-kvbust-synth", "1"), ("x-correlation-id", &session)],
            ),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "x-kvbust-synth-turn"), Some("0"));
        served.push(
            header(&resp, "x-kvbust-synth-conversation")
                .unwrap()
                .to_owned(),
        );
        body_bytes(resp).await;
    }
    assert_eq!(
        served,
        ["trace-b", "trace-c", "trace-b", "trace-c", "trace-b"]
    );
    // Without a session header every request is a new session: still only roots.
    for _ in 0..3 {
        let resp = send(&client, post(&url, CLIENT_BODY, &[("x-kvbust-synth", "1")])).await;
        let id = header(&resp, "x-kvbust-synth-conversation")
            .unwrap()
            .to_owned();
        assert!(roots.contains(&id.as_str()), "{id}");
        body_bytes(resp).await;
    }

    // A child named percent-encoded, as a client may send any id back.
    let resp = send(
        &client,
        post(
            &url,
            CLIENT_BODY,
            &[
                ("x-kvbust-synth", "1"),
                ("x-correlation-id", "kid"),
                ("x-kvbust-synth-conversation", "trace-b%3A%3Afa%3A000"),
            ],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        header(&resp, "x-kvbust-synth-conversation"),
        Some("trace-b::fa:000")
    );
    body_bytes(resp).await;
    let got: Value =
        serde_json::from_slice(&h.mock.recorder().requests().pop().unwrap().body).unwrap();
    let child = conversation(&ds, "trace-b::fa:000");
    assert_eq!(
        got["messages"],
        serde_json::to_value(kvbust::synth::dataset::trace::agentic::context(child, 0)).unwrap()
    );

    let before = h.mock.recorder().requests_total();
    for (headers, code, says) in [
        (
            vec![
                ("x-kvbust-synth", "1"),
                ("x-kvbust-synth-conversation", "trace-z"),
            ],
            "unknown_conversation",
            "x-kvbust-synth-conversation names no conversation",
        ),
        (
            vec![
                ("x-kvbust-synth", "1"),
                ("x-kvbust-synth-conversation", "a%zz"),
            ],
            "invalid_header",
            "percent-encoded",
        ),
        (
            vec![("x-kvbust-synth-conversation", "trace-b")],
            "invalid_header",
            "x-kvbust-synth: 1",
        ),
    ] {
        let resp = send(&client, post(&url, CLIENT_BODY, &headers)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{code}");
        let v = json(resp).await;
        assert_eq!(v["error"]["code"], code);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    assert_eq!(h.mock.recorder().requests_total(), before);
    h.shutdown().await;
}

/// A spawning turn tells each child's dispatch offset (AIPerf's `_child_dispatch_offset_ms`: the
/// child's first request minus the branch start), and the joining turn after it carries no
/// delay: trace-b's agent_002 children start 2,497, 3,120 and 4,555 ms after its turn 1
/// completes (AIPerf, replaying the same dataset, started them at +2.51, +3.14 and +4.56 s).
#[tokio::test]
async fn spawned_children_carry_aiperfs_dispatch_offsets() {
    let p = agentic_params("weka_subagents", 7);
    let h = start(|c| c.synth.dataset = Some(p.clone())).await;
    let client = h1();
    let url = h.url("/v1/chat/completions");
    let ask = || {
        post(
            &url,
            CLIENT_BODY,
            &[("x-kvbust-synth", "1"), ("x-correlation-id", "offsets")],
        )
    };
    let resp = send(&client, ask()).await;
    assert_eq!(
        header(&resp, "x-kvbust-synth-conversation"),
        Some("trace-b")
    );
    // The flat agent starts at its branch start; the next turn keeps its recorded delay.
    assert_eq!(
        header(&resp, "x-kvbust-synth-spawn"),
        Some("trace-b:flatspawn:0=trace-b::fa:000 start_ms=13386 offsets_ms=0 background")
    );
    assert_eq!(header(&resp, "x-kvbust-synth-next-delay-ms"), Some("6768"));
    body_bytes(resp).await;
    let resp = send(&client, ask()).await;
    let spawn = header(&resp, "x-kvbust-synth-spawn").unwrap().to_owned();
    assert_eq!(
        spawn,
        "trace-b:spawn:agent_002=trace-b::sa:agent_002,trace-b::sa:agent_002:aux:000,\
         trace-b::sa:agent_002:aux:001 start_ms=16366 offsets_ms=2497,3120,4555"
    );
    let offsets: Vec<f64> = spawn
        .rsplit_once("offsets_ms=")
        .unwrap()
        .1
        .split(',')
        .map(|o| o.parse().unwrap())
        .collect();
    for (ours, aiperf) in offsets.iter().zip([2510.0, 3140.0, 4560.0]) {
        assert!(
            (aiperf - ours) >= 0.0 && (aiperf - ours) < 25.0,
            "{ours} vs {aiperf}"
        );
    }
    // Turn 2 joins the branch: it goes out when the children complete (its recorded delay,
    // 9,247 ms, is not waited).
    assert_eq!(
        header(&resp, "x-kvbust-synth-next-after"),
        Some("trace-b:spawn:agent_002")
    );
    assert_eq!(header(&resp, "x-kvbust-synth-next-delay-ms"), Some("0"));
    body_bytes(resp).await;
    h.shutdown().await;
}

/// The Weka cases of agentic_traces.json replayed through the proxy (the mock upstream records
/// every request) by `tools/k6-agentic-smoke.mjs`, the Node runner of `deploy/load/k6-agentic.js`,
/// with delays scaled by 1/50: AIPerf's orchestrator rules computed here from the dataset hold
/// for every request — a child's first request goes out no earlier than its dispatch offset
/// (first request minus branch start) after its spawning turn completed, and a joining turn
/// after every child of the branches it waits for completed (its recorded delay not waited:
/// the smoke runner also fails on a join announced with one). Orders of events only, no upper
/// bounds on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_k6_script_follows_aiperfs_schedule_for_the_weka_cases() {
    const SCALE: f64 = 0.02;
    for (case, seed) in [
        ("weka_main_only", 42),
        ("weka_subagents", 7),
        ("weka_compaction", 3),
        ("weka_fanout", 11),
    ] {
        let p = agentic_params(case, seed);
        let ds = build_dataset(&p, tokenizer()).unwrap();
        let h = start(|c| c.synth.dataset = Some(p.clone())).await;
        let log_path = crate::common::test_dir().join(format!("smoke-{case}.json"));
        let base = h.url("");
        let roots = ds
            .conversations
            .iter()
            .filter(|c| c.agentic.as_ref().is_none_or(|t| t.is_root))
            .count();
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/k6-agentic-smoke.mjs");
        let log = log_path.clone();
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("node")
                .arg(script)
                .env("KVBUST", base)
                .env("ROOTS", roots.to_string())
                .env("DELAY_SCALE", SCALE.to_string())
                .env("MAX_DELAY_MS", "100")
                .env("SMOKE_LOG", &log)
                .output()
                .expect("node (20+) runs the k6 smoke client")
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{case}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(&log_path).unwrap()).unwrap();
        assert_eq!(
            h.mock.recorder().requests_total() as usize,
            log.len(),
            "{case}: every request reached the upstream"
        );
        // Every conversation of every tree, each turn once, in order.
        let turns: usize = ds.conversations.iter().map(|c| c.turns.len()).sum();
        assert_eq!(log.len(), turns, "{case}: {stdout}");
        check_schedule(case, &ds, &log, SCALE);
        h.shutdown().await;
    }
}

/// AIPerf's rules over the smoke runner's log (one tree per root: trees are not mixed).
fn check_schedule(case: &str, ds: &Dataset, log: &[Value], scale: f64) {
    let at = |conv: &str, turn: usize| -> &Value {
        log.iter()
            .find(|e| {
                e["conv"] == conv && e["turn"].as_str().and_then(|s| s.parse().ok()) == Some(turn)
            })
            .unwrap_or_else(|| panic!("{case}: {conv} turn {turn} was not sent"))
    };
    let t = |e: &Value, k: &str| e[k].as_f64().unwrap();
    let end_of = |conv: &str| -> f64 {
        let n = conversation(ds, conv).turns.len();
        t(at(conv, n - 1), "t1")
    };
    for conv in &ds.conversations {
        let Some(topo) = conv.agentic.as_ref() else {
            continue;
        };
        for (k, turn) in conv.turns.iter().enumerate() {
            let Some(info) = turn.agentic.as_ref() else {
                continue;
            };
            for b in topo
                .branches
                .iter()
                .filter(|b| info.branch_ids.contains(&b.branch_id))
            {
                let spawned_end = t(at(&conv.session_id, k), "t1");
                for child in &b.child_conversation_ids {
                    let first = conversation(ds, child).turns[0]
                        .timestamp
                        .as_ref()
                        .and_then(|n| n.as_f64());
                    let offset = first.map_or(0.0, |f| (f - b.start_timestamp_ms).max(0.0));
                    let started = t(at(child, 0), "t0") - spawned_end;
                    assert!(
                        started >= offset * scale - 1.0,
                        "{case}: {child} started {started} ms after its spawn, before its \
                         {} ms offset",
                        offset * scale
                    );
                }
            }
            if !info.prerequisites.is_empty() {
                let sent = t(at(&conv.session_id, k), "t0");
                for b in topo
                    .branches
                    .iter()
                    .filter(|b| info.prerequisites.contains(&b.branch_id))
                {
                    for child in &b.child_conversation_ids {
                        assert!(
                            sent >= end_of(child),
                            "{case}: {} turn {k} sent before {child} completed",
                            conv.session_id
                        );
                    }
                }
            }
        }
    }
}

/// `[synth.dataset] model` names the model of every synthesized request of a non-agentic
/// dataset too (a hash-id trace here), as AIPerf's `--model` does: the client's is replaced.
#[tokio::test]
async fn the_dataset_model_reaches_the_upstream_for_every_dataset_type() {
    let trace = crate::common::test_dir().join("proxy-model.jsonl");
    std::fs::write(&trace, "{\"input_length\": 20, \"output_length\": 3}\n").unwrap();
    let p = SynthParams {
        input_file: Some(trace.clone()),
        random_seed: Some(3),
        model: Some("claude-opus".into()),
        ..SynthParams::default()
    };
    let h = start(|c| c.synth.dataset = Some(p.clone())).await;
    let resp = send(
        &h1(),
        post(
            &h.url("/v1/chat/completions"),
            CLIENT_BODY,
            &[("x-kvbust-synth", "1")],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    body_bytes(resp).await;
    let got = h.mock.recorder().requests().pop().unwrap();
    let v: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(v["model"], "claude-opus");
    assert_eq!(v["max_tokens"], 3);
    h.shutdown().await;
    std::fs::remove_file(&trace).unwrap();
}
