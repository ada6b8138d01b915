#!/usr/bin/env python3
"""Metal3's scale tooling through the HA layout (issue 51; docs/e2e.md "Scale").

Three all-in-one Ironic instances (PyPI, the e2e's virtualenv) configured as the kit configures
them, sushy-tools' fake system driver with N systems and fake-ipa from the pinned tree, in
shards (tests/e2e/scale_setup.py). N hosts go through enrol, manage, inspect, provide (automated
cleaning) and deploy, driven as baremetal-operator drives them (tests/e2e/scale_driver.py).

Modes: ironic-proxy (default: a sidecar per instance with the egress, the ironic-proxy
balancer on 127.0.0.11:6385, lookups and heartbeats over TLS to it verifying the CA, Ironic's
JSON-RPC, Redfish and agent commands through the sidecar's egress); `--compare direct` (no
proxies: plain HTTP API and JSON-RPC, agents and the driver spread over the three APIs);
`--compare haproxy` (HAProxy as balancer and TLS front, Ironic's own TLS for JSON-RPC).
Run it through scripts/e2e-scale, which installs what it needs.
"""

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402 - puts tests/support/python on sys.path too
import ironic_e2e  # noqa: E402
import scale_driver  # noqa: E402
import scale_measure as sm  # noqa: E402
import scale_report  # noqa: E402
import scale_setup as ss  # noqa: E402
from ironic_proxy_testing import pki  # noqa: E402
from ironic_proxy_testing.ports import wait_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def lb_url():
    return f"https://{ss.LB_HOST}:{h.LB_PORT}"


class Scale:
    def __init__(self, args, summary):
        self.args = args
        self.s = summary
        self.mode = args.compare or "proxy"
        self.bin = os.path.abspath(args.proxy_bin)
        self.venv_bin = os.path.dirname(os.path.abspath(sys.executable))
        self.tools_bin = os.path.join(args.tools_venv, "bin")
        self.root = tempfile.mkdtemp(prefix="ironic-scale-")
        os.chmod(self.root, 0o755)
        self.procs = h.Procs()
        self.ca_dir = os.path.join(self.root, "ca")
        self.ca = os.path.join(self.ca_dir, "ca.crt")
        self.instances = [h.Instance(self.root, ip) for ip in ss.IPS]
        self.db = h.MariaDB(self.root, self.procs)
        self.hosts = ss.make_hosts(args.hosts)
        self.lb = None
        self.lb_log = os.path.join(self.root, "lb.log")
        self.lb_admin = None
        self.haproxy_stats = None
        self.tools = []  # (name, Popen, log)
        self.driver = None
        self.sampler = None
        self.cpu = {}
        self.idle_rate = {}
        self.oncpu0 = self.oncpu = {}
        self.haproxy_counts0 = self.haproxy_counts = None
        self.run_seconds = None
        self.wall_start = None

    # --- setup -----------------------------------------------------------------------------

    def busy_ports(self):
        wanted = [(ss.LB_HOST, h.LB_PORT), (ss.IMAGE_IP, ss.IMAGE_PORT)]
        for ip in ss.IPS:
            wanted += [(ip, p) for p in (h.API_PORT, h.RPC_PORT, h.ADMIN_PORT, h.EGRESS_PORT)]
        for k in range(ss.shards(len(self.hosts))):
            wanted += [(ss.SUSHY_IP, ss.SUSHY_PORT + k), (ss.AGENT_IP, ss.AGENT_PORT + k)]
        return [f"{a}:{p}" for a, p in wanted if h.port_in_use(a, p)]

    def setup(self):
        busy = self.busy_ports()
        if busy:
            raise h.Failure(f"ports already in use (another run?): {', '.join(busy)}")
        pki.ca_init(self.bin, self.ca_dir, name="ironic-scale CA", permit_ip=["127.0.0.0/8"],
                    permit_dns=["metal3.svc"])  # fmt: skip
        self.files = ss.image(self.root)
        log = os.path.join(self.root, "images.log")
        p = self.procs.start("image server", [sys.executable, os.path.join(HERE, "static_httpd.py"),
                             str(ss.IMAGE_PORT), "--bind", ss.IMAGE_IP, "--directory",
                             self.files["dir"]], log, env=self.clean_env())  # fmt: skip
        self.tools.append(("image server", p, log))
        wait_port(ss.IMAGE_PORT, ss.IMAGE_IP, timeout=30)
        self.db.start()
        if self.mode == "proxy":
            public = lb_url()
        elif self.mode == "haproxy":
            public = lb_url()
            for inst in self.instances:
                pki.issue(self.bin, self.ca_dir, inst.tls_dir, ips=[inst.ip], validity="24h")
                shutil.copy(self.ca, os.path.join(inst.tls_dir, "ca.crt"))
        for inst in self.instances:
            if self.mode == "direct":
                public = f"http://{inst.ip}:{h.API_PORT}"
            with open(inst.conf, "w") as f:
                f.write(ss.ironic_conf(inst, self.db.url, self.mode, public, inst.tls_dir))
        h.run([os.path.join(self.venv_bin, "ironic-dbsync"), "--config-file",
               self.instances[0].conf, "create_schema"], "ironic-dbsync create_schema")  # fmt: skip
        if self.mode == "proxy":
            self.start_proxies()
        for inst in self.instances:
            self.start_ironic(inst)
        for inst in self.instances:
            h.wait_for(f"Ironic {inst.ip} to serve", lambda i=inst: self.serving(i), 180)
        if self.mode == "proxy":
            self.start_lb()
        elif self.mode == "haproxy":
            self.start_haproxy()
        self.start_tools()

    def start_proxies(self):
        cred = os.path.join(self.root, "egress.credentials")
        self.egress_password = secrets.token_urlsafe(18)
        with open(cred, "w") as f:
            f.write(f"{h.EGRESS_USER}:{self.egress_password}\n")
        self.dns_port = h.free_port()
        h.start_dnsmasq(self.root, self.procs, self.dns_port, ss.IPS)
        for inst in self.instances:
            conf = h.sidecar_config(inst, self.ca_dir, ss.IPS)
            # The profile's validity (config/profiles/sidecar.toml), not the e2e's 12 s: this
            # run measures serving, not rotation.
            conf = conf.replace(f'validity = "{h.SIDECAR_VALIDITY}"', 'validity = "24h"')
            conf = conf.replace(f'renew_before = "{h.SIDECAR_RENEW_BEFORE}"', 'renew_before = "8h"')
            with open(inst.sidecar_conf, "w") as f:
                f.write(conf + h.egress_listener(inst, ss.IPS, cred))
            h.run([self.bin, "check", "--config", inst.sidecar_conf], f"check sidecar {inst.ip}")
            inst.sidecar = self.procs.start(
                f"sidecar {inst.ip}",
                [self.bin, "--log-format", "json", "run", "--config", inst.sidecar_conf],
                inst.sidecar_log,
                env=self.proxy_env(),
            )
        for inst in self.instances:
            h.wait_for(f"sidecar {inst.ip}", lambda i=inst: self.sidecar_up(i), 30, interval=0.1)

    def sidecar_up(self, inst):
        if inst.sidecar.poll() is not None:
            raise h.Failure(f"sidecar {inst.ip} exited:\n{h.tail(inst.sidecar_log, 10)}")
        return requests.get(inst.admin_url + "/healthz", timeout=2).ok

    def clean_env(self, **extra):
        """The environment without proxies or ironic-proxy variables of the caller's."""
        drop = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
        env = {k: v for k, v in os.environ.items()
               if k.lower() not in drop and not k.startswith("IRONIC_PROXY_")}  # fmt: skip
        return {**env, **extra}

    def proxy_env(self):
        """The proxies' environment: access lines at info, and `--proxy-threads` as
        IRONIC_PROXY_WORKER_THREADS. Its default, one, is what the kit gives every ironic-proxy
        container: `limits.cpu: "1"`, which the proxy counts as one CPU and so runs a
        current-thread runtime (docs/reference.md, "Threads"); this machine's CPUs are not
        limited, so the harness says it."""
        extra = {"RUST_LOG": "info", "IRONIC_PROXY_WORKER_THREADS": str(self.args.proxy_threads)}
        return self.clean_env(**extra)

    def start_ironic(self, inst):
        env = self.clean_env(PYTHONUNBUFFERED="1")
        if self.mode == "proxy":
            # As the kit: HTTP_PROXY to the sidecar's egress, no_proxy loopback only; Redfish,
            # agent commands and JSON-RPC all leave through it.
            env.update(h.egress_env(inst, self.egress_password))
        inst.ironic = self.procs.start(
            f"ironic {inst.ip}",
            [os.path.join(self.venv_bin, "ironic"), "--config-file", inst.conf],
            inst.ironic_log,
            env=env,
        )

    def serving(self, inst):
        if inst.ironic.poll() is not None:
            raise h.Failure(f"ironic {inst.ip} exited:\n{h.tail(inst.ironic_log, 20)}")
        url = inst.api_url if self.mode == "proxy" else f"http://{inst.ip}:{h.API_PORT}"
        r = requests.get(url + "/v1/conductors", headers=h.HEADERS, verify=self.ca, timeout=5)
        return r.ok and any(c["hostname"] == inst.ip and c["alive"]
                            for c in r.json()["conductors"])  # fmt: skip

    def start_lb(self):
        self.lb_admin = f"http://127.0.0.1:{h.free_port()}"
        conf = os.path.join(self.root, "lb.toml")
        with open(conf, "w") as f:
            f.write(h.lb_config(self.ca_dir, self.lb_admin.rsplit(":", 1)[1], self.dns_port,
                                host=ss.LB_HOST))  # fmt: skip
        h.run([self.bin, "check", "--config", conf], "check balancer")
        self.lb = self.procs.start("balancer", [self.bin, "--log-format", "json", "run",
                                                "--config", conf], self.lb_log,
                                   env=self.proxy_env())  # fmt: skip

        def ready():
            if self.lb.poll() is not None:
                raise h.Failure(f"balancer exited:\n{h.tail(self.lb_log, 10)}")
            healthy = h.metric(h.scrape(self.lb_admin), "ironic_proxy_upstream_endpoints",
                               state="healthy")  # fmt: skip
            return healthy == 3

        h.wait_for("the balancer to see 3 healthy sidecars", ready, 60)

    def start_haproxy(self):
        lb_tls = os.path.join(self.root, "lb-tls")
        pki.issue(self.bin, self.ca_dir, lb_tls, ips=[ss.LB_HOST], validity="24h")
        pem = os.path.join(lb_tls, "lb.pem")
        with open(pem, "w") as out:
            for name in ("tls.crt", "tls.key"):
                with open(os.path.join(lb_tls, name)) as f:
                    out.write(f.read())
        port = h.free_port()
        self.haproxy_stats = f"http://127.0.0.1:{port}/stats;csv"
        conf = os.path.join(self.root, "haproxy.cfg")
        with open(conf, "w") as f:
            f.write(ss.haproxy_config(pem, port, ss.IPS, self.args.haproxy_threads))
        h.run(["haproxy", "-c", "-f", conf], "haproxy -c")
        self.lb_log = os.path.join(self.root, "haproxy.log")
        self.lb = self.procs.start("haproxy", ["haproxy", "-db", "-f", conf], self.lb_log)

        def ready():
            if self.lb.poll() is not None:
                raise h.Failure(f"haproxy exited:\n{h.tail(self.lb_log, 10)}")
            rows = scale_report.haproxy_stats(self.haproxy_stats)
            return sum(1 for r in rows if r["svname"].startswith("i") and r["status"] == "UP") == 3

        h.wait_for("HAProxy to see 3 healthy Ironic APIs", ready, 60)

    def agent_api(self, shard):
        """Where fake-ipa shard k looks up and heartbeats: the balancer, or (direct) one of
        the three APIs in turn."""
        if self.mode == "direct":
            return f"http://{ss.IPS[shard % 3]}:{h.API_PORT}"
        return lb_url()

    def start_tools(self):
        src = os.environ.get("FAKE_IPA_SRC")
        if not src or not os.path.exists(os.path.join(src, "fake_ipa", "main.py")):
            raise h.Failure(f"no fake-ipa tree at FAKE_IPA_SRC={src!r} (scripts/e2e-scale sets it)")
        tools = os.path.join(self.root, "tools")
        os.makedirs(tools)
        py = os.path.join(self.tools_bin, "python3")
        for k in range(ss.shards(len(self.hosts))):
            sushy_conf = os.path.join(tools, f"sushy-{k}.conf")
            with open(sushy_conf, "w") as f:
                f.write(ss.sushy_config(k, self.hosts, os.path.join(tools, f"sushy-state-{k}")))
            ipa_conf = os.path.join(tools, f"fake-ipa-{k}.conf")
            with open(ipa_conf, "w") as f:
                f.write(ss.fake_ipa_config(k, self.agent_api(k), self.ca))
            log = os.path.join(tools, f"sushy-{k}.log")
            p = self.procs.start(f"sushy-tools {k}", [os.path.join(self.tools_bin, "sushy-emulator"),
                                 "--fake", "--config", sushy_conf], log, env=self.clean_env())  # fmt: skip
            self.tools.append((f"sushy-tools {k}", p, log))
            log = os.path.join(tools, f"fakeipa-{k}.log")
            env = self.clean_env(PYTHONPATH=src, PYTHONUNBUFFERED="1")
            p = self.procs.start(f"fake-ipa {k}", [py, "-m", "fake_ipa.main", "--config", ipa_conf],
                                 log, env=env)  # fmt: skip
            self.tools.append((f"fake-ipa {k}", p, log))
        for k in range(ss.shards(len(self.hosts))):
            wait_port(ss.SUSHY_PORT + k, ss.SUSHY_IP, timeout=60)
            wait_port(ss.AGENT_PORT + k, ss.AGENT_IP, timeout=60)

    # --- the run ---------------------------------------------------------------------------

    def groups(self):
        """Process trees per party, for the CPU figures."""
        g = {"Ironic (3 instances)": [i.ironic.pid for i in self.instances],
             "sushy-tools, fake-ipa, image server": [p.pid for _, p, _ in self.tools],
             "MariaDB": [self.db.proc.pid]}  # fmt: skip
        if self.mode == "proxy":
            g["proxies (balancer + 3 sidecars)"] = [self.lb.pid] + [
                i.sidecar.pid for i in self.instances]
        elif self.mode == "haproxy":
            g["proxies (HAProxy)"] = [self.lb.pid]
        return g

    def proxy_procs(self):
        """(name, Popen) of each proxy process."""
        if self.mode == "proxy":
            return [("balancer", self.lb)] + [(f"sidecar {i.ip}", i.sidecar) for i in self.instances]
        return [("HAProxy", self.lb)] if self.mode == "haproxy" else []

    def cpu_now(self):
        out = {name: sm.group_cpu(pids) for name, pids in self.groups().items()}
        for name, p in self.proxy_procs():
            out[f"each: {name}"] = sm.group_cpu([p.pid])
        t = os.times()
        out["the test (BMO stand-in)"] = t.user + t.system
        out["machine (every process)"] = sm.machine_busy()
        return out

    def oncpu_now(self):
        """Each proxy's time on CPU (scheduler, ns resolution), in seconds."""
        return {name: sm.oncpu_seconds(p.pid) for name, p in self.proxy_procs()}

    def idle_window(self):
        """The proxies' CPU per second with every part up and no host enrolled (health checks,
        DNS refreshes, timers; fake-ipa and sushy-tools idle): what a proxy costs whatever the
        traffic, subtracted to give the cost of a request."""
        self.idle_rate = {}
        if not self.args.idle or self.mode == "direct":
            return
        c0, t0 = self.oncpu_now(), time.monotonic()
        time.sleep(self.args.idle)
        c1, dt = self.oncpu_now(), time.monotonic() - t0
        self.idle_rate = {k: (c1[k] - c0[k]) / dt for k in c1}
        self.s.figure(f"proxies' CPU with no host enrolled ({dt:.0f} s)",
                      ", ".join(f"{k} {1000 * v:.2f} ms/s" for k, v in self.idle_rate.items()))

    def run(self):
        with ironic_e2e.Phase(self.s, f"setup ({self.mode}, {len(self.hosts)} hosts, "
                              f"{ss.shards(len(self.hosts))} tool shards)"):  # fmt: skip
            self.setup()
        sources = {}
        if self.mode == "proxy":
            sources = {"balancer": lambda: sm.proxy_connections(self.lb_admin)}
            for inst in self.instances:
                sources[f"sidecar {inst.ip}"] = lambda i=inst: sm.proxy_connections(i.admin_url)
        elif self.mode == "haproxy":
            sources = {"HAProxy": lambda: scale_report.haproxy_current(self.haproxy_stats)}
        self.sampler = sm.Sampler(sources)
        self.sampler.start()
        self.idle_window()
        apis = [lb_url()] if self.mode != "direct" else [f"http://{ip}:{h.API_PORT}" for ip in ss.IPS]
        self.driver = scale_driver.Driver(self.hosts, apis, self.ca, self.files, self.args.limit,
                                          self.args.requeue, workers=16)  # fmt: skip
        self.wall_start = time.time()
        load0 = os.getloadavg()[0]
        before = self.cpu_now()
        self.oncpu0 = self.oncpu_now()
        if self.haproxy_stats:
            self.haproxy_counts0 = scale_report.haproxy_counters(self.haproxy_stats)
        with ironic_e2e.Phase(self.s, f"enrol to active ({len(self.hosts)} hosts)"):
            self.all_active = self.driver.run(time.monotonic() + self.args.timeout,
                                              progress=lambda m: print(f"e2e-scale: {m}", flush=True))  # fmt: skip
        after = self.cpu_now()
        self.run_seconds = time.time() - self.wall_start
        self.cpu = {k: after[k] - before[k] for k in after if not k.startswith("each: ")}
        self.cpu_each = {k[6:]: after[k] - before[k] for k in after if k.startswith("each: ")}
        self.oncpu = {k: v - self.oncpu0[k] for k, v in self.oncpu_now().items()}
        if self.haproxy_stats:
            self.haproxy_counts = scale_report.haproxy_counters(self.haproxy_stats)
        self.s.figure("machine load average (1 min) at start, at end",
                      f"{load0:.1f}, {os.getloadavg()[0]:.1f} (2 cores, shared)")
        self.sampler.stop()
        scale_report.analyse(self)

    def cleanup(self, failed):
        if self.sampler:
            self.sampler.stop()
        self.procs.cleanup(first=[self.lb] if self.lb else [], last=[self.db.proc])
        if failed:
            for name, _, log in self.tools[:2]:
                print(f"---- {name} ({log}) ----\n{h.tail(log, 15)}")
            for inst in self.instances:
                print(f"---- ironic {inst.ip} ----\n{h.tail(inst.ironic_log, 15)}")
        if self.args.keep:
            print(f"e2e-scale: kept {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy-bin", required=True, help="the ironic-proxy binary")
    parser.add_argument("--tools-venv", required=True, help="virtualenv with sushy-tools")
    parser.add_argument("--hosts", type=int, required=True, help="number of fake hosts")
    parser.add_argument("--compare", choices=["direct", "haproxy"], help="run without ironic-proxy")
    parser.add_argument("--limit", type=int, default=50,
                        help="hosts busy at once (BMO's PROVISIONING_LIMIT; its default is 20)")
    parser.add_argument("--requeue", type=float, default=5.0,
                        help="seconds between reconciles of a waiting host (BMO: 10)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for all to be active")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--idle", type=float, default=30,
                        help="seconds of the proxies' idle CPU measured before the first enrol")
    parser.add_argument("--result-json", help="append the run's figures as one JSON line here")
    parser.add_argument("--proxy-threads", type=int, default=1,
                        help="ironic-proxy's worker threads (IRONIC_PROXY_WORKER_THREADS); 1, as "
                        "the kit's CPU limit of one CPU gives it")
    parser.add_argument("--haproxy-threads", type=int,
                        help="HAProxy's nbthread (default: HAProxy's own, one per CPU)")
    parser.add_argument("--address-base", type=int, default=11,
                        help="use 127.0.0.BASE to BASE+6 (two runs side by side)")
    args = parser.parse_args()
    ss.set_base(args.address_base)
    summary = scale_report.summary(args.compare or "proxy")
    ironic_e2e.run_scenario(Scale, args, summary)


if __name__ == "__main__":
    main()
