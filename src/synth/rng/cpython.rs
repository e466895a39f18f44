//! CPython 3.11 `random.Random`: MT19937 seeded by `init_by_array` from an int, `getrandbits`,
//! `_randbelow`/`randrange`/`randint`/`choice`, `random()` and `gauss` with its cached value.
//! Owns only this generator's state; must never use any other source of randomness.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// The MT19937 core shared by CPython and numpy's legacy `RandomState`.
#[derive(Clone)]
pub struct Mt19937 {
    mt: [u32; N],
    index: usize,
}

impl Mt19937 {
    /// Knuth's `init_genrand`: the seeding numpy's `RandomState(seed)` uses.
    pub fn from_init_genrand(seed: u32) -> Self {
        let mut mt = [0u32; N];
        mt[0] = seed;
        for i in 1..N {
            let prev = mt[i - 1];
            mt[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { mt, index: N }
    }

    /// `init_by_array(key)`: the seeding CPython's `random.seed(int)` uses.
    pub fn from_init_by_array(key: &[u32]) -> Self {
        let mut g = Self::from_init_genrand(19_650_218);
        let mt = &mut g.mt;
        let key_len = key.len().max(1);
        let mut i = 1usize;
        let mut j = 0usize;
        for _ in 0..N.max(key_len) {
            let prev = mt[i - 1];
            let k = key.get(j).copied().unwrap_or(0);
            mt[i] = (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(k)
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key_len {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = mt[i - 1];
            mt[i] =
                (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        g.index = N;
        g
    }

    fn twist(&mut self) {
        for k in 0..N {
            let y = (self.mt[k] & UPPER_MASK) | (self.mt[(k + 1) % N] & LOWER_MASK);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            self.mt[k] = self.mt[(k + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// One tempered 32-bit output (`genrand_uint32`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }
}

/// CPython's `random.Random`, seeded from a non-negative integer.
#[derive(Clone)]
pub struct PyRandom {
    mt: Mt19937,
    gauss_next: Option<f64>,
}

impl PyRandom {
    /// `random.Random(seed)` for an integer seed (the key is |seed|'s 32-bit words, low first).
    pub fn new(seed: u64) -> Self {
        let lo = seed as u32;
        let hi = (seed >> 32) as u32;
        let key: &[u32] = if hi == 0 { &[lo] } else { &[lo, hi] };
        PyRandom {
            mt: Mt19937::from_init_by_array(key),
            gauss_next: None,
        }
    }

    /// One raw 32-bit MT output.
    pub fn next_u32(&mut self) -> u32 {
        self.mt.next_u32()
    }

    /// `getrandbits(k)` for `k <= 64`.
    ///
    /// # Panics
    /// If `k > 64` (a caller bug: no AIPerf draw needs more).
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        assert!(k <= 64, "getrandbits is ported for k <= 64 only");
        if k == 0 {
            return 0;
        }
        if k <= 32 {
            return u64::from(self.next_u32() >> (32 - k));
        }
        // Words are filled least significant first; the last word keeps its top bits.
        let low = u64::from(self.next_u32());
        let high = u64::from(self.next_u32() >> (64 - k));
        (high << 32) | low
    }

    /// `_randbelow(n)`: uniform in `[0, n)` by rejection on `getrandbits(bit_length(n))`.
    ///
    /// # Panics
    /// If `n == 0` (Python raises there too).
    pub fn randbelow(&mut self, n: u64) -> u64 {
        assert!(n > 0, "randbelow needs a positive bound");
        let k = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `randrange(n)` for a positive `n`.
    pub fn randrange(&mut self, n: u64) -> u64 {
        self.randbelow(n)
    }

    /// `randint(a, b)`, both ends inclusive.
    ///
    /// # Panics
    /// If `a > b` (Python raises there too).
    pub fn randint(&mut self, a: i64, b: i64) -> i64 {
        assert!(a <= b, "randint needs a <= b");
        let width = (b as i128 - a as i128 + 1) as u64;
        (a as i128 + self.randbelow(width) as i128) as i64
    }

    /// `choice(seq)` index: `_randbelow(len)`; `len` must be positive.
    pub fn choice_index(&mut self, len: usize) -> usize {
        self.randbelow(len as u64) as usize
    }

    /// `sample(population, k)` as indices into a population of `n`: CPython's two algorithms
    /// (a shrinking pool for small populations, rejection on a set for large ones), chosen by
    /// the same `setsize` rule, so the draws match.
    ///
    /// # Panics
    /// If `k > n` (Python raises there too).
    pub fn sample_indices(&mut self, n: usize, k: usize) -> Vec<usize> {
        assert!(k <= n, "sample larger than population");
        let mut setsize = 21usize;
        if k > 5 {
            let e = ((k * 3) as f64).ln() / 4f64.ln();
            setsize += 4usize.pow(e.ceil() as u32);
        }
        let mut out = Vec::with_capacity(k);
        if n <= setsize {
            let mut pool: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = self.randbelow((n - i) as u64) as usize;
                out.push(pool[j]);
                pool[j] = pool[n - i - 1];
            }
        } else {
            let mut selected = std::collections::HashSet::with_capacity(k);
            for _ in 0..k {
                let mut j = self.randbelow(n as u64) as usize;
                while !selected.insert(j) {
                    j = self.randbelow(n as u64) as usize;
                }
                out.push(j);
            }
        }
        out
    }

    /// `uniform(a, b)`: `a + (b - a) * random()`.
    pub fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.random()
    }

    /// `random()`: a 53-bit double in `[0, 1)`.
    pub fn random(&mut self) -> f64 {
        let a = f64::from(self.next_u32() >> 5);
        let b = f64::from(self.next_u32() >> 6);
        (a * 67_108_864.0 + b) / 9_007_199_254_740_992.0
    }

    /// `gauss(mu, sigma)`: Box–Muller with the second value cached for the next call.
    pub fn gauss(&mut self, mu: f64, sigma: f64) -> f64 {
        let z = match self.gauss_next.take() {
            Some(z) => z,
            None => {
                let x2pi = self.random() * std::f64::consts::TAU;
                let g2rad = (-2.0 * (1.0 - self.random()).ln()).sqrt();
                self.gauss_next = Some(x2pi.sin() * g2rad);
                x2pi.cos() * g2rad
            }
        };
        mu + z * sigma
    }

    /// AIPerf's `sample_positive_normal_integer(mean, stddev)`.
    pub fn sample_positive_normal_integer(&mut self, mean: f64, stddev: f64) -> u64 {
        let clamped = super::py_round(mean).max(1) as u64;
        if stddev <= 0.0 {
            return clamped;
        }
        for _ in 0..10_000 {
            let x = self.gauss(mean, stddev);
            if x >= 0.0 {
                return (x.ceil() as u64).max(1);
            }
        }
        clamped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_0_and_42_first_words() {
        let mut r = PyRandom::new(0);
        let got: Vec<u32> = (0..3).map(|_| r.next_u32()).collect();
        assert_eq!(got, [3626764237, 1654615998, 3255389356]);
        let mut r = PyRandom::new(42);
        assert_eq!(r.next_u32(), 2746317213);
    }

    #[test]
    fn randrange_and_gauss_seed_42() {
        let mut r = PyRandom::new(42);
        let got: Vec<u64> = (0..5).map(|_| r.randrange(1_200_000)).collect();
        assert_eq!(got, [233478, 52451, 576778, 513575, 468106]);
        let mut r = PyRandom::new(42);
        assert_eq!(r.gauss(128.0, 20.0), 125.11819340844143);
        assert_eq!(r.gauss(128.0, 20.0), 124.54192799336961);
    }

    #[test]
    fn two_word_seed() {
        let mut r = PyRandom::new(10558974911300946294);
        assert_eq!(r.next_u32(), 1032511543);
    }

    #[test]
    fn positive_normal_without_stddev_draws_nothing() {
        let mut r = PyRandom::new(1);
        assert_eq!(r.sample_positive_normal_integer(2.5, 0.0), 2);
        assert_eq!(r.sample_positive_normal_integer(0.2, 0.0), 1);
        assert_eq!(r.next_u32(), PyRandom::new(1).next_u32());
    }
}
