//! The seeded draws the coding-corpus generators compose text from: picks, ranges, numbers,
//! identifiers, paths and hashes. Owns the per-block PRNG; must never touch OS entropy, the clock
//! or any global state, so the same seed always yields the same text.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

use super::vocab;

/// SplitMix64's finaliser: spreads `(seed, index)` pairs into independent PRNG seeds.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A PRNG seed for stream `stream` of item `index` under the corpus seed.
pub fn sub_seed(seed: u64, stream: u64, index: u64) -> u64 {
    mix(mix(mix(seed) ^ stream) ^ index)
}

/// A seeded source of draws for one block.
pub struct Draw {
    rng: Pcg64,
}

impl Draw {
    /// A fresh stream for `seed`.
    pub fn new(seed: u64) -> Self {
        Draw {
            rng: Pcg64::seed_from_u64(seed),
        }
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        // Every vocabulary and template list passed here is a non-empty constant.
        &xs[self.rng.random_range(0..xs.len())]
    }

    /// One string of a non-empty list.
    pub fn s<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.rng.random_range(0..xs.len())]
    }

    /// An index chosen with the given relative weights (at least one positive).
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut r = self.rng.random_range(0..total.max(1));
        for (i, &w) in weights.iter().enumerate() {
            if r < w {
                return i;
            }
            r -= w;
        }
        weights.len().saturating_sub(1)
    }

    /// An integer in `lo..=hi`.
    pub fn int(&mut self, lo: u64, hi: u64) -> u64 {
        self.rng.random_range(lo..=hi)
    }

    /// A count in `lo..=hi`.
    pub fn n(&mut self, lo: usize, hi: usize) -> usize {
        self.rng.random_range(lo..=hi)
    }

    /// A float in `[lo, hi)`.
    pub fn float(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.rng.random::<f64>()
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p.clamp(0.0, 1.0))
    }

    /// Up to `k` distinct elements of `xs`, in random order.
    pub fn sample<'a>(&mut self, xs: &[&'a str], k: usize) -> Vec<&'a str> {
        let mut v = xs.to_vec();
        v.shuffle(&mut self.rng);
        v.truncate(k);
        v
    }

    /// Between `lo` and `hi` distinct elements of `xs`, in random order.
    pub fn sample_n<'a>(&mut self, xs: &[&'a str], lo: usize, hi: usize) -> Vec<&'a str> {
        let k = self.n(lo, hi);
        self.sample(xs, k)
    }

    /// Shuffles a slice in place.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        xs.shuffle(&mut self.rng);
    }

    /// `n` lowercase hex digits.
    pub fn hex(&mut self, n: usize) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        (0..n)
            .map(|_| char::from(HEX[self.rng.random_range(0..16)]))
            .collect()
    }

    /// A random word-like token made of lowercase letters (ids, suffixes).
    pub fn alnum(&mut self, n: usize) -> String {
        const ALNUM: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        (0..n)
            .map(|_| char::from(ALNUM[self.rng.random_range(0..36)]))
            .collect()
    }

    /// Between `lo` and `hi` random lowercase letters and digits.
    pub fn alnum_n(&mut self, lo: usize, hi: usize) -> String {
        let n = self.n(lo, hi);
        self.alnum(n)
    }

    /// A snake_case identifier of one to three words (verb_noun, adj_noun, noun_noun, …).
    pub fn snake(&mut self) -> String {
        match self.n(0, 5) {
            0 => self.s(&vocab::NOUNS).to_owned(),
            1 | 2 => format!("{}_{}", self.s(&vocab::VERBS), self.s(&vocab::NOUNS)),
            3 => format!("{}_{}", self.s(&vocab::ADJS), self.s(&vocab::NOUNS)),
            4 => format!("{}_{}", self.s(&vocab::NOUNS), self.s(&vocab::NOUNS)),
            _ => format!(
                "{}_{}_{}",
                self.s(&vocab::VERBS),
                self.s(&vocab::ADJS),
                self.s(&vocab::NOUNS)
            ),
        }
    }

    /// A snake_case noun phrase (variables, fields, tables).
    pub fn noun_snake(&mut self) -> String {
        match self.n(0, 3) {
            0 | 1 => self.s(&vocab::NOUNS).to_owned(),
            2 => format!("{}_{}", self.s(&vocab::ADJS), self.s(&vocab::NOUNS)),
            _ => format!("{}_{}", self.s(&vocab::NOUNS), self.s(&vocab::NOUNS)),
        }
    }

    /// A verb phrase in snake_case (functions).
    pub fn fn_snake(&mut self) -> String {
        if self.chance(0.3) {
            format!(
                "{}_{}_{}",
                self.s(&vocab::VERBS),
                self.s(&vocab::ADJS),
                self.s(&vocab::NOUNS)
            )
        } else {
            format!("{}_{}", self.s(&vocab::VERBS), self.s(&vocab::NOUNS))
        }
    }

    /// A PascalCase type name.
    pub fn pascal(&mut self) -> String {
        let base = match self.n(0, 3) {
            0 => pascal_of(&[self.s(&vocab::NOUNS)]),
            1 => pascal_of(&[self.s(&vocab::ADJS), self.s(&vocab::NOUNS)]),
            _ => pascal_of(&[self.s(&vocab::NOUNS), self.s(&vocab::NOUNS)]),
        };
        if self.chance(0.35) {
            format!("{base}{}", self.s(&vocab::TYPE_SUFFIXES))
        } else {
            base
        }
    }

    /// A camelCase verb phrase (Go/TypeScript methods).
    pub fn camel_fn(&mut self) -> String {
        camel_of(&self.fn_snake())
    }

    /// A camelCase noun phrase (variables and fields).
    pub fn camel(&mut self) -> String {
        camel_of(&self.noun_snake())
    }

    /// A relative source path with the given extension, under a plausible folder layout.
    pub fn path(&mut self, ext: &str) -> String {
        let depth = self.n(1, 3);
        let mut parts: Vec<String> = vec![self.s(&vocab::TOP_DIRS).to_owned()];
        for _ in 1..depth {
            parts.push(self.s(&vocab::SUB_DIRS).to_owned());
        }
        let stem = if self.chance(0.5) {
            self.noun_snake()
        } else {
            self.s(&vocab::FILE_STEMS).to_owned()
        };
        let stem = if ext == "go" || ext == "py" || ext == "rs" {
            stem
        } else if self.chance(0.5) {
            stem.replace('_', "-")
        } else {
            camel_of(&stem)
        };
        format!("{}/{stem}.{ext}", parts.join("/"))
    }

    /// A source path with one of the given extensions.
    pub fn path_of(&mut self, exts: &[&'static str]) -> String {
        let ext = self.s(exts);
        self.path(ext)
    }

    /// A source path in one of the four corpus languages.
    pub fn code_path(&mut self) -> String {
        self.path_of(&["py", "go", "rs", "ts"])
    }

    /// A project / repository name.
    pub fn project(&mut self) -> String {
        match self.n(0, 2) {
            0 => format!("{}-{}", self.s(&vocab::ADJS), self.s(&vocab::NOUNS)),
            1 => format!(
                "{}-{}",
                self.s(&vocab::NOUNS),
                self.s(&vocab::PROJECT_SUFFIXES)
            ),
            _ => self.s(&vocab::PROJECT_NAMES).to_owned(),
        }
        .replace('_', "-")
    }

    /// A person's handle, e.g. for git authors and shell prompts.
    pub fn user(&mut self) -> String {
        let first = self.s(&vocab::FIRST_NAMES).to_lowercase();
        match self.n(0, 2) {
            0 => first,
            1 => format!("{first}.{}", self.s(&vocab::LAST_NAMES).to_lowercase()),
            _ => format!(
                "{}{}",
                &first[..1],
                self.s(&vocab::LAST_NAMES).to_lowercase()
            ),
        }
    }

    /// A host name.
    pub fn host(&mut self) -> String {
        match self.n(0, 3) {
            0 => format!("gpu-node-{:02}", self.int(1, 64)),
            1 => format!("{}-{}", self.s(&vocab::HOST_WORDS), self.int(1, 9)),
            2 => format!(
                "ip-10-{}-{}-{}",
                self.int(0, 255),
                self.int(0, 255),
                self.int(1, 254)
            ),
            _ => format!("{}-worker-{}", self.s(&vocab::HOST_WORDS), self.alnum(5)),
        }
    }

    /// A time of day `HH:MM:SS`.
    pub fn clock(&mut self) -> (u64, u64, u64) {
        (self.int(0, 23), self.int(0, 59), self.int(0, 59))
    }

    /// A date `YYYY-MM-DD`.
    pub fn date(&mut self) -> String {
        format!(
            "20{:02}-{:02}-{:02}",
            self.int(22, 26),
            self.int(1, 12),
            self.int(1, 28)
        )
    }

    /// A semantic version.
    pub fn version(&mut self) -> String {
        format!("{}.{}.{}", self.int(0, 4), self.int(0, 40), self.int(0, 20))
    }

    /// A sentence describing what a piece of code does (comments, docstrings, commit subjects).
    pub fn sentence(&mut self) -> String {
        let verb = self.s(&vocab::VERBS_3RD);
        let obj = self.noun_phrase();
        match self.n(0, 4) {
            0 => format!("{verb} the {obj} for each incoming request"),
            1 => format!(
                "{verb} {obj} before it reaches the {}",
                self.s(&vocab::NOUNS)
            ),
            2 => format!(
                "{verb} the {obj} and returns the {} count",
                self.s(&vocab::NOUNS)
            ),
            3 => format!(
                "{verb} {obj}, retrying up to {} times on transient errors",
                self.int(2, 8)
            ),
            _ => format!(
                "{verb} the {obj} when the {} is {}",
                self.s(&vocab::NOUNS),
                self.s(&vocab::STATES)
            ),
        }
    }

    /// A short noun phrase in plain words (`"stale cache entries"`).
    pub fn noun_phrase(&mut self) -> String {
        match self.n(0, 2) {
            0 => format!("{} {}", self.s(&vocab::ADJS), self.s(&vocab::NOUNS)),
            1 => format!("{} {}", self.s(&vocab::NOUNS), self.s(&vocab::NOUNS)),
            _ => self.s(&vocab::NOUNS).to_owned(),
        }
        .replace('_', " ")
    }
}

/// `["max", "batch"]` → `"MaxBatch"`.
pub fn pascal_of(words: &[&str]) -> String {
    words
        .iter()
        .flat_map(|w| w.split('_'))
        .map(capitalize)
        .collect()
}

/// `"max_batch_size"` → `"maxBatchSize"`.
pub fn camel_of(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    for (i, w) in snake.split('_').enumerate() {
        if i == 0 {
            out.push_str(w);
        } else {
            out.push_str(&capitalize(w));
        }
    }
    out
}

/// `"batch"` → `"Batch"`.
pub fn capitalize(w: &str) -> String {
    let mut c = w.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_draws() {
        let mut a = Draw::new(7);
        let mut b = Draw::new(7);
        let xa: Vec<String> = (0..50).map(|_| a.snake()).collect();
        let xb: Vec<String> = (0..50).map(|_| b.snake()).collect();
        assert_eq!(xa, xb);
        assert_ne!(sub_seed(1, 0, 0), sub_seed(2, 0, 0));
        assert_ne!(sub_seed(1, 0, 0), sub_seed(1, 0, 1));
    }

    #[test]
    fn case_helpers() {
        assert_eq!(pascal_of(&["max", "batch_size"]), "MaxBatchSize");
        assert_eq!(camel_of("max_batch_size"), "maxBatchSize");
        assert_eq!(capitalize(""), "");
    }
}
