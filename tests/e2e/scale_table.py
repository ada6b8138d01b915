#!/usr/bin/env python3
"""The side-by-side table of scale runs (docs/e2e.md "Scale", BENCHMARKS.md): reads the JSON
lines that `scripts/e2e-scale --result-json FILE` appends, one per run, and prints one
Markdown row per run and, per mode, the medians of CPU per request with their ratio to HAProxy.

    tests/e2e/scale_table.py results.jsonl
"""

import json
import statistics
import sys


def proxies_of(r):
    """(the balancer's row, the sidecars' rows) of one run; HAProxy is its balancer."""
    p = r.get("proxies") or {}
    lb = p.get("balancer") or p.get("HAProxy")
    sidecars = [v for k, v in p.items() if k.startswith("sidecar")]
    return lb, sidecars


def fmt(x, digits=3):
    return "–" if x is None else f"{x:.{digits}f}"


def row(r):
    lb, sidecars = proxies_of(r)
    share = sum(v for k, v in r["cpu_share_pct"].items() if k.startswith("proxies"))
    cpu = sum(v for k, v in r["cpu_s"].items() if k.startswith("proxies"))
    ironic = r["cpu_s"].get("Ironic (3 instances)", 0)
    rss = ", ".join(f"{v['rss_mib']:.1f}" for v in r["peak"].values()) or "–"
    if lb:
        per = (f"{fmt(lb['ms_per_request'])} ({fmt(lb['ms_per_request_less_idle'])}); "
               f"{lb['requests']} req / {lb['connections']} conn")  # fmt: skip
    else:
        per = "–"
    side = "–"
    if sidecars:
        req = sum(s["requests"] for s in sidecars)
        sc = sum(s["cpu_s"] for s in sidecars)
        idle = sum(s["idle_ms_per_s"] for s in sidecars) / 1000 * r["run_s"]
        side = f"{1000 * sc / req:.3f} ({1000 * (sc - idle) / req:.3f}); {req} req" if req else "–"
    errors = r["blamed_on_proxy"]
    drv = sum(r["driver_errors"].values())
    t = r["all_active_s"]
    time = fmt(t, 0) if t else "> " + fmt(r["run_s"], 0)
    return (f"| {r['mode']} | {r['hosts']} | {r['active']} | {time} s "
            f"| {r['load'][0]:.0f} | {ironic:.0f} s | {cpu:.2f} s ({share:.2f} %) | {per} | {side} "
            f"| {rss} | {errors} ({drv} seen by the driver) |")  # fmt: skip


def main():
    runs = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
    print("| mode | N | active | time to all active | load (1 min, at end) | Ironic CPU "
          "| proxies' CPU (share of the run) | balancer ms CPU per request (less idle); "
          "requests / client connections | sidecars ms per request (less idle) "
          "| peak RSS MiB | failed by the proxies |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    for r in runs:
        print(row(r))
    med = {}
    for r in runs:
        lb, _ = proxies_of(r)
        if lb and lb["ms_per_request"] is not None:
            med.setdefault(r["mode"], []).append(lb)
    print()
    for mode, rows in med.items():
        gross = statistics.median(x["ms_per_request"] for x in rows)
        net = statistics.median(x["ms_per_request_less_idle"] for x in rows)
        line = f"{mode}: balancer median {gross:.3f} ms per request, {net:.3f} less idle"
        if mode != "haproxy" and "haproxy" in med:
            hg = statistics.median(x["ms_per_request"] for x in med["haproxy"])
            hn = statistics.median(x["ms_per_request_less_idle"] for x in med["haproxy"])
            line += f"; against HAProxy {gross / hg:.2f}x gross, {net / hn:.2f}x less idle"
        print(line)


if __name__ == "__main__":
    main()
