#!/usr/bin/env python3
"""End-to-end test of ironic-proxy against a real distributed Ironic (issue 7, item 1).

Three all-in-one Ironic 39 instances on 127.0.0.2-4 share one MariaDB. Each has its API and its
JSON-RPC server on unix sockets and one ironic-proxy sidecar that terminates TLS for the API and
mutual TLS for JSON-RPC, issues its own short-lived certificate for the instance's IP from a CA
made by `ironic-proxy ca init`, and exports it for Ironic's JSON-RPC client (client_use_ssl).
One more ironic-proxy on 127.0.0.1:6385 is the DaemonSet-style load balancer: it finds the
instances through dnsmasq (A records of ironic.metal3.svc) and speaks TLS to them.

Through the load balancer, the real `baremetal` CLI enrols 9 fake-hardware nodes and drives them
through manage, provide, deploy, power off and on, undeploy and delete, while the test polls the
REST API every 0.2 s. The five assertions of the issue are checked and a summary is printed,
always. Exit status 0 only when all of them pass. Run it through scripts/e2e, which installs
what it needs; docs/e2e.md explains what each assertion proves.
"""

import argparse
import collections
import json
import os
import shutil
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402 - puts tests/support/python on sys.path too
from ironic_proxy_testing import pki  # noqa: E402
import container  # noqa: E402
import egress_checks  # noqa: E402
import operate_checks  # noqa: E402

LB_URL = f"https://{h.LB_HOST}:{h.LB_PORT}"
NODE_COUNT = 9
FAILED_STATES = {"deploy failed", "clean failed", "error", "inspect failed", "manage failed"}
STEP_TIMEOUT = 120  # one provisioning step of 9 nodes; ~10 s is usual
ROTATION_TIMEOUT = 40  # two renewals of every sidecar (one every ~6 s), with room for a slow machine
CONTROL_PATH = "/e2e-control-probe"  # the probe's request, left out of the JSON-RPC counts


def ironic_version():
    """The version of the Ironic this run uses (its package metadata)."""
    try:
        from importlib.metadata import version

        return "Ironic " + version("ironic")
    except Exception as e:  # a summary line must never fail the run
        return f"Ironic (version unknown: {e})"


class Summary:
    """What the run measured and decided; printed at the end whatever happened."""

    def __init__(self):
        self.start = time.monotonic()
        self.timings = []  # (name, seconds)
        self.figures = []  # (name, text)
        self.checks = {}  # number -> (title, ok, detail)
        self.error = None
        self.expected = 6  # 7 with --egress (tests/e2e/egress_checks.py)
        self.image = None  # which sidecar ran from the container image, and how fast it started

    def timing(self, name, seconds):
        self.timings.append((name, seconds))

    def figure(self, name, text):
        self.figures.append((name, text))
        print(f"e2e: {name}: {text}", flush=True)

    def check(self, number, title, ok, detail):
        self.checks[number] = (title, ok, detail)
        print(f"e2e: [{'PASS' if ok else 'FAIL'}] {number}. {title}: {detail}", flush=True)

    @property
    def passed(self):
        return (
            self.error is None
            and len(self.checks) == self.expected
            and all(ok for _, ok, _ in self.checks.values())
        )

    def print(self):
        total = time.monotonic() - self.start
        out = ["", "==== ironic-proxy end-to-end summary (real distributed Ironic) ===="]
        out.append(f"result: {'PASS' if self.passed else 'FAIL'}")
        out.append(f"ironic: {ironic_version()}; sidecar {h.IPS[0]} from `run --profile sidecar` "
                   "(environment only), the others from config files")
        if self.image:
            out.append(f"image: {self.image}")
        if self.error:
            out.append(f"error: {self.error}")
        out.append("timings:")
        before = [
            ("install (apt, Ironic virtualenv)", os.environ.get("E2E_INSTALL_SECONDS")),
            ("build (cargo, debug)", os.environ.get("E2E_BUILD_SECONDS")),
        ]
        before = [(name, float(v)) for name, v in before if v]
        for name, s in before + self.timings:
            out.append(f"  {name:<48} {s:7.1f} s")
        out.append(f"  {'test (setup to cleanup)':<48} {total:7.1f} s")
        if before:
            whole = total + sum(s for _, s in before)
            out.append(f"  {'whole scripts/e2e run':<48} {whole:7.1f} s")
        out.append("figures:")
        for name, text in self.figures:
            out.append(f"  {name}: {text}")
        out.append("assertions:")
        titles = {
            1: "nodes spread over 3 conductors; JSON-RPC crossed instances",
            2: "foreign-CA and plain-HTTP clients refused on JSON-RPC",
            3: "instance killed: LB answers, dead conductor's nodes taken over",
            4: "rolling restart: 0 failed reads through the LB",
            5: "certificate rotation mid-run with 0 failed JSON-RPC calls",
            operate_checks.CHECK: operate_checks.TITLE,
            egress_checks.CHECK: egress_checks.TITLE,
        }
        passed = failed = 0
        for n in range(1, self.expected + 1):
            title, ok, detail = self.checks.get(n, (titles[n], False, "not reached"))
            passed += ok
            failed += not ok
            out.append(f"  [{'PASS' if ok else 'FAIL'}] {n}. {title}")
            out.append(f"         {detail}")
        out.append(f"e2e: {passed} passed, {failed} failed")
        print("\n".join(out), flush=True)


class Phase:
    """Times a block into the summary."""

    def __init__(self, summary, name):
        self.summary, self.name = summary, name

    def __enter__(self):
        print(f"e2e: -- {self.name}", flush=True)
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.t0
        self.summary.timing(self.name, self.seconds)
        return False


class Reader(threading.Thread):
    """Reads /v1/nodes through the load balancer continuously; counts reads and failures."""

    def __init__(self, ca, interval=0.05):
        super().__init__(daemon=True)
        self.ca, self.interval = ca, interval
        self.reads = self.failures = 0
        self.errors = []
        self._stop_event = threading.Event()

    def run(self):
        session = requests.Session()
        while not self._stop_event.is_set():
            try:
                r = session.get(LB_URL + "/v1/nodes", headers=h.HEADERS, verify=self.ca, timeout=15)
                ok = r.status_code == 200 and "nodes" in r.json()
                detail = f"HTTP {r.status_code}: {r.text[:200]}"
            except Exception as e:  # noqa: BLE001 - every failure counts
                ok, detail = False, repr(e)[:300]
            self.reads += 1
            if not ok:
                self.failures += 1
                if len(self.errors) < 10:
                    self.errors.append(f"{time.strftime('%H:%M:%S')} {detail}")
            self._stop_event.wait(self.interval)

    def stop(self):
        self._stop_event.set()
        self.join(timeout=30)


class SerialWatch(threading.Thread):
    """Samples the certificate each sidecar exports; records every change of serial."""

    def __init__(self, instances):
        super().__init__(daemon=True)
        self.instances = instances
        self.changes = {i.ip: [] for i in instances}  # ip -> [(monotonic, serial)]
        self._stop_event = threading.Event()

    def sample(self):
        for inst in self.instances:
            try:
                serial = h.cert_serial(os.path.join(inst.tls_dir, "tls.crt"))
            except (OSError, ValueError):
                continue  # mid-swap or not exported yet
            seen = self.changes[inst.ip]
            if not seen or seen[-1][1] != serial:
                seen.append((time.monotonic(), serial))

    def run(self):
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(0.5)

    def stop(self):
        self._stop_event.set()
        self.join(timeout=10)

    def changes_between(self, ip, t0, t1):
        return sum(1 for t, _ in self.changes[ip][1:] if t0 <= t <= t1)


def tls_probe(ip, port, ca, cert=None, key=None, path="/"):
    """Opens TLS to ip:port (optionally with a client certificate) and sends a request.
    Returns ("answered", status line) or ("refused", why)."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    try:
        with socket.create_connection((ip, port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=ip) as tls:
                tls.sendall(
                    f"GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\n"
                    "Connection: close\r\n\r\n".encode()
                )
                data = b""
                while b"\r\n" not in data:
                    chunk = tls.recv(256)
                    if not chunk:
                        break
                    data += chunk
    except (ssl.SSLError, OSError) as e:
        return "refused", f"{type(e).__name__}: {e}"
    if data.startswith(b"HTTP/"):
        return "answered", data.split(b"\r\n")[0].decode(errors="replace")
    return "refused", f"closed without an HTTP response ({data[:40]!r})"


def plain_probe(ip, port):
    """Speaks plain HTTP to a TLS port. Returns ("answered", status line) or ("refused", why)."""
    try:
        with socket.create_connection((ip, port), timeout=5) as s:
            s.sendall(
                f"POST / HTTP/1.1\r\nHost: {ip}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: 2\r\nConnection: close\r\n\r\n{{}}".encode()
            )
            data = b""
            while len(data) < 256:
                chunk = s.recv(256)
                if not chunk:
                    break
                data += chunk
    except OSError as e:
        return "refused", f"{type(e).__name__}: {e}"
    if data.startswith(b"HTTP/"):
        return "answered", data.split(b"\r\n")[0].decode(errors="replace")
    return "refused", f"closed without an HTTP response ({len(data)} bytes of TLS alert or none)"


class E2E:
    def __init__(self, args, summary):
        # Scenarios built on this class with parsers of their own (auth_e2e, networking_e2e)
        # have no --egress option: they run in export mode.
        if not hasattr(args, "egress"):
            args.egress = False
        self.args = args
        self.s = summary
        self.bin = os.path.abspath(args.proxy_bin)
        self.venv_bin = os.path.dirname(os.path.abspath(sys.executable))
        self.root = tempfile.mkdtemp(prefix="ironic-e2e-")
        os.chmod(self.root, 0o755)
        self.procs = h.Procs()
        self.ca_dir = os.path.join(self.root, "ca")
        self.ca = os.path.join(self.ca_dir, "ca.crt")
        self.instances = [h.Instance(self.root, ip) for ip in h.IPS]
        self.db = h.MariaDB(self.root, self.procs)
        self.lb = None
        self.lb_log = os.path.join(self.root, "lb.log")
        self.lb_admin = None
        self.api = requests.Session()
        self.api_calls = 0
        self.api_5xx = []
        self.cli_calls = 0
        self.names = [f"e2e-node-{i}" for i in range(NODE_COUNT)]
        self.serials = None
        self.deliberate_failures = 0
        # ip -> counters of sidecar processes that were killed or restarted since (their
        # metrics die with them): renewals, and json-rpc handshake failures
        self.renewals_lost = collections.Counter()
        self.rpc_failures_lost = collections.Counter()
        self.egress_password = None
        self.flow_windows = []  # (t0, t1) of the node flows, for rotation counting
        self.wall = {}  # phase -> (wall-clock start, end), to match log timestamps
        # E2E_SIDECAR_IMAGE: the first instance's sidecar runs from this image (container.py).
        self.image = container.image_from_env()
        self.image_desc = None  # "<image> (id ..., size)", once setup found it
        self.image_mounts = None
        self.containers_started = 0
        self.ready_seconds = collections.defaultdict(list)  # ip -> start-to-ready of each start
        self.image_exits = []  # exit status of `podman run` (the container's) after SIGTERM

    # --- plumbing --------------------------------------------------------------------------

    def proxy(self, *argv, what):
        return h.run([self.bin, *argv], what)

    def sidecar_args(self, inst):
        """`run`/`check` arguments and environment of inst's sidecar: its file, or the built-in
        profile with environment variables only."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("IRONIC_PROXY_")}
        if inst.profile_env is None:
            return ["--config", inst.sidecar_conf], {**base, "RUST_LOG": "info"}
        return ["--profile", "sidecar"], {**base, **inst.profile_env, "RUST_LOG": "info"}

    def from_image(self, inst):
        """Whether inst's sidecar runs from the container image: with E2E_SIDECAR_IMAGE, the
        first instance's, the one with the environment-only profile the kit's pods use."""
        return self.image is not None and inst is self.instances[0]

    def sidecar_command(self, inst, *command):
        """(argv, env, container name or None) of `ironic-proxy <command>` for inst's sidecar:
        the host binary, or `podman run` of the image with a container name of its own."""
        args, env = self.sidecar_args(inst)
        if not self.from_image(inst):
            return [self.bin, *command, *args], env, None
        self.containers_started += 1
        name = f"ironic-e2e-{os.getpid()}-{inst.ip.rsplit('.', 1)[1]}-{self.containers_started}"
        inside = {**inst.profile_env, "RUST_LOG": "info"}
        argv = container.argv(self.image, name, inside, self.image_mounts, [*command, *args])
        return argv, dict(os.environ), name

    def start_sidecar(self, inst):
        argv, env, name = self.sidecar_command(inst, "--log-format", "json", "run")
        t0 = time.monotonic()
        inst.sidecar = self.procs.start(
            f"sidecar {inst.ip}", argv, inst.sidecar_log, env=env, container=name
        )

        def up():
            if inst.sidecar.poll() is not None:
                raise h.Failure(
                    f"sidecar {inst.ip} exited ({inst.sidecar.returncode}):\n"
                    + h.tail(inst.sidecar_log, 10)
                )
            files = all(
                os.path.exists(os.path.join(inst.tls_dir, f))
                for f in ("tls.crt", "tls.key", "ca.crt")
            )
            return files and requests.get(inst.admin_url + "/healthz", timeout=2).ok

        h.wait_for(f"sidecar {inst.ip} to export its certificate", up, 30, interval=0.05)
        self.ready_seconds[inst.ip].append(time.monotonic() - t0)
        if self.image is not None:
            self.s.image = self.image_line()

    def image_line(self):
        """The summary's line on the sidecar from the image and its start-to-ready times."""
        first = self.instances[0]
        own = ", ".join(f"{t:.2f} s" for t in self.ready_seconds[first.ip])
        host = sorted(t for i in self.instances[1:] for t in self.ready_seconds[i.ip])
        median = f"{host[len(host) // 2]:.2f} s" if host else "none yet"
        return (
            f"sidecar {first.ip} ran from the image {self.image_desc} (podman, runc, "
            f"--network host --read-only --user {container.UID}:{container.GID}), the others "
            f"from the host binary; start to ready (`podman run` to its certificate exported "
            f"and /healthz 200): {own} ({len(self.ready_seconds[first.ip])} starts); the "
            f"host-binary sidecars' median {median} ({len(host)} starts); exit status after "
            f"SIGTERM in the rolling restart {self.image_exits or 'not reached'}"
        )

    def start_ironic(self, inst):
        egress = h.egress_env(inst, self.egress_password) if self.args.egress else {}
        inst.ironic = self.procs.start(
            f"ironic {inst.ip}",
            [os.path.join(self.venv_bin, "ironic"), "--config-file", inst.conf],
            inst.ironic_log,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **egress},
        )

    def serving(self, inst):
        """Ironic answers through its own sidecar and its conductor is registered alive."""
        if inst.ironic.poll() is not None:
            raise h.Failure(
                f"ironic {inst.ip} exited ({inst.ironic.returncode}):\n"
                + h.tail(inst.ironic_log, 20)
            )
        r = requests.get(
            inst.api_url + "/v1/conductors", headers=h.HEADERS, verify=self.ca, timeout=5
        )
        if r.status_code != 200:
            return False
        return any(c["hostname"] == inst.ip and c["alive"] for c in r.json()["conductors"])

    def lb_healthy(self):
        return h.metric(h.scrape(self.lb_admin), "ironic_proxy_upstream_endpoints", state="healthy")

    def api_get(self, path):
        """GET path through the load balancer; counted, a 5xx recorded, any error raised."""
        self.api_calls += 1
        r = self.api.get(LB_URL + path, headers=h.HEADERS, verify=self.ca, timeout=15)
        if r.status_code >= 500:
            self.api_5xx.append(f"GET {path}: HTTP {r.status_code}: {r.text[:300]}")
        r.raise_for_status()
        return r

    def nodes(self):
        """Our nodes as the API (through the load balancer) lists them."""
        # /detail, not ?fields=: Ironic 39 answers 500 when `fields` names `conductor`, which
        # is computed from the hash ring, not a database column.
        r = self.api_get("/v1/nodes/detail")
        return [n for n in r.json()["nodes"] if n["name"] in self.names]

    def cli(self, *argv, what):
        """The real baremetal CLI, through the load balancer."""
        self.cli_calls += 1
        cmd = [
            os.path.join(self.venv_bin, "baremetal"),
            "--os-endpoint",
            LB_URL,
            "--os-auth-type",
            "none",
            "--os-cacert",
            self.ca,
            "--os-baremetal-api-version",
            "latest",
            *argv,
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            err = (p.stderr.strip() or p.stdout.strip())[-1500:]
            raise h.Failure(f"{what}: `baremetal {' '.join(argv)}` failed: {err}")
        return p.stdout

    def wait_nodes(self, what, done, timeout=STEP_TIMEOUT):
        """Polls the REST API every 0.2 s until done(nodes); fails on any failed state."""
        t0 = time.monotonic()
        while True:
            ns = self.nodes()
            for n in ns:
                if n["provision_state"] in FAILED_STATES:
                    raise h.Failure(
                        f"{what}: node {n['name']} went to '{n['provision_state']}': "
                        f"{n.get('last_error')}"
                    )
            if done(ns):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                states = collections.Counter((n["provision_state"], n["power_state"]) for n in ns)
                raise h.Failure(f"{what}: not done after {timeout} s; states {dict(states)}")
            time.sleep(0.2)

    def step(self, name, cli_args, done):
        with Phase(self.s, name):
            self.cli(*cli_args, what=name)
            self.wait_nodes(name, done)

    # --- the run ---------------------------------------------------------------------------

    def run(self):
        self.setup()
        self.flow_up()
        self.flow_rotation()
        self.probe_rpc_ports()
        self.failover()
        self.flow_power()
        self.restore_victim()
        self.rolling_restart()
        self.flow_down()
        self.analyse()
        # Issue 14: doctor on every instance, JSON-RPC methods per calling conductor.
        operate_checks.run(self)
        if self.args.egress:
            egress_checks.run(self)

    def setup(self):
        with Phase(self.s, "setup (PKI, MariaDB, dnsmasq, 3 instances, LB)"):
            if self.image is not None:  # fails now, never skips, when the image is missing
                self.image_desc = container.describe(self.image)
            busy = [
                f"{host}:{port}"
                for host, port in [(ip, p) for ip in h.IPS for p in (h.RPC_PORT, h.API_PORT)]
                + [(ip, h.ADMIN_PORT) for ip in h.IPS]
                + [(h.LB_HOST, h.LB_PORT)]
                if h.port_in_use(host, port)
            ]
            if busy:
                raise h.Failure(f"ports already in use (another run?): {', '.join(busy)}")

            # The operator CA, constrained to loopback addresses; a foreign CA and a client
            # certificate from it that claims to be instance 127.0.0.2.
            # metal3.svc: the profile sidecar also names itself <pod>.ironic.metal3.svc.
            pki.ca_init(self.bin, self.ca_dir, name="ironic-e2e CA", permit_ip=["127.0.0.0/8"],
                        permit_dns=["metal3.svc"])  # fmt: skip
            foreign = os.path.join(self.root, "foreign")
            pki.ca_init(self.bin, foreign, name="foreign CA", permit_ip=["127.0.0.0/8"],
                        what="foreign ca init")  # fmt: skip
            self.foreign_client = os.path.join(self.root, "foreign-client")
            pki.issue(self.bin, foreign, self.foreign_client, ips=[h.IPS[0]], validity="1h",
                      what="cert issue (foreign)")  # fmt: skip

            self.db.start()
            dns_port = h.free_port()
            self.dnsmasq = h.start_dnsmasq(self.root, self.procs, dns_port, h.IPS)

            # The first instance's sidecar runs from the built-in profile, with environment
            # variables only (as a pod spec gives them); the others from their files.
            self.instances[0].profile_env = h.sidecar_profile_env(
                self.instances[0], self.ca_dir, h.IPS
            )
            # --egress: one credentials file that Ironic's HTTP_PROXY and every sidecar share.
            cred = os.path.join(self.root, "egress.credentials")
            if self.args.egress:
                self.egress_password = secrets.token_urlsafe(18)
                with open(cred, "w") as f:
                    f.write(f"{h.EGRESS_USER}:{self.egress_password}\n")
                self.instances[0].profile_env.update(h.egress_profile_env(self.instances[0], cred))
                self.s.expected = egress_checks.CHECK
            if self.image is not None:
                first = self.instances[0]
                self.image_mounts = container.prepare(first, self.ca_dir, first.profile_env)
            for inst in self.instances:
                with open(inst.sidecar_conf, "w") as f:
                    f.write(h.sidecar_config(inst, self.ca_dir, h.IPS))
                    if self.args.egress:
                        f.write(h.egress_listener(inst, h.IPS, cred))
                with open(inst.conf, "w") as f:
                    conf = h.ironic_conf(inst, self.db.url)
                    f.write(h.egress_ironic_conf(conf) if self.args.egress else conf)
                argv, env, name = self.sidecar_command(inst, "check")
                how = f"{self.sidecar_args(inst)[0][0]}{', image' if name else ''}"
                h.run(argv, f"check sidecar {inst.ip} ({how})", env=env)
            self.lb_admin = f"http://127.0.0.1:{h.free_port()}"
            lb_conf = os.path.join(self.root, "lb.toml")
            with open(lb_conf, "w") as f:
                f.write(h.lb_config(self.ca_dir, self.lb_admin.rsplit(":", 1)[1], dns_port))
            self.proxy("check", "--config", lb_conf, what="check LB config")

            h.run(
                [os.path.join(self.venv_bin, "ironic-dbsync"), "--config-file",
                 self.instances[0].conf, "create_schema"],
                "ironic-dbsync create_schema",
            )  # fmt: skip

            # Sidecars first: Ironic's JSON-RPC client needs the exported certificate.
            for inst in self.instances:
                self.start_sidecar(inst)
            self.serials = SerialWatch(self.instances)
            self.serials.start()
            for inst in self.instances:
                self.start_ironic(inst)
            for inst in self.instances:
                h.wait_for(f"Ironic {inst.ip} to serve", lambda i=inst: self.serving(i), 120)

            self.lb = self.procs.start(
                "load balancer",
                [self.bin, "--log-format", "json", "run", "--config", lb_conf],
                self.lb_log,
                env={**os.environ, "RUST_LOG": "info"},
            )
            h.wait_for(
                "the load balancer to be ready with 3 healthy peers",
                lambda: (
                    self.lb_healthy() == 3 and requests.get(self.lb_admin + "/readyz", timeout=2).ok
                ),
                30,
            )
            r = requests.get(LB_URL + "/v1", headers=h.HEADERS, verify=self.ca, timeout=10)
            if r.status_code != 200:
                raise h.Failure(f"GET {LB_URL}/v1 through the LB: HTTP {r.status_code}")

    def conductors_of(self, ns):
        return dict(collections.Counter(n["conductor"] for n in ns))

    def flow_up(self):
        t0 = time.monotonic()
        path = os.path.join(self.root, "nodes.json")
        with open(path, "w") as f:
            json.dump(
                {
                    "nodes": [
                        {"name": name, "uuid": u, "driver": "fake-hardware"}
                        for name, u in zip(
                            self.names, h.spread_uuids(NODE_COUNT // len(h.IPS)), strict=True
                        )
                    ]
                },
                f,
            )
        n = NODE_COUNT
        self.step(
            "enrol 9 nodes (baremetal create)",
            ["create", path],
            lambda ns: len(ns) == n,
        )
        self.spread_enrolled = self.conductors_of(self.nodes())
        self.step(
            "manage",
            ["node", "manage", *self.names],
            lambda ns: sum(x["provision_state"] == "manageable" for x in ns) == n,
        )
        self.step(
            "provide (cleaning)",
            ["node", "provide", *self.names],
            lambda ns: sum(x["provision_state"] == "available" for x in ns) == n,
        )
        self.step(
            "deploy",
            ["node", "deploy", *self.names],
            lambda ns: sum(x["provision_state"] == "active" for x in ns) == n,
        )
        self.spread = self.conductors_of(self.nodes())
        self.s.figure(
            "nodes per conductor",
            f"after enrol {self.spread_enrolled}, after deploy {self.spread}",
        )
        self.flow_windows.append((t0, time.monotonic()))

    def flow_rotation(self):
        """Validates every node through the load balancer (each validation is a JSON-RPC call to
        the node's conductor, most of them on another instance) until every sidecar has renewed
        its certificate twice since the phase began. The node flows alone last a few seconds on
        a fast machine, less than the renewal period, so whether a renewal fell inside them was
        left to timing; this phase makes rotation under JSON-RPC traffic happen on every run."""
        t0 = time.monotonic()
        deadline = t0 + ROTATION_TIMEOUT
        with Phase(self.s, "JSON-RPC calls until every sidecar renewed twice"):
            calls = 0
            while True:
                for name in self.names:
                    self.api_get(f"/v1/nodes/{name}/validate")
                    calls += 1
                if self.args.egress:
                    # Past the egress pool's 5 s idle expiry: the next round's calls open new
                    # TLS connections to the peers, each with the identity current then.
                    time.sleep(5.5)
                now = time.monotonic()
                renewed = {i.ip: self.serials.changes_between(i.ip, t0, now) for i in self.instances}
                if all(v >= 2 for v in renewed.values()):
                    break
                if now > deadline:
                    raise h.Failure(
                        f"rotation phase: serial changes after {ROTATION_TIMEOUT} s {renewed} "
                        "(every sidecar should renew about every 6 s)"
                    )
        self.s.figure(
            "rotation phase",
            f"{calls} node validations (JSON-RPC calls) in {now - t0:.1f} s; serial changes {renewed}",
        )
        self.flow_windows.append((t0, now))

    def rpc_handshake_failures(self, inst):
        """json-rpc handshake failures counted by the sidecar process running now."""
        return h.metric(
            h.scrape(inst.admin_url),
            "ironic_proxy_tls_handshake_failures_total",
            listener="json-rpc",
        )

    def save_sidecar_counters(self, inst):
        """Keeps the counters of a sidecar that is about to be killed or restarted."""
        try:
            samples = h.scrape(inst.admin_url)
        except requests.RequestException:
            return
        self.renewals_lost[inst.ip] += h.metric(samples, "ironic_proxy_certificate_renewals_total")
        self.rpc_failures_lost[inst.ip] += h.metric(
            samples, "ironic_proxy_tls_handshake_failures_total", listener="json-rpc"
        )

    def probe_rpc_ports(self):
        with Phase(self.s, "JSON-RPC port probes"):
            target = self.instances[0]
            before = self.rpc_handshake_failures(target)
            # A control: a genuine conductor certificate (instance .3's, read from one export
            # generation) is answered, so a refusal below is the proxy's decision.
            gen = os.path.realpath(os.path.join(self.instances[1].tls_dir, "..data"))
            control = tls_probe(
                target.ip, h.RPC_PORT, self.ca,
                os.path.join(gen, "tls.crt"), os.path.join(gen, "tls.key"), CONTROL_PATH,
            )  # fmt: skip
            foreign = tls_probe(
                target.ip, h.RPC_PORT, self.ca,
                os.path.join(self.foreign_client, "tls.crt"),
                os.path.join(self.foreign_client, "tls.key"),
            )  # fmt: skip
            nocert = tls_probe(target.ip, h.RPC_PORT, self.ca)
            plain = plain_probe(target.ip, h.RPC_PORT)
            time.sleep(0.5)  # the proxy counts the failure when it closes the connection
            after = self.rpc_handshake_failures(target)
            self.deliberate_failures = 3
            counted = after - before
            ok = (
                control[0] == "answered"
                and foreign[0] == "refused"
                and nocert[0] == "refused"
                and plain[0] == "refused"
                and counted == self.deliberate_failures
            )
            self.s.check(
                2,
                "foreign-CA and plain-HTTP clients refused on JSON-RPC",
                ok,
                f"on {target.ip}:{h.RPC_PORT}: foreign-CA cert -> {foreign[0]} ({foreign[1]}); "
                f"no cert -> {nocert[0]} ({nocert[1]}); plain HTTP -> {plain[0]} ({plain[1]}); "
                f"control with a genuine conductor cert -> {control[0]} ({control[1]}); "
                f"handshake failures counted by the sidecar: {counted:.0f} (expected 3)",
            )

    def owners_in_db(self, uuids):
        with self.db.connect() as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT n.uuid, c.hostname FROM nodes n "
                "LEFT JOIN conductors c ON c.id = n.conductor_affinity"
            )
            return {u: host for u, host in cur.fetchall() if u in uuids}

    def failover(self):
        victim = self.instances[2]
        survivors = {i.ip for i in self.instances if i is not victim}
        ns = self.nodes()
        victims = {n["uuid"] for n in ns if n["conductor"] == victim.ip}
        if not victims:
            raise h.Failure(f"no node is mapped to {victim.ip} before the kill: {ns}")
        affinity_before = self.owners_in_db(victims)
        self.save_sidecar_counters(victim)
        reader = Reader(self.ca)
        reader.start()
        time.sleep(1)
        w0 = time.time()
        with Phase(self.s, f"failover: kill Ironic + sidecar of {victim.ip}") as phase:
            t0 = time.monotonic()
            self.procs.kill(victim.ironic)
            self.procs.kill(victim.sidecar)

            streak = {"n": 0, "since": None}

            def routed():
                mapped = {n["uuid"]: n["conductor"] for n in self.nodes()}
                if all(mapped.get(u) in survivors for u in victims):
                    if streak["n"] == 0:
                        streak["since"] = time.monotonic()
                    streak["n"] += 1
                else:
                    streak["n"] = 0
                return streak["n"] >= 5  # every survivor's API agrees (the LB alternates)

            h.wait_for("the API to route the dead conductor's nodes elsewhere", routed, 90)
            t_routed = streak["since"] - t0
            after = h.wait_for(
                "the surviving conductors to take the dead conductor's nodes over",
                lambda: (lambda o: o if all(o.get(u) in survivors for u in victims) else None)(
                    self.owners_in_db(victims)
                ),
                90,
            )
            t_takeover = time.monotonic() - t0
            time.sleep(1)
        reader.stop()
        self.wall["failover"] = (w0, time.time())
        self.victim = victim
        self.s.figure(
            "takeover after killing " + victim.ip,
            f"API routed its {len(victims)} nodes to survivors after {t_routed:.1f} s; "
            f"conductor_affinity moved (takeover done) after {t_takeover:.1f} s "
            f"(affinity before {sorted(set(affinity_before.values()))}, "
            f"after {dict(collections.Counter(after.values()))})",
        )
        self.s.figure(
            "LB health changes during the failover",
            ", ".join(self.lb_health_changes("failover")) or "none",
        )
        self.s.figure(
            "reads through the LB during the failover",
            f"{reader.reads} reads, {reader.failures} failed"
            + (f": {reader.errors}" if reader.errors else ""),
        )
        self.failover_result = (victim, victims, t_routed, t_takeover, reader, phase.seconds)

    def lb_retries(self, phase):
        """Requests the load balancer retried on another endpoint during a phase (its log)."""
        t0, t1 = self.wall[phase]
        return sum(
            1
            for e in h.proxy_events(self.lb_log)
            if e.get("message") == "retrying on another endpoint" and t0 <= h.event_time(e) <= t1
        )

    def lb_health_changes(self, phase):
        """The load balancer's endpoint health changes during a phase, from its log."""
        t0, t1 = self.wall[phase]
        out = []
        for e in h.proxy_events(self.lb_log):
            t = h.event_time(e)
            if e.get("message") == "endpoint health changed" and t0 <= t <= t1:
                endpoint = e.get("span", {}).get("endpoint", "?").split(":")[0]
                out.append(f"+{t - t0:.1f}s {endpoint} {e.get('from')}->{e.get('to')}")
        return out

    def flow_power(self):
        """Power off and on, on two instances: the taken-over nodes obey their new owners."""
        t0 = time.monotonic()
        n = NODE_COUNT
        self.step(
            "power off (2 instances left)",
            ["node", "power", "off", *self.names],
            lambda ns: sum(x["power_state"] == "power off" for x in ns) == n,
        )
        self.step(
            "power on (2 instances left)",
            ["node", "power", "on", *self.names],
            lambda ns: sum(x["power_state"] == "power on" for x in ns) == n,
        )
        self.flow_windows.append((t0, time.monotonic()))
        victim, victims, t_routed, t_takeover, reader, _ = self.failover_result
        self.s.check(
            3,
            "instance killed: LB answers, dead conductor's nodes taken over",
            reader.failures == 0 and reader.reads > 0,
            f"killed Ironic and its sidecar on {victim.ip} (SIGKILL); LB reads "
            f"{reader.reads}, failed {reader.failures} (LB retries on another endpoint "
            f"{self.lb_retries('failover')}); its {len(victims)} nodes routed to "
            f"survivors after {t_routed:.1f} s, taken over (conductor_affinity) after "
            f"{t_takeover:.1f} s; then power off/on of all 9 nodes succeeded on 2 instances",
        )

    def wait_three_conductors(self, timeout=60):
        streak = {"n": 0}

        def all_three():
            ok = set(self.conductors_of(self.nodes())) == set(h.IPS)
            streak["n"] = streak["n"] + 1 if ok else 0
            return streak["n"] >= 5

        h.wait_for("every API to map nodes to all 3 conductors again", all_three, timeout)

    def restore_victim(self):
        victim = self.victim
        with Phase(self.s, f"restart Ironic + sidecar of {victim.ip}"):
            self.start_sidecar(victim)
            self.start_ironic(victim)
            h.wait_for(f"Ironic {victim.ip} to serve", lambda: self.serving(victim), 120)
            h.wait_for("the LB to see 3 healthy peers", lambda: self.lb_healthy() == 3, 30)
            self.wait_three_conductors()

    def rolling_restart(self):
        reader = Reader(self.ca)
        reader.start()
        time.sleep(1)
        per = []
        w0 = time.time()
        # Each instance is replaced as the kubelet replaces a pod with a native sidecar: SIGTERM
        # to Ironic, then (once it is gone) SIGTERM to its sidecar, which drains; a while down;
        # then the sidecar starts first (a fresh identity, exported anew) and Ironic after it.
        with Phase(self.s, "rolling restart of the 3 instances (Ironic + sidecar)") as phase:
            for inst in self.instances:
                t0 = time.monotonic()
                stopped = self.procs.stop(inst.ironic, timeout=60)
                self.save_sidecar_counters(inst)
                drained = self.procs.stop(inst.sidecar, timeout=60)
                if self.from_image(inst):
                    self.image_exits.append(inst.sidecar.returncode)
                time.sleep(2)  # the pod stays down a while, as in a real restart
                self.start_sidecar(inst)
                self.start_ironic(inst)
                h.wait_for(f"Ironic {inst.ip} to serve again", lambda i=inst: self.serving(i), 120)
                h.wait_for("the LB to see 3 healthy peers", lambda: self.lb_healthy() == 3, 30)
                per.append(
                    f"{inst.ip} {time.monotonic() - t0:.1f} s (Ironic stop {stopped:.1f} s, "
                    f"sidecar drain {drained:.1f} s)"
                )
            time.sleep(2)
        reader.stop()
        self.wall["rolling restart"] = (w0, time.time())
        retried = self.lb_retries("rolling restart")
        self.s.figure("rolling restart per instance", "; ".join(per))
        self.s.figure(
            "LB health changes during the rolling restart",
            ", ".join(self.lb_health_changes("rolling restart")) or "none",
        )
        self.s.check(
            4,
            "rolling restart: 0 failed reads through the LB",
            reader.failures == 0 and reader.reads > 0,
            f"{reader.reads} reads of /v1/nodes in {phase.seconds:.1f} s, "
            f"{reader.failures} failed"
            + (f": {reader.errors}" if reader.errors else "")
            + f"; the LB retried {retried} requests on another endpoint meanwhile (a sidecar "
            "answers 502 while its Ironic is down, and refuses connections while it is down "
            "itself)",
        )
        self.wait_three_conductors()

    def flow_down(self):
        t0 = time.monotonic()
        n = NODE_COUNT
        self.step(
            "undeploy (cleaning)",
            ["node", "undeploy", *self.names],
            lambda ns: sum(x["provision_state"] == "available" for x in ns) == n,
        )
        self.step("delete", ["node", "delete", *self.names], lambda ns: not ns)
        self.flow_windows.append((t0, time.monotonic()))

    # --- assertions from logs and metrics --------------------------------------------------

    def analyse(self):
        self.serials.stop()
        matrix = collections.Counter()
        rpc_total = 0
        rpc_errors = []
        hs_rpc = {}
        hs_api = 0
        renewed_logged = collections.Counter()
        identity_events = {ip: [] for ip in h.IPS}  # ip -> [(time, "issued" | "renewed")]
        connections = {}  # (callee, client address) -> [caller, opened, [call times]]
        # The access log names a client by its certificate's first SAN: the IP for the sidecars
        # with a config file, <pod>.ironic.metal3.svc for the one from the profile.
        aliases = {
            f"{i.profile_env['POD_NAME']}.ironic.metal3.svc": i.ip
            for i in self.instances
            if i.profile_env is not None
        }
        for inst in self.instances:
            hs_rpc[inst.ip] = 0
            for e in h.proxy_events(inst.sidecar_log):
                # tracing's JSON puts the fields at the top level (older layouts: "fields").
                f = e.get("fields", e)
                if f.get("message") == "issued our certificate":
                    identity_events[inst.ip].append((h.event_time(e), "issued"))
                if f.get("message") == "renewed our certificate":
                    renewed_logged[inst.ip] += 1
                    identity_events[inst.ip].append((h.event_time(e), "renewed"))
                if f.get("message") == "TLS handshake failed":
                    if f.get("listener") == "json-rpc":
                        hs_rpc[inst.ip] += 1
                    else:
                        hs_api += 1
                if e.get("target") != "access" or f.get("listener") != "json-rpc":
                    continue
                if f.get("path") == CONTROL_PATH:
                    continue
                rpc_total += 1
                caller = aliases.get(f.get("identity"), f.get("identity"))
                matrix[(caller, inst.ip)] += 1
                t = h.event_time(e)
                conn = connections.setdefault(
                    (inst.ip, f.get("client")), [caller, t, []]
                )
                conn[2].append(t)
                status = int(f.get("status", 0))
                if status >= 500 or status == 0:
                    rpc_errors.append(f"{inst.ip}: {f.get('method')} {f.get('path')} {status}")
        cross = sum(c for (caller, callee), c in matrix.items() if caller != callee)

        def renewed_at(ip, t):
            """Whether the certificate ip's sidecar held at time t was a renewed one."""
            state = None
            for when, kind in identity_events.get(ip, []):
                if when > t:
                    break
                state = kind
            return state == "renewed"

        # A connection's first request comes right after its handshake, for which Ironic's
        # client read the exported files and the sidecar presented its current certificate.
        rotated_conns = sum(
            1
            for (callee, _), (caller, opened, _) in connections.items()
            if renewed_at(caller, opened) and renewed_at(callee, opened)
        )
        old_conn_calls = sum(
            1
            for caller, opened, calls in connections.values()
            for t in calls
            if t - opened > h.SIDECAR_VALIDITY_SECONDS
        )
        callees = {callee for (caller, callee) in matrix if caller != callee}
        callers = {caller for (caller, callee) in matrix if caller != callee}
        self.s.figure(
            "JSON-RPC calls through the sidecars",
            f"{rpc_total} in total, {cross} crossed instances; caller->callee "
            + ", ".join(f"{a}->{b}: {c}" for (a, b), c in sorted(matrix.items())),
        )
        spread_ok = set(self.spread) == set(h.IPS) and set(self.spread_enrolled) == set(h.IPS)
        self.s.check(
            1,
            "nodes spread over 3 conductors; JSON-RPC crossed instances",
            spread_ok and cross > 0 and callees == set(h.IPS) and callers == set(h.IPS),
            f"conductors {self.spread}; {cross} of {rpc_total} JSON-RPC calls crossed "
            f"instances (counted from the sidecars' access logs: json-rpc lines whose client "
            f"identity differs from the sidecar's IP); every instance called and was called "
            f"by another: {callees == set(h.IPS) and callers == set(h.IPS)}",
        )

        # Rotation: serials seen, renewals counted, and nothing failed because of it.
        # Renewals: the metric of each sidecar process (plus what the killed one had counted)
        # and the sidecars' "renewed our certificate" log lines, which survive restarts.
        renewals = {}
        for inst in self.instances:
            samples = h.scrape(inst.admin_url)
            renewals[inst.ip] = h.metric(
                samples, "ironic_proxy_certificate_renewals_total"
            ) + self.renewals_lost[inst.ip]
        during_flows = {
            ip: sum(self.serials.changes_between(ip, a, b) for a, b in self.flow_windows)
            for ip in h.IPS
        }
        distinct = {ip: len({s for _, s in self.serials.changes[ip]}) for ip in h.IPS}
        first = self.instances[0]
        metric_rpc_failures = self.rpc_handshake_failures(first) + self.rpc_failures_lost[first.ip]
        ssl_errors = []
        for inst in self.instances:
            with open(inst.ironic_log, errors="replace") as f:
                for line in f:
                    if any(
                        k in line
                        for k in ("SSLError", "CERTIFICATE_VERIFY_FAILED", "key values mismatch")
                    ):
                        ssl_errors.append(f"{inst.ip}: {line.strip()[:200]}")
        self.s.figure(
            "certificate rotation (validity "
            f"{h.SIDECAR_VALIDITY}, renew_before {h.SIDECAR_RENEW_BEFORE})",
            "renewals (metric) "
            + ", ".join(f"{ip}={v:.0f}" for ip, v in renewals.items())
            + "; renewals (logs) "
            + ", ".join(f"{ip}={renewed_logged[ip]}" for ip in h.IPS)
            + "; distinct serials exported "
            + ", ".join(f"{ip}={v}" for ip, v in distinct.items())
            + "; serial changes during the node flows "
            + ", ".join(f"{ip}={v}" for ip, v in during_flows.items()),
        )
        self.s.figure(
            "JSON-RPC connections",
            f"{len(connections)} opened; {rotated_conns} of them after both ends' certificates "
            f"had been renewed; {old_conn_calls} calls rode keep-alive connections older than "
            f"the certificate that opened them",
        )
        self.s.figure(
            "TLS handshake failures",
            f"json-rpc (from the sidecars' logs) {hs_rpc}, of which deliberate "
            f"{self.deliberate_failures}; api listeners {hs_api}",
        )
        self.s.figure(
            "API calls",
            f"{self.cli_calls} baremetal CLI commands, {self.api_calls} REST polls, "
            f"{len(self.api_5xx)} answered 5xx",
        )
        ok = (
            all(v >= 1 for v in renewals.values())
            and all(renewed_logged[ip] >= 1 for ip in h.IPS)
            # Every instance rotates at least twice while JSON-RPC calls flow: the rotation
            # phase runs until that holds, so this fails only if renewal or its sampling broke.
            and all(v >= 2 for v in during_flows.values())
            and rotated_conns >= 1
            and not rpc_errors
            and sum(hs_rpc.values()) == self.deliberate_failures
            and metric_rpc_failures == self.deliberate_failures
            and not self.api_5xx
            and not ssl_errors
        )
        self.s.check(
            5,
            "certificate rotation mid-run with 0 failed JSON-RPC calls",
            ok,
            f"renewals {sum(renewals.values()):.0f} "
            f"(serial changes during the node flows {during_flows}); {rotated_conns} JSON-RPC "
            f"connections opened with renewed certificates at both ends; JSON-RPC calls failed "
            f"{len(rpc_errors)} of {rpc_total}{': ' + str(rpc_errors[:5]) if rpc_errors else ''}; "
            f"API 5xx {len(self.api_5xx)}{': ' + str(self.api_5xx[:3]) if self.api_5xx else ''}; "
            f"json-rpc handshake failures {sum(hs_rpc.values())} (deliberate "
            f"{self.deliberate_failures}, metric on {self.instances[0].ip} "
            f"{metric_rpc_failures:.0f}); TLS errors in Ironic logs {len(ssl_errors)}"
            + (f": {ssl_errors[:3]}" if ssl_errors else ""),
        )

    # --- cleanup ---------------------------------------------------------------------------

    def dump_logs(self):
        logs = [(f"sidecar {i.ip}", i.sidecar_log) for i in self.instances]
        logs += [(f"ironic {i.ip}", i.ironic_log) for i in self.instances]
        logs += [("load balancer", self.lb_log), ("mariadb", self.db.log)]
        for name, path in logs:
            if os.path.exists(path):
                print(f"---- last lines of {name} ({path}) ----\n{h.tail(path, 25)}")
        # The proxies' own events (health, retries, renewals) drown in their access lines.
        for name, path in [("load balancer", self.lb_log)] + [
            (f"sidecar {i.ip}", i.sidecar_log) for i in self.instances
        ]:
            if os.path.exists(path):
                events = [
                    json.dumps(e)[:300]
                    for e in h.proxy_events(path)
                    if e.get("target") != "access" and e.get("message") != "renewed our certificate"
                ]
                print(f"---- last events of {name} (no access lines) ----")
                print("\n".join(events[-40:]))

    def cleanup(self, failed):
        if self.serials:
            self.serials.stop()
        self.procs.cleanup(first=[self.lb], last=[self.db.proc])
        if failed:
            self.dump_logs()
        if self.args.keep:
            print(f"e2e: kept {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


class TitledSummary(Summary):
    """The summary of a scenario with a fixed list of numbered checks (TITLES), a HEADING and a
    LABEL for its closing "LABEL: N passed, N failed" line; EXTRA lines follow the result."""

    TITLES = {}
    HEADING = ""
    LABEL = ""

    def extra(self):
        return []

    @property
    def passed(self):
        return (
            self.error is None
            and len(self.checks) == len(self.TITLES)
            and all(ok for _, ok, _ in self.checks.values())
        )

    def print(self):
        out = ["", f"==== {self.HEADING} ===="]
        out.append(f"result: {'PASS' if self.passed else 'FAIL'}")
        out.extend(self.extra())
        if self.image:
            out.append(f"image: {self.image}")
        if self.error:
            out.append(f"error: {self.error}")
        for name, s in self.timings:
            out.append(f"  {name:<48} {s:7.1f} s")
        for name, text in self.figures:
            out.append(f"  {name}: {text}")
        passed = failed = 0
        for n, title in self.TITLES.items():
            title, ok, detail = self.checks.get(n, (title, False, "not reached"))
            passed += ok
            failed += not ok
            out.append(f"  [{'PASS' if ok else 'FAIL'}] {n}. {title}")
            out.append(f"         {detail}")
        out.append(f"{self.LABEL}: {passed} passed, {failed} failed")
        print("\n".join(out), flush=True)


def run_scenario(scenario, args, summary):
    """Runs one scenario class (E2E or a subclass) with SIGTERM as an exit, always cleans up and
    prints the summary, and exits 0 when every check passed, 1 otherwise."""

    def terminate(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    e2e = None
    try:
        e2e = scenario(args, summary)
        e2e.run()
    except h.Failure as e:
        summary.error = str(e)
    except BaseException as e:  # noqa: BLE001 - always clean up and print the summary
        summary.error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        if e2e is not None:
            e2e.cleanup(failed=not summary.passed)
        summary.print()
    sys.exit(0 if summary.passed else 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy-bin", required=True, help="the ironic-proxy binary")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--egress",
        action="store_true",
        help="Ironic's JSON-RPC client without TLS, through each sidecar's egress listener",
    )
    args = parser.parse_args()

    run_scenario(E2E, args, Summary())


if __name__ == "__main__":
    main()
