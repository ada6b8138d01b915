#!/usr/bin/env python3
"""End-to-end test of boot-file routing against a real distributed Ironic (issue 12).

Three all-in-one Ironic 39 instances on 127.0.0.2-4 share one MariaDB, with the `ipxe` boot
interface and the `ramdisk` deploy interface (fake power and management), each with its own
`[deploy]http_root` served by a real static HTTP server (`python3 -m http.server`) on
<ip>:6180 and `[deploy]http_url` pointing at it. Each instance has an ironic-proxy sidecar whose
API listener is `tls = "optional"` on <ip>:6385: TLS to Ironic's API on its unix socket, and
over plain HTTP only a `find = "newest"` route for `boot.ipxe`, `pxelinux.cfg/*`,
`grub.cfg-01-*` (local = its own file server, peers = every file server through DNS). One more
ironic-proxy on 127.0.0.1:6385 is the load balancer, with the same route whose endpoints are the
sidecars (TLS), so its fan-out reaches each sidecar, which answers from its own files only
(loop safety).

What Ironic 39 writes (read in the installed package): `boot.ipxe` at conductor start into
http_root (`common/pxe_utils.py` create_ipxe_boot_script, template
`drivers/modules/boot.ipxe`: `chain pxelinux.cfg/${mac:hexhyp}`, relative to its own URL); on
deploy with the ramdisk interface (`drivers/modules/ramdisk.py` deploy -> boot.prepare_instance)
`<uuid>/config` plus the symlinks `pxelinux.cfg/<mac with hyphens>` (`_get_pxe_mac_path`),
`grub.cfg-01-<mac>` and `<mac>.conf` (`_get_pxe_grub_mac_path`), only on the owning conductor;
undeploy removes them; takeover of an active node calls prepare_instance again on the new owner
(`RamdiskDeploy.prepare`).

Run it through scripts/e2e-boot (`flock /tmp/ironic-e2e.lock scripts/e2e-boot`).
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import traceback

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402 - puts tests/support/python on sys.path too
from ironic_proxy_testing import pki  # noqa: E402
import ipxe_tls  # noqa: E402
import ipxe_tls_vm  # noqa: E402
import vm  # noqa: E402

HTTP_PORT = 6180  # Ironic's httpd in Metal3
IPXE_TLS_PORT = 8084  # ironic-image's IPXE_TLS_PORT default (scripts/tls-common.sh)
LB = f"127.0.0.1:{h.LB_PORT}"
NODES_PER_CONDUCTOR = 2
STEP_TIMEOUT = 120
HERE = os.path.dirname(os.path.abspath(__file__))
UNKNOWN_MAC = "52:54:00:ff:ff:01"


def boot_route(inst):
    """The API listener's find route for the per-node iPXE files, over every instance's httpd."""
    return f"""
[[listeners.routes]]
paths = ["/boot.ipxe", "/pxelinux.cfg/*", "/grub.cfg-01-*"]
plaintext = true
[listeners.routes.upstream]
local = "{inst.ip}:{HTTP_PORT}"
dns = "{h.SERVICE}:{HTTP_PORT}"
find = "newest"
find_timeout = "2s"
health = {{ path = "/boot.ipxe", interval = "1s", timeout = "1s", unhealthy_after = 1, healthy_after = 1 }}
"""


def sidecar_config(inst, ca_dir, loopback_port=None):
    """harness.sidecar_config with the API listener on one port for TLS and plain boot files.
    With loopback_port, the same listener once more on 127.0.0.1 (name `api-loopback`): the
    iPXE of a QEMU user-mode guest reaches the host's 127.0.0.1 only (vm.py)."""
    base = h.sidecar_config(inst, ca_dir, h.IPS)
    old = f'tls = "server"\nupstream = "unix:{inst.api_sock}"\n'
    if old not in base:
        raise h.Failure("harness.sidecar_config changed shape; update boot_e2e.sidecar_config")
    new = f"""tls = "optional"
upstream = "unix:{inst.api_sock}"
{boot_route(inst)}"""
    # iPXE over TLS on ironic-image's IPXE_TLS_PORT: the same find route, and the instance's own
    # httpd for everything else (the kernel and ramdisk URLs name the owner's address).
    new += f"""
[[listeners]]
name = "boot-tls"
listen = "{inst.ip}:{IPXE_TLS_PORT}"
tls = "server"
http2 = false
upstream = "{inst.ip}:{HTTP_PORT}"
{boot_route(inst).replace("plaintext = true", "plaintext = false")}"""
    if loopback_port is not None:
        new += f"""
[[listeners]]
name = "api-loopback"
listen = "127.0.0.1:{loopback_port}"
tls = "optional"
upstream = "unix:{inst.api_sock}"
{boot_route(inst)}"""
    return base.replace(old, new) + f'\n[dns]\nservers = ["127.0.0.1:{{dns_port}}"]\nrefresh = "2s"\n'


def kernel_script(u):
    """The "kernel" of node u: an iPXE script. iPXE's `kernel` selects only an image it can run
    (8 KiB of zeros would be taken for a PXE program and jumped into), and a script is one: once
    booted it names the node whose kernel it is on the console, lists the images iPXE holds (the
    ramdisk, with its size) and stops at iPXE's shell. Padded to 8 KiB with a comment; Ironic
    sees a raw image."""
    s = f"#!ipxe\necho e2e kernel {u} on ${{net0/mac}}\nimgstat\nshell\n"
    return s + "#" * (8191 - len(s)) + "\n"


def lb_config(ca_dir, admin_port, dns_port, extra_ips=()):
    ips = ", ".join(f'"{ip}"' for ip in (h.LB_HOST, *extra_ips))
    return f"""# Load balancer with the boot-file route (written by tests/e2e/boot_e2e.py).
[identity]
trust = "{ca_dir}/ca.crt"
issuer_cert = "{ca_dir}/ca.crt"
issuer_key = "{ca_dir}/ca.key"
ip_addresses = [{ips}]
validity = "1h"

[admin]
listen = "127.0.0.1:{admin_port}"

[dns]
servers = ["127.0.0.1:{dns_port}"]
refresh = "2s"

[[listeners]]
name = "api"
listen = "{LB}"
tls = "optional"
[listeners.upstream]
dns = "{h.SERVICE}:{h.API_PORT}"
tls = true
health = {{ path = "/", interval = "2s", timeout = "1s", unhealthy_after = 2, healthy_after = 1 }}

[[listeners.routes]]
paths = ["/boot.ipxe", "/pxelinux.cfg/*", "/grub.cfg-01-*"]
plaintext = true
[listeners.routes.upstream]
dns = "{h.SERVICE}:{h.API_PORT}"
tls = true
find = "newest"
find_timeout = "2s"
health = {{ path = "/boot.ipxe", interval = "1s", timeout = "1s", unhealthy_after = 1, healthy_after = 1 }}
"""


def ironic_conf(inst, db_url, images, tls=False):
    """harness.ironic_conf with iPXE boot and ramdisk deploy (docs/e2e.md, "Boot files").
    tls: [deploy]http_url on the sidecar's boot-TLS listener, so the configs name https."""
    conf = h.ironic_conf(inst, db_url)
    conf = conf.replace("enabled_boot_interfaces = fake", "enabled_boot_interfaces = ipxe,fake")
    conf = conf.replace(
        "enabled_deploy_interfaces = fake", "enabled_deploy_interfaces = ramdisk,fake"
    )
    conf = conf.replace(
        "[conductor]\n",
        f"[conductor]\nautomated_clean = false\nfile_url_allowed_paths = {images}\n",
    )
    return conf + f"""
[deploy]
http_url = {f"https://{inst.ip}:{IPXE_TLS_PORT}" if tls else f"http://{inst.ip}:{HTTP_PORT}"}
http_root = {inst.http_root}

[pxe]
tftp_root = {inst.dir}/tftp
tftp_master_path = {inst.dir}/tftp/master_images
instance_master_path = {inst.dir}/master_images
"""


class Boot:
    def __init__(self, args):
        self.args = args
        self.bin = os.path.abspath(args.proxy_bin)
        self.venv_bin = os.path.dirname(os.path.abspath(sys.executable))
        self.root = tempfile.mkdtemp(prefix="ironic-boot-e2e-")
        os.chmod(self.root, 0o755)
        self.procs = h.Procs()
        self.ca_dir = os.path.join(self.root, "ca")
        self.ca = os.path.join(self.ca_dir, "ca.crt")
        self.images = os.path.join(self.root, "images")
        self.vm_dir = os.path.join(self.root, "vm")  # each VM's console, screenshot, QEMU log
        self.lb_log = os.path.join(self.root, "lb.log")
        self.qemu = vm.require_qemu()
        self.instances = [h.Instance(self.root, ip) for ip in h.IPS]
        for inst in self.instances:
            inst.http_root = os.path.join(inst.dir, "httproot")
            os.makedirs(inst.http_root)
            os.makedirs(os.path.join(inst.dir, "tftp", "master_images"))
            os.makedirs(os.path.join(inst.dir, "master_images"))
            inst.http = None
            inst.http_log = os.path.join(inst.dir, "http.log")
        self.db = h.MariaDB(self.root, self.procs)
        self.api = requests.Session()
        self.api.verify = self.ca
        self.api.trust_env = False  # no proxy from the environment: loopback only
        self.api.headers.update(h.HEADERS)
        self.results = []  # (name, ok, detail)
        self.nodes = {}  # uuid -> mac
        # --tls: the TLS boot routes as iPXE uses them (tests/e2e/ipxe_tls_vm.py).
        self.tls = args.tls
        self.http_port, self.ipxe_tls_port = HTTP_PORT, IPXE_TLS_PORT

    # --- plumbing ------------------------------------------------------------------------------

    def check(self, name, ok, detail=""):
        self.results.append((name, bool(ok), detail))
        print(f"e2e-boot: {'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)

    def start_http(self, inst):
        inst.http = self.procs.start(
            f"http {inst.ip}",
            [sys.executable, os.path.join(HERE, "static_httpd.py"), str(HTTP_PORT),
             "--bind", inst.ip, "--directory", inst.http_root],
            inst.http_log,
        )  # fmt: skip
        h.wait_for(f"http server {inst.ip}", lambda: h.port_in_use(inst.ip, HTTP_PORT), 10)

    def start_proxy(self, name, conf, log):
        return self.procs.start(
            name,
            [self.bin, "--log-format", "json", "run", "--config", conf],
            log,
            env={**os.environ, "RUST_LOG": "info"},
        )

    def lb_get(self, path, method="GET", tls=False):
        scheme = "https" if tls else "http"
        return self.api.request(method, f"{scheme}://{LB}{path}", timeout=15)

    def sidecar_get(self, inst, path, method="GET", tls=False):
        scheme = "https" if tls else "http"
        return self.api.request(method, f"{scheme}://{inst.ip}:{h.API_PORT}{path}", timeout=15)

    def node(self, u):
        r = self.api.get(f"https://{LB}/v1/nodes/{u}", timeout=15)
        r.raise_for_status()
        return r.json()

    def provision(self, uuids, target, state):
        for u in uuids:
            r = self.api.put(
                f"https://{LB}/v1/nodes/{u}/states/provision", json={"target": target}, timeout=30
            )
            if r.status_code != 202:
                raise h.Failure(f"{target} {u}: HTTP {r.status_code}: {r.text[:300]}")

        def done():
            states = [self.node(u) for u in uuids]
            for n in states:
                if n["provision_state"] in ("deploy failed", "clean failed", "error"):
                    raise h.Failure(f"{n['uuid']} -> {n['provision_state']}: {n['last_error']}")
            return all(n["provision_state"] == state for n in states)

        h.wait_for(f"{len(uuids)} nodes {state}", done, STEP_TIMEOUT)

    def owner(self, u):
        ip = self.node(u)["conductor"]
        return next(i for i in self.instances if i.ip == ip)

    def mac_path(self, u):
        return "/pxelinux.cfg/" + self.nodes[u].replace(":", "-")

    def on_disk(self, inst, path):
        with open(inst.http_root + path, "rb") as f:
            return f.read()

    # --- the run -------------------------------------------------------------------------------

    def setup(self):
        busy = [
            f"{ip}:{p}"
            for ip in h.IPS
            for p in (h.RPC_PORT, h.API_PORT, h.ADMIN_PORT, HTTP_PORT, IPXE_TLS_PORT)
            if h.port_in_use(ip, p)
        ] + ([LB] if h.port_in_use(h.LB_HOST, h.LB_PORT) else [])
        if busy:
            raise h.Failure(f"ports already in use (another run?): {', '.join(busy)}")
        if self.tls:
            ipxe_tls_vm.use_test_ca(self.ca_dir, self.bin)
        else:
            pki.ca_init(self.bin, self.ca_dir, name="boot-e2e CA", permit_ip=["127.0.0.0/8"])
        os.makedirs(self.images)
        with open(os.path.join(self.images, "ramdisk"), "wb") as f:
            f.write(b"\0" * 8192)
        self.db.start()
        dns_port = self.dns_port = h.free_port()
        h.start_dnsmasq(self.root, self.procs, dns_port, h.IPS)
        self.vm_port = h.free_port()
        for inst in self.instances:
            loopback = self.vm_port if inst is self.instances[0] else None
            with open(inst.sidecar_conf, "w") as f:
                f.write(
                    sidecar_config(inst, self.ca_dir, loopback).replace(
                        "{dns_port}", str(dns_port)
                    )
                )
            with open(inst.conf, "w") as f:
                f.write(ironic_conf(inst, self.db.url, self.images, self.tls))
            h.run([self.bin, "check", "--config", inst.sidecar_conf], "check sidecar config")
        self.lb_admin = f"http://127.0.0.1:{h.free_port()}"
        lb_conf = os.path.join(self.root, "lb.toml")
        with open(lb_conf, "w") as f:
            f.write(lb_config(self.ca_dir, self.lb_admin.rsplit(":", 1)[1], dns_port,
                              [ipxe_tls_vm.DIALLED] if self.tls else []))
        h.run([self.bin, "check", "--config", lb_conf], "check LB config")
        h.run([os.path.join(self.venv_bin, "ironic-dbsync"), "--config-file",
               self.instances[0].conf, "create_schema"], "ironic-dbsync")  # fmt: skip
        for inst in self.instances:
            self.start_http(inst)
            inst.sidecar = self.start_proxy(f"sidecar {inst.ip}", inst.sidecar_conf, inst.sidecar_log)
        for inst in self.instances:
            h.wait_for(
                f"sidecar {inst.ip} exports its certificate",
                lambda i=inst: os.path.exists(os.path.join(i.tls_dir, "tls.crt")),
                30,
            )
            inst.ironic = self.procs.start(
                f"ironic {inst.ip}",
                [os.path.join(self.venv_bin, "ironic"), "--config-file", inst.conf],
                inst.ironic_log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        for inst in self.instances:

            def serving(i=inst):
                if i.ironic.poll() is not None:
                    raise h.Failure(f"ironic {i.ip} exited:\n" + h.tail(i.ironic_log, 20))
                r = self.api.get(f"https://{i.ip}:{h.API_PORT}/v1/conductors", timeout=5)
                return r.ok and any(
                    c["hostname"] == i.ip and c["alive"] for c in r.json()["conductors"]
                )

            h.wait_for(f"Ironic {inst.ip} to serve", serving, 120)
        self.lb = self.start_proxy("load balancer", lb_conf, self.lb_log)
        h.wait_for(
            "the load balancer ready, its boot route with 3 healthy sidecars",
            lambda: requests.get(self.lb_admin + "/readyz", timeout=2).ok
            and h.metric(
                h.scrape(self.lb_admin),
                "ironic_proxy_upstream_endpoints",
                upstream="api/routes[0]",
                state="healthy",
            )
            == 3,
            60,
        )

    def deploy(self):
        images = self.images
        for i, u in enumerate(h.spread_uuids(NODES_PER_CONDUCTOR)):
            mac = f"52:54:00:00:00:{i + 1:02x}"
            with open(os.path.join(images, f"kernel-{i}"), "w") as f:
                f.write(kernel_script(u))
            r = self.api.post(
                f"https://{LB}/v1/nodes",
                json={
                    "name": f"boot-e2e-{i}",
                    "uuid": u,
                    "driver": "fake-hardware",
                    "boot_interface": "ipxe",
                    "deploy_interface": "ramdisk",
                    "network_interface": "noop",
                    "instance_info": {
                        "kernel": f"file://{images}/kernel-{i}",
                        "ramdisk": f"file://{images}/ramdisk",
                    },
                },
                timeout=30,
            )
            if r.status_code != 201:
                raise h.Failure(f"create node: HTTP {r.status_code}: {r.text[:300]}")
            r = self.api.post(
                f"https://{LB}/v1/ports", json={"address": mac, "node_uuid": u}, timeout=30
            )
            if r.status_code != 201:
                raise h.Failure(f"create port: HTTP {r.status_code}: {r.text[:300]}")
            self.nodes[u] = mac
        uuids = list(self.nodes)
        self.provision(uuids, "manage", "manageable")
        self.provision(uuids, "provide", "available")
        self.provision(uuids, "active", "active")
        owners = {self.owner(u).ip for u in uuids}
        self.check("every instance owns a deployed node", owners == set(h.IPS), f"{owners}")

    def served_by_all(self, fn):
        """fn(get) for the sidecar of the first instance and for the load balancer."""
        first = self.instances[0]
        return [
            ("sidecar", fn(lambda p, **kw: self.sidecar_get(first, p, **kw))),
            ("lb", fn(lambda p, **kw: self.lb_get(p, **kw))),
        ]

    def boot_files(self):
        ipxe = self.served_by_all(lambda get: get("/boot.ipxe"))
        self.check(
            "boot.ipxe 200 over plain HTTP",
            all(r.status_code == 200 and b"chain pxelinux.cfg/" in r.content for _, r in ipxe),
            str([(w, r.status_code) for w, r in ipxe]),
        )
        bad = []
        for u in self.nodes:
            owner = self.owner(u)
            want = self.on_disk(owner, self.mac_path(u))
            for who, r in self.served_by_all(lambda get, u=u: get(self.mac_path(u))):
                if r.status_code != 200 or r.content != want:
                    bad.append(f"{who} {u}: {r.status_code}")
            if f"http://{owner.ip}:{HTTP_PORT}/".encode() not in want:
                bad.append(f"{u}: owner's config does not name the owner's http_url")
        self.check("every node's pxelinux.cfg/<mac> 200, byte-equal to the owner's", not bad, str(bad))

        unknown = self.served_by_all(lambda get: get("/pxelinux.cfg/52-54-00-ff-ff-ff"))
        self.check(
            "unknown MAC 404 without Retry-After",
            all(r.status_code == 404 and "Retry-After" not in r.headers for _, r in unknown),
            str([(w, r.status_code, dict(r.headers)) for w, r in unknown]),
        )
        u = next(iter(self.nodes))
        same = []
        for who, (g, hd) in self.served_by_all(
            lambda get: (get(self.mac_path(u)), get(self.mac_path(u), method="HEAD"))
        ):
            keys = ("Content-Length", "Last-Modified", "Content-Type")
            same.append(
                (who, hd.status_code == g.status_code and all(
                    g.headers.get(k) == hd.headers.get(k) for k in keys))
            )  # fmt: skip
        self.check("HEAD matches GET", all(ok for _, ok in same), str(same))
        post = self.served_by_all(lambda get: get(self.mac_path(u), method="POST"))
        self.check(
            "POST 405 with Allow",
            all(r.status_code == 405 and r.headers.get("Allow") == "GET, HEAD" for _, r in post),
            str([(w, r.status_code) for w, r in post]),
        )
        v1 = self.served_by_all(lambda get: get("/v1"))
        v1_tls = self.served_by_all(lambda get: get("/v1", tls=True))
        self.check(
            "/v1 403 over plain HTTP, 200 over TLS on the same port",
            all(r.status_code == 403 for _, r in v1) and all(r.status_code == 200 for _, r in v1_tls),
            str([(w, r.status_code) for w, r in v1 + v1_tls]),
        )

    def owner_http_killed(self):
        victim = self.instances[1]
        theirs = [u for u in self.nodes if self.owner(u) is victim]
        others = [u for u in self.nodes if self.owner(u) is not victim]
        self.procs.stop(victim.http)
        time.sleep(0.5)
        bad = []
        for u in theirs:
            for who, r in self.served_by_all(lambda get, u=u: get(self.mac_path(u))):
                if r.status_code != 502 or "Retry-After" in r.headers:
                    bad.append(f"{who} owner's {u}: {r.status_code}")
        for u in others:
            for who, r in self.served_by_all(lambda get, u=u: get(self.mac_path(u))):
                if r.status_code != 200:
                    bad.append(f"{who} other {u}: {r.status_code}")
        self.check("owner's HTTP server killed: its nodes 502, the others 200", not bad, str(bad))
        self.start_http(victim)
        # Until the health checks pass again, a find that finds nothing answers 502 (the
        # unavailable endpoint may be the owner), not 404: wait for them.
        self.wait_routes_healthy()

    def wait_routes_healthy(self):
        """Until every endpoint of both boot routes is available again: an unknown MAC is then
        asked of all of them and answers 404 (502 while one of them is still unavailable). The
        endpoint gauges are published once a second, so they can still read healthy right after
        a failure; the answer itself cannot."""

        def all_404():
            return all(
                r.status_code == 404
                for _, r in self.served_by_all(lambda get: get("/pxelinux.cfg/52-54-00-ff-ff-fe"))
            )

        h.wait_for("every boot route endpoint available again (an unknown MAC 404)", all_404, 30)

    def stale_copy(self):
        u = next(u for u in self.nodes if self.owner(u) is self.instances[2])
        path = self.mac_path(u)
        stale = self.instances[0].http_root + path
        os.makedirs(os.path.dirname(stale), exist_ok=True)
        with open(stale, "wb") as f:
            f.write(b"#!ipxe\necho stale copy from an old owner\n")
        past = time.time() - 3600
        os.utime(stale, (past, past))
        want = self.on_disk(self.instances[2], path)
        got = self.served_by_all(lambda get: get(path))
        self.check(
            "stale older copy on another instance: the owner's newer copy served",
            all(r.status_code == 200 and r.content == want for _, r in got),
            str([(w, r.status_code, r.content[:40]) for w, r in got]),
        )
        os.unlink(stale)

    def undeploy_one(self):
        u = next(iter(self.nodes))
        self.provision([u], "deleted", "available")
        got = self.served_by_all(lambda get: get(self.mac_path(u)))
        self.check(
            "after undeploy: 404",
            all(r.status_code == 404 for _, r in got),
            str([(w, r.status_code) for w, r in got]),
        )
        del self.nodes[u]

    def takeover(self):
        victim = self.instances[2]
        theirs = [u for u in self.nodes if self.owner(u) is victim]
        old = {u: self.on_disk(victim, self.mac_path(u)) for u in theirs}
        self.procs.kill(victim.ironic)
        t0 = time.monotonic()
        # Each API instance computes a node's "conductor" from its own hash ring, refreshed on
        # its own schedule, so for a while one of them (behind the load balancer) still names
        # the victim. Keep the owners from the one answer that named none.
        owners = {}

        def moved():
            now = {u: self.owner(u) for u in theirs}
            if any(o is victim for o in now.values()):
                return False
            owners.clear()
            owners.update(now)
            return True

        def taken():
            return moved() and all(
                os.path.exists(o.http_root + self.mac_path(u)) for u, o in owners.items()
            )

        how = "taken over"
        try:
            h.wait_for("the killed conductor's nodes taken over", taken, 90)
        except h.Failure:
            # Not rewritten by the takeover: redeploy (rebuild) on the new owner.
            how = "rebuilt"
            self.provision(theirs, "rebuild", "active")
            h.wait_for("an answer naming the new owners", moved, 30)
        bad = []
        for u in theirs:
            new_owner = owners[u]
            want = self.on_disk(new_owner, self.mac_path(u))
            if want == old[u]:
                bad.append(f"{u}: the new owner's config equals the old one")
            for who, r in self.served_by_all(lambda get, u=u: get(self.mac_path(u))):
                if r.status_code != 200 or r.content != want:
                    bad.append(f"{who} {u}: {r.status_code} {r.content[:60]!r}")
        self.check(
            f"conductor killed, nodes {how} in {time.monotonic() - t0:.0f} s: new owner's file "
            "served (the old owner's copy still on its HTTP server)",
            not bad and theirs,
            str(bad),
        )

    # --- a real iPXE in a VM (issue 33) ---------------------------------------------------------

    def vm_plan(self):
        """(via, node or None) per VM, one VM at a time: every node once, the two nodes of each
        owner through different paths (so each path boots a node of every conductor), then an
        unknown MAC through each. E2E_BOOT_VMS=all boots every node through both paths."""
        by_owner = {}
        for u in self.nodes:
            by_owner.setdefault(self.owner(u).ip, []).append(u)
        both = os.environ.get("E2E_BOOT_VMS") == "all"
        plan = []
        for ip in sorted(by_owner):
            for k, u in enumerate(by_owner[ip]):
                vias = ("sidecar", "lb") if both else (("sidecar", "lb")[k % 2],)
                plan += [(via, u) for via in vias]
        return plan + [("sidecar", None), ("lb", None)]

    def access(self, log, listener, b):
        """The proxy's access lines of one listener from the VM (QEMU's user network connects
        from 127.0.0.1) while it ran."""
        return [
            e
            for e in h.proxy_events(log)
            if e.get("target") == "access"
            and e.get("listener") == listener
            and e.get("client", "").startswith("127.0.0.1:")
            and b.started <= h.event_time(e) <= b.ended + 0.5
        ]

    def access_any(self, log, listener, b):
        """The proxy's access lines of one listener while the VM ran, from any client (QEMU
        connects to 127.0.0.x from that address)."""
        return [
            e
            for e in h.proxy_events(log)
            if e.get("target") == "access"
            and e.get("listener") == listener
            and b.started <= h.event_time(e) <= b.ended + 0.5
        ]

    def httpd_lines(self, inst, b):
        """The requests an instance's httpd served while the VM ran (static_httpd.py's log)."""
        out = []
        with open(inst.http_log, errors="replace") as f:
            for line in f:
                if line.startswith("{"):
                    e = json.loads(line)
                    if b.started - 0.5 <= e["time"] <= b.ended + 0.5:
                        out.append(e)
        return out

    def ipxe_vm(self, via, u, verbose):
        first = self.instances[0]
        port, log, listener = {
            "sidecar": (self.vm_port, first.sidecar_log, "api-loopback"),
            "lb": (h.LB_PORT, self.lb_log, "api"),
        }[via]
        url = f"http://10.0.2.2:{port}/boot.ipxe"
        mac = self.nodes[u] if u else UNKNOWN_MAC
        config = "/pxelinux.cfg/" + mac.replace(":", "-")
        if u:
            owner = self.owner(u)
            marker = f"e2e kernel {u} on {mac}"
            b = vm.boot(self.vm_dir, f"{via}-{u[:8]}", mac, url, [marker], then=["iPXE>"])
        else:
            owner, marker = None, "PXE boot failed! No configuration found"
            b = vm.boot(self.vm_dir, f"{via}-unknown", mac, url, [marker],
                        then=["No more network devices"])  # fmt: skip
        time.sleep(0.3)  # access lines are written at most 100 ms after the request
        lines = self.access(log, listener, b)
        got = [(e["method"], e["path"], e["status"], e["bytes"]) for e in lines]
        ipxe = self.on_disk(first, "/boot.ipxe")
        if u:
            want = [("GET", "/boot.ipxe", 200, len(ipxe)),
                    ("GET", config, 200, len(self.on_disk(owner, config)))]  # fmt: skip
        else:
            want = [("GET", "/boot.ipxe", 200, len(ipxe)), ("GET", config, 404)]
            got = [g if g[2] == 200 else g[:3] for g in got]  # a 404's body is the proxy's
        direct, ua, bad = {}, "-", []
        if u:
            for e in self.httpd_lines(owner, b):
                name = e["path"].rsplit("/", 1)[-1]
                if e["path"] in (f"/{u}/kernel", f"/{u}/ramdisk") and e["status"] == 200:
                    direct[name] = e["bytes"]
                    ua = e["user_agent"]
                    if e["bytes"] != os.path.getsize(f"{owner.http_root}/{u}/{name}"):
                        bad.append(f"{name}: {e['bytes']} bytes served, not the owner's size")
            if set(direct) != {"kernel", "ramdisk"}:
                bad.append(f"owner's httpd served {direct}, not the kernel and the ramdisk")
            proxied = [e["user_agent"] for e in self.httpd_lines(owner, b) if e["path"] == config]
            if not ua.startswith("iPXE/") or ua not in proxied:
                bad.append(f"User-Agent {ua!r} direct, {proxied} through the proxy")
        if marker not in b.seen:
            bad.append(f"never on the console: {marker!r}")
        if got != want:
            bad.append(f"access log {got}, expected {want}")
        t_boot = b.seen.get(marker)
        t_ipxe = h.event_time(lines[0]) - b.started if lines else None
        summary = (
            f"{via} {mac}" + (f" (node {u[:8]}, owner {owner.ip})" if u else " (unknown)")
            + f": boot.ipxe at {t_ipxe or 0:.1f} s, "
            + (f"`boot` at {t_boot or 0:.1f} s" if u else f"'{marker}' at {t_boot or 0:.1f} s")
            + f"; {listener} access log {got}"
            + (f"; owner's httpd direct {direct}, User-Agent {ua}" if u else "")
        )  # fmt: skip
        print(f"e2e-boot: iPXE VM {summary}", flush=True)
        if verbose or bad:
            start = next((i for i, r in enumerate(b.transcript) if "Features:" in r), 0)
            shown = b.transcript[start:]
            print("  console:\n    " + "\n    ".join(r for r in shown if r), flush=True)
        what = "booted its own kernel" if u else "got 404, then iPXE's script gave up as written"
        self.check(f"iPXE VM through the {via}: {'node ' + u[:8] if u else 'unknown MAC'} {what}",
                   not bad, "; ".join(bad))  # fmt: skip
        return t_boot

    def ipxe_vms(self):
        def all_404():
            url = f"http://127.0.0.1:{self.vm_port}/pxelinux.cfg/52-54-00-ff-ff-fe"
            return requests.get(url, timeout=5).status_code == 404

        h.wait_for("the sidecar's loopback listener's boot route", all_404, 30)
        times = {"sidecar": [], "lb": []}
        t0 = time.monotonic()
        plan = self.vm_plan()
        for n, (via, u) in enumerate(plan):
            t = self.ipxe_vm(via, u, verbose=n == 0 or (u is None and via == "sidecar"))
            if u and t:
                times[via].append(t)
        for via, ts in times.items():
            if ts:
                spread = f"min {min(ts):.1f} s, max {max(ts):.1f} s over {len(ts)} nodes"
                print(f"e2e-boot: iPXE VM through the {via}: QEMU start to `boot` {spread}",
                      flush=True)  # fmt: skip
        print(f"e2e-boot: {len(plan)} VMs in {time.monotonic() - t0:.0f} s", flush=True)

    # --- boot files over TLS (issue 33) -----------------------------------------------------------

    def tls_boot(self):
        """The sidecars' `boot-tls` listener (ironic-image's IPXE_TLS_PORT) with clients that
        offer exactly what iPXE offers; Debian's real iPXE given an https:// boot file URL."""
        first = self.instances[0]
        at = f"{first.ip}:{IPXE_TLS_PORT}"
        u = next(u for u in self.nodes if self.owner(u) is not first)
        owner, config = self.owner(u), self.mac_path(u)
        request = (f"GET {config} HTTP/1.1\r\nHost: {at}\r\nUser-Agent: iPXE/2.0.0\r\n"
                   "Connection: close\r\n\r\n")  # fmt: skip
        want = self.on_disk(owner, config)
        keys = ("Protocol version", "Ciphersuite", "Signature type", "Hash used",
                "Server Temp Key", "Verification")  # fmt: skip
        for prof in (ipxe_tls.CURRENT, ipxe_tls.V2_0):
            info, out, err = ipxe_tls.s_client(at, prof, self.ca, request)
            shown = {k: info.get(k) for k in keys}
            print(f"e2e-boot: TLS as {prof.name} to {at}: {shown}", flush=True)
            head, _, body = out.partition(b"\r\n\r\n")
            self.check(
                f"TLS boot listener: a client offering only what {prof.name} offers gets TLS "
                "1.2 and the owner's config found across conductors",
                info.get("Protocol version") == "TLSv1.2" and info.get("Verification") == "OK"
                and head.split(b" ")[1:2] == [b"200"] and body == want,
                f"{out[:80]!r} {err[-300:]}" if not out.endswith(want) else "",
            )  # fmt: skip
        bad = []
        for n in self.nodes:
            o, path = self.owner(n), self.mac_path(n)
            for url, disk in [
                (f"https://{at}/boot.ipxe", self.on_disk(first, "/boot.ipxe")),
                (f"https://{at}{path}", self.on_disk(o, path)),
                (f"https://{o.ip}:{IPXE_TLS_PORT}/{n}/kernel", self.on_disk(o, f"/{n}/kernel")),
            ]:
                status, body = ipxe_tls.curl(url, ipxe_tls.CURRENT, self.ca)
                if status != 200 or body != disk:
                    bad.append(f"{url}: {status}, {len(body)} bytes")
        self.check("TLS boot listener with iPXE 2.0's offer (curl): boot.ipxe, every node's "
                   "config and kernel byte-equal to the owner's", not bad, str(bad))  # fmt: skip
        refused = []
        for prof in (ipxe_tls.RSA_ONLY, ipxe_tls.V1_21):
            t0 = time.time()
            info, out, err = ipxe_tls.s_client(at, prof, self.ca, request)
            alert = next((line.strip() for line in err.splitlines() if "alert" in line), err[-200:])
            time.sleep(0.3)
            why = [
                e.get("detail")
                for e in h.proxy_events(first.sidecar_log)
                if e.get("message") == "TLS handshake failed"
                and e.get("listener") == "boot-tls"
                and h.event_time(e) >= t0
            ]
            said = [p for p in alert.split(":") if "alert" in p]  # OpenSSL's error line
            print(f"e2e-boot: TLS as {prof.name}: client: {said}; "
                  f"proxy: {why}", flush=True)  # fmt: skip
            refused.append(not out and "handshake failure" in alert and len(why) == 1)
        self.check("TLS boot listener (ECDSA P-256 certificate): iPXE offers without ECDSA "
                   "(RSA-only builds, 1.21.1) fail the handshake",
                   all(refused), str(refused))  # fmt: skip

        # Debian's iPXE has no https:// opener: it never connects. The load balancer serves
        # the same URL over TLS to a client that has one.
        status, _ = ipxe_tls.curl(f"https://{LB}/boot.ipxe", ipxe_tls.CURRENT, self.ca)
        text = "Could not start download: Operation not supported"
        url = f"https://10.0.2.2:{h.LB_PORT}/boot.ipxe"
        b = vm.boot(self.vm_dir, "lb-https", self.nodes[u], url, [text],
                    then=["No more network devices"])  # fmt: skip
        time.sleep(0.3)
        lines = self.access(self.lb_log, "api", b)
        feature = next((r for r in b.transcript if r.startswith("Features:")), "?")
        print(f"e2e-boot: Debian's iPXE, boot file {url}: "
              f"{feature!r}; {text!r} at {b.seen.get(text, 0):.1f} s; load balancer access "
              f"lines {len(lines)}; the same URL with curl: {status}", flush=True)  # fmt: skip
        self.check("Debian's iPXE cannot fetch https:// (no HTTPS feature, never connects)",
                   text in b.seen and "HTTPS" not in feature and not lines and status == 200,
                   f"{b.seen} {feature} {lines} {status}")  # fmt: skip

    def kit_files(self):
        """config/sidecar-boot-tls.toml (the kit's TLS boot listeners) checks with a sidecar's
        environment, and the boot-files component carries byte-equal copies of both files."""
        repo = os.path.dirname(os.path.dirname(HERE))
        # A CA of its own: the test's CA permits 127.0.0.0/8 only, the kit names service DNS.
        ca_dir = os.path.join(self.root, "kit-ca")
        pki.ca_init(self.bin, ca_dir, name="kit CA", what="ca init (kit)")
        env = {
            **os.environ, "POD_NAME": "ironic-0", "POD_NAMESPACE": "metal3",
            "POD_IPS": "127.0.0.1", "IRONIC_PROXY_PEER_CIDRS": "127.0.0.0/8",
            "IRONIC_PROXY_TRUST": f"{ca_dir}/ca.crt", "IRONIC_PROXY_ISSUER_DIR": ca_dir,
            "IRONIC_PROXY_EXPORT_DIR": os.path.join(self.root, "kit-export"),
            "IRONIC_PROXY_HTPASSWD": os.path.join(self.root, "kit-htpasswd"),
            "IRONIC_PROXY_EGRESS_CREDENTIALS": os.path.join(self.root, "kit-egress"),
            "IRONIC_PROXY_METRICS_TOKEN_FILE": os.path.join(self.root, "kit-metrics-token"),
        }  # fmt: skip
        with open(env["IRONIC_PROXY_EGRESS_CREDENTIALS"], "w") as f:
            f.write("ironic:0123456789abcdef")
        with open(env["IRONIC_PROXY_METRICS_TOKEN_FILE"], "w") as f:
            f.write("0123456789abcdef0123456789abcdef\n")
        import bcrypt  # from the Ironic virtualenv, as auth_e2e.py uses it

        with open(env["IRONIC_PROXY_HTPASSWD"], "wb") as f:
            f.write(b"admin:" + bcrypt.hashpw(b"x", bcrypt.gensalt(5)) + b"\n")
        out = h.run([self.bin, "check", "--config", f"{repo}/config/sidecar-boot-tls.toml"],
                    "check config/sidecar-boot-tls.toml", env=env).stdout  # fmt: skip
        same = all(
            open(f"{repo}/config/{n}", "rb").read()
            == open(f"{repo}/config/k8s/components/boot-files/{n}", "rb").read()
            for n in ("sidecar-boot.toml", "sidecar-boot-tls.toml")
        )
        self.check("kit: sidecar-boot-tls.toml checks (boot-tls on 8084, vmedia-tls on 6183), "
                   "the boot-files component's copies are byte-equal",
                   same and 'listen = "[::]:8084"' in out and 'listen = "[::]:6183"' in out,
                   f"copies equal: {same}")  # fmt: skip

    def find_metrics(self):
        for name, url in [("sidecar", self.instances[0].admin_url), ("lb", self.lb_admin)]:
            s = h.scrape(url)
            counts = {
                o: h.metric(s, "ironic_proxy_find_total", outcome=o)
                for o in ("found", "not_found", "failed", "no_endpoint")
            }
            print(f"e2e-boot: {name} ironic_proxy_find_total {counts}", flush=True)

    def run(self):
        if self.tls:
            self.setup()
            self.deploy()
            route = boot_route(self.instances[0]).replace("plaintext = true", "plaintext = false")
            ipxe_tls_vm.run_all(self, self.dns_port, route)
            self.find_metrics()
            return
        self.setup()
        self.kit_files()
        self.deploy()
        self.boot_files()
        self.ipxe_vms()
        self.tls_boot()
        self.owner_http_killed()
        self.stale_copy()
        self.undeploy_one()
        self.takeover()
        self.find_metrics()

    def cleanup(self, failed):
        self.procs.cleanup(last=[self.db.proc] if self.db.proc else [])
        if failed or self.args.keep:
            print(f"e2e-boot: logs kept in {self.root}")
        else:
            import shutil

            shutil.rmtree(self.root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy-bin", required=True)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--tls", action="store_true",
                        help="the TLS boot listeners as iPXE uses them: real TLS clients, or the HTTPS "
                        "iPXE IPXE_TLS_DIR names (ipxe_tls_vm.py)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda s, _f: (_ for _ in ()).throw(SystemExit(128 + s)))
    t0 = time.monotonic()
    boot, error = None, None
    try:
        boot = Boot(args)
        boot.run()
    except (h.Failure, vm.VmError) as e:
        error = str(e)
    except BaseException as e:  # noqa: BLE001 - always clean up and print the summary
        error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    results = boot.results if boot else []
    passed = error is None and results and all(ok for _, ok, _ in results)
    if boot is not None:
        boot.cleanup(failed=not passed)
    print("\n==== ironic-proxy boot-file end-to-end summary (real distributed Ironic) ====")
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + ("" if ok else f"  ({detail})"))
    if error:
        print(f"error: {error}")
    print(f"result: {'PASS' if passed else 'FAIL'} in {time.monotonic() - t0:.0f} s")
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
