"""Request counts per path, from the proxies' access logs (one line per request, with the
listener, the upstream, the JSON-RPC method, the status and who failed it: `blame`)."""

import ipaddress
import json
import os
import re

FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
# A VM's address (the DHCP range .100-.199), as a proxy logs its client.
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


def client_ip(client):
    """The address of an access record's client (`[::ffff:172.22.0.1]:55676`, `1.2.3.4:5`)."""
    host = client.rsplit(":", 1)[0] if client.count(":") == 1 or "]" in client else client
    host = host.strip("[]")
    return host[7:] if host.startswith("::ffff:") else host


def is_vm(client):
    """Whether an access record's client is a VM: host part 100-199 of the run's networks (the
    DHCP range; in IPv6 too, so fd2e:22::64 to ::c7 in hex)."""
    try:
        ip = ipaddress.ip_address(client_ip(client))
    except ValueError:
        return False
    net = ipaddress.ip_network("172.22.0.0/24" if ip.version == 4 else "fd2e:22::/64")
    return ip in net and 100 <= int(ip) - int(net.network_address) <= 199


def kind(rec, who, harness=None):
    """The path a request took, or None for health probes. harness: the address the harness's
    requests come from through a LoadBalancer in front of the sidecars (the statefulset
    layout), whose API records are then split by client as the balancer's are."""
    if rec.get("user_agent") == "ironic-proxy-health":
        return None
    listener, path = rec.get("listener"), rec.get("path", "")
    client = rec.get("client", "")
    if who == "balancer":
        if is_vm(client):
            return "API through the balancer: IPA (lookup, heartbeat, inspection)"
        return "API through the balancer: harness (as BMO)"
    if harness and listener == "api":
        if is_vm(client):
            return "API through the LoadBalancer: IPA (lookup, heartbeat, inspection)"
        if client_ip(client) == harness:
            return "API through the LoadBalancer: harness (as BMO)"
        return "API from a peer sidecar (second hop)"
    if listener == "json-rpc-egress":
        if rec.get("rpc_method") not in (None, "-", "other"):
            return "JSON-RPC through the egress"
        if rec.get("upstream", "").endswith(":9999"):
            return "relay to IPA (egress)"
        return "relay, other (Redfish to the BMC; egress)"
    if listener == "json-rpc":
        return "JSON-RPC received (mutual TLS)"
    if listener == "vmedia-tls" and path.startswith("/images/"):
        return "deploy image over TLS (vmedia-tls port)"
    if listener == "vmedia-tls":
        return "virtual media (vmedia-tls)"
    if listener == "boot-tls":
        return "boot files over TLS"
    if path.startswith(BOOT):
        return "boot routes (plain HTTP on the API port)"
    return "API at a sidecar"


def counts(logs, harness=None):
    """{kind: {"requests": n, "failed": n, "blame": {party: n}}} over (who, path) logs."""
    table = {}
    for who, path in logs:
        for rec in parse(path):
            k = kind(rec, who, harness)
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
        print(f"  {k:64} {row['requests']:6}  failed {row['failed']}" +
              (f" (blame: {blame})" if blame else ""))


def failed_by_proxy(table):
    """Requests the proxies themselves failed (blame `proxy`/`us`)."""
    return sum(n for row in table.values() for b, n in row["blame"].items()
               if b in ("proxy", "us", "self"))


def agent_commands(tmp, roles, uuid=None):
    """Ironic's requests to the agents (ironic/drivers/modules/agent_client.py logs each at
    debug, which ironic-image turns on): commands and command-status polls, over the logs of
    `roles`, for node `uuid` only when given."""
    out = {"commands": 0, "polls": 0}
    node = f" for node {uuid}" if uuid else ""
    for role in roles:
        try:
            text = open(f"{tmp}/{role}-ironic.log", errors="replace").read()
        except OSError:
            continue
        out["commands"] += len(re.findall(r"Executing agent command \S+" + re.escape(node),
                                          text))
        out["polls"] += text.count("Fetching status of agent commands" + node)
    return out


def check_agent_relay(run, tmp, roles, uuid, route=""):
    """The check that Ironic's commands to a plain-HTTP agent left through the egress: at least
    as many `:9999` relays in the sidecars' access logs as Ironic logged commands and status
    polls for the node."""
    relay = [rec for r in roles for rec in parse(os.path.join(tmp, f"{r}-ironic-proxy.log"))
             if rec.get("listener") == "json-rpc-egress"
             and rec.get("upstream", "").endswith(":9999")]
    plain = agent_commands(tmp, roles, uuid)
    want = plain["commands"] + plain["polls"]
    run.check("Ironic's commands to host-b's agent (plain HTTP): through the egress relay",
              want > 0 and len(relay) >= want,
              f"{len(relay)} relayed to :9999 (statuses {sorted({r['status'] for r in relay})}) "
              f"for {plain['commands']} commands and {plain['polls']} status polls in Ironic's "
              f"logs{route}")


UUIDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
NUMBERS = re.compile(r"\b\d+(\.\d+)*\b")
# What counts as a failed request in the logs of the parties that are not proxies.
FAILED = {
    "ironic": re.compile(r" (ERROR|WARNING) .*(HTTP|http|[Cc]onnection|[Tt]imed? ?out|"
                         r"refused|RPC|rpc|json_rpc|[Hh]eartbeat|[Ff]ailed to|Unable to)"),
    "ipa": re.compile(r"(ERROR|WARNING) ironic_python_agent\.(agent|ironic_api_client|"
                      r"inspector)\b.*(heartbeat|[Ll]ookup|[Cc]onnection|HTTP|status|"
                      r"[Tt]imed? ?out|refused|SSL|certificate)"),
    # werkzeug's access lines, coloured for errors ("\x1b[35m\x1b[1mPOST ... HTTP/1.1\x1b[0m").
    "sushy": re.compile(r'"(\x1b\[[0-9;]*m)*\w+ \S+ HTTP/1\.\d(\x1b\[0m)?" [45]\d\d|'
                        r'ERROR|Traceback'),
}


def log_failures(tmp, roles, consoles):
    """Failed requests seen by the parties other than the proxies, grouped by message (UUIDs
    and numbers masked): {(log, party): {message: count}}."""
    logs = [(f"{role}-ironic.log", "ironic", f"{tmp}/{role}-ironic.log") for role in roles]
    logs.append(("bmc-sushy.log", "sushy", f"{tmp}/bmc-sushy.log"))
    logs += [(f"{label} console (IPA)", "ipa", path) for label, path in consoles.items()]
    out = {}
    for name, party, path in logs:
        try:
            lines = open(path, errors="replace").read().splitlines()
        except OSError:
            continue
        groups = {}
        for line in lines:
            if not FAILED[party].search(line):
                continue
            key = NUMBERS.sub("N", UUIDS.sub("UUID", line.split(" - ", 1)[-1]))[:220]
            groups[key] = groups.get(key, 0) + 1
        if groups:
            out[(name, party)] = groups
    return out


def print_failures(groups):
    print("failed or retried requests in the other parties' logs (grouped; classified in "
          "the report):")
    if not groups:
        print("  none")
    for (name, _), msgs in sorted(groups.items()):
        print(f"  {name}:")
        for msg, n in sorted(msgs.items(), key=lambda kv: -kv[1])[:25]:
            print(f"    {n:5}x  {msg}")
