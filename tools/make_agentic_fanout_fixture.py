"""Makes tests/fixtures/synth/agentic_fanout.json: a generated agentic corpus (8 Weka traces
x 24 requests with compactions, side chains, a parallel worker fan-out and subagents;
tools/agentic_bench.py gen) and what AIPerf 0.13.0 builds from it, messages as sha256.

    python3 -m venv V && V/bin/pip install aiperf==0.13.0
    V/bin/python tools/make_agentic_fanout_fixture.py ../shared/data/tokenizers/qwen3 \
        tests/fixtures/synth/agentic_fanout.json

AIPerf runs as `aiperf profile --input-file DIR --custom-dataset-type weka_trace
--random-seed 5 --model claude-opus` does, with its default settings (worker pool included).
"""
import hashlib, json, os, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agentic_bench as B  # noqa: E402

N, REQS, GEN_SEED, SEED = 8, 24, 4, 5


def sha(s):
    return hashlib.sha256(s.encode()).hexdigest()


def main(tokp, out):
    d = tempfile.mkdtemp()
    B.gen(d, N, REQS, GEN_SEED)
    files = {f: json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d))}
    dump = os.path.join(d, "aiperf.jsonl")
    B.aiperf(d, tokp, SEED, dump)
    convs = []
    for line in open(dump):
        c = json.loads(line)
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
            r["raw_messages"] = [{"role": m["role"], "content_sha256": sha(m["content"])}
                                 for m in t["raw_messages"]]
            rec["turns"].append(r)
        convs.append(rec)
    json.dump({"aiperf_version": "0.13.0", "tokenizer": "qwen3",
               "argv": ["--random-seed", str(SEED), "--model", "claude-opus"],
               "how": "tools/make_agentic_fanout_fixture.py", "files": files,
               "conversations": convs}, open(out, "w"), separators=(",", ":"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
