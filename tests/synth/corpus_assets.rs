//! The shipped precomputed sonnet ids (`assets/sonnet-qwen3-ids.bin`) must equal a fresh
//! tokenization of the shipped corpus with the shipped Qwen3 tokenizer. Set
//! `KVBUST_REGEN_ASSETS=1` to rewrite the asset instead (then run the tests again).
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use kvbust::synth::corpus::sonnet::SHAKESPEARE;
use kvbust::synth::{TokenCorpus, Tokenizer};

#[test]
fn shipped_qwen3_ids_match_a_fresh_build() {
    let tok = Tokenizer::default_qwen3().unwrap();
    let fresh = TokenCorpus::build(SHAKESPEARE, &tok).unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sonnet-qwen3-ids.bin");
    if std::env::var_os("KVBUST_REGEN_ASSETS").is_some() {
        std::fs::write(path, fresh.to_cache_bytes()).unwrap();
        return;
    }
    let shipped = TokenCorpus::shipped(SHAKESPEARE, &tok).expect("shipped ids parse");
    assert_eq!(shipped.tokens(), fresh.tokens());
    assert_eq!(shipped.joins(), fresh.joins());
    assert_eq!(shipped.joins().len(), 485);
    // The shipped file's bytes are exactly what the cache writer produces.
    assert_eq!(std::fs::read(path).unwrap(), fresh.to_cache_bytes());
}
