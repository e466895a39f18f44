#!/usr/bin/env bash
# Instructions per request on the proxy path, counted by valgrind (callgrind): a figure that does
# not depend on what else the machine runs, for comparing builds of kvbust and the floor
# (benches/floor.rs) while the cores are busy. Each proxy runs under callgrind in front of the
# nginx `return 200` upstream; `loadgen fixed` sends WARMUP requests, the counters are zeroed,
# then REQUESTS more are sent (the 1 KB chat POST of benches/proxy.sh) and counted.
#   benches/instructions.sh                       # kvbust-none kvbust-ftp floor
#   PATHS="kvbust-none" REQUESTS=5000 benches/instructions.sh
#   PATHS="kvbust-none kvbust-none-nousage kvbust-stream kvbust-stream-nousage" benches/instructions.sh
#       observe.request_usage on (the default) and off (`-nousage`): the 1 KB non-streaming POST,
#       and (`kvbust-stream*`) the same prompt streamed, 16 tokens from the built-in mock (no
#       pacing; its own process, not counted), without `include_usage`, so kvbust asks for it
#       and strips it when on.
#   PATHS="kvbust-none-nomodel kvbust-ftp-nomodel" benches/instructions.sh
#       the same with the cache model off (`cache_model.enabled = false`; `-nomodel` combines
#       with the other suffixes, e.g. `kvbust-none-nousage-nomodel`).
#   BENCH_KVBUST=/path/to/other/kvbust benches/instructions.sh   # another build
#   (BENCH_FLOOR and BENCH_LOADGEN likewise; the floor reads FLOOR_* knobs from the environment)
# Every thread is profiled apart (`--separate-threads=yes`). Prints one line per path:
#   path  request-path  model  total  Ir/request
# `request-path` sums every thread but the cache model's (`kvbust-cache-model`, which tokenizes
# each request off the request path) and capture's writer; `model` is the cache model's thread;
# `total` is all threads, what one callgrind run without the split counts. Each thread's profile
# is kept in $WORK (callgrind_annotate --inclusive=yes FILE).
# Knobs: REQUESTS (2000), WARMUP (200), CONNECTIONS (1), PATHS, PORT_BASE (18300).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REQUESTS=${REQUESTS:-2000}
WARMUP=${WARMUP:-200}
CONNECTIONS=${CONNECTIONS:-1}
PATHS=${PATHS:-kvbust-none kvbust-ftp floor}
BASE=${PORT_BASE:-18300}
WORK=${WORK:-$(mktemp -d /tmp/kvbust-instr.XXXXXX)}
mkdir -p "$WORK"
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
command -v nginx >/dev/null || { echo "needs nginx (benches/proxy.sh installs it)" >&2; exit 1; }
[ -n "${SKIP_BUILD:-}" ] || cargo build --profile dist --locked --quiet --bin kvbust --example loadgen --example floor
KVBUST=${BENCH_KVBUST:-$ROOT/target/dist/kvbust}
LOADGEN=${BENCH_LOADGEN:-$ROOT/target/dist/examples/loadgen}
FLOOR=${BENCH_FLOOR:-$ROOT/target/dist/examples/floor}
P_UP=$BASE

. "$ROOT/benches/lib.sh"

sed -e "s#@DIR@#$WORK#g" -e "s#@PORT@#$P_UP#g" "$ROOT/benches/nginx/upstream.conf" >"$WORK/upstream.conf"
nginx -c "$WORK/upstream.conf" -p "$WORK" -e "$WORK/upstream.log"
wait_port "$P_UP"
python3 - "$WORK/body.json" "$WORK/stream.json" <<'PY'
import json, sys
user = ("Summarise the following passage in two sentences. " +
        "Shall I compare thee to a summer's day? Thou art more lovely and more temperate. " * 12)[:900]
body = {"model": "bench", "messages": [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": user}], "max_tokens": 64, "stream": False}
open(sys.argv[1], "w").write(json.dumps(body))
body.update(max_tokens=16, stream=True)
open(sys.argv[2], "w").write(json.dumps(body))
PY
P_MOCK=$((BASE + 1))
case " $PATHS " in
    *" kvbust-stream"*)
        RUST_LOG=warn "$KVBUST" mock --listen 127.0.0.1:$P_MOCK --inter-token 0s --base-delay 0s \
            --prefill-per-token 0s >"$WORK/mock.log" 2>&1 &
        PIDS+=("$!")
        wait_port $P_MOCK
        ;;
esac

i=0
for path in $PATHS; do
    i=$((i + 1))
    port=$((BASE + 2 * i))
    out=$WORK/callgrind.$path
    case $path in
        kvbust-none* | kvbust-ftp* | kvbust-stream*)
            target=none
            case $path in kvbust-ftp*) target=first_turn_prefix ;; esac
            up=$P_UP body=$WORK/body.json usage=true model=true
            case $path in kvbust-stream*) up=$P_MOCK body=$WORK/stream.json ;; esac
            case $path in *-nousage*) usage=false ;; esac
            case $path in *-nomodel) model=false ;; esac
            KVBUST_OBSERVE__REQUEST_USAGE=$usage KVBUST_CACHE_MODEL__ENABLED=$model \
                RUST_LOG=warn,kvbust::cache_model::tokens=info \
                valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out.%p" \
                "$KVBUST" serve --listen 127.0.0.1:$port --admin-listen 127.0.0.1:$((port + 1)) \
                --upstream "http://127.0.0.1:$up" --cache-bust $target >"$WORK/$path.log" 2>&1 &
            ;;
        floor)
            body=$WORK/body.json
            valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out.%p" \
                "$FLOOR" 127.0.0.1:$port 127.0.0.1:$P_UP >"$WORK/$path.log" 2>&1 &
            ;;
        *) echo "unknown path $path" >&2; exit 2 ;;
    esac
    pid=$!
    PIDS+=("$pid")
    wait_port $port
    url=http://127.0.0.1:$port/v1/chat/completions
    "$LOADGEN" fixed "$url" "$body" "$WARMUP" "$CONNECTIONS" >/dev/null
    # The byte-level encoder is built on a thread of its own after the model starts; under
    # callgrind on a busy machine that can outlast the warm-up, and its build (and the slower
    # `tokenizers` counting meanwhile) would be counted. Measure once the model has chosen.
    if [ "${model:-false}" = true ] && [ "$path" != floor ]; then
        until grep -q "cache model: tokenizing with" "$WORK/$path.log"; do sleep 0.5; done
        "$LOADGEN" fixed "$url" "$body" "$WARMUP" "$CONNECTIONS" >/dev/null
    fi
    callgrind_control -z "$pid" >/dev/null 2>&1
    result=$("$LOADGEN" fixed "$url" "$body" "$REQUESTS" "$CONNECTIONS")
    callgrind_control -d "$pid" >/dev/null 2>&1
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    # The dump after zeroing is part 1 (`FILE.PID.1-TT`, one file per thread TT); its summary
    # counts only the measured run. A thread is the cache model's (or capture's) when its own
    # profile runs that thread's loop.
    all=0 model=0 side=0
    for dump in "$out.$pid".1-*; do
        ir=$(awk '/^summary:/ {print $2}' "$dump")
        all=$((all + ir))
        # Its loop (`Worker::run`) may be inlined away; only that thread tokenizes.
        if grep -qE 'cache_model::worker::Worker::run|cache_model::tokens::encode' "$dump"; then
            model=$((model + ir))
        elif grep -q 'capture::file::Writer::run' "$dump"; then
            side=$((side + ir))
        fi
    done
    req=$((all - model - side))
    printf '%s %d %d %d Ir/request (request path, cache model, total; %d requests, %d connections; %s; profiles %s)\n' \
        "$path" $((req / REQUESTS)) $((model / REQUESTS)) $((all / REQUESTS)) "$REQUESTS" \
        "$CONNECTIONS" "$result" "$out.$pid.1-*"
done
