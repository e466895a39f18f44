//! Bit-exact ports of the random number generators AIPerf, vLLM and SGLang draw from.
//! Owns only number generation; must never read files or the clock, nor OS entropy outside
//! `uuid` (unseeded session ids).

pub mod cpython;
pub mod derive;
pub mod numpy_dist;
pub mod numpy_legacy;
pub mod numpy_pcg64;
pub mod uuid;
pub mod ziggurat_tables;

pub use cpython::PyRandom;
pub use derive::{derive_seed, DerivedRng, GeneratorRngs};
pub use numpy_legacy::{fold_seed_to_u32, RandomState};
pub use numpy_pcg64::{NumpyGenerator, SeedSequence};

/// Python's `round()` on a float: round half to even, as an integer.
pub fn py_round(x: f64) -> i64 {
    x.round_ties_even() as i64
}
