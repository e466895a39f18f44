//! Synthesis parameters (AIPerf's flag set) and their validation.
//! Owns the meaning and the consistency rules of the parameters; must never draw or tokenize.

use std::path::PathBuf;

use crate::synth::corpus::PromptCorpus;
use crate::synth::corpus::RandomCorpusStyle;
use crate::synth::dataset::marker::CacheBustTarget;
use crate::synth::dataset::trace::synthesize::Multipliers;
use crate::synth::dataset::trace_kind::{corpus_refusal, BlockTerminator, TraceKind};
use crate::synth::error::SynthError;

/// AIPerf's default number of conversations when `--num-dataset-entries` is not given.
pub const DEFAULT_ENTRIES: usize = 100;

/// AIPerf's default ISL mean when `--isl` is not given.
pub const DEFAULT_ISL: u64 = 550;

/// `--random-range-ratio`: one float for both, or vLLM's JSON `{"input": a, "output": b}`.
/// In configuration files: a number, a string as on the command line, or a table with
/// `input` and `output`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RangeRatio {
    pub input: f64,
    pub output: f64,
    /// Given as a JSON object (SGLang style accepts only a single float).
    pub per_direction: bool,
}

impl std::str::FromStr for RangeRatio {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(t)
                .map_err(|e| format!("range ratio {t:?} is not valid JSON: {e}"))?;
            let get = |k: &str| {
                v.get(k).and_then(serde_json::Value::as_f64).ok_or_else(|| {
                    format!("range ratio JSON needs numeric \"input\" and \"output\" keys, got {t}")
                })
            };
            return Ok(RangeRatio {
                input: get("input")?,
                output: get("output")?,
                per_direction: true,
            });
        }
        let r: f64 = t
            .parse()
            .map_err(|_| format!("range ratio {t:?} is neither a number nor a JSON object"))?;
        Ok(RangeRatio {
            input: r,
            output: r,
            per_direction: false,
        })
    }
}

/// Everything that shapes a synthetic dataset, named after AIPerf's flags (in configuration
/// files the same names in snake_case; unknown keys are rejected).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SynthParams {
    /// `--prompt-corpus` (None: sonnet, or coding for an agentic trace, as AIPerf's plugins
    /// default).
    pub prompt_corpus: Option<PromptCorpus>,
    /// `--isl` (None: AIPerf's default 550).
    pub isl: Option<u64>,
    pub isl_stddev: f64,
    /// `--osl` (None: no `max_tokens`).
    pub osl: Option<u64>,
    pub osl_stddev: f64,
    /// `--random-seed` (None: OS entropy and uuid session ids).
    pub random_seed: Option<u64>,
    pub range_ratio: Option<RangeRatio>,
    pub random_corpus_style: RandomCorpusStyle,
    /// `--num-dataset-entries`: the number of conversations (None: AIPerf's 100). Given for an
    /// agentic trace, the first N traces that fit `--max-context-length` (AIPerf caps a trace
    /// dataset only when the flag is given).
    pub num_dataset_entries: Option<usize>,
    pub num_prefix_prompts: usize,
    pub prefix_prompt_length: usize,
    pub shared_system_prompt_length: Option<usize>,
    pub user_context_prompt_length: Option<usize>,
    /// `--system-prompt`: a verbatim system message.
    pub system_prompt: Option<String>,
    pub session_turns_mean: f64,
    pub session_turns_stddev: f64,
    pub cache_bust: CacheBustTarget,
    pub apply_chat_template: bool,
    /// `--input-file`: replay this hash-id trace instead of synthesizing conversations.
    pub input_file: Option<PathBuf>,
    /// `--custom-dataset-type` (None: detected from the first line).
    pub custom_dataset_type: Option<TraceKind>,
    /// `--isl-block-size` (None: the trace type's default, 512 mooncake / 16 bailian).
    pub isl_block_size: Option<usize>,
    /// `--trace-block-terminator`.
    pub trace_block_terminator: BlockTerminator,
    /// `--synthesis-max-isl`: trace requests with more input tokens are skipped.
    pub synthesis_max_isl: Option<u64>,
    /// `--synthesis-max-osl`: caps trace requests' `max_tokens` (weka: top-level requests).
    pub synthesis_max_osl: Option<u64>,
    /// `--synthesis-speedup-ratio`: trace timestamps are divided by it (mooncake, bailian).
    pub synthesis_speedup_ratio: f64,
    /// `--synthesis-prefix-len-multiplier`: shared prefixes are stretched or cut by it.
    pub synthesis_prefix_len_multiplier: f64,
    /// `--synthesis-prefix-root-multiplier`: requests are spread over this many prefix trees.
    pub synthesis_prefix_root_multiplier: i64,
    /// `--synthesis-prompt-len-multiplier`: the unique (non-shared) prompt lengths scale by it.
    pub synthesis_prompt_len_multiplier: f64,
    /// `--synthesis-output-len-multiplier`: output lengths scale by it.
    pub synthesis_output_len_multiplier: f64,
    /// `--max-context-length`: weka traces whose peak input + output exceeds it are dropped.
    pub max_context_length: Option<u64>,
    /// `--inter-turn-delay-cap-seconds`: weka delays are clamped to this.
    pub inter_turn_delay_cap_seconds: Option<f64>,
    /// `--trace-idle-gap-cap-seconds`: weka traces' long idle gaps are compressed to this (wins
    /// over the delay cap).
    pub trace_idle_gap_cap_seconds: Option<f64>,
    /// `--use-think-time-only`: weka delays are the recorded `think_time`.
    pub use_think_time_only: bool,
    /// `--tool-shaped-messages` (AIPerf's `WEKA_TOOL_SHAPED_MESSAGES`): weka tool results as
    /// `role: tool` messages answering synthetic `tool_calls`.
    pub tool_shaped_messages: bool,
    /// `--model`: weka trace models map onto these names (comma-separated; main model first).
    pub model: Option<String>,
    /// `--strict`: a trace row AIPerf would drop (a BurstGPT row that does not parse, a TraceLab
    /// row with no `session_id`) is an error instead of a warning.
    pub strict: bool,
}

impl serde::Serialize for RangeRatio {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if self.per_direction {
            let mut m = s.serialize_map(Some(2))?;
            m.serialize_entry("input", &self.input)?;
            m.serialize_entry("output", &self.output)?;
            m.end()
        } else {
            s.serialize_f64(self.input)
        }
    }
}

impl<'de> serde::Deserialize<'de> for RangeRatio {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Form {
            Number(f64),
            Text(String),
            Table { input: f64, output: f64 },
        }
        match Form::deserialize(d)? {
            Form::Number(r) => Ok(RangeRatio {
                input: r,
                output: r,
                per_direction: false,
            }),
            Form::Text(t) => t.parse().map_err(serde::de::Error::custom),
            Form::Table { input, output } => Ok(RangeRatio {
                input,
                output,
                per_direction: true,
            }),
        }
    }
}

impl Default for SynthParams {
    fn default() -> Self {
        SynthParams {
            prompt_corpus: None,
            isl: None,
            isl_stddev: 0.0,
            osl: None,
            osl_stddev: 0.0,
            random_seed: None,
            range_ratio: None,
            random_corpus_style: RandomCorpusStyle::Vllm,
            num_dataset_entries: None,
            num_prefix_prompts: 0,
            prefix_prompt_length: 100,
            shared_system_prompt_length: None,
            user_context_prompt_length: None,
            system_prompt: None,
            session_turns_mean: 1.0,
            session_turns_stddev: 0.0,
            cache_bust: CacheBustTarget::None,
            apply_chat_template: false,
            input_file: None,
            custom_dataset_type: None,
            isl_block_size: None,
            trace_block_terminator: BlockTerminator::Aiperf,
            synthesis_max_isl: None,
            synthesis_max_osl: None,
            synthesis_speedup_ratio: 1.0,
            synthesis_prefix_len_multiplier: 1.0,
            synthesis_prefix_root_multiplier: 1,
            synthesis_prompt_len_multiplier: 1.0,
            synthesis_output_len_multiplier: 1.0,
            max_context_length: None,
            inter_turn_delay_cap_seconds: None,
            trace_idle_gap_cap_seconds: None,
            use_think_time_only: false,
            tool_shaped_messages: false,
            model: None,
            strict: false,
        }
    }
}

impl SynthParams {
    /// The number of conversations of a synthetic dataset (AIPerf's default 100).
    pub fn entries(&self) -> usize {
        self.num_dataset_entries.unwrap_or(DEFAULT_ENTRIES)
    }

    /// The corpus of a synthetic dataset (sonnet unless `--prompt-corpus` says otherwise).
    pub fn corpus(&self) -> PromptCorpus {
        self.prompt_corpus.unwrap_or_default()
    }

    /// Whether the prefix pool is on.
    pub fn prefix_pool_enabled(&self) -> bool {
        self.num_prefix_prompts > 0
    }

    /// The `--synthesis-*` multipliers (checked by [`SynthParams::validate`]).
    pub fn multipliers(&self) -> Multipliers {
        Multipliers {
            speedup_ratio: self.synthesis_speedup_ratio,
            prefix_len: self.synthesis_prefix_len_multiplier,
            prefix_root: self.synthesis_prefix_root_multiplier.max(1) as u64,
            prompt_len: self.synthesis_prompt_len_multiplier,
            output_len: self.synthesis_output_len_multiplier,
        }
    }

    /// AIPerf's `SynthesisConfig` bounds: every ratio a finite number, above 0 (the output
    /// multiplier: 0 or more), the prefix-root multiplier a whole number of at least 1.
    fn validate_multipliers(&self) -> Result<(), SynthError> {
        let ratios = [
            (
                self.synthesis_speedup_ratio,
                "--synthesis-speedup-ratio",
                false,
            ),
            (
                self.synthesis_prefix_len_multiplier,
                "--synthesis-prefix-len-multiplier",
                false,
            ),
            (
                self.synthesis_prompt_len_multiplier,
                "--synthesis-prompt-len-multiplier",
                false,
            ),
            (
                self.synthesis_output_len_multiplier,
                "--synthesis-output-len-multiplier",
                true,
            ),
        ];
        for (v, flag, zero_ok) in ratios {
            let ok = v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0));
            if !ok {
                let bound = if zero_ok { "0 or more" } else { "above 0" };
                return Err(SynthError::InvalidParams(format!(
                    "{flag} (synth.dataset.{}) is {v}, and must be a finite number {bound} \
                     (1 leaves the trace as it is)",
                    flag.trim_start_matches("--").replace('-', "_")
                )));
            }
        }
        if self.synthesis_prefix_root_multiplier < 1 {
            return Err(SynthError::InvalidParams(format!(
                "--synthesis-prefix-root-multiplier (synth.dataset.\
                 synthesis_prefix_root_multiplier) is {}, and must be a whole number of at least \
                 1 (1 keeps one prefix tree)",
                self.synthesis_prefix_root_multiplier
            )));
        }
        Ok(())
    }

    /// The flags only a trace reads, and whether each is set.
    /// The flags only the agentic (Weka-reconstructed) trace types read, and whether each is set.
    fn weka_only_flags(&self) -> [(bool, &'static str); 5] {
        [
            (self.max_context_length.is_some(), "--max-context-length"),
            (
                self.inter_turn_delay_cap_seconds.is_some(),
                "--inter-turn-delay-cap-seconds",
            ),
            (
                self.trace_idle_gap_cap_seconds.is_some(),
                "--trace-idle-gap-cap-seconds",
            ),
            (self.use_think_time_only, "--use-think-time-only"),
            (self.tool_shaped_messages, "--tool-shaped-messages"),
        ]
    }

    /// The multiplier flags and whether each is set (not 1).
    fn multiplier_flags(&self) -> [(bool, &'static str); 5] {
        [
            (
                self.synthesis_speedup_ratio != 1.0,
                "--synthesis-speedup-ratio",
            ),
            (
                self.synthesis_prefix_len_multiplier != 1.0,
                "--synthesis-prefix-len-multiplier",
            ),
            (
                self.synthesis_prefix_root_multiplier != 1,
                "--synthesis-prefix-root-multiplier",
            ),
            (
                self.synthesis_prompt_len_multiplier != 1.0,
                "--synthesis-prompt-len-multiplier",
            ),
            (
                self.synthesis_output_len_multiplier != 1.0,
                "--synthesis-output-len-multiplier",
            ),
        ]
    }

    fn trace_only_flags(&self) -> Vec<(bool, &'static str)> {
        let mut flags = vec![
            (self.custom_dataset_type.is_some(), "--custom-dataset-type"),
            (self.synthesis_max_isl.is_some(), "--synthesis-max-isl"),
            (self.synthesis_max_osl.is_some(), "--synthesis-max-osl"),
        ];
        flags.extend(self.multiplier_flags());
        flags.extend(self.weka_only_flags());
        flags.extend([
            (self.isl_block_size.is_some(), "--isl-block-size"),
            (
                self.trace_block_terminator != BlockTerminator::Aiperf,
                "--trace-block-terminator",
            ),
        ]);
        flags
    }

    /// Rejects combinations AIPerf rejects (or that cannot work), saying what to change.
    pub fn validate(&self) -> Result<(), SynthError> {
        let bad = |m: &str| Err(SynthError::invalid(m));
        if self.input_file.is_some() {
            return self.validate_trace();
        }
        let trace_only = self.trace_only_flags();
        if let Some((_, flag)) = trace_only.iter().find(|(set, _)| *set) {
            return Err(SynthError::InvalidParams(format!(
                "{flag} applies to trace replay; add --input-file TRACE.jsonl"
            )));
        }
        if self.num_dataset_entries == Some(0) {
            return bad("--num-dataset-entries must be at least 1");
        }
        if self.isl_stddev < 0.0 || self.osl_stddev < 0.0 || self.session_turns_stddev < 0.0 {
            return bad("standard deviations must not be negative");
        }
        if self.session_turns_mean < 1.0 {
            return bad("--session-turns-mean must be at least 1");
        }
        if self.prefix_pool_enabled() && self.prefix_prompt_length == 0 {
            return bad("--num-prefix-prompts needs --prefix-prompt-length of at least 1");
        }
        if self.prefix_pool_enabled()
            && (self.shared_system_prompt_length.is_some()
                || self.user_context_prompt_length.is_some())
        {
            return bad(
                "the prefix pool (--num-prefix-prompts) cannot be combined with \
                 --shared-system-prompt-length or --user-context-prompt-length; drop one of them",
            );
        }
        if self.system_prompt.is_some()
            && (self.shared_system_prompt_length.is_some() || self.prefix_pool_enabled())
        {
            return bad(
                "--system-prompt cannot be combined with --shared-system-prompt-length or \
                 --num-prefix-prompts; drop one of them",
            );
        }
        if self.shared_system_prompt_length == Some(0) || self.user_context_prompt_length == Some(0)
        {
            return bad(
                "--shared-system-prompt-length and --user-context-prompt-length must be at least 1",
            );
        }
        if self.cache_bust == CacheBustTarget::WarmupIsolationSystem
            && self.shared_system_prompt_length.is_none()
            && self.system_prompt.is_none()
        {
            return bad(
                "--cache-bust warmup_isolation_system needs a system prompt: set \
                 --shared-system-prompt-length or --system-prompt, or use \
                 --cache-bust warmup_isolation_first_turn",
            );
        }
        if let Some(r) = self.range_ratio {
            self.validate_range_ratio(r)?;
        }
        self.validate_single_model(None)
    }

    /// `--model` / `model` names every request's model, except for the agentic traces, whose
    /// trace models map onto a comma-separated list: elsewhere a list cannot apply (AIPerf would
    /// pick among its names per request), so it is refused rather than ignored.
    fn validate_single_model(&self, kind: Option<TraceKind>) -> Result<(), SynthError> {
        let agentic = kind.is_some_and(TraceKind::is_agentic);
        match &self.model {
            Some(m) if !agentic && (m.contains(',') || m.trim().is_empty()) => {
                Err(SynthError::InvalidParams(format!(
                    "--model (synth.dataset.model) {m:?} must be one model name for {}: every \
                     request is sent with it (a comma-separated list maps weka_trace and \
                     tracelab models only)",
                    kind.map_or("a synthetic dataset".to_owned(), |k| k.to_string())
                )))
            }
            _ => Ok(()),
        }
    }

    /// `--random-range-ratio` needs fixed `--isl` and `--osl` and a ratio the style accepts.
    fn validate_range_ratio(&self, r: RangeRatio) -> Result<(), SynthError> {
        let bad = |m: &str| Err(SynthError::invalid(m));
        let (Some(isl), Some(osl)) = (self.isl, self.osl) else {
            return bad("--random-range-ratio needs both --isl and --osl");
        };
        if isl < 1 || osl < 1 {
            return bad("--random-range-ratio needs --isl and --osl of at least 1");
        }
        if self.isl_stddev > 0.0 || self.osl_stddev > 0.0 {
            return bad(
                "--random-range-ratio cannot be combined with --isl-stddev or --osl-stddev; \
                 drop the stddev flags",
            );
        }
        match self.random_corpus_style {
            RandomCorpusStyle::Vllm => {
                let ok = |x: f64| (0.0..1.0).contains(&x);
                if !ok(r.input) || !ok(r.output) {
                    return bad("--random-range-ratio must be in [0, 1) for the vllm style");
                }
            }
            RandomCorpusStyle::Sglang => {
                if r.per_direction {
                    return bad(
                        "the sglang style takes a single --random-range-ratio number, \
                         not a JSON object",
                    );
                }
                if !(0.0..=1.0).contains(&r.input) {
                    return bad("--random-range-ratio must be in [0, 1] for the sglang style");
                }
            }
        }
        Ok(())
    }

    /// The flags that only one trace type reads, refused for the others (after the type is
    /// known: it may be detected from the file).
    pub fn validate_trace_kind(&self, kind: TraceKind) -> Result<(), SynthError> {
        // AIPerf's CLI refuses --max-context-length with any explicit type but weka_trace, yet
        // passes it through for a detected file, where the tracelab loader applies it.
        if self.custom_dataset_type == Some(TraceKind::Tracelab)
            && self.max_context_length.is_some()
        {
            return Err(SynthError::InvalidParams(
                "--max-context-length with --custom-dataset-type tracelab is refused, as AIPerf \
                 0.13.0 refuses it for every explicit type but weka_trace; leave out \
                 --custom-dataset-type (the type is detected from the file) and AIPerf's \
                 tracelab loader applies it"
                    .into(),
            ));
        }
        // tracelab is reconstructed by the Weka loader, so it reads the same flags.
        if !kind.is_agentic() {
            let weka_only = self.weka_only_flags();
            if let Some((_, flag)) = weka_only.iter().find(|(set, _)| *set) {
                return Err(SynthError::InvalidParams(format!(
                    "{flag} applies to agentic weka_trace and tracelab input, and this input is \
                     {kind}"
                )));
            }
        }
        self.validate_single_model(Some(kind))?;
        if !matches!(kind, TraceKind::MooncakeTrace | TraceKind::BailianTrace) {
            if let Some((_, flag)) = self.multiplier_flags().iter().find(|(set, _)| *set) {
                return Err(SynthError::InvalidParams(format!(
                    "{flag} reshapes hash-id traces (mooncake_trace, bailian_trace), and this \
                     input is {kind}; drop it"
                )));
            }
        }
        Ok(())
    }

    /// The rules for a trace (`--input-file`): AIPerf's corpus rule, and no synthetic-only flag.
    fn validate_trace(&self) -> Result<(), SynthError> {
        self.validate_multipliers()?;
        if let Some(kind) = self.custom_dataset_type {
            self.validate_single_model(Some(kind))?;
        }
        // coding-exact: kvbust's extension for hash-id traces (mooncake, bailian) only.
        let hash_id_trace = matches!(
            self.custom_dataset_type,
            None | Some(TraceKind::MooncakeTrace | TraceKind::BailianTrace)
        );
        if let Some(c) = self.prompt_corpus.filter(|c| match c {
            PromptCorpus::Sonnet | PromptCorpus::Coding => false,
            PromptCorpus::CodingExact => !hash_id_trace,
            PromptCorpus::Random => true,
        }) {
            return Err(SynthError::InvalidParams(corpus_refusal(c)));
        }
        for (v, flag) in [
            (
                self.inter_turn_delay_cap_seconds,
                "--inter-turn-delay-cap-seconds",
            ),
            (
                self.trace_idle_gap_cap_seconds,
                "--trace-idle-gap-cap-seconds",
            ),
        ] {
            if v.is_some_and(|x| !x.is_finite() || x < 0.0) {
                return Err(SynthError::InvalidParams(format!(
                    "{flag} must be a number of seconds, 0 or more"
                )));
            }
        }
        if self.isl_block_size == Some(0) {
            return Err(SynthError::invalid("--isl-block-size must be at least 1"));
        }
        let synthetic_only = [
            (self.isl.is_some(), "--isl"),
            (self.isl_stddev > 0.0, "--isl-stddev"),
            (self.range_ratio.is_some(), "--random-range-ratio"),
            (self.num_prefix_prompts > 0, "--num-prefix-prompts"),
            (
                self.shared_system_prompt_length.is_some(),
                "--shared-system-prompt-length",
            ),
            (
                self.user_context_prompt_length.is_some(),
                "--user-context-prompt-length",
            ),
            (
                self.session_turns_mean != 1.0 || self.session_turns_stddev > 0.0,
                "--session-turns-mean/--session-turns-stddev",
            ),
            (self.apply_chat_template, "--apply-chat-template"),
        ];
        if let Some((_, flag)) = synthetic_only.iter().find(|(set, _)| *set) {
            return Err(SynthError::InvalidParams(format!(
                "{flag} shapes synthetic datasets and does not apply to a trace (--input-file): \
                 the trace gives each request's input length, output length and turns"
            )));
        }
        if self.osl_stddev < 0.0 {
            return Err(SynthError::invalid(
                "standard deviations must not be negative",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_names_round_trip_through_serde_and_from_str() {
        for c in PromptCorpus::ALL {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<PromptCorpus>(&json).unwrap(), c);
            assert_eq!(c.as_str().parse::<PromptCorpus>().unwrap(), c);
        }
        let e: PromptCorpus = serde_json::from_str("\"coding_exact\"").unwrap();
        assert_eq!(e, PromptCorpus::CodingExact);
        let err = serde_json::from_str::<PromptCorpus>("\"poetry\"").unwrap_err();
        assert!(err.to_string().contains("unknown prompt corpus"), "{err}");
    }

    #[test]
    fn a_model_list_is_refused_where_it_cannot_apply() {
        let list = SynthParams {
            model: Some("a,b".into()),
            ..SynthParams::default()
        };
        let e = list.validate().unwrap_err().to_string();
        assert!(
            e.contains("must be one model name for a synthetic dataset"),
            "{e}"
        );
        let trace = SynthParams {
            input_file: Some("t.jsonl".into()),
            custom_dataset_type: Some(TraceKind::BurstGptTrace),
            ..list.clone()
        };
        assert!(trace
            .validate()
            .unwrap_err()
            .to_string()
            .contains("burst_gpt_trace"));
        let weka = SynthParams {
            custom_dataset_type: Some(TraceKind::WekaTrace),
            ..trace
        };
        weka.validate().unwrap();
        let one = SynthParams {
            model: Some("claude-opus".into()),
            ..SynthParams::default()
        };
        one.validate().unwrap();
    }

    #[test]
    fn multiplier_keys_read_from_a_config_file_and_are_checked() {
        let p: SynthParams = toml::from_str(
            r#"
            input_file = "trace.jsonl"
            synthesis_speedup_ratio = 2.0
            synthesis_prefix_root_multiplier = 3
            "#,
        )
        .unwrap();
        p.validate().unwrap();
        p.validate_trace_kind(TraceKind::BailianTrace).unwrap();
        assert_eq!(p.multipliers().prefix_root, 3);
        let e = p.validate_trace_kind(TraceKind::WekaTrace).unwrap_err();
        assert!(
            e.to_string().contains("--synthesis-speedup-ratio reshapes"),
            "{e}"
        );
        let bad = SynthParams {
            synthesis_prompt_len_multiplier: f64::NAN,
            ..p.clone()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.contains("--synthesis-prompt-len-multiplier (synth.dataset.synthesis_prompt_len_multiplier) is NaN"),
            "{e}"
        );
        let bad = SynthParams {
            synthesis_prefix_root_multiplier: 0,
            ..p
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn agentic_keys_read_from_a_config_file_and_belong_to_weka() {
        let p: SynthParams = toml::from_str(
            r#"
            input_file = "traces/"
            custom_dataset_type = "weka_trace"
            model = "a,b"
            synthesis_max_osl = 300
            max_context_length = 4096
            inter_turn_delay_cap_seconds = 2.5
            tool_shaped_messages = true
            "#,
        )
        .unwrap();
        assert_eq!(p.custom_dataset_type, Some(TraceKind::WekaTrace));
        assert_eq!(p.prompt_corpus, None);
        assert_eq!(p.inter_turn_delay_cap_seconds, Some(2.5));
        p.validate().unwrap();
        p.validate_trace_kind(TraceKind::WekaTrace).unwrap();
        let e = p.validate_trace_kind(TraceKind::MooncakeTrace).unwrap_err();
        assert!(
            e.to_string()
                .contains("--max-context-length applies to agentic weka_trace"),
            "{e}"
        );
        let synthetic = SynthParams {
            tool_shaped_messages: true,
            ..SynthParams::default()
        };
        let e = synthetic.validate().unwrap_err();
        assert!(
            e.to_string()
                .contains("--tool-shaped-messages applies to trace replay"),
            "{e}"
        );
    }
}
