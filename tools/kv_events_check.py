#!/usr/bin/env python3
"""Decode the mock's KV cache events with vLLM's own msgspec classes (issue 41, item 2).

Starts `kvbust mock` with `mock.kv_events` on a free port and a 64-block cache, subscribes with
pyzmq (SUB, topic "kv"), sends chat requests that overflow the cache and a /reset_prefix_cache,
then decodes every batch with `msgspec.msgpack.Decoder(vllm.distributed.kv_events.KVEventBatch)`
and checks:
  - the multipart shape [topic, seq as 8-byte big-endian, payload] and seq 0, 1, 2, ... (no gap);
  - the payload decodes as vLLM's KVEventBatch, and msgspec re-encodes the decoded batch to the
    very same bytes (so field order, omitted defaults and integer widths are vLLM's);
  - BlockStored, BlockRemoved and AllBlocksCleared all occur;
  - extra_keys as vLLM 0.33 fills them (block_pool.BlockPool.cache_full_blocks,
    kv_cache_utils.generate_block_hash_extra_keys and to_event_extra_keys): one entry per stored
    block, None for a block without keys, and for a request with a cache_salt the 1-tuple
    (salt,) on the prompt's first block only, so only in a run with no parent_block_hash; every
    salt sent (SALTS) appears, and no other.
Prints what it saw; exit status 0 when every check holds, 1 when one fails, 77 (skip) when no
vLLM is importable.

vLLM's kv_events module imports torch-heavy parts of vLLM at load time; where those are missing
(a venv with `pip install --no-deps vllm==0.33.*` plus msgspec and pyzmq), the module's own source
is executed with stand-ins for those four imports only: the msgspec classes are vLLM's code.

Usage: PYTHON tools/kv_events_check.py KVBUST_BINARY
"""
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.request

SKIP = 77
SALTS = ["tenant-a", "tenant-b"]


def load_kv_events():
    """vLLM's kv_events module: imported, else its source run with stand-in imports."""
    try:
        from vllm.distributed import kv_events  # noqa: PLC0415

        return kv_events, "imported"
    except Exception:  # noqa: BLE001 - any missing heavy dependency
        pass
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None, "vllm is not installed"
    path = os.path.join(spec.submodule_search_locations[0], "distributed", "kv_events.py")
    stubs = {
        "vllm.config.kv_events": {"KVEventsConfig": object},
        "vllm.logger": {"init_logger": lambda name: __import__("logging").getLogger(name)},
        "vllm.utils.network_utils": {
            "get_ip": lambda: "127.0.0.1",
            "get_tcp_uri": lambda ip, port: f"tcp://{ip}:{port}",
            "is_valid_ipv6_address": lambda ip: False,
            "split_zmq_path": lambda p: p.split(":"),
        },
        "vllm.v1.core.kv_cache_utils": {"ExternalBlockHash": bytes | int},
    }
    for name, attrs in stubs.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
    module = types.ModuleType("vllm_kv_events")
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), module.__dict__)  # noqa: S102
    return module, f"source of {path} (vLLM's heavy imports stubbed)"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    try:
        import msgspec  # noqa: PLC0415
        import zmq  # noqa: PLC0415
    except ImportError as e:
        print(f"SKIP: {e}")
        return SKIP
    kv, how = load_kv_events()
    if kv is None:
        print(f"SKIP: {how}")
        return SKIP
    print(f"vLLM kv_events: {how}")
    http_port, zmq_port = free_port(), free_port()
    events_cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{zmq_port}", "topic": "kv"}
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "kvbust.toml")
        with open(cfg, "w", encoding="utf-8") as f:
            f.write("[mock]\ncache_blocks = 64\nblock_size = 16\nbase_delay = \"0ms\"\n"
                    "inter_token = \"0ms\"\nprefill_per_token = \"0ms\"\n"
                    f"kv_events = '{json.dumps(events_cfg)}'\n")
        proc = subprocess.Popen([sys.argv[1], "mock", "--listen", f"127.0.0.1:{http_port}",
                                 "--config", cfg], stderr=subprocess.PIPE, text=True)
        try:
            return run(kv, msgspec, zmq, proc, http_port, zmq_port)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def run(kv, msgspec, zmq, proc, http_port, zmq_port):
    base = f"http://127.0.0.1:{http_port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            break
        except OSError:
            if proc.poll() is not None:
                print("the mock exited:", proc.stderr.read())
                return 1
            time.sleep(0.05)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(f"tcp://127.0.0.1:{zmq_port}")
    # A PUB drops what it sends before the subscription reaches it: reset until one arrives.
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    frames = []
    for _ in range(100):
        post(base + "/reset_prefix_cache", {})
        if poller.poll(100):
            frames.append(sub.recv_multipart())
            break
    if not frames:
        print("FAIL: no event reached the subscriber")
        return 1
    for conv in range(6):
        msgs = [{"role": "system", "content": f"Conversation {conv}. " + "lorem ipsum " * 60}]
        for turn in range(3):
            msgs.append({"role": "user", "content": f"turn {turn}: " + "dolor sit amet " * 20})
            post(base + "/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 4})
            msgs.append({"role": "assistant", "content": "ok"})
    # Salted conversations: the salt joins the first block's hash, so each salt's first request
    # stores from block 0 (its salt in extra_keys) and its later turns continue after a parent.
    for conv, salt in enumerate(SALTS):
        msgs = [{"role": "system", "content": f"Salted conversation {conv}. " + "lorem " * 40}]
        for turn in range(2):
            msgs.append({"role": "user", "content": f"turn {turn}: " + "dolor sit " * 20})
            post(base + "/v1/chat/completions",
                 {"model": "m", "messages": msgs, "max_tokens": 4, "cache_salt": salt})
            msgs.append({"role": "assistant", "content": "ok"})
    post(base + "/reset_prefix_cache", {})
    while poller.poll(500):
        frames.append(sub.recv_multipart())
    return check(kv, msgspec, frames)


def check(kv, msgspec, frames):
    decoder = msgspec.msgpack.Decoder(type=kv.KVEventBatch)
    encoder = msgspec.msgpack.Encoder()
    kinds, failures, first_seq, salts_seen = {}, [], None, []
    for i, parts in enumerate(frames):
        if len(parts) != 3 or parts[0] != b"kv" or len(parts[1]) != 8:
            failures.append(f"message {i}: not [topic, seq, payload]: {[len(p) for p in parts]}")
            continue
        seq = int.from_bytes(parts[1], "big")
        first_seq = seq if first_seq is None else first_seq
        if seq != first_seq + i:
            failures.append(f"message {i}: seq {seq}, expected {first_seq + i}")
        batch = decoder.decode(parts[2])
        again = encoder.encode(batch)
        if again != parts[2]:
            at = next((j for j, (a, b) in enumerate(zip(again, parts[2])) if a != b),
                      min(len(again), len(parts[2])))
            failures.append(f"seq {seq}: msgspec re-encodes the batch to other bytes from byte {at}:"
                            f" vLLM {again[at:at + 24].hex()} / mock {parts[2][at:at + 24].hex()}")
        for e in batch.events:
            kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
            if isinstance(e, kv.BlockStored):
                failures.extend(f"seq {seq}: {f}" for f in check_extra_keys(e, salts_seen))
        if i < 3 or i == len(frames) - 1:
            print(f"seq {seq}: {str(batch)[:300]}")
    print(f"{len(frames)} batches, seq {first_seq}..{first_seq + len(frames) - 1}, events: {kinds}")
    for want in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        if want not in kinds:
            failures.append(f"no {want} event")
    print(f"salts in extra_keys: {salts_seen}")
    if sorted(salts_seen) != sorted(SALTS):
        failures.append(f"salted first blocks {salts_seen}, expected one per salt sent {SALTS}")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("OK: every batch decodes with vLLM's KVEventBatch and re-encodes to the same bytes")
    return 1 if failures else 0


def check_extra_keys(e, salts_seen):
    """vLLM's extra_keys for a stored run: one entry per block, None but for a salted run's
    first block when the run starts at the prompt's first block."""
    keys = e.extra_keys
    if keys is None or len(keys) != len(e.block_hashes):
        return [f"extra_keys {keys!r} is not one entry per block ({len(e.block_hashes)})"]
    bad = [i for i, k in enumerate(keys[1:], 1) if k is not None]
    if bad:
        return [f"blocks {bad} after the first have extra keys: {keys!r}"]
    if keys[0] is None:
        return []
    if e.parent_block_hash is not None:
        return [f"a run with a parent has keys on its first block: {keys[0]!r}"]
    if not (isinstance(keys[0], tuple) and len(keys[0]) == 1 and isinstance(keys[0][0], str)):
        return [f"the first block's keys are not (salt,): {keys[0]!r}"]
    salts_seen.append(keys[0][0])
    if len(salts_seen) == 1:
        print(f"a salted BlockStored: parent_block_hash={e.parent_block_hash}, "
              f"{len(e.block_hashes)} blocks, extra_keys={keys!r}")
    return []


if __name__ == "__main__":
    sys.exit(main())
