//! Trace replay: AIPerf 0.13.0's trace loaders, one file each, in one table ([`LOADERS`]) that
//! both detection (`can_load`, in AIPerf's order) and dispatch (`build`) read: the hash-id
//! types in [`hash_ids`], BurstGPT in [`burst`], the agentic types in [`agentic`]. A new trace
//! format is one file and one row. Reads trace files; never writes files.

pub mod agentic;
pub mod analyze;
pub mod burst;
pub mod content;
pub mod hash_ids;
pub mod input;
pub mod precheck;
pub mod record;
pub mod synthesize;

use std::path::Path;
use std::sync::Arc;

use crate::synth::corpus::aiperf_coding::CodingPool;
use crate::synth::corpus::sonnet::SHAKESPEARE;
use crate::synth::corpus::PromptCorpus;
use crate::synth::corpus::TokenCorpus;
use crate::synth::dataset::params::SynthParams;
use crate::synth::dataset::trace_kind::{corpus_refusal, TraceKind};
use crate::synth::dataset::{Dataset, Out};
use crate::synth::error::{SynthError, TraceError};
use crate::synth::tokenizer::Tokenizer;

pub use content::{CodingContent, ExactContent, SonnetContent, TraceContent};
pub use hash_ids::{build, build_entries, read_lines, TraceFile, TraceParams};

/// What detection reads of an input: whether it is a directory, the top-level keys of its first
/// bytes and its first line.
pub struct Probe<'a> {
    pub path: &'a Path,
    pub dir: bool,
    pub keys: Vec<String>,
    /// `(line number, text)` of the first non-blank line, when the first bytes hold all of it.
    pub first: Option<(usize, &'a str)>,
    /// The first bytes are the whole file.
    pub whole: bool,
}

/// What a loader's `build` gets besides the content: the input, the run's flags, the tokenizer
/// and the root seed the content was made under.
pub struct Build<'a> {
    pub path: &'a Path,
    pub params: &'a SynthParams,
    pub tokenizer: &'a Tokenizer,
    pub root_seed: u64,
}

/// One trace loader: AIPerf's `can_load` for it, and its dataset builder, which hands each
/// conversation to `out` as soon as it is built (in output order), so a replay never holds more
/// than the conversations it is working on.
pub struct Loader {
    pub kind: TraceKind,
    /// Whether this loader reads the probed input (an error when the input is ambiguous or
    /// empty, naming the file).
    pub can_load: fn(&Probe<'_>) -> Result<bool, TraceError>,
    pub build: fn(&Build<'_>, &mut dyn TraceContent, &mut Out<'_>) -> Result<(), SynthError>,
}

/// Every loader, in AIPerf's detection order: the first whose `can_load` holds reads the input.
/// Mooncake, the fallback, comes last.
pub const LOADERS: [Loader; 5] = [
    agentic::WEKA,
    agentic::TRACELAB,
    burst::LOADER,
    hash_ids::BAILIAN,
    hash_ids::MOONCAKE,
];

/// The loader of `kind`.
pub fn loader(kind: TraceKind) -> &'static Loader {
    // Every kind has its row: `every_kind_has_one_loader` checks the table.
    #[allow(clippy::expect_used)]
    LOADERS
        .iter()
        .find(|l| l.kind == kind)
        .expect("every trace kind has a loader")
}

/// The type of the input at `path`: `--custom-dataset-type` when given, else the first loader
/// whose `can_load` holds, as AIPerf's loaders decide (a directory or a Weka JSON is
/// `weka_trace`, a first row with TraceLab's keys `tracelab`, a CSV with BurstGPT's columns
/// `burst_gpt_trace`, else mooncake or bailian from the first line), from the first
/// [`input::DETECT_BYTES`] of the file only.
pub fn detect_kind(path: &Path, given: Option<TraceKind>) -> Result<TraceKind, SynthError> {
    if let Some(k) = given {
        return Ok(k);
    }
    if path.is_dir() {
        return Ok(kind_of(&Probe {
            path,
            dir: true,
            keys: Vec::new(),
            first: None,
            whole: true,
        })?);
    }
    let prefix = input::detect_prefix(path)?;
    let whole = prefix.len() < input::DETECT_BYTES;
    let probe = Probe {
        path,
        dir: false,
        keys: input::top_level_keys(&prefix),
        first: input::first_line(&prefix, whole),
        whole,
    };
    Ok(kind_of(&probe)?)
}

fn kind_of(probe: &Probe<'_>) -> Result<TraceKind, TraceError> {
    for l in &LOADERS {
        if (l.can_load)(probe)? {
            return Ok(l.kind);
        }
    }
    // Mooncake's `can_load` always holds.
    Ok(TraceKind::MooncakeTrace)
}

/// The corpus a trace is built from: `--prompt-corpus` when given, else the type's AIPerf
/// default (coding for the agentic types, sonnet for the others).
pub fn default_corpus(kind: TraceKind) -> PromptCorpus {
    if kind.is_agentic() {
        PromptCorpus::Coding
    } else {
        PromptCorpus::Sonnet
    }
}

/// The dataset for `params.input_file` (see [`SynthParams`]): reads the trace, builds the
/// corpus it asks for (sonnet: shipped ids, or the id cache in `cache_dir`) and replays it.
pub fn build_from_params(
    params: &SynthParams,
    tokenizer: &Tokenizer,
    cache_dir: Option<&Path>,
) -> Result<Dataset, SynthError> {
    crate::synth::dataset::collect(|out| stream_from_params(params, tokenizer, cache_dir, out))
}

/// [`build_from_params`], each conversation handed to `out` as it is built (`kvbust synth`
/// writes it then and there).
pub fn stream_from_params(
    params: &SynthParams,
    tokenizer: &Tokenizer,
    cache_dir: Option<&Path>,
    out: &mut Out<'_>,
) -> Result<(), SynthError> {
    let path = params
        .input_file
        .as_deref()
        .ok_or_else(|| SynthError::invalid("a trace dataset needs --input-file"))?;
    let kind = detect_kind(path, params.custom_dataset_type)?;
    params.validate_trace_kind(kind)?;
    let root_seed = params.random_seed.unwrap_or_else(rand::random);
    let corpus = params.prompt_corpus.unwrap_or_else(|| default_corpus(kind));
    let b = Build {
        path,
        params,
        tokenizer,
        root_seed,
    };
    let build = loader(kind).build;
    match corpus {
        PromptCorpus::Sonnet => {
            let corpus = TokenCorpus::build_cached(SHAKESPEARE, tokenizer, cache_dir)?;
            build(
                &b,
                &mut SonnetContent::new(tokenizer, corpus, root_seed),
                out,
            )
        }
        PromptCorpus::Coding => {
            let pool = CodingPool::build_cached(root_seed, tokenizer, cache_dir)?;
            build(&b, &mut CodingContent::new(tokenizer, Arc::new(pool)), out)
        }
        PromptCorpus::CodingExact if !kind.is_agentic() && kind != TraceKind::BurstGptTrace => {
            let coding = crate::synth::corpus::kvbust_coding::CodingCorpus::for_root_seed_cached(
                root_seed, tokenizer, cache_dir,
            )?;
            build(
                &b,
                &mut ExactContent::new(tokenizer, coding.tokens(), root_seed)?,
                out,
            )
        }
        // Checked by SynthParams::validate; kept for callers that skip it.
        other => Err(SynthError::invalid(corpus_refusal(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_loader() {
        for kind in TraceKind::ALL {
            assert_eq!(
                LOADERS.iter().filter(|l| l.kind == kind).count(),
                1,
                "{kind}"
            );
        }
        assert_eq!(LOADERS.len(), TraceKind::ALL.len());
    }
}
