//! A chat-completions request as vLLM 0.33 hands it to the chat template, and its rendering:
//! the one function the mock and the cache model both render chat prompts with
//! ([`render`]). What vLLM does beyond role and content, and where (vLLM 0.33.0's
//! `ChatCompletionRequest` validators, `OnlineRenderer.render_chat`, `parse_chat_message_content`,
//! `_postprocess_messages`, `safe_apply_chat_template`, then transformers'
//! `apply_chat_template`):
//!
//! - `tools` through `model_dump()`: `{"type", "function": {"name", "description",
//!   "parameters"[, "strict"][, "defer_loading"]}[, "defer_loading"]}`, nulls kept, key order
//!   as sent ([`PyJson`]); an empty list is refused;
//! - assistant `tool_calls` with each `function.arguments` string parsed to an object (invalid
//!   JSON or a non-object: `{}`), `tool` messages with their `tool_call_id`, `name` fields;
//! - `reasoning_content` renamed `reasoning` (an assistant message carries both names);
//! - content parts: the text parts joined with `"\n"`; a system message's Claude Code billing
//!   header line dropped;
//! - `developer` turned into `system` (and the system messages merged into one, first) when
//!   the template's source never names the role;
//! - `chat_template_kwargs`, with the body's `reasoning_effort` (and `enable_thinking` from
//!   it), `add_generation_prompt` and `continue_final_message` over them;
//! - `continue_final_message`: the prompt ends where the last message's content does.
//!
//! Owns the request's chat fields and the rendering; never tokenizes and never touches the
//! prefix cache.

use minijinja::Value;
use serde_json::value::RawValue;
use serde_json::Map;

use super::request::{field, opt_bool, ApiError, Message, MessageExtra};
pub use super::request::{Chat, ChatOptions, PLAIN};
use crate::synth::tokenizer::chat_template::ChatTemplate;
use crate::synth::tokenizer::pyjinja::{Dict, PyJson};

/// `apply_chat_template`'s own parameters: transformers takes them from the kwargs and never
/// hands them to the template (`tools` and `documents` go in under their own names).
const APPLY_PARAMS: [&str; 12] = [
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "sanitize_control_tokens",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
];

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(code, message)
}

fn py_json(raw: &RawValue) -> Result<Value, ApiError> {
    serde_json::from_str::<PyJson>(raw.get())
        .map(|v| v.0)
        .map_err(|e| {
            bad(
                "invalid_json",
                format!("The request body is not valid JSON: {e}"),
            )
        })
}

/// The body's template fields: `obj` is the body without its raw members `tools` and
/// `chat_template_kwargs` (read here with their key order).
pub fn parse_options(
    obj: &Map<String, serde_json::Value>,
    tools: Option<&RawValue>,
    kwargs: Option<&RawValue>,
) -> Result<ChatOptions, ApiError> {
    let explicit = |k: &str| field(obj, k).is_some_and(|v| v.as_bool() == Some(true));
    if explicit("continue_final_message") && explicit("add_generation_prompt") {
        return Err(bad(
            "invalid_value",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ));
    }
    let tools = match tools.filter(|t| t.get() != "null") {
        None => None,
        Some(raw) => Some(model_dump_tools(&py_json(raw)?)?),
    };
    let add_generation_prompt = match field(obj, "add_generation_prompt") {
        None => true,
        Some(_) => opt_bool(obj, "add_generation_prompt", "add_generation_prompt")?,
    };
    let continue_final_message = opt_bool(obj, "continue_final_message", "continue_final_message")?;
    let add_special_tokens = opt_bool(obj, "add_special_tokens", "add_special_tokens")?;
    let mut merged = Dict::default();
    if let Some(raw) = kwargs.filter(|k| k.get() != "null") {
        let user = py_json(raw)?;
        if !matches!(user.kind(), minijinja::value::ValueKind::Map) {
            return Err(bad(
                "invalid_type",
                "`chat_template_kwargs` must be an object",
            ));
        }
        for key in user.try_iter().into_iter().flatten() {
            let v = user.get_item(&key).unwrap_or_default();
            merged.set(key, v);
        }
    }
    let user_thinking = merged
        .0
        .iter()
        .any(|(k, _)| k.as_str() == Some("enable_thinking"));
    // `merge_kwargs`: the body's fields over the user's, but never a null or "auto".
    if let Some(effort) = field(obj, "reasoning_effort").and_then(serde_json::Value::as_str) {
        if effort != "auto" {
            merged.set("reasoning_effort", Value::from(effort));
        }
        if !user_thinking {
            merged.set("enable_thinking", Value::from(effort != "none"));
        }
    }
    if let Some(docs) = field(obj, "documents") {
        let docs = serde_json::from_str::<PyJson>(&docs.to_string())
            .map_or_else(|_| Value::from(()), |v| v.0);
        merged.set("documents", docs);
    }
    let kwargs = merged
        .0
        .into_iter()
        .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v)))
        .filter(|(k, _)| !APPLY_PARAMS.contains(&k.as_str()))
        .collect();
    Ok(ChatOptions {
        tools,
        kwargs,
        add_generation_prompt,
        continue_final_message,
        add_special_tokens,
    })
}

/// `[tool.model_dump() for tool in request.tools]`.
fn model_dump_tools(tools: &Value) -> Result<Value, ApiError> {
    let not_list = || bad("invalid_type", "`tools` must be a list of tools");
    if !matches!(tools.kind(), minijinja::value::ValueKind::Seq) {
        return Err(not_list());
    }
    let list: Vec<Value> = tools.try_iter().map_err(|_| not_list())?.collect();
    if list.is_empty() {
        return Err(bad(
            "invalid_value",
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely. (parameter=tools)",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let get = |v: &Value, k: &str| v.get_attr(k).ok().filter(|v| !v.is_undefined());
        let function = get(tool, "function")
            .filter(|f| matches!(f.kind(), minijinja::value::ValueKind::Map))
            .ok_or_else(|| {
                bad(
                    "invalid_tool",
                    format!("`tools[{i}].function` must be an object"),
                )
            })?;
        let name = get(&function, "name")
            .filter(|n| n.as_str().is_some())
            .ok_or_else(|| {
                bad(
                    "invalid_tool",
                    format!("`tools[{i}].function.name` must be a string"),
                )
            })?;
        let none = || Value::from(());
        let top_defer = get(tool, "defer_loading").filter(|v| !v.is_none());
        let mut f = Dict::default();
        f.set("name", name);
        f.set(
            "description",
            get(&function, "description").unwrap_or_else(none),
        );
        f.set(
            "parameters",
            get(&function, "parameters").unwrap_or_else(none),
        );
        if let Some(strict) = get(&function, "strict").filter(|v| !v.is_none()) {
            f.set("strict", strict);
        }
        if let Some(d) = get(&function, "defer_loading")
            .filter(|v| !v.is_none())
            .or_else(|| top_defer.clone())
        {
            f.set("defer_loading", d);
        }
        let mut t = Dict::default();
        t.set(
            "type",
            get(tool, "type").unwrap_or_else(|| Value::from("function")),
        );
        t.set("function", f.into_value());
        if let Some(d) = top_defer {
            t.set("defer_loading", d);
        }
        out.push(t.into_value());
    }
    Ok(Value::from(out))
}

/// The billing header line Claude Code puts first in its system prompt: vLLM drops it (its
/// value changes on every request, so keeping it would miss the prefix cache).
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// A message's text: a string, or its text parts (strings, or objects with a `text`) joined
/// with `"\n"`; a system message's billing header line dropped from each part.
fn content_text(content: &Value, role: &str, path: &str) -> Result<String, ApiError> {
    let strip = |t: &str| -> Option<String> {
        if role == "system" && t.starts_with(BILLING_HEADER) {
            let rest = t.split_once('\n').map_or("", |(_, r)| r);
            return (!rest.is_empty()).then(|| rest.to_owned());
        }
        Some(t.to_owned())
    };
    match content.kind() {
        minijinja::value::ValueKind::Undefined | minijinja::value::ValueKind::None => {
            Ok(String::new())
        }
        minijinja::value::ValueKind::String => {
            Ok(strip(content.as_str().unwrap_or_default()).unwrap_or_default())
        }
        minijinja::value::ValueKind::Seq => {
            let mut texts = Vec::new();
            for part in content.try_iter().into_iter().flatten() {
                let text = match part.as_str() {
                    Some(s) => Some(s.to_owned()),
                    None => part
                        .get_attr("text")
                        .ok()
                        .and_then(|t| t.as_str().map(str::to_owned)),
                };
                if let Some(t) = text.as_deref().and_then(strip) {
                    texts.push(t);
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(bad(
            "invalid_type",
            format!("`{path}` must be a string, a list of content parts or null, got {content}"),
        )),
    }
}

/// One message of a chat-completions body, as vLLM parses it.
pub fn parse_message(raw: &RawValue, i: usize) -> Result<Message, ApiError> {
    let m = py_json(raw)?;
    let get = |k: &str| {
        m.get_attr(k)
            .ok()
            .filter(|v| !v.is_undefined() && !v.is_none())
    };
    let Some(role) = get("role").and_then(|r| r.as_str().map(str::to_owned)) else {
        return Err(bad(
            "invalid_message",
            format!("`messages[{i}].role` must be a string"),
        ));
    };
    let content = content_text(
        &get("content").unwrap_or_default(),
        &role,
        &format!("messages[{i}].content"),
    )?;
    let mut extra = MessageExtra {
        name: get("name").and_then(|n| n.as_str().map(str::to_owned)),
        ..MessageExtra::default()
    };
    match role.as_str() {
        "assistant" => {
            extra.reasoning = get("reasoning").or_else(|| get("reasoning_content"));
            if let Some(calls) = get("tool_calls") {
                extra.tool_calls = tool_calls(&calls)?;
            }
        }
        "tool" => extra.tool_call_id = get("tool_call_id"),
        _ => {}
    }
    let mut msg = Message::new(role, content);
    if extra != MessageExtra::default() {
        msg.extra = Some(Box::new(extra));
    }
    Ok(msg)
}

/// `_postprocess_messages`: each call's `function.arguments` as an object; no calls at all
/// is none.
fn tool_calls(calls: &Value) -> Result<Option<Value>, ApiError> {
    let Ok(items) = calls.try_iter() else {
        return Ok(None);
    };
    let items: Vec<Value> = items.collect();
    if items.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        if !matches!(item.kind(), minijinja::value::ValueKind::Map) {
            return Err(bad(
                "invalid_tool_call",
                "assistant tool_calls entries must be objects.",
            ));
        }
        let function = item.get_attr("function").unwrap_or_default();
        let kind = item.get_attr("type").ok().filter(|t| !t.is_undefined());
        if kind.is_some_and(|k| k.as_str() != Some("function"))
            || !matches!(function.kind(), minijinja::value::ValueKind::Map)
        {
            return Err(bad(
                "invalid_tool_call",
                "chat completions only support assistant tool_calls of type 'function'.",
            ));
        }
        let args = function.get_attr("arguments").unwrap_or_default();
        let parsed = match args.as_str() {
            _ if !args.is_true() => Dict::default().into_value(),
            Some(s) => serde_json::from_str::<PyJson>(s)
                .ok()
                .map(|v| v.0)
                .filter(|v| matches!(v.kind(), minijinja::value::ValueKind::Map))
                .unwrap_or_else(|| Dict::default().into_value()),
            None if matches!(args.kind(), minijinja::value::ValueKind::Map) => args,
            None => Dict::default().into_value(),
        };
        out.push(replace(
            &item,
            "function",
            replace(&function, "arguments", parsed),
        ));
    }
    Ok(Some(Value::from(out)))
}

/// A copy of the dict `map` with `key` set to `value`.
fn replace(map: &Value, key: &str, value: Value) -> Value {
    let mut d = Dict::default();
    for k in map.try_iter().into_iter().flatten() {
        let v = map.get_item(&k).unwrap_or_default();
        d.set(k, v);
    }
    d.set(key, value);
    d.into_value()
}

/// Why a chat could not be rendered: vLLM's 400 and its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RenderError(pub String);

/// The tag transformers appends to the message to continue, to find where it ends.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// `messages` as the template sees them (vLLM's key order: role, content, tool_calls,
/// reasoning, reasoning_content, tool_call_id, name).
fn conversation(messages: &[Message], template: &ChatTemplate) -> Vec<Dict> {
    let mut conv: Vec<Dict> = messages.iter().map(message_dict).collect();
    // The template's source is searched only for a chat that has a developer message: two
    // searches of a 4 KB source were 5% of the cache model's work on every request.
    let names_developer =
        |source: &str| source.contains("\"developer\"") || source.contains("'developer'");
    if messages.iter().any(|m| m.role == "developer") && !names_developer(template.source()) {
        for (d, m) in conv.iter_mut().zip(messages) {
            if m.role == "developer" {
                d.set("role", Value::from("system"));
            }
        }
        conv = consolidate_system(conv);
    }
    conv
}

fn message_dict(m: &Message) -> Dict {
    let mut d = Dict(Vec::with_capacity(4));
    d.set("role", Value::from(m.role.as_str()));
    d.set("content", Value::from(m.content.as_str()));
    if let Some(x) = &m.extra {
        if let Some(calls) = &x.tool_calls {
            d.set("tool_calls", calls.clone());
        }
        if let Some(r) = &x.reasoning {
            d.set("reasoning", r.clone());
            d.set("reasoning_content", r.clone());
        }
        if let Some(id) = &x.tool_call_id {
            d.set("tool_call_id", id.clone());
        }
        if let Some(n) = &x.name {
            d.set("name", Value::from(n.as_str()));
        }
    }
    if m.role == "developer" {
        d.set("tools", Value::from(()));
    }
    d
}

/// `_consolidate_system_messages`: every system message merged into one, first, when any is
/// not first already (their non-empty contents joined with a blank line).
fn consolidate_system(conv: Vec<Dict>) -> Vec<Dict> {
    let is_system = |d: &Dict| d.0.first().and_then(|(_, r)| r.as_str()) == Some("system");
    let content = |d: &Dict| -> String {
        d.0.iter()
            .find(|(k, _)| k.as_str() == Some("content"))
            .and_then(|(_, v)| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    let systems = conv.iter().filter(|d| is_system(d)).count();
    let needs = systems > 1 || (systems == 1 && !conv.first().is_some_and(is_system));
    if !needs {
        return conv;
    }
    let mut texts = Vec::new();
    let mut rest = Vec::with_capacity(conv.len());
    for d in conv {
        if is_system(&d) {
            let c = content(&d);
            if !c.is_empty() {
                texts.push(c);
            }
        } else {
            rest.push(d);
        }
    }
    let mut merged = Dict::default();
    merged.set("role", Value::from("system"));
    merged.set("content", Value::from(texts.join("\n\n")));
    let mut out = vec![merged];
    out.extend(rest);
    out
}

/// `messages` rendered through `template` as vLLM 0.33 renders a chat-completions request
/// with `options` (see the module documentation); the error is the 400's message.
pub fn render(
    template: &ChatTemplate,
    messages: &[Message],
    options: &ChatOptions,
) -> Result<String, RenderError> {
    if messages.is_empty() {
        return Err(RenderError(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
                .into(),
        ));
    }
    let mut conv = conversation(messages, template);
    let continuing = options.continue_final_message;
    if continuing {
        if options.add_generation_prompt {
            return Err(RenderError("continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead.".into()));
        }
        if !template.source().contains("content") {
            return Err(RenderError("continue_final_message is set to \"content\" but this is not an accepted field in the chat_template".into()));
        }
        if let Some(last) = conv.last_mut() {
            let text = format!("{}{CONTINUE_TAG}", messages[messages.len() - 1].content);
            last.set("content", Value::from(text));
        }
    }
    let mut vars: Vec<(&str, Value)> = Vec::with_capacity(options.kwargs.len() + 4);
    let documents = options
        .kwargs
        .iter()
        .find(|(k, _)| k == "documents")
        .map_or_else(|| Value::from(()), |(_, v)| v.clone());
    vars.push((
        "messages",
        Value::from(conv.into_iter().map(Dict::into_value).collect::<Vec<_>>()),
    ));
    vars.push((
        "tools",
        options.tools.clone().unwrap_or_else(|| Value::from(())),
    ));
    vars.push(("documents", documents));
    vars.push((
        "add_generation_prompt",
        Value::from(options.add_generation_prompt),
    ));
    for (k, v) in &options.kwargs {
        if k != "documents" {
            vars.push((k.as_str(), v.clone()));
        }
    }
    let text = template
        .render_with(vars)
        .map_err(|e| RenderError(template_reason(&e)))?;
    if !continuing {
        return Ok(text);
    }
    let last = &messages[messages.len() - 1].content;
    let tag = CONTINUE_TAG.trim();
    let Some(at) = text.rfind(tag).filter(|_| text.contains(last.trim())) else {
        return Err(RenderError(format!("continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible.Final message to continue: {}\nRendered chat:\n{text}", last.trim())));
    };
    if text[at..].starts_with(CONTINUE_TAG) {
        Ok(text[..at].to_owned())
    } else {
        Ok(text[..at].trim_end().to_owned())
    }
}

/// The template's own reason (what Jinja's `TemplateError` says in Python: the text of
/// `raise_exception`), else minijinja's description.
fn template_reason(e: &minijinja::Error) -> String {
    match (e.kind(), e.detail()) {
        (minijinja::ErrorKind::InvalidOperation, Some(d)) => d.to_owned(),
        _ => e.to_string(),
    }
}
