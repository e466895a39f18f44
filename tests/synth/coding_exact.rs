//! kvbust's own coding corpus (`coding-exact`): deterministic per seed and different across seeds, tokenized once,
//! every requested length token-exact, the category mix by block count, block variety, no
//! chat-template tokens, and `kvbust synth --prompt-corpus coding-exact` end to end.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::synth_common::Wrapper;
use clap::Parser;
use kvbust::cli::synth::run;
use kvbust::synth::corpus::kvbust_coding::{
    self as coding, Category, CodingCorpus, BLOCK_COUNT, TOKENIZE_GROUPS,
};
use kvbust::synth::{PromptCorpus, PromptStream, RandomCorpusStyle, Tokenizer};
use rand::{Rng, SeedableRng};
use serde_json::Value;

const SEED: u64 = 42;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::default_qwen3().expect("embedded tokenizer loads"))
}

/// The corpus for [`SEED`], built once per test binary.
fn corpus() -> &'static CodingCorpus {
    static C: OnceLock<CodingCorpus> = OnceLock::new();
    C.get_or_init(|| {
        let t0 = Instant::now();
        let c = CodingCorpus::build(SEED, tokenizer()).expect("corpus builds");
        eprintln!(
            "coding corpus: {} blocks, {} tokens, built in {:?}",
            c.blocks().len(),
            c.len(),
            t0.elapsed()
        );
        c
    })
}

fn texts(blocks: &[coding::Block]) -> Vec<&str> {
    blocks.iter().map(|b| b.text.as_str()).collect()
}

#[test]
fn same_seed_same_bytes_other_seed_other_corpus() {
    let a = coding::blocks(7);
    let b = coding::blocks(7);
    assert_eq!(a, b);
    assert_eq!(coding::corpus_text(&a), coding::corpus_text(&b));
    // The corpus built for SEED holds exactly the blocks generated for SEED, in the same order.
    assert_eq!(texts(corpus().blocks()), texts(&coding::blocks(SEED)));
    assert_eq!(corpus().seed(), SEED);

    let c = coding::blocks(8);
    assert_ne!(coding::corpus_text(&a), coding::corpus_text(&c));
    let in_a: HashSet<&str> = texts(&a).into_iter().collect();
    let shared = texts(&c).iter().filter(|t| in_a.contains(*t)).count();
    assert!(
        shared * 100 < c.len(),
        "{shared} of {} blocks of seed 8 also occur in seed 7",
        c.len()
    );
    // Block order is shuffled: the first blocks are not all of the first category.
    let head: HashSet<Category> = a[..50].iter().map(|b| b.category).collect();
    assert!(head.len() >= 4, "{head:?}");
}

#[test]
fn tokenized_once_over_the_joined_text() {
    let c = corpus();
    assert!(c.len() >= 1_000_000, "pool has {} tokens", c.len());
    assert_eq!(c.joins().len(), TOKENIZE_GROUPS - 1);
    // The first two groups, encoded as one text, equal the token array up to the second join:
    // group-wise encoding is the same as encoding the joined text once.
    let per_group = BLOCK_COUNT.div_ceil(TOKENIZE_GROUPS);
    let text = format!(
        "{}{}",
        coding::corpus_text(&c.blocks()[..2 * per_group]),
        coding::SEPARATOR
    );
    let ids = tokenizer().encode(&text).expect("encode");
    assert_eq!(ids.as_slice(), &c.tokens()[..c.joins()[1]]);
    // And the last group's text ends the array without a separator.
    let last = coding::corpus_text(&c.blocks()[(TOKENIZE_GROUPS - 1) * per_group..]);
    let ids = tokenizer().encode(&last).expect("encode");
    assert_eq!(
        ids.as_slice(),
        &c.tokens()[c.joins()[TOKENIZE_GROUPS - 2]..]
    );
}

#[test]
fn every_requested_length_is_token_exact() {
    let c = corpus();
    let t = tokenizer();
    let mut rng = rand_pcg::Pcg64::seed_from_u64(5);
    let mut lengths: Vec<usize> = (0..240).map(|_| rng.random_range(1..=4096)).collect();
    lengths.extend([1, 2, 3, 7, 64, 1024, 4095, 4096]);
    for &n in &lengths {
        let p = c.prompt(t, &mut rng, n).expect("prompt");
        assert_eq!(t.encode(&p).expect("encode").len(), n, "length {n}: {p:?}");
    }
    // Windows that wrap past the end of the pool, and starts right at group joins.
    let mut starts = vec![c.len() - 1, c.len() - 500, 0];
    starts.extend(c.joins().iter().take(8).map(|j| j - 3));
    for (i, &s) in starts.iter().enumerate() {
        let n = 300 + 97 * i;
        let p = c.prompt_at(t, s, n).expect("prompt");
        assert_eq!(t.encode(&p).expect("encode").len(), n, "start {s}");
        assert_eq!(p, c.prompt_at(t, s, n).expect("prompt"), "deterministic");
    }
    assert_eq!(c.prompt_at(t, 123, 0).expect("empty prompt"), "");
}

#[test]
fn category_mix_by_block_count_is_on_target() {
    let blocks = corpus().blocks();
    assert_eq!(blocks.len(), BLOCK_COUNT);
    let mut counts: HashMap<Category, usize> = HashMap::new();
    for b in blocks {
        *counts.entry(b.category).or_default() += 1;
    }
    let total: f64 = Category::ALL.iter().map(|c| c.share()).sum();
    assert!((total - 1.0).abs() < 1e-9);
    for c in Category::ALL {
        let got = counts.get(&c).copied().unwrap_or(0) as f64 / blocks.len() as f64;
        assert!(
            (got - c.share()).abs() <= 0.03,
            "{}: {:.1}% of blocks, target {:.1}%",
            c.as_str(),
            100.0 * got,
            100.0 * c.share()
        );
    }
    // The shares named by the issue.
    let want = [
        ("code", 0.28),
        ("ml", 0.11),
        ("shell", 0.20),
        ("json", 0.11),
        ("error", 0.09),
        ("sql", 0.03),
        ("other", 0.10),
        ("user_prompt", 0.08),
    ];
    for (c, (name, share)) in Category::ALL.iter().zip(want) {
        assert_eq!((c.as_str(), c.share()), (name, share));
    }
}

/// Lines of at least 30 characters that occur more than once in a window of `n` tokens.
fn repeated_line_fraction(text: &str) -> f64 {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.len() >= 30)
        .collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for l in &lines {
        *seen.entry(l).or_default() += 1;
    }
    let dup: usize = seen.values().filter(|&&v| v > 1).sum();
    dup as f64 / lines.len().max(1) as f64
}

#[test]
fn blocks_are_distinct_and_windows_do_not_repeat() {
    let c = corpus();
    let distinct = coding::distinct(c.blocks());
    eprintln!("{distinct} distinct blocks of {}", c.blocks().len());
    assert!(
        distinct * 100 >= c.blocks().len() * 99,
        "only {distinct} distinct blocks of {}",
        c.blocks().len()
    );
    // In 32k-token windows, few long lines occur twice (imports and boilerplate do).
    let t = tokenizer();
    let mut rng = rand_pcg::Pcg64::seed_from_u64(11);
    for _ in 0..4 {
        let start = rng.random_range(0..c.len());
        let text = t.decode(&c.window(start, 32_768).tokens).expect("decode");
        let f = repeated_line_fraction(&text);
        assert!(
            f < 0.2,
            "{:.1}% of long lines repeat in a 32k window",
            100.0 * f
        );
    }
}

#[test]
fn no_chat_template_tokens_in_the_corpus() {
    let added: Vec<String> = tokenizer()
        .inner()
        .get_added_tokens_decoder()
        .values()
        .map(|t| t.content.clone())
        .collect();
    assert!(added.iter().any(|t| t == "<|im_start|>"));
    for b in corpus().blocks() {
        for a in &added {
            assert!(!b.text.contains(a.as_str()), "{a} in {:?}", b.text);
        }
    }
}

fn scratch_dir() -> PathBuf {
    crate::common::test_dir()
}

fn scratch(name: &str) -> PathBuf {
    scratch_dir().join(name)
}

fn synth(argv: &[&str], out: &str) -> Vec<Value> {
    let out = scratch(out);
    let mut full = vec!["synth".to_owned()];
    full.extend(argv.iter().map(|s| s.to_string()));
    full.extend(["-o".into(), out.display().to_string()]);
    let args = Wrapper::try_parse_from(full).expect("flags parse").args;
    run(&args).expect("synth runs");
    std::fs::read_to_string(&out)
        .expect("output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

#[test]
fn synth_cli_prompt_corpus_coding_exact() {
    assert_eq!(
        "coding-exact".parse::<PromptCorpus>(),
        Ok(PromptCorpus::CodingExact)
    );
    assert_eq!(
        "coding_exact".parse::<PromptCorpus>(),
        Ok(PromptCorpus::CodingExact)
    );
    let e = "poetry"
        .parse::<PromptCorpus>()
        .expect_err("unknown corpus");
    assert!(e.contains("sonnet, random, coding or coding-exact"), "{e}");

    let cache = scratch("cache");
    let cache = cache.display().to_string();
    let argv = [
        "--prompt-corpus",
        "coding-exact",
        "--random-seed",
        "42",
        "--isl",
        "300",
        "--num-dataset-entries",
        "6",
        "--shared-system-prompt-length",
        "40",
        "--corpus-cache-dir",
        cache.as_str(),
    ];
    let first = synth(&argv, "a.jsonl");
    let t0 = Instant::now();
    let second = synth(&argv, "b.jsonl");
    eprintln!("second run (cached corpus) took {:?}", t0.elapsed());
    assert_eq!(
        first, second,
        "same seed, same dataset (built, then from the cache)"
    );
    let cached: Vec<String> = std::fs::read_dir(scratch("cache"))
        .expect("cache dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("coding-ids-v1-"))
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    assert_eq!(first.len(), 6);
    let t = tokenizer();
    let mut seen = HashSet::new();
    for conv in &first {
        let sys = conv["system_message"].as_str().expect("system prompt");
        assert_eq!(t.encode(sys).expect("encode").len(), 40);
        for turn in conv["turns"].as_array().expect("turns") {
            let text = turn["text"].as_str().expect("text");
            assert_eq!(t.encode(text).expect("encode").len(), 300, "{text:?}");
            assert!(seen.insert(text.to_owned()), "prompts differ");
        }
    }
    // Only this test's files: other tests of this module use the same scratch folder at once.
    for own in ["cache", "a.jsonl", "b.jsonl"] {
        let p = scratch(own);
        let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
    }
}

#[test]
fn prompt_stream_serves_the_coding_exact_corpus() {
    let tok = Arc::new(Tokenizer::default_qwen3().expect("tokenizer"));
    let corpus = Some(corpus().as_token_corpus().clone());
    let stream = |corpus| {
        PromptStream::new(
            tok.clone(),
            PromptCorpus::CodingExact,
            RandomCorpusStyle::Vllm,
            corpus,
            Some(3),
            kvbust::app::default_cache_dir().as_deref(),
        )
        .expect("stream")
    };
    let (mut a, mut b) = (stream(corpus.clone()), stream(corpus));
    let mut seen = HashSet::new();
    for n in [1, 17, 256, 1024, 3000] {
        let p = a.prompt(n).expect("prompt");
        assert_eq!(tok.encode(&p).expect("encode").len(), n);
        assert_eq!(p, b.prompt(n).expect("prompt"), "same seed, same prompts");
        assert!(seen.insert(p), "successive prompts differ");
    }
}

/// Figures for the report: run with `cargo test --test synth coding_exact:: -- --ignored --nocapture`.
#[test]
#[ignore]
fn report() {
    let t = tokenizer();
    let t0 = Instant::now();
    let c = CodingCorpus::build(SEED + 1, t).expect("corpus builds");
    let build = t0.elapsed();
    let dir = scratch_dir().join("report-cache");
    CodingCorpus::build_cached(SEED + 1, t, Some(&dir)).expect("cached build");
    let t0 = Instant::now();
    let cached = CodingCorpus::build_cached(SEED + 1, t, Some(&dir)).expect("cached build");
    eprintln!("build from the id cache: {:?}", t0.elapsed());
    assert_eq!(cached.tokens(), c.tokens());
    std::fs::remove_dir_all(&dir).expect("remove scratch files");
    let t0 = Instant::now();
    let blocks = coding::blocks(SEED + 2);
    let generate = t0.elapsed();
    let s = c.stats(t).expect("stats");
    eprintln!(
        "build {build:?} (block generation alone {generate:?} for {} blocks)",
        blocks.len()
    );
    eprintln!(
        "blocks {} distinct {} bytes {} tokens {}",
        s.blocks, s.distinct_blocks, s.bytes, s.tokens
    );
    let alone: usize = s.per_category.iter().map(|(_, _, t)| t).sum();
    for (cat, n, tok) in &s.per_category {
        eprintln!(
            "{:<12} blocks {:>5} ({:>5.1}%)  tokens {:>8} ({:>5.1}%)  avg {:>4.0}",
            cat.as_str(),
            n,
            100.0 * *n as f64 / s.blocks as f64,
            tok,
            100.0 * *tok as f64 / alone as f64,
            *tok as f64 / *n as f64
        );
    }
    let mut rng = rand_pcg::Pcg64::seed_from_u64(9);
    let mut worst: f64 = 0.0;
    let mut mean = 0.0;
    for _ in 0..20 {
        let start = rng.random_range(0..c.len());
        let f = repeated_line_fraction(&t.decode(&c.window(start, 32_768).tokens).expect("decode"));
        worst = worst.max(f);
        mean += f / 20.0;
    }
    eprintln!(
        "32k windows: repeated long lines mean {:.1}%, worst {:.1}%",
        100.0 * mean,
        100.0 * worst
    );
    let n = 300;
    let t0 = Instant::now();
    for _ in 0..n {
        c.prompt(t, &mut rng, 1024).expect("prompt");
    }
    eprintln!(
        "{:.0} prompts/s at 1024 tokens",
        n as f64 / t0.elapsed().as_secs_f64()
    );
    if let Ok(dir) = std::env::var("CODING_DUMP") {
        std::fs::write(format!("{dir}/corpus.txt"), coding::corpus_text(c.blocks())).expect("dump");
    }
}

/// A few blocks of each category, to read: `cargo test --test synth coding_exact:: -- --ignored
/// --nocapture dump_samples`.
#[test]
#[ignore]
fn dump_samples() {
    let blocks = coding::blocks(99);
    for c in Category::ALL {
        for b in blocks.iter().filter(|b| b.category == c).take(3) {
            println!("=== {c}\n{}", b.text);
        }
    }
}

/// An unseeded run samples at random from a fixed corpus, so the tokenized corpus is cached as
/// a seeded run's is: the second unseeded run reads it instead of rebuilding (5 s).
#[test]
fn unseeded_runs_cache_the_corpus_too() {
    let dir = scratch_dir().join("unseeded-cache");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let params = kvbust::synth::SynthParams {
        prompt_corpus: Some(PromptCorpus::CodingExact),
        isl: Some(24),
        num_dataset_entries: Some(2),
        random_seed: None,
        ..Default::default()
    };
    let cached = || -> Vec<(PathBuf, std::time::SystemTime)> {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with("coding-ids-v1-") && name.ends_with(".bin")
            })
            .map(|p| {
                let m = std::fs::metadata(&p).unwrap().modified().unwrap();
                (p, m)
            })
            .collect()
    };
    let first = kvbust::synth::build_dataset_with(&params, tokenizer(), Some(&dir), &mut |_, _| {})
        .expect("builds");
    let after_first = cached();
    assert_eq!(
        after_first.len(),
        1,
        "the corpus was cached: {after_first:?}"
    );
    let t0 = Instant::now();
    let second =
        kvbust::synth::build_dataset_with(&params, tokenizer(), Some(&dir), &mut |_, _| {})
            .expect("builds");
    eprintln!("second unseeded coding-exact build: {:?}", t0.elapsed());
    assert_eq!(
        cached(),
        after_first,
        "read from the cache, not written again"
    );
    // Still unseeded: each run samples its own prompts.
    assert_ne!(
        first.conversations[0].turns[0].text,
        second.conversations[0].turns[0].text
    );
}
