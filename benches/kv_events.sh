#!/usr/bin/env bash
# What following an engine's KV events costs kvbust (issue 41): `kvbust serve` (the cache model
# on, Qwen3) in front of the built-in mock publishing vLLM's KV events (`mock.kv_events`, Qwen3
# too, so the events name the model's own blocks; a cache of CACHE_BLOCKS blocks, so each
# request past the first few stores blocks and evicts as many), with `cache_model.kv_events`
# off and then on. `loadgen fixed` sends REQUESTS chat bodies of each of SIZES bytes at CONC
# connections, a distinct prompt per request (the request's number at the start of the user
# turn). Per row: kvbust's CPU seconds per 1,000 requests (the whole process, /proc/PID/stat,
# from before the load to `/report?wait=60s`, so the model's queued work counts), its model
# thread's, the share of requests the model accounted, and with events on what the subscription
# received (batches, blocks stored and removed, lost batches, blocks removed from the model).
#   benches/kv_events.sh                        # builds the release binary and loadgen
#   SKIP_BUILD=1 REQUESTS=2000 SIZES="1024 8192" CONC=8 ROUNDS=1 benches/kv_events.sh
# Binaries from ${CARGO_TARGET_DIR:-target}/release. Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REQUESTS=${REQUESTS:-2000}
SIZES=${SIZES:-"1024 8192"}
CONC=${CONC:-8}
ROUNDS=${ROUNDS:-1}
CACHE_BLOCKS=${CACHE_BLOCKS:-1024}
BASE=${PORT_BASE:-18500}
WORK=$(mktemp -d /tmp/kvbust-kv-events.XXXXXX)
[ -n "${SKIP_BUILD:-}" ] || cargo build --release --locked --quiet --bin kvbust --example loadgen
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
KVBUST=$BIN/kvbust
LOADGEN=$BIN/examples/loadgen
. "$ROOT/benches/lib.sh"

P_MOCK=$BASE
P_EVENTS=$((BASE + 1))
# A paced mock (10 ms a request): the model keeps up, so every request is accounted and the
# CPU per request is the model's whole work, not a share of it.
cat >"$WORK/mock.toml" <<TOML
[mock]
tokenizer = "qwen3"
base_delay = "10ms"
prefill_per_token = "0s"
inter_token = "0s"
default_max_tokens = 16
block_size = 16
cache_blocks = $CACHE_BLOCKS
kv_events = '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:$P_EVENTS"}'
TOML
"$KVBUST" mock --listen 127.0.0.1:$P_MOCK --config "$WORK/mock.toml" >"$WORK/mock.log" 2>&1 &
PIDS+=($!)
wait_port $P_MOCK

echo "| body | kv_events | requests | req/s | accounted | kvbust CPU s / 1,000 req | model thread CPU s / 1,000 req | batches | stored / removed blocks | lost | removed from the model |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
port=$((BASE + 2))
for round in $(seq 1 "$ROUNDS"); do
  for size in $SIZES; do
    body "$size"
    for events in off on; do
        P=$port
        port=$((port + 2))
        follow=()
        [ "$events" = on ] && follow=(env "KVBUST_CACHE_MODEL__KV_EVENTS=tcp://127.0.0.1:$P_EVENTS")
        KVBUST_LOG__ACCESS=false RUST_LOG=warn "${follow[@]}" \
            "$KVBUST" serve --listen 127.0.0.1:$P --admin-listen 127.0.0.1:$((P + 1)) \
            --upstream "http://127.0.0.1:$P_MOCK" >"$WORK/serve-$size-$events-$round.log" 2>&1 &
        pid=$!
        PIDS+=($pid)
        wait_port $P
        until curl -sf "http://127.0.0.1:$((P + 1))/readyz" >/dev/null; do sleep 0.2; done
        # A fresh cache for every row; with events on, resets (each an AllBlocksCleared) until
        # one reaches kvbust: a PUB drops what it sends before the subscription arrives.
        curl -sf -X POST "http://127.0.0.1:$P_MOCK/reset_prefix_cache" >/dev/null
        if [ "$events" = on ]; then
            until curl -s "http://127.0.0.1:$((P + 1))/report" |
                python3 -c 'import json,sys; k=json.load(sys.stdin)["cache_model"].get("kv_events"); sys.exit(0 if k and k["batches"] > 0 else 1)'; do
                curl -sf -X POST "http://127.0.0.1:$P_MOCK/reset_prefix_cache" >/dev/null
                sleep 0.1
            done
        fi
        cpu0=$(proc_cpu $pid)
        m0=$(thread_cpu $pid kvbust-cache-mo)
        out=$("$LOADGEN" fixed "http://127.0.0.1:$P/v1/chat/completions" "$WORK/body-$size.json" "$REQUESTS" "$CONC")
        curl -s "http://127.0.0.1:$((P + 1))/report?wait=60s" >"$WORK/report-$size-$events-$round.json"
        cpu1=$(proc_cpu $pid)
        m1=$(thread_cpu $pid kvbust-cache-mo)
        python3 - "$size" "$events" "$out" "$WORK/report-$size-$events-$round.json" "$cpu0" "$cpu1" "$m0" "$m1" <<'PY'
import json, sys
size, events, out, rep = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), json.load(open(sys.argv[4]))
c0, c1, m0, m1 = map(float, sys.argv[5:9])
rows = rep["rows"]
req = sum(x["requests"] for x in rows)
acc = sum(x["accounted_requests"] for x in rows)
n = max(out["requests"], 1)
k = rep["cache_model"].get("kv_events")
ev = (f"{k['batches']} | {k['stored_blocks']} / {k['removed_blocks']} | {k['lost_batches']} | {k['evicted_in_model']}"
      if k else "— | — | — | —")
print(f"| {size} B | {events} | {req} | {out['requests'] / out['seconds']:.0f} | {acc} ({100 * acc / max(req, 1):.0f}%) "
      f"| **{1000 * (c1 - c0) / n:.3f}** | {1000 * (m1 - m0) / n:.3f} | {ev} |")
PY
        kill $pid
    done
  done
done
echo
echo "Machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg). kvbust $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty'). $REQUESTS requests per row, $CONC connections, the mock's cache $CACHE_BLOCKS blocks of 16 tokens."
