//! OpenAI chat/completions wire shapes for the mock, and the request model every shape parses into: parsing a
//! request into a [`GenRequest`] (dispatching `/v1/responses` and `/v1/messages` to their modules), building
//! chat/completions bodies and SSE events, and error bodies in the route's shape. Owns only JSON in and out; it
//! never sleeps, never touches the prefix cache or the network, and never panics on any input.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Map, Value};

/// Which generation route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/responses` (OpenAI Responses API)
    Responses,
    /// `POST /v1/messages` (Anthropic Messages API)
    Messages,
}

/// One chat message as the chat template sees it: a role and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`.
    pub role: String,
    /// The message's text (text parts joined by newlines).
    pub content: String,
}

impl Message {
    /// A message of `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// What is tokenized for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Chat-shaped routes (chat, responses, messages): rendered through the tokenizer's chat template, as vLLM
    /// does, then tokenized without adding special tokens.
    Messages(Vec<Message>),
    /// `/v1/completions`: text tokenized with the tokenizer's special tokens (as vLLM does), or token ids as
    /// they are.
    Raw(Vec<PromptPart>),
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
    pub endpoint: Endpoint,
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
    pub fn body_for(&self, endpoint: Option<Endpoint>) -> Bytes {
        if endpoint == Some(Endpoint::Messages) {
            let v = json!({"type": "error", "error": {"type": self.kind, "message": self.message}});
            return Bytes::from(v.to_string());
        }
        self.body()
    }
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

/// The body as a JSON object.
pub(crate) fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            format!("The request body is not valid JSON: {e}"),
        )
    })?;
    match value {
        Value::Object(obj) => Ok(obj),
        _ => Err(ApiError::bad_request(
            "invalid_json",
            "The request body must be a JSON object",
        )),
    }
}

fn chat_prompt(obj: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let Some(Value::Array(messages)) = field(obj, "messages") else {
        return Err(ApiError::bad_request(
            "missing_messages",
            "`messages` must be a non-empty list of messages",
        ));
    };
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "missing_messages",
            "`messages` must be a non-empty list of messages",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(ApiError::bad_request(
                "invalid_message",
                format!("`messages[{i}].role` must be a string"),
            ));
        };
        let content = content_text(m.get("content"), &format!("messages[{i}].content"))?;
        out.push(Message::new(role, content));
    }
    Ok(out)
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn completion_prompt(obj: &Map<String, Value>) -> Result<Vec<PromptPart>, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "invalid_prompt",
            "`prompt` must be a string, a list of strings, a list of token ids or a list of token-id lists",
        )
    };
    match field(obj, "prompt") {
        Some(Value::String(s)) => Ok(vec![PromptPart::Text(s.clone())]),
        Some(Value::Array(items)) if !items.is_empty() => {
            if items.iter().all(Value::is_number) {
                return token_ids(items)
                    .map(|t| vec![PromptPart::Tokens(t)])
                    .ok_or_else(bad);
            }
            items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(PromptPart::Text(s.clone())),
                    Value::Array(ids) => token_ids(ids).map(PromptPart::Tokens).ok_or_else(bad),
                    _ => Err(bad()),
                })
                .collect()
        }
        _ => Err(bad()),
    }
}

/// Parses a completion request body. `default_model` is used when the request names no model.
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    default_model: &str,
) -> Result<GenRequest, ApiError> {
    match endpoint {
        Endpoint::Responses => return super::responses::parse_request(body, default_model),
        Endpoint::Messages => return super::anthropic::parse_request(body, default_model),
        Endpoint::Chat | Endpoint::Completions => {}
    }
    let obj = json_object(body)?;
    let model = model(&obj, default_model)?;
    if let Some(n) = field(&obj, "n") {
        if n.as_u64() != Some(1) {
            return Err(ApiError::bad_request(
                "unsupported_value",
                format!("the mock supports only `n` = 1, got {n}"),
            ));
        }
    }
    let prompt = match endpoint {
        Endpoint::Completions => Prompt::Raw(completion_prompt(&obj)?),
        _ => Prompt::Messages(chat_prompt(&obj)?),
    };
    let stream = opt_bool(&obj, "stream", "stream")?;
    let include_usage = match field(&obj, "stream_options") {
        None => false,
        Some(Value::Object(opts)) => {
            opt_bool(opts, "include_usage", "stream_options.include_usage")?
        }
        Some(other) => {
            return Err(ApiError::bad_request(
                "invalid_type",
                format!("`stream_options` must be an object, got {other}"),
            ))
        }
    };
    Ok(GenRequest {
        endpoint,
        model,
        prompt,
        max_tokens: max_tokens(&obj, &["max_completion_tokens", "max_tokens"])?,
        instructions: None,
        stream,
        include_usage,
    })
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

/// Identity of one response, shared by all its chunks.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// The route.
    pub endpoint: Endpoint,
    /// `id`.
    pub id: String,
    /// `created`.
    pub created: u64,
    /// `model`.
    pub model: String,
    /// Whether every chunk carries `"usage": null` and a usage chunk follows the finish chunk.
    pub include_usage: bool,
}

/// The non-streaming response body.
pub fn full_response(meta: &ResponseMeta, text: &str, usage: &Usage) -> Bytes {
    let choice = match meta.endpoint {
        Endpoint::Completions => {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"})
        }
        _ => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": "length",
        }),
    };
    let object = match meta.endpoint {
        Endpoint::Completions => "text_completion",
        _ => "chat.completion",
    };
    let v = json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage.json(),
    });
    Bytes::from(v.to_string())
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn chunk(meta: &ResponseMeta, choices: Value, usage: Option<Value>) -> Bytes {
    let object = match meta.endpoint {
        Endpoint::Completions => "text_completion",
        _ => "chat.completion.chunk",
    };
    let mut v = json!({"id": meta.id, "object": object, "created": meta.created, "model": meta.model, "choices": choices});
    if meta.include_usage {
        v["usage"] = usage.unwrap_or(Value::Null);
    }
    sse(&v)
}

/// The SSE event carrying completion token `index` (the first chat chunk also carries `role`).
pub fn token_event(meta: &ResponseMeta, index: u32, piece: &str) -> Bytes {
    let choice = match meta.endpoint {
        Endpoint::Completions => {
            json!({"index": 0, "text": piece, "logprobs": null, "finish_reason": null})
        }
        _ if index == 0 => json!({
            "index": 0, "delta": {"role": "assistant", "content": piece}, "logprobs": null, "finish_reason": null,
        }),
        _ => {
            json!({"index": 0, "delta": {"content": piece}, "logprobs": null, "finish_reason": null})
        }
    };
    chunk(meta, json!([choice]), None)
}

/// The SSE event closing the choice with `finish_reason: "length"` (no content).
pub fn finish_event(meta: &ResponseMeta) -> Bytes {
    let choice = match meta.endpoint {
        Endpoint::Completions => {
            json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "length"})
        }
        _ => json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"}),
    };
    chunk(meta, json!([choice]), None)
}

/// The SSE event with empty `choices` and the `usage` (sent when `stream_options.include_usage` is true).
pub fn usage_event(meta: &ResponseMeta, usage: &Usage) -> Bytes {
    chunk(meta, json!([]), Some(usage.json()))
}

/// The last SSE event of every stream.
pub const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(endpoint: Endpoint, body: &str) -> Result<GenRequest, ApiError> {
        parse_request(endpoint, body.as_bytes(), "dflt")
    }

    #[test]
    fn chat_prompt_concatenates_roles_and_text_parts() {
        let r = parse(
            Endpoint::Chat,
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]},
                {"role":"assistant","content":null}],
               "max_tokens":3,"max_completion_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .expect("valid");
        assert_eq!(
            r.prompt,
            Prompt::Messages(vec![
                Message::new("system", "be brief"),
                Message::new("user", "a\nb"),
                Message::new("assistant", ""),
            ])
        );
        assert_eq!(
            (r.model.as_str(), r.max_tokens, r.stream, r.include_usage),
            ("m", Some(5), true, true)
        );
    }

    #[test]
    fn completion_prompts_of_every_shape() {
        let p = |b: &str| parse(Endpoint::Completions, b).map(|r| r.prompt);
        assert_eq!(
            p(r#"{"prompt":"hi"}"#),
            Ok(Prompt::Raw(vec![PromptPart::Text("hi".into())]))
        );
        assert_eq!(
            p(r#"{"prompt":[1,2]}"#),
            Ok(Prompt::Raw(vec![PromptPart::Tokens(vec![1, 2])]))
        );
        assert_eq!(
            p(r#"{"prompt":["a",[3]]}"#),
            Ok(Prompt::Raw(vec![
                PromptPart::Text("a".into()),
                PromptPart::Tokens(vec![3])
            ]))
        );
        for bad in [
            r#"{"prompt":[]}"#,
            r#"{"prompt":[-1]}"#,
            r#"{"prompt":{}}"#,
            r#"{}"#,
            r#"{"prompt":[1.5]}"#,
        ] {
            assert_eq!(p(bad).map_err(|e| e.code), Err("invalid_prompt"), "{bad}");
        }
    }

    #[test]
    fn defaults_and_rejections() {
        let r = parse(
            Endpoint::Chat,
            r#"{"messages":[{"role":"user","content":"x"}],"stream":null}"#,
        )
        .expect("ok");
        assert_eq!(
            (r.model.as_str(), r.max_tokens, r.stream, r.include_usage),
            ("dflt", None, false, false)
        );
        for (body, code) in [
            ("not json", "invalid_json"),
            ("[1]", "invalid_json"),
            (r#"{"messages":[]}"#, "missing_messages"),
            (r#"{"messages":[{"content":"x"}]}"#, "invalid_message"),
            (
                r#"{"messages":[{"role":"user","content":5}]}"#,
                "invalid_type",
            ),
            (
                r#"{"messages":[{"role":"user"}],"max_tokens":0}"#,
                "invalid_value",
            ),
            (
                r#"{"messages":[{"role":"user"}],"max_tokens":"7"}"#,
                "invalid_value",
            ),
            (
                r#"{"messages":[{"role":"user"}],"stream":"yes"}"#,
                "invalid_type",
            ),
            (
                r#"{"messages":[{"role":"user"}],"n":2}"#,
                "unsupported_value",
            ),
        ] {
            let e = parse(Endpoint::Chat, body).expect_err(body);
            assert_eq!(
                (e.status, e.code),
                (StatusCode::BAD_REQUEST, code),
                "{body}"
            );
            let v: Value = serde_json::from_slice(&e.body()).expect("error body is JSON");
            assert!(
                v["error"]["message"].is_string() && v["error"]["type"].is_string(),
                "{v}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics_on_arbitrary_bytes(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = parse_request(Endpoint::Chat, &body, "m");
            let _ = parse_request(Endpoint::Completions, &body, "m");
        }

        #[test]
        fn parsing_never_panics_on_odd_json(
            messages in r#"\[(\{"role":("user"|1|null),"content":("x"|\[\{"text":"y"\},1\]|\{\}|null|7)\},?){0,3}\]|null|"s"|\[\]"#,
            prompt in r#""p"|\[1,2\]|\[\["a"\]\]|\[-1\]|\[1e99\]|\[\[4294967296\]\]|\{\}|null"#,
            max in r#"0|1|-1|1.5|4294967296|18446744073709551616|"3"|null|true"#,
        ) {
            let body = format!(r#"{{"messages":{messages},"prompt":{prompt},"max_tokens":{max},"stream":true,"n":1}}"#);
            let _ = parse_request(Endpoint::Chat, body.as_bytes(), "m");
            let _ = parse_request(Endpoint::Completions, body.as_bytes(), "m");
        }
    }

    #[test]
    fn stream_events_have_the_openai_shape() {
        let meta = ResponseMeta {
            endpoint: Endpoint::Chat,
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
            include_usage: true,
        };
        let first = token_event(&meta, 0, "hi");
        let s = std::str::from_utf8(&first).expect("utf8");
        assert!(s.starts_with("data: {") && s.ends_with("}\n\n"), "{s}");
        let v: Value = serde_json::from_str(&s[6..]).expect("json");
        assert_eq!(v["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(v["choices"][0]["delta"]["content"], "hi");
        assert!(v["usage"].is_null() && v.as_object().is_some_and(|o| o.contains_key("usage")));
        let usage = Usage {
            prompt_tokens: 10,
            completion_tokens: 2,
            cached_tokens: 4,
            cache_written: 0,
        };
        let u: Value =
            serde_json::from_str(&String::from_utf8_lossy(&usage_event(&meta, &usage))[6..])
                .expect("json");
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["total_tokens"], 12);
        assert_eq!(u["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    }
}
