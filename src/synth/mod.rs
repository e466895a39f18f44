//! Prompt synthesis: tokenizer, bit-exact RNG ports, corpora and the AIPerf dataset composer.
//! Never does network I/O. Laid out in layers, each importing only those below it (checked by
//! `tools/layers.py`): `error` < `rng` < `tokenizer` < `corpus` < `prompt` < `dataset` < the
//! edges (`cli`, `bench`).

pub mod bench;

pub mod corpus;
pub mod dataset;
pub mod error;
pub mod prompt;
pub mod rng;
pub mod tokenizer;

pub use corpus::{PromptCorpus, RandomCorpusStyle, TokenCorpus};
pub use dataset::composer::{build_dataset, build_dataset_with, compose, compose_from};
pub use dataset::marker::CacheBustTarget;
pub use dataset::params::{RangeRatio, SynthParams};
pub use dataset::{Conversation, Dataset, Turn};
pub use error::SynthError;
pub use prompt::stream::PromptStream;
pub use tokenizer::Tokenizer;
