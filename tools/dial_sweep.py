#!/usr/bin/env python3
"""A cache-hit dial sweep (issue 40): the same 60 prompts warmed once, then profiled at
R = 0, 0.25, 0.5, 0.75 and 1 (`x-kvbust-hit-ratio`), one report run each (`POST /report/reset`
between them), against `kvbust serve` with its built-in mock (20 us of prefill per uncached
token, a cache large enough to hold everything). Prints the table: requests, the reported and
predicted hit rate and TTFT p50/p99 per R.

Usage: python3 tools/dial_sweep.py [KVBUST_BIN] (default target/release/kvbust). Standard
library only; picks free loopback ports; stops the server it started.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "assets", "shakespeare.txt")
DIALS = ["0", "0.25", "0.5", "0.75", "1"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def call(url, body=None, headers=None, method=None):
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    with urllib.request.urlopen(req, timeout=600) as resp:
        return resp.read()


def prompts(n):
    text = open(CORPUS, encoding="utf-8").read()
    out, x = [], 12345
    for i in range(n):
        x = (x * 6364136223846793005 + 1) % 2**64
        size = 6000 + (x >> 33) % 20000  # characters: about 1,600 to 7,000 Qwen3 tokens
        x = (x * 6364136223846793005 + 1) % 2**64
        start = (x >> 33) % (len(text) - size)
        out.append(f"Passage {i}:\n" + text[start:start + size])
    return out


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "target", "release", "kvbust")
    data, admin = free_port(), free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(f'[listen]\naddr = "127.0.0.1:{data}"\n[admin]\naddr = "127.0.0.1:{admin}"\n'
              '[mock]\nbase_delay = "2ms"\nprefill_per_token = "20us"\ninter_token = "1ms"\n'
              "cache_blocks = 1000000\n")
    cfg.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVBUST_")}
    server = subprocess.Popen([binary, "serve", "--config", cfg.name], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                call(f"http://127.0.0.1:{admin}/readyz")
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)

        def chat(prompt, headers):
            body = json.dumps({"model": "kvbust-mock", "max_tokens": 4, "stream": True,
                               "stream_options": {"include_usage": True},
                               "messages": [{"role": "user", "content": prompt}]}).encode()
            call(f"http://127.0.0.1:{data}/v1/chat/completions", body,
                 {"content-type": "application/json", **headers})

        ps = prompts(60)
        for p in ps:
            chat(p, {"x-kvbust-phase": "warmup"})
        print("| R | requests | reported hit rate | predicted hit rate | TTFT p50 (ms) | TTFT p99 (ms) |")
        print("|---|---|---|---|---|---|")
        for r in DIALS:
            call(f"http://127.0.0.1:{admin}/report/reset", b"", method="POST")
            for p in ps:
                chat(p, {"x-kvbust-phase": "profiling", "x-kvbust-hit-ratio": r})
            report = json.loads(call(f"http://127.0.0.1:{admin}/report?wait=60s"))
            row = next(w for w in report["rows"] if w["phase"] == "profiling")
            reported = row["cached_tokens"]["reported"] / row["prompt_tokens"]["reported"]
            predicted = row["cached_tokens"]["predicted"] / row["prompt_tokens"]["predicted"]
            t = row["latency"]["ttft_ms"]
            print(f"| {r} | {row['requests']} | {reported:.3f} | {predicted:.3f} | "
                  f"{t['p50']:.1f} | {t['p99']:.1f} |")
    finally:
        server.terminate()
        server.wait()
        os.unlink(cfg.name)


if __name__ == "__main__":
    main()
