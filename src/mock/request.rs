//! The request model every mock API shape parses into ([`GenRequest`]: endpoint, model, prompt,
//! limits, streaming), the error every shape answers with ([`ApiError`]), the JSON field helpers
//! the shapes' parsers share, and the token accounting ([`Usage`]) every shape reports. Owns no
//! shape of its own: `openai`, `responses` and `anthropic` each import this and never each other
//! (the dispatch by route is `openai::parse_request`'s). Never panics on any input.

use bytes::Bytes;
use http::StatusCode;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::api::Shape;
use minijinja::Value as JinjaValue;

/// One chat message as the chat template sees it: a role, its text, and what else vLLM hands
/// the template (chat completions' tool calls, names, reasoning).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`.
    pub role: String,
    /// The message's text (text parts joined by newlines).
    pub content: String,
    /// `None`: nothing beyond role and content.
    pub extra: Option<Box<MessageExtra>>,
}

impl Message {
    /// A message of `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            extra: None,
        }
    }
}

/// What vLLM hands a message's template beyond role and content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageExtra {
    /// `name`, when a string.
    pub name: Option<String>,
    /// An assistant's `tool_calls`, each `function.arguments` already an object.
    pub tool_calls: Option<JinjaValue>,
    /// A tool message's `tool_call_id`.
    pub tool_call_id: Option<JinjaValue>,
    /// An assistant's `reasoning` (or `reasoning_content`).
    pub reasoning: Option<JinjaValue>,
}

/// The request-level fields the chat template sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatOptions {
    /// `tools`, each as `model_dump()` writes it; `None` without.
    pub tools: Option<JinjaValue>,
    /// The template's other variables: `chat_template_kwargs` with the body's own fields
    /// merged in (minus those transformers keeps for itself).
    pub kwargs: Vec<(String, JinjaValue)>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// Whether the tokenizer adds its special tokens (a BOS) to the rendered text.
    pub add_special_tokens: bool,
}

/// What a chat prompt is rendered with when the body set nothing (the responses and messages
/// routes, and tests).
pub static PLAIN: ChatOptions = ChatOptions {
    tools: None,
    kwargs: Vec::new(),
    add_generation_prompt: true,
    continue_final_message: false,
    add_special_tokens: false,
};

/// A chat-completions prompt: its messages and the request's template fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chat {
    pub messages: Vec<Message>,
    pub options: ChatOptions,
}

/// What is tokenized for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Chat-shaped routes (responses, messages): rendered through the tokenizer's chat template, as vLLM
    /// does, then tokenized without adding special tokens.
    Messages(Vec<Message>),
    /// `/v1/chat/completions`: the messages with the body's template fields (tools, kwargs, flags).
    Chat(Box<Chat>),
    /// `/v1/completions`: text tokenized with the tokenizer's special tokens (as vLLM does), or token ids as
    /// they are.
    Raw(Vec<PromptPart>),
}

impl Prompt {
    /// A chat prompt's messages and template fields (the defaults for `Messages`); `None` for
    /// completions.
    pub fn chat(&self) -> Option<(&[Message], &ChatOptions)> {
        match self {
            Prompt::Messages(m) => Some((m, &PLAIN)),
            Prompt::Chat(c) => Some((&c.messages, &c.options)),
            Prompt::Raw(_) => None,
        }
    }

    /// A chat prompt's messages.
    pub fn messages(&self) -> Option<&[Message]> {
        self.chat().map(|(m, _)| m)
    }
}

/// A piece of prompt: text to tokenize, or token ids given directly (`/v1/completions` accepts both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptPart {
    /// Text to tokenize.
    Text(String),
    /// Token ids taken as they are.
    Tokens(Vec<u32>),
}

/// What a completion request asks the mock for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenRequest {
    /// The route.
    pub endpoint: Shape,
    /// The model to report: the request's `model`, else the configured one.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// The output limit the request set (`max_completion_tokens`/`max_tokens`, `max_output_tokens`); `None`
    /// when it set none.
    pub max_tokens: Option<u32>,
    /// `/v1/responses`: the request's `instructions`, echoed in the response object.
    pub instructions: Option<Value>,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `cache_salt` (chat, completions, Responses), checked as vLLM checks it: it joins the
    /// hash of the prompt's first block ([`super::prefix_cache::chain_salted`]).
    pub cache_salt: Option<String>,
}

/// An error answered in the OpenAI shape `{"error": {"message", "type", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message a user can act on.
    pub message: String,
    /// OpenAI error `type`.
    pub kind: &'static str,
    /// Machine-readable `code`.
    pub code: &'static str,
}

impl ApiError {
    /// 400 `invalid_request_error` with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            code,
        }
    }

    /// The OpenAI-shaped JSON body.
    pub fn body(&self) -> Bytes {
        let v = json!({"error": {"message": self.message, "type": self.kind, "code": self.code}});
        Bytes::from(v.to_string())
    }

    /// The body in the shape of `endpoint`'s API: Anthropic's `{"type":"error","error":{"type","message"}}`
    /// on `/v1/messages`, OpenAI's everywhere else.
    pub fn body_for(&self, endpoint: Option<Shape>) -> Bytes {
        if endpoint == Some(Shape::Messages) {
            let v = json!({"type": "error", "error": {"type": self.kind, "message": self.message}});
            return Bytes::from(v.to_string());
        }
        self.body()
    }
}

/// vLLM 0.33's longest `cache_salt`, in characters.
const MAX_CACHE_SALT_CHARS: usize = 128;

/// The request's `cache_salt`, refused as vLLM 0.33's `validate_cache_salt` refuses it, with its
/// messages and a 400: not a non-empty string (a list too, which SGLang's type would take: the
/// mock follows vLLM), more than 128 characters, or one of `@ / \` or NUL. `null` is absent.
pub(crate) fn cache_salt(obj: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    let Some(v) = field(obj, "cache_salt") else {
        return Ok(None);
    };
    let salt = match v.as_str() {
        Some(s) if !s.is_empty() => s,
        _ => {
            return Err(ApiError::bad_request(
                "invalid_cache_salt",
                "Parameter 'cache_salt' must be a non-empty string if provided.",
            ))
        }
    };
    if salt.chars().count() > MAX_CACHE_SALT_CHARS
        || salt.chars().any(|c| matches!(c, '@' | '/' | '\\' | '\0'))
    {
        return Err(ApiError::bad_request(
            "invalid_cache_salt",
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', \
             '/', '\\\\', or NUL.",
        ));
    }
    Ok(Some(salt.to_string()))
}

pub(crate) fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

pub(crate) fn opt_bool(obj: &Map<String, Value>, key: &str, path: &str) -> Result<bool, ApiError> {
    match field(obj, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::bad_request(
            "invalid_type",
            format!("`{path}` must be a boolean, got {other}"),
        )),
    }
}

/// The first of `keys` that is set, as a token count of at least 1.
pub(crate) fn max_tokens(obj: &Map<String, Value>, keys: &[&str]) -> Result<Option<u32>, ApiError> {
    for &key in keys {
        if let Some(v) = field(obj, key) {
            return match v.as_u64() {
                Some(n) if n >= 1 => Ok(Some(u32::try_from(n).unwrap_or(u32::MAX))),
                _ => Err(ApiError::bad_request(
                    "invalid_value",
                    format!("`{key}` must be an integer of at least 1, got {v}"),
                )),
            };
        }
    }
    Ok(None)
}

/// Text parts joined by newlines; non-text parts (images, audio) carry no text to count.
pub(crate) fn parts_text(parts: &[Value]) -> String {
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    texts.join("\n")
}

/// A message `content`: a string, a list of parts (see [`parts_text`]) or null; `path` names it in errors.
pub(crate) fn content_text(content: Option<&Value>, path: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => Ok(parts_text(parts)),
        Some(other) => Err(ApiError::bad_request(
            "invalid_type",
            format!("`{path}` must be a string, a list of content parts or null, got {other}"),
        )),
    }
}

/// The request's `model`, else `default_model`.
pub(crate) fn model(obj: &Map<String, Value>, default_model: &str) -> Result<String, ApiError> {
    match field(obj, "model") {
        None => Ok(default_model.to_owned()),
        Some(Value::String(m)) => Ok(m.clone()),
        Some(other) => Err(ApiError::bad_request(
            "invalid_type",
            format!("`model` must be a string, got {other}"),
        )),
    }
}

fn invalid_json(e: serde_json::Error) -> ApiError {
    ApiError::bad_request(
        "invalid_json",
        format!("The request body is not valid JSON: {e}"),
    )
}

/// A body's other members as values, and the raw text of those asked for.
pub(crate) type WithRaws<'a, const N: usize> = (Map<String, Value>, [Option<&'a RawValue>; N]);

/// [`json_object`] with the members `names` left as their raw text (in the order of
/// `names`): a chat's `messages`, the bulk of a long body, and the members whose key order
/// must survive (a chat's `tools`: a value's map sorts its keys). The other members become
/// values; the caller reads the list's elements one at a time, so a long chat never becomes
/// one tree of values (a 64 MB chat's tree was most of the mock's memory for it). The same
/// checks, errors and last-member-wins as [`json_object`].
pub(crate) fn json_object_with_raws<'a, const N: usize>(
    body: &'a [u8],
    names: [&str; N],
) -> Result<WithRaws<'a, N>, ApiError> {
    super::bounds::check(body).map_err(|e| ApiError::bad_request(e.code, e.message))?;
    // A body that is an object from its first byte (any client's) has its members read in one
    // pass; any other, or one that pass refuses, is read as before, so its error is worded as
    // before (not an object, or where the JSON breaks).
    let one_pass = match body.first() {
        Some(b'{') => serde_json::from_slice(body).ok(),
        _ => None,
    };
    let members: std::collections::BTreeMap<String, &RawValue> = match one_pass {
        Some(members) => members,
        None => {
            let top: &RawValue = serde_json::from_slice(body).map_err(invalid_json)?;
            if !top.get().starts_with('{') {
                return Err(not_an_object());
            }
            serde_json::from_str(top.get()).map_err(invalid_json)?
        }
    };
    let mut obj = Map::new();
    let mut raw = [None; N];
    for (key, value) in members {
        if let Some(i) = names.iter().position(|n| *n == key) {
            raw[i] = Some(value);
        } else {
            obj.insert(
                key,
                serde_json::from_str(value.get()).map_err(invalid_json)?,
            );
        }
    }
    Ok((obj, raw))
}

fn not_an_object() -> ApiError {
    ApiError::bad_request("invalid_json", "The request body must be a JSON object")
}

/// The body as a JSON object, once its element counts are within [`super::bounds`] (checked
/// before anything is built: a body past them is a 400 naming the list, its count and the limit).
pub(crate) fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    super::bounds::check(body).map_err(|e| ApiError::bad_request(e.code, e.message))?;
    let value: Value = serde_json::from_slice(body).map_err(invalid_json)?;
    match value {
        Value::Object(obj) => Ok(obj),
        _ => Err(not_an_object()),
    }
}

/// Token accounting reported in `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Completion tokens.
    pub completion_tokens: usize,
    /// Prompt tokens served from the simulated prefix cache.
    pub cached_tokens: usize,
    /// Prompt tokens this request newly wrote to the simulated prefix cache (its full blocks that were not
    /// cached): Anthropic's `cache_creation_input_tokens`, OpenAI Responses' `cache_write_tokens`.
    pub cache_written: usize,
}

impl Usage {
    /// The `usage` object.
    pub fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}
