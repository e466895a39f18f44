//! Export formats, each loaded the way its consumer loads it: vLLM's custom dataset (JSONL,
//! `prompt` + `output_tokens`), the ShareGPT loaders of vLLM and SGLang (first human/gpt pair,
//! output length = tokens of the gpt value), AIPerf's mooncake_trace loader (kvbust's own
//! port, which the trace vectors pin to AIPerf), and multi-turn OpenAI chat bodies.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::synth_common;
use crate::synth_common::Wrapper;
use clap::Parser;
use kvbust::cli::synth::run;
use kvbust::synth::Tokenizer;
use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    synth_common::scratch("export", name)
}

fn tok() -> Tokenizer {
    Tokenizer::default_qwen3().unwrap()
}

/// Runs `kvbust synth ARGS -o FILE`, returns the file's text.
fn synth(args: &[&str], out: &str) -> String {
    let path = scratch(out);
    let mut full = vec!["synth".to_owned()];
    full.extend(args.iter().map(|s| s.to_string()));
    full.extend(["-o".into(), path.display().to_string()]);
    let args = Wrapper::try_parse_from(full).expect("flags parse").args;
    run(&args).expect("synth runs");
    std::fs::read_to_string(path).unwrap()
}

fn jsonl(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

/// A small multi-turn mooncake trace with timestamps, delays and hash ids, in a file of its
/// own per test (tests run in parallel).
fn trace_file(name: &str) -> PathBuf {
    let path = scratch(&format!("{name}.trace.jsonl"));
    std::fs::write(
        &path,
        concat!(
            "{\"session_id\": \"c0\", \"input_length\": 40, \"output_length\": 9, \"hash_ids\": [1, 2], \"timestamp\": 10}\n",
            "{\"session_id\": \"c1\", \"input_length\": 30, \"output_length\": 5, \"hash_ids\": [1, 3]}\n",
            "{\"session_id\": \"c0\", \"input_length\": 25, \"output_length\": 7, \"delay\": 250.5}\n",
            "{\"session_id\": \"c1\", \"text_input\": \"plain words\", \"output_length\": 3, \"delay\": 100}\n",
        ),
    )
    .unwrap();
    path
}

fn trace_args(p: &std::path::Path) -> Vec<String> {
    vec![
        "--input-file".into(),
        p.display().to_string(),
        "--isl-block-size".into(),
        "16".into(),
        "--random-seed".into(),
        "3".into(),
    ]
}

fn with(base: &[String], more: &[&str]) -> Vec<String> {
    let mut v = base.to_vec();
    v.extend(more.iter().map(|s| s.to_string()));
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn conversations_carry_timestamp_and_delay() {
    let t = trace_file("t1");
    let convs = jsonl(&synth(&strs(&trace_args(&t)), "conv.jsonl"));
    assert_eq!(convs.len(), 2);
    assert_eq!(convs[0]["session_id"], "c0");
    assert_eq!(convs[0]["turns"][0]["timestamp"], 10);
    assert!(convs[0]["turns"][0].get("delay").is_none());
    assert_eq!(convs[0]["turns"][1]["delay"], 250.5);
    assert_eq!(convs[1]["turns"][1]["text"], "plain words");
    // Synthetic datasets have neither.
    let s = jsonl(&synth(
        &[
            "--isl",
            "8",
            "--num-dataset-entries",
            "1",
            "--random-seed",
            "1",
        ],
        "s.jsonl",
    ));
    assert!(s[0]["turns"][0].get("timestamp").is_none());
}

#[test]
fn vllm_custom_loads_like_vllm() {
    // vLLM: pandas.read_json(lines=True) on a *.jsonl file, a `prompt` column, int(output_tokens),
    // prompt_len = len(tokenizer(prompt).input_ids).
    let text = synth(
        &[
            "--isl",
            "64",
            "--osl",
            "12",
            "--num-dataset-entries",
            "5",
            "--random-seed",
            "7",
            "--session-turns-mean",
            "2",
            "--format",
            "vllm-custom",
        ],
        "custom.jsonl",
    );
    let rows = jsonl(&text);
    assert_eq!(rows.len(), 10, "one row per turn");
    let t = tok();
    for r in &rows {
        let o = r.as_object().unwrap();
        let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["output_tokens", "prompt"]);
        assert_eq!(o["output_tokens"].as_u64(), Some(12));
        assert_eq!(t.encode(o["prompt"].as_str().unwrap()).unwrap().len(), 64);
    }
    // From a trace: the prompts are the dataset's texts, in order.
    let tr = trace_file("t2");
    let conv = jsonl(&synth(&strs(&trace_args(&tr)), "c2.jsonl"));
    let custom = jsonl(&synth(
        &strs(&with(&trace_args(&tr), &["--format", "vllm-custom"])),
        "c2c.jsonl",
    ));
    let texts: Vec<&Value> = conv
        .iter()
        .flat_map(|c| c["turns"].as_array().unwrap().iter().map(|t| &t["text"]))
        .collect();
    let prompts: Vec<&Value> = custom.iter().map(|r| &r["prompt"]).collect();
    assert_eq!(texts, prompts);
    assert_eq!(custom[0]["output_tokens"], 9);
}

#[test]
fn sharegpt_loads_like_vllm_and_sglang() {
    let args = [
        "--isl",
        "32",
        "--osl",
        "20",
        "--osl-stddev",
        "5",
        "--num-dataset-entries",
        "4",
        "--random-seed",
        "11",
        "--session-turns-mean",
        "3",
    ];
    let conv = jsonl(&synth(&args, "sharegpt-src.jsonl"));
    let mut sargs = args.to_vec();
    sargs.extend(["--format", "sharegpt"]);
    let text = synth(&sargs, "sharegpt.json");
    // Both loaders: json.load of the whole file, entries with len(conversations) >= 2, the
    // first two values as (prompt, completion), output_len = len(encode(completion)).
    let data: Value = serde_json::from_str(&text).expect("one JSON array");
    let items = data.as_array().unwrap();
    assert_eq!(items.len(), 4);
    let t = tok();
    for (item, c) in items.iter().zip(&conv) {
        assert_eq!(item["id"], c["session_id"]);
        let msgs = item["conversations"].as_array().unwrap();
        let turns = c["turns"].as_array().unwrap();
        assert_eq!(msgs.len(), 2 * turns.len());
        for (k, m) in msgs.iter().enumerate() {
            let from = if k % 2 == 0 { "human" } else { "gpt" };
            assert_eq!(m["from"], from, "roles alternate");
            let turn = &turns[k / 2];
            let value = m["value"].as_str().unwrap();
            if k % 2 == 0 {
                assert_eq!(value, turn["text"].as_str().unwrap());
            } else {
                assert_eq!(
                    Some(t.encode(value).unwrap().len() as u64),
                    turn["max_tokens"].as_u64(),
                    "gpt value is exactly the turn's output length"
                );
            }
        }
        let prompt = msgs[0]["value"].as_str().unwrap();
        let completion = msgs[1]["value"].as_str().unwrap();
        assert_eq!(t.encode(prompt).unwrap().len(), 32);
        assert_eq!(
            Some(t.encode(completion).unwrap().len() as u64),
            turns[0]["max_tokens"].as_u64()
        );
    }
    // Without output lengths there is nothing to make the gpt values from.
    let mut full: Vec<String> = ["synth", "--isl", "8", "--format", "sharegpt"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    full.extend(["-o".into(), scratch("nosl.json").display().to_string()]);
    let err = run(&Wrapper::try_parse_from(full).unwrap().args).unwrap_err();
    assert!(err.to_string().contains("--osl"), "{err}");
}

#[test]
fn mooncake_export_replays_verbatim_through_the_trace_loader() {
    let tr = trace_file("t3");
    let original = jsonl(&synth(&strs(&trace_args(&tr)), "m-src.jsonl"));
    let exported = synth(
        &strs(&with(&trace_args(&tr), &["--format", "mooncake"])),
        "m.jsonl",
    );
    let lines = jsonl(&exported);
    assert_eq!(lines.len(), 4);
    for l in &lines {
        assert!(
            l["text_input"].is_string() && l["output_length"].is_u64(),
            "{l}"
        );
        assert!(l.get("hash_ids").is_none() && l.get("input_length").is_none());
    }
    assert_eq!(lines[0]["timestamp"], 10);
    assert_eq!(lines[1]["delay"], 250.5);
    assert_eq!(lines[3]["delay"], 100);
    // Loading it again (AIPerf's mooncake_trace rules) gives back the same dataset.
    let path = scratch("m.jsonl");
    let again = jsonl(&synth(
        &[
            "--input-file",
            path.to_str().unwrap(),
            "--custom-dataset-type",
            "mooncake_trace",
            "--random-seed",
            "99",
        ],
        "m-again.jsonl",
    ));
    assert_eq!(again, original);

    // A synthetic multi-turn dataset survives the same round trip.
    let args = [
        "--isl",
        "24",
        "--osl",
        "6",
        "--num-dataset-entries",
        "3",
        "--random-seed",
        "2",
        "--session-turns-mean",
        "2",
    ];
    let src = jsonl(&synth(&args, "ms-src.jsonl"));
    let mut margs = args.to_vec();
    margs.extend(["--format", "mooncake"]);
    synth(&margs, "ms.jsonl");
    let p = scratch("ms.jsonl");
    let mut back = jsonl(&synth(
        &["--input-file", p.to_str().unwrap()],
        "ms-again.jsonl",
    ));
    // It has no schedule, so the export gave it the one `--fixed-schedule` needs: each first
    // turn at timestamp 0, each later turn at delay 0. Apart from that, the same dataset.
    for c in &mut back {
        for (i, t) in c["turns"].as_array_mut().unwrap().iter_mut().enumerate() {
            let t = t.as_object_mut().unwrap();
            let (has, hasnt) = if i == 0 {
                ("timestamp", "delay")
            } else {
                ("delay", "timestamp")
            };
            assert_eq!(t.remove(has), Some(serde_json::json!(0)), "turn {i}");
            assert!(t.get(hasnt).is_none());
        }
    }
    assert_eq!(back, src);
}

#[test]
fn openai_chat_multi_turn_bodies() {
    let tr = trace_file("t4");
    let conv = jsonl(&synth(&strs(&trace_args(&tr)), "o-src.jsonl"));
    let bodies = jsonl(&synth(
        &strs(&with(
            &trace_args(&tr),
            &["--format", "openai-chat", "--model", "qwen", "--stream"],
        )),
        "o.jsonl",
    ));
    assert_eq!(bodies.len(), 4, "one body per turn");
    let t = tok();
    let mut answers: HashMap<String, Vec<String>> = HashMap::new();
    let mut b = bodies.iter();
    for c in &conv {
        let turns = c["turns"].as_array().unwrap();
        for (i, turn) in turns.iter().enumerate() {
            let body = b.next().unwrap();
            assert_eq!(body["model"], "qwen");
            assert_eq!(body["stream"], true);
            assert_eq!(body["stream_options"]["include_usage"], true);
            assert_eq!(body["max_completion_tokens"], turn["max_tokens"]);
            let msgs = body["messages"].as_array().unwrap();
            assert_eq!(msgs.len(), 2 * i + 1);
            for (k, m) in msgs.iter().enumerate() {
                let role = if k % 2 == 0 { "user" } else { "assistant" };
                assert_eq!(m["role"], role, "roles alternate");
                let content = m["content"].as_str().unwrap();
                if k % 2 == 0 {
                    assert_eq!(content, turns[k / 2]["text"].as_str().unwrap());
                } else {
                    assert_eq!(
                        Some(t.encode(content).unwrap().len() as u64),
                        turns[k / 2]["max_tokens"].as_u64()
                    );
                    // Every later body repeats the same answer: the prefix stays cacheable.
                    let seen = answers
                        .entry(c["session_id"].as_str().unwrap().to_owned())
                        .or_default();
                    match seen.get(k / 2) {
                        Some(prev) => assert_eq!(prev, content),
                        None => seen.push(content.to_owned()),
                    }
                }
            }
        }
    }
    // Key order as AIPerf sends it.
    let raw = std::fs::read_to_string(scratch("o.jsonl")).unwrap();
    assert!(raw.lines().all(|l| l.starts_with("{\"messages\":")));
}

/// `--model` on every turn of every dataset type, as AIPerf 0.13.0's composer sets `Turn.model`
/// on each turn it finalizes (burst_gpt_trace and weka_trace against AIPerf's own output:
/// `agentic::agentic_trace_vectors_*`): `conversations` lines carry it per turn, `openai-chat`
/// bodies send it. Without `--model` nothing is invented in `conversations`.
#[test]
fn the_model_is_on_every_turn_of_every_dataset_type() {
    let traces = synth_common::read_json("traces.json");
    let write = |name: &str, lines: &Value| {
        let path = scratch(&format!("model-{name}.jsonl"));
        let text: String = lines
            .as_array()
            .unwrap()
            .iter()
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let mooncake = write("mooncake", &traces["cases"]["mooncake_multiturn"]["trace"]);
    let bailian = write("bailian", &traces["cases"]["bailian"]["trace"]);
    let inputs: Vec<(&str, Vec<&str>)> = vec![
        (
            "synthetic",
            vec!["--isl", "24", "--osl", "3", "--num-dataset-entries", "3"],
        ),
        (
            "synthetic-multiturn",
            vec![
                "--isl",
                "24",
                "--osl",
                "3",
                "--num-dataset-entries",
                "2",
                "--session-turns-mean",
                "3",
            ],
        ),
        ("mooncake", vec!["--input-file", &mooncake]),
        (
            "bailian",
            vec![
                "--input-file",
                &bailian,
                "--custom-dataset-type",
                "bailian_trace",
            ],
        ),
    ];
    for (name, args) in &inputs {
        let mut with_model = args.clone();
        with_model.extend(["--random-seed", "1", "--model", "my-model"]);
        let text = synth(&with_model, &format!("model-{name}-conv.jsonl"));
        let mut turns = 0;
        for line in text.lines() {
            let conv: Value = serde_json::from_str(line).unwrap();
            for t in conv["turns"].as_array().unwrap() {
                assert_eq!(t["model"], "my-model", "{name}: {t}");
                turns += 1;
            }
        }
        assert!(turns > 2, "{name}: {turns} turns");
        let mut chat = with_model.clone();
        chat.extend(["--format", "openai-chat"]);
        let bodies = synth(&chat, &format!("model-{name}-chat.jsonl"));
        assert_eq!(bodies.lines().count(), turns, "{name}");
        for line in bodies.lines() {
            let b: Value = serde_json::from_str(line).unwrap();
            assert_eq!(b["model"], "my-model", "{name}");
        }
        let mut without = args.clone();
        without.extend(["--random-seed", "1"]);
        let text = synth(&without, &format!("model-{name}-none.jsonl"));
        assert!(!text.contains("\"model\""), "{name}: {text:.200}");
    }
}
