//! The prompt corpora: the sonnet token array and the random-corpus token pools.
//! Owns corpus construction only; must never draw random numbers.

pub mod random;
pub mod sonnet;

pub use random::{RandomCorpusStyle, RandomPools};
pub use sonnet::SonnetCorpus;
