#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs (fuzz/seeds/<target>/) from the repo's real inputs:
the AIPerf cache-bust vectors (tests/fixtures/cachebust/cachebust.json), config/kvbust.toml,
the README's placeholder examples and SSE streams as the mock and vLLM send them. Each seed
starts with the selector bytes its target reads (see fuzz/src/lib.rs). Deterministic."""
import json, os, random, shutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHAPES = {"chat": 0, "responses": 1, "messages": 2, "completions": 3}
TARGETS = ["none", "system_prefix", "system_suffix", "first_turn_prefix", "first_turn_suffix",
           "warmup_isolation_system", "warmup_isolation_first_turn"]
rng = random.Random(14)


def out(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


for t in ["rewrite", "rewrite_json", "placeholders", "sse", "headers", "config"]:
    shutil.rmtree(os.path.join(HERE, t), ignore_errors=True)

# rewrite: shape, target, phase, trace byte, user-context count, list-parts mode; then the body.
vec = json.load(open(os.path.join(ROOT, "tests/fixtures/cachebust/cachebust.json")))
seen = set()
for case in vec["payload_vectors"]:
    key = (case["endpoint"], case["scenario"], case["target"], case["phase"])
    if key in seen:
        continue
    seen.add(key)
    req = case["requests"][-1]
    sel = bytes([SHAPES[case["endpoint"]], TARGETS.index(case["target"]),
                 case["phase"] == "warmup", len(seen) % 256,
                 int("user_context" in case["scenario"]), "inline" in case["scenario"]])
    style = len(seen) % 3
    body = json.dumps(req["before"], ensure_ascii=style == 0,
                      separators=(",", ":") if style == 1 else (", ", ": "),
                      indent=2 if style == 2 else None)
    out("rewrite", f"{case['endpoint']}-{case['scenario']}-{case['target']}-{case['phase']}", sel + body.encode())

# rewrite_json: selector bytes then generator decisions.
for i in range(24):
    sel = bytes([i % 4, rng.randrange(1, 7), rng.randrange(2), i, rng.randrange(3), rng.randrange(2)])
    out("rewrite_json", f"gen-{i:02}", sel + bytes(rng.randrange(256) for _ in range(rng.randrange(32, 200))))

# placeholders: mode (even: raw body), count limit, token limit; then the body.
bodies = [
    '{"model":"kvbust-mock","max_tokens":8,"messages":[{"role":"user","content":"Summarise: {{kvbust:prompt:1024:coding}}"}]}',
    '{"messages":[{"role":"user","content":"A {{kvbust:prompt:12}} B {{kvbust:prompt:3:random}}"}],"user":"{{kvbust:prompt:5}}"}',
    '{"messages":[{"role":"system","content":[{"type":"text","text":"{{kvbust:prompt:64:sonnet}}"}]},{"role":"user","content":"{{kvbust:prompt:8:coding-exact}}"}]}',
    '{"messages":[{"role":"user","content":"{{kvbust:prompt:5"}],"model":"m"}',
    '{"messages":[{"role":"user","content":"{{kvbust:prompt:0}} {{kvbust:prompt:x}} {{kvbust:prompt:5:poems}}"}]}',
    '{"messages":[{"{{kvbust:prompt:7}}":"user","content":"hi"}]}',
    '"{{kvbust:prompt:5}}"',
]
for i, b in enumerate(bodies):
    out("placeholders", f"raw-{i}", bytes([0, 0, 0]) + b.encode())
for i in range(12):
    out("placeholders", f"gen-{i:02}", bytes([1, rng.randrange(5), rng.randrange(4)]) +
        bytes(rng.randrange(256) for _ in range(rng.randrange(32, 160))))

# sse: 0 = SSE (0xff = JSON body), cut count, cut sizes; then the stream.
chunk = lambda d: "data: " + json.dumps(d, separators=(",", ":")) + "\n\n"
chat = ("".join([chunk({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})] +
                [chunk({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": t}}]}) for t in ["Hi", " there", "!"]] +
                [chunk({"id": "c", "choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 32}}}), "data: [DONE]\n\n"]))
reasoning = "".join(chunk({"choices": [{"delta": {"reasoning_content": t}}]}) for t in ["think", "ing"]) + chunk({"choices": [{"delta": {"content": "ok"}}], "usage": {"prompt_tokens": 9}}) + "data:[DONE]\r\n\r\n"
completions = "".join(chunk({"choices": [{"text": t, "index": 0}]}) for t in ["a", "b", ""]) + ": keep-alive\n\nevent: message\nid: 7\n" + chunk({"choices": [], "usage": {"prompt_tokens": 3, "prompt_tokens_details": None}}) + "data: [DONE]\n\n"
crlf = chat.replace("\n", "\r\n")
for i, s in enumerate([chat, reasoning, completions, crlf]):
    out("sse", f"stream-{i}", bytes([0, 3, 1, 7, 64]) + s.encode())
out("sse", "json-0", bytes([0xff, 2, 5, 11]) + json.dumps({"id": "x", "choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}}).encode())

# headers: lines of <name index><value>, an empty line, then a chat body.
chat_body = '{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"}],"user":"u-1"}'
cases = [
    [(0, "warmup"), (1, "warmup_isolation_system")],
    [(1, "first_turn_prefix"), (7, "session-42")],
    [(1, "system_suffix"), (7, "séssion-1")],
    [(1, "first_turn_suffix"), (8, "sess-9")],
    [(1, "system_prefix"), (3, "session_000000"), (4, "0123456789ab"), (5, "2"), (6, "3")],
    [(2, "1"), (1, "first_turn_prefix")],
    [(2, "x" * 300), (0, "profiling")],
    [(5, "7")],
    [(9, "gzip"), (1, "system_prefix")],
    [(0, "WARMUP"), (1, "none")],
]
for i, hs in enumerate(cases):
    head = b"\n".join(bytes([n]) + v.encode() for n, v in hs)
    out("headers", f"case-{i}", head + b"\n\n" + chat_body.encode())
out("headers", "raw-name", b"\xf0x-kvbust-target:system_prefix\n\xf0x-correlation-id: a b \n\n" + chat_body.encode())

# config: 0 = TOML (1 = YAML); the file, NUL, env lines.
toml = open(os.path.join(ROOT, "config/kvbust.toml"), "rb").read()
out("config", "shipped-toml", b"\0" + toml + b"\0")
out("config", "small-toml", b"\0" + b'[upstream]\nurl = "http://user:s3cretpassw0rd@127.0.0.1:8000/v1"\n[cache_bust]\ntarget = "system_prefix"\n\0LIMITS__MAX_BODY=64MiB\nLISTEN__IDLE_TIMEOUT=5s\n')
out("config", "small-yaml", b"\1" + b'upstream:\n  url: "http://127.0.0.1:8000"\ncache_bust:\n  target: first_turn_suffix\n  session_sources: [x_correlation_id, first_user_turn]\nsynth:\n  max_placeholders: 4\n\0CACHE_BUST__LEDGER_CAPACITY=10\n')
out("config", "env-only", b"\0\0UPSTREAM__URL=https://a:b@h:1\nCACHE_BUST__USER_CONTEXT_MESSAGES=2\nADMIN__TOKEN=t\nSERVICE_PORT=80\n")
