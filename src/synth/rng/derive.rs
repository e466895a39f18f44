//! AIPerf's derived random streams: `sha256("{root_seed}:{identifier}")`'s first 8 bytes,
//! big-endian, seed one CPython `random.Random` and one numpy `default_rng` each.
//! Owns only seed derivation and the named streams a prompt generator draws from; must never
//! fall back to OS entropy.

use sha2::{Digest, Sha256};

use super::{NumpyGenerator, PyRandom};

/// `int.from_bytes(sha256(f"{root_seed}:{identifier}").digest()[:8], "big")`.
pub fn derive_seed(root_seed: u64, identifier: &str) -> u64 {
    let digest = Sha256::digest(format!("{root_seed}:{identifier}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// AIPerf's `RandomGenerator`: two independent generators seeded with the same derived value.
#[derive(Clone)]
pub struct DerivedRng {
    /// The derived 64-bit seed.
    pub seed: u64,
    /// The CPython side (`randrange`, `choice`, `gauss`, …).
    pub py: PyRandom,
    /// The numpy side (`integers`, `shuffle`, …).
    pub np: NumpyGenerator,
}

impl DerivedRng {
    /// `rng.derive(identifier)` under the root seed.
    pub fn derive(root_seed: u64, identifier: &str) -> Self {
        Self::from_seed(derive_seed(root_seed, identifier))
    }

    /// Both generators seeded with `seed`.
    pub fn from_seed(seed: u64) -> Self {
        DerivedRng {
            seed,
            py: PyRandom::new(seed),
            np: NumpyGenerator::new(u128::from(seed)),
        }
    }
}

/// The derived streams a prompt generator draws from.
pub struct GeneratorRngs {
    /// `dataset.prompt.length` (CPython side: lengths with a stddev).
    pub length: DerivedRng,
    /// `dataset.prompt.corpus` (CPython side: sonnet windows; numpy side: random offsets/top-ups).
    pub corpus: DerivedRng,
    /// `dataset.prompt.prefix` (CPython side: prefix-pool choice).
    pub prefix: DerivedRng,
}

impl GeneratorRngs {
    /// The three streams of AIPerf's `PromptGenerator` (`dataset.prompt.*`) under a root seed.
    pub fn derive(root_seed: u64) -> Self {
        Self::derive_under(root_seed, "dataset.prompt")
    }

    /// The three streams `{prefix}.length`, `.corpus` and `.prefix` under a root seed (the
    /// coding corpus uses `dataset.coding_content`).
    pub fn derive_under(root_seed: u64, prefix: &str) -> Self {
        let d = |s: &str| DerivedRng::derive(root_seed, &format!("{prefix}.{s}"));
        GeneratorRngs {
            length: d("length"),
            corpus: d("corpus"),
            prefix: d("prefix"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_seeds_seed_42() {
        assert_eq!(
            derive_seed(42, "dataset.prompt.corpus"),
            10558974911300946294
        );
        assert_eq!(
            derive_seed(42, "dataset.prompt.length"),
            7521479737366565015
        );
    }
}
