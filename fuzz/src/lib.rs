//! The fuzz targets' properties: one `check_*` function per target, shared by the AFL binaries
//! (`src/bin/*.rs`) and the `replay` binary. Each panics on a property violation (that is what
//! the fuzzer reports as a crash) and must never panic on an input kvbust is right to refuse.
//! Never does I/O, except the config target's one temporary file.
#![forbid(unsafe_code)]

mod gen;
mod jsonscan;

pub use gen::{gen_chat_with_placeholders, gen_rewrite_body, Src};

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use kvbust::cachebust::{
    build_marker, parse, DigestInputs, ListParts, Location, Phase, Plan, Shape, Target,
};
use kvbust::config::{CliOverrides, Config};
use kvbust::metrics::Metrics;
use kvbust::proxy::observe::{Labels, Observer};
use kvbust::proxy::{rewrite, synthesize};
use kvbust::runtime::SharedState;
use serde_json::Value;

/// The longest error message any target may produce: client text is quoted at most 200 bytes
/// (escaped, so up to ~6 characters a byte) plus kvbust's own explanation.
const MAX_ERROR_LEN: usize = 1600;

/// Every target by name, for `replay` and the README.
pub const TARGETS: [(&str, fn(&[u8])); 6] = [
    ("rewrite", check_rewrite),
    ("rewrite_json", check_rewrite_json),
    ("placeholders", check_placeholders),
    ("sse", check_sse),
    ("headers", check_headers),
    ("config", check_config),
];

/// The rule: an error quotes at most 200 bytes of any client text. Checks that no
/// 204-byte window of `client` (sampled every 16 bytes) appears verbatim in `msg`: a cut at
/// byte 200 through a literal U+FFFD is completed by the lossy decoding to 3 more bytes that
/// equal the client's, so 201–203 matching bytes are not a longer quote.
fn quotes_at_most_200(what: &str, msg: &str, client: &[u8]) {
    const W: usize = 204;
    if client.len() < W || msg.len() < W {
        return;
    }
    for start in (0..=client.len() - W).step_by(16) {
        if let Ok(window) = std::str::from_utf8(&client[start..start + W]) {
            assert!(
                !msg.contains(window),
                "{what}: error quotes more than 200 bytes of client text: {}…",
                &msg[..msg.floor_char_boundary(300)]
            );
        }
    }
}

fn bounded_error(what: &str, msg: &str) {
    assert!(!msg.is_empty(), "{what}: empty error message");
    assert!(
        msg.len() <= MAX_ERROR_LEN,
        "{what}: error message of {} bytes quotes unbounded client text: {}…",
        msg.len(),
        &msg[..msg.floor_char_boundary(300)]
    );
}

// ---------------------------------------------------------------------------------------------
// Body rewrite.

/// A plan chosen by three selector bytes: shape, target, phase, digest, user-context count and
/// list-parts mode.
fn plan_from(s: &mut Src) -> (Shape, Target, Option<String>, usize, ListParts) {
    let shape = Shape::ALL[s.below(Shape::ALL.len())];
    let target = Target::ALL[s.below(Target::ALL.len())];
    let phase = if s.flag() {
        Phase::Warmup
    } else {
        Phase::Profiling
    };
    let inputs = DigestInputs {
        benchmark_id: "0123456789ab".into(),
        recycle_pass: 0,
        trajectory_index: 0,
        trace_id: format!("session_{:06}", s.byte()),
    };
    let ctx = s.below(3);
    let list_parts = if s.flag() {
        ListParts::InlineText
    } else {
        ListParts::OwnPart
    };
    (
        shape,
        target,
        build_marker(target, phase, &inputs),
        ctx,
        list_parts,
    )
}

/// Arbitrary bytes as a body, under every shape and target.
pub fn check_rewrite(data: &[u8]) {
    let mut s = Src::new(data);
    let (shape, target, marker, ctx, lp) = plan_from(&mut s);
    check_apply(shape, target, marker.as_deref(), ctx, lp, s.rest());
}

/// Structure-aware: the bytes drive a generator of chat/responses/messages/completions bodies.
pub fn check_rewrite_json(data: &[u8]) {
    let mut s = Src::new(data);
    let (shape, target, marker, ctx, lp) = plan_from(&mut s);
    let body = gen_rewrite_body(&mut s, shape);
    check_apply(shape, target, marker.as_deref(), ctx, lp, body.as_bytes());
}

/// The rewrite's contract on one body (see `cachebust::inject`'s module docs).
pub fn check_apply(
    shape: Shape,
    target: Target,
    marker: Option<&str>,
    ctx: usize,
    list_parts: ListParts,
    body: &[u8],
) {
    let parsed = match parse(shape, body) {
        Ok(p) => p,
        Err(e) => {
            assert!(e.is_client_error(), "engine error on parse: {e}");
            bounded_error("parse", &e.to_string());
            quotes_at_most_200("parse", &e.to_string(), body);
            return;
        }
    };
    let hash_in = parsed.first_user_turn_hash(ctx);
    let Some(marker) = marker else {
        let out = parsed
            .apply(&Plan::new(target, ""))
            .expect("an empty plan never fails");
        assert_eq!((out.body, out.location), (None, None));
        return;
    };
    let plan = Plan {
        user_context_messages: ctx,
        list_parts,
        ..Plan::new(target, marker)
    };
    let out = match parsed.apply(&plan) {
        Ok(o) => o,
        Err(e) => {
            assert!(e.is_client_error(), "engine error on apply: {e}");
            bounded_error("apply", &e.to_string());
            quotes_at_most_200("apply", &e.to_string(), body);
            return;
        }
    };
    if let Some(loc) = out.location {
        let system_loc = matches!(loc, Location::System | Location::Fallthrough);
        assert_eq!(
            system_loc,
            target.is_system(),
            "location {loc:?} for {target}"
        );
    }
    let Some(new) = out.body else {
        return;
    };
    assert!(
        out.location.is_some(),
        "changed a body but reports no location"
    );
    let new_text = String::from_utf8_lossy(&new);
    let reparsed = serde_json::from_slice::<&serde_json::value::RawValue>(&new);
    assert!(reparsed.is_ok(), "output is not JSON: {new_text}");
    assert!(new.len() > body.len(), "a rewrite only inserts");

    // Bytes: one contiguous insertion (completions with a prompt list: one per string).
    let multi = shape == Shape::Completions;
    let k = new.len() - body.len();
    let p = body.iter().zip(&new).take_while(|(a, b)| a == b).count();
    if multi {
        assert!(is_subsequence(body, &new), "an input byte was lost");
    } else {
        assert_eq!(
            &body[p..],
            &new[p + k..],
            "more than one insertion, or input bytes changed"
        );
    }

    // Members: parse both and compare every member; only the marked one may differ, and only
    // by the marker.
    if let (Ok(a), Ok(b)) = (
        serde_json::from_slice::<Value>(body),
        serde_json::from_slice::<Value>(&new),
    ) {
        let mut diffs = Vec::new();
        diff(&a, &b, &mut String::new(), &mut diffs);
        assert!(
            !diffs.is_empty(),
            "the body changed but no member did (a duplicate key's hidden copy was marked?)"
        );
        assert!(multi || diffs.len() == 1, "members changed: {diffs:?}");
        for (path, x, y) in &diffs {
            assert!(
                accept_diff(x, y, marker),
                "member {path} changed by more than the marker {marker:?}: {x} -> {y}"
            );
        }
    }

    // Idempotent, and a marked copy of a session's first turn is the same session.
    let again = parse(shape, &new)
        .and_then(|p| {
            // Also where the client's body already holds marker text: the hash strips markers
            // to a fixpoint (finding 5), so stacking kvbust's on top must not move it either.
            assert_eq!(
                p.first_user_turn_hash(ctx),
                hash_in,
                "marking moved the session hash"
            );
            p.apply(&plan)
        })
        .expect("the output parses and applies");
    assert_eq!(again.body, None, "not idempotent: {new_text}");
    assert_eq!(again.location, out.location);
}

fn is_subsequence(small: &[u8], big: &[u8]) -> bool {
    let mut it = big.iter();
    small.iter().all(|b| it.any(|c| c == b))
}

/// The leaves (and reshaped containers) where `a` and `b` differ.
fn diff<'v>(
    a: &'v Value,
    b: &'v Value,
    path: &mut String,
    out: &mut Vec<(String, &'v Value, &'v Value)>,
) {
    match (a, b) {
        (Value::Object(x), Value::Object(y))
            if x.len() == y.len() && x.keys().all(|k| y.contains_key(k)) =>
        {
            for (k, v) in x {
                let n = path.len();
                path.push('.');
                path.push_str(k);
                diff(v, &y[k], path, out);
                path.truncate(n);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                let n = path.len();
                path.push_str(&format!("[{i}]"));
                diff(v, w, path, out);
                path.truncate(n);
            }
        }
        _ if a == b => {}
        _ => out.push((path.clone(), a, b)),
    }
}

fn is_marker_part(p: &Value, marker: &str) -> bool {
    let Value::Object(o) = p else { return false };
    o.len() == 2
        && matches!(
            o.get("type").and_then(Value::as_str),
            Some("text" | "input_text")
        )
        && o.get("text")
            .and_then(Value::as_str)
            .is_some_and(|t| t == marker || t == marker.trim())
}

/// Whether `y` is `x` with the marker added the way the rules allow.
fn accept_diff(x: &Value, y: &Value, marker: &str) -> bool {
    match (x, y) {
        (Value::String(x), Value::String(y)) => {
            *y == format!("{marker}{x}") || *y == format!("{x}{marker}")
        }
        (Value::Array(xs), Value::Array(ys)) if ys.len() == xs.len() + 1 => {
            (ys[1..] == xs[..] && is_marker_part(&ys[0], marker))
                || (ys[..xs.len()] == xs[..] && is_marker_part(&ys[xs.len()], marker))
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Placeholder scanner.

/// Arbitrary bytes (first byte even) or a generated chat body with placeholders in values,
/// keys and non-content fields (odd), under limits chosen by the next bytes.
pub fn check_placeholders(data: &[u8]) {
    let mut s = Src::new(data);
    let structured = s.flag();
    let max_count = [usize::MAX, 0, 1, 3, 64][s.below(5)];
    let max_tokens = [usize::MAX, 1, 100, 131_072][s.below(4)];
    let generated;
    let body: &[u8] = if structured {
        generated = gen_chat_with_placeholders(&mut s);
        generated.as_bytes()
    } else {
        s.rest()
    };
    check_scan(body, max_count, max_tokens);
}

pub fn check_scan(body: &[u8], max_count: usize, max_tokens: usize) {
    let found = match synthesize::find_placeholders_limited(body, max_count, max_tokens) {
        Ok(f) => f,
        Err(e) => {
            assert_eq!(e.status(), http::StatusCode::BAD_REQUEST, "{e}");
            let msg = e.to_string();
            bounded_error("placeholder scan", &msg);
            quotes_at_most_200("placeholder scan", &msg, body);
            assert!(
                !msg.chars().any(char::is_control),
                "raw control character in an error: {msg:?}"
            );
            return;
        }
    };
    // Without `{{kvbust:` the body is not even parsed (the hot path), valid or not.
    if !body.windows(9).any(|w| w == b"{{kvbust:") {
        assert!(found.is_empty());
        return;
    }
    assert!(found.len() <= max_count);
    let total: usize = found.iter().map(|p| p.tokens).sum();
    assert!(total <= max_tokens);
    assert!(serde_json::from_slice::<&serde_json::value::RawValue>(body).is_ok());
    let strings = jsonscan::strings(body).expect("valid JSON scans");
    // A lone surrogate escape is JSON syntax but not text: no `Value` to ask about part types.
    let Ok(doc) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let mut last_end = 0;
    for p in &found {
        let r = p.range.clone();
        assert!(
            r.start >= last_end && r.end <= body.len(),
            "spans overlap or leave the body"
        );
        last_end = r.end;
        let text = std::str::from_utf8(&body[r.clone()]).expect("ASCII placeholder");
        assert!(
            text.starts_with("{{kvbust:prompt:") && text.ends_with("}}"),
            "{text}"
        );
        assert!(p.tokens > 0);
        let holder = strings
            .iter()
            .find(|st| st.range.start < r.start && r.end < st.range.end)
            .unwrap_or_else(|| panic!("placeholder {text} at {r:?} is not inside a JSON string"));
        assert!(
            !holder.is_key,
            "placeholder {text} expanded inside an object key at {r:?}"
        );
        assert!(
            is_content(holder, &doc),
            "placeholder {text} at {:?} is not message content",
            holder.path
        );
    }
    // Complete: when the scan is not cut short, it finds every `{{kvbust:` of message content
    // (a malformed one would have been a 400).
    if found.len() < max_count && found.iter().map(|p| p.tokens).sum::<usize>() < max_tokens {
        let in_content: usize = strings
            .iter()
            .filter(|st| is_content(st, &doc))
            .map(|st| {
                body[st.range.clone()]
                    .windows(9)
                    .filter(|w| w == b"{{kvbust:")
                    .count()
            })
            .sum();
        let all = synthesize::find_placeholders(body).expect("limits were the only error");
        assert_eq!(
            all.len(),
            in_content,
            "placeholders of message content missed"
        );
    }
    // The limited scan is a prefix of the unlimited one.
    let all = synthesize::find_placeholders(body).expect("limits were the only error");
    assert_eq!(all[..found.len()], found[..]);
}

/// Message content, as the contract means it: the string `content` of an element of the
/// top-level `messages`, or the `text` of one of its `content` parts whose `type` is `text`; the
/// last member of each key (what the upstream's parser keeps).
fn is_content(st: &jsonscan::Str, doc: &Value) -> bool {
    use jsonscan::Seg::{Index, Key};
    if st.is_key || st.shadowed {
        return false;
    }
    match st.path.as_slice() {
        [Key(m), Index(_), Key(c)] => m == "messages" && c == "content",
        [Key(m), Index(i), Key(c), Index(j), Key(t)] => {
            m == "messages"
                && c == "content"
                && t == "text"
                && doc["messages"][*i]["content"][*j]["type"] == "text"
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// SSE observer.

/// What an observer counted: TTFT samples, inter-token samples, prompt and cached tokens.
fn observe(ct: &str, pieces: &[&[u8]]) -> [u64; 4] {
    let m = Metrics::new();
    let labels = Labels {
        route: "chat",
        phase: "profiling",
        target: "none",
    };
    let t0 = Instant::now();
    let mut o = Observer::new(m.clone(), labels, t0, Some(ct), Some(1 << 16));
    for (i, p) in pieces.iter().enumerate() {
        o.on_data(p, t0 + Duration::from_millis(i as u64));
    }
    o.finish();
    drop(o);
    let l = ["profiling", "none"];
    // The latency histograms carry route, phase and target (issue 12).
    let exchange = ["chat", "profiling", "none"];
    [
        m.ttft.with_label_values(&exchange).get_sample_count(),
        m.inter_token
            .with_label_values(&exchange)
            .get_sample_count(),
        m.prompt_tokens.with_label_values(&l).get(),
        m.cached_tokens.with_label_values(&l).get(),
    ]
}

/// The same byte stream in one frame, byte by byte, and in frames cut where the first bytes
/// say, must give the same counts (SSE and JSON bodies alike).
pub fn check_sse(data: &[u8]) {
    let mut s = Src::new(data);
    let json = s.byte() == 0xff;
    let cuts: Vec<usize> = (0..s.below(8)).map(|_| s.byte() as usize + 1).collect();
    let stream = s.rest();
    let ct = if json {
        "application/json"
    } else {
        "text/event-stream"
    };
    let whole = observe(ct, &[stream]);
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(observe(ct, &bytes), whole, "byte-by-byte frames differ");
    let mut pieces = Vec::new();
    let mut rest = stream;
    let mut i = 0;
    while !rest.is_empty() {
        let n = cuts
            .get(i % cuts.len().max(1))
            .copied()
            .unwrap_or(7)
            .min(rest.len());
        pieces.push(&rest[..n]);
        rest = &rest[n..];
        i += 1;
    }
    assert_eq!(observe(ct, &pieces), whole, "frames cut at {cuts:?} differ");
    if !json {
        assert!(whole[0] <= 1, "more than one first token");
        assert!(whole[1] <= whole[0] * stream.len() as u64);
    }
}

// ---------------------------------------------------------------------------------------------
// Header and session parsing.

const HEADER_NAMES: [&str; 13] = [
    "x-kvbust-phase",
    "x-kvbust-target",
    "x-kvbust-user-context-messages",
    "x-kvbust-trace-id",
    "x-kvbust-benchmark-id",
    "x-kvbust-recycle-pass",
    "x-kvbust-trajectory-index",
    "x-correlation-id",
    "x-session-id",
    "content-encoding",
    "x-kvbust-synth",
    "x-kvbust-phase",
    "x-correlation-id",
];

/// Lines `<name byte><value>` up to an empty line, then a body. A name byte past the table
/// takes the line as `name:value`.
pub fn check_headers(data: &[u8]) {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &b""[..]),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|&b| b == b'\n') {
        let Some((&sel, rest)) = line.split_first() else {
            continue;
        };
        let (name, value) = match HEADER_NAMES.get(sel as usize) {
            Some(n) => (HeaderName::from_static(n), rest),
            None => {
                let Some(c) = rest.iter().position(|&b| b == b':') else {
                    continue;
                };
                let Ok(n) = HeaderName::from_bytes(&rest[..c]) else {
                    continue;
                };
                (n, &rest[c + 1..])
            }
        };
        if let Ok(v) = HeaderValue::from_bytes(value) {
            if let Ok(text) = v.to_str() {
                check_target_phase_text(text);
            }
            headers.append(name, v);
        }
    }
    let rt = SharedState::new(Arc::new(Config::default()), Metrics::new());
    let cfg = &rt.config;
    let control = rewrite::has_control_headers(&headers, &cfg.headers);
    let d = match rewrite::decide(&headers, control, &rt) {
        Ok(d) => d,
        Err(e) => {
            assert_eq!(e.status(), http::StatusCode::BAD_REQUEST, "{e}");
            let msg = e.to_string();
            bounded_error("decide", &msg);
            for v in headers.values() {
                quotes_at_most_200("decide", &msg, v.as_bytes());
            }
            return;
        }
    };
    if !d.needs_body() {
        return;
    }
    let limit = cfg.limits.max_control_header.as_u64() as usize;
    let key = rewrite::header_session_key(
        &cfg.cache_bust.session_sources,
        &headers,
        &cfg.headers,
        limit,
    );
    let body = Bytes::copy_from_slice(body);
    let run = || rewrite::apply(&d, Shape::Chat, &body, &headers, &rt, None);
    let first = match run() {
        Ok(r) => r,
        Err(e) => {
            assert_eq!(e.status(), http::StatusCode::BAD_REQUEST, "{e}");
            let msg = e.to_string();
            bounded_error("apply", &msg);
            quotes_at_most_200("apply", &msg, &body);
            for v in headers.values() {
                quotes_at_most_200("apply", &msg, v.as_bytes());
            }
            return;
        }
    };
    if let Some(b) = &first.body {
        assert!(serde_json::from_slice::<&serde_json::value::RawValue>(b).is_ok());
    }
    if let Some(rid) = &first.rid {
        assert!(
            rid.len() == 12 && rid.bytes().all(|b| b.is_ascii_hexdigit()),
            "{rid}"
        );
    }
    // A session named by a header is one session: the same request gets the same RID again.
    if matches!(key, Ok(Some(_))) || d.explicit.is_some() {
        let second = run().expect("the same request succeeds twice");
        assert_eq!(second.rid, first.rid, "one session, two RIDs");
        assert_eq!(second.body, first.body);
    }
}

fn check_target_phase_text(text: &str) {
    if let Ok(t) = text.parse::<Target>() {
        assert_eq!(t.as_str().parse::<Target>().ok(), Some(t));
    }
    if let Ok(p) = text.parse::<Phase>() {
        assert_eq!(p.as_str().parse::<Phase>().ok(), Some(p));
    }
}

// ---------------------------------------------------------------------------------------------
// Config loader.

/// First byte: file format (even TOML, odd YAML). Then the file text, a NUL, and `KEY=VALUE`
/// lines for the environment (`KVBUST_` added when missing).
pub fn check_config(data: &[u8]) {
    let mut s = Src::new(data);
    let yaml = s.flag();
    let rest = s.rest();
    let (file, env) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &b""[..]),
    };
    let env: Vec<(String, String)> = String::from_utf8_lossy(env)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let k = if k.starts_with("KVBUST_") {
                k.to_string()
            } else {
                format!("KVBUST_{k}")
            };
            (k, v.to_string())
        })
        .collect();
    let ext = if yaml { "yaml" } else { "toml" };
    let path = std::env::temp_dir().join(format!("kvbust-fuzz-{}.{ext}", std::process::id()));
    std::fs::write(&path, file).expect("temp file writable");
    let loaded = Config::load(Some(&path), &env, &CliOverrides::default());
    let input = String::from_utf8_lossy(rest);
    let secret = url_password(&input);
    match loaded {
        Err(e) => {
            assert!(!e.key.is_empty(), "config error names no key: {e}");
            let msg = e.to_string();
            assert!(msg.contains(&e.key), "{msg}");
            if let Some(pw) = secret {
                assert!(
                    !msg.contains(pw),
                    "config error shows the URL password: {msg}"
                );
            }
        }
        Ok(cfg) => {
            let shown = cfg.redacted().to_toml();
            if let Some(pw) = secret {
                assert!(
                    !shown.contains(pw),
                    "redacted config shows the URL password"
                );
            }
            // What `config show` prints loads back to the same configuration.
            let text = cfg.to_toml();
            let path2 = path.with_extension("toml");
            std::fs::write(&path2, &text).expect("temp file writable");
            let back = Config::load(Some(&path2), &[], &CliOverrides::default())
                .unwrap_or_else(|e| panic!("config show output does not load: {e}\n{text}"));
            assert_eq!(
                back.to_toml(),
                text,
                "config show output does not round-trip"
            );
        }
    }
}

/// A password in a `scheme://user:pw@` URL that occurs once in the input and is long enough not
/// to occur by chance in kvbust's own text.
fn url_password(input: &str) -> Option<&str> {
    let after = &input[input.find("://")? + 3..];
    let userinfo = &after[..after.find('@')?];
    if userinfo.contains('/') {
        return None;
    }
    let pw = userinfo.split_once(':')?.1;
    (pw.len() >= 8
        && input.matches(pw).count() == 1
        && pw.chars().all(|c| c.is_ascii_alphanumeric()))
    .then_some(pw)
}
