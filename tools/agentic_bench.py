"""The agentic-trace benchmark of benches/README.md: an agentic corpus and AIPerf's side of it.

    python3 tools/agentic_bench.py gen DIR [N_TRACES=200] [N_REQUESTS=40] [SEED=1]
        writes N Weka kv-cache-tester traces (DIR/trace-NNNN.json), each a main agent whose
        context grows block by block over N_REQUESTS top-level requests, with a compaction,
        a flat side chain, a parallel fan-out of three workers and two subagents (inner
        chains sharing the system prefix).
    V/bin/python tools/agentic_bench.py aiperf DIR TOKENIZER_DIR [SEED=42] [OUT]
        (V: a venv with `pip install aiperf==0.13.0`) builds AIPerf 0.13.0's dataset for
        `aiperf profile --input-file DIR --custom-dataset-type weka_trace --random-seed SEED
        --model claude-opus` with its default settings (its own worker pool included) and
        prints the conversation and turn counts (and with OUT writes its conversations,
        one JSON line each, to compare with kvbust's: tools/agentic_compare.py).

Time both sides over the whole process (`/usr/bin/time -v`), as benches/README.md records.
Only the standard library is needed for `gen`.
"""
import json, os, random, sys


def trace(seed, tid, nreq, bs=64):
    r = random.Random(seed)
    nxt = [1]

    def fresh(k):
        out = list(range(nxt[0], nxt[0] + k))
        nxt[0] += k
        return out

    sys_blocks = fresh(6)
    ctx = list(sys_blocks)
    t = r.random() * 3

    def request(ctx, t, model="claude-opus"):
        h = ctx + fresh(r.randint(1, 6))
        return {"t": round(t, 3), "type": r.choice(["n", "s"]), "model": model,
                "in": (len(h) - 1) * bs + r.randint(1, bs), "out": r.randint(20, 900),
                "hash_ids": h, "input_types": r.choice([["text"], ["tool_result"], []]),
                "output_types": ["text"], "stop": r.choice(["tool_use", "end_turn", ""]),
                "api_time": round(0.3 + r.random() * 5, 3), "think_time": round(r.random() * 2, 3)}, h

    reqs = []
    side = list(sys_blocks[:3]) + fresh(2)
    for i in range(nreq):
        t += 0.5 + r.random() * 8
        if i == nreq // 2:
            ctx = list(sys_blocks) + fresh(3)  # a compaction
        d, h = request(ctx, t)
        reqs.append(d)
        ctx = h + fresh(1)
        if i in (3, 9):
            t += 0.2
            dd, side = request(side, t)
            reqs.append(dd)
            side = side + fresh(1)
        if i == 12:
            # A parallel fan-out: three same-model workers forked from this context, running
            # at once (AIPerf names them ::wg:GGG_MMM).
            fork_ctx, ft = list(h), t + 0.1
            for w in range(3):
                wctx, wt = list(fork_ctx), ft + 0.05 * w
                for _ in range(2):
                    dd, hh = request(wctx, wt)
                    reqs.append(dd)
                    wctx = hh + fresh(1)
                    wt += 0.5
            t = ft + 2.0
        if i in (5, 20):
            inner, sctx, st = [], list(sys_blocks[:2]) + fresh(1), t + 0.4
            for _ in range(r.randint(3, 6)):
                st += 0.3 + r.random() * 3
                dd, hh = request(sctx, st, r.choice(["claude-opus", "claude-haiku"]))
                inner.append(dd)
                sctx = hh + fresh(1)
            reqs.append({"t": round(t + 0.2, 3), "type": "subagent", "agent_id": f"agent_{i:03d}",
                         "subagent_type": "Explore", "duration_ms": int((st - t) * 1000) + 500,
                         "total_tokens": 9000, "tool_use_count": len(inner), "status": "completed",
                         "requests": inner, "models": ["claude-opus"], "tool_tokens": 64,
                         "system_tokens": 64})
            t = st + 0.5
    return {"id": tid, "models": ["claude-opus", "claude-haiku"], "block_size": bs,
            "hash_id_scope": "local", "tool_tokens": 200, "system_tokens": 180, "requests": reqs}


def gen(out, n=200, nreq=40, seed=1):
    os.makedirs(out, exist_ok=True)
    for i in range(int(n)):
        with open(os.path.join(out, f"trace-{i:04d}.json"), "w") as f:
            json.dump(trace(int(seed) * 100003 + i, f"trace-{i:04d}", int(nreq)), f)


def aiperf(path, tokp, seed=42, out=None):
    from aiperf.cli import app
    from aiperf.common import random_generator as rng
    from aiperf.common.tokenizer import Tokenizer
    from aiperf.config import BenchmarkRun
    from aiperf.config.flags.resolver import resolve_config
    from aiperf.config.loader.plan import build_benchmark_plan
    from aiperf.dataset.composer.custom import CustomDatasetComposer

    seed = int(seed)
    argv = ["profile", "--model", "claude-opus", "--url", "localhost:8000", "--endpoint-type", "chat",
            "--tokenizer", tokp, "--input-file", path, "--custom-dataset-type", "weka_trace",
            "--random-seed", str(seed)]
    _, bound, _ = app.parse_args(argv)
    cfg = build_benchmark_plan(resolve_config(list(bound.arguments.values())[0])).configs[0]
    run = BenchmarkRun(benchmark_id="0123456789ab", cfg=cfg, trial=0, artifact_dir=cfg.artifacts.dir,
                       random_seed=seed, variables={})
    rng.reset()
    rng.init(seed)
    comp = CustomDatasetComposer(run=run, tokenizer=Tokenizer.from_pretrained(tokp))
    convs = comp.create_dataset()
    print(len(convs), "conversations", sum(len(c.turns) for c in convs), "turns")
    if out:  # AIPerf's dataset, one conversation per line, to compare with kvbust's
        with open(out, "w") as f:
            for c in convs:
                f.write(json.dumps(c.model_dump(mode="json", exclude_none=True)) + "\n")


if __name__ == "__main__":
    {"gen": gen, "aiperf": aiperf}[sys.argv[1]](*sys.argv[2:])
