#!/usr/bin/env python3
"""The built-in mock's parse and memory on the largest bodies it accepts (issue 34 items 3, 10).

Starts `kvbust mock` and sends, one at a time, the bodies below; for each prints the status, the
seconds it took, and the mock's peak RSS (VmHWM, reset before each where the kernel allows) and
RSS after. Then a burst (BURST copies of the largest chat at once) and the RSS right after it and
SETTLE seconds later (default 60): what is given back after a peak. The burst is BURST (30)
concurrent chats of one 100,000-token message each (within the mock's 131,072-token context).
With BIG=1, the 64 MB chat once and then BIG_BURST (3) of them at once. Before the mock counted a
large prompt chunk by chunk and stopped past the context length, each was tokenized whole (~7 GB
apiece; three at once held 21.9 GB): run an older binary with BIG=1 BIG_BURST=0 only.

  benches/mock_memory.py                               # target/dist/kvbust
  KVBUST=/tmp/other/kvbust SETTLE=60 BURST=6 benches/mock_memory.py
  BIG=1 SETTLE=0 BURST=0 benches/mock_memory.py        # the 64 MB chat, once and 3 at once

Bodies (each within the mock's element bounds, src/mock/bounds.rs, and mock.max_body 64 MiB):
  chat-empty    100,000 chat messages with empty content (the issue's 2,000,000 are refused now)
  chat-64mb     100,000 chat messages of 630 bytes each (~64 MB, the largest accepted chat;
                only with BIG=1: 31.5M tokens, refused for its length)
  chat-100k     one message of 100,000 tokens (200 KB), the burst's body
  prompt-ids    a /v1/completions prompt of 2,097,152 token ids
"""
import http.client
import json
import os
import subprocess
import sys
import threading
import time

KVBUST = os.environ.get("KVBUST", "target/dist/kvbust")
PORT = int(os.environ.get("PORT", "18790"))
SETTLE = float(os.environ.get("SETTLE", "60"))
BURST = int(os.environ.get("BURST", "30"))


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def reset_peak(pid):
    # Linux 4.0+: writing 5 to clear_refs resets VmHWM to the current RSS.
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def post(path, body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    t0 = time.monotonic()
    c.request("POST", path, body, {"content-type": "application/json"})
    r = c.getresponse()
    out = r.read()
    return r.status, time.monotonic() - t0, out


def chat(n, content):
    msg = json.dumps({"role": "user", "content": content})
    return ('{"model":"m","max_tokens":1,"messages":[' + ",".join([msg] * n) + "]}").encode()



def burst(pid, body, n):
    """Posts `body` as a chat `n` times at once, the peak RSS reset first: the sorted statuses
    and the seconds until the last answer."""
    reset_peak(pid)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(post("/v1/chat/completions", body)[:2]))
        for _ in range(n)
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(s for s, _ in results), time.monotonic() - t0

def main():
    proc = subprocess.Popen(
        [KVBUST, "mock", "--listen", f"127.0.0.1:{PORT}", "--inter-token", "0ms", "--base-delay", "0ms"],
        stdout=subprocess.DEVNULL,
        stderr=open("/tmp/mock_memory.kvbust.log", "w"),
    )
    try:
        for _ in range(300):
            try:
                http.client.HTTPConnection("127.0.0.1", PORT, timeout=1).connect()
                break
            except OSError:
                time.sleep(0.1)
        pid = proc.pid
        bodies = [
            ("chat-empty", "/v1/chat/completions", chat(100_000, "")),
            ("chat-100k", "/v1/chat/completions", chat(1, "x " * 100_000)),
            (
                "prompt-ids",
                "/v1/completions",
                ('{"model":"m","max_tokens":1,"prompt":[' + ",".join(["1"] * (1 << 21)) + "]}").encode(),
            ),
        ]
        print(f"start: RSS {status_kb(pid, 'VmRSS') / 1024:.0f} MB", flush=True)
        for name, path, body in bodies:
            reset_peak(pid)
            status, secs, out = post(path, body)
            detail = "" if status == 200 else " " + out[:200].decode(errors="replace")
            print(
                f"{name}: {len(body) / 1e6:.1f} MB body, status {status}, {secs:.2f} s, peak RSS "
                f"{status_kb(pid, 'VmHWM') / 1024:.0f} MB, RSS after {status_kb(pid, 'VmRSS') / 1024:.0f} MB{detail}",
                flush=True,
            )
        if os.environ.get("BIG"):
            huge = chat(100_000, "x " * 315)
            reset_peak(pid)
            status, secs, out = post("/v1/chat/completions", huge)
            print(
                f"chat-64mb: {len(huge) / 1e6:.1f} MB body, status {status}, {secs:.2f} s, peak RSS "
                f"{status_kb(pid, 'VmHWM') / 1024:.0f} MB, RSS after {status_kb(pid, 'VmRSS') / 1024:.0f} MB "
                f"{out[:160].decode(errors='replace')}",
                flush=True,
            )
            n = int(os.environ.get("BIG_BURST", "3"))
            if n:
                statuses, secs = burst(pid, huge, n)
                print(
                    f"chat-64mb x {n} at once: statuses {statuses}, "
                    f"{secs:.2f} s, peak RSS {status_kb(pid, 'VmHWM') / 1024:.0f} MB, "
                    f"RSS after {status_kb(pid, 'VmRSS') / 1024:.0f} MB",
                    flush=True,
                )
        if not BURST:
            return 0
        big = bodies[1][2]
        statuses, secs = burst(pid, big, BURST)
        print(
            f"burst of {BURST} x {len(big) / 1e6:.0f} MB: statuses {statuses}, "
            f"{secs:.1f} s, peak RSS {status_kb(pid, 'VmHWM') / 1024:.0f} MB, "
            f"RSS after {status_kb(pid, 'VmRSS') / 1024:.0f} MB",
            flush=True,
        )
        time.sleep(SETTLE)
        print(f"RSS {SETTLE:.0f} s after the burst: {status_kb(pid, 'VmRSS') / 1024:.0f} MB", flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
