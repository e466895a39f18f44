//! Prompt tokenization for the mock: the configured Hugging Face tokenizer (the shipped Qwen3 one by default)
//! with its chat template, or a cheap deterministic built-in one. Owns prompt → token ids only; it never panics
//! on any input and never fetches anything over the network (a tokenizer path is read once, at load).
//!
//! With a real tokenizer, chat-shaped prompts (chat, responses, messages) are rendered through the tokenizer's
//! chat template with the generation prompt and tokenized without adding special tokens, and completions prompts
//! are tokenized with them, as vLLM does; so `prompt_tokens` includes the template's tokens (Qwen3: 5 per
//! message plus 3 for the assistant header). A tokenizer without a chat template, and the built-in one, count
//! `role\ncontent\n` per message instead.

use std::sync::Arc;

use super::config::MockTokenizerSetting;
use super::request::{ApiError, Message, Prompt, PromptPart};
use crate::synth::error::SynthError;
use crate::synth::tokenizer::chat_template::ChatTemplate;
use crate::synth::tokenizer::Tokenizer;

/// The tokenizer the mock counts prompt tokens with.
#[derive(Clone)]
pub enum MockTokenizer {
    /// A real tokenizer and its chat template, when it has one.
    Hf {
        /// The tokenizer.
        tokenizer: Arc<Tokenizer>,
        /// Its chat template, compiled once.
        template: Option<Arc<ChatTemplate>>,
    },
    /// The built-in fallback: see [`builtin_pieces`].
    Builtin,
}

impl std::fmt::Debug for MockTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MockTokenizer::Hf {
                tokenizer,
                template,
            } => f
                .debug_struct("MockTokenizer::Hf")
                .field("fingerprint", &tokenizer.fingerprint())
                .field("chat_template", &template.is_some())
                .finish(),
            MockTokenizer::Builtin => f.write_str("MockTokenizer::Builtin"),
        }
    }
}

/// The text the built-in tokenizer (and a tokenizer without a chat template) counts for chat messages.
pub fn plain_render(messages: &[Message]) -> String {
    let mut text = String::new();
    for m in messages {
        text.push_str(&m.role);
        text.push('\n');
        text.push_str(&m.content);
        text.push('\n');
    }
    text
}

/// `messages` rendered through `template`, as the engine renders a chat prompt (the mock and the
/// cache model render alike, so they count alike).
pub fn render_chat(template: &ChatTemplate, messages: &[Message]) -> Result<String, SynthError> {
    let pairs: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect();
    template.render(&pairs)
}

impl MockTokenizer {
    /// `tokenizer` with its chat template compiled (an invalid template is an error).
    pub fn hf(tokenizer: Arc<Tokenizer>) -> Result<Self, SynthError> {
        let template = ChatTemplate::for_tokenizer(&tokenizer)?.map(Arc::new);
        Ok(MockTokenizer::Hf {
            tokenizer,
            template,
        })
    }

    /// Loads the tokenizer `setting` names (blocking: reads and parses `tokenizer.json`).
    pub fn load(setting: &MockTokenizerSetting) -> Result<Self, SynthError> {
        let tokenizer = match setting {
            MockTokenizerSetting::Builtin => return Ok(MockTokenizer::Builtin),
            MockTokenizerSetting::Qwen3 => Tokenizer::default_qwen3()?,
            MockTokenizerSetting::Path(p) => Tokenizer::from_path(p)?,
        };
        Self::hf(Arc::new(tokenizer))
    }

    /// Token ids of `text`, without special tokens. A real tokenizer that fails on some input falls back to
    /// the built-in one.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_inner(text, false)
    }

    fn encode_inner(&self, text: &str, special: bool) -> Vec<u32> {
        match self {
            MockTokenizer::Hf { tokenizer, .. } => {
                match tokenizer.inner().encode_fast(text, special) {
                    Ok(enc) => enc.get_ids().to_vec(),
                    Err(e) => {
                        tracing::debug!(error = %e, "tokenizer failed; using the built-in fallback for this prompt");
                        builtin_encode(text)
                    }
                }
            }
            MockTokenizer::Builtin => builtin_encode(text),
        }
    }

    /// The prompt's token ids (see the module documentation); a chat template that refuses the messages (say,
    /// roles that do not alternate) is a 400, as in vLLM.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
        match prompt {
            Prompt::Messages(messages) => {
                let text = match self {
                    MockTokenizer::Hf {
                        template: Some(t), ..
                    } => render_chat(t, messages).map_err(|e| {
                        ApiError::bad_request(
                            "chat_template_error",
                            format!("the chat template could not render these messages: {e}"),
                        )
                    })?,
                    _ => plain_render(messages),
                };
                Ok(self.encode_inner(&text, false))
            }
            Prompt::Raw(parts) => {
                let mut out = Vec::new();
                for part in parts {
                    match part {
                        PromptPart::Text(t) => out.extend(self.encode_inner(t, true)),
                        PromptPart::Tokens(t) => out.extend_from_slice(t),
                    }
                }
                Ok(out)
            }
        }
    }

    /// Bytes of text a prompt makes the tokenizer read (to decide whether it belongs on a blocking thread).
    pub fn prompt_bytes(prompt: &Prompt) -> usize {
        match prompt {
            Prompt::Messages(m) => m.iter().map(|m| m.role.len() + m.content.len()).sum(),
            Prompt::Raw(parts) => parts
                .iter()
                .map(|p| match p {
                    PromptPart::Text(t) => t.len(),
                    PromptPart::Tokens(_) => 0,
                })
                .sum(),
        }
    }

    /// Whether encoding is expensive enough that large inputs belong on a blocking thread.
    pub fn is_expensive(&self) -> bool {
        matches!(self, MockTokenizer::Hf { .. })
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
    pub(crate) fn word_level() -> Arc<Tokenizer> {
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2},"unk_token":"[UNK]"}}"#;
        Arc::new(Tokenizer::from_bytes(json.as_bytes(), None).expect("a valid tokenizer.json"))
    }

    #[test]
    fn a_configured_tokenizer_is_used() {
        let t = MockTokenizer::hf(word_level()).expect("no template to compile");
        assert!(t.is_expensive());
        assert_eq!(t.encode("hello world, hello"), [1, 2, 0, 1]);
        assert_eq!(t.encode(""), Vec::<u32>::new());
        // No chat template: messages are counted as `role\ncontent\n`.
        let m = Prompt::Messages(vec![Message::new("hello", "world world")]);
        assert_eq!(t.prompt_tokens(&m), Ok(vec![1, 2, 2]));
    }

    #[test]
    fn qwen3_counts_its_chat_template_around_the_content() {
        let t = MockTokenizer::load(&MockTokenizerSetting::Qwen3).expect("shipped tokenizer");
        let MockTokenizer::Hf { tokenizer, .. } = &t else {
            panic!("qwen3 is a real tokenizer")
        };
        let content = "The quick brown fox jumps over the lazy dog.";
        let n = tokenizer.encode(content).expect("encodes").len();
        let one = Prompt::Messages(vec![Message::new("user", content)]);
        let ids = t.prompt_tokens(&one).expect("renders");
        // <|im_start|>user\n … <|im_end|>\n<|im_start|>assistant\n
        assert_eq!(ids.len(), n + 8);
        let im_start = tokenizer.inner().token_to_id("<|im_start|>");
        assert_eq!(ids.first().copied(), im_start);
        let two = Prompt::Messages(vec![
            Message::new("system", "Be terse."),
            Message::new("user", content),
        ]);
        let sys = tokenizer.encode("Be terse.").expect("encodes").len();
        assert_eq!(t.prompt_tokens(&two).expect("renders").len(), sys + n + 13);
        // Completions text is the text's own tokens (Qwen3 adds no BOS).
        let raw = Prompt::Raw(vec![PromptPart::Text(content.into())]);
        assert_eq!(t.prompt_tokens(&raw).expect("encodes").len(), n);
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
        let m = Prompt::Messages(vec![Message::new("user", "x y")]);
        assert_eq!(
            MockTokenizer::Builtin.prompt_tokens(&m),
            Ok(builtin_encode("user\nx y\n"))
        );
    }
}
