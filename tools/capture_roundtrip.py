#!/usr/bin/env python3
"""Capture round trip on the hash-id vectors of ../shared/vectors/traces.json (issue 30).

For each trace case with hash ids and each corpus: `kvbust synth` builds the requests AIPerf
would send (openai-chat bodies), they go through `kvbust serve` (built-in mock, Qwen3) with
capture on at the trace's block size, and the captured rows are compared with the original,
row for row: input and output lengths, and the share of blocks whose ids map one to one
(a consistent renaming in both directions). Requests are sent back to back (the schedule is
checked by the exact round-trip test, tests/proxy/capture.rs).

usage: tools/capture_roundtrip.py [KVBUST_BINARY] [TRACES_JSON]
"""
import json, os, socket, subprocess, sys, tempfile, time, urllib.request

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/debug/kvbust"
VECTORS = sys.argv[2] if len(sys.argv) > 2 else "../shared/vectors/traces.json"
BLOCK = {"mooncake_trace": 512, "bailian_trace": 16}


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def grouped(kind, rows):
    """Rows in the order AIPerf's loader groups them (the order synth writes bodies in)."""
    order, index = [], {}
    if kind == "bailian_trace":
        parent = {r["chat_id"]: r["parent_chat_id"] for r in rows}
        def root(c):
            seen = set()
            while parent.get(c, -1) not in (-1, None) and parent[c] in parent and c not in seen:
                seen.add(c); c = parent[c]
            return c
        for i, r in enumerate(rows):
            k = f"chat-{root(r['chat_id'])}"; index.setdefault(k, []).append(i)
            if k not in order: order.append(k)
        return [(k, i) for k in order for i in sorted(index[k], key=lambda j: rows[j].get("turn", 1))]
    for i, r in enumerate(rows):
        k = r.get("session_id") or f"own-{i}"; index.setdefault(k, []).append(i)
        if k not in order: order.append(k)
    return [(k, i) for k in order for i in index[k]]


def one_to_one(orig, got):
    ab, ba, ok, total = {}, {}, 0, 0
    for o, g in zip(orig, got):
        for x, y in zip(o.get("hash_ids", []), g.get("hash_ids", [])):
            total += 1
            if ab.setdefault(x, y) == y and ba.setdefault(y, x) == x:
                ok += 1
        total += abs(len(o.get("hash_ids", [])) - len(g.get("hash_ids", [])))
    return ok, total


def run_case(name, case, corpus, tmp):
    kind, rows = case["custom_dataset_type"], case["trace"]
    argv = case.get("argv", [])
    bs = int(argv[argv.index("--isl-block-size") + 1]) if "--isl-block-size" in argv else BLOCK[kind]
    trace = os.path.join(tmp, f"{name}.jsonl")
    with open(trace, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    bodies = os.path.join(tmp, f"{name}-{corpus}.bodies")
    made = subprocess.run([BIN, "synth", "--input-file", trace, "--custom-dataset-type", kind,
                           "--prompt-corpus", corpus, "--random-seed", "1", "--isl-block-size", str(bs),
                           "--format", "openai-chat", "-o", bodies], capture_output=True, text=True)
    if made.returncode != 0:
        return f"synth refused: {made.stderr.strip().splitlines()[-1]}"
    cap = os.path.join(tmp, f"cap-{name}-{corpus}")
    data, admin = free_port(), free_port()
    cfg = os.path.join(tmp, "kv.toml")
    with open(cfg, "w") as f:
        f.write(f'[listen]\naddr = "127.0.0.1:{data}"\n[admin]\naddr = "127.0.0.1:{admin}"\n'
                f'[capture]\nenabled = true\ndir = "{cap}"\nblock_size = {bs}\n'
                '[cache_bust]\nsession_sources = ["x_correlation_id"]\n')
    srv = subprocess.Popen([BIN, "serve", "--config", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz"); break
            except Exception:
                time.sleep(0.1)
        order = grouped(kind, rows)
        with open(bodies) as f:
            lines = [l for l in f if l.strip()]
        for (session, _), body in zip(order, lines):
            h = {"content-type": "application/json"}
            if not session.startswith("own-"):
                h["x-correlation-id"] = str(session)
            urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{data}/v1/chat/completions", body.encode(), h)).read()
        urllib.request.urlopen(f"http://127.0.0.1:{admin}/report?wait=20s").read()
    finally:
        srv.terminate(); srv.wait()
    got = []
    for fn in sorted(os.listdir(cap)):
        if fn.endswith(".jsonl"):
            got += [json.loads(l) for l in open(os.path.join(cap, fn))]
    orig = [rows[i] for _, i in order]
    with_ids = [(o, g) for o, g in zip(orig, got) if o.get("hash_ids")]
    ok, total = one_to_one([o for o, _ in with_ids], [g for _, g in with_ids])
    d_in = [g["input_length"] - o["input_length"] for o, g in zip(orig, got)]
    d_out = [g["output_length"] - o["output_length"] for o, g in zip(orig, got)]
    return (f"rows {len(got)}/{len(orig)}; ids 1:1 {ok}/{total} ({100 * ok / max(total, 1):.1f}%); "
            f"input diff min {min(d_in)} max {max(d_in)} exact {sum(d == 0 for d in d_in)}/{len(d_in)}; "
            f"output exact {sum(d == 0 for d in d_out)}/{len(d_out)}")


def main():
    cases = json.load(open(VECTORS))["cases"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in cases.items():
            if not any(r.get("hash_ids") for r in case["trace"]):
                continue
            for corpus in ["sonnet", "coding", "coding-exact"]:
                print(f"{name:28} {corpus:12} {run_case(name, case, corpus, tmp)}", flush=True)


if __name__ == "__main__":
    main()
