//! OpenAI chat/completions wire shapes for the mock: parsing a request into a [`GenRequest`] (the model is
//! `request`'s; dispatching `/v1/responses` and `/v1/messages` to their modules), building
//! chat/completions bodies and SSE events, and error bodies in the route's shape. Owns only JSON in and out; it
//! never sleeps, never touches the prefix cache or the network, and never panics on any input.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use serde_json::value::RawValue;

use super::chat;
use super::request::{
    field, json_object, json_object_with_raws, max_tokens, model, opt_bool, ApiError, GenRequest,
    Message, Prompt, PromptPart, Usage,
};
use crate::api::Shape;

/// A chat's messages from the raw `messages` ([`json_object_with_raws`]), each element read
/// on its own, made a [`Message`] as vLLM parses it ([`chat::parse_message`]) and dropped
/// before the next.
fn chat_prompt(messages: Option<&RawValue>) -> Result<Vec<Message>, ApiError> {
    let missing = || {
        ApiError::bad_request(
            "missing_messages",
            "`messages` must be a non-empty list of messages",
        )
    };
    let Some(list) = messages.filter(|m| m.get().starts_with('[')) else {
        return Err(missing());
    };
    let items: Vec<&RawValue> = serde_json::from_str(list.get()).map_err(|_| missing())?;
    if items.is_empty() {
        return Err(missing());
    }
    items
        .iter()
        .enumerate()
        .map(|(i, raw)| chat::parse_message(raw, i))
        .collect()
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
    endpoint: Shape,
    body: &[u8],
    default_model: &str,
) -> Result<GenRequest, ApiError> {
    match endpoint {
        Shape::Responses => return super::responses::parse_request(body, default_model),
        Shape::Messages => return super::anthropic::parse_request(body, default_model),
        Shape::Chat | Shape::Completions => {}
    }
    // A chat's messages stay raw until the prompt is read: no tree of a long chat is built.
    // (`tools` and `chat_template_kwargs` too: their key order reaches the prompt.)
    let (obj, [messages, tools, kwargs]) = match endpoint {
        Shape::Chat => json_object_with_raws(body, ["messages", "tools", "chat_template_kwargs"])?,
        _ => (json_object(body)?, [None; 3]),
    };
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
        Shape::Completions => Prompt::Raw(completion_prompt(&obj)?),
        _ => {
            let options = chat::parse_options(&obj, tools, kwargs)?;
            Prompt::Chat(Box::new(chat::Chat {
                messages: chat_prompt(messages)?,
                options,
            }))
        }
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
        cache_salt: super::request::cache_salt(&obj)?,
    })
}

/// Identity of one response, shared by all its chunks.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// The route.
    pub endpoint: Shape,
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
        Shape::Completions => {
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
        Shape::Completions => "text_completion",
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
        Shape::Completions => "text_completion",
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
        Shape::Completions => {
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
        Shape::Completions => {
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
    use http::StatusCode;

    fn parse(endpoint: Shape, body: &str) -> Result<GenRequest, ApiError> {
        parse_request(endpoint, body.as_bytes(), "dflt")
    }

    /// The chat parse as it was, one tree of values for the whole body: the reference the
    /// message-at-a-time parse must answer exactly as.
    fn parse_as_one_tree(body: &str) -> Result<GenRequest, ApiError> {
        let obj = json_object(body.as_bytes())?;
        let model = model(&obj, "dflt")?;
        if let Some(n) = field(&obj, "n") {
            if n.as_u64() != Some(1) {
                return Err(ApiError::bad_request(
                    "unsupported_value",
                    format!("the mock supports only `n` = 1, got {n}"),
                ));
            }
        }
        let missing = || {
            ApiError::bad_request(
                "missing_messages",
                "`messages` must be a non-empty list of messages",
            )
        };
        let Some(Value::Array(messages)) = field(&obj, "messages") else {
            return Err(missing());
        };
        if messages.is_empty() {
            return Err(missing());
        }
        let mut out = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let Some(role) = m.get("role").and_then(Value::as_str) else {
                return Err(ApiError::bad_request(
                    "invalid_message",
                    format!("`messages[{i}].role` must be a string"),
                ));
            };
            let _ = role;
            let raw = RawValue::from_string(m.to_string()).map_err(|_| missing())?;
            out.push(chat::parse_message(&raw, i)?);
        }
        let mut req = parse(
            Shape::Chat,
            r#"{"messages":[{"role":"user","content":"x"}]}"#,
        )?;
        req.model = model;
        req.prompt = Prompt::Chat(Box::new(chat::Chat {
            messages: out,
            options: chat::PLAIN.clone(),
        }));
        req.stream = opt_bool(&obj, "stream", "stream")?;
        req.include_usage = match field(&obj, "stream_options") {
            None => false,
            Some(Value::Object(o)) => opt_bool(o, "include_usage", "stream_options.include_usage")?,
            Some(other) => {
                return Err(ApiError::bad_request(
                    "invalid_type",
                    format!("`stream_options` must be an object, got {other}"),
                ))
            }
        };
        req.max_tokens = max_tokens(&obj, &["max_completion_tokens", "max_tokens"])?;
        Ok(req)
    }

    #[test]
    fn a_chat_read_message_by_message_answers_as_the_whole_tree_did() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]},{"role":"assistant","content":null}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"messages":[{"role":"user","content":"x","name":"n","extra":{"deep":[1,2]}}]}"#,
            r#"{"messages":[{"role":"user","content":"first"}],"messages":[{"role":"user","content":"last wins"}]}"#,
            r#"{"mess\u0061ges":[{"role":"user","content":"escaped key"}]}"#,
            r#"{"model":"m"}"#,
            r#"{"messages":null}"#,
            r#"{"messages":[]}"#,
            r#"{"messages":{"role":"user"}}"#,
            r#"{"messages":["hi"]}"#,
            r#"{"messages":[{"content":"no role"}]}"#,
            r#"{"messages":[{"role":7,"content":"x"}]}"#,
            r#"{"messages":[{"role":"user","content":7}]}"#,
            r#"{"model":7,"messages":[]}"#,
            r#"{"n":2,"messages":7}"#,
            r#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
            r#"{"messages":[{"role":"user","content":"x"}],"stream_options":[1]}"#,
            r#"[{"role":"user"}]"#,
            r#"{"messages":[{"role":"user","content":"x"}"#,
            r#"  {"messages":[{"role":"user","content":"\u00e9\n"}]}  "#,
        ];
        for body in bodies {
            assert_eq!(parse(Shape::Chat, body), parse_as_one_tree(body), "{body}");
        }
    }

    #[test]
    fn chat_prompt_concatenates_roles_and_text_parts() {
        let r = parse(
            Shape::Chat,
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]},
                {"role":"assistant","content":null}],
               "max_tokens":3,"max_completion_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .expect("valid");
        assert_eq!(
            r.prompt.messages(),
            Some(
                &[
                    Message::new("system", "be brief"),
                    Message::new("user", "a\nb"),
                    Message::new("assistant", ""),
                ][..]
            )
        );
        assert_eq!(
            (r.model.as_str(), r.max_tokens, r.stream, r.include_usage),
            ("m", Some(5), true, true)
        );
    }

    #[test]
    fn completion_prompts_of_every_shape() {
        let p = |b: &str| parse(Shape::Completions, b).map(|r| r.prompt);
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
            Shape::Chat,
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
            let e = parse(Shape::Chat, body).expect_err(body);
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
            let _ = parse_request(Shape::Chat, &body, "m");
            let _ = parse_request(Shape::Completions, &body, "m");
        }

        #[test]
        fn parsing_never_panics_on_odd_json(
            messages in r#"\[(\{"role":("user"|1|null),"content":("x"|\[\{"text":"y"\},1\]|\{\}|null|7)\},?){0,3}\]|null|"s"|\[\]"#,
            prompt in r#""p"|\[1,2\]|\[\["a"\]\]|\[-1\]|\[1e99\]|\[\[4294967296\]\]|\{\}|null"#,
            max in r#"0|1|-1|1.5|4294967296|18446744073709551616|"3"|null|true"#,
        ) {
            let body = format!(r#"{{"messages":{messages},"prompt":{prompt},"max_tokens":{max},"stream":true,"n":1}}"#);
            let _ = parse_request(Shape::Chat, body.as_bytes(), "m");
            let _ = parse_request(Shape::Completions, body.as_bytes(), "m");
        }
    }

    #[test]
    fn stream_events_have_the_openai_shape() {
        let meta = ResponseMeta {
            endpoint: Shape::Chat,
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
