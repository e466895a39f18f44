//! `kvbust synth` on small hostile and big broken trace files (issue 34, items 2, 6 and 11):
//! each is refused with exit 2 and a message naming the file, the line and the field, before
//! anything huge is allocated; dropped rows are warned about (and refused with --strict).
//! Every case runs the real binary.

use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::synth_common::fresh_scratch;

fn kvbust() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvbust"))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

struct Run {
    code: i32,
    stderr: String,
    wrote: bool,
}

/// Runs `kvbust synth --input-file <dir>/<name>` (written from `body`) with `extra` flags.
fn synth(case: &str, name: &str, body: &[u8], extra: &[&str]) -> Run {
    let dir = fresh_scratch("hostile", case);
    let input = dir.join(name);
    std::fs::write(&input, body).unwrap();
    run(&input, &dir.join("out.jsonl"), extra)
}

fn run(input: &Path, out: &Path, extra: &[&str]) -> Run {
    let o = kvbust()
        .args(["synth", "--random-seed", "1", "--input-file"])
        .arg(input)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    Run {
        code: o.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        wrote: out.exists(),
    }
}

/// Exit 2, no output, and every `says` in the message.
fn refused(case: &str, r: &Run, says: &[&str]) {
    assert_eq!(r.code, 2, "{case}: {}", r.stderr);
    assert!(!r.wrote, "{case}: an output file was written");
    assert!(!r.stderr.contains("panicked"), "{case}: {}", r.stderr);
    for s in says {
        assert!(r.stderr.contains(s), "{case}: {:?} lacks {s:?}", r.stderr);
    }
}

fn tracelab_row(extra: serde_json::Value) -> String {
    let mut row = json!({"session_id": "claude:s1", "round_index": 0, "provider": "claude",
        "user": "u", "project": "p", "model": "claude-sonnet-4-5", "input_tokens_total": 100,
        "prefix_tokens": 0, "newly_append_tokens": 100, "output_tokens": 10,
        "first_input_event_type": "user_message",
        "timing_events": [{"event_type": "user_message", "timestamp": "2025-11-03T09:00:00Z"},
                          {"event_type": "text", "timestamp": "2025-11-03T09:00:01Z"}],
        "tools": []});
    for (k, v) in extra.as_object().unwrap() {
        row[k] = v.clone();
    }
    format!("{row}\n")
}

fn weka(request: serde_json::Value) -> String {
    let mut r = json!({"t": 0.5, "type": "n", "model": "m", "in": 100, "out": 10,
                       "hash_ids": [1, 2]});
    for (k, v) in request.as_object().unwrap() {
        r[k] = v.clone();
    }
    json!({"id": "w", "models": ["m"], "block_size": 64, "hash_id_scope": "local",
           "requests": [r]})
    .to_string()
}

#[test]
fn huge_lengths_are_refused_before_they_are_built() {
    // The 16 GB TraceLab row (input_tokens_total 4e9), detected and explicit.
    let row = tracelab_row(json!({"input_tokens_total": 4_000_000_000u64,
                                  "newly_append_tokens": 4_000_000_000u64}));
    for extra in [&[][..], &["--custom-dataset-type", "tracelab"]] {
        let r = synth("tracelab-4e9", "rounds.jsonl", row.as_bytes(), extra);
        refused(
            "tracelab 4e9",
            &r,
            &[
                "rounds.jsonl:1",
                "input_tokens_total",
                "ceiling of 10000000",
            ],
        );
    }
    // Mooncake: input_length 512,000,000 with 10^6 hash ids (2.5 GB in the decoder before).
    let ids: Vec<u32> = (0..1_000_000).collect();
    let line = json!({"input_length": 512_000_000, "output_length": 10, "hash_ids": ids});
    let r = synth(
        "mooncake-512m",
        "t.jsonl",
        format!("{line}\n").as_bytes(),
        &[],
    );
    refused(
        "mooncake 512M",
        &r,
        &["t.jsonl:1:", "`input_length`", "ceiling"],
    );
    // Bailian and an output length, the same.
    let line =
        "{\"chat_id\": 1, \"timestamp\": 1, \"input_length\": 5, \"output_length\": 20000000}\n";
    let r = synth("bailian-osl", "b.jsonl", line.as_bytes(), &[]);
    refused(
        "bailian osl",
        &r,
        &["b.jsonl:1:", "`output_length`", "ceiling"],
    );
    // Weka `in` past the ceiling (and 10^12, issue item 11).
    for n in [10_000_001u64, 1_000_000_000_000] {
        let r = synth("weka-in", "w.json", weka(json!({"in": n})).as_bytes(), &[]);
        refused("weka in", &r, &["w.json", "requests[0].in", "ceiling"]);
    }
    // Within the ceiling, the same files are fine (so each refusal is the length's).
    let ok = tracelab_row(json!({}));
    let r = synth("tracelab-ok", "rounds.jsonl", ok.as_bytes(), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

#[test]
fn bombs_and_huge_records_are_refused_while_streaming() {
    // A gzip line expanding far past the ratio cap (the 1 MB -> 1 GB line, scaled down:
    // 96 MiB from ~100 KB), as .jsonl.gz (mooncake detection) and .json.gz (Weka's reader).
    let mut line = b"{\"text_input\": \"".to_vec();
    line.resize(96 << 20, b'a');
    let bomb = gzip(&line);
    assert!(bomb.len() < 200_000, "{}", bomb.len());
    for name in ["bomb.jsonl.gz", "bomb.json.gz"] {
        let r = synth("gz-bomb", name, &bomb, &[]);
        refused(name, &r, &[name, ":1:", "expands more than 200-fold"]);
    }
    let r = synth(
        "gz-bomb-typed",
        "bomb.json.gz",
        &bomb,
        &["--custom-dataset-type", "weka_trace"],
    );
    refused(
        "weka bomb",
        &r,
        &["bomb.json.gz:1:", "expands more than 200-fold"],
    );
    // A plain line past the record cap, after a good one: refused at its line.
    let mut text = b"{\"text_input\": \"hi\"}\n\n".to_vec();
    text.extend_from_slice(&line[..(65 << 20)]);
    let r = synth("long-line", "long.jsonl", &text, &[]);
    refused("long line", &r, &["long.jsonl:3:", "longer than 64 MiB"]);
    // A gzip file of blank lines (a bomb with nothing in it).
    let blank = gzip(&vec![b'\n'; 64 << 20]);
    let r = synth("gz-blank", "blank.jsonl.gz", &blank, &[]);
    refused(
        "blank bomb",
        &r,
        &["blank.jsonl.gz", "expands more than 200-fold"],
    );
}

#[test]
fn burst_rows_are_dropped_with_a_warning_or_refused_with_strict() {
    let csv = "Timestamp,Model,Request tokens,Response tokens\n1,GPT-4,10,5\n2,GPT-4,abc,5\n\
               3,GPT-4,1e23,4\n4,GPT-4,8,2\n";
    let r = synth("burst-warn", "b.csv", csv.as_bytes(), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.wrote);
    for s in [
        "b.csv: dropped 2 BurstGPT row(s)",
        "line 3: Request tokens \"abc\" is not an integer",
        "line 4: Request tokens \"1e23\" is not an integer",
    ] {
        assert!(r.stderr.contains(s), "{:?} lacks {s:?}", r.stderr);
    }
    let r = synth("burst-strict", "b.csv", csv.as_bytes(), &["--strict"]);
    refused(
        "strict",
        &r,
        &["b.csv:3:", "Request tokens \"abc\"", "--strict", "2 row(s)"],
    );
    // 10^23 written out is an integer to Python (AIPerf keeps the row): past the ceiling.
    let csv = "Timestamp,Model,Request tokens,Response tokens\n1,GPT-4,10,5\n\
               2,GPT-4,100000000000000000000000,4\n";
    let r = synth("burst-huge", "b.csv", csv.as_bytes(), &[]);
    refused("huge", &r, &["b.csv:3:", "`Request tokens`", "ceiling"]);
    // A 70 MiB field: refused at its row, not held whole.
    let mut big = b"Timestamp,Model,Request tokens,Response tokens\n1,GPT-4,10,5\n2,\"".to_vec();
    big.resize(big.len() + (70 << 20), b'x');
    big.extend_from_slice(b"\",7,3\n3,GPT-4,8,2\n");
    let r = synth("burst-field", "big.csv", &big, &[]);
    refused("big field", &r, &["big.csv:3:", "longer than 64 MiB"]);
}

#[test]
fn tracelab_dropped_rows_are_warned_or_refused_with_strict() {
    let body = format!("{}[1]\n{{\"round_index\": 1}}\n", tracelab_row(json!({})));
    let r = synth("tl-drop", "rounds.jsonl", body.as_bytes(), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("dropped 2 TraceLab row(s) that are not objects or have no session_id")
            && r.stderr.contains("lines 2, 3"),
        "{}",
        r.stderr
    );
    let r = synth("tl-strict", "rounds.jsonl", body.as_bytes(), &["--strict"]);
    refused("strict", &r, &["rounds.jsonl:2", "session_id", "--strict"]);
}

#[test]
fn out_of_range_fields_are_refused() {
    let cases: Vec<(&str, &str, String, Vec<&str>)> = vec![
        (
            "weka-t",
            "w.json",
            weka(json!({"t": 1e308})),
            vec!["w.json", "requests[0].t", "1e9 seconds"],
        ),
        (
            "weka-think",
            "w.json",
            weka(json!({"think_time": -1e300})),
            vec!["requests[0].think_time"],
        ),
        (
            "tl-append",
            "rounds.jsonl",
            tracelab_row(json!({"newly_append_tokens": -5})),
            vec!["rounds.jsonl:1", "newly_append_tokens", "is -5"],
        ),
        (
            "tl-round",
            "rounds.jsonl",
            tracelab_row(json!({"round_index": 9_223_372_036_854_775_808u64})),
            vec!["rounds.jsonl:1", "round_index", "2^53"],
        ),
        (
            "tl-output",
            "rounds.jsonl",
            tracelab_row(json!({"output_tokens": 6_000_000, "reasoning_output_tokens": 6_000_000})),
            vec!["rounds.jsonl:1", "output_tokens"],
        ),
        (
            "burst-time",
            "b.csv",
            "Timestamp,Request tokens,Response tokens\n1e308,5,5\n".to_owned(),
            vec!["b.csv:2:", "`Timestamp`"],
        ),
    ];
    for (case, name, body, says) in cases {
        let r = synth(case, name, body.as_bytes(), &[]);
        refused(case, &r, &says);
    }
}
