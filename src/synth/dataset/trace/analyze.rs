//! `kvbust analyze-trace`: the statistics of AIPerf 0.13.0's `PrefixAnalyzer` (what
//! `aiperf analyze-trace --output-file` writes) over a trace's requests — ISL/OSL, context
//! (repeated-block) and unique-prompt lengths, and the theoretical infinite-cache hit rates.
//! Owns the figures and the reading of a hash-id JSONL trace into rows; must never build
//! prompts or write files.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Serialize;

use crate::synth::error::TraceError;

/// One request as the analyzer sees it (`input_length`, `output_length`, `hash_ids`; a missing
/// field counts as 0 / none, as AIPerf's `trace.get(key, 0)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Row {
    pub input_length: i64,
    pub output_length: i64,
    pub hash_ids: Vec<i64>,
}

/// The default of `analyze-trace --max-blocks`: hash-id blocks counted in all. The analyzer
/// keeps a prefix-trie node, a (position, id) count and a seen id per distinct block, about 100
/// bytes each when none repeat, so 8Mi blocks is under 1 GiB however the trace is shaped (a
/// million-request mooncake trace of 8 blocks a request fits).
pub const DEFAULT_MAX_BLOCKS: u64 = 8 << 20;

/// Refuses rows holding more than `max` hash-id blocks in all, naming the request (by its
/// place) that passed it.
pub fn check_blocks(path: &Path, rows: &[Row], max: u64) -> Result<(), TraceError> {
    let mut blocks = 0u64;
    for (i, row) in rows.iter().enumerate() {
        blocks += row.hash_ids.len() as u64;
        if blocks > max {
            return Err(TraceError::File {
                path: path.to_path_buf(),
                message: format!(
                    "request {} takes the trace to {blocks} hash-id blocks, more than \
                     --max-blocks ({max}); the analysis holds about 100 bytes a block, so raise \
                     --max-blocks if the machine has the memory, or analyze part of the trace",
                    i + 1
                ),
            });
        }
    }
    Ok(())
}

/// AIPerf's `MetricStats`: numpy's mean, population std, min, linear percentiles and max.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MetricStats {
    pub mean: f64,
    pub std_dev: f64,
    pub min: f64,
    pub p25: f64,
    pub median: f64,
    pub p75: f64,
    pub max: f64,
}

/// AIPerf's `AnalysisStats`, field for field and in its order (the JSON keys).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnalysisStats {
    pub total_requests: u64,
    pub unique_prefixes: u64,
    pub num_prefix_groups: u64,
    pub cache_hit_rate: f64,
    pub min_isl: i64,
    pub max_isl: i64,
    pub avg_isl: f64,
    pub min_osl: i64,
    pub max_osl: i64,
    pub avg_osl: f64,
    pub prefix_reuse_ratio: f64,
    pub isl_stats: Option<MetricStats>,
    pub osl_stats: Option<MetricStats>,
    pub context_length_stats: Option<MetricStats>,
    pub unique_prompt_length_stats: Option<MetricStats>,
    pub hit_rate_stats: Option<MetricStats>,
}

impl AnalysisStats {
    /// The JSON `--output-file` gets (pydantic's `model_dump_json(indent=2)` layout).
    pub fn to_json_pretty(&self) -> String {
        // Plain numbers and options of them always serialise.
        #[allow(clippy::expect_used)] // the invariant is named at the expect
        serde_json::to_string_pretty(self).expect("stats serialise")
    }
}

/// numpy's `percentile(values, q)` (linear interpolation) over sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q / 100.0 * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let t = pos - lo as f64;
    let (a, b) = (sorted[lo], sorted[hi]);
    // numpy's `_lerp`: from the far end when t >= 0.5, which keeps it monotonic.
    if t >= 0.5 {
        b - (b - a) * (1.0 - t)
    } else {
        a + (b - a) * t
    }
}

/// `_compute_metric_stats`: `None` for no values.
pub fn metric_stats(values: &[f64]) -> Option<MetricStats> {
    if values.is_empty() {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(MetricStats {
        mean,
        std_dev: var.sqrt(),
        min: sorted[0],
        p25: percentile(&sorted, 25.0),
        median: percentile(&sorted, 50.0),
        p75: percentile(&sorted, 75.0),
        max: sorted[sorted.len() - 1],
    })
}

/// The prefix trie's counts: how many requests carry each distinct hash-id prefix.
fn prefix_counts(rows: &[Row]) -> Vec<u64> {
    // Node 0 is the empty prefix; a prefix is (parent node, next hash id).
    let mut children: HashMap<(usize, i64), usize> = HashMap::new();
    let mut counts: Vec<u64> = vec![0];
    for row in rows {
        let mut node = 0usize;
        for &h in &row.hash_ids {
            let next = counts.len();
            node = *children.entry((node, h)).or_insert(next);
            if node == next {
                counts.push(0);
            }
            counts[node] += 1;
        }
    }
    counts.remove(0);
    counts
}

/// Per request with hash ids: the share of its blocks before the first one never seen before.
fn hit_rates(rows: &[Row]) -> Vec<f64> {
    let mut seen: HashSet<i64> = HashSet::new();
    let mut rates = Vec::new();
    for row in rows.iter().filter(|r| !r.hash_ids.is_empty()) {
        let first_unseen = row
            .hash_ids
            .iter()
            .position(|h| !seen.contains(h))
            .unwrap_or(row.hash_ids.len());
        rates.push(first_unseen as f64 / row.hash_ids.len() as f64);
        seen.extend(row.hash_ids.iter().copied());
    }
    rates
}

/// Context (blocks whose (position, id) pair recurs, in tokens; the whole input when all do)
/// and unique-prompt lengths per request.
fn context_lengths(rows: &[Row], block_size: u64) -> (Vec<f64>, Vec<f64>) {
    let mut pairs: HashMap<(usize, i64), u32> = HashMap::new();
    for row in rows {
        for (pos, &h) in row.hash_ids.iter().enumerate() {
            *pairs.entry((pos, h)).or_insert(0) += 1;
        }
    }
    let repeated = |pos: usize, h: i64| pairs.get(&(pos, h)).is_some_and(|&c| c > 1);
    let mut context = Vec::with_capacity(rows.len());
    let mut unique = Vec::with_capacity(rows.len());
    for row in rows {
        let count = row
            .hash_ids
            .iter()
            .enumerate()
            .filter(|(pos, &h)| repeated(*pos, h))
            .count();
        let (ctx, uniq) = if row.hash_ids.is_empty() {
            (0, row.input_length)
        } else if count == row.hash_ids.len() {
            (row.input_length, 0)
        } else {
            let ctx = count as i64 * block_size as i64;
            (ctx, row.input_length - ctx)
        };
        context.push(ctx as f64);
        unique.push(uniq as f64);
    }
    (context, unique)
}

/// `PrefixAnalyzer(block_size).analyze_traces(rows)`.
pub fn analyze(rows: &[Row], block_size: u64) -> AnalysisStats {
    let counts = prefix_counts(rows);
    let total: u64 = counts.iter().sum();
    let reused: u64 = counts.iter().filter(|&&c| c > 1).sum();
    let mut first_blocks: HashMap<i64, u32> = HashMap::new();
    for row in rows {
        if let Some(&h) = row.hash_ids.first() {
            *first_blocks.entry(h).or_insert(0) += 1;
        }
    }
    let rates = hit_rates(rows);
    let (context, unique) = context_lengths(rows, block_size);
    let isl: Vec<i64> = rows.iter().map(|r| r.input_length).collect();
    let osl: Vec<i64> = rows.iter().map(|r| r.output_length).collect();
    let avg = |v: &[i64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64
        }
    };
    let as_f64 = |v: &[i64]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    AnalysisStats {
        total_requests: rows.len() as u64,
        unique_prefixes: counts.len() as u64,
        num_prefix_groups: first_blocks.values().filter(|&&c| c > 1).count() as u64,
        cache_hit_rate: if rates.is_empty() {
            0.0
        } else {
            rates.iter().sum::<f64>() / rates.len() as f64
        },
        min_isl: isl.iter().copied().min().unwrap_or(0),
        max_isl: isl.iter().copied().max().unwrap_or(0),
        avg_isl: avg(&isl),
        min_osl: osl.iter().copied().min().unwrap_or(0),
        max_osl: osl.iter().copied().max().unwrap_or(0),
        avg_osl: avg(&osl),
        prefix_reuse_ratio: if total > 0 {
            reused as f64 / total as f64
        } else {
            0.0
        },
        isl_stats: metric_stats(&as_f64(&isl)),
        osl_stats: metric_stats(&as_f64(&osl)),
        context_length_stats: metric_stats(&context),
        unique_prompt_length_stats: metric_stats(&unique),
        hit_rate_stats: metric_stats(&rates),
    }
}

#[derive(serde::Deserialize)]
struct Line {
    #[serde(default)]
    input_length: Option<i64>,
    #[serde(default)]
    output_length: Option<i64>,
    #[serde(default)]
    hash_ids: Option<Vec<i64>>,
}

/// The rows of a hash-id JSONL trace (mooncake_trace, bailian_trace or any JSON lines with
/// these keys), read as AIPerf's analyzer reads them: every non-blank line is a JSON object,
/// other keys ignored.
pub fn rows_from_jsonl(path: &Path, text: &str) -> Result<Vec<Row>, TraceError> {
    let lines: Vec<(usize, String)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim().to_owned()))
        .filter(|(_, l)| !l.is_empty())
        .collect();
    rows_from_lines(path, &lines)
}

/// [`rows_from_jsonl`] on lines already split (non-blank, trimmed, numbered).
pub fn rows_from_lines(path: &Path, lines: &[(usize, String)]) -> Result<Vec<Row>, TraceError> {
    let mut rows = Vec::new();
    for (i, line) in lines {
        let parsed: Line = serde_json::from_str(line).map_err(|e| TraceError::Line {
            path: path.to_path_buf(),
            line: *i,
            message: format!(
                "is not a trace object with integer `input_length`, `output_length` and a \
                 `hash_ids` list of integers: {e}"
            ),
        })?;
        rows.push(Row {
            input_length: parsed.input_length.unwrap_or(0),
            output_length: parsed.output_length.unwrap_or(0),
            hash_ids: parsed.hash_ids.unwrap_or_default(),
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(isl: i64, osl: i64, ids: &[i64]) -> Row {
        Row {
            input_length: isl,
            output_length: osl,
            hash_ids: ids.to_vec(),
        }
    }

    #[test]
    fn percentiles_follow_numpy_linear() {
        let s = [1.0, 2.0, 4.0, 8.0];
        assert_eq!(percentile(&s, 25.0), 1.75);
        assert_eq!(percentile(&s, 50.0), 3.0);
        assert_eq!(percentile(&s, 75.0), 5.0);
        assert_eq!(percentile(&[7.0], 75.0), 7.0);
    }

    #[test]
    fn prefixes_hits_and_context() {
        let rows = [
            row(1030, 5, &[1, 2, 3]),
            row(1024, 7, &[1, 2]),
            row(40, 1, &[]),
            row(600, 3, &[9, 2]),
        ];
        let s = analyze(&rows, 512);
        assert_eq!(s.total_requests, 4);
        // Prefixes (1) (1,2) (1,2,3) (9) (9,2); (1) and (1,2) are reused.
        assert_eq!(s.unique_prefixes, 5);
        assert_eq!(s.prefix_reuse_ratio, 4.0 / 7.0);
        assert_eq!(s.num_prefix_groups, 1);
        // Hit rates: 0, 1 (both seen), 0 (9 unseen first).
        assert_eq!(s.cache_hit_rate, 1.0 / 3.0);
        let ctx = s.context_length_stats.unwrap();
        // 1024 (two repeated blocks), 1024 (all repeated: the whole input), 0, 512 ((1,2)).
        assert_eq!(ctx.max, 1024.0);
        assert_eq!(ctx.mean, (1024.0 + 1024.0 + 0.0 + 512.0) / 4.0);
        assert_eq!(s.unique_prompt_length_stats.unwrap().min, 0.0);
        assert_eq!(s.min_isl, 40);
        assert_eq!(s.avg_osl, 4.0);
    }

    #[test]
    fn an_empty_trace_has_no_distributions() {
        let s = analyze(&[], 512);
        assert_eq!(s.total_requests, 0);
        assert!(s.isl_stats.is_none() && s.hit_rate_stats.is_none());
        let json: serde_json::Value = serde_json::from_str(&s.to_json_pretty()).unwrap();
        assert_eq!(json["isl_stats"], serde_json::Value::Null);
        assert_eq!(json["avg_isl"], 0.0);
    }
}
