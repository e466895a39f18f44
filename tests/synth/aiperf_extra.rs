//! More AIPerf 0.13.0 parity beyond `prompts.json`: datasets made by AIPerf's own composer for
//! larger and mixed configurations (ISL up to 8192, 500 conversations, multi-turn with turn and
//! length stddevs, chat template + verbatim system prompt + cache-bust, prefix pools in both
//! corpora, sglang preseed, shared system + user context on the random corpus past the preseed
//! caches). `tests/fixtures/synth/aiperf_extra_qwen3.json` stores sha256 of every text.

use crate::synth_common::Wrapper;
use clap::Parser;
use kvbust::synth::corpus::sonnet::SHAKESPEARE;
use kvbust::synth::{compose, TokenCorpus, Tokenizer};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn digest(s: Option<&str>) -> Value {
    match s {
        Some(s) => Value::String(hex::encode(Sha256::digest(s.as_bytes()))),
        None => Value::Null,
    }
}

#[test]
fn aiperf_extra_datasets_match() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/synth/aiperf_extra_qwen3.json"
    ))
    .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let tok = Tokenizer::default_qwen3().unwrap();
    let sonnet = TokenCorpus::shipped(SHAKESPEARE, &tok).unwrap();
    let mut failures = Vec::new();
    let cases = v["cases"].as_object().unwrap();
    for (name, case) in cases {
        let mut argv = vec!["synth".to_owned()];
        let raw: Vec<&str> = case["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let mut i = 0;
        while i < raw.len() {
            if raw[i] == "--request-count" {
                i += 2;
                continue;
            }
            argv.push(raw[i].to_owned());
            i += 1;
        }
        let params = Wrapper::try_parse_from(&argv).unwrap().args.to_params();
        let started = std::time::Instant::now();
        let got = compose(&params, &tok, Some(&sonnet), &mut |_, _| {}).unwrap();
        // Printed for the record (`--nocapture`); the AIPerf figure was taken when the fixture
        // was made, on the same kind of machine.
        println!(
            "{name}: kvbust {:.3} s, AIPerf {} s",
            started.elapsed().as_secs_f64(),
            case["aiperf_seconds"]
        );
        let want = case["conversations"].as_array().unwrap();
        assert_eq!(got.conversations.len(), want.len(), "{name}");
        for (c, (g, w)) in got.conversations.iter().zip(want).enumerate() {
            let turns: Vec<Value> = g
                .turns
                .iter()
                .map(|t| serde_json::json!({"text": digest(Some(&t.text)), "max_tokens": t.max_tokens}))
                .collect();
            let mine = serde_json::json!({
                "session_id": g.session_id,
                "system_message": digest(g.system_message.as_deref()),
                "user_context_message": digest(g.user_context_message.as_deref()),
                "turns": turns,
            });
            if &mine != w {
                failures.push(format!("{name} conversation {c}"));
                break;
            }
        }
    }
    assert_eq!(cases.len(), 8);
    assert!(failures.is_empty(), "differ: {failures:?}");
}
