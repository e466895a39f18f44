//! Criterion throughput of the cache model's tokenizers, one core: `tokenizers` (HF, what synthesis
//! keeps) against the byte-level BPE encoder (`kvbust::synth::tokenizer::bpe`), for Qwen3 and
//! Llama 3.2, on prose (the sonnet corpus) and code (this crate's Rust source). Reports bytes per
//! second; the token counts it prints first turn that into tokens per second.
//! `cargo bench --bench tokenizer` (a filter runs a part: `-- qwen3/prose`).
// Run by hand: a failed expect is this tool's error report (Cargo.toml denies it in the library).
#![allow(clippy::expect_used)]
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use kvbust::synth::tokenizer::bpe::ByteLevelBpe;
use kvbust::synth::tokenizer::Tokenizer;

mod sources;
use sources::{root, rust_sources};

/// Bytes of each text (HF runs at ~1.5 MB/s here: a sample is a fraction of a second).
const TEXT_BYTES: usize = 256 << 10;

/// `text` cut to about `TEXT_BYTES`, at a character boundary.
fn cut(text: &str) -> String {
    let mut end = TEXT_BYTES.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn code() -> String {
    cut(&rust_sources(&[
        "src/proxy",
        "src/cache_model",
        "src/synth/tokenizer",
    ]))
}

fn load(path: &Path) -> Tokenizer {
    Tokenizer::from_path(path).expect("tokenizer")
}

fn bench(c: &mut Criterion) {
    let prose =
        cut(&std::fs::read_to_string(root().join("assets/shakespeare.txt")).expect("corpus"));
    let code = code();
    let tokenizers = [
        ("qwen3", load(&root().join("assets/tokenizers/qwen3"))),
        (
            "llama-3.2",
            load(&root().join("tests/fixtures/synth/tokenizers/llama-3.2")),
        ),
    ];
    for (name, tok) in &tokenizers {
        let bpe = ByteLevelBpe::new(tok).expect("a byte-level tokenizer");
        let mut group = c.benchmark_group(*name);
        group
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4));
        for (kind, text) in [("prose", &prose), ("code", &code)] {
            let ids = bpe.encode(text);
            assert_eq!(
                ids,
                tok.encode(text).expect("encodes"),
                "{name} {kind}: the same ids"
            );
            eprintln!(
                "{name}/{kind}: {} bytes, {} tokens ({:.2} bytes per token)",
                text.len(),
                ids.len(),
                text.len() as f64 / ids.len() as f64
            );
            group.throughput(Throughput::Bytes(text.len() as u64));
            group.bench_with_input(BenchmarkId::new("tokenizers", kind), text, |b, t| {
                b.iter(|| tok.encode(black_box(t)).expect("encodes"))
            });
            group.bench_with_input(BenchmarkId::new("byte_level_bpe", kind), text, |b, t| {
                b.iter(|| bpe.encode(black_box(t)))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
