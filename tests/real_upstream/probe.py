#!/usr/bin/env python3
"""Probe a running llama.cpp server directly (no kvbust) and print the facts
recorded in tests/real_upstream/README.md.

Stdlib only, so any python3 runs it:

    line="$(tests/real_upstream/llamacpp.sh start)" && export "$line"
    python3 tests/real_upstream/probe.py cache        # cases (a), (b), (c), (c2)
    python3 tests/real_upstream/probe.py sessions     # case (e): first_turn_prefix markers
    python3 tests/real_upstream/probe.py disconnect   # case (d)
    python3 tests/real_upstream/probe.py speed        # prompt / generation tokens/s
    python3 tests/real_upstream/probe.py all

Every case uses a fresh random nonce in its text so that neither the slot's
KV cache nor llama.cpp's host-RAM prompt cache holds anything from an earlier
case or an earlier run: a shared server keeps prefixes across requests.
"""

import argparse
import http.client
import json
import os
import re
import secrets
import sys
import time
import urllib.parse

URL = os.environ.get("KVBUST_REAL_UPSTREAM", "")

# About 340 tokens of a plausible system prompt (SmolLM2 tokenizer: see
# `system_prompt_tokens` in the output for the exact count).
SYSTEM_BODY = (
    "You are the customer support assistant of Northwind Outdoor Supply, a shop that sells "
    "tents, sleeping bags, stoves, backpacks and climbing gear. Follow these rules in every answer. "
    "1. Be brief: answer in at most three sentences unless the customer asks for detail. "
    "2. Never invent order numbers, prices, tracking codes or delivery dates; if you do not know, say so "
    "and offer to connect the customer with a human agent. "
    "3. Returns: unused items can be returned within 30 days of delivery with the original receipt; "
    "used items only if they are defective. Refunds go back to the original payment method within "
    "five business days after the warehouse receives the parcel. "
    "4. Warranty: tents and backpacks have a two-year warranty against manufacturing defects; stoves have "
    "one year; climbing gear that has been used is never taken back for safety reasons. "
    "5. Shipping: standard shipping takes three to five business days, express shipping one to two; "
    "orders above 80 euros ship for free inside the European Union. "
    "6. Safety: for questions about carbon monoxide, stove fuel or climbing anchors, always remind the "
    "customer to read the manufacturer's manual and, for climbing, to get training from a certified "
    "instructor. "
    "7. Tone: friendly, plain language, no emojis, no marketing superlatives. "
    "8. Privacy: never ask for a full card number or a password. "
    "9. If the customer writes in German, French or Spanish, answer in that language. "
    "10. End every answer by asking whether there is anything else you can help with."
)


def _conn(timeout=120):
    u = urllib.parse.urlparse(URL)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def get_json(path):
    c = _conn()
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


def post_json(path, payload):
    c = _conn()
    c.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"POST {path} -> {r.status}: {body[:300]!r}")
    return json.loads(body)


def stream(path, payload, stop_after_events=None):
    """POST with stream=true; return (events, seconds). Closes the socket after
    `stop_after_events` data events when given (a client disconnect)."""
    c = _conn()
    t0 = time.monotonic()
    c.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    events = []
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.decode().rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
        if stop_after_events is not None and len(events) >= stop_after_events:
            # Hard close: shut the socket down so the server's next write fails.
            c.sock.shutdown(2)
            c.close()
            return events, time.monotonic() - t0
        if data == "[DONE]":
            break
    c.close()
    return events, time.monotonic() - t0


def n_tokens(text):
    return len(post_json("/tokenize", {"content": text})["tokens"])


def metrics():
    _, text = get_json("/metrics")
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(llamacpp:\w+) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def chat(messages, max_tokens=8, streaming=True):
    payload = {"model": "smollm2", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if streaming:
        payload.update(stream=True, stream_options={"include_usage": True})
        events, secs = stream("/v1/chat/completions", payload)
        usage_chunk = next(e for e in events if isinstance(e, dict) and "usage" in e)
        assert usage_chunk["choices"] == [], usage_chunk
        text = "".join(
            (e["choices"][0]["delta"].get("content") or "")
            for e in events
            if isinstance(e, dict) and e.get("choices")
        )
        res = {"usage": usage_chunk["usage"], "timings": usage_chunk["timings"], "text": text}
    else:
        t0 = time.monotonic()
        body = post_json("/v1/chat/completions", payload)
        secs = time.monotonic() - t0
        res = {"usage": body["usage"], "timings": body["timings"],
               "text": body["choices"][0]["message"]["content"]}
    u = res["usage"]
    return {
        "prompt_tokens": u["prompt_tokens"],
        "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
        "cache_n": res["timings"]["cache_n"],
        "prompt_n": res["timings"]["prompt_n"],
        "completion_tokens": u["completion_tokens"],
        "seconds": round(secs, 3),
        "text": res["text"],
    }


def system_prompt():
    # The nonce comes first so the prompt diverges right after the chat
    # template's "<|im_start|>system\n" from anything cached before.
    return f"Ticket {secrets.token_hex(4)}. {SYSTEM_BODY}"


def case_cache():
    out = {}
    m0 = metrics()

    # (a) identical request twice.
    sys_a = system_prompt()
    msgs = [{"role": "system", "content": sys_a}, {"role": "user", "content": "How long do I have to return a tent?"}]
    out["system_prompt_tokens"] = n_tokens(sys_a)
    out["a_first"] = chat(msgs)
    out["a_second"] = chat(msgs)
    out["a_third_nonstream"] = chat(msgs, streaming=False)

    # (b) warmup with "[warmup]\n\n" prefixed to the system prompt, then the real one.
    sys_b = system_prompt()
    user_b = "Does the stove have a warranty?"
    out["b_warmup"] = chat([{"role": "system", "content": "[warmup]\n\n" + sys_b}, {"role": "user", "content": user_b}])
    out["b_profiled"] = chat([{"role": "system", "content": sys_b}, {"role": "user", "content": user_b}])
    # And once more: the profiled prompt is now cached itself.
    out["b_profiled_again"] = chat([{"role": "system", "content": sys_b}, {"role": "user", "content": user_b}])

    # (c) shared system prompt, different first user turns; then session 1's second turn.
    sys_c = system_prompt()
    u1 = "Hi, my name is Alice and I ordered a blue two-person tent last week. How long is shipping?"
    u2 = "Hello, this is Bob. My climbing harness arrived damaged. Can I send it back?"
    s1 = [{"role": "system", "content": sys_c}, {"role": "user", "content": u1}]
    s2 = [{"role": "system", "content": sys_c}, {"role": "user", "content": u2}]
    out["c_session1_turn1"] = chat(s1)
    out["c_session2_turn1"] = chat(s2)
    s1_t2 = s1 + [{"role": "assistant", "content": out["c_session1_turn1"]["text"]},
                  {"role": "user", "content": "And is express shipping possible?"}]
    out["c_session1_turn2"] = chat(s1_t2)
    # Token counts of the shared parts, to compare with cached_tokens.
    sys_part = f"<|im_start|>system\n{sys_c}<|im_end|>\n"
    out["c_tokens_system_block"] = n_tokens(sys_part)
    out["c_tokens_system_block_plus_user_header"] = n_tokens(sys_part + "<|im_start|>user\n")
    out["c_tokens_session1_turn1_full"] = n_tokens(
        sys_part + f"<|im_start|>user\n{u1}<|im_end|>\n<|im_start|>assistant\n"
    )

    # (c2) the same with long first turns (> the system prompt): the other
    # session now keeps < 50 % of the slot, so llama.cpp saves the slot to its
    # host-RAM prompt cache and restores session 1 from it on turn 2.
    sys_c2 = system_prompt()
    filler = " ".join(f"Line {i}: the order contained item number {i * 7 + 3}." for i in range(40))
    v1 = "Hi, I am Alice. Here is my order list. " + filler + " How long is shipping?"
    v2 = "Hello, this is Bob. Here is my parts list. " + filler.replace("order", "parcel") + " Can I return it?"
    t1 = [{"role": "system", "content": sys_c2}, {"role": "user", "content": v1}]
    t2 = [{"role": "system", "content": sys_c2}, {"role": "user", "content": v2}]
    out["c2_session1_turn1"] = chat(t1)
    out["c2_session2_turn1"] = chat(t2)
    t1_2 = t1 + [{"role": "assistant", "content": out["c2_session1_turn1"]["text"]},
                 {"role": "user", "content": "And is express shipping possible?"}]
    out["c2_session1_turn2"] = chat(t1_2)
    out["c2_session2_turn2"] = chat(t2 + [{"role": "assistant", "content": out["c2_session2_turn1"]["text"]},
                                          {"role": "user", "content": "Thanks. Who pays the return label?"}])

    m1 = metrics()
    out["metrics_delta"] = {
        k: m1[k] - m0.get(k, 0)
        for k in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total",
                  "llamacpp:tokens_predicted_total")
    }
    return out


def case_sessions():
    """(e) kvbust's first_turn_prefix by hand: `[rid:<12 hex>]\n\n` before the
    first user turn of each session (same rid on every turn of a session)."""
    out = {}
    for label, n_filler in (("short_turns", 0), ("long_turns", 40)):
        sys_e = system_prompt()
        filler = " ".join(f"Line {i}: the order contained item number {i * 7 + 3}." for i in range(n_filler))
        firsts = {
            "s1": f"[rid:{secrets.token_hex(6)}]\n\nHi, I am Alice. {filler} How long is shipping?",
            "s2": f"[rid:{secrets.token_hex(6)}]\n\nHello, this is Bob. {filler} Can I return it?",
        }
        conv = {k: [{"role": "system", "content": sys_e}, {"role": "user", "content": v}]
                for k, v in firsts.items()}
        res = {}
        res["s1_turn1"] = chat(conv["s1"])
        res["s2_turn1"] = chat(conv["s2"])
        conv["s1"] += [{"role": "assistant", "content": res["s1_turn1"]["text"]},
                       {"role": "user", "content": "And is express shipping possible?"}]
        res["s1_turn2"] = chat(conv["s1"])
        for v in res.values():
            v.pop("text")
        res["tokens_system_block_plus_user_header"] = n_tokens(
            f"<|im_start|>system\n{sys_e}<|im_end|>\n<|im_start|>user\n")
        res["tokens_s1_turn1_prompt"] = res["s1_turn1"]["prompt_tokens"]
        out[label] = res
    return out


def slot_busy():
    _, slots = get_json("/slots")
    return slots[0]["is_processing"]


def wait_idle(t_from, limit=30.0, every=0.02):
    """Poll /slots every `every` s; seconds from `t_from` until the slot is idle."""
    polls = 0
    while True:
        polls += 1
        if not slot_busy():
            return round(time.monotonic() - t_from, 3), polls
        if time.monotonic() - t_from > limit:
            return None, polls
        time.sleep(every)


def _start_and_drop(payload, after_busy_s):
    """Send a request, wait until the slot is busy plus `after_busy_s`, then
    drop the connection without reading. Returns the disconnect time."""
    c = _conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(payload),
              headers={"Content-Type": "application/json"})
    while not slot_busy():
        time.sleep(0.01)
    time.sleep(after_busy_s)
    c.sock.shutdown(2)
    c.close()
    return time.monotonic()


def case_disconnect():
    out = {}
    essay = "Write a very long, detailed essay about camping in the Alps."

    # (d1) streaming client disconnects during generation (after 5 SSE events).
    wait_idle(time.monotonic(), limit=300)
    msgs = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": essay}]
    payload = {"model": "smollm2", "messages": msgs, "max_tokens": 1500, "temperature": 0,
               "stream": True, "stream_options": {"include_usage": True}}
    m0 = metrics()
    events, secs = stream("/v1/chat/completions", payload, stop_after_events=5)
    t_disc = time.monotonic()
    busy_right_after = slot_busy()
    idle_after, polls = wait_idle(t_disc)
    m1 = metrics()
    out["stream_during_generation"] = {
        "events_read": len(events), "seconds_request_to_disconnect": round(secs, 3),
        "busy_right_after_disconnect": busy_right_after,
        "seconds_until_slot_idle": idle_after, "polls": polls,
        "tokens_predicted_delta": m1["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"],
        "requests_processing_after": m1["llamacpp:requests_processing"],
    }

    # (d2) non-streaming client disconnects during generation.
    wait_idle(time.monotonic(), limit=300)
    msgs = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": essay}]
    payload = {"model": "smollm2", "messages": msgs, "max_tokens": 400, "temperature": 0,
               "ignore_eos": True}
    m0 = metrics()
    # ~360-token prompt (2-6 s of prompt processing), then drop well into generation.
    t_disc = _start_and_drop(payload, after_busy_s=float(os.environ.get("PROBE_NONSTREAM_DROP_AFTER", "6")))
    idle_after, polls = wait_idle(t_disc, limit=300, every=0.05)
    m1 = metrics()
    out["nonstream_during_generation"] = {
        "max_tokens": 400,
        "seconds_until_slot_idle": idle_after, "polls": polls,
        "tokens_predicted_delta": m1["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"],
    }

    # (d3) streaming client disconnects during prompt processing of a long prompt.
    wait_idle(time.monotonic(), limit=300)
    long_user = " ".join(f"Item {i}: a tent peg made of aluminium." for i in range(int(os.environ.get("PROBE_LONG_ITEMS", "100"))))
    msgs = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": long_user}]
    payload = {"model": "smollm2", "messages": msgs, "max_tokens": 200, "temperature": 0,
               "stream": True, "stream_options": {"include_usage": True}}
    n_prompt = n_tokens(long_user) + n_tokens(msgs[0]["content"]) + 10
    m0 = metrics()
    t0 = time.monotonic()
    t_disc = _start_and_drop(payload, after_busy_s=0.5)
    idle_after, polls = wait_idle(t_disc, limit=300, every=0.05)
    m1 = metrics()
    out["stream_during_prompt"] = {
        "prompt_tokens_approx": n_prompt,
        "seconds_request_to_disconnect": round(t_disc - t0, 3),
        "seconds_until_slot_idle": idle_after, "polls": polls,
        "prompt_tokens_delta": m1["llamacpp:prompt_tokens_total"] - m0["llamacpp:prompt_tokens_total"],
        "tokens_predicted_delta": m1["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"],
    }
    return out


def case_speed():
    out = {}
    msgs = [{"role": "system", "content": system_prompt()},
            {"role": "user", "content": "Write a long essay about hiking safety."}]
    payload = {"model": "smollm2", "messages": msgs, "max_tokens": 256, "temperature": 0}
    body = post_json("/v1/chat/completions", payload)
    t = body["timings"]
    out["prompt_n"] = t["prompt_n"]
    out["prompt_per_second"] = round(t["prompt_per_second"], 1)
    out["predicted_n"] = t["predicted_n"]
    out["predicted_per_second"] = round(t["predicted_per_second"], 1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["cache", "sessions", "disconnect", "speed", "all"])
    args = ap.parse_args()
    if not URL:
        sys.exit("set KVBUST_REAL_UPSTREAM (export \"$(tests/real_upstream/llamacpp.sh env)\")")
    res = {}
    if args.what in ("speed", "all"):
        res["speed"] = case_speed()
    if args.what in ("cache", "all"):
        res["cache"] = case_cache()
    if args.what in ("sessions", "all"):
        res["sessions"] = case_sessions()
    if args.what in ("disconnect", "all"):
        res["disconnect"] = case_disconnect()
    json.dump(res, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
