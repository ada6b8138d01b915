"""The renewal race of export mode against egress, under the same renewals, side by side.

    python3 benches/egress/stress.py [--proxy-bin target/debug/ironic-proxy] [--duration 600]
    python3 benches/egress/stress.py --quick      # 20 s, as scripts/test runs it

Two real sidecars (the binary from --proxy-bin, else $IRONIC_PROXY_BIN, else
target/debug/ironic-proxy), both self-issuing a certificate valid `--validity` (5 s) renewed
`--renew-before` (2.5 s) its end, so about every 2 s (less up to 10 % of renew_before as jitter
and the fraction of a second notAfter loses):

- the caller's sidecar exports its key and certificate (`export_dir`, the kit's export mode:
  what Ironic's JSON-RPC client read with `client_use_ssl = true`) and runs an egress listener
  (`[listeners.egress]`) that may dial the peer's JSON-RPC port;
- the peer's sidecar: a mutual-TLS `jsonrpc` listener in front of a stand-in for Ironic's
  JSON-RPC server on a unix socket (a small Python HTTP/1.1 server answering every call with a
  JSON-RPC result; not Ironic: the stand-in only has to answer).

For `--duration` seconds, at the same time, two processes:

- **the old way**: CPython `ssl` loading the exported pair in a tight loop, a new
  `ssl.SSLContext(PROTOCOL_TLS_CLIENT)` and `load_cert_chain(certfile, keyfile)` each time, as
  urllib3 does for each new connection when `requests` is given `cert=(certfile, keyfile)`
  (keystoneauth, hence Ironic's JSON-RPC client, in export mode). Counted: loads, and failures
  by class (`KEY_VALUES_MISMATCH`: an `ssl.SSLError` whose reason it is; any other
  `ssl.SSLError` reason; `OSError` by errno name).
- **the new way**: JSON-RPC calls with Python `requests` (what keystoneauth sends through) in
  plain HTTP through the egress listener, the proxy taken from `HTTP_PROXY` with credentials and
  `NO_PROXY` empty, as Ironic's environment sets it; a new `requests.Session` per call, closed
  after it, so every call is a new TCP connection to the egress (no keep-alive). The egress
  pools its TLS connections to a peer; to make every call meet the renewals on a new mutual-TLS
  connection too, each call is followed by a `POST /recycle`, which the peer's sidecar refuses
  itself (a route that allows `GET` only: 405 with `Connection: close`), so the egress drops
  that connection and the next call handshakes again with both sidecars' current certificates
  (`--pooled` leaves this out: the egress's pooling as in production). Counted: calls, failures
  by class (exception name or HTTP status), the distinct client certificates the stand-in saw
  (the peer passes it on in `X-Forwarded-Client-Cert`) and the mutual-TLS connections the peer
  accepted (distinct client ports in its access log, in order).
- **the new way, pooled** (at the same time, to a second mutual listener of the peer, so the
  egress keeps a pool of its own for it): one `requests.Session` for the whole run, calls back
  to back, no recycling: the egress's pooled connection to the peer would carry every call with
  the certificate of its handshake, were it not dropped after each renewal (issue 43). Counted
  as the new way, with the client certificates the stand-in saw on this path in order.

The loops stop at the deadline or at `--max-loads` / `--max-calls`. Renewals are the sidecars'
`ironic_proxy_certificate_renewals_total`, read before and after. Prints one summary line per
way and a JSON object; exits 1 if either new way failed once, if a loop ran nothing, if the
renewals were fewer than one per 4 s on either sidecar, if a sidecar died, or if the pooled path
did not follow the renewals. That rule: with R the caller's renewals logged ("renewed our
certificate", its JSON log's timestamps) between the pooled loop's first call and its last
answer, the peer must have seen at least R - 1 distinct client certificates on the pooled path
(each renewal inside the window is followed by calls, bar one that lands just before the last;
the slack of one more covers timestamps taken in two processes), and none again once a newer
one was seen (a pooled connection made before a renewal given a call after it). Mismatches of the
old way are the measurement, not a failure of this script. Listeners and admin endpoints bind
127.0.0.1:0 (their ports read from the log and /proc), so runs never collide. Needs Python
`requests` (scripts/test's virtualenv has it).
"""

import argparse
import base64
import datetime
import errno
import hashlib
import json
import os
import re
import shutil
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support", "python"))
from ironic_proxy_testing import pki, procs  # noqa: E402

USER, PASSWORD = "ironic-rpc", base64.urlsafe_b64encode(os.urandom(12)).decode()
CALL = {
    "jsonrpc": "2.0",
    "method": "get_node_with_token",
    "params": {"node_id": "4b2c8ae4-9c48-4e55-8f5a-2f4b1c3b5d71", "context": {"user": None}},
    "id": "req-1",
}
ANSWER = b'{"jsonrpc": "2.0", "result": {"uuid": "4b2c8ae4"}, "id": "req-1"}'


# ------------------------------------------------------------------ the two loops (workers)
def old_way(args):
    """Tight loop of new SSL contexts loading the exported pair, as urllib3 per connection."""
    crt, key = os.path.join(args.dir, "tls.crt"), os.path.join(args.dir, "tls.key")
    deadline = time.monotonic() + args.duration
    loads, failures, first = 0, {}, {}
    while loads < args.max_loads and time.monotonic() < deadline:
        loads += 1
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(crt, key)
            continue
        except ssl.SSLError as e:
            kind, err = e.reason or f"SSLError({e.library}, {e.args[0]})", e
        except OSError as e:
            kind, err = f"OSError {errno.errorcode.get(e.errno, e.errno)}", e
        failures[kind] = failures.get(kind, 0) + 1
        first.setdefault(kind, args_repr(err))
    return {"loads": loads, "failures": failures, "examples": first}


def args_repr(e):
    return f"{type(e).__name__}: {e}"[:200]


def pooled_way(args):
    """One session, calls back to back through the egress to the peer's second listener: the
    egress's pool carries them, its connections replaced only after renewals."""
    import requests  # noqa: PLC0415 - only the worker needs it

    url = f"http://127.0.0.1:{args.pooled_port}/"
    deadline = time.monotonic() + args.duration
    calls, ok, failures, first = 0, 0, {}, {}
    s = requests.Session()
    started = time.time()
    try:
        while calls < args.max_calls and time.monotonic() < deadline:
            calls += 1
            try:
                r = s.post(url, json=CALL, timeout=10, headers={"x-stress-way": "pooled"})
                if r.status_code == 200 and r.content == ANSWER:
                    ok += 1
                else:
                    kind = f"HTTP {r.status_code}"
                    failures[kind] = failures.get(kind, 0) + 1
                    first.setdefault(kind, r.text[:200])
            except requests.RequestException as e:
                kind = type(e).__name__
                failures[kind] = failures.get(kind, 0) + 1
                first.setdefault(kind, args_repr(e))
    finally:
        s.close()
    return {"calls": calls, "ok": ok, "failures": failures, "examples": first,
            "window": [started, time.time()]}


def new_way(args):
    """New connection per JSON-RPC call through the egress (HTTP_PROXY from the environment)."""
    import requests  # noqa: PLC0415 - only the worker needs it

    url = f"http://127.0.0.1:{args.peer_port}/"
    recycle = f"http://127.0.0.1:{args.peer_port}/recycle"
    deadline = time.monotonic() + args.duration
    calls, ok, failures, first, recycles = 0, 0, {}, {}, 0
    while calls < args.max_calls and time.monotonic() < deadline:
        calls += 1
        s = requests.Session()
        try:
            r = s.post(url, json=CALL, timeout=10)
            if r.status_code == 200 and r.content == ANSWER:
                ok += 1
            else:
                kind = f"HTTP {r.status_code}"
                failures[kind] = failures.get(kind, 0) + 1
                first.setdefault(kind, r.text[:200])
            if not args.pooled:
                r = s.post(recycle, timeout=10)
                recycles += r.status_code == 405
        except requests.RequestException as e:
            kind = type(e).__name__
            failures[kind] = failures.get(kind, 0) + 1
            first.setdefault(kind, args_repr(e))
        finally:
            s.close()
    return {"calls": calls, "ok": ok, "failures": failures, "examples": first,
            "recycles": recycles}


# ------------------------------------------------------------------ Ironic's stand-in
class Backend(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path):
        super().__init__(path, Handler)
        self.calls, self.certs, self.lock = 0, set(), threading.Lock()
        # The pooled path's client certificates in the order first seen, each with its calls.
        self.pooled = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        xfcc = self.headers.get("x-forwarded-client-cert", "")
        cert = hashlib.sha256(xfcc.encode()).hexdigest()
        with self.server.lock:
            self.server.calls += 1
            if self.headers.get("x-stress-way") == "pooled":
                runs = self.server.pooled
                if runs and runs[-1][0] == cert:
                    runs[-1][1] += 1
                else:
                    runs.append([cert, 1])
            else:
                self.server.certs.add(cert)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def address_string(self):
        return "unix"

    def log_message(self, *a):
        pass


# ------------------------------------------------------------------ sidecars
class Sidecar:
    def __init__(self, binary, d, name, config):
        self.name, self.log = name, os.path.join(d, f"{name}.log")
        path = os.path.join(d, f"{name}.toml")
        with open(path, "w") as f:
            f.write(config)
        self.p = subprocess.Popen(
            [binary, "--log-format", "json", "run", "--config", path],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),
            env={**os.environ, "RUST_LOG": "info"},
        )  # fmt: skip
        self.listen, self.admin = {}, None
        for _ in range(300):
            if self.p.poll() is not None:
                sys.exit(f"egress-stress: {name} exited {self.p.returncode}: {self.tail()}")
            for line in open(self.log):
                if '"ready"' in line:
                    self._ports()
                    return
            time.sleep(0.05)
        sys.exit(f"egress-stress: {name} not ready in 15 s: {self.tail()}")

    def _ports(self):
        for line in open(self.log):
            if '"listening"' in line:
                e = json.loads(line)
                self.listen[e["listener"]] = int(e["addr"].rsplit(":", 1)[1])
        # The admin listener's port is not logged: the process's other listening socket.
        inodes = set()
        for fd in os.listdir(f"/proc/{self.p.pid}/fd"):
            try:
                m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{self.p.pid}/fd/{fd}"))
            except OSError:
                continue
            if m:
                inodes.add(m.group(1))
        ports = set()
        for row in open(f"/proc/{self.p.pid}/net/tcp").read().splitlines()[1:]:
            f = row.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.add(int(f[1].split(":")[1], 16))
        admin = ports - set(self.listen.values())
        if len(admin) != 1:
            sys.exit(f"egress-stress: {self.name}: admin port not found among {sorted(ports)}")
        self.admin = admin.pop()

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/metrics", timeout=10) as r:
            return r.read().decode()

    def metric(self, name, **labels):
        total = 0.0
        for line in self.metrics().splitlines():
            m = re.match(rf"{name}(?:\{{(.*)\}})? (\S+)$", line)
            if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
                total += float(m.group(2))
        return total

    def tail(self):
        return open(self.log).read()[-600:]

    def stop(self):
        procs.stop(self.p)


def identity(d, args, export=None):
    return (f'[identity]\ntrust = "{d}/ca/ca.crt"\nissuer_cert = "{d}/ca/ca.crt"\n'
            f'issuer_key = "{d}/ca/ca.key"\nip_addresses = ["127.0.0.1"]\n'
            f'validity = "{args.validity}"\nrenew_before = "{args.renew_before}"\n'
            + (f'export_dir = "{export}"\n' if export else "")
            + '[admin]\nlisten = "127.0.0.1:0"\n')


def renewals_between(log, start, end):
    """The renewals a sidecar logged between two wall-clock times (Unix seconds)."""
    n = 0
    for line in open(log):
        if '"renewed our certificate"' not in line:
            continue
        ts = json.loads(line)["timestamp"].replace("Z", "+00:00")
        n += start < datetime.datetime.fromisoformat(ts).timestamp() < end
    return n


def peer_connections(log):
    """Mutual-TLS connections the peer accepted, from its access log: the client address
    changes from one request to the next (each call is on a new connection when recycled)."""
    n, last = 0, None
    for line in open(log):
        if '"access"' not in line or '"json-rpc"' not in line:
            continue
        client = json.loads(line).get("client")
        if client != last:
            n, last = n + 1, client
    return n


# ------------------------------------------------------------------ orchestration
def worker(args, which, extra_env=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", which,
           "--duration", str(args.duration), "--dir", args.dir,
           "--peer-port", str(args.peer_port), "--pooled-port", str(args.pooled_port),
           "--max-loads", str(args.max_loads),
           "--max-calls", str(args.max_calls)] + (["--pooled"] if args.pooled else [])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(extra_env or {})})


def collect(p, timeout, what):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        sys.exit(f"egress-stress: the {what} loop ran past its deadline")
    if p.returncode != 0:
        sys.exit(f"egress-stress: the {what} loop exited {p.returncode}")
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proxy-bin", default=os.environ.get(
        "IRONIC_PROXY_BIN", os.path.join(ROOT, "target", "debug", "ironic-proxy")))
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--quick", action="store_true", help="--duration 20")
    ap.add_argument("--validity", default="5s")
    ap.add_argument("--renew-before", default="2500ms")
    ap.add_argument("--max-loads", type=int, default=50_000_000)
    ap.add_argument("--max-calls", type=int, default=2_000_000)
    ap.add_argument("--pooled", action="store_true",
                    help="no /recycle: the egress reuses its connections to the peer")
    ap.add_argument("--worker", choices=("old", "new", "pooled"), help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--peer-port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--pooled-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        way = {"old": old_way, "new": new_way, "pooled": pooled_way}[args.worker]
        print(json.dumps(way(args)))
        return
    if args.quick:
        args.duration = 20.0
    binary = os.path.abspath(args.proxy_bin)
    if not os.access(binary, os.X_OK):
        sys.exit(f"egress-stress: no binary at {binary}: cargo build, or --proxy-bin")
    d = tempfile.mkdtemp(prefix="egress-stress-")
    pki.ca_init(binary, f"{d}/ca", permit_ip=["127.0.0.0/8"])
    backend = Backend(f"{d}/rpc.sock")
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    with open(f"{d}/egress.credentials", "w") as f:
        f.write(f"{USER}:{PASSWORD}\n")
    sidecars = []
    try:
        peer = Sidecar(binary, d, "peer", identity(d, args) + (
            f'[[listeners]]\nname = "json-rpc"\nlisten = "127.0.0.1:0"\ntls = "mutual"\n'
            f'jsonrpc = true\nupstream = "unix:{d}/rpc.sock"\n'
            # POST /recycle: 405 with Connection: close from the peer's sidecar itself.
            f'[[listeners.routes]]\npaths = ["/recycle"]\nmethods = ["GET"]\n'
            f'upstream = "unix:{d}/rpc.sock"\n'
            # The pooled way's own listener: the egress keeps a pool per destination.
            f'[[listeners]]\nname = "json-rpc-pooled"\nlisten = "127.0.0.1:0"\n'
            f'tls = "mutual"\njsonrpc = true\nupstream = "unix:{d}/rpc.sock"\n'))
        sidecars.append(peer)
        args.peer_port = peer.listen["json-rpc"]
        args.pooled_port = peer.listen["json-rpc-pooled"]
        caller = Sidecar(binary, d, "caller", identity(d, args, f"{d}/tls") + (
            f'[[listeners]]\nname = "json-rpc-egress"\nlisten = "127.0.0.1:0"\ntls = "none"\n'
            f'jsonrpc = true\n[listeners.egress]\ncredentials = "{d}/egress.credentials"\n'
            f'targets = ["127.0.0.1"]\nports = [{args.peer_port}, {args.pooled_port}]\n'))
        sidecars.append(caller)
        egress_port = caller.listen["json-rpc-egress"]
        renewals0 = {s.name: s.metric("ironic_proxy_certificate_renewals_total")
                     for s in sidecars}
        print(f"egress-stress: {args.duration:.0f} s; caller (export {d}/tls, egress "
              f"127.0.0.1:{egress_port}) and peer (json-rpc 127.0.0.1:{args.peer_port}), "
              f"certificates valid {args.validity} renewed {args.renew_before} before their "
              f"end; {binary}", flush=True)
        args.dir = f"{d}/tls"
        t0 = time.monotonic()
        proxy_env = {
            "HTTP_PROXY": f"http://{USER}:{PASSWORD}@127.0.0.1:{egress_port}",
            "http_proxy": f"http://{USER}:{PASSWORD}@127.0.0.1:{egress_port}",
            "NO_PROXY": "", "no_proxy": "", "HTTPS_PROXY": "", "https_proxy": ""}
        old = worker(args, "old")
        new = worker(args, "new", proxy_env)
        pooled = worker(args, "pooled", proxy_env)
        o = collect(old, args.duration + 60, "old-way")
        n = collect(new, args.duration + 60, "new-way")
        pl = collect(pooled, args.duration + 60, "pooled")
        wall = time.monotonic() - t0
        dead = [s.name for s in sidecars if s.p.poll() is not None]
        if dead:
            sys.exit(f"egress-stress: {', '.join(dead)} died: "
                     + " | ".join(s.tail() for s in sidecars))
        renewals = {s.name: s.metric("ironic_proxy_certificate_renewals_total") - renewals0[s.name]
                    for s in sidecars}
        egress = {oc: caller.metric("ironic_proxy_egress_requests_total", outcome=oc)
                  for oc in ("forwarded", "peer_failed")}
        peer_tls_fail = caller.metric("ironic_proxy_peer_tls_failures_total")
        handshake_fail = peer.metric("ironic_proxy_tls_handshake_failures_total")
        time.sleep(0.3)  # the access log's batch
        conns = peer_connections(peer.log)
        in_window = renewals_between(caller.log, *pl["window"])
    finally:
        for s in sidecars:
            s.stop()
        backend.shutdown()
    with backend.lock:
        runs = [list(r) for r in backend.pooled]
    pooled_certs = len({c for c, _ in runs})
    came_back = len(runs) - pooled_certs
    pfail = sum(pl["failures"].values())
    mism = o["failures"].get("KEY_VALUES_MISMATCH", 0)
    other_old = sum(v for k, v in o["failures"].items() if k != "KEY_VALUES_MISMATCH")
    nfail = sum(n["failures"].values())
    print(f"old way (export, load_cert_chain per new context): {o['loads']} loads, {mism} "
          f"KEY_VALUES_MISMATCH, {other_old} other failures {o['failures']}")
    print(f"new way (egress, new connection per call): {n['calls']} calls, {n['ok']} ok, "
          f"{nfail} failures {n['failures']}; peer's mutual-TLS connections {conns}, client "
          f"certificates seen {len(backend.certs)}; egress forwarded {egress['forwarded']:.0f} "
          f"(with {n['recycles']} recycles), peer_failed {egress['peer_failed']:.0f}, peer TLS "
          f"failures {peer_tls_fail:.0f}, peer handshake failures {handshake_fail:.0f}")
    print(f"new way, pooled (one session, the egress's pool): {pl['calls']} calls, {pl['ok']} "
          f"ok, {pfail} failures {pl['failures']}; client certificates seen {pooled_certs} "
          f"(calls on each, in order: {[n for _, n in runs]}), {came_back} seen again after a "
          f"newer one; {in_window} caller renewals during its calls")
    print(f"renewals: caller {renewals['caller']:.0f}, peer {renewals['peer']:.0f} in "
          f"{wall:.0f} s")
    if mism and renewals["caller"]:
        # Loads run back to back, so a renewal's swap hits one with the chance window / period:
        # the window between load_cert_chain's two opens is that chance times the period.
        per_renewal = mism / renewals["caller"]
        window = per_renewal * args.duration / o["loads"]
        print(f"old way: 1 mismatch in {o['loads'] / mism:,.0f} loads, {per_renewal:.2f} per "
              f"renewal of the exported pair: a window of ~{window * 1e3:.2f} ms per renewal "
              f"(at {o['loads'] / args.duration:,.0f} loads/s)")
    summary = {"duration_s": round(wall, 1), "validity": args.validity,
               "renew_before": args.renew_before, "renewals": renewals, "old_way": o,
               "new_way": {**n, "peer_tls_connections": conns,
                           "client_certificates_seen": len(backend.certs),
                           "backend_calls": backend.calls, "egress": egress,
                           "peer_tls_failures": peer_tls_fail,
                           "peer_handshake_failures": handshake_fail},
               "pooled_way": {**pl, "client_certificates_seen": pooled_certs,
                              "calls_per_certificate": [n for _, n in runs],
                              "seen_again_after_a_newer_one": came_back,
                              "caller_renewals_during_calls": in_window}}
    print(json.dumps(summary, indent=1))
    problems = []
    if nfail or egress["peer_failed"] or n["ok"] != n["calls"]:
        problems.append(f"the new way failed {nfail} calls")
    if pfail or pl["ok"] != pl["calls"]:
        problems.append(f"the pooled way failed {pfail} calls")
    if o["loads"] == 0 or n["calls"] == 0 or pl["calls"] == 0:
        problems.append("a loop ran nothing")
    if pooled_certs < in_window - 1 or in_window == 0:
        problems.append(f"the peer saw {pooled_certs} client certificates on the pooled path "
                        f"for {in_window} caller renewals during its calls (fewer than "
                        f"renewals - 1, or no renewal)")
    if came_back:
        problems.append(f"{came_back} client certificates came back on the pooled path after "
                        f"a newer one")
    want = args.duration / 4
    if min(renewals.values()) < want:
        problems.append(f"renewals {renewals}: fewer than {want:.0f}")
    if problems:
        sys.exit("egress-stress: FAIL: " + "; ".join(problems))
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
