"""Agentic-trace vectors from AIPerf 0.13.0 itself: weka_trace (Weka kv-cache-tester agentic coding
traces, with subagents) and burst_gpt_trace (BurstGPT CSV token counts).

    python3 -m venv V && V/bin/pip install aiperf==0.13.0
    V/bin/python make_agentic_vectors.py TOKENIZER_DIR OUT.json public

Drives AIPerf's CustomDatasetComposer exactly as
`aiperf profile --input-file PATH --custom-dataset-type weka_trace|burst_gpt_trace [flags]` would
(hash-id block decoding made sequential with the same tokenizer: identical output, no process
pool; WEKA_PARALLEL_WORKERS=1). Records the input files and flags, and per conversation every field
AIPerf's Conversation/Turn carries that a replay needs: session id, context mode, and per turn the
messages (full text), max_tokens, timestamp,
delay, model, input kind, and the spawn/join topology (conversation branches, is_root,
agent_depth, parent; turn branch_ids and prerequisites).
"""
import csv, gzip, hashlib, io, json, os, random, shutil, sys, tempfile, time

os.environ.setdefault("AIPERF_DATASET_WEKA_PARALLEL_WORKERS", "1")

from aiperf.cli import app
from aiperf.common import random_generator as rng
from aiperf.common.tokenizer import Tokenizer
from aiperf.config import BenchmarkRun
from aiperf.config.flags.resolver import resolve_config
from aiperf.config.loader.plan import build_benchmark_plan
from aiperf.dataset.composer.custom import CustomDatasetComposer
import aiperf.dataset.loader.hash_ids_synthesis as H


def weka_trace(seed, tid, nreq=8, subagents=1, compact_at=None, bs=64, tool_tokens=120, system_tokens=60,
               stream_share=0.5, flat_fanout=False):
    """One synthetic Weka trace: a main agent whose context grows block by block (each request's
    hash_ids extend the previous one's), optional subagents with their own inner chains (sharing the
    system prefix), an optional context compaction (a fresh chain keeping only the system blocks),
    and optionally an untagged fan-out (flat requests on a second chain) that AIPerf splits off."""
    r = random.Random(seed)
    nxt = [1]

    def fresh(k):
        out = list(range(nxt[0], nxt[0] + k)); nxt[0] += k; return out

    sys_blocks = fresh(3)
    ctx = list(sys_blocks); t = r.random() * 3; reqs = []; prev_stop = ""

    def request(ctx, t, kind):
        h = ctx + fresh(r.randint(1, 4))
        stop = r.choice(["tool_use", "tool_use", "end_turn", ""])
        d = {"t": round(t, 3), "type": kind, "model": r.choice(["claude-opus", "claude-opus", "claude-haiku"]),
             "in": (len(h) - 1) * bs + r.randint(1, bs), "out": r.randint(5, 400), "hash_ids": h,
             "input_types": r.choice([["text"], ["tool_result"], ["tool_result", "text"], []]),
             "output_types": r.choice([["text"], ["tool_use"], ["thinking", "text"]]), "stop": stop,
             "api_time": round(0.2 + r.random() * 4, 3), "think_time": round(r.random() * 2, 3)}
        if kind == "s":
            d["ttft"] = round(r.random(), 3)
        return d, h

    side = list(sys_blocks[:2]) + fresh(2)
    for i in range(nreq):
        t += 0.5 + r.random() * 6
        if compact_at is not None and i == compact_at:
            ctx = list(sys_blocks) + fresh(2)
        d, h = request(ctx, t, "s" if r.random() < stream_share else "n")
        reqs.append(d); ctx = h + fresh(1)
        if flat_fanout and i in (1, 4):
            t += 0.3
            dd, side = request(side, t, "n"); reqs.append(dd); side = side + fresh(1)
        if subagents and i in (2, 5)[:subagents]:
            inner = []; sctx = list(sys_blocks[:1]) + fresh(1); st = t + 0.4
            for _ in range(r.randint(2, 4)):
                st += 0.3 + r.random() * 2
                dd, hh = request(sctx, st, "n" if r.random() < 0.7 else "s"); inner.append(dd); sctx = hh + fresh(1)
            reqs.append({"t": round(t + 0.2, 3), "type": "subagent", "agent_id": f"agent_{i:03d}",
                         "subagent_type": r.choice(["Explore", "general-purpose"]),
                         "duration_ms": int((st - t) * 1000) + 500, "total_tokens": 4000 + r.randint(0, 9000),
                         "tool_use_count": len(inner), "status": "completed", "requests": inner,
                         "models": ["claude-haiku"], "tool_tokens": 40, "system_tokens": 30})
            t = st + 0.5
    return {"id": tid, "models": ["claude-opus", "claude-haiku"], "block_size": bs, "hash_id_scope": "local",
            "tool_tokens": tool_tokens, "system_tokens": system_tokens, "requests": reqs}


def burst_csv(seed, n):
    r = random.Random(seed); buf = io.StringIO(); w = csv.writer(buf); t = 0
    w.writerow(["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"])
    for _ in range(n):
        t += r.randint(0, 9); a = r.randint(1, 900); b = r.randint(1, 300)
        w.writerow([t, r.choice(["ChatGPT", "GPT-4"]), a, b, a + b, "Conversation log"])
    return buf.getvalue()


def weka_dir(specs):
    return {"kind": "weka_trace", "files": {f"{s[1]}.json": weka_trace(*s[:2], **s[2]) for s in specs}}


PUBLIC = {
    "weka_main_only": (weka_dir([(1, "trace-a", {"subagents": 0})]), ["--random-seed", "42"]),
    "weka_subagents": (weka_dir([(2, "trace-b", {"subagents": 2}), (3, "trace-c", {"subagents": 1})]), ["--random-seed", "7"]),
    "weka_compaction": (weka_dir([(4, "trace-d", {"subagents": 0, "compact_at": 4, "nreq": 9})]), ["--random-seed", "3"]),
    "weka_fanout": (weka_dir([(5, "trace-e", {"subagents": 1, "flat_fanout": True})]), ["--random-seed", "11"]),
    "weka_sonnet_corpus": (weka_dir([(6, "trace-f", {"subagents": 1})]), ["--random-seed", "5", "--prompt-corpus", "sonnet"]),
    "weka_bs32_single_file": ({"kind": "weka_trace", "single": True, "files": {"one.json": weka_trace(7, "trace-g", bs=32, subagents=1)}}, ["--random-seed", "9"]),
    "burst_gpt": ({"kind": "burst_gpt_trace", "single": True, "files": {"burst.csv": burst_csv(8, 15)}}, ["--random-seed", "13"]),
}
def run_case(tokp, case, extra, tmp):
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    for name, content in case["files"].items():
        data = (content if isinstance(content, str) else json.dumps(content)).encode()
        with open(os.path.join(tmp, name), "wb") as f:
            # A `.gz` name is written gzip-compressed (make_tracelab_vectors.py's inputs).
            f.write(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    path = os.path.join(tmp, next(iter(case["files"]))) if case.get("single") else tmp
    argv = ["profile", "--model", "claude-opus", "--url", "localhost:8000", "--endpoint-type", "chat",
            "--tokenizer", tokp, "--input-file", path]
    # kind None: the type is detected from the file, as `aiperf profile` without the flag does.
    argv += (["--custom-dataset-type", case["kind"]] if case["kind"] is not None else []) + extra
    _, bound, _ = app.parse_args(argv)
    cfg = build_benchmark_plan(resolve_config(list(bound.arguments.values())[0])).configs[0]
    seed = int(extra[extra.index("--random-seed") + 1])
    run = BenchmarkRun(benchmark_id="0123456789ab", cfg=cfg, trial=0, artifact_dir=cfg.artifacts.dir,
                       random_seed=seed, variables={})
    rng.reset(); rng.init(seed)
    tok = Tokenizer.from_pretrained(tokp)
    H.parallel_decode = lambda seqs, name, **kw: [tok.decode(x) for x in seqs]
    comp = CustomDatasetComposer(run=run, tokenizer=tok)
    t = time.perf_counter(); convs = comp.create_dataset(); dt = time.perf_counter() - t
    return convs, dt


KEEP_TURN = ("model", "timestamp", "delay", "max_tokens", "input_kind", "no_request", "reset_context",
             "prerequisites", "branch_ids", "raw_messages", "texts")
KEEP_CONV = ("context_mode", "is_root", "agent_depth", "parent_conversation_id", "branches")


def sha(s):
    return hashlib.sha256(s.encode()).hexdigest()


def hide(messages):
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), str):
            m["content_sha256"] = sha(m.pop("content"))
        out.append(m)
    return out


def turn_record(t, public):
    d = t.model_dump(mode="json", exclude_none=True)
    rec = {k: d[k] for k in KEEP_TURN if k in d and d[k] not in ([], None)}
    if "texts" in rec:  # burst_gpt: synthesized user text
        rec["texts"] = [c for x in rec["texts"] for c in x.get("contents", [])]
        if not public:
            rec["texts_sha256"] = [sha(c) for c in rec.pop("texts")]
    if "raw_messages" in rec and not public:
        rec["raw_messages"] = hide(rec["raw_messages"])
    return rec


def main(tokp, out, which):
    cases = PUBLIC
    public = which == "public"
    res = {"aiperf_version": "0.13.0", "tokenizer": "qwen3 (shared/data/tokenizers/qwen3)",
           "how": "aiperf profile --input-file PATH --custom-dataset-type KIND + argv; "
                  "CustomDatasetComposer.create_dataset(); per conversation the fields below",
           "cases": {}}
    for name, (case, extra) in cases.items():
        convs, dt = run_case(tokp, case, extra, os.path.join(tempfile.gettempdir(), f"weka_{name}"))
        conv_out = []
        for c in convs:
            d = c.model_dump(mode="json", exclude_none=True)
            rec = {"session_id": c.session_id}
            rec.update({k: d[k] for k in KEEP_CONV if k in d and d[k] not in ([], None)})
            rec["turns"] = [turn_record(t, public) for t in c.turns]
            conv_out.append(rec)
        res["cases"][name] = {"custom_dataset_type": case["kind"], "argv": extra,
                              "input": {"single_file": bool(case.get("single")), "files": case["files"]},
                              "aiperf_seconds": round(dt, 3), "conversations": conv_out}
        print(name, len(convs), "conversations", sum(len(c["turns"]) for c in conv_out), "turns",
              round(dt, 2), "s", file=sys.stderr)
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
