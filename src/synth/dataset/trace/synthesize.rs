//! AIPerf 0.13.0's trace `Synthesizer` (`--synthesis-speedup-ratio`, `--synthesis-prefix-len-
//! multiplier`, `--synthesis-prefix-root-multiplier`, `--synthesis-prompt-len-multiplier`,
//! `--synthesis-output-len-multiplier`): reshapes a hash-id trace's shared prefixes, unique
//! prompts, output lengths and timestamps before its prompts are built, drawing the prefix-root
//! choices from the same seeded stream. Owns only that rewrite of parsed trace entries; must
//! never read files or build prompt text.

use std::collections::{HashMap, HashSet};

use serde_json::Number;

use crate::synth::dataset::trace::record::{Entry, Input};
use crate::synth::dataset::trace_kind::TraceKind;
use crate::synth::rng::PyRandom;

/// The derived stream the prefix-root choices come from (`rng.derive(...)` in AIPerf).
pub const RNG_STREAM: &str = "dataset.synthesis.synthesizer";

/// The five multipliers (AIPerf's `SynthesisConfig`; all 1 = off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Multipliers {
    pub speedup_ratio: f64,
    pub prefix_len: f64,
    pub prefix_root: u64,
    pub prompt_len: f64,
    pub output_len: f64,
}

impl Default for Multipliers {
    fn default() -> Self {
        Multipliers {
            speedup_ratio: 1.0,
            prefix_len: 1.0,
            prefix_root: 1,
            prompt_len: 1.0,
            output_len: 1.0,
        }
    }
}

impl Multipliers {
    /// AIPerf runs the Synthesizer only when one of them is not 1.
    pub fn is_active(&self) -> bool {
        *self != Multipliers::default()
    }
}

/// A line whose `input_length` is shorter than its shared prefix blocks (AIPerf raises).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixLongerThanInput {
    pub line: usize,
    pub input_length: i64,
    pub prefix_tokens: i64,
}

/// `_apply_multipliers`: each entry's new hash ids and input length, in entry order.
fn apply(
    entries: &[&Entry],
    m: &Multipliers,
    block_size: i64,
    rng: &mut PyRandom,
) -> Result<Vec<(Vec<i64>, i64)>, PrefixLongerThanInput> {
    let mut counter: HashMap<i64, u32> = HashMap::new();
    for e in entries {
        for &h in &e.hash_ids {
            *counter.entry(h).or_insert(0) += 1;
        }
    }
    let shared: HashSet<i64> = counter
        .iter()
        .filter(|(_, &c)| c > 1)
        .map(|(&h, _)| h)
        .collect();
    let stretch = if m.prefix_len > 1.0 {
        m.prefix_len as i64
    } else {
        1
    };
    // New ids start past every stretched shared id.
    let mut max_id = (shared.iter().copied().max().unwrap_or(0) + 1) * stretch;
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let input_len = input_length(e).unwrap_or(0);
        if e.hash_ids.is_empty() {
            out.push((Vec::new(), input_len));
            continue;
        }
        let prefix: Vec<i64> = e
            .hash_ids
            .iter()
            .copied()
            .take_while(|h| shared.contains(h))
            .collect();
        let prefix_tokens = prefix.len() as i64 * block_size;
        let prompt_len = input_len - prefix_tokens;
        if prompt_len < 0 {
            return Err(PrefixLongerThanInput {
                line: e.line,
                input_length: input_len,
                prefix_tokens,
            });
        }
        let (mut ids, new_prefix_len) = if m.prefix_len > 1.0 {
            let mut ids: Vec<i64> = prefix
                .iter()
                .flat_map(|h| (0..stretch).map(move |j| h * stretch + j))
                .collect();
            let target = (prefix.len() as f64 * m.prefix_len).ceil() as i64;
            let extra = target - ids.len() as i64;
            if extra > 0 {
                ids.extend(max_id + 1..max_id + 1 + extra);
                max_id += extra;
            }
            let len = ids.len() as i64 * block_size;
            (ids, len)
        } else if m.prefix_len < 1.0 {
            // AIPerf keeps at least one block's worth of prefix length, even with no prefix.
            let blocks = ((prefix.len() as f64 * m.prefix_len) as i64).max(1);
            let kept = prefix.iter().copied().take(blocks as usize).collect();
            (kept, blocks * block_size)
        } else {
            (prefix, prefix_tokens)
        };
        let new_prompt_len = (prompt_len as f64 * m.prompt_len) as i64;
        let prompt_blocks = (new_prompt_len + block_size - 1).div_euclid(block_size);
        ids.extend(max_id + 1..max_id + 1 + prompt_blocks);
        max_id += prompt_blocks;
        out.push((ids, new_prefix_len + new_prompt_len));
    }
    if m.prefix_root > 1 {
        let offset_base = max_id + 1;
        for (ids, _) in out.iter_mut().filter(|(ids, _)| !ids.is_empty()) {
            let tree = rng.randint(0, m.prefix_root as i64 - 1);
            if tree > 0 {
                for h in ids.iter_mut() {
                    *h += tree * offset_base;
                }
            }
        }
    }
    Ok(out)
}

fn input_length(e: &Entry) -> Option<i64> {
    match e.input {
        Input::Length(n) => Some(n),
        _ => None,
    }
}

/// Python's `round(x)`: halves to even.
fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

/// Rewrites the sessions' entries (in session order, as AIPerf flattens them) with the
/// multipliers; `rng` is the `dataset.synthesis.synthesizer` stream. `max_isl` clamps the new
/// input lengths and `max_osl` caps the scaled output lengths, as AIPerf's Synthesizer does.
pub fn synthesize(
    sessions: &mut [(String, Vec<Entry>)],
    kind: TraceKind,
    m: &Multipliers,
    block_size: usize,
    limits: (Option<i64>, Option<i64>),
    rng: &mut PyRandom,
) -> Result<(), PrefixLongerThanInput> {
    let (max_isl, max_osl) = limits;
    let block = block_size as i64;
    let flat: Vec<&Entry> = sessions.iter().flat_map(|(_, es)| es.iter()).collect();
    let rewritten = apply(&flat, m, block, rng)?;
    let entries = sessions.iter_mut().flat_map(|(_, es)| es.iter_mut());
    for (e, (ids, new_isl)) in entries.zip(rewritten) {
        let mut isl = new_isl;
        if ids.is_empty() {
            // No new ids: the line's own length (the block size when it has none).
            isl = input_length(e).unwrap_or(block);
            if kind == TraceKind::MooncakeTrace {
                e.hash_ids.clear();
            }
            // Bailian's reconstruction falls back to the line's own hash ids.
        } else {
            e.hash_ids = ids;
        }
        if let Some(cap) = max_isl.filter(|&c| c > 0 && isl > c) {
            isl = cap;
        }
        if let Input::Length(n) = &mut e.input {
            *n = isl;
        }
        if let Some(ts) = e.timestamp.as_ref().and_then(Number::as_f64) {
            let scaled = (ts / m.speedup_ratio).trunc() as i64;
            // Bailian's model holds a float timestamp; mooncake keeps Python's int.
            e.timestamp = if kind == TraceKind::BailianTrace {
                Number::from_f64(scaled as f64)
            } else {
                Some(Number::from(scaled))
            };
        }
        if let Some(ol) = e.output_length {
            let mut scaled = round_half_even(ol as f64 * m.output_len) as i64;
            if let Some(cap) = max_osl {
                scaled = scaled.min(cap);
            }
            e.output_length = Some(scaled.max(1));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(line: usize, isl: i64, ids: &[i64]) -> Entry {
        Entry {
            line,
            input: Input::Length(isl),
            output_length: Some(5),
            hash_ids: ids.to_vec(),
            timestamp: Some(Number::from(1001)),
            delay: None,
            session_id: None,
            chat: None,
            extra: None,
        }
    }

    #[test]
    fn python_round_halves_to_even() {
        assert_eq!(round_half_even(2.5), 2.0);
        assert_eq!(round_half_even(3.5), 4.0);
        assert_eq!(round_half_even(7.5), 8.0);
        assert_eq!(round_half_even(2.6), 3.0);
        assert_eq!(round_half_even(0.5), 0.0);
    }

    #[test]
    fn stretch_and_prompt_blocks() {
        let mut sessions = vec![
            ("a".to_owned(), vec![entry(1, 20, &[1, 2, 3])]),
            ("b".to_owned(), vec![entry(2, 25, &[1, 2, 9])]),
        ];
        let m = Multipliers {
            prefix_len: 2.0,
            speedup_ratio: 2.0,
            output_len: 0.5,
            ..Multipliers::default()
        };
        let mut rng = PyRandom::new(0);
        synthesize(
            &mut sessions,
            TraceKind::MooncakeTrace,
            &m,
            8,
            (None, None),
            &mut rng,
        )
        .unwrap();
        // Shared 1, 2 → max id (2+1)*2 = 6; stretched [2,3,4,5], prompt 4 tokens → 1 block (7).
        let a = &sessions[0].1[0];
        assert_eq!(a.hash_ids, vec![2, 3, 4, 5, 7]);
        assert_eq!(a.input, Input::Length(32 + 4));
        assert_eq!(a.timestamp, Some(Number::from(500)));
        // round(2.5) = 2 in Python.
        assert_eq!(a.output_length, Some(2));
        let b = &sessions[1].1[0];
        assert_eq!(b.hash_ids, vec![2, 3, 4, 5, 8, 9]);
        assert_eq!(b.input, Input::Length(32 + 9));
    }

    #[test]
    fn a_prefix_longer_than_the_input_is_refused() {
        let mut sessions = vec![(
            "a".to_owned(),
            vec![entry(1, 20, &[1, 2, 3]), entry(2, 4, &[1, 2])],
        )];
        let m = Multipliers {
            prompt_len: 2.0,
            ..Multipliers::default()
        };
        let e = synthesize(
            &mut sessions,
            TraceKind::MooncakeTrace,
            &m,
            8,
            (None, None),
            &mut PyRandom::new(0),
        )
        .unwrap_err();
        assert_eq!(
            e,
            PrefixLongerThanInput {
                line: 2,
                input_length: 4,
                prefix_tokens: 16
            }
        );
    }
}
