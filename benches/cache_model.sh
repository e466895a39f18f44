#!/usr/bin/env bash
# The cache model's costs, in one run on this machine (issue 28):
#   1. an agentic replay: 200 Weka traces (tools/agentic_bench.py gen) synthesized by kvbust and
#      sent through it to nginx `return 200`, one connection after the other: the model's thread
#      CPU against kvbust's whole process, and the model's tokens per CPU-second (one core);
#   2. a flood of 220 KB chat bodies at 64 connections with cache_model.max_memory = 64MiB: the
#      queue drops (and counts) what the model cannot take, and the resident memory with the
#      model on stays within the same kvbust's with it off plus max_memory.
#   benches/cache_model.sh                  # builds the release binary, then both parts
#   SKIP_BUILD=1 TRACES=50 benches/cache_model.sh
# Installs nginx from the distribution when missing. Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TRACES=${TRACES:-200}
FLOOD_REQUESTS=${FLOOD_REQUESTS:-4000}
BASE=${PORT_BASE:-18300}
WORK=$(mktemp -d /tmp/kvbust-model.XXXXXX)
if ! command -v nginx >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
fi
[ -n "${SKIP_BUILD:-}" ] || cargo build --profile dist --locked --quiet --bin kvbust --example loadgen
KVBUST=$ROOT/target/dist/kvbust
LOADGEN=$ROOT/target/dist/examples/loadgen
. "$ROOT/benches/lib.sh"
model_cpu() { thread_cpu "$1" kvbust-cache-mo; }
report() { curl -s "http://127.0.0.1:$1/report?wait=60s"; }

P_UP=$BASE
sed -e "s#@DIR@#$WORK#g" -e "s#@PORT@#$P_UP#g" -e "s#@ACCESS_LOG@#off#g" \
    "$ROOT/benches/nginx/upstream.conf" >"$WORK/upstream.conf"
nginx -c "$WORK/upstream.conf" -p "$WORK" -e "$WORK/nginx.log"
wait_port "$P_UP"

# 1. The agentic replay.
python3 tools/agentic_bench.py gen "$WORK/traces" "$TRACES" 40 1 >/dev/null
P_AG=$((BASE + 2))
KVBUST_SYNTH__ROUTES='["/v1/chat/completions"]' \
    KVBUST_SYNTH__DATASET__INPUT_FILE="$WORK/traces" \
    KVBUST_SYNTH__DATASET__CUSTOM_DATASET_TYPE=weka_trace \
    KVBUST_LOG__ACCESS=false RUST_LOG=warn \
    "$KVBUST" serve --listen 127.0.0.1:$P_AG --admin-listen 127.0.0.1:$((P_AG + 1)) \
    --upstream "http://127.0.0.1:$P_UP" --cache-bust first_turn_prefix >"$WORK/agentic.log" 2>&1 &
PIDS+=($!)
AG_PID=$!
wait_port $P_AG
until curl -sf "http://127.0.0.1:$((P_AG + 1))/readyz" >/dev/null; do sleep 0.2; done
TURNS=$(cat "$WORK"/traces/*.json | python3 -c "import json,sys; d=sys.stdin.read(); print(d.count('\"hash_ids\"'))")
echo '{"model":"claude-opus"}' >"$WORK/empty.json"
cpu0=$(proc_cpu $AG_PID)
m0=$(model_cpu $AG_PID)
"$LOADGEN" fixed "http://127.0.0.1:$P_AG/v1/chat/completions" "$WORK/empty.json" "$TURNS" 1 >"$WORK/agentic.json"
R=$(report $((P_AG + 1)))
cpu1=$(proc_cpu $AG_PID)
m1=$(model_cpu $AG_PID)
AG_RSS=$(rss_kb $AG_PID)

# 2. The flood: one 220 KB body, 64 connections, model on (64 MiB) and off.
python3 - "$WORK/big.json" <<'PY'
import json, random, sys
r = random.Random(7)
words = "the quick brown fox jumps over a lazy dog while seven bold wizards quietly judge boxing".split()
text = " ".join(r.choice(words) for _ in range(40000))[:220_000]
json.dump({"model": "bench", "messages": [{"role": "system", "content": "You are terse."},
          {"role": "user", "content": text}], "max_tokens": 8}, open(sys.argv[1], "w"))
PY
flood() { # port enabled -> "rss_before hwm_after requests/s unaccounted accounted memory_gauge"
    local port=$1 pid
    KVBUST_CACHE_MODEL__ENABLED=$2 KVBUST_CACHE_MODEL__MAX_MEMORY=64MiB KVBUST_LOG__ACCESS=false \
        KVBUST_CACHE_MODEL__TOKENIZER=qwen3 RUST_LOG=warn \
        "$KVBUST" serve --listen 127.0.0.1:"$port" --admin-listen 127.0.0.1:$((port + 1)) \
        --upstream "http://127.0.0.1:$P_UP" >"$WORK/flood-$port.log" 2>&1 &
    pid=$!
    PIDS+=($pid)
    wait_port "$port"
    local before out rps
    before=$(rss_kb $pid)
    out=$("$LOADGEN" fixed "http://127.0.0.1:$port/v1/chat/completions" "$WORK/big.json" "$FLOOD_REQUESTS" 64)
    rps=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(f\"{d['requests']/d['seconds']:.0f}\")" "$out")
    report $((port + 1)) >"$WORK/flood-$port.report.json"
    echo "$before $(hwm_kb $pid) $rps $(metric $((port + 1)) 'kvbust_cache_model_unaccounted_total{reason="queue_full"}') $(python3 -c "import json; print(sum(r['accounted_requests'] for r in json.load(open('$WORK/flood-$port.report.json'))['rows']))") $(metric $((port + 1)) kvbust_cache_model_memory_bytes)"
    kill $pid
}
read -r ON_RSS0 ON_HWM ON_RPS ON_DROP ON_ACC ON_MEM < <(flood $((BASE + 4)) true)
read -r OFF_RSS0 OFF_HWM OFF_RPS _ _ _ < <(flood $((BASE + 6)) false)

{
echo "## kvbust cache model benchmark — $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "Machine: $(nproc) cores, $(awk -F: '/model name/ {print $2; exit}' /proc/cpuinfo | sed 's/^ //'). kvbust $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty'). Upstream: nginx \`return 200\`."
echo
echo "### Agentic replay ($TRACES Weka traces, $TURNS requests, one connection, first_turn_prefix, Qwen3)"
echo
python3 - "$R" "$cpu0" "$cpu1" "$m0" "$m1" "$WORK/agentic.json" "$AG_RSS" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); c0, c1, m0, m1 = map(float, sys.argv[2:6])
run = json.load(open(sys.argv[6]))
rows = r["rows"]
req = sum(x["requests"] for x in rows); acc = sum(x["accounted_requests"] for x in rows)
tok = sum(x["prompt_tokens"]["predicted"] for x in rows)
cached = sum(x["cached_tokens"]["predicted"] for x in rows)
cpu, model = c1 - c0, m1 - m0
print("| figure | value |\n|---|---|")
print(f"| requests (accounted) | {req} ({acc}); unaccounted {r['cache_model']['unaccounted']} |")
print(f"| wall time, requests/s | {run['seconds']:.1f} s, {req / run['seconds']:.0f} |")
print(f"| prompt tokens modelled (predicted cached) | {tok} ({cached}, {100 * cached / max(tok, 1):.1f}%) |")
print(f"| kvbust CPU | {cpu:.2f} s |")
print(f"| cache model thread CPU | {model:.2f} s: **{100 * model / max(cpu, 1e-9):.1f}%** of kvbust's |")
print(f"| model throughput | **{tok / max(model, 1e-9) / 1e6:.2f} M tokens per CPU-second** ({tok / max(acc, 1):.0f} tokens an accounted request; the thread's CPU includes loading the tokenizer) |")
print(f"| kvbust RSS after | {int(sys.argv[7]) // 1024} MiB; model memory gauge in the report: {r['cache_model']['indexed_blocks']} blocks indexed |")
PY
echo
echo "### 220 KB-body flood ($FLOOD_REQUESTS requests, 64 connections, cache_model.max_memory = 64MiB)"
echo
echo "| model | requests/s | RSS at start | peak RSS (VmHWM) | dropped (queue_full) | accounted | model memory gauge at end |"
echo "|---|---|---|---|---|---|---|"
echo "| on | $ON_RPS | $((ON_RSS0 / 1024)) MiB | $((ON_HWM / 1024)) MiB | $ON_DROP | $ON_ACC | $(python3 -c "print(f'{int(float(\"$ON_MEM\"))/2**20:.1f} MiB')") |"
echo "| off | $OFF_RPS | $((OFF_RSS0 / 1024)) MiB | $((OFF_HWM / 1024)) MiB | — | — | — |"
echo
echo "Peak RSS with the model on exceeds the same kvbust's with it off by $(( (ON_HWM - OFF_HWM) / 1024 )) MiB (max_memory 64 MiB)."
} | tee "$WORK/results.md"
echo "results: $WORK/results.md" >&2
