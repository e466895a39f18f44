"""TraceLab vectors from AIPerf 0.13.0 itself: `--custom-dataset-type tracelab` (uw-syfi TraceLab
agentic coding traces: one JSONL row per LLM round, plain or gzipped), synthetic inputs covering
session grouping, submission-time ordering, the prefix/append hash-id split, compaction, and the
subagent join (claude Agent/Task windows, codex spawn_agent/wait_agent windows, tightest-window
ambiguity, grandchildren and un-anchorable children kept standalone).

    python3 -m venv V && V/bin/pip install aiperf==0.13.0
    V/bin/python tools/make_tracelab_vectors.py TOKENIZER_DIR OUT.json

Reuses make_agentic_vectors.py (beside it) for the AIPerf call and the per-conversation record, so
the output has agentic_traces.json's layout. Each case's `input.files` holds the exact text of the
input file; a name ending in `.gz` is gzip-compressed before AIPerf (and the Rust test) reads it.
"""
import json, os, random, sys, tempfile, uuid
from datetime import datetime, timedelta, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_agentic_vectors as A  # noqa: E402

EPOCH = datetime(2025, 11, 3, 9, 0, 0, tzinfo=timezone.utc)


def stamp(sec, style="z"):
    dt = EPOCH + timedelta(microseconds=round(sec * 1e6))
    if style == "z":
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if style == "naive":
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%f")
    if style == "offset":  # the same instant written in UTC+02:00
        return (dt + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "+02:00"
    raise ValueError(style)


class Session:
    """One TraceLab session: rounds whose context grows, with optional compaction."""

    def __init__(self, r, sid, start, user="u1", project="p1", provider="claude",
                 model="claude-sonnet-4-5", style="z"):
        self.r, self.sid, self.t, self.user, self.project = r, sid, start, user, project
        self.provider, self.model, self.style = provider, model, style
        self.ctx = r.randint(300, 900)
        self.rows = []

    def round(self, *, gap=None, tools=(), compact=False, inputs=1, undated=False, model=None,
              out_events=("text",), first_input="tool_result", reasoning=None, tie=False):
        r = self.r
        if not tie:
            self.t += gap if gap is not None else 0.4 + r.random() * 5
        if compact:
            self.ctx = r.randint(200, 500)
            prefix = r.randint(0, 100)
        else:
            prefix = self.ctx - r.randint(0, 40)
        new = r.randint(20, 400)
        total = self.ctx + new
        self.ctx = total
        events = []
        sub = self.t
        for k in range(inputs):
            events.append({"event_type": "user_message" if first_input == "user_message" and k == 0
                           else "tool_result", "timestamp": stamp(sub - 0.05 * (inputs - 1 - k), self.style)})
        tend = sub
        for kind in out_events:
            tend += 0.2 + r.random() * 3
            events.append({"event_type": kind, "timestamp": stamp(tend, self.style)})
        tool_rows = []
        for name, lat in tools:
            emitted = tend + 0.01
            tool_rows.append({"tool_name": name, "emitted_at": stamp(emitted, self.style),
                              "result_at": stamp(emitted + lat / 1000, self.style),
                              "tool_wall_latency_ms": lat})
        row = {"trace_key": uuid.UUID(int=r.getrandbits(128)).hex, "session_id": self.sid,
               "round_index": len(self.rows), "provider": self.provider, "user": self.user,
               "project": self.project, "model": model or self.model,
               "input_tokens_total": total, "prefix_tokens": max(prefix, 0),
               "newly_append_tokens": total - max(prefix, 0),
               "output_tokens": r.randint(5, 500),
               "first_input_event_type": first_input,
               "timing_events": [] if undated else events, "tools": tool_rows}
        if reasoning is not None:
            row["reasoning_output_tokens"] = reasoning
        self.rows.append(row)
        self.t = tend + sum(lat for _, lat in tools) / 1000
        return row


def jsonl(rows, extra_lines=()):
    lines = [json.dumps(x) for x in rows]
    for pos, text in extra_lines:
        lines.insert(pos, text)
    return "\n".join(lines) + "\n"


def interleave(r, *sessions):
    """Rows of several sessions in a plausible file order (each session's own order kept)."""
    queues = [list(s.rows) for s in sessions]
    out = []
    while any(queues):
        q = r.choice([q for q in queues if q])
        out.append(q.pop(0))
    return out


def case_basic():
    r = random.Random(1)
    a = Session(r, "claude:7f3e0c1a-0000-4000-8000-00000000000a", 0.0)
    a.round(first_input="user_message", out_events=("reasoning", "text", "tool_call"))
    for i in range(6):
        a.round(out_events=("tool_call",) if i % 2 == 0 else ("text",), reasoning=r.choice([None, 0, 37]),
                inputs=r.choice([1, 2, 3]))
    a.round(compact=True, first_input="user_message")
    a.round()
    a.round(undated=True)  # no timing events: dropped
    b = Session(r, "claude:1b2c3d4e-0000-4000-8000-00000000000b", 2.0, user="u2", model="claude-opus-4-1")
    for i in range(5):
        b.round(first_input="user_message" if i == 0 else "tool_result")
    b.round(tie=True)  # same submission time as the previous round: round_index breaks the tie
    rows = interleave(r, a, b)
    # Rows of the same session out of round order, one with no session_id, a non-object line,
    # a blank line: all as AIPerf reads them.
    rows[3], rows[5] = rows[5], rows[3]
    text = jsonl(rows, [(4, json.dumps({"round_index": 0, "note": "no session"})), (6, "[1, 2]"), (8, "")])
    return {"kind": "tracelab", "single": True, "files": {"rounds.jsonl": text}}


def claude_family(r, base, user="u1", with_grandchild=True, with_short=True, style="z"):
    """A parent with two long Agent calls (two children in the first, one in the second), a short
    Task that spawns nothing, a grandchild, and an unrelated concurrent session of another user."""
    p = Session(r, f"claude:{base}-parent", 0.0, user=user, style=style)
    p.round(first_input="user_message", out_events=("text", "tool_call"))
    p.round(out_events=("tool_call",))
    w1_start = p.t
    p.round(out_events=("tool_call",), tools=[("Agent", 60000)])
    w1 = (w1_start, p.t)
    if with_short:
        p.round(out_events=("tool_call",), tools=[("Task", 4000)])  # below 10 s: no window
    p.round(out_events=("tool_call",), tools=[("Task", 40000)])
    p.round()
    p.round(first_input="user_message")
    # Two children in window 1 (their rounds start after the Agent call is emitted).
    c1 = Session(r, f"claude:{base}-child1", 0.0, user=user, model="claude-haiku-4-5", style=style)
    c1.t = w1[0] + 4
    for _ in range(3):
        c1.round(gap=1.0 + r.random() * 3, tools=[("Agent", 12000)] if with_grandchild and not c1.rows else ())
    c2 = Session(r, f"claude:{base}-child2", 0.0, user=user, style=style)
    c2.t = w1[0] + 8
    for _ in range(2):
        c2.round(gap=1.0 + r.random() * 2)
    sessions = [p, c1, c2]
    if with_grandchild:
        g = Session(r, f"claude:{base}-grandchild", 0.0, user=user, model="claude-haiku-4-5", style=style)
        g.t = c1.rows[0]["tools"] and (datetime.fromisoformat(c1.rows[0]["tools"][0]["emitted_at"].replace("Z", "+00:00")) - EPOCH).total_seconds() + 1
        g.round(gap=0.5)
        g.round(gap=1.0)
        sessions.append(g)
    # Window of the 40 s Task: one child.
    task = [t for row in p.rows for t in row["tools"] if t["tool_name"] == "Task" and t["tool_wall_latency_ms"] >= 10000][0]
    ts = (datetime.fromisoformat(task["emitted_at"].replace("Z", "+00:00").replace("+02:00", "+02:00"))
          - EPOCH).total_seconds()
    if style == "offset":
        ts = (datetime.fromisoformat(task["emitted_at"]) - EPOCH).total_seconds()
    c3 = Session(r, f"claude:{base}-child3", 0.0, user=user, style=style)
    c3.t = ts + 2
    for _ in range(4):
        c3.round(gap=1.0 + r.random() * 3)
    sessions.append(c3)
    other = Session(r, f"claude:{base}-other-user", 0.0, user=user + "-x", style=style)
    other.t = w1[0] + 5
    other.round(gap=1)
    other.round(gap=2)
    sessions.append(other)
    return sessions


def case_subagents_gz():
    r = random.Random(2)
    fam = claude_family(r, "5a9d")
    rows = interleave(r, *fam)
    return {"kind": "tracelab", "single": True, "files": {"syfi_coding_trace.jsonl.gz": jsonl(rows)}}


def case_codex_and_unanchored():
    r = random.Random(3)
    # Codex parent: spawn_agent at round 1, wait_agent returning at round 3 -> one window.
    p = Session(r, "codex:019a-parent", 0.0, provider="codex", model="gpt-5-codex")
    p.round(first_input="user_message", out_events=("reasoning", "tool_call"), reasoning=120)
    p.round(out_events=("tool_call",), tools=[("spawn_agent", 40), ("spawn_agent", 35)])
    spawn_t = p.rows[-1]["tools"][0]["emitted_at"]
    p.round(out_events=("tool_call",), tools=[("wait_agent", 30000)])
    p.round(out_events=("tool_call",), tools=[("wait_agent", 15000)])
    p.round()
    t_spawn = (datetime.fromisoformat(spawn_t.replace("Z", "+00:00")) - EPOCH).total_seconds()
    kids = []
    for k in range(2):
        c = Session(r, f"codex:019a-worker{k}", 0.0, provider="codex", model="gpt-5-codex-mini")
        c.t = t_spawn + 1 + 3 * k
        for _ in range(2 + k):
            c.round(gap=1.0 + r.random() * 4)
        kids.append(c)
    # A claude parent whose first row has no timing (dropped) but emitted the Agent call: its
    # child's spawn time is before the parent's first request, so it cannot be anchored and is
    # kept as its own trace.
    q = Session(r, "claude:0c0c-early-spawn", 100.0, user="u9")
    q.round(undated=True, tools=[("Agent", 30000)])
    q.rows[-1]["tools"][0]["emitted_at"] = stamp(100.5)
    q.rows[-1]["tools"][0]["result_at"] = stamp(130.5)
    q.t = 118
    q.round(first_input="user_message")
    q.round()
    qc = Session(r, "claude:0c0c-early-child", 0.0, user="u9")
    qc.t = 101
    qc.round(gap=1)
    qc.round(gap=1.5)
    rows = interleave(r, p, *kids, q, qc)
    return {"kind": "tracelab", "single": True, "files": {"codex.jsonl": jsonl(rows)}}


def case_bs32_sonnet():
    r = random.Random(4)
    fam = claude_family(r, "77ee", with_grandchild=False, with_short=False, style="offset")
    solo = Session(r, "claude:naive-stamps", 3.0, style="naive")
    for i in range(4):
        solo.round(first_input="user_message" if i == 0 else "tool_result")
    rows = interleave(r, *fam, solo)
    return {"kind": "tracelab", "single": True, "files": {"mixed.jsonl": jsonl(rows)}}


CASES = {
    "tracelab_basic": (case_basic, ["--random-seed", "42"]),
    "tracelab_subagents_gz": (case_subagents_gz, ["--random-seed", "7"]),
    "tracelab_codex_unanchored": (case_codex_and_unanchored, ["--random-seed", "3"]),
    "tracelab_bs32_sonnet": (case_bs32_sonnet, ["--random-seed", "5", "--isl-block-size", "32",
                                                 "--prompt-corpus", "sonnet"]),
    # The codex input again, its type detected (AIPerf's CLI refuses --max-context-length with an
    # explicit non-weka type, but passes it through for a detected file, and the tracelab loader
    # applies it: the codex parent's peak context is over 2000, so it and its children go), with
    # the Weka delay cap and osl cap.
    "tracelab_selection_caps": (lambda: dict(case_codex_and_unanchored(), kind=None), ["--random-seed", "3", "--max-context-length", "2000",
                                                            "--synthesis-max-osl", "200",
                                                            "--inter-turn-delay-cap-seconds", "1.5"]),
}


def main(tokp, out):
    res = {"aiperf_version": "0.13.0", "tokenizer": "qwen3 (shared/data/tokenizers/qwen3)",
           "how": "aiperf profile --input-file PATH --custom-dataset-type tracelab + argv; "
                  "CustomDatasetComposer.create_dataset(); per conversation the fields below "
                  "(tools/make_tracelab_vectors.py)",
           "cases": {}}
    for name, (make, extra) in CASES.items():
        case = make()
        convs, dt = A.run_case(tokp, case, extra, os.path.join(tempfile.gettempdir(), f"tracelab_{name}"))
        conv_out = []
        for c in convs:
            d = c.model_dump(mode="json", exclude_none=True)
            rec = {"session_id": c.session_id}
            rec.update({k: d[k] for k in A.KEEP_CONV if k in d and d[k] not in ([], None)})
            rec["turns"] = [A.turn_record(t, True) for t in c.turns]
            conv_out.append(rec)
        res["cases"][name] = {"custom_dataset_type": case["kind"], "argv": extra,
                              "input": {"single_file": True, "files": case["files"]},
                              "aiperf_seconds": round(dt, 3), "conversations": conv_out}
        print(name, len(convs), "conversations", sum(len(c["turns"]) for c in conv_out), "turns",
              round(dt, 2), "s", file=sys.stderr)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
