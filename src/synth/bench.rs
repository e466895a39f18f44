//! Cross-tool parity: the prompts `vllm bench serve --dataset-name random` (vLLM 0.17–0.33) and
//! SGLang 0.5.14–0.5.23 `bench_serving --dataset-name random-ids` draw, reproduced exactly.
//! Owns those tools' draw orders; must never mix them with AIPerf's streams.

use rayon::prelude::*;

use crate::synth::dataset::params::RangeRatio;
use crate::synth::error::SynthError;
use crate::synth::rng::{NumpyGenerator, RandomState};
use crate::synth::tokenizer::reencode::{reencode, Pieces};
use crate::synth::tokenizer::Tokenizer;

/// Requests whose first fix-up round is computed in one parallel batch.
const BATCH: usize = 32;

/// Which benchmark tool to reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchTool {
    /// vLLM 0.33.0 `--dataset-name random` (PCG64 `default_rng(seed)`).
    Vllm,
    /// SGLang 0.5.23 `--dataset-name random-ids` (legacy `np.random.seed(seed)`).
    Sglang,
}

impl std::str::FromStr for BenchTool {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "vllm" => Ok(Self::Vllm),
            "sglang" => Ok(Self::Sglang),
            other => Err(format!("unknown bench tool {other:?}; use vllm or sglang")),
        }
    }
}

/// The tool's own parameters (`--seed`, `--num-prompts`, `--random-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct BenchParams {
    pub tool: BenchTool,
    pub seed: u64,
    pub num_prompts: usize,
    pub input_len: u64,
    pub output_len: u64,
    pub range_ratio: RangeRatio,
    /// vLLM only.
    pub prefix_len: usize,
}

/// One request as the tool would send it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BenchRequest {
    pub request_id: String,
    pub prompt: String,
    pub prompt_len: usize,
    pub expected_output_len: u64,
}

/// vLLM's `gen_prompt_decode_to_target_len`: returns the last decoded prompt and its re-encoding.
/// `first` is the already computed `encode(decode(seq))`, if any. The re-encodes keep the
/// sequence's structure (a canonical re-encode, then a truncation or random top-up ids), so only
/// what can change is re-encoded ([`reencode`]).
fn vllm_decode_to_target(
    tokenizer: &Tokenizer,
    mut seq: Pieces,
    target: usize,
    rng: &mut NumpyGenerator,
    mut first: Option<Vec<u32>>,
) -> Result<(String, Vec<u32>), SynthError> {
    let vocab = tokenizer.vocab_size() as i64;
    let mut remain = 10;
    loop {
        let encoded = match first.take() {
            Some(encoded) => encoded,
            None => reencode(tokenizer, &seq)?,
        };
        if remain <= 0 || encoded.len() == target {
            return Ok((tokenizer.decode(&seq.tokens)?, encoded));
        }
        let mut next = Pieces::canonical(encoded);
        if next.tokens.len() < target {
            let topup = (next.tokens.len()..target)
                .map(|_| rng.integers(0, vocab) as u32)
                .collect();
            next.append(Pieces::opaque(topup));
        } else {
            next.truncate(target);
        }
        seq = next;
        remain -= 1;
    }
}

/// vLLM's input length bounds from `--random-input-len` and the ratio, refusing a ratio outside
/// [0, 1) and bounds that allow an empty prompt.
fn vllm_input_bounds(
    params: &BenchParams,
    tokenizer: &Tokenizer,
) -> Result<(i64, i64), SynthError> {
    let r = params.range_ratio;
    let ok = |x: f64| (0.0..1.0).contains(&x);
    if !ok(r.input) || !ok(r.output) {
        return Err(SynthError::invalid(
            "vLLM's --random-range-ratio must be in [0, 1) (each value of a JSON object too)",
        ));
    }
    let special = tokenizer.num_special_tokens_to_add() as u64;
    let real_input = params.input_len.saturating_sub(special) as f64;
    let in_lo = (real_input * (1.0 - r.input)).floor() as i64;
    let in_hi = (real_input * (1.0 + r.input)).ceil() as i64;
    if params.prefix_len as i64 + in_lo < 1 {
        return Err(SynthError::invalid(format!(
            "--random-input-len {} with --random-range-ratio {} and --random-prefix-len {} gives a \
             minimum input of {} tokens; raise the input or prefix length, or lower the ratio",
            params.input_len,
            r.input,
            params.prefix_len,
            params.prefix_len as i64 + in_lo
        )));
    }
    Ok((in_lo, in_hi))
}

fn vllm(params: &BenchParams, tokenizer: &Tokenizer) -> Result<Vec<BenchRequest>, SynthError> {
    let (in_lo, in_hi) = vllm_input_bounds(params, tokenizer)?;
    let r = params.range_ratio;
    let out = params.output_len as f64;
    let out_lo = ((out * (1.0 - r.output)).floor() as i64).max(1);
    let out_hi = ((out * (1.0 + r.output)).ceil() as i64).max(1);
    let n = params.num_prompts;
    let vocab = tokenizer.vocab_size() as i64;
    if vocab == 0 {
        return Err(SynthError::invalid("the tokenizer has an empty vocabulary"));
    }
    let mut rng = NumpyGenerator::new(u128::from(params.seed));
    let input_lens = rng.integers_n(in_lo, in_hi + 1, n);
    let output_lens = rng.integers_n(out_lo, out_hi + 1, n);
    let offsets = rng.integers_n(0, vocab, n);
    let specials = tokenizer.all_special_ids();
    let allowed: Vec<u32> = (0..vocab as u32)
        .filter(|i| !specials.contains(i))
        .collect();
    let a = allowed.len();
    if a == 0 {
        return Err(SynthError::invalid(
            "the tokenizer has no non-special tokens",
        ));
    }
    let prefix: Vec<u32> = if params.prefix_len > 0 {
        let ids: Vec<u32> = (0..params.prefix_len)
            .map(|_| allowed[rng.integers(0, a as i64) as usize])
            .collect();
        vllm_decode_to_target(
            tokenizer,
            Pieces::opaque(ids),
            params.prefix_len,
            &mut rng,
            None,
        )?
        .1
    } else {
        Vec::new()
    };
    // Every request's starting sequence is known now, so the first decode → encode of each
    // is computed in parallel batches; the draws (top-ups) stay strictly in request order.
    let initial = |i: usize| -> Pieces {
        let len = input_lens[i].max(0) as usize;
        let base = offsets[i] as usize + i;
        let mut seq = Pieces::canonical(prefix.clone());
        seq.append(Pieces::opaque(
            (0..len).map(|j| allowed[(base + j) % a]).collect(),
        ));
        seq
    };
    let mut out = Vec::with_capacity(n);
    for batch_start in (0..n).step_by(BATCH) {
        let batch: Vec<usize> = (batch_start..(batch_start + BATCH).min(n)).collect();
        let firsts: Result<Vec<Vec<u32>>, SynthError> = batch
            .par_iter()
            .map(|&i| reencode(tokenizer, &initial(i)))
            .collect();
        for (i, first) in batch.into_iter().zip(firsts?) {
            let target = params.prefix_len + input_lens[i].max(0) as usize;
            let (prompt, seq) =
                vllm_decode_to_target(tokenizer, initial(i), target, &mut rng, Some(first))?;
            out.push(BenchRequest {
                request_id: i.to_string(),
                prompt,
                prompt_len: seq.len(),
                expected_output_len: output_lens[i] as u64,
            });
        }
    }
    Ok(out)
}

fn sglang(params: &BenchParams, tokenizer: &Tokenizer) -> Result<Vec<BenchRequest>, SynthError> {
    let r = params.range_ratio;
    if r.per_direction {
        return Err(SynthError::invalid(
            "SGLang takes a single --random-range-ratio number, not a JSON object",
        ));
    }
    if !(0.0..=1.0).contains(&r.input) {
        return Err(SynthError::invalid(
            "SGLang's --random-range-ratio must be in [0, 1]",
        ));
    }
    if params.prefix_len > 0 {
        return Err(SynthError::invalid(
            "SGLang's random-ids dataset has no prefix; drop --random-prefix-len",
        ));
    }
    let seed = u32::try_from(params.seed).map_err(|_| {
        SynthError::invalid("SGLang seeds numpy's legacy generator, which needs --seed below 2^32")
    })?;
    let n = params.num_prompts;
    let mut rng = RandomState::new(seed);
    let lens = |len: u64, rng: &mut RandomState| -> Vec<i64> {
        if len == 0 {
            return vec![0; n];
        }
        let lo = ((len as f64 * r.input) as i64).max(1);
        rng.randint_n(lo, len as i64 + 1, n)
    };
    let special = tokenizer.num_special_tokens_to_add() as i64;
    let input_lens: Vec<i64> = lens(params.input_len, &mut rng)
        .into_iter()
        .map(|l| (l - special).max(1))
        .collect();
    let output_lens = lens(params.output_len, &mut rng);
    let vocab = tokenizer.vocab_size();
    if vocab == 0 {
        return Err(SynthError::invalid("the tokenizer has an empty vocabulary"));
    }
    let offsets = rng.randint_n(0, vocab as i64, n);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let len = input_lens[i] as usize;
        let base = offsets[i] as usize + i;
        let ids: Vec<u32> = (0..len).map(|j| ((base + j) % vocab) as u32).collect();
        out.push(BenchRequest {
            request_id: i.to_string(),
            prompt: tokenizer.decode(&ids)?,
            prompt_len: len,
            expected_output_len: output_lens[i] as u64,
        });
    }
    Ok(out)
}

/// The requests the chosen tool draws for these parameters.
pub fn bench_requests(
    params: &BenchParams,
    tokenizer: &Tokenizer,
) -> Result<Vec<BenchRequest>, SynthError> {
    match params.tool {
        BenchTool::Vllm => vllm(params, tokenizer),
        BenchTool::Sglang => sglang(params, tokenizer),
    }
}
