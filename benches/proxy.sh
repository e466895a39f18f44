#!/usr/bin/env bash
# One-command benchmark of the proxy path: direct vs nginx vs the floor (benches/floor.rs: the
# least proxy hyper and tokio make) vs kvbust (targets `none` and `first_turn_prefix`), in one run
# on this machine. Prints Markdown tables with ratios; every gap to nginx is split in two: floor vs
# nginx (what hyper and the runtime cost) and kvbust vs floor (what kvbust adds).
#   benches/proxy.sh                 # full run (about 4 minutes)
#   DURATION=5 benches/proxy.sh      # shorter runs
#   SECTIONS="nonstream" benches/proxy.sh   # only some of: nonstream stream overhead memory
# Installs nginx and wrk from the distribution when missing. Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DURATION=${DURATION:-10}
STREAM_SECONDS=${STREAM_SECONDS:-10}
HOLD_STREAMS=${HOLD_STREAMS:-10000}
BASE=${PORT_BASE:-18100}
WORK=$(mktemp -d /tmp/kvbust-bench.XXXXXX)
OUT=${OUT:-$WORK/results.md}
SECTIONS=${SECTIONS:-nonstream stream overhead memory}
has() { [[ " $SECTIONS " == *" $1 "* ]]; }

need() { command -v "$1" >/dev/null 2>&1; }
if ! need nginx || ! need wrk; then
    echo "installing nginx and wrk from the distribution" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light wrk >/dev/null
fi
# Each held stream costs kvbust a client socket (and an upstream one over HTTP/1.1): raise the
# soft limit as far as the hard one allows.
ulimit -n "$(ulimit -Hn)"

[ -n "${SKIP_BUILD:-}" ] || cargo build --release --locked --quiet --bin kvbust --example loadgen --example floor
# BENCH_KVBUST: compare another build (e.g. an older release) with the same harness
# (BENCH_FLOOR, BENCH_LOADGEN likewise).
KVBUST=${BENCH_KVBUST:-$ROOT/target/release/kvbust}
LOADGEN=${BENCH_LOADGEN:-$ROOT/target/release/examples/loadgen}
FLOOR=${BENCH_FLOOR:-$ROOT/target/release/examples/floor}

P_UP=$BASE                       # nginx `return 200` upstream
P_NGINX=$((BASE + 1))            # nginx proxy -> upstream
P_KV_NONE=$((BASE + 2))          # kvbust target none -> upstream
P_KV_FTP=$((BASE + 4))           # kvbust first_turn_prefix -> upstream
P_MOCK=$((BASE + 6))             # kvbust mock, streaming
P_NGINX_MOCK=$((BASE + 7))       # nginx proxy -> mock
P_KV_MOCK=$((BASE + 8))          # kvbust -> mock
P_KV_IDLE=$((BASE + 10))         # kvbust -> mock, for the RSS figures
P_FLOOR=$((BASE + 16))           # the floor proxy -> upstream
P_KV_NOMODEL=$((BASE + 18))      # kvbust target none, cache model off -> upstream
P_KV_CAPTURE=$((BASE + 22))      # kvbust target none, capture on -> upstream

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for f in "$WORK"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# NGINX_ACCESS_LOG=1: the proxying nginx writes an access log to a file, buffered as kvbust's
# is, to compare like with like with kvbust's log.access (on unless KVBUST_LOG__ACCESS=false).
if [ -n "${NGINX_ACCESS_LOG:-}" ]; then
    NGINX_ACCESS="@DIR@/access-@PORT@.log combined buffer=64k flush=1s"
    NGINX_ACCESS_DESC="on (a file, buffer=64k)"
else
    NGINX_ACCESS=off
    NGINX_ACCESS_DESC=off
fi
nginx_conf() { # template port upstream
    sed -e "s#@ACCESS_LOG@#$NGINX_ACCESS#g" -e "s#@DIR@#$WORK#g" -e "s#@PORT@#$2#g" -e "s#@UPSTREAM@#${3:-0}#g" \
        "$ROOT/benches/nginx/$1.conf" >"$WORK/$1-$2.conf"
    nginx -c "$WORK/$1-$2.conf" -p "$WORK" -e "$WORK/nginx-$2.log"
}
. "$ROOT/benches/lib.sh"
kvbust() { # data-port admin-port upstream target [extra args]
    local port=$1 admin=$2 up=$3 target=$4
    shift 4
    RUST_LOG=warn "$KVBUST" serve --listen 127.0.0.1:"$port" --admin-listen 127.0.0.1:"$admin" \
        --upstream "http://127.0.0.1:$up" --cache-bust "$target" "$@" >"$WORK/kvbust-$port.log" 2>&1 &
    PIDS+=($!)
    echo $! >"$WORK/kvbust-$port.kpid"
    wait_port "$port"
}
# CPU time (clock ticks, user + system) of a process and its children processes.
cpu_ticks() {
    local total=0 p
    for p in "$1" $(pgrep -P "$1"); do
        total=$((total + $(awk '{print $14 + $15}' /proc/"$p"/stat)))
    done
    echo "$total"
}
TICK=$(getconf CLK_TCK)
# The process that serves a port: kvbust, or the nginx master (its reuseport workers own the
# listening sockets, so step up to their parent).
port_pid() {
    local pid parent
    pid=$(ss -ltnpH "sport = :$1" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    parent=$(ps -o ppid= -p "$pid" | tr -d ' ')
    if [ "$(ps -o comm= -p "$parent")" = nginx ]; then pid=$parent; fi
    echo "$pid"
}

nginx_conf upstream "$P_UP"
nginx_conf proxy "$P_NGINX" "$P_UP"
kvbust "$P_KV_NONE" $((P_KV_NONE + 1)) "$P_UP" none
kvbust "$P_KV_FTP" $((P_KV_FTP + 1)) "$P_UP" first_turn_prefix
# The cache model (on by default) costs a body collection and a queue hand-off per request on
# the request path, and its worker thread's CPU beside it: the same kvbust with it off.
KVBUST_CACHE_MODEL__ENABLED=false kvbust "$P_KV_NOMODEL" $((P_KV_NOMODEL + 1)) "$P_UP" none
# Capture ([capture]) rides on the model's worker: its rows, their ordering and files beside it.
KVBUST_CAPTURE__ENABLED=true KVBUST_CAPTURE__DIR="$WORK/captures" \
    kvbust "$P_KV_CAPTURE" $((P_KV_CAPTURE + 1)) "$P_UP" none
"$FLOOR" 127.0.0.1:"$P_FLOOR" 127.0.0.1:"$P_UP" >"$WORK/floor.log" 2>&1 &
PIDS+=($!)
wait_port "$P_FLOOR"
RUST_LOG=warn "$KVBUST" mock --listen 127.0.0.1:"$P_MOCK" --inter-token 20ms --base-delay 1ms \
    --prefill-per-token 0s >"$WORK/mock.log" 2>&1 &
PIDS+=($!)
wait_port "$P_MOCK"
nginx_conf proxy "$P_NGINX_MOCK" "$P_MOCK"
kvbust "$P_KV_MOCK" $((P_KV_MOCK + 1)) "$P_MOCK" none
for p in $P_UP $P_NGINX $P_NGINX_MOCK; do wait_port "$p"; done
KV_NONE_PID=$(cat "$WORK/kvbust-$P_KV_NONE.kpid")
RSS_IDLE=n/a
# BENCH_BASELINE=/path/to/older/kvbust adds a row for that build (target none), same run.
NONSTREAM_PATHS="direct:$P_UP nginx:$P_NGINX floor:$P_FLOOR kvbust-none:$P_KV_NONE kvbust-none-nomodel:$P_KV_NOMODEL kvbust-none-capture:$P_KV_CAPTURE kvbust-ftp:$P_KV_FTP"
if [ -n "${BENCH_BASELINE:-}" ]; then
    P_BASELINE=$((BASE + 20))
    RUST_LOG=warn "$BENCH_BASELINE" serve --listen 127.0.0.1:$P_BASELINE --admin-listen 127.0.0.1:$((P_BASELINE + 1)) \
        --upstream "http://127.0.0.1:$P_UP" --cache-bust none >"$WORK/baseline.log" 2>&1 &
    PIDS+=($!)
    wait_port $P_BASELINE
    NONSTREAM_PATHS="$NONSTREAM_PATHS baseline-none:$P_BASELINE"
fi
RSS_IDLE_START=$(rss_kb "$KV_NONE_PID")

# The 1 KB chat body every non-streaming request sends.
python3 - "$WORK/body.json" <<'PY'
import json, sys
user = ("Summarise the following passage in two sentences. " +
        "Shall I compare thee to a summer's day? Thou art more lovely and more temperate. " * 12)[:900]
body = {"model": "bench", "messages": [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": user}], "max_tokens": 64, "stream": False}
open(sys.argv[1], "w").write(json.dumps(body))
PY
export BODY_FILE=$WORK/body.json

# wrk figures: req/s and p50 (µs).
wrk_run() { # port connections
    local out
    out=$(wrk -t1 -c"$2" -d"${DURATION}s" --latency -s "$ROOT/benches/nginx/chat.lua" \
        "http://127.0.0.1:$1/v1/chat/completions")
    local rps p50 p99 non2xx
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    p50=$(awk '$1=="50%" {print $2}' <<<"$out")
    p99=$(awk '$1=="99%" {print $2}' <<<"$out")
    non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
    echo "$rps $(to_us "$p50") $(to_us "$p99") ${non2xx:-0}"
}
to_us() { # wrk prints 26.00us / 1.20ms / 1.00s
    awk -v v="$1" 'BEGIN { n=v+0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n*1000; else print n*1000000 }'
}

if has nonstream; then
echo "warming up" >&2
for name in $NONSTREAM_PATHS; do
    p=${name##*:}
    wrk -t1 -c64 -d2s -s "$ROOT/benches/nginx/chat.lua" "http://127.0.0.1:$p/v1/chat/completions" >/dev/null
done

declare -A RPS P50 P99 ERR CPU
for name in $NONSTREAM_PATHS; do
    n=${name%%:*}
    p=${name##*:}
    for c in 1 64; do
        echo "non-streaming $n c=$c" >&2
        pid=$(port_pid "$p")
        t0=$(cpu_ticks "$pid")
        read -r r a b e < <(wrk_run "$p" "$c")
        t1=$(cpu_ticks "$pid")
        RPS[$n,$c]=$r P50[$n,$c]=$a P99[$n,$c]=$b ERR[$n,$c]=$e
        # CPU µs the serving process spent per request (the upstream's own for "direct").
        CPU[$n,$c]=$(python3 -c "import sys; t,tk,r,d=map(float,sys.argv[1:]); print(f'{t/tk*1e6/(r*d):.1f}')" $((t1 - t0)) "$TICK" "$r" "$DURATION")
    done
done
RSS_IDLE=$(rss_kb "$KV_NONE_PID")
fi

declare -A ST
has stream && for name in direct:$P_MOCK nginx:$P_NGINX_MOCK kvbust:$P_KV_MOCK; do
    n=${name%%:*}
    p=${name##*:}
    for c in 1 256; do
        echo "streaming $n c=$c" >&2
        ST[$n,$c]=$("$LOADGEN" stream "http://127.0.0.1:$p/v1/chat/completions" "$c" "$STREAM_SECONDS" 64)
    done
done

declare -A OVH
has overhead && for size in 1024 102400 1048576 10485760; do
    n=200
    [ "$size" -ge 1048576 ] && n=40
    OVH[$size]=$("$LOADGEN" overhead "http://127.0.0.1:$P_KV_FTP/v1/chat/completions" "$size" "$n")
done

if has memory; then
echo "RSS with idle open streams" >&2
RUST_LOG=warn "$KVBUST" mock --listen 127.0.0.1:$((P_KV_IDLE + 2)) --inter-token 600s --base-delay 0s \
    --prefill-per-token 0s >"$WORK/mock-idle.log" 2>&1 &
PIDS+=($!)
wait_port $((P_KV_IDLE + 2))
# hold PORT STREAMS h1|h2: starts a fresh kvbust on PORT, opens STREAMS streams through it, and
# prints "rss-fresh rss-held streams".
hold() {
    local port=$1 n=$2 proto=$3 pid
    kvbust "$port" $((port + 1)) $((P_KV_IDLE + 2)) none
    pid=$(cat "$WORK/kvbust-$port.kpid")
    local fresh held_rss ready held
    fresh=$(rss_kb "$pid")
    coproc HOLD { timeout 300 "$LOADGEN" hold "http://127.0.0.1:$port/v1/chat/completions" "$n" "$proto"; }
    read -r ready held <&"${HOLD[0]}"
    held_rss=$(rss_kb "$pid")
    eval "exec ${HOLD[1]}>&-"
    wait "$HOLD_PID" 2>/dev/null || true
    kill "$pid"
    echo "$fresh $held_rss $held"
}
# Clients over h2c (100 streams a connection), upstream over HTTP/1.1 (a socket per stream).
read -r RSS_FRESH RSS_HELD HELD < <(hold "$P_KV_IDLE" "$HOLD_STREAMS" h2)
# HTTP/1.1 on both sides: two sockets per stream, as many as the fd limit allows.
H1_STREAMS=$(( ($(ulimit -n) - 200) / 2 ))
[ "$H1_STREAMS" -gt "$HOLD_STREAMS" ] && H1_STREAMS=$HOLD_STREAMS
read -r RSS_FRESH1 RSS_HELD1 HELD1 < <(hold $((P_KV_IDLE + 4)) "$H1_STREAMS" h1)
fi
per_stream() { python3 -c "import sys; print(f'{(int(sys.argv[2])-int(sys.argv[1]))/int(sys.argv[3]):.1f}')" "$@"; }

j() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}' if b else 'n/a')" "$1" "$2"; }
added() { python3 -c "import sys; print(f'{float(sys.argv[1])-float(sys.argv[2]):.0f}')" "$1" "$2"; }
signed() { python3 -c "import sys; print(f'{float(sys.argv[1])-float(sys.argv[2]):+.0f}')" "$1" "$2"; }
diff1() { python3 -c "import sys; print(f'{float(sys.argv[1])-float(sys.argv[2]):+.1f}')" "$1" "$2"; }
# target_row what value reference ratio: met when value/reference >= ratio.
target_row() {
    python3 -c "import sys; w,a,b,r=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4]); print(f'| {w} | {a/b:.2f}× ({a:.0f} vs {b:.0f} req/s) | {\"yes\" if a/b>=r else \"no\"} |')" "$@"
}
# p50_row what p50 reference-p50 slack (µs): met when p50 <= reference + slack.
p50_row() {
    python3 -c "import sys; w,a,b,s=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4]); print(f'| {w} | {a:.0f} vs {b:.0f} µs ({a-b:+.0f}) | {\"yes\" if a<=b+s else \"no\"} |')" "$@"
}

{
echo "## kvbust proxy benchmark — $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "Machine: $(nproc) cores, $(awk -F: '/model name/ {print $2; exit}' /proc/cpuinfo | sed 's/^ //'), $(uname -r). kvbust $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty')."
echo "wrk -t1, ${DURATION}s per cell, 1 KB chat POST; upstream nginx \`return 200\` (2 workers); nginx proxy: 2 workers, upstream keepalive, proxy_buffering off, access_log $NGINX_ACCESS_DESC; kvbust log.access ${KVBUST_LOG__ACCESS:-true} (stderr to a file)."
if has nonstream; then
echo
echo "### Non-streaming"
echo
echo "| path | req/s c=64 | vs nginx | vs floor | p50 c=1 (µs) | added p50 c=1 (µs) | p99 c=64 (µs) | CPU µs/req c=1 | CPU µs/req c=64 | non-2xx |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for name in $NONSTREAM_PATHS; do
    n=${name%%:*}
    echo "| $n | ${RPS[$n,64]} | $(ratio "${RPS[$n,64]}" "${RPS[nginx,64]}") | $(ratio "${RPS[$n,64]}" "${RPS[floor,64]}") | ${P50[$n,1]} | $(added "${P50[$n,1]}" "${P50[direct,1]}") | ${P99[$n,64]} | ${CPU[$n,1]} | ${CPU[$n,64]} | $((ERR[$n,1] + ERR[$n,64])) |"
done
echo
echo "### The gap to nginx, split: floor vs nginx (hyper and the runtime), kvbust vs floor (what kvbust adds)"
echo
echo "| path | floor vs nginx: req/s c=64 | CPU µs/req c=64 | added p50 c=1 (µs) | kvbust vs floor: req/s c=64 | CPU µs/req c=64 | added p50 c=1 (µs) |"
echo "|---|---|---|---|---|---|---|"
for name in $NONSTREAM_PATHS; do
    n=${name%%:*}
    case $n in direct | nginx | floor) continue ;; esac
    echo "| $n | $(ratio "${RPS[floor,64]}" "${RPS[nginx,64]}")× | $(diff1 "${CPU[floor,64]}" "${CPU[nginx,64]}") | $(signed "${P50[floor,1]}" "${P50[nginx,1]}") | $(ratio "${RPS[$n,64]}" "${RPS[floor,64]}")× | $(diff1 "${CPU[$n,64]}" "${CPU[floor,64]}") | $(signed "${P50[$n,1]}" "${P50[floor,1]}") |"
done
echo
echo "### Targets (issue 21), this run"
echo
echo "| target | result | met |"
echo "|---|---|---|"
target_row "\`none\` ≥ 0.95× the floor at c=64" "${RPS[kvbust-none,64]}" "${RPS[floor,64]}" 0.95
target_row "\`first_turn_prefix\` ≥ 0.90× the floor at c=64" "${RPS[kvbust-ftp,64]}" "${RPS[floor,64]}" 0.90
p50_row "added p50 at c=1 within 5 µs of the floor's" "${P50[kvbust-none,1]}" "${P50[floor,1]}" 5
target_row "\`none\` ≥ 1.0× nginx at c=64" "${RPS[kvbust-none,64]}" "${RPS[nginx,64]}" 1.0
p50_row "added p50 at c=1 ≤ nginx's" "${P50[kvbust-none,1]}" "${P50[nginx,1]}" 0
fi
if has stream; then
echo
echo "### Streaming (built-in mock, 64 tokens 20 ms apart, ${STREAM_SECONDS}s per cell)"
echo
echo "TTFT: all streams; \"warm\": every stream but each connection's first (which also opens the connection through every hop)."
echo
echo "| path | c | streams | TTFT p50 (ms) | TTFT p99 (ms) | added TTFT p50/p99 (ms) | warm TTFT p50/p99 (ms) | added warm p50/p99 (ms) | gap p50 (ms) | gap p99 (ms) | events/stream min–max | failed |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for c in 1 256; do
    for n in direct nginx kvbust; do
        s=${ST[$n,$c]}
        d=${ST[direct,$c]}
        echo "| $n | $c | $(j "$s" streams) | $(j "$s" ttft_p50_ms) | $(j "$s" ttft_p99_ms) | $(python3 -c "import sys; print(f'{float(sys.argv[1])-float(sys.argv[3]):.2f} / {float(sys.argv[2])-float(sys.argv[4]):.2f}')" "$(j "$s" ttft_p50_ms)" "$(j "$s" ttft_p99_ms)" "$(j "$d" ttft_p50_ms)" "$(j "$d" ttft_p99_ms)") | $(j "$s" ttft_warm_p50_ms) / $(j "$s" ttft_warm_p99_ms) | $(python3 -c "import sys; print(f'{float(sys.argv[1])-float(sys.argv[3]):.2f} / {float(sys.argv[2])-float(sys.argv[4]):.2f}')" "$(j "$s" ttft_warm_p50_ms)" "$(j "$s" ttft_warm_p99_ms)" "$(j "$d" ttft_warm_p50_ms)" "$(j "$d" ttft_warm_p99_ms)") | $(j "$s" gap_p50_ms) | $(j "$s" gap_p99_ms) | $(j "$s" events_min)–$(j "$s" events_max) | $(j "$s" failed) |"
    done
done
fi
if has overhead; then
echo
echo "### Rewrite overhead (\`first_turn_prefix\`, x-kvbust-overhead-us: arrival to sent upstream, includes receiving the body)"
echo
echo "| body | p50 (µs) | p99 (µs) |"
echo "|---|---|---|"
for size in 1024 102400 1048576 10485760; do
    echo "| $size B | $(j "${OVH[$size]}" overhead_p50_us) | $(j "${OVH[$size]}" overhead_p99_us) |"
done
fi
if has memory; then
echo
echo "### Memory (kvbust, VmRSS)"
echo
echo "| state | RSS |"
echo "|---|---|"
echo "| just started | $RSS_FRESH KiB |"
echo "| idle after the non-streaming runs | $RSS_IDLE KiB (at start $RSS_IDLE_START KiB) |"
echo "| $HELD idle open streams (clients h2c, upstream HTTP/1.1) | $RSS_HELD KiB: $(per_stream "$RSS_FRESH" "$RSS_HELD" "$HELD") KiB per stream |"
echo "| $HELD1 idle open streams (HTTP/1.1 both sides) | $RSS_HELD1 KiB: $(per_stream "$RSS_FRESH1" "$RSS_HELD1" "$HELD1") KiB per stream |"
fi
} | tee "$OUT"
echo "results: $OUT" >&2
