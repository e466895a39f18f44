//! Shared by the modules of the synthesis test binary (`main.rs`): the fixture paths and scratch
//! folders, the JSON vector files, AIPerf's argv mapped onto [`SynthParams`] and the comparison
//! of a composed dataset with AIPerf's. Owns the test-side reading of the vectors; must never
//! compute an expected value.

use std::path::PathBuf;

use kvbust::cli::synth::SynthArgs;
use kvbust::synth::{CacheBustTarget, Dataset, PromptCorpus, RangeRatio, SynthParams};
use serde_json::Value;

/// AIPerf flags that do not change the synthetic dataset (they pick the server or tokenizer,
/// which the tests choose themselves).
const NOT_SYNTHESIS: &[&str] = &[
    "--endpoint-type",
    "--model",
    "--request-count",
    "--tokenizer",
    "--url",
    "--custom-dataset-type",
];

/// `kvbust synth`'s flags, parsed as the binary parses them (clap wants a command around them).
#[derive(clap::Parser)]
pub struct Wrapper {
    #[command(flatten)]
    pub args: SynthArgs,
}

/// `name` in this test's own scratch folder for the test area `area` (the folder exists; see
/// `common::test_dir`: no other test writes or removes it).
pub fn scratch(area: &str, name: &str) -> PathBuf {
    let dir = crate::common::test_dir().join(format!("synth-{area}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// As [`scratch`], a folder of its own, empty.
pub fn fresh_scratch(area: &str, name: &str) -> PathBuf {
    let dir = scratch(area, name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `tests/fixtures/synth/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/synth")
        .join(name)
}

/// A JSON vector file of `tests/fixtures/synth`.
pub fn read_json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A case's `argv`.
pub fn argv(case: &Value) -> Vec<String> {
    case["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}

/// Maps a case's AIPerf argv (with or without the leading `profile` subcommand) onto
/// [`SynthParams`]; a flag that is neither mapped nor listed in [`NOT_SYNTHESIS`] fails the test.
pub fn params_from_argv(argv: &[String]) -> SynthParams {
    let mut p = SynthParams::default();
    let argv = argv.strip_prefix(&["profile".to_owned()]).unwrap_or(argv);
    let mut args = argv.iter().map(String::as_str);
    while let Some(flag) = args.next() {
        if flag == "--apply-chat-template" {
            p.apply_chat_template = true;
            continue;
        }
        let val = args
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag {
            "--isl" => p.isl = Some(val.parse().unwrap()),
            "--isl-stddev" => p.isl_stddev = val.parse().unwrap(),
            "--osl" => p.osl = Some(val.parse().unwrap()),
            "--osl-stddev" => p.osl_stddev = val.parse().unwrap(),
            "--random-seed" => p.random_seed = Some(val.parse().unwrap()),
            "--num-dataset-entries" => p.num_dataset_entries = Some(val.parse().unwrap()),
            "--prompt-corpus" => p.prompt_corpus = Some(val.parse::<PromptCorpus>().unwrap()),
            "--random-corpus-style" => p.random_corpus_style = val.parse().unwrap(),
            "--random-range-ratio" => p.range_ratio = Some(val.parse::<RangeRatio>().unwrap()),
            "--num-prefix-prompts" => p.num_prefix_prompts = val.parse().unwrap(),
            "--prefix-prompt-length" => p.prefix_prompt_length = val.parse().unwrap(),
            "--shared-system-prompt-length" => {
                p.shared_system_prompt_length = Some(val.parse().unwrap())
            }
            "--user-context-prompt-length" => {
                p.user_context_prompt_length = Some(val.parse().unwrap())
            }
            "--system-prompt" => p.system_prompt = Some(val.to_owned()),
            "--session-turns-mean" => p.session_turns_mean = val.parse().unwrap(),
            "--session-turns-stddev" => p.session_turns_stddev = val.parse().unwrap(),
            "--cache-bust" => p.cache_bust = val.parse::<CacheBustTarget>().unwrap(),
            other if NOT_SYNTHESIS.contains(&other) => {}
            other => panic!("flag {other} is not mapped"),
        }
    }
    p
}

/// A JSON string or null.
pub fn opt_str(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

/// Compares a composed dataset with a case's `conversations`, the expected turn text taken by
/// `text_of` from each turn; returns a description of the first difference.
pub fn compare(
    name: &str,
    got: &Dataset,
    want: &Value,
    text_of: fn(&Value) -> &str,
) -> Result<(), String> {
    let want = want.as_array().expect("conversations");
    if got.conversations.len() != want.len() {
        return Err(format!(
            "{name}: {} conversations, want {}",
            got.conversations.len(),
            want.len()
        ));
    }
    for (c, (g, w)) in got.conversations.iter().zip(want).enumerate() {
        let ctx = format!("{name} conversation {c}");
        if g.session_id != w["session_id"].as_str().unwrap() {
            return Err(format!("{ctx}: session id {}", g.session_id));
        }
        if g.system_message != opt_str(&w["system_message"]) {
            return Err(format!(
                "{ctx}: system message {:?} want {:?}",
                g.system_message, w["system_message"]
            ));
        }
        if g.user_context_message != opt_str(&w["user_context_message"]) {
            return Err(format!(
                "{ctx}: user context {:?} want {:?}",
                g.user_context_message, w["user_context_message"]
            ));
        }
        let wt = w["turns"].as_array().expect("turns");
        if g.turns.len() != wt.len() {
            return Err(format!("{ctx}: {} turns want {}", g.turns.len(), wt.len()));
        }
        for (t, (gt, wt)) in g.turns.iter().zip(wt).enumerate() {
            let want_text = text_of(wt);
            if gt.text != want_text {
                return Err(format!(
                    "{ctx} turn {t}: text\n got {:?}\nwant {want_text:?}",
                    gt.text
                ));
            }
            if gt.max_tokens != wt["max_tokens"].as_u64() {
                return Err(format!(
                    "{ctx} turn {t}: max_tokens {:?} want {}",
                    gt.max_tokens, wt["max_tokens"]
                ));
            }
        }
    }
    Ok(())
}
