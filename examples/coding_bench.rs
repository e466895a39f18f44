//! Timing figures for AIPerf's coding corpus (`--prompt-corpus coding`), to set beside AIPerf's
//! own constructor and `generate`: `cargo run --release --example coding_bench [seed]`.
//! Prints the pool build cold (templates + tokenization, no cache) and warm (id cache), its
//! parts, and the time per ISL-1024 prompt. Nothing is asserted.
// Run by hand: a failed expect is this tool's error report (Cargo.toml denies it in the library).
#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use kvbust::synth::corpus::aiperf_coding::{self, CodingPool, CodingPrompts};
use kvbust::synth::corpus::kvbust_coding::CodingCorpus;
use kvbust::synth::Tokenizer;

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::INFINITY;
    let mut out = None;
    for _ in 0..runs {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(v);
    }
    (best, out.expect("at least one run"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seed: u64 = std::env::args().nth(1).map_or(Ok(42), |s| s.parse())?;
    if let Some(n) = std::env::args()
        .nth(2)
        .and_then(|s| s.parse::<usize>().ok())
    {
        // `coding_bench SEED N`: only the templates, N times (for a profiler).
        for _ in 0..n {
            aiperf_coding::pool_blocks(seed, 1.0)?;
        }
        return Ok(());
    }
    let tok = Tokenizer::default_qwen3()?;
    // Warm the tokenizer's lazy tables and the parsed template asset once.
    CodingPool::build(seed.wrapping_add(1), &tok)?;

    let (t_blocks, blocks) = best_of(5, || aiperf_coding::pool_blocks(seed, 1.0));
    let text = blocks?.join(aiperf_coding::SEPARATOR);
    let (t_encode, ids) = best_of(5, || aiperf_coding::encode_large(&tok, &text));
    let (t_cold, pool) = best_of(5, || CodingPool::build(seed, &tok));
    let pool = pool?;
    let dir = std::env::temp_dir().join(format!("kvbust-coding-bench-{}", std::process::id()));
    CodingPool::build_cached(seed, &tok, Some(&dir))?;
    let (t_warm, cached) = best_of(5, || CodingPool::build_cached(seed, &tok, Some(&dir)));
    assert_eq!(cached?.tokens(), pool.tokens());
    assert_eq!(ids?, pool.tokens());

    println!(
        "seed {seed}: {} blocks, {} bytes, {} tokens",
        blocks_len(seed)?,
        text.len(),
        pool.len()
    );
    println!(
        "  templates (790 blocks + shuffle): {:8.2} ms",
        t_blocks * 1e3
    );
    println!(
        "  tokenize (parallel line pieces): {:8.2} ms",
        t_encode * 1e3
    );
    println!("  pool build, cold (no cache):     {:8.2} ms", t_cold * 1e3);
    println!("  pool build, warm (id cache):     {:8.2} ms", t_warm * 1e3);

    // kvbust's own corpus, for the README's comparison.
    let (t_exact, exact) = best_of(3, || CodingCorpus::build(seed, &tok));
    let exact = exact?;
    CodingCorpus::build_cached(seed, &tok, Some(&dir))?;
    let (t_exact_warm, _) = best_of(3, || CodingCorpus::build_cached(seed, &tok, Some(&dir)));
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "  coding-exact ({} tokens): cold {:.2} ms, warm (id cache) {:.2} ms",
        exact.len(),
        t_exact * 1e3,
        t_exact_warm * 1e3
    );

    let mut gen = CodingPrompts::new(Arc::new(pool), &tok);
    let n = 20_000;
    let t = Instant::now();
    let mut bytes = 0;
    for _ in 0..n {
        bytes += gen.prompt(&tok, 1024, None)?.len();
    }
    let per = t.elapsed().as_secs_f64() / n as f64;
    println!(
        "  ISL-1024 prompt: {:.2} us each ({n} prompts, {} bytes on average)",
        per * 1e6,
        bytes / n
    );
    Ok(())
}

fn blocks_len(seed: u64) -> Result<usize, Box<dyn std::error::Error>> {
    Ok(aiperf_coding::pool_blocks(seed, 1.0)?.len())
}
