"""CPU per JSON-RPC call: Ironic's client doing TLS itself (Python `requests` with the exported
certificate and key, as `[json_rpc]client_use_ssl = true`) against the same client in plain HTTP
through the sidecar's egress listener (`HTTP_PROXY`), which does the TLS. Both call the same peer
sidecar (mutual TLS, `jsonrpc = true`) in front of the same unix-socket upstream.

Counted: the client process's CPU (getrusage around the calls), the egress sidecar's and the
peer sidecar's (utime + stime from /proc/<pid>/stat before and after); the upstream's is not
counted (the same in both). Two connection patterns: one keep-alive session for every call, and
a new session (so a new TCP and TLS connection, and for the Python-TLS client a new SSLContext
that loads the certificate and key) per call.

    python3 benches/egress/run.py --proxy-bin target/release/ironic-proxy [--calls 2000]
"""

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stress import ANSWER, CALL  # noqa: E402 - the same call and answer as the renewal race

from ironic_proxy_testing import pki  # noqa: E402 - on sys.path through stress
from ironic_proxy_testing.cpu import cpu_seconds  # noqa: E402
from ironic_proxy_testing.ports import free_port  # noqa: E402
from ironic_proxy_testing.procs import stop_all  # noqa: E402


def upstream(path):
    """A minimal HTTP/1.1 keep-alive server on a unix socket (Ironic's stand-in)."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(64)

    def serve(c):
        buf = b""
        with c:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, buf = buf.split(b"\r\n\r\n", 1)
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":")[1])
                while len(buf) < n:
                    buf += c.recv(65536)
                buf = buf[n:]
                c.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER
                )

    def accept():
        while True:
            c, _ = srv.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def start(binary, config, log):
    p = subprocess.Popen(
        [binary, "run", "--config", config],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"),
        env={**os.environ, "RUST_LOG": "warn"},
    )  # fmt: skip
    return p


def wait_ready(admin):
    for _ in range(200):
        try:
            if requests.get(f"http://{admin}/readyz", timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise SystemExit(f"not ready: {admin}")


def measure(calls, session_per_call, post, pids):
    before = [cpu_seconds(p) for p in pids]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    s = requests.Session()
    for _ in range(calls):
        if session_per_call:
            s.close()
            s = requests.Session()
        r = post(s)
        if r.status_code != 200:
            raise SystemExit(f"HTTP {r.status_code}: {r.text[:200]}")
    s.close()
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    after = [cpu_seconds(p) for p in pids]
    client = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    per = lambda x: x / calls * 1e6  # noqa: E731
    return {
        "client_us": round(per(client)),
        "sidecars_us": [round(per(b - a)) for a, b in zip(before, after, strict=True)],
        "wall_ms_per_call": round(wall / calls * 1000, 2),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proxy-bin", required=True)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="egress-cost-")
    b = os.path.abspath(args.proxy_bin)
    pki.ca_init(b, f"{d}/ca", permit_ip=["127.0.0.0/8"])
    upstream(f"{d}/rpc.sock")
    peer_port, peer_admin, eg_port, eg_admin = (free_port() for _ in range(4))
    ident = (f'[identity]\ntrust = "{d}/ca/ca.crt"\nissuer_cert = "{d}/ca/ca.crt"\n'
             f'issuer_key = "{d}/ca/ca.key"\nip_addresses = ["127.0.0.1"]\nvalidity = "1h"\n')
    with open(f"{d}/peer.toml", "w") as f:
        f.write(ident + f'export_dir = "{d}/tls"\n[admin]\nlisten = "127.0.0.1:{peer_admin}"\n'
                f'[[listeners]]\nname = "json-rpc"\nlisten = "127.0.0.1:{peer_port}"\n'
                f'tls = "mutual"\njsonrpc = true\nupstream = "unix:{d}/rpc.sock"\n')
    with open(f"{d}/cred", "w") as f:
        f.write("ironic-rpc:bench-password\n")
    with open(f"{d}/egress.toml", "w") as f:
        f.write(ident + f'[admin]\nlisten = "127.0.0.1:{eg_admin}"\n'
                f'[[listeners]]\nname = "json-rpc-egress"\nlisten = "127.0.0.1:{eg_port}"\n'
                f'tls = "none"\njsonrpc = true\n[listeners.egress]\ncredentials = "{d}/cred"\n'
                f'targets = ["127.0.0.1"]\nports = [{peer_port}]\n')
    peer = start(b, f"{d}/peer.toml", f"{d}/peer.log")
    egress = start(b, f"{d}/egress.toml", f"{d}/egress.log")
    try:
        wait_ready(f"127.0.0.1:{peer_admin}")
        wait_ready(f"127.0.0.1:{eg_admin}")
        tls = (f"{d}/tls/tls.crt", f"{d}/tls/tls.key")
        direct = lambda s: s.post(f"https://127.0.0.1:{peer_port}/", json=CALL,  # noqa: E731
                                  cert=tls, verify=f"{d}/ca/ca.crt", timeout=30)
        proxy = {"http": f"http://ironic-rpc:bench-password@127.0.0.1:{eg_port}"}
        through = lambda s: s.post(f"http://127.0.0.1:{peer_port}/", json=CALL,  # noqa: E731
                                   proxies=proxy, timeout=30)
        out = {}
        for pattern, per_call in (("keep-alive", False), ("new connection per call", True)):
            n = args.calls if not per_call else args.calls // 4
            measure(50, per_call, direct, [peer.pid])  # warm-up
            measure(50, per_call, through, [egress.pid, peer.pid])
            a = measure(n, per_call, direct, [peer.pid])
            e = measure(n, per_call, through, [egress.pid, peer.pid])
            out[pattern] = {
                "calls": n,
                "python_tls": {**a, "total_us": a["client_us"] + sum(a["sidecars_us"])},
                "egress": {**e, "total_us": e["client_us"] + sum(e["sidecars_us"])},
            }
        print(json.dumps(out, indent=2))
    finally:
        stop_all([peer, egress])


if __name__ == "__main__":
    main()
