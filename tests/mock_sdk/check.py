#!/usr/bin/env python3
"""Parses the built-in mock's /v1/responses and /v1/messages output with the official SDKs' own
pydantic models (full validation), streaming and not, so the mock's shapes stay the real ones.

    python3 -m venv /tmp/sdk && /tmp/sdk/bin/pip install openai anthropic
    kvbust mock --listen 127.0.0.1:18999 &
    /tmp/sdk/bin/python tests/mock_sdk/check.py http://127.0.0.1:18999

Exits non-zero with the validation error on the first mismatch. Not part of `cargo test` (it needs
the SDKs); run by hand when a shape changes.
"""
import json
import sys
import urllib.request

from pydantic import TypeAdapter
from openai.types.responses import Response, ResponseStreamEvent
from anthropic.types import Message, RawMessageStreamEvent

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18999"
SYSTEM = "You answer questions about tents. " * 6


def post(path, body):
    req = urllib.request.Request(BASE + path, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return r.read().decode()


def sse(text):
    """(event name, data dict) pairs; every event must have both lines."""
    out = []
    for block in text.split("\n\n"):
        if not block:
            continue
        head, data = block.split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: "), block
        out.append((head[7:], json.loads(data[6:])))
    return out


def parse(adapter, value):
    """Full pydantic validation (the SDKs themselves parse leniently, which would hide a wrong shape)."""
    return adapter.validate_python(value)


resp_event = TypeAdapter(ResponseStreamEvent)
msg_event = TypeAdapter(RawMessageStreamEvent)

# OpenAI Responses
for stream in (False, True):
    body = {"model": "gpt-test", "instructions": SYSTEM, "input": [{"role": "user", "content": [{"type": "input_text", "text": "Can I return a tent?"}]}],
            "max_output_tokens": 6, "stream": stream}
    text = post("/v1/responses", body)
    if not stream:
        r = Response.model_validate(json.loads(text))
        assert r.usage is not None and r.usage.output_tokens == 6, r.usage
        print("responses        ", r.status, r.usage.model_dump())
    else:
        events = [parse(resp_event, d) for _, d in sse(text)]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        done = events[-1]
        assert done.type == "response.completed", done.type
        print("responses stream ", len(events), "events;", done.response.usage.model_dump())

# Anthropic Messages
for stream in (False, True):
    body = {"model": "claude-test", "max_tokens": 6, "system": SYSTEM, "messages": [{"role": "user", "content": "Can I return a tent?"}], "stream": stream}
    text = post("/v1/messages", body)
    if not stream:
        m = Message.model_validate(json.loads(text))
        assert m.usage.output_tokens == 6
        print("messages         ", m.stop_reason, m.usage.model_dump(exclude_none=True))
    else:
        events = []
        for name, d in sse(text):
            if name == "ping":
                assert d == {"type": "ping"}
                continue
            events.append(parse(msg_event, d))
        assert events[0].type == "message_start" and events[-1].type == "message_stop"
        print("messages stream  ", len(events), "events;", events[0].message.usage.model_dump(exclude_none=True),
              "final", events[-2].usage.model_dump(exclude_none=True))
print("ok: every body and event parsed with the SDKs' models")
