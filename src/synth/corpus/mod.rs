//! The prompt corpora: token arrays (the sonnet corpus's, and the coding corpora's in the same
//! shape) and the random-corpus token pools.
//! Owns corpus construction only; must never draw random numbers.

pub mod aiperf_coding;
pub mod cache;
pub mod hash_blocks;
pub mod kvbust_coding;
pub mod random;
pub mod sonnet;
pub mod tokens;

pub use random::{RandomCorpusStyle, RandomPools};
pub use tokens::TokenCorpus;
