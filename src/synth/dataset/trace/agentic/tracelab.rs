//! TraceLab (uw-syfi) agentic coding traces as AIPerf 0.13.0's `tracelab` loader reads them:
//! one JSONL row per LLM round (plain or gzipped) grouped into sessions, rounds ordered by
//! submission time, hash ids minted from the engine's prefix/append token split, subagents
//! recovered by timing containment, each root session turned into a Weka trace for
//! [`super::weka`]. Owns reading TraceLab rows and that conversion; never reconstructs prompts
//! and never writes anything.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde_json::{Map, Value};

use super::schema::{Entry, Request, Subagent, WekaTrace};
use super::{weka, AgenticError};
use crate::synth::dataset::trace::input::{self, TraceReader};
use crate::synth::dataset::trace_kind::TraceKind;
use crate::synth::error::SynthError;

/// The `tracelab` plugin's `default_block_size` (`--isl-block-size` overrides it). TraceLab
/// records no block size, so this is the size the block ids are synthesized at.
pub const DEFAULT_BLOCK_SIZE: usize = TraceKind::Tracelab.default_block_size();

/// `AIPERF_DATASET_TRACELAB_MIN_SPAWN_MS` at its default: shorter Agent/Task calls are no-op or
/// error returns, and admitting them widens windows enough to capture unrelated sessions.
const MIN_SPAWN_MS: f64 = 10_000.0;

/// Claude Code spawns a subagent through one blocking call of these tools.
const CLAUDE_SPAWN_TOOLS: [&str; 2] = ["Agent", "Task"];

/// The keys AIPerf's `can_load` looks for in the first row: together they occur in no other
/// format it reads.
const DETECT_KEYS: [&str; 6] = [
    "session_id",
    "round_index",
    "input_tokens_total",
    "prefix_tokens",
    "newly_append_tokens",
    "timing_events",
];

/// Whether the top-level keys of a file's first object are TraceLab's (AIPerf's `can_load`
/// on the first row: an object holding every detection key).
pub fn tracelab_keys(keys: &[String]) -> bool {
    DETECT_KEYS.iter().all(|k| keys.iter().any(|x| x == k))
}

/// Whether `bytes` (already gunzipped) look like TraceLab: the detection keys on the first
/// row.
pub fn looks_like_tracelab(bytes: &[u8]) -> bool {
    tracelab_keys(&input::top_level_keys(bytes))
}

/// The token counts of a row AIPerf reads with `int(row.get(k) or 0)` (output and reasoning
/// tokens add up to one request's output).
const TOKEN_FIELDS: [&str; 4] = [
    "input_tokens_total",
    "prefix_tokens",
    "output_tokens",
    "reasoning_output_tokens",
];

/// The highest `round_index` kvbust orders exactly: it compares them as f64, which holds every
/// integer up to 2^53 (AIPerf's Python ints have no bound).
const MAX_ROUND_INDEX: f64 = 9_007_199_254_740_992.0;

/// kvbust's range checks on a row, stricter than AIPerf (whose loader reads these with `int()`
/// and no bound, and never reads `newly_append_tokens`): every token count within
/// [`input::MAX_REQUEST_TOKENS`], `newly_append_tokens` a count (0 or more), a numeric
/// `round_index` a whole number in 0..=2^53.
fn check_row(obj: &Map<String, Value>) -> Result<(), FieldError> {
    let count = |key: &str| -> Result<i64, FieldError> {
        match obj.get(key) {
            Some(v) if truthy(v) => py_int(v).map_err(|m| (key.to_owned(), m)),
            _ => Ok(0),
        }
    };
    let mut output = 0i64;
    for key in TOKEN_FIELDS {
        let n = count(key)?;
        if let Some(why) = input::over_ceiling(n) {
            return Err((key.to_owned(), why));
        }
        if key != "input_tokens_total" && key != "prefix_tokens" {
            output = output.saturating_add(n);
        }
    }
    if let Some(why) = input::over_ceiling(output) {
        return Err((
            "output_tokens".into(),
            format!("plus reasoning_output_tokens {why}"),
        ));
    }
    let appended = count("newly_append_tokens")?;
    if appended < 0 {
        return Err((
            "newly_append_tokens".into(),
            format!("is {appended}, but a token count cannot be negative"),
        ));
    }
    if let Some(why) = input::over_ceiling(appended) {
        return Err(("newly_append_tokens".into(), why));
    }
    if let Some(Value::Number(n)) = obj.get("round_index") {
        let x = n.as_f64().unwrap_or(f64::INFINITY);
        if !(0.0..=MAX_ROUND_INDEX).contains(&x) || x.fract() != 0.0 {
            return Err((
                "round_index".into(),
                format!(
                    "is {n}; kvbust orders rounds by a whole round_index from 0 to 2^53 (AIPerf \
                     sorts any number)"
                ),
            ));
        }
    }
    Ok(())
}

/// A bad field of a row: (JSON path inside the row, why).
type FieldError = (String, String);

/// A bad field and the line of its row.
type LineError = (usize, FieldError);

/// A dated round: (submission time, api_time, the row).
type Timed<'s> = (f64, Option<f64>, &'s Round);

/// A spawn window of one session: (start, end, duration_ms).
type Window = (f64, f64, i64);

/// A spawn window with its session: (start, end, parent index, duration_ms).
type ParentWindow = (f64, f64, usize, i64);

/// Who ran a session: its first row's (`user`, `project`).
type Ident = (PyKey, PyKey);

/// Python's truthiness of a JSON value (`row.get(k) or default` falls back on these).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

use super::schema::kind;

/// Python's `int(v)` for a truthy JSON value: integers as they are, floats truncated, booleans
/// 0/1, decimal strings parsed; anything else is refused as `int()` refuses it.
fn py_int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Ok(i);
            }
            match n.as_f64() {
                // Beyond i64 only as an unsigned integer or a huge float.
                Some(x) if x.trunc().abs() < 9.2e18 => Ok(x.trunc() as i64),
                _ => Err(format!("{n} is too large for a token count")),
            }
        }
        Value::String(s) => {
            let t = s.trim();
            let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
            // Python's int(str): digits, single underscores only between digits.
            let ok = !digits.is_empty()
                && !digits.starts_with('_')
                && !digits.ends_with('_')
                && !digits.contains("__")
                && digits.chars().all(|c| c.is_ascii_digit() || c == '_');
            let parsed = ok.then(|| t.replace('_', "").parse::<i64>().ok()).flatten();
            parsed.ok_or_else(|| format!("is {s:?}, which is not an integer"))
        }
        other => Err(format!("must be an integer, not {}", kind(other))),
    }
}

/// A hashable Python value used as a dict key (`user`, `project`): Python's `1 == 1.0 == True`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum PyKey {
    None,
    Num(u64),
    Str(String),
}

fn py_key(v: Option<&Value>) -> Result<PyKey, String> {
    let num = |x: f64| PyKey::Num(if x == 0.0 { 0 } else { x.to_bits() });
    match v {
        None | Some(Value::Null) => Ok(PyKey::None),
        Some(Value::Bool(b)) => Ok(num(f64::from(u8::from(*b)))),
        Some(Value::Number(n)) => Ok(num(n.as_f64().unwrap_or(f64::NAN))),
        Some(Value::String(s)) => Ok(PyKey::Str(s.clone())),
        Some(other) => Err(format!(
            "must be a string (it groups sessions for the subagent join), not {}",
            kind(other)
        )),
    }
}

/// `round_index` as the tie-break of AIPerf's sort (`row.get("round_index") or 0`).
#[derive(Debug, Clone, PartialEq)]
enum RoundKey {
    Num(f64),
    Str(String),
}

/// ISO-8601 → POSIX seconds as AIPerf's `parse_ts` computes it: `Z` read as `+00:00`, naive
/// times as UTC, Python 3.11's `datetime.fromisoformat` forms (extended or basic date, any
/// one-character separator, `HH[:MM[:SS[.f]]]`, fractions cut at microseconds, `±HH[:MM[:SS]]`
/// offsets), and `timestamp()`'s integer-microseconds-over-10⁶ division.
fn parse_ts(raw: &str) -> Result<f64, String> {
    let bad = || format!("is {raw:?}, which is not an ISO-8601 timestamp");
    let s = raw.replace('Z', "+00:00");
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = b.get(from..from + len)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0i64, |a, d| a * 10 + i64::from(d - b'0')))
    };
    // The date: YYYY-MM-DD or YYYYMMDD.
    let (year, month, day, date_len) = if b.get(4) == Some(&b'-') {
        if b.get(7) != Some(&b'-') {
            return Err(bad());
        }
        (num(0, 4), num(5, 2), num(8, 2), 10)
    } else {
        (num(0, 4), num(4, 2), num(6, 2), 8)
    };
    let (Some(year), Some(month), Some(day)) = (year, month, day) else {
        return Err(bad());
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if year < 1 || !(1..=12).contains(&month) || day < 1 || day > month_days[month as usize - 1] {
        return Err(bad());
    }
    let (mut hour, mut minute, mut second, mut micros, mut offset_us) = (0i64, 0, 0, 0, 0i64);
    if let Some(sep) = s.get(date_len..).and_then(|r| r.chars().next()) {
        // Any one character separates the date from the time.
        let rest = &s[date_len + sep.len_utf8()..];
        let tz_at = rest.find(['+', '-']).unwrap_or(rest.len());
        let (time, tz) = rest.split_at(tz_at);
        (hour, minute, second, micros) = parse_clock(time).ok_or_else(bad)?;
        if hour > 23 || minute > 59 || second > 59 {
            return Err(bad());
        }
        if !tz.is_empty() {
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            let (h, m, sec, us) = parse_clock(&tz[1..]).ok_or_else(bad)?;
            if h > 23 || m > 59 || sec > 59 {
                return Err(bad());
            }
            offset_us = sign * (((h * 60 + m) * 60 + sec) * 1_000_000 + us);
        }
    }
    // Days since 1970-01-01 (Howard Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let total_us =
        ((days * 86_400 + hour * 3_600 + minute * 60 + second) * 1_000_000 + micros) - offset_us;
    // Python divides the integer microseconds by 10**6 with one correct rounding; the cast is
    // exact below 2^53 µs (years 1685..2255), so this is that same single rounding.
    Ok(total_us as f64 / 1_000_000.0)
}

/// `HH[:MM[:SS[(.|,)f…]]]` or `HH[MM[SS[(.|,)f…]]]` → (h, m, s, µs); digits past the sixth of
/// the fraction are dropped, as Python does.
fn parse_clock(t: &str) -> Option<(i64, i64, i64, i64)> {
    let (clock, frac) = match t.find(['.', ',']) {
        Some(k) => (&t[..k], Some(&t[k + 1..])),
        None => (t, None),
    };
    let parts: Vec<&str> = if clock.contains(':') {
        clock.split(':').collect()
    } else {
        (0..clock.len().div_ceil(2))
            .map(|k| clock.get(2 * k..(2 * k + 2).min(clock.len())))
            .collect::<Option<_>>()?
    };
    if parts.is_empty()
        || parts.len() > 3
        || parts
            .iter()
            .any(|p| p.len() != 2 || !p.bytes().all(|c| c.is_ascii_digit()))
    {
        return None;
    }
    let field = |k: usize| parts.get(k).map_or(Some(0), |p| p.parse().ok());
    let micros = match frac {
        None => 0,
        // A fraction needs the seconds before it.
        Some(_) if parts.len() < 3 => return None,
        Some(f) if f.is_empty() || !f.bytes().all(|c| c.is_ascii_digit()) => return None,
        Some(f) => format!("{:0<6}", &f[..f.len().min(6)]).parse().ok()?,
    };
    Some((field(0)?, field(1)?, field(2)?, micros))
}

/// Python's `round(x, 6)`: the exact binary value rounded to 6 decimals, ties to even (Rust's
/// fixed-precision formatting is exact with the same tie rule), read back as the nearest f64.
fn round6(x: f64) -> f64 {
    format!("{x:.6}").parse().unwrap_or(x)
}

/// Python's `max(a, b)`: `a` unless `b` is greater (so `max(-0.0, 0.0)` is `-0.0`).
fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

struct Event {
    /// `event_type` when it is a string (other types are in neither event set).
    kind: Option<String>,
    /// `timestamp`, when truthy.
    at: Option<f64>,
}

struct Tool {
    index: usize,
    name: Option<String>,
    /// `tool_wall_latency_ms` as given (read only for Agent/Task calls, as AIPerf reads it).
    latency: Option<Value>,
    emitted: Option<f64>,
    result: Option<f64>,
}

/// One row of a session, its timestamps parsed up front: AIPerf's join reads every event and
/// tool stamp of every session, so a bad one fails the load whatever else the row holds.
struct Round {
    line: usize,
    obj: Map<String, Value>,
    events: Vec<Event>,
    tools: Vec<Tool>,
}

impl Round {
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key)
    }

    /// `int(row.get(key) or 0)`.
    fn int_or_zero(&self, key: &str) -> Result<i64, FieldError> {
        match self.get(key) {
            Some(v) if truthy(v) => py_int(v).map_err(|m| (key.to_owned(), m)),
            _ => Ok(0),
        }
    }

    fn is_tool_result(&self) -> bool {
        self.get("first_input_event_type").and_then(Value::as_str) == Some("tool_result")
    }

    /// `(submission time, api_time)`: the latest input event (a round fed by parallel tool
    /// results cannot be sent before the last lands), else the first output event; api_time
    /// runs to the last output event.
    fn timing(&self) -> (Option<f64>, Option<f64>) {
        let stamps = |set: &[&str]| -> Vec<f64> {
            self.events
                .iter()
                .filter(|e| e.kind.as_deref().is_some_and(|k| set.contains(&k)))
                .filter_map(|e| e.at)
                .collect()
        };
        let ins = stamps(&["user_message", "tool_result"]);
        let outs = stamps(&["text", "reasoning", "tool_call"]);
        let fold = |v: &[f64], pick: fn(f64, f64) -> f64| v.iter().copied().reduce(pick);
        let first_max = |a: f64, b: f64| py_max(a, b);
        let first_min = |a: f64, b: f64| if b < a { b } else { a };
        let submitted = match fold(&ins, first_max).or_else(|| fold(&outs, first_min)) {
            Some(s) => s,
            None => return (None, None),
        };
        let api = fold(&outs, first_max).map(|last| py_max(last - submitted, 0.0));
        (Some(submitted), api)
    }
}

struct Session {
    id: String,
    rows: Vec<Round>,
}

/// Every error of this module: the file and line, the session, the field.
struct Origin<'p> {
    path: &'p Path,
}

impl Origin<'_> {
    fn at(&self, line: usize, sid: &str, (field, message): FieldError) -> AgenticError {
        AgenticError::Input {
            origin: format!("{}:{line}", self.path.display()),
            trace_id: Some(sid.to_owned()),
            path: field,
            message,
        }
    }

    fn file(&self, message: String) -> AgenticError {
        AgenticError::Input {
            origin: self.path.display().to_string(),
            trace_id: None,
            path: String::new(),
            message,
        }
    }
}

/// `row[key] or []` as a list of objects (`timing_events`, `tools`).
fn objects<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
) -> Result<Vec<&'v Map<String, Value>>, FieldError> {
    match obj.get(key) {
        Some(v) if truthy(v) => match v {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_object().ok_or_else(|| {
                        (
                            format!("{key}[{i}]"),
                            format!("must be an object, not {}", kind(x)),
                        )
                    })
                })
                .collect(),
            other => Err((
                key.to_owned(),
                format!("must be an array, not {}", kind(other)),
            )),
        },
        _ => Ok(Vec::new()),
    }
}

/// A stamp field of an event or tool: parsed when truthy (AIPerf skips falsy ones).
fn stamp(obj: &Map<String, Value>, key: &str, at: &str) -> Result<Option<f64>, FieldError> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => parse_ts(s)
            .map(Some)
            .map_err(|m| (format!("{at}.{key}"), m)),
        Some(v) if truthy(v) => Err((
            format!("{at}.{key}"),
            format!("must be an ISO-8601 string, not {}", kind(v)),
        )),
        _ => Ok(None),
    }
}

fn round_of(line: usize, obj: Map<String, Value>) -> Result<Round, FieldError> {
    let events = objects(&obj, "timing_events")?
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            Ok(Event {
                kind: e
                    .get("event_type")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                at: stamp(e, "timestamp", &format!("timing_events[{i}]"))?,
            })
        })
        .collect::<Result<_, FieldError>>()?;
    let tools = objects(&obj, "tools")?
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tools[{i}]");
            Ok(Tool {
                index: i,
                name: t
                    .get("tool_name")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                latency: t.get("tool_wall_latency_ms").cloned(),
                emitted: stamp(t, "emitted_at", &at)?,
                result: stamp(t, "result_at", &at)?,
            })
        })
        .collect::<Result<_, FieldError>>()?;
    Ok(Round {
        line,
        obj,
        events,
        tools,
    })
}

/// Every row with a `session_id`, grouped by it in order of first appearance (rows keep file
/// order). Rows that are not objects, or have no `session_id`, are skipped as AIPerf skips them,
/// and counted in one warning (with `strict`, the first is an error).
fn read_sessions(
    path: &Path,
    origin: &Origin,
    strict: bool,
    (block_size, max_blocks): (usize, u64),
) -> Result<Vec<Session>, SynthError> {
    let mut reader = TraceReader::open(path)?;
    let mut blocks = 0u64;
    let mut sessions: Vec<Session> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut dropped: Vec<usize> = Vec::new();
    while let Some((line, text)) = reader.next_line()? {
        let v: Value = serde_json::from_str(&text).map_err(|e| AgenticError::Input {
            origin: format!("{}:{line}", path.display()),
            trace_id: None,
            path: String::new(),
            message: format!("invalid JSON in a TraceLab row: {e}"),
        })?;
        let Value::Object(obj) = v else {
            dropped.push(line);
            continue;
        };
        let sid = match obj.get("session_id") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(v) if truthy(v) => {
                return Err(AgenticError::Input {
                    origin: format!("{}:{line}", path.display()),
                    trace_id: None,
                    path: "session_id".into(),
                    message: format!("must be a string, not {}", kind(v)),
                }
                .into())
            }
            _ => {
                dropped.push(line);
                continue;
            }
        };
        check_row(&obj).map_err(|e| origin.at(line, &sid, e))?;
        let round = round_of(line, obj).map_err(|e| origin.at(line, &sid, e))?;
        // Counted as the rows come, before any id is minted: a 400-byte row may ask for 10M
        // tokens, 156K block ids at block size 64, so the ids, not the file, take the memory.
        let total = round.int_or_zero("input_tokens_total").unwrap_or(0).max(0) as u64;
        blocks = blocks.saturating_add(total / block_size.max(1) as u64);
        if blocks > max_blocks {
            return Err(origin
                .at(
                    line,
                    &sid,
                    (
                        "input_tokens_total".into(),
                        format!(
                            "takes the trace to {blocks} hash-id blocks of {block_size} tokens, \
                             more than the cap of {max_blocks} (--max-blocks); every block is an \
                             id held in memory (8 bytes in synth, about 100 in analyze-trace). \
                             Raise --max-blocks if the machine has the memory, use a larger \
                             --isl-block-size / --block-size, or split the trace"
                        ),
                    ),
                )
                .into());
        }
        let k = *index.entry(sid.clone()).or_insert_with(|| {
            sessions.push(Session {
                id: sid,
                rows: Vec::new(),
            });
            sessions.len() - 1
        });
        sessions[k].rows.push(round);
    }
    report_dropped(origin, &dropped, strict)?;
    Ok(sessions)
}

/// One warning for the rows skipped for having no `session_id` (AIPerf skips them silently),
/// or with `--strict` an error naming the first.
fn report_dropped(origin: &Origin, dropped: &[usize], strict: bool) -> Result<(), AgenticError> {
    let Some(first) = dropped.first() else {
        return Ok(());
    };
    if strict {
        return Err(AgenticError::Input {
            origin: format!("{}:{first}", origin.path.display()),
            trace_id: None,
            path: "session_id".into(),
            message: format!(
                "is missing (or the row is not an object); --strict refuses dropped rows ({} \
                 row(s) of this file would be dropped, as AIPerf drops them)",
                dropped.len()
            ),
        });
    }
    let lines: Vec<String> = dropped.iter().take(10).map(usize::to_string).collect();
    tracing::warn!(
        "{}: dropped {} TraceLab row(s) that are not objects or have no session_id (AIPerf drops \
         them too; --strict makes this an error): lines {}{}",
        origin.path.display(),
        dropped.len(),
        lines.join(", "),
        if dropped.len() > 10 { ", …" } else { "" }
    );
    Ok(())
}

/// A recovered parent → child link: where the window starts and how long the spawn took. (The
/// window's end only sets the entry's `status`, which no reconstruction reads.)
#[derive(Debug, Clone, Copy)]
struct Spawn {
    parent: usize,
    start: f64,
    duration_ms: i64,
}

/// Wall-clock extent of a session across its round events and tool stamps.
fn session_span(s: &Session) -> Option<(f64, f64)> {
    let stamps = s.rows.iter().flat_map(|r| {
        r.events
            .iter()
            .filter_map(|e| e.at)
            .chain(r.tools.iter().flat_map(|t| [t.emitted, t.result]).flatten())
    });
    stamps.fold(None, |acc, x| match acc {
        None => Some((x, x)),
        Some((lo, hi)) => Some((if x < lo { x } else { lo }, py_max(hi, x))),
    })
}

/// Codex: `[earliest spawn_agent emitted, latest wait_agent result]` for the whole session (the
/// handle pairing a spawn with its wait lived in the stripped tool arguments).
fn codex_window(s: &Session) -> Option<(f64, f64)> {
    let tools = || s.rows.iter().flat_map(|r| r.tools.iter());
    let named = |n: &str, t: &&Tool| t.name.as_deref() == Some(n);
    let start = tools()
        .filter(|t| named("spawn_agent", t))
        .filter_map(|t| t.emitted)
        .reduce(|a, b| if b < a { b } else { a })?;
    let end = tools()
        .filter(|t| named("wait_agent", t))
        .filter_map(|t| t.result)
        .reduce(py_max)?;
    (end > start).then_some((start, end))
}

/// Claude: one window per blocking Agent/Task call of at least [`MIN_SPAWN_MS`]; its duration
/// is the recorded `tool_wall_latency_ms`.
fn claude_windows(s: &Session) -> Result<Vec<Window>, LineError> {
    let mut out = Vec::new();
    for r in &s.rows {
        for t in &r.tools {
            if !t
                .name
                .as_deref()
                .is_some_and(|n| CLAUDE_SPAWN_TOOLS.contains(&n))
            {
                continue;
            }
            let field = format!("tools[{}].tool_wall_latency_ms", t.index);
            let latency = match &t.latency {
                None | Some(Value::Null) => continue,
                Some(Value::Bool(b)) => f64::from(u8::from(*b)),
                Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
                Some(other) => {
                    return Err((
                        r.line,
                        (field, format!("must be a number, not {}", kind(other))),
                    ))
                }
            };
            if latency < MIN_SPAWN_MS {
                continue;
            }
            if let (Some(start), Some(end)) = (t.emitted, t.result) {
                // int(latency): truncation toward zero.
                out.push((start, end, latency.trunc() as i64));
            }
        }
    }
    Ok(out)
}

/// `child → spawn` for every session whose whole span fits inside a spawn window of another
/// session with the same `user` and `project`; the tightest window wins (then the earliest,
/// then the parent id). Containment only: nothing in the corpus says the match is right.
/// Each session's time span and, when it has one, its identity (user, project).
type Spans = (Vec<Option<(f64, f64)>>, Vec<Option<Ident>>);

fn spans_and_identities(sessions: &[Session], origin: &Origin) -> Result<Spans, AgenticError> {
    let mut span: Vec<Option<(f64, f64)>> = Vec::with_capacity(sessions.len());
    let mut ident: Vec<Option<Ident>> = Vec::with_capacity(sessions.len());
    for s in sessions {
        let extent = session_span(s);
        span.push(extent);
        let first = &s.rows[0];
        ident.push(match extent {
            None => None,
            Some(_) => {
                let key = |k: &str| {
                    py_key(first.get(k)).map_err(|m| origin.at(first.line, &s.id, (k.into(), m)))
                };
                Some((key("user")?, key("project")?))
            }
        });
    }
    Ok((span, ident))
}

fn join_index(sessions: &[Session], origin: &Origin) -> Result<Vec<Option<Spawn>>, AgenticError> {
    let (span, ident) = spans_and_identities(sessions, origin)?;
    // (start, end, parent, duration_ms) in AIPerf's window order, grouped by the parent's
    // identity.
    let mut by_ident: HashMap<&Ident, Vec<ParentWindow>> = HashMap::new();
    let (mut n_claude, mut n_codex) = (0usize, 0usize);
    for (p, s) in sessions.iter().enumerate() {
        let windows = if s.rows[0].get("provider").and_then(Value::as_str) == Some("codex") {
            let w: Vec<Window> = codex_window(s)
                .map(|(a, b)| (a, b, ((b - a) * 1000.0).trunc() as i64))
                .into_iter()
                .collect();
            n_codex += w.len();
            w
        } else {
            let w = claude_windows(s).map_err(|(line, e)| origin.at(line, &s.id, e))?;
            n_claude += w.len();
            w
        };
        if windows.is_empty() {
            continue;
        }
        // A window's stamps are part of the span, so a session with windows has an identity.
        let Some(id) = ident[p].as_ref() else {
            continue;
        };
        by_ident
            .entry(id)
            .or_default()
            .extend(windows.into_iter().map(|(a, b, d)| (a, b, p, d)));
    }
    let mut links = vec![None; sessions.len()];
    let mut ambiguous = 0usize;
    for (c, extent) in span.iter().enumerate() {
        let (Some((cstart, cend)), Some(id)) = (extent, ident[c].as_ref()) else {
            continue;
        };
        let hits = by_ident
            .get(id)
            .into_iter()
            .flatten()
            .filter(|(ws, we, p, _)| *p != c && *cstart >= *ws && *cend <= *we);
        let mut count = 0usize;
        // Python sorts the hits by (width, start, parent id) and keeps the first: min_by keeps
        // the first of equal minima, as the stable sort does.
        let best = hits
            .inspect(|_| count += 1)
            .min_by(|a, b| {
                (a.1 - a.0)
                    .partial_cmp(&(b.1 - b.0))
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal))
                    .then_with(|| sessions[a.2].id.cmp(&sessions[b.2].id))
            })
            .copied();
        if count > 1 {
            ambiguous += 1;
        }
        links[c] = best.map(|(start, _end, parent, duration_ms)| Spawn {
            parent,
            start,
            duration_ms,
        });
    }
    tracing::info!(
        windows = n_claude + n_codex,
        claude = n_claude,
        codex = n_codex,
        matched = links.iter().filter(|l| l.is_some()).count(),
        ambiguous,
        "TraceLab subagent join"
    );
    Ok(links)
}

/// `(submitted, api_time, row)` in replay order: submission time, then `round_index`, then file
/// order; rounds with no usable timing are dropped.
fn order_rounds<'s>(s: &'s Session, origin: &Origin) -> Result<Vec<Timed<'s>>, AgenticError> {
    let mut timed = Vec::new();
    for r in &s.rows {
        let (Some(submitted), api) = r.timing() else {
            continue;
        };
        let key = match r.get("round_index") {
            Some(Value::String(x)) if !x.is_empty() => RoundKey::Str(x.clone()),
            Some(Value::Bool(b)) => RoundKey::Num(f64::from(u8::from(*b))),
            Some(Value::Number(n)) => RoundKey::Num(n.as_f64().unwrap_or(0.0)),
            Some(v) if truthy(v) => {
                return Err(origin.at(
                    r.line,
                    &s.id,
                    (
                        "round_index".into(),
                        format!("must be a number, not {}", kind(v)),
                    ),
                ))
            }
            _ => RoundKey::Num(0.0),
        };
        timed.push((submitted, api, r, key));
    }
    let mut mixed: Option<usize> = None;
    // Stable, as Python's sort; a number and a string tied on time cannot be compared.
    timed.sort_by(|a, b| {
        a.0.partial_cmp(&b.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| match (&a.3, &b.3) {
                (RoundKey::Num(x), RoundKey::Num(y)) => {
                    x.partial_cmp(y).unwrap_or(std::cmp::Ordering::Equal)
                }
                (RoundKey::Str(x), RoundKey::Str(y)) => x.cmp(y),
                _ => {
                    mixed = Some(b.2.line);
                    std::cmp::Ordering::Equal
                }
            })
    });
    if let Some(line) = mixed {
        return Err(origin.at(
            line,
            &s.id,
            (
                "round_index".into(),
                "mixes numbers and strings among rounds submitted at the same time, which \
                 cannot be ordered"
                    .into(),
            ),
        ));
    }
    Ok(timed.into_iter().map(|(s, a, r, _)| (s, a, r)).collect())
}

/// Block ids of one trace: a parent and every child nested in it share one namespace, so a
/// block reused across them decodes to the same tokens.
struct Minter {
    next: i64,
}

impl Minter {
    fn take(&mut self, count: i64) -> Vec<i64> {
        let ids: Vec<i64> = (self.next..self.next + count.max(0)).collect();
        self.next += count.max(0);
        ids
    }
}

/// Each round's block ids: the first `prefix_tokens / block_size` of the previous round's
/// (the engine-reported resident prefix), fresh ids for the rest; `input_tokens_total /
/// block_size` in all (whole blocks only; the partial tail is unhashed).
fn hash_ids(
    rounds: &[Timed],
    block_size: i64,
    minter: &mut Minter,
) -> Result<Vec<Vec<i64>>, LineError> {
    let mut prev: Vec<i64> = Vec::new();
    let mut out = Vec::with_capacity(rounds.len());
    for (_, _, r) in rounds {
        let total = r
            .int_or_zero("input_tokens_total")
            .map_err(|e| (r.line, e))?
            .max(0);
        let prefix = r
            .int_or_zero("prefix_tokens")
            .map_err(|e| (r.line, e))?
            .max(0)
            .min(total);
        let n_blocks = total / block_size;
        let n_reuse = (prefix / block_size).min(prev.len() as i64).min(n_blocks);
        let mut ids = prev[..n_reuse as usize].to_vec();
        ids.extend(minter.take(n_blocks - n_reuse));
        prev.clone_from(&ids);
        out.push(ids);
    }
    Ok(out)
}

/// Rounds → Weka `n` requests timed from `t0`; also the models in first-use order.
fn requests(
    rounds: &[Timed],
    chains: Vec<Vec<i64>>,
    t0: f64,
) -> Result<(Vec<Request>, Vec<String>), LineError> {
    let mut out = Vec::with_capacity(rounds.len());
    let mut models: Vec<String> = Vec::new();
    let mut prev_end: Option<f64> = None;
    for ((submitted, api, r), hash_ids) in rounds.iter().zip(chains) {
        let err = |e: FieldError| (r.line, e);
        let model = match r.get("model") {
            Some(Value::String(m)) if !m.is_empty() => m.clone(),
            Some(v) if truthy(v) => {
                return Err(err((
                    "model".into(),
                    format!("must be a string, not {}", kind(v)),
                )))
            }
            _ => "unknown".to_owned(),
        };
        if !models.contains(&model) {
            models.push(model.clone());
        }
        let t = submitted - t0;
        // The client-side idle gap: from the previous request completing to this one's send.
        let think = prev_end.map(|e| py_max(t - e, 0.0));
        // Reasoning is generated output too; the schema has no field of its own for it.
        let mut out_tokens = r.int_or_zero("output_tokens").map_err(err)?;
        out_tokens =
            out_tokens.saturating_add(r.int_or_zero("reasoning_output_tokens").map_err(err)?);
        let emitted_tool = r
            .events
            .iter()
            .any(|e| e.kind.as_deref() == Some("tool_call"));
        out.push(Request {
            t: round6(t),
            model,
            input_length: r.int_or_zero("input_tokens_total").map_err(err)?.max(1),
            output_length: out_tokens.max(1),
            hash_ids,
            input_types: vec![if r.is_tool_result() {
                "tool_result"
            } else {
                "text"
            }
            .into()],
            stop: if emitted_tool { "tool_use" } else { "end_turn" }.into(),
            api_time: api.map(round6),
            think_time: think.map(round6),
        });
        prev_end = Some(t + api.unwrap_or(0.0));
    }
    Ok((out, models))
}

/// Python's `safe_trace_id`: runs of characters outside `[A-Za-z0-9._-]` become one `_`, cut
/// at 150 characters (all ASCII by then).
pub fn safe_trace_id(sid: &str) -> String {
    let mut out = String::with_capacity(sid.len());
    let mut in_run = false;
    for c in sid.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('_');
            in_run = true;
        }
    }
    out.truncate(150);
    out
}

struct Converter<'a> {
    sessions: &'a [Session],
    block_size: i64,
    origin: Origin<'a>,
}

impl Converter<'_> {
    fn lift(&self, s: usize, (line, e): LineError) -> AgenticError {
        self.origin.at(line, &self.sessions[s].id, e)
    }

    /// One child session → a subagent entry (None when none of its rounds is dated).
    fn subagent(
        &self,
        child: usize,
        spawn: &Spawn,
        minter: &mut Minter,
        t0: f64,
    ) -> Result<Option<(Subagent, Vec<String>)>, AgenticError> {
        let s = &self.sessions[child];
        let timed = order_rounds(s, &self.origin)?;
        if timed.is_empty() {
            return Ok(None);
        }
        let chains = hash_ids(&timed, self.block_size, minter).map_err(|e| self.lift(child, e))?;
        let (mut inner, models) = requests(&timed, chains, t0).map_err(|e| self.lift(child, e))?;
        let entry_t = spawn.start - t0;
        // An inner t before the marker would be read downstream as subagent-relative; the
        // containment join makes it unreachable, and AIPerf keeps this guard anyway.
        for r in &mut inner {
            if r.t < entry_t {
                r.t = round6(entry_t);
            }
        }
        // A think time on the child's first request would be a gap from nothing.
        inner[0].think_time = None;
        Ok(Some((
            Subagent {
                t: round6(entry_t),
                agent_id: safe_trace_id(&s.id),
                duration_ms: Some(spawn.duration_ms),
                requests: inner,
                tool_tokens: 0,
                system_tokens: 0,
            },
            models,
        )))
    }

    /// One session (and the children nested in it) → a Weka trace; None when no round is
    /// dated. `placed` collects the children that found a place.
    fn trace(
        &self,
        s: usize,
        children: &[(usize, Spawn)],
        placed: &mut HashSet<usize>,
    ) -> Result<Option<WekaTrace>, AgenticError> {
        let session = &self.sessions[s];
        let timed = order_rounds(session, &self.origin)?;
        let Some(&(t0, _, _)) = timed.first() else {
            return Ok(None);
        };
        let mut minter = Minter { next: 1 };
        let chains = hash_ids(&timed, self.block_size, &mut minter).map_err(|e| self.lift(s, e))?;
        let (requests, _models) = requests(&timed, chains, t0).map_err(|e| self.lift(s, e))?;
        // Each marker goes after the last parent request at or before its spawn: by time, not by
        // the emitting round's position, so a join can never land ahead of its spawn.
        let mut pending: Vec<Vec<Subagent>> = (0..requests.len()).map(|_| Vec::new()).collect();
        for (child, spawn) in children {
            // Minted before the anchor check: an unplaceable child still used its ids.
            let Some((entry, _models)) = self.subagent(*child, spawn, &mut minter, t0)? else {
                continue;
            };
            let Some(anchor) = requests.iter().rposition(|r| r.t <= entry.t) else {
                continue;
            };
            pending[anchor].push(entry);
            placed.insert(*child);
        }
        let mut entries = Vec::with_capacity(requests.len());
        for (r, mut after) in requests.into_iter().zip(pending) {
            entries.push(Entry::Request(r));
            after.sort_by(|a, b| a.t.partial_cmp(&b.t).unwrap_or(std::cmp::Ordering::Equal));
            entries.extend(after.into_iter().map(Entry::Subagent));
        }
        Ok(Some(WekaTrace {
            id: safe_trace_id(&session.id),
            block_size: self.block_size,
            tool_tokens: 0,
            system_tokens: 0,
            requests: entries,
        }))
    }
}

/// Reads a TraceLab file and converts it as AIPerf's `tracelab` loader does: one Weka trace per
/// root session (children nested as subagent entries), then the children that could not be
/// nested as traces of their own, at `block_size` tokens per synthesized block id.
pub fn read(path: &Path, block_size: usize, strict: bool) -> Result<Vec<weka::Source>, SynthError> {
    read_capped(path, block_size, strict, u64::MAX)
}

/// The default of `--max-blocks`: the hash-id blocks a TraceLab file may ask for in all (32Mi
/// ids: 256 MiB as `synth` holds them). TraceLab rows carry token counts, not ids, so a file of
/// kilobytes can ask for billions; this bounds the memory the ids take.
pub const DEFAULT_MAX_BLOCKS: u64 = 32 << 20;

/// [`read`], refusing a file whose rows ask for more than `max_blocks` block ids in all (the
/// row that passes it named), before any is minted.
pub fn read_capped(
    path: &Path,
    block_size: usize,
    strict: bool,
    max_blocks: u64,
) -> Result<Vec<weka::Source>, SynthError> {
    let origin = Origin { path };
    let sessions = read_sessions(path, &origin, strict, (block_size, max_blocks))?;
    if sessions.is_empty() {
        return Err(origin
            .file(
                "holds no TraceLab sessions: every row must be a JSON object with a \
                 `session_id`"
                    .into(),
            )
            .into());
    }
    let links = join_index(&sessions, &origin)?;
    // The schema nests one level: a child whose parent is itself a child (a grandchild) stays
    // a trace of its own rather than being dropped.
    let mut children: Vec<Vec<(usize, Spawn)>> = vec![Vec::new(); sessions.len()];
    let mut nested: HashSet<usize> = HashSet::new();
    let mut grandchildren = 0usize;
    for (c, link) in links.iter().enumerate() {
        let Some(spawn) = link else { continue };
        if links[spawn.parent].is_some() {
            grandchildren += 1;
            continue;
        }
        children[spawn.parent].push((c, *spawn));
        nested.insert(c);
    }
    if grandchildren > 0 {
        tracing::info!(
            grandchildren,
            "TraceLab grandchildren kept as standalone traces"
        );
    }
    let conv = Converter {
        sessions: &sessions,
        block_size: block_size as i64,
        origin: Origin { path },
    };
    let mut traces: Vec<(usize, WekaTrace)> = Vec::new();
    let mut placed: HashSet<usize> = HashSet::new();
    for (s, kids) in children.iter().enumerate() {
        if nested.contains(&s) {
            continue;
        }
        if let Some(t) = conv.trace(s, kids, &mut placed)? {
            traces.push((s, t));
        }
    }
    let fallback: Vec<usize> = (0..sessions.len())
        .filter(|s| nested.contains(s) && !placed.contains(s))
        .collect();
    if !fallback.is_empty() {
        tracing::warn!(
            sessions = fallback.len(),
            "TraceLab: subagent session(s) failed to nest and are emitted as standalone traces"
        );
    }
    for s in fallback {
        if let Some(t) = conv.trace(s, &[], &mut placed)? {
            traces.push((s, t));
        }
    }
    if traces.is_empty() {
        // AIPerf writes an empty dataset here, which replays as nothing: said, not done.
        return Err(origin
            .file(format!(
                "has {} TraceLab session(s) and not one round with a usable time (a \
                 `timing_events` entry with a timestamp): there is nothing to replay; check the \
                 file is the TraceLab export you meant",
                sessions.len()
            ))
            .into());
    }
    unique_sources(path, &origin, &sessions, traces)
}

/// The converted traces as Weka sources, in order; two sessions whose ids become the same trace
/// id are an error naming both.
fn unique_sources(
    path: &Path,
    origin: &Origin,
    sessions: &[Session],
    traces: Vec<(usize, WekaTrace)>,
) -> Result<Vec<weka::Source>, SynthError> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut sources = Vec::with_capacity(traces.len());
    for (s, trace) in traces {
        let first_line = sessions[s].rows[0].line;
        if let Some(prior) = seen.insert(trace.id.clone(), s) {
            return Err(origin
                .at(
                    first_line,
                    &sessions[s].id,
                    (
                        "session_id".into(),
                        format!(
                            "becomes trace id {:?}, as does session {:?} (line {}): ids keep only \
                             [A-Za-z0-9._-], so the two collide",
                            trace.id, sessions[prior].id, sessions[prior].rows[0].line
                        ),
                    ),
                )
                .into());
        }
        sources.push(weka::Source {
            origin: format!("{}:{first_line}", path.display()),
            trace,
        });
    }
    Ok(sources)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timestamps_match_python_parse_ts() {
        // Values printed by AIPerf 0.13.0's parse_ts (Python 3.11).
        let table: &[(&str, f64)] = &[
            ("2025-11-03T09:00:01.937Z", 1762160401.937),
            ("1999-12-31T23:59:59.999999-07:30", 946711799.999999),
            ("2025-11-03T11:00:04.276000+02:00", 1762160404.276),
            ("2024-02-29T12:34:56.789012", 1709210096.789012),
            ("2025-11-03 09:00:05.5", 1762160405.5),
            ("2025-01-01T00:00:00.1234567Z", 1735689600.123456),
            ("2025-01-01T00:00", 1735689600.0),
            ("2025-01-01", 1735689600.0),
            ("20250101T000000Z", 1735689600.0),
            ("2025-01-01T00:00:00,5Z", 1735689600.5),
            ("2025-01-01T00:00:00.123+0530", 1735669800.123),
        ];
        for (s, want) in table {
            assert_eq!(parse_ts(s).unwrap().to_bits(), want.to_bits(), "{s}");
        }
        for bad in [
            "yesterday",
            "2025-01-01T24:00:00",
            "2025-02-30",
            "2025-01-01T10:00:00.",
            "",
        ] {
            assert!(parse_ts(bad).is_err(), "{bad}");
        }
    }

    /// Issue 42 (10): sessions whose rounds carry no usable time make nothing to replay: an
    /// error saying so, not an empty dataset.
    #[test]
    fn a_file_with_no_usable_round_is_an_error_that_says_so() {
        let path = std::env::temp_dir().join(format!(
            "kvbust-tracelab-undated-{}.jsonl",
            std::process::id()
        ));
        let row = |i: u32| {
            json!({"session_id": "s", "round_index": i, "input_tokens_total": 10,
                   "output_tokens": 2, "timing_events": []})
            .to_string()
        };
        std::fs::write(&path, format!("{}\n{}\n", row(0), row(1))).unwrap();
        let got = read(&path, 64, false);
        let _ = std::fs::remove_file(&path);
        let e = got
            .err()
            .expect("an error, not an empty dataset")
            .to_string();
        assert!(e.contains("not one round with a usable time"), "{e}");
    }

    #[test]
    fn rounding_and_max_follow_python() {
        // round(x, 6) ties to even on the exact binary value; the error of a difference stays.
        assert_eq!(round6(0.0078125), 0.007812);
        assert_eq!(round6(0.0234375), 0.023438);
        assert_eq!(round6(1762160401.937 - 1762160400.0), 1.937);
        assert!(round6(-1e-9).is_sign_negative());
        assert!(py_max(-0.0, 0.0).is_sign_negative());
    }

    #[test]
    fn hash_ids_reuse_the_reported_prefix() {
        // As synthesize_hash_ids prints for these (total, prefix) rows at block size 64.
        let rows: Vec<Round> = [
            (130, 0),
            (200, 128),
            (300, 250),
            (90, 40),
            (500, -1),
            (63, 63),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (total, prefix))| {
            let mut obj = Map::new();
            obj.insert("input_tokens_total".into(), total.into());
            if prefix >= 0 {
                obj.insert("prefix_tokens".into(), prefix.into());
            }
            round_of(i + 1, obj).unwrap()
        })
        .collect();
        let timed: Vec<Timed> = rows.iter().map(|r| (0.0, None, r)).collect();
        let ids = hash_ids(&timed, 64, &mut Minter { next: 1 }).unwrap();
        let want: Vec<Vec<i64>> = vec![
            vec![1, 2],
            vec![1, 2, 3],
            vec![1, 2, 3, 4],
            vec![5],
            vec![6, 7, 8, 9, 10, 11, 12],
            vec![],
        ];
        assert_eq!(ids, want);
    }

    #[test]
    fn ids_and_ints_follow_python() {
        assert_eq!(
            safe_trace_id("claude:ab/c d..é日-_x"),
            "claude_ab_c_d.._-_x"
        );
        assert_eq!(safe_trace_id(&"x".repeat(200)).len(), 150);
        assert_eq!(py_int(&json!(12.9)), Ok(12));
        assert_eq!(py_int(&json!(" 1_000 ")), Ok(1000));
        assert_eq!(py_int(&json!(true)), Ok(1));
        assert!(py_int(&json!("1.5")).is_err());
        assert!(py_int(&json!({"a": 1})).is_err());
        assert!(!truthy(&json!(0.0)) && !truthy(&json!("")) && truthy(&json!([0])));
        assert_eq!(py_key(Some(&json!(1))), py_key(Some(&json!(1.0))));
        assert_eq!(py_key(Some(&json!(true))), py_key(Some(&json!(1))));
    }

    #[test]
    fn detection_needs_every_key_on_the_first_row() {
        let row = r#"{"session_id":"s","round_index":0,"input_tokens_total":1,"prefix_tokens":0,"newly_append_tokens":1,"timing_events":[]}"#;
        assert!(looks_like_tracelab(format!("\n{row}\n").as_bytes()));
        assert!(!looks_like_tracelab(
            row.replace("\"prefix_tokens\":0,", "").as_bytes()
        ));
        assert!(!looks_like_tracelab(b"{\"input_length\": 5}\n"));
    }
}
