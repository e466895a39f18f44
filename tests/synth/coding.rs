//! `--prompt-corpus coding` against AIPerf 0.13.0 (`tests/fixtures/synth/coding.json`, made by
//! AIPerf's own composer and trace loader with the Qwen3 tokenizer): every synthetic case byte
//! for byte through `compose`; the mooncake-trace case's texts through the hash-id API
//! ([`CodingPrompts::hash_id_prompt`]), since the trace loader itself (sessions, timestamps) is
//! issue #9's. Also the pool's size and id hash for two seeds (printed by AIPerf), the placeholder
//! stream, and the clear error for a tokenizer that cannot encode the pool.

use crate::synth_common::{argv, compare, fixture, params_from_argv};

use std::sync::{Arc, OnceLock};

use kvbust::synth::corpus::aiperf_coding::{CodingPool, CodingPrompts};
use kvbust::synth::{compose, Dataset, PromptCorpus, PromptStream, RandomCorpusStyle, Tokenizer};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Parts of a case not checked here, with the reason.
const PENDING: &[(&str, &str)] = &[(
    "coding_mooncake_trace",
    "session ids, timestamps and the trace-file plumbing need the mooncake_trace loader \
     (issue #9, branch `traces`); its turn texts are checked through the hash-id API here",
)];

fn vectors() -> &'static Value {
    static V: OnceLock<Value> = OnceLock::new();
    V.get_or_init(|| crate::synth_common::read_json("coding.json"))
}

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::default_qwen3().expect("qwen3"))
}

/// Compares one synthetic case; returns the first difference.
fn check_case(name: &str) -> Result<(), String> {
    let case = &vectors()["cases"][name];
    let params = params_from_argv(&argv(case));
    assert_eq!(params.prompt_corpus, Some(PromptCorpus::Coding));
    let got: Dataset = compose(&params, tokenizer(), None, &mut |_, _| {})
        .map_err(|e| format!("{name}: error {e}"))?;
    compare(name, &got, &case["conversations"], |t| {
        t["text"].as_str().unwrap()
    })
}

#[test]
fn every_case_is_checked() {
    let names: Vec<&String> = vectors()["cases"].as_object().unwrap().keys().collect();
    assert_eq!(names.len(), 5);
    for (name, why) in PENDING {
        assert!(names.iter().any(|n| n == name), "{name}");
        eprintln!("{name}: partly pending: {why}");
    }
}

#[test]
fn isl256() {
    check_case("coding_isl256").unwrap();
}

#[test]
fn isl2048_seed42() {
    check_case("coding_isl2048_seed42").unwrap();
}

#[test]
fn mixed_stddev_turns_system_and_user_context() {
    check_case("coding_mix").unwrap();
}

#[test]
fn prefix_pool() {
    check_case("coding_prefix_pool").unwrap();
}

/// The trace file AIPerf read: one `json.dumps(line)` per line (Python's default separators).
fn trace_file_bytes(trace: &[Value]) -> String {
    trace
        .iter()
        .map(|l| {
            let ids: Vec<String> = l["hash_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(Value::to_string)
                .collect();
            format!(
                "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [{}]}}\n",
                l["timestamp"],
                l["input_length"],
                l["output_length"],
                ids.join(", ")
            )
        })
        .collect()
}

#[test]
fn mooncake_trace_texts_through_the_hash_id_api() {
    let case = &vectors()["cases"]["coding_mooncake_trace"];
    let seed: u64 = argv(case)[1].parse().unwrap();
    let trace = case["trace"].as_array().unwrap();
    // AIPerf scopes hash ids to the file: trace_id = sha256(file bytes)[:16].
    let trace_id = hex::encode(Sha256::digest(trace_file_bytes(trace).as_bytes()))[..16].to_owned();
    let pool = Arc::new(CodingPool::build(seed, tokenizer()).unwrap());
    let mut gen = CodingPrompts::new(pool, tokenizer());
    gen.set_trace_id(&trace_id);
    let convs = case["conversations"].as_array().unwrap();
    assert_eq!(convs.len(), trace.len());
    for (line, conv) in trace.iter().zip(convs) {
        let hash_ids: Vec<u64> = line["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let n = line["input_length"].as_u64().unwrap() as usize;
        // AIPerf's default --isl-block-size.
        let got = gen.hash_id_prompt(tokenizer(), n, &hash_ids, 512).unwrap();
        assert_eq!(got, conv["turns"][0]["text"].as_str().unwrap(), "{line}");
    }
}

#[test]
fn pool_matches_aiperf_for_two_seeds() {
    // len(_tool_pool) and sha256(json.dumps(_tool_pool)) printed by AIPerf 0.13.0's
    // CodingContentGenerator under rng.init(seed) with the Qwen3 tokenizer.
    for (seed, len, sha) in [
        (
            0u64,
            283_860usize,
            "d946e06b1fb120a2c6ff6e6461d4917f819c88b4f07149b5ecc71b6cdfb315f9",
        ),
        (
            42,
            276_439,
            "a793466afffca024407d8bb0df4cc71ffc976b6b50a6344b1abbc8aa86b012b0",
        ),
    ] {
        let pool = CodingPool::build(seed, tokenizer()).unwrap();
        assert_eq!(pool.len(), len, "seed {seed}");
        let ids: Vec<String> = pool.tokens().iter().map(u32::to_string).collect();
        let json = format!("[{}]", ids.join(", "));
        assert_eq!(
            hex::encode(Sha256::digest(json.as_bytes())),
            sha,
            "seed {seed}"
        );
    }
}

#[test]
fn placeholder_stream_draws_like_the_composer() {
    // The n-th placeholder prompt equals the n-th prompt AIPerf's generator makes for the seed:
    // the ISL-256 case has no length draws, so its bodies are the first eight windows.
    let case = &vectors()["cases"]["coding_isl256"];
    let mut stream = PromptStream::new(
        Arc::new(Tokenizer::default_qwen3().unwrap()),
        PromptCorpus::Coding,
        RandomCorpusStyle::Vllm,
        None,
        Some(0),
        kvbust::app::default_cache_dir().as_deref(),
    )
    .unwrap();
    for conv in case["conversations"].as_array().unwrap() {
        assert_eq!(
            stream.prompt(256).unwrap(),
            conv["turns"][0]["text"].as_str().unwrap()
        );
    }
}

#[test]
fn a_tokenizer_that_cannot_encode_the_pool_is_refused() {
    // A word-level vocabulary of a few words with an unknown token.
    let json = r#"{
      "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
      "normalizer": null,
      "pre_tokenizer": {"type": "Whitespace"},
      "post_processor": null, "decoder": null,
      "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "def": 1, "return": 2}, "unk_token": "[UNK]"}
    }"#;
    let tok = Tokenizer::from_bytes(json.as_bytes(), None).expect("tiny tokenizer loads");
    let err = CodingPool::build(1, &tok).expect_err("must be refused");
    let msg = err.to_string();
    assert!(msg.contains("cannot encode the coding corpus"), "{msg}");
    assert!(msg.contains("unknown token"), "{msg}");
}

#[test]
fn fast_pool_encoding_equals_the_tokenizer() {
    // The pool's shortcut encoder against the full `tokenizers` pipeline, for more seeds and
    // for Llama-3.2 (digit runs of up to three, a BOS it must not add).
    let llama = Tokenizer::from_path(&fixture("tokenizers/llama-3.2")).expect("llama");
    for tok in [tokenizer(), &llama] {
        for seed in [1u64, 7, 1234] {
            let text = kvbust::synth::corpus::aiperf_coding::pool_blocks(seed, 1.0)
                .unwrap()
                .join(kvbust::synth::corpus::aiperf_coding::SEPARATOR);
            assert_eq!(
                kvbust::synth::corpus::aiperf_coding::encode_large(tok, &text).unwrap(),
                tok.encode(&text).unwrap(),
                "seed {seed}"
            );
        }
    }
}

fn digest(s: Option<&str>) -> Value {
    s.map_or(Value::Null, |t| {
        Value::String(hex::encode(Sha256::digest(t.as_bytes())))
    })
}

#[test]
fn more_seeds_lengths_and_flags_match_aiperf() {
    // `coding_extra.json`: AIPerf 0.13.0's own composer, texts as sha256 (see its README row).
    let v = crate::synth_common::read_json("coding_extra.json");
    let llama = Tokenizer::from_path(&fixture("tokenizers/llama-3.2")).expect("llama");
    let cases = v["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 8);
    for (name, case) in cases {
        let tok = match case["tokenizer"].as_str().unwrap() {
            "qwen3" => tokenizer(),
            _ => &llama,
        };
        let params = params_from_argv(&argv(case));
        let got = compose(&params, tok, None, &mut |_, _| {}).unwrap();
        let want = case["conversations"].as_array().unwrap();
        assert_eq!(got.conversations.len(), want.len(), "{name}");
        for (c, (g, w)) in got.conversations.iter().zip(want).enumerate() {
            assert_eq!(g.session_id, w["session_id"].as_str().unwrap(), "{name}");
            assert_eq!(
                digest(g.system_message.as_deref()),
                w["system_message"],
                "{name} {c}"
            );
            assert_eq!(
                digest(g.user_context_message.as_deref()),
                w["user_context_message"],
                "{name} {c}"
            );
            let wt = w["turns"].as_array().unwrap();
            assert_eq!(g.turns.len(), wt.len(), "{name} {c}");
            for (t, (gt, wt)) in g.turns.iter().zip(wt).enumerate() {
                assert_eq!(
                    digest(Some(&gt.text)),
                    wt["text"],
                    "{name} conversation {c} turn {t}"
                );
                assert_eq!(gt.max_tokens, wt["max_tokens"].as_u64(), "{name} {c} {t}");
            }
        }
    }
}
