"""The scale e2e's assertions and summary (docs/e2e.md "Scale"): per-path requests, CPU shares,
peak RSS and connections, balancer spread, errors by party. The last line is
`e2e-scale: N passed, N failed`."""

import collections
import csv
import io
import json
import os

import requests

import harness as h
import ironic_e2e
import scale_measure as sm
import scale_setup as ss
from ironic_proxy_testing import cpu

TITLES = {
    "proxy": {
        1: "every host active",
        2: "lookups, heartbeats and inspection data through the balancer over TLS",
        3: "agent commands and Redfish through the sidecars' egress (relayed)",
        4: "JSON-RPC between conductors through the egress",
        5: "0 requests failed by the proxies",
        6: "balancer spread over the 3 conductors",
    },
    "haproxy": {
        1: "every host active",
        2: "lookups, heartbeats and inspection data through the balancer over TLS",
        5: "0 requests failed by HAProxy",
        6: "balancer spread over the 3 conductors",
    },
    "direct": {1: "every host active"},
}


def summary(mode):
    class ScaleSummary(ironic_e2e.TitledSummary):
        HEADING = f"ironic-proxy scale e2e ({mode})"
        LABEL = "e2e-scale"

    s = ScaleSummary()
    s.TITLES = TITLES[mode]
    return s


def haproxy_stats(url):
    r = requests.get(url, timeout=5)
    r.raise_for_status()
    text = r.text.lstrip("# ")
    return list(csv.DictReader(io.StringIO(text)))


def haproxy_current(url):
    return sum(int(r["scur"] or 0) for r in haproxy_stats(url) if r["pxname"] == "api"
               and r["svname"] == "FRONTEND")  # fmt: skip


def haproxy_counters(url):
    """The api frontend's cumulative connections and requests (`conn_tot`, `req_tot`)."""
    for r in haproxy_stats(url):
        if r["pxname"] == "api" and r["svname"] == "FRONTEND":
            return {"connections": int(r.get("conn_tot") or 0),
                    "requests": int(r.get("req_tot") or 0)}  # fmt: skip
    return None


def analyse(e):
    s, d, n = e.s, e.driver, len(e.hosts)
    active = len(d.active_at)
    t_all = e.all_active
    s.figure("hosts active", f"{active} of {n}" + (f", all active after {t_all:.1f} s" if t_all
                                                   else ""))  # fmt: skip
    if d.active_at:
        ts = sorted(d.active_at.values())
        s.figure("time to active", f"first {ts[0]:.1f} s, median {ts[len(ts) // 2]:.1f} s, "
                 f"last {ts[-1]:.1f} s")  # fmt: skip
    failed = collections.Counter(v.split(":", 1)[0] for v in d.failed.values())
    if d.failed:
        s.figure("failed hosts", f"{dict(failed)}; e.g. {next(iter(d.failed.values()))[:300]}")
    s.figure("driver requests", ", ".join(f"{k} {v}" for k, v in sorted(d.requests.items())))
    s.check(1, TITLES[e.mode][1], active == n,
            f"{active} of {n} active" + (f" in {t_all:.1f} s" if t_all else "")
            + (f"; failed: {dict(failed)}" if failed else ""))  # fmt: skip

    paths = sm.Paths()
    if e.mode == "proxy":
        sm.read_proxy_logs(paths, e.lb_log, {i.ip: i.sidecar_log for i in e.instances},
                           e.wall_start)  # fmt: skip
    elif e.mode == "haproxy":
        sm.read_haproxy_log(paths, e.lb_log, e.wall_start)
    table = paths.lines()
    if table:
        s.figure("requests per path (hop, kind, count, peak, status)", "\n    " + "\n    ".join(table))
    cpu_report(e)
    memory_report(e)
    per_request_report(e, paths)
    if e.mode != "direct":
        checks_through(e, paths, n)
    errors_report(e, paths)
    if e.args.result_json:
        write_result(e, paths)


def cpu_report(e):
    c = dict(e.cpu)
    machine = c.pop("machine (every process)")
    total = sum(c.values())
    lines = [f"{k:<34} {v:8.1f} s  {100 * v / total:5.1f} %" for k, v in c.items()]
    lines.append(f"{'run total (the parties above)':<34} {total:8.1f} s")
    lines.append(f"{'machine busy (all users)':<34} {machine:8.1f} s")
    e.s.figure("CPU from first enrol to all active", "\n    " + "\n    ".join(lines))
    e.cpu_total = total


def memory_report(e):
    if e.mode == "direct":
        return
    parts = []
    for name, p in e.proxy_procs():
        pids = cpu.tree(p.pid)
        peak = cpu.peak_rss_kib(pids) / 1024
        conns = e.sampler.peak.get(name, 0)
        parts.append(f"{name}: CPU {e.cpu_each.get(name, 0):.1f} s, peak RSS {peak:.1f} MiB, "
                     f"peak open client connections {conns}")  # fmt: skip
    e.s.figure("proxies' memory and connections", "\n    " + "\n    ".join(parts))


def per_request(e, paths):
    """Per proxy process: time on CPU, requests answered, client connections, and CPU per
    request, gross and less the idle rate measured before the first enrol."""
    out = {}
    for name, _ in e.proxy_procs():
        cpu_s = e.oncpu.get(name, 0.0)
        idle = e.idle_rate.get(name, 0.0) * (e.run_seconds or 0)
        net = cpu_s - idle
        served = paths.served.get(name, 0)
        conns = len(paths.clients.get(name, ()))
        out[name] = {
            "cpu_s": round(cpu_s, 3),
            "idle_ms_per_s": round(1000 * e.idle_rate.get(name, 0.0), 3),
            "requests": served,
            "connections": conns,
            "ms_per_request": round(1000 * cpu_s / served, 3) if served else None,
            "ms_per_request_less_idle": round(1000 * net / served, 3) if served else None,
        }
    return out


def per_request_report(e, paths):
    if e.mode == "direct":
        return
    rows = per_request(e, paths)
    lines = []
    for name, r in rows.items():
        if not r["requests"]:
            lines.append(f"{name}: {r['cpu_s']:.2f} s on CPU, no request")
            continue
        per_conn = r["requests"] / r["connections"] if r["connections"] else float("nan")
        lines.append(
            f"{name}: {r['cpu_s']:.2f} s on CPU, {r['requests']} requests over "
            f"{r['connections']} client connections ({per_conn:.1f} requests per connection, "
            f"so as many TLS handshakes as connections on a TLS listener); "
            f"{r['ms_per_request']:.3f} ms per request, {r['ms_per_request_less_idle']:.3f} less "
            f"its idle {r['idle_ms_per_s']:.2f} ms/s"
        )
    if e.haproxy_counts and e.haproxy_counts0:
        d = {k: e.haproxy_counts[k] - e.haproxy_counts0[k] for k in e.haproxy_counts}
        lines.append(f"HAProxy's own counters (api frontend): {d['requests']} requests, "
                     f"{d['connections']} connections")  # fmt: skip
    if e.mode == "proxy":
        total = sum(r["cpu_s"] for r in rows.values())
        served = rows["balancer"]["requests"]
        lines.append(f"all four proxies: {total:.2f} s on CPU, "
                     f"{1000 * total / max(served, 1):.3f} ms per balancer request")  # fmt: skip
    e.s.figure("proxies' CPU per request (time on CPU from the scheduler)",
               "\n    " + "\n    ".join(lines))


def threads_label(e):
    """The threads of the layout's proxies, as the tables name the layout: ironic-proxy's
    worker threads; HAProxy's `nbthread` when set (else its own default, one per CPU)."""
    if e.mode == "proxy":
        n = e.args.proxy_threads
        return f", {n} thread" + ("s" if n != 1 else "")
    if e.mode == "haproxy" and e.args.haproxy_threads:
        n = e.args.haproxy_threads
        return f", {n} thread" + ("s" if n != 1 else "")
    return ""


def write_result(e, paths):
    """One JSON line per run (--result-json): what the side-by-side tables are made of."""
    d = e.driver
    c = dict(e.cpu)
    machine = c.pop("machine (every process)", None)
    total = sum(c.values()) or 1
    peak = {}
    for name, p in e.proxy_procs():
        peak[name] = {"rss_mib": round(cpu.peak_rss_kib(cpu.tree(p.pid)) / 1024, 1),
                      "peak_open_connections": e.sampler.peak.get(name, 0)}  # fmt: skip
    blamed = sum(v for (_, blame, _), v in paths.blame.items() if blame == "proxy")
    row = {
        "mode": e.mode + threads_label(e),
        "hosts": len(e.hosts),
        "active": len(d.active_at),
        "all_active_s": round(e.all_active, 1) if e.all_active else None,
        "run_s": round(e.run_seconds or 0, 1),
        "load": [round(x, 1) for x in os.getloadavg()],
        "cpu_s": {k: round(v, 2) for k, v in c.items()},
        "cpu_share_pct": {k: round(100 * v / total, 2) for k, v in c.items()},
        "machine_busy_s": round(machine or 0, 1),
        "proxies": per_request(e, paths),
        "peak": peak,
        "haproxy": ({k: e.haproxy_counts[k] - e.haproxy_counts0[k] for k in e.haproxy_counts}
                    if e.haproxy_counts and e.haproxy_counts0 else None),  # fmt: skip
        "paths": {f"{h} / {k}": v for (h, k), v in sorted(paths.count.items())},
        "blamed_on_proxy": blamed,
        "driver_errors": dict(collections.Counter(p for p, _ in d.errors)),
        "failed_hosts": len(d.failed),
    }
    with open(e.args.result_json, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"e2e-scale: result written to {e.args.result_json}", flush=True)


def checks_through(e, paths, n):
    s = e.s
    c = paths.count
    agent = {k: c[("balancer", k)] for k in ("agent lookup", "agent heartbeat",
                                              "agent inspection data")}  # fmt: skip
    ok = agent["agent lookup"] >= n and agent["agent heartbeat"] >= n and \
        agent["agent inspection data"] >= n
    tls = "fake-ipa FAKE_IPA_CAFILE = the test CA, FAKE_IPA_API_URL " + ss.LB_HOST
    s.check(2, TITLES[e.mode][2], ok, f"{agent} through the balancer ({tls})")
    spread = {k: v for k, v in paths.spread.items() if k not in ("-", "", "<NOSRV>")}
    total = sum(spread.values()) or 1
    share = {k: f"{100 * v / total:.0f} %" for k, v in sorted(spread.items())}
    s.figure("balancer spread (requests per conductor)", f"{dict(sorted(spread.items()))} {share}")
    s.check(6, TITLES[e.mode][6], len(spread) == 3 and min(spread.values()) >= total / 10,
            f"{share}")  # fmt: skip
    proxy_failed = sum(v for (hop, blame, st), v in paths.blame.items() if blame == "proxy")
    extra = {}
    if e.mode == "proxy":
        for name, url in [("balancer", e.lb_admin)] + [(i.ip, i.admin_url) for i in e.instances]:
            m = h.scrape(url)
            for metric in ("ironic_proxy_tls_handshake_failures_total",
                           "ironic_proxy_rejected_connections_total", "ironic_proxy_panics_total"):
                v = h.metric(m, metric)
                if v:
                    extra[f"{name} {metric[13:]}"] = v
            v = h.metric(m, "ironic_proxy_egress_requests_total", outcome="peer_failed")
            if v:
                extra[f"{name} egress peer_failed"] = v
        relayed = c[("sidecar egress", "agent commands")]
        redfish = c[("sidecar egress", "Redfish")]
        rpc = c[("sidecar egress", "JSON-RPC")]
        bad = sum(paths.status[("sidecar egress", k)][500] for k in ("agent commands", "Redfish"))
        s.check(3, TITLES["proxy"][3], relayed >= n and redfish >= n and bad == 0,
                f"agent commands {relayed}, Redfish {redfish} relayed, {bad} 5xx")
        rpc_in = c[("sidecar json-rpc in", "JSON-RPC")]
        s.check(4, TITLES["proxy"][4], rpc > 0 and rpc_in >= rpc * 0.99,
                f"{rpc} calls left through the egress (mutual TLS), {rpc_in} arrived")
    failed = proxy_failed + sum(extra.values())
    s.check(5, TITLES[e.mode][5], failed == 0,
            f"{proxy_failed} answers blamed on the proxy; {extra or 'no failure counters'}")


def errors_report(e, paths):
    lines = []
    by_party = collections.Counter(party for party, _ in e.driver.errors)
    for party, count in sorted(by_party.items()):
        example = next(t for p, t in e.driver.errors if p == party)
        lines.append(f"seen by the BMO stand-in, {party}: {count} (e.g. {example[:160]})")
    for (hop, blame, status), v in sorted(paths.blame.items()):
        party = {"proxy": "the proxy", "upstream": "upstream", "client": "client"}.get(blame, blame)
        lines.append(f"{hop}: {v} x {status}, blamed on {party}")
    lines += [f"  {x}" for x in paths.examples[:6]]
    ironic = sm.ironic_errors(e.instances)
    lines.append(f"Ironic ERROR log lines: {sum(ironic.values())}")
    lines += [f"  {v} x {m}" for m, v in ironic.most_common(5)]
    tools = sm.tool_errors([log for _, _, log in e.tools])
    lines.append(f"sushy-tools / fake-ipa ERROR lines: {sum(tools.values())}")
    lines += [f"  {v} x {m}" for m, v in tools.most_common(5)]
    e.s.figure("errors by party", "\n    " + "\n    ".join(lines))
