#!/usr/bin/env python3
"""Writes a chat request body of exactly SIZE bytes for the large-body benchmarks.

    python3 benches/chat_body.py SIZE OUT [--seq] [--agentic]

A system message (instructions, about 1.5 KB) and one long user turn shaped like an agent's
context: prose, source code, a file listing and tool output, JSON-escaped as a client sends them
(newlines, quotes, backslashes). The text is drawn from fixed word lists with a generator seeded
by SIZE, so a size always gives the same bytes. Real text, not one repeated character: a
tokenizer and a scanner then do the work they do on a real agentic context (about 4 bytes a
token). With --seq the user turn starts with `@SEQ@`, which benches/nginx/chat_fresh.lua
replaces with a number per request (the body stays within a few bytes of SIZE). With --agentic
the first user turn is the task alone (one sentence) and the long context is an assistant turn
after it: the shape of an agent's later turns, where the first user turn comes early.
"""
import json
import random
import sys

WORDS = """the request body is forwarded upstream after the proxy reads the first user turn and
writes a marker so every session gets its own cache path through the engine while the rest of
the context streams as it arrives from the client without being held in memory longer than a
single chunk needs and tests check that the bytes sent equal the bytes expected for each target
configuration including the suffix targets which place the marker at the end of a string value
inside the first system message or user message of a conversation with many tool calls results
files diffs errors warnings build logs traces latency throughput memory budget queue worker
thread connection pool timeout retry backoff deadline cancel shutdown signal handler""".split()
IDENTS = "body buf chunk len pos rest head tail marker target route session phase cfg ctx req resp upstream".split()
FILES = "src/proxy/forward.rs src/body.rs src/cachebust/inject.rs src/cache_model/worker.rs tests/proxy/large.rs benches/proxy.sh README.md config/kvbust.toml".split()

SYSTEM = (
    "You are a coding agent working in a Rust repository. Follow the user's instructions exactly. "
    "Before changing a file, read it. Prefer small, reviewed steps; run the tests that cover the "
    "code you touch and report their output verbatim. Never invent file contents or command "
    "output. When a command fails, quote the error, explain the cause in one sentence and propose "
    "the smallest fix. Keep answers short: a numbered list of what you did, then what is left. "
    "Tools available: read_file(path), write_file(path, text), run(cmd), search(query). "
    "Style: comments say why, not what; functions stay under eighty lines; errors are values, "
    "not panics; no unwrap outside tests. The repository builds with `cargo build --release` "
    "and is tested with `cargo test --locked`. Answer in English. "
) * 3


def sentence(r):
    n = r.randint(8, 22)
    words = [r.choice(WORDS) for _ in range(n)]
    if r.random() < 0.2:
        i = r.randrange(n)
        words[i] = '"' + words[i] + '"'
    return " ".join(words).capitalize() + "."


def prose(r):
    return " ".join(sentence(r) for _ in range(r.randint(3, 7)))


def code(r):
    name = r.choice(IDENTS)
    lines = [f"fn {name}_{r.randint(0, 999)}({r.choice(IDENTS)}: &[u8], {r.choice(IDENTS)}: usize) -> Result<usize, Error> {{"]
    for _ in range(r.randint(3, 10)):
        a, b = r.choice(IDENTS), r.choice(IDENTS)
        lines.append(f"    let {a} = {b}.get({r.randint(0, 64)}..).ok_or(Error::Short(\"{a}\"))?;")
    lines.append(f"    Ok({r.choice(IDENTS)}.len())")
    lines.append("}")
    return "```rust\n" + "\n".join(lines) + "\n```"


def listing(r):
    rows = [f"{r.randint(100, 99999):>6} {r.choice(FILES)}" for _ in range(r.randint(3, 8))]
    return "$ wc -c " + " ".join(sorted({x.split()[1] for x in rows})) + "\n" + "\n".join(rows)


def tool_output(r):
    rows = []
    for _ in range(r.randint(2, 6)):
        f = r.choice(FILES)
        rows.append(f"warning: unused variable `{r.choice(IDENTS)}` --> {f}:{r.randint(1, 900)}:{r.randint(1, 80)}")
        rows.append(f"test {r.choice(IDENTS)}::{r.choice(IDENTS)}_{r.randint(0, 99)} ... {'ok' if r.random() < 0.9 else 'FAILED'}")
    return "Tool result (run):\n" + "\n".join(rows) + "\nC:\\\\ci\\\\log path noted"


def user_text(r, want):
    parts, total = [], 0
    makers = [prose, prose, prose, code, listing, tool_output]
    while total < want:
        p = r.choice(makers)(r)
        parts.append(p)
        total += len(p) + 2
    return "\n\n".join(parts)


TASK = "Fix the failing test in tests/proxy/large.rs and report the test output."


def body(size, seq, agentic=False):
    r = random.Random(size)
    head = "@SEQ@ " if seq else ""
    text = head + "Here is the context of the task so far. " + user_text(r, size)

    def encode(t):
        turns = [{"role": "user", "content": t}]
        if agentic:
            turns = [{"role": "user", "content": TASK}, {"role": "assistant", "content": t}]
        return json.dumps({"model": "bench", "messages": [
            {"role": "system", "content": SYSTEM}] + turns, "max_tokens": 64, "stream": False})

    # Cut the text until the encoded body fits (an escape costs two bytes), then pad with words.
    out = encode(text)
    while len(out) > size:
        if not text:
            sys.exit(f"{size} bytes is smaller than the system message")
        text = text[: len(text) - (len(out) - size)]
        out = encode(text)
    pad = size - len(out)
    text += (" " + "x" * (pad - 1)) if pad > 1 else (" " * pad)
    out = encode(text)
    assert len(out) == size, (len(out), size)
    return out


if __name__ == "__main__":
    size, path = int(sys.argv[1]), sys.argv[2]
    with open(path, "w") as f:
        f.write(body(size, "--seq" in sys.argv[3:], "--agentic" in sys.argv[3:]))
