//! The Weka kv-cache-tester trace schema (AIPerf 0.13.0's `weka_trace_models`): a trace file's
//! JSON checked field by field, unknown fields refused, every error naming its JSON path.
//! Owns parsing and validation of one trace; never reconstructs anything.

use serde_json::{Map, Value};

use crate::synth::dataset::trace::input::{bad_seconds, over_ceiling};

/// One normal (`"n"`) or streaming (`"s"`) API call.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Seconds from the conversation start.
    pub t: f64,
    pub model: String,
    /// `in`: input tokens.
    pub input_length: i64,
    /// `out`: output tokens.
    pub output_length: i64,
    pub hash_ids: Vec<i64>,
    pub input_types: Vec<String>,
    pub stop: String,
    pub api_time: Option<f64>,
    pub think_time: Option<f64>,
}

/// A `"subagent"` marker with its own requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Subagent {
    pub t: f64,
    pub agent_id: String,
    pub duration_ms: Option<i64>,
    pub requests: Vec<Request>,
    pub tool_tokens: i64,
    pub system_tokens: i64,
}

/// One entry of a trace's `requests`.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Request(Request),
    Subagent(Subagent),
}

/// One Weka trace (one file, or one line of a cc-traces JSON-lines export).
#[derive(Debug, Clone, PartialEq)]
pub struct WekaTrace {
    pub id: String,
    /// The block size the trace declares (AIPerf's `aiperf profile` replays at 64 unless
    /// `--isl-block-size` says otherwise; see [`super::weka`]).
    pub block_size: i64,
    pub tool_tokens: i64,
    pub system_tokens: i64,
    pub requests: Vec<Entry>,
}

/// A schema violation at a JSON path (`requests[3].in`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

type R<T> = Result<T, SchemaError>;

fn err<T>(path: &str, message: impl Into<String>) -> R<T> {
    Err(SchemaError {
        path: path.to_owned(),
        message: message.into(),
    })
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// What a JSON value is, for messages ("a string", "null").
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An object's fields, read once each; whatever is left over is an unknown field.
struct Fields<'a> {
    path: &'a str,
    map: &'a Map<String, Value>,
    known: &'static [&'static str],
}

impl<'a> Fields<'a> {
    fn new(path: &'a str, v: &'a Value, known: &'static [&'static str]) -> R<Self> {
        match v {
            Value::Object(map) => {
                if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
                    return err(
                        &join(path, k),
                        format!(
                            "unknown field (the Weka trace schema forbids extra fields; known \
                             here: {})",
                            known.join(", ")
                        ),
                    );
                }
                Ok(Fields { path, map, known })
            }
            other => err(path, format!("must be an object, not {}", kind(other))),
        }
    }

    fn get(&self, key: &str) -> Option<(&'a Value, String)> {
        debug_assert!(self.known.contains(&key));
        self.map
            .get(key)
            .filter(|v| !v.is_null())
            .map(|v| (v, join(self.path, key)))
    }

    fn required(&self, key: &str) -> R<(&'a Value, String)> {
        self.get(key)
            .map_or_else(|| err(&join(self.path, key), "is missing"), Ok)
    }

    fn string(&self, key: &str) -> R<String> {
        let (v, p) = self.required(key)?;
        as_string(v, &p)
    }

    fn float(&self, key: &str) -> R<f64> {
        let (v, p) = self.required(key)?;
        as_float(v, &p)
    }

    fn opt_float(&self, key: &str) -> R<Option<f64>> {
        self.get(key).map(|(v, p)| as_float(v, &p)).transpose()
    }

    fn int(&self, key: &str) -> R<i64> {
        let (v, p) = self.required(key)?;
        as_int(v, &p)
    }

    fn opt_int(&self, key: &str) -> R<Option<i64>> {
        self.get(key).map(|(v, p)| as_int(v, &p)).transpose()
    }

    fn int_or_zero(&self, key: &str) -> R<i64> {
        Ok(self.opt_int(key)?.unwrap_or(0))
    }

    fn strings(&self, key: &str) -> R<Vec<String>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some((v, p)) => array(v, &p)?
                .iter()
                .enumerate()
                .map(|(i, x)| as_string(x, &format!("{p}[{i}]")))
                .collect(),
        }
    }
}

fn array<'v>(v: &'v Value, path: &str) -> R<&'v Vec<Value>> {
    v.as_array().map_or_else(
        || err(path, format!("must be an array, not {}", kind(v))),
        Ok,
    )
}

fn as_string(v: &Value, path: &str) -> R<String> {
    v.as_str().map(str::to_owned).map_or_else(
        || err(path, format!("must be a string, not {}", kind(v))),
        Ok,
    )
}

fn as_float(v: &Value, path: &str) -> R<f64> {
    match v.as_f64() {
        Some(x) if v.is_number() => Ok(x),
        _ => err(path, format!("must be a number, not {}", kind(v))),
    }
}

/// An integer: a JSON integer, or a number with no fractional part (pydantic's lax int).
fn as_int(v: &Value, path: &str) -> R<i64> {
    if let Some(i) = v.as_i64() {
        return Ok(i);
    }
    match v.as_f64() {
        Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Ok(x as i64),
        Some(_) if v.is_u64() => err(path, "is out of range for a 64-bit integer"),
        Some(x) => err(path, format!("must be an integer, not {x}")),
        None => err(path, format!("must be an integer, not {}", kind(v))),
    }
}

fn non_negative(x: i64, path: &str, what: &str) -> R<i64> {
    if x < 0 {
        return err(path, format!("is {x}, but {what} cannot be negative"));
    }
    if let Some(why) = over_ceiling(x) {
        return err(path, why);
    }
    Ok(x)
}

/// A time in seconds within kvbust's bound (AIPerf's `float` fields take any value).
fn seconds(x: f64, path: &str) -> R<f64> {
    match bad_seconds(x) {
        Some(why) => err(path, why),
        None => Ok(x),
    }
}

fn opt_seconds(x: Option<f64>, path: &str) -> R<Option<f64>> {
    x.map(|x| seconds(x, path)).transpose()
}

const REQUEST_FIELDS: &[&str] = &[
    "t",
    "type",
    "model",
    "in",
    "input_length",
    "out",
    "output_length",
    "hash_ids",
    "input_types",
    "output_types",
    "stop",
    "api_time",
    "think_time",
];
const STREAMING_FIELDS: &[&str] = &[
    "t",
    "type",
    "model",
    "in",
    "input_length",
    "out",
    "output_length",
    "hash_ids",
    "input_types",
    "output_types",
    "stop",
    "api_time",
    "think_time",
    "ttft",
];
const SUBAGENT_FIELDS: &[&str] = &[
    "t",
    "type",
    "agent_id",
    "subagent_type",
    "duration_ms",
    "total_tokens",
    "tool_use_count",
    "status",
    "requests",
    "models",
    "tool_tokens",
    "system_tokens",
];
const TRACE_FIELDS: &[&str] = &[
    "id",
    "models",
    "block_size",
    "hash_id_scope",
    "tool_tokens",
    "system_tokens",
    "requests",
    "totals",
];

/// `in` / `input_length` (the alias and the field name are both accepted, as pydantic's
/// `populate_by_name` does; the alias wins when both are given).
fn length(f: &Fields, alias: &str, name: &str) -> R<i64> {
    let (v, p) = match f.get(alias).or_else(|| f.get(name)) {
        Some(found) => found,
        None => return err(&join(f.path, alias), "is missing"),
    };
    non_negative(as_int(v, &p)?, &p, "a token count")
}

fn request(v: &Value, path: &str, streaming: bool) -> R<Request> {
    let known = if streaming {
        STREAMING_FIELDS
    } else {
        REQUEST_FIELDS
    };
    let f = Fields::new(path, v, known)?;
    let hash_ids = match f.get("hash_ids") {
        None => Vec::new(),
        Some((v, p)) => array(v, &p)?
            .iter()
            .enumerate()
            .map(|(i, x)| as_int(x, &format!("{p}[{i}]")))
            .collect::<R<_>>()?,
    };
    // Checked for their type only (AIPerf keeps them; kvbust does not need them).
    f.strings("output_types")?;
    if streaming {
        f.opt_float("ttft")?;
    }
    let stop = match f.get("stop") {
        Some((v, p)) => as_string(v, &p)?,
        None => String::new(),
    };
    Ok(Request {
        t: seconds(f.float("t")?, &join(path, "t"))?,
        model: f.string("model")?,
        input_length: length(&f, "in", "input_length")?,
        output_length: length(&f, "out", "output_length")?,
        hash_ids,
        input_types: f.strings("input_types")?,
        stop,
        api_time: opt_seconds(f.opt_float("api_time")?, &join(path, "api_time"))?,
        think_time: opt_seconds(f.opt_float("think_time")?, &join(path, "think_time"))?,
    })
}

fn type_tag<'v>(v: &'v Value, path: &str) -> R<&'v str> {
    let tag = v.get("type");
    match tag.and_then(Value::as_str) {
        Some(t @ ("n" | "s" | "subagent")) => Ok(t),
        Some(other) => err(
            &join(path, "type"),
            format!("is {other:?}; a Weka request type is \"n\", \"s\" or \"subagent\""),
        ),
        None if v.is_object() => err(
            &join(path, "type"),
            "is missing; a Weka request type is \"n\", \"s\" or \"subagent\"",
        ),
        None => err(path, format!("must be an object, not {}", kind(v))),
    }
}

fn inner_request(v: &Value, path: &str) -> R<Request> {
    match type_tag(v, path)? {
        "subagent" => err(
            &join(path, "type"),
            "a subagent's requests are \"n\" or \"s\" calls; nested subagents are not part of \
             the schema",
        ),
        t => request(v, path, t == "s"),
    }
}

fn subagent(v: &Value, path: &str) -> R<Subagent> {
    let f = Fields::new(path, v, SUBAGENT_FIELDS)?;
    f.string("subagent_type")?;
    f.string("status")?;
    f.opt_int("total_tokens")?;
    f.opt_int("tool_use_count")?;
    f.strings("models")?;
    f.required("models")?;
    let (reqs, rp) = f.required("requests")?;
    let reqs = array(reqs, &rp)?;
    if reqs.is_empty() {
        return err(
            &rp,
            "is empty: a subagent with no requests has nothing to replay (its child \
             conversation would have no turns); drop the marker or record its calls",
        );
    }
    let requests = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| inner_request(r, &format!("{rp}[{i}]")))
        .collect::<R<_>>()?;
    Ok(Subagent {
        t: seconds(f.float("t")?, &join(path, "t"))?,
        agent_id: f.string("agent_id")?,
        duration_ms: f.opt_int("duration_ms")?,
        requests,
        tool_tokens: non_negative(
            f.int_or_zero("tool_tokens")?,
            &join(path, "tool_tokens"),
            "a token count",
        )?,
        system_tokens: non_negative(
            f.int_or_zero("system_tokens")?,
            &join(path, "system_tokens"),
            "a token count",
        )?,
    })
}

/// Checks one trace object against the schema.
pub fn parse(v: &Value) -> R<WekaTrace> {
    let f = Fields::new("", v, TRACE_FIELDS)?;
    let id = f.string("id")?;
    f.required("models")?;
    f.strings("models")?;
    let block_size = f.int("block_size")?;
    if block_size <= 0 {
        return err(
            "block_size",
            format!("is {block_size}; it must be at least 1"),
        );
    }
    match f.get("hash_id_scope") {
        Some((Value::String(s), _)) if s == "local" => {}
        Some((Value::String(s), p)) => {
            return err(
                &p,
                format!(
                    "is {s:?}; only \"local\" (hash ids scoped to this trace) is supported, as \
                     in AIPerf: a global scope would need cross-trace coordination"
                ),
            )
        }
        Some((other, p)) => return err(&p, format!("must be \"local\", not {}", kind(other))),
        None => return err("hash_id_scope", "is missing (it must be \"local\")"),
    }
    if let Some((t, p)) = f.get("totals") {
        if !t.is_object() {
            return err(&p, format!("must be an object, not {}", kind(t)));
        }
    }
    let (reqs, rp) = f.required("requests")?;
    let requests = array(reqs, &rp)?
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let p = format!("requests[{i}]");
            match type_tag(r, &p)? {
                "subagent" => subagent(r, &p).map(Entry::Subagent),
                t => request(r, &p, t == "s").map(Entry::Request),
            }
        })
        .collect::<R<_>>()?;
    let trace = WekaTrace {
        id,
        block_size,
        tool_tokens: non_negative(
            f.int_or_zero("tool_tokens")?,
            "tool_tokens",
            "a token count",
        )?,
        system_tokens: non_negative(
            f.int_or_zero("system_tokens")?,
            "system_tokens",
            "a token count",
        )?,
        requests,
    };
    check_blocks(&trace)?;
    Ok(trace)
}

/// Every request's hash ids fit its input at the trace's declared block size: `n` hash ids
/// need more than `(n - 1) * block_size` tokens. More ids than that means the ids were
/// recorded at another block size than the trace declares (or `in` is wrong), and a hash id
/// would then stand for blocks of two sizes.
fn check_blocks(trace: &WekaTrace) -> R<()> {
    let bs = trace.block_size;
    let check = |r: &Request, path: String| -> R<()> {
        let n = r.hash_ids.len() as i64;
        if n > 0 && (n - 1).saturating_mul(bs) >= r.input_length {
            return err(
                &format!("{path}.hash_ids"),
                format!(
                    "holds {n} hash ids, which need more than {} input tokens at the trace's \
                     block_size {bs}, but `in` is {}: the hash ids were recorded at another \
                     block size than the trace declares (a hash id reused at a different block \
                     size), or `in` is wrong",
                    (n - 1) * bs,
                    r.input_length
                ),
            );
        }
        Ok(())
    };
    for (i, e) in trace.requests.iter().enumerate() {
        match e {
            Entry::Request(r) => check(r, format!("requests[{i}]"))?,
            Entry::Subagent(s) => {
                for (j, r) in s.requests.iter().enumerate() {
                    check(r, format!("requests[{i}].requests[{j}]"))?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"id": "t", "models": ["m"], "block_size": 4, "hash_id_scope": "local",
               "requests": [{"t": 0.5, "type": "n", "model": "m", "in": 9, "out": 3,
                             "hash_ids": [1, 2, 3]},
                            {"t": 1, "type": "subagent", "agent_id": "a", "subagent_type": "x",
                             "status": "completed", "models": ["m"],
                             "requests": [{"t": 2, "type": "s", "model": "m", "input_length": 4,
                                           "out": 0, "ttft": 0.1}]}]})
    }

    fn error_of(v: Value) -> String {
        parse(&v).unwrap_err().to_string()
    }

    #[test]
    fn reads_a_trace() {
        let t = parse(&base()).unwrap();
        assert_eq!(t.id, "t");
        let Entry::Subagent(s) = &t.requests[1] else {
            panic!("second entry is the subagent")
        };
        assert_eq!(s.requests[0].input_length, 4);
        assert_eq!(s.requests[0].output_length, 0);
    }

    #[test]
    fn errors_name_the_json_path() {
        type Edit = fn(&mut Value);
        let table: Vec<(Edit, &str)> = vec![
            (
                |v| v["requests"][0]["extra"] = json!(1),
                "requests[0].extra: unknown field",
            ),
            (
                |v| v["requests"][0]["in"] = json!(-5),
                "requests[0].in: is -5, but a token count cannot be negative",
            ),
            (
                |v| {
                    v["requests"][0].as_object_mut().unwrap().remove("in");
                },
                "requests[0].in: is missing",
            ),
            (
                |v| v["hash_id_scope"] = json!("global"),
                "hash_id_scope: is \"global\"",
            ),
            (
                |v| v["requests"][1]["requests"] = json!([]),
                "requests[1].requests: is empty",
            ),
            (
                |v| {
                    v["requests"][1].as_object_mut().unwrap().remove("requests");
                },
                "requests[1].requests: is missing",
            ),
            (
                |v| v["requests"][0]["hash_ids"] = json!([1, 2, 3, 4]),
                "requests[0].hash_ids: holds 4 hash ids",
            ),
            (
                |v| v["requests"][0]["type"] = json!("x"),
                "requests[0].type: is \"x\"",
            ),
            (|v| v["block_size"] = json!(0), "block_size: is 0"),
            (
                |v| v["requests"][1]["requests"][0]["ttft"] = json!("soon"),
                "requests[1].requests[0].ttft: must be a number",
            ),
        ];
        for (edit, want) in table {
            let mut v = base();
            edit(&mut v);
            let e = error_of(v);
            assert!(e.starts_with(want), "{e:?} does not start with {want:?}");
        }
    }
}
