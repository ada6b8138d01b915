"""Operability step of the end-to-end test (issue 14), run after the node flows.

1. `ironic-proxy doctor --config <sidecar.toml> --json` on every instance passes (its sidecar's
   identity, export, Ironic's sockets, admin). Sidecars renew every few seconds here, so a run that
   catches a renewal between reading the live certificate and the exported one is repeated once.
2. The JSON-RPC methods Ironic really called, per calling conductor, from the sidecars' access
   logs (`rpc_method` with the caller's certificate identity, `jsonrpc = true` on the json-rpc
   listener), and the same counts in `ironic_proxy_jsonrpc_calls_total`, summed over instances.
   Counters of a sidecar restarted during the run start again, so the metric may be lower than
   the logs but never higher; the check wants at least the deploy and power methods, known
   methods only, and `other` only for the test's own probes.
"""

import collections
import time
import json
import subprocess

import harness as h

CHECK = 6
TITLE = "doctor passes on every instance; JSON-RPC methods per conductor"


def doctor(e2e, inst):
    """(passed, checks, failed lines) of one doctor run, repeated once on failure."""
    for attempt in (1, 2):
        p = subprocess.run(
            [e2e.bin, "doctor", "--config", inst.sidecar_conf, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        try:
            report = json.loads(p.stdout)
        except ValueError:
            report = {"ok": False, "checks": [{"check": "output", "verdict": "fail",
                                                "detail": (p.stdout + p.stderr)[:300]}]}
        failed = [f"{c['check']}: {c['detail']}" for c in report["checks"] if c["verdict"] != "pass"]
        ok = p.returncode == 0 and report["ok"] and not failed
        if ok or attempt == 2:
            return ok, len(report["checks"]), failed


def methods_from_logs(e2e):
    """Counter of (caller identity, callee ip, method) over the sidecars' access lines."""
    seen = collections.Counter()
    for inst in e2e.instances:
        for e in h.proxy_events(inst.sidecar_log):
            if e.get("target") != "access" or e.get("listener") != "json-rpc":
                continue
            method = e.get("rpc_method")
            if method in (None, "-"):
                continue
            seen[(e.get("identity", "-"), inst.ip, method)] += 1
    return seen


def run(e2e):
    s = e2e.s
    results = {}
    for inst in e2e.instances:
        ok, n, failed = doctor(e2e, inst)
        results[inst.ip] = ok
        s.figure(
            f"doctor {inst.ip}",
            f"{n} checks, {'all pass' if ok else 'FAILED: ' + '; '.join(failed[:4])}",
        )
    metric = collections.Counter()
    outcomes = collections.Counter()
    for inst in e2e.instances:
        for name, labels, v in h.scrape(inst.admin_url):
            if name == "ironic_proxy_jsonrpc_calls_total" and labels.get("listener") == "json-rpc":
                metric[labels["method"]] += v
                outcomes[labels["outcome"]] += v
    # The metrics first: a call is counted before its access line is logged, and access lines
    # reach stderr in batches within 100 ms, so logs read after that hold every counted call.
    time.sleep(0.5)
    seen = methods_from_logs(e2e)
    by_method = collections.Counter()
    by_caller = collections.defaultdict(collections.Counter)
    for (caller, callee, method), n in seen.items():
        by_method[method] += n
        by_caller[caller][method] += n
    s.figure(
        "JSON-RPC methods (access logs)",
        ", ".join(f"{m} {n}" for m, n in by_method.most_common()) or "none",
    )
    for caller in sorted(by_caller):
        calls = by_caller[caller]
        s.figure(
            f"JSON-RPC calls made by conductor {caller}",
            ", ".join(f"{m} {n}" for m, n in calls.most_common()),
        )
    s.figure(
        "ironic_proxy_jsonrpc_calls_total (live sidecars)",
        ", ".join(f"{m} {n:.0f}" for m, n in metric.most_common())
        + " | by outcome: "
        + ", ".join(f"{o} {n:.0f}" for o, n in outcomes.most_common()),
    )
    wanted = {"do_node_deploy", "change_node_power_state", "do_provisioning_action"}
    missing = sorted(wanted - set(by_method))
    too_high = sorted(m for m, n in metric.items() if n > by_method.get(m, 0))
    callers = sorted(c for c in by_caller if c != "-")
    ok = (
        all(results.values())
        and not missing
        and not too_high
        and len(callers) >= 2
    )
    detail = (
        f"doctor: {sum(results.values())}/{len(results)} instances pass; "
        f"{sum(by_method.values())} JSON-RPC calls logged, {len(by_method)} methods, "
        f"from {len(callers)} conductors ({', '.join(callers)})"
    )
    if missing:
        detail += f"; never seen: {missing}"
    if too_high:
        detail += f"; metric above the log for {too_high}"
    s.check(CHECK, TITLE, ok, detail)
