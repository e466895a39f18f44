//! Micro-benchmark of the cache-bust rewrite on a ~64 KB chat body: prints ns/op for parse,
//! parse+apply (several targets) and the first-user-turn hash. Run optimised:
//! `cargo run --release --example bench_inject` (or `CARGO_PROFILE_DEV_OPT_LEVEL=3 cargo run --example bench_inject`).

use std::hint::black_box;
use std::time::Instant;

use kvbust::cachebust::{build_marker, parse, DigestInputs, Phase, Plan, Shape, Target};

fn body(turns: usize, user_first_at_end: bool) -> Vec<u8> {
    let filler = "All the world's a stage, and all the men and women merely players; \u{e9}\u{1f600} \"quoted\"\n".repeat(20);
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": format!("You are a helpful assistant. {filler}")}),
    ];
    for i in 0..turns {
        let role = if user_first_at_end {
            "assistant"
        } else if i % 2 == 0 {
            "user"
        } else {
            "assistant"
        };
        messages.push(serde_json::json!({"role": role, "content": format!("turn {i}: {filler}")}));
    }
    if user_first_at_end {
        messages.push(serde_json::json!({"role": "user", "content": "the only user turn"}));
    }
    serde_json::to_vec(&serde_json::json!({
        "messages": messages, "model": "test-model", "stream": true,
        "max_completion_tokens": 128, "temperature": 1.0e-7, "seed": 123456789012345678901234567890u128 as f64,
    }))
    .unwrap()
}

fn time(label: &str, iters: u32, mut f: impl FnMut()) {
    for _ in 0..iters / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(iters);
    println!("{label:<48} {ns:>10.0} ns/op");
}

fn main() {
    let iters = 10_000;
    let inputs = DigestInputs {
        benchmark_id: "0123456789ab".into(),
        recycle_pass: 0,
        trajectory_index: 0,
        trace_id: "session_000000".into(),
    };
    for (name, b) in [
        ("typical (user turn early)", body(40, false)),
        ("worst (one user turn, last)", body(40, true)),
    ] {
        println!("body: {name}, {} bytes, {} messages", b.len(), 42);
        time("  parse", iters, || {
            black_box(parse(Shape::Chat, black_box(&b)).unwrap());
        });
        for target in [
            Target::FirstTurnPrefix,
            Target::SystemSuffix,
            Target::FirstTurnSuffix,
        ] {
            let marker = build_marker(target, Phase::Profiling, &inputs).unwrap();
            let plan = Plan::new(target, &marker);
            time(&format!("  parse + apply {target}"), iters, || {
                let out = parse(Shape::Chat, black_box(&b))
                    .unwrap()
                    .apply(&plan)
                    .unwrap();
                black_box(out.body.unwrap());
            });
        }
        let parsed = parse(Shape::Chat, &b).unwrap();
        time("  first_user_turn_hash (already parsed)", iters, || {
            black_box(parsed.first_user_turn_hash(0).unwrap());
        });
        time("  serde_json scan only (IgnoredAny)", iters, || {
            black_box(serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&b)).unwrap());
        });
        time("  serde_json &RawValue of the body", iters, || {
            black_box(
                serde_json::from_slice::<&serde_json::value::RawValue>(black_box(&b)).unwrap(),
            );
        });
        time("  Value round trip (reference only, lossy)", iters, || {
            let v: serde_json::Value = serde_json::from_slice(black_box(&b)).unwrap();
            black_box(serde_json::to_vec(&v).unwrap());
        });
        time("  memcpy of the body (floor)", iters, || {
            black_box(black_box(&b).to_vec());
        });
    }
}
