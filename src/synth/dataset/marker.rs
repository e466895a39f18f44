//! The cache-bust facts synthesis needs: the seven targets and AIPerf's marker token-cost
//! estimate (`estimate_marker_token_cost`). Owns no request rewriting; markers are never put
//! into synthesized text.

use crate::cachebust::{build_marker, DigestInputs, Phase};
use crate::synth::error::SynthError;
use crate::synth::rng::py_round;
use crate::synth::tokenizer::Tokenizer;

/// AIPerf's `CacheBustTarget`: the same type the proxy's cache-bust engine uses.
pub use crate::cachebust::Target as CacheBustTarget;

/// `estimate_marker_token_cost`: mean token count of eight estimator markers, rounded half to
/// even; 0 for `none` and the warm-up isolation targets.
pub fn marker_token_cost(
    target: CacheBustTarget,
    tokenizer: &Tokenizer,
) -> Result<usize, SynthError> {
    if target.is_none() || target.is_warmup_isolation() {
        return Ok(0);
    }
    let mut total = 0usize;
    for i in 0..8 {
        let inputs = DigestInputs {
            benchmark_id: "estimator".into(),
            recycle_pass: i,
            trajectory_index: i,
            trace_id: format!("estimator-{i}"),
        };
        // RID targets always have a marker; the phase does not change it.
        let marker = build_marker(target, Phase::Profiling, &inputs).unwrap_or_default();
        total += tokenizer.encode(&marker)?.len();
    }
    Ok(py_round(total as f64 / 8.0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

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
