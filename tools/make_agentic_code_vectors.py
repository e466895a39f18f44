"""Makes tests/fixtures/synth/agentic_code_extra.json: runs of AIPerf 0.13.0's own
`aiperf synthesize agentic-code` pipeline (SessionSynthesizer + write_dataset, as its CLI drives
them) for the trace_tools.json cases and more: custom distribution configs (restart splits,
explicit turns mode, bounded lognormals), the bundled `--config default`, a previous run's
manifest.json as --config, and 1,000 sessions. Each case keeps its argv, the config file it was
given (name and exact text), the dataset.jsonl sha256 and row count, and manifest.json and
quality.json verbatim.

    python3 -m venv V && V/bin/pip install aiperf==0.13.0
    V/bin/python tools/make_agentic_code_vectors.py tests/fixtures/synth/agentic_code_extra.json
"""
import hashlib, json, pathlib, sys, tempfile, time

from aiperf.dataset.agentic_code_gen.cli import _apply_cli_overrides
from aiperf.dataset.agentic_code_gen.config import load_config
from aiperf.dataset.agentic_code_gen.models import SessionDistributionConfig
from aiperf.dataset.agentic_code_gen.session_synthesizer import SessionSynthesizer
from aiperf.dataset.agentic_code_gen.writer import write_dataset

RESTART = {
    "restart_initial_probability": 0.6, "restart_turn_range": [2, 6],
    "new_tokens_per_turn": {"mean": 4000, "median": 2000, "min": 50, "max": 20000, "bias": 1.1},
    "inter_turn_delay": {"agentic_fraction": 0.5, "agentic_delay": {"mean": 3000, "median": 2000},
                         "human_delay": {"mean": 50000, "median": 30000, "max": 90000}, "max": 60000},
    "cache": {"layer1_tokens": 10000, "layer1_5_tokens": 3000, "layer2": {"mean": 9000, "median": 4000, "min": 100},
              "layer1_5_groups": {"num_groups": 7, "zipf_alpha": 0.8}},
    "max_prompt_tokens": 120000, "block_size": 256,
}
TURNS = {
    "turns": {"mean": 6, "median": 5, "min": 2, "max": 12},
    "generationLength": {"mean": 400, "median": 250, "max": 800},
    "cache": {"layer1_tokens": 8000, "layer1_5_tokens": 0},
    "max_prompt_tokens": 150000,
}
# (name, argv after the flags, config name or None, config JSON or None)
CASES = [
    ("ac_default_5", ["--num-sessions", "5", "--seed", "42"], None, None),
    ("ac_seed7_isl", ["--num-sessions", "4", "--seed", "7", "--max-isl", "60000"], None, None),
    ("ac_osl", ["--num-sessions", "3", "--seed", "3", "--max-osl", "400"], None, None),
    ("ac_restart", ["--num-sessions", "40", "--seed", "11"], "restart", RESTART),
    ("ac_turns", ["--num-sessions", "25", "--seed", "5", "--max-osl", "600"], "turns", TURNS),
    ("ac_bundled_default", ["--num-sessions", "30", "--seed", "9", "--config", "default"], None, None),
    ("ac_manifest", ["--num-sessions", "12", "--seed", "2"], "manifest", "from:ac_restart"),
    ("ac_1000", ["--num-sessions", "1000", "--seed", "1"], None, None),
]


def flag(argv, name, cast=int):
    return cast(argv[argv.index(name) + 1]) if name in argv else None


def main(out):
    res = {"aiperf_version": "0.13.0", "how": "tools/make_agentic_code_vectors.py", "cases": {}}
    manifests = {}
    for name, argv, cfg_name, cfg_json in CASES:
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"{name}_"))
        conf = flag(argv, "--config", str)
        config_text = None
        if cfg_name is not None:
            if isinstance(cfg_json, str):
                cfg_json = json.loads(manifests[cfg_json.split(":", 1)[1]])
            conf = str(work / f"{cfg_name}.json")
            config_text = json.dumps(cfg_json, indent=1)
            pathlib.Path(conf).write_text(config_text)
        if conf:
            cfg = load_config(conf)
            config_name = pathlib.Path(conf).stem if pathlib.Path(conf).is_file() else conf
        else:
            cfg, config_name = SessionDistributionConfig(), "default"
        cfg = _apply_cli_overrides(cfg, max_isl=flag(argv, "--max-isl"), max_osl=flag(argv, "--max-osl"))
        seed = flag(argv, "--seed")
        t = time.perf_counter()
        sessions = SessionSynthesizer(cfg, seed=seed).synthesize_sessions(flag(argv, "--num-sessions"))
        run = work / "run"
        jsonl, manifest, quality = write_dataset(sessions, run, cfg, seed=seed, config_name=config_name)
        dt = time.perf_counter() - t
        raw = jsonl.read_bytes()
        manifests[name] = manifest.read_text()
        res["cases"][name] = {
            "argv": argv, "config_file": None if cfg_name is None else f"{cfg_name}.json", "config_text": config_text,
            "aiperf_seconds": round(dt, 3), "dataset_jsonl_sha256": hashlib.sha256(raw).hexdigest(),
            "rows": raw.count(b"\n"), "manifest_json": manifest.read_text(), "quality_json": quality.read_text(),
        }
        print(name, raw.count(b"\n"), "rows", round(dt, 2), "s", file=sys.stderr)
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
