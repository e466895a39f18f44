//! numpy's legacy `RandomState(seed)`: MT19937 seeded by `init_genrand` and the masked
//! rejection `randint`, plus AIPerf's 64→32-bit seed folding.
//! Owns only this generator's state; must never use any other source of randomness.

use super::cpython::Mt19937;

/// AIPerf's fold of a seed to 32 bits before `RandomState`: `(seed ^ (seed >> 32)) & 0xffffffff`.
pub fn fold_seed_to_u32(seed: u64) -> u32 {
    (seed ^ (seed >> 32)) as u32
}

/// `numpy.random.RandomState(seed)` (also what `np.random.seed(seed)` sets up).
#[derive(Clone)]
pub struct RandomState {
    mt: Mt19937,
}

impl RandomState {
    /// Seeds with Knuth's `init_genrand` (not `init_by_array`).
    pub fn new(seed: u32) -> Self {
        RandomState {
            mt: Mt19937::from_init_genrand(seed),
        }
    }

    /// One raw 32-bit output (unbuffered).
    pub fn next_u32(&mut self) -> u32 {
        self.mt.next_u32()
    }

    /// Legacy `next_uint64`: the first 32-bit draw is the high half.
    pub fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        (hi << 32) | u64::from(self.next_u32())
    }

    /// `randint(low, high)`: uniform in `[low, high)` by masked rejection; no draw when the
    /// range holds one value.
    ///
    /// # Panics
    /// If `low >= high` (numpy raises there too).
    pub fn randint(&mut self, low: i64, high: i64) -> i64 {
        assert!(low < high, "randint needs low < high");
        let rng = (high as i128 - 1 - low as i128) as u64;
        if rng == 0 {
            return low;
        }
        let mask = u64::MAX >> rng.leading_zeros();
        let v = if rng <= u64::from(u32::MAX) {
            loop {
                let v = u64::from(self.next_u32()) & mask;
                if v <= rng {
                    break v;
                }
            }
        } else {
            loop {
                let v = self.next_u64() & mask;
                if v <= rng {
                    break v;
                }
            }
        };
        (low as i128 + v as i128) as i64
    }

    /// `randint(low, high, size=n)`.
    pub fn randint_n(&mut self, low: i64, high: i64, n: usize) -> Vec<i64> {
        (0..n).map(|_| self.randint(low, high)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_examples() {
        assert_eq!(fold_seed_to_u32(5), 5);
        assert_eq!(fold_seed_to_u32(4294967300), 5);
        assert_eq!(fold_seed_to_u32(1099511627781), 261);
        assert_eq!(fold_seed_to_u32(9223372036854775807), 2147483648);
    }

    #[test]
    fn randint_seed_42() {
        let mut r = RandomState::new(42);
        assert_eq!(
            r.randint_n(1, 1025, 10),
            [103, 436, 861, 271, 107, 72, 701, 21, 615, 122]
        );
    }
}
