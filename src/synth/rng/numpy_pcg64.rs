//! numpy's `default_rng(seed)`: `SeedSequence` → PCG64 (XSL-RR 128/64) with numpy's buffered
//! 32-bit half-word, Lemire bounded `integers`, `random()` and list `shuffle`.
//! Owns only this generator's state; must never use any other source of randomness.

use rand::RngCore;
use rand_pcg::Lcg128Xsl64;

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const POOL_SIZE: usize = 4;

/// numpy's `SeedSequence` for an integer entropy value and no spawn key.
pub struct SeedSequence {
    pool: [u32; POOL_SIZE],
}

fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut v = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    v = v.wrapping_mul(*hash_const);
    v ^ (v >> 16)
}

fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> 16)
}

impl SeedSequence {
    /// `SeedSequence(entropy)` for a non-negative integer up to 128 bits.
    pub fn new(entropy: u128) -> Self {
        let mut words = Vec::with_capacity(4);
        let mut e = entropy;
        loop {
            words.push(e as u32);
            e >>= 32;
            if e == 0 {
                break;
            }
        }
        let mut hc = INIT_A;
        let mut pool = [0u32; POOL_SIZE];
        for (i, slot) in pool.iter_mut().enumerate() {
            *slot = hashmix(words.get(i).copied().unwrap_or(0), &mut hc);
        }
        for src in 0..POOL_SIZE {
            for dst in 0..POOL_SIZE {
                if src != dst {
                    let h = hashmix(pool[src], &mut hc);
                    pool[dst] = mix(pool[dst], h);
                }
            }
        }
        for &w in words.iter().skip(POOL_SIZE) {
            for slot in pool.iter_mut() {
                let h = hashmix(w, &mut hc);
                *slot = mix(*slot, h);
            }
        }
        SeedSequence { pool }
    }

    /// The mixed entropy pool.
    pub fn pool(&self) -> [u32; POOL_SIZE] {
        self.pool
    }

    /// `generate_state(n, uint32)`.
    pub fn generate_state_u32(&self, n: usize) -> Vec<u32> {
        let mut hc = INIT_B;
        (0..n)
            .map(|k| {
                let mut w = self.pool[k % POOL_SIZE] ^ hc;
                hc = hc.wrapping_mul(MULT_B);
                w = w.wrapping_mul(hc);
                w ^ (w >> 16)
            })
            .collect()
    }

    /// `generate_state(n, uint64)`: pairs of 32-bit words, low half first.
    pub fn generate_state_u64(&self, n: usize) -> Vec<u64> {
        self.generate_state_u32(2 * n)
            .chunks_exact(2)
            .map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32))
            .collect()
    }
}

/// numpy `Generator(PCG64(SeedSequence(seed)))`, i.e. `numpy.random.default_rng(seed)`.
#[derive(Clone)]
pub struct NumpyGenerator {
    core: Lcg128Xsl64,
    /// numpy's `has_uint32`/`uinteger`: the high half of the last u64, waiting to be used.
    buffered_u32: Option<u32>,
}

impl NumpyGenerator {
    /// `default_rng(seed)`.
    pub fn new(seed: u128) -> Self {
        let s = SeedSequence::new(seed).generate_state_u64(4);
        let initstate = (u128::from(s[0]) << 64) | u128::from(s[1]);
        let initseq = (u128::from(s[2]) << 64) | u128::from(s[3]);
        NumpyGenerator {
            core: Lcg128Xsl64::new(initstate, initseq),
            buffered_u32: None,
        }
    }

    /// One raw PCG64 output (`bit_generator.random_raw()`); leaves the half-word buffer alone.
    pub fn next_u64(&mut self) -> u64 {
        self.core.next_u64()
    }

    /// numpy's buffered `next_uint32`: low half of a fresh u64 first, its high half next time.
    pub fn next_u32(&mut self) -> u32 {
        if let Some(v) = self.buffered_u32.take() {
            return v;
        }
        let x = self.next_u64();
        self.buffered_u32 = Some((x >> 32) as u32);
        x as u32
    }

    /// `random()`: a 53-bit double in `[0, 1)`.
    pub fn random(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    fn lemire_u32(&mut self, rng: u32) -> u32 {
        let range = u64::from(rng) + 1;
        let mut m = u64::from(self.next_u32()) * range;
        let mut left = m as u32;
        if u64::from(left) < range {
            let threshold = ((u32::MAX - rng) as u64 % range) as u32;
            while left < threshold {
                m = u64::from(self.next_u32()) * range;
                left = m as u32;
            }
        }
        (m >> 32) as u32
    }

    fn lemire_u64(&mut self, rng: u64) -> u64 {
        let range = u128::from(rng) + 1;
        let mut m = u128::from(self.next_u64()) * range;
        let mut left = m as u64;
        if u128::from(left) < range {
            let threshold = ((u64::MAX - rng) as u128 % range) as u64;
            while left < threshold {
                m = u128::from(self.next_u64()) * range;
                left = m as u64;
            }
        }
        (m >> 64) as u64
    }

    /// `integers(low, high)`: uniform in `[low, high)`. A one-value range (`high - low == 1`)
    /// returns `low` without drawing, as numpy does.
    ///
    /// # Panics
    /// If `low >= high` (numpy raises there too).
    pub fn integers(&mut self, low: i64, high: i64) -> i64 {
        assert!(low < high, "integers needs low < high");
        let rng = (high as i128 - 1 - low as i128) as u64;
        let off = if rng == 0 {
            0
        } else if rng <= u64::from(u32::MAX) {
            if rng == u64::from(u32::MAX) {
                u64::from(self.next_u32())
            } else {
                u64::from(self.lemire_u32(rng as u32))
            }
        } else if rng == u64::MAX {
            self.next_u64()
        } else {
            self.lemire_u64(rng)
        };
        (low as i128 + off as i128) as i64
    }

    /// `integers(low, high, size=n)`: identical to `n` scalar draws.
    pub fn integers_n(&mut self, low: i64, high: i64, n: usize) -> Vec<i64> {
        (0..n).map(|_| self.integers(low, high)).collect()
    }

    /// numpy's `random_interval(max)`: masked rejection in `[0, max]`.
    pub fn random_interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mask = u64::MAX >> max.leading_zeros();
        if max <= u64::from(u32::MAX) {
            loop {
                let v = u64::from(self.next_u32()) & mask;
                if v <= max {
                    return v;
                }
            }
        }
        loop {
            let v = self.next_u64() & mask;
            if v <= max {
                return v;
            }
        }
    }

    /// `Generator.shuffle(list)`: Fisher–Yates from the end with `random_interval`.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.random_interval(i as u64) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_sequence_pool_seed_0() {
        assert_eq!(
            SeedSequence::new(0).pool(),
            [4265667335, 1328953910, 1320288413, 3365567143]
        );
    }

    #[test]
    fn raw_outputs_seed_0() {
        let mut g = NumpyGenerator::new(0);
        assert_eq!(g.next_u64(), 11749869230777074271);
        assert_eq!(g.next_u64(), 4976686463289251617);
    }

    #[test]
    fn lemire_uses_both_halves() {
        let mut g = NumpyGenerator::new(0);
        assert_eq!(
            g.integers_n(0, 50000, 10),
            [42531, 31848, 25556, 13489, 15391, 2048, 3762, 826, 8763, 40663]
        );
    }

    #[test]
    fn degenerate_range_draws_nothing() {
        let mut a = NumpyGenerator::new(5);
        let mut b = NumpyGenerator::new(5);
        assert_eq!(a.integers(7, 8), 7);
        assert_eq!(a.next_u64(), b.next_u64());
    }
}
