//! Reports built for the renderers' tests: an empty run, a silent upstream, one phase only, and
//! two phases with breaches, unaccounted requests and the shared-cache note.

use std::collections::BTreeMap;

use crate::report::{
    Breaches, Bucket, Errors, Isolation, Latency, ModelFacts, Pair, Report, Reuse, Row, Run, Stats,
    Throughput, Timeline, UpstreamFacts, Verdict, SCHEMA,
};

pub(crate) fn empty() -> Report {
    Report {
        schema: SCHEMA,
        run: Run {
            name: "run-1".into(),
            opened_by: "start".into(),
            benchmark_id: "bench-empty".into(),
            started_at: "2026-05-01T10:00:00.000Z".into(),
            ended_at: None,
            generated_at: "2026-05-01T10:00:03.500Z".into(),
            elapsed_s: 3.5,
            complete: true,
            ..Run::default()
        },
        verdict: Verdict {
            message: "isolation not requested (target none)".into(),
            ..Verdict::default()
        },
        cache_model: ModelFacts {
            enabled: true,
            block_size: 16,
            tokenizer: "Qwen/Qwen3-0.6B".into(),
            chat_template: "auto".into(),
            capacity_blocks: 0,
            max_memory: 256 << 20,
            indexed_blocks: 0,
            evicted_blocks: 0,
            unaccounted: BTreeMap::new(),
            topology: "sidecar".into(),
            note: None,
            kv_events: None,
        },
        upstream: UpstreamFacts {
            reports_cached_tokens: None,
            responses_with_usage: 0,
            hint: None,
        },
        rows: vec![],
        timeline: Timeline {
            bucket_s: 1.0,
            buckets: vec![],
        },
    }
}

/// A row whose figures follow from `requests` (each request 1,000 prompt tokens).
pub(crate) fn row(phase: &str, target: &str, requests: u64, hit: f64, reported: bool) -> Row {
    let prompt = requests * 1000;
    let predicted = (prompt as f64 * hit) as u64;
    Row {
        phase: phase.into(),
        target: target.into(),
        requests,
        accounted_requests: requests,
        prompt_tokens: Pair {
            reported: reported.then_some(prompt + requests),
            predicted: prompt,
        },
        cached_tokens: Pair {
            reported: reported.then_some(predicted - predicted / 10),
            predicted,
        },
        reuse: Reuse {
            same_session: predicted / 2,
            other_session: predicted / 4,
            warmup: predicted - predicted / 2 - predicted / 4,
        },
        breaches: Breaches::default(),
        divergent_requests: 0,
        latency: Latency {
            ttft_ms: Stats {
                count: requests,
                p50: Some(40.0 + hit * 10.0),
                p99: Some(180.5),
                ..stats(requests, 50.0 - hit * 10.0)
            },
            itl_ms: stats(requests * 99, 8.0 + hit),
            tpot_ms: stats(requests, 8.2 + hit),
            e2e_ms: stats(requests, 850.0 + hit * 100.0),
        },
        throughput: Throughput {
            duration_s: requests as f64 / 4.0,
            requests_per_s: Some(4.0),
            output_tokens_per_s: Some(400.0),
            output_tokens: requests * 100,
            successful_requests: requests,
        },
        ..Row::default()
    }
}

/// Statistics around `mid`, spread by a tenth of it either way.
pub(crate) fn stats(count: u64, mid: f64) -> Stats {
    Stats {
        count,
        avg: Some(mid * 1.01),
        min: Some(mid * 0.5),
        max: Some(mid * 3.0),
        p50: Some(mid),
        p90: Some(mid * 1.6),
        p99: Some(mid * 2.4),
        std: Some(mid * 0.3),
    }
}

/// `n` buckets of `phase` from `first`, hit rate rising from 0 to `top`.
pub(crate) fn buckets(phase: &str, first: u64, n: u64, top: f64, reported: bool) -> Vec<Bucket> {
    (0..n)
        .map(|i| {
            let prompt = 4000 + 100 * (i % 7);
            let hit = top * i as f64 / n.max(2) as f64;
            let cached = (prompt as f64 * hit) as u64;
            Bucket {
                index: first + i,
                phase: phase.into(),
                requests: 4,
                prompt_tokens: prompt,
                predicted_cached: cached,
                reported_cached: reported.then_some(cached - cached / 20),
                reported_prompt_tokens: reported.then_some(prompt),
                ttft_ms_mean: Some(30.0 + 50.0 * (1.0 - hit)),
            }
        })
        .collect()
}

/// Warmup then profiling on two targets, the upstream reporting; 3 cross-session and 1
/// collision breach in profiling × first_turn_prefix; 12 unaccounted requests; a gateway note.
pub(crate) fn two_phases() -> Report {
    let mut r = empty();
    r.run.benchmark_id = "bench-7f3a".into();
    r.run.elapsed_s = 3723.0;
    r.cache_model.indexed_blocks = 123_456;
    r.cache_model.unaccounted = BTreeMap::from([
        ("queue_full".to_string(), 10),
        ("unparseable".to_string(), 2),
        ("template_error".to_string(), 0),
    ]);
    r.cache_model.topology = "shared".into();
    r.cache_model.note = Some(
        "the upstream is a Service: predictions assume one cache shared by its replicas; \
         run kvbust as a sidecar for exact figures"
            .into(),
    );
    r.upstream = UpstreamFacts {
        reports_cached_tokens: Some(true),
        responses_with_usage: 640,
        hint: None,
    };
    let mut breached = row("profiling", "first_turn_prefix", 300, 0.62, true);
    breached.breaches = Breaches {
        cross_session: 3,
        warmup_reuse: 0,
        session_collision: 1,
    };
    breached.divergent_requests = 7;
    breached.accounted_requests = 288;
    breached.errors = Errors {
        count: 5,
        by_status: BTreeMap::from([("502".to_string(), 3), ("aborted".to_string(), 2)]),
        by_side: BTreeMap::from([("upstream".to_string(), 3), ("client".to_string(), 2)]),
    };
    breached.throughput.successful_requests = 295;
    r.verdict = Verdict {
        isolation: Isolation::Breached,
        reused_from_warmup_tokens: 0,
        cross_session_tokens: 18_400,
        warmup_share: None,
        message: "isolation breached: 18,400 prompt tokens crossed sessions past the isolation \
                  point in profiling × first_turn_prefix (4 requests); send a session header"
            .into(),
    };
    r.rows = vec![
        row("warmup", "system_prefix", 20, 0.1, true),
        row("warmup", "first_turn_prefix", 20, 0.05, true),
        row("profiling", "system_prefix", 300, 0.81, true),
        breached,
    ];
    r.timeline.bucket_s = 2.0;
    r.timeline.buckets = buckets("warmup", 0, 10, 0.2, true);
    r.timeline
        .buckets
        .extend(buckets("profiling", 10, 50, 0.85, true));
    r
}

/// Profiling only, one target.
pub(crate) fn one_phase() -> Report {
    let mut r = empty();
    r.upstream.reports_cached_tokens = Some(true);
    r.upstream.responses_with_usage = 50;
    r.rows = vec![row("profiling", "system_prefix", 50, 0.5, true)];
    r.timeline.buckets = buckets("profiling", 0, 5, 0.6, true);
    r
}

/// Both phases, one target, and an upstream that says nothing about its cache.
pub(crate) fn silent_upstream() -> Report {
    let mut r = empty();
    r.upstream = UpstreamFacts {
        reports_cached_tokens: Some(false),
        responses_with_usage: 64,
        hint: Some("add --enable-prompt-tokens-details to vLLM's arguments".into()),
    };
    r.rows = vec![
        row("warmup", "system_prefix", 10, 0.1, false),
        row("profiling", "system_prefix", 40, 0.7, false),
    ];
    r.timeline.buckets = buckets("warmup", 0, 3, 0.1, false);
    r.timeline
        .buckets
        .extend(buckets("profiling", 3, 8, 0.7, false));
    r
}

/// A dialled run (`x-kvbust-hit-ratio: 0.5`, target `none`): warmup without a dial, then
/// profiling under it, the upstream reporting.
pub(crate) fn dialled() -> Report {
    let mut r = empty();
    r.run.name = "r0.5".into();
    r.upstream.reports_cached_tokens = Some(true);
    r.upstream.responses_with_usage = 120;
    let mut profiling = row("profiling", "none", 60, 0.5, true);
    profiling.hit_ratio = Some(0.5);
    profiling.dialled_requests = 60;
    r.rows = vec![row("warmup", "none", 60, 0.0, true), profiling];
    r.verdict.warmup_share = Some(0.5);
    r.verdict.message = "Isolation not requested (target none): 50.0% of profiling prompt tokens \
                         (30000 of 60000) were served from warmup's cache, as the dial \
                         (hit_ratio 0.5) allows."
        .into();
    r.timeline.buckets = buckets("warmup", 0, 3, 0.0, true);
    r.timeline
        .buckets
        .extend(buckets("profiling", 3, 5, 0.5, true));
    r
}
