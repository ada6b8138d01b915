#!/usr/bin/env python3
"""End-to-end test of Ironic's networking service behind the sidecar (issue 33, item 3).

The topology of ironic_e2e.py (three all-in-one Ironic instances on 127.0.0.2-4, a sidecar each,
one load balancer, MariaDB, dnsmasq) plus `ironic-networking` (Ironic 34+, the console script of
the PyPI package) next to the first instance, as IrSO runs it in the Ironic pod:

- the networking service serves its JSON-RPC on a unix socket only
  (`[ironic_networking_json_rpc] unix_socket`, a group that registers `[json_rpc]`'s options:
  Ironic 39 `ironic/conf/__init__.py`);
- the first instance's sidecar runs the built-in profile `sidecar` with
  `IRONIC_PROXY_NETWORKING_RPC_SOCKET` set, so it adds the listener `networking-json-rpc` on
  `127.0.0.2:6190` (IrSO's port): mutual TLS, the `allow` of the conductors' `json-rpc`;
- every conductor dials it as Ironic's own client does (`ironic/networking/rpcapi.py`: topic
  `ironic.<host_ip>:<port>` of `[ironic_networking_json_rpc]`, `client_use_ssl` with the
  certificate its sidecar exports), like conductor-to-conductor JSON-RPC.

The call is a real conductor operation: nodes use the network interface `ironic-networking`
(`ironic/drivers/modules/network/ironic_networking.py`); updating a port's `extra.switchport`
makes the owning conductor's `update_port` call `port_changed`, which calls the networking
service's `update_port` (removing it calls `reset_port`). In `enroll` the port is on the idle
network, so each node names one in `driver_info/idle_network` (else no call is made).

Switch driver: Ironic 39.0.0 registers its `noop` switch driver as
`ironic.drivers.modules.switch:NoOpSwitchDriver`, which does not exist (the class is in
`ironic.drivers.modules.switch.base`), so `enabled_switch_drivers = noop` loads nothing and the
service refuses to start. The test registers that same upstream class under the name `e2e-noop`
(an entry point in a `.dist-info` directory on the service's PYTHONPATH); `generic-switch` would
need networking-generic-switch and a switch.

Checks (numbered as printed):
1. the networking service runs behind the sidecar's `networking-json-rpc` listener and answers
   a call with the client certificate of a conductor;
2. updating a port on one node per conductor: each owning conductor calls `update_port` through
   mTLS; the sidecar's access log has each call with its `rpc_method` and the caller's identity
   (its certificate's SAN), `jsonrpc_calls_total{listener="networking-json-rpc"}` counts them,
   and the service logged each switch port update; removing the switchport calls `reset_port`;
3. without a client certificate (curl without `--cert`), and with one from a foreign CA, the
   handshake is refused (`tls_handshake_failures_total`), and nothing reaches the service.

Ironic 35+: the service exists since 34.0.0, the network interface that calls it since 35.0.0
(`IRONIC_VERSION=35.0.0` runs it there). Run it as
`E2E_TEST=networking_e2e scripts/e2e`, under `flock /tmp/ironic-e2e.lock` (fixed
loopback addresses).
"""

import argparse
import collections
import json
import os
import re
import socket
import subprocess
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import ironic_e2e as base  # noqa: E402

NET_PORT = 6190  # IrSO's networking JSON-RPC port; the sidecar's networking-json-rpc listener
LISTENER = "networking-json-rpc"
DRIVER = "e2e-noop"
IDLE = "access/native_vlan=10"
SWITCHPORT = {"mode": "access", "native_vlan": 100}
# What Ironic's JSON-RPC server logs with debug on for each call it serves
# (ironic/common/json_rpc/server.py, `_handle_requests`).
SERVED = re.compile(r"ironic\.common\.json_rpc\.server \[[^]]*\] RPC (\w+) with ")


class Summary(base.TitledSummary):
    TITLES = {
        1: "ironic-networking behind the sidecar's networking-json-rpc listener",
        2: "conductors call the networking service through mTLS (update_port, reset_port)",
        3: "no or foreign client certificate: refused at the handshake, nothing reaches it",
    }

    HEADING = "ironic-proxy networking service end-to-end summary (real Ironic)"
    LABEL = "e2e-networking"

    def extra(self):
        return [f"  {base.ironic_version()}"]


class NetworkingE2E(base.E2E):
    def __init__(self, args, summary):
        super().__init__(args, summary)
        self.net_dir = os.path.join(self.root, "networking")
        os.makedirs(os.path.join(self.net_dir, "drivers"))
        self.net_sock = os.path.join(self.net_dir, "json-rpc.sock")
        self.net_conf = os.path.join(self.net_dir, "networking.conf")
        self.net_log = os.path.join(self.net_dir, "networking.log")
        self.net_ip = self.instances[0].ip
        self.net = None
        self.names = [f"net-node-{i}" for i in range(len(h.IPS))]
        self.patch_configs()

    def patch_configs(self):
        """The first sidecar's profile gets the networking socket; every ironic.conf enables
        the network interface and the networking service's client options."""
        profile_env = h.sidecar_profile_env
        net = {
            "IRONIC_PROXY_NETWORKING_RPC_SOCKET": self.net_sock,
            "IRONIC_PROXY_NETWORKING_RPC_PORT": str(NET_PORT),
        }
        h.sidecar_profile_env = lambda *a: {**profile_env(*a), **net}
        ironic = h.ironic_conf
        line = "enabled_network_interfaces = noop\n"

        def conf(inst, db_url):
            text = ironic(inst, db_url)
            if line not in text:
                raise h.Failure("ironic.conf template changed: no enabled_network_interfaces")
            text = text.replace(line, "enabled_network_interfaces = noop,ironic-networking\n")
            # The client half of [ironic_networking_json_rpc], as for [json_rpc]: TLS with the
            # certificate the instance's own sidecar exports.
            return text + (
                "\n[ironic_networking_json_rpc]\n"
                f"host_ip = {self.net_ip}\nport = {NET_PORT}\n"
                "auth_strategy = noauth\nclient_use_ssl = True\n"
                f"cafile = {inst.tls_dir}/ca.crt\ncertfile = {inst.tls_dir}/tls.crt\n"
                f"keyfile = {inst.tls_dir}/tls.key\n"
            )

        h.ironic_conf = conf

    def run(self):
        if h.port_in_use(self.net_ip, NET_PORT):
            raise h.Failure(f"{self.net_ip}:{NET_PORT} already in use (another run?)")
        self.setup()
        self.start_networking()
        self.served()
        self.conductor_calls()
        self.refused()

    # --- the networking service --------------------------------------------------------------

    def start_networking(self):
        with base.Phase(self.s, "start ironic-networking"):
            plugin = os.path.join(self.net_dir, "plugin")
            info = os.path.join(plugin, "ironic_proxy_e2e_switch-0.dist-info")
            os.makedirs(info)
            with open(os.path.join(info, "METADATA"), "w") as f:
                f.write("Metadata-Version: 2.1\nName: ironic-proxy-e2e-switch\nVersion: 0\n")
            with open(os.path.join(info, "entry_points.txt"), "w") as f:
                f.write(
                    "[ironic.networking.switch_drivers]\n"
                    f"{DRIVER} = ironic.drivers.modules.switch.base:NoOpSwitchDriver\n"
                )
            switches = os.path.join(self.net_dir, "switches.conf")
            open(switches, "w").close()  # no switch sections: the no-op driver takes any
            with open(self.net_conf, "w") as f:
                f.write(
                    f"[DEFAULT]\nhost = {self.net_ip}\nrpc_transport = json-rpc\n"
                    # debug: the service logs each RPC it serves ("RPC <method> with ...").
                    "debug = True\n\n"
                    f"[ironic_networking]\nenabled_switch_drivers = {DRIVER}\n"
                    f"switch_config_file = {switches}\n"
                    f"driver_config_dir = {os.path.join(self.net_dir, 'drivers')}\n\n"
                    "[ironic_networking_json_rpc]\nauth_strategy = noauth\n"
                    f"unix_socket = {self.net_sock}\n"
                    # Group-usable, as Ironic's (harness.ironic_conf; tests/e2e/container.py).
                    "unix_socket_mode = 0660\n"
                    # The topic it names itself by: what the conductors dial.
                    f"host_ip = {self.net_ip}\nport = {NET_PORT}\n"
                )
            self.net = self.procs.start(
                "ironic-networking",
                [os.path.join(self.venv_bin, "ironic-networking"), "--config-file",
                 self.net_conf],
                self.net_log,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": plugin},
            )  # fmt: skip

            def up():
                if self.net.poll() is not None:
                    raise h.Failure(
                        f"ironic-networking exited ({self.net.returncode}):\n"
                        + h.tail(self.net_log, 20)
                    )
                # Connected, not only there: the server binds, chmods (unix_socket_mode), then
                # listens; a call in between was refused (ECONNREFUSED) once.
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.net_sock)
                return True

            h.wait_for("ironic-networking to listen on its unix socket", up, 60)

    def served_calls(self):
        """Calls the networking service logged serving, by method."""
        seen = collections.Counter()
        with open(self.net_log, errors="replace") as f:
            for line in f:
                m = SERVED.search(line)
                if m:
                    seen[m.group(1)] += 1
        return seen

    def access(self):
        """The networking listener's access lines in the first sidecar's log."""
        return [
            e
            for e in h.proxy_events(self.instances[0].sidecar_log)
            if e.get("target") == "access" and e.get("listener") == LISTENER
        ]

    def metrics(self):
        return h.scrape(self.instances[0].admin_url)

    def served(self):
        """A call with a conductor's certificate (instance 2's export) reaches the service."""
        inst = self.instances[1]
        cert = (os.path.join(inst.tls_dir, "tls.crt"), os.path.join(inst.tls_dir, "tls.key"))
        call = {"jsonrpc": "2.0", "method": "get_switches", "params": {"context": {}},
                "id": "e2e"}  # fmt: skip
        r = requests.post(f"https://{self.net_ip}:{NET_PORT}/", json=call, cert=cert,
                          verify=self.ca, timeout=15)  # fmt: skip
        ok = r.status_code == 200 and r.json().get("result") == {}
        self.s.check(
            1,
            Summary.TITLES[1],
            ok,
            f"ironic-networking on {self.net_sock}; get_switches with {inst.ip}'s certificate "
            f"through https://{self.net_ip}:{NET_PORT}: HTTP {r.status_code} {r.text[:120]}",
        )

    # --- the conductors' calls ---------------------------------------------------------------

    def ports(self):
        r = self.api_get("/v1/ports/detail")
        return {p["node_uuid"]: p for p in r.json()["ports"]}

    def conductor_calls(self):
        t0 = time.monotonic()
        uuids = h.spread_uuids(1)  # one node per conductor, by Ironic's hash ring
        before = self.served_calls()
        for i, (name, u) in enumerate(zip(self.names, uuids, strict=True)):
            self.cli("node", "create", "--driver", "fake-hardware", "--name", name, "--uuid", u,
                     "--network-interface", "ironic-networking",
                     "--driver-info", f"idle_network={IDLE}", what=f"create {name}")
            self.cli("port", "create", f"52:54:00:00:0e:{i:02x}", "--node", u,
                     "--local-link-connection", f"switch_id=52:54:00:ff:00:{i:02x}",
                     "--local-link-connection", f"port_id=Ethernet1/{i + 1}",
                     what=f"port of {name}")  # fmt: skip
        owners = {n["uuid"]: n["conductor"] for n in self.nodes()}
        ports = self.ports()
        t_set = time.monotonic()
        for u in uuids:
            self.cli("port", "set", ports[u]["uuid"], "--extra",
                     f"switchport={json.dumps(SWITCHPORT)}", what="port set --extra switchport")
        set_s = time.monotonic() - t_set
        for u in uuids:
            self.cli("port", "unset", ports[u]["uuid"], "--extra", "switchport",
                     what="port unset --extra switchport")
        # Access lines reach stderr within 100 ms of the request's end.
        time.sleep(0.5)
        lines = self.access()
        served = self.served_calls() - before
        by = collections.Counter((e.get("identity"), e.get("rpc_method"), e.get("status"))
                                 for e in lines if e.get("identity") != "-")  # fmt: skip
        samples = self.metrics()
        metric = {
            (ls["method"], ls["outcome"]): v
            for n, ls, v in samples
            if n == "ironic_proxy_jsonrpc_calls_total" and ls.get("listener") == LISTENER
        }
        self.s.figure(
            "networking-json-rpc access lines (identity, rpc_method, status)",
            "; ".join(f"{i} {m} {s} x{n}" for (i, m, s), n in sorted(by.items())) or "none",
        )
        self.s.figure(
            "ironic_proxy_jsonrpc_calls_total{listener=networking-json-rpc}",
            ", ".join(f"{m}/{o} {v:.0f}" for (m, o), v in sorted(metric.items())) or "none",
        )
        self.s.figure(
            "calls the networking service logged",
            ", ".join(f"{m} {n}" for m, n in sorted(served.items())) or "none",
        )
        updates = {i for (i, m, s), _ in by.items() if m == "update_port" and s == 200}
        # The proxy labels the conductor's and the networking service's methods
        # (src/proxy/jsonrpc/mod.rs KNOWN), reset_port among them.
        resets = sum(n for (i, m, s), n in by.items() if m == "reset_port")
        with open(self.net_log, errors="replace") as f:
            noop = f.read().count("NoOp: Update port")
        ok = (
            len(updates) == len(h.IPS)
            and served.get("update_port") == len(h.IPS)
            and served.get("reset_port") == len(h.IPS)
            and resets >= len(h.IPS)
            and metric.get(("update_port", "ok")) == len(h.IPS)
            and noop == len(h.IPS)
        )
        self.s.timing("3 x port set --extra switchport (CLI)", set_s)
        self.s.check(
            2,
            Summary.TITLES[2],
            ok,
            f"nodes owned by conductors {sorted(set(owners.values()))}; update_port from "
            f"{len(updates)} identities ({', '.join(sorted(updates))}), "
            f"{noop} switch port updates logged by the no-op driver, "
            f"{served.get('reset_port', 0)} reset_port served; "
            f"{time.monotonic() - t0:.1f} s",
        )

    # --- refusals -----------------------------------------------------------------------------

    def refused(self):
        url = f"https://{self.net_ip}:{NET_PORT}/"
        body = json.dumps({"jsonrpc": "2.0", "method": "get_switches",
                           "params": {"context": {}}, "id": "e2e-nocert"})  # fmt: skip

        def failures():
            return {
                ls["reason"]: v
                for n, ls, v in self.metrics()
                if n == "ironic_proxy_tls_handshake_failures_total"
                and ls.get("listener") == LISTENER
            }

        before_f, before_a, before_s = failures(), len(self.access()), self.served_calls()
        attempts = []
        fc = self.foreign_client
        for label, extra in [
            ("no client certificate", []),
            ("foreign CA's certificate", ["--cert", f"{fc}/tls.crt", "--key", f"{fc}/tls.key"]),
        ]:
            p = subprocess.run(
                ["curl", "-sS", "--cacert", self.ca, "-H", "Content-Type: application/json",
                 "-d", body, "-o", "/dev/null", "-w", "%{http_code}", *extra, url],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            attempts.append((label, p.returncode, p.stdout.strip(), p.stderr.strip()))
        time.sleep(0.5)
        after_f, after_a, after_s = failures(), len(self.access()), self.served_calls()
        grew = {r: after_f.get(r, 0) - before_f.get(r, 0) for r in after_f}
        grew = {r: v for r, v in grew.items() if v}
        for label, rc, code, err in attempts:
            self.s.figure(f"curl, {label}", f"exit {rc}, HTTP {code or '-'}: {err[-160:]}")
        ok = (
            all(rc != 0 and code in ("", "000") for _, rc, code, _ in attempts)
            and grew.get("no_client_cert", 0) >= 1
            and sum(grew.values()) >= 2
            and after_a == before_a
            and after_s == before_s
        )
        self.s.check(
            3,
            Summary.TITLES[3],
            ok,
            f"curl exits {[rc for _, rc, _, _ in attempts]} with no HTTP status; handshake "
            f"failures by reason {grew}; access lines {before_a} -> {after_a}, calls the "
            f"service logged {sum(before_s.values())} -> {sum(after_s.values())}",
        )

    def dump_logs(self):
        super().dump_logs()
        if os.path.exists(self.net_log):
            print(f"---- last lines of ironic-networking ({self.net_log}) ----")
            print(h.tail(self.net_log, 25))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy-bin", required=True)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    base.run_scenario(NetworkingE2E, args, Summary())


if __name__ == "__main__":
    main()
