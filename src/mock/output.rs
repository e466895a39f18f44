//! Deterministic completion text: token `i` of a completion is a word picked from a fixed list by a hash of the
//! prompt and `i`. Owns only that choice; it never looks at wall-clock time or randomness, so the same prompt
//! always yields the same answer.

/// The vocabulary completions are drawn from (one word = one completion token).
pub const WORDS: [&str; 64] = [
    "the", "model", "cache", "prefix", "token", "block", "stream", "proxy", "answer", "simple",
    "quick", "quiet", "river", "stone", "light", "shadow", "garden", "window", "paper", "signal",
    "number", "latency", "memory", "kernel", "vector", "matrix", "bright", "silver", "orange",
    "purple", "forest", "meadow", "harbor", "island", "valley", "summit", "thunder", "breeze",
    "candle", "lantern", "compass", "journey", "harvest", "winter", "summer", "autumn", "spring",
    "morning", "evening", "midnight", "circle", "square", "spiral", "bridge", "tower", "castle",
    "market", "village", "engine", "rocket", "planet", "comet", "galaxy", "ocean",
];

fn mix(mut z: u64) -> u64 {
    // splitmix64 finaliser
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Seed of a completion: a hash of the prompt's token ids.
pub fn seed(prompt_tokens: &[u32]) -> u64 {
    prompt_tokens
        .iter()
        .fold(0x6b76_6275_7374_u64, |h, &t| mix(h ^ u64::from(t)))
}

/// The words of [`WORDS`] that `is_one_token` says are one token alone and after a space, so
/// that an answer of `n` words is `n` tokens when a client re-tokenizes it; all of [`WORDS`] when
/// fewer than 16 are (a tokenizer that splits most of them).
pub fn one_token_words(is_one_token: impl Fn(&str) -> bool) -> Vec<&'static str> {
    let v: Vec<&'static str> = WORDS
        .iter()
        .copied()
        .filter(|w| is_one_token(w) && is_one_token(&format!(" {w}")))
        .collect();
    if v.len() >= 16 {
        v
    } else {
        WORDS.to_vec()
    }
}

/// The word of completion token `index`, from `vocab` (never empty: [`WORDS`] or a part of it).
pub fn word<'v>(vocab: &[&'v str], seed: u64, index: u32) -> &'v str {
    let i = mix(seed ^ mix(u64::from(index))) % vocab.len().max(1) as u64;
    vocab.get(i as usize).copied().unwrap_or("the")
}

/// The text piece of completion token `index`: the word, preceded by a space except for the first token.
pub fn piece(vocab: &[&str], seed: u64, index: u32) -> String {
    let w = word(vocab, seed, index);
    if index == 0 {
        w.to_owned()
    } else {
        format!(" {w}")
    }
}

/// The whole completion of `n` tokens (the concatenation of its pieces).
pub fn text(vocab: &[&str], seed: u64, n: u32) -> String {
    let mut out = String::with_capacity(n as usize * 7);
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word(vocab, seed, i));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_prompt_dependent() {
        let v = &WORDS[..];
        let s = seed(&[1, 2, 3]);
        assert_eq!(text(v, s, 8), text(v, seed(&[1, 2, 3]), 8));
        assert_ne!(text(v, s, 8), text(v, seed(&[1, 2, 4]), 8));
        let joined: String = (0..8).map(|i| piece(v, s, i)).collect();
        assert_eq!(joined, text(v, s, 8));
        assert_eq!(text(v, s, 8).split(' ').count(), 8);
        assert_eq!(text(v, s, 0), "");
    }

    #[test]
    fn one_token_words_keep_what_the_tokenizer_keeps_whole() {
        let short = one_token_words(|w| w.trim().len() <= 6);
        assert!(
            short.len() >= 16 && short.iter().all(|w| w.len() <= 6),
            "{short:?}"
        );
        assert_eq!(one_token_words(|_| false), WORDS.to_vec(), "too few: all");
    }
}
