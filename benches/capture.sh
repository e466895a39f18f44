#!/usr/bin/env bash
# Capture's costs, in one run on this machine (issue 30), against nginx `return 200`:
#   1. throughput and CPU per request at 64 connections with small chat bodies: kvbust (target
#      none, cache model on) with capture off and on, beside direct and nginx;
#   2. a long capture: REQUESTS (1M) requests with distinct prompts (a system prompt shared by
#      all, then a numbered question) through kvbust with capture on: resident memory before and
#      after, rows written, files finished, and rows per CPU-second of the capture thread.
#   benches/capture.sh                       # builds the release binary, then both parts
#   SKIP_BUILD=1 REQUESTS=200000 benches/capture.sh
# Installs nginx from the distribution when missing. Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REQUESTS=${REQUESTS:-1000000}
SMALL=${SMALL:-100000}
BASE=${PORT_BASE:-18500}
WORK=$(mktemp -d /tmp/kvbust-capture.XXXXXX)
if ! command -v nginx >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
fi
[ -n "${SKIP_BUILD:-}" ] || cargo build --profile dist --locked --quiet --bin kvbust --example loadgen
KVBUST=$ROOT/target/dist/kvbust
LOADGEN=$ROOT/target/dist/examples/loadgen
. "$ROOT/benches/lib.sh"
rps() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(f\"{d['requests']/d['seconds']:.0f} {d['non_2xx']}\")" "$1"; }

P_UP=$BASE
P_NGINX=$((BASE + 1))
for conf in upstream proxy; do
    port=$P_UP; [ $conf = proxy ] && port=$P_NGINX
    sed -e "s#@DIR@#$WORK#g" -e "s#@PORT@#$port#g" -e "s#@ACCESS_LOG@#off#g" -e "s#@UPSTREAM@#$P_UP#g" \
        "$ROOT/benches/nginx/$conf.conf" >"$WORK/$conf.conf"
    nginx -c "$WORK/$conf.conf" -p "$WORK" -e "$WORK/nginx-$conf.log"
done
wait_port $P_UP
wait_port $P_NGINX
kv() { # port capture(true|false) -> pid
    KVBUST_CAPTURE__ENABLED=$2 KVBUST_CAPTURE__DIR="$WORK/captures-$1" KVBUST_LOG__ACCESS=false \
        KVBUST_CACHE_MODEL__TOKENIZER=qwen3 RUST_LOG=warn \
        "$KVBUST" serve --listen 127.0.0.1:"$1" --admin-listen 127.0.0.1:$(($1 + 1)) \
        --upstream "http://127.0.0.1:$P_UP" --cache-bust none >"$WORK/kv-$1.log" 2>&1 &
    echo $! >"$WORK/kv-$1.pid"
    wait_port "$1"
    until curl -sf "http://127.0.0.1:$(($1 + 1))/readyz" >/dev/null; do sleep 0.1; done
}
SYSTEM=$(python3 -c "print(' '.join(['You review code for a large team and answer in short numbered lists.'] * 12))")
printf '{"model":"bench","messages":[{"role":"system","content":"%s"},{"role":"user","content":"Question @SEQ@: what does this change break, and which test covers it?"}],"max_tokens":8}' "$SYSTEM" >"$WORK/body.json"

# 1. Small bodies, 64 connections.
P_OFF=$((BASE + 2)); P_ON=$((BASE + 4))
kv $P_OFF false
kv $P_ON true
declare -A R C
for cell in direct:$P_UP nginx:$P_NGINX capture-off:$P_OFF capture-on:$P_ON; do
    name=${cell%%:*}; port=${cell##*:}
    pid=""; [ -f "$WORK/kv-$port.pid" ] && pid=$(cat "$WORK/kv-$port.pid")
    c0=0; [ -n "$pid" ] && c0=$(proc_cpu "$pid")
    out=$("$LOADGEN" fixed "http://127.0.0.1:$port/v1/chat/completions" "$WORK/body.json" "$SMALL" 64)
    R[$name]=$(rps "$out")
    C[$name]=n/a
    [ -n "$pid" ] && C[$name]=$(python3 -c "print(f'{($(proc_cpu "$pid") - $c0) / $SMALL * 1e6:.0f}')")
done

# 2. The long capture, and the same run with capture off (the cache model's own memory).
P_LOFF=$((BASE + 8))
kv $P_LOFF false
LOFF_PID=$(cat "$WORK/kv-$P_LOFF.pid")
"$LOADGEN" fixed "http://127.0.0.1:$P_LOFF/v1/chat/completions" "$WORK/body.json" "$REQUESTS" 64 >/dev/null
curl -s "http://127.0.0.1:$((P_LOFF + 1))/report?wait=60s" >/dev/null
RSS_OFF=$(rss_kb $LOFF_PID)
kill $LOFF_PID
P_LONG=$((BASE + 6))
kv $P_LONG true
LONG_PID=$(cat "$WORK/kv-$P_LONG.pid")
RSS0=$(rss_kb $LONG_PID)
t0=$(date +%s.%N)
OUT=$("$LOADGEN" fixed "http://127.0.0.1:$P_LONG/v1/chat/completions" "$WORK/body.json" "$REQUESTS" 64)
curl -s "http://127.0.0.1:$((P_LONG + 1))/report?wait=60s" >/dev/null
RSS1=$(rss_kb $LONG_PID)
ROWS=$(metric $((P_LONG + 1)) kvbust_capture_rows_total)
UNACC=$(metric $((P_LONG + 1)) 'kvbust_capture_dropped_total{reason="unaccounted"}')
FILES_LIVE=$(metric $((P_LONG + 1)) kvbust_capture_files_total)
CAP_CPU=$(thread_cpu $LONG_PID kvbust-capture)
MODEL_CPU=$(thread_cpu $LONG_PID kvbust-cache-mo)
kill -TERM $LONG_PID; while kill -0 $LONG_PID 2>/dev/null; do sleep 0.2; done
BYTES=$(cat "$WORK/captures-$P_LONG"/*.jsonl | wc -c)
NFILES=$(ls "$WORK/captures-$P_LONG"/*.jsonl | wc -l)

echo "## kvbust capture benchmark — $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "Machine: $(nproc) cores, $(awk -F: '/model name/ {print $2; exit}' /proc/cpuinfo | sed 's/^ //'). kvbust $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty'). Upstream: nginx \`return 200\`; Qwen3 tokenizer; body: a 150-token system prompt and a numbered question."
echo
echo "### 1. $SMALL requests, 64 connections"
echo
echo "| path | req/s | vs nginx | non-2xx | kvbust CPU µs/request |"
echo "|---|---|---|---|---|"
NG=${R[nginx]%% *}
for name in direct nginx capture-off capture-on; do
    set -- ${R[$name]}
    echo "| $name | $1 | $(python3 -c "print(f'{$1 / $NG:.2f}x')") | $2 | ${C[$name]} |"
done
echo
echo "### 2. $REQUESTS captured requests"
echo
echo "| figure | value |"
echo "|---|---|"
echo "| requests/s, non-2xx | $(rps "$OUT") |"
echo "| rows written (metric) | $ROWS; left out because the cache model's queue was full: ${UNACC:-0}; files finished while running: $FILES_LIVE, after stop: $NFILES ($BYTES bytes, $(python3 -c "print(f'{$BYTES / max($ROWS, 1):.0f}')") bytes a row) |"
echo "| capture thread CPU | $CAP_CPU s: $(python3 -c "print(f'{$ROWS / max($CAP_CPU, 1e-9):,.0f}')") rows per CPU-second |"
echo "| cache model thread CPU | $MODEL_CPU s |"
echo "| kvbust RSS before, after | $((RSS0 / 1024)) MiB, $((RSS1 / 1024)) MiB (the same run with capture off: $((RSS_OFF / 1024)) MiB after) |"
