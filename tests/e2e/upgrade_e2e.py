#!/usr/bin/env python3
"""Rolling upgrade with mixed versions (issue 43): the real distributed Ironic of ironic_e2e.py
starts with every sidecar and both load balancers on an older ironic-proxy build, then each is
replaced by HEAD's build, one at a time, as a rolling update of the pods and of the balancers'
DaemonSet does it, under continuous load:

- API reads (`GET /v1/nodes`) through the load balancers, as a client behind a VIP makes them:
  to the first balancer, and to the second when a connection to the first is refused (the
  address moved; nothing was sent). A read that fails otherwise is a failure;
- JSON-RPC calls through the egress, framed as Ironic's client sends them
  (`ironic/common/json_rpc/client.py` `_request`: `POST http://<host>:<port>/` with a JSON-RPC
  2.0 body, through HTTP_PROXY with the egress credentials), from every instance's egress to
  every other instance's JSON-RPC listener, with a method no conductor has (Ironic answers
  -32601 and does nothing). Counted per (caller's version, callee's version), so old-to-new and
  new-to-old calls are both shown. An instance being replaced is taken out of the rotation
  before it stops and put back once it serves again (its pod is down by design).

Each instance is replaced as the kubelet replaces a pod with a native sidecar: SIGTERM to Ironic,
then to the sidecar (it drains), the new sidecar starts, then Ironic. Then the first balancer,
then the second. Result: 0 failed reads and 0 failed calls. Run by
`scripts/e2e --upgrade-from <commit>`, which builds the old binary.
"""

import argparse
import collections
import os
import random
import subprocess
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import ironic_e2e as base  # noqa: E402

RPC_BODY = {"jsonrpc": "2.0", "method": "ironic_proxy_upgrade_ping",
            "params": {"context": {}}, "id": "upgrade"}


class Summary(base.TitledSummary):
    TITLES = {
        1: "rolling upgrade of 3 sidecars and 2 balancers: 0 failed API reads",
        2: "JSON-RPC through the egress across versions: 0 failed calls",
    }
    HEADING = "ironic-proxy rolling upgrade end-to-end summary (real Ironic, mixed versions)"
    LABEL = "e2e-upgrade"

    def __init__(self, versions):
        super().__init__()
        self.versions = versions

    def extra(self):
        return [f"  {base.ironic_version()}", f"  {self.versions}"]


class Reads(threading.Thread):
    """GET /v1/nodes through the first balancer, the second on a refused connection."""

    def __init__(self, ca, urls):
        super().__init__(daemon=True)
        self.ca, self.urls = ca, urls
        self.reads = self.failures = self.moved = 0
        self.errors = []
        self.stop_event = threading.Event()

    def get(self, url):
        return requests.get(url + "/v1/nodes", headers=h.HEADERS, verify=self.ca, timeout=15)

    def run(self):
        while not self.stop_event.is_set():
            try:
                try:
                    r = self.get(self.urls[0])
                except requests.ConnectionError as e:
                    # A stopping balancer answers every connection it accepted or had queued
                    # (src/listen: the drain serves their first request), so only a refused
                    # one, never a reset, may move to the other balancer.
                    if "Connection refused" not in str(e):
                        raise
                    self.moved += 1
                    r = self.get(self.urls[1])
                ok, detail = r.status_code == 200 and "nodes" in r.json(), f"HTTP {r.status_code}"
            except Exception as e:  # noqa: BLE001 - every failure counts
                ok, detail = False, repr(e)[:300]
            self.reads += 1
            if not ok:
                self.failures += 1
                if len(self.errors) < 10:
                    self.errors.append(f"{time.strftime('%H:%M:%S')} {detail}")
            self.stop_event.wait(0.05)


class Calls(threading.Thread):
    """JSON-RPC calls between live instances through the caller's egress."""

    def __init__(self, e2e):
        super().__init__(daemon=True)
        self.e2e = e2e
        self.lock = threading.Lock()  # held during a call; taking it drains the caller
        self.down = set()
        self.calls = collections.Counter()  # (caller version, callee version) -> calls
        self.failures = 0
        self.errors = []
        self.stop_event = threading.Event()

    def out_of_rotation(self, inst):
        with self.lock:
            self.down.add(inst.ip)

    def back(self, inst):
        with self.lock:
            self.down.discard(inst.ip)

    def call(self, src, dst):
        proxy = (f"http://{h.EGRESS_USER}:{self.e2e.egress_password}@{src.ip}:{h.EGRESS_PORT}")
        r = requests.post(f"http://{dst.ip}:{h.RPC_PORT}", json=RPC_BODY, timeout=15,
                          proxies={"http": proxy})
        body = r.json()
        return r.status_code == 200 and body.get("error", {}).get("code") == -32601, (
            f"HTTP {r.status_code} {r.text[:200]}"
        )

    def run(self):
        while not self.stop_event.is_set():
            with self.lock:
                live = [i for i in self.e2e.instances if i.ip not in self.down]
                if len(live) >= 2:
                    src, dst = random.sample(live, 2)
                    try:
                        ok, detail = self.call(src, dst)
                    except Exception as e:  # noqa: BLE001 - every failure counts
                        ok, detail = False, repr(e)[:300]
                    key = (self.e2e.version_of(src), self.e2e.version_of(dst))
                    self.calls[key] += 1
                    if not ok:
                        self.failures += 1
                        if len(self.errors) < 10:
                            self.errors.append(f"{src.ip}->{dst.ip} {detail}")
            self.stop_event.wait(0.05)


# Keys newer than the build upgraded from, which it would refuse as unknown: an upgrade keeps
# the configuration the old build ran with, and new keys are turned on after it.
NEW_KEYS = ("others",)


def old_compatible(render):
    def wrapped(*a, **kw):
        lines = render(*a, **kw).splitlines(keepends=True)
        return "".join(line for line in lines if not line.strip().startswith(NEW_KEYS))

    return wrapped


class UpgradeE2E(base.E2E):
    def __init__(self, args, summary):
        args.egress = True
        h.egress_listener = old_compatible(h.egress_listener)
        super().__init__(args, summary)
        self.new_bin = os.path.abspath(args.proxy_bin)
        self.old_bin = os.path.abspath(args.old_bin)
        self.bin = self.old_bin  # setup starts everything on the old build
        self.bins = {}  # ip -> binary of its sidecar, once replaced
        self.lb2 = None
        self.lb2_url = None

    def version_of(self, inst):
        return "new" if self.bins.get(inst.ip) == self.new_bin else "old"

    def sidecar_command(self, inst, *command):
        saved = self.bin
        self.bin = self.bins.get(inst.ip, self.old_bin)
        try:
            return super().sidecar_command(inst, *command)
        finally:
            self.bin = saved

    def start_lb2(self, binary):
        port = h.free_port()
        admin = h.free_port()
        conf = os.path.join(self.root, "lb2.toml")
        text = h.lb_config(self.ca_dir, admin, self.dns_port)
        text = text.replace(f'listen = "{h.LB_HOST}:{h.LB_PORT}"', f'listen = "{h.LB_HOST}:{port}"')
        with open(conf, "w") as f:
            f.write(text)
        self.lb2_conf, self.lb2_admin = conf, f"http://127.0.0.1:{admin}"
        self.lb2_url = f"https://{h.LB_HOST}:{port}"
        return self.restart_lb2(binary)

    def restart_lb2(self, binary):
        self.lb2 = self.procs.start(
            "load balancer 2", [binary, "--log-format", "json", "run", "--config", self.lb2_conf],
            os.path.join(self.root, "lb2.log"), env={**os.environ, "RUST_LOG": "info"},
        )  # fmt: skip
        h.wait_for("balancer 2 ready", lambda: requests.get(self.lb2_admin + "/readyz",
                                                             timeout=2).ok, 30)

    def restart_lb1(self, binary):
        self.procs.stop(self.lb, timeout=60)
        lb_conf = os.path.join(self.root, "lb.toml")
        self.lb = self.procs.start(
            "load balancer", [binary, "--log-format", "json", "run", "--config", lb_conf],
            self.lb_log, env={**os.environ, "RUST_LOG": "info"},
        )  # fmt: skip
        h.wait_for("balancer 1 ready with 3 healthy peers",
                   lambda: self.lb_healthy() == 3
                   and requests.get(self.lb_admin + "/readyz", timeout=2).ok, 30)

    def run(self):
        self.setup()
        # The port setup gave dnsmasq, for the second balancer's [dns] servers.
        self.dns_port = int(next(a for a in self.dnsmasq.args if a.startswith("--port="))[7:])
        self.start_lb2(self.old_bin)
        self.bin = self.new_bin
        reads = Reads(self.ca, [base.LB_URL, self.lb2_url])
        calls = Calls(self)
        reads.start()
        calls.start()
        per = []
        with base.Phase(self.s, "rolling upgrade (3 instances, 2 balancers)") as phase:
            time.sleep(2)
            for inst in self.instances:
                t0 = time.monotonic()
                calls.out_of_rotation(inst)
                self.procs.stop(inst.ironic, timeout=60)
                self.procs.stop(inst.sidecar, timeout=60)
                self.bins[inst.ip] = self.new_bin
                self.start_sidecar(inst)
                self.start_ironic(inst)
                h.wait_for(f"Ironic {inst.ip} to serve", lambda i=inst: self.serving(i), 120)
                h.wait_for("the LB to see 3 healthy peers", lambda: self.lb_healthy() == 3, 30)
                calls.back(inst)
                per.append(f"{inst.ip} {time.monotonic() - t0:.1f} s")
                time.sleep(2)  # mixed versions serve together a while
            t0 = time.monotonic()
            self.restart_lb1(self.new_bin)
            per.append(f"balancer 1 {time.monotonic() - t0:.1f} s")
            t0 = time.monotonic()
            self.procs.stop(self.lb2, timeout=60)
            self.restart_lb2(self.new_bin)
            per.append(f"balancer 2 {time.monotonic() - t0:.1f} s")
            time.sleep(2)
        reads.stop_event.set()
        calls.stop_event.set()
        reads.join(timeout=30)
        calls.join(timeout=30)
        self.s.figure("replaced", "; ".join(per))
        self.s.check(
            1, Summary.TITLES[1], reads.reads > 0 and reads.failures == 0,
            f"{reads.reads} reads in {phase.seconds:.1f} s, {reads.failures} failed"
            f"{': ' + str(reads.errors) if reads.errors else ''}; {reads.moved} went to "
            "balancer 2 because balancer 1 refused the connection while it was replaced",
        )
        pairs = ", ".join(f"{a}->{b} {n}" for (a, b), n in sorted(calls.calls.items()))
        mixed = all(calls.calls[k] > 0 for k in [("old", "new"), ("new", "old")])
        total = sum(calls.calls.values())
        self.s.check(
            2, Summary.TITLES[2], total > 0 and calls.failures == 0 and mixed,
            f"{total} calls ({pairs}), {calls.failures} failed"
            f"{': ' + str(calls.errors) if calls.errors else ''}",
        )


def describe(binary):
    p = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return p.stdout.strip() or p.stderr.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy-bin", required=True, help="HEAD's ironic-proxy")
    parser.add_argument("--old-bin", required=True, help="the build to upgrade from")
    parser.add_argument("--old-commit", default="?", help="the commit it was built from")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    versions = (f"from {args.old_commit} ({describe(args.old_bin)}) to HEAD "
                f"({describe(args.proxy_bin)})")
    base.run_scenario(UpgradeE2E, args, Summary(versions))


if __name__ == "__main__":
    main()
