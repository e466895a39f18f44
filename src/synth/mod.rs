//! Prompt synthesis: tokenizer, bit-exact RNG ports, corpora and the AIPerf dataset composer. Never does network I/O.

pub mod rng;
