//! Timing figures for the random corpus (`--prompt-corpus random`), composer against composer:
//! `cargo run --release --example synth_random_bench -- N STYLE OUT.jsonl [CACHE_DIR|-]` times
//! the tokenizer load apart from `build_dataset_with` at ISL 1024 / OSL 128, range ratio 0,
//! seed 42 (as `kvbust synth --prompt-corpus random --random-range-ratio 0 ...`), with the
//! corpus cache folder given (`-` or none: no cache, so the piece memo starts empty), and
//! writes each first-turn text as `{"text": ...}` per line to compare with AIPerf's. Then times placeholder-style
//! prompts (a `PromptStream`, one at a time) on a fresh tokenizer: cold, and after the piece
//! memo warm-up that placeholder lanes start in the background. Nothing is asserted.
// Run by hand: a failed expect is this tool's error report (Cargo.toml denies it in the library).
#![allow(clippy::expect_used)]

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use kvbust::synth::corpus::RandomPools;
use kvbust::synth::{
    build_dataset_with, PromptCorpus, PromptStream, RandomCorpusStyle, RangeRatio, SynthParams,
    Tokenizer,
};

/// This process's user + system CPU seconds (all threads), from `/proc/self/stat` (10 ms ticks
/// on Linux); `None` elsewhere.
fn cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn ms_per(n: usize, f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e3 / n as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(1000), |s| s.parse())?;
    let style: RandomCorpusStyle = args.next().unwrap_or_else(|| "vllm".into()).parse()?;
    let out = args.next();
    // A corpus cache folder (`-`: none): the piece memo is read from it, or written to it.
    let cache = args
        .next()
        .filter(|d| d != "-")
        .map(std::path::PathBuf::from);

    let (c0, t0) = (cpu_s(), Instant::now());
    let tok = Tokenizer::default_qwen3()?;
    let (c1, t1) = (cpu_s(), Instant::now());
    let params = SynthParams {
        prompt_corpus: Some(PromptCorpus::Random),
        random_corpus_style: style,
        isl: Some(1024),
        osl: Some(128),
        range_ratio: Some(RangeRatio {
            input: 0.0,
            output: 0.0,
            per_direction: false,
        }),
        random_seed: Some(42),
        num_dataset_entries: Some(n),
        ..SynthParams::default()
    };
    let dataset = build_dataset_with(&params, &tok, cache.as_deref(), &mut |_, _| {})?;
    let (c2, t2) = (cpu_s(), Instant::now());
    let d = |a: Option<f64>, b: Option<f64>| {
        a.zip(b)
            .map_or("null".to_string(), |(a, b)| format!("{:.2}", b - a))
    };
    println!(
        "{{\"n\":{n},\"style\":\"{style:?}\",\"tokenizer_load_cpu_s\":{},\"tokenizer_load_wall_s\":{:.3},\"composer_cpu_s\":{},\"composer_wall_s\":{:.3}}}",
        d(c0, c1),
        (t1 - t0).as_secs_f64(),
        d(c1, c2),
        (t2 - t1).as_secs_f64()
    );
    if let Some(path) = out {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        for c in &dataset.conversations {
            writeln!(f, "{}", serde_json::json!({ "text": c.turns[0].text }))?;
        }
    }

    // Placeholder-style prompts: one 1024-token prompt at a time, as a lane makes them.
    let fresh = Arc::new(Tokenizer::default_qwen3()?);
    let mut stream = PromptStream::new(
        fresh.clone(),
        PromptCorpus::Random,
        style,
        None,
        Some(0),
        kvbust::app::default_cache_dir().as_deref(),
    )?;
    let mut next = || {
        stream.prompt(1024).expect("a prompt");
    };
    let first = ms_per(1, &mut next);
    let cold = ms_per(200, &mut next);
    let t = Instant::now();
    RandomPools::new(&fresh, style).warm_piece_memo(&fresh)?;
    let warm_up = t.elapsed().as_secs_f64();
    let warm = ms_per(1000, &mut next);
    println!(
        "{{\"placeholder_first_ms\":{first:.3},\"placeholder_next_200_ms_each\":{cold:.3},\"memo_warm_up_wall_s\":{warm_up:.3},\"placeholder_warm_ms_each\":{warm:.3}}}"
    );
    Ok(())
}
