//! The cache-bust facts synthesis needs: the seven targets and AIPerf's marker token-cost
//! estimate (`estimate_marker_token_cost`). Owns no request rewriting; markers are never put
//! into synthesized text.

use sha2::{Digest, Sha256};

use crate::synth::error::SynthError;
use crate::synth::rng::py_round;
use crate::synth::tokenizer::Tokenizer;

/// AIPerf's `CacheBustTarget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheBustTarget {
    #[default]
    None,
    SystemPrefix,
    SystemSuffix,
    FirstTurnPrefix,
    FirstTurnSuffix,
    WarmupIsolationSystem,
    WarmupIsolationFirstTurn,
}

impl std::str::FromStr for CacheBustTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "none" => Self::None,
            "system_prefix" => Self::SystemPrefix,
            "system_suffix" => Self::SystemSuffix,
            "first_turn_prefix" => Self::FirstTurnPrefix,
            "first_turn_suffix" => Self::FirstTurnSuffix,
            "warmup_isolation_system" => Self::WarmupIsolationSystem,
            "warmup_isolation_first_turn" => Self::WarmupIsolationFirstTurn,
            other => {
                return Err(format!(
                    "unknown cache-bust target {other:?}; use none, system_prefix, system_suffix, \
                     first_turn_prefix, first_turn_suffix, warmup_isolation_system or \
                     warmup_isolation_first_turn"
                ))
            }
        })
    }
}

impl CacheBustTarget {
    /// Targets whose marker lands on the system message when there is one.
    pub fn is_system(self) -> bool {
        matches!(self, Self::SystemPrefix | Self::SystemSuffix)
    }

    fn rid_marker(self, digest: &str) -> Option<String> {
        match self {
            Self::SystemPrefix | Self::FirstTurnPrefix => Some(format!("[rid:{digest}]\n\n")),
            Self::SystemSuffix | Self::FirstTurnSuffix => Some(format!("\n\n[rid:{digest}]")),
            _ => None,
        }
    }
}

/// The 12-hex digest of `"{benchmark_id}:{recycle_pass}:{trajectory_index}:{trace_id}"`.
pub fn marker_digest(
    benchmark_id: &str,
    recycle_pass: i64,
    trajectory_index: i64,
    trace_id: &str,
) -> String {
    let input = format!("{benchmark_id}:{recycle_pass}:{trajectory_index}:{trace_id}");
    hex::encode(Sha256::digest(input.as_bytes()))[..12].to_owned()
}

/// `estimate_marker_token_cost`: mean token count of eight estimator markers, rounded half to
/// even; 0 for `none` and the warm-up isolation targets.
pub fn marker_token_cost(
    target: CacheBustTarget,
    tokenizer: &Tokenizer,
) -> Result<usize, SynthError> {
    let mut total = 0usize;
    for i in 0..8 {
        let digest = marker_digest("estimator", i, i, &format!("estimator-{i}"));
        let Some(marker) = target.rid_marker(&digest) else {
            return Ok(0);
        };
        total += tokenizer.encode(&marker)?.len();
    }
    Ok(py_round(total as f64 / 8.0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_example() {
        assert_eq!(
            marker_digest("0123456789ab", 0, 0, "session_000000"),
            "bec92e2bea5e"
        );
    }

    #[test]
    fn qwen3_costs() {
        let t = Tokenizer::default_qwen3().unwrap();
        assert_eq!(
            marker_token_cost(CacheBustTarget::SystemPrefix, &t).unwrap(),
            14
        );
        assert_eq!(
            marker_token_cost(CacheBustTarget::FirstTurnSuffix, &t).unwrap(),
            15
        );
        assert_eq!(
            marker_token_cost(CacheBustTarget::WarmupIsolationSystem, &t).unwrap(),
            0
        );
    }
}
