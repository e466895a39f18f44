//! Criterion: what the cache model's thread pays per token for a chat with the full template
//! (issue 41's Done-when): the body parsed as the engine parses it, rendered through Qwen3's
//! chat template, tokenized (the byte-level encoder, between the template's special tokens) and
//! hashed into 16-token blocks, as `cache_model`'s worker does before it looks at its index.
//! Two conversations with the same text: role/content only, and an agent's (`tools` of about
//! 30 KB of JSON schemas, assistant `tool_calls`, `tool` results). Each runs with a fresh memo
//! (every piece tokenized: the whole prompt's cost) and with the memo warm (the same history,
//! a new last user turn each request: what an agent's next turn costs). A third group is the
//! event consumer's share (`cache_model.kv_events`): one request's events as the engine sends
//! them (its blocks stored, under a salt, and as many removed), decoded and applied to the
//! model's map and index, per token of the stored run.
//!
//! Measured in CPU time of the benchmark's thread (`/proc/thread-self/schedstat`), not wall
//! time: the throughput criterion prints is tokens per CPU-second, and other processes on a
//! loaded machine do not stretch it.
//! `cargo bench --bench model_tokens` (a filter runs a part: `-- tools/cold`).
// Run by hand: a failed expect is this tool's error report (Cargo.toml denies it in the library).
#![allow(clippy::expect_used)]
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde_json::{json, Value};

use kvbust::api::Shape;
use kvbust::cache_model::events::{EventStats, Follow};
use kvbust::cache_model::index::{chain_salted, BlockIndex};
use kvbust::cache_model::tokens::{encode, IsoHint, Memo, Vocab};
use kvbust::mock::kv_events::{decode_batch, encode_batch, vllm_extra_keys, Batch, KvEvent};
use kvbust::mock::openai::parse_request;
use kvbust::synth::tokenizer::bpe::ByteLevelBpe;
use kvbust::synth::tokenizer::Tokenizer;

mod sources;
use sources::{root, rust_sources};

/// The model's default block size.
const BLOCK_SIZE: usize = 16;
/// The tool schemas' JSON, in bytes (issue 41: "30 KB of tool schemas").
const TOOLS_BYTES: usize = 30 << 10;
/// Tool calls and results before the last user turn.
const ROUNDS: usize = 6;

/// CPU time of the calling thread, in nanoseconds: the first field of
/// `/proc/thread-self/schedstat` (the scheduler's own account, to the nanosecond; no `unsafe`
/// `clock_gettime` needed). Criterion runs every routine on the thread that calls it.
struct ThreadCpu;

fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("Linux with schedstat")
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a CPU time")
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

/// Times as CPU time, throughput per CPU-second.
struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, ns: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = match ns {
            n if n < 1e3 => (1.0, "ns CPU"),
            n if n < 1e6 => (1e-3, "µs CPU"),
            n if n < 1e9 => (1e-6, "ms CPU"),
            _ => (1e-9, "s CPU"),
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }

    fn scale_throughputs(&self, ns: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let per = match *t {
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) | Throughput::Elements(n) => {
                n as f64
            }
        };
        let unit_is_bytes = !matches!(t, Throughput::Elements(_));
        let rate = per * 1e9 / ns;
        let (div, unit) = match (rate, unit_is_bytes) {
            (r, false) if r >= 1e6 => (1e6, "M tokens/CPU-s"),
            (_, false) => (1e3, "K tokens/CPU-s"),
            (r, true) if r >= 1e6 => (1e6, "MB/CPU-s"),
            (_, true) => (1e3, "KB/CPU-s"),
        };
        values.iter_mut().for_each(|v| *v = per * 1e9 / *v / div);
        unit
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns CPU"
    }
}

const VERBS: [&str; 8] = [
    "search", "read", "edit", "list", "run", "create", "delete", "inspect",
];
const NOUNS: [&str; 6] = ["files", "symbols", "tests", "issues", "branches", "logs"];

/// One tool as an agent declares it: a function with a description and a JSON schema of
/// typed, described parameters (an enum, bounds, a nested array), about 1.3 KB.
fn tool(i: usize) -> Value {
    let name = format!("{}_{}_{i}", VERBS[i % VERBS.len()], NOUNS[i % NOUNS.len()]);
    json!({
        "type": "function",
        "function": {
            "name": name,
            "description": format!(
                "Tool {i}: {} {} in the workspace. Use it when the task needs the current state of the \
                 repository rather than what was read earlier; results are truncated to max_results \
                 entries and paths are relative to the workspace root.",
                VERBS[i % VERBS.len()], NOUNS[i % NOUNS.len()]
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "A file or folder, relative to the workspace root (e.g. src/cache_model/mod.rs)."},
                    "pattern": {"type": "string", "description": "A regular expression in Rust's regex syntax; matched against each line."},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many entries are returned."},
                    "mode": {"type": "string", "enum": ["fast", "full", "incremental"], "description": "How thoroughly to look: fast reads only the index."},
                    "include_hidden": {"type": "boolean", "description": "Whether dot-files and ignored paths are included."},
                    "context": {"type": "array", "items": {"type": "string"}, "description": "Extra paths whose contents may inform the result."}
                },
                "required": ["path"]
            }
        }
    })
}

/// Tools until their JSON passes `TOOLS_BYTES`.
fn tools() -> Vec<Value> {
    let mut tools = Vec::new();
    while serde_json::to_vec(&tools).expect("serialises").len() < TOOLS_BYTES {
        tools.push(tool(tools.len()));
    }
    tools
}

/// Text a tool returns: this crate's source, `n` bytes from `at`, at character boundaries.
fn output(source: &str, at: usize, n: usize) -> String {
    let mut start = at % (source.len() - n);
    while !source.is_char_boundary(start) {
        start += 1;
    }
    let mut end = start + n;
    while !source.is_char_boundary(end) {
        end += 1;
    }
    source[start..end].to_string()
}

/// The conversation's messages before its last user turn. With `agent`, the calls are
/// `tool_calls` and the results `tool` messages; without, the same text as role/content.
fn history(source: &str, agent: bool) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful coding agent working in a Rust repository. Read before you edit, keep changes small, run the tests after each change and report what you changed and why."}),
        json!({"role": "user", "content": "The cache model reports divergent requests when the engine evicts blocks. Find where stored blocks are matched to the model's own, and explain what happens to a block whose first tokens carry a cache salt."}),
    ];
    for r in 0..ROUNDS {
        let name = format!("{}_{}_{r}", VERBS[r % VERBS.len()], NOUNS[r % NOUNS.len()]);
        let args = json!({"path": format!("src/cache_model/part_{r}.rs"), "pattern": "fn (stored|apply)", "max_results": 20 + r});
        let thought = format!("Step {r}: looking at the next part of the model.");
        let result = output(source, r * 7919, 2048);
        if agent {
            messages.push(
                json!({"role": "assistant", "content": thought, "tool_calls": [{
                    "id": format!("call_{r}"), "type": "function",
                    "function": {"name": name, "arguments": args.to_string()}
                }]}),
            );
            messages.push(
                json!({"role": "tool", "tool_call_id": format!("call_{r}"), "content": result}),
            );
        } else {
            messages
                .push(json!({"role": "assistant", "content": format!("{thought}\n{name} {args}")}));
            messages.push(json!({"role": "user", "content": result}));
        }
    }
    messages
}

/// The `n`th request's body: the history, then a last user turn of its own.
fn body(history: &[Value], tools: Option<&[Value]>, n: u64) -> Vec<u8> {
    let mut messages = history.to_vec();
    messages.push(json!({"role": "user", "content": format!("Request {n}: go on with the next step, and say which test covers it.")}));
    let mut body = json!({"model": "Qwen/Qwen3-0.6B", "messages": messages, "max_tokens": 64});
    if let Some(t) = tools {
        body["tools"] = json!(t);
    }
    serde_json::to_vec(&body).expect("serialises")
}

/// What the model's worker does with a body before its index: parse, render, tokenize, hash.
/// Returns the prompt's tokens.
fn model(vocab: &Vocab, memo: &mut Memo, body: &[u8]) -> usize {
    let req = parse_request(Shape::Chat, body, "").expect("parses");
    let encoded = encode(vocab, memo, &req.prompt, &IsoHint::None).expect("encodes");
    let hashes = chain_salted(&encoded.ids, BLOCK_SIZE, req.cache_salt.as_deref());
    black_box(hashes);
    encoded.ids.len()
}

fn source() -> String {
    rust_sources(&["src/cache_model", "src/mock"])
}

fn bench(c: &mut Criterion<ThreadCpu>) {
    let tokenizer = Tokenizer::from_path(&root().join("assets/tokenizers/qwen3")).expect("Qwen3");
    // Built now, so the vocabulary uses it from the first request (the model builds it on a
    // thread of its own and counts with `tokenizers` until then).
    ByteLevelBpe::shared(&tokenizer).expect("Qwen3 is byte-level");
    let vocab = Vocab::hf(Arc::new(tokenizer), true).expect("Qwen3's template");
    assert!(vocab.is_fast());
    let source = source();
    let tools = tools();
    let tools_bytes = serde_json::to_vec(&tools).expect("serialises").len();
    let mut group = c.benchmark_group("model_tokens");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for (name, agent) in [("plain", false), ("tools", true)] {
        let history = history(&source, agent);
        let tools = agent.then_some(tools.as_slice());
        let first = body(&history, tools, 0);
        let tokens = model(&vocab, &mut Memo::new(usize::MAX), &first);
        eprintln!(
            "{name}: {} bytes of body{}, {tokens} tokens",
            first.len(),
            if agent {
                format!(
                    " ({} tools, {tools_bytes} bytes of them)",
                    tools.map_or(0, <[_]>::len)
                )
            } else {
                String::new()
            }
        );
        group.throughput(Throughput::Elements(tokens as u64));
        let mut n = 0u64;
        group.bench_function(format!("{name}/cold"), |b| {
            b.iter_batched(
                || {
                    n += 1;
                    (body(&history, tools, n), Memo::new(usize::MAX))
                },
                |(body, mut memo)| model(&vocab, &mut memo, &body),
                BatchSize::SmallInput,
            )
        });
        let mut memo = Memo::new(usize::MAX);
        group.bench_function(format!("{name}/warm"), |b| {
            b.iter_batched(
                || {
                    n += 1;
                    body(&history, tools, n)
                },
                |body| model(&vocab, &mut memo, &body),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
    events(c, &vocab, &source);
}

/// The consumer's work for one request of the plain conversation: its blocks stored from the
/// prompt's start under a salt (so the first block's hash takes the salt from `extra_keys`)
/// and as many removed (a full engine evicts what it stores, one event per block), as one
/// batch's bytes.
fn events(c: &mut Criterion<ThreadCpu>, vocab: &Vocab, source: &str) {
    let req =
        parse_request(Shape::Chat, &body(&history(source, false), None, 0), "").expect("parses");
    let ids = encode(
        vocab,
        &mut Memo::new(usize::MAX),
        &req.prompt,
        &IsoHint::None,
    )
    .expect("encodes")
    .ids;
    let salt = Some("kvbust-0123456789ab");
    let hashes = chain_salted(&ids, BLOCK_SIZE, salt);
    let stored = hashes.len() * BLOCK_SIZE;
    // One `BlockRemoved` per block, as vLLM's `BlockPool._emit_block_removed_events` (and the
    // mock) send them.
    let mut events = vec![KvEvent::Stored {
        block_hashes: hashes.clone(),
        parent: None,
        token_ids: ids[..stored].to_vec(),
        block_size: BLOCK_SIZE as u32,
        medium: Some("GPU".into()),
        lora_name: None,
        extra_keys: vllm_extra_keys(salt, 0, hashes.len()),
    }];
    events.extend(hashes.iter().map(|h| KvEvent::Removed {
        block_hashes: vec![*h],
        medium: Some("GPU".into()),
    }));
    let payload = encode_batch(&Batch {
        ts: 0.0,
        events,
        data_parallel_rank: Some(0),
    });
    eprintln!(
        "events: {} blocks stored and removed, {} bytes of batch",
        hashes.len(),
        payload.len()
    );
    let mut index = BlockIndex::new(
        BLOCK_SIZE,
        std::num::NonZeroUsize::new(1 << 20).expect("non-zero"),
    );
    let (mut follow, stats) = (Follow::default(), EventStats::default());
    let mut group = c.benchmark_group("kv_events");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(stored as u64));
    // The decode alone runs on the subscription's task, the rest on the model's thread.
    group.bench_function("decode", |b| {
        b.iter(|| decode_batch(black_box(&payload)).expect("decodes"))
    });
    group.bench_function("decode_and_apply", |b| {
        b.iter(|| {
            let batch = decode_batch(black_box(&payload)).expect("decodes");
            follow.apply(&mut index, batch.events, &stats);
        })
    });
    group.finish();
}

fn cpu() -> Criterion<ThreadCpu> {
    Criterion::default().with_measurement(ThreadCpu)
}

criterion_group! {
    name = benches;
    config = cpu();
    targets = bench
}
criterion_main!(benches);
