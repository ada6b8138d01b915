"""Egress (issue 34), check 7 of `ironic_e2e.py --egress`: Ironic's JSON-RPC client runs with
`[json_rpc]client_use_ssl = False` and `HTTP_PROXY` naming its own sidecar's egress listener,
which originates mutual TLS to the peer's sidecar with its live identity; Ironic reads no
certificate, key or CA.

Checked after the run, from the sidecars' access logs (which survive a sidecar's restart) and
metrics:
- every JSON-RPC call Ironic made went out through its own egress and was served by the callee's
  json-rpc listener: the calls counted at both ends (the caller's `json-rpc-egress` access lines
  and the callees' `json-rpc` access lines, the test's own probes left out) are equal, none of
  them 5xx, and `ironic_proxy_egress_requests_total{outcome="forwarded"}` counts on every live
  sidecar, with no refusal and no `peer_failed`;
- Ironic's configuration names no cafile, certfile or keyfile;
- NO_PROXY: an agent-style call (`requests.Session().post("http://<agent>:9999/v1/commands/")`,
  as `ironic/drivers/modules/agent_client.py` makes it) with Ironic's exact environment reaches
  the fake agent directly, not through the egress (no `Via`, the egress counts nothing); the
  same call with NO_PROXY emptied is refused by the egress (403), so this check fails if
  NO_PROXY is wrong.
"""

import http.server
import json
import os
import subprocess
import sys
import threading

import harness as h

CHECK = 7
TITLE = "egress: JSON-RPC without TLS in Ironic, counted at both ends; NO_PROXY keeps other calls direct"

AGENT_CALL = r"""
import json, sys, requests
r = requests.Session().post(sys.argv[1], json={"name": "get_clean_steps", "params": {}}, timeout=10)
print(json.dumps({"status": r.status_code, "body": r.text[:200]}))
"""


class FakeAgent(http.server.BaseHTTPRequestHandler):
    """The ramdisk agent's command endpoint: records who called and with which headers."""

    seen = []

    def do_POST(self):  # noqa: N802 - http.server's name
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        FakeAgent.seen.append({"client": self.client_address[0], "via": self.headers.get("via")})
        body = b'{"command_status": "SUCCEEDED"}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def egress_counts(inst):
    samples = h.scrape(inst.admin_url)
    return {
        labels.get("outcome"): v
        for name, labels, v in samples
        if name == "ironic_proxy_egress_requests_total"
    }


def agent_call(e2e, inst, env):
    url = f"http://{h.AGENT_IP}:{h.AGENT_PORT}/v1/commands/?wait=true"
    p = subprocess.run(
        [sys.executable, "-c", AGENT_CALL, url],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    if p.returncode != 0:
        return {"status": 0, "body": p.stderr.strip()[-300:]}
    return json.loads(p.stdout)


def no_proxy_check(e2e):
    """The agent-style call with Ironic's environment, then with NO_PROXY emptied."""
    server = http.server.HTTPServer((h.AGENT_IP, h.AGENT_PORT), FakeAgent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        inst = e2e.instances[1]
        env = {**os.environ, **h.egress_env(inst, e2e.egress_password)}
        before = egress_counts(inst)
        direct = agent_call(e2e, inst, env)
        after = egress_counts(inst)
        seen = list(FakeAgent.seen)
        wrong = agent_call(e2e, inst, {**env, "NO_PROXY": ""})
        after_wrong = egress_counts(inst)
    finally:
        server.shutdown()
    direct_ok = (
        direct["status"] == 200 and len(seen) == 1 and seen[0]["via"] is None and before == after
    )
    refused = after_wrong.get("target_refused", 0) - after.get("target_refused", 0)
    wrong_refused = wrong["status"] == 403 and refused == 1 and len(FakeAgent.seen) == 1
    return direct_ok and wrong_refused, (
        f"agent call with Ironic's NO_PROXY: HTTP {direct['status']}, reached the agent "
        f"directly {seen}, egress counts unchanged {before == after}; with NO_PROXY emptied: "
        f"HTTP {wrong['status']} from the egress (target_refused +{refused:.0f}), agent not reached "
        f"{len(FakeAgent.seen) == 1}"
    )


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
        ip: {k: v for k, v in c.items() if k != "forwarded" and v}
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
    no_proxy_ok, no_proxy_detail = no_proxy_check(e2e)
    e2e.s.figure(
        "egress",
        f"JSON-RPC calls out through the callers' egress {egress_calls}, in at the callees' "
        f"json-rpc listeners {rpc_calls}; forwarded (metric, live sidecars) {forwarded}; "
        f"other outcomes {refused}; Ironic TLS settings {keys or 'none'}",
    )
    ok = (
        egress_calls > 0
        and egress_calls == rpc_calls
        and not egress_bad
        and all(v > 0 for v in forwarded.values())
        and not any(refused.values())
        and not keys
        and no_proxy_ok
    )
    e2e.s.check(
        CHECK,
        TITLE,
        ok,
        f"{egress_calls} calls out through egress = {rpc_calls} in at the callees "
        f"({len(egress_bad)} failed{': ' + str(egress_bad[:5]) if egress_bad else ''}); "
        f"refusals {refused}; Ironic holds no TLS setting {not keys}; {no_proxy_detail}",
    )
