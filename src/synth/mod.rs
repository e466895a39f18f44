//! Prompt synthesis: tokenizer, bit-exact RNG ports, corpora and the AIPerf dataset composer. Never does network I/O.

pub mod bench;
pub mod cli;
pub mod corpus;
pub mod dataset;
pub mod error;
pub mod prompt;
pub mod rng;
pub mod tokenizer;

pub use corpus::{RandomCorpusStyle, TokenCorpus};
pub use dataset::composer::{build_dataset, build_dataset_with, compose, compose_from};
pub use dataset::marker::CacheBustTarget;
pub use dataset::params::{PromptCorpus, RangeRatio, SynthParams};
pub use dataset::{Conversation, Dataset, Turn};
pub use error::SynthError;
pub use prompt::stream::PromptStream;
pub use tokenizer::Tokenizer;
