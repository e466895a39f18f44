//! Synthetic bodies: the `messages` of a dataset turn (or an agentic turn's whole context) and
//! its output length and model, spliced into the client's body so every other member stays as
//! sent, with the layout of the body it writes. Owns the writing only; never picks the turn
//! (that is the synthesizer's, `super`) and reads the client's body once.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::value::RawValue;

use super::internal;
use crate::error::ProxyError;
use crate::json::{self, Json, Kind, Layout, Top};
use crate::synth::Conversation;

/// A 400 for a body synthesis cannot fill; serde_json quotes a whole string that is not an
/// object ("invalid type: string ..."), so what reaches the client and the log is bounded.
fn unfillable(e: serde_json::Error) -> ProxyError {
    ProxyError::bad_request(
        "invalid_body",
        format!(
            "cannot synthesize into this body: {}",
            crate::error::excerpt(e.to_string().as_bytes())
        ),
    )
}

/// The client's body, read once: its members, `messages` split out when it is one array whose
/// key is plainly spelled (then its brackets are known without a second look). Any other body
/// is read whole a second time, which also words the error.
pub(super) fn client_top(body: &[u8]) -> Result<Top<'_>, ProxyError> {
    if let Ok(top) = json::object_with_array(body, "messages") {
        if top.array_members == 0 || (top.array_members == 1 && top.array_span.is_some()) {
            return Ok(top);
        }
    }
    json::top_object(body).map_err(unfillable)
}

/// Every `messages` member's value range, in order.
fn messages_spans(body: &[u8], top: &Top<'_>) -> Option<Vec<Range<usize>>> {
    let mut spans: Vec<Range<usize>> = top.array_span.iter().cloned().collect();
    for (k, v) in top.object.members() {
        if k == "messages" {
            spans.push(json::span(body, v)?);
        }
    }
    Some(spans)
}

/// `s` as a JSON string literal, appended (serde_json spelling, as AIPerf's orjson).
fn write_json_str(out: &mut Vec<u8>, s: &str) {
    // Serializing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

pub(super) fn json_str(s: &str) -> String {
    // Serializing a &str cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

/// The `messages` for turn `k` of `conv`: system and user-context messages, the earlier user
/// turns each followed by the client's matching assistant message (when it sent one), then
/// user turn `k`. Returns the JSON array and how many user-context messages lead it.
pub fn conversation_messages(
    conv: &Conversation,
    k: usize,
    assistant: &[&RawValue],
) -> (String, usize) {
    let assistant: Vec<Json<'_>> = assistant.iter().map(|a| Json::from(*a)).collect();
    let (bytes, _, ctx) = write_messages(conv, k, &assistant);
    (String::from_utf8(bytes).unwrap_or_default(), ctx)
}

/// A JSON array being written, and where each element is in it.
struct ArrayWriter {
    out: Vec<u8>,
    items: Vec<Range<usize>>,
}

impl ArrayWriter {
    fn element(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        self.out
            .push(if self.items.is_empty() { b'[' } else { b',' });
        let start = self.out.len();
        write(&mut self.out);
        self.items.push(start..self.out.len());
    }

    /// `{"role":role,"content":content}`, as AIPerf spells it.
    fn message(&mut self, role: &str, content: &str) {
        self.element(|out| {
            out.extend_from_slice(b"{\"role\":\"");
            out.extend_from_slice(role.as_bytes());
            out.extend_from_slice(b"\",\"content\":");
            write_json_str(out, content);
            out.push(b'}');
        });
    }

    fn finish(mut self) -> (Vec<u8>, Vec<Range<usize>>) {
        if self.items.is_empty() {
            self.out.push(b'[');
        }
        self.out.push(b']');
        (self.out, self.items)
    }
}

/// [`conversation_messages`] written as bytes, with where each message is in them (the layout
/// the steps after synthesis read instead of parsing the body).
pub(super) fn write_messages(
    conv: &Conversation,
    k: usize,
    assistant: &[Json<'_>],
) -> (Vec<u8>, Vec<Range<usize>>, usize) {
    let turns = conv.turns.iter().take(k + 1);
    let text: usize = turns.clone().map(|t| t.text.len()).sum::<usize>()
        + conv.system_message.as_ref().map_or(0, String::len)
        + conv.user_context_message.as_ref().map_or(0, String::len)
        + assistant
            .iter()
            .take(k)
            .map(|a| a.get().len())
            .sum::<usize>();
    let mut w = ArrayWriter {
        out: Vec::with_capacity(text + 48 * (k + 3)),
        items: Vec::with_capacity(2 * k + 3),
    };
    if let Some(s) = &conv.system_message {
        w.message("system", s);
    }
    let ctx = usize::from(conv.user_context_message.is_some());
    if let Some(c) = &conv.user_context_message {
        w.message("user", c);
    }
    for (i, turn) in turns.enumerate() {
        w.message("user", &turn.text);
        if i < k {
            if let Some(a) = assistant.get(i) {
                w.element(|out| out.extend_from_slice(a.get().as_bytes()));
            }
        }
    }
    let (out, items) = w.finish();
    (out, items, ctx)
}

/// The whole context turn `k` of an agentic conversation sends ([`crate::synth::dataset::trace::agentic::context`]:
/// the delta messages since the last reset, system, user, assistant and tool-shaped ones, each
/// as AIPerf spells it), with where each message is in it.
pub(super) fn write_agentic(conv: &Conversation, k: usize) -> (Vec<u8>, Vec<Range<usize>>) {
    let context = crate::synth::dataset::trace::agentic::context(conv, k);
    let text: usize = context.iter().map(|m| m.content().len() + 48).sum();
    let mut w = ArrayWriter {
        out: Vec::with_capacity(text + 2),
        items: Vec::with_capacity(context.len()),
    };
    for m in context {
        // Serializing a message of strings into a Vec cannot fail.
        w.element(|out| {
            let _ = serde_json::to_writer(&mut *out, m);
        });
    }
    w.finish()
}

/// Replaces `messages` (or adds it) and sets the output length from the entry's OSL: every
/// present `max_tokens` / `max_completion_tokens` is replaced, or `max_completion_tokens` added.
pub fn fill_body(
    body: &[u8],
    messages: &str,
    max_tokens: Option<u64>,
) -> Result<Vec<u8>, ProxyError> {
    let top = client_top(body)?;
    let fill = Fill {
        messages: messages.as_bytes(),
        items: None,
        max_tokens,
        model: None,
    };
    Ok(fill_top(body, &top, &fill)?.0)
}

/// What synthesis writes into the client's body.
pub(super) struct Fill<'a> {
    /// The `messages` array's JSON.
    pub(super) messages: &'a [u8],
    /// Where each element is within `messages`, when known.
    pub(super) items: Option<&'a [Range<usize>]>,
    /// Every `max_tokens` / `max_completion_tokens` becomes this (or `max_completion_tokens`
    /// is added).
    pub(super) max_tokens: Option<u64>,
    /// Every `model` becomes this (or `model` is added): an agentic turn's own model.
    pub(super) model: Option<&'a str>,
}

/// [`fill_body`] on the client's body read once (`top`), also returning the layout of the body
/// it makes: the client's members moved by the edits, `messages` (whose elements are at
/// `fill.items` within `messages`, when known) where it was put.
pub(super) fn fill_top(
    body: &[u8],
    top: &Top<'_>,
    fill: &Fill<'_>,
) -> Result<(Vec<u8>, Layout), ProxyError> {
    let Fill {
        messages,
        items,
        max_tokens,
        model,
    } = *fill;
    let (spans, mut layout) = messages_spans(body, top)
        .zip(Layout::of(body, top))
        .ok_or_else(|| internal("a member outside the body"))?;
    let mut edits: Vec<(Range<usize>, Cow<'_, [u8]>)> = Vec::with_capacity(spans.len() + 3);
    let has_messages = !spans.is_empty();
    edits.extend(spans.into_iter().map(|r| (r, Cow::Borrowed(messages))));
    let mut has_max = false;
    if let Some(n) = max_tokens {
        for (k, v) in top.object.members() {
            if matches!(k, "max_tokens" | "max_completion_tokens") {
                has_max = true;
                let r = json::span(body, v).ok_or_else(|| internal("a member outside the body"))?;
                edits.push((r, Cow::Owned(n.to_string().into_bytes())));
            }
        }
    }
    let mut has_model = false;
    if let Some(m) = model {
        let quoted = json_str(m).into_bytes();
        for (k, v) in top.object.members() {
            if k == "model" {
                has_model = true;
                let r = json::span(body, v).ok_or_else(|| internal("a member outside the body"))?;
                edits.push((r, Cow::Owned(quoted.clone())));
            }
        }
    }
    let add_max = max_tokens.filter(|_| !has_max);
    let add_model = model.filter(|_| !has_model);
    // Where `messages`'s value starts in the tail that adds it, and the tail's length.
    let mut added_at = None;
    if !has_messages || add_max.is_some() || add_model.is_some() {
        let mut tail = Vec::new();
        let mut at = None;
        // A member before each added one, unless the object is empty.
        let mut comma = layout.members() > 0;
        let mut sep = |tail: &mut Vec<u8>| {
            if std::mem::replace(&mut comma, true) {
                tail.push(b',');
            }
        };
        if let Some(m) = add_model {
            sep(&mut tail);
            tail.extend_from_slice(b"\"model\":");
            write_json_str(&mut tail, m);
        }
        if !has_messages {
            sep(&mut tail);
            tail.extend_from_slice(b"\"messages\":");
            at = Some(tail.len());
            tail.extend_from_slice(messages);
        }
        if let Some(n) = add_max {
            sep(&mut tail);
            tail.extend_from_slice(format!("\"max_completion_tokens\":{n}").as_bytes());
        }
        added_at = at.map(|at| (at, tail.len()));
        let close = layout.close();
        edits.push((close..close, Cow::Owned(tail)));
    }
    let out = json::splice(body, &mut edits).ok_or_else(|| internal("overlapping edits"))?;
    layout.shift(&edits);
    let start = match (added_at, layout.get("messages")) {
        // Added: the tail ends where the object now closes.
        (Some((at, tail_len)), _) => (layout.close() + at)
            .checked_sub(tail_len)
            .ok_or_else(|| internal("the tail outside the body"))?,
        (None, Some(r)) => r.start,
        (None, None) => return Err(internal("the replaced `messages` is not in the layout")),
    };
    let items = items.map(|v| v.iter().map(|r| start + r.start..start + r.end).collect());
    layout.set_messages(start..start + messages.len(), items);
    Ok((out, layout))
}

/// The client's assistant messages, raw, in order (the answers to earlier synthetic turns), as
/// a serde derive read them: none unless there is exactly one `messages`, an array; of its
/// elements those whose one `role` is `"assistant"`, spelled without escapes (or, as serde
/// reads a struct from a sequence, the array `["assistant"]`).
pub(super) fn assistant_messages<'a>(top: &Top<'a>) -> Vec<Json<'a>> {
    let messages = match top.object.count("messages") + top.array_members {
        1 => match (&top.array, top.object.get("messages")) {
            (Some(items), _) => items.clone(),
            (None, Some(m)) if Kind::of(m) == Kind::Array => json::array(m).unwrap_or_default(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    let assistant = |v: Json<'_>| v.get() == r#""assistant""#;
    messages
        .into_iter()
        .filter(|m| match Kind::of(*m) {
            Kind::Object => json::object(*m)
                .is_ok_and(|o| o.count("role") == 1 && o.get("role").is_some_and(assistant)),
            Kind::Array => json::array(*m).is_ok_and(|a| a.len() == 1 && assistant(a[0])),
            _ => false,
        })
        .collect()
}
