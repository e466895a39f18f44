//! Every case of `tests/fixtures/synth/prompts.json` (AIPerf 0.13.0's own composer) through the
//! library: texts byte-identical, `max_tokens`, system and user-context messages equal. Also the
//! corpus facts. Cases not run would be listed in `SKIPPED` with the reason.

use crate::synth_common::{argv, compare, fixture, params_from_argv};

use std::sync::OnceLock;

use kvbust::synth::corpus::sonnet::SHAKESPEARE;
use kvbust::synth::{compose, Dataset, PromptCorpus, TokenCorpus, Tokenizer};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Cases not run, with the reason.
const SKIPPED: &[(&str, &str)] = &[];

fn vectors() -> &'static Value {
    static V: OnceLock<Value> = OnceLock::new();
    V.get_or_init(|| crate::synth_common::read_json("prompts.json"))
}

struct Loaded {
    tokenizer: Tokenizer,
    sonnet: TokenCorpus,
}

fn load(name: &str) -> &'static Loaded {
    static QWEN: OnceLock<Loaded> = OnceLock::new();
    static LLAMA: OnceLock<Loaded> = OnceLock::new();
    let (cell, make): (&OnceLock<Loaded>, fn() -> Tokenizer) = match name {
        "qwen3" => (&QWEN, || Tokenizer::default_qwen3().expect("qwen3")),
        "llama3.2" => (&LLAMA, || {
            Tokenizer::from_path(&fixture("tokenizers/llama-3.2")).expect("llama")
        }),
        other => panic!("unknown tokenizer {other}"),
    };
    cell.get_or_init(|| {
        let tokenizer = make();
        let sonnet = TokenCorpus::build(SHAKESPEARE, &tokenizer).expect("corpus");
        Loaded { tokenizer, sonnet }
    })
}

/// Compares one case; returns a description of the first difference.
fn check_case(name: &str) -> Result<(), String> {
    let case = &vectors()["cases"][name];
    let argv = argv(case);
    let loaded = load(case["tokenizer"].as_str().unwrap());
    let params = params_from_argv(&argv);
    let got: Dataset = compose(
        &params,
        &loaded.tokenizer,
        Some(&loaded.sonnet),
        &mut |_, _| {},
    )
    .map_err(|e| format!("{name}: error {e}"))?;
    compare(name, &got, &case["conversations"], |t| {
        t["texts"][0].as_str().unwrap()
    })
}

fn case_names(filter: impl Fn(&str) -> bool) -> Vec<String> {
    vectors()["cases"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| !SKIPPED.iter().any(|(s, _)| s == k))
        .filter(|k| filter(k))
        .cloned()
        .collect()
}

fn run_cases(filter: impl Fn(&str) -> bool) {
    let names = case_names(filter);
    assert!(!names.is_empty());
    let failures: Vec<String> = names.iter().filter_map(|n| check_case(n).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

#[test]
fn every_case_is_run_or_listed_as_skipped() {
    let all = vectors()["cases"].as_object().unwrap().len();
    assert_eq!(all, 42);
    assert_eq!(case_names(|_| true).len() + SKIPPED.len(), all);
}

#[test]
fn sonnet_qwen3_cases() {
    run_cases(|n| n.starts_with("sonnet") && n.ends_with("qwen3"));
}

#[test]
fn sonnet_llama_cases() {
    run_cases(|n| n.starts_with("sonnet") && n.ends_with("llama3.2"));
}

#[test]
fn random_cases() {
    run_cases(|n| n.starts_with("random"));
}

#[test]
fn coding_cases() {
    run_cases(|n| n.starts_with("coding"));
}

fn corpus_facts(tok: &str) {
    let facts = &vectors()["corpus"]["per_tokenizer"][tok];
    let ids = load(tok).sonnet.tokens();
    assert_eq!(
        ids.len() as u64,
        facts["corpus_token_count"].as_u64().unwrap()
    );
    let joined = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    assert_eq!(
        hex::encode(Sha256::digest(joined.as_bytes())),
        facts["corpus_token_ids_sha256_of_comma_joined_decimal"]
            .as_str()
            .unwrap()
    );
    let t = &load(tok).tokenizer;
    assert_eq!(t.vocab_size() as u64, facts["vocab_size"].as_u64().unwrap());
    assert_eq!(
        t.num_special_tokens_to_add() as u64,
        facts["num_prompt_special_tokens"].as_u64().unwrap()
    );
    let mut got: Vec<u64> = t.all_special_ids().iter().map(|&x| u64::from(x)).collect();
    got.sort_unstable();
    let mut want: Vec<u64> = facts["all_special_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    want.sort_unstable();
    assert_eq!(got, want);
}

#[test]
fn corpus_facts_qwen3() {
    corpus_facts("qwen3");
}

#[test]
fn corpus_facts_llama() {
    corpus_facts("llama3.2");
}

#[test]
fn prompt_stream_continues_aiperf_generator() {
    // With seed 42 the first three prompts of 16 tokens are the bodies of the ISL-16 case.
    let tok = std::sync::Arc::new(Tokenizer::default_qwen3().unwrap());
    let sonnet = load("qwen3").sonnet.clone();
    let mut stream = kvbust::synth::PromptStream::new(
        tok,
        PromptCorpus::Sonnet,
        Default::default(),
        Some(sonnet),
        Some(42),
        kvbust::app::default_cache_dir().as_deref(),
    )
    .unwrap();
    let case = &vectors()["cases"]["sonnet_isl16_seed42_qwen3"]["conversations"];
    for c in 0..3 {
        assert_eq!(
            stream.prompt(16).unwrap(),
            case[c]["turns"][0]["texts"][0].as_str().unwrap()
        );
    }
    assert_eq!(stream.prompt(0).unwrap(), "");
}
