//! What `aiperf synthesize agentic-code` writes, as bytes: the mooncake `dataset.jsonl`
//! (incremental rows, fresh hash ids after each session's first turn), `manifest.json` and
//! `quality.json` (orjson's two-space layout). Owns the serialisation and the quality figures;
//! the caller writes the files.

use serde::Serialize;

use crate::synth::dataset::agentic_code::config::DistributionConfig;
use crate::synth::dataset::agentic_code::sessions::{EndReason, SynthSession};
use crate::synth::rng::numpy_dist::pairwise_sum;

/// Python's `round(x, digits)`: the exact value rounded to `digits` decimals.
pub fn py_round(x: f64, digits: usize) -> f64 {
    format!("{x:.digits$}").parse().unwrap_or(x)
}

#[derive(Serialize)]
struct Row<'a> {
    session_id: &'a str,
    input_length: i64,
    output_length: i64,
    hash_ids: &'a [i64],
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_restart: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<f64>,
}

fn to_json<T: Serialize>(v: &T, pretty: bool) -> String {
    // Plain structs of numbers, strings and lists always serialise.
    #[allow(clippy::expect_used)] // the invariant is named at the expect
    let s = if pretty {
        serde_json::to_string_pretty(v)
    } else {
        serde_json::to_string(v)
    }
    .expect("plain data serialises");
    s
}

/// `dataset.jsonl`: one row per turn; a row's `input_length` is the turn's new tokens.
pub fn dataset_jsonl(sessions: &[SynthSession], block_size: i64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut next_id = 0i64;
    let mut fresh = Vec::new();
    for s in sessions {
        for t in &s.turns {
            let first = t.turn_index == 0;
            let ids: &[i64] = if first {
                if let Some(m) = t.hash_ids.iter().max() {
                    next_id = next_id.max(m + 1);
                }
                &t.hash_ids
            } else {
                let n = (t.new_tokens + block_size - 1).div_euclid(block_size);
                fresh.clear();
                fresh.extend(next_id..next_id + n);
                next_id += n;
                &fresh
            };
            let row = Row {
                session_id: &s.session_id,
                input_length: t.new_tokens,
                output_length: t.output_length,
                hash_ids: ids,
                timestamp: first.then(|| py_round(t.timestamp_ms, 1)),
                group_id: first.then_some(s.group_id),
                is_restart: (first && s.is_restart_continuation).then_some(true),
                delay: (!first).then(|| py_round(t.delay_ms, 1)),
            };
            out.extend_from_slice(to_json(&row, false).as_bytes());
            out.push(b'\n');
        }
    }
    out
}

#[derive(Serialize)]
struct Manifest<'a> {
    seed: u64,
    num_sessions: usize,
    config_name: Option<&'a str>,
    generation_params: &'a DistributionConfig,
}

/// `manifest.json`: the seed, the number of sessions written and the full config.
pub fn manifest_json(
    seed: u64,
    sessions: usize,
    config_name: Option<&str>,
    cfg: &DistributionConfig,
) -> String {
    to_json(
        &Manifest {
            seed,
            num_sessions: sessions,
            config_name,
            generation_params: cfg,
        },
        true,
    )
}

/// AIPerf's `PercentileStats` (rounded to 2 decimals, as `percentile_stats` does).
#[derive(Serialize, Clone, Copy, Default)]
struct Stats {
    count: usize,
    mean: f64,
    std: f64,
    median: f64,
    p05: f64,
    p25: f64,
    p75: f64,
    p95: f64,
    p99: f64,
}

/// numpy's linear `percentile` over sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q / 100.0 * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let t = pos - lo as f64;
    let (a, b) = (sorted[lo], sorted[hi]);
    if t >= 0.5 {
        b - (b - a) * (1.0 - t)
    } else {
        a + (b - a) * t
    }
}

fn stats(values: &[f64]) -> Stats {
    if values.is_empty() {
        return Stats::default();
    }
    let n = values.len() as f64;
    let mean = pairwise_sum(values) / n;
    let sq: Vec<f64> = values.iter().map(|v| (v - mean) * (v - mean)).collect();
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    };
    let r = |x: f64| py_round(x, 2);
    Stats {
        count: values.len(),
        mean: r(mean),
        std: r((pairwise_sum(&sq) / n).sqrt()),
        median: r(median),
        p05: r(percentile(&sorted, 5.0)),
        p25: r(percentile(&sorted, 25.0)),
        p75: r(percentile(&sorted, 75.0)),
        p95: r(percentile(&sorted, 95.0)),
        p99: r(percentile(&sorted, 99.0)),
    }
}

#[derive(Serialize)]
struct Metric {
    target_mean: Option<f64>,
    target_median: Option<f64>,
    observed: Stats,
    pct_error_mean: Option<f64>,
    pct_error_median: Option<f64>,
}

fn metric(values: &[f64], target_mean: Option<f64>, target_median: Option<f64>) -> Metric {
    let observed = stats(values);
    let err = |target: f64, seen: f64| {
        if target == 0.0 {
            0.0
        } else {
            py_round((seen - target).abs() / target * 100.0, 2)
        }
    };
    Metric {
        target_mean,
        target_median,
        observed,
        pct_error_mean: target_mean.map(|t| err(t, observed.mean)),
        pct_error_median: target_median.map(|t| err(t, observed.median)),
    }
}

/// A `config_summary` value: Python keeps ints and floats apart.
#[derive(Serialize)]
#[serde(untagged)]
enum Num {
    Int(i64),
    Float(f64),
}

fn config_summary(cfg: &DistributionConfig) -> Vec<(&'static str, Num)> {
    let c = &cfg.cache;
    let (l1, l15) = (c.layer1_tokens, c.layer1_5_tokens);
    let fixed = (l1 + l15) as f64;
    let mut s = vec![
        ("initial_context_mean", Num::Float(fixed + c.layer2.mean)),
        (
            "initial_context_median",
            Num::Float(fixed + c.layer2.median),
        ),
        ("layer1_tokens", Num::Int(l1)),
        ("layer1_5_tokens", Num::Int(l15)),
        ("layer2_mean", Num::Float(c.layer2.mean)),
        ("layer2_median", Num::Float(c.layer2.median)),
        ("num_groups", Num::Int(c.layer1_5_groups.num_groups)),
        ("zipf_alpha", Num::Float(c.layer1_5_groups.zipf_alpha)),
        (
            "new_tokens_per_turn_mean",
            Num::Float(cfg.new_tokens_per_turn.dist.mean),
        ),
        (
            "new_tokens_per_turn_median",
            Num::Float(cfg.new_tokens_per_turn.dist.median),
        ),
        (
            "generation_length_mean",
            Num::Float(cfg.generation_length.mean),
        ),
        (
            "generation_length_median",
            Num::Float(cfg.generation_length.median),
        ),
        ("max_prompt_tokens", Num::Int(cfg.max_prompt_tokens)),
        ("block_size", Num::Int(cfg.block_size)),
        (
            "inter_turn_delay_agentic_fraction",
            Num::Float(cfg.inter_turn_delay.agentic_fraction),
        ),
        (
            "inter_turn_delay_agentic_mean_ms",
            Num::Float(cfg.inter_turn_delay.agentic_delay.mean),
        ),
        (
            "inter_turn_delay_human_mean_ms",
            Num::Float(cfg.inter_turn_delay.human_delay.mean),
        ),
        (
            "turn_mode_enabled",
            Num::Int(i64::from(cfg.turns.is_some())),
        ),
    ];
    if let Some(r) = &cfg.reset {
        s.push(("reset_base_probability", Num::Float(r.base_probability)));
        s.push(("reset_context_scaling", Num::Float(r.context_scaling)));
    }
    if let Some(t) = &cfg.turns {
        s.push(("turns_mean", Num::Int(t.mean)));
        s.push(("turns_median", Num::Int(t.median)));
        s.push(("turns_min", Num::Int(t.min)));
        s.push(("turns_max", Num::Int(t.max)));
        s.push((
            "turns_allow_truncation",
            Num::Int(i64::from(t.allow_truncation)),
        ));
        if let Some(a) = t.max_session_attempts {
            s.push(("turns_max_session_attempts", Num::Int(a)));
        }
    }
    s
}

/// An ordered JSON object from pairs (serde_json's map would sort the keys).
struct Ordered<T>(Vec<(&'static str, T)>);

impl<T: Serialize> Serialize for Ordered<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct EndStats {
    total_sessions: usize,
    forced_retires: usize,
    probabilistic_resets: usize,
    target_turn_completions: usize,
    restart_splits: usize,
    retire_fraction: f64,
    reset_fraction: f64,
    target_turn_fraction: f64,
    restart_split_fraction: f64,
    final_context_utilization: Stats,
}

#[derive(Serialize)]
struct Quality {
    config_summary: Ordered<Num>,
    observed_vs_target: Ordered<Metric>,
    session_stats: Stats,
    session_end_stats: EndStats,
}

fn end_stats(sessions: &[SynthSession], cfg: &DistributionConfig) -> EndStats {
    let count = |r: EndReason| sessions.iter().filter(|s| s.end_reason == r).count();
    let total = sessions.len();
    let frac = |n: usize| py_round(n as f64 / total.max(1) as f64, 4);
    let mut fcu: Vec<f64> = sessions
        .iter()
        .filter_map(|s| s.turns.last())
        .map(|t| t.input_length as f64 / cfg.max_prompt_tokens as f64)
        .collect();
    if fcu.is_empty() {
        fcu.push(0.0);
    }
    let (f, p, t, r) = (
        count(EndReason::ForcedRetire),
        count(EndReason::ProbabilisticReset),
        count(EndReason::TargetTurnCount),
        count(EndReason::RestartSplit),
    );
    EndStats {
        total_sessions: total,
        forced_retires: f,
        probabilistic_resets: p,
        target_turn_completions: t,
        restart_splits: r,
        retire_fraction: frac(f),
        reset_fraction: frac(p),
        target_turn_fraction: frac(t),
        restart_split_fraction: frac(r),
        final_context_utilization: stats(&fcu),
    }
}

/// `quality.json`: observed distributions against the config's targets, and how sessions ended.
pub fn quality_json(sessions: &[SynthSession], cfg: &DistributionConfig) -> String {
    let (mut initial, mut new_tokens, mut outputs, mut delays) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut tps: Vec<f64> = Vec::new();
    for s in sessions {
        tps.push(s.turns.len() as f64);
        for t in &s.turns {
            if t.turn_index == 0 {
                initial.push(t.input_length as f64);
            } else {
                new_tokens.push(t.new_tokens as f64);
                delays.push(t.delay_ms);
            }
            outputs.push(t.output_length as f64);
        }
    }
    let c = &cfg.cache;
    let fixed = (c.layer1_tokens + c.layer1_5_tokens) as f64;
    let mut observed = Vec::new();
    let mut add = |name, v: &[f64], mean, median| {
        if !v.is_empty() {
            observed.push((name, metric(v, mean, median)));
        }
    };
    add(
        "initial_context",
        &initial,
        Some(fixed + c.layer2.mean),
        Some(fixed + c.layer2.median),
    );
    let g = &cfg.generation_length;
    add("generation_length", &outputs, Some(g.mean), Some(g.median));
    let n = &cfg.new_tokens_per_turn.dist;
    add(
        "new_tokens_per_turn",
        &new_tokens,
        Some(n.mean),
        Some(n.median),
    );
    add("inter_turn_delay_ms", &delays, None, None);
    let turns = cfg.turns.as_ref();
    add(
        "turns_per_session",
        &tps,
        turns.map(|t| t.mean as f64),
        turns.map(|t| t.median as f64),
    );
    if tps.is_empty() {
        tps.push(0.0);
    }
    to_json(
        &Quality {
            config_summary: Ordered(config_summary(cfg)),
            observed_vs_target: Ordered(observed),
            session_stats: stats(&tps),
            session_end_stats: end_stats(sessions, cfg),
        },
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_rounding_and_numpy_stats() {
        assert_eq!(py_round(19358.34999, 1), 19358.3);
        assert_eq!(py_round(2.675, 2), 2.67); // 2.675 is 2.67499999… in binary
        let s = stats(&[1.0, 2.0, 4.0, 8.0]);
        assert_eq!((s.median, s.p25, s.p75, s.mean), (3.0, 1.75, 5.0, 3.75));
        assert_eq!(stats(&[]).count, 0);
    }
}
