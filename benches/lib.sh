# Helpers the kvbust bench scripts share (sourced by the benches/*.sh that start processes): waiting for a port, a process's and a thread's CPU seconds, its resident
# memory, and one metric read from an admin port; and the clean-up on exit. A script sets
# WORK before it sources this file, and appends what it starts to PIDS; a daemon that forks
# (nginx) leaves its pid in a file $WORK/*.pid.
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for f in "${WORK:-/nonexistent}"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
wait_port() {
    for _ in $(seq 1 600); do
        (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "port $1 did not open" >&2
    exit 1
}
ticks() { awk '{print $14 + $15}' "$1"; }
TICK=$(getconf CLK_TCK)
# CPU seconds (user + system) of a whole process.
proc_cpu() { python3 -c "print($(ticks /proc/"$1"/stat) / $TICK)"; }
# CPU seconds of the thread of process $1 named $2 (its comm, at most 15 characters); 0 if none.
thread_cpu() {
    local t
    for t in /proc/"$1"/task/*; do
        if [ "$(cat "$t/comm")" = "$2" ]; then
            python3 -c "print($(ticks "$t/stat") / $TICK)"
            return
        fi
    done
    echo 0
}
# CPU seconds of all threads of process $1 whose comm is one of $2... (summed); 0 if none.
threads_cpu() {
    local pid=$1 t comm name total=0
    shift
    for t in /proc/"$pid"/task/*; do
        comm=$(cat "$t/comm" 2>/dev/null) || continue
        for name in "$@"; do
            [ "$comm" = "$name" ] && total="$total + $(ticks "$t/stat")"
        done
    done
    python3 -c "print(($total) / $TICK)"
}
rss_kb() { awk '/VmRSS/ {print $2}' /proc/"$1"/status; }
hwm_kb() { awk '/VmHWM/ {print $2}' /proc/"$1"/status; }
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" 'index($0, m) == 1 {print $2}'; }

# body SIZE: writes $WORK/body-SIZE.json, an agent-like chat body of about SIZE bytes with @SEQ@
# first in the user turn (loadgen fixed numbers each request there: distinct prompts).
body() {
    python3 - "$1" >"$WORK/body-$1.json" <<'PY'
import json, random, sys
size = int(sys.argv[1])
r = random.Random(size)
words = ("the model reads a long context of tool output, code and prose; fn main() { let x = 42; }"
         " naïve café 東京 path/to/file.rs:120 error[E0308]: mismatched types").split()
head = {"model": "bench", "max_tokens": 16, "messages": [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "@SEQ@ "}]}
room = size - len(json.dumps(head, ensure_ascii=False).encode())
text = []
n = 0
while n < room:
    w = r.choice(words)
    text.append(w)
    n += len(w.encode()) + 1
head["messages"][1]["content"] += " ".join(text)[: max(room, 0)]
sys.stdout.write(json.dumps(head, ensure_ascii=False))
PY
}
