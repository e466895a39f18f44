#!/usr/bin/env bash
# Does the cache model keep up (issue 44 item 4)? kvbust `serve` (defaults: the cache model on,
# Qwen3) in front of the built-in mock, `loadgen fixed` at CONC connections, chat bodies of each
# of SIZES bytes with a distinct prompt per request (the request's number at the start of the
# user turn, so no request is served from the model's memo), then `/report?wait=60s`: the share
# of requests the model accounted, its queue drops, and its thread's CPU per request. Two mocks:
# "full speed" (no delays: the proxy's pace alone) and "preset" (config/README.md's shared
# capacity near an 8B model on one H100: prefill 16,000 and decode 4,000 tokens/s, 6 ms between
# tokens, max_num_seqs 64). Both mocks count with the built-in tokenizer, so the mock's own
# tokenizing does not throttle the load. THREADS sets cache_model.threads (1 by default); the
# model's CPU is its thread's plus its prepare threads'.
#   benches/accounting.sh                       # builds the release binary and loadgen
#   SKIP_BUILD=1 REQUESTS=2000 SIZES="1024 102400" CONC=64 MOCKS="fast preset" benches/accounting.sh
#   THREADS=2 SKIP_BUILD=1 MOCKS=fast benches/accounting.sh
#   BENCH_KVBUST=target/dist/kvbust BENCH_LOADGEN=target/dist/examples/loadgen SKIP_BUILD=1 benches/accounting.sh
# Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REQUESTS=${REQUESTS:-4000}
SIZES=${SIZES:-"1024 102400"}
CONC=${CONC:-64}
MOCKS=${MOCKS:-"fast preset"}
THREADS=${THREADS:-1}
BASE=${PORT_BASE:-18400}
WORK=$(mktemp -d /tmp/kvbust-accounting.XXXXXX)
[ -n "${SKIP_BUILD:-}" ] || cargo build --release --locked --quiet --bin kvbust --example loadgen
KVBUST=${BENCH_KVBUST:-$ROOT/target/release/kvbust}
LOADGEN=${BENCH_LOADGEN:-$ROOT/target/release/examples/loadgen}
. "$ROOT/benches/lib.sh"

cat >"$WORK/fast.toml" <<'TOML'
[mock]
tokenizer = "builtin"
base_delay = "0s"
prefill_per_token = "0s"
inter_token = "0s"
default_max_tokens = 16
TOML
cat >"$WORK/preset.toml" <<'TOML'
[mock]
tokenizer = "builtin"
default_max_tokens = 16
prefill_tokens_per_s = 16000
decode_tokens_per_s = 4000
inter_token = "6ms"
max_num_seqs = 64
TOML

echo "| mock | body | threads | requests | req/s | accounted | share | queue_full | model CPU µs/req | kvbust CPU µs/req |"
echo "|---|---|---|---|---|---|---|---|---|---|"
port=$BASE
for mock in $MOCKS; do
    P_MOCK=$port
    "$KVBUST" mock --listen 127.0.0.1:$P_MOCK --config "$WORK/$mock.toml" >"$WORK/mock-$mock.log" 2>&1 &
    PIDS+=($!)
    wait_port $P_MOCK
    port=$((port + 1))
    for size in $SIZES; do
        body "$size"
        P=$port
        port=$((port + 2))
        KVBUST_LOG__ACCESS=false KVBUST_CACHE_MODEL__THREADS=$THREADS RUST_LOG=warn \
            "$KVBUST" serve --listen 127.0.0.1:$P --admin-listen 127.0.0.1:$((P + 1)) \
            --upstream "http://127.0.0.1:$P_MOCK" >"$WORK/serve-$mock-$size.log" 2>&1 &
        pid=$!
        PIDS+=($pid)
        wait_port $P
        until curl -sf "http://127.0.0.1:$((P + 1))/readyz" >/dev/null; do sleep 0.2; done
        cpu0=$(proc_cpu $pid)
        m0=$(threads_cpu $pid kvbust-cache-mo kvbust-model-pr)
        out=$("$LOADGEN" fixed "http://127.0.0.1:$P/v1/chat/completions" "$WORK/body-$size.json" "$REQUESTS" "$CONC")
        curl -s "http://127.0.0.1:$((P + 1))/report?wait=60s" >"$WORK/report-$mock-$size.json"
        drops=$(metric $((P + 1)) 'kvbust_cache_model_unaccounted_total{reason="queue_full"}')
        cpu1=$(proc_cpu $pid)
        m1=$(threads_cpu $pid kvbust-cache-mo kvbust-model-pr)
        python3 - "$mock" "$size" "$out" "$WORK/report-$mock-$size.json" "${drops:-0}" "$cpu0" "$cpu1" "$m0" "$m1" "$THREADS" <<'PY'
import json, sys
mock, size, out, rep, drops = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
c0, c1, m0, m1 = map(float, sys.argv[6:10])
threads = sys.argv[10]
rows = json.load(open(rep))["rows"]
req = sum(x["requests"] for x in rows)
acc = sum(x["accounted_requests"] for x in rows)
n = max(out["requests"], 1)
print(f"| {mock} | {size} B | {threads} | {req} | {out['requests'] / out['seconds']:.0f} | {acc} | **{100 * acc / max(req, 1):.1f}%** "
      f"| {float(drops):.0f} | {1e6 * (m1 - m0) / n:.0f} | {1e6 * (c1 - c0) / n:.0f} |")
PY
        kill $pid
    done
done
echo
echo "Machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg). kvbust $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty'). $REQUESTS requests per row, $CONC connections."
