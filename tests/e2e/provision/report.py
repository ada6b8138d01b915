"""Request counts per path, from the proxies' access logs (one line per request, with the
listener, the upstream, the JSON-RPC method, the status and who failed it: `blame`)."""

import json
import re

FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
BOOT = ("/boot.ipxe", "/pxelinux.cfg/", "/grub.cfg-01-", "/inspector.ipxe", "/images/")


def parse(path):
    """Access records of a proxy log (text or JSON format), as dicts of strings."""
    out = []
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return out
    for line in lines:
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "listener" in rec and "status" in rec and "method" in rec:
                out.append({k: str(v) for k, v in rec.items()})
        elif " access: " in line:
            out.append({k: v.strip('"') for k, v in FIELD.findall(line.split(" access: ", 1)[1])})
    return out


def kind(rec, who):
    """The path a request took, or None for health probes."""
    if rec.get("user_agent") == "ironic-proxy-health":
        return None
    listener, path = rec.get("listener"), rec.get("path", "")
    if who == "balancer":
        return "API through the balancer"
    if listener == "json-rpc-egress":
        if rec.get("rpc_method") not in (None, "-", "other"):
            return "JSON-RPC through the egress"
        if rec.get("upstream", "").endswith(":9999"):
            return "relay to IPA (egress)"
        return "relay, other (BMC, images; egress)"
    if listener == "json-rpc":
        return "JSON-RPC received (mutual TLS)"
    if listener == "vmedia-tls":
        return "virtual media (vmedia-tls)"
    if listener == "boot-tls":
        return "boot files over TLS"
    if path.startswith(BOOT):
        return "boot routes (plain HTTP on the API port)"
    return "API at a sidecar"


def counts(logs):
    """{kind: {"requests": n, "failed": n, "blame": {party: n}}} over (who, path) logs."""
    table = {}
    for who, path in logs:
        for rec in parse(path):
            k = kind(rec, who)
            if k is None:
                continue
            row = table.setdefault(k, {"requests": 0, "failed": 0, "blame": {}})
            row["requests"] += 1
            status = int(rec.get("status", "0") or 0)
            blame = rec.get("blame", "-")
            if blame in ("-", ""):
                # The upstream answered the error itself (Ironic, sushy-tools): the proxy
                # passed it on.
                blame = f"answered by the upstream ({status})"
            if status >= 500 or not blame.startswith("answered"):
                row["failed"] += 1
                row["blame"][blame] = row["blame"].get(blame, 0) + 1
    return table


def print_counts(table):
    print("requests per path (access logs of the sidecars and the balancer; health probes "
          "left out):")
    for k in sorted(table):
        row = table[k]
        blame = ", ".join(f"{b} {n}" for b, n in sorted(row["blame"].items()))
        print(f"  {k:45} {row['requests']:6}  failed {row['failed']}" +
              (f" (blame: {blame})" if blame else ""))


def failed_by_proxy(table):
    """Requests the proxies themselves failed (blame `proxy`/`us`)."""
    return sum(n for row in table.values() for b, n in row["blame"].items()
               if b in ("proxy", "us", "self"))
