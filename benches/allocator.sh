#!/usr/bin/env bash
# Allocator trial (issue 34 item 10): for each kvbust binary given (built with a different
# #[global_allocator]), the mock's memory after a burst (benches/mock_memory.py: 30 chats of
# 100,000 tokens at once, RSS right after and SETTLE s later) and the small-body path's
# throughput (wrk -t1 -c32, a 1 KB chat through `kvbust serve --cache-bust first_turn_prefix` to
# `kvbust mock` with zero pacing and the built-in tokenizer, both processes from that binary).
#
#   benches/allocator.sh glibc=/tmp/kvbust-glibc mimalloc=/tmp/kvbust-mi jemalloc=/tmp/kvbust-je
#   MEMORY=0 DURATION=20 benches/allocator.sh ...     # throughput only (WRK=0: memory only)
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
DURATION=${DURATION:-10}
SETTLE=${SETTLE:-60}
BASE=${PORT_BASE:-18830}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
printf '[mock]\ntokenizer = "builtin"\n' > "$tmp/mock.toml"
python3 -c 'import json; print(json.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "You are terse. " * 30}, {"role": "user", "content": "Hello there, " * 40}]}))' > "$tmp/chat.json"
for spec in "$@"; do
    name=${spec%%=*}
    bin=${spec#*=}
    echo "== $name ($bin)"
    if [ "${MEMORY:-1}" = 1 ]; then
        KVBUST=$bin PORT=$BASE BURST=30 SETTLE=$SETTLE python3 benches/mock_memory.py |
            grep -E "^(start|burst|RSS)" | sed -E 's/statuses \[[0-9, ]*\]/statuses ok/'
    fi
    [ "${WRK:-1}" = 1 ] || continue
    "$bin" mock --config "$tmp/mock.toml" --listen 127.0.0.1:$((BASE + 1)) --inter-token 0ms \
        --base-delay 0ms --prefill-per-token 0us >/dev/null 2>&1 &
    mock=$!
    RUST_LOG=warn "$bin" serve --listen 127.0.0.1:$((BASE + 2)) --admin-listen 127.0.0.1:$((BASE + 3)) \
        --upstream http://127.0.0.1:$((BASE + 1)) --cache-bust first_turn_prefix >/dev/null 2>&1 &
    proxy=$!
    wait_port $((BASE + 1))
    wait_port $((BASE + 2))
    BODY_FILE=$tmp/chat.json wrk -t1 -c32 -d2s -s benches/nginx/chat.lua http://127.0.0.1:$((BASE + 2))/v1/chat/completions >/dev/null
    cpu0=$(python3 -c "print($(proc_cpu $proxy) + $(proc_cpu $mock))")
    BODY_FILE=$tmp/chat.json wrk -t1 -c32 -d"${DURATION}"s -s benches/nginx/chat.lua \
        http://127.0.0.1:$((BASE + 2))/v1/chat/completions > "$tmp/wrk.txt"
    cpu1=$(python3 -c "print($(proc_cpu $proxy) + $(proc_cpu $mock))")
    grep -E "Requests/sec|Latency|Non-2xx" "$tmp/wrk.txt"
    n=$(awk '/requests in/ {print $1}' "$tmp/wrk.txt")
    echo "CPU (serve + mock) $(python3 -c "print(round(($cpu1 - $cpu0) * 1e6 / $n, 1))") us/request"
    echo "serve RSS $(($(rss_kb $proxy) / 1024)) MB (peak $(($(hwm_kb $proxy) / 1024)) MB), mock RSS $(($(rss_kb $mock) / 1024)) MB"
    kill $proxy $mock
    wait $proxy $mock 2>/dev/null || true
done
