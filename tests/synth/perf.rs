//! Timing figures for synthesis (run on demand: `cargo test --test synth perf:: -- --ignored
//! --nocapture`). Nothing here is asserted; the figures are printed.

use std::time::Instant;

use kvbust::synth::corpus::sonnet::SHAKESPEARE;
use kvbust::synth::{compose, PromptCorpus, RangeRatio, SynthParams, TokenCorpus, Tokenizer};

#[test]
#[ignore = "timing run, prints figures"]
fn synthesis_timings() {
    let t = Instant::now();
    let tok = Tokenizer::default_qwen3().unwrap();
    println!(
        "tokenizer load (embedded Qwen3): {:.3} s",
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let corpus = TokenCorpus::build(SHAKESPEARE, &tok).unwrap();
    println!(
        "sonnet corpus tokenize ({} tokens, parallel): {:.3} s",
        corpus.len(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let shipped = TokenCorpus::shipped(SHAKESPEARE, &tok).unwrap();
    println!(
        "sonnet corpus from shipped ids: {:.3} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(shipped.tokens(), corpus.tokens());

    // The on-disk id cache, with a tokenizer that has no shipped ids (Llama-3.2, test fixture).
    let llama = Tokenizer::from_path(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/synth/tokenizers/llama-3.2"
    )))
    .unwrap();
    let dir = crate::common::test_dir();
    let t = Instant::now();
    TokenCorpus::build_cached(SHAKESPEARE, &llama, Some(&dir)).unwrap();
    println!(
        "llama corpus, first run (tokenize + write cache): {:.3} s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    TokenCorpus::build_cached(SHAKESPEARE, &llama, Some(&dir)).unwrap();
    println!(
        "llama corpus from id cache: {:.3} s",
        t.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);

    let t = Instant::now();
    let eligible = tok.boundary_flags().is_some();
    println!(
        "re-encode shortcut flags (eligible: {eligible}): {:.3} s",
        t.elapsed().as_secs_f64()
    );

    for corpus_kind in [PromptCorpus::Sonnet, PromptCorpus::Random] {
        for (isl, n) in [(128u64, 2000usize), (1024, 500), (8192, 60)] {
            let params = SynthParams {
                prompt_corpus: Some(corpus_kind),
                isl: Some(isl),
                osl: Some(128),
                random_seed: Some(42),
                num_dataset_entries: Some(n),
                range_ratio: (corpus_kind == PromptCorpus::Random).then_some(RangeRatio {
                    input: 0.0,
                    output: 0.0,
                    per_direction: false,
                }),
                ..SynthParams::default()
            };
            let t = Instant::now();
            let ds = compose(&params, &tok, Some(&corpus), &mut |_, _| {}).unwrap();
            let s = t.elapsed().as_secs_f64();
            println!(
                "{corpus_kind:?} ISL {isl}: {n} prompts in {s:.3} s = {:.1} prompts/s",
                ds.conversations.len() as f64 / s
            );
        }
    }
}

#[test]
#[ignore = "timing run, prints figures"]
fn where_sonnet_time_goes() {
    use kvbust::synth::tokenizer::reencode::reencode;
    let tok = Tokenizer::default_qwen3().unwrap();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("synth-corpus-cache");
    let corpus = TokenCorpus::build_cached(SHAKESPEARE, &tok, Some(&dir)).unwrap();
    tok.boundary_flags();
    let starts: Vec<usize> = (0..500)
        .map(|i| (i * 2297) % (corpus.len() - 2000))
        .collect();
    let t = Instant::now();
    let windows: Vec<_> = starts.iter().map(|&s| corpus.window(s, 1024)).collect();
    println!(
        "window copy: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / 500.0
    );
    let t = Instant::now();
    for w in &windows {
        std::hint::black_box(reencode(&tok, w).unwrap());
    }
    println!(
        "local re-encode: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / 500.0
    );
    let t = Instant::now();
    for w in &windows {
        std::hint::black_box(tok.decode(&w.tokens).unwrap());
    }
    println!("decode: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / 500.0);
    let t = Instant::now();
    for w in windows.iter().take(100) {
        std::hint::black_box(tok.encode(&tok.decode(&w.tokens).unwrap()).unwrap());
    }
    println!(
        "full decode+encode: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / 100.0
    );
}

#[test]
#[ignore = "timing run, prints figures"]
fn default_dataset_from_nothing() {
    // What `[synth]` defaults cost a cold process: load the shipped tokenizer, take the shipped
    // corpus ids, build 100 sonnet conversations at ISL 550 (seed 0).
    let t = Instant::now();
    let tok = Tokenizer::default_qwen3().unwrap();
    let params = SynthParams {
        random_seed: Some(0),
        ..SynthParams::default()
    };
    let ds = kvbust::synth::build_dataset_with(&params, &tok, None, &mut |_, _| {}).unwrap();
    println!(
        "default dataset ({} conversations, ISL 550) from nothing: {:.3} s",
        ds.conversations.len(),
        t.elapsed().as_secs_f64()
    );
}
