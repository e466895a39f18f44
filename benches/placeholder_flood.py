#!/usr/bin/env python3
"""Placeholder generation under a flood of new coding lengths (issue 34 item 4).

Starts `kvbust serve` (built-in mock upstream) and, for DURATION seconds, runs FLOODERS threads
spread over IPS loopback source addresses (127.0.0.11, .12, ...), each request asking for 3 coding
lengths never asked before; beside them one victim (127.0.0.200) asks, one request at a time, for
a coding length built before the flood (VICTIM_TOKENS: by default 32768, past the prefetch bound,
so each of its prompts is generated when asked). Prints the victim's statuses and p50/p90, the
flooders' statuses, and kvbust's CPU-seconds over the run; first the victim alone (unloaded).

  benches/placeholder_flood.py                      # 80 flooders over 10 IPs
  IPS=1 FLOODERS=8 benches/placeholder_flood.py     # one flooding IP
  KVBUST=target/dist/kvbust PORT=18700 DURATION=25 VICTIM_TOKENS=1024 ...
Extra kvbust settings go in the environment as usual (KVBUST_SYNTH__...).
"""
import http.client
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time

KVBUST = os.environ.get("KVBUST", "target/dist/kvbust")
PORT = int(os.environ.get("PORT", "18700"))
ADMIN = PORT + 1
DURATION = float(os.environ.get("DURATION", "25"))
IPS = int(os.environ.get("IPS", "10"))
FLOODERS = int(os.environ.get("FLOODERS", "80"))
VICTIM_TOKENS = int(os.environ.get("VICTIM_TOKENS", "32768"))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def ask(source, content, timeout=120):
    body = json.dumps(
        {
            "model": "kvbust-mock",
            "max_tokens": 1,
            "messages": [{"role": "user", "content": content}],
        }
    )
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout, source_address=(source, 0))
    t0 = time.monotonic()
    try:
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        status = resp.status
    except OSError as e:
        status = type(e).__name__
    finally:
        conn.close()
    return status, time.monotonic() - t0


def wait_ready():
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", ADMIN, timeout=2)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("kvbust did not become ready")


def victim_run(stop, out):
    while not stop.is_set():
        out.append(ask("127.0.0.200", f"v {{{{kvbust:prompt:{VICTIM_TOKENS}:coding}}}}"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def summary(name, results):
    statuses = {}
    for s, _ in results:
        statuses[s] = statuses.get(s, 0) + 1
    ok = [t for s, t in results if s == 200]
    line = f"{name}: {len(results)} requests, statuses {dict(sorted(statuses.items(), key=str))}"
    if ok:
        line += f", p50 {statistics.median(ok):.3f} s, p90 {pct(ok, 0.9):.3f} s"
    print(line, flush=True)
    return statistics.median(ok) if ok else float("nan")


def main():
    env = dict(os.environ)
    # Each new coding length builds (and caches) a pool: a scratch cache, sized at the end.
    cache = env.setdefault("KVBUST_CACHE_DIR", f"/tmp/placeholder_flood.cache.{os.getpid()}")
    proc = subprocess.Popen(
        [KVBUST, "serve", "--listen", f"127.0.0.1:{PORT}", "--admin-listen", f"127.0.0.1:{ADMIN}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open("/tmp/placeholder_flood.kvbust.log", "w"),
    )
    try:
        wait_ready()
        # The victim's length is built (its lane and the coding pool of its stream) before.
        print("warm-up:", ask("127.0.0.200", f"{{{{kvbust:prompt:{VICTIM_TOKENS}:coding}}}}"), flush=True)
        stop = threading.Event()
        alone = []
        t = threading.Thread(target=victim_run, args=(stop, alone))
        t.start()
        time.sleep(min(DURATION, 10))
        stop.set()
        t.join()
        base = summary("victim alone", alone)

        # New lengths 100..20099 in turn: 3 of them with their pools' cost stay within
        # synth.max_placeholder_tokens, and one seen 20,000 lengths ago has long been dropped
        # (128 lanes are kept), so asking it again builds again.
        lengths = (100 + c % 20_000 for c in itertools.count())
        lock = threading.Lock()
        flood, victim = [], []
        stop = threading.Event()

        def flooder(i):
            source = f"127.0.0.{11 + i % IPS}"
            while not stop.is_set():
                with lock:
                    ns = [next(lengths) for _ in range(3)]
                content = " ".join(f"{{{{kvbust:prompt:{n}:coding}}}}" for n in ns)
                flood.append(ask(source, content))

        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        threads = [threading.Thread(target=flooder, args=(i,)) for i in range(FLOODERS)]
        threads.append(threading.Thread(target=victim_run, args=(stop, victim)))
        for th in threads:
            th.start()
        time.sleep(DURATION)
        stop.set()
        for th in threads:
            th.join()
        cpu, wall = cpu_seconds(proc.pid) - cpu0, time.monotonic() - t0
        print(f"flood: {FLOODERS} threads over {IPS} source addresses, {wall:.1f} s, kvbust {cpu:.1f} CPU-s, RSS {rss_mb(proc.pid):.0f} MB")
        summary("flooders", flood)
        loaded = summary("victim under flood", victim)
        print(f"victim p50 under flood / alone: {loaded / base:.2f}x")
    finally:
        proc.terminate()
        proc.wait()
        size = subprocess.run(["du", "-sm", cache], capture_output=True, text=True).stdout.split()
        print(f"corpus cache written: {size[0] if size else 0} MB in {cache}")
        subprocess.run(["rm", "-rf", cache])


if __name__ == "__main__":
    main()
