//! `kvbust synth` through `cli::synth::run`: a few prompts.json and bench_random.json cases
//! written as JSONL and compared line by line; the corpus id cache; actionable errors.

use std::path::PathBuf;

use crate::synth_common;
use crate::synth_common::Wrapper;
use clap::Parser;
use kvbust::cli::synth::{run, SynthArgs};
use kvbust::synth::SynthError;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/synth")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    synth_common::scratch("cli", name)
}

fn parse(argv: &[String]) -> SynthArgs {
    let mut full = vec!["synth".to_owned()];
    full.extend_from_slice(argv);
    Wrapper::try_parse_from(full).expect("flags parse").args
}

/// The synthesis flags of an AIPerf argv, with the tokenizer path mapped to ours.
fn synth_flags(argv: &[Value]) -> Vec<String> {
    const KEEP_WITH_VALUE: &[&str] = &[
        "--isl",
        "--isl-stddev",
        "--osl",
        "--osl-stddev",
        "--random-seed",
        "--num-dataset-entries",
        "--prompt-corpus",
        "--random-corpus-style",
        "--random-range-ratio",
        "--num-prefix-prompts",
        "--prefix-prompt-length",
        "--shared-system-prompt-length",
        "--user-context-prompt-length",
        "--session-turns-mean",
        "--cache-bust",
    ];
    let argv: Vec<&str> = argv.iter().map(|v| v.as_str().unwrap()).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let flag = argv[i];
        if KEEP_WITH_VALUE.contains(&flag) {
            out.push(flag.to_owned());
            out.push(argv[i + 1].to_owned());
            i += 2;
        } else if flag == "--tokenizer" {
            if argv[i + 1].ends_with("llama-3.2") {
                out.push("--tokenizer".into());
                out.push(fixture("tokenizers/llama-3.2").display().to_string());
            }
            i += 2;
        } else if flag == "--apply-chat-template" {
            out.push(flag.to_owned());
            i += 1;
        } else {
            i += 1;
        }
    }
    out
}

fn run_to_lines(mut argv: Vec<String>, out_name: &str) -> Vec<Value> {
    let out = scratch(out_name);
    argv.extend(["-o".into(), out.display().to_string()]);
    run(&parse(&argv)).expect("synth runs");
    std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn prompt_cases_through_the_cli() {
    let text = std::fs::read_to_string(fixture("prompts.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let cache = scratch("cache");
    for (k, name) in [
        "sonnet_sys32_ctx16_isl32_seed42_qwen3",
        "random_sglang_rr0.5_isl128_seed42_qwen3",
        "sonnet_multiturn3_isl32_seed42_qwen3",
        "sonnet_isl128_seed7_llama3.2",
    ]
    .into_iter()
    .enumerate()
    {
        let case = &v["cases"][name];
        let mut argv = synth_flags(case["argv"].as_array().unwrap());
        argv.extend(["--corpus-cache-dir".into(), cache.display().to_string()]);
        let lines = run_to_lines(argv, &format!("out{k}.jsonl"));
        let want = case["conversations"].as_array().unwrap();
        assert_eq!(lines.len(), want.len(), "{name}");
        for (g, w) in lines.iter().zip(want) {
            assert_eq!(g["session_id"], w["session_id"], "{name}");
            assert_eq!(g["system_message"], w["system_message"], "{name}");
            assert_eq!(
                g["user_context_message"], w["user_context_message"],
                "{name}"
            );
            let gt = g["turns"].as_array().unwrap();
            let wt = w["turns"].as_array().unwrap();
            assert_eq!(gt.len(), wt.len(), "{name}");
            for (a, b) in gt.iter().zip(wt) {
                assert_eq!(a["text"], b["texts"][0], "{name}");
                assert_eq!(a["max_tokens"], b["max_tokens"], "{name}");
            }
        }
    }
    // Qwen3 uses the shipped ids; the Llama corpus was tokenized once and cached. The random
    // case left the Qwen3 piece memo beside it.
    let mut cached: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    cached.sort();
    assert_eq!(cached.len(), 2, "{cached:?}");
    assert!(cached[0].starts_with("piece-memo-"), "{cached:?}");
    assert!(cached[1].starts_with("sonnet-ids-"), "{cached:?}");
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn openai_chat_format() {
    let argv: Vec<String> = [
        "--prompt-corpus",
        "random",
        "--isl",
        "16",
        "--osl",
        "8",
        "--random-seed",
        "1",
        "--num-dataset-entries",
        "2",
        "--session-turns-mean",
        "2",
        "--shared-system-prompt-length",
        "8",
        "--format",
        "openai-chat",
        "--model",
        "m",
    ]
    .map(String::from)
    .to_vec();
    let lines = run_to_lines(argv, "chat.jsonl");
    assert_eq!(lines.len(), 4);
    let raw = std::fs::read_to_string(scratch("chat.jsonl")).unwrap();
    let second = raw.lines().nth(1).unwrap();
    assert!(
        second.starts_with("{\"messages\":[{\"role\":\"system\""),
        "{second}"
    );
    assert!(second.contains("],\"model\":\"m\",\"stream\":false,\"max_completion_tokens\":8}"));
    // Turn 2 holds turn 1 and its answer: system, user, assistant, user.
    let msgs = lines[1]["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(lines[1]["max_completion_tokens"], 8);
}

#[test]
fn bench_compat_through_the_cli() {
    let text = std::fs::read_to_string(fixture("bench_random.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    for (k, name) in [
        "vllm-qwen3-s42-in128-rr0.5-p0-n10",
        "sglang-qwen3-s42-in128-rr0.5-n8",
    ]
    .into_iter()
    .enumerate()
    {
        let case = &v["cases"][name];
        let p = &case["params"];
        let argv: Vec<String> = vec![
            "--bench-compat".into(),
            case["tool"].as_str().unwrap().into(),
            "--seed".into(),
            p["seed"].to_string(),
            "--num-prompts".into(),
            p["num_prompts"].to_string(),
            "--random-input-len".into(),
            p["input_len"].to_string(),
            "--random-output-len".into(),
            p["output_len"].to_string(),
            "--random-range-ratio".into(),
            p["range_ratio"].to_string(),
        ];
        let lines = run_to_lines(argv, &format!("bench{k}.jsonl"));
        let want = case["requests"].as_array().unwrap();
        assert_eq!(lines.len(), want.len());
        for (g, w) in lines.iter().zip(want) {
            assert_eq!(g["prompt"], w["prompt"], "{name}");
            assert_eq!(g["prompt_len"], w["prompt_len"], "{name}");
            assert_eq!(g["expected_output_len"], w["expected_output_len"], "{name}");
        }
    }
}

fn error_of(argv: &[&str]) -> String {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let mut argv = argv;
    argv.extend(["-o".into(), scratch("err.jsonl").display().to_string()]);
    format!("{:#}", run(&parse(&argv)).expect_err("must fail"))
}

#[test]
fn impossible_combinations_say_what_to_change() {
    let e = error_of(&[
        "--prompt-corpus",
        "random",
        "--random-range-ratio",
        "0.5",
        "--isl",
        "10",
    ]);
    assert!(
        e.contains("--random-range-ratio needs both --isl and --osl"),
        "{e}"
    );
    let e = error_of(&[
        "--num-prefix-prompts",
        "2",
        "--shared-system-prompt-length",
        "8",
    ]);
    assert!(e.contains("drop one of them"), "{e}");
    let e = error_of(&["--cache-bust", "warmup_isolation_system"]);
    assert!(e.contains("--shared-system-prompt-length"), "{e}");
    let e = error_of(&["--random-input-len", "128"]);
    assert!(e.contains("--bench-compat"), "{e}");
    let e = error_of(&["--bench-compat", "vllm", "--isl", "128"]);
    assert!(e.contains("--random-input-len"), "{e}");
    let e = error_of(&["--tokenizer", "/nonexistent/tok"]);
    assert!(e.contains("never downloads"), "{e}");
    // Usage problems are typed, so the caller can choose the exit code.
    let argv: Vec<String> = ["--random-input-len", "1"].map(String::from).to_vec();
    let err = run(&parse(&argv)).unwrap_err();
    assert!(matches!(
        err.downcast_ref::<SynthError>(),
        Some(SynthError::InvalidParams(_))
    ));
    let e = error_of(&[
        "--random-corpus-style",
        "sglang",
        "--random-range-ratio",
        "{\"input\":0.1,\"output\":0.2}",
        "--isl",
        "10",
        "--osl",
        "10",
    ]);
    assert!(e.contains("single --random-range-ratio"), "{e}");
}

#[test]
fn flag_definitions_are_consistent() {
    use clap::CommandFactory;
    Wrapper::command().debug_assert();
    let args = parse(&[]);
    assert_eq!(args.num_dataset_entries, None);
    assert_eq!(args.prefix_prompt_length, 100);
    assert!(args.isl.is_none() && args.osl.is_none() && args.random_seed.is_none());
}

#[test]
fn params_from_configuration() {
    use kvbust::synth::{PromptCorpus, RangeRatio, SynthParams};
    let p: SynthParams = serde_json::from_str(
        r#"{"prompt_corpus": "random", "isl": 128, "osl": 16, "random_seed": 7,
            "range_ratio": {"input": 0.25, "output": 0.5}, "cache_bust": "first_turn_prefix"}"#,
    )
    .unwrap();
    assert_eq!(p.prompt_corpus, Some(PromptCorpus::Random));
    assert_eq!(p.entries(), 100);
    assert_eq!(
        p.range_ratio,
        Some(RangeRatio {
            input: 0.25,
            output: 0.5,
            per_direction: true
        })
    );
    let q: SynthParams = serde_json::from_str(r#"{"range_ratio": 0.5}"#).unwrap();
    assert_eq!(q.range_ratio.unwrap().output, 0.5);
    let r: SynthParams = serde_json::from_str(r#"{"range_ratio": "0.3"}"#).unwrap();
    assert_eq!(r.range_ratio.unwrap().input, 0.3);
    assert!(serde_json::from_str::<SynthParams>(r#"{"isl_mean": 3}"#).is_err());
    let back: SynthParams = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
}
