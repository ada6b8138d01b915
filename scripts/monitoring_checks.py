"""Checks of scripts/validate-monitoring that need no running proxy: the alerts fire on
synthetic series, runbooks exist for them, the operator guide quotes them right, and the
PodMonitor/ServiceMonitor select the kit's pods. Each check reports through `ok`/`fail`.
"""

import re
import subprocess
from pathlib import Path

import yaml

# The labels every synthetic series carries, as a scrape by podmonitor.yaml gives them.
JOB = {"job": "ironic-proxy-sidecar", "instance": "192.168.111.21:9901"}
J = 'job="ironic-proxy-sidecar",instance="192.168.111.21:9901"'

# Per alert: input series (promtool notation, 1m apart), when to evaluate, and the labels the
# firing alert must carry besides alertname and the rule's own labels. Series the alert must
# ignore sit beside the ones that fire it (egress, auth): the expected list is exact.
FIXTURES = {
    "IronicProxyCertificateExpiringSoon": dict(
        series=[(f'ironic_proxy_certificate_expiry_timestamp_seconds{{certificate="leaf",subject="CN=x",serial="01",{J}}}', "3600x20")],
        at="10m", labels=dict(JOB, certificate="leaf", subject="CN=x", serial="01")),
    "IronicProxyCertificateRenewalFailing": dict(
        series=[(f"ironic_proxy_certificate_renewal_failures_total{{{J}}}", "0 0 1 1 1 1")],
        at="5m", labels=JOB),
    "IronicProxyReloadFailing": dict(
        series=[(f'ironic_proxy_reload_failures_total{{what="metrics_token",{J}}}', "0 0 1 1 1")],
        at="4m", labels=dict(JOB, what="metrics_token")),
    "IronicProxyTrustedCAExpiringSoon": dict(
        series=[(f'ironic_proxy_certificate_expiry_timestamp_seconds{{certificate="ca",subject="CN=ca",serial="02",{J}}}', "86400x90")],
        at="70m", labels=dict(JOB, certificate="ca", subject="CN=ca", serial="02")),
    "IronicProxyTrustedCAExpired": dict(
        series=[(f'ironic_proxy_certificate_expiry_timestamp_seconds{{certificate="ca",subject="CN=old",serial="03",{J}}}', "30x20")],
        at="10m", labels=dict(JOB, certificate="ca", subject="CN=old", serial="03")),
    "IronicProxyNoHealthyUpstream": dict(
        series=[(f'ironic_proxy_upstream_endpoints{{upstream="api",state="healthy",{J}}}', "0x10"),
                (f'ironic_proxy_upstream_endpoints{{upstream="api",state="unhealthy",{J}}}', "2x10")],
        at="5m", labels=dict(JOB, upstream="api")),
    "IronicProxyPeerUnhealthy": dict(
        series=[(f'ironic_proxy_upstream_endpoint_healthy{{upstream="api",endpoint="192.168.111.22:6385",role="peer",{J}}}', "0x15"),
                (f'ironic_proxy_upstream_endpoint_healthy{{upstream="api",endpoint="unix:/shared/ironic.sock",role="local",{J}}}', "0x15")],
        at="10m", labels=dict(JOB, upstream="api", endpoint="192.168.111.22:6385", role="peer")),
    "IronicProxyDNSFailing": dict(
        series=[(f'ironic_proxy_dns_failures_total{{upstream="api",{J}}}', "0+1x30")],
        at="25m", labels=dict(JOB, upstream="api")),
    "IronicProxyHigh5xxRatio": dict(
        series=[(f'ironic_proxy_requests_total{{listener="api",class="5xx",code="502",{J}}}', "0+6x30"),
                (f'ironic_proxy_requests_total{{listener="api",class="2xx",code="200",{J}}}', "0+10x30")],
        at="25m", labels=dict(JOB, listener="api")),
    "IronicProxyTLSHandshakeFailures": dict(
        series=[(f'ironic_proxy_tls_handshake_failures_total{{listener="api",reason="bad_certificate",{J}}}', "0+6x30"),
                (f'ironic_proxy_tls_handshake_failures_total{{listener="json-rpc",reason="bad_certificate",{J}}}', "0x30")],
        at="25m", labels=dict(JOB, listener="api", reason="bad_certificate")),
    "IronicProxyPeerTLSFailures": dict(
        series=[(f'ironic_proxy_peer_tls_failures_total{{upstream="api",reason="name_mismatch",{J}}}', "0+1x30")],
        at="25m", labels=dict(JOB, upstream="api", reason="name_mismatch")),
    "IronicProxyJSONRPCErrors": dict(
        series=[(f'ironic_proxy_jsonrpc_calls_total{{listener="json-rpc",method="do_node_deploy",outcome="error",{J}}}', "0+5x40"),
                (f'ironic_proxy_jsonrpc_calls_total{{listener="json-rpc",method="do_node_deploy",outcome="ok",{J}}}', "0+5x40")],
        at="30m", labels=dict(JOB, listener="json-rpc", method="do_node_deploy")),
    "IronicProxyJSONRPCSlow": dict(
        series=[(f'ironic_proxy_jsonrpc_call_duration_seconds_bucket{{listener="json-rpc",method="do_node_deploy",le="10",{J}}}', "0x40"),
                (f'ironic_proxy_jsonrpc_call_duration_seconds_bucket{{listener="json-rpc",method="do_node_deploy",le="60",{J}}}', "0+1x40"),
                (f'ironic_proxy_jsonrpc_call_duration_seconds_bucket{{listener="json-rpc",method="do_node_deploy",le="+Inf",{J}}}', "0+1x40")],
        at="30m", labels=dict(JOB, listener="json-rpc", method="do_node_deploy")),
    "IronicProxyJSONRPCCallersRefused": dict(
        series=[(f'ironic_proxy_tls_handshake_failures_total{{listener="json-rpc",reason="no_client_cert",{J}}}', "0 1 1 1")],
        at="3m", labels=dict(JOB, reason="no_client_cert")),
    "IronicProxyJSONRPC4xx": dict(
        series=[(f'ironic_proxy_requests_total{{listener="json-rpc",class="4xx",code="403",{J}}}', "0 1 1 1"),
                (f'ironic_proxy_requests_total{{listener="api",class="4xx",code="404",{J}}}', "0 1 2 3")],
        at="3m", labels=dict(JOB, code="403")),
    "IronicProxySidecarDown": dict(
        series=[(f"up{{{J}}}", "1 1 0x10"),
                ('up{job="ironic-proxy-sidecar",instance="192.168.111.22:9901"}', "1x12")],
        at="6m", labels=JOB),
    "IronicProxySidecarMetricsAbsent": dict(
        series=[('up{job="ironic-proxy-balancer",instance="192.168.111.21:9902"}', "1x20")],
        at="15m", labels={"job": "ironic-proxy-sidecar"}),
    "IronicProxyBalancerDown": dict(
        series=[('up{job="ironic-proxy-balancer",instance="192.168.111.21:9902"}', "0x10")],
        at="5m", labels={"job": "ironic-proxy-balancer", "instance": "192.168.111.21:9902"}),
    "IronicProxyPanics": dict(
        series=[(f"ironic_proxy_panics_total{{{J}}}", "0 0 1 1")],
        at="3m", labels=JOB),
    "IronicProxyEgressRefusals": dict(
        series=[(f'ironic_proxy_egress_requests_total{{listener="json-rpc-egress",outcome="target_refused",{J}}}', "0 1 1"),
                (f'ironic_proxy_egress_requests_total{{listener="json-rpc-egress",outcome="forwarded",{J}}}', "0+5x3"),
                (f'ironic_proxy_egress_requests_total{{listener="json-rpc-egress",outcome="relayed",{J}}}', "0+5x3"),
                (f'ironic_proxy_egress_requests_total{{listener="json-rpc-egress",outcome="peer_failed",{J}}}', "0+1x3")],
        at="2m", labels=dict(JOB, listener="json-rpc-egress", outcome="target_refused")),
    "IronicProxyAuthFailures": dict(
        series=[(f'ironic_proxy_auth_total{{listener="api",outcome="wrong_password",{J}}}', "0+12x30"),
                (f'ironic_proxy_auth_total{{listener="api",outcome="ok",{J}}}', "0+100x30"),
                (f'ironic_proxy_auth_total{{listener="admin",outcome="no_credentials",{J}}}', "0+100x30")],
        at="20m", labels=dict(JOB, listener="api")),
    "IronicProxyBootFileFindFailing": dict(
        series=[(f'ironic_proxy_find_total{{listener="api",outcome="failed",{J}}}', "0+1x30"),
                (f'ironic_proxy_find_total{{listener="api",outcome="not_found",{J}}}', "0+9x30")],
        at="20m", labels=dict(JOB, listener="api")),
}

# Exported families that need no panel, and why.
NO_PANEL = {
    "process_virtual_memory_bytes": "address space reserved, not used: resident memory is the "
                                    "figure to watch, and has a panel",
}

RUNBOOK_PREFIX = "docs/operate.md#"


def alert_tests(tool, groups, tmp, ok, fail):
    """promtool test rules on the rules without annotations and a test file from FIXTURES."""
    bare = {"groups": [{"name": g["name"], "rules": [
        {k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
        for g in groups["groups"]]}
    (tmp / "alerts.yaml").write_text(yaml.safe_dump(bare))
    rules = {r["alert"]: r for g in groups["groups"] for r in g["rules"] if "alert" in r}
    tests = []
    for name, rule in rules.items():
        fx = FIXTURES.get(name)
        if fx is None:
            fail(f"alert {name}: no fixture in scripts/monitoring_checks.py FIXTURES")
            continue
        tests.append({
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in fx["series"]],
            "alert_rule_test": [{
                "eval_time": fx["at"],
                "alertname": name,
                "exp_alerts": [{"exp_labels": dict(fx["labels"], **rule.get("labels", {}))}],
            }],
        })
    for name in sorted(set(FIXTURES) - set(rules)):
        fail(f"FIXTURES has {name}, which is no alert")
    (tmp / "alerts-test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["alerts.yaml"], "evaluation_interval": "1m", "tests": tests}))
    r = subprocess.run([tool, "test", "rules", "alerts-test.yaml"], cwd=tmp,
                       capture_output=True, text=True)
    if r.returncode == 0:
        ok(f"promtool test rules: each of {len(tests)} alerts fires on its synthetic series "
           "with the expected labels")
    else:
        fail(f"promtool test rules:\n{r.stdout}{r.stderr}")


def anchor(heading):
    """GitHub's anchor of a Markdown heading."""
    a = heading.strip().lower()
    a = re.sub(r"[^\w\- ]", "", a)
    return a.replace(" ", "-")


def runbook_checks(alerts, root, ok, fail):
    text = (root / "docs/operate.md").read_text()
    sections = {}
    current = None
    in_alerts = False
    for line in text.splitlines():
        if line.startswith("## "):
            in_alerts = line.strip() == "## Alerts and runbooks"
            current = None
        elif line.startswith("### ") and in_alerts:
            current = line[4:].strip()
            sections[current] = []
        elif current:
            sections[current].append(line)
    by_anchor = {anchor(h): h for h in sections}
    named = set()
    for r in alerts:
        name = r["alert"]
        url = (r.get("annotations") or {}).get("runbook_url", "")
        if not url.startswith(RUNBOOK_PREFIX):
            fail(f"alert {name}: runbook_url {url!r} is not {RUNBOOK_PREFIX}<anchor>")
            continue
        heading = by_anchor.get(url[len(RUNBOOK_PREFIX):])
        if heading is None:
            fail(f"alert {name}: {url} has no section in docs/operate.md, "
                 "\"## Alerts and runbooks\"")
            continue
        named.add(heading)
        body = "\n".join(sections[heading])
        missing = [p for p in ("Symptom", "Check", "Fix") if f"**{p}**" not in body]
        if heading != name:
            fail(f"alert {name}: its runbook section is titled {heading!r}")
        elif missing:
            fail(f"alert {name}: runbook {url} has no {', '.join(missing)}")
        else:
            ok(f"alert {name}: runbook {url} (Symptom, Check, Fix)")
    for h in sorted(set(sections) - named):
        fail(f"docs/operate.md: runbook {h!r} belongs to no alert")


def norm(expr):
    return " ".join(expr.split())


def guide_checks(alerts, root, ok, fail):
    """The PromQL block of docs/operate.md's "Dashboard and alerts" section: every expression
    is an alert's, and every alert is there, so the guide and the rules cannot drift apart."""
    text = (root / "docs/operate.md").read_text()
    intro = "The alerts, as the rules have them"
    m = re.search(re.escape(intro) + r".*?```promql\n(.*?)```", text, re.S)
    if not m:
        fail(f"docs/operate.md: no ```promql block after {intro!r}")
        return
    exprs = {norm(r["expr"]): r["alert"] for r in alerts}
    fors = {r["alert"]: r.get("for") for r in alerts}
    quoted = {}
    name = None
    for line in m.group(1).splitlines():
        if line.startswith("# "):
            name = line[2:].split(":")[0].strip()
            said = re.search(r", for (\w+)", line)
            if fors.get(name, "?") != (said.group(1) if said else None):
                fail(f"docs/operate.md: {name} 'for' is {said and said.group(1)}, "
                     f"the rule's {fors.get(name)}")
        elif line.strip():
            quoted[name] = norm(line)
    for a, e in quoted.items():
        if exprs.get(e) != a:
            fail(f"docs/operate.md quotes {a}: {e!r}, which is not that alert's expr")
    missing = sorted(set(exprs.values()) - set(quoted))
    if missing:
        fail(f"docs/operate.md does not quote {', '.join(missing)}")
    else:
        ok(f"docs/operate.md quotes the {len(quoted)} alert expressions as the rules have them")


def containers(doc):
    spec = doc["spec"]["template"]["spec"]
    return (spec.get("initContainers") or []) + (spec.get("containers") or [])


def kit_workloads(root):
    out = []
    for path in sorted((root / "config/k8s").glob("*/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("DaemonSet", "Deployment"):
                for c in containers(doc):
                    if c["name"] == "ironic-proxy":
                        out.append((path.relative_to(root), doc, c))
    return out


def monitor_checks(root, ok, fail):
    workloads = kit_workloads(root)
    if not workloads:
        fail("config/k8s: no workload with an ironic-proxy container")
        return
    monitors = {}
    for f in ("podmonitor.yaml", "servicemonitor.yaml"):
        try:
            docs = [d for d in yaml.safe_load_all((root / "config/monitoring" / f).read_text()) if d]
        except (OSError, yaml.YAMLError) as e:
            fail(f"config/monitoring/{f}: {e}")
            continue
        for d in docs:
            monitors.setdefault(d.get("kind"), []).append((f, d))
    jobs = {"PodMonitor": "ironic-proxy-sidecar", "ServiceMonitor": "ironic-proxy-balancer"}
    services = [d for _, d in monitors.get("Service", [])]
    for kind, job in jobs.items():
        if not monitors.get(kind):
            fail(f"config/monitoring: no {kind}")
        for f, m in monitors.get(kind, []):
            what = f"{f} {kind}/{m['metadata']['name']}"
            sel = m["spec"]["selector"].get("matchLabels") or {}
            eps = m["spec"].get("podMetricsEndpoints" if kind == "PodMonitor" else "endpoints") or []
            if kind == "ServiceMonitor":
                svc = [s for s in services
                       if sel and sel.items() <= ((s["metadata"].get("labels") or {}).items())]
                if len(svc) != 1:
                    fail(f"{what}: selects {len(svc)} Services of its file, expected 1")
                    continue
                pod_sel = svc[0]["spec"]["selector"]
                ports = {p["name"]: p.get("targetPort") for p in svc[0]["spec"]["ports"]}
            else:
                pod_sel = sel
                ports = None
            targets = [(p, d, c) for p, d, c in workloads
                       if pod_sel and pod_sel.items() <= (d["spec"]["template"]["metadata"]
                                                          .get("labels") or {}).items()]
            if not targets:
                fail(f"{what}: selects no pod of the kit ({pod_sel})")
                continue
            for ep in eps:
                port = ep.get("port")
                if ports is not None:
                    port = ports.get(port)
                relabel = [r.get("replacement") for r in ep.get("relabelings") or []
                           if r.get("targetLabel") == "job"]
                cred = ((ep.get("authorization") or {}).get("credentials")) or {}
                for path, d, c in targets:
                    names = {p.get("name") for p in c.get("ports") or []}
                    env = {e["name"]: e.get("value") for e in c.get("env") or []}
                    where = f"{what} -> {path} {d['metadata']['name']}"
                    problems = []
                    # A DaemonSet that surges (the balancer) declares no port and names the
                    # ones it binds in an annotation: there, the admin port is the profile's 9902.
                    bound = (d["spec"]["template"]["metadata"].get("annotations") or {}).get(
                        "ironic-proxy.metal3.io/host-ports", "")
                    named = port == "admin" and port in names
                    numbered = port == 9902 and "9902/TCP" in bound.split()
                    if not (named or numbered):
                        problems.append(f"port {port!r} is not the container's admin port")
                    if ep.get("path") != "/metrics":
                        problems.append(f"path {ep.get('path')!r}")
                    if relabel != [job]:
                        problems.append(f"job {relabel}, the alerts select {job}")
                    token = env.get("IRONIC_PROXY_METRICS_TOKEN_FILE")
                    mounted = secret_of(d, c, token) if token else None
                    if mounted != (cred.get("name"), cred.get("key")):
                        problems.append(f"token from Secret {cred.get('name')}/{cred.get('key')}, "
                                        f"the container reads {token} ({mounted})")
                    if problems:
                        fail(f"{where}: {'; '.join(problems)}")
                    else:
                        ok(f"{where}: port admin, /metrics, job {job}, token "
                           f"{cred['name']}/{cred['key']}")


def secret_of(doc, container, path):
    """(Secret name, key) the file at `path` in `container` comes from, or None."""
    vols = {v["name"]: v for v in doc["spec"]["template"]["spec"].get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        mp = m["mountPath"].rstrip("/") + "/"
        if path.startswith(mp):
            secret = vols.get(m["name"], {}).get("secret")
            if not secret:
                return None
            rel = path[len(mp):]
            items = {i["path"]: i["key"] for i in secret.get("items") or []}
            return (secret["secretName"], items.get(rel, rel) if items else rel)
    return None
