//! JSON API payloads for the coding corpus (chat requests and responses, tool calls, REST
//! resources, errors, webhooks) and the small ordered JSON writer every generator uses.
//! Owns these templates and the writer; must never reorder keys or emit invalid JSON.

use super::draw::Draw;
use super::vocab;

/// An ordered JSON value (keys keep insertion order, numbers keep their written form).
#[derive(Debug, Clone)]
pub enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    pub fn s(v: impl Into<String>) -> J {
        J::Str(v.into())
    }
    pub fn n(v: &str) -> J {
        J::Num(v.to_owned())
    }
    pub fn int(v: u64) -> J {
        J::Num(v.to_string())
    }
    pub fn float(v: f64, digits: usize) -> J {
        J::Num(format!("{v:.digits$}"))
    }
    pub fn arr(v: Vec<J>) -> J {
        J::Arr(v)
    }
    pub fn obj(v: Vec<(&str, J)>) -> J {
        J::Obj(v.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }

    /// Two-space indented text, like `json.dumps(indent=2)`.
    pub fn pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, Some(0));
        out
    }

    /// Compact text with `", "`/`": "` separators, like `json.dumps`.
    pub fn compact(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, None);
        out
    }

    fn write(&self, out: &mut String, indent: Option<usize>) {
        match self {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Num(n) => out.push_str(n),
            J::Str(s) => out.push_str(&quote(s)),
            J::Arr(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                        if indent.is_none() {
                            out.push(' ');
                        }
                    }
                    newline(out, indent.map(|n| n + 1));
                    item.write(out, indent.map(|n| n + 1));
                }
                newline(out, indent);
                out.push(']');
            }
            J::Obj(fields) => {
                if fields.is_empty() {
                    out.push_str("{}");
                    return;
                }
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                        if indent.is_none() {
                            out.push(' ');
                        }
                    }
                    newline(out, indent.map(|n| n + 1));
                    out.push_str(&quote(k));
                    out.push_str(": ");
                    v.write(out, indent.map(|n| n + 1));
                }
                newline(out, indent);
                out.push('}');
            }
        }
    }
}

fn newline(out: &mut String, indent: Option<usize>) {
    if let Some(n) = indent {
        out.push('\n');
        for _ in 0..n {
            out.push_str("  ");
        }
    }
}

/// A JSON string literal.
pub fn quote(s: &str) -> String {
    // Serialising a &str to JSON cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

/// One JSON API payload block.
pub fn block(d: &mut Draw) -> String {
    match d.weighted(&[20, 20, 20, 20, 10, 10]) {
        0 => chat_request(d),
        1 => chat_response(d),
        2 => tool_call(d),
        3 => rest_resource(d),
        4 => error_payload(d),
        _ => webhook(d),
    }
}

fn id(d: &mut Draw, prefix: &str) -> String {
    format!("{prefix}{}", d.alnum_n(12, 24))
}

fn iso(d: &mut Draw) -> String {
    let (h, m, s) = d.clock();
    format!("{}T{h:02}:{m:02}:{s:02}.{:03}Z", d.date(), d.int(0, 999))
}

fn tool_schema(d: &mut Draw, name: &str) -> J {
    let mut props = Vec::new();
    let mut required = Vec::new();
    for _ in 0..d.n(1, 4) {
        let p = d.noun_snake();
        let ty = d.s(&["string", "integer", "boolean", "array", "number"]);
        let mut spec = vec![
            ("type", J::s(ty)),
            ("description", J::s(format!("The {}.", d.noun_phrase()))),
        ];
        if ty == "array" {
            spec.push(("items", J::obj(vec![("type", J::s("string"))])));
        }
        if d.chance(0.6) {
            required.push(J::s(p.clone()));
        }
        props.push((p, J::obj(spec)));
    }
    J::obj(vec![
        ("type", J::s("function")),
        (
            "function",
            J::obj(vec![
                ("name", J::s(name)),
                ("description", J::s(format!("{}.", d.sentence()))),
                (
                    "parameters",
                    J::obj(vec![
                        ("type", J::s("object")),
                        ("properties", J::Obj(props)),
                        ("required", J::arr(required)),
                    ]),
                ),
            ]),
        ),
    ])
}

fn tool_args(d: &mut Draw, tool: &str) -> J {
    match tool {
        "read_file" | "view_file" => {
            J::obj(vec![("path", J::s(d.path_of(&["py", "go", "rs", "ts"])))])
        }
        "run_command" | "bash" => J::obj(vec![
            (
                "command",
                J::s(format!(
                    "{} {}",
                    d.s(&[
                        "pytest -x",
                        "cargo test",
                        "go test ./...",
                        "npm test --",
                        "ruff check",
                        "git diff --stat"
                    ]),
                    d.path_of(&["py", "rs", "go", "ts"])
                )),
            ),
            ("timeout", J::int(d.int(10, 600))),
        ]),
        "search_code" | "grep" => J::obj(vec![
            ("pattern", J::s(d.fn_snake())),
            (
                "glob",
                J::s(d.s(&["**/*.py", "src/**/*.rs", "**/*.go", "src/**/*.ts"])),
            ),
        ]),
        "edit_file" | "apply_patch" => J::obj(vec![
            ("path", J::s(d.path_of(&["py", "go", "rs", "ts"]))),
            ("old_str", J::s(format!("    return {}", d.noun_snake()))),
            (
                "new_str",
                J::s(format!("    return {}({})", d.fn_snake(), d.noun_snake())),
            ),
        ]),
        _ => J::obj(vec![
            ("query", J::s(d.noun_phrase())),
            ("limit", J::int(d.int(1, 50))),
        ]),
    }
}

fn chat_request(d: &mut Draw) -> String {
    let mut messages = vec![J::obj(vec![
        ("role", J::s("system")),
        (
            "content",
            J::s(format!(
                "You are a coding assistant working in the {} repository. {}",
                d.project(),
                d.s(&[
                    "Prefer small, reviewable diffs.",
                    "Run the tests before you answer.",
                    "Answer concisely.",
                    "Always explain the root cause first."
                ])
            )),
        ),
    ])];
    for _ in 0..d.n(1, 3) {
        messages.push(J::obj(vec![
            ("role", J::s("user")),
            (
                "content",
                J::s(format!(
                    "{} `{}` in {}?",
                    d.s(&[
                        "Why does this fail:",
                        "Can you refactor",
                        "How should I test",
                        "What is wrong with",
                        "Please document"
                    ]),
                    d.fn_snake(),
                    d.code_path()
                )),
            ),
        ]));
        if d.chance(0.6) {
            messages.push(J::obj(vec![
                ("role", J::s("assistant")),
                (
                    "content",
                    J::s(format!(
                        "The {} is {} because {}.",
                        d.noun_phrase(),
                        d.s(&vocab::STATES),
                        d.s(&vocab::ERROR_PHRASES)
                    )),
                ),
            ]));
        }
    }
    let mut fields = vec![
        ("model", J::s(d.s(&vocab::MODELS))),
        ("messages", J::arr(messages)),
        (
            "max_tokens",
            J::int(*d.pick(&[256u64, 512, 1024, 2048, 4096])),
        ),
        ("temperature", J::float(d.float(0.0, 1.0), 1)),
        ("stream", J::Bool(d.chance(0.5))),
    ];
    if d.chance(0.5) {
        let tools: Vec<J> = d
            .sample_n(&vocab::TOOLS, 1, 3)
            .into_iter()
            .map(|t| tool_schema(d, t))
            .collect();
        fields.push(("tools", J::arr(tools)));
        fields.push(("tool_choice", J::s("auto")));
    }
    let body = J::obj(fields);
    match d.n(0, 3) {
        0 => format!("POST /v1/chat/completions HTTP/1.1\nHost: {}\nContent-Type: application/json\n\n{}", d.s(&["localhost:8000", "127.0.0.1:8080", "api.internal"]), body.pretty()),
        1 => format!("$ curl -s http://localhost:{}/v1/chat/completions -H 'Content-Type: application/json' -d '{}'", d.s(&["8000", "8080", "30000"]), body.compact()),
        2 => format!("payload = {}\nresp = {}.post(f\"{{BASE_URL}}/v1/chat/completions\", json=payload, timeout={})", body.pretty(), d.s(&["requests", "httpx", "session", "client"]), d.int(5, 600)),
        _ => format!("request body ({} bytes):\n{}", body.compact().len(), body.pretty()),
    }
}

fn usage(d: &mut Draw) -> J {
    let p = d.int(20, 30_000);
    let c = d.int(1, 4000);
    J::obj(vec![
        ("prompt_tokens", J::int(p)),
        ("completion_tokens", J::int(c)),
        ("total_tokens", J::int(p + c)),
    ])
}

fn chat_response(d: &mut Draw) -> String {
    let content = format!(
        "The {} in `{}` {} `{}` {}. I changed it to {} and added a test for the {} case.",
        d.s(&["failure", "panic", "timeout", "regression", "flaky test"]),
        d.path_of(&["py", "go", "rs", "ts"]),
        d.s(&["comes from", "is caused by", "happens in"]),
        d.fn_snake(),
        d.s(&[
            "returning early on an empty batch",
            "not releasing the lock",
            "reading a stale cache entry",
            "ignoring the context deadline"
        ]),
        d.s(&[
            "check the length first",
            "use a scoped guard",
            "refresh the entry on miss",
            "propagate the error"
        ]),
        d.noun_phrase()
    );
    let resp = J::obj(vec![
        ("id", J::s(id(d, "chatcmpl-"))),
        ("object", J::s("chat.completion")),
        ("created", J::int(d.int(1_700_000_000, 1_780_000_000))),
        ("model", J::s(d.s(&vocab::MODELS))),
        (
            "choices",
            J::arr(vec![J::obj(vec![
                ("index", J::int(0)),
                (
                    "message",
                    J::obj(vec![
                        ("role", J::s("assistant")),
                        ("content", J::s(content)),
                    ]),
                ),
                ("finish_reason", J::s(d.s(&["stop", "length", "stop"]))),
            ])]),
        ),
        ("usage", usage(d)),
    ]);
    resp.pretty()
}

fn tool_call(d: &mut Draw) -> String {
    let tool = d.s(&vocab::TOOLS);
    let args = tool_args(d, tool);
    let call_id = id(d, "call_");
    let mut parts = Vec::new();
    let call = J::obj(vec![
        ("role", J::s("assistant")),
        ("content", J::Null),
        (
            "tool_calls",
            J::arr(vec![J::obj(vec![
                ("id", J::s(call_id.clone())),
                ("type", J::s("function")),
                (
                    "function",
                    J::obj(vec![
                        ("name", J::s(tool)),
                        ("arguments", J::s(args.compact())),
                    ]),
                ),
            ])]),
        ),
    ]);
    parts.push(call.pretty());
    if d.chance(0.7) {
        let result = match tool {
            "run_command" | "bash" => format!(
                "exit code {}\n{} passed, {} failed in {:.2}s",
                d.s(&["0", "1", "0", "2"]),
                d.int(0, 300),
                d.int(0, 5),
                d.float(0.1, 90.0)
            ),
            "read_file" | "view_file" => format!(
                "1\tdef {}({}):\n2\t    return {}\n",
                d.fn_snake(),
                d.noun_snake(),
                d.noun_snake()
            ),
            _ => format!("{} matches in {} files", d.int(0, 90), d.int(1, 20)),
        };
        let out = J::obj(vec![
            ("role", J::s("tool")),
            ("tool_call_id", J::s(call_id)),
            ("content", J::s(result)),
        ]);
        parts.push(out.pretty());
    }
    parts.join("\n")
}

fn resource(d: &mut Draw, kind: &str) -> J {
    let mut fields = vec![
        (
            "id",
            J::s(id(d, &format!("{}_", &kind[..3.min(kind.len())]))),
        ),
        ("created_at", J::s(iso(d))),
        ("updated_at", J::s(iso(d))),
    ];
    let extra: Vec<(String, J)> = (0..d.n(2, 6))
        .map(|_| {
            let k = d.noun_snake();
            let v = match d.n(0, 4) {
                0 => J::int(d.int(0, 100_000)),
                1 => J::s(d.noun_phrase()),
                2 => J::Bool(d.chance(0.5)),
                3 => J::float(d.float(0.0, 1000.0), 2),
                _ => J::Null,
            };
            (k, v)
        })
        .collect();
    let mut obj: Vec<(String, J)> = fields.drain(..).map(|(k, v)| (k.to_owned(), v)).collect();
    obj.push((
        "status".into(),
        J::s(d.s(&[
            "active",
            "pending",
            "archived",
            "failed",
            "running",
            "succeeded",
        ])),
    ));
    obj.extend(extra);
    J::Obj(obj)
}

fn rest_resource(d: &mut Draw) -> String {
    let kind = d.s(&vocab::NOUNS);
    let n = d.n(1, 4);
    let items: Vec<J> = (0..n).map(|_| resource(d, kind)).collect();
    let body = J::obj(vec![
        ("object", J::s("list")),
        ("data", J::arr(items)),
        ("has_more", J::Bool(d.chance(0.5))),
        (
            "next_cursor",
            if d.chance(0.5) {
                J::s(d.alnum(16))
            } else {
                J::Null
            },
        ),
    ]);
    format!(
        "$ curl -s {}://{}/api/{}s?limit={} | jq .\n{}",
        d.s(&["http", "https"]),
        d.s(&[
            "localhost:8080",
            "127.0.0.1:3000",
            "api.internal",
            "staging.local:8000"
        ]),
        kind,
        n,
        body.pretty()
    )
}

fn error_payload(d: &mut Draw) -> String {
    let code = *d.pick(&[400u64, 401, 403, 404, 409, 422, 429, 500, 502, 503]);
    let body = J::obj(vec![(
        "error",
        J::obj(vec![
            (
                "code",
                J::s(d.s(&[
                    "invalid_request",
                    "rate_limited",
                    "not_found",
                    "conflict",
                    "internal_error",
                    "context_length_exceeded",
                    "unauthorized",
                ])),
            ),
            (
                "message",
                J::s(format!(
                    "{}: {}",
                    d.noun_phrase(),
                    d.s(&vocab::ERROR_PHRASES)
                )),
            ),
            ("status", J::int(code)),
            ("request_id", J::s(format!("req_{}", d.hex(24)))),
            (
                "details",
                J::arr(vec![J::obj(vec![
                    ("field", J::s(d.noun_snake())),
                    (
                        "reason",
                        J::s(d.s(&[
                            "must not be empty",
                            "exceeds maximum length",
                            "unknown value",
                            "must be a positive integer",
                        ])),
                    ),
                ])]),
            ),
        ]),
    )]);
    format!(
        "HTTP/1.1 {code} {}\ncontent-type: application/json\nx-request-id: {}\n\n{}",
        d.s(&["Bad Request", "Error"]),
        d.hex(16),
        body.pretty()
    )
}

fn webhook(d: &mut Draw) -> String {
    let body = J::obj(vec![
        (
            "event",
            J::s(format!(
                "{}.{}",
                d.s(&vocab::NOUNS),
                d.s(&["created", "updated", "deleted", "completed", "failed"])
            )),
        ),
        (
            "delivery_id",
            J::s(format!("{}-{}-{}", d.hex(8), d.hex(4), d.hex(12))),
        ),
        ("timestamp", J::s(iso(d))),
        (
            "repository",
            J::obj(vec![
                ("full_name", J::s(format!("{}/{}", d.user(), d.project()))),
                ("default_branch", J::s("main")),
            ]),
        ),
        (
            "sender",
            J::obj(vec![("login", J::s(d.user())), ("type", J::s("User"))]),
        ),
        ("payload", resource(d, "event")),
    ]);
    body.pretty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_output_is_valid_json() {
        for seed in 0..50 {
            let mut d = Draw::new(seed);
            let v = resource(&mut d, "order");
            let pretty: serde_json::Value = serde_json::from_str(&v.pretty()).expect("valid");
            let compact: serde_json::Value = serde_json::from_str(&v.compact()).expect("valid");
            assert_eq!(pretty, compact);
        }
        assert_eq!(
            J::obj(vec![("a", J::arr(vec![J::int(1), J::Null]))]).compact(),
            "{\"a\": [1, null]}"
        );
    }
}
