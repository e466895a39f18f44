"""Compares kvbust's agentic dataset with AIPerf's, field by field (benches/README.md).

    python3 tools/agentic_compare.py KVBUST.jsonl AIPERF.jsonl

KVBUST.jsonl: `kvbust synth --input-file DIR --model claude-opus ...` (conversations format);
AIPERF.jsonl: `tools/agentic_bench.py aiperf DIR TOKENIZER SEED OUT`. Prints the first
difference and exits 1, or prints the counts and exits 0.
"""
import json, sys


def main(ours_path, theirs_path):
    ours = [json.loads(l) for l in open(ours_path)]
    theirs = [json.loads(l) for l in open(theirs_path)]

    def fail(msg):
        print("DIFFERENT:", msg)
        sys.exit(1)

    if [c["session_id"] for c in ours] != [c["session_id"] for c in theirs]:
        fail("conversation ids or order")
    turns = 0
    for o, t in zip(ours, theirs):
        sid = t["session_id"]
        for k, default in (("is_root", True), ("agent_depth", 0), ("parent_conversation_id", None),
                           ("context_mode", None)):
            if o.get(k, default) != t.get(k, default):
                fail(f"{sid}: {k} {o.get(k)!r} != {t.get(k)!r}")
        ob, tb = o.get("branches", []), t.get("branches", [])
        if len(ob) != len(tb):
            fail(f"{sid}: {len(ob)} branches != {len(tb)}")
        for a, b in zip(ob, tb):
            for k in ("branch_id", "child_conversation_ids", "mode", "dispatch_timing", "is_background",
                      "start_timestamp_ms"):
                if a.get(k) != b.get(k):
                    fail(f"{sid}: branch {k} {a.get(k)!r} != {b.get(k)!r}")
        if len(o["turns"]) != len(t["turns"]):
            fail(f"{sid}: {len(o['turns'])} turns != {len(t['turns'])}")
        for i, (a, b) in enumerate(zip(o["turns"], t["turns"])):
            turns += 1
            at = f"{sid} turn {i}"
            pairs = [("messages", "raw_messages", []), ("model", "model", None),
                     ("max_tokens", "max_tokens", None), ("timestamp", "timestamp", None),
                     ("delay", "delay", None), ("input_kind", "input_kind", None),
                     ("branch_ids", "branch_ids", []), ("prerequisites", "prerequisites", []),
                     ("reset_context", "reset_context", False)]
            for ko, kt, default in pairs:
                x, y = a.get(ko, default), b.get(kt, default)
                if ko == "prerequisites":
                    y = [{"kind": p["kind"], "branch_id": p["branch_id"]} for p in y]
                if x != y:
                    fail(f"{at}: {ko}: {str(x)[:300]!r} != {str(y)[:300]!r}")
    print(f"identical: {len(ours)} conversations, {turns} turns")


if __name__ == "__main__":
    main(*sys.argv[1:3])
