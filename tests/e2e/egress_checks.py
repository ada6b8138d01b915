"""Egress (issues 34 and 42), check 7 of `ironic_e2e.py --egress`: Ironic's JSON-RPC client runs
with `[json_rpc]client_use_ssl = False` and `HTTP_PROXY` naming its own sidecar's egress
listener, which originates mutual TLS to the peer's sidecar with its live identity; Ironic reads
no certificate, key or CA, and its `no_proxy` names loopback only, as the kit sets it.

Checked after the run, from the sidecars' access logs (which survive a sidecar's restart) and
metrics:
- every JSON-RPC call Ironic made went out through its own egress and was served by the callee's
  json-rpc listener: the calls counted at both ends (the caller's `json-rpc-egress` access lines
  and the callees' `json-rpc` access lines, the test's own probes left out) are equal, none of
  them 4xx or 5xx, and `ironic_proxy_egress_requests_total{outcome="forwarded"}` counts on every
  live sidecar, with no refusal and no `peer_failed` during the run (the counts are recorded);
- Ironic's configuration names no cafile, certfile or keyfile;
- relay (`others = "relay"`), with Ironic's exact environment (no `no_proxy` beyond loopback):
  (a) an agent-style call (`requests.Session().post("http://<agent>:9999/v1/commands/")`, as
  `ironic/drivers/modules/agent_client.py` makes it) to a fake agent inside the peers' CIDR, from
  the profile's sidecar and a file-configured one; (b) the same to a fake agent on IPv6, in a
  network namespace this check creates and reaches over a veth pair; (c) an image download
  (`requests.get(url, stream=True)`, as Ironic's `HttpImageService.download` does) from a static
  server outside every target, its SHA-256 compared. Each reached its server through the egress
  (`Via: 1.1 ironic-proxy`, no `Proxy-Authorization`) and counted `relayed` exactly once; and the
  JSON-RPC port on a host outside `targets` is 403 `target_refused`, its listener never dialled.
"""

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import harness as h

CHECK = 7
TITLE = (
    "egress: JSON-RPC without TLS in Ironic, counted at both ends; with no no_proxy beyond "
    "loopback, agent calls (IPv4 in the peers' CIDR, IPv6) and an image download are relayed"
)

AGENT_CALL = r"""
import json, sys, requests
r = requests.Session().post(sys.argv[1], json={"name": "get_clean_steps", "params": {}}, timeout=10)
print(json.dumps({"status": r.status_code, "body": r.text[:200]}))
"""

IMAGE_GET = r"""
import hashlib, json, sys, requests
h, n = hashlib.sha256(), 0
with requests.get(sys.argv[1], stream=True, timeout=60) as r:
    for chunk in r.iter_content(1 << 16):
        h.update(chunk)
        n += len(chunk)
print(json.dumps({"status": r.status_code, "bytes": n, "sha256": h.hexdigest()}))
"""

# A fake agent: answers POST, prints one JSON line per request (client, Via, whether a
# Proxy-Authorization arrived), flushed, so the check reads what reached it.
AGENT_SERVER = r"""
import http.server, json, socket, sys

class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        print(json.dumps({"client": self.client_address[0], "via": self.headers.get("via"),
                          "proxy_auth": "proxy-authorization" in self.headers}), flush=True)
        body = b'{"command_status": "SUCCEEDED"}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

class S(http.server.HTTPServer):
    address_family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET

print("listening", flush=True)
S((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""

V6_NS = f"ironic-e2e-egress-{os.getpid()}"
V6_HOST, V6_AGENT = "fd42:e2e::1", "fd42:e2e::5"


def egress_counts(inst):
    samples = h.scrape(inst.admin_url)
    return {
        labels.get("outcome"): v
        for name, labels, v in samples
        if name == "ironic_proxy_egress_requests_total"
    }


def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


class Agent:
    """A fake agent process (in `netns` when given); `hits()` is what reached it."""

    def __init__(self, ip, port, netns=None):
        self.out = tempfile.NamedTemporaryFile("w+", suffix=".agent.log")
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self.p = subprocess.Popen(
            prefix + [sys.executable, "-c", AGENT_SERVER, ip, str(port)],
            stdout=self.out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while "listening" not in self.text():
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fake agent on {ip} did not start: {self.text()}")
            time.sleep(0.05)

    def text(self):
        self.out.seek(0)
        return self.out.read()

    def hits(self):
        return [json.loads(line) for line in self.text().splitlines() if line.startswith("{")]

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=10)
        self.out.close()


def v6_netns():
    """A namespace holding V6_AGENT, reached from here over a veth pair whose host end holds
    V6_HOST (nodad: usable at once). Deleting the namespace deletes both ends."""
    sh("ip", "netns", "add", V6_NS)
    sh("ip", "link", "add", "e2e-eg0", "type", "veth", "peer", "name", "e2e-eg1", "netns", V6_NS)
    sh("ip", "-6", "addr", "add", f"{V6_HOST}/64", "dev", "e2e-eg0", "nodad")
    sh("ip", "link", "set", "e2e-eg0", "up")
    for cmd in (["ip", "link", "set", "lo", "up"],
                ["ip", "-6", "addr", "add", f"{V6_AGENT}/64", "dev", "e2e-eg1", "nodad"],
                ["ip", "link", "set", "e2e-eg1", "up"]):
        sh("ip", "netns", "exec", V6_NS, *cmd)


def python_with(env, script, *args):
    p = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    if p.returncode != 0:
        return {"status": 0, "body": p.stderr.strip()[-300:]}
    return json.loads(p.stdout)


def relayed_once(inst, before, call):
    """Runs `call()`; its result and the change of each egress outcome on `inst`."""
    out = call()
    after = egress_counts(inst)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    return out, delta, after


def relay_check(e2e):
    """(a), (b), (c) and the JSON-RPC port off targets; (ok, detail, refusals seen)."""
    problems, facts = [], []
    path = "/v1/commands/?wait=true"
    v4 = Agent(h.AGENT_IP, h.AGENT_PORT)
    v6 = None
    image_dir = tempfile.TemporaryDirectory()
    image = os.urandom(8 << 20)
    with open(os.path.join(image_dir.name, "ipa.initramfs"), "wb") as f:
        f.write(image)
    image_port = h.free_port(h.IMAGE_IP)
    httpd = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "static_httpd.py"),
         str(image_port), "--bind", h.IMAGE_IP, "--directory", image_dir.name],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    catcher = None
    try:
        v6_netns()
        v6 = Agent(V6_AGENT, h.AGENT_PORT, netns=V6_NS)
        h.wait_for(
            "the image server",
            lambda: socket.create_connection((h.IMAGE_IP, image_port), 1).close() or True, 20,
        )  # fmt: skip
        # (a) from the profile's sidecar (targets: the conductors' /32s) and a file-configured
        # one (targets: the peers' CIDR, which holds the agent).
        for inst in e2e.instances[:2]:
            env = {**os.environ, **h.egress_env(inst, e2e.egress_password)}
            before = egress_counts(inst)
            n = len(v4.hits())
            out, delta, _ = relayed_once(
                inst, before,
                lambda: python_with(env, AGENT_CALL, f"http://{h.AGENT_IP}:{h.AGENT_PORT}{path}"),
            )  # fmt: skip
            hit = v4.hits()[n:]
            ok = (out["status"] == 200 and delta == {"relayed": 1} and len(hit) == 1
                  and hit[0]["via"] == "1.1 ironic-proxy" and not hit[0]["proxy_auth"])
            facts.append(f"(a) {inst.ip} -> {h.AGENT_IP}:{h.AGENT_PORT}: HTTP {out['status']}, "
                         f"egress {delta}, agent saw {hit}")
            if not ok:
                problems.append(facts[-1])
        inst = e2e.instances[1]
        env = {**os.environ, **h.egress_env(inst, e2e.egress_password)}
        # (b) IPv6.
        before = egress_counts(inst)
        out, delta, _ = relayed_once(
            inst, before,
            lambda: python_with(env, AGENT_CALL, f"http://[{V6_AGENT}]:{h.AGENT_PORT}{path}"),
        )  # fmt: skip
        hit = v6.hits()
        ok = (out["status"] == 200 and delta == {"relayed": 1} and len(hit) == 1
              and hit[0]["via"] == "1.1 ironic-proxy" and hit[0]["client"] == V6_HOST)
        facts.append(f"(b) {inst.ip} -> [{V6_AGENT}]:{h.AGENT_PORT}: HTTP {out['status']}, "
                     f"egress {delta}, agent saw {hit}")
        if not ok:
            problems.append(facts[-1])
        # (c) an image download.
        before = egress_counts(inst)
        url = f"http://{h.IMAGE_IP}:{image_port}/ipa.initramfs"
        out, delta, _ = relayed_once(inst, before, lambda: python_with(env, IMAGE_GET, url))
        want = hashlib.sha256(image).hexdigest()
        ok = out.get("status") == 200 and out.get("sha256") == want and delta == {"relayed": 1}
        facts.append(f"(c) {url}: HTTP {out.get('status')}, {out.get('bytes')} bytes, "
                     f"SHA-256 equal {out.get('sha256') == want}, egress {delta}")
        if not ok:
            problems.append(facts[-1])
        # The JSON-RPC port on a host outside targets: 403, never dialled.
        catcher = Agent(h.IMAGE_IP, h.RPC_PORT)
        before = egress_counts(inst)
        out, delta, _ = relayed_once(
            inst, before, lambda: python_with(env, AGENT_CALL, f"http://{h.IMAGE_IP}:{h.RPC_PORT}/"),
        )  # fmt: skip
        ok = out["status"] == 403 and delta == {"target_refused": 1} and not catcher.hits()
        facts.append(f"JSON-RPC port off targets http://{h.IMAGE_IP}:{h.RPC_PORT}/: HTTP "
                     f"{out['status']}, egress {delta}, dialled {bool(catcher.hits())}")
        if not ok:
            problems.append(facts[-1])
    except Exception as e:  # noqa: BLE001 - reported as the check's failure
        problems.append(f"relay check could not run: {e!r}")
    finally:
        for a in (v4, v6, catcher):
            if a is not None:
                a.stop()
        httpd.terminate()
        httpd.wait(timeout=10)
        image_dir.cleanup()
        subprocess.run(["ip", "netns", "del", V6_NS], capture_output=True, timeout=30)
    return not problems, "; ".join(facts + [f"PROBLEMS: {problems}"] if problems else facts)


def run(e2e):
    """Check 7; only with --egress."""
    egress_calls, egress_bad, rpc_calls = 0, [], 0
    for inst in e2e.instances:
        for e in h.proxy_events(inst.sidecar_log):
            f = e.get("fields", e)
            if e.get("target") != "access" or f.get("path") == "/e2e-control-probe":
                continue
            if f.get("rpc_method") == "other":
                continue  # the test's own probes, not Ironic's calls
            status = int(f.get("status", 0))
            if f.get("listener") == "json-rpc-egress":
                egress_calls += 1
                if status >= 400 or status == 0:
                    egress_bad.append(f"{inst.ip}: {f.get('rpc_method')} {status}")
            elif f.get("listener") == "json-rpc":
                rpc_calls += 1
    counts = {inst.ip: egress_counts(inst) for inst in e2e.instances}
    forwarded = {ip: c.get("forwarded", 0) for ip, c in counts.items()}
    refused = {
        ip: {k: v for k, v in c.items() if k not in ("forwarded", "plain", "relayed") and v}
        for ip, c in counts.items()
    }
    keys = []
    for inst in e2e.instances:
        with open(inst.conf) as f:
            keys += [
                f"{inst.ip}: {line.strip()}"
                for line in f
                if line.startswith(("cafile", "certfile", "keyfile"))
                or line.replace(" ", "").lower() == "client_use_ssl=true\n"
            ]
    # The run's own outcomes, before the relay check adds its own.
    relay_ok, relay_detail = relay_check(e2e)
    e2e.s.figure(
        "egress",
        f"JSON-RPC calls out through the callers' egress {egress_calls}, in at the callees' "
        f"json-rpc listeners {rpc_calls}; forwarded (metric, live sidecars) {forwarded}; "
        f"refusals and failures {refused}; all egress outcomes during the run {counts}; "
        f"Ironic TLS settings {keys or 'none'}",
    )
    ok = (
        egress_calls > 0
        and egress_calls == rpc_calls
        and not egress_bad
        and all(v > 0 for v in forwarded.values())
        and not any(refused.values())
        and not keys
        and relay_ok
    )
    e2e.s.check(
        CHECK,
        TITLE,
        ok,
        f"{egress_calls} calls out through egress = {rpc_calls} in at the callees "
        f"({len(egress_bad)} failed{': ' + str(egress_bad[:5]) if egress_bad else ''}); "
        f"refusals during the run {refused}; Ironic holds no TLS setting {not keys}; "
        f"{relay_detail}",
    )
