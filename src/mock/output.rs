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

/// The word of completion token `index`.
pub fn word(seed: u64, index: u32) -> &'static str {
    let i = mix(seed ^ mix(u64::from(index))) % WORDS.len() as u64;
    WORDS[i as usize]
}

/// The text piece of completion token `index`: the word, preceded by a space except for the first token.
pub fn piece(seed: u64, index: u32) -> String {
    let w = word(seed, index);
    if index == 0 {
        w.to_owned()
    } else {
        format!(" {w}")
    }
}

/// The whole completion of `n` tokens (the concatenation of its pieces).
pub fn text(seed: u64, n: u32) -> String {
    let mut out = String::with_capacity(n as usize * 7);
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word(seed, i));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_prompt_dependent() {
        let s = seed(&[1, 2, 3]);
        assert_eq!(text(s, 8), text(seed(&[1, 2, 3]), 8));
        assert_ne!(text(s, 8), text(seed(&[1, 2, 4]), 8));
        let joined: String = (0..8).map(|i| piece(s, i)).collect();
        assert_eq!(joined, text(s, 8));
        assert_eq!(text(s, 8).split(' ').count(), 8);
        assert_eq!(text(s, 0), "");
    }
}
