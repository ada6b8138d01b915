"""scripts/e2e-provision's scenario (issue 49; docs/e2e.md "Provisioning end to end").

    python3 -m provision.main --stack ipv4 --proxy-bin BIN --ironic-venv DIR --bmc-venv DIR
                              [--variant standalone|statefulset] [--ipa DIR] [--keep]

--variant statefulset (issue 52): config/k8s/statefulset's three pods on a pod network behind a
LoadBalancer (podnet.py, statefulset.py), host B only (virtual media), IPv4; one fault, a
sidecar restart (faults.SidecarRestart; none with --no-faults).

Stages, each a check line; the last line is `e2e-provision: N passed, N failed`.
"""

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import threading
import traceback
import types

from ironic_proxy_testing.procs import wait_for
from ironic_proxy_testing.topology import Topology

from . import bmc, podnet, quickstart, report, services, statefulset
from . import hosts as hosts_mod
from .api import Api, Timeline
from .faults import Faults, SidecarRestart
from .kit import API_PORT, Kit, wait_listening

ROLES = ["svc", "bmc", "cp1", "cp2", "cp3"]
CPS = ["cp1", "cp2", "cp3"]
MAC_A = "52:54:00:22:00:0a"
MAC_B = "52:54:00:22:00:0b"


class Run:
    def __init__(self, args):
        self.args = args
        self.passed = self.failed = 0
        self.t0 = time.monotonic()

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""),
              flush=True)
        return ok

    def stage(self, name):
        print(f"---- {time.monotonic() - self.t0:7.1f} s  {name}", flush=True)


def trust_from_boot(run, ctx):
    """Each boot path brings the agent the kit's CA: on host A's iPXE boots ironic-image's extra
    initrd, unpacked beside the ramdisk (its init lists /etc/ironic-python-agent.d); on host B's
    virtual media the files Ironic injects into the ISO, which IPA copies at its start. The
    run's ramdisk also carries its own CAs (site-ca.conf, for the rotation: scripts/e2e-provision),
    so this shows the delivery; tests/e2e/ipa_ramdisk_check.py shows a ramdisk without them."""
    want = {"host-a": "configuration: /etc/ironic-python-agent.d/ironic-tls.conf cafile = "
                      "/etc/ironic-python-agent/ironic.crt",
            "host-b": "/etc/ironic-python-agent.d to /etc/ironic-python-agent.d"}
    for label, line in want.items():
        host = ctx.hosts.get(label)
        if host is None:
            continue
        found = [l.strip() for l in host.console_text().splitlines() if line in l]
        run.check(f"{label}: the kit's boot brought the agent its CA", bool(found),
                  found[0][:200] if found else f"no {line!r} on the serial console")

def ipa_files(path):
    """(kernel, initramfs) of scripts/build-ipa-ramdisk's output directory, or None."""
    if not path:
        return None
    k = os.path.join(path, "ironic-python-agent.kernel")
    r = os.path.join(path, "ironic-python-agent.initramfs")
    return (k, r) if os.path.exists(k) and os.path.exists(r) else None


def placeholder_ipa(tmp):
    """Without a ramdisk: 8 KiB files so that Ironic validates and writes the boot files; iPXE
    downloads them and stops there (the PXE chain up to the kernel download)."""
    out = []
    for name in ("ironic-python-agent.kernel", "ironic-python-agent.initramfs"):
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(b"\0" * 8192)
        out.append(p)
    return tuple(out)


def proxy_logs(tmp):
    logs = [("balancer", os.path.join(tmp, "svc-balancer.log"))]
    return logs + [("sidecar", os.path.join(tmp, f"{r}-ironic-proxy.log")) for r in CPS]


def summary(run, tmp, harness=None):
    table = report.counts(proxy_logs(tmp), harness)
    if not table:
        return
    report.print_counts(table)
    bad = report.failed_by_proxy(table)
    run.check("0 requests failed by the proxies", bad == 0, f"{bad} with blame=proxy")


def agent_traffic(run, tmp, uuids):
    """IPA's lookups and heartbeats through the balancer's VIP. Ironic's commands to the agents
    take the path each agent's URL gives them:
    - host-a keeps IPA's automatic TLS (Metal3's default): its agent_url is https, and the kit
      sets HTTP_PROXY only, so they leave Ironic direct, TLS end to end (the egress's contract
      answers CONNECT with 405); counted from Ironic's debug log;
    - host-b's agent serves plain HTTP (enrolled with `ipa-enable-auto-tls=0`), so they leave
      through the conductor's egress, relayed to the agent's port 9999 (no no_proxy); counted
      from the sidecars' access logs, and every one must have been relayed."""
    bal = report.parse(os.path.join(tmp, "svc-balancer.log"))
    lookups = [r for r in bal if r.get("path", "").startswith("/v1/lookup")]
    beats = [r for r in bal if "/heartbeat" in r.get("path", "")]
    direct = report.agent_commands(tmp, CPS, uuids["host-a"])
    run.check("IPA lookups and heartbeats through the balancer's VIP", lookups and beats,
              f"lookup {len(lookups)}x, heartbeat {len(beats)}x "
              f"(statuses {sorted({r['status'] for r in lookups + beats})})")
    run.check("Ironic's commands to host-a's agent (automatic TLS): direct, TLS end to end",
              direct["commands"] + direct["polls"] > 0,
              f"{direct['commands']} commands and {direct['polls']} status polls in Ironic's "
              "logs (the agent URL is https, see `deployed host-a`)")
    report.check_agent_relay(run, tmp, CPS, uuids["host-b"])
    return direct


def write_result(args, run, timeline, tmp, harness, router, faults):
    """The run as data: when, what, the result line's figures, the timeline, the counts."""
    commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)),
                             "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "status",
                            "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip() != ""
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": os.environ.get("E2E_PROVISION_COMMAND", "scripts/e2e-provision"),
           "variant": args.variant, "until": args.until, "commit": commit, "tree_dirty": dirty,
           "passed": run.passed, "failed": run.failed,
           "seconds": round(time.monotonic() - run.t0),
           "timeline": timeline.events if timeline else {},
           "counts": report.counts(proxy_logs(tmp), harness), "router": router,
           "faults": faults.events if faults else []}
    with open(args.result_json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stack", default="ipv4", choices=["ipv4", "ipv6", "dual"])
    p.add_argument("--variant", default="standalone", choices=["standalone", "statefulset"])
    p.add_argument("--proxy-bin", required=True)
    p.add_argument("--ironic-venv", required=True)
    p.add_argument("--bmc-venv", required=True)
    p.add_argument("--ipa", default=os.environ.get("IPA_DIR"))
    p.add_argument("--ca-dir", required=True)
    p.add_argument("--ca-next-dir")
    p.add_argument("--dist", help="the release folder the README's quick start runs in "
                   "(standalone: the kit is what it applies)")
    p.add_argument("--until", default="active",
                   choices=["up", "enrolled", "pxe", "inspected", "available", "active"])
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--result-json", help="write the result, the timeline and the counts here "
                   "(scripts/gen-compatibility reads it)")
    args = p.parse_args()
    sts = args.variant == "statefulset"
    if sts and (args.stack != "ipv4" or args.until == "pxe"):
        p.error("--variant statefulset: IPv4 only, and no PXE (virtual media only)")
    if not sts and not args.dist:
        p.error("--dist: the standalone run starts what the README's quick start applies")
    run = Run(args)
    tmp = tempfile.mkdtemp(prefix="e2e-provision.")
    os.chmod(tmp, 0o755)
    if sts:
        topo = Topology(args.stack, roles=podnet.ROLES, segments=podnet.SEGMENTS)
    else:
        topo = Topology(args.stack, roles=ROLES)
    # The statefulset run keeps its own libvirtd: a standalone run beside it stops its own.
    libvirt = bmc.Libvirt(tmp, private=sts)
    hosts, api, timeline, faults = {}, None, None, None
    password = secrets.token_hex(12)
    try:
        run.stage(f"topology ({args.stack}, {args.variant}): bridges "
                  f"{', '.join(topo.bridges())}, namespaces "
                  f"{', '.join(topo.netns(r) for r in topo.roles)}")
        topo.up()
        if sts:  # the router, the LoadBalancer, the hosts' DHCP
            podnet.start(topo, tmp)
        for vip in [] if sts else topo.addresses("vip"):  # the balancer's address, in svc
            topo.add_address("svc", vip, record=False)
        # libvirtd first: its QEMU capability probe overlaps the control plane's start.
        libvirt.start()
        warm = subprocess.Popen(["virsh", "-c", bmc.URI, "domcapabilities",
                                 "--virttype", "qemu"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        ipa = ipa_files(args.ipa)
        run.check("deploy ramdisk", ipa is not None,
                  f"{args.ipa}" if ipa else "none built (scripts/build-ipa-ramdisk): "
                  "placeholders, the PXE chain stops at the kernel download")
        real_ipa = ipa is not None
        ipa = ipa or placeholder_ipa(tmp)
        objs = None
        if not sts:
            run.stage("the README's quick start for this topology (scripts/check-quickstart "
                      f"--dist {args.dist})")
            objs, said = quickstart.render(topo, tmp, args.dist, args.ca_dir, ipa, password)
            checks = [ln for ln in said.splitlines() if ln.endswith(" failed") and
                      " checks, " in ln]
            run.check("quick start: rendered and `kit check`ed for this topology",
                      bool(checks) and checks[-1].endswith(" 0 failed"),
                      f"{len(objs)} objects; kit check: {checks[-1] if checks else 'no line'}; "
                      f"facts: {' '.join(f'{k}={v}' for k, v in quickstart.settings(topo).items())}")
        kit = Kit(topo, tmp, args.proxy_bin, args.ironic_venv, password,
                  f"ironic:{secrets.token_hex(24)}", args.ca_dir, args.ca_next_dir,
                  **(dict(variant="statefulset", lb=podnet.LB, nodes=CPS,
                          dns=topo.ip("svc")) if sts else dict(objs=objs)))
        run.stage("shared services: MariaDB, DNS" + ("" if sts else ", the deploy ramdisk's URL"))
        if sts:
            db = services.db_reader(services.start_mariadb(topo, tmp, password))
        else:
            db = services.db_reader(services.start_mariadb(
                topo, tmp, admin=(quickstart.ADMIN, password)))
            quickstart.serve_ipa(topo, tmp, ipa)
        services.start_dns(topo, tmp, {r: kit.pod_name(r) for r in CPS} if sts else None)
        if not sts:
            run.stage("database Job (components/database) on cp1")
            run.check("database: Ironic's database and account made by the kit's Job",
                      True, kit.db_create("cp1"))
        run.stage("schema Job (rundatabase-upgrade) on cp1")
        kit.db_upgrade("cp1")
        run.stage("control-plane nodes: sidecar, Ironic, httpd from the rendered kit"
                  + (" (pods ironic-0, -1, -2 on the pod network)" if sts else ""))
        for role in CPS:
            kit.start_node(role, ipa)
        for role in CPS:
            wait_listening(topo, role, API_PORT, what=f"{role} sidecar API")
            wait_for(f"{role} Ironic socket", lambda r=role: os.path.exists(
                os.path.join(kit.shared(r), "ironic.sock")), 600, interval=1)
        if sts:
            podnet.wait_lb(topo)
            front = podnet.LB
        else:
            services.start_balancer(topo, tmp, kit, args.proxy_bin)
            services.start_dhcp(kit)
            front = topo.url_host("vip")
        api = Api(topo.netns("svc"), f"https://{front}:{API_PORT}", kit.api_auth(),
                  kit.client_ca)
        if not sts:
            bmo = kit.cms["ironic"]["data"]
            want = f"https://{front}:{API_PORT}/v1/"
            run.check("baremetal-operator's ConfigMap ironic names the API the run drives, "
                      "with the Secret ironic-credentials",
                      topo.stack != "ipv4" or bmo["IRONIC_ENDPOINT"] == want,
                      f"IRONIC_ENDPOINT {bmo['IRONIC_ENDPOINT']}" +
                      ("" if topo.stack == "ipv4" else " (the block's VIP is IPv4: not compared)"))
        via = "the LoadBalancer" if sts else "the balancer"

        def conductors():
            got = api.get("/v1/conductors?fields=hostname,alive", timeout=10)["conductors"]
            return sorted(c["hostname"] for c in got if c["alive"])
        alive = wait_for(f"three conductors alive through {via}",
                         lambda: len(conductors()) == 3 and conductors(), 300, interval=2)
        run.check(f"up: three conductors through {via} (TLS, Basic auth)", True,
                  ", ".join(alive))
        if not sts:
            # The quick start's last command: kubectl exec ... -c ironic-proxy -- doctor.
            code, said = kit.exec("cp1", "ironic-proxy", ["/usr/local/bin/ironic-proxy",
                                                          "doctor"])
            last = said.strip().splitlines()[-1] if said.strip() else "no output"
            run.check("doctor in cp1's sidecar (the quick start's last command)",
                      code == 0 and last.endswith(" 0 failed"), f"exit {code}: {last}"
                      + ("" if code == 0 else f"; {said.strip()[-800:]}"))
        if sts:
            podnet.isolation(run, topo)
            podnet.vmedia_probe(run, topo, kit, "cp2")
        if args.until == "up":
            return
        run.stage("BMC: sushy-tools on libvirt; " + ("host B (virtual media) on the hosts' "
                  "network" if sts else "hosts A (PXE) and B (virtual media)"))
        warm.wait(timeout=600)
        libvirt.storage_pool()
        users = os.path.join(tmp, "bmc-htpasswd")
        bmc_pw = secrets.token_hex(8)
        os.system(f"htpasswd -nbB admin {bmc_pw} > {users}")
        bmc.start_sushy(topo, tmp, args.bmc_venv, users, kit.client_ca)
        if not sts:
            hosts["host-a"] = bmc.Host(tmp, topo.tag, "host-a", MAC_A, topo.bridge, pxe=True)
        hosts["host-b"] = bmc.Host(tmp, topo.tag, "host-b", MAC_B,
                                   topo.segment_bridge("vm") if sts else topo.bridge, pxe=False)
        timeline = Timeline(api)
        bmc_url = f"http://{topo.url_host('bmc')}:{bmc.REDFISH_PORT}"
        auth = ("admin", bmc_pw)
        if sts:
            ctx = statefulset.enrol(run, api, kit, topo, tmp, args, hosts, bmc_url, auth, timeline)
            hosts_mod.provision(api, ctx.uuids["host-b"], "host-b", "manage", "manageable",
                                timeout=300)
            run.check("enrolled and managed: host-b (redfish-virtual-media, sushy-tools + "
                      "libvirt)", True)
            statefulset.jsonrpc_by_name(run, tmp)
            if args.until == "enrolled" or not real_ipa:
                return
            run.stage("inspect, provide, deploy: host-b through the LoadBalancer")
            spare = next(r for r in CPS if r != ctx.owners["host-b"])
            if not args.no_faults and args.until in ("available", "active"):
                faults = SidecarRestart(ctx, spare, timeline.t0)
                faults.start()
            hosts_mod.lifecycle(ctx, "host-b", args.until)
            if faults:
                faults.close()
                run.check(f"fault: the sidecar of {kit.pod_name(spare)} ({spare}) restarted "
                          "while host-b's agent heartbeated",
                          faults.restarted and not faults.errors,
                          "; ".join(f"{t} s {text}" for t, text in faults.events + [
                              (0, e) for e in faults.errors]) or "never in clean wait")
            if args.until in ("available", "active"):
                statefulset.agent_traffic(run, tmp, topo, ctx.uuids["host-b"])
            return
        ip_role = {topo.ip(r): r for r in CPS}
        # A's owner is not cp1: cp1's sidecar is the boot.ipxe URL the DHCP server hands out,
        # and the kill fault takes A's owner down. B's owner is another node.
        a, cond_a, tries_a = hosts_mod.enrol_owned(
            api, "host-a", hosts["host-a"], bmc_url, auth, "ipxe",
            {topo.ip("cp2"), topo.ip("cp3")})
        # B's agent serves plain HTTP, so that Ironic's commands to it take the egress relay;
        # A's keeps IPA's automatic TLS, Metal3's default (agent_traffic).
        b, cond_b, tries_b = hosts_mod.enrol_owned(
            api, "host-b", hosts["host-b"], bmc_url, auth, "redfish-virtual-media",
            set(ip_role) - {hosts_mod.conductor_host(cond_a)}, agent_tls=False)
        owners = {"host-a": ip_role[hosts_mod.conductor_host(cond_a)],
                  "host-b": ip_role[hosts_mod.conductor_host(cond_b)]}
        spare = next(r for r in CPS if r not in owners.values())
        ctx = types.SimpleNamespace(
            api=api, kit=kit, topo=topo, run=run, tmp=tmp, proxy_bin=args.proxy_bin,
            uuids={"host-a": a, "host-b": b}, hosts=hosts, owners=owners,
            boot={"host-a": "ipxe", "host-b": "redfish-virtual-media"},
            image_role=owners["host-b"], spare=spare, retry_if={}, stuck={}, retries={}, lb=None, db=db,
            image_base=f"http://{topo.url_host(owners['host-b'])}:{API_PORT}/images")
        for label, u in ctx.uuids.items():
            timeline.watch(u, label)
        run.check("A and B owned by different conductors", owners["host-a"] != owners["host-b"],
                  f"host-a {a} (ipxe) -> {cond_a} ({owners['host-a']}, UUID try {tries_a}); "
                  f"host-b {b} (redfish-virtual-media) -> {cond_b} ({owners['host-b']}, "
                  f"UUID try {tries_b}); {spare} owns neither")
        for label, u in ctx.uuids.items():
            hosts_mod.provision(api, u, label, "manage", "manageable", timeout=300)
        run.check("enrolled and managed: host-a, host-b (redfish, sushy-tools + libvirt)", True)
        if args.until == "enrolled":
            return
        if not real_ipa:
            api.call("PUT", f"/v1/nodes/{a}/states/provision", json={"target": "inspect"})
            hosts_mod.pxe_chain(run, kit, owners["host-a"], a, 900)
            return
        if not args.no_faults and args.until == "active" and args.ca_next_dir:
            faults = Faults(run, ctx, t0=timeline.t0)
            ctx.retry_if["host-a"] = lambda: faults.killed_at and (
                f"{owners['host-a']} killed with host-a in {faults.killed_at[0]} (step "
                f"{faults.killed_at[1]}): ironic/conductor/manager.py _check_orphan_nodes "
                "fails a node in deploying reserved by an offline conductor "
                "(utils.abort_on_conductor_take_over)")
            ctx.stuck["host-a"] = faults.stuck
            faults.start()
        run.stage("inspect, provide, deploy: host-a and host-b side by side")
        errors = {}

        def life(label):
            try:
                hosts_mod.lifecycle(ctx, label, args.until)
            except Exception as e:  # noqa: BLE001 - reported below
                errors[label] = e
                traceback.print_exc()
        threads = [threading.Thread(target=life, args=(label,), daemon=True)
                   for label in ctx.uuids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for label, e in errors.items():
            run.check(f"{label} reached {args.until}", False, f"{type(e).__name__}: {e}")
        trust_from_boot(run, ctx)
        if faults:
            faults.close()
            if not errors and faults.rotation_step == 2:
                faults.rotate_drop_old()
            end = api.get(f"/v1/nodes/{a}?fields=provision_state,conductor")
            run.check("fault: host-a's owner killed while it held host-a's lock; the lock "
                      "released, host-a carried by another conductor",
                      faults.killed_at is not None and faults.released_after is not None
                      and hosts_mod.conductor_host(end["conductor"] or "")
                      not in topo.addresses(owners["host-a"]),
                      f"{owners['host-a']} killed in {faults.killed_at}; lock released after "
                      f"{faults.released_after} s; host-a now {end['provision_state']} on "
                      f"{end['conductor']} (was {cond_a}); deploy retries as "
                      f"baremetal-operator retries: {len(ctx.retries.get('host-a', []))}")
            run.check("fault: a sidecar and the balancer restarted during an agent's first "
                      "lookup", faults.restarted,
                      f"sidecar of {spare}, then the balancer by handover (limits.handover)")
            run.check("fault: CA rotated during the run", faults.rotation_step == 3,
                      f"step {faults.rotation_step} of 3")
            for err in faults.errors:
                run.check("fault", False, err)
        if args.until in ("available", "active"):
            agent_traffic(run, tmp, ctx.uuids)
    except BaseException as e:  # noqa: BLE001 - reported (an interrupt too), then cleaned up
        run.check("run", False, f"{type(e).__name__}: {e}")
        traceback.print_exc()
        for name in sorted(os.listdir(tmp)):
            if name.endswith(".log"):
                path = os.path.join(tmp, name)
                lines = open(path, errors="replace").read().splitlines()[-8:]
                print(f"==== {name} (last lines)\n" + "\n".join(lines))
        for h in hosts.values():
            print(f"==== {h.name} console (last lines)\n" +
                  "\n".join(h.console_text().splitlines()[-20:]))
    finally:
        if faults:
            faults.close()
        if timeline:
            timeline.close()
            timeline.print()
        if faults and faults.events:
            print("faults:")
            for t, text in faults.events:
                print(f"  {t:7.1f} s  {text}")
        router = podnet.counters(topo) if sts and topo.built else {}
        podnet.print_counters(router)
        try:
            summary(run, tmp, topo.ip("rtr") if sts else None)
            report.print_failures(report.log_failures(
                tmp, CPS, {label: h.console for label, h in hosts.items()}))
        except Exception as e:  # noqa: BLE001 - the summary must not hide the cleanup
            run.check("summary", False, repr(e))
        if api:
            api.close()
        for h in hosts.values():
            h.destroy()
        topo.down()
        libvirt.stop()
        if args.result_json:
            try:
                write_result(args, run, timeline, tmp, topo.ip("rtr") if sts else None, router,
                             faults)
            except Exception as e:  # noqa: BLE001 - reported, the run's result stands
                print(f"e2e-provision: cannot write {args.result_json}: {e!r}")
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"e2e-provision: {run.passed} passed, {run.failed} failed "
              f"({time.monotonic() - run.t0:.0f} s)")
        # Here, not after the try: the stages end early (`--until`) by returning from it, and
        # a failed check must still fail the run.
        sys.exit(1 if run.failed else 0)


if __name__ == "__main__":
    main()
