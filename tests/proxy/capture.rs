//! Capture (`[capture]`) through the running proxy and the built-in mock: rows in forwarding
//! order with the workload's lengths (before kvbust's marker), sessions split into turns,
//! failures left out and counted, no byte of a prompt in any file, rare blocks split per
//! session, and `kvbust trace merge` across replicas with one key (refused with two).

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};

use crate::common::{self, body_bytes, h1, post, send, Harness};
use kvbust::cachebust::Target;
use kvbust::config::{Config, SessionSource};
use kvbust::mock::tokenize::builtin_encode;

fn fresh_dir(name: &str) -> PathBuf {
    let d = common::test_dir().join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Capture on, into `dir`, blocks of 4 built-in tokens, sessions from `x-correlation-id` only.
fn capturing(c: &mut Config, dir: &Path) {
    c.capture.enabled = true;
    c.capture.dir = dir.to_path_buf();
    c.capture.block_size = 4;
    c.cache_bust.session_sources = vec![SessionSource::XCorrelationId];
}

async fn say(h: &Harness, session: Option<&str>, messages: Value) -> String {
    let body = json!({"model": "m", "messages": messages, "max_tokens": 3}).to_string();
    let headers: Vec<(&str, &str)> = session
        .map(|s| ("x-correlation-id", s))
        .into_iter()
        .collect();
    let resp = send(&h1(), post(&h.url("/v1/chat/completions"), body, &headers)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let v: Value = serde_json::from_slice(&body_bytes(resp).await).unwrap();
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The finished traces in `dir` (with their metadata), after checking nothing half-written
/// is left.
fn finished(dir: &Path) -> Vec<(PathBuf, Vec<Value>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        assert!(!name.starts_with('.'), "left behind: {name}");
        if name.ends_with(".jsonl") {
            assert!(
                kvbust::capture::file::meta_path(&p).exists(),
                "{name} has its metadata"
            );
            let rows = std::fs::read_to_string(&p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            out.push((p, rows));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn n(text: &str) -> u64 {
    builtin_encode(text).len() as u64
}

#[tokio::test]
async fn rows_hold_the_workload_in_forwarding_order_and_no_prompt_text() {
    let dir = fresh_dir("rows");
    let h = common::start(|c| {
        capturing(c, &dir);
        // A marker in the first user turn: the capture must not see it.
        c.cache_bust.target = Target::FirstTurnPrefix;
    })
    .await;
    let canary = "CANARY-7f3a9 the quick brown fox jumps over the lazy dog";
    let system = "You are a careful assistant who answers in one short line.";
    let (q1, q2) = ("What is a prefix cache?", "And what evicts from it?");
    say(&h, None, json!([{"role": "user", "content": canary}])).await;
    let a1 = say(
        &h,
        Some("conv-1"),
        json!([{"role": "system", "content": system}, {"role": "user", "content": q1}]),
    )
    .await;
    say(
        &h,
        Some("conv-1"),
        json!([
            {"role": "system", "content": system},
            {"role": "user", "content": q1},
            {"role": "assistant", "content": a1},
            {"role": "user", "content": q2}
        ]),
    )
    .await;
    say(
        &h,
        Some("conv-2"),
        json!([{"role": "system", "content": system}, {"role": "user", "content": q2}]),
    )
    .await;
    // A stream the client abandons after its first event: left out, counted.
    let stream = json!({"model": "m", "messages": [{"role": "user", "content": "long"}],
        "max_tokens": 1000, "stream": true})
    .to_string();
    let resp = send(
        &h1(),
        post(
            &h.url("/v1/chat/completions"),
            stream,
            &[("x-mock-inter-token", "20ms")],
        ),
    )
    .await;
    let mut body = resp.into_body();
    http_body_util::BodyExt::frame(&mut body)
        .await
        .unwrap()
        .unwrap();
    drop(body);
    h.settle_report().await;
    // The writer counts a row when it takes it, after the ticket: read the counters once it has
    // finished (at shutdown).
    let rt = h.runtime.clone();
    h.shutdown().await;
    let m = String::from_utf8(rt.metrics.render()).unwrap();

    let files = finished(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let (path, rows) = &files[0];
    assert_eq!(rows.len(), 4, "{rows:?}");
    // 1: no session; its own prompt's tokens, without the marker kvbust added.
    assert_eq!(rows[0]["input_length"], n(canary));
    assert_eq!(rows[0]["output_length"], 3);
    assert!(rows[0].get("session_id").is_none());
    assert_eq!(rows[0]["timestamp"], 0);
    assert_eq!(
        rows[0]["hash_ids"].as_array().unwrap().len() as u64,
        n(canary).div_ceil(4)
    );
    // 2 and 3: one session; the second turn holds only the client's new message.
    assert_eq!(rows[1]["input_length"], n(system) + n(q1));
    assert!(rows[1].get("timestamp").is_some() && rows[1].get("delay").is_none());
    assert_eq!(rows[2]["input_length"], n(q2));
    assert!(rows[2].get("delay").is_some() && rows[2].get("timestamp").is_none());
    assert_eq!(rows[1]["session_id"], rows[2]["session_id"]);
    // 4: another session, sharing the system prompt's leading blocks with 2.
    assert_ne!(rows[3]["session_id"], rows[1]["session_id"]);
    assert_eq!(rows[3]["hash_ids"][0], rows[1]["hash_ids"][0]);
    assert!(!rows[1]["session_id"].as_str().unwrap().contains("conv"));
    // Not a byte of any prompt, in the trace or its metadata.
    for p in [path.clone(), kvbust::capture::file::meta_path(path)] {
        let text = std::fs::read_to_string(&p).unwrap();
        for needle in [
            "CANARY",
            "quick brown",
            "careful assistant",
            "prefix cache",
            "conv-1",
        ] {
            assert!(!text.contains(needle), "{needle} in {}", p.display());
        }
    }
    assert!(m.contains("kvbust_capture_rows_total 4"), "{m}");
    assert!(
        m.contains("kvbust_capture_dropped_total{reason=\"cancelled\"} 1"),
        "{m}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn rare_blocks_are_split_per_session_and_common_ones_kept() {
    let dir = fresh_dir("rare");
    let h = common::start(|c| {
        capturing(c, &dir);
        c.capture.min_sessions_per_shared_block = 2;
    })
    .await;
    let system = "Shared system prompt that every session sends first.";
    let doc = "A private document that exactly two users pasted in.";
    for (s, tail) in [
        ("a", doc),
        ("b", doc),
        ("c", "Something else entirely, asked alone."),
    ] {
        say(
            &h,
            Some(s),
            json!([{"role": "system", "content": system}, {"role": "user", "content": tail}]),
        )
        .await;
    }
    h.settle_report().await;
    h.shutdown().await;
    let files = finished(&dir);
    let rows = &files[0].1;
    let ids = |i: usize| -> Vec<u64> {
        rows[i]["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    let (a, b, c) = (ids(0), ids(1), ids(2));
    let full_system_blocks = (n(system) / 4) as usize;
    assert!(full_system_blocks >= 2);
    // The system prompt's blocks: three sessions, more than k = 2: one id each.
    assert_eq!(a[..full_system_blocks], b[..full_system_blocks]);
    assert_eq!(a[..full_system_blocks], c[..full_system_blocks]);
    // The document's blocks: one pair of sessions: two ids each.
    let last = a.len() - 1;
    assert!(a.len() == b.len() && last > full_system_blocks);
    assert_ne!(a[last], b[last]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One replica's capture of `tail` after a shared prefix, under `key`.
async fn replica(name: &str, key: &Path, tail: &str) -> PathBuf {
    let dir = fresh_dir(name);
    let key = key.to_path_buf();
    let h = common::start(|c| {
        capturing(c, &dir);
        c.capture.key_file = Some(key);
    })
    .await;
    let content = format!("The common opening every replica sees. {tail}");
    say(&h, None, json!([{"role": "user", "content": content}])).await;
    h.settle_report().await;
    h.shutdown().await;
    let files = finished(&dir);
    assert_eq!(files.len(), 1);
    files[0].0.clone()
}

#[tokio::test]
async fn replicas_with_one_key_merge_into_one_id_space_and_two_keys_are_refused() {
    let keys = fresh_dir("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let (k1, k2) = (keys.join("one.key"), keys.join("two.key"));
    std::fs::write(&k1, "0123456789abcdef-first-key\n").unwrap();
    std::fs::write(&k2, "fedcba9876543210-other-key\n").unwrap();
    let a = replica("replica-a", &k1, "Then replica A's own question.").await;
    let b = replica("replica-b", &k1, "Then B asks something different.").await;
    let other = replica("replica-c", &k2, "Then replica A's own question.").await;

    let out = keys.join("merged.jsonl");
    let m = kvbust::capture::merge::merge(&[a.clone(), b.clone()], &out).unwrap();
    assert_eq!((m.files, m.rows), (2, 2));
    let rows: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The shared opening's first block: one dense id in both; the tails differ.
    assert_eq!(rows[0]["hash_ids"][0], 0);
    assert_eq!(rows[1]["hash_ids"][0], 0);
    let last = |r: &Value| r["hash_ids"].as_array().unwrap().last().cloned();
    assert_ne!(last(&rows[0]), last(&rows[1]));
    let max = rows
        .iter()
        .flat_map(|r| r["hash_ids"].as_array().unwrap().clone())
        .map(|v| v.as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(max + 1, m.distinct_ids, "dense ids");

    // The command ends with one summary line: files, rows, tokens (summed from the inputs), the
    // merged file's bytes, the time.
    let cli_out = keys.join("merged-cli.jsonl");
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_kvbust"))
        .args(["trace", "merge"])
        .arg(&a)
        .arg(&b)
        .arg("-o")
        .arg(&cli_out)
        .output()
        .unwrap();
    assert_eq!(cli.status.code(), Some(0), "{cli:?}");
    let inputs: Vec<Value> = [&a, &b].iter().flat_map(|p| jsonl(p)).collect();
    let sum = |k: &str| -> u64 { inputs.iter().map(|r| r[k].as_u64().unwrap()).sum() };
    let want = format!(
        "kvbust trace merge: merged 2 file(s): 2 rows, {} input tokens, {} output tokens, {} \
         distinct block ids, {} sessions; {} bytes to {} in ",
        sum("input_length"),
        sum("output_length"),
        m.distinct_ids,
        m.sessions,
        std::fs::metadata(&cli_out).unwrap().len(),
        cli_out.display()
    );
    let err = String::from_utf8_lossy(&cli.stderr);
    assert!(sum("input_length") > 0, "{inputs:?}");
    assert!(err.contains(&want), "{want} in {err}");

    // Two keys: refused, naming both files; the CLI exits 2.
    let err = kvbust::capture::merge::merge(&[a.clone(), other.clone()], &out).unwrap_err();
    assert!(
        err.contains(a.to_str().unwrap()) && err.contains(other.to_str().unwrap()),
        "{err}"
    );
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_kvbust"))
        .args(["trace", "merge"])
        .arg(&a)
        .arg(&other)
        .arg("-o")
        .arg(keys.join("refused.jsonl"))
        .output()
        .unwrap();
    assert_eq!(cli.status.code(), Some(2), "{cli:?}");
    assert!(!keys.join("refused.jsonl").exists());
    for p in [a, b, other] {
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }
    let _ = std::fs::remove_dir_all(&keys);
}

fn kvbust(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kvbust"))
        .args(args)
        .output()
        .unwrap()
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Whether `a`'s ids map one to one onto `b`'s, row for row.
fn one_to_one(a: &[Value], b: &[Value]) -> bool {
    let (mut ab, mut ba) = (
        std::collections::HashMap::new(),
        std::collections::HashMap::new(),
    );
    a.iter().zip(b).all(|(x, y)| {
        let (xs, ys) = (x["hash_ids"].as_array(), y["hash_ids"].as_array());
        xs.map(Vec::len) == ys.map(Vec::len)
            && xs
                .into_iter()
                .flatten()
                .zip(ys.into_iter().flatten())
                .all(|(p, q)| {
                    let (p, q) = (p.as_u64().unwrap(), q.as_u64().unwrap());
                    *ab.entry(p).or_insert(q) == q && *ba.entry(q).or_insert(p) == p
                })
    })
}

/// A mooncake trace synthesized with kvbust's token-exact corpus, replayed through `kvbust
/// serve` on its schedule with capture on at the trace's block size, comes back as itself:
/// lengths and sessions row for row, ids up to a renaming, times as the wire saw them; and
/// `kvbust synth` reads the capture back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_exact_trace_round_trips_through_capture() {
    let dir = fresh_dir("roundtrip");
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.jsonl");
    let original = [
        json!({"timestamp": 0, "input_length": 70, "output_length": 5, "hash_ids": [1, 2, 3]}),
        json!({"timestamp": 150, "input_length": 96, "output_length": 4, "hash_ids": [1, 2, 4]}),
        json!({"timestamp": 300, "input_length": 40, "output_length": 3, "hash_ids": [5, 6]}),
        json!({"session_id": "x", "timestamp": 450, "input_length": 64, "output_length": 3, "hash_ids": [1, 7]}),
        json!({"session_id": "x", "delay": 100, "input_length": 32, "output_length": 2, "hash_ids": [8]}),
    ];
    let text: String = original.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&trace, text).unwrap();
    let bodies = dir.join("bodies.jsonl");
    let synth = |input: &Path, out: &Path| {
        kvbust(&[
            "synth",
            "--input-file",
            input.to_str().unwrap(),
            "--custom-dataset-type",
            "mooncake_trace",
            "--prompt-corpus",
            "coding-exact",
            "--isl-block-size",
            "32",
            "--random-seed",
            "7",
            "--format",
            "openai-chat",
            "-o",
            out.to_str().unwrap(),
        ])
    };
    let made = synth(&trace, &bodies);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let bodies: Vec<String> = std::fs::read_to_string(&bodies)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(bodies.len(), original.len());

    let cap = dir.join("captured");
    let h = common::start(|c| {
        capturing(c, &cap);
        c.capture.block_size = 32;
        c.cache_model.tokenizer = Some(kvbust::mock::MockTokenizerSetting::Qwen3);
    })
    .await;
    let start = tokio::time::Instant::now();
    let mut prev_end = start;
    // When each request was sent and its answer read: the proxy saw it arrive, and its answer
    // end, between the two.
    let mut wire = Vec::new();
    for (row, body) in original.iter().zip(&bodies) {
        // On the trace's schedule: a timestamp from the start, a delay after the previous turn.
        let at = match (row.get("timestamp"), row.get("delay")) {
            (Some(t), _) => start + Duration::from_millis(t.as_u64().unwrap()),
            (_, Some(d)) => prev_end + Duration::from_millis(d.as_u64().unwrap()),
            _ => unreachable!(),
        };
        tokio::time::sleep_until(at).await;
        let sent = tokio::time::Instant::now();
        let headers: Vec<(&str, &str)> = row["session_id"]
            .as_str()
            .map(|s| ("x-correlation-id", s))
            .into_iter()
            .collect();
        let resp = send(
            &h1(),
            post(&h.url("/v1/chat/completions"), body.clone(), &headers),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        body_bytes(resp).await;
        prev_end = tokio::time::Instant::now();
        wire.push((sent, prev_end));
    }
    h.settle_report().await;
    h.shutdown().await;
    let files = finished(&cap);
    let (path, got) = &files[0];
    assert_eq!(got.len(), original.len(), "{got:?}");
    for (i, (o, g)) in original.iter().zip(got).enumerate() {
        assert_eq!(o["input_length"], g["input_length"], "{o} / {g}");
        assert_eq!(o["output_length"], g["output_length"], "{o} / {g}");
        assert_eq!(o.get("session_id").is_some(), g.get("session_id").is_some());
        assert_eq!(o.get("delay").is_some(), g.get("delay").is_some());
        // Schedule: a row's time is what the wire saw, bounded by the test's own clock (no
        // tolerance: a loaded machine sends late, and the capture must say how late).
        // `timestamp`: from the first request's arrival; `delay`: from the previous turn's end.
        let (from, to) = match (g.get("timestamp"), g.get("delay")) {
            (Some(_), _) => (wire[0], wire[i]),
            (_, Some(_)) => (wire[i - 1], wire[i]),
            _ => panic!("{g}: neither timestamp nor delay"),
        };
        let at = g
            .get("timestamp")
            .or(g.get("delay"))
            .unwrap()
            .as_u64()
            .unwrap();
        let least = to.0.saturating_duration_since(from.1).as_millis() as u64;
        let most = to.1.saturating_duration_since(from.0).as_millis() as u64;
        assert!(
            least <= at && at <= most,
            "{g}: {at} ms, the wire saw {least}..={most} ms"
        );
        // A later turn waits its delay after the previous answer's end, so no captured delay
        // is shorter than the trace's.
        if let (Some(a), Some(b)) = (o.get("delay"), g.get("delay")) {
            assert!(
                b.as_u64().unwrap() >= a.as_u64().unwrap(),
                "delay: {a} vs {b}"
            );
        }
    }
    assert!(one_to_one(&original, got), "ids map one to one: {got:?}");

    // The capture is itself a trace kvbust synth replays.
    let again = dir.join("again.jsonl");
    let made = synth(path, &again);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    assert_eq!(jsonl(&again).len(), original.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kvbust analyze-trace` on a capture gives the hit rate the cache model predicted for the
/// same traffic, at the same block size with unbounded capacity. Completions with token-id
/// prompts, so the model and the capture count the very same tokens; every prompt is 13 tokens
/// (three full blocks of 4 and a last one of its own), so vLLM's never-the-whole-prompt cap
/// never bites and each request's predicted hit is `4 ×` the leading ids analyze-trace finds
/// seen: its mean hit rate is the predicted cached tokens over `4 × 4 ×` the requests.
#[tokio::test]
async fn analyze_trace_on_a_capture_gives_the_models_predicted_hit_rate() {
    let dir = fresh_dir("analyze");
    let h = common::start(|c| {
        capturing(c, &dir);
        c.cache_model.block_size = 4;
    })
    .await;
    let prompts: Vec<Vec<u32>> = (0..12u32)
        .map(|i| {
            let mut p: Vec<u32> = (1..=4).collect();
            // Blocks 2 and 3 repeat in smaller and smaller groups; the last token is unique.
            p.extend([10 + i % 2; 4]);
            p.extend([20 + i % 4; 4]);
            p.push(1000 + i);
            p
        })
        .collect();
    for p in &prompts {
        let body = json!({"model": "m", "prompt": p, "max_tokens": 2}).to_string();
        let resp = send(&h1(), post(&h.url("/v1/completions"), body, &[])).await;
        assert_eq!(resp.status(), StatusCode::OK);
        body_bytes(resp).await;
    }
    let resp = send(&h1(), common::get(&h.admin_url("/report?wait=60s"))).await;
    let report: kvbust::report::Report = serde_json::from_slice(&body_bytes(resp).await).unwrap();
    h.shutdown().await;
    let predicted: u64 = report.rows.iter().map(|r| r.cached_tokens.predicted).sum();
    assert!(predicted > 0);
    let files = finished(&dir);
    let out = dir.join("analysis.json");
    let run = kvbust(&[
        "analyze-trace",
        files[0].0.to_str().unwrap(),
        "--block-size",
        "4",
        "--output-file",
        out.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let analysis: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let rate = analysis["cache_hit_rate"].as_f64().unwrap();
    let expected = predicted as f64 / (4.0 * 4.0 * prompts.len() as f64);
    assert!((rate - expected).abs() < 1e-9, "{rate} vs {expected}");
    let _ = std::fs::remove_dir_all(&dir);
}
