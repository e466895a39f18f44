//! Anthropic Messages API (`POST /v1/messages`) wire shapes for the mock: parsing a request into a
//! [`GenRequest`] and building the message object and its SSE event sequence (`message_start`,
//! `content_block_start`, `ping`, one `content_block_delta` per token, `content_block_stop`, `message_delta`,
//! `message_stop`). Owns only JSON in and out; it never sleeps, never touches the prefix cache or the network,
//! and never panics on any input.
//!
//! `system` (a string or text blocks) becomes a leading system message and `messages` follow, rendered through
//! the chat template. Usage is Anthropic's: `input_tokens` counts only the prompt tokens neither read from nor
//! written to the cache, so `input_tokens + cache_read_input_tokens + cache_creation_input_tokens` is the whole
//! prompt. The mock always stops at `max_tokens` (`stop_reason: "max_tokens"`).

use bytes::Bytes;
use serde_json::{json, Value};

use super::request::{
    field, json_object, max_tokens, model, opt_bool, ApiError, GenRequest, Message, Prompt, Usage,
};
use crate::api::Shape;

/// The text of one content block, or `None` for blocks that carry no text (images, thinking).
fn block_text(block: &Value) -> Option<String> {
    match block.get("type").and_then(Value::as_str) {
        Some("text") => block.get("text").and_then(Value::as_str).map(str::to_owned),
        // A tool call's arguments and a tool's result are text the model reads.
        Some("tool_use") => block.get("input").map(Value::to_string),
        Some("tool_result") => match block.get("content") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(blocks)) => Some(blocks_text(blocks)),
            _ => None,
        },
        _ => None,
    }
}

fn blocks_text(blocks: &[Value]) -> String {
    let texts: Vec<String> = blocks.iter().filter_map(block_text).collect();
    texts.join("\n")
}

/// A string or a list of content blocks; `path` names it in errors.
fn content(v: Option<&Value>, path: &str) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => Ok(blocks_text(blocks)),
        other => Err(ApiError::bad_request(
            "invalid_request_error",
            format!(
                "{path}: must be a string or a list of content blocks, got {}",
                other.map_or_else(|| "nothing".to_owned(), Value::to_string)
            ),
        )),
    }
}

/// Parses a `/v1/messages` body. `default_model` is used when the request names no model.
pub fn parse_request(body: &[u8], default_model: &str) -> Result<GenRequest, ApiError> {
    let obj = json_object(body)?;
    let model = model(&obj, default_model)?;
    let mut out = Vec::new();
    if let Some(system) = field(&obj, "system") {
        out.push(Message::new("system", content(Some(system), "system")?));
    }
    let messages = match field(&obj, "messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        _ => {
            return Err(ApiError::bad_request(
                "invalid_request_error",
                "messages: must be a non-empty list of messages",
            ))
        }
    };
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        let Some(role @ ("user" | "assistant")) = role else {
            return Err(ApiError::bad_request(
                "invalid_request_error",
                format!("messages.{i}.role: must be \"user\" or \"assistant\""),
            ));
        };
        out.push(Message::new(
            role,
            content(m.get("content"), &format!("messages.{i}.content"))?,
        ));
    }
    let max_tokens = max_tokens(&obj, &["max_tokens"])?;
    if max_tokens.is_none() {
        return Err(ApiError::bad_request(
            "invalid_request_error",
            "max_tokens: Field required",
        ));
    }
    Ok(GenRequest {
        endpoint: Shape::Messages,
        model,
        prompt: Prompt::Messages(out),
        max_tokens,
        instructions: None,
        stream: opt_bool(&obj, "stream", "stream")?,
        include_usage: true,
        // The Messages API has no salt.
        cache_salt: None,
    })
}

/// Prompt tokens not read from or written to the cache (Anthropic's `input_tokens`).
fn uncached_input(usage: &Usage) -> usize {
    usage
        .prompt_tokens
        .saturating_sub(usage.cached_tokens + usage.cache_written)
}

/// The `usage` object with `output_tokens` output tokens.
fn usage_json(usage: &Usage, output_tokens: usize) -> Value {
    json!({
        "input_tokens": uncached_input(usage),
        "cache_creation_input_tokens": usage.cache_written,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": output_tokens,
    })
}

fn message(id: &str, model: &str, content: Value, stop: Option<&str>, usage: Value) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage,
    })
}

/// The non-streaming response body.
pub fn full_response(id: &str, model: &str, text: &str, usage: &Usage) -> Bytes {
    let content = json!([{"type": "text", "text": text}]);
    let usage = usage_json(usage, usage.completion_tokens);
    Bytes::from(message(id, model, content, Some("max_tokens"), usage).to_string())
}

fn event(kind: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// `message_start` (usage with one output token, as Anthropic sends it), `content_block_start` and `ping`,
/// sent as the stream opens.
pub fn opening(id: &str, model: &str, usage: &Usage) -> Vec<Bytes> {
    let msg = message(id, model, json!([]), None, usage_json(usage, 1));
    vec![
        event(
            "message_start",
            &json!({"type": "message_start", "message": msg}),
        ),
        event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        event("ping", &json!({"type": "ping"})),
    ]
}

/// `content_block_delta` with one token's text.
pub fn token(piece: &str) -> Bytes {
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
    )
}

/// `content_block_stop`, `message_delta` (stop reason, cumulative `output_tokens`) and `message_stop`.
pub fn closing(usage: &Usage) -> Vec<Bytes> {
    vec![
        event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ),
        event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                "usage": {"output_tokens": usage.completion_tokens},
            }),
        ),
        event("message_stop", &json!({"type": "message_stop"})),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_blocks_and_messages_become_chat_messages() {
        let r = parse_request(
            br#"{"model":"claude","max_tokens":5,"stream":true,
                 "system":[{"type":"text","text":"be brief"},{"type":"text","text":"and kind"}],
                 "messages":[{"role":"user","content":"hi"},
                   {"role":"assistant","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"t","name":"f","input":{"x":1}}]},
                   {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"42"},{"type":"image","source":{}}]}]}"#,
            "dflt",
        )
        .expect("valid");
        assert_eq!(
            r.prompt,
            Prompt::Messages(vec![
                Message::new("system", "be brief\nand kind"),
                Message::new("user", "hi"),
                Message::new("assistant", "a\n{\"x\":1}"),
                Message::new("user", "42"),
            ])
        );
        assert_eq!(
            (r.model.as_str(), r.max_tokens, r.stream),
            ("claude", Some(5), true)
        );
    }

    #[test]
    fn rejections_name_the_field_in_anthropic_style() {
        for (body, needle) in [
            (
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                "max_tokens",
            ),
            (r#"{"max_tokens":1,"messages":[]}"#, "messages"),
            (
                r#"{"max_tokens":1,"messages":[{"role":"system","content":"x"}]}"#,
                "messages.0.role",
            ),
            (
                r#"{"max_tokens":1,"messages":[{"role":"user","content":5}]}"#,
                "messages.0.content",
            ),
            (
                r#"{"max_tokens":1,"system":5,"messages":[{"role":"user","content":"x"}]}"#,
                "system",
            ),
        ] {
            let e = parse_request(body.as_bytes(), "m").expect_err(body);
            assert!(e.message.starts_with(needle), "{body}: {}", e.message);
            let v: Value =
                serde_json::from_slice(&e.body_for(Some(Shape::Messages))).expect("json");
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], "invalid_request_error");
        }
    }

    #[test]
    fn usage_splits_the_prompt_into_uncached_read_and_written() {
        let usage = Usage {
            prompt_tokens: 100,
            completion_tokens: 3,
            cached_tokens: 48,
            cache_written: 48,
        };
        let v: Value =
            serde_json::from_slice(&full_response("msg_1", "m", "a b c", &usage)).expect("json");
        assert_eq!(v["usage"]["input_tokens"], 4);
        assert_eq!(v["usage"]["cache_read_input_tokens"], 48);
        assert_eq!(v["usage"]["cache_creation_input_tokens"], 48);
        assert_eq!(v["usage"]["output_tokens"], 3);
        assert_eq!(v["content"][0]["text"], "a b c");
        assert_eq!(v["stop_reason"], "max_tokens");
    }
}
