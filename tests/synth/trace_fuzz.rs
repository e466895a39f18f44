//! A deterministic mutation fuzzer over trace input (cargo-fuzz needs a nightly toolchain this
//! project does not use): valid mooncake, bailian, weka, tracelab and BurstGPT files, plain and
//! gzipped, mutated by seeded draws (byte flips, cuts, repeats, hostile numbers and tokens),
//! then detected, loaded as every type and, when small enough, built into a dataset. Each must
//! end in Ok or a typed error, never a panic. The run is bounded by its iteration count
//! (`KVBUST_TRACE_FUZZ_ITERS` per seed file and compression, default 40), never by a clock;
//! inputs it once broke on are replayed from tests/fixtures/synth/trace_fuzz.

use std::io::Write;
use std::path::{Path, PathBuf};

use kvbust::synth::corpus::PromptCorpus;
use kvbust::synth::dataset::trace::agentic::{self, tracelab};
use kvbust::synth::dataset::trace::burst;
use kvbust::synth::dataset::trace::input::TraceReader;
use kvbust::synth::dataset::trace::record::Input;
use kvbust::synth::dataset::trace::{build_from_params, detect_kind, TraceFile};
use kvbust::synth::dataset::trace_kind::TraceKind;
use kvbust::synth::{SynthParams, Tokenizer};
use rand::{Rng, SeedableRng};

use crate::synth_common::fresh_scratch;

const KINDS: [TraceKind; 5] = [
    TraceKind::MooncakeTrace,
    TraceKind::BailianTrace,
    TraceKind::WekaTrace,
    TraceKind::Tracelab,
    TraceKind::BurstGptTrace,
];

/// Datasets are built only from inputs asking for at most this many tokens in all (a mutation
/// may ask for millions, which is legal and slow, not a bug).
const BUILD_TOKENS: i64 = 200_000;

/// The seed files: (name, text).
fn seeds() -> Vec<(&'static str, String)> {
    let tl = |sid: &str, i: u32, at: &str| {
        serde_json::json!({"session_id": sid, "round_index": i, "provider": "claude",
            "user": "u", "project": "p", "model": "claude-sonnet-4-5",
            "input_tokens_total": 200 + 100 * i, "prefix_tokens": 150 * i,
            "newly_append_tokens": 50, "output_tokens": 20,
            "first_input_event_type": "tool_result",
            "timing_events": [{"event_type": "tool_result", "timestamp": format!("2025-11-03T09:00:{at}Z")},
                              {"event_type": "tool_call", "timestamp": format!("2025-11-03T09:00:{at}.900Z")}],
            "tools": [{"tool_name": "Agent", "emitted_at": format!("2025-11-03T09:00:{at}.950Z"),
                       "result_at": "2025-11-03T09:00:40Z", "tool_wall_latency_ms": 20000}]})
        .to_string()
    };
    vec![
        (
            "mooncake.jsonl",
            "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
             {\"timestamp\": 10, \"input_length\": 50, \"output_length\": 3, \"hash_ids\": [1, 3]}\n\
             {\"session_id\": \"s\", \"text_input\": \"hello\", \"delay\": 5}\n\
             {\"session_id\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n"
                .to_owned(),
        ),
        (
            "bailian.jsonl",
            "{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 1.5, \"input_length\": 30, \
             \"output_length\": 4, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [7, 8]}\n\
             {\"chat_id\": 2, \"parent_chat_id\": 1, \"timestamp\": 2.5, \"input_length\": 40, \
             \"output_length\": 4, \"type\": \"text\", \"turn\": 2, \"hash_ids\": [7, 8, 9]}\n"
                .to_owned(),
        ),
        (
            "weka.json",
            serde_json::json!({"id": "w", "models": ["m", "h"], "block_size": 32,
                "hash_id_scope": "local", "tool_tokens": 10, "system_tokens": 5,
                "requests": [
                    {"t": 0.0, "type": "n", "model": "m", "in": 80, "out": 9, "hash_ids": [1, 2, 3],
                     "input_types": ["text"], "stop": "tool_use", "api_time": 1.0},
                    {"t": 2.0, "type": "subagent", "agent_id": "a", "subagent_type": "Explore",
                     "status": "completed", "models": ["h"], "duration_ms": 3000,
                     "requests": [{"t": 2.5, "type": "s", "model": "h", "in": 40, "out": 4,
                                   "hash_ids": [9], "ttft": 0.1}]},
                    {"t": 6.0, "type": "n", "model": "m", "in": 120, "out": 7,
                     "hash_ids": [1, 2, 3, 4], "think_time": 0.5}]})
            .to_string(),
        ),
        (
            "tracelab.jsonl",
            [
                tl("claude:p", 0, "01"),
                tl("claude:p", 1, "05"),
                tl("claude:c", 0, "10"),
            ]
            .map(|l| l + "\n")
            .concat(),
        ),
        (
            "burst.csv",
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
             5,ChatGPT,472,18,490,Conversation log\n45,\"GPT-4, x\",1087,230,1317,API log\n"
                .to_owned(),
        ),
    ]
}

/// Replacements a mutation splices in: numbers at and past every bound, other JSON types.
const TOKENS: &[&str] = &[
    "4000000000",
    "10000001",
    "9999999",
    "-5",
    "0",
    "1e308",
    "-1e308",
    "9223372036854775808",
    "18446744073709551616",
    "1.5",
    "NaN",
    "null",
    "true",
    "\"\"",
    "[]",
    "{}",
    "[[[[[[[[",
    "\"\\ud800\"",
    ",",
    "\n",
    "\r",
    "\"2025-13-45T99:99:99Z\"",
];

fn mutate(rng: &mut rand_pcg::Pcg64, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let len = b.len().max(1);
        let at = rng.random_range(0..len).min(b.len());
        match rng.random_range(0..6) {
            0 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] ^= 1 << rng.random_range(0..8);
            }
            1 => {
                let end = (at + rng.random_range(0..16)).min(b.len());
                b.drain(at..end);
            }
            2 => {
                let end = (at + rng.random_range(1..64)).min(b.len());
                let piece = b[at..end].to_vec();
                for _ in 0..rng.random_range(1..50) {
                    b.splice(at..at, piece.iter().copied());
                }
            }
            3 | 4 => {
                // Replace the number or word at `at` with a hostile token.
                let end = b[at..]
                    .iter()
                    .position(|c| !c.is_ascii_alphanumeric() && !b"-+.".contains(c))
                    .map_or(b.len(), |k| at + k);
                let t = TOKENS[rng.random_range(0..TOKENS.len())];
                b.splice(at..end, t.bytes());
            }
            _ => {
                let t = TOKENS[rng.random_range(0..TOKENS.len())];
                b.splice(at..at, t.bytes());
            }
        }
    }
    b
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// The tokens a file of `kind` asks for, when its loader reads it (None: it does not).
fn asked_tokens(path: &Path, kind: TraceKind) -> Option<i64> {
    let sum = |it: &mut dyn Iterator<Item = i64>| it.fold(0i64, |a, n| a.saturating_add(n.max(0)));
    match kind {
        TraceKind::MooncakeTrace | TraceKind::BailianTrace => {
            let entries = TraceFile::read(path).ok()?.entries(kind).ok()?;
            Some(sum(&mut entries.iter().map(|e| {
                let input = match e.input {
                    Input::Length(n) => n,
                    _ => 0,
                };
                input.saturating_add(e.output_length.unwrap_or(0))
            })))
        }
        TraceKind::BurstGptTrace => {
            let entries = burst::entries(path, TraceReader::open(path).ok()?, None, false).ok()?;
            Some(sum(&mut entries.iter().map(|e| match e.input {
                Input::Length(n) => n.saturating_add(e.output_length.unwrap_or(0)),
                _ => 0,
            })))
        }
        TraceKind::WekaTrace | TraceKind::Tracelab => {
            let sources = match kind {
                TraceKind::WekaTrace => agentic::read_weka(path).ok()?,
                _ => tracelab::read(path, 64, false).ok()?,
            };
            let mut total = 0i64;
            for s in &sources {
                total = total
                    .saturating_add(s.trace.tool_tokens)
                    .saturating_add(s.trace.system_tokens);
                for e in &s.trace.requests {
                    let reqs: Vec<_> = match e {
                        agentic::schema::Entry::Request(r) => vec![r],
                        agentic::schema::Entry::Subagent(s) => s.requests.iter().collect(),
                    };
                    for r in reqs {
                        total = total
                            .saturating_add(r.input_length)
                            .saturating_add(r.output_length);
                    }
                }
            }
            Some(total)
        }
    }
}

/// Everything a trace file goes through: detection, every loader, and a build when the loader
/// of the detected type reads it and it asks for little.
fn exercise(path: &Path, tokenizer: &Tokenizer) {
    let detected = detect_kind(path, None).ok();
    for kind in KINDS {
        let tokens = asked_tokens(path, kind);
        if detected != Some(kind) || tokens.is_none_or(|t| t > BUILD_TOKENS) {
            continue;
        }
        let params = SynthParams {
            input_file: Some(path.to_path_buf()),
            random_seed: Some(1),
            prompt_corpus: Some(PromptCorpus::Sonnet),
            ..SynthParams::default()
        };
        let _ = build_from_params(&params, tokenizer, None);
    }
}

/// Runs `exercise` on `bytes` written to `path`; on a panic, keeps the input as a finding and
/// returns where.
fn check(path: &Path, bytes: &[u8], tokenizer: &Tokenizer, what: &str) -> Option<String> {
    std::fs::write(path, bytes).unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        exercise(path, tokenizer);
    }));
    outcome.is_err().then(|| {
        let keep = std::env::temp_dir().join(format!(
            "kvbust-fuzz-finding-{}-{}",
            what.replace([' ', '/'], "_"),
            path.file_name().unwrap().to_string_lossy()
        ));
        std::fs::write(&keep, bytes).unwrap();
        format!("{what}: input kept at {}", keep.display())
    })
}

// The knob of a long run (a test reads no other configuration), not a library input.
#[allow(clippy::disallowed_methods)]
fn iterations() -> u64 {
    std::env::var("KVBUST_TRACE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

#[test]
fn trace_loaders_survive_mutated_input() {
    let tokenizer = Tokenizer::default_qwen3().unwrap();
    let dir = fresh_scratch("trace_fuzz", "run");
    let iters = iterations();
    let mut found = Vec::new();
    for (k, (name, text)) in seeds().into_iter().enumerate() {
        for gz in [false, true] {
            let file = if gz {
                format!("{name}.gz")
            } else {
                name.to_owned()
            };
            let path = dir.join(&file);
            // The unmutated seed loads as its own type.
            let bytes = if gz {
                gzip(text.as_bytes())
            } else {
                text.clone().into_bytes()
            };
            found.extend(check(&path, &bytes, &tokenizer, &file));
            assert_eq!(detect_kind(&path, None).unwrap(), KINDS[k], "{file}");
            for i in 0..iters {
                let mut rng =
                    rand_pcg::Pcg64::seed_from_u64((k as u64) << 40 | u64::from(gz) << 32 | i);
                let m = mutate(&mut rng, text.as_bytes());
                let bytes = if gz { gzip(&m) } else { m };
                found.extend(check(
                    &path,
                    &bytes,
                    &tokenizer,
                    &format!("{file} iteration {i}"),
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the trace loaders panicked on:\n{}",
        found.join("\n")
    );
}

fn findings() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth/trace_fuzz")
}

#[test]
fn fuzz_findings_replay() {
    let tokenizer = Tokenizer::default_qwen3().unwrap();
    let dir = fresh_scratch("trace_fuzz", "replay");
    let mut n = 0;
    for entry in std::fs::read_dir(findings()).unwrap() {
        let src = entry.unwrap().path();
        if src.extension().is_some_and(|x| x == "md") {
            continue;
        }
        let path = dir.join(src.file_name().unwrap());
        let what = src.display().to_string();
        assert_eq!(
            check(&path, &std::fs::read(&src).unwrap(), &tokenizer, &what),
            None
        );
        n += 1;
    }
    assert!(n > 0, "no findings to replay in {}", findings().display());
}

/// The long run the issue asks for (10 minutes per type, plain and gzipped): ignored by default,
/// driven by `KVBUST_FUZZ_SECS` (seconds per type) and `KVBUST_FUZZ_KINDS` (comma-separated seed
/// file prefixes: mooncake, bailian, weka, tracelab, burst; default all). Mutations stack (a
/// mutated input is mutated again, up to 8 deep) from a base seed in `KVBUST_FUZZ_SEED` (default
/// the clock), printed so that a run can be repeated. The input under test is written to
/// `kvbust-fuzz-current-<file>` in the temp dir first, so an abort (out of memory, stack overflow)
/// leaves it behind; a panic keeps it as a finding, and an input taking over 10 s is reported.
/// Run: `KVBUST_FUZZ_SECS=600 cargo test --release --test synth trace_fuzz::long -- --ignored
/// --nocapture`.
#[test]
#[ignore = "long: run with KVBUST_FUZZ_SECS"]
#[allow(clippy::disallowed_methods)] // the knobs of a long run, not library input
fn long_trace_fuzz_run() {
    let env = |k: &str| std::env::var(k).ok();
    let secs: u64 = env("KVBUST_FUZZ_SECS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let base: u64 = env("KVBUST_FUZZ_SEED")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    let kinds = env("KVBUST_FUZZ_KINDS").unwrap_or_default();
    let tokenizer = Tokenizer::default_qwen3().unwrap();
    let dir = fresh_scratch("trace_fuzz", "long");
    let mut found = Vec::new();
    for (k, (name, text)) in seeds().into_iter().enumerate() {
        if !kinds.is_empty() && !kinds.split(',').any(|p| name.starts_with(p.trim())) {
            continue;
        }
        let (t0, mut i, mut slow) = (std::time::Instant::now(), 0u64, 0u64);
        let mut rng = rand_pcg::Pcg64::seed_from_u64(base ^ (k as u64) << 48);
        let mut current = text.clone().into_bytes();
        while t0.elapsed().as_secs() < secs {
            let gz = i % 2 == 1;
            // Back to the seed now and then, so the run does not drift into pure noise.
            if rng.random_range(0..8) == 0 || current.len() > 1 << 20 {
                current = text.clone().into_bytes();
            }
            current = mutate(&mut rng, &current);
            let file = if gz {
                format!("{name}.gz")
            } else {
                name.to_owned()
            };
            let bytes = if gz { gzip(&current) } else { current.clone() };
            let marker = std::env::temp_dir().join(format!("kvbust-fuzz-current-{file}"));
            std::fs::write(&marker, &bytes).unwrap();
            let one = std::time::Instant::now();
            found.extend(check(
                &dir.join(&file),
                &bytes,
                &tokenizer,
                &format!("{file} long {i}"),
            ));
            if one.elapsed().as_secs() >= 10 {
                slow += 1;
                let keep = std::env::temp_dir().join(format!("kvbust-fuzz-slow-{i}-{file}"));
                std::fs::write(&keep, &bytes).unwrap();
                found.push(format!(
                    "{file}: {:?} on the input kept at {}",
                    one.elapsed(),
                    keep.display()
                ));
            }
            i += 1;
        }
        println!("{name}: {i} inputs (plain and gzipped alternately) in {:?}, base seed {base}, {slow} slow", t0.elapsed());
    }
    assert!(found.is_empty(), "findings:\n{}", found.join("\n"));
}

/// Two captures as `kvbust trace merge` takes them (rows, then their metadata), the second
/// started a second after the first.
fn merge_seeds() -> [(String, String); 2] {
    let meta = |start: u64| {
        serde_json::json!({"format": "kvbust-capture", "version": 1, "start_unix_ms": start,
            "block_size": 4, "key": null, "chat_template": "none", "tokenizer": "builtin",
            "min_sessions_per_shared_block": 1, "rows": 3})
        .to_string()
    };
    [
        (
            "{\"session_id\": \"s0\", \"timestamp\": 0, \"input_length\": 8, \"output_length\": 2, \"hash_ids\": [0, 1]}\n\
             {\"session_id\": \"s0\", \"delay\": 40, \"input_length\": 12, \"output_length\": 2, \"hash_ids\": [0, 1, 2]}\n\
             {\"timestamp\": 90, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [3]}\n"
                .to_owned(),
            meta(1_000),
        ),
        (
            "{\"session_id\": \"s0\", \"timestamp\": 3, \"input_length\": 8, \"output_length\": 2, \"hash_ids\": [0, 1]}\n"
                .to_owned(),
            meta(2_000),
        ),
    ]
}

/// Merges `a` (mutated) with the second seed; Ok or an error, never a panic, and an Ok merge
/// keeps every row within the trace readers' time ceiling and leaves the inputs alone.
fn check_merge(dir: &Path, a: (&[u8], &[u8]), b: &(String, String), what: &str) -> Option<String> {
    let (pa, pb) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
    std::fs::write(&pa, a.0).unwrap();
    std::fs::write(dir.join("a.meta.json"), a.1).unwrap();
    std::fs::write(&pb, &b.0).unwrap();
    std::fs::write(dir.join("b.meta.json"), &b.1).unwrap();
    let out = dir.join("merged.jsonl");
    let _ = std::fs::remove_file(&out);
    let outcome =
        std::panic::catch_unwind(|| kvbust::capture::merge::merge(&[pa.clone(), pb.clone()], &out));
    let failed = match outcome {
        Err(_) => Some("panicked".to_string()),
        Ok(Err(_)) => None,
        Ok(Ok(m)) => {
            let rows: Vec<serde_json::Value> = std::fs::read_to_string(&out)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let late = rows
                .iter()
                .filter_map(|r| r["timestamp"].as_u64())
                .any(|t| t > 1_000_000_000_000);
            (rows.len() as u64 != m.rows || late).then(|| format!("{} rows, late {late}", m.rows))
        }
    };
    let left = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"));
    let failed = failed.or_else(|| left.then(|| "a temporary file was left".to_string()));
    failed.map(|why| {
        let keep = std::env::temp_dir().join(format!(
            "kvbust-fuzz-finding-merge-{}",
            what.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ));
        std::fs::write(&keep, a.0).unwrap();
        format!("{what}: {why}; input kept at {}", keep.display())
    })
}

/// Issue 42 (4): `kvbust trace merge` is fuzzed as the trace loaders are: its rows and its
/// metadata mutated by the same seeded draws.
#[test]
fn trace_merge_survives_mutated_input() {
    let dir = fresh_scratch("trace_fuzz", "merge");
    let [a, b] = merge_seeds();
    let mut found = Vec::new();
    found.extend(check_merge(
        &dir,
        (a.0.as_bytes(), a.1.as_bytes()),
        &b,
        "seed",
    ));
    assert!(found.is_empty(), "the seeds merge: {found:?}");
    assert!(dir.join("merged.jsonl").exists(), "the seeds merge");
    // Every number of the rows and the metadata in turn replaced by every hostile token.
    for (k, text) in [&a.0, &a.1].into_iter().enumerate() {
        let bytes = text.as_bytes();
        let mut at = 0;
        while let Some(start) = bytes[at..]
            .iter()
            .position(u8::is_ascii_digit)
            .map(|p| at + p)
        {
            let end = bytes[start..]
                .iter()
                .position(|c| !c.is_ascii_digit())
                .map_or(bytes.len(), |p| start + p);
            for t in TOKENS {
                let m = [&bytes[..start], t.as_bytes(), &bytes[end..]].concat();
                let (rows, meta) = if k == 0 {
                    (m, a.1.clone().into_bytes())
                } else {
                    (a.0.clone().into_bytes(), m)
                };
                let what = format!("number at {k}:{start} as {t}");
                found.extend(check_merge(&dir, (&rows, &meta), &b, &what));
            }
            at = end;
        }
    }
    for i in 0..iterations() * 4 {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(0x6d65_7267_6500 | i);
        let (rows, meta) = if i % 4 == 3 {
            (a.0.clone().into_bytes(), mutate(&mut rng, a.1.as_bytes()))
        } else {
            (mutate(&mut rng, a.0.as_bytes()), a.1.clone().into_bytes())
        };
        found.extend(check_merge(
            &dir,
            (&rows, &meta),
            &b,
            &format!("iteration {i}"),
        ));
    }
    assert!(
        found.is_empty(),
        "trace merge failed on:\n{}",
        found.join("\n")
    );
}
