//! Which trace loader a dataset is replayed with (`--custom-dataset-type`), what starts each
//! synthesized block (`--trace-block-terminator`) and which corpora a trace may draw from.
//! Owns these choices and their names; must never read a trace (that is `trace`).

use crate::synth::corpus::PromptCorpus;

/// `--custom-dataset-type`: the trace loaders kvbust reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    /// Mooncake: `input_length` + `hash_ids`, or `text_input` / `messages` / `payload`;
    /// `timestamp`, or `session_id` + `delay` for multi-turn.
    MooncakeTrace,
    /// Alibaba Bailian: `chat_id` / `parent_chat_id` / `turn` chains, timestamps in seconds.
    BailianTrace,
    /// Weka kv-cache-tester agentic coding traces (JSON per trace, a directory of them, or a
    /// SemiAnalysis cc-traces JSON-lines export): see [`crate::synth::dataset::trace::agentic`].
    WekaTrace,
    /// BurstGPT CSV: `Timestamp`, `Request tokens`, `Response tokens` per row.
    BurstGptTrace,
    /// TraceLab (uw-syfi) agentic coding rounds, JSON lines, plain or gzipped: converted to Weka
    /// traces (see [`crate::synth::dataset::trace::agentic::tracelab`]).
    Tracelab,
}

/// AIPerf's other `--custom-dataset-type` values (named in the error for a better hint).
const OTHER_AIPERF_TYPES: &[&str] = &[
    "single_turn",
    "multi_turn",
    "random_pool",
    "raw_payload",
    "inputs_json",
    "baseten_trace",
    "sagemaker_data_capture",
    "dag_jsonl",
];

impl TraceKind {
    /// Every kind.
    pub const ALL: [TraceKind; 5] = [
        TraceKind::MooncakeTrace,
        TraceKind::BailianTrace,
        TraceKind::WekaTrace,
        TraceKind::BurstGptTrace,
        TraceKind::Tracelab,
    ];

    /// AIPerf's name.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceKind::MooncakeTrace => "mooncake_trace",
            TraceKind::BailianTrace => "bailian_trace",
            TraceKind::WekaTrace => "weka_trace",
            TraceKind::BurstGptTrace => "burst_gpt_trace",
            TraceKind::Tracelab => "tracelab",
        }
    }

    /// Whether the type is an agentic one ([`crate::synth::dataset::trace::agentic`]), whose AIPerf plugin
    /// defaults to the coding corpus.
    pub fn is_agentic(self) -> bool {
        matches!(self, TraceKind::WekaTrace | TraceKind::Tracelab)
    }

    /// The plugin's `default_block_size` (`--isl-block-size` overrides it).
    pub const fn default_block_size(self) -> usize {
        match self {
            TraceKind::MooncakeTrace => 512,
            TraceKind::BailianTrace => 16,
            // AIPerf's agentic plugins (`weka::DEFAULT_BLOCK_SIZE` and
            // `tracelab::DEFAULT_BLOCK_SIZE` read theirs from here).
            TraceKind::WekaTrace => 64,
            TraceKind::Tracelab => 64,
            // No hash ids: the block size is never used.
            TraceKind::BurstGptTrace => 512,
        }
    }

    /// The other hash-id kind, tried for a better hint when a line does not parse as `self`.
    pub(crate) fn other(self) -> Self {
        match self {
            TraceKind::BailianTrace => TraceKind::MooncakeTrace,
            _ => TraceKind::BailianTrace,
        }
    }
}

impl std::fmt::Display for TraceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TraceKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mooncake_trace" => Ok(TraceKind::MooncakeTrace),
            "bailian_trace" => Ok(TraceKind::BailianTrace),
            "weka_trace" => Ok(TraceKind::WekaTrace),
            "burst_gpt_trace" => Ok(TraceKind::BurstGptTrace),
            "tracelab" => Ok(TraceKind::Tracelab),
            other if OTHER_AIPERF_TYPES.contains(&other) => Err(format!(
                "{other} is an AIPerf dataset type kvbust does not reproduce; kvbust reads \
                 mooncake_trace, bailian_trace, weka_trace, burst_gpt_trace and tracelab"
            )),
            other => Err(format!(
                "unknown custom dataset type {other:?}; use mooncake_trace, bailian_trace, \
                 weka_trace, burst_gpt_trace or tracelab"
            )),
        }
    }
}

/// `--trace-block-terminator`: what starts each synthesized hash-id block.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum BlockTerminator {
    /// AIPerf's: the tokenizer's BOS, else its EOS (Qwen3: `<|im_end|>`), as the first token
    /// of every block.
    #[default]
    Aiperf,
    /// kvbust extension: blocks are corpus tokens only.
    None,
}

/// Why `corpus` cannot feed a trace (empty for sonnet and coding, which can).
pub fn corpus_refusal(corpus: PromptCorpus) -> String {
    match corpus {
        PromptCorpus::Sonnet => String::new(),
        PromptCorpus::Random => "--prompt-corpus random is not compatible with a trace \
            (--input-file): trace loaders synthesize prompt content from a text corpus keyed by \
            hash_id, and there is no corpus to draw from with the random corpus (AIPerf's rule). \
            Use --prompt-corpus sonnet, or drop --input-file for a synthetic dataset"
            .into(),
        PromptCorpus::Coding => String::new(),
        PromptCorpus::CodingExact => "--prompt-corpus coding-exact is kvbust's own token-exact \
            corpus, for the hash-id traces (mooncake_trace, bailian_trace) only; the agentic and \
            BurstGPT types replay with AIPerf's corpora. Use --prompt-corpus coding or sonnet"
            .into(),
    }
}
