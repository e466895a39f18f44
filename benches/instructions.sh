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
#   BENCH_KVBUST=/path/to/other/kvbust benches/instructions.sh   # another build
#   (BENCH_FLOOR and BENCH_LOADGEN likewise; the floor reads FLOOR_* knobs from the environment)
# Prints "path Ir/request" lines and keeps each profile (callgrind_annotate FILE) in $WORK.
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
[ -n "${SKIP_BUILD:-}" ] || cargo build --release --locked --quiet --bin kvbust --example loadgen --example floor
KVBUST=${BENCH_KVBUST:-$ROOT/target/release/kvbust}
LOADGEN=${BENCH_LOADGEN:-$ROOT/target/release/examples/loadgen}
FLOOR=${BENCH_FLOOR:-$ROOT/target/release/examples/floor}
P_UP=$BASE

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -f "$WORK/upstream.pid" ] && kill "$(cat "$WORK/upstream.pid")" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT
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
        kvbust-none | kvbust-ftp | kvbust-none-nousage | kvbust-stream | kvbust-stream-nousage)
            target=none
            [ "$path" = kvbust-ftp ] && target=first_turn_prefix
            up=$P_UP body=$WORK/body.json usage=true
            case $path in kvbust-stream*) up=$P_MOCK body=$WORK/stream.json ;; esac
            case $path in *-nousage) usage=false ;; esac
            KVBUST_OBSERVE__REQUEST_USAGE=$usage RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out.%p" \
                "$KVBUST" serve --listen 127.0.0.1:$port --admin-listen 127.0.0.1:$((port + 1)) \
                --upstream "http://127.0.0.1:$up" --cache-bust $target >"$WORK/$path.log" 2>&1 &
            ;;
        floor)
            body=$WORK/body.json
            valgrind --tool=callgrind --callgrind-out-file="$out.%p" \
                "$FLOOR" 127.0.0.1:$port 127.0.0.1:$P_UP >"$WORK/$path.log" 2>&1 &
            ;;
        *) echo "unknown path $path" >&2; exit 2 ;;
    esac
    pid=$!
    PIDS+=("$pid")
    wait_port $port
    url=http://127.0.0.1:$port/v1/chat/completions
    "$LOADGEN" fixed "$url" "$body" "$WARMUP" "$CONNECTIONS" >/dev/null
    callgrind_control -z "$pid" >/dev/null 2>&1
    result=$("$LOADGEN" fixed "$url" "$body" "$REQUESTS" "$CONNECTIONS")
    callgrind_control -d "$pid" >/dev/null 2>&1
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    # The dump after zeroing is part 1 (`FILE.PID.1`); its summary counts only the measured run.
    dump=$(ls "$out.$pid".1 2>/dev/null || ls "$out.$pid"-* | head -1)
    ir=$(awk '/^summary:/ {print $2}' "$dump")
    echo "$path $((ir / REQUESTS)) Ir/request ($REQUESTS requests, $CONNECTIONS connections; $result; profile $dump)"
done
