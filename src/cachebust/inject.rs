//! The pure body rewrite: parse a request body once, find where AIPerf's rule puts the marker, and splice it into the raw bytes. Never does I/O, never re-serialises bytes it does not change, never panics on client input.
//!
//! # Transparency
//! The body is parsed into borrowed raw values (`json::Json`; objects as ordered `(key, value)` pairs), and
//! the output is `body[..at] + inserted + body[at..]` for each insertion point. Every byte outside
//! the insertions is the client's: key order, whitespace, number spelling, escapes, unknown fields.
//! A marker goes *inside* an existing JSON string literal (right after the opening quote for a
//! prefix, right before the closing quote for a suffix), spelled as `serde_json` spells it
//! (`\n` for the newlines), so the client's own escapes in that string are kept too. When the
//! client's string was written by orjson/serde_json (as AIPerf's are), the result is byte-equal to
//! re-encoding `marker + text` with `serde_json::to_string`. A marker that becomes its own content
//! part is a new compact element `{"type":"text","text":"[rid:…]"}` inserted before the first or
//! after the last element (with the comma on the inner side; into `[]` without one).
//! Duplicate keys: lookups use the last member with a key (what the upstream's JSON parser keeps)
//! and that member is the one rewritten.
//!
//! # Rules (`aiperf-semantics.md` §1.6, adapted to a client-supplied body)
//! * **System targets** (`system_prefix`, `system_suffix`, `warmup_isolation_system`):
//!   - chat: `messages[0]` when its role is `system` or `developer`;
//!   - responses: top-level `instructions` (a string); without it, `input[0]` when it is an item
//!     with role `system`/`developer` (the chat rule; a kvbust extension, AIPerf never sends that);
//!   - messages (Anthropic): top-level `system`, a string or an array of blocks;
//!   - completions: never (falls through).
//!
//!   `null` counts as absent. No system → the first-user rule with the same orientation,
//!   reported as [`Location::Fallthrough`].
//! * **First-turn targets** and fall-through: the first user message after skipping
//!   `user_context_messages` user messages: chat/messages `role == "user"` in `messages`; responses
//!   `input` when it is a string (no skipping possible: with `user_context_messages > 0` there is
//!   nothing to mark), else the first item with `role == "user"`; completions **every** string of
//!   `prompt` (a kvbust extension: AIPerf rejects cache-bust on completions; a batch of prompts is
//!   a batch of independent requests, each gets the session's marker). A Responses request with a
//!   non-null `previous_response_id` keeps its first turn on the server (marked when it was sent),
//!   so the first-user rule does nothing there.
//!   No such message → nothing is marked ([`Outcome::location`] is `None`).
//! * **Content**: a string → `marker + s` / `s + marker`, skipped when `s` already starts *or* ends
//!   with the marker. An array of parts → depends on [`ListParts`]. Anything else (`null`, a
//!   number, an object, a missing field) in the message the rule must mark is an error
//!   ([`RewriteError::ContentType`]): the client asked for a marker there and there is no way to
//!   carry one, and the upstream would reject such a message anyway. AIPerf warns and drops the
//!   marker; a proxy that silently forwarded an unmarked body would fake a cache-bust.
//! * A later request of a session carries the client's unmarked history and gets the same marker
//!   again on its first user message, so its wire bytes equal AIPerf's (which persisted the mark).
//!   An already-marked history is left unchanged by the idempotency checks.
//!
//! # Validation
//! [`parse`] checks that the body is a JSON object and that the fields the shape needs have the
//! right JSON type (`messages` an array, `input` a string or array, `prompt` a string or array,
//! `instructions` a string, Anthropic `system` a string or array). [`Parsed::apply`] checks what
//! the rule reads: every message it looks at must be an object, `role` (when present) a string,
//! and the content it marks a string or an array. Messages after the one marked are not read.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::fmt;

use sha2::{Digest as _, Sha256};

use super::marker::unmarked;
use super::target::Target;
use crate::api::Shape;
use crate::json::{self, Json, Kind, Layout, RawObject, Top};

#[cfg(test)]
mod tests;

/// Where a marker landed (the metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// The system prompt (system targets).
    System,
    /// The first user turn (first-turn targets).
    FirstUser,
    /// The first user turn, because a system target found no system prompt.
    Fallthrough,
}

impl Location {
    /// `system`, `first_user`, `fallthrough`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Location::System => "system",
            Location::FirstUser => "first_user",
            Location::Fallthrough => "fallthrough",
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a marker goes into content that is a list of parts (or Anthropic system blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ListParts {
    /// AIPerf's `raw_messages` rule: a new part `{"type":"text","text":marker.strip()}` first
    /// (prefix) or last (suffix); skipped when the first or last part already equals it.
    #[default]
    OwnPart,
    /// AIPerf's synthetic multimodal rule: the full marker is concatenated into the first text
    /// part's string (prefix or suffix of that string); when there is no text part, a new part
    /// with the full marker goes first (AIPerf renders text parts before media).
    InlineText,
}

/// What to inject, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan<'a> {
    pub target: Target,
    /// The full marker including its newlines, from [`super::marker::build_marker`].
    pub marker: &'a str,
    /// How many leading user messages are user context (skipped by the first-user rule).
    pub user_context_messages: usize,
    pub list_parts: ListParts,
    /// Chat only: the system message `messages[0]` is AIPerf's merge of the conversation's system
    /// prompt (this many bytes of UTF-8 text) with a dataset system message: string content
    /// `prompt + "\n\n" + dataset` (`SYSTEM_PROMPT_JOIN_SEP`), list content
    /// `[{"type":"text","text":prompt}, ...dataset parts]`. AIPerf marks the *prompt* before
    /// merging, so a suffix marker lands after the first `n` bytes of the string, or at the end of
    /// the first part's text (a prefix marker lands where it always does). Only kvbust's own
    /// synthesis knows this; `None` (the default) treats the content as one piece.
    pub system_prompt_bytes: Option<usize>,
    /// Most strings of a completions `prompt` list that may be marked: a longer list is
    /// [`RewriteError::TooManyPrompts`] (each string gets the marker, so this bounds how far the
    /// body grows). Unbounded in [`Plan::new`]; the proxy sets `cache_bust.max_marked_prompts`.
    pub max_prompts: usize,
}

impl<'a> Plan<'a> {
    /// A plan with no user-context messages, [`ListParts::OwnPart`] and no merged system prompt.
    pub fn new(target: Target, marker: &'a str) -> Self {
        Plan {
            target,
            marker,
            user_context_messages: 0,
            list_parts: ListParts::OwnPart,
            system_prompt_bytes: None,
            max_prompts: usize::MAX,
        }
    }
}

/// The result of [`Parsed::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The rewritten body, or `None` when nothing changed (forward the original bytes).
    pub body: Option<Vec<u8>>,
    /// Where the marker is: `Some` with `body: None` means the body already carried it there;
    /// `None` means the rule found nowhere to put it (e.g. no user message) or the plan was empty.
    pub location: Option<Location>,
}

impl Outcome {
    /// True when the body was changed.
    pub fn injected(&self) -> bool {
        self.body.is_some()
    }
}

/// Why a body could not be rewritten. Every message names the field and the problem, for a 400.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("body is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    #[error("body must be a JSON object (found {found})")]
    NotAnObject { found: &'static str },
    #[error("`{field}` is missing: a {shape} request must have it")]
    MissingField { field: &'static str, shape: Shape },
    #[error("`{path}` must be an array (found {found})")]
    NotAnArray { path: String, found: &'static str },
    #[error("`{path}` must be an object (found {found})")]
    ElementNotObject { path: String, found: &'static str },
    #[error("`{path}` must be a string (found {found})")]
    NotAString { path: String, found: &'static str },
    #[error("`{path}` must be a string or an array of content parts (found {found})")]
    ContentType { path: String, found: &'static str },
    #[error("`{path}` must be a string or an array of strings to carry a cache-bust marker (found {found}; token-id prompts cannot be marked)")]
    PromptType { path: String, found: &'static str },
    #[error("`{path}` must be {expected} (found {found})")]
    WrongType {
        path: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("`prompt` holds more than {limit} strings: kvbust marks at most {limit} prompts in one request (cache_bust.max_marked_prompts); send fewer per request or raise the limit")]
    TooManyPrompts { limit: usize },
    /// The plan's `system_prompt_bytes` does not fit the system message (a kvbust bug, since
    /// only kvbust's own synthesis sets it).
    #[error("cache-bust plan does not fit the body: {0}")]
    PlanMismatch(String),
    #[error(
        "internal error in the cache-bust engine ({0}); please report it with the request body"
    )]
    Internal(&'static str),
}

impl RewriteError {
    /// A stable snake_case code for the error (for the OpenAI-shaped error's `code` and metrics).
    pub fn code(&self) -> &'static str {
        match self {
            RewriteError::InvalidJson(_) => "invalid_json",
            RewriteError::NotAnObject { .. } => "body_not_object",
            RewriteError::MissingField { .. } => "missing_field",
            RewriteError::NotAnArray { .. }
            | RewriteError::ElementNotObject { .. }
            | RewriteError::NotAString { .. }
            | RewriteError::ContentType { .. }
            | RewriteError::PromptType { .. }
            | RewriteError::WrongType { .. } => "invalid_field_type",
            RewriteError::TooManyPrompts { .. } => "too_many_prompts",
            RewriteError::PlanMismatch(_) => "plan_mismatch",
            RewriteError::Internal(_) => "internal",
        }
    }

    /// True when the client's body is at fault (everything but [`RewriteError::Internal`]).
    pub fn is_client_error(&self) -> bool {
        !matches!(
            self,
            RewriteError::Internal(_) | RewriteError::PlanMismatch(_)
        )
    }
}

const MISSING: &str = "no such field";

/// A JSON path for messages: `root`, `root[i]`, `root[i].leaf`.
#[derive(Clone, Copy)]
struct Path {
    root: &'static str,
    index: Option<usize>,
    leaf: Option<&'static str>,
}

impl Path {
    const fn top(root: &'static str) -> Path {
        Path {
            root,
            index: None,
            leaf: None,
        }
    }
    const fn at(self, i: usize) -> Path {
        Path {
            index: Some(i),
            ..self
        }
    }
    const fn field(self, leaf: &'static str) -> Path {
        Path {
            leaf: Some(leaf),
            ..self
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.root)?;
        if let Some(i) = self.index {
            write!(f, "[{i}]")?;
        }
        if let Some(l) = self.leaf {
            write!(f, ".{l}")?;
        }
        Ok(())
    }
}

fn found(raw: Option<Json<'_>>) -> &'static str {
    raw.map_or(MISSING, |r| Kind::of(r).describe())
}

fn internal(what: &'static str) -> impl FnOnce(serde_json::Error) -> RewriteError {
    move |_| RewriteError::Internal(what)
}

/// The shape-specific view of a body.
enum View<'a> {
    Chat {
        messages: Vec<Json<'a>>,
    },
    Messages {
        system: Option<Json<'a>>,
        messages: Vec<Json<'a>>,
    },
    Responses {
        instructions: Option<Json<'a>>,
        input: Input<'a>,
        stateful: bool,
    },
    Completions {
        prompt: Json<'a>,
    },
}

enum Input<'a> {
    Absent,
    Text(Json<'a>),
    Items(Vec<Json<'a>>),
}

/// A body parsed once, borrowing from the request bytes.
pub struct Parsed<'a> {
    body: &'a [u8],
    shape: Shape,
    user: Option<Cow<'a, str>>,
    view: View<'a>,
    /// The first-user rule's pick, kept by the first step that made it (the session hash asks
    /// before the marking does), so the messages are read once per request.
    first_user: OnceCell<FirstUser<'a>>,
}

/// The message the first-user rule chose after skipping `skip` user messages: its index and its
/// `content` (`found` is `None` when there is no such message).
#[derive(Clone, Copy)]
struct FirstUser<'a> {
    skip: usize,
    found: Option<(usize, Option<Json<'a>>)>,
}

impl fmt::Debug for Parsed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parsed")
            .field("shape", &self.shape)
            .field("body_len", &self.body.len())
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

fn parse_top(body: &[u8]) -> Result<Top<'_>, RewriteError> {
    let first = body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first == Some(&b'{') {
        return json::top_object(body).map_err(RewriteError::InvalidJson);
    }
    // Not an object: say what it is when it is JSON at all.
    let raw: Json<'_> = json::top_value(body).map_err(RewriteError::InvalidJson)?;
    Err(RewriteError::NotAnObject {
        found: Kind::of(raw).describe(),
    })
}

fn required_array<'a>(
    top: &RawObject<'a>,
    split: Option<Vec<Json<'a>>>,
    field: &'static str,
    shape: Shape,
) -> Result<Vec<Json<'a>>, RewriteError> {
    if let Some(items) = split {
        return Ok(items);
    }
    let raw = top
        .get(field)
        .ok_or(RewriteError::MissingField { field, shape })?;
    if Kind::of(raw) != Kind::Array {
        return Err(RewriteError::NotAnArray {
            path: field.to_owned(),
            found: found(Some(raw)),
        });
    }
    json::array(raw).map_err(internal("array of a validated array"))
}

/// Parses `body` for `shape` once. Fails when the body is not a JSON object or a field the shape
/// needs has the wrong JSON type (see the module docs).
pub fn parse(shape: Shape, body: &[u8]) -> Result<Parsed<'_>, RewriteError> {
    parse_laid_out(shape, body).map(|(parsed, _)| parsed)
}

/// [`parse`], also returning the body's [`Layout`] for the request steps after this one (`None`
/// only on an engine bug).
pub(crate) fn parse_laid_out(
    shape: Shape,
    body: &[u8],
) -> Result<(Parsed<'_>, Option<Layout>), RewriteError> {
    // The array that holds the conversation is split out while the body is read (one pass);
    // anything unusual (no object, invalid JSON, the field not an array) takes the general path.
    let array_field = match shape {
        Shape::Chat | Shape::Messages => Some("messages"),
        Shape::Responses => Some("input"),
        Shape::Completions => None,
    };
    let top = match array_field.map(|f| json::object_with_array(body, f)) {
        Some(Ok(top)) => top,
        _ => parse_top(body)?,
    };
    let layout = Layout::of(body, &top);
    Ok((view(shape, body, top)?, layout))
}

/// The shape's view of a parsed top-level object, checking the fields it needs.
fn view<'a>(shape: Shape, body: &'a [u8], top: Top<'a>) -> Result<Parsed<'a>, RewriteError> {
    let Top {
        object: top,
        array: mut split,
        ..
    } = top;
    let user = top.get("user").and_then(json::as_str);
    let view = match shape {
        Shape::Chat => View::Chat {
            messages: required_array(&top, split.take(), "messages", shape)?,
        },
        Shape::Messages => {
            let system = top.get_non_null("system");
            if let Some(s) = system {
                if !matches!(Kind::of(s), Kind::String | Kind::Array) {
                    return Err(RewriteError::WrongType {
                        path: "system".into(),
                        expected: "a string or an array of content blocks",
                        found: found(system),
                    });
                }
            }
            View::Messages {
                system,
                messages: required_array(&top, split.take(), "messages", shape)?,
            }
        }
        Shape::Responses => {
            let instructions = top.get_non_null("instructions");
            if let Some(i) = instructions {
                if Kind::of(i) != Kind::String {
                    return Err(RewriteError::NotAString {
                        path: "instructions".into(),
                        found: found(instructions),
                    });
                }
            }
            let input = match (split.take(), top.get_non_null("input")) {
                (Some(items), _) => Input::Items(items),
                (None, None) => Input::Absent,
                (None, Some(r)) => match Kind::of(r) {
                    Kind::String => Input::Text(r),
                    Kind::Array => {
                        Input::Items(json::array(r).map_err(internal("array of input"))?)
                    }
                    k => {
                        return Err(RewriteError::WrongType {
                            path: "input".into(),
                            expected: "a string or an array of input items",
                            found: k.describe(),
                        })
                    }
                },
            };
            View::Responses {
                instructions,
                input,
                stateful: top.get_non_null("previous_response_id").is_some(),
            }
        }
        Shape::Completions => {
            let prompt = top.get("prompt").ok_or(RewriteError::MissingField {
                field: "prompt",
                shape,
            })?;
            if !matches!(Kind::of(prompt), Kind::String | Kind::Array) {
                return Err(RewriteError::PromptType {
                    path: "prompt".into(),
                    found: found(Some(prompt)),
                });
            }
            View::Completions { prompt }
        }
    };
    Ok(Parsed {
        body,
        shape,
        user,
        view,
        first_user: OnceCell::new(),
    })
}

/// A message object with its index.
struct Message<'a> {
    index: usize,
    obj: RawObject<'a>,
}

fn message<'a>(path: Path, raw: Json<'a>) -> Result<RawObject<'a>, RewriteError> {
    if Kind::of(raw) != Kind::Object {
        return Err(RewriteError::ElementNotObject {
            path: path.to_string(),
            found: found(Some(raw)),
        });
    }
    // The syntax was validated, but a member name holding a lone surrogate (`"\uDDDD"`) only
    // fails now, when names are decoded (the scan leaves escaped names to serde): the client's
    // JSON is invalid text, a 400.
    json::object_of_valid(raw).map_err(RewriteError::InvalidJson)
}

/// The message's role; `None` when absent or not decodable text.
fn role<'a>(path: Path, obj: &RawObject<'a>) -> Result<Option<Cow<'a, str>>, RewriteError> {
    match obj.get("role") {
        None => Ok(None),
        Some(r) if Kind::of(r) == Kind::String => Ok(json::string(r).ok()),
        Some(r) => Err(RewriteError::NotAString {
            path: path.field("role").to_string(),
            found: found(Some(r)),
        }),
    }
}

fn is_system_role(role: Option<&str>) -> bool {
    matches!(role, Some("system" | "developer"))
}

/// Whether the chat message `raw` (element `index` of `messages`) is a user turn, as the
/// first-user rule reads it; the error that rule's read of it gives.
pub(crate) fn is_user_message(index: usize, raw: Json<'_>) -> Result<bool, RewriteError> {
    let path = Path::top("messages").at(index);
    let obj = message(path, raw)?;
    Ok(role(path, &obj)?.as_deref() == Some("user"))
}

/// The `(skip+1)`-th message with role `user`.
fn nth_user<'a>(
    root: &'static str,
    items: &[Json<'a>],
    mut skip: usize,
) -> Result<Option<Message<'a>>, RewriteError> {
    for (index, raw) in items.iter().enumerate() {
        let path = Path::top(root).at(index);
        let obj = message(path, *raw)?;
        if role(path, &obj)?.as_deref() == Some("user") {
            if skip == 0 {
                return Ok(Some(Message { index, obj }));
            }
            skip -= 1;
        }
    }
    Ok(None)
}

/// The first message when it is a system/developer message.
fn leading_system<'a>(
    root: &'static str,
    items: &[Json<'a>],
) -> Result<Option<Message<'a>>, RewriteError> {
    let Some(first) = items.first() else {
        return Ok(None);
    };
    let path = Path::top(root).at(0);
    let obj = message(path, *first)?;
    Ok(is_system_role(role(path, &obj)?.as_deref()).then_some(Message { index: 0, obj }))
}

/// One edit of a body: the range replaced and the bytes that replace it.
pub(crate) type Edit = (std::ops::Range<usize>, Vec<u8>);

/// Collects insertions for one plan.
struct Injector<'p> {
    body: &'p [u8],
    marker: &'p str,
    prefix: bool,
    list_parts: ListParts,
    text_type: &'static str,
    max_prompts: usize,
    /// `(range of the body replaced, new bytes)`; an empty range is an insertion.
    edits: Vec<Edit>,
}

/// `s` as a JSON string literal (serde_json spelling = orjson's).
fn json_string(s: &str) -> Result<String, RewriteError> {
    serde_json::to_string(s).map_err(internal("string encoding"))
}

/// The literal without its quotes.
fn json_string_inner(s: &str) -> Result<String, RewriteError> {
    let lit = json_string(s)?;
    Ok(lit
        .get(1..lit.len().saturating_sub(1))
        .unwrap_or_default()
        .to_owned())
}

/// Whether the string `raw` already carries `marker`: its text starts or ends with it, or, when
/// the string is not decodable as text (a lone surrogate escape), its JSON spelling starts or
/// ends with `inner` (the marker's spelling).
fn already_marked(raw: Json<'_>, marker: &str, inner: &str) -> bool {
    let lit = raw.get();
    let body = lit.get(1..lit.len().saturating_sub(1)).unwrap_or_default();
    let spelled = body.starts_with(inner) || body.ends_with(inner);
    // The ends alone give the text's answer when the whole string decodes; when it does not
    // (a lone surrogate anywhere), the answer is `spelled`. Where the two agree, that is the
    // answer either way, and the string (a whole first turn, often hundreds of KB) is not
    // decoded. Only where they differ does the whole string have to say which case it is.
    if ends_marked(body, marker) == Some(spelled) {
        return spelled;
    }
    match json::string(raw) {
        Ok(s) => s.starts_with(marker) || s.ends_with(marker),
        Err(_) => spelled,
    }
}

/// Raw bytes per decoded byte, at most: an escape `\u0041` is 6 bytes for 1 byte of text
/// (`\uD83D\uDE00` is 12 for 4, a literal character as many as it decodes to).
const RAW_PER_BYTE: usize = 6;
/// How far [`ends_marked`] looks for a cut it can decode from before giving up.
const CUT_SEARCH: usize = 64;

/// `Some(text.starts_with(marker) || text.ends_with(marker))` for the `text` the JSON string
/// contents `body` decode to, read from its two ends only and assuming the whole decodes (see
/// [`already_marked`]); `None` when the ends cannot tell cheaply (a short string, no cut found,
/// an end that does not decode on its own). Testing the ends for backslashes alone would not do:
/// a marker's own newlines are escapes (`\n`), so every marked string has them at an end.
fn ends_marked(body: &str, marker: &str) -> Option<bool> {
    // Each end is decoded from `RAW_PER_BYTE * marker.len()` raw bytes or more, which hold at
    // least `marker.len()` bytes of text; a string shorter than both ends is decoded whole.
    let reach = RAW_PER_BYTE.checked_mul(marker.len())?;
    if body.len() <= 2 * (reach + CUT_SEARCH) {
        return None;
    }
    let head_end = (reach..reach + CUT_SEARCH).find(|&at| is_cut(body, at))?;
    let tail_start = (body.len() - reach - CUT_SEARCH..=body.len() - reach)
        .rev()
        .find(|&at| is_cut(body, at))?;
    let head = decode_piece(body.get(..head_end)?)?;
    let tail = decode_piece(body.get(tail_start..)?)?;
    if head.len() < marker.len() || tail.len() < marker.len() {
        return None;
    }
    Some(head.starts_with(marker) || tail.ends_with(marker))
}

/// True when the JSON string contents `body` can be cut at `at` into two pieces that decode on
/// their own, the text of the whole being the two texts joined. An escape is `\` and one of
/// `"\/bfnrt`, or `\u` and four hex digits: all ASCII, and every byte of one but its last is `\`,
/// `u` or a hex digit. So an ASCII byte before `at` that is none of those ends a literal character
/// or an escape, and a non-ASCII byte is part of a literal character, which ends where a
/// character boundary is. Nor can such a cut part a surrogate pair (`\uD83D\uDE00`): its halves
/// meet after a hex digit. (This misses some cuts, after `\b` or `\\` for instance; a missed cut
/// only means looking one byte further.)
fn is_cut(body: &str, at: usize) -> bool {
    match at.checked_sub(1).and_then(|i| body.as_bytes().get(i)) {
        Some(&c) if c.is_ascii() => c != b'\\' && c != b'u' && !c.is_ascii_hexdigit(),
        Some(_) => body.is_char_boundary(at),
        None => at == 0,
    }
}

/// The text of a piece of JSON string contents cut by [`is_cut`]; `None` when it does not decode
/// (a lone surrogate).
fn decode_piece(piece: &str) -> Option<Cow<'_, str>> {
    if memchr::memchr(b'\\', piece.as_bytes()).is_none() {
        return Some(Cow::Borrowed(piece));
    }
    let mut lit = String::with_capacity(piece.len() + 2);
    lit.push('"');
    lit.push_str(piece);
    lit.push('"');
    serde_json::from_str::<String>(&lit).ok().map(Cow::Owned)
}

/// The `text` value of a part `{"type": text_type, "text": <string>, ...}`.
fn text_of_part<'a>(part: Json<'a>, text_type: &str) -> Option<Json<'a>> {
    if Kind::of(part) != Kind::Object {
        return None;
    }
    json::part_text(&json::object_of_valid(part).ok()?, text_type)
}

/// Python `part == {"type": text_type, "text": text}`: exactly those two keys and values.
fn part_equals(part: Json<'_>, text_type: &str, text: &str) -> bool {
    if Kind::of(part) != Kind::Object {
        return false;
    }
    let Ok(obj) = json::object_of_valid(part) else {
        return false;
    };
    obj.distinct_keys() == 2
        && obj
            .get("type")
            .and_then(json::as_str)
            .is_some_and(|t| t == text_type)
        && obj
            .get("text")
            .and_then(json::as_str)
            .is_some_and(|t| t == text)
}

impl<'p> Injector<'p> {
    fn span(&self, raw: Json<'_>) -> Result<std::ops::Range<usize>, RewriteError> {
        json::span(self.body, raw).ok_or(RewriteError::Internal("value outside the body"))
    }

    /// Marks a string value in place (inside its quotes), unless it starts or ends with the marker.
    fn string(&mut self, raw: Json<'_>) -> Result<(), RewriteError> {
        let span = self.span(raw)?;
        let inner = json_string_inner(self.marker)?;
        if !already_marked(raw, self.marker, &inner) {
            let at = if self.prefix {
                span.start + 1
            } else {
                span.end - 1
            };
            self.edits.push((at..at, inner.into_bytes()));
        }
        Ok(())
    }

    /// Marks the conversation system prompt that occupies the first `n` bytes of a merged system
    /// message (see [`Plan::system_prompt_bytes`]).
    fn merged_system(
        &mut self,
        path: Path,
        raw: Option<Json<'_>>,
        n: usize,
    ) -> Result<(), RewriteError> {
        let mismatch =
            |what: &str| RewriteError::PlanMismatch(format!("`{}` {what}", path.field("content")));
        match raw {
            Some(r) if Kind::of(r) == Kind::String => {
                if self.prefix {
                    return self.string(r);
                }
                let s = json::string(r).map_err(|_| mismatch("is not valid Unicode text"))?;
                if !s.is_char_boundary(n) {
                    return Err(mismatch(&format!(
                        "has no character boundary at system prompt length {n}"
                    )));
                }
                let (head, tail) = s.split_at(n);
                if head.ends_with(self.marker)
                    || tail.starts_with(self.marker)
                    || s.ends_with(self.marker)
                {
                    return Ok(());
                }
                // The text around the cut is re-encoded (serde_json = orjson spelling); the rest of
                // the body is untouched.
                let new = json_string(&format!("{head}{}{tail}", self.marker))?;
                let span = self.span(r)?;
                self.edits.push((span, new.into_bytes()));
                Ok(())
            }
            Some(r) if Kind::of(r) == Kind::Array => {
                let elems = json::array(r).map_err(internal("array of a validated array"))?;
                match elems.first().and_then(|e| text_of_part(*e, self.text_type)) {
                    Some(text) => self.string(text),
                    None => Err(mismatch(
                        "does not start with a text part holding the system prompt",
                    )),
                }
            }
            _ => self.content(path, raw),
        }
    }

    /// Marks an array of content parts / blocks according to [`ListParts`].
    fn parts(&mut self, raw: Json<'_>) -> Result<(), RewriteError> {
        let elems = json::array(raw).map_err(internal("array of a validated array"))?;
        match self.list_parts {
            ListParts::OwnPart => {
                let stripped = self.marker.trim();
                let present = match (elems.first(), elems.last()) {
                    (Some(first), Some(last)) => {
                        part_equals(*first, self.text_type, stripped)
                            || part_equals(*last, self.text_type, stripped)
                    }
                    _ => false,
                };
                if !present {
                    self.insert_part(raw, &elems, stripped, self.prefix)?;
                }
                Ok(())
            }
            ListParts::InlineText => {
                if let Some(text) = elems.iter().find_map(|e| text_of_part(*e, self.text_type)) {
                    return self.string(text);
                }
                self.insert_part(raw, &elems, self.marker, true)
            }
        }
    }

    fn insert_part(
        &mut self,
        array: Json<'_>,
        elems: &[Json<'_>],
        text: &str,
        first: bool,
    ) -> Result<(), RewriteError> {
        let part = format!(
            r#"{{"type":{},"text":{}}}"#,
            json_string(self.text_type)?,
            json_string(text)?
        );
        let (at, bytes) = match (elems.first(), elems.last()) {
            (Some(head), Some(tail)) => {
                if first {
                    (self.span(*head)?.start, part + ",")
                } else {
                    (self.span(*tail)?.end, format!(",{part}"))
                }
            }
            _ => (self.span(array)?.start + 1, part),
        };
        self.edits.push((at..at, bytes.into_bytes()));
        Ok(())
    }

    /// Marks the content of the message the rule chose.
    fn content(&mut self, path: Path, raw: Option<Json<'_>>) -> Result<(), RewriteError> {
        match raw {
            Some(r) if Kind::of(r) == Kind::String => self.string(r),
            Some(r) if Kind::of(r) == Kind::Array => self.parts(r),
            _ => Err(RewriteError::ContentType {
                path: path.field("content").to_string(),
                found: found(raw),
            }),
        }
    }

    /// How long the body is with the edits made.
    fn out_len(&self) -> usize {
        self.edits
            .iter()
            .fold(self.body.len(), |n, (range, bytes)| {
                n.saturating_add(bytes.len()).saturating_sub(range.len())
            })
    }

    /// The body with the edits made, and `layout` (of the body) moved onto it.
    fn finish(mut self, layout: Option<&mut Layout>) -> Option<Vec<u8>> {
        if self.edits.is_empty() {
            return None;
        }
        // Edits never overlap: each is inside a different value, or an insertion between values.
        let out = json::splice(self.body, &mut self.edits)?;
        if let Some(layout) = layout {
            layout.shift(&self.edits);
        }
        Some(out)
    }
}

impl<'a> Parsed<'a> {
    /// The shape this body was parsed as.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The body's top-level `user` string (OpenAI's end-user id), for session identity.
    pub fn user_field(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// A chat body read through the [`Layout`] an earlier step made of these very bytes, without
    /// parsing them: what [`parse`] would give. `None` when the layout cannot stand for a parse
    /// (another shape, or `messages` not known to be an array): the caller parses.
    pub(crate) fn from_layout(shape: Shape, body: &'a [u8], layout: &Layout) -> Option<Self> {
        if shape != Shape::Chat {
            return None;
        }
        let messages = layout
            .items()?
            .iter()
            .map(|r| Json::at(body, r.clone()))
            .collect::<Option<Vec<_>>>()?;
        let user = match layout.get("user") {
            Some(r) => json::as_str(Json::at(body, r)?),
            None => None,
        };
        Some(Parsed {
            body,
            shape,
            user,
            view: View::Chat { messages },
            first_user: OnceCell::new(),
        })
    }

    /// Applies `plan`. `Target::None` or an empty marker changes nothing. Idempotent: applying
    /// the same plan to the output changes nothing more.
    pub fn apply(&self, plan: &Plan) -> Result<Outcome, RewriteError> {
        self.apply_shifting(plan, None)
    }

    /// [`Parsed::apply`], moving `layout` (of this body) onto the rewritten body.
    pub(crate) fn apply_shifting(
        &self,
        plan: &Plan,
        layout: Option<&mut Layout>,
    ) -> Result<Outcome, RewriteError> {
        let admit = |_: usize| Ok::<(), std::convert::Infallible>(());
        match self.apply_admitting(plan, layout, admit)? {
            Ok(o) => Ok(o),
            Err(never) => match never {},
        }
    }

    /// [`Parsed::apply_shifting`] that asks `admit` with the rewritten body's length before
    /// building it, so the caller can refuse a body too large (or charge memory for it) before
    /// the memory is taken; `admit`'s refusal is the inner error.
    pub(crate) fn apply_admitting<E>(
        &self,
        plan: &Plan,
        layout: Option<&mut Layout>,
        admit: impl FnOnce(usize) -> Result<(), E>,
    ) -> Result<Result<Outcome, E>, RewriteError> {
        let Some((inj, location)) = self.injector(plan)? else {
            return Ok(Ok(Outcome {
                body: None,
                location: None,
            }));
        };
        if !inj.edits.is_empty() {
            if let Err(e) = admit(inj.out_len()) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(Outcome {
            body: inj.finish(layout),
            location,
        }))
    }

    /// The edits [`Parsed::apply_admitting`] would make, not made: each a range of the body and
    /// the bytes that replace it (an empty range: an insertion), in no particular order and
    /// never overlapping, and where the marker is. For a caller that splices as the body goes.
    pub(crate) fn plan_edits(
        &self,
        plan: &Plan,
    ) -> Result<(Vec<Edit>, Option<Location>), RewriteError> {
        Ok(match self.injector(plan)? {
            Some((inj, location)) => (inj.edits, location),
            None => (Vec::new(), None),
        })
    }

    /// The injector with the plan's edits collected, and where the marker is; `None` for an
    /// empty plan.
    fn injector<'p>(
        &'p self,
        plan: &Plan<'p>,
    ) -> Result<Option<(Injector<'p>, Option<Location>)>, RewriteError> {
        if plan.target.is_none() || plan.marker.is_empty() {
            return Ok(None);
        }
        let mut inj = Injector {
            body: self.body,
            marker: plan.marker,
            prefix: plan.target.is_prefix(),
            list_parts: plan.list_parts,
            text_type: self.shape.text_part_type(),
            max_prompts: plan.max_prompts,
            edits: Vec::new(),
        };
        let skip = plan.user_context_messages;
        let location = if plan.target.is_system() {
            if self.mark_system(&mut inj, plan)? {
                Some(Location::System)
            } else if self.mark_first_user(&mut inj, skip)? {
                Some(Location::Fallthrough)
            } else {
                None
            }
        } else if self.mark_first_user(&mut inj, skip)? {
            Some(Location::FirstUser)
        } else {
            None
        };
        Ok(Some((inj, location)))
    }

    /// Marks the system prompt; false when the body has none.
    fn mark_system(&self, inj: &mut Injector<'_>, plan: &Plan) -> Result<bool, RewriteError> {
        match &self.view {
            View::Chat { messages } => match leading_system("messages", messages)? {
                Some(m) => {
                    let path = Path::top("messages").at(m.index);
                    match plan.system_prompt_bytes {
                        Some(n) => inj.merged_system(path, m.obj.get("content"), n)?,
                        None => inj.content(path, m.obj.get("content"))?,
                    }
                    Ok(true)
                }
                None => Ok(false),
            },
            View::Messages { system, .. } => match system {
                Some(s) => {
                    inj.content(Path::top("system"), Some(*s))?;
                    Ok(true)
                }
                None => Ok(false),
            },
            View::Responses {
                instructions,
                input,
                ..
            } => {
                if let Some(i) = instructions {
                    inj.string(*i)?;
                    return Ok(true);
                }
                if let Input::Items(items) = input {
                    if let Some(m) = leading_system("input", items)? {
                        inj.content(Path::top("input").at(m.index), m.obj.get("content"))?;
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            View::Completions { .. } => Ok(false),
        }
    }

    /// Marks the first user turn; false when there is none.
    fn mark_first_user(&self, inj: &mut Injector<'_>, skip: usize) -> Result<bool, RewriteError> {
        match &self.view {
            View::Chat { messages } | View::Messages { messages, .. } => {
                match self.first_user("messages", messages, skip)? {
                    Some((index, content)) => {
                        inj.content(Path::top("messages").at(index), content)?;
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
            View::Responses {
                input, stateful, ..
            } => {
                if *stateful {
                    return Ok(false);
                }
                match input {
                    Input::Absent => Ok(false),
                    Input::Text(t) => {
                        if skip > 0 {
                            return Ok(false);
                        }
                        inj.string(*t)?;
                        Ok(true)
                    }
                    Input::Items(items) => match self.first_user("input", items, skip)? {
                        Some((index, content)) => {
                            inj.content(Path::top("input").at(index), content)?;
                            Ok(true)
                        }
                        None => Ok(false),
                    },
                }
            }
            View::Completions { prompt } => {
                if Kind::of(*prompt) == Kind::String {
                    inj.string(*prompt)?;
                    return Ok(true);
                }
                let (elems, more) = json::array_head(*prompt, inj.max_prompts)
                    .map_err(internal("array of prompt"))?;
                if more {
                    return Err(RewriteError::TooManyPrompts {
                        limit: inj.max_prompts,
                    });
                }
                for (i, e) in elems.iter().enumerate() {
                    if Kind::of(*e) != Kind::String {
                        return Err(RewriteError::PromptType {
                            path: Path::top("prompt").at(i).to_string(),
                            found: found(Some(*e)),
                        });
                    }
                    inj.string(*e)?;
                }
                Ok(!elems.is_empty())
            }
        }
    }

    /// [`nth_user`]'s index and `content`, from the body's one conversation (`root`: `items`),
    /// read once and kept. An error is not kept: asking again gives it again.
    fn first_user(
        &self,
        root: &'static str,
        items: &[Json<'a>],
        skip: usize,
    ) -> Result<Option<(usize, Option<Json<'a>>)>, RewriteError> {
        if let Some(kept) = self.first_user.get().filter(|k| k.skip == skip) {
            return Ok(kept.found);
        }
        let found = nth_user(root, items, skip)?.map(|m| (m.index, m.obj.get("content")));
        // Already set means another `skip` was kept first; that one stays.
        let _ = self.first_user.set(FirstUser { skip, found });
        Ok(found)
    }

    /// The content of the first user turn (after `user_context_messages`), as the first-user
    /// rule would choose it. For completions, the first prompt string.
    fn first_user_content(&self, skip: usize) -> Result<Option<Json<'a>>, RewriteError> {
        Ok(match &self.view {
            View::Chat { messages } | View::Messages { messages, .. } => self
                .first_user("messages", messages, skip)?
                .and_then(|(_, content)| content),
            View::Responses {
                input, stateful, ..
            } => match input {
                _ if *stateful => None,
                Input::Absent => None,
                Input::Text(t) => (skip == 0).then_some(*t),
                Input::Items(items) => self
                    .first_user("input", items, skip)?
                    .and_then(|(_, content)| content),
            },
            View::Completions { prompt } => match Kind::of(*prompt) {
                Kind::String => Some(*prompt),
                _ => json::array_head(*prompt, 1)
                    .map_err(internal("array of prompt"))?
                    .0
                    .first()
                    .copied(),
            },
        })
    }

    /// A stable hash (16 lowercase hex of SHA-256) of the first user turn's content in its
    /// *unmarked* form, for session identity when no header names the session. A marked and an
    /// unmarked copy of the same turn hash the same, whichever [`ListParts`] rule marked it and
    /// however many markers are stacked: a string is hashed as [`unmarked`] (every
    /// `[rid:<12 hex>]` and `[warmup]` out, any digest, since the hash is taken before the
    /// session's marker is known; newlines at the ends trimmed); in a list of parts every text
    /// part (`{"type":"text"|"input_text","text":…}`) that is empty once unmarked is dropped (a
    /// marker part, stripped or full, or an empty part the inline rule marked), and every other
    /// text part's string is taken unmarked. Parts are hashed in a canonical JSON form (sorted
    /// keys, compact). `None` when there is no first user turn, its content is neither a string
    /// nor an array, or the body is a stateful Responses request.
    pub fn first_user_turn_hash(&self, user_context_messages: usize) -> Option<String> {
        let content = self.first_user_content(user_context_messages).ok()??;
        first_turns::hash(content.get(), || Self::content_hash(content))
    }

    /// The hash of a first user turn's `content` (its raw JSON), as [`Self::first_user_turn_hash`]
    /// describes it.
    fn content_hash(content: Json<'_>) -> Option<String> {
        let mut h = Sha256::new();
        h.update(b"kvbust-first-user-turn-v1\0");
        match Kind::of(content) {
            Kind::String => {
                h.update(b"s\0");
                hash_unmarked_string(&mut h, content)?;
            }
            Kind::Array => {
                let serde_json::Value::Array(mut parts) =
                    serde_json::from_str::<serde_json::Value>(content.get()).ok()?
                else {
                    return None;
                };
                unmark_parts(&mut parts);
                let mut canon = String::with_capacity(content.get().len());
                canonical(&serde_json::Value::Array(parts), &mut canon);
                h.update(b"p\0");
                h.update(canon.as_bytes());
            }
            _ => return None,
        }
        let digest = h.finalize();
        Some(hex::encode(&digest[..8]))
    }
}

/// Feeds `h` the [`unmarked`] text of the string `raw`; `None` when it is not decodable as text
/// (a lone surrogate escape). The text is decoded into a buffer this thread keeps, not a new
/// allocation per turn (a first turn is often hundreds of KB), and hashed where it lies.
fn hash_unmarked_string(h: &mut Sha256, raw: Json<'_>) -> Option<()> {
    thread_local! {
        static TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    /// A buffer grown past this is let go after use, so one huge turn does not stay held.
    const KEEP: usize = 4 << 20;
    let lit = raw.get();
    let contents = lit.get(1..lit.len().saturating_sub(1))?;
    if memchr::memchr(b'\\', contents.as_bytes()).is_none() {
        h.update(unmarked(contents).as_bytes());
        return Some(());
    }
    let hashed = TEXT.try_with(|text| {
        // A reentrant call (there is none) would find the buffer taken: it decodes apart.
        let Ok(mut text) = text.try_borrow_mut() else {
            return None;
        };
        let out = decode_string(contents, &mut text).map(|()| h.update(unmarked(&text).as_bytes()));
        if text.capacity() > KEEP {
            *text = String::new();
        }
        Some(out)
    });
    match hashed {
        Ok(Some(out)) => out,
        _ => {
            let mut text = String::new();
            decode_string(contents, &mut text)?;
            h.update(unmarked(&text).as_bytes());
            Some(())
        }
    }
}

/// Decodes validated JSON string contents (between the quotes) into `out`, as serde_json does;
/// `None` on a lone surrogate escape, which serde refuses as text too. The caller's contents come
/// from a parsed body, so their escapes are well formed and they hold no control character; a
/// malformed escape gives `None` all the same.
fn decode_string(contents: &str, out: &mut String) -> Option<()> {
    out.clear();
    out.reserve(contents.len());
    let b = contents.as_bytes();
    let mut at = 0;
    while let Some(k) = memchr::memchr(b'\\', b.get(at..)?) {
        let esc = at + k;
        out.push_str(contents.get(at..esc)?);
        let (c, len) = match *b.get(esc + 1)? {
            b'"' => ('"', 2),
            b'\\' => ('\\', 2),
            b'/' => ('/', 2),
            b'b' => ('\u{8}', 2),
            b'f' => ('\u{c}', 2),
            b'n' => ('\n', 2),
            b'r' => ('\r', 2),
            b't' => ('\t', 2),
            b'u' => unicode_escape(b, esc)?,
            _ => return None,
        };
        out.push(c);
        at = esc + len;
    }
    out.push_str(contents.get(at..)?);
    Some(())
}

/// The character of the `\uXXXX` escape at `esc` (with its low half when it is a high
/// surrogate) and how many bytes it spans; `None` for a lone surrogate.
fn unicode_escape(b: &[u8], esc: usize) -> Option<(char, usize)> {
    let hex4 = |at: usize| -> Option<u32> {
        let digits = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
        if !digits.bytes().all(|d| d.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(digits, 16).ok()
    };
    let hi = hex4(esc + 2)?;
    match hi {
        0xD800..=0xDBFF => {
            if b.get(esc + 6..esc + 8)? != b"\\u" {
                return None;
            }
            let lo = hex4(esc + 8)?;
            if !(0xDC00..=0xDFFF).contains(&lo) {
                return None;
            }
            let c = char::from_u32(0x1_0000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?;
            Some((c, 12))
        }
        _ => Some((char::from_u32(hi)?, 6)),
    }
}

fn text_part_mut(part: &mut serde_json::Value) -> Option<&mut String> {
    let obj = part.as_object_mut()?;
    if !matches!(
        obj.get("type").and_then(|t| t.as_str()),
        Some("text" | "input_text")
    ) {
        return None;
    }
    match obj.get_mut("text") {
        Some(serde_json::Value::String(s)) => Some(s),
        _ => None,
    }
}

/// A text part with no text once markers are off ([`unmarked`]): a marker part (own-part rule),
/// the part `inline_text` adds when there is no text part, an empty text part `inline_text`
/// marked (it is then nothing but the marker), or an empty text part.
fn is_blank_text_part(part: &mut serde_json::Value) -> bool {
    text_part_mut(part).is_some_and(|s| unmarked(s).is_empty())
}

/// The unmarked form of a first turn's parts. Blank text parts are dropped wherever they are,
/// because AIPerf's inline rule gives `[{"type":"text","text":""}, img]` and `[img]` the same
/// marked form `[{"type":"text","text":"[warmup]\n\n"}, img]`: both unmarked turns must hash as
/// it does. (An empty text part carries no prompt; AIPerf never renders one.) Every other text
/// part is taken as [`unmarked`], whatever its type: the inline rule marks the first part of the
/// shape's own type, which need not be the first text part (`input_text` before an Anthropic
/// `text` part, issue 23 item 11), and a part no rule marked is the same either way.
fn unmark_parts(parts: &mut Vec<serde_json::Value>) {
    parts.retain_mut(|p| !is_blank_text_part(p));
    for s in parts.iter_mut().filter_map(text_part_mut) {
        if let Cow::Owned(u) = unmarked(s) {
            *s = u;
        } else {
            let u = unmarked(s).into_owned();
            if u.len() != s.len() {
                *s = u;
            }
        }
    }
}

/// Compact JSON with object keys sorted (independent of serde_json's `preserve_order`).
fn canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(x) = m.get(k) {
                    canonical(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The first user turns this thread hashed last, and their hashes. A conversation sends its first
/// user turn again with every turn, and the hash (decode, strip markers, SHA-256) is most of what
/// marking a body costs; a turn seen again is compared byte for byte with the one kept, so a hit
/// is exactly the hash the turn would get. Per thread (each data worker has one), so no lock.
/// Agentic first turns are long (hundreds of KB to a few MB), so what is kept is bounded by a
/// byte budget as well as a count, the least recently used turn going first.
mod first_turns {
    use std::cell::RefCell;
    use std::collections::VecDeque;

    /// Turns kept per thread at most.
    pub(super) const ENTRIES: usize = 8;
    /// Bytes of kept turns per thread at most; a longer turn is hashed every time.
    pub(super) const BUDGET: usize = 4 << 20;

    /// A kept turn: its raw JSON and its hash.
    type Entry = (Box<str>, String);

    /// Turns most recently used first, and the sum of their lengths.
    #[derive(Default)]
    pub(super) struct Kept {
        turns: VecDeque<Entry>,
        bytes: usize,
    }

    impl Kept {
        /// The hash kept for `content`, which becomes the most recently used.
        fn get(&mut self, content: &str) -> Option<String> {
            let i = self.turns.iter().position(|(turn, _)| &**turn == content)?;
            let entry = self.turns.remove(i)?;
            let digest = entry.1.clone();
            self.turns.push_front(entry);
            Some(digest)
        }

        /// Keeps `content`'s hash, letting the least recently used turns go until it fits.
        fn put(&mut self, content: &str, digest: String) {
            if content.len() > BUDGET {
                return;
            }
            while self.turns.len() >= ENTRIES || self.bytes + content.len() > BUDGET {
                match self.turns.pop_back() {
                    Some((turn, _)) => self.bytes -= turn.len(),
                    None => break,
                }
            }
            self.bytes += content.len();
            self.turns.push_front((content.into(), digest));
        }

        /// The kept turns' lengths, most recently used first, and their sum.
        #[cfg(test)]
        pub(super) fn lengths(&self) -> (Vec<usize>, usize) {
            (
                self.turns.iter().map(|(t, _)| t.len()).collect(),
                self.bytes,
            )
        }
    }

    thread_local! {
        static KEPT: RefCell<Kept> = RefCell::new(Kept::default());
    }

    /// The hash of `content` (a turn's raw JSON): kept, or `compute`d and kept.
    pub(super) fn hash(content: &str, compute: impl FnOnce() -> Option<String>) -> Option<String> {
        if content.len() > BUDGET {
            return compute();
        }
        if let Ok(Some(digest)) = KEPT.try_with(|kept| kept.borrow_mut().get(content)) {
            return Some(digest);
        }
        let digest = compute()?;
        let _ = KEPT.try_with(|kept| kept.borrow_mut().put(content, digest.clone()));
        Some(digest)
    }

    /// This thread's kept turns, for tests.
    #[cfg(test)]
    pub(super) fn with_kept<T>(f: impl FnOnce(&Kept) -> T) -> T {
        KEPT.with(|kept| f(&kept.borrow()))
    }
}
