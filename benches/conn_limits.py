#!/usr/bin/env python3
"""Issue 34 items 1 and 5, re-run against a release build (not the project's tests).

admin: `kvbust serve` (built-in mock) at the process's open-file limit; two clients (127.0.0.2 and
  127.0.0.3) each open ADMIN_CONNS (10,500) silent connections to the admin port. Meanwhile and
  after: /readyz and a data-port chat must answer. Prints kvbust's open descriptors at the peak,
  kvbust_admin_shed_total, and the answers.
h2c:  `kvbust serve` in front of a separate `kvbust mock`; one source address opens H2_CONNS (8)
  h2c connections, each with H2_STREAMS (256) concurrent streaming chats held open by a slow
  mock; prints the upstream connections kvbust holds to the mock (counted from /proc/net/tcp)
  at the peak, and after the streams end.

  benches/conn_limits.py admin|h2c|both      # KVBUST=target/dist/kvbust
The h2c part needs the `h2` Python package (pip install h2).
"""
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

KVBUST = os.environ.get("KVBUST", "target/dist/kvbust")
BASE = int(os.environ.get("PORT", "18800"))
ADMIN_CONNS = int(os.environ.get("ADMIN_CONNS", "10500"))
H2_CONNS = int(os.environ.get("H2_CONNS", "8"))
H2_STREAMS = int(os.environ.get("H2_STREAMS", "256"))


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def get(port, path, timeout=5):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    except OSError as e:
        return type(e).__name__, b""


def chat(port, timeout=10):
    body = json.dumps({"model": "kvbust-mock", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        return r.status
    except OSError as e:
        return type(e).__name__


def wait_ready(admin):
    for _ in range(600):
        if get(admin, "/readyz", 1)[0] == 200:
            return
        time.sleep(0.1)
    sys.exit("kvbust did not become ready")


def metric(admin, name):
    status, body = get(admin, "/metrics")
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(name):
            return line.split()[-1]
    return "?"


def hold(source, port, n):
    """Child process: opens `n` silent connections from `source`, prints how many, and holds
    them until its stdin closes (one process per source: each stays under its own file limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks, failed = [], 0
    for _ in range(n):
        s = socket.socket()
        try:
            s.bind((source, 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            socks.append(s)
        except OSError:
            failed += 1
            s.close()
    print(f"  {source}: {len(socks)} connected, {failed} failed", flush=True)
    sys.stdin.read()


def admin_flood():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    data, admin = BASE, BASE + 1
    proc = subprocess.Popen(
        [KVBUST, "serve", "--listen", f"127.0.0.1:{data}", "--admin-listen", f"127.0.0.1:{admin}"],
        stdout=subprocess.DEVNULL,
        stderr=open("/tmp/conn_limits.admin.log", "w"),
    )
    try:
        wait_ready(admin)
        print(f"admin: kvbust open-file limit {soft}; {fds(proc.pid)} descriptors at start", flush=True)
        holders = [
            subprocess.Popen([sys.executable, __file__, "hold", src, str(admin), str(ADMIN_CONNS)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for src in ("127.0.0.2", "127.0.0.3")
        ]
        peak, done = [0], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], fds(proc.pid))
                time.sleep(0.2)

        sampler = threading.Thread(target=sample)
        sampler.start()
        for h in holders:
            # Each holder prints one line once all its connections are made (or failed).
            print(h.stdout.readline().rstrip(), flush=True)
        done.set()
        sampler.join()
        peak = max(peak[0], fds(proc.pid))
        print(f"  kvbust descriptors: peak {peak}, now {fds(proc.pid)} (limit {soft})", flush=True)
        print(f"  while held: /readyz {get(admin, '/readyz')[0]}, data-port chat {chat(data)}", flush=True)
        print(f"  kvbust_admin_shed_total {metric(admin, 'kvbust_admin_shed_total')}", flush=True)
        for h in holders:
            h.stdin.close()
            h.wait()
        time.sleep(1)
        print(f"  after: /readyz {get(admin, '/readyz')[0]}, data-port chat {chat(data)}, descriptors {fds(proc.pid)}", flush=True)
        with open("/tmp/conn_limits.admin.log") as f:
            errors = [l for l in f if "Too many open files" in l or "upstream is down" in l]
        print(f"  log lines naming EMFILE or 'upstream is down': {len(errors)}", flush=True)
    finally:
        proc.terminate()
        proc.wait()


def upstream_conns(mock_port, pid):
    # Established TCP connections of kvbust's process to the mock's port.
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            rem_port = int(parts[2].split(":")[1], 16)
            if rem_port == mock_port and parts[3] == "01" and parts[9] in inodes:
                n += 1
    return n


def h2c_fanout():
    import h2.config
    import h2.connection
    import h2.events

    data, admin, mock = BASE + 2, BASE + 3, BASE + 4
    mproc = subprocess.Popen(
        [KVBUST, "mock", "--listen", f"127.0.0.1:{mock}", "--inter-token", "50ms"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc = subprocess.Popen(
        [KVBUST, "serve", "--listen", f"127.0.0.1:{data}", "--admin-listen", f"127.0.0.1:{admin}",
         "--upstream", f"http://127.0.0.1:{mock}"],
        stdout=subprocess.DEVNULL,
        stderr=open("/tmp/conn_limits.h2c.log", "w"),
    )
    try:
        wait_ready(admin)
        body = json.dumps({"model": "kvbust-mock", "max_tokens": 100, "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        conns = []
        for _ in range(H2_CONNS):
            s = socket.create_connection(("127.0.0.1", data))
            s.settimeout(30)
            c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            c.initiate_connection()
            s.sendall(c.data_to_send())
            conns.append((s, c))
        sent = 0
        for s, c in conns:
            for _ in range(H2_STREAMS):
                sid = c.get_next_available_stream_id()
                c.send_headers(sid, [(":method", "POST"), (":path", "/v1/chat/completions"),
                                     (":scheme", "http"), (":authority", "x"),
                                     ("content-type", "application/json")])
                c.send_data(sid, body, end_stream=True)
                sent += 1
            s.sendall(c.data_to_send())
        peak, ended = 0, 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20:
            for s, c in conns:
                s.setblocking(False)
                try:
                    for ev in c.receive_data(s.recv(1 << 20)):
                        if isinstance(ev, h2.events.StreamEnded):
                            ended += 1
                        elif isinstance(ev, h2.events.DataReceived):
                            c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    s.sendall(c.data_to_send())
                except BlockingIOError:
                    pass
            peak = max(peak, upstream_conns(mock, proc.pid))
            if ended >= sent:
                break
            time.sleep(0.05)
        print(f"h2c: 1 source, {H2_CONNS} connections x {H2_STREAMS} streams ({sent}); {ended} ended; "
              f"upstream connections to the model server: peak {peak}, now {upstream_conns(mock, proc.pid)}", flush=True)
        for s, _ in conns:
            s.close()
    finally:
        proc.terminate()
        mproc.terminate()
        proc.wait()
        mproc.wait()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "both"
    if what == "hold":
        hold(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        sys.exit(0)
    if what in ("admin", "both"):
        admin_flood()
    if what in ("h2c", "both"):
        h2c_fanout()
