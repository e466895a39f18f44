//! The rest of a coding session for the coding corpus: git diffs and logs, config files (TOML,
//! Dockerfile, Kubernetes YAML), markdown docs and test-runner output. Owns these templates;
//! must never emit text that was not composed here from the vocabularies.

use super::draw::Draw;
use super::vocab;

/// One block of the "other" category.
pub fn block(d: &mut Draw) -> String {
    match d.weighted(&[22, 10, 10, 12, 14, 16, 16]) {
        0 => git_diff(d),
        1 => git_log(d),
        2 => toml(d),
        3 => dockerfile(d),
        4 => k8s(d),
        5 => markdown(d),
        _ => test_output(d),
    }
}

fn git_diff(d: &mut Draw) -> String {
    let mut out = String::new();
    let ext = d.s(&["py", "go", "rs", "ts"]);
    for _ in 0..d.n(1, 2) {
        let path = d.path(ext);
        w!(out, "diff --git a/{path} b/{path}");
        w!(out, "index {}..{} 100644", d.hex(7), d.hex(7));
        w!(out, "--- a/{path}");
        w!(out, "+++ b/{path}");
        for _ in 0..d.n(1, 3) {
            let start = d.int(1, 700);
            let ctx = d.n(2, 4);
            let del = d.n(0, 3);
            let add = d.n(1, 4);
            w!(
                out,
                "@@ -{start},{} +{start},{} @@ {}",
                ctx + del,
                ctx + add,
                match ext {
                    "py" => format!("def {}(", d.fn_snake()),
                    "go" => format!(
                        "func (s *{}) {}(",
                        d.pascal(),
                        super::draw::capitalize(&d.camel_fn())
                    ),
                    "rs" => format!("impl {} {{", d.pascal()),
                    _ => format!("export function {}(", d.camel_fn()),
                }
            );
            let (lead, comment) = match ext {
                "py" => ("        ", "#"),
                "go" => ("\t", "//"),
                _ => ("    ", "//"),
            };
            w!(
                out,
                " {lead}{} = {}({})",
                d.noun_snake(),
                d.fn_snake(),
                d.noun_snake()
            );
            for _ in 0..del {
                w!(out, "-{lead}{}", diff_line(d, ext));
            }
            for _ in 0..add {
                if d.chance(0.2) {
                    w!(out, "+{lead}{comment} {}", d.sentence());
                } else {
                    w!(out, "+{lead}{}", diff_line(d, ext));
                }
            }
            for _ in 1..ctx {
                w!(out, " {lead}{}", diff_line(d, ext));
            }
        }
    }
    out
}

fn diff_line(d: &mut Draw, ext: &str) -> String {
    match (ext, d.n(0, 3)) {
        ("py", 0) => {
            let v = d.noun_snake();
            format!(
                "{v} = {v} or {}",
                d.s(&["{}", "[]", "DEFAULT_TIMEOUT", "self.default"])
            )
        }
        ("py", 3) => format!("logger.debug(\"{} %s\", {})", d.fn_snake(), d.noun_snake()),
        ("py", 1) => format!(
            "{} = self.{}.get({}, {})",
            d.noun_snake(),
            d.noun_snake(),
            d.noun_snake(),
            d.int(0, 9)
        ),
        ("py", 2) => format!(
            "return {}({}, timeout={})",
            d.fn_snake(),
            d.noun_snake(),
            d.int(1, 60)
        ),
        ("go", 0) => format!("defer {}.Close()", d.camel()),
        ("go", 3) => format!("{}.{}++", d.camel(), d.camel()),
        ("go", 1) => format!(
            "return nil, fmt.Errorf(\"{}: %w\", err)",
            d.fn_snake().replace('_', " ")
        ),
        ("go", 2) => format!(
            "{} := {}.{}(ctx)",
            d.camel(),
            d.camel(),
            super::draw::capitalize(&d.camel_fn())
        ),
        ("rs", 0) => format!(
            "let {} = self.{}(&{})?;",
            d.noun_snake(),
            d.fn_snake(),
            d.noun_snake()
        ),
        ("rs", 1) => format!(".map_err(|e| {}Error::from(e))?;", d.pascal()),
        ("rs", 2) => format!("let {} = {}.len();", d.noun_snake(), d.noun_snake()),
        ("rs", 3) => format!("debug!(\"{}\");", d.sentence().to_lowercase()),
        (_, 0) => format!(
            "const {} = await {}({});",
            d.camel(),
            d.camel_fn(),
            d.camel()
        ),
        (_, 1) => format!("if (!{}) return;", d.camel()),
        (_, 2) => format!("{}.{} = {};", d.camel(), d.camel(), d.int(0, 999)),
        _ => format!("{}({});", d.camel_fn(), d.camel()),
    }
}

fn git_log(d: &mut Draw) -> String {
    let mut out = String::new();
    w!(out, "$ git log --oneline --graph -n {}", d.n(5, 12));
    for _ in 0..d.n(5, 12) {
        let subject = match d.n(0, 4) {
            0 => format!(
                "{}: {}",
                d.s(&["fix", "feat", "chore", "refactor", "perf", "test", "docs"]),
                d.sentence().to_lowercase()
            ),
            1 => format!(
                "Merge pull request #{} from {}/{}",
                d.int(10, 9000),
                d.user(),
                d.s(&["fix-cache", "streaming", "bump-deps", "retry-logic"])
            ),
            2 => format!(
                "{} {} in {}",
                d.s(&["Fix", "Add", "Remove", "Handle", "Speed up"]),
                d.noun_phrase(),
                d.s(&vocab::SUB_DIRS)
            ),
            3 => format!(
                "Bump {} from {} to {}",
                d.s(&vocab::PY_PACKAGES),
                d.version(),
                d.version()
            ),
            _ => format!("wip: {}", d.noun_phrase()),
        };
        w!(out, "* {} {subject}", d.hex(7));
    }
    out
}

fn toml(d: &mut Draw) -> String {
    let mut out = String::new();
    let name = d.project();
    if d.chance(0.5) {
        w!(out, "[package]");
        w!(out, "name = \"{name}\"");
        w!(out, "version = \"{}\"", d.version());
        w!(out, "edition = \"{}\"", d.s(&["2021", "2024"]));
        w!(out, "rust-version = \"1.{}\"", d.int(70, 88));
        w!(out);
        w!(out, "[dependencies]");
        for c in d.sample_n(&vocab::RUST_CRATES, 4, 9) {
            if d.chance(0.4) {
                w!(
                    out,
                    "{c} = {{ version = \"{}\", features = [\"{}\"] }}",
                    d.int(0, 4),
                    d.s(&["full", "derive", "macros", "rt-multi-thread", "json"])
                );
            } else {
                w!(out, "{c} = \"{}.{}\"", d.int(0, 4), d.int(0, 40));
            }
        }
        w!(out);
        w!(out, "[profile.release]");
        w!(out, "lto = \"{}\"", d.s(&["thin", "fat"]));
        w!(out, "codegen-units = {}", d.int(1, 16));
    } else {
        w!(out, "[project]");
        w!(out, "name = \"{name}\"");
        w!(out, "version = \"{}\"", d.version());
        w!(out, "requires-python = \">=3.{}\"", d.int(9, 12));
        w!(out, "dependencies = [");
        for p in d.sample_n(&vocab::PY_PACKAGES, 3, 8) {
            w!(out, "    \"{p}>={}\",", d.version());
        }
        w!(out, "]");
        w!(out);
        w!(out, "[tool.ruff]");
        w!(out, "line-length = {}", d.s(&["88", "100", "120"]));
        w!(out, "target-version = \"py3{}\"", d.int(10, 12));
        w!(out);
        w!(out, "[tool.pytest.ini_options]");
        w!(out, "testpaths = [\"tests\"]");
        w!(
            out,
            "addopts = \"{}\"",
            d.s(&["-q", "-ra --strict-markers", "-x -q --disable-warnings"])
        );
    }
    out
}

fn dockerfile(d: &mut Draw) -> String {
    let mut out = String::new();
    match d.n(0, 1) {
        0 => {
            w!(
                out,
                "FROM nvidia/cuda:12.{}.{}-{}-ubuntu22.04",
                d.int(1, 8),
                d.int(0, 2),
                d.s(&["runtime", "devel", "cudnn-runtime"])
            );
            w!(
                out,
                "ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 HF_HOME=/models"
            );
            w!(out, "RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip git curl \\");
            w!(out, "    && rm -rf /var/lib/apt/lists/*");
            w!(out, "WORKDIR /app");
            w!(out, "COPY requirements.txt .");
            w!(out, "RUN pip install --no-cache-dir -r requirements.txt");
            w!(out, "COPY . .");
            w!(out, "EXPOSE {}", d.s(&["8000", "8080", "9000"]));
            w!(
                out,
                "HEALTHCHECK --interval={}s CMD curl -fsS http://localhost:8000/healthz || exit 1",
                d.int(10, 60)
            );
            w!(
                out,
                "CMD [\"python3\", \"-m\", \"{}.{}\", \"--port\", \"8000\"]",
                d.project().replace('-', "_"),
                d.s(&["server", "serve", "main"])
            );
        }
        _ => {
            let lang = d.s(&["rust:1.8", "golang:1.2"]);
            let bin = d.project();
            w!(out, "FROM {lang}{} AS builder", d.int(0, 9));
            w!(out, "WORKDIR /src");
            w!(out, "COPY . .");
            if lang.starts_with("rust") {
                w!(out, "RUN --mount=type=cache,target=/usr/local/cargo/registry cargo build --release --locked");
            } else {
                w!(out, "RUN --mount=type=cache,target=/root/.cache/go-build CGO_ENABLED=0 go build -trimpath -o /out/server ./cmd/server");
            }
            w!(out);
            w!(
                out,
                "FROM gcr.io/distroless/{}",
                d.s(&["cc-debian12", "static-debian12"])
            );
            w!(
                out,
                "COPY --from=builder {} /usr/local/bin/{}",
                if lang.starts_with("rust") {
                    "/src/target/release/server"
                } else {
                    "/out/server"
                },
                bin
            );
            w!(out, "USER nonroot:nonroot");
            w!(out, "ENTRYPOINT [\"/usr/local/bin/{bin}\"]");
        }
    }
    out
}

fn k8s(d: &mut Draw) -> String {
    let mut out = String::new();
    let name = d.project();
    let port = d.s(&["8000", "8080", "9000", "3000"]);
    w!(out, "apiVersion: apps/v1");
    w!(out, "kind: Deployment");
    w!(out, "metadata:");
    w!(out, "  name: {name}");
    w!(
        out,
        "  namespace: {}",
        d.s(&["default", "inference", "ml-platform", "staging"])
    );
    w!(out, "  labels:");
    w!(out, "    app: {name}");
    w!(out, "spec:");
    w!(out, "  replicas: {}", d.int(1, 12));
    w!(out, "  selector:");
    w!(out, "    matchLabels:");
    w!(out, "      app: {name}");
    w!(out, "  template:");
    w!(out, "    metadata:");
    w!(out, "      labels:");
    w!(out, "        app: {name}");
    w!(out, "    spec:");
    w!(out, "      containers:");
    w!(
        out,
        "        - name: {}",
        d.s(&["server", "app", "vllm", "worker"])
    );
    w!(
        out,
        "          image: registry.local/{name}:{}",
        d.version()
    );
    w!(
        out,
        "          args: [\"--port\", \"{port}\", \"--max-batch\", \"{}\"]",
        d.int(1, 256)
    );
    w!(out, "          ports:");
    w!(out, "            - containerPort: {port}");
    w!(out, "          env:");
    for _ in 0..d.n(1, 4) {
        w!(out, "            - name: {}", d.noun_snake().to_uppercase());
        w!(out, "              value: \"{}\"", d.int(0, 1000));
    }
    w!(out, "          resources:");
    w!(out, "            requests:");
    w!(out, "              cpu: \"{}\"", d.int(1, 16));
    w!(out, "              memory: {}Gi", d.int(1, 128));
    w!(out, "            limits:");
    if d.chance(0.5) {
        w!(out, "              nvidia.com/gpu: {}", d.int(1, 8));
    }
    w!(out, "              memory: {}Gi", d.int(2, 256));
    w!(out, "          readinessProbe:");
    w!(out, "            httpGet:");
    w!(out, "              path: /readyz");
    w!(out, "              port: {port}");
    w!(out, "            periodSeconds: {}", d.int(2, 30));
    if d.chance(0.5) {
        w!(out, "---");
        w!(out, "apiVersion: v1");
        w!(out, "kind: Service");
        w!(out, "metadata:");
        w!(out, "  name: {name}");
        w!(out, "spec:");
        w!(out, "  selector:");
        w!(out, "    app: {name}");
        w!(out, "  ports:");
        w!(out, "    - port: 80");
        w!(out, "      targetPort: {port}");
    }
    out
}

fn markdown(d: &mut Draw) -> String {
    let mut out = String::new();
    let name = d.project();
    w!(
        out,
        "## {}",
        d.s(&[
            "Getting started",
            "Configuration",
            "Architecture",
            "Troubleshooting",
            "Development",
            "Deployment",
            "API"
        ])
    );
    w!(out);
    w!(
        out,
        "`{name}` {} The {} is {} by default; set `{}` to change it.",
        d.sentence().to_lowercase(),
        d.noun_phrase(),
        d.s(&[
            "enabled",
            "disabled",
            "read from the environment",
            "cached for 60 seconds"
        ]),
        d.noun_snake().to_uppercase()
    );
    w!(out);
    w!(out, "```bash");
    w!(
        out,
        "{}",
        d.s(&[
            "pip install -e '.[dev]'",
            "cargo install --path .",
            "go install ./cmd/...",
            "npm install && npm run dev"
        ])
    );
    w!(
        out,
        "{name} {} --{} {}",
        d.s(&["serve", "run", "start", "train"]),
        d.noun_snake().replace('_', "-"),
        d.int(1, 1000)
    );
    w!(out, "```");
    w!(out);
    if d.chance(0.6) {
        w!(out, "| Option | Default | Description |");
        w!(out, "| --- | --- | --- |");
        for _ in 0..d.n(2, 6) {
            w!(
                out,
                "| `{}` | `{}` | {}. |",
                d.noun_snake(),
                d.int(0, 4096),
                d.sentence()
            );
        }
        w!(out);
    }
    w!(
        out,
        "### {}",
        d.s(&["Notes", "Known issues", "Limits", "How it works"])
    );
    w!(out);
    for _ in 0..d.n(2, 5) {
        w!(out, "- {}.", d.sentence());
    }
    out
}

fn test_output(d: &mut Draw) -> String {
    let mut out = String::new();
    TEST_RUNNERS[d.n(0, TEST_RUNNERS.len() - 1)](d, &mut out);
    out
}

/// Test-runner outputs, drawn uniformly (the order is part of the corpus).
const TEST_RUNNERS: [fn(&mut Draw, &mut String); 4] = [
    pytest_output,
    cargo_test_output,
    go_test_output,
    jest_output,
];

/// A `pytest` session.
fn pytest_output(d: &mut Draw, out: &mut String) {
    w!(
        out,
        "============================= test session starts =============================="
    );
    w!(
        out,
        "platform linux -- Python 3.{}.{}, pytest-{}, pluggy-1.{}.0",
        d.int(10, 12),
        d.int(0, 9),
        d.version(),
        d.int(3, 6)
    );
    w!(out, "rootdir: /home/{}/{}", d.user(), d.project());
    let n = d.n(3, 7);
    w!(out, "collected {} items", n * d.n(2, 9));
    w!(out);
    let mut failed = Vec::new();
    for _ in 0..n {
        let f = format!("tests/test_{}.py", d.noun_snake());
        let mut marks = String::new();
        for _ in 0..d.n(2, 12) {
            let c = if d.chance(0.08) {
                'F'
            } else if d.chance(0.05) {
                's'
            } else {
                '.'
            };
            if c == 'F' {
                failed.push(format!("{f}::test_{}", d.fn_snake()));
            }
            marks.push(c);
        }
        w!(out, "{f} {marks} [{:>3}%]", d.int(1, 100));
    }
    w!(out);
    if !failed.is_empty() {
        w!(
            out,
            "=========================== short test summary info ============================"
        );
        for f in &failed {
            w!(
                out,
                "FAILED {f} - {}: {}",
                d.s(&vocab::PY_EXCEPTIONS),
                d.s(&vocab::ERROR_PHRASES)
            );
        }
    }
    w!(
        out,
        "========================= {}{} passed in {:.2}s =========================",
        if failed.is_empty() {
            String::new()
        } else {
            format!("{} failed, ", failed.len())
        },
        d.int(5, 400),
        d.float(0.3, 300.0)
    );
}

/// `cargo test` output.
fn cargo_test_output(d: &mut Draw, out: &mut String) {
    w!(
        out,
        "     Running unittests src/lib.rs (target/debug/deps/{}-{})",
        d.project().replace('-', "_"),
        d.hex(16)
    );
    let n = d.n(3, 10);
    w!(out);
    w!(out, "running {n} tests");
    let mut fails = 0;
    for _ in 0..n {
        let ok = d.chance(0.9);
        if !ok {
            fails += 1;
        }
        w!(
            out,
            "test {}::tests::{} ... {}",
            d.s(&vocab::SUB_DIRS),
            d.fn_snake(),
            if ok { "ok" } else { "FAILED" }
        );
    }
    w!(out);
    w!(out, "test result: {}. {} passed; {fails} failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s", if fails == 0 { "ok" } else { "FAILED" }, n - fails, d.float(0.0, 30.0));
}

/// `go test ./...` package lines.
fn go_test_output(d: &mut Draw, out: &mut String) {
    let module = format!("github.com/{}/{}", d.user(), d.project());
    for _ in 0..d.n(3, 7) {
        let pkg = d.s(&vocab::SUB_DIRS);
        match d.n(0, 5) {
            0 => {
                w!(
                    out,
                    "--- FAIL: Test{} ({:.2}s)",
                    super::draw::capitalize(&d.camel_fn()),
                    d.float(0.0, 5.0)
                );
                w!(
                    out,
                    "    {}_test.go:{}: got {}, want {}",
                    d.s(&vocab::FILE_STEMS),
                    d.int(10, 300),
                    d.int(0, 99),
                    d.int(0, 99)
                );
                w!(
                    out,
                    "FAIL\t{module}/internal/{pkg}\t{:.3}s",
                    d.float(0.0, 9.0)
                );
            }
            1 => w!(out, "?   \t{module}/internal/{pkg}\t[no test files]"),
            _ => w!(
                out,
                "ok  \t{module}/internal/{pkg}\t{:.3}s{}",
                d.float(0.0, 9.0),
                d.s(&["", "", "\tcoverage: 71.4% of statements"])
            ),
        }
    }
}

/// Jest-style per-file results.
fn jest_output(d: &mut Draw, out: &mut String) {
    for _ in 0..d.n(2, 4) {
        let ok = d.chance(0.8);
        w!(
            out,
            " {} {} ({} tests{}) {}ms",
            if ok { "\u{2713}" } else { "\u{276f}" },
            d.path("test.ts"),
            d.int(1, 30),
            if ok {
                String::new()
            } else {
                " | 1 failed".to_string()
            },
            d.int(3, 3000)
        );
        if !ok {
            w!(
                out,
                "   \u{00d7} {} > {} {}",
                d.camel_fn(),
                d.s(&["returns", "handles", "rejects"]),
                d.noun_phrase()
            );
            w!(
                out,
                "     \u{2192} expected {} to deeply equal {}",
                d.int(0, 99),
                d.int(0, 99)
            );
        }
    }
    w!(out);
    w!(
        out,
        " Test Files  {} passed ({})",
        d.int(1, 40),
        d.int(1, 40)
    );
    w!(
        out,
        "      Tests  {} passed ({})",
        d.int(10, 400),
        d.int(10, 400)
    );
    w!(out, "   Duration  {:.2}s", d.float(0.5, 60.0));
}
