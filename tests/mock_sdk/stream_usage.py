#!/usr/bin/env python3
"""observe.request_usage (on by default) through the openai SDK's own stream parser: a chat or
completions stream that does not ask for usage, sent through kvbust, yields the same chunks as the
upstream's direct stream without usage, with no extra chunk, while kvbust counts its usage.

    python3 -m venv /tmp/sdk && /tmp/sdk/bin/pip install openai
    kvbust mock --listen 127.0.0.1:18999 &
    kvbust serve --upstream http://127.0.0.1:18999 --listen 127.0.0.1:18080 --admin-listen 127.0.0.1:19090 &
    /tmp/sdk/bin/python tests/mock_sdk/stream_usage.py http://127.0.0.1:18999 http://127.0.0.1:18080 http://127.0.0.1:19090

Exits non-zero on the first difference. Not part of `cargo test` (it needs the SDK); run by hand
when the stream handling changes (tests/observe.rs checks the same bytes without the SDK).
"""
import json
import re
import sys
import urllib.request

from openai import OpenAI

UPSTREAM, KVBUST, ADMIN = sys.argv[1:4]
MODEL = "kvbust-mock"


def prompt_tokens_total():
    text = urllib.request.urlopen(ADMIN + "/metrics").read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^kvbust_upstream_prompt_tokens_total\{[^}]*\} (\S+)$", text, re.M))


def chunks(base, kind, i):
    """The SDK's parsed chunks of one stream, id and created left out (they differ per request)."""
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    text = f"Request {i}: can I return a tent that I have used once?"
    if kind == "chat":
        stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=6, stream=True)
    else:
        stream = client.completions.create(model=MODEL, prompt=text, max_tokens=6, stream=True)
    return [c.model_dump(exclude={"id", "created"}) for c in stream]


def raw_events(base, kind, i):
    """The raw SSE events, with the per-request id and created masked."""
    text = f"Request {i}: can I return a tent that I have used once?"
    body = {"model": MODEL, "max_tokens": 6, "stream": True}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    raw = urllib.request.urlopen(req).read().decode()
    raw = re.sub(r'"id":"[^"]*"', '"id":"X"', raw)
    return re.sub(r'"created":\d+', '"created":0', raw).split("\n\n")


for i, kind in enumerate(["chat", "completions", "chat"]):
    before = prompt_tokens_total()
    via = chunks(KVBUST, kind, i)
    after = prompt_tokens_total()
    direct = chunks(UPSTREAM, kind, i)
    assert after > before, f"{kind}: kvbust did not count the stream's usage ({before} -> {after})"
    assert all(c.get("usage") is None for c in via), f"{kind}: a usage chunk reached the client: {via}"
    assert len(via) == len(direct), f"{kind}: {len(via)} chunks through kvbust, {len(direct)} direct"
    for n, (a, b) in enumerate(zip(via, direct)):
        assert a == b, f"{kind} chunk {n}: through kvbust {a}\n direct {b}"
    assert raw_events(KVBUST, kind, i) == raw_events(UPSTREAM, kind, i), f"{kind}: raw events differ"
    print(f"{kind:12} {len(via)} chunks, identical through kvbust; prompt tokens counted {after - before:.0f}")
print("ok: streams without include_usage reach the SDK unchanged, and kvbust counted them")
