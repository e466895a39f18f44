"""Makes tests/fixtures/synth/agentic_fanout.json: a generated agentic corpus (8 Weka traces
x 24 requests with compactions, side chains, a parallel worker fan-out and subagents;
tools/agentic_bench.py gen) and what AIPerf 0.13.0 builds from it under several flag sets
(messages as sha256).

    python3 -m venv V && V/bin/pip install aiperf==0.13.0
    V/bin/python tools/make_agentic_fanout_fixture.py ../shared/data/tokenizers/qwen3 \
        tests/fixtures/synth/agentic_fanout.json

Each case runs AIPerf in its own process (its WEKA_* settings are read at import) as
`aiperf profile --input-file DIR --custom-dataset-type weka_trace ARGV` does, with its default
settings (worker pool included) unless the case sets one; `kvbust_argv` is the same run's kvbust
flags.
"""
import hashlib, json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agentic_bench as B  # noqa: E402

N, REQS, GEN_SEED = 8, 24, 4
BASE = ["--random-seed", "5", "--model", "claude-opus"]


def cases(peaks):
    mid = sorted(peaks)[len(peaks) // 2]
    knobs = ["--synthesis-max-isl", "2500", "--synthesis-max-osl", "300",
             "--max-context-length", str(mid), "--inter-turn-delay-cap-seconds", "2.5"]
    return {
        "default": (BASE, {}, BASE),
        "knobs_tool_shaped": (BASE + knobs, {"AIPERF_DATASET_WEKA_TOOL_SHAPED_MESSAGES": "1"},
                              BASE + knobs + ["--tool-shaped-messages"]),
        "idle_gap_cap": (BASE + ["--trace-idle-gap-cap-seconds", "3"], {},
                         BASE + ["--trace-idle-gap-cap-seconds", "3"]),
        "think_time_sonnet": (BASE + ["--use-think-time-only", "--prompt-corpus", "sonnet"], {},
                              BASE + ["--use-think-time-only", "--prompt-corpus", "sonnet"]),
    }


def sha(s):
    return hashlib.sha256(s.encode()).hexdigest()


def one(tokp, d, argv_json, out):
    """Child process: AIPerf's dataset for one case, compacted."""
    from aiperf.cli import app
    from aiperf.common import random_generator as rng
    from aiperf.common.tokenizer import Tokenizer
    from aiperf.config import BenchmarkRun
    from aiperf.config.flags.resolver import resolve_config
    from aiperf.config.loader.plan import build_benchmark_plan
    from aiperf.dataset.composer.custom import CustomDatasetComposer

    extra = json.loads(argv_json)
    seed = int(extra[extra.index("--random-seed") + 1])
    argv = ["profile", "--url", "localhost:8000", "--endpoint-type", "chat", "--tokenizer", tokp,
            "--input-file", d, "--custom-dataset-type", "weka_trace"] + extra
    _, bound, _ = app.parse_args(argv)
    cfg = build_benchmark_plan(resolve_config(list(bound.arguments.values())[0])).configs[0]
    run = BenchmarkRun(benchmark_id="0123456789ab", cfg=cfg, trial=0, artifact_dir=cfg.artifacts.dir,
                       random_seed=seed, variables={})
    rng.reset()
    rng.init(seed)
    convs = CustomDatasetComposer(run=run, tokenizer=Tokenizer.from_pretrained(tokp)).create_dataset()
    recs = []
    for c in convs:
        c = c.model_dump(mode="json", exclude_none=True)
        rec = {"session_id": c["session_id"]}
        for k in ("context_mode", "is_root", "agent_depth", "parent_conversation_id", "branches"):
            if c.get(k) not in (None, []):
                rec[k] = c[k]
        rec["turns"] = []
        for t in c["turns"]:
            r = {k: t[k] for k in ("model", "timestamp", "delay", "max_tokens", "input_kind",
                                    "reset_context", "branch_ids") if t.get(k) not in (None, [])}
            if t.get("prerequisites"):
                r["prerequisites"] = [{"kind": p["kind"], "branch_id": p["branch_id"]}
                                      for p in t["prerequisites"]]
            r["raw_messages"] = [{"role": m["role"], "content_sha256": sha(m.get("content") or ""),
                                  **({"tool_call_id": m["tool_call_id"]} if "tool_call_id" in m else {}),
                                  **({"tool_calls": m["tool_calls"]} if "tool_calls" in m else {})}
                                 for m in t["raw_messages"]]
            rec["turns"].append(r)
        recs.append(rec)
    json.dump(recs, open(out, "w"))


def main(tokp, out):
    d = tempfile.mkdtemp()
    outs = tempfile.mkdtemp()  # not beside the traces: AIPerf reads every *.json there
    B.gen(d, N, REQS, GEN_SEED)
    files = {f: json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d))}
    peaks = []
    for t in files.values():
        p = 0
        for r in t["requests"]:
            for q in (r["requests"] if r["type"] == "subagent" else [r]):
                p = max(p, q["in"] + max(q["out"], 1))
        peaks.append(p)
    res = {"aiperf_version": "0.13.0", "tokenizer": "qwen3", "how": "tools/make_agentic_fanout_fixture.py",
           "files": files, "cases": {}}
    for name, (argv, env, kv_argv) in cases(peaks).items():
        tmp = os.path.join(outs, f"{name}.json")
        subprocess.run([sys.executable, __file__, "--one", tokp, d, json.dumps(argv), tmp],
                       env={**os.environ, **env}, check=True)
        convs = json.load(open(tmp))
        res["cases"][name] = {"aiperf_argv": argv, "aiperf_env": env, "kvbust_argv": kv_argv,
                              "conversations": convs}
        print(name, len(convs), "conversations", sum(len(c["turns"]) for c in convs), "turns",
              file=sys.stderr)
    json.dump(res, open(out, "w"), separators=(",", ":"))


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        one(*sys.argv[2:6])
    else:
        main(*sys.argv[1:3])
