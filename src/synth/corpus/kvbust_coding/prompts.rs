//! User turns of an agentic coding session for the coding corpus: task requests with context
//! and constraints, and short multi-turn exchanges. Owns these templates; must never emit text
//! that was not composed here from the vocabularies.

use super::draw::Draw;
use super::vocab;

/// One user-prompt block.
pub fn block(d: &mut Draw) -> String {
    if d.chance(0.45) {
        conversation(d)
    } else {
        request(d)
    }
}

fn lang_ext(d: &mut Draw) -> &'static str {
    d.s(&["py", "go", "rs", "ts"])
}

fn ask(d: &mut Draw) -> String {
    let ext = lang_ext(d);
    let path = d.path(ext);
    let f = d.fn_snake();
    let ty = d.pascal();
    match d.n(0, 15) {
        0 => format!("Fix the failing test in {path}: `test_{f}` started failing after the last merge with `{}: {}`.", d.s(&vocab::PY_EXCEPTIONS), d.s(&vocab::ERROR_PHRASES)),
        1 => format!("Refactor `{f}` in {path} so it no longer holds the lock while calling the {} client.", d.s(&vocab::NOUNS)),
        2 => format!("Add {} to the `{ty}` in {path}. Keep the public API unchanged.", d.s(&vocab::TOPICS)),
        3 => format!("Write unit tests for `{f}` covering the empty input, a single {} and more than {} items.", d.noun_phrase(), d.int(2, 1000)),
        4 => format!("Why is `{f}` slow? Profiling shows {}% of the time in `{}`. Suggest a fix and implement it.", d.int(30, 95), d.fn_snake()),
        5 => format!("Rename `{}` to `{}` everywhere in {}/ and update the docs.", d.noun_snake(), d.noun_snake(), d.s(&vocab::TOP_DIRS)),
        6 => format!("The CI job `{}` is red on main. Find out which commit broke it and open a fix.", d.s(&["test", "lint", "build", "integration", "e2e"])),
        7 => format!("Port `{f}` from Python to {} and keep the same behaviour for {}.", d.s(&["Rust", "Go", "TypeScript"]), d.noun_phrase()),
        8 => format!("Add a `--{}` flag to the CLI that {}.", d.noun_snake().replace('_', "-"), d.sentence().to_lowercase()),
        9 => format!("Our training run diverges after step {}: loss goes to NaN. Look at {} and the config and tell me what to change.", d.int(100, 50_000), d.path("py")),
        10 => format!("Review this diff for {} and point out anything that could break in production.", d.s(&vocab::TOPICS)),
        11 => format!("Implement the TODO in {path} (`{f}`): it should {}.", d.sentence().to_lowercase()),
        12 => format!("Make `{ty}` serialisable to JSON and add a round-trip test."),
        13 => format!("The `{}` endpoint returns {} under load. Add {} and a test that reproduces it.", d.s(&vocab::HTTP_PATHS), d.s(&["503s", "timeouts", "stale data", "duplicate rows"]), d.s(&vocab::TOPICS)),
        14 => format!("Explain what {path} does and draw the call graph from `main` to `{f}`."),
        _ => format!("Bump {} to {} and fix whatever breaks.", d.s(&vocab::PY_PACKAGES), d.version()),
    }
}

fn constraint(d: &mut Draw) -> String {
    match d.n(0, 7) {
        0 => "Don't change the public API.".into(),
        1 => format!(
            "Run `{}` before you finish.",
            d.s(&[
                "pytest -x",
                "cargo test",
                "go test ./...",
                "npm test",
                "make check"
            ])
        ),
        2 => "Keep the diff small; no drive-by reformatting.".into(),
        3 => format!(
            "We target Python 3.{} and can't add new dependencies.",
            d.int(9, 12)
        ),
        4 => "Explain the root cause before showing code.".into(),
        5 => format!("It has to stay under {} ms p99.", d.int(5, 500)),
        6 => "Add a regression test that fails without the fix.".into(),
        _ => format!(
            "Ask me before touching anything under {}/.",
            d.s(&vocab::SUB_DIRS)
        ),
    }
}

fn context(d: &mut Draw, out: &mut String) {
    CONTEXTS[d.n(0, CONTEXTS.len() - 1)](d, out);
}

/// What the user shows with a request, drawn uniformly (the order is part of the corpus).
const CONTEXTS: [fn(&mut Draw, &mut String); 6] = [
    context_error,
    context_code,
    context_tests,
    context_logs,
    |d, out| {
        w!(
            out,
            "It only happens when {} is {} and the {} is {}.",
            d.noun_phrase(),
            d.s(&vocab::STATES),
            d.noun_phrase(),
            d.s(&vocab::STATES)
        )
    },
    |d, out| {
        w!(
            out,
            "I already tried {} but {} still {}.",
            d.s(&[
                "restarting the worker",
                "clearing the cache",
                "pinning the version",
                "raising the timeout",
                "running it locally"
            ]),
            d.noun_phrase(),
            d.s(&["fails", "times out", "returns stale data", "leaks memory"])
        )
    },
];

fn context_error(d: &mut Draw, out: &mut String) {
    w!(out, "Here is the error:");
    w!(out, "```");
    w!(
        out,
        "{}: {}",
        d.s(&vocab::PY_EXCEPTIONS),
        d.s(&vocab::ERROR_PHRASES)
    );
    for _ in 0..d.n(1, 4) {
        w!(
            out,
            "  at {} ({}:{})",
            d.fn_snake(),
            d.code_path(),
            d.int(1, 900)
        );
    }
    w!(out, "```");
}

fn context_code(d: &mut Draw, out: &mut String) {
    w!(out, "Relevant code:");
    w!(out, "```python");
    w!(
        out,
        "def {}({}, {}={}):",
        d.fn_snake(),
        d.noun_snake(),
        d.noun_snake(),
        d.int(0, 99)
    );
    for _ in 0..d.n(1, 4) {
        w!(
            out,
            "    {} = {}.{}({})",
            d.noun_snake(),
            d.noun_snake(),
            d.fn_snake(),
            d.noun_snake()
        );
    }
    w!(out, "    return {}", d.noun_snake());
    w!(out, "```");
}

fn context_tests(d: &mut Draw, out: &mut String) {
    w!(out, "The test output:");
    w!(out, "```");
    for _ in 0..d.n(2, 5) {
        let ok = d.chance(0.6);
        w!(
            out,
            "{} {}::test_{}",
            if ok { "PASSED" } else { "FAILED" },
            d.path("py"),
            d.fn_snake()
        );
    }
    w!(out, "```");
}

fn context_logs(d: &mut Draw, out: &mut String) {
    w!(out, "From the logs:");
    w!(out, "```");
    for _ in 0..d.n(2, 5) {
        let (h, m, s) = d.clock();
        w!(
            out,
            "{h:02}:{m:02}:{s:02} {} {}: {}",
            d.s(&["WARN", "ERROR", "INFO"]),
            d.s(&vocab::SUB_DIRS),
            d.s(&vocab::ERROR_PHRASES)
        );
    }
    w!(out, "```");
}

fn request(d: &mut Draw) -> String {
    let mut out = String::new();
    w!(out, "{}", ask(d));
    context(d, &mut out);
    if d.chance(0.35) {
        w!(out, "Also: {}", ask(d));
    }
    for _ in 0..d.n(1, 2) {
        w!(out, "{}", constraint(d));
    }
    out
}

fn conversation(d: &mut Draw) -> String {
    let mut out = String::new();
    let user = d.s(&["User", "user", "Human", "Me"]);
    let bot = d.s(&["Assistant", "assistant", "AI", "Agent"]);
    w!(out, "{user}: {}", ask(d));
    for _ in 0..d.n(2, 3) {
        let path = d.code_path();
        w!(out, "{bot}: {}", match d.n(0, 4) {
            0 => format!("I looked at {path}. The {} is {} because `{}` {}. I changed it to {} and the tests pass.", d.noun_phrase(), d.s(&vocab::STATES), d.fn_snake(), d.s(&["never resets the counter", "swallows the error", "reads the config once at import time", "compares ids as strings"]), d.s(&["reset it per request", "return the error", "read it lazily", "parse them as integers"])),
            1 => format!("Running `{}`: {} passed, {} failed. The failure is in `test_{}`: {}.", d.s(&["pytest -x", "cargo test", "go test ./...", "npm test"]), d.int(1, 300), d.int(1, 4), d.fn_snake(), d.s(&vocab::ERROR_PHRASES)),
            2 => format!("Done. I added {} in {path} and a test in {}. Want me to also update the docs?", d.s(&vocab::TOPICS), d.code_path()),
            3 => format!("Before I change `{}`: should {} keep the old behaviour when the {} is {}?", d.fn_snake(), d.noun_phrase(), d.noun_phrase(), d.s(&vocab::STATES)),
            _ => format!("I found {} call sites of `{}`. {} of them pass a {} that can be empty.", d.int(2, 40), d.fn_snake(), d.int(1, 5), d.noun_phrase()),
        });
        w!(
            out,
            "{user}: {}",
            match d.n(0, 5) {
                0 => format!("Yes, but keep {} as it is.", d.noun_phrase()),
                1 => format!("That broke `{}` in CI, can you look again?", d.fn_snake()),
                2 => constraint(d),
                3 => ask(d),
                4 => format!(
                    "Why not just {} instead?",
                    d.s(&[
                        "catch the exception",
                        "add a retry",
                        "increase the timeout",
                        "use a set",
                        "cache the result"
                    ])
                ),
                _ => format!("Looks good. Now do the same for `{}`.", d.fn_snake()),
            }
        );
    }
    out
}
