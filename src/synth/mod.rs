//! Prompt synthesis: tokenizer, bit-exact RNG ports, corpora and the AIPerf dataset composer. Never does network I/O.

pub mod agentic;
pub mod bench;
pub mod chat_template;
pub mod cli;
pub mod coding;
pub mod coding_exact;
pub mod composer;
pub mod corpus;
pub mod dataset;
pub mod error;
pub mod export;
pub mod generator;
pub mod hash_blocks;
pub mod marker;
pub mod params;
pub mod piece_memo;
pub mod placeholders;
pub mod reencode;
pub mod rng;
pub mod stream;
pub mod tokenizer;
pub mod trace;

pub use composer::{build_dataset, build_dataset_with, compose, compose_from};
pub use corpus::{RandomCorpusStyle, TokenCorpus};
pub use dataset::{Conversation, Dataset, Turn};
pub use error::SynthError;
pub use marker::CacheBustTarget;
pub use params::{PromptCorpus, RangeRatio, SynthParams};
pub use stream::PromptStream;
pub use tokenizer::Tokenizer;
