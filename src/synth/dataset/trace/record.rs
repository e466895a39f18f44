//! Trace lines as AIPerf 0.13.0's pydantic models read them (`MooncakeTrace`, `BailianTrace`):
//! lax coercion (numeric strings and integral floats become ints), the input-mode rules, and
//! errors that name the line and the field. Owns parsing only; must never generate content.

use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::{Number, Value};

use crate::synth::dataset::trace::input::over_ceiling;
use crate::synth::dataset::trace_kind::TraceKind;
use crate::synth::dataset::RawJson;

/// What a line asks to be sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// `input_length` tokens of synthesized content (from `hash_ids` blocks when given).
    Length(i64),
    /// `text_input`, sent verbatim.
    Text(String),
    /// `messages` (+ `tools`), sent verbatim.
    Messages {
        messages: RawJson,
        tools: Option<RawJson>,
    },
    /// `payload`, the whole request body, sent verbatim.
    Payload(RawJson),
}

/// Bailian's conversation links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chat {
    pub chat_id: i64,
    pub parent_chat_id: i64,
    pub turn: i64,
}

/// One parsed trace line.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// 1-based line number in the file.
    pub line: usize,
    pub input: Input,
    pub output_length: Option<i64>,
    /// Empty when the line has none.
    pub hash_ids: Vec<i64>,
    /// In ms (bailian's seconds already converted), int or float as written.
    pub timestamp: Option<Number>,
    pub delay: Option<Number>,
    /// Mooncake's `session_id` (an empty string counts as none, as in AIPerf).
    pub session_id: Option<String>,
    /// Bailian only.
    pub chat: Option<Chat>,
    pub extra: Option<RawJson>,
}

type Fields = HashMap<String, Box<RawValue>>;

/// Why a field was refused: `(field, message)`.
type FieldError = (String, String);

fn bad(field: &str, msg: impl Into<String>) -> FieldError {
    (field.to_owned(), msg.into())
}

fn value(raw: &RawValue) -> Value {
    // A RawValue is valid JSON by construction.
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

fn present<'a>(f: &'a Fields, key: &str) -> Option<&'a RawValue> {
    f.get(key).map(|b| &**b).filter(|r| r.get() != "null")
}

fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

/// pydantic's lax `int`: ints, integral floats, booleans and integer strings.
fn lax_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
                .map(|f| f as i64)
        }),
        Value::Bool(b) => Some(i64::from(*b)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn int_field(f: &Fields, key: &str) -> Result<Option<i64>, FieldError> {
    let Some(raw) = present(f, key) else {
        return Ok(None);
    };
    let v = value(raw);
    lax_int(&v)
        .map(Some)
        .ok_or_else(|| bad(key, format!("must be an integer, got {}", show(&v))))
}

/// pydantic's lax `int | float`: numbers keep their JSON form; strings become the number.
fn number_field(f: &Fields, key: &str) -> Result<Option<Number>, FieldError> {
    let Some(raw) = present(f, key) else {
        return Ok(None);
    };
    let v = value(raw);
    let n = match &v {
        // Floats are re-read from their text: serde_json's own float parsing may be one ULP
        // off, and Python's `float()` is correctly rounded.
        Value::Number(n) if n.is_f64() => raw
            .get()
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64),
        Value::Number(n) => Some(n.clone()),
        Value::Bool(b) => Some(Number::from(i64::from(*b))),
        Value::String(s) => {
            let t = s.trim();
            t.parse::<i64>()
                .ok()
                .map(Number::from)
                .or_else(|| t.parse::<f64>().ok().and_then(Number::from_f64))
        }
        _ => None,
    };
    n.map(Some)
        .ok_or_else(|| bad(key, format!("must be a number, got {}", show(&v))))
}

fn str_field(f: &Fields, key: &str) -> Result<Option<String>, FieldError> {
    let Some(raw) = present(f, key) else {
        return Ok(None);
    };
    match value(raw) {
        Value::String(s) => Ok(Some(s)),
        v => Err(bad(key, format!("must be a string, got {}", show(&v)))),
    }
}

fn hash_ids_field(f: &Fields, key: &str) -> Result<Option<Vec<i64>>, FieldError> {
    let Some(raw) = present(f, key) else {
        return Ok(None);
    };
    let v = value(raw);
    let Value::Array(items) = &v else {
        return Err(bad(
            key,
            format!("must be a list of integers, got {}", show(&v)),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            lax_int(x)
                .ok_or_else(|| bad(key, format!("item {i} must be an integer, got {}", show(x))))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn raw_field(f: &Fields, key: &str) -> Option<RawJson> {
    present(f, key).map(|r| RawJson(r.to_owned()))
}

/// `extra`: an object (or absent).
fn extra_field(f: &Fields) -> Result<Option<RawJson>, FieldError> {
    let Some(raw) = present(f, "extra") else {
        return Ok(None);
    };
    match value(raw) {
        Value::Object(_) => Ok(Some(RawJson(raw.to_owned()))),
        v => Err(bad("extra", format!("must be an object, got {}", show(&v)))),
    }
}

/// A line parsed as `kind`, or `(field, why)`.
pub fn parse(kind: TraceKind, line: usize, text: &str) -> Result<Entry, FieldError> {
    let fields: Fields = serde_json::from_str(text).map_err(|e| {
        if serde_json::from_str::<Value>(text).is_ok() {
            bad("", "is not a JSON object; each line must be one object")
        } else {
            bad("", format!("is not valid JSON: {e}"))
        }
    })?;
    match kind {
        TraceKind::MooncakeTrace => mooncake(line, &fields),
        TraceKind::BailianTrace => bailian(line, &fields),
        TraceKind::WekaTrace | TraceKind::BurstGptTrace | TraceKind::Tracelab => Err(bad(
            "",
            format!("is not read line by line: {kind} has its own reader"),
        )),
    }
}

fn mooncake(line: usize, f: &Fields) -> Result<Entry, FieldError> {
    check_type(f)?;
    let input_length = within_ceiling("input_length", int_field(f, "input_length")?)?;
    let text_input = str_field(f, "text_input")?;
    let messages = raw_field(f, "messages");
    let payload = raw_field(f, "payload");
    let modes = [
        input_length.is_some(),
        text_input.is_some(),
        messages.is_some(),
        payload.is_some(),
    ];
    check_one_mode(&modes)?;
    let hash_ids = hash_ids_field(f, "hash_ids")?;
    if hash_ids.is_some() && input_length.is_none() {
        return Err(bad(
            "hash_ids",
            "is only allowed with 'input_length', not with 'text_input', 'messages' or 'payload'",
        ));
    }
    let tools = raw_field(f, "tools");
    check_raw_inputs(tools.as_ref(), messages.as_ref(), payload.as_ref())?;
    let input = match (input_length, text_input, messages, payload) {
        (Some(n), ..) => Input::Length(n),
        (_, Some(t), ..) => Input::Text(t),
        (_, _, Some(messages), _) => Input::Messages { messages, tools },
        (_, _, _, Some(p)) => Input::Payload(p),
        // Exactly one mode was counted above.
        _ => return Err(bad("input_length", "is missing")),
    };
    Ok(Entry {
        line,
        input,
        output_length: output_length(int_field(f, "output_length")?)?,
        hash_ids: hash_ids.unwrap_or_default(),
        timestamp: number_field(f, "timestamp")?,
        delay: number_field(f, "delay")?,
        session_id: str_field(f, "session_id")?.filter(|s| !s.is_empty()),
        chat: None,
        extra: extra_field(f)?,
    })
}

/// A mooncake line's `type`, when given, is "mooncake_trace".
fn check_type(f: &Fields) -> Result<(), FieldError> {
    if let Some(raw) = present(f, "type") {
        let v = value(raw);
        if v != Value::String("mooncake_trace".into()) {
            return Err(bad(
                "type",
                format!(
                    "is {} but a mooncake_trace line may only say \"mooncake_trace\"",
                    show(&v)
                ),
            ));
        }
    }
    Ok(())
}

/// Exactly one of the four input modes is given.
fn check_one_mode(modes: &[bool]) -> Result<(), FieldError> {
    match modes.iter().filter(|m| **m).count() {
        0 => Err(bad(
            "input_length",
            "is missing: exactly one of 'input_length', 'text_input', 'messages' or 'payload' \
             must be given",
        )),
        1 => Ok(()),
        _ => Err(bad(
            "input_length",
            "'input_length', 'text_input', 'messages' and 'payload' are mutually exclusive; \
             keep one of them",
        )),
    }
}

/// `tools` (only with `messages`: a non-empty list of objects), `messages` (a non-empty list of
/// objects with a role) and `payload` (a non-empty object).
fn check_raw_inputs(
    tools: Option<&RawJson>,
    messages: Option<&RawJson>,
    payload: Option<&RawJson>,
) -> Result<(), FieldError> {
    if let Some(t) = tools {
        if messages.is_none() {
            return Err(bad("tools", "is only allowed when 'messages' is given"));
        }
        let ok = matches!(serde_json::from_str::<Value>(t.get()),
            Ok(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_object));
        if !ok {
            return Err(bad("tools", "must be a non-empty list of objects"));
        }
    }
    if let Some(m) = messages {
        match serde_json::from_str::<Value>(m.get()) {
            Ok(Value::Array(a)) if !a.is_empty() => {
                if let Some(i) = a
                    .iter()
                    .position(|x| !x.as_object().is_some_and(|o| o.contains_key("role")))
                {
                    return Err(bad(
                        "messages",
                        format!("each message must have a 'role' key, but message {i} does not"),
                    ));
                }
            }
            _ => return Err(bad("messages", "must be a non-empty list")),
        }
    }
    if let Some(p) = payload {
        if !matches!(serde_json::from_str::<Value>(p.get()), Ok(Value::Object(o)) if !o.is_empty())
        {
            return Err(bad("payload", "must be a non-empty object"));
        }
    }
    Ok(())
}

/// AIPerf's `Turn.max_tokens` is `ge=1`: a smaller `output_length` fails its validation.
fn output_length(n: Option<i64>) -> Result<Option<i64>, FieldError> {
    match n {
        Some(n) if n < 1 => Err(bad(
            "output_length",
            format!("is {n}, but it must be at least 1 (AIPerf refuses max_tokens below 1)"),
        )),
        other => within_ceiling("output_length", other),
    }
}

/// A token count within kvbust's per-request ceiling (AIPerf's models take any integer).
fn within_ceiling(key: &str, n: Option<i64>) -> Result<Option<i64>, FieldError> {
    match n.and_then(over_ceiling) {
        Some(why) => Err(bad(key, why)),
        None => Ok(n),
    }
}

fn required<T>(v: Option<T>, key: &str) -> Result<T, FieldError> {
    v.ok_or_else(|| bad(key, "is required in a bailian_trace line"))
}

fn bailian(line: usize, f: &Fields) -> Result<Entry, FieldError> {
    let chat_id = required(int_field(f, "chat_id")?, "chat_id")?;
    let parent_chat_id = int_field(f, "parent_chat_id")?.unwrap_or(-1);
    // `float` field: the trace's seconds, then AIPerf's `timestamp * 1000.0`.
    let seconds = required(number_field(f, "timestamp")?, "timestamp")?;
    let ms = seconds
        .as_f64()
        .map(|s| s * 1000.0)
        .and_then(Number::from_f64)
        .ok_or_else(|| bad("timestamp", "must be a finite number of seconds"))?;
    let input_length = required(
        within_ceiling("input_length", int_field(f, "input_length")?)?,
        "input_length",
    )?;
    let output_length = output_length(Some(required(
        int_field(f, "output_length")?,
        "output_length",
    )?))?;
    str_field(f, "type")?;
    let turn = int_field(f, "turn")?.unwrap_or(1);
    let hash_ids = match f.get("hash_ids") {
        Some(r) if r.get() == "null" => {
            return Err(bad("hash_ids", "must be a list of integers, got null"))
        }
        _ => hash_ids_field(f, "hash_ids")?.unwrap_or_default(),
    };
    // BailianTrace allows extra keys, and AIPerf reads `text_input`, `delay` and `extra`
    // through getattr, so a stray one is honoured.
    let input = match str_field(f, "text_input")? {
        Some(t) => Input::Text(t),
        None => Input::Length(input_length),
    };
    Ok(Entry {
        line,
        input,
        output_length,
        hash_ids,
        timestamp: Some(ms),
        delay: number_field(f, "delay")?,
        session_id: None,
        chat: Some(Chat {
            chat_id,
            parent_chat_id,
            turn,
        }),
        extra: extra_field(f)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lax_coercion_follows_pydantic() {
        let e = parse(
            TraceKind::MooncakeTrace,
            1,
            r#"{"input_length":"10","hash_ids":[1.0,"2",true],"timestamp":"5","delay":2.5}"#,
        )
        .unwrap();
        assert_eq!(e.input, Input::Length(10));
        assert_eq!(e.hash_ids, [1, 2, 1]);
        assert_eq!(e.timestamp, Some(Number::from(5)));
        assert_eq!(e.delay.unwrap().to_string(), "2.5");
        let err = parse(TraceKind::MooncakeTrace, 1, r#"{"input_length":10.5}"#).unwrap_err();
        assert_eq!(err.0, "input_length");
        let err = parse(TraceKind::MooncakeTrace, 1, r#"{"text_input":5}"#).unwrap_err();
        assert_eq!(err.0, "text_input");
    }

    #[test]
    fn input_modes_are_exclusive() {
        let p = |s| parse(TraceKind::MooncakeTrace, 3, s);
        // (line, the field the error names); bailian's request type is not a mooncake type.
        for (line, field) in [
            (r#"{"output_length":4}"#, "input_length"),
            (r#"{"input_length":4,"text_input":"x"}"#, "input_length"),
            (r#"{"text_input":"x","hash_ids":[1]}"#, "hash_ids"),
            (r#"{"messages":[{"content":"x"}]}"#, "messages"),
            (r#"{"payload":{}}"#, "payload"),
            (r#"{"text_input":"x","tools":[{}]}"#, "tools"),
            (r#"{"input_length":4,"type":"text"}"#, "type"),
        ] {
            assert_eq!(p(line).unwrap_err().0, field, "{line}");
        }
        let e = p(r#"{"payload":{"b":1,"a":[2]},"session_id":""}"#).unwrap();
        assert_eq!(
            e.input,
            Input::Payload(RawJson(
                RawValue::from_string(r#"{"b":1,"a":[2]}"#.into()).unwrap()
            ))
        );
        assert_eq!(e.session_id, None);
        assert!(p("[1]").unwrap_err().1.contains("not a JSON object"));
        assert!(p("{").unwrap_err().1.contains("not valid JSON"));
    }

    #[test]
    fn bailian_seconds_become_ms() {
        let e = parse(
            TraceKind::BailianTrace,
            1,
            r#"{"chat_id":1,"timestamp":2.4899999999999998,"input_length":3,"output_length":4,"type":"text"}"#,
        )
        .unwrap();
        assert_eq!(e.timestamp.unwrap().to_string(), "2489.9999999999995");
        assert_eq!(
            e.chat,
            Some(Chat {
                chat_id: 1,
                parent_chat_id: -1,
                turn: 1
            })
        );
        let e = parse(
            TraceKind::BailianTrace,
            1,
            r#"{"chat_id":1,"timestamp":2,"input_length":3,"output_length":4}"#,
        )
        .unwrap();
        assert_eq!(e.timestamp.unwrap().to_string(), "2000.0");
        let err = parse(
            TraceKind::BailianTrace,
            1,
            r#"{"timestamp":2,"input_length":3,"output_length":4}"#,
        )
        .unwrap_err();
        assert_eq!(err.0, "chat_id");
    }
}
