#!/usr/bin/env python3
"""End-to-end test of Basic authentication (issue 11) against a real distributed Ironic.

The topology of ironic_e2e.py (three all-in-one Ironic 39 instances, a sidecar each, one load
balancer found through dnsmasq), with `[listeners.auth]` on every sidecar's API listener and on
the load balancer, all reading one bcrypt htpasswd. Ironic itself runs `auth_strategy = noauth`
on its API, as behind ironic-image's httpd. JSON-RPC runs in the mode given by --rpc-auth:

- `noauth`: mutual TLS only (the kit's default);
- `http_basic`: mutual TLS plus Ironic's own Basic auth, `[json_rpc] auth_strategy = http_basic`
  with its own htpasswd and the client's `auth_type = http_basic` / `username` / `password`;
  the json-rpc listeners have no `[listeners.auth]` and pass Authorization through.

Checks (numbered as printed):
1. the real `baremetal` CLI with the right credentials enrols 3 nodes and drives them through
   manage, provide, deploy, undeploy and delete through the load balancer;
2. without credentials and with wrong ones the CLI fails with 401, and requests gets 401 with
   `WWW-Authenticate: Basic realm="Ironic API"` from the LB and from a sidecar directly;
3. the ramdisk agent's paths and version discovery (`/`, `/v1`, `/v1/lookup`,
   `/v1/heartbeat/<node>`, `/v1/continue_inspection`) reach Ironic without credentials (the
   answer is Ironic's own, never the proxy's 401), and a bypass spelling does not;
4. JSON-RPC in the chosen mode: the flow above crossed conductors; with `http_basic` a call
   that presents a valid client certificate but no password is refused by Ironic (401) and
   one with the password is served; with `noauth` the certificate alone is served.

Run it as `E2E_TEST=auth_e2e scripts/e2e --rpc-auth noauth` (and `http_basic`), under
`flock /tmp/ironic-e2e.lock` (fixed loopback addresses).
"""

import argparse
import json
import os
import subprocess
import sys
import time
import uuid

import bcrypt
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import ironic_e2e as base  # noqa: E402

USER, PASSWORD = "metal3", "correct horse battery staple"
RPC_USER, RPC_PASSWORD = "rpc", "json-rpc secret"
NODES = 3
REALM = 'Basic realm="Ironic API"'


def htpasswd(path, user, password, prefix=b"$2y$"):
    """An htpasswd line as `htpasswd -B` (cost 5) writes it."""
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(5))
    with open(path, "w") as f:
        f.write(f"{user}:{(prefix + hashed[4:]).decode()}\n")


class Summary(base.TitledSummary):
    TITLES = {
        1: "baremetal CLI with credentials runs the flow through LB and sidecars",
        2: "no or wrong credentials: 401 with the Basic challenge",
        3: "agent and discovery paths reach Ironic without credentials",
        4: "JSON-RPC between conductors in the chosen mode",
    }

    HEADING = "ironic-proxy Basic auth end-to-end summary (real distributed Ironic)"
    LABEL = "e2e-auth"


class AuthE2E(base.E2E):
    def __init__(self, args, summary):
        super().__init__(args, summary)
        self.rpc_auth = args.rpc_auth
        self.names = [f"auth-node-{i}" for i in range(NODES)]
        self.htpasswd = os.path.join(self.root, "htpasswd")
        self.rpc_htpasswd = os.path.join(self.root, "htpasswd-json-rpc")
        self.api.auth = (USER, PASSWORD)
        self.patch_configs()

    def patch_configs(self):
        """Adds [listeners.auth] to the API listeners (the last table of both configs) and
        sets the JSON-RPC mode in ironic.conf."""
        sidecar, lb, ironic = h.sidecar_config, h.lb_config, h.ironic_conf
        table = f'\n[listeners.auth]\nhtpasswd = "{self.htpasswd}"\nrealm = "Ironic API"\n'
        h.sidecar_config = lambda *a: sidecar(*a) + table
        # The sidecar that runs from `--profile sidecar` (env vars only) gets the same htpasswd
        # the way a pod spec gives it (IRONIC_PROXY_HTPASSWD, as the kit sets it).
        profile_env = h.sidecar_profile_env
        h.sidecar_profile_env = lambda *a: {
            **profile_env(*a),
            "IRONIC_PROXY_HTPASSWD": self.htpasswd,
            "IRONIC_PROXY_AUTH_REALM": "Ironic API",
        }
        h.lb_config = lambda *a: lb(*a) + table
        rpc = "[json_rpc]\nauth_strategy = noauth\n"
        basic = (
            "[json_rpc]\nauth_strategy = http_basic\n"
            f"http_basic_auth_user_file = {self.rpc_htpasswd}\n"
            f"auth_type = http_basic\nusername = {RPC_USER}\npassword = {RPC_PASSWORD}\n"
        )

        def conf(inst, db_url):
            text = ironic(inst, db_url)
            if rpc not in text:
                raise h.Failure("ironic.conf template changed: no [json_rpc] noauth block")
            return text.replace(rpc, basic) if self.rpc_auth == "http_basic" else text

        h.ironic_conf = conf

    def serving(self, inst):
        if inst.ironic.poll() is not None:
            raise h.Failure(f"ironic {inst.ip} exited:\n" + h.tail(inst.ironic_log, 20))
        r = requests.get(
            inst.api_url + "/v1/conductors",
            headers=h.HEADERS,
            verify=self.ca,
            timeout=5,
            auth=(USER, PASSWORD),
        )
        if r.status_code != 200:
            return False
        return any(c["hostname"] == inst.ip and c["alive"] for c in r.json()["conductors"])

    def baremetal(self, *argv, auth):
        cmd = [
            os.path.join(self.venv_bin, "baremetal"),
            "--os-endpoint", base.LB_URL, "--os-cacert", self.ca,
            "--os-baremetal-api-version", "latest",
        ]  # fmt: skip
        if auth is None:
            cmd += ["--os-auth-type", "none"]
        else:
            cmd += ["--os-auth-type", "http_basic", "--os-username", auth[0],
                    "--os-password", auth[1]]  # fmt: skip
        return subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=120)

    def cli(self, *argv, what):
        self.cli_calls += 1
        p = self.baremetal(*argv, auth=(USER, PASSWORD))
        if p.returncode != 0:
            err = (p.stderr.strip() or p.stdout.strip())[-1500:]
            raise h.Failure(f"{what}: `baremetal {' '.join(argv)}` failed: {err}")
        return p.stdout

    def run(self):
        htpasswd(self.htpasswd, USER, PASSWORD)
        htpasswd(self.rpc_htpasswd, RPC_USER, RPC_PASSWORD, prefix=b"$2b$")
        self.setup()
        self.flow()
        self.refused()
        self.public_paths()
        self.json_rpc()

    def flow(self):
        t0 = time.monotonic()
        path = os.path.join(self.root, "nodes.json")
        with open(path, "w") as f:
            json.dump(
                {"nodes": [{"name": n, "uuid": u, "driver": "fake-hardware"}
                           for n, u in zip(self.names, h.spread_uuids(NODES // len(h.IPS)),
                                           strict=True)]},
                f,
            )  # fmt: skip
        n = NODES
        count = lambda state: lambda ns: sum(x["provision_state"] == state for x in ns) == n  # noqa: E731
        self.step("enrol 3 nodes", ["create", path], lambda ns: len(ns) == n)
        self.step("manage", ["node", "manage", *self.names], count("manageable"))
        self.step("provide", ["node", "provide", *self.names], count("available"))
        self.step("deploy", ["node", "deploy", *self.names], count("active"))
        self.conductors = sorted({x["conductor"] for x in self.nodes()})
        self.step("undeploy", ["node", "undeploy", *self.names], count("available"))
        self.step("delete", ["node", "delete", *self.names], lambda ns: not ns)
        self.s.check(
            1,
            Summary.TITLES[1],
            True,
            f"{self.cli_calls} authenticated CLI calls, {self.api_calls} authenticated REST polls "
            f"in {time.monotonic() - t0:.1f} s; nodes were on conductors {self.conductors}",
        )

    def refused(self):
        results = []
        for label, auth in [("no credentials", None), ("wrong password", (USER, "wrong"))]:
            p = self.baremetal("node", "list", auth=auth)
            out = p.stderr + p.stdout
            results.append((f"CLI {label}", p.returncode != 0 and "401" in out, out.strip()[-200:]))
        for url in (base.LB_URL, self.instances[0].api_url):
            for label, auth in [("none", None), ("wrong", (USER, "nope")), ("unknown", ("x", "y"))]:
                r = requests.get(url + "/v1/nodes", headers=h.HEADERS, verify=self.ca,
                                 timeout=10, auth=auth)  # fmt: skip
                ok = (
                    r.status_code == 401
                    and r.headers.get("WWW-Authenticate") == REALM
                    and r.json().get("error") == "unauthorized"
                )
                results.append((f"GET {url}/v1/nodes ({label})", ok, f"HTTP {r.status_code}"))
        bad = [f"{w}: {d}" for w, ok, d in results if not ok]
        self.s.check(
            2,
            Summary.TITLES[2],
            not bad,
            "; ".join(bad) or f"{len(results)} attempts, all 401 with {REALM}",
        )

    def public_paths(self):
        node = str(uuid.uuid4())
        agent = {**h.HEADERS, "X-OpenStack-Ironic-API-Version": "1.90"}
        probes = [
            ("GET", "/", None),
            ("GET", "/v1", None),
            ("GET", "/v1/", None),
            ("GET", "/v1/lookup?addresses=52:54:00:aa:bb:cc", None),
            ("POST", f"/v1/heartbeat/{node}", {"callback_url": "https://127.0.0.9:9999",
                                               "agent_version": "10.0.0"}),
            ("POST", "/v1/continue_inspection", {"inventory": {}}),
        ]  # fmt: skip
        results = []
        for url in (base.LB_URL, self.instances[1].api_url):
            for method, path, body in probes:
                r = requests.request(method, url + path, headers=agent, json=body,
                                     verify=self.ca, timeout=15)  # fmt: skip
                try:
                    doc = r.json()
                except ValueError:
                    doc = {}
                # Ironic's own answers: 200 documents, or its errors ({"error_message": ...});
                # never the proxy's {"error": "unauthorized"}.
                ironic = r.status_code != 401 and "error" not in doc
                results.append((f"{method} {path} via {url}", ironic, r.status_code))
        # requests keeps dot segments as written (urllib3 does not normalise them).
        sneak = requests.Request("GET", base.LB_URL + "/v1/heartbeat/../../v1/nodes").prepare()
        sneak.url = base.LB_URL + "/v1/heartbeat/../../v1/nodes"
        with requests.Session() as s:
            r2 = s.send(sneak, verify=self.ca, timeout=10)
        bypass_ok = r2.status_code == 401
        bad = [f"{w}: HTTP {st}" for w, ok, st in results if not ok]
        if not bypass_ok:
            bad.append(f"/v1/heartbeat/../../v1/nodes: HTTP {r2.status_code}")
        self.s.check(
            3,
            Summary.TITLES[3],
            not bad,
            "; ".join(bad)
            or "statuses from Ironic: "
            + ", ".join(f"{w.split(' via ')[0]} {st}" for w, _, st in results[: len(probes)])
            + "; /v1/heartbeat/../../v1/nodes without credentials: 401",
        )

    def json_rpc(self):
        inst = self.instances[0]
        cert = (os.path.join(inst.tls_dir, "tls.crt"), os.path.join(inst.tls_dir, "tls.key"))
        url = f"https://{inst.ip}:{h.RPC_PORT}/"
        call = {"jsonrpc": "2.0", "method": "get_conductor_info", "params": {}, "id": "e2e"}
        bare = requests.post(url, json=call, cert=cert, verify=self.ca, timeout=15)
        withpw = requests.post(url, json=call, cert=cert, verify=self.ca, timeout=15,
                               auth=(RPC_USER, RPC_PASSWORD))  # fmt: skip
        crossed = len(self.conductors) > 1
        if self.rpc_auth == "http_basic":
            ok = crossed and bare.status_code == 401 and withpw.status_code == 200
        else:
            ok = crossed and bare.status_code == 200
        self.s.check(
            4,
            Summary.TITLES[4] + f" ({self.rpc_auth})",
            ok,
            f"nodes on {len(self.conductors)} conductors; a call with the client certificate "
            f"and no password: HTTP {bare.status_code}; with the password: "
            f"HTTP {withpw.status_code}",
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy-bin", required=True)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--rpc-auth", choices=["noauth", "http_basic"], default="noauth")
    args = parser.parse_args()
    base.run_scenario(AuthE2E, args, Summary())


if __name__ == "__main__":
    main()
