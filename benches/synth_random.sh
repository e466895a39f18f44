#!/usr/bin/env bash
# The random corpus against AIPerf 0.13.0 (benches/README.md, "Synthesis: the `random` corpus"):
# per style, AIPerf's SyntheticDatasetComposer (tools/aiperf_random_composer.py: tokenizer loaded
# first, `time.process_time()` around the composer only; whole process under /usr/bin/time), then
# `kvbust synth` as a whole process from an empty cache (`--no-corpus-cache`), then
# `synth_random_bench` (the composer alone, in process, no cache). Every kvbust output is
# compared with AIPerf's 1,000 texts. CPU s = user + sys.
#
#   cargo build --profile dist --bin kvbust --example synth_random_bench
#   flock -x /tmp/kvbust-cpu.lock benches/synth_random.sh [N] [REPEATS]
#
# AIPERF_PYTHON (default /tmp/aip/bin/python: a venv with `pip install aiperf==0.13.0`),
# KVBUST and SYNTH_BENCH (default target/dist/...) choose the programs; OUT the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000}"
REPEATS="${2:-3}"
PY="${AIPERF_PYTHON:-/tmp/aip/bin/python}"
KVBUST="${KVBUST:-target/dist/kvbust}"
SYNTH_BENCH="${SYNTH_BENCH:-target/dist/examples/synth_random_bench}"
OUT="${OUT:-$(mktemp -d /tmp/synth-random.XXXXXX)}"
TOK=assets/tokenizers/qwen3
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) N=$N; uptime: $(uptime)"

cpu() { # /usr/bin/time -f '%U %S %e' output -> "cpu_s wall_s"
    awk '{printf "%.2f %.2f", $1 + $2, $3}' "$1"
}

for style in vllm sglang; do
    "/usr/bin/time" -f '%U %S %e' -o "$OUT/aiperf-$style.time" \
        "$PY" tools/aiperf_random_composer.py "$TOK" "$N" "$style" "$OUT/aiperf-$style.jsonl" \
        >"$OUT/aiperf-$style.json" 2>"$OUT/aiperf-$style.err"
    echo "aiperf $style: $(cat "$OUT/aiperf-$style.json") whole_process_cpu_wall_s: $(cpu "$OUT/aiperf-$style.time")"
    for r in $(seq "$REPEATS"); do
        "/usr/bin/time" -f '%U %S %e' -o "$OUT/kvbust-$style.time" \
            "$KVBUST" synth --prompt-corpus random --random-corpus-style "$style" --isl 1024 \
            --osl 128 --random-range-ratio 0 --random-seed 42 --num-dataset-entries "$N" \
            --no-corpus-cache -o "$OUT/kvbust-$style.jsonl"
        echo "kvbust synth $style, no cache, whole process, run $r: cpu_wall_s $(cpu "$OUT/kvbust-$style.time")"
    done
    for r in $(seq "$REPEATS"); do
        echo "synth_random_bench $style, no cache, run $r: $("$SYNTH_BENCH" "$N" "$style" "$OUT/bench-$style.jsonl" - | sed -n 1p)"
    done
    "$PY" - "$OUT/aiperf-$style.jsonl" "$OUT/kvbust-$style.jsonl" "$OUT/bench-$style.jsonl" <<'PY'
import json, sys
aiperf = [json.loads(l)["text"] for l in open(sys.argv[1])]
cli = [json.loads(l)["turns"][0]["text"] for l in open(sys.argv[2])]
bench = [json.loads(l)["text"] for l in open(sys.argv[3])]
same = lambda xs: len(xs) == len(aiperf) and all(a.encode() == b.encode() for a, b in zip(aiperf, xs))
print(f"identical to AIPerf's {len(aiperf)} texts: kvbust synth {same(cli)}, synth_random_bench {same(bench)}")
PY
done
echo "# uptime after: $(uptime)"
