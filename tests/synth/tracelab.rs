//! `kvbust synth` on TraceLab input: every tracelab_traces.json case (AIPerf 0.13.0's
//! CustomDatasetComposer with the tracelab loader, Qwen3; plain and gzipped files, subagent
//! joins, grandchildren and unplaceable children, another block size and corpus, the loader's
//! --max-context-length selection with Weka's caps) byte for byte through the command line,
//! detection without the type, and the errors bad rows get (file:line, session, field; exit 2;
//! no output file).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Parser;
use kvbust::cli::synth::run;
use kvbust::synth::dataset::trace::detect_kind;
use kvbust::synth::dataset::trace_kind::TraceKind;
use serde_json::{json, Value};

use crate::agentic_common::{check_conversation, run_synth_binary};
use crate::synth_common::{fresh_scratch, Wrapper};

fn vectors() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth/tracelab_traces.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    fresh_scratch("tracelab", name)
}

fn gzip(text: &str) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap()
}

/// Writes a case's file as the vector script did (its exact text; gzipped for a `.gz` name) and
/// returns its path.
fn write_input(dir: &Path, input: &Value) -> PathBuf {
    let files = input["files"].as_object().unwrap();
    assert_eq!(files.len(), 1, "TraceLab is one file");
    let (name, text) = files.iter().next().unwrap();
    let text = text.as_str().unwrap();
    let path = dir.join(name);
    if name.ends_with(".gz") {
        std::fs::write(&path, gzip(text)).unwrap();
    } else {
        std::fs::write(&path, text).unwrap();
    }
    path
}

fn synth(argv: &[String]) -> anyhow::Result<()> {
    let mut full = vec!["synth".to_owned()];
    full.extend_from_slice(argv);
    run(&Wrapper::try_parse_from(full).expect("flags parse").args)
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The case's flags; `--custom-dataset-type` when the case gave it (null: AIPerf detected the
/// type) and `with_type` asks for it.
fn case_argv(input: &Path, case: &Value, out: &Path, with_type: bool) -> Vec<String> {
    let mut argv: Vec<String> = vec!["--input-file".into(), input.display().to_string()];
    if let (true, Some(kind)) = (with_type, case["custom_dataset_type"].as_str()) {
        argv.push("--custom-dataset-type".into());
        argv.push(kind.into());
    }
    // AIPerf's run had `--model claude-opus`.
    argv.extend(["--model", "claude-opus", "-o"].map(String::from));
    argv.push(out.display().to_string());
    argv.extend(
        case["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned()),
    );
    argv
}

fn check_case(name: &str, case: &Value, got: &[Value]) {
    let want = case["conversations"].as_array().unwrap();
    let ids = |c: &[Value]| {
        c.iter()
            .map(|x| x["session_id"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(got), ids(want), "{name}: conversations");
    for (g, w) in got.iter().zip(want) {
        check_conversation(&format!("{name} {}", w["session_id"]), g, w);
    }
}

#[test]
fn all_tracelab_vectors_byte_exact() {
    let v = vectors();
    assert_eq!(v["aiperf_version"], "0.13.0");
    let cases = v["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 5);
    let mut gz = 0;
    for (name, case) in cases {
        // null: the type was detected (AIPerf refuses --max-context-length with an explicit one).
        assert!(
            case["custom_dataset_type"] == "tracelab" || case["custom_dataset_type"].is_null(),
            "{name}"
        );
        let dir = scratch(name);
        let input = write_input(&dir, &case["input"]);
        gz += usize::from(input.extension().is_some_and(|x| x == "gz"));
        let out = dir.join("out.jsonl");
        let t0 = std::time::Instant::now();
        synth(&case_argv(&input, case, &out, true)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        eprintln!(
            "{name}: {:?} (AIPerf: {} s)",
            t0.elapsed(),
            case["aiperf_seconds"]
        );
        check_case(name, case, &lines(&out));
    }
    assert_eq!(gz, 1, "one case reads a gzipped file");
}

#[test]
fn max_context_length_needs_a_detected_type_as_in_aiperf() {
    let v = vectors();
    let case = &v["cases"]["tracelab_selection_caps"];
    assert!(case["argv"]
        .as_array()
        .unwrap()
        .contains(&json!("--max-context-length")));
    let dir = scratch("explicit-max-context");
    let input = write_input(&dir, &case["input"]);
    let mut argv = case_argv(&input, case, &dir.join("out.jsonl"), false);
    argv.extend(["--custom-dataset-type", "tracelab"].map(String::from));
    let err = format!("{:#}", synth(&argv).unwrap_err());
    assert!(
        err.contains("--max-context-length with --custom-dataset-type tracelab is refused"),
        "{err}"
    );
}

#[test]
fn tracelab_is_detected_from_the_first_row_plain_or_gzipped() {
    let v = vectors();
    for name in ["tracelab_basic", "tracelab_subagents_gz"] {
        let case = &v["cases"][name];
        let dir = scratch(&format!("detect-{name}"));
        let input = write_input(&dir, &case["input"]);
        assert_eq!(detect_kind(&input, None).unwrap(), TraceKind::Tracelab);
        // Detection picks tracelab's defaults too (block size 64, the coding corpus).
        let out = dir.join("out.jsonl");
        synth(&case_argv(&input, case, &out, false)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        check_case(name, case, &lines(&out));
    }
}

/// Two sessions, each with two dated rounds; the second session's first round spawns nothing.
fn rows() -> Vec<Value> {
    let row = |sid: &str, i: u32, at: &str| {
        json!({"session_id": sid, "round_index": i, "provider": "claude", "user": "u",
               "project": "p", "model": "claude-sonnet-4-5", "input_tokens_total": 500 + 300 * i,
               "prefix_tokens": 480 * i, "newly_append_tokens": 20, "output_tokens": 40,
               "first_input_event_type": "tool_result",
               "timing_events": [{"event_type": "tool_result", "timestamp": format!("2025-11-03T09:00:{at}Z")},
                                 {"event_type": "text", "timestamp": format!("2025-11-03T09:00:{at}.900Z")}],
               "tools": [{"tool_name": "Read", "emitted_at": format!("2025-11-03T09:00:{at}.950Z"),
                          "result_at": format!("2025-11-03T09:00:{at}.990Z"), "tool_wall_latency_ms": 40}]})
    };
    vec![
        row("claude:s1", 0, "01"),
        row("claude:s1", 1, "05"),
        row("claude:s2", 0, "02"),
        row("claude:s2", 1, "07"),
    ]
}

fn text(rows: &[Value]) -> String {
    rows.iter().map(|r| format!("{r}\n")).collect()
}

/// Runs the real binary on `body` (as rounds.jsonl): exit code, stderr, whether -o was written.
fn run_bad(name: &str, body: &str) -> (i32, String, bool) {
    let dir = scratch(name);
    let input = dir.join("rounds.jsonl");
    std::fs::write(&input, body).unwrap();
    run_synth_binary("tracelab", &input, &dir.join("out.jsonl"))
}

#[test]
fn bad_rows_exit_2_naming_file_line_session_and_field() {
    type Edit = fn(&mut Vec<Value>);
    let table: Vec<(&str, Edit, &str)> = vec![
        ("stamp", |r| r[1]["timing_events"][1]["timestamp"] = json!("yesterday"),
         "rounds.jsonl:2: trace \"claude:s1\": timing_events[1].timestamp: is \"yesterday\", which is not an ISO-8601 timestamp"),
        ("stamp-type", |r| r[2]["tools"][0]["result_at"] = json!(17), "rounds.jsonl:3: trace \"claude:s2\": tools[0].result_at: must be an ISO-8601 string, not a number"),
        ("tokens", |r| r[3]["input_tokens_total"] = json!("lots"), "rounds.jsonl:4: trace \"claude:s2\": input_tokens_total: is \"lots\", which is not an integer"),
        ("prefix", |r| r[1]["prefix_tokens"] = json!([1]), "rounds.jsonl:2: trace \"claude:s1\": prefix_tokens: must be an integer, not an array"),
        ("model", |r| r[0]["model"] = json!(5), "rounds.jsonl:1: trace \"claude:s1\": model: must be a string, not a number"),
        ("tools", |r| r[2]["tools"] = json!("Read"), "rounds.jsonl:3: trace \"claude:s2\": tools: must be an array, not a string"),
        ("event", |r| r[0]["timing_events"][0] = json!("tool_result"), "rounds.jsonl:1: trace \"claude:s1\": timing_events[0]: must be an object, not a string"),
        ("latency", |r| { r[0]["tools"][0]["tool_name"] = json!("Agent"); r[0]["tools"][0]["tool_wall_latency_ms"] = json!("long"); },
         "rounds.jsonl:1: trace \"claude:s1\": tools[0].tool_wall_latency_ms: must be a number, not a string"),
        ("user", |r| r[2]["user"] = json!({"name": "u"}), "rounds.jsonl:3: trace \"claude:s2\": user: must be a string"),
        ("session-type", |r| r[3]["session_id"] = json!(7), "rounds.jsonl:4: session_id: must be a string, not a number"),
        ("collide", |r| { r[2]["session_id"] = json!("claude_s1"); r[3]["session_id"] = json!("claude_s1"); },
         "rounds.jsonl:3: trace \"claude_s1\": session_id: becomes trace id \"claude_s1\", as does session \"claude:s1\" (line 1)"),
    ];
    for (name, edit, want) in table {
        let mut r = rows();
        edit(&mut r);
        let (code, stderr, wrote) = run_bad(name, &text(&r));
        assert_eq!(code, 2, "{name}: {stderr}");
        assert!(!wrote, "{name}: an output file was left behind");
        assert!(stderr.contains(want), "{name}: {stderr:?} lacks {want:?}");
    }
    // Not JSON, and no session at all.
    let mut body = text(&rows());
    body.insert_str(0, "\n{\"session_id\": \"claude:s0\",\n");
    let (code, stderr, wrote) = run_bad("json", &body);
    assert!(code == 2 && !wrote, "{stderr}");
    assert!(
        stderr.contains("rounds.jsonl:2: invalid JSON in a TraceLab row"),
        "{stderr}"
    );
    let (code, stderr, wrote) = run_bad("empty", "{\"round_index\": 0}\n[1]\n\n");
    assert!(code == 2 && !wrote, "{stderr}");
    assert!(
        stderr.contains("rounds.jsonl: holds no TraceLab sessions"),
        "{stderr}"
    );
    // The unedited rows are fine (so each error above is the edit's).
    let (code, stderr, wrote) = run_bad("good", &text(&rows()));
    assert_eq!(code, 0, "{stderr}");
    assert!(wrote);
}
