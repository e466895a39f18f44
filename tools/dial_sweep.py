#!/usr/bin/env python3
"""The client of the README's cache-hit dial sweep (issue 40): sends one fixed dataset, 60
chat prompts of about 1,600 to 7,000 Qwen3 tokens cut from the shipped Shakespeare corpus,
one at a time, streamed with usage, to kvbust's data port. Run it once as warmup, then once per
dial, each under `kvbust run`, which opens, closes, judges and saves the run:

  kvbust run --name warm -- python3 tools/dial_sweep.py --phase warmup
  kvbust run --name r0.5 --results-dir runs -- python3 tools/dial_sweep.py --hit-ratio 0.5

kvbust measures TTFT and the hit rates on the wire, so this client only sends and checks that
each request succeeded (exit 1 on the first that did not). Standard library only.
"""
import argparse
import json
import os
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "assets", "shakespeare.txt")


def prompts(n):
    """`n` passages of the corpus, at places and of lengths drawn by a fixed LCG: the same
    dataset on every run, so a dial sweep profiles exactly what its warmup sent."""
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="kvbust's data port")
    p.add_argument("--phase", choices=["warmup", "profiling"], default="profiling",
                   help="sent as x-kvbust-phase")
    p.add_argument("--hit-ratio", metavar="R",
                   help="sent as x-kvbust-hit-ratio (0 to 1); none: no dial")
    p.add_argument("--prompts", type=int, default=60, help="how many prompts of the dataset")
    p.add_argument("--model", default="kvbust-mock")
    a = p.parse_args()
    headers = {"content-type": "application/json", "x-kvbust-phase": a.phase}
    if a.hit_ratio is not None:
        headers["x-kvbust-hit-ratio"] = a.hit_ratio
    for i, prompt in enumerate(prompts(a.prompts)):
        body = json.dumps({"model": a.model, "max_tokens": 4, "stream": True,
                           "stream_options": {"include_usage": True},
                           "messages": [{"role": "user", "content": prompt}]}).encode()
        req = urllib.request.Request(f"{a.url}/v1/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                resp.read()
        except Exception as e:  # an HTTP error, a refused or cut connection: the run failed
            sys.exit(f"dial_sweep: prompt {i}: {e}")
    dial = f", dial {a.hit_ratio}" if a.hit_ratio is not None else ""
    print(f"dial_sweep: sent {a.prompts} prompts ({a.phase}{dial})")


if __name__ == "__main__":
    main()
