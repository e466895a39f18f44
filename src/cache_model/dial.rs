//! The cache-hit dial (`cache_bust.hit_ratio`, `x-kvbust-hit-ratio`, issue 40): where a
//! request-unique marker goes in a prompt so that at most `R` of it, rounded up to a whole
//! block, can come from the upstream's cache. Counts the prompt as the cache model does (its
//! tokenizer, chat template and block size) and checks with the tokenizer that the text before
//! the marker tokenizes exactly as it did without it. Owns that placement; never does I/O and
//! never changes a byte of the body but the marker's insertion.
//!
//! The rule: `N` prompt tokens, boundary `B = ceil(R × N / block) × block`. The marker goes at
//! the start of the first token `t ≥ B` that lies inside a message's content (a chat's string
//! contents, a completion's prompt string) where inserting it leaves tokens `0..t` as they were
//! (the text before is a pre-token boundary for the tokenizer; otherwise the next token start
//! is tried). Blocks wholly before `t` are unchanged, so at most `floor(t / block)` blocks (`B`
//! tokens when `t < B + block`, the usual case) can be reused; every block from `t` on holds
//! the marker, which no other request carries. With `B ≥ N` nothing is capped and nothing goes
//! in.

use std::ops::Range;

use crate::api::Shape;
use crate::json::{self, Json, Kind};
use crate::mock::request::Prompt;
use crate::mock::tokenize::{builtin_pieces, plain_render, render_chat, MockTokenizer};

/// Token starts tried past the boundary before giving up (each costs one tokenization).
const MAX_TRIES: usize = 24;

/// The prompt counter: the cache model's tokenizer, template mode and block size.
pub struct Dialer {
    tokenizer: MockTokenizer,
    use_template: bool,
    block_size: usize,
}

/// Where the marker went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The insertion into the body (an empty range at the marker's place, and its JSON text).
    pub edit: (Range<usize>, Vec<u8>),
    /// The prompt's tokens without the marker.
    pub prompt_tokens: usize,
    /// `B`: the block boundary at or after `R × prompt_tokens`.
    pub boundary: usize,
    /// The token index the marker starts at (`≥ boundary`).
    pub at_token: usize,
}

impl Placed {
    /// Most tokens the cache can serve: the whole blocks before the marker.
    pub fn cacheable(&self, block_size: usize) -> usize {
        self.at_token / block_size.max(1) * block_size.max(1)
    }
}

/// Why the dial could not place its marker: each a 400 for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    #[error("the cache-hit dial works on /v1/chat/completions and on /v1/completions with one prompt string ({0})")]
    Unsupported(&'static str),
    #[error("the cache-hit dial cannot read the body: {0}")]
    Body(String),
}

/// A piece of the rendered prompt that is a message's text, and where it is in the body.
struct Span {
    /// Its bytes in the rendered text.
    text: Range<usize>,
    /// The raw JSON string literal (quotes included) in the body.
    raw: Range<usize>,
}

impl Dialer {
    pub fn new(tokenizer: MockTokenizer, use_template: bool, block_size: usize) -> Self {
        Self {
            tokenizer,
            use_template,
            block_size: block_size.max(1),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Places `marker` in `body` (a request on `shape`) for the dial `ratio` (0..=1). `None`:
    /// nothing to cap (the boundary is past the prompt, or past its last text).
    pub fn place(
        &self,
        shape: Shape,
        body: &[u8],
        ratio: f64,
        marker: &str,
    ) -> Result<Option<Placed>, DialError> {
        let (rendered, spans, special) = self.render(shape, body)?;
        let (ids, offsets) = self.encode(&rendered, special);
        let n = ids.len();
        let bs = self.block_size;
        let target = (ratio.clamp(0.0, 1.0) * n as f64).ceil() as usize;
        let boundary = target.div_ceil(bs) * bs;
        if boundary >= n {
            return Ok(None);
        }
        let mut tries = 0;
        for t in boundary..n {
            let at = offsets[t];
            // A token that starts where the one before it does (a split character) is no
            // place to cut.
            if t > 0 && offsets[t - 1] >= at || !rendered.is_char_boundary(at) {
                continue;
            }
            let Some(span) = spans.iter().find(|s| s.text.start <= at && at < s.text.end) else {
                continue;
            };
            tries += 1;
            if tries > MAX_TRIES {
                break;
            }
            let with = format!("{}{marker}{}", &rendered[..at], &rendered[at..]);
            let (again, _) = self.encode(&with, special);
            if again.len() < t || again[..t] != ids[..t] {
                continue;
            }
            let decoded = at - span.text.start;
            let raw = &body[span.raw.clone()];
            let Some(inside) = raw_index(raw, decoded) else {
                continue;
            };
            let quoted =
                serde_json::to_string(marker).map_err(|e| DialError::Body(e.to_string()))?;
            let text = quoted.as_bytes()[1..quoted.len() - 1].to_vec();
            let pos = span.raw.start + inside;
            return Ok(Some(Placed {
                edit: (pos..pos, text),
                prompt_tokens: n,
                boundary,
                at_token: t,
            }));
        }
        Ok(None)
    }

    /// The prompt as the engine reads it, the spans of it that are message text, and whether
    /// special tokens are added (completions).
    fn render(&self, shape: Shape, body: &[u8]) -> Result<(String, Vec<Span>, bool), DialError> {
        let req = crate::mock::openai::parse_request(shape, body, "")
            .map_err(|e| DialError::Body(e.message))?;
        let top = json::top_object(body).map_err(|e| DialError::Body(e.to_string()))?;
        match (shape, req.prompt.chat()) {
            (Shape::Chat, Some((messages, options))) => {
                let rendered = match &self.tokenizer {
                    MockTokenizer::Hf {
                        template: Some(t), ..
                    } if self.use_template => render_chat(t, messages, options)
                        .map_err(|e| DialError::Body(e.to_string()))?,
                    _ => plain_render(messages),
                };
                let elems = top
                    .array
                    .or_else(|| top.object.get("messages").and_then(|m| json::array(m).ok()))
                    .unwrap_or_default();
                let mut spans = Vec::new();
                let mut from = 0;
                for e in elems {
                    let content = json::object(e).ok().and_then(|o| o.get("content"));
                    let Some(c) = content.filter(|c| Kind::of(*c) == Kind::String) else {
                        continue;
                    };
                    if let Some(span) = locate(body, c, &rendered, &mut from) {
                        spans.push(span);
                    }
                }
                Ok((rendered, spans, false))
            }
            (Shape::Completions, _) if matches!(req.prompt, Prompt::Raw(_)) => {
                let p = top.object.get("prompt");
                let Some(p) = p.filter(|p| Kind::of(*p) == Kind::String) else {
                    return Err(DialError::Unsupported(
                        "a completions prompt must be one string",
                    ));
                };
                let text = json::string(p).map_err(|e| DialError::Body(e.to_string()))?;
                let raw = json::span(body, p).ok_or(DialError::Unsupported("internal"))?;
                let spans = vec![Span {
                    text: 0..text.len(),
                    raw,
                }];
                Ok((text.into_owned(), spans, true))
            }
            _ => Err(DialError::Unsupported("not on this route")),
        }
    }

    /// Token ids and each token's start (a byte offset of `text`).
    fn encode(&self, text: &str, special: bool) -> (Vec<u32>, Vec<usize>) {
        if let MockTokenizer::Hf { tokenizer, .. } = &self.tokenizer {
            if let Ok(enc) = tokenizer.inner().encode(text, special) {
                let starts = enc.get_offsets().iter().map(|o| o.0).collect();
                return (enc.get_ids().to_vec(), starts);
            }
        }
        let mut at = 0;
        let mut starts = Vec::new();
        let mut ids = Vec::new();
        for piece in builtin_pieces(text) {
            starts.push(at);
            ids.push(crate::mock::tokenize::piece_id(piece));
            at += piece.len();
        }
        (ids, starts)
    }
}

/// The span of the string `c` (a message's content in `body`) in `rendered`, searched from
/// `from` on (messages render in order); `None` when the template does not carry it verbatim.
fn locate(body: &[u8], c: Json<'_>, rendered: &str, from: &mut usize) -> Option<Span> {
    let text = json::string(c).ok()?;
    if text.is_empty() {
        return None;
    }
    let at = *from + rendered.get(*from..)?.find(text.as_ref())?;
    *from = at + text.len();
    Some(Span {
        text: at..at + text.len(),
        raw: json::span(body, c)?,
    })
}

/// Where, in the raw JSON string literal `raw` (quotes included), the decoded text's byte
/// `decoded` begins; `None` past its end or inside an escape.
pub(crate) fn raw_index(raw: &[u8], decoded: usize) -> Option<usize> {
    let end = raw.len().checked_sub(1)?;
    let (mut i, mut d) = (1, 0);
    while d < decoded {
        if i >= end {
            return None;
        }
        if raw[i] != b'\\' {
            i += 1;
            d += 1;
            continue;
        }
        match raw.get(i + 1)? {
            b'u' => {
                let hex = std::str::from_utf8(raw.get(i + 2..i + 6)?).ok()?;
                let cp = u32::from_str_radix(hex, 16).ok()?;
                if (0xD800..0xDC00).contains(&cp) {
                    // A surrogate pair: one 4-byte character in 12 raw bytes.
                    i += 12;
                    d += 4;
                } else {
                    i += 6;
                    d += char::from_u32(cp).map_or(3, char::len_utf8);
                }
            }
            _ => {
                i += 2;
                d += 1;
            }
        }
    }
    (d == decoded && i <= end).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn qwen() -> Dialer {
        let t = crate::synth::tokenizer::Tokenizer::default_qwen3().expect("shipped tokenizer");
        Dialer::new(MockTokenizer::hf(Arc::new(t)).expect("template"), true, 16)
    }

    #[test]
    fn raw_offsets_follow_escapes() {
        let raw = br#""a\nb\u00e9c\ud83d\ude00d""#;
        let text: String = serde_json::from_slice(raw).unwrap();
        for (d, _) in text.char_indices().chain([(text.len(), ' ')]) {
            let i = raw_index(raw, d).unwrap();
            let back: String = serde_json::from_slice(&[&raw[..i], b"\""].concat()).unwrap();
            assert_eq!(back, text[..d], "{d}");
        }
        assert_eq!(raw_index(raw, text.len() + 1), None);
    }

    /// The marker lands at the first token start at or past the boundary, inside a message's
    /// text, and the text before it tokenizes exactly as it did.
    #[test]
    fn the_text_before_the_marker_tokenizes_as_it_did() {
        let d = qwen();
        let user = "It was the best of times, it was the worst of times; \"quoted\"\nand a tab\t. "
            .repeat(40);
        let body = serde_json::json!({
            "model": "m",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": user}],
        })
        .to_string();
        let marker = "[dial:0123456789abcdef]";
        for ratio in [0.0, 0.1, 0.25, 0.5, 0.75, 0.9] {
            let p = d
                .place(Shape::Chat, body.as_bytes(), ratio, marker)
                .unwrap()
                .expect("capped");
            assert!(
                p.boundary as f64 >= ratio * p.prompt_tokens as f64,
                "{ratio}"
            );
            assert!(
                p.at_token >= p.boundary && p.at_token < p.boundary + 16,
                "{ratio} {p:?}"
            );
            let mut out = body.clone().into_bytes();
            out.splice(p.edit.0.clone(), p.edit.1.clone());
            // The engine's view: the rendered prompt with and without the marker.
            let (before, _, _) = d.render(Shape::Chat, body.as_bytes()).unwrap();
            let (after, _, _) = d.render(Shape::Chat, &out).unwrap();
            let (ids, _) = d.encode(&before, false);
            let (with, _) = d.encode(&after, false);
            assert_eq!(with[..p.at_token], ids[..p.at_token], "{ratio}");
            assert_ne!(with[p.at_token], ids[p.at_token], "{ratio}");
            let cut = after.find(marker).unwrap();
            assert_eq!(after[..cut], before[..cut]);
            assert_eq!(after.replacen(marker, "", 1), before);
        }
        // R = 1: nothing to cap.
        assert_eq!(
            d.place(Shape::Chat, body.as_bytes(), 1.0, marker).unwrap(),
            None
        );
    }

    #[test]
    fn completions_and_the_builtin_tokenizer_are_dialled_too() {
        let d = Dialer::new(MockTokenizer::Builtin, false, 4);
        let prompt = "alpha beta gamma delta ".repeat(30);
        let body = serde_json::json!({"model": "m", "prompt": prompt}).to_string();
        let p = d
            .place(Shape::Completions, body.as_bytes(), 0.5, " [dial:x]")
            .unwrap()
            .unwrap();
        assert_eq!(
            p.boundary,
            ((p.prompt_tokens as f64 * 0.5).ceil() as usize).div_ceil(4) * 4
        );
        assert!(
            p.at_token >= p.boundary && p.at_token < p.boundary + 4,
            "{p:?}"
        );
        let err = d
            .place(Shape::Responses, br#"{"input":"x"}"#, 0.5, "m")
            .unwrap_err();
        assert!(matches!(err, DialError::Unsupported(_)), "{err}");
    }
}
