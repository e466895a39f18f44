//! The placeholder scan: finds `{{kvbust:prompt:N[:corpus]}}` in message content (never
//! elsewhere) within the request's limits, reading the messages through the body's layout when
//! it is known. Owns placeholder syntax and its errors; never generates a prompt (that is the
//! synthesizer's, `super`) and never parses a body that does not hold `{{kvbust:`.

use std::ops::Range;
use std::sync::LazyLock;

use crate::error::ProxyError;
use crate::json::{self, Json, Kind, Layout};
use crate::synth::PromptCorpus;

const PLACEHOLDER_OPEN: &[u8] = b"{{kvbust:";

/// Largest prompt one placeholder may ask for (the per-request total is configured).
const MAX_PLACEHOLDER_TOKENS: usize = 1 << 20;

/// Longest placeholder text between `{{kvbust:` and `}}`; what is longer is not a placeholder.
const MAX_PLACEHOLDER_INNER: usize = 64;

/// A placeholder found in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    pub range: Range<usize>,
    pub tokens: usize,
    pub corpus: Option<PromptCorpus>,
}

/// Finds `{{kvbust:prompt:N}}` / `{{kvbust:prompt:N:corpus}}` in message content: the string
/// `content` of a message in the top-level `messages`, or the `text` of its `content` parts of
/// type `text` (`kvbust-contract.md`: "inside any message content"). Everything else (roles,
/// names, tool calls and their arguments, other part types, other members, member names) is
/// message metadata, not prompt text, and passes through as sent, placeholder or not. Duplicate
/// keys: the last `messages`, `content`, `type` and `text` count, as for the upstream's parser.
/// A placeholder is matched in the raw JSON, so one spelled with escapes (`\u007b…`) is text.
pub fn find_placeholders(body: &[u8]) -> Result<Vec<Placeholder>, ProxyError> {
    find_placeholders_limited(body, usize::MAX, usize::MAX)
}

/// [`find_placeholders`] that stops with a 400 as soon as there are more than `max_count`
/// placeholders or they ask for more than `max_tokens` tokens together. A placeholder is only
/// `[A-Za-z0-9:_-]` between the braces (so it always sits inside one JSON string); anything
/// else after `{{kvbust:` in message content is malformed, and the error quotes a bounded,
/// escaped excerpt of that string.
pub fn find_placeholders_limited(
    body: &[u8],
    max_count: usize,
    max_tokens: usize,
) -> Result<Vec<Placeholder>, ProxyError> {
    find_placeholders_at(body, &mut None, max_count, max_tokens)
}

/// [`find_placeholders_limited`] reading the messages through `layout` (of `body`) when it knows
/// them; a body it parses leaves its layout there, for the steps after.
pub(super) fn find_placeholders_at(
    body: &[u8],
    layout: &mut Option<Layout>,
    max_count: usize,
    max_tokens: usize,
) -> Result<Vec<Placeholder>, ProxyError> {
    // Every chat body comes through here: one SIMD search decides for the many without any.
    if find_open(body).is_none() {
        return Ok(Vec::new());
    }
    scan_content(body, layout, max_count, max_tokens)
}

/// [`find_placeholders_at`] once the body holds `{{kvbust:`: kept out of line so the common
/// call stays a search and a return.
#[inline(never)]
fn scan_content(
    body: &[u8],
    layout: &mut Option<Layout>,
    max_count: usize,
    max_tokens: usize,
) -> Result<Vec<Placeholder>, ProxyError> {
    let mut scan = Scan {
        body,
        max_count,
        max_tokens,
        total: 0,
        out: Vec::new(),
    };
    let known = layout.as_ref().and_then(|l| laid_out_messages(body, l));
    let messages = match known {
        Some(m) => m,
        None => {
            let (m, l) = chat_messages(body)?;
            *layout = l;
            m
        }
    };
    for (i, message) in messages.into_iter().enumerate() {
        // Only a message holding the text is decoded further (a second pass over its bytes).
        if Kind::of(message) != Kind::Object || find_open(message.get().as_bytes()).is_none() {
            continue;
        }
        let obj = json::object(message).map_err(|e| invalid_body(&format!("messages[{i}]"), e))?;
        match obj.get("content") {
            Some(c) if Kind::of(c) == Kind::String => scan.string(c)?,
            Some(c) if Kind::of(c) == Kind::Array => {
                let parts = json::array(c)
                    .map_err(|e| invalid_body(&format!("messages[{i}].content"), e))?;
                for (j, part) in parts.into_iter().enumerate() {
                    if Kind::of(part) != Kind::Object || find_open(part.get().as_bytes()).is_none()
                    {
                        continue;
                    }
                    let part = json::object(part)
                        .map_err(|e| invalid_body(&format!("messages[{i}].content[{j}]"), e))?;
                    if let Some(text) = json::part_text(&part, "text") {
                        scan.string(text)?;
                    }
                }
            }
            // No content, or content of another kind: nothing that is prompt text.
            _ => {}
        }
    }
    Ok(scan.out)
}

/// The elements of `messages` a layout of `body` knows, read without a parse.
fn laid_out_messages<'a>(body: &'a [u8], layout: &Layout) -> Option<Vec<Json<'a>>> {
    let items = layout.items()?;
    items.iter().map(|r| Json::at(body, r.clone())).collect()
}

/// The top-level `messages` array's elements (the last `messages`); none when it is absent or
/// not an array (no message content to expand: the upstream judges such a body). With them, the
/// body's layout, knowing the elements (`None` only on a bug).
fn chat_messages(body: &[u8]) -> Result<(Vec<Json<'_>>, Option<Layout>), ProxyError> {
    if let Ok(top) = json::object_with_array(body, "messages") {
        let layout = Layout::of(body, &top);
        let messages = top.array.unwrap_or_default();
        let layout = match top.array_members {
            0 => layout,
            _ => layout.and_then(|l| l.with_items(body, &messages)),
        };
        return Ok((messages, layout));
    }
    // The one-pass reader failed: not an object, invalid JSON (worded here), or some `messages`
    // is not an array. Only the last one counts: an earlier duplicate of another kind does not
    // hide the array the upstream reads.
    let top = json::top_object(body).map_err(|e| invalid_body("this body", e))?;
    let layout = Layout::of(body, &top);
    match top.object.get("messages") {
        Some(m) if Kind::of(m) == Kind::Array => {
            let messages = json::array(m).map_err(|e| invalid_body("messages", e))?;
            let layout = layout.and_then(|l| l.with_items(body, &messages));
            Ok((messages, layout))
        }
        _ => Ok((Vec::new(), layout)),
    }
}

/// A 400 for JSON the placeholder scan cannot read; serde_json may quote a whole string
/// ("invalid type: string …"), so the message is bounded and escaped.
fn invalid_body(what: &str, e: serde_json::Error) -> ProxyError {
    ProxyError::bad_request(
        "invalid_body",
        format!(
            "cannot expand placeholders in {what}: {}",
            crate::error::excerpt(e.to_string().as_bytes())
        ),
    )
}

/// The placeholders found so far, against the request's limits.
struct Scan<'a> {
    body: &'a [u8],
    max_count: usize,
    max_tokens: usize,
    total: usize,
    out: Vec<Placeholder>,
}

impl Scan<'_> {
    /// Every placeholder inside one JSON string literal of the body, in order.
    fn string(&mut self, literal: Json<'_>) -> Result<(), ProxyError> {
        let body = self.body;
        // A RawValue borrowed from the body always lies in it; a string literal has its quotes.
        let Some(span) = json::span(body, literal) else {
            return Err(ProxyError::Internal(
                "placeholder scan: a value outside the body".into(),
            ));
        };
        let end_of_text = span.end.saturating_sub(1);
        let mut at = span.start + 1;
        while let Some(i) = find_open(&body[at..end_of_text]) {
            let start = at + i;
            // No JSON escape holds `{`, `}` or ends in `[A-Za-z0-9:_-]` followed by `}}`, so a
            // match in the raw text is the literal text.
            let rest = &body[start..end_of_text];
            let inner = rest[PLACEHOLDER_OPEN.len()..]
                .iter()
                .take(MAX_PLACEHOLDER_INNER + 1)
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'-'))
                .count();
            let end = start + PLACEHOLDER_OPEN.len() + inner;
            if inner > MAX_PLACEHOLDER_INNER || !body[end..end_of_text].starts_with(b"}}") {
                return Err(malformed(
                    rest,
                    "it is not closed with `}}` after at most 64 characters of [A-Za-z0-9:_-]",
                ));
            }
            let end = end + 2;
            // Only ASCII was accepted above, so this is UTF-8.
            let text =
                std::str::from_utf8(&body[start..end]).map_err(|_| malformed(rest, "not UTF-8"))?;
            let p = parse_placeholder(text, start..end)?;
            self.push(p)?;
            at = end;
        }
        Ok(())
    }

    fn push(&mut self, p: Placeholder) -> Result<(), ProxyError> {
        self.total = self.total.saturating_add(p.tokens);
        if self.out.len() >= self.max_count {
            return Err(ProxyError::bad_request(
                "placeholder_limit",
                format!(
                    "the request holds more than synth.max_placeholders = {} \
                     placeholders; send fewer or raise the limit",
                    self.max_count
                ),
            ));
        }
        if self.total > self.max_tokens {
            return Err(ProxyError::bad_request(
                "placeholder_limit",
                format!(
                    "the placeholders ask for more than synth.max_placeholder_tokens = \
                     {} tokens together; ask for fewer or raise the limit",
                    self.max_tokens
                ),
            ));
        }
        self.out.push(p);
        Ok(())
    }
}

fn parse_placeholder(text: &str, range: Range<usize>) -> Result<Placeholder, ProxyError> {
    let inner = &text[PLACEHOLDER_OPEN.len()..text.len() - 2];
    let mut parts = inner.split(':');
    if parts.next() != Some("prompt") {
        return Err(malformed(text, "the only kind is `prompt`"));
    }
    let n = parts.next().unwrap_or("");
    let tokens: usize = n
        .parse()
        .map_err(|_| malformed(text, "N must be a positive integer"))?;
    if tokens == 0 || tokens > MAX_PLACEHOLDER_TOKENS {
        return Err(malformed(
            text,
            &format!("N must be between 1 and {MAX_PLACEHOLDER_TOKENS}"),
        ));
    }
    let corpus = match parts.next() {
        None => None,
        Some(name) => Some(
            name.parse::<PromptCorpus>()
                .map_err(|e| malformed(text, &e))?,
        ),
    };
    if parts.next().is_some() {
        return Err(malformed(text, "too many `:` fields"));
    }
    Ok(Placeholder {
        range,
        tokens,
        corpus,
    })
}

fn malformed(text: impl AsRef<[u8]>, why: &str) -> ProxyError {
    ProxyError::bad_request(
        "invalid_placeholder",
        format!(
            "malformed placeholder `{}`: {why}; write {{{{kvbust:prompt:N}}}} or {{{{kvbust:prompt:N:corpus}}}}",
            crate::error::excerpt(text.as_ref())
        ),
    )
}

/// SIMD substring search: every chat body is scanned for placeholders, so this is on the hot path.
/// The searcher is built once: `memmem::find` would build it again on every call.
fn find_open(hay: &[u8]) -> Option<usize> {
    static OPEN: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(PLACEHOLDER_OPEN));
    OPEN.find(hay)
}
