//! Criterion micro-benchmarks of the pure pieces on the request path: the cache-bust rewrite per
//! target and body size, the marker, the SSE observer per event, the placeholder scan, and
//! placeholder expansion per corpus. `cargo bench --bench micro` (add a filter to run a part,
//! e.g. `cargo bench --bench micro -- rewrite/first_turn_prefix`).
// Run by hand: a failed expect is this tool's error report (Cargo.toml denies it in the library).
#![allow(clippy::expect_used)]
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use kvbust::api::Shape;
use kvbust::cachebust::{build_marker, parse, DigestInputs, Phase, Plan, Target};
use kvbust::metrics::Metrics;
use kvbust::proxy::observe::{Labels, Observer};
use kvbust::proxy::synthesize::{find_placeholders, Synthesizer};

/// A chat body of about `size` bytes: a system prompt, then user/assistant turns of prose with
/// escapes and non-ASCII, as multi-turn benchmark clients send them.
fn chat_body(size: usize) -> Vec<u8> {
    chat_body_ending(size, "")
}

/// [`chat_body`] whose last message ends with `tail` (e.g. a placeholder).
fn chat_body_ending(size: usize, tail: &str) -> Vec<u8> {
    let filler = "All the world's a stage, and all the men and women merely players; \u{e9}\u{1f600} \"quoted\"\n";
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a helpful assistant."})];
    let mut len = 200;
    let mut i = 0;
    while len < size {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let text = filler.repeat(((size - len) / filler.len()).clamp(1, 40));
        len += text.len() + 40;
        messages.push(serde_json::json!({"role": role, "content": text}));
        i += 1;
    }
    if let Some(serde_json::Value::String(last)) =
        messages.last_mut().and_then(|m| m.get_mut("content"))
    {
        last.push_str(tail);
    }
    serde_json::to_vec(&serde_json::json!({
        "model": "bench", "messages": messages, "stream": true, "max_tokens": 128, "temperature": 0.0,
    }))
    .expect("serialises")
}

const SIZES: [(usize, &str); 4] = [
    (1 << 10, "1KB"),
    (100 << 10, "100KB"),
    (1 << 20, "1MB"),
    (10 << 20, "10MB"),
];

fn inputs() -> DigestInputs {
    DigestInputs {
        benchmark_id: "0123456789ab".into(),
        recycle_pass: 0,
        trajectory_index: 0,
        trace_id: "session_000000".into(),
    }
}

fn rewrite(c: &mut Criterion) {
    let mut g = c.benchmark_group("rewrite");
    let targets = [
        Target::FirstTurnPrefix,
        Target::FirstTurnSuffix,
        Target::SystemPrefix,
        Target::SystemSuffix,
        Target::WarmupIsolationFirstTurn,
    ];
    for (size, label) in SIZES {
        let body = chat_body(size);
        g.throughput(Throughput::Bytes(body.len() as u64));
        if size >= 1 << 20 {
            g.sample_size(20);
        }
        for target in targets {
            let marker = build_marker(target, Phase::Warmup, &inputs()).expect("a marker");
            let plan = Plan::new(target, &marker);
            g.bench_with_input(
                BenchmarkId::new(target.as_str(), label),
                &body,
                |b, body| {
                    b.iter(|| {
                        let out = parse(Shape::Chat, black_box(body))
                            .expect("parses")
                            .apply(&plan)
                            .expect("applies");
                        black_box(out.body)
                    })
                },
            );
        }
        g.bench_with_input(
            BenchmarkId::new("placeholder_scan", label),
            &body,
            |b, body| b.iter(|| black_box(find_placeholders(black_box(body)).expect("scans"))),
        );
        // The same body with one placeholder in its last message: the scan's slow path.
        let with = chat_body_ending(size, " {{kvbust:prompt:16}}");
        g.bench_with_input(
            BenchmarkId::new("placeholder_scan_one", label),
            &with,
            |b, body| {
                b.iter(|| {
                    let found = find_placeholders(black_box(body)).expect("scans");
                    assert_eq!(found.len(), 1);
                    black_box(found)
                })
            },
        );
    }
    g.finish();
}

fn marker(c: &mut Criterion) {
    let inputs = inputs();
    c.bench_function("marker/first_turn_prefix", |b| {
        b.iter(|| {
            black_box(build_marker(
                Target::FirstTurnPrefix,
                Phase::Profiling,
                black_box(&inputs),
            ))
        })
    });
}

fn observer(c: &mut Criterion) {
    let metrics = Metrics::new();
    let labels = Labels {
        route: kvbust::api::Route::Api(Shape::Chat),
        phase: "profiling",
        target: "none",
    };
    let event = Bytes::from_static(
        b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"finish_reason\":null}]}\n\n",
    );
    let mut g = c.benchmark_group("observer");
    g.throughput(Throughput::Elements(1));
    g.bench_function("sse_event", |b| {
        let mut obs = Observer::new(
            metrics.clone(),
            labels,
            Instant::now(),
            Some("text/event-stream"),
            Some(1 << 20),
        );
        b.iter(|| obs.on_data(black_box(&event), Instant::now()))
    });
    g.finish();
}

fn placeholders(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut g = c.benchmark_group("placeholder_expand");
    g.sample_size(20);
    for corpus in ["sonnet", "random", "coding"] {
        let cfg = kvbust::config::SynthConfig {
            placeholder_seed: Some(0),
            ..Default::default()
        };
        let synth = Synthesizer::new(cfg, Target::None);
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{{{{kvbust:prompt:1024:{corpus}}}}}"}}]}}"#
        );
        // The first expansion builds the corpus; measure the steady state after it.
        rt.block_on(synth.expand(body.as_bytes())).expect("expands");
        g.bench_function(BenchmarkId::new(corpus, "1024 tokens"), |b| {
            b.iter(|| {
                black_box(
                    rt.block_on(synth.expand(black_box(body.as_bytes())))
                        .expect("expands"),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, rewrite, marker, observer, placeholders);
criterion_main!(benches);
