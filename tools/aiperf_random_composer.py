"""AIPerf 0.13.0's side of benches/synth_random.sh (never run by the tests): builds the
`--prompt-corpus random` dataset with AIPerf's own SyntheticDatasetComposer, the tokenizer loaded
first, and prints the composer's CPU seconds (`time.process_time()`, all threads) and wall
seconds as one JSON line; writes each first-turn text as {"text": ...} per line to compare with
kvbust's output byte for byte.

    /tmp/aip/bin/python tools/aiperf_random_composer.py TOKENIZER_DIR N STYLE OUT.jsonl
"""
import json
import sys
import time

from aiperf.cli import app
from aiperf.common import random_generator as rng
from aiperf.common.tokenizer import Tokenizer
from aiperf.config import BenchmarkRun
from aiperf.config.flags.resolver import resolve_config
from aiperf.config.loader.plan import build_benchmark_plan
from aiperf.dataset.composer.synthetic import SyntheticDatasetComposer

SEED = 42


def main(tokenizer_path, n, style, out_path):
    argv = ["profile", "--model", "m", "--url", "localhost:8000", "--endpoint-type", "chat",
            "--tokenizer", tokenizer_path, "--random-seed", str(SEED), "--isl", "1024",
            "--osl", "128", "--num-dataset-entries", n, "--request-count", n,
            "--prompt-corpus", "random", "--random-corpus-style", style,
            "--random-range-ratio", "0.0"]
    c0, t0 = time.process_time(), time.perf_counter()
    tok = Tokenizer.from_pretrained(tokenizer_path)
    c1, t1 = time.process_time(), time.perf_counter()
    _, bound, _ = app.parse_args(argv)
    cfg = build_benchmark_plan(resolve_config(list(bound.arguments.values())[0])).configs[0]
    run = BenchmarkRun(benchmark_id="0123456789ab", cfg=cfg, trial=0,
                       artifact_dir=cfg.artifacts.dir, random_seed=SEED, variables={})
    rng.reset()
    rng.init(SEED)
    c2, t2 = time.process_time(), time.perf_counter()
    convs = SyntheticDatasetComposer(run=run, tokenizer=tok).create_dataset()
    c3, t3 = time.process_time(), time.perf_counter()
    with open(out_path, "w") as f:
        for c in convs:
            f.write(json.dumps({"text": c.turns[0].texts[0].contents[0]}, ensure_ascii=False) + "\n")
    print(json.dumps({"n": int(n), "style": style,
                      "tokenizer_load_cpu_s": round(c1 - c0, 3),
                      "tokenizer_load_wall_s": round(t1 - t0, 3),
                      "composer_cpu_s": round(c3 - c2, 3), "composer_wall_s": round(t3 - t2, 3)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
