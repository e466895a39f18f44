//! Prompt tokenization for the mock: the configured Hugging Face tokenizer (the shipped Qwen3 one by default)
//! with its chat template, or a cheap deterministic built-in one. Owns prompt → token ids only; it never panics
//! on any input and never fetches anything over the network (a tokenizer path is read once, at load).
//!
//! With a real tokenizer, chat-shaped prompts (chat, responses, messages) are rendered through the tokenizer's
//! chat template with the generation prompt and tokenized without adding special tokens, and completions prompts
//! are tokenized with them, as vLLM does; so `prompt_tokens` includes the template's tokens (Qwen3: 5 per
//! message plus 3 for the assistant header). A tokenizer without a chat template, and the built-in one, count
//! `role\ncontent\n` per message instead.

use std::borrow::Cow;
use std::sync::Arc;

use super::chat::{self, RenderError};
use super::config::MockTokenizerSetting;
use super::request::{ApiError, ChatOptions, Message, Prompt, PromptPart};
use crate::synth::error::SynthError;
use crate::synth::tokenizer::chat_template::ChatTemplate;
use crate::synth::tokenizer::pyjinja::TemplateDate;
use crate::synth::tokenizer::Tokenizer;

/// Bytes of text counted at a time when a large prompt is checked against the context length
/// ([`MockTokenizer::prompt_tokens_within`]): the tokenizer's working memory is for this much.
pub const COUNT_CHUNK_BYTES: usize = 64 << 10;

/// Tokens a cut between two chunks may add to their count over the whole text's: none at the
/// cuts [`chunk_end`] looks for, a few when a chunk has no such place and is cut mid-word.
pub const CUT_SLACK: usize = 16;

/// A prompt's token ids, or, once it went past the limit it was checked against, a lower bound
/// on their count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counted {
    /// Every token id: the prompt was tokenized whole.
    Tokens(Vec<u32>),
    /// At least this many tokens, more than the limit; counting stopped there.
    Over(usize),
}

/// A piece of what a prompt makes the tokenizer read, in order.
enum Part<'a> {
    /// Text, and whether the tokenizer's special tokens are added to it.
    Text(Cow<'a, str>, bool),
    /// Token ids taken as they are.
    Ids(&'a [u32]),
}

impl Part<'_> {
    fn bytes(&self) -> usize {
        match self {
            Part::Text(t, _) => t.len(),
            // A token id stands for at least a byte of text.
            Part::Ids(ids) => ids.len(),
        }
    }
}

/// Where the chunk at the start of `text` ends: all of it when it holds at most
/// [`COUNT_CHUNK_BYTES`], else the last space in the chunk's second half that follows a
/// non-space and precedes a letter or digit (`" word"` begins a piece in every usual
/// pre-tokenizer, byte-level, Metaspace or whitespace, so the chunks count as the whole does),
/// else the last character boundary within the chunk.
fn chunk_end(text: &str) -> usize {
    if text.len() <= COUNT_CHUNK_BYTES {
        return text.len();
    }
    let b = text.as_bytes();
    (COUNT_CHUNK_BYTES / 2..COUNT_CHUNK_BYTES)
        .rev()
        .find(|&i| {
            b[i] == b' ' && !b[i - 1].is_ascii_whitespace() && b[i + 1].is_ascii_alphanumeric()
        })
        .or_else(|| {
            (1..=COUNT_CHUNK_BYTES)
                .rev()
                .find(|&i| text.is_char_boundary(i))
        })
        .unwrap_or(text.len())
}

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

/// `messages` rendered through `template` with the request's `options`, as vLLM renders a chat
/// prompt ([`chat::render`]: the mock and the cache model render alike, so they count alike).
pub fn render_chat(
    template: &ChatTemplate,
    messages: &[Message],
    options: &ChatOptions,
) -> Result<String, RenderError> {
    chat::render(template, messages, options)
}

impl MockTokenizer {
    /// `tokenizer` with its chat template compiled (an invalid template is an error).
    pub fn hf(tokenizer: Arc<Tokenizer>) -> Result<Self, SynthError> {
        Self::hf_dated(tokenizer, TemplateDate::Today)
    }

    /// [`MockTokenizer::hf`] with the template's `strftime_now` reading `date`.
    pub fn hf_dated(tokenizer: Arc<Tokenizer>, date: TemplateDate) -> Result<Self, SynthError> {
        let template =
            ChatTemplate::for_tokenizer(&tokenizer)?.map(|t| Arc::new(t.with_date(date)));
        Ok(MockTokenizer::Hf {
            tokenizer,
            template,
        })
    }

    /// Loads the tokenizer `setting` names (blocking: reads and parses `tokenizer.json`).
    pub fn load(setting: &MockTokenizerSetting) -> Result<Self, SynthError> {
        Self::load_dated(setting, TemplateDate::Today)
    }

    /// [`MockTokenizer::load`] with the template's `strftime_now` reading `date`
    /// (`mock.chat_template_date`).
    pub fn load_dated(
        setting: &MockTokenizerSetting,
        date: TemplateDate,
    ) -> Result<Self, SynthError> {
        let tokenizer = match setting {
            MockTokenizerSetting::Builtin => return Ok(MockTokenizer::Builtin),
            MockTokenizerSetting::Qwen3 => Tokenizer::default_qwen3()?,
            MockTokenizerSetting::Path(p) => Tokenizer::from_path(p)?,
        };
        Self::hf_dated(Arc::new(tokenizer), date)
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
        let parts = self.parts(prompt)?;
        Ok(self.encode_parts(&parts))
    }

    /// The prompt's token ids when it can hold at most `limit` tokens, else [`Counted::Over`] with
    /// a lower bound past `limit`: a prompt of more bytes than `limit` (and than one chunk) is
    /// first counted chunk by chunk, stopping as soon as the count passes `limit`, so a 64 MB
    /// prompt costs the tokenizer's memory for one chunk, not for 30 million tokens. A prompt
    /// that passes the count is then tokenized whole, as [`MockTokenizer::prompt_tokens`] does:
    /// the ids of a prompt that fits never depend on the chunks.
    pub fn prompt_tokens_within(&self, prompt: &Prompt, limit: usize) -> Result<Counted, ApiError> {
        let parts = self.parts(prompt)?;
        // Below a byte per token no tokenizer the mock ships goes past `limit`; a prompt this
        // small costs little to tokenize whole even if one did (the exact check follows).
        let bytes: usize = parts.iter().map(Part::bytes).sum();
        if bytes > limit.max(COUNT_CHUNK_BYTES) {
            if let Some(n) = self.count_past(&parts, limit) {
                return Ok(Counted::Over(n));
            }
        }
        Ok(Counted::Tokens(self.encode_parts(&parts)))
    }

    /// What `prompt` makes the tokenizer read: chat messages rendered (a template error is a 400).
    fn parts<'a>(&self, prompt: &'a Prompt) -> Result<Vec<Part<'a>>, ApiError> {
        Ok(match prompt {
            Prompt::Messages(_) | Prompt::Chat(_) => {
                let (messages, options) = prompt.chat().unwrap_or((&[], &chat::PLAIN));
                let text = match self {
                    MockTokenizer::Hf {
                        template: Some(t), ..
                    } => render_chat(t, messages, options)
                        .map_err(|e| ApiError::bad_request("chat_template_error", e.0))?,
                    _ => plain_render(messages),
                };
                vec![Part::Text(Cow::Owned(text), options.add_special_tokens)]
            }
            Prompt::Raw(parts) => parts
                .iter()
                .map(|part| match part {
                    PromptPart::Text(t) => Part::Text(Cow::Borrowed(t.as_str()), true),
                    PromptPart::Tokens(t) => Part::Ids(t),
                })
                .collect(),
        })
    }

    fn encode_parts(&self, parts: &[Part<'_>]) -> Vec<u32> {
        if let [Part::Text(text, special)] = parts {
            return self.encode_inner(text, *special);
        }
        let mut out = Vec::new();
        for part in parts {
            match part {
                Part::Text(text, special) => out.extend(self.encode_inner(text, *special)),
                Part::Ids(ids) => out.extend_from_slice(ids),
            }
        }
        out
    }

    /// A lower bound on the tokens of `parts` once it passes `limit`, counted a chunk of text at a
    /// time ([`chunk_end`]) and stopped there; `None` when all of them were counted without
    /// passing it. Each cut may split what the whole text makes one token, so [`CUT_SLACK`] per
    /// cut is taken off; special tokens are left out (they only add).
    fn count_past(&self, parts: &[Part<'_>], limit: usize) -> Option<usize> {
        let mut sum = 0usize;
        let mut cuts = 0usize;
        for part in parts {
            let mut rest: &str = match part {
                Part::Ids(ids) => {
                    sum = sum.saturating_add(ids.len());
                    ""
                }
                Part::Text(text, _) => text,
            };
            loop {
                let lower = sum.saturating_sub(cuts.saturating_mul(CUT_SLACK));
                if lower > limit {
                    return Some(lower);
                }
                if rest.is_empty() {
                    break;
                }
                let (chunk, tail) = rest.split_at(chunk_end(rest));
                sum = sum.saturating_add(self.count(chunk));
                if !tail.is_empty() {
                    cuts += 1;
                }
                rest = tail;
            }
        }
        None
    }

    /// The number of tokens of `text` (without special tokens), as [`MockTokenizer::encode`] makes.
    pub fn count(&self, text: &str) -> usize {
        match self {
            MockTokenizer::Hf { tokenizer, .. } => match tokenizer.inner().encode_fast(text, false)
            {
                Ok(enc) => enc.len(),
                Err(_) => Pieces(text).count(),
            },
            MockTokenizer::Builtin => Pieces(text).count(),
        }
    }

    /// Bytes of text a prompt makes the tokenizer read (to decide whether it belongs on a blocking thread).
    pub fn prompt_bytes(prompt: &Prompt) -> usize {
        match prompt {
            Prompt::Messages(_) | Prompt::Chat(_) => prompt
                .messages()
                .unwrap_or_default()
                .iter()
                .map(|m| m.role.len() + m.content.len())
                .sum(),
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
    pieces.extend(Pieces(text));
    pieces
}

/// [`builtin_pieces`] one at a time, so they can be counted without a list.
struct Pieces<'a>(&'a str);

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.0;
        let first = rest.chars().next()?;
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
        self.0 = tail;
        Some(piece)
    }
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

    /// Real text of many chunks: the project's own documentation, repeated.
    fn docs(bytes: usize) -> String {
        let one = concat!(
            include_str!("../../README.md"),
            include_str!("../../config/README.md")
        );
        one.repeat(bytes / one.len() + 1)
    }

    #[test]
    fn chunks_count_as_the_whole_text_does() {
        let qwen = MockTokenizer::load(&MockTokenizerSetting::Qwen3).expect("shipped tokenizer");
        let text = docs(3 * COUNT_CHUNK_BYTES);
        for t in [&qwen, &MockTokenizer::Builtin] {
            let (mut rest, mut sum, mut cuts) = (text.as_str(), 0, 0);
            while !rest.is_empty() {
                let (chunk, tail) = rest.split_at(chunk_end(rest));
                assert!(
                    chunk.len() <= COUNT_CHUNK_BYTES && chunk.len() > COUNT_CHUNK_BYTES / 2
                        || tail.is_empty()
                );
                sum += t.count(chunk);
                cuts += usize::from(!tail.is_empty());
                rest = tail;
            }
            assert!(cuts >= 3, "{cuts}");
            assert_eq!(sum, t.encode(&text).len(), "{t:?}");
        }
    }

    #[test]
    fn a_prompt_past_the_limit_is_counted_no_further_than_a_chunk_past_it() {
        let text = docs(16 * COUNT_CHUNK_BYTES);
        let raw = Prompt::Raw(vec![PromptPart::Text(text.clone())]);
        let chat = Prompt::Messages(vec![Message::new("user", text.clone())]);
        let qwen = MockTokenizer::load(&MockTokenizerSetting::Qwen3).expect("shipped tokenizer");
        for t in [&qwen, &MockTokenizer::Builtin] {
            let whole = t.prompt_tokens(&raw).expect("encodes").len();
            for limit in [0, 1000, whole / 3] {
                for prompt in [&raw, &chat] {
                    let Ok(Counted::Over(n)) = t.prompt_tokens_within(prompt, limit) else {
                        panic!("{t:?}: {limit} is not past the limit");
                    };
                    // Stopped within one chunk past the limit (a token is at least a byte), not
                    // after the 1 MiB of text the whole prompt holds.
                    assert!(
                        n > limit && n <= limit + COUNT_CHUNK_BYTES,
                        "{t:?} {limit}: {n}"
                    );
                    assert!(n < whole, "{t:?} {limit}: {n} of {whole}");
                }
            }
            // A prompt that fits is tokenized whole, the same ids as without a limit.
            for prompt in [&raw, &chat] {
                let all = t.prompt_tokens(prompt).expect("encodes");
                for limit in [all.len(), usize::MAX] {
                    assert_eq!(
                        t.prompt_tokens_within(prompt, limit),
                        Ok(Counted::Tokens(all.clone()))
                    );
                }
            }
            // Token ids count one each, and ids past the limit stop the count too.
            let ids = Prompt::Raw(vec![
                PromptPart::Tokens(vec![7; 2 * COUNT_CHUNK_BYTES]),
                PromptPart::Text(text.clone()),
            ]);
            assert_eq!(
                t.prompt_tokens_within(&ids, COUNT_CHUNK_BYTES),
                Ok(Counted::Over(2 * COUNT_CHUNK_BYTES))
            );
        }
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
