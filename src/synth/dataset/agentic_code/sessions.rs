//! AIPerf 0.13.0's `SessionSynthesizer` and `PrefixAllocator`: synthetic agentic-coding sessions
//! (context growth, mixture delays, resets, restart splits) and their layered hash ids, drawn
//! from numpy's `default_rng(seed)` in AIPerf's order. Owns the session state machine; must
//! never write files.

use crate::synth::dataset::agentic_code::config::{DistributionConfig, Lognormal};
use crate::synth::rng::numpy_dist::{self, choice_cdf, choice_index, pairwise_sum};
use crate::synth::rng::NumpyGenerator;

const OUTPUT_MIN: i64 = 30;
const MAX_GROUP_BLOCKS: i64 = 200;
const MAX_GROUPS: i64 = 1_000;
const MAX_SESSION_BLOCKS: i64 = 4_000;

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    ForcedRetire,
    ProbabilisticReset,
    RestartSplit,
    TargetTurnCount,
}

/// One synthesized turn (input length cumulative, as in AIPerf's model).
#[derive(Debug, Clone, PartialEq)]
pub struct SynthTurn {
    pub turn_index: usize,
    pub input_length: i64,
    pub output_length: i64,
    pub new_tokens: i64,
    pub delay_ms: f64,
    pub timestamp_ms: f64,
    pub hash_ids: Vec<i64>,
}

/// One synthesized session.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSession {
    pub session_id: String,
    pub group_id: i64,
    pub turns: Vec<SynthTurn>,
    pub end_reason: EndReason,
    pub is_restart_continuation: bool,
}

/// The layered hash-id allocator: L1 global, L1.5 per group, L2+L3 per session.
#[derive(Debug, Clone)]
pub struct Prefix {
    block_size: i64,
    l1_blocks: i64,
    l15_blocks: i64,
    session_region_base: i64,
}

impl Prefix {
    /// Checks AIPerf's allocator bounds.
    pub fn new(cfg: &DistributionConfig) -> Result<Self, String> {
        let bs = cfg.block_size;
        let ceil = |t: i64| (t + bs - 1).div_euclid(bs);
        let (l1, l15) = (
            ceil(cfg.cache.layer1_tokens),
            ceil(cfg.cache.layer1_5_tokens),
        );
        let groups = cfg.cache.layer1_5_groups.num_groups;
        if groups > MAX_GROUPS {
            return Err(format!(
                "cache.layer1_5_groups.num_groups {groups} exceeds {MAX_GROUPS}"
            ));
        }
        if l15 > MAX_GROUP_BLOCKS {
            return Err(format!(
                "cache.layer1_5_tokens {} needs {l15} blocks, more than {MAX_GROUP_BLOCKS}",
                cfg.cache.layer1_5_tokens
            ));
        }
        Ok(Prefix {
            block_size: bs,
            l1_blocks: l1,
            l15_blocks: l15,
            session_region_base: l1 + MAX_GROUPS * MAX_GROUP_BLOCKS,
        })
    }

    /// L1 + L1.5 as whole blocks, in tokens.
    pub fn prefix_tokens(&self) -> i64 {
        (self.l1_blocks + self.l15_blocks) * self.block_size
    }

    /// Everything after L1 + L1.5.
    fn session_ids(&self, ids: &[i64]) -> Vec<i64> {
        let n = (self.l1_blocks + self.l15_blocks) as usize;
        ids.get(n..).map(<[i64]>::to_vec).unwrap_or_default()
    }

    /// `turn_hash_ids`: L1 ++ L1.5 ++ session blocks covering `input_length`.
    fn turn_ids(
        &self,
        session: i64,
        group: i64,
        input_length: i64,
        prev: Option<&[i64]>,
    ) -> Result<Vec<i64>, String> {
        let total = if input_length > 0 {
            (input_length + self.block_size - 1).div_euclid(self.block_size)
        } else {
            0
        };
        let l1 = self.l1_blocks.min(total);
        let mut ids: Vec<i64> = (0..l1).collect();
        let remaining = total - l1;
        if remaining <= 0 {
            return Ok(ids);
        }
        let l15 = self.l15_blocks.min(remaining);
        let group_base = self.l1_blocks + group * MAX_GROUP_BLOCKS;
        ids.extend(group_base..group_base + l15);
        let needed = (remaining - l15).max(0);
        if needed == 0 {
            return Ok(ids);
        }
        if needed > MAX_SESSION_BLOCKS {
            return Err(format!(
                "input_length={input_length} needs {needed} session blocks, exceeding \
                 {MAX_SESSION_BLOCKS}: lower max_prompt_tokens (--max-isl) or raise block_size"
            ));
        }
        let base = self.session_region_base + session * MAX_SESSION_BLOCKS;
        match prev {
            None => ids.extend(base..base + needed),
            Some(prev) => {
                let fresh = needed - prev.len() as i64;
                if fresh > 0 {
                    let next = prev.last().map_or(base, |l| l + 1);
                    ids.extend_from_slice(prev);
                    ids.extend(next..next + fresh);
                } else {
                    ids.extend_from_slice(&prev[..needed as usize]);
                }
            }
        }
        Ok(ids)
    }
}

/// `SessionSynthesizer(config, seed)`.
pub struct Synthesizer<'c> {
    cfg: &'c DistributionConfig,
    rng: NumpyGenerator,
    prefix: Prefix,
    counter: i64,
    group_cdf: Vec<f64>,
    output_min: i64,
    new_tokens: Lognormal,
}

type Res<T> = Result<T, String>;

impl<'c> Synthesizer<'c> {
    pub fn new(cfg: &'c DistributionConfig, seed: u64) -> Res<Self> {
        let groups = &cfg.cache.layer1_5_groups;
        let weights: Vec<f64> = (1..=groups.num_groups)
            .map(|k| 1.0 / (k as f64).powf(groups.zipf_alpha))
            .collect();
        let total = pairwise_sum(&weights);
        let p: Vec<f64> = weights.iter().map(|w| w / total).collect();
        let output_min = cfg
            .generation_length
            .max
            .map_or(OUTPUT_MIN, |m| OUTPUT_MIN.min(m as i64));
        let ntp = &cfg.new_tokens_per_turn;
        let mut new_tokens = ntp.dist.clone();
        if ntp.bias != 1.0 {
            new_tokens.mu += ntp.bias.ln();
        }
        Ok(Synthesizer {
            cfg,
            rng: NumpyGenerator::new(u128::from(seed)),
            prefix: Prefix::new(cfg)?,
            counter: 0,
            group_cdf: choice_cdf(&p),
            output_min,
            new_tokens,
        })
    }

    /// `sample_lognormal`: rejection inside [min, max] (100 tries, then clamped), then the floor.
    fn lognormal(&mut self, d: &Lognormal, clip_min: Option<f64>) -> f64 {
        let mut x = numpy_dist::lognormal(&mut self.rng, d.mu, d.sigma);
        if d.min.is_some() || d.max.is_some() {
            let out = |x: f64| d.min.is_some_and(|lo| x < lo) || d.max.is_some_and(|hi| x > hi);
            for _ in 0..100 {
                if !out(x) {
                    break;
                }
                x = numpy_dist::lognormal(&mut self.rng, d.mu, d.sigma);
            }
            if let Some(lo) = d.min {
                x = x.max(lo);
            }
            if let Some(hi) = d.max {
                x = x.min(hi);
            }
        }
        clip_min.map_or(x, |c| x.max(c))
    }

    fn session_id(&mut self) -> String {
        let b = numpy_dist::bytes(&mut self.rng, 16);
        format!("sess-{}", &hex::encode(b)[..12])
    }

    fn should_reset(&mut self, input_length: i64) -> bool {
        let Some(r) = &self.cfg.reset else {
            return false;
        };
        let ratio = input_length as f64 / self.cfg.max_prompt_tokens as f64;
        let p = r.base_probability * (1.0 + (r.context_scaling - 1.0) * ratio);
        self.rng.random() < p
    }

    fn group_id(&mut self) -> i64 {
        choice_index(&mut self.rng, &self.group_cdf) as i64
    }

    fn initial_context(&mut self) -> i64 {
        let layer2 = self.cfg.cache.layer2.clone();
        let l2 = (self.lognormal(&layer2, None) as i64).max(1);
        (self.prefix.prefix_tokens() + l2).min(self.cfg.max_prompt_tokens - 1)
    }

    fn output_length(&mut self) -> i64 {
        let g = self.cfg.generation_length.clone();
        self.lognormal(&g, Some(self.output_min as f64)) as i64
    }

    fn delay_ms(&mut self, prev_input: i64) -> f64 {
        let mix = self.cfg.inter_turn_delay.clone();
        let agentic = self.rng.random() < mix.agentic_fraction;
        let a = self.lognormal(&mix.agentic_delay, None);
        let h = self.lognormal(&mix.human_delay, None);
        let mut d = if agentic { a } else { h };
        if let Some(m) = mix.max {
            d = d.min(m);
        }
        let ratio = prev_input as f64 / self.cfg.max_prompt_tokens as f64;
        d *= 0.2f64.max(1.0 - 0.8 * ratio);
        if let Some(m) = mix.max {
            d = d.min(m);
        }
        d
    }

    fn new_tokens(&mut self) -> i64 {
        let d = self.new_tokens.clone();
        (self.lognormal(&d, None) as i64).max(1)
    }

    /// Turns after the first until the context limit or a reset; `restart_at` splits.
    fn grow(
        &mut self,
        index: i64,
        group: i64,
        turns: &mut Vec<SynthTurn>,
        restart_at: Option<usize>,
    ) -> Res<EndReason> {
        loop {
            let turn_idx = turns.len();
            if Some(turn_idx) == restart_at {
                return Ok(EndReason::RestartSplit);
            }
            let last = &turns[turns.len() - 1];
            let (prev_input, prev_output, prev_ts) =
                (last.input_length, last.output_length, last.timestamp_ms);
            let delay_ms = self.delay_ms(prev_input);
            let timestamp_ms = prev_ts + delay_ms;
            let new_tokens = self.new_tokens();
            let input_length = prev_input + prev_output + new_tokens;
            if input_length >= self.cfg.max_prompt_tokens {
                return Ok(EndReason::ForcedRetire);
            }
            if self.should_reset(input_length) {
                return Ok(EndReason::ProbabilisticReset);
            }
            let output_length = self.output_length();
            let prev = self.prefix.session_ids(&turns[turns.len() - 1].hash_ids);
            let hash_ids = self
                .prefix
                .turn_ids(index, group, input_length, Some(&prev))?;
            turns.push(SynthTurn {
                turn_index: turn_idx,
                input_length,
                output_length,
                new_tokens,
                delay_ms,
                timestamp_ms,
                hash_ids,
            });
        }
    }

    fn first_turn(&self, input: i64, output: i64, hash_ids: Vec<i64>) -> SynthTurn {
        SynthTurn {
            turn_index: 0,
            input_length: input,
            output_length: output,
            new_tokens: input,
            delay_ms: 0.0,
            timestamp_ms: 0.0,
            hash_ids,
        }
    }

    /// `synthesize_session` (reset mode): one session, or two when split at a restart.
    fn session(&mut self, inject_restart: bool) -> Res<Vec<SynthSession>> {
        let index = self.counter;
        self.counter += 1;
        let session_id = self.session_id();
        let [lo, hi] = self.cfg.restart_turn_range;
        let restart_at = inject_restart.then(|| self.rng.integers(lo, hi) as usize);
        let group = self.group_id();
        let initial = self.initial_context();
        let output = self.output_length();
        let ids = self.prefix.turn_ids(index, group, initial, None)?;
        let mut turns = vec![self.first_turn(initial, output, ids)];
        let end = self.grow(index, group, &mut turns, restart_at)?;
        let last = turns[turns.len() - 1].clone();
        let a = SynthSession {
            session_id,
            group_id: group,
            turns,
            end_reason: end,
            is_restart_continuation: false,
        };
        if end != EndReason::RestartSplit {
            return Ok(vec![a]);
        }
        // Session B: a new id, the accumulated context as its first turn.
        let session_id = self.session_id();
        let initial = (last.input_length + last.output_length).min(self.cfg.max_prompt_tokens - 1);
        let output = self.output_length();
        let prev = self.prefix.session_ids(&last.hash_ids);
        let ids = self.prefix.turn_ids(index, group, initial, Some(&prev))?;
        let mut turns = vec![self.first_turn(initial, output, ids)];
        let end = self.grow(index, group, &mut turns, None)?;
        let b = SynthSession {
            session_id,
            group_id: group,
            turns,
            end_reason: end,
            is_restart_continuation: true,
        };
        Ok(vec![a, b])
    }

    /// `_synthesize_explicit_turn_session` (turns mode).
    fn explicit_session(&mut self) -> Res<SynthSession> {
        let Some(tc) = self.cfg.turns.clone() else {
            return Err("explicit turn mode without a turns config".into());
        };
        let dist = Lognormal {
            min: Some(tc.min as f64),
            max: Some(tc.max as f64),
            ..Lognormal::from_mean_median(tc.mean as f64, tc.median as f64)
        };
        let target = (self.lognormal(&dist, None).round_ties_even() as i64).clamp(tc.min, tc.max);
        let attempts = tc.max_session_attempts.unwrap_or(1);
        for _ in 0..attempts {
            let index = self.counter;
            self.counter += 1;
            let session_id = self.session_id();
            let group = self.group_id();
            let initial = self.initial_context();
            if initial >= self.cfg.max_prompt_tokens {
                continue;
            }
            let output = self.output_length();
            let ids = self.prefix.turn_ids(index, group, initial, None)?;
            let mut turns = vec![self.first_turn(initial, output, ids)];
            let mut realized = true;
            for turn_idx in 1..target as usize {
                let last = &turns[turns.len() - 1];
                let (pi, po, ts) = (last.input_length, last.output_length, last.timestamp_ms);
                let delay_ms = self.delay_ms(pi);
                let new_tokens = self.new_tokens();
                let input_length = pi + po + new_tokens;
                if input_length >= self.cfg.max_prompt_tokens {
                    if tc.allow_truncation {
                        return Ok(SynthSession {
                            session_id,
                            group_id: group,
                            turns,
                            end_reason: EndReason::ForcedRetire,
                            is_restart_continuation: false,
                        });
                    }
                    realized = false;
                    break;
                }
                let output_length = self.output_length();
                let prev = self.prefix.session_ids(&last.hash_ids);
                let hash_ids = self
                    .prefix
                    .turn_ids(index, group, input_length, Some(&prev))?;
                turns.push(SynthTurn {
                    turn_index: turn_idx,
                    input_length,
                    output_length,
                    new_tokens,
                    delay_ms,
                    timestamp_ms: ts + delay_ms,
                    hash_ids,
                });
            }
            if realized {
                return Ok(SynthSession {
                    session_id,
                    group_id: group,
                    turns,
                    end_reason: EndReason::TargetTurnCount,
                    is_restart_continuation: false,
                });
            }
        }
        Err(format!(
            "could not synthesize an explicit-turn session of {target} turns in {attempts} \
             attempts under max_prompt_tokens {}",
            self.cfg.max_prompt_tokens
        ))
    }

    /// `synthesize_sessions(n)`: restart continuations scattered into the back of the queue.
    pub fn sessions(&mut self, n: usize) -> Res<Vec<SynthSession>> {
        if self.cfg.turns.is_some() {
            return (0..n).map(|_| self.explicit_session()).collect();
        }
        let p0 = self.cfg.restart_initial_probability;
        let mut primary: Vec<SynthSession> = Vec::with_capacity(n);
        let mut deferred: Vec<(SynthSession, usize)> = Vec::new();
        for i in 0..n {
            let progress = i as f64 / (n.saturating_sub(1).max(1)) as f64;
            let p = if progress >= 0.75 {
                0.0
            } else {
                p0 * (1.0 - progress / 0.75)
            };
            let inject = self.rng.random() < p;
            let mut result = self.session(inject)?.into_iter();
            let origin = primary.len();
            if let Some(a) = result.next() {
                primary.push(a);
            }
            deferred.extend(result.map(|b| (b, origin)));
        }
        let min_offset = ((n as f64 * 0.25) as usize).max(1);
        for (b, origin) in deferred {
            let low = (origin + min_offset).min(primary.len());
            let pos = if low >= primary.len() {
                primary.len()
            } else {
                self.rng.integers(low as i64, primary.len() as i64 + 1) as usize
            };
            primary.insert(pos, b);
        }
        Ok(primary)
    }
}
