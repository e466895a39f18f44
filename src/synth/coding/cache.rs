//! The on-disk cache of coding-corpus token arrays, keyed by the tokenizer file's hash and the
//! corpus text's hash. Owns the cache file layout; must never let a cache problem fail a build
//! (a missing, unreadable or corrupt entry is rebuilt) and never trust an entry whose checksum
//! does not match.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::synth::corpus::SonnetCorpus;

/// The cache file for a corpus text under a tokenizer.
pub fn path(dir: &Path, tokenizer_fingerprint: &str, text: &str) -> PathBuf {
    let text_hash = hex::encode(Sha256::digest(text.as_bytes()));
    let fp = tokenizer_fingerprint
        .get(..16)
        .unwrap_or(tokenizer_fingerprint);
    dir.join(format!("coding-ids-v1-{fp}-{}.bin", &text_hash[..16]))
}

/// Layout (the sonnet id cache's, [`SonnetCorpus::to_cache_bytes`]): 32-byte sha256 of the rest, then little-endian u32s: the number of joins, the joins,
/// then the token ids.
pub fn read(path: &Path) -> Option<(Vec<u32>, Vec<usize>)> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < 36 || (bytes.len() - 32) % 4 != 0 {
        return None;
    }
    let (sum, body) = bytes.split_at(32);
    if Sha256::digest(body).as_slice() != sum {
        return None;
    }
    let words: Vec<u32> = body
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let n_joins = *words.first()? as usize;
    if words.len() < 1 + n_joins {
        return None;
    }
    let joins = words[1..1 + n_joins].iter().map(|&j| j as usize).collect();
    Some((words[1 + n_joins..].to_vec(), joins))
}

/// Writes an entry atomically (temp file + rename) in the sonnet cache's layout; failures are
/// ignored.
pub fn write(path: &Path, corpus: &SonnetCorpus) {
    let bytes = corpus.to_cache_bytes();
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, &bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("kvbust-coding-cache-{}", std::process::id()));
        let p = path(&dir, "0123456789abcdef0123", "some text");
        write(
            &p,
            &SonnetCorpus::from_parts(vec![1, 2, 3, 151_643], vec![2]),
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
