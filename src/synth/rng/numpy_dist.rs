//! numpy `Generator` draws beyond uniform integers and doubles, bit for bit: the ziggurat
//! `standard_normal` (and `normal`/`lognormal` on it), `bytes`, and `choice(n, p=...)` with
//! numpy's pairwise `sum`. Owns only these draws; must never read files or OS entropy.

use super::numpy_pcg64::NumpyGenerator;
use super::ziggurat_tables::{FI, KI, WI};

/// The ziggurat's base-layer edge (numpy's `ziggurat_nor_r`).
const ZIGGURAT_R: f64 = 3.654_152_885_361_009;
/// `1 / ZIGGURAT_R` (numpy's `ziggurat_nor_inv_r`).
const ZIGGURAT_INV_R: f64 = 0.273_661_237_329_758_3;

/// `standard_normal()`: numpy's 256-layer ziggurat over raw 64-bit draws.
pub fn standard_normal(g: &mut NumpyGenerator) -> f64 {
    loop {
        let mut r = g.next_u64();
        let idx = (r & 0xff) as usize;
        r >>= 8;
        let negative = r & 1 == 1;
        let rabs = (r >> 1) & 0x000f_ffff_ffff_ffff;
        let mut x = rabs as f64 * WI[idx];
        if negative {
            x = -x;
        }
        if rabs < KI[idx] {
            return x;
        }
        if idx == 0 {
            // The tail past R (1 - U keeps log away from 0, as numpy).
            loop {
                let xx = -ZIGGURAT_INV_R * (-g.random()).ln_1p();
                let yy = -(-g.random()).ln_1p();
                if yy + yy > xx * xx {
                    return if (rabs >> 8) & 1 == 1 {
                        -(ZIGGURAT_R + xx)
                    } else {
                        ZIGGURAT_R + xx
                    };
                }
            }
        }
        if (FI[idx - 1] - FI[idx]) * g.random() + FI[idx] < (-0.5 * x * x).exp() {
            return x;
        }
    }
}

/// `lognormal(mean, sigma)`: `exp(mean + sigma * standard_normal())`.
pub fn lognormal(g: &mut NumpyGenerator, mean: f64, sigma: f64) -> f64 {
    (mean + sigma * standard_normal(g)).exp()
}

/// `bytes(n)`: little-endian 32-bit draws, cut to `n` bytes.
pub fn bytes(g: &mut NumpyGenerator, n: usize) -> Vec<u8> {
    let words = if n == 0 { 0 } else { (n - 1) / 4 + 1 };
    let mut out: Vec<u8> = (0..words)
        .flat_map(|_| g.next_u32().to_le_bytes())
        .collect();
    out.truncate(n);
    out
}

/// numpy's pairwise summation of a contiguous float64 array (`ndarray.sum()`).
pub fn pairwise_sum(a: &[f64]) -> f64 {
    const BLOCK: usize = 128;
    let n = a.len();
    if n < 8 {
        return a.iter().fold(0.0, |acc, x| acc + x);
    }
    if n <= BLOCK {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let whole = n - n % 8;
        for chunk in a[8..whole].chunks_exact(8) {
            for (acc, x) in r.iter_mut().zip(chunk) {
                *acc += x;
            }
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for x in &a[whole..] {
            res += x;
        }
        return res;
    }
    let mut half = n / 2;
    half -= half % 8;
    pairwise_sum(&a[..half]) + pairwise_sum(&a[half..])
}

/// The cumulative distribution `choice(len(p), p=p)` searches: `p.cumsum() / cdf[-1]`.
pub fn choice_cdf(p: &[f64]) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = p
        .iter()
        .map(|x| {
            acc += x;
            acc
        })
        .collect();
    let last = cdf.last().copied().unwrap_or(1.0);
    for c in &mut cdf {
        *c /= last;
    }
    cdf
}

/// `choice(len(p), p=p)` for one value, with the cdf from [`choice_cdf`]: one `random()`
/// searched with `side='right'`.
pub fn choice_index(g: &mut NumpyGenerator, cdf: &[f64]) -> usize {
    let u = g.random();
    cdf.partition_point(|&c| c <= u)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by numpy 2.4.6 (`default_rng(seed)`).
    #[test]
    fn draws_match_numpy() {
        let mut g = NumpyGenerator::new(42);
        let got: Vec<f64> = (0..3).map(|_| standard_normal(&mut g)).collect();
        assert_eq!(
            got,
            [0.30471707975443135, -1.0399841062404955, 0.7504511958064572]
        );
        let mut g = NumpyGenerator::new(7);
        assert_eq!(lognormal(&mut g, 7.5, 1.2), 1810.7133887317527);
        assert_eq!(hex::encode(bytes(&mut g, 6)), "956a26afbccd");
        assert_eq!(g.random(), 0.7756856902451935);
        let w: Vec<f64> = (1..=50).map(|k| 1.0 / f64::from(k).powf(1.2)).collect();
        let total = pairwise_sum(&w);
        let p: Vec<f64> = w.iter().map(|x| x / total).collect();
        let cdf = choice_cdf(&p);
        let mut g = NumpyGenerator::new(5);
        let picks: Vec<usize> = (0..8).map(|_| choice_index(&mut g, &cdf)).collect();
        assert_eq!(picks, [14, 14, 3, 0, 0, 1, 1, 0]);
        // 200,000 normals (the tail and wedge paths included), as numpy's bytes.
        let mut g = NumpyGenerator::new(123);
        let mut h = <sha2::Sha256 as sha2::Digest>::new();
        for _ in 0..200_000 {
            sha2::Digest::update(&mut h, standard_normal(&mut g).to_le_bytes());
        }
        assert_eq!(
            hex::encode(sha2::Digest::finalize(h)),
            "44812e4b613d4474a79c13d809c114ab485e06131cbeb2f0aab89cc5ff31317a"
        );
    }

    #[test]
    fn pairwise_sum_groups_like_numpy() {
        // Below 8 values: left to right; from 8: eight accumulators, then the rest.
        assert_eq!(pairwise_sum(&[1.0, 2.0, 3.0]), 6.0);
        let a: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(pairwise_sum(&a), 210.0);
        let big: Vec<f64> = (0..300).map(|i| f64::from(i) * 0.5).collect();
        assert_eq!(pairwise_sum(&big), 22425.0);
    }

    #[test]
    fn bytes_cut_little_endian_words() {
        let mut a = NumpyGenerator::new(3);
        let mut b = NumpyGenerator::new(3);
        let got = bytes(&mut a, 6);
        let w0 = b.next_u32().to_le_bytes();
        let w1 = b.next_u32().to_le_bytes();
        assert_eq!(got, [&w0[..], &w1[..2]].concat());
    }

    #[test]
    fn choice_searches_right_of_equal_values() {
        let cdf = choice_cdf(&[0.25, 0.25, 0.5]);
        assert_eq!(cdf, vec![0.25, 0.5, 1.0]);
        assert_eq!(cdf.partition_point(|&c| c <= 0.25), 1);
        assert_eq!(cdf.partition_point(|&c| c <= 0.1), 0);
    }
}
