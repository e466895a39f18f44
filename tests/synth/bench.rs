//! Cross-tool parity: every case of `tests/fixtures/synth/bench_random.json` (vLLM 0.33.0
//! `random`, SGLang 0.5.23 `random-ids`, real tokenizers): prompt text, `prompt_len` and
//! expected output length equal.

use std::path::PathBuf;
use std::sync::OnceLock;

use kvbust::synth::bench::{bench_requests, BenchParams, BenchTool};
use kvbust::synth::{RangeRatio, Tokenizer};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/synth")
        .join(name)
}

fn tokenizer(path: &str) -> &'static Tokenizer {
    static QWEN: OnceLock<Tokenizer> = OnceLock::new();
    static LLAMA: OnceLock<Tokenizer> = OnceLock::new();
    if path.ends_with("qwen3") {
        QWEN.get_or_init(|| Tokenizer::default_qwen3().unwrap())
    } else if path.ends_with("llama-3.2") {
        LLAMA.get_or_init(|| Tokenizer::from_path(&fixture("tokenizers/llama-3.2")).unwrap())
    } else {
        panic!("unknown tokenizer {path}")
    }
}

fn check(name: &str, case: &Value) -> Result<(), String> {
    let p = &case["params"];
    let tool: BenchTool = case["tool"].as_str().unwrap().parse().unwrap();
    let ratio: RangeRatio = match p.get("range_ratio_cli").and_then(Value::as_str) {
        Some(cli) => cli.parse().unwrap(),
        None => p["range_ratio"].to_string().parse().unwrap(),
    };
    let params = BenchParams {
        tool,
        seed: p["seed"].as_u64().unwrap(),
        num_prompts: p["num_prompts"].as_u64().unwrap() as usize,
        input_len: p["input_len"].as_u64().unwrap(),
        output_len: p["output_len"].as_u64().unwrap(),
        range_ratio: ratio,
        prefix_len: p.get("prefix_len").and_then(Value::as_u64).unwrap_or(0) as usize,
    };
    let tok = tokenizer(case["tokenizer"].as_str().unwrap());
    let got = bench_requests(&params, tok).map_err(|e| format!("{name}: {e}"))?;
    let want = case["requests"].as_array().unwrap();
    if got.len() != want.len() {
        return Err(format!(
            "{name}: {} requests want {}",
            got.len(),
            want.len()
        ));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.prompt != w["prompt"].as_str().unwrap() {
            return Err(format!("{name} request {i}: prompt differs"));
        }
        if g.prompt_len as u64 != w["prompt_len"].as_u64().unwrap() {
            return Err(format!(
                "{name} request {i}: prompt_len {} want {}",
                g.prompt_len, w["prompt_len"]
            ));
        }
        if g.expected_output_len != w["expected_output_len"].as_u64().unwrap() {
            return Err(format!(
                "{name} request {i}: output len {}",
                g.expected_output_len
            ));
        }
    }
    Ok(())
}

#[test]
fn every_bench_random_case() {
    let text = std::fs::read_to_string(fixture("bench_random.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let cases = v["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 17);
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(n, c)| check(n, c).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of 17 differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
