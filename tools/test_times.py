#!/usr/bin/env python3
"""Which tests cost the most: runs every test binary `cargo test --locked` builds and prints each
binary's wall and CPU time and the slowest tests (issue 43 item 1).

Why: a cold `cargo test` must fit CI's 2 cores, so the tests that take the time are named, and
the dependencies they lean on keep opt-level 3 in the test profile (Cargo.toml).

How: `cargo test --locked --no-run --message-format=json` lists the binaries (building them
first if needed); each runs from the repository root as cargo runs it, with libtest's JSON
events and per-test times. Those two options are unstable in libtest, so the binaries (never
cargo or rustc: their fingerprints would change) run with RUSTC_BOOTSTRAP=1, which lets a
stable test binary accept `-Z unstable-options`. A measurement aid only; nothing ships with it.

Usage: python3 tools/test_times.py [--top N] [--threads N] [FILTER...]
FILTER is passed to every binary (as `cargo test -- FILTER` would). Times are wall-clock: on a
shared machine read the order, not the figures, and say what else ran.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_binaries():
    out = subprocess.run(
        ["cargo", "test", "--locked", "--no-run", "--message-format=json"],
        cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True,
    ).stdout
    bins = []
    for line in out.splitlines():
        m = json.loads(line)
        if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
            kind = m["target"]["kind"][0]
            bins.append((f"{m['target']['name']} ({kind})", m["executable"]))
    return bins


def run(name, exe, threads, filters):
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    args = [exe, "-Z", "unstable-options", "--format", "json", "--report-time",
            f"--test-threads={threads}", *filters]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tests, failed = [], []
    for line in p.stdout.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("type") == "test" and e.get("event") in ("ok", "failed"):
            tests.append((float(e.get("exec_time", 0.0)), name, e["name"]))
            if e["event"] == "failed":
                failed.append(e["name"])
    return wall, cpu, tests, failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("filters", nargs="*")
    a = ap.parse_args()
    everything, failures = [], []
    print(f"| binary | tests | failed | wall s | CPU s |\n|---|---|---|---|---|")
    for name, exe in test_binaries():
        wall, cpu, tests, failed = run(name, exe, a.threads, a.filters)
        everything += tests
        failures += [f"{name}: {t}" for t in failed]
        print(f"| {name} | {len(tests)} | {len(failed)} | {wall:.1f} | {cpu:.1f} |", flush=True)
    for f in failures:
        print(f"FAILED {f}")
    print(f"\nThe {a.top} slowest tests (wall s, each test's own time):\n")
    print("| s | binary | test |\n|---|---|---|")
    for t, name, test in sorted(everything, reverse=True)[: a.top]:
        print(f"| {t:.2f} | {name} | `{test}` |")


if __name__ == "__main__":
    sys.exit(main())
