"""scripts/e2e-provision's scenario (issue 49; docs/e2e.md "Provisioning end to end").

    python3 -m provision.main --stack ipv4 --proxy-bin BIN --ironic-venv DIR --bmc-venv DIR
                              [--ipa DIR] [--keep]

Stages, each a check line; the last line is `e2e-provision: N passed, N failed`.
"""

import argparse
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

from ironic_proxy_testing.procs import Failure, wait_for
from ironic_proxy_testing.topology import Topology

from . import bmc, image, report, services
from .api import Api, Timeline
from .kit import API_PORT, Kit, wait_listening

ROLES = ["svc", "bmc", "cp1", "cp2", "cp3"]
CPS = ["cp1", "cp2", "cp3"]
MAC_A = "52:54:00:22:00:0a"
STEP = 1800  # seconds a provisioning step may take: QEMU under TCG on 2 cores shared with other work


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


def ipa_files(path):
    """(kernel, initramfs) of scripts/build-ipa-ramdisk's output directory, or None."""
    if not path:
        return None
    k, r = os.path.join(path, "ipa.kernel"), os.path.join(path, "ipa.initramfs")
    return (k, r) if os.path.exists(k) and os.path.exists(r) else None


def placeholder_ipa(tmp):
    """Without a ramdisk: 8 KiB files so that Ironic validates and writes the boot files; iPXE
    downloads them and stops there (the PXE chain up to the kernel download)."""
    out = []
    for name in ("ipa.kernel", "ipa.initramfs"):
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(b"\0" * 8192)
        out.append(p)
    return tuple(out)


def enrol(api, name, host, bmc_url, bmc_auth, kit, owner_ip=None):
    """As baremetal-operator registers a host (pkg/provisioner/ironic/ironic.go Register:
    driver, driver_info with the BMC's address and credentials and the deploy kernel and
    ramdisk, boot interface, properties; then a port with the boot MAC)."""
    body = {"name": name, "driver": "redfish", "boot_interface": "ipxe",
            "inspect_interface": "agent", "deploy_interface": "direct",
            "firmware_interface": "redfish", "raid_interface": "redfish",
            "driver_info": {"redfish_address": bmc_url,
                            "redfish_system_id": f"/redfish/v1/Systems/{host.uuid}",
                            "redfish_username": bmc_auth[0],
                            "redfish_password": bmc_auth[1],
                            "deploy_kernel": "file:///shared/html/images/"
                                             "ironic-python-agent.kernel",
                            "deploy_ramdisk": "file:///shared/html/images/"
                                              "ironic-python-agent.initramfs"},
            "properties": {"capabilities": "boot_mode:bios", "cpu_arch": "x86_64"}}
    node = api.call("POST", "/v1/nodes", json=body).json()
    api.call("POST", "/v1/ports", json={"node_uuid": node["uuid"], "address": host.mac,
                                        "pxe_enabled": True})
    return node["uuid"]


def provision(api, timeline, uuid, label, verb, want, body=None, timeout=STEP):
    """PUT /v1/nodes/<uuid>/states/provision {target: verb}, then waits for `want` (failing at
    once on a *failed state)."""
    api.call("PUT", f"/v1/nodes/{uuid}/states/provision", json={"target": verb, **(body or {})})

    def done():
        n = api.get(f"/v1/nodes/{uuid}?fields=provision_state,last_error", timeout=10)
        state = n["provision_state"]
        if state == want or state.endswith("failed") or state == "error":
            return n
        return None
    # wait_for retries on exceptions: a failed state is returned, then raised here.
    n = wait_for(f"{label} to reach {want}", done, timeout, interval=1)
    if n["provision_state"] != want:
        raise Failure(f"{label}: {n['provision_state']}: {n.get('last_error')}")


def access(path):
    """The JSON access lines of a proxy log (the sidecar's, the balancer's)."""
    out = []
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return out
    for line in text.splitlines():
        if '"access"' in line or " access: " in line:
            out.append(line)
    return out


# A VM's address from the DHCP range (the nodes are .11-.13), as the sidecar logs a client.
VM_CLIENT = re.compile(r"client=\[(::ffff:)?172\.22\.0\.1\d\d\]|client=\[fd2e:22::1\d\d\]")


def pxe_chain(run, kit, owner, uuid, timeout):
    """The PXE chain of a host, from the logs: boot.ipxe and the per-node config through a
    sidecar's plain boot route (from the VM's DHCP address), then the deploy kernel from the
    owning conductor's httpd."""
    def seen():
        boot = [l for r in CPS for l in access(kit.log(r, "ironic-proxy"))
                if "boot.ipxe" in l and VM_CLIENT.search(l) and "status=200" in l]
        conf = [l for r in CPS for l in access(kit.log(r, "ironic-proxy"))
                if "pxelinux.cfg/" in l and "status=200" in l]
        kernel = [l for l in open(kit.log(owner, "httpd"), errors="replace")
                  if f"/{uuid}/deploy_kernel" in l and '"status": 200' in l]
        return (boot, conf, kernel) if boot and conf and kernel else None
    got = wait_for("the PXE chain (boot.ipxe, the node's config, the deploy kernel)", seen,
                   timeout or 1, interval=2)
    run.check("PXE chain through the sidecars", True,
              f"boot.ipxe {len(got[0])}x, config {len(got[1])}x via the boot route; deploy "
              f"kernel from {owner}'s httpd {len(got[2])}x")


def proxy_logs(tmp):
    logs = [("balancer", os.path.join(tmp, "svc-balancer.log"))]
    return logs + [("sidecar", os.path.join(tmp, f"{r}-ironic-proxy.log")) for r in CPS]


def summary(run, tmp):
    table = report.counts(proxy_logs(tmp))
    if not table:
        return
    report.print_counts(table)
    bad = report.failed_by_proxy(table)
    run.check("0 requests failed by the proxies", bad == 0, f"{bad} with blame=proxy")


def agent_traffic(run, tmp):
    """IPA's lookups and heartbeats through the balancer's VIP; Ironic's commands to IPA
    through the egress relay."""
    bal = report.parse(os.path.join(tmp, "svc-balancer.log"))
    lookups = [r for r in bal if r.get("path", "").startswith("/v1/lookup")]
    beats = [r for r in bal if "/heartbeat" in r.get("path", "")]
    relay = [r for _, p in proxy_logs(tmp)[1:] for r in report.parse(p)
             if r.get("listener") == "json-rpc-egress" and r.get("upstream", "").endswith(":9999")]
    run.check("IPA lookups and heartbeats through the balancer's VIP", lookups and beats,
              f"lookup {len(lookups)}x, heartbeat {len(beats)}x "
              f"(statuses {sorted({r['status'] for r in lookups + beats})})")
    run.check("Ironic's commands to IPA through the egress relay", bool(relay),
              f"{len(relay)} requests to :9999 "
              f"(statuses {sorted({r['status'] for r in relay})})")


def deploy(run, api, timeline, kit, uuid, host, label, tmp):
    """As baremetal-operator provisions (pkg/provisioner/ironic/ironic.go Provision and
    getInstanceUpdateOpts: instance_info image_source, image_os_hash_algo/value,
    image_disk_format; the config drive with the target `active`): a whole-disk image that IPA
    downloads from the owning conductor's boot server. Then the disk's content and the
    deployed image's marker on the serial console."""
    marker = f"E2E-PROVISION-MARKER {label}"
    img = os.path.join(tmp, f"{label}.img")
    size, digest = image.make(img, marker)
    for role in CPS:
        dst = os.path.join(kit.shared(role), "html", "images", f"{label}.img")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(img, dst)
        os.chmod(dst, 0o644)
    # The conductor field is Ironic's [DEFAULT]host with the JSON-RPC port ("ip:6189").
    owner_ip = api.get(f"/v1/nodes/{uuid}?fields=conductor")["conductor"].rsplit(":", 1)[0]
    url = f"http://{kit.topo.url_host(owner_ip)}:6180/images/{label}.img"
    api.call("PATCH", f"/v1/nodes/{uuid}", json=[
        {"op": "add", "path": "/instance_info/image_source", "value": url},
        {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
        {"op": "add", "path": "/instance_info/image_os_hash_value", "value": digest},
        {"op": "add", "path": "/instance_info/image_disk_format", "value": "raw"}])
    configdrive = {"meta_data": {"uuid": uuid, "name": label, "hostname": label},
                   "user_data": f"#cloud-config\nhostname: {label}\n"}
    provision(api, timeline, uuid, label, "active", "active", body={"configdrive": configdrive})
    run.check(f"deployed {label}: active", True, f"image {url} ({size} B, sha256 "
              f"{digest[:16]})")
    seconds = bmc.wait_console(host, marker, 600)
    run.check(f"{label} boots the deployed image from its disk", True,
              f"marker on the serial console {seconds:.0f} s after active")
    ok, detail = image.disk_matches(host.disk, img)
    run.check(f"{label} disk holds the image", ok, detail)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stack", default="ipv4", choices=["ipv4", "ipv6", "dual"])
    p.add_argument("--variant", default="standalone", choices=["standalone"])
    p.add_argument("--proxy-bin", required=True)
    p.add_argument("--ironic-venv", required=True)
    p.add_argument("--bmc-venv", required=True)
    p.add_argument("--ipa", default=os.environ.get("IPA_DIR"))
    p.add_argument("--ca-dir", required=True)
    p.add_argument("--until", default="active",
                   choices=["up", "enrolled", "pxe", "inspected", "available", "active"])
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    run = Run(args)
    tmp = tempfile.mkdtemp(prefix="e2e-provision.")
    os.chmod(tmp, 0o755)
    topo = Topology(args.stack, roles=ROLES)
    libvirt = bmc.Libvirt(tmp)
    hosts, api, timeline = [], None, None
    password = secrets.token_hex(12)
    try:
        run.stage(f"topology ({args.stack}): bridge {topo.bridge}, namespaces "
                  f"{', '.join(topo.netns(r) for r in ROLES)}")
        topo.up()
        for vip in topo.addresses("vip"):  # the balancer's address, in svc
            topo.add_address("svc", vip, record=False)
        # libvirtd first: its QEMU capability probe overlaps the control plane's start.
        libvirt.start()
        warm = subprocess.Popen(["virsh", "-c", "qemu:///system", "domcapabilities",
                                 "--virttype", "qemu"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        ipa = ipa_files(args.ipa)
        run.check("deploy ramdisk", ipa is not None,
                  f"{args.ipa}" if ipa else "none built (scripts/build-ipa-ramdisk): "
                  "placeholders, the PXE chain stops at the kernel download")
        real_ipa = ipa is not None
        ipa = ipa or placeholder_ipa(tmp)
        kit = Kit(topo, tmp, args.proxy_bin, args.ironic_venv, password,
                  f"ironic:{secrets.token_hex(24)}", args.ca_dir)
        run.stage("shared services: MariaDB, DNS")
        services.start_mariadb(topo, tmp, password)
        services.start_dns(topo, tmp)
        run.stage("schema Job (rundatabase-upgrade) on cp1")
        kit.db_upgrade("cp1")
        run.stage("control-plane nodes: sidecar, Ironic, httpd from the rendered kit")
        for role in CPS:
            kit.start_node(role, ipa)
        for role in CPS:
            wait_listening(topo, role, API_PORT, what=f"{role} sidecar API")
            wait_for(f"{role} Ironic socket", lambda r=role: os.path.exists(
                os.path.join(kit.shared(r), "ironic.sock")), 600, interval=1)
        services.start_balancer(topo, tmp, kit, args.proxy_bin)
        services.start_dhcp(kit)
        api = Api(topo.netns("svc"), f"https://{topo.url_host('vip')}:{API_PORT}",
                  ("admin", password), os.path.join(kit.ca, "ca.crt"))

        def conductors():
            got = api.get("/v1/conductors?fields=hostname,alive", timeout=10)["conductors"]
            return sorted(c["hostname"] for c in got if c["alive"])
        alive = wait_for("three conductors alive through the balancer",
                         lambda: len(conductors()) == 3 and conductors(), 300, interval=2)
        run.check("up: three conductors through the balancer (TLS, Basic auth)", True,
                  ", ".join(alive))
        if args.until == "up":
            return
        run.stage("BMC: sushy-tools on libvirt")
        warm.wait(timeout=600)
        users = os.path.join(tmp, "bmc-htpasswd")
        bmc_pw = secrets.token_hex(8)
        os.system(f"htpasswd -nbB admin {bmc_pw} > {users}")
        bmc.start_sushy(topo, tmp, args.bmc_venv, users, os.path.join(kit.ca, "ca.crt"))
        host_a = bmc.Host(tmp, topo.tag, "host-a", MAC_A, topo.bridge, pxe=True)
        hosts.append(host_a)
        timeline = Timeline(api)
        bmc_url = f"http://{topo.url_host('bmc')}:{bmc.REDFISH_PORT}"
        a = enrol(api, "host-a", host_a, bmc_url, ("admin", bmc_pw), kit)
        timeline.watch(a, "host-a")
        provision(api, timeline, a, "host-a", "manage", "manageable", timeout=300)
        owner = api.get(f"/v1/nodes/{a}?fields=conductor")["conductor"]
        run.check("enrolled and managed: host-a (redfish, sushy-tools + libvirt)", True,
                  f"owner {owner}")
        if args.until == "enrolled":
            return
        run.stage("inspect host-a (agent): PXE boot through the sidecars' boot routes")
        owner_role = next(r for r in CPS if topo.ip(r) == owner.split(":")[0])
        if not real_ipa:
            api.call("PUT", f"/v1/nodes/{a}/states/provision", json={"target": "inspect"})
            pxe_chain(run, kit, owner_role, a, 900)
            return
        provision(api, timeline, a, "host-a", "inspect", "manageable")
        pxe_chain(run, kit, owner_role, a, 0)
        inv = api.get(f"/v1/nodes/{a}/inventory", expect=(200,))
        run.check("inspected host-a", True,
                  f"{len(inv['inventory'].get('interfaces', []))} interfaces, "
                  f"{len(inv['inventory'].get('disks', []))} disks, memory "
                  f"{inv['inventory'].get('memory', {}).get('physical_mb')} MB")
        if args.until == "inspected":
            return
        provision(api, timeline, a, "host-a", "provide", "available")
        run.check("cleaned host-a (provide: metadata erase)", True)
        agent_traffic(run, tmp)
        if args.until == "available":
            return
        deploy(run, api, timeline, kit, a, host_a, "host-a", tmp)
    except Exception as e:  # noqa: BLE001 - reported, then cleaned up
        run.check("run", False, f"{type(e).__name__}: {e}")
        traceback.print_exc()
        for name in sorted(os.listdir(tmp)):
            if name.endswith(".log"):
                path = os.path.join(tmp, name)
                lines = open(path, errors="replace").read().splitlines()[-8:]
                print(f"==== {name} (last lines)\n" + "\n".join(lines))
        for h in hosts:
            print(f"==== {h.name} console (last lines)\n" +
                  "\n".join(h.console_text().splitlines()[-20:]))
    finally:
        if timeline:
            timeline.close()
            timeline.print()
        try:
            summary(run, tmp)
        except Exception as e:  # noqa: BLE001 - the summary must not hide the cleanup
            run.check("summary", False, repr(e))
        if api:
            api.close()
        for h in hosts:
            h.destroy()
        topo.down()
        libvirt.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"e2e-provision: {run.passed} passed, {run.failed} failed "
              f"({time.monotonic() - run.t0:.0f} s)")
    sys.exit(1 if run.failed else 0)


if __name__ == "__main__":
    main()
