//! Compaction is not collision (issue 39 item 6): agentic Weka traces, built as AIPerf 0.13.0
//! builds them, replayed through the proxy the way AIPerf sends them (each conversation its
//! whole context per turn under its own `x-correlation-id`, in trace time order) under the four
//! RID targets. A conversation whose context is cut back (a `reset_context` turn) and then grows
//! from there is counted in `kvbust_cache_model_compactions_total`, never a `session_collision`.
//! Two conversations taking turns under one key stay a collision
//! (`cache_model::two_conversations_under_one_session_key_are_a_collision`).

use std::path::Path;

use http::StatusCode;
use serde_json::{json, Value};

use crate::common::{self, body_bytes, get, h1, post, send, Harness};
use kvbust::cachebust::Target;
use kvbust::synth::dataset::trace::agentic;
use kvbust::synth::dataset::trace_kind::TraceKind;
use kvbust::synth::{build_dataset, Dataset, SynthParams};

/// The targets whose isolation a session collision breaks (one RID per session key).
const RID_TARGETS: [Target; 4] = [
    Target::SystemPrefix,
    Target::SystemSuffix,
    Target::FirstTurnPrefix,
    Target::FirstTurnSuffix,
];

/// The Weka traces in `files` (a fixture's name → trace object) written to a scratch folder,
/// and the dataset AIPerf builds of them with `--random-seed seed` (and `--model`).
fn weka(files: &Value, dir: &str, seed: u64, model: Option<&str>) -> Dataset {
    let dir = common::test_dir().join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, trace) in files.as_object().unwrap() {
        std::fs::write(dir.join(name), trace.to_string()).unwrap();
    }
    let params = SynthParams {
        input_file: Some(dir),
        custom_dataset_type: Some(TraceKind::WekaTrace),
        random_seed: Some(seed),
        model: model.map(str::to_owned),
        ..SynthParams::default()
    };
    let tokenizer = kvbust::synth::Tokenizer::default_qwen3().expect("shipped tokenizer");
    build_dataset(&params, &tokenizer).expect("a dataset")
}

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/synth")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `reset_context` turns in `ds`: the compactions the traces hold.
fn resets(ds: &Dataset) -> usize {
    ds.conversations
        .iter()
        .flat_map(|c| &c.turns)
        .filter(|t| t.agentic.as_ref().is_some_and(|a| a.reset_context))
        .count()
}

/// The sum of `family`'s series carrying every label of `labels`.
fn counter(metrics: &str, family: &str, labels: &[(&str, &str)]) -> u64 {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum()
}

/// What the model counted over a replay.
#[derive(Debug, PartialEq, Eq)]
struct Counted {
    requests: usize,
    collisions: u64,
    breaches: u64,
    compactions: u64,
}

/// Every turn of `ds` through a proxy marking for `target`, each conversation under its own
/// `x-correlation-id`, turns in trace time order (a conversation's own turns in its order).
async fn replay(ds: &Dataset, target: Target) -> Counted {
    let h = common::start(|c| c.cache_bust.target = target).await;
    let mut turns: Vec<(f64, usize, usize)> = Vec::new();
    for (i, conv) in ds.conversations.iter().enumerate() {
        let mut at = f64::MIN;
        for (k, t) in conv.turns.iter().enumerate() {
            // Never before the conversation's previous turn.
            at = at.max(t.timestamp.as_ref().and_then(|n| n.as_f64()).unwrap_or(at));
            turns.push((at, i, k));
        }
    }
    turns.sort_by(|a, b| a.0.total_cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let client = h1();
    let url = h.url("/v1/chat/completions");
    for &(_, i, k) in &turns {
        let conv = &ds.conversations[i];
        let context = agentic::context(conv, k);
        assert!(!context.is_empty(), "{} turn {k}", conv.session_id);
        let model = conv.turns[k].agentic.as_ref().and_then(|a| a.model.clone());
        let body = json!({"model": model.unwrap_or_else(|| "m".into()), "messages": context, "max_tokens": 1});
        let resp = send(
            &client,
            post(
                &url,
                body.to_string(),
                &[("x-correlation-id", conv.session_id.as_str())],
            ),
        )
        .await;
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "{} turn {k}",
            conv.session_id
        );
        body_bytes(resp).await;
    }
    let counted = counted(&h, target, turns.len()).await;
    h.shutdown().await;
    counted
}

/// The model's counts once it has modelled every request.
async fn counted(h: &Harness, target: Target, requests: usize) -> Counted {
    let resp = send(&h1(), get(&h.admin_url("/report?wait=60s"))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let report: kvbust::report::Report = serde_json::from_slice(&body_bytes(resp).await).unwrap();
    let m = common::metrics_text(h).await;
    let t = ("target", target.as_str());
    // The run's report counts what the metric counts, and its verdict is not a breach.
    let in_report: u64 = report.rows.iter().map(|r| r.compactions).sum();
    let in_metric = counter(&m, "kvbust_cache_model_compactions_total", &[t]);
    assert_eq!(in_report, in_metric, "{:?}", report.rows);
    assert_eq!(
        report.verdict.isolation,
        kvbust::report::Isolation::Held,
        "{}",
        report.verdict.message
    );
    assert!(
        counter(&m, "kvbust_predicted_cached_tokens_total", &[t]) > 0,
        "the model saw the run: {m}"
    );
    assert_eq!(
        counter(&m, "kvbust_cache_model_unaccounted_total", &[]),
        0,
        "every request modelled: {m}"
    );
    Counted {
        requests,
        collisions: counter(
            &m,
            "kvbust_isolation_breaches_total",
            &[t, ("kind", "session_collision")],
        ),
        breaches: counter(&m, "kvbust_isolation_breaches_total", &[t]),
        compactions: counter(&m, "kvbust_cache_model_compactions_total", &[t]),
    }
}

/// agentic_traces.json's `weka_compaction` case (trace-d: its turn 2 resets the context to the
/// system prompt and a new user turn, then grows): one compaction, no breach, under each RID
/// target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_weka_compaction_trace_is_a_compaction_not_a_collision() {
    let v = fixture("agentic_traces.json");
    let ds = weka(
        &v["cases"]["weka_compaction"]["input"]["files"],
        "compaction-weka-d",
        3,
        None,
    );
    assert_eq!(resets(&ds), 1, "trace-d compacts once");
    for target in RID_TARGETS {
        let got = replay(&ds, target).await;
        assert_eq!(
            (got.collisions, got.breaches, got.compactions),
            (0, 0, 1),
            "{}: {got:?}",
            target.as_str()
        );
    }
}

/// AIPerf's replay of a generated 8-trace Weka set (agentic_fanout.json: subagents, a parallel
/// worker fan-out, side chains and 5 compactions; its `default` flags). The rule before this
/// (a request that does not extend its session's previous one collides) made each compaction a
/// `session_collision` under every target; now each is counted and nothing breaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8_trace_weka_set_with_fan_out_and_compactions_breaches_nothing() {
    let v = fixture("agentic_fanout.json");
    assert_eq!(
        v["cases"]["default"]["kvbust_argv"],
        json!(["--random-seed", "5", "--model", "claude-opus"])
    );
    let ds = weka(&v["files"], "compaction-fanout", 5, Some("claude-opus"));
    let compactions = resets(&ds);
    assert_eq!(compactions, 5);
    for target in RID_TARGETS {
        let got = replay(&ds, target).await;
        assert_eq!(
            (got.collisions, got.breaches, got.compactions),
            (0, 0, compactions as u64),
            "{}: {got:?}",
            target.as_str()
        );
    }
}
