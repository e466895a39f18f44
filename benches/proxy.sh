#!/usr/bin/env bash
# One-command benchmark of the proxy path: direct vs nginx vs the floor (benches/floor.rs: the
# least proxy hyper and tokio make) vs kvbust (targets `none` and `first_turn_prefix`), in one run
# on this machine. Prints Markdown tables with ratios; every gap to nginx is split in two: floor vs
# nginx (what hyper and the runtime cost) and kvbust vs floor (what kvbust adds).
#   benches/proxy.sh                 # full run (about 13 minutes)
#   DURATION=5 benches/proxy.sh      # shorter runs
#   SECTIONS="nonstream" benches/proxy.sh   # only some of: nonstream stream overhead memory large agentic features
# large: 16 KiB, 227 KiB and 1 MiB chat bodies at c=20 and c=150 (wrk -t2) through direct, nginx
# (proxy_request_buffering off), the floor and kvbust none / first_turn_prefix / system_suffix.
# agentic: 227 KiB bodies shaped as an agent's later turns (short first user turn), marked with and
# without a session header (marked as they flow, or collected).
# features: the cache model and capture on and off (1 KB bodies at c=64; 227 KiB at c=20 with the
# model's tokens per CPU-second and queue drops).
# Installs nginx and wrk from the distribution when missing. Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DURATION=${DURATION:-10}
LARGE_SIZES=${LARGE_SIZES:-16384 232448 1048576}
STREAM_SECONDS=${STREAM_SECONDS:-10}
HOLD_STREAMS=${HOLD_STREAMS:-10000}
BASE=${PORT_BASE:-18100}
WORK=$(mktemp -d /tmp/kvbust-bench.XXXXXX)
OUT=${OUT:-$WORK/results.md}
SECTIONS=${SECTIONS:-nonstream stream overhead memory large agentic features}
has() { [[ " $SECTIONS " == *" $1 "* ]]; }

need() { command -v "$1" >/dev/null 2>&1; }
if ! need nginx || ! need wrk; then
    echo "installing nginx and wrk from the distribution" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light wrk >/dev/null
fi
# Each held stream costs kvbust a client socket (and an upstream one over HTTP/1.1): raise the
# soft limit as far as the hard one allows.
ulimit -n "$(ulimit -Hn)"
# The script calls python3 for its arithmetic hundreds of times: call the interpreter itself, not
# a version manager's shim in front of it (pyenv's adds about 0.2 s a call).
PYTHON=$(python3 -c 'import sys; print(sys.executable)')
python3() { "$PYTHON" "$@"; }

[ -n "${SKIP_BUILD:-}" ] || cargo build --profile dist --locked --quiet --bin kvbust --example loadgen --example floor
# BENCH_KVBUST: compare another build (e.g. an older release) with the same harness
# (BENCH_FLOOR, BENCH_LOADGEN likewise).
KVBUST=${BENCH_KVBUST:-$ROOT/target/dist/kvbust}
LOADGEN=${BENCH_LOADGEN:-$ROOT/target/dist/examples/loadgen}
FLOOR=${BENCH_FLOOR:-$ROOT/target/dist/examples/floor}

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
P_NGINX_STREAM=$((BASE + 24))    # nginx proxy, proxy_request_buffering off -> upstream
P_KV_SS=$((BASE + 26))           # kvbust system_suffix -> upstream

. "$ROOT/benches/lib.sh"

# NGINX_ACCESS_LOG=1: the proxying nginx writes an access log to a file, buffered as kvbust's
# is, to compare like with like with kvbust's log.access (on unless KVBUST_LOG__ACCESS=false).
if [ -n "${NGINX_ACCESS_LOG:-}" ]; then
    NGINX_ACCESS="@DIR@/access-@PORT@.log combined buffer=64k flush=1s"
    NGINX_ACCESS_DESC="on (a file, buffer=64k)"
else
    NGINX_ACCESS=off
    NGINX_ACCESS_DESC=off
fi
nginx_conf() { # template port upstream [directives for proxy.conf's location block]
    sed -e "s#@ACCESS_LOG@#$NGINX_ACCESS#g" -e "s#@DIR@#$WORK#g" -e "s#@PORT@#$2#g" -e "s#@UPSTREAM@#${3:-0}#g" \
        -e "s#\# @LOCATION_EXTRA@#${4:-}#" "$ROOT/benches/nginx/$1.conf" >"$WORK/$1-$2.conf"
    nginx -c "$WORK/$1-$2.conf" -p "$WORK" -e "$WORK/nginx-$2.log"
}
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
# For large bodies nginx streams the request body upstream as it arrives, as kvbust's floor does;
# the other sections keep nginx's default (the body read whole first, past 16 KB into a file).
nginx_conf proxy "$P_NGINX_STREAM" "$P_UP" "proxy_request_buffering off;"
kvbust "$P_KV_NONE" $((P_KV_NONE + 1)) "$P_UP" none
kvbust "$P_KV_FTP" $((P_KV_FTP + 1)) "$P_UP" first_turn_prefix
kvbust "$P_KV_SS" $((P_KV_SS + 1)) "$P_UP" system_suffix
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
for p in $P_UP $P_NGINX $P_NGINX_MOCK $P_NGINX_STREAM; do wait_port "$p"; done
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

# wrk_cell threads connections lua-script port: one wrk cell on $BODY_FILE, as
# "req/s p50-µs p99-µs non-2xx socket-errors requests".
wrk_cell() {
    local out
    out=$(wrk -t"$1" -c"$2" -d"${DURATION}s" --latency -s "$ROOT/benches/nginx/$3" \
        "http://127.0.0.1:$4/v1/chat/completions")
    local rps p50 p99 non2xx sock n
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    p50=$(awk '$1=="50%" {print $2}' <<<"$out")
    p99=$(awk '$1=="99%" {print $2}' <<<"$out")
    non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
    sock=$(awk -F'[ ,]+' '/Socket errors/ {print $5 + $7 + $9 + $11}' <<<"$out")
    n=$(awk '/requests in/ {print $1}' <<<"$out")
    echo "$(fmt "$rps" .0f) $(to_us "$p50") $(to_us "$p99") ${non2xx:-0} ${sock:-0} $n"
}
# The cache model's and capture's counters of the kvbust on data port $1 (admin port $1 + 1),
# once the model has caught up with the requests sent: "tokens-modelled accounted queue-drops
# capture-rows model-thread-cpu-s process-cpu-s" (tokens: the report's predicted prompt tokens).
model_counters() {
    local admin=$(($1 + 1)) pid
    pid=$(cat "$WORK/kvbust-$1.kpid")
    curl -s "http://127.0.0.1:$admin/report?wait=60s" >"$WORK/report-$1.json"
    # The report waits for open requests; the model may still be working through its queue: wait
    # (up to 5 minutes) until nothing is queued and its thread's CPU stands still.
    local t a b q
    for t in $(seq 1 600); do
        q=$(metric "$admin" kvbust_cache_model_queue_bytes)
        a=$(thread_cpu "$pid" kvbust-cache-mo)
        sleep 0.5
        b=$(thread_cpu "$pid" kvbust-cache-mo)
        [ "${q:-0}" = 0 ] && [ "$a" = "$b" ] && break
    done
    curl -s "http://127.0.0.1:$admin/report" >"$WORK/report-$1.json"
    python3 - "$WORK/report-$1.json" \
        "$(metric "$admin" 'kvbust_cache_model_unaccounted_total{reason="queue_full"}')" \
        "$(metric "$admin" kvbust_capture_rows_total)" \
        "$(thread_cpu "$pid" kvbust-cache-mo)" "$(proc_cpu "$pid")" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except (ValueError, KeyError):
    rows = []  # the model is off: no report rows
tok = sum(r["prompt_tokens"]["predicted"] for r in rows)
acc = sum(r["accounted_requests"] for r in rows)
num = lambda v: float(v) if v else 0.0
print(tok, acc, num(sys.argv[2]), num(sys.argv[3]), num(sys.argv[4]), num(sys.argv[5]))
PY
}
fmt() { python3 -c "import sys; print(format(float(sys.argv[1]), sys.argv[2]))" "$1" "$2"; }
# A large-body cell: wrk on port $2 with $1 connections and script $3; fills the arrays below
# under key $4. CPU is the serving process's (kvbust: after its cache model caught up, so the
# model's work for these requests counts; its thread's share also in MCPU).
declare -A LRPS LP50 LP99 LERR LCPU LMCPU LREQ LTOK LACC LDROP LROWS
large_cell() { # connections port script key threads
    local c=$1 p=$2 script=$3 key=$4 pid t0 t1 r a b e s n m0 m1
    pid=$(port_pid "$p")
    if [ -f "$WORK/kvbust-$p.kpid" ]; then read -r -a m0 < <(model_counters "$p"); fi
    t0=$(cpu_ticks "$pid")
    read -r r a b e s n < <(BODY_FILE=$BIG_BODY wrk_cell "${5:-2}" "$c" "$script" "$p")
    if [ -f "$WORK/kvbust-$p.kpid" ]; then read -r -a m1 < <(model_counters "$p"); fi
    t1=$(cpu_ticks "$pid")
    LRPS[$key]=$r LP50[$key]=$a LP99[$key]=$b LERR[$key]="$e/$s" LREQ[$key]=$n
    LCPU[$key]=$(python3 -c "import sys; t,tk,n=map(float,sys.argv[1:]); print(f'{t/tk*1e6/n:.0f}')" $((t1 - t0)) "$TICK" "$n")
    LMCPU[$key]="" LTOK[$key]="" LACC[$key]="" LDROP[$key]="" LROWS[$key]=""
    if [ -n "${m0:-}" ]; then
        read -r "LTOK[$key]" "LACC[$key]" "LDROP[$key]" "LROWS[$key]" "LMCPU[$key]" < <(python3 -c "
import sys
a, b = [list(map(float, x.split())) for x in sys.argv[1:3]]
d = [y - x for x, y in zip(a, b)]
print(f'{d[0]:.0f} {d[1]:.0f} {d[2]:.0f} {d[3]:.0f} {d[4]:.2f}')" "${m0[*]}" "${m1[*]}")
    fi
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
# Large bodies (benches/chat_body.py: a system message and one long agentic user turn).
body_file() { # size [--seq | --agentic] -> path
    local f=$WORK/body-$1${2:-}.json
    [ -f "$f" ] || python3 "$ROOT/benches/chat_body.py" "$1" "$f" ${2:+"$2"}
    echo "$f"
}
if has large; then
LARGE_PATHS="direct:$P_UP nginx:$P_NGINX_STREAM floor:$P_FLOOR kvbust-none:$P_KV_NONE kvbust-ftp:$P_KV_FTP kvbust-ss:$P_KV_SS"
for size in $LARGE_SIZES; do
    BIG_BODY=$(body_file "$size")
    echo "warming up ($size B)" >&2
    for name in $LARGE_PATHS; do
        BODY_FILE=$BIG_BODY wrk -t2 -c20 -d1s -s "$ROOT/benches/nginx/chat.lua" \
            "http://127.0.0.1:${name##*:}/v1/chat/completions" >/dev/null
    done
    for name in $LARGE_PATHS; do
        for c in 20 150; do
            echo "large $size B ${name%%:*} c=$c" >&2
            large_cell "$c" "${name##*:}" chat.lua "$size,${name%%:*},$c"
        done
    done
done
fi
# Agentic bodies (chat_body.py --agentic: system, a one-sentence first user turn, then the long
# context as an assistant turn). With a session header (SESSION, sent by chat.lua as
# x-correlation-id) kvbust marks them as they flow (cache_bust.mark_in_flight); without one the
# default session sources need the whole body.
if has agentic; then
AGENTIC_SIZES=${AGENTIC_SIZES:-232448}
AGENTIC_PATHS="nginx:$P_NGINX_STREAM: kvbust-none:$P_KV_NONE: kvbust-ftp:$P_KV_FTP: kvbust-ftp-session:$P_KV_FTP:bench kvbust-ss-session:$P_KV_SS:bench"
for size in $AGENTIC_SIZES; do
    BIG_BODY=$(body_file "$size" --agentic)
    for cell in $AGENTIC_PATHS; do
        IFS=: read -r n p session <<<"$cell"
        SESSION=$session BODY_FILE=$BIG_BODY wrk -t2 -c20 -d1s -s "$ROOT/benches/nginx/chat.lua" \
            "http://127.0.0.1:$p/v1/chat/completions" >/dev/null
        for c in 20 150; do
            echo "agentic $size B $n c=$c" >&2
            if [ -n "$session" ]; then
                SESSION=$session large_cell "$c" "$p" chat.lua "agentic,$size,$n,$c"
            else
                large_cell "$c" "$p" chat.lua "agentic,$size,$n,$c"
            fi
        done
    done
done
fi
if has features; then
# 1 KB bodies at c=64 (wrk -t1, as the non-streaming section).
FEAT_SMALL="nginx:$P_NGINX kvbust-none:$P_KV_NONE kvbust-none-nomodel:$P_KV_NOMODEL kvbust-none-capture:$P_KV_CAPTURE"
BIG_BODY=$WORK/body.json
for name in $FEAT_SMALL; do
    wrk -t1 -c64 -d2s -s "$ROOT/benches/nginx/chat.lua" "http://127.0.0.1:${name##*:}/v1/chat/completions" >/dev/null
    echo "features 1 KB ${name%%:*} c=64" >&2
    large_cell 64 "${name##*:}" chat.lua "small,${name%%:*}" 1
done
# 227 KiB at c=20: the same body every request (the model finds its messages remembered after
# the first), and a fresh user turn every request (chat_fresh.lua: every body tokenized whole).
FEAT_BIG="nginx:$P_NGINX_STREAM:chat.lua kvbust-none:$P_KV_NONE:chat.lua kvbust-none-fresh:$P_KV_NONE:chat_fresh.lua kvbust-none-nomodel:$P_KV_NOMODEL:chat.lua kvbust-none-capture:$P_KV_CAPTURE:chat.lua kvbust-none-capture-fresh:$P_KV_CAPTURE:chat_fresh.lua"
for cell in $FEAT_BIG; do
    IFS=: read -r n p script <<<"$cell"
    BIG_BODY=$(body_file 232448)
    [ "$script" = chat_fresh.lua ] && BIG_BODY=$(body_file 232448 --seq)
    BODY_FILE=$BIG_BODY wrk -t2 -c20 -d1s -s "$ROOT/benches/nginx/$script" \
        "http://127.0.0.1:$p/v1/chat/completions" >/dev/null
    echo "features 227 KiB $n c=20" >&2
    large_cell 20 "$p" "$script" "big,$n"
done
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
# A large-body cell's columns: req/s, the ratio to nginx's cell, p50 and p99 (ms), CPU µs per
# request (kvbust's model thread's share in brackets).
cell_cols() { # key nginx-key
    local k=$1 cpu=${LCPU[$1]}
    if [ -n "${LMCPU[$k]}" ]; then
        cpu="$cpu ($(python3 -c "print(f'{${LMCPU[$k]}*1e6/${LREQ[$k]}:.0f}')"))"
    fi
    echo " | ${LRPS[$k]} | $(ratio "${LRPS[$k]}" "${LRPS[$2]}") | $(fmt "$(python3 -c "print(${LP50[$k]}/1000)")" .2f) | $(fmt "$(python3 -c "print(${LP99[$k]}/1000)")" .1f) | $cpu"
}
if has large; then
echo
echo "### Large bodies (wrk -t2, ${DURATION}s per cell; nginx with \`proxy_request_buffering off\`)"
echo
echo "CPU µs/req: the serving process's user+system CPU over the cell (for kvbust, until its cache model has caught up; in brackets its model thread's share), divided by the requests served; \"direct\" is the upstream nginx's own. GB/s per core: body bytes received per CPU-second of that process. Errors: non-2xx / socket errors."
for size in $LARGE_SIZES; do
    echo
    echo "#### $size B ($(fmt "$(python3 -c "print($size/1024)")" .0f) KiB) chat body"
    echo
    echo "| path | c=20 req/s | vs nginx | p50 (ms) | p99 (ms) | CPU µs/req | GB/s per core | c=150 req/s | vs nginx | p50 (ms) | p99 (ms) | CPU µs/req | GB/s per core | errors c=20, c=150 |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for name in $LARGE_PATHS; do
        n=${name%%:*}
        row="| $n"
        for c in 20 150; do
            k=$size,$n,$c
            row="$row$(cell_cols "$k" "$size,nginx,$c") | $(python3 -c "c=float('${LCPU[$k]}'); print(f'{$size/c/1e3:.2f}' if c else 'n/a')")"
        done
        echo "$row | ${LERR[$size,$n,20]}, ${LERR[$size,$n,150]} |"
    done
done
fi
if has agentic; then
echo
echo "### Agentic bodies (wrk -t2, ${DURATION}s per cell; nginx with \`proxy_request_buffering off\`)"
echo
echo "System, a one-sentence first user turn, the long context as an assistant turn (\`chat_body.py --agentic\`). \"-session\": every request carries \`x-correlation-id: bench\`, so kvbust marks the body as it flows; without it the default session sources need the whole body. Columns as in the large-body tables."
for size in $AGENTIC_SIZES; do
    echo
    echo "#### $size B agentic chat body"
    echo
    echo "| path | c=20 req/s | vs nginx | p50 (ms) | p99 (ms) | CPU µs/req | c=150 req/s | vs nginx | p50 (ms) | p99 (ms) | CPU µs/req | errors c=20, c=150 |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    for cell in $AGENTIC_PATHS; do
        n=${cell%%:*}
        row="| $n"
        for c in 20 150; do
            row="$row$(cell_cols "agentic,$size,$n,$c" "agentic,$size,nginx,$c")"
        done
        echo "$row | ${LERR[agentic,$size,$n,20]}, ${LERR[agentic,$size,$n,150]} |"
    done
done
fi
if has features; then
echo
echo "### The cache model and capture, on and off (target \`none\`)"
echo
echo "1 KB chat body, c=64, wrk -t1, ${DURATION}s per cell. \"model µs/req\": the cache model thread's CPU per request; drops: \`kvbust_cache_model_unaccounted_total{reason=\"queue_full\"}\` over the cell."
echo
echo "| row | req/s | vs nginx | vs \`none\` (defaults) | p50 (µs) | added p50 vs \`none\` (µs) | p99 (µs) | CPU µs/req | model µs/req | queue drops / requests | capture rows |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for name in $FEAT_SMALL; do
    n=${name%%:*}; k=small,$n
    mcpu=—; [ -n "${LMCPU[$k]}" ] && mcpu=$(python3 -c "print(f'{${LMCPU[$k]}*1e6/${LREQ[$k]}:.1f}')")
    drops=—; [ -n "${LDROP[$k]}" ] && drops="${LDROP[$k]} / ${LREQ[$k]}"
    echo "| $n | ${LRPS[$k]} | $(ratio "${LRPS[$k]}" "${LRPS[small,nginx]}") | $(ratio "${LRPS[$k]}" "${LRPS[small,kvbust-none]}") | ${LP50[$k]} | $(signed "${LP50[$k]}" "${LP50[small,kvbust-none]}") | ${LP99[$k]} | ${LCPU[$k]} | $mcpu | $drops | ${LROWS[$k]:-—} |"
done
echo
echo "227 KiB chat body (232,448 B), c=20, wrk -t2. \"fresh\": the user turn differs on every request (\`benches/nginx/chat_fresh.lua\`), so the model tokenizes every body whole; otherwise the same body every request and the model finds its messages remembered. Tokens: the prompt tokens the model counted (\`GET /report\`), per CPU-second of its thread."
echo
echo "| row | req/s | vs nginx | p50 (ms) | p99 (ms) | CPU µs/req | model thread CPU s | tokens counted | M tokens per model CPU-s | accounted / requests | queue drops | capture rows |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for cell in $FEAT_BIG; do
    n=${cell%%:*}; k=big,$n
    if [ -n "${LMCPU[$k]}" ] && [ "${LACC[$k]}" != 0 ]; then
        model=$(python3 -c "m,t=${LMCPU[$k]},${LTOK[$k]}; print(f'{m:.2f} | {t:.0f} | {t/m/1e6 if m else 0:.2f}')")
        acc="${LACC[$k]} / ${LREQ[$k]} | ${LDROP[$k]} | ${LROWS[$k]}"
    else
        model="— | — | —"; acc="— | — | —"
    fi
    echo "| $n | ${LRPS[$k]} | $(ratio "${LRPS[$k]}" "${LRPS[big,nginx]}") | $(fmt "$(python3 -c "print(${LP50[$k]}/1000)")" .2f) | $(fmt "$(python3 -c "print(${LP99[$k]}/1000)")" .1f) | ${LCPU[$k]} | $model | $acc |"
done
fi
} | tee "$OUT"
echo "results: $OUT" >&2
