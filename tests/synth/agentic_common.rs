//! Shared by the agentic vector tests (`agentic.rs`, `tracelab.rs`): one
//! conversation `kvbust synth` wrote compared field by field with the one AIPerf 0.13.0's
//! composer recorded in the vector file. Owns that comparison; must never compute an expected
//! value.

use serde_json::{json, Value};

/// A number compared as AIPerf's float (5988.0 and 5988 are the same value).
pub fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// Panics (naming `at`, the field and both values) where `got` differs from `want`.
pub fn check_conversation(at: &str, got: &Value, want: &Value) {
    assert_eq!(got["session_id"], want["session_id"], "{at}");
    // A conversation outside any agent tree leaves out AIPerf's defaults (a root at depth 0).
    let defaults = json!({"is_root": true, "agent_depth": 0});
    for k in [
        "context_mode",
        "is_root",
        "agent_depth",
        "parent_conversation_id",
    ] {
        let ours = got.get(k).or(defaults.get(k)).unwrap_or(&Value::Null);
        assert_eq!(ours, want.get(k).unwrap_or(&Value::Null), "{at}: {k}");
    }
    let gb = got.get("branches").cloned().unwrap_or(json!([]));
    let wb = want.get("branches").cloned().unwrap_or(json!([]));
    assert_eq!(
        gb.as_array().unwrap().len(),
        wb.as_array().unwrap().len(),
        "{at}: branches"
    );
    for (g, w) in gb.as_array().unwrap().iter().zip(wb.as_array().unwrap()) {
        for k in [
            "branch_id",
            "child_conversation_ids",
            "mode",
            "dispatch_timing",
            "is_background",
        ] {
            assert_eq!(g[k], w[k], "{at}: branch {k}");
        }
        assert_eq!(
            num(&g["start_timestamp_ms"]),
            num(&w["start_timestamp_ms"]),
            "{at}: branch start"
        );
    }
    let gt = got["turns"].as_array().unwrap();
    let wt = want["turns"].as_array().unwrap();
    assert_eq!(gt.len(), wt.len(), "{at}: turns");
    for (i, (g, w)) in gt.iter().zip(wt).enumerate() {
        let at = format!("{at} turn {i}");
        assert_eq!(g["max_tokens"], w["max_tokens"], "{at}: max_tokens");
        for k in ["timestamp", "delay"] {
            assert_eq!(g.get(k).and_then(num), w.get(k).and_then(num), "{at}: {k}");
        }
        // Every turn, BurstGPT's too: AIPerf's composer puts `--model` on each.
        assert_eq!(g["model"], w["model"], "{at}: model");
        if let Some(texts) = w.get("texts") {
            // BurstGPT: one synthesized user prompt.
            assert_eq!(json!([g["text"]]), *texts, "{at}: text");
            continue;
        }
        for k in ["input_kind", "branch_ids", "prerequisites"] {
            assert_eq!(g.get(k), w.get(k), "{at}: {k}");
        }
        assert_eq!(
            g.get("reset_context").cloned().unwrap_or(json!(false)),
            w["reset_context"],
            "{at}: reset_context"
        );
        let (gm, wm) = (
            g["messages"].as_array().unwrap(),
            w["raw_messages"].as_array().unwrap(),
        );
        assert_eq!(gm.len(), wm.len(), "{at}: message count");
        for (j, (a, b)) in gm.iter().zip(wm).enumerate() {
            assert_eq!(a["role"], b["role"], "{at} message {j}: role");
            assert!(
                a["content"] == b["content"],
                "{at} message {j}: content differs\n got: {:.300}\nwant: {:.300}",
                a["content"],
                b["content"]
            );
        }
    }
}

/// Runs the real binary: `kvbust synth --custom-dataset-type KIND --random-seed 1 --input-file
/// INPUT -o OUT`; returns (exit code, stderr, whether OUT was written).
pub fn run_synth_binary(
    kind: &str,
    input: &std::path::Path,
    out: &std::path::Path,
) -> (i32, String, bool) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_kvbust"))
        .args(["synth", "--custom-dataset-type", kind, "--random-seed", "1"])
        .arg("--input-file")
        .arg(input)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        out.exists(),
    )
}
