//! General source code for the coding corpus: Python, Go, Rust and TypeScript files made of
//! imports, functions, types, methods and tests. Owns these templates; must never emit text
//! that was not composed here from the vocabularies.

use super::draw::{camel_of, capitalize, pascal_of, Draw};
use super::vocab;

/// One general-code block in one of the four languages.
pub fn block(d: &mut Draw) -> String {
    match d.n(0, 3) {
        0 => python(d),
        1 => go(d),
        2 => rust(d),
        _ => typescript(d),
    }
}

// ---------------------------------------------------------------- Python

fn py_type(d: &mut Draw) -> String {
    match d.n(0, 9) {
        0 => "int".into(),
        1 => "str".into(),
        2 => "float".into(),
        3 => "bool".into(),
        4 => "bytes".into(),
        5 => format!("list[{}]", d.s(&["int", "str", "float", "dict[str, Any]"])),
        6 => format!("dict[str, {}]", d.s(&["int", "str", "Any", "list[str]"])),
        7 => format!("{} | None", d.s(&["int", "str", "float", "Path"])),
        8 => "Path".into(),
        _ => d.pascal(),
    }
}

fn py_value(d: &mut Draw) -> String {
    match d.n(0, 7) {
        0 => d.int(0, 4096).to_string(),
        1 => format!("\"{}\"", d.noun_snake()),
        2 => format!("{:.3}", d.float(0.0, 10.0)),
        3 => d.s(&["None", "True", "False", "[]", "{}"]).into(),
        4 => format!("self.{}", d.noun_snake()),
        5 => format!("len({})", d.noun_snake()),
        6 => format!("{}.get(\"{}\")", d.noun_snake(), d.noun_snake()),
        _ => format!("{}({})", d.fn_snake(), d.noun_snake()),
    }
}

fn py_stmt(d: &mut Draw, out: &mut String, ind: &str, vars: &[String]) {
    let v = d.pick(vars).clone();
    PY_STMTS[d.n(0, PY_STMTS.len() - 1)](d, out, ind, &v, vars);
}

/// A statement at indent `ind` about the variable `v` (one of `vars`).
type PyStmt = fn(&mut Draw, &mut String, &str, &str, &[String]);

/// Python statements, drawn uniformly (the order is part of the corpus).
const PY_STMTS: [PyStmt; 12] = [
    |d, out, ind, _, _| w!(out, "{ind}{} = {}", d.snake(), py_value(d)),
    py_none_check,
    py_for_loop,
    |d, out, ind, v, _| {
        w!(
            out,
            "{ind}logger.{}(\"{} %s in %.2fs\", {v}, time.monotonic() - start)",
            d.s(&["info", "debug", "warning"]),
            d.sentence().to_lowercase()
        )
    },
    py_try,
    |d, out, ind, v, _| {
        w!(
            out,
            "{ind}{} = {{k: v for k, v in {v}.items() if v is not None}}",
            d.noun_snake()
        )
    },
    |d, out, ind, v, _| {
        w!(
            out,
            "{ind}{} = [{}(x) for x in {v} if x.{}]",
            d.noun_snake(),
            d.fn_snake(),
            d.noun_snake()
        )
    },
    py_with,
    |d, out, ind, v, _| {
        w!(
            out,
            "{ind}assert {v} {} {}, \"{}\"",
            d.s(&[">=", "<=", "!=", "=="]),
            d.int(0, 512),
            d.noun_phrase()
        )
    },
    |d, out, ind, _, _| w!(out, "{ind}# {}", d.sentence()),
    |d, out, ind, _, _| w!(out, "{ind}self._{} += {}", d.noun_snake(), d.int(1, 16)),
    |d, out, ind, _, vars| w!(out, "{ind}{}", py_call(d, vars)),
];

fn py_none_check(d: &mut Draw, out: &mut String, ind: &str, v: &str, vars: &[String]) {
    w!(out, "{ind}if {v} is None:");
    w!(
        out,
        "{ind}    raise {}(f\"{} is required for {{{}!r}}\")",
        d.s(&["ValueError", "KeyError", "RuntimeError", "TypeError"]),
        v,
        d.pick(vars)
    );
}

fn py_for_loop(d: &mut Draw, out: &mut String, ind: &str, v: &str, _: &[String]) {
    let item = d.s(&vocab::NOUNS);
    w!(out, "{ind}for {item} in {v}:");
    w!(out, "{ind}    if not {item}.{}:", d.s(&vocab::ADJS));
    w!(out, "{ind}        continue");
    w!(
        out,
        "{ind}    {}.append({}({item}))",
        d.noun_snake(),
        d.fn_snake()
    );
}

fn py_try(d: &mut Draw, out: &mut String, ind: &str, v: &str, _: &[String]) {
    w!(out, "{ind}try:");
    w!(
        out,
        "{ind}    {} = await self.{}({v})",
        d.noun_snake(),
        d.fn_snake()
    );
    w!(
        out,
        "{ind}except {} as exc:",
        d.s(&["TimeoutError", "ConnectionError", "OSError", "KeyError"])
    );
    w!(
        out,
        "{ind}    logger.warning(\"{} failed: %s\", exc)",
        d.fn_snake()
    );
    w!(
        out,
        "{ind}    return {}",
        d.s(&["None", "[]", "{}", "False"])
    );
}

fn py_with(d: &mut Draw, out: &mut String, ind: &str, v: &str, vars: &[String]) {
    w!(
        out,
        "{ind}with {}.{}() as {}:",
        v,
        d.s(&["lock", "session", "begin", "open"]),
        d.s(&["tx", "fh", "conn", "ctx"])
    );
    w!(out, "{ind}    {}", py_call(d, vars));
}

fn py_call(d: &mut Draw, vars: &[String]) -> String {
    let a = d.pick(vars).clone();
    match d.n(0, 3) {
        0 => format!("{}({a}, {}={})", d.fn_snake(), d.noun_snake(), py_value(d)),
        1 => format!("self.{}.{}({a})", d.noun_snake(), d.fn_snake()),
        2 => format!("await {}.{}({a})", d.noun_snake(), d.fn_snake()),
        _ => format!("{}.{}({a}, {})", d.noun_snake(), d.fn_snake(), py_value(d)),
    }
}

fn py_params(d: &mut Draw, n: usize) -> (Vec<String>, String) {
    let mut names: Vec<String> = Vec::new();
    let mut parts = Vec::new();
    for _ in 0..n {
        let name = d.noun_snake();
        if names.contains(&name) {
            continue;
        }
        let ty = py_type(d);
        if d.chance(0.25) {
            parts.push(format!("{name}: {ty} = {}", py_value(d)));
        } else {
            parts.push(format!("{name}: {ty}"));
        }
        names.push(name);
    }
    if names.is_empty() {
        names.push("value".into());
        parts.push("value: Any".into());
    }
    (names, parts.join(", "))
}

fn py_function(d: &mut Draw, out: &mut String, ind: &str, method: bool) {
    let is_async = d.chance(0.3);
    let n = d.n(1, 4);
    let (vars, params) = py_params(d, n);
    let name = d.fn_snake();
    let self_ = if method { "self, " } else { "" };
    let ret = py_type(d);
    if d.chance(0.2) {
        w!(
            out,
            "{ind}@{}",
            d.s(&[
                "staticmethod",
                "functools.lru_cache(maxsize=128)",
                "retry(attempts=3)",
                "timed",
                "property"
            ])
        );
    }
    w!(
        out,
        "{ind}{}def {name}({self_}{params}) -> {ret}:",
        if is_async { "async " } else { "" }
    );
    w!(out, "{ind}    \"\"\"{}.", d.sentence());
    if d.chance(0.5) {
        w!(out);
        w!(out, "{ind}    Args:");
        for v in &vars {
            w!(out, "{ind}        {v}: the {}.", d.noun_phrase());
        }
        w!(out);
        w!(out, "{ind}    Returns:");
        w!(out, "{ind}        The {}.", d.noun_phrase());
    }
    w!(out, "{ind}    \"\"\"");
    if d.chance(0.4) {
        w!(out, "{ind}    start = time.monotonic()");
    }
    let inner = format!("{ind}    ");
    for _ in 0..d.n(2, 6) {
        py_stmt(d, out, &inner, &vars);
    }
    w!(out, "{ind}    return {}", py_value(d));
}

fn python(d: &mut Draw) -> String {
    let mut out = String::new();
    py_header(d, &mut out);
    w!(out);
    for _ in 0..d.n(1, 3) {
        w!(out);
        PY_ITEMS[d.n(0, PY_ITEMS.len() - 1)](d, &mut out);
    }
    out
}

/// Top-level items of a Python module, drawn uniformly (the order is part of the corpus).
const PY_ITEMS: [fn(&mut Draw, &mut String); 4] = [
    |d, out| py_function(d, out, "", false),
    py_class,
    py_tests,
    py_main,
];

/// The path comment, imports, logger and a module constant of a Python module.
fn py_header(d: &mut Draw, out: &mut String) {
    if d.chance(0.5) {
        w!(out, "# {}", d.path("py"));
    }
    if d.chance(0.4) {
        w!(out, "from __future__ import annotations");
        w!(out);
    }
    let mut mods = d.sample_n(&vocab::PY_STDLIB, 2, 5);
    mods.sort_unstable();
    for m in mods {
        w!(out, "import {m}");
    }
    if d.chance(0.6) {
        w!(
            out,
            "from typing import {}",
            d.sample_n(
                &["Any", "Iterable", "Mapping", "Sequence", "Callable", "Protocol", "TypeVar"],
                1,
                3
            )
            .join(", ")
        );
    }
    if d.chance(0.6) {
        w!(
            out,
            "from {}.{} import {}, {}",
            d.project().replace('-', "_"),
            d.s(&vocab::SUB_DIRS),
            d.pascal(),
            d.fn_snake()
        );
    }
    w!(out);
    match d.n(0, 3) {
        0 => w!(out, "logger = logging.getLogger(__name__)"),
        1 => w!(out, "log = logging.getLogger(\"{}\")", d.project()),
        2 => w!(out, "logger = structlog.get_logger()"),
        _ => {}
    }
    if d.chance(0.4) {
        w!(
            out,
            "{} = {}",
            d.noun_snake().to_uppercase(),
            d.int(2, 10_000)
        );
    }
}

/// A class with its methods.
fn py_class(d: &mut Draw, out: &mut String) {
    let cls = d.pascal();
    if d.chance(0.5) {
        w!(
            out,
            "@dataclass{}",
            d.s(&["", "(frozen=True)", "(slots=True)"])
        );
        w!(out, "class {cls}:");
        w!(out, "    \"\"\"{}.\"\"\"", d.sentence());
        w!(out);
        for _ in 0..d.n(2, 6) {
            w!(
                out,
                "    {}: {} = {}",
                d.noun_snake(),
                py_type(d),
                py_value(d)
            );
        }
    } else {
        w!(
            out,
            "class {cls}({}):",
            d.s(&["", "Base", "Protocol", "Exception", "nn.Module"])
        );
        let n = d.n(1, 3);
        let (vars, params) = py_params(d, n);
        w!(out, "    def __init__(self, {params}) -> None:");
        for v in &vars {
            w!(out, "        self.{v} = {v}");
        }
        w!(
            out,
            "        self._{} = {}",
            d.noun_snake(),
            d.s(&["{}", "[]", "0", "None", "threading.Lock()"])
        );
    }
    for _ in 0..d.n(1, 2) {
        w!(out);
        py_function(d, out, "    ", true);
    }
}

/// Test functions for one subject.
fn py_tests(d: &mut Draw, out: &mut String) {
    let subject = d.fn_snake();
    for _ in 0..d.n(1, 3) {
        if d.chance(0.3) {
            w!(
                out,
                "@pytest.mark.parametrize(\"{}\", [{}, {}, {}])",
                d.noun_snake(),
                d.int(0, 9),
                d.int(10, 99),
                d.int(100, 999)
            );
        }
        w!(
            out,
            "def test_{subject}_{}({}):",
            d.s(&[
                "returns_empty",
                "handles_missing_key",
                "raises_on_invalid",
                "is_idempotent",
                "respects_limit",
                "roundtrip",
                "with_retry",
                "sorted_output"
            ]),
            d.s(&["", "tmp_path", "monkeypatch", "client", "db_session"])
        );
        let var = d.noun_snake();
        w!(out, "    {var} = {subject}({})", py_value(d));
        w!(
            out,
            "    assert {var} {} {}",
            d.s(&["==", "!=", "is not", "=="]),
            py_value(d)
        );
        if d.chance(0.5) {
            w!(
                out,
                "    with pytest.raises({}):",
                d.s(&vocab::PY_EXCEPTIONS)
            );
            w!(out, "        {subject}({})", py_value(d));
        }
        w!(out);
    }
}

/// A `main` entry point with an argument parser.
fn py_main(d: &mut Draw, out: &mut String) {
    let p = d.s(&["parser", "ap", "cli"]);
    w!(
        out,
        "def {}(argv{}) -> int:",
        d.s(&["main", "cli", "run", "entrypoint"]),
        d.s(&[
            ": list[str] | None = None",
            "=None",
            ": Sequence[str] | None = None"
        ])
    );
    w!(
        out,
        "    {p} = argparse.ArgumentParser(description=\"{}\")",
        d.sentence()
    );
    for _ in 0..d.n(2, 4) {
        w!(
            out,
            "    {p}.add_argument(\"--{}\", type={}, default={})",
            d.noun_snake().replace('_', "-"),
            d.s(&["int", "str", "float"]),
            py_value(d)
        );
    }
    let a = d.s(&["args", "opts", "ns"]);
    w!(out, "    {a} = {p}.parse_args(argv)");
    w!(out, "    {}({a})", d.fn_snake());
    w!(out, "    return 0");
    w!(out);
    w!(out);
    w!(out, "if __name__ == \"__main__\":");
    w!(out, "    sys.exit(main())");
}

// ---------------------------------------------------------------- Go

fn go_type(d: &mut Draw) -> String {
    match d.n(0, 9) {
        0 => "int".into(),
        1 => "string".into(),
        2 => "int64".into(),
        3 => "bool".into(),
        4 => "[]byte".into(),
        5 => "time.Duration".into(),
        6 => format!("[]{}", d.s(&["string", "int", "*Item", "Event"])),
        7 => format!("map[string]{}", d.s(&["int", "string", "bool", "*Entry"])),
        8 => format!("*{}", d.pascal()),
        _ => "float64".into(),
    }
}

fn go_function(d: &mut Draw, out: &mut String, recv: Option<&str>) {
    let name = capitalize(&d.camel_fn());
    let mut params = vec!["ctx context.Context".to_string()];
    let mut vars = vec![];
    for _ in 0..d.n(1, 3) {
        let v = d.camel();
        if vars.contains(&v) {
            continue;
        }
        params.push(format!("{v} {}", go_type(d)));
        vars.push(v);
    }
    let ret = go_type(d);
    let recv_s = match recv {
        Some(r) => format!("({} *{r}) ", r[..1].to_lowercase()),
        None => String::new(),
    };
    w!(out, "// {name} {}.", d.sentence().to_lowercase());
    w!(
        out,
        "func {recv_s}{name}({}) ({ret}, error) {{",
        params.join(", ")
    );
    for _ in 0..d.n(2, 5) {
        let v = d.pick(&vars).clone();
        GO_STMTS[d.n(0, GO_STMTS.len() - 1)](d, out, &v, &ret);
    }
    w!(out, "\treturn {}, nil", go_zero(&ret));
    w!(out, "}}");
}

/// A statement about the parameter `v` in a function returning `(ret, error)`.
type GoStmt = fn(&mut Draw, &mut String, &str, &str);

/// Go function statements, drawn uniformly (the order is part of the corpus).
const GO_STMTS: [GoStmt; 8] = [
    go_guard,
    go_call,
    go_range,
    |d, out, v, _| {
        w!(
            out,
            "\tslog.{}(\"{}\", \"{}\", {v}, \"elapsed\", time.Since(start))",
            d.s(&["Info", "Debug", "Warn"]),
            d.sentence().to_lowercase(),
            d.noun_snake()
        )
    },
    |d, out, _, _| {
        w!(
            out,
            "\tctx, cancel := context.WithTimeout(ctx, {}*time.{})",
            d.int(1, 60),
            d.s(&["Second", "Millisecond", "Minute"])
        );
        w!(out, "\tdefer cancel()");
    },
    go_select,
    |_, out, _, _| {
        w!(out, "\tmu.Lock()");
        w!(out, "\tdefer mu.Unlock()");
    },
    |d, out, _, _| w!(out, "\t// {}", d.sentence()),
];

fn go_guard(d: &mut Draw, out: &mut String, v: &str, ret: &str) {
    w!(out, "\tif {v} == {} {{", d.s(&["nil", "\"\"", "0"]));
    w!(
        out,
        "\t\treturn {}, fmt.Errorf(\"{}: %w\", Err{})",
        go_zero(ret),
        d.fn_snake().replace('_', " "),
        d.pascal()
    );
    w!(out, "\t}}");
}

fn go_call(d: &mut Draw, out: &mut String, v: &str, ret: &str) {
    let res = d.camel();
    w!(
        out,
        "\t{res}, err := {}.{}(ctx, {v})",
        d.camel(),
        capitalize(&d.camel_fn())
    );
    w!(out, "\tif err != nil {{");
    w!(
        out,
        "\t\treturn {}, fmt.Errorf(\"{} %q: %w\", {v}, err)",
        go_zero(ret),
        d.fn_snake().replace('_', " ")
    );
    w!(out, "\t}}");
    w!(out, "\t_ = {res}");
}

fn go_range(d: &mut Draw, out: &mut String, v: &str, _: &str) {
    w!(
        out,
        "\tfor i, {} := range {v} {{",
        d.s(&vocab::NOUNS).replace('_', "")
    );
    w!(out, "\t\tif i >= {} {{", d.int(8, 1024));
    w!(out, "\t\t\tbreak");
    w!(out, "\t\t}}");
    w!(out, "\t}}");
}

fn go_select(d: &mut Draw, out: &mut String, v: &str, ret: &str) {
    w!(out, "\tselect {{");
    w!(out, "\tcase <-ctx.Done():");
    w!(out, "\t\treturn {}, ctx.Err()", go_zero(ret));
    w!(out, "\tcase {} := <-{}:", d.camel(), d.camel());
    w!(out, "\t\t_ = {v}");
    w!(out, "\t}}");
}

fn go_zero(ty: &str) -> &'static str {
    match ty {
        "int" | "int64" | "float64" | "time.Duration" => "0",
        "string" => "\"\"",
        "bool" => "false",
        _ => "nil",
    }
}

fn go(d: &mut Draw) -> String {
    let mut out = String::new();
    let pkg = d.s(&vocab::SUB_DIRS);
    go_header(d, &mut out, pkg);
    let ty = d.pascal();
    go_struct(d, &mut out, &ty);
    if d.chance(0.5) {
        w!(out, "func New{ty}({} {}) *{ty} {{", d.camel(), go_type(d));
        w!(out, "\treturn &{ty}{{}}");
        w!(out, "}}");
        w!(out);
    }
    for _ in 0..d.n(1, 2) {
        go_function(d, &mut out, Some(&ty));
        w!(out);
    }
    if d.chance(0.5) {
        go_table_test(d, &mut out);
    }
    out
}

/// The package clause, the imports and maybe a sentinel error.
fn go_header(d: &mut Draw, out: &mut String, pkg: &str) {
    if d.chance(0.4) {
        w!(out, "// {}", d.path("go"));
    }
    w!(out, "package {pkg}");
    w!(out);
    w!(out, "import (");
    let mut imports = d.sample_n(&vocab::GO_IMPORTS, 3, 6);
    imports.sort_unstable();
    for i in imports {
        w!(out, "\t\"{i}\"");
    }
    if d.chance(0.5) {
        w!(out);
        w!(
            out,
            "\t\"github.com/{}/{}/internal/{}\"",
            d.user(),
            d.project(),
            d.s(&vocab::SUB_DIRS)
        );
    }
    w!(out, ")");
    w!(out);
    if d.chance(0.5) {
        w!(
            out,
            "var Err{} = errors.New(\"{}\")",
            d.pascal(),
            d.s(&vocab::ERROR_PHRASES)
        );
        w!(out);
    }
}

/// The struct `ty` with JSON-tagged fields and a mutex.
fn go_struct(d: &mut Draw, out: &mut String, ty: &str) {
    w!(out, "// {ty} {}.", d.sentence().to_lowercase());
    w!(out, "type {ty} struct {{");
    for _ in 0..d.n(2, 6) {
        let f = d.noun_snake();
        w!(
            out,
            "\t{} {} `json:\"{f}{}\"`",
            pascal_of(&[&f]),
            go_type(d),
            d.s(&["", ",omitempty"])
        );
    }
    w!(out, "\tmu sync.{}", d.s(&["Mutex", "RWMutex"]));
    w!(out, "}}");
    w!(out);
}

/// A table-driven test.
fn go_table_test(d: &mut Draw, out: &mut String) {
    let f = capitalize(&d.camel_fn());
    w!(out, "func Test{f}(t *testing.T) {{");
    w!(out, "\ttests := []struct {{");
    w!(out, "\t\tname string");
    w!(out, "\t\tin   {}", go_type(d));
    w!(out, "\t\twant {}", go_type(d));
    w!(out, "\t}}{{");
    for _ in 0..d.n(2, 4) {
        w!(
            out,
            "\t\t{{name: \"{}\", in: {}, want: {}}},",
            d.noun_phrase(),
            d.int(0, 100),
            d.int(0, 100)
        );
    }
    w!(out, "\t}}");
    let tc = d.s(&["tc", "tt", "test", "c"]);
    w!(out, "\tfor _, {tc} := range tests {{");
    w!(out, "\t\tt.Run({tc}.name, func(t *testing.T) {{");
    w!(out, "\t\t\tgot := {f}({tc}.in)");
    w!(out, "\t\t\tif got != {tc}.want {{");
    w!(
        out,
        "\t\t\t\tt.{}(\"{f}(%v) = %v, want %v\", {tc}.in, got, {tc}.want)",
        d.s(&["Errorf", "Fatalf"])
    );
    w!(out, "\t\t\t}}");
    w!(out, "\t\t}})");
    w!(out, "\t}}");
    w!(out, "}}");
}

// ---------------------------------------------------------------- Rust

fn rs_type(d: &mut Draw) -> String {
    match d.n(0, 10) {
        0 => "u64".into(),
        1 => "usize".into(),
        2 => "String".into(),
        3 => "bool".into(),
        4 => "f32".into(),
        5 => "Vec<u8>".into(),
        6 => format!("Vec<{}>", d.s(&["String", "u32", "Entry", "Span"])),
        7 => format!("Option<{}>", d.s(&["String", "u64", "Duration", "PathBuf"])),
        8 => format!("HashMap<String, {}>", d.s(&["u64", "String", "Vec<u32>"])),
        9 => "Duration".into(),
        _ => format!("Arc<{}>", d.pascal()),
    }
}

fn rust(d: &mut Draw) -> String {
    let mut out = String::new();
    rs_header(d, &mut out);
    let ty = d.pascal();
    let err = format!("{}Error", d.pascal());
    if d.chance(0.5) {
        rs_error_enum(d, &mut out, &err);
    }
    let fields = rs_struct(d, &mut out, &ty);
    rs_impl(d, &mut out, &ty, &err, &fields);
    if d.chance(0.6) {
        rs_tests(d, &mut out, &ty, &fields[0]);
    }
    out
}

/// The file comment, module doc and `use` lines of a Rust module.
fn rs_header(d: &mut Draw, out: &mut String) {
    if d.chance(0.4) {
        w!(out, "// {}", d.path("rs"));
    }
    if d.chance(0.5) {
        w!(out, "//! {}.", d.sentence());
        w!(out);
    }
    let mut std_uses = d.sample_n(
        &[
            "use std::collections::HashMap;",
            "use std::collections::{BTreeMap, HashSet};",
            "use std::sync::Arc;",
            "use std::sync::atomic::{AtomicU64, Ordering};",
            "use std::time::{Duration, Instant};",
            "use std::path::{Path, PathBuf};",
            "use std::fmt;",
            "use std::io::{self, Read, Write};",
        ],
        1,
        4,
    );
    std_uses.sort_unstable();
    for u in std_uses {
        w!(out, "{u}");
    }
    w!(out);
    for c in d.sample_n(&vocab::RUST_CRATES, 1, 3) {
        match c {
            "serde" => w!(out, "use serde::{{Deserialize, Serialize}};"),
            "tokio" => w!(out, "use tokio::sync::{{mpsc, RwLock}};"),
            "anyhow" => w!(out, "use anyhow::{{bail, Context, Result}};"),
            "tracing" => w!(out, "use tracing::{{debug, info, warn}};"),
            other => w!(out, "use {other}::{};", d.pascal()),
        }
    }
    w!(out);
}

/// A `thiserror` enum named `err` with two to four variants.
fn rs_error_enum(d: &mut Draw, out: &mut String, err: &str) {
    w!(out, "#[derive(Debug, thiserror::Error)]");
    w!(out, "pub enum {err} {{");
    for _ in 0..d.n(2, 4) {
        let v = d.pascal();
        match d.n(0, 2) {
            0 => {
                w!(
                    out,
                    "    #[error(\"{} not found: {{0}}\")]",
                    d.noun_phrase()
                );
                w!(out, "    {v}NotFound(String),");
            }
            1 => {
                w!(
                    out,
                    "    #[error(\"{} timed out after {{0:?}}\")]",
                    d.noun_phrase()
                );
                w!(out, "    {v}Timeout(Duration),");
            }
            _ => {
                w!(out, "    #[error(\"io error: {{0}}\")]");
                w!(out, "    Io(#[from] std::io::Error),");
            }
        }
    }
    w!(out, "}}");
    w!(out);
}

/// The struct `ty` with two to five distinct fields; returns the field names (never empty).
fn rs_struct(d: &mut Draw, out: &mut String, ty: &str) -> Vec<String> {
    w!(out, "/// {}.", d.sentence());
    w!(
        out,
        "#[derive(Debug, Clone{})]",
        d.s(&["", ", Default", ", PartialEq", ", Serialize, Deserialize"])
    );
    w!(out, "pub struct {ty} {{");
    let mut fields = Vec::new();
    for _ in 0..d.n(2, 5) {
        let f = d.noun_snake();
        if fields.contains(&f) {
            continue;
        }
        w!(
            out,
            "    {}{f}: {},",
            d.s(&["pub ", "", "pub(crate) "]),
            rs_type(d)
        );
        fields.push(f);
    }
    w!(out, "}}");
    w!(out);
    fields
}

/// `impl ty`: a constructor and one to three methods.
fn rs_impl(d: &mut Draw, out: &mut String, ty: &str, err: &str, fields: &[String]) {
    w!(out, "impl {ty} {{");
    w!(
        out,
        "    pub fn new({}: {}) -> Self {{",
        fields[0],
        rs_type(d)
    );
    w!(out, "        Self {{");
    w!(out, "            {},", fields[0]);
    w!(out, "            ..Default::default()");
    w!(out, "        }}");
    w!(out, "    }}");
    for _ in 0..d.n(1, 3) {
        rs_method(d, out, err, fields);
    }
    w!(out, "}}");
}

/// One method: a signature, two to five statements from [`RS_STMTS`] and an `Ok(..)`.
fn rs_method(d: &mut Draw, out: &mut String, err: &str, fields: &[String]) {
    w!(out);
    let name = d.fn_snake();
    let arg = d.noun_snake();
    let is_async = d.chance(0.3);
    w!(out, "    /// {}.", d.sentence());
    w!(
        out,
        "    pub {}fn {name}(&{}self, {arg}: {}) -> Result<{}, {}> {{",
        if is_async { "async " } else { "" },
        d.s(&["", "mut "]),
        d.s(&["&str", "u64", "&[u8]", "usize", "&Path"]),
        rs_type(d),
        if d.chance(0.5) {
            err.to_owned()
        } else {
            d.s(&["anyhow::Error", "std::io::Error"]).to_owned()
        }
    );
    let m = RsMethod { arg, is_async };
    for _ in 0..d.n(2, 5) {
        let f = d.pick(fields).clone();
        RS_STMTS[d.n(0, RS_STMTS.len() - 1)](d, out, &m, &f);
    }
    w!(
        out,
        "        Ok({})",
        d.s(&[
            "Default::default()",
            "result",
            "self.value.clone()",
            "total",
            "out"
        ])
    );
    w!(out, "    }}");
}

/// What a method statement may refer to.
struct RsMethod {
    arg: String,
    is_async: bool,
}

/// A statement about field `f` inside a method.
type RsStmt = fn(&mut Draw, &mut String, &RsMethod, &str);

/// Method statements, drawn uniformly (the order is part of the corpus).
const RS_STMTS: [RsStmt; 7] = [
    rs_early_return,
    rs_call,
    rs_for_loop,
    rs_match_get,
    |_, out, _, _| w!(out, "        let started = Instant::now();"),
    |d, out, _, _| w!(out, "        // {}", d.sentence()),
    rs_reassign,
];

fn rs_early_return(d: &mut Draw, out: &mut String, _: &RsMethod, f: &str) {
    w!(
        out,
        "        if self.{f}.{}() {{",
        d.s(&["is_empty", "is_none", "is_stale", "is_closed"])
    );
    w!(
        out,
        "            return {};",
        d.s(&[
            "Ok(Default::default())",
            "Ok(Vec::new())",
            "Ok(0)",
            "Err(Error::Empty)",
            "Ok(None)"
        ])
    );
    w!(out, "        }}");
}

fn rs_call(d: &mut Draw, out: &mut String, m: &RsMethod, _: &str) {
    w!(
        out,
        "        let {} = self.{}(&{}){}?;",
        d.noun_snake(),
        d.fn_snake(),
        m.arg,
        if m.is_async { ".await" } else { "" }
    );
}

fn rs_for_loop(d: &mut Draw, out: &mut String, _: &RsMethod, f: &str) {
    w!(
        out,
        "        for (i, {}) in self.{f}.iter().enumerate() {{",
        d.s(&vocab::NOUNS)
    );
    w!(
        out,
        "            debug!(i, \"{}\");",
        d.sentence().to_lowercase()
    );
    w!(out, "        }}");
}

fn rs_match_get(d: &mut Draw, out: &mut String, m: &RsMethod, f: &str) {
    w!(
        out,
        "        let {} = match self.{f}.get(&{}) {{",
        d.noun_snake(),
        m.arg
    );
    w!(out, "            Some(v) => v.clone(),");
    w!(
        out,
        "            None => return Err({}.into()),",
        d.s(&[
            "\"missing entry\"",
            "std::io::ErrorKind::NotFound",
            "anyhow::anyhow!(\"not found\")"
        ])
    );
    w!(out, "        }};");
}

fn rs_reassign(d: &mut Draw, out: &mut String, _: &RsMethod, f: &str) {
    w!(
        out,
        "        self.{f} = self.{f}.{}();",
        d.s(&["clone", "to_owned", "into", "saturating_sub(1).into"])
    );
}

/// A `#[cfg(test)]` module with one to three tests of `ty`.
fn rs_tests(d: &mut Draw, out: &mut String, ty: &str, field: &str) {
    w!(out);
    w!(out, "#[cfg(test)]");
    w!(out, "mod tests {{");
    w!(out, "    use super::*;");
    for _ in 0..d.n(1, 3) {
        w!(out);
        w!(out, "    #[{}]", d.s(&["test", "tokio::test", "test"]));
        w!(
            out,
            "    fn {}_{}() {{",
            d.fn_snake(),
            d.s(&[
                "works",
                "rejects_empty",
                "is_stable",
                "round_trips",
                "handles_overflow"
            ])
        );
        w!(
            out,
            "        let mut {field} = {ty}::new({});",
            d.s(&["Default::default()", "\"abc\".into()", "42", "vec![]"])
        );
        w!(
            out,
            "        assert_eq!({field}.{}(), {});",
            d.fn_snake(),
            d.int(0, 64)
        );
        if d.chance(0.5) {
            w!(
                out,
                "        assert!({field}.{}({}).is_{}());",
                d.fn_snake(),
                d.int(0, 9),
                d.s(&["err", "ok", "some", "none"])
            );
        }
        w!(out, "    }}");
    }
    w!(out, "}}");
}

// ---------------------------------------------------------------- TypeScript

fn ts_type(d: &mut Draw) -> String {
    match d.n(0, 8) {
        0 => "number".into(),
        1 => "string".into(),
        2 => "boolean".into(),
        3 => format!("{}[]", d.s(&["string", "number", "Item"])),
        4 => format!("Record<string, {}>", d.s(&["number", "string", "unknown"])),
        5 => format!("{} | null", d.s(&["string", "number", "Date"])),
        6 => "Date".into(),
        7 => format!("Promise<{}>", d.s(&["void", "string", "number"])),
        _ => d.pascal(),
    }
}

fn typescript(d: &mut Draw) -> String {
    let mut out = String::new();
    ts_header(d, &mut out);
    let ts = ts_interface(d, &mut out);
    if d.chance(0.4) {
        w!(
            out,
            "const {} = {};",
            d.noun_snake().to_uppercase(),
            d.int(1, 10_000)
        );
        w!(out);
    }
    for _ in 0..d.n(1, 2) {
        TS_ITEMS[d.n(0, TS_ITEMS.len() - 1)](d, &mut out, &ts);
        w!(out);
    }
    out
}

/// The exported interface of a TypeScript module, which its other items use.
struct Ts {
    iface: String,
    fields: Vec<String>,
}

/// Items after the interface, drawn uniformly (the order is part of the corpus).
const TS_ITEMS: [fn(&mut Draw, &mut String, &Ts); 3] = [ts_function, ts_class, ts_tests];

/// The path comment and imports of a TypeScript module.
fn ts_header(d: &mut Draw, out: &mut String) {
    if d.chance(0.4) {
        w!(out, "// {}", d.path("ts"));
    }
    for p in d.sample_n(&vocab::TS_PACKAGES, 1, 3) {
        w!(
            out,
            "import {{ {} }} from \"{p}\";",
            camel_of(&d.noun_snake())
        );
    }
    w!(
        out,
        "import type {{ {} }} from \"./{}\";",
        d.pascal(),
        d.s(&vocab::FILE_STEMS)
    );
    w!(out);
}

/// The exported interface with two to six fields.
fn ts_interface(d: &mut Draw, out: &mut String) -> Ts {
    let iface = d.pascal();
    w!(out, "export interface {iface} {{");
    let mut fields = Vec::new();
    for _ in 0..d.n(2, 6) {
        let f = d.camel();
        w!(
            out,
            "  {}{}: {};",
            if d.chance(0.15) { "readonly " } else { "" },
            f,
            ts_type(d)
        );
        fields.push(f);
    }
    w!(out, "}}");
    w!(out);
    Ts { iface, fields }
}

/// An exported function.
fn ts_function(d: &mut Draw, out: &mut String, ts: &Ts) {
    let Ts { iface, fields } = ts;
    let name = d.camel_fn();
    let is_async = d.chance(0.5);
    w!(out, "/** {}. */", d.sentence());
    w!(
        out,
        "export {}function {name}(input: {iface}, {}: {}): {} {{",
        if is_async { "async " } else { "" },
        d.camel(),
        ts_type(d),
        if is_async {
            format!("Promise<{}>", ts_type(d))
        } else {
            ts_type(d)
        }
    );
    for _ in 0..d.n(2, 5) {
        let f = d.pick(fields).clone();
        match d.n(0, 5) {
            0 => {
                w!(out, "  if (!input.{f}) {{");
                w!(
                    out,
                    "    throw new Error(`{} missing for ${{input.{}}}`);",
                    d.noun_phrase(),
                    d.pick(fields)
                );
                w!(out, "  }}");
            }
            1 => w!(
                out,
                "  const {} = await {}.{}(input.{f});",
                d.camel(),
                d.camel(),
                d.camel_fn()
            ),
            2 => w!(
                out,
                "  const {} = input.{f}.filter((x) => x.{} !== undefined).map((x) => x.{});",
                d.camel(),
                d.camel(),
                d.camel()
            ),
            3 => w!(
                out,
                "  logger.{}({{ {f}: input.{f} }}, \"{}\");",
                d.s(&["info", "debug", "warn"]),
                d.sentence().to_lowercase()
            ),
            4 => {
                w!(
                    out,
                    "  for (const {} of input.{f}) {{",
                    d.s(&vocab::NOUNS).replace('_', "")
                );
                w!(out, "    total += {};", d.int(1, 9));
                w!(out, "  }}");
            }
            _ => w!(out, "  // {}", d.sentence()),
        }
    }
    w!(
        out,
        "  return {};",
        d.s(&[
            "result",
            "null",
            "total",
            "input",
            "{ ...input, updatedAt: new Date() }"
        ])
    );
    w!(out, "}}");
}

/// An exported class keeping `iface` values in a map.
fn ts_class(d: &mut Draw, out: &mut String, ts: &Ts) {
    let Ts { iface, .. } = ts;
    let cls = d.pascal();
    w!(out, "export class {cls} {{");
    w!(
        out,
        "  private readonly {} = new Map<string, {iface}>();",
        d.camel()
    );
    w!(out);
    w!(
        out,
        "  constructor(private readonly {}: {}, private {}: number = {}) {{}}",
        d.camel(),
        d.pascal(),
        d.camel(),
        d.int(1, 500)
    );
    for _ in 0..d.n(1, 3) {
        w!(out);
        w!(
            out,
            "  {}{}({}: {}): {} {{",
            d.s(&["", "async ", "public ", "private "]),
            d.camel_fn(),
            d.camel(),
            ts_type(d),
            ts_type(d)
        );
        w!(
            out,
            "    const {} = this.{}.get({});",
            d.camel(),
            d.camel(),
            d.s(&["key", "id", "name"])
        );
        w!(
            out,
            "    {}",
            d.s(&[
                "if (!entry) return null;",
                "this.hits++;",
                "await this.flush();",
                "this.emit(\"change\", entry);"
            ])
        );
        w!(
            out,
            "    return {};",
            d.s(&["entry", "this.size", "true", "undefined"])
        );
        w!(out, "  }}");
    }
    w!(out, "}}");
}

/// A `describe` block of tests.
fn ts_tests(d: &mut Draw, out: &mut String, ts: &Ts) {
    let Ts { fields, .. } = ts;
    let subject = d.camel_fn();
    w!(out, "describe(\"{subject}\", () => {{");
    for _ in 0..d.n(2, 4) {
        w!(
            out,
            "  it(\"{} {}\", {}() => {{",
            d.s(&["returns", "rejects", "handles", "keeps", "drops"]),
            d.noun_phrase(),
            d.s(&["", "async "])
        );
        w!(
            out,
            "    const result = {subject}({{ {}: {} }});",
            d.pick(fields),
            d.int(0, 99)
        );
        w!(
            out,
            "    expect(result){}({});",
            d.s(&[".toEqual", ".toBe", ".not.toBeNull", ".toHaveLength"]),
            d.int(0, 9)
        );
        w!(out, "  }});");
    }
    w!(out, "}});");
}
