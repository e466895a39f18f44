//! OpenAI Responses API (`POST /v1/responses`) wire shapes for the mock: parsing a request into a
//! [`GenRequest`] and building the `response` object and its SSE event sequence (`response.created` …
//! `response.completed`, each with `type` and `sequence_number`). Owns only JSON in and out; it never sleeps,
//! never touches the prefix cache or the network, and never panics on any input.
//!
//! As vLLM does: `instructions` becomes a leading system message and `input` (a string, or message items whose
//! content is a string or a list of parts) the messages after it, all rendered through the chat template. A
//! response that stopped at the request's `max_output_tokens` has `status: "incomplete"` with
//! `incomplete_details.reason = "max_output_tokens"`, one without a limit `status: "completed"`; the stream
//! ends with `response.completed` either way (vLLM's behaviour) and carries no `data: [DONE]`.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::request::{
    content_text, field, json_object, max_tokens, model, opt_bool, parts_text, ApiError,
    GenRequest, Message, Prompt, Usage,
};
use crate::api::Shape;

/// The role a Responses item's role is rendered as: `developer` is OpenAI's newer name for `system`.
fn template_role(role: &str) -> &str {
    if role == "developer" {
        "system"
    } else {
        role
    }
}

/// One `input` item as a chat message, or `None` for items that carry no text (reasoning, images).
fn input_item(item: &Value, i: usize) -> Result<Option<Message>, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "invalid_input",
            format!("`input[{i}]` must be a message item (`role` and `content`) or a function call item"),
        )
    };
    let Value::Object(obj) = item else {
        return Err(bad());
    };
    if let Some(role) = obj.get("role") {
        let Some(role) = role.as_str() else {
            return Err(ApiError::bad_request(
                "invalid_input",
                format!("`input[{i}].role` must be a string"),
            ));
        };
        let content = content_text(obj.get("content"), &format!("input[{i}].content"))?;
        return Ok(Some(Message::new(template_role(role), content)));
    }
    match obj.get("type").and_then(Value::as_str) {
        // A tool call the model made earlier, and its result: the model sees both as text.
        Some("function_call") => Ok(Some(Message::new(
            "assistant",
            obj.get("arguments")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        ))),
        Some("function_call_output") => {
            let output = match obj.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts_text(parts),
                _ => String::new(),
            };
            Ok(Some(Message::new("tool", output)))
        }
        Some(_) => Ok(None),
        None => Err(bad()),
    }
}

/// Parses a `/v1/responses` body. `default_model` is used when the request names no model.
pub fn parse_request(body: &[u8], default_model: &str) -> Result<GenRequest, ApiError> {
    let obj = json_object(body)?;
    let model = model(&obj, default_model)?;
    if field(&obj, "previous_response_id").is_some() || field(&obj, "conversation").is_some() {
        return Err(ApiError::bad_request(
            "unsupported_parameter",
            "the mock stores no responses: send the whole conversation in `input` instead of \
             `previous_response_id` or `conversation`",
        ));
    }
    let mut messages = Vec::new();
    let instructions = field(&obj, "instructions").cloned();
    match &instructions {
        None => {}
        Some(Value::String(s)) => messages.push(Message::new("system", s.clone())),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                messages.extend(input_item(item, i)?);
            }
        }
        Some(other) => {
            return Err(ApiError::bad_request(
                "invalid_type",
                format!("`instructions` must be a string, got {other}"),
            ))
        }
    }
    match field(&obj, "input") {
        Some(Value::String(s)) => messages.push(Message::new("user", s.clone())),
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                messages.extend(input_item(item, i)?);
            }
        }
        _ => {
            return Err(ApiError::bad_request(
                "missing_input",
                "`input` must be a string or a non-empty list of input items",
            ))
        }
    }
    Ok(GenRequest {
        endpoint: Shape::Responses,
        model,
        prompt: Prompt::Messages(messages),
        max_tokens: max_tokens(&obj, &["max_output_tokens"])?,
        instructions,
        stream: opt_bool(&obj, "stream", "stream")?,
        include_usage: true,
        cache_salt: super::request::cache_salt(&obj)?,
    })
}

/// Identity and settings of one response, shared by its events.
#[derive(Debug, Clone)]
pub struct ResponseInfo {
    /// `resp_…`
    pub id: String,
    /// The output message item's `msg_…` id.
    pub item_id: String,
    /// `created_at` (seconds).
    pub created_at: u64,
    /// `model`.
    pub model: String,
    /// The request's `instructions`, echoed.
    pub instructions: Option<Value>,
    /// The request's `max_output_tokens`; when set the output stops there and the response is incomplete.
    pub max_output_tokens: Option<u32>,
}

/// The `usage` object.
pub fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_written,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    })
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
}

fn message_item(info: &ResponseInfo, content: Option<&str>) -> Value {
    let (status, content) = match content {
        Some(text) => ("completed", json!([output_text(text)])),
        None => ("in_progress", json!([])),
    };
    json!({"id": info.item_id, "type": "message", "status": status, "role": "assistant", "content": content})
}

/// The `response` object: in progress (no output, no usage) when `done` is `None`, else finished with the
/// output text and usage.
pub fn response_object(info: &ResponseInfo, done: Option<(&str, &Usage)>) -> Value {
    let mut v = json!({
        "id": info.id,
        "object": "response",
        "created_at": info.created_at,
        "status": "in_progress",
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": info.instructions,
        "max_output_tokens": info.max_output_tokens,
        "max_tool_calls": null,
        "model": info.model,
        "output": [],
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "service_tier": "default",
        "store": false,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": null,
        "user": null,
        "metadata": {},
    });
    if let Some((text, usage)) = done {
        if info.max_output_tokens.is_some() {
            v["status"] = json!("incomplete");
            v["incomplete_details"] = json!({"reason": "max_output_tokens"});
        } else {
            v["status"] = json!("completed");
        }
        v["output"] = json!([message_item(info, Some(text))]);
        v["usage"] = usage_json(usage);
    }
    v
}

/// The non-streaming response body.
pub fn full_response(info: &ResponseInfo, text: &str, usage: &Usage) -> Bytes {
    Bytes::from(response_object(info, Some((text, usage))).to_string())
}

/// The SSE events of one streamed response, numbered in order as they are made.
#[derive(Debug)]
pub struct ResponseEvents {
    info: ResponseInfo,
    sequence: u64,
    text: String,
}

impl ResponseEvents {
    /// Events for `info`, numbered from 0.
    pub fn new(info: ResponseInfo) -> Self {
        ResponseEvents {
            info,
            sequence: 0,
            text: String::new(),
        }
    }

    fn event(&mut self, kind: &str, fields: Value) -> Bytes {
        let mut v = json!({"type": kind});
        if let (Some(obj), Value::Object(extra)) = (v.as_object_mut(), fields) {
            obj.extend(extra);
            obj.insert("sequence_number".into(), json!(self.sequence));
        }
        self.sequence += 1;
        Bytes::from(format!("event: {kind}\ndata: {v}\n\n"))
    }

    fn part_fields(&self, extra: Map<String, Value>) -> Value {
        let mut v = json!({"item_id": self.info.item_id, "output_index": 0, "content_index": 0});
        if let Some(obj) = v.as_object_mut() {
            obj.extend(extra);
        }
        v
    }

    /// The response these events describe.
    pub fn info(&self) -> &ResponseInfo {
        &self.info
    }

    /// `response.created` and `response.in_progress`, sent as the stream opens.
    pub fn opening(&mut self) -> Vec<Bytes> {
        let r = response_object(&self.info, None);
        vec![
            self.event("response.created", json!({"response": r.clone()})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    /// `response.output_item.added` and `response.content_part.added`, sent with the first token.
    pub fn before_first_token(&mut self) -> Vec<Bytes> {
        let item = message_item(&self.info, None);
        let part = self.part_fields(Map::from_iter([("part".into(), output_text(""))]));
        vec![
            self.event(
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
            ),
            self.event("response.content_part.added", part),
        ]
    }

    /// `response.output_text.delta` with one token's text.
    pub fn token(&mut self, piece: &str) -> Bytes {
        self.text.push_str(piece);
        let fields = self.part_fields(Map::from_iter([
            ("delta".into(), json!(piece)),
            ("logprobs".into(), json!([])),
        ]));
        self.event("response.output_text.delta", fields)
    }

    /// `response.output_text.done`, `response.content_part.done`, `response.output_item.done` and
    /// `response.completed` (with the usage), sent after the last token.
    pub fn closing(&mut self, usage: &Usage) -> Vec<Bytes> {
        let text = std::mem::take(&mut self.text);
        let done = self.part_fields(Map::from_iter([
            ("text".into(), json!(text)),
            ("logprobs".into(), json!([])),
        ]));
        let part = self.part_fields(Map::from_iter([("part".into(), output_text(&text))]));
        let item = message_item(&self.info, Some(&text));
        let response = response_object(&self.info, Some((&text, usage)));
        vec![
            self.event("response.output_text.done", done),
            self.event("response.content_part.done", part),
            self.event(
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            ),
            self.event("response.completed", json!({"response": response})),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(body: &str) -> Result<Vec<Message>, ApiError> {
        parse_request(body.as_bytes(), "dflt").map(|r| match r.prompt {
            Prompt::Messages(m) => m,
            Prompt::Raw(_) | Prompt::Chat(_) => unreachable!("responses prompts are messages"),
        })
    }

    #[test]
    fn instructions_and_every_input_shape_become_messages() {
        assert_eq!(
            messages(r#"{"instructions":"be brief","input":"hi"}"#),
            Ok(vec![
                Message::new("system", "be brief"),
                Message::new("user", "hi")
            ])
        );
        assert_eq!(
            messages(
                r#"{"input":[{"role":"developer","content":"rules"},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"},{"type":"input_text","text":"b"}]},
                {"type":"reasoning","summary":[]},
                {"type":"function_call","call_id":"c","name":"f","arguments":"{\"x\":1}"},
                {"type":"function_call_output","call_id":"c","output":"42"},
                {"role":"assistant","content":[{"type":"output_text","text":"ok"}]}]}"#
            ),
            Ok(vec![
                Message::new("system", "rules"),
                Message::new("user", "a\nb"),
                Message::new("assistant", r#"{"x":1}"#),
                Message::new("tool", "42"),
                Message::new("assistant", "ok"),
            ])
        );
    }

    #[test]
    fn limits_stream_and_rejections() {
        let r = parse_request(
            br#"{"model":"m","input":"x","max_output_tokens":7,"stream":true}"#,
            "dflt",
        )
        .expect("valid");
        assert_eq!(
            (r.model.as_str(), r.max_tokens, r.stream),
            ("m", Some(7), true)
        );
        let r = parse_request(br#"{"input":"x","max_tokens":7}"#, "dflt").expect("valid");
        assert_eq!(
            (r.model.as_str(), r.max_tokens),
            ("dflt", None),
            "max_tokens is not a Responses field"
        );
        for (body, code) in [
            (r#"{}"#, "missing_input"),
            (r#"{"input":[]}"#, "missing_input"),
            (r#"{"input":5}"#, "missing_input"),
            (r#"{"input":[7]}"#, "invalid_input"),
            (r#"{"input":[{"content":"x"}]}"#, "invalid_input"),
            (r#"{"input":[{"role":1,"content":"x"}]}"#, "invalid_input"),
            (r#"{"input":"x","instructions":3}"#, "invalid_type"),
            (r#"{"input":"x","max_output_tokens":0}"#, "invalid_value"),
            (
                r#"{"input":"x","previous_response_id":"resp_1"}"#,
                "unsupported_parameter",
            ),
        ] {
            assert_eq!(
                parse_request(body.as_bytes(), "m").map_err(|e| e.code),
                Err(code),
                "{body}"
            );
        }
    }

    fn info(max: Option<u32>) -> ResponseInfo {
        ResponseInfo {
            id: "resp_1".into(),
            item_id: "msg_1".into(),
            created_at: 5,
            model: "m".into(),
            instructions: Some(json!("be brief")),
            max_output_tokens: max,
        }
    }

    const USAGE: Usage = Usage {
        prompt_tokens: 40,
        completion_tokens: 2,
        cached_tokens: 16,
        cache_written: 16,
    };

    #[test]
    fn events_are_numbered_in_order_and_end_with_the_usage() {
        let mut ev = ResponseEvents::new(info(Some(2)));
        let mut all = ev.opening();
        all.extend(ev.before_first_token());
        all.push(ev.token("hello"));
        all.push(ev.token(" world"));
        all.extend(ev.closing(&USAGE));
        let parsed: Vec<(String, Value)> = all
            .iter()
            .map(|b| {
                let s = std::str::from_utf8(b).expect("utf8");
                let (head, data) = s.split_once('\n').expect("two lines");
                let name = head.strip_prefix("event: ").expect("event line");
                let data = data.strip_prefix("data: ").expect("data line");
                assert!(data.ends_with("\n\n"), "{s:?}");
                (name.to_owned(), serde_json::from_str(data).expect("json"))
            })
            .collect();
        let names: Vec<&str> = parsed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (name, v)) in parsed.iter().enumerate() {
            assert_eq!(v["type"], name.as_str());
            assert_eq!(v["sequence_number"], i);
        }
        let done = &parsed[6].1;
        assert_eq!(done["text"], "hello world");
        let completed = &parsed[9].1["response"];
        assert_eq!(completed["status"], "incomplete");
        assert_eq!(
            completed["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        assert_eq!(completed["output"][0]["content"][0]["text"], "hello world");
        assert_eq!(completed["usage"]["input_tokens"], 40);
        assert_eq!(
            completed["usage"]["input_tokens_details"]["cached_tokens"],
            16
        );
        assert_eq!(completed["usage"]["total_tokens"], 42);
        assert_eq!(parsed[0].1["response"]["status"], "in_progress");
        assert!(parsed[0].1["response"]["usage"].is_null());
    }

    #[test]
    fn a_response_without_a_limit_is_completed() {
        let v: Value =
            serde_json::from_slice(&full_response(&info(None), "hi", &USAGE)).expect("json");
        assert_eq!(v["status"], "completed");
        assert!(v["incomplete_details"].is_null());
        assert_eq!(v["instructions"], "be brief");
        assert_eq!(v["output"][0]["role"], "assistant");
        assert_eq!(v["output"][0]["status"], "completed");
    }
}
