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
    Trace(#[from] TraceError),
    #[error(transparent)]
    Agentic(Box<AgenticError>),
}

impl From<AgenticError> for SynthError {
    fn from(e: AgenticError) -> Self {
        match e {
            AgenticError::Synth(inner) => *inner,
            other => SynthError::Agentic(Box::new(other)),
        }
    }
}

/// Bad trace input: always names the file, and the line and field when there is one.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} holds no trace lines (empty, or only blank lines); give a JSONL file with one \
         {kind} entry per line"
    )]
    Empty { path: PathBuf, kind: String },
    #[error("{path}:{line}: {message}")]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
}

/// Bad agentic input: always names the file, and the trace id and JSON path when known.
#[derive(Debug, thiserror::Error)]
pub enum AgenticError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}{}: {}{message}", trace_id.as_deref().map(|t| format!(": trace {t:?}")).unwrap_or_default(), if path.is_empty() { String::new() } else { format!("{path}: ") })]
    Input {
        /// The file (and line, for JSON-lines exports).
        origin: String,
        trace_id: Option<String>,
        /// The JSON path inside the trace (`requests[3].in`).
        path: String,
        message: String,
    },
    #[error("{0}")]
    Selection(String),
    #[error(transparent)]
    Synth(#[from] Box<SynthError>),
}

impl From<SynthError> for AgenticError {
    fn from(e: SynthError) -> Self {
        AgenticError::Synth(Box::new(e))
    }
}

impl SynthError {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        SynthError::InvalidParams(msg.into())
    }
}
