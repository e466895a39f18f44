#!/usr/bin/env python3
"""Run llama.cpp's HTTP server (embedded in the `xllamacpp` wheel) until SIGTERM.

Started by tests/real_upstream/llamacpp.sh inside the throwaway venv. Kept as
small as possible: fill xllamacpp.CommonParams, create xllamacpp.Server (which
loads the model and serves from native threads), then block the main thread
until SIGTERM/SIGINT and drop the server so llama.cpp shuts down cleanly.
"""

import argparse
import os
import signal
import sys
import time

import xllamacpp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="path to the GGUF file")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--cache-ram-mib", type=int, default=256)
    ap.add_argument("--alias", default="smollm2")
    ap.add_argument("--ready-file", default=None,
                    help="written with '<pid> <url>' once Server() has returned")
    args = ap.parse_args()

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx
    # One slot: every request lands on the same KV cache, which is what the
    # prefix-cache tests need to observe reuse (or its absence).
    params.n_parallel = args.parallel
    # Threads for generation (cpuparams) and prompt processing (cpuparams_batch).
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.cache_prompt = True
    # Host-RAM prompt cache: the default (8192 MiB) is far more than a CI box
    # should give a 135M model.
    params.cache_ram_mib = args.cache_ram_mib
    params.endpoint_metrics = True
    params.endpoint_slots = True
    params.model_alias = {args.alias}  # a set[str] in this binding

    # Block the signals before the server spawns its native threads, so they
    # inherit the mask and only this thread receives them (via sigwait).
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)

    t0 = time.monotonic()
    server = xllamacpp.Server(params)
    print(
        f"serve_llamacpp: Server() returned after {time.monotonic() - t0:.2f}s, "
        f"listening_address={server.listening_address!r}",
        file=sys.stderr,
        flush=True,
    )
    if args.ready_file:
        # Proof for llamacpp.sh that *this* process serves the port: a /health
        # answer alone could come from another server already bound to it.
        with open(args.ready_file + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {server.listening_address}\n")
        os.replace(args.ready_file + ".tmp", args.ready_file)

    sig = signal.sigwait(stop_signals)
    print(f"serve_llamacpp: got signal {sig}, shutting down", file=sys.stderr, flush=True)
    del server  # dropping the object stops llama.cpp's server
    return 0


if __name__ == "__main__":
    sys.exit(main())
