//! The typed errors of prompt synthesis. Owns error kinds and their messages only.

use std::path::PathBuf;

/// Everything that can go wrong while loading a tokenizer or synthesizing a dataset.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("cannot read tokenizer file {path}: {source}")]
    TokenizerIo {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} holds no tokenizer.json; pass a tokenizer.json file or a folder containing one"
    )]
    TokenizerMissing { path: PathBuf },
    #[error("cannot parse tokenizer {what}: {message}")]
    TokenizerParse { what: String, message: String },
    #[error("tokenizer failed to {op}: {message}")]
    Tokenize { op: &'static str, message: String },
    #[error("invalid synthesis parameters: {0}")]
    InvalidParams(String),
    #[error("chat template could not be rendered: {0}")]
    ChatTemplate(String),
    #[error("writing the output failed: {0}")]
    Output(#[from] std::io::Error),
    #[error(transparent)]
    Trace(#[from] crate::synth::dataset::trace::TraceError),
    #[error(transparent)]
    Agentic(Box<crate::synth::dataset::trace::agentic::AgenticError>),
}

impl From<crate::synth::dataset::trace::agentic::AgenticError> for SynthError {
    fn from(e: crate::synth::dataset::trace::agentic::AgenticError) -> Self {
        match e {
            crate::synth::dataset::trace::agentic::AgenticError::Synth(inner) => *inner,
            other => SynthError::Agentic(Box::new(other)),
        }
    }
}

impl SynthError {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        SynthError::InvalidParams(msg.into())
    }
}
