"""The networks of the statefulset variant (config/k8s/statefulset, issue 52): what a cluster
and a site give the kit there, built from namespaces.

- **The pod network** (the bridge `<tag>-br`, 172.22.0.0/26): one namespace per pod of the
  StatefulSet (ironic-0, -1, -2), the shared services (MariaDB, the cluster DNS), and the router.
- **The BMC network** (`<tag>-brbmc`, 172.22.0.64/28): sushy-tools.
- **The hosts' network** (`<tag>-brvm`, 172.22.0.128/25): the VM's NIC, and the site's DHCP
  server (in the router; not Ironic's: this layout has none).
- **The router** (namespace `rtr`, an interface on each): the node's routing between pods and the
  networks outside, and the LoadBalancer. The LoadBalancer address (LB, 172.22.0.90, on no
  network) is what kube-proxy's nftables mode makes of a LoadBalancer Service: DNAT of LB:6385
  and LB:6183 to one of the three pods, picked at random per connection (`numgen random mod 3`,
  kube-proxy's endpoint choice), the client's address kept (`externalTrafficPolicy: Local`);
  from the pod network itself it is masqueraded, as kube-proxy does for hairpin traffic, so the
  answer comes back through the router.
- **Filter** (the router's forward chain, policy drop): the hosts' and the BMCs' networks reach
  the LoadBalancer only (6385, 6183); the pods reach the BMCs' Redfish port and the agents' port
  9999, as pods route to the provisioning network in a cluster; nothing else crosses. The
  router itself answers the hosts' network for DHCP only.

The LoadBalancer has no health checks: kube-proxy drops an endpoint when its pod is not Ready,
this one keeps all three (the run restarts nothing).
"""

import ipaddress
import json
import os
import shutil
import subprocess

from ironic_proxy_testing.procs import wait_for
from ironic_proxy_testing.topology import Segment

from .kit import API_PORT, VMEDIA_TLS_PORT

LB = "172.22.0.90"
BMC_PORT = 8000
AGENT_PORT = 9999
# Host parts in the run's /24 (172.22.0.0/24, which the cached CA permits); .80-.127 belong to no
# network, the LoadBalancer address among them.
SEGMENTS = [
    Segment("", "172.22.0.0/26", {"rtr": 1, "svc": 2, "cp1": 11, "cp2": 12, "cp3": 13}),
    Segment("bmc", "172.22.0.64/28", {"rtr": 65, "bmc": 66}),
    # `probe`: a namespace on the hosts' network that stands for a host before the VM boots
    # (isolation checks by TCP connect only); the VMs take DHCP leases in .150-.199.
    Segment("vm", "172.22.0.128/25", {"rtr": 129, "probe": 140}),
]
ROLES = ["rtr", "svc", "bmc", "probe", "cp1", "cp2", "cp3"]
DHCP = ("172.22.0.150", "172.22.0.199")

# `ct status dnat`: a connection the lb rule rewrote, the only DNAT of the ruleset (so: to the
# LoadBalancer address, one of its two ports).
RULES = """\
define LB = {lb}
define FRONT = {{ {api}, {vmedia} }}
define PODS = {pods}
define BMCS = {bmcs}
define VMS = {vms}
table ip e2e {{
    chain lb {{
        type nat hook prerouting priority dstnat; policy accept;
        ip daddr $LB tcp dport $FRONT counter \\
            dnat to numgen random mod 3 map {{ 0 : {cp1}, 1 : {cp2}, 2 : {cp3} }} comment "lb"
    }}
    chain hairpin {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr $PODS ct status dnat counter masquerade comment "pods to lb (masqueraded)"
    }}
    chain forward {{
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
        ct status dnat ip saddr $VMS counter accept comment "vms to lb"
        ct status dnat ip saddr $BMCS counter accept comment "bmcs to lb"
        ct status dnat ip saddr $PODS counter accept comment "pods to lb"
        ip saddr $PODS ip daddr $BMCS tcp dport {bmc_port} counter accept comment "pods to bmcs"
        ip saddr $PODS ip daddr $VMS tcp dport {agent} counter accept comment "pods to agents"
        iifname "vm0" counter drop comment "vms, anything else: dropped"
        counter drop comment "others: dropped"
    }}
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "vm0" udp dport 67 accept
        iifname "vm0" counter drop comment "vms to the router: dropped"
    }}
}}
"""


def start(topo, tmp):
    """The router (forwarding, the ruleset, no ICMP redirects), the routes of every other
    namespace through it, and the site's DHCP server on the hosts' network."""
    # On no network: a client on one would ask for it by ARP instead of going to the router.
    inside = [seg.cidr for seg in SEGMENTS
              if ipaddress.ip_address(LB) in ipaddress.ip_network(seg.cidr)]
    if inside:
        raise ValueError(f"the LoadBalancer address {LB} is inside {inside}")
    # No ICMP redirects: the pods' traffic to the LoadBalancer leaves the router by the
    # interface it came in on, and a redirect would send a pod's next packets for the LB address
    # straight to another pod. The kernel ORs `all` with each interface's value.
    ifaces = [iface for _, iface, _ in topo.links("rtr")]
    topo.in_ns("rtr", ["sysctl", "-qw", "net.ipv4.ip_forward=1",
                       *[f"net.ipv4.conf.{i}.send_redirects=0" for i in ["all", *ifaces]]],
               "router sysctls")
    for role in ("svc", "cp1", "cp2", "cp3"):
        topo.in_ns(role, ["sysctl", "-qw", "net.ipv4.conf.all.accept_redirects=0",
                          "net.ipv4.conf.prov0.accept_redirects=0"], f"{role} sysctls")
    rules = os.path.join(tmp, "rtr.nft")
    with open(rules, "w") as f:
        f.write(RULES.format(lb=LB, api=API_PORT, vmedia=VMEDIA_TLS_PORT, cp1=topo.ip("cp1"),
                             cp2=topo.ip("cp2"), cp3=topo.ip("cp3"),
                             pods=topo.segment_cidr(""), bmcs=topo.segment_cidr("bmc"),
                             vms=topo.segment_cidr("vm"), bmc_port=BMC_PORT, agent=AGENT_PORT))
    topo.in_ns("rtr", ["nft", "-f", rules], "the router's ruleset")
    gw = {seg: topo.addresses("rtr")[i] for i, seg in enumerate(["", "bmc", "vm"])}
    for role in ("svc", "cp1", "cp2", "cp3"):
        topo.route(role, "default", gw[""])
    topo.route("bmc", "default", gw["bmc"])
    topo.route("probe", "default", gw["vm"])
    leases = os.path.join(tmp, "vm-dhcp.leases")
    topo.start("rtr", "dhcp", [
        "dnsmasq", "--keep-in-foreground", "--no-daemon", "--conf-file=/dev/null", "--port=0",
        "--interface=vm0", "--bind-interfaces", "--no-resolv", "--no-hosts",
        f"--pid-file={tmp}/vm-dhcp.pid", f"--dhcp-leasefile={leases}", "--dhcp-authoritative",
        f"--dhcp-range={DHCP[0]},{DHCP[1]},255.255.255.128,1h",
        f"--dhcp-option=option:router,{gw['vm']}", "--log-dhcp", "--user=root"],
        os.path.join(tmp, "rtr-dhcp.log"))


def reaches(topo, role, ip, port, timeout=3):
    """Whether a TCP connection from a role's namespace to ip:port opens (no byte sent)."""
    p = subprocess.run(topo.wrap(role, ["timeout", str(timeout), "bash", "-c",
                                        f"exec 3<>/dev/tcp/{ip}/{port}"]),
                       capture_output=True)
    return p.returncode == 0


def isolation(run, topo):
    """From the hosts' network: the LoadBalancer's two ports open, nothing else does (a pod's
    API and JSON-RPC ports, MariaDB, the DNS, the BMC)."""
    want = {f"LB {LB}:{API_PORT}": (LB, API_PORT), f"LB {LB}:{VMEDIA_TLS_PORT}":
            (LB, VMEDIA_TLS_PORT)}
    shut = {f"pod {topo.ip('cp1')}:{API_PORT}": (topo.ip("cp1"), API_PORT),
            f"pod {topo.ip('cp2')}:6189": (topo.ip("cp2"), 6189),
            f"MariaDB {topo.ip('svc')}:3306": (topo.ip("svc"), 3306),
            f"BMC {topo.ip('bmc')}:{BMC_PORT}": (topo.ip("bmc"), BMC_PORT)}
    opened = [k for k, (ip, port) in want.items() if reaches(topo, "probe", ip, port)]
    leaked = [k for k, (ip, port) in shut.items() if reaches(topo, "probe", ip, port)]
    run.check("the hosts' network reaches the LoadBalancer only",
              len(opened) == len(want) and not leaked,
              f"from {topo.ip('probe')}: open {', '.join(opened) or 'none'}; closed "
              f"{', '.join(k for k in shut if k not in leaked)}"
              + (f"; LEAKED {', '.join(leaked)}" if leaked else ""))


def vmedia_probe(run, topo, kit, owner, tries=6):
    """A file only `owner`'s httpd has, under /redfish/, fetched by the BMC's namespace through
    the LoadBalancer over TLS (curl verifying the clients' CA for the LB address) `tries` times:
    every pod the LoadBalancer picks must find it on the owner."""
    name = f"e2e-probe-{topo.tag}.iso"
    path = os.path.join(kit.shared(owner), "html", "redfish", name)
    if not os.path.isdir(os.path.dirname(path)):
        # Ironic's user writes its ISOs there.
        os.makedirs(os.path.dirname(path))
        shutil.chown(os.path.dirname(path), 997, 994)
    with open(path, "w") as f:
        f.write(f"probe {topo.tag}\n")
    os.chmod(path, 0o644)
    codes = []
    for _ in range(tries):
        p = subprocess.run(topo.wrap("bmc", [
            "curl", "-sS", "--max-time", "20", "--cacert", kit.client_ca, "-o", "/dev/null",
            "-w", "%{http_code}", f"https://{LB}:{VMEDIA_TLS_PORT}/redfish/{name}"]),
            capture_output=True, text=True)
        codes.append(p.stdout.strip() or p.stderr.strip()[-80:])
    run.check("virtual media through the LoadBalancer found on the pod that has it",
              all(c == "200" for c in codes),
              f"GET https://{LB}:{VMEDIA_TLS_PORT}/redfish/{name} (on {owner} only) from the "
              f"BMC's network, TLS verified: {', '.join(codes)}")


def counters(topo):
    """{comment: packets} of the router's counted rules."""
    p = subprocess.run(topo.wrap("rtr", ["nft", "-j", "list", "table", "ip", "e2e"]),
                       capture_output=True, text=True)
    out = {}
    try:
        items = json.loads(p.stdout).get("nftables", [])
    except ValueError:
        return out
    for it in items:
        rule = it.get("rule")
        if not rule or "comment" not in rule:
            continue
        n = next((e["counter"]["packets"] for e in rule.get("expr", []) if "counter" in e), 0)
        out[rule["comment"]] = n
    return out


def print_counters(got):
    """`counters`' result, one line per rule."""
    if got:
        print("the router's packets per rule (new connections only, but for the drops):")
        for k, n in got.items():
            print(f"  {k:32} {n:8}")


def wait_lb(topo, timeout=60):
    """Until the LoadBalancer's API port opens from the pod network (the harness's side)."""
    wait_for("the LoadBalancer", lambda: reaches(topo, "svc", LB, API_PORT), timeout, 1)
