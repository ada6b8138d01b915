"""The statefulset variant's own stages and checks (issue 52; docs/e2e.md "Provisioning end to
end: the statefulset variant"): host B enrolled with any owner, and what must have gone through
the LoadBalancer and the egress (from the sidecars' access logs and the router's counters)."""

import os
import types

from . import hosts as hosts_mod
from . import podnet, report
from .kit import VMEDIA_TLS_PORT

CPS = ["cp1", "cp2", "cp3"]


def agent_traffic(run, tmp, topo, uuid):
    """The statefulset layout: IPA's lookups, heartbeats and its image download reach the
    sidecars through the LoadBalancer (a VM's address on their api and vmedia-tls listeners,
    which the router lets through to the LB only); Ironic's commands to the plain-HTTP agent
    leave through the owner's egress, relayed from the pod network to the agent's port 9999."""
    recs = [(r, rec) for r in CPS for rec in report.parse(
        os.path.join(tmp, f"{r}-ironic-proxy.log"))]
    vm = [(r, rec) for r, rec in recs if hosts_mod.vm_client(rec)]
    lookups = [x for x in vm if x[1].get("path", "").startswith("/v1/lookup")]
    beats = [x for x in vm if "/heartbeat" in x[1].get("path", "")]
    image = [x for x in vm if x[1].get("listener") == "vmedia-tls"
             and x[1].get("path", "").startswith("/images/")]
    pods = lambda xs: ", ".join(f"{r} {sum(1 for p, _ in xs if p == r)}" for r in CPS)
    run.check("IPA lookups and heartbeats through the LoadBalancer", lookups and beats,
              f"lookup {len(lookups)}x, heartbeat {len(beats)}x, landing on {pods(lookups + beats)}"
              f" (statuses {sorted({x[1]['status'] for x in lookups + beats})})")
    run.check("IPA's image download through the LoadBalancer over TLS",
              any(x[1].get("status") == "200" for x in image),
              f"{len(image)} GET {image[0][1]['path'] if image else '-'} on the vmedia-tls port "
              f"({pods(image)}; statuses {sorted({x[1]['status'] for x in image})})")
    report.check_agent_relay(run, tmp, CPS, uuid,
                             ", routed from the pod network to the hosts' network")
    got = podnet.counters(topo)
    run.check("the router: the hosts' and the BMC's networks through the LoadBalancer",
              got.get("vms to lb", 0) > 0 and got.get("bmcs to lb", 0) > 0,
              ", ".join(f"{k} {n}" for k, n in got.items()) or "no counters")


def jsonrpc_by_name(run, tmp):
    """The conductors' JSON-RPC calls to one another in the statefulset layout: each peer is
    known to Ironic by its pod's name only (`ironic-N.ironic.metal3.svc:6189`), so every call
    that left an egress was resolved by the pod's DNS and went out with mutual TLS."""
    recs = [rec for r in CPS for rec in report.parse(os.path.join(tmp, f"{r}-ironic-proxy.log"))
            if rec.get("listener") == "json-rpc-egress"
            and rec.get("rpc_method") not in (None, "-", "other")]
    ok = [rec for rec in recs if rec.get("status", "").startswith("2")]
    run.check("JSON-RPC between the pods by name through the egress", recs and len(ok) == len(recs),
              f"{len(recs)} calls, {len(ok)} answered 2xx, to "
              f"{', '.join(sorted({rec.get('upstream', '-') for rec in recs})) or '-'}; methods "
              f"{', '.join(sorted({rec.get('rpc_method') for rec in recs})) or '-'}")


def enrol(run, api, kit, topo, tmp, args, hosts, bmc_url, auth, timeline):
    """The statefulset layout: host B enrolled as baremetal-operator enrols a
    `redfish-virtualmedia://` host, its agent serving plain HTTP (as standalone's host B); any
    conductor may own it. Returns the run's context for hosts.lifecycle."""
    conductor_role = {kit.conductor(r): r for r in CPS}
    b, cond, tries = hosts_mod.enrol_owned(
        api, "host-b", hosts["host-b"], bmc_url, auth, "redfish-virtual-media",
        set(conductor_role), agent_tls=False)
    owner = conductor_role[hosts_mod.conductor_host(cond)]
    timeline.watch(b, "host-b")
    run.check("host-b enrolled through the LoadBalancer", True,
              f"{b} (redfish-virtual-media) -> {cond} ({owner}, pod {kit.pod_name(owner)}, "
              f"{topo.ip(owner)}; UUID try {tries})")
    return types.SimpleNamespace(
        api=api, kit=kit, topo=topo, run=run, tmp=tmp, proxy_bin=args.proxy_bin,
        uuids={"host-b": b}, hosts=hosts, owners={"host-b": owner},
        boot={"host-b": "redfish-virtual-media"}, retry_if={}, stuck={}, retries={},
        lb=podnet.LB,
        image_base=f"https://{podnet.LB}:{VMEDIA_TLS_PORT}/images")
