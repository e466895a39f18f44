//! Prompt tokenization for the mock: a configured Hugging Face tokenizer, or a cheap deterministic built-in one.
//! Owns text → token ids only; it never panics on any input and never loads anything from disk or the network.

use std::sync::Arc;

/// The tokenizer the mock counts prompt tokens with.
#[derive(Clone)]
pub enum MockTokenizer {
    /// A real tokenizer (the configured one); special tokens are not added.
    Hf(Arc<tokenizers::Tokenizer>),
    /// The built-in fallback: see [`builtin_pieces`].
    Builtin,
}

impl std::fmt::Debug for MockTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MockTokenizer::Hf(_) => f.write_str("MockTokenizer::Hf"),
            MockTokenizer::Builtin => f.write_str("MockTokenizer::Builtin"),
        }
    }
}

impl MockTokenizer {
    /// Token ids of `text`. A real tokenizer that fails on some input falls back to the built-in one.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            MockTokenizer::Hf(t) => match t.encode_fast(text, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                Err(e) => {
                    tracing::debug!(error = %e, "tokenizer failed; using the built-in fallback for this prompt");
                    builtin_encode(text)
                }
            },
            MockTokenizer::Builtin => builtin_encode(text),
        }
    }

    /// Whether encoding is expensive enough that large inputs belong on a blocking thread.
    pub fn is_expensive(&self) -> bool {
        matches!(self, MockTokenizer::Hf(_))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Word,
    Space,
    Other,
}

fn class(c: char) -> Class {
    if c.is_alphanumeric() || c == '_' {
        Class::Word
    } else if c.is_whitespace() {
        Class::Space
    } else {
        Class::Other
    }
}

/// Maximum bytes in one built-in token piece.
pub const MAX_PIECE_BYTES: usize = 4;

/// Splits `text` into BPE-like pieces of at most [`MAX_PIECE_BYTES`] bytes, never splitting a character:
/// a single space joins the word or punctuation mark that follows it (`" the"`), runs of word characters and
/// runs of other whitespace are cut into ≤4-byte pieces, and every other character (punctuation, symbols) is
/// its own piece. The pieces concatenate back to `text` exactly.
pub fn builtin_pieces(text: &str) -> Vec<&str> {
    let mut pieces = Vec::with_capacity(text.len() / 3 + 1);
    let mut rest = text;
    while let Some(first) = rest.chars().next() {
        let mut len = 0;
        let mut lead = first;
        // A single space attaches to the following non-space character when the pair fits in a piece.
        if first == ' ' {
            if let Some(next) = rest[1..].chars().next() {
                if class(next) != Class::Space && next.len_utf8() < MAX_PIECE_BYTES {
                    len = 1;
                    lead = next;
                }
            }
        }
        let cls = class(lead);
        len += lead.len_utf8();
        if cls != Class::Other {
            for c in rest[len..].chars() {
                if class(c) != cls || len + c.len_utf8() > MAX_PIECE_BYTES {
                    break;
                }
                len += c.len_utf8();
            }
        }
        let (piece, tail) = rest.split_at(len);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

/// Token id of a built-in piece: FNV-1a over its bytes (deterministic across runs and platforms).
pub fn piece_id(piece: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in piece.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The built-in tokenizer: ids of [`builtin_pieces`].
pub fn builtin_encode(text: &str) -> Vec<u32> {
    builtin_pieces(text).into_iter().map(piece_id).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn pieces_are_bpe_like_and_small() {
        assert_eq!(
            builtin_pieces("Hello, world!"),
            ["Hell", "o", ",", " wor", "ld", "!"]
        );
        assert_eq!(builtin_pieces("a  b\n\nc"), ["a", "  ", "b", "\n\n", "c"]);
        assert_eq!(builtin_pieces(" the cat"), [" the", " cat"]);
        assert_eq!(builtin_pieces(""), Vec::<&str>::new());
    }

    #[test]
    fn pieces_never_split_characters_and_rejoin_exactly() {
        for text in [
            "naïve café — 東京タワー 🦀🦀 ok",
            " 😀x",
            "\u{0}\u{10FFFF} \t\r\n  ",
            "snake_case_identifier_1234567890",
            "     ",
        ] {
            let pieces = builtin_pieces(text);
            assert_eq!(pieces.concat(), text);
            for p in &pieces {
                assert!(
                    !p.is_empty() && p.len() <= MAX_PIECE_BYTES,
                    "{p:?} in {text:?}"
                );
            }
        }
        // A 4-byte character cannot take a leading space: the space stands alone.
        assert_eq!(builtin_pieces(" 😀"), [" ", "😀"]);
    }

    /// A tiny word-level tokenizer: whitespace pre-tokenizer, three known words, everything else `[UNK]`.
    pub(crate) fn word_level() -> Arc<tokenizers::Tokenizer> {
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2},"unk_token":"[UNK]"}}"#;
        Arc::new(json.parse().expect("a valid tokenizer.json"))
    }

    #[test]
    fn a_configured_tokenizer_is_used() {
        let t = MockTokenizer::Hf(word_level());
        assert!(t.is_expensive());
        assert_eq!(t.encode("hello world, hello"), [1, 2, 0, 1]);
        assert_eq!(t.encode(""), Vec::<u32>::new());
    }

    proptest::proptest! {
        #[test]
        fn any_text_splits_into_small_pieces_that_rejoin(text in ".*") {
            let pieces = builtin_pieces(&text);
            proptest::prop_assert_eq!(pieces.concat(), text.clone());
            proptest::prop_assert!(pieces.iter().all(|p| !p.is_empty() && p.len() <= MAX_PIECE_BYTES));
            proptest::prop_assert_eq!(builtin_encode(&text).len(), pieces.len());
        }
    }

    #[test]
    fn encoding_is_deterministic_and_prefix_stable() {
        let a = builtin_encode("The quick brown fox jumps over the lazy dog.");
        let b = builtin_encode("The quick brown fox jumps over the lazy dog. And more.");
        assert_eq!(
            a,
            builtin_encode("The quick brown fox jumps over the lazy dog.")
        );
        assert_eq!(&b[..a.len()], &a[..]);
        assert_ne!(builtin_encode("the"), builtin_encode("The"));
        assert_eq!(MockTokenizer::Builtin.encode("x y"), builtin_encode("x y"));
    }
}
