"""The egress relay's cost per call (issue 42): the same plain-HTTP call direct and relayed by
an egress listener with `others = "relay"`, in one run, interleaved.

    python3 benches/egress/relay_cost.py [--proxy-bin target/debug/ironic-proxy] [--calls 300]

One real sidecar (the binary from --proxy-bin, else $IRONIC_PROXY_BIN, else
target/debug/ironic-proxy) with an egress listener whose `targets` and `ports` do not cover the
server, so every call through it is relayed in plain HTTP. The server is an agent stand-in, a
Python `ThreadingHTTPServer` speaking HTTP/1.1 in its own process on 127.0.0.3:0, answering each
`POST /v1/commands/` with a small JSON body, as a ramdisk agent does (with `TCP_NODELAY`, so that
no delayed ACK stands in the measurement). The client is Python
`requests` (what Ironic's agent client and image service use), two ways per call:

- `new`: a new `requests.Session` per call, closed after it: a new TCP connection each time
  (to the server direct, to the egress relayed; the egress keeps its own pooled connection to
  the server);
- `keep-alive`: one `Session` for all the calls of a block.

`--rounds` rounds, each with a block of `--calls` calls per way and path (direct, relayed), the
order of direct and relayed swapped every round. Prints median and p99 per way and path and the
relayed minus direct difference, and checks every call answered 200 and that the egress counted
exactly the relayed calls as `relayed`. Bounded: at most rounds x 4 x calls calls, and
`--max-seconds` in all. Needs Python `requests` (Ironic's virtualenv has it).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stress import ROOT, Sidecar  # noqa: E402 - the sidecar harness of the renewal race

from ironic_proxy_testing import pki, procs  # noqa: E402 - on sys.path through stress

import requests  # noqa: E402

SERVER = r"""
import http.server, json, sys

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body are separate writes: without TCP_NODELAY the body of every answer on a
    # kept-alive connection waits for the client's delayed ACK (40 ms), on both paths.
    disable_nagle_algorithm = True

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b'{"command_status": "SUCCEEDED", "command_result": null}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

s = http.server.ThreadingHTTPServer(("127.0.0.3", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""

CALL = {"name": "get_clean_steps", "params": {"node": {"uuid": "4b2c8ae4"}}}


def block(url, proxies, calls, keep_alive, deadline):
    """`calls` timed calls; their durations in ms, and the statuses that were not 200."""
    times, bad = [], []
    session = requests.Session() if keep_alive else None
    if session is not None:
        session.trust_env, session.proxies = False, proxies
    for _ in range(calls):
        if time.monotonic() > deadline:
            break
        s = session
        if s is None:
            s = requests.Session()
            s.trust_env, s.proxies = False, proxies
        t = time.perf_counter()
        r = s.post(url, json=CALL, timeout=10)
        r.content  # noqa: B018 - read the whole answer inside the timing
        times.append((time.perf_counter() - t) * 1000)
        if r.status_code != 200:
            bad.append(r.status_code)
        if session is None:
            s.close()
    if session is not None:
        session.close()
    return times, bad


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proxy-bin", default=os.environ.get(
        "IRONIC_PROXY_BIN", os.path.join(ROOT, "target", "debug", "ironic-proxy")))
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=600.0)
    args = ap.parse_args()
    binary = os.path.abspath(args.proxy_bin)
    d = tempfile.mkdtemp(prefix="egress-relay-cost-")
    pki.ca_init(binary, f"{d}/ca", permit_ip=["127.0.0.0/8"])
    with open(f"{d}/egress.credentials", "w") as f:
        f.write("ironic:relay-cost\n")
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    sidecar = None
    try:
        port = int(server.stdout.readline())
        sidecar = Sidecar(binary, d, "egress", (
            f'[identity]\ntrust = "{d}/ca/ca.crt"\nissuer_cert = "{d}/ca/ca.crt"\n'
            f'issuer_key = "{d}/ca/ca.key"\nip_addresses = ["127.0.0.1"]\n'
            '[admin]\nlisten = "127.0.0.1:0"\n'
            '[[listeners]]\nname = "json-rpc-egress"\nlisten = "127.0.0.1:0"\ntls = "none"\n'
            f'[listeners.egress]\ncredentials = "{d}/egress.credentials"\n'
            'targets = ["127.0.0.1"]\nports = [1]\nothers = "relay"\n'))
        egress = sidecar.listen["json-rpc-egress"]
        url = f"http://127.0.0.3:{port}/v1/commands/?wait=true"
        paths = {
            "direct": {},
            "relayed": {"http": f"http://ironic:relay-cost@127.0.0.1:{egress}"},
        }
        deadline = time.monotonic() + args.max_seconds
        times = {(w, p): [] for w in ("new", "keep-alive") for p in paths}
        bad = []
        # One block of each first, not counted: warms the server, the egress and its pool.
        for way in ("new", "keep-alive"):
            for p in paths.values():
                block(url, p, 20, way == "keep-alive", deadline)
        before = sidecar.metric("ironic_proxy_egress_requests_total", outcome="relayed")
        for r in range(args.rounds):
            order = list(paths) if r % 2 == 0 else list(reversed(paths))
            for way in ("new", "keep-alive"):
                for name in order:
                    t, b = block(url, paths[name], args.calls, way == "keep-alive", deadline)
                    times[(way, name)] += t
                    bad += b
        relayed = sidecar.metric("ironic_proxy_egress_requests_total", outcome="relayed") - before
        sent = sum(len(v) for (w, p), v in times.items() if p == "relayed")
        result = {"binary": binary, "calls_per_block": args.calls, "rounds": args.rounds}
        for way in ("new", "keep-alive"):
            row = {}
            for name in paths:
                xs = times[(way, name)]
                row[name] = {"n": len(xs), "median_ms": round(statistics.median(xs), 3),
                             "p99_ms": round(p99(xs), 3)}
            row["median_delta_ms"] = round(row["relayed"]["median_ms"] - row["direct"]["median_ms"], 3)
            row["p99_delta_ms"] = round(row["relayed"]["p99_ms"] - row["direct"]["p99_ms"], 3)
            result[way] = row
            print(f"relay-cost {way:10}: direct median {row['direct']['median_ms']:.3f} ms p99 "
                  f"{row['direct']['p99_ms']:.3f} ms (n={row['direct']['n']}); relayed median "
                  f"{row['relayed']['median_ms']:.3f} ms p99 {row['relayed']['p99_ms']:.3f} ms "
                  f"(n={row['relayed']['n']}); +{row['median_delta_ms']:.3f} ms median, "
                  f"+{row['p99_delta_ms']:.3f} ms p99")
        result["failed_calls"] = bad
        result["egress_relayed"] = relayed
        print(json.dumps(result))
        if bad or relayed != sent:
            sys.exit(f"relay-cost: {len(bad)} calls not 200, egress counted {relayed:.0f} "
                     f"relayed of {sent} sent")
    finally:
        if sidecar is not None:
            sidecar.stop()
        procs.stop(server)


if __name__ == "__main__":
    main()
