//! Issue 42 (3): `kvbust synth` replays a trace a conversation at a time and `analyze-trace`
//! counts what it will hold, so neither holds more than its stated bound whatever the output:
//! a conversation over `--max-row-bytes`, or a TraceLab file asking for more block ids than
//! `--max-blocks`, stops the run (exit 2) naming the row, the limit and the fix, and a
//! conversation is written before the next one is built. Memory itself is not measured here
//! (the figures are in the commit notes); these are its observable outcomes.

use std::path::Path;
use std::process::Command;

use kvbust::cli::synth::{write_dataset, OutputFormat, WriteOptions};
use kvbust::synth::corpus::sonnet::SHAKESPEARE;
use kvbust::synth::dataset::export::Answers;
use kvbust::synth::dataset::trace::build_from_params;
use kvbust::synth::{TokenCorpus, Tokenizer};
use serde_json::json;

use clap::Parser;

use crate::synth_common::{fresh_scratch, Wrapper};

fn kvbust() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvbust"))
}

/// TraceLab rows: one session of `rounds` rounds of `tokens` input tokens each, every round's
/// blocks new (`prefix_tokens` 0), ten seconds apart.
fn tracelab(rounds: usize, tokens: u64) -> String {
    let stamp = |s: usize| format!("2025-11-03T09:{:02}:{:02}.000Z", s / 60, s % 60);
    (0..rounds)
        .map(|i| {
            let row = json!({
                "session_id": "claude:big", "round_index": i, "provider": "claude",
                "user": "u", "project": "p", "model": "claude-sonnet",
                "input_tokens_total": tokens, "prefix_tokens": 0, "newly_append_tokens": tokens,
                "output_tokens": 5, "first_input_event_type": "tool_result",
                "timing_events": [
                    {"event_type": "tool_result", "timestamp": stamp(10 * i)},
                    {"event_type": "text", "timestamp": stamp(10 * i + 2)}
                ],
                "tools": []
            });
            format!("{row}\n")
        })
        .collect()
}

struct Run {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

fn run(args: &[&str], input: &Path, extra: &[&str]) -> Run {
    let o = kvbust().args(args).arg(input).args(extra).output().unwrap();
    Run {
        code: o.status.code(),
        stdout: o.stdout,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// A conversation whose prompt text passes `--max-row-bytes` stops the run as soon as the turn
/// that takes it over is built: exit 2, the conversation, the request and the flag named, no
/// output file. Three rounds of 20,000 fresh tokens are about 80 KB of text each.
#[test]
fn a_conversation_over_the_row_cap_is_refused_naming_it() {
    let dir = fresh_scratch("streaming", "row_cap");
    let input = dir.join("rounds.jsonl");
    std::fs::write(&input, tracelab(3, 20_000)).unwrap();
    let out = dir.join("out.jsonl");
    let r = run(
        &["synth", "--random-seed", "1", "--input-file"],
        &input,
        &["--max-row-bytes", "100KiB", "-o", out.to_str().unwrap()],
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    for says in [
        "claude_big",
        "requests[1]",
        "bytes of prompt text by its turn 2",
        "--max-row-bytes (100KiB)",
        "--synthesis-max-isl",
    ] {
        assert!(r.stderr.contains(says), "{says:?} not in {}", r.stderr);
    }
    assert!(!out.exists(), "an output file was written");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(left.len(), 1, "a temporary file was left");
    // The same trace within a larger cap is written whole.
    let r = run(
        &["synth", "--random-seed", "1", "--input-file"],
        &input,
        &["--max-row-bytes", "1MiB", "-o", out.to_str().unwrap()],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(out.exists());
}

/// A TraceLab file of a few kilobytes asking for more block ids than `--max-blocks` is refused
/// while it is read, before any id is minted, naming the row that passed the cap; synth and
/// analyze-trace alike. 10 rounds of 9,999,999 tokens are 156,249 blocks each at block size 64.
#[test]
fn tracelab_rows_asking_for_too_many_blocks_are_refused_as_read() {
    let dir = fresh_scratch("streaming", "block_cap");
    let input = dir.join("rounds.jsonl");
    std::fs::write(&input, tracelab(10, 9_999_999)).unwrap();
    let out = dir.join("out.jsonl");
    let synth = ["synth", "--random-seed", "1", "--input-file"];
    let cap = ["--max-blocks", "500000"];
    let written = ["-o", out.to_str().unwrap()];
    for (args, extra) in [
        (&synth[..], [&cap[..], &written[..]].concat()),
        (&["analyze-trace"][..], cap.to_vec()),
    ] {
        let r = run(args, &input, &extra);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        for says in [
            "rounds.jsonl:4",
            "input_tokens_total",
            "624996 hash-id blocks",
            "more than the cap of 500000 (--max-blocks)",
        ] {
            assert!(
                r.stderr.contains(says),
                "{args:?}: {says:?} not in {}",
                r.stderr
            );
        }
        assert!(!out.exists(), "{args:?}: an output file was written");
    }
}

/// `analyze-trace`'s default cap: 60 rounds of 9,999,999 tokens (9.4M blocks, the shape of the
/// issue's 418 KB file that ran for minutes at 2.5 GB) are refused at once by the default
/// `--max-blocks`, the row named.
#[test]
fn analyze_trace_refuses_a_tracelab_file_over_the_default_block_cap() {
    let dir = fresh_scratch("streaming", "analyze_default_cap");
    let input = dir.join("rounds.jsonl");
    std::fs::write(&input, tracelab(60, 9_999_999)).unwrap();
    let r = run(&["analyze-trace"], &input, &[]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    // 8Mi blocks: the 54th row takes the count past it (53 x 156,249 = 8,281,197).
    assert!(r.stderr.contains("rounds.jsonl:54"), "{}", r.stderr);
    assert!(r.stderr.contains("(--max-blocks)"), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "a report was printed");
}

/// Conversations are written as they are built, not after the whole dataset: a mooncake trace
/// whose last line fails only while its prompt is built (its hash id was built at another size
/// on line 1) has its earlier conversations on standard output before the error (exit 2). A
/// build that held the dataset first wrote nothing.
#[test]
fn conversations_reach_the_output_before_the_next_is_built() {
    let dir = fresh_scratch("streaming", "incremental");
    let input = dir.join("trace.jsonl");
    let mut text = String::new();
    for i in 0..600 {
        text.push_str(&format!(
            "{}\n",
            json!({"timestamp": i, "input_length": 8, "output_length": 2, "hash_ids": [1000 + i]})
        ));
    }
    // Hash id 1000 was built at 8 tokens on line 1; here it would be 3.
    text.push_str("{\"timestamp\": 600, \"input_length\": 3, \"hash_ids\": [1000]}\n");
    std::fs::write(&input, text).unwrap();
    let r = run(
        &["synth", "--random-seed", "1", "--input-file"],
        &input,
        &["--isl-block-size", "8"],
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("trace.jsonl:601"), "{}", r.stderr);
    let written = String::from_utf8(r.stdout).unwrap();
    let first: serde_json::Value = serde_json::from_str(written.lines().next().unwrap()).unwrap();
    assert_eq!(first["session_id"], "session_000000");
    // A decoding batch is 512 lines: the sessions before the 512th are out before the rest.
    assert!(
        written.lines().count() >= 500,
        "{} lines",
        written.lines().count()
    );
}

/// The streamed command writes, in every format, exactly what building the dataset first and
/// writing it writes (the library's own path, which the AIPerf vectors check), for a hash-id
/// trace with sessions, a trace without a schedule and an agentic (TraceLab) trace.
#[test]
fn the_streamed_output_equals_the_built_dataset_in_every_format() {
    let dir = fresh_scratch("streaming", "formats");
    let sessions = dir.join("sessions.jsonl");
    let mut text = String::new();
    for i in 0..40 {
        let line = json!({"session_id": format!("s{}", i % 7), "timestamp": i * 10,
            "input_length": 20 + i, "output_length": 3 + i % 4, "hash_ids": [1, 2 + i % 5]});
        text.push_str(&format!("{line}\n"));
    }
    std::fs::write(&sessions, text).unwrap();
    let unscheduled = dir.join("unscheduled.jsonl");
    std::fs::write(
        &unscheduled,
        "{\"input_length\": 12, \"output_length\": 3, \"hash_ids\": [1]}\n\
         {\"input_length\": 9, \"output_length\": 2}\n",
    )
    .unwrap();
    let rounds = dir.join("rounds.jsonl");
    std::fs::write(&rounds, tracelab(4, 700)).unwrap();
    let tok = Tokenizer::default_qwen3().unwrap();
    let cases: [(&Path, &[OutputFormat]); 3] = [
        (
            &sessions,
            &[
                OutputFormat::Conversations,
                OutputFormat::OpenaiChat,
                OutputFormat::VllmCustom,
                OutputFormat::Sharegpt,
                OutputFormat::Mooncake,
            ],
        ),
        (
            &unscheduled,
            &[OutputFormat::Mooncake, OutputFormat::Sharegpt],
        ),
        (
            &rounds,
            &[
                OutputFormat::Conversations,
                OutputFormat::OpenaiChat,
                OutputFormat::Mooncake,
            ],
        ),
    ];
    for (input, formats) in cases {
        let argv: Vec<String> = [
            "--input-file",
            input.to_str().unwrap(),
            "--random-seed",
            "3",
            "--isl-block-size",
            "8",
            "--model",
            "m1",
        ]
        .map(String::from)
        .to_vec();
        let mut full = vec!["synth".to_owned()];
        full.extend(argv.iter().cloned());
        let params = Wrapper::try_parse_from(full).unwrap().args.to_params();
        let mut dataset = build_from_params(&params, &tok, None).unwrap();
        dataset.assign_models(&["m1"]);
        for &format in formats {
            let name = format!("{format:?}");
            let mut want = Vec::new();
            let sonnet = TokenCorpus::build_cached(SHAKESPEARE, &tok, None).unwrap();
            let mut answers = Answers::new(&tok, sonnet, 3);
            let opts = WriteOptions {
                format,
                model: "m1",
                stream: false,
            };
            write_dataset(&mut want, &dataset, &opts, Some(&mut answers)).unwrap();
            let value = clap::ValueEnum::to_possible_value(&format).unwrap();
            let o = kvbust()
                .arg("synth")
                .args(&argv)
                .args(["--format", value.get_name()])
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}: {name}: {}",
                input.display(),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(
                o.stdout == want,
                "{}: {name}: the streamed output differs from the built dataset's",
                input.display()
            );
        }
    }
}
