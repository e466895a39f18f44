//! The on-disk cache of coding-corpus token arrays, keyed by the tokenizer file's hash and the
//! corpus text's hash. Owns the cache file layout; must never let a cache problem fail a build
//! (a missing, unreadable or corrupt entry is rebuilt) and never trust an entry whose checksum
//! does not match.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::synth::corpus::TokenCorpus;

/// The cache file for a corpus text under a tokenizer.
pub fn path(dir: &Path, tokenizer_fingerprint: &str, text: &str) -> PathBuf {
    let text_hash = hex::encode(Sha256::digest(text.as_bytes()));
    let fp = tokenizer_fingerprint
        .get(..16)
        .unwrap_or(tokenizer_fingerprint);
    dir.join(format!("coding-ids-v1-{fp}-{}.bin", &text_hash[..16]))
}

/// Reads an entry in the sonnet id cache's layout ([`TokenCorpus::to_cache_bytes`]); `None`
/// when missing or corrupt.
pub fn read(path: &Path) -> Option<(Vec<u32>, Vec<usize>)> {
    let c = crate::synth::corpus::tokens::read_cache(path)?;
    Some((c.tokens().to_vec(), c.joins().to_vec()))
}

/// Writes an entry atomically in the sonnet cache's layout; failures are ignored.
pub fn write(path: &Path, corpus: &TokenCorpus) {
    crate::synth::corpus::tokens::write_cache(path, corpus);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = crate::test_support::test_dir();
        let p = path(&dir, "0123456789abcdef0123", "some text");
        write(
            &p,
            &TokenCorpus::from_parts(vec![1, 2, 3, 151_643], vec![2]),
        );
        assert_eq!(read(&p), Some((vec![1, 2, 3, 151_643], vec![2])));
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(read(&p), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
