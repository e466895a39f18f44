//! `kvbust synth` on agentic traces: the seven agentic_traces.json cases (AIPerf 0.13.0's
//! CustomDatasetComposer with weka_trace and burst_gpt_trace, Qwen3) byte for byte through the
//! command line, and the errors bad traces get (file, trace id, JSON path; exit 2; no file).

use std::path::{Path, PathBuf};

use clap::Parser;
use kvbust::cli::synth::run;
use serde_json::{json, Value};

use crate::agentic_common::{check_conversation, run_synth_binary};
use crate::synth_common::{fresh_scratch, Wrapper};

fn vectors() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth/agentic_traces.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    fresh_scratch("agentic", name)
}

/// Writes a case's input as the vector script did (`json.dumps` of each trace object, or the
/// CSV text) and returns what `--input-file` names: the one file, or the folder.
fn write_input(name: &str, input: &Value) -> PathBuf {
    let dir = scratch(name).join("in");
    std::fs::create_dir_all(&dir).unwrap();
    let files = input["files"].as_object().unwrap();
    for (file, content) in files {
        let text = match content {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        std::fs::write(dir.join(file), text).unwrap();
    }
    if input["single_file"].as_bool().unwrap() {
        dir.join(files.keys().next().unwrap())
    } else {
        dir
    }
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

fn case_argv(name: &str, case: &Value, out: &Path) -> Vec<String> {
    let input = write_input(name, &case["input"]);
    let mut argv: Vec<String> = vec![
        "--input-file".into(),
        input.display().to_string(),
        "--custom-dataset-type".into(),
        case["custom_dataset_type"].as_str().unwrap().into(),
        // AIPerf's run had `--model claude-opus`.
        "--model".into(),
        "claude-opus".into(),
        "-o".into(),
        out.display().to_string(),
    ];
    argv.extend(
        case["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned()),
    );
    argv
}

#[test]
fn all_agentic_vectors_byte_exact() {
    let v = vectors();
    assert_eq!(v["aiperf_version"], "0.13.0");
    let cases = v["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 7);
    for (name, case) in cases {
        let out = scratch(name).join("out.jsonl");
        let t0 = std::time::Instant::now();
        synth(&case_argv(name, case, &out)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        eprintln!(
            "{name}: {:?} (AIPerf: {} s)",
            t0.elapsed(),
            case["aiperf_seconds"]
        );
        let got = lines(&out);
        let want = case["conversations"].as_array().unwrap();
        let ids = |c: &[Value]| {
            c.iter()
                .map(|x| x["session_id"].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&got), ids(want), "{name}: conversations");
        for (g, w) in got.iter().zip(want) {
            check_conversation(&format!("{name} {}", w["session_id"]), g, w);
        }
    }
}

fn weka_trace() -> Value {
    json!({"id": "bad-trace", "models": ["m"], "block_size": 64, "hash_id_scope": "local",
           "tool_tokens": 0, "system_tokens": 0,
           "requests": [
               {"t": 0.5, "type": "n", "model": "m", "in": 100, "out": 5, "hash_ids": [1, 2]},
               {"t": 1.0, "type": "subagent", "agent_id": "agent_000", "subagent_type": "Explore",
                "status": "completed", "models": ["m"],
                "requests": [{"t": 1.5, "type": "s", "model": "m", "in": 70, "out": 3,
                              "hash_ids": [1, 9]}]},
               {"t": 4.0, "type": "n", "model": "m", "in": 200, "out": 5, "hash_ids": [1, 2, 3, 4]}]})
}

/// Runs the real binary on a trace edited by `edit`: exit code, stderr, whether -o was written.
fn run_bad(name: &str, edit: impl Fn(&mut Value)) -> (i32, String, bool) {
    let dir = scratch(name);
    let mut t = weka_trace();
    edit(&mut t);
    let input = dir.join("trace.json");
    std::fs::write(&input, t.to_string()).unwrap();
    run_synth_binary("weka_trace", &input, &dir.join("out.jsonl"))
}

#[test]
fn bad_traces_exit_2_naming_file_trace_and_path() {
    type Edit = fn(&mut Value);
    let table: Vec<(&str, Edit, &str)> = vec![
        ("unknown", |t| t["requests"][0]["cache"] = json!(true), "requests[0].cache: does not match the Weka trace schema: unknown field"),
        ("negative", |t| t["requests"][2]["in"] = json!(-3), "requests[2].in: does not match the Weka trace schema: is -3, but a token count cannot be negative"),
        ("missing", |t| { t["requests"][1]["requests"][0].as_object_mut().unwrap().remove("out"); }, "requests[1].requests[0].out: does not match the Weka trace schema: is missing"),
        ("global", |t| t["hash_id_scope"] = json!("global"), "hash_id_scope: does not match the Weka trace schema: is \"global\""),
        ("no-requests", |t| t["requests"][1]["requests"] = json!([]), "requests[1].requests: does not match the Weka trace schema: is empty"),
        ("block-size", |t| t["requests"][2]["hash_ids"] = json!([1, 2, 3, 4, 5]), "requests[2].hash_ids: does not match the Weka trace schema: holds 5 hash ids"),
    ];
    for (name, edit, want) in table {
        let (code, stderr, wrote) = run_bad(name, edit);
        assert_eq!(code, 2, "{name}: {stderr}");
        assert!(!wrote, "{name}: an output file was left behind");
        assert!(
            stderr.contains("trace.json: trace \"bad-trace\": "),
            "{name}: {stderr}"
        );
        assert!(stderr.contains(want), "{name}: {stderr:?} lacks {want:?}");
    }
    // The unedited trace is fine (so each error above is the edit's).
    let (code, stderr, wrote) = run_bad("good", |_| {});
    assert_eq!(code, 0, "{stderr}");
    assert!(wrote);
}

#[test]
fn duplicate_ids_in_a_directory_and_formats_that_cannot_hold_agentic_turns_are_refused() {
    let dir = scratch("dup");
    let traces = dir.join("traces");
    std::fs::create_dir_all(&traces).unwrap();
    for f in ["a.json", "b.json"] {
        std::fs::write(traces.join(f), weka_trace().to_string()).unwrap();
    }
    let err = synth(&[
        "--input-file".into(),
        traces.display().to_string(),
        "-o".into(),
        dir.join("o.jsonl").display().to_string(),
    ])
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("b.json: trace \"bad-trace\": id: duplicate trace id"),
        "{msg}"
    );
}

#[test]
fn exports_carry_the_accumulated_context_or_refuse() {
    let v = vectors();
    let case = &v["cases"]["weka_compaction"];
    let dir = scratch("export");
    let chat = dir.join("chat.jsonl");
    let mut argv = case_argv("export-in", case, &chat);
    argv.extend(["--format".into(), "openai-chat".into()]);
    synth(&argv).unwrap();
    let bodies = lines(&chat);
    // One body per turn, in conversation order; each turn's messages are the deltas since
    // the last reset_context turn (AIPerf's deltas_with_responses), its model and max tokens.
    let mut expected = Vec::new();
    for conv in case["conversations"].as_array().unwrap() {
        let mut context: Vec<Value> = Vec::new();
        for t in conv["turns"].as_array().unwrap() {
            if t["reset_context"] == json!(true) {
                context.clear();
            }
            context.extend(t["raw_messages"].as_array().unwrap().iter().cloned());
            expected.push((context.clone(), t["model"].clone(), t["max_tokens"].clone()));
        }
    }
    assert!(
        expected.iter().any(|(c, _, _)| c.len() == 2),
        "the case has a reset"
    );
    assert_eq!(bodies.len(), expected.len());
    for (b, (messages, model, max)) in bodies.iter().zip(&expected) {
        assert_eq!(b["messages"], json!(messages));
        assert_eq!(&b["model"], model);
        assert_eq!(&b["max_completion_tokens"], max);
    }
    for format in ["vllm-custom", "sharegpt"] {
        let out = dir.join(format!("{format}.out"));
        let mut argv = case_argv("export-in", case, &out);
        argv.extend(["--format".into(), format.into()]);
        let e = format!("{:#}", synth(&argv).unwrap_err());
        assert!(
            e.contains("is an agentic conversation") && e.contains("openai-chat"),
            "{e}"
        );
        assert!(!out.exists());
    }
}

/// What a `datasets` export does to a row: every request carries every column of the
/// request union, null where it has none.
fn as_dataset_row(trace: &Value) -> Value {
    let mut t = trace.clone();
    t["totals"] = Value::Null;
    let union = [
        "ttft",
        "agent_id",
        "subagent_type",
        "duration_ms",
        "total_tokens",
        "tool_use_count",
        "status",
        "requests",
        "models",
        "tool_tokens",
        "system_tokens",
    ];
    for r in t["requests"].as_array_mut().unwrap() {
        let o = r.as_object_mut().unwrap();
        for k in union {
            o.entry(k).or_insert(Value::Null);
        }
    }
    t
}

#[test]
fn a_cc_traces_json_lines_export_replays_like_the_files() {
    let v = vectors();
    let case = &v["cases"]["weka_subagents"];
    let dir = scratch("cc-traces");
    let rows: String = case["input"]["files"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| as_dataset_row(t).to_string() + "\n")
        .collect();
    let plain = dir.join("cc-traces.jsonl");
    std::fs::write(&plain, &rows).unwrap();
    let gz = dir.join("cc-traces.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, rows.as_bytes()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let want = case["conversations"].as_array().unwrap();
    for input in [&plain, &gz] {
        let out = dir.join("out.jsonl");
        let mut argv = vec!["--input-file".to_owned(), input.display().to_string()];
        argv.extend(["--model", "claude-opus", "-o"].map(String::from));
        argv.push(out.display().to_string());
        argv.extend(
            case["argv"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned()),
        );
        synth(&argv).unwrap_or_else(|e| panic!("{}: {e:#}", input.display()));
        let got = lines(&out);
        assert_eq!(got.len(), want.len(), "{}", input.display());
        for (g, w) in got.iter().zip(want) {
            check_conversation(&format!("{} {}", input.display(), w["session_id"]), g, w);
        }
    }
    // A non-null field that is not in the schema still fails, with the line named.
    std::fs::write(&plain, rows.replacen("\"ttft\":null", "\"ttft\":\"x\"", 1)).unwrap();
    let e = format!(
        "{:#}",
        synth(&["--input-file".into(), plain.display().to_string()]).unwrap_err()
    );
    assert!(
        e.contains("cc-traces.jsonl:1: trace \"trace-b\": requests[") && e.contains("].ttft: "),
        "{e}"
    );
}

/// A generated corpus (8 traces x 24 requests, tools/make_agentic_fanout_fixture.py) with
/// compactions, side chains, a parallel worker fan-out (`::wg:`) and subagents, against what
/// AIPerf 0.13.0 built from it under several flag sets: defaults; --synthesis-max-isl/-osl,
/// --max-context-length, --inter-turn-delay-cap-seconds and tool-shaped messages; the idle-gap
/// cap; think time with the sonnet corpus (message contents as sha256).
#[test]
fn a_generated_fan_out_corpus_matches_aiperf_under_each_flag_set() {
    use sha2::{Digest, Sha256};
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth/agentic_fanout.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let dir = scratch("fanout");
    let input = dir.join("traces");
    std::fs::create_dir_all(&input).unwrap();
    for (name, t) in v["files"].as_object().unwrap() {
        std::fs::write(input.join(name), t.to_string()).unwrap();
    }
    let hashed = |m: &Value, content: &str| {
        let mut o = m.as_object().unwrap().clone();
        o.remove("content_sha256");
        o.insert("content".into(), json!(content));
        Value::Object(o)
    };
    let cases = v["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 4);
    for (name, case) in cases {
        let out = dir.join(format!("{name}.jsonl"));
        let mut argv = vec![
            "--input-file".to_owned(),
            input.display().to_string(),
            "-o".into(),
        ];
        argv.push(out.display().to_string());
        argv.extend(
            case["kvbust_argv"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned()),
        );
        synth(&argv).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let mut got = lines(&out);
        for c in &mut got {
            for t in c["turns"].as_array_mut().unwrap() {
                let msgs: Vec<Value> = t["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        let sha = hex::encode(Sha256::digest(m["content"].as_str().unwrap()));
                        hashed(m, &sha)
                    })
                    .collect();
                t["messages"] = json!(msgs);
            }
        }
        let mut want = case["conversations"].as_array().unwrap().clone();
        for c in &mut want {
            for t in c["turns"].as_array_mut().unwrap() {
                let msgs: Vec<Value> = t["raw_messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| hashed(m, m["content_sha256"].as_str().unwrap()))
                    .collect();
                t["raw_messages"] = json!(msgs);
                t.as_object_mut()
                    .unwrap()
                    .entry("reset_context")
                    .or_insert(json!(false));
            }
        }
        let ids = |c: &[Value]| {
            c.iter()
                .map(|x| x["session_id"].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&got), ids(&want), "{name}");
        for (g, w) in got.iter().zip(&want) {
            check_conversation(&format!("{name} {}", w["session_id"]), g, w);
            for (i, (gt, wt)) in g["turns"]
                .as_array()
                .unwrap()
                .iter()
                .zip(w["turns"].as_array().unwrap())
                .enumerate()
            {
                assert_eq!(
                    gt["messages"], wt["raw_messages"],
                    "{name} {} turn {i}",
                    w["session_id"]
                );
            }
        }
    }
    let default = cases["default"]["conversations"].as_array().unwrap();
    assert!(default
        .iter()
        .any(|c| c["session_id"].as_str().unwrap().contains("::wg:")));
    let shaped = cases["knobs_tool_shaped"].to_string();
    assert!(shaped.contains("\"role\":\"tool\"") && shaped.contains("tool_calls"));
}

/// `--num-dataset-entries N`, given, keeps the first N traces (AIPerf's filter-then-cap): the
/// same conversations as without it, for those traces only.
#[test]
fn num_dataset_entries_keeps_the_first_traces() {
    let v = vectors();
    let case = &v["cases"]["weka_subagents"];
    let out = scratch("entries").join("out.jsonl");
    let mut argv = case_argv("entries-in", case, &out);
    argv.extend(["--num-dataset-entries".into(), "1".into()]);
    synth(&argv).unwrap();
    let got = lines(&out);
    let want: Vec<&Value> = case["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            let id = c["session_id"].as_str().unwrap();
            id == "trace-b" || id.starts_with("trace-b::")
        })
        .collect();
    assert!(want.len() > 1 && want.len() < case["conversations"].as_array().unwrap().len());
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        check_conversation(&format!("entries {}", w["session_id"]), g, w);
    }
}
