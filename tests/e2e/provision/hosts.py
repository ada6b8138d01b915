"""The hosts' lives, driven through the balancer the way baremetal-operator drives them:
enrol with a chosen owner, manage, inspect (agent), provide (automated cleaning), deploy a
whole-disk image with a config drive; and what the logs must show on the way (host A's PXE
chain through the sidecars' boot routes, host B's virtual media fetched by the BMC from its
owner's vmedia TLS listener)."""

import os
import shutil
import uuid as uuidlib

from ironic_proxy_testing.procs import Failure, wait_for

from . import bmc, image, report

CPS = ["cp1", "cp2", "cp3"]
STEP = 1800  # seconds a provisioning step may take: QEMU under TCG on 2 shared cores
DEPLOY = 1200  # seconds a deploy may take (a retry included: the ramdisk boots again)


def enrol(api, name, host, bmc_url, bmc_auth, boot, uuid, agent_tls=True):
    """As baremetal-operator registers a host (metal3-io/baremetal-operator at 02aa5059,
    pkg/provisioner/ironic/register.go enrollNode: nodes.CreateOpts with the BMC access's
    Driver, BootInterface, FirmwareInterface, RAIDInterface, the inspect interface `agent`
    (inspectInterfaceForMode), the deploy interface, properties capabilities and cpu_arch;
    driver_info from pkg/hardwareutils/bmc/redfish.go DriverInfo: redfish_address,
    redfish_system_id, redfish_username, redfish_password; deploy_kernel and deploy_ramdisk
    from pkg/provisioner/ironic/ironic.go setDeployImage when no deploy ISO is configured, so
    that for virtual media Ironic builds the ISO itself).

    boot: `ipxe` as for a `redfish://` BMC address (redfish.go BootInterface) or
    `redfish-virtual-media` as for `redfish-virtualmedia://` (redfish_virtualmedia.go
    BootInterface; Driver `redfish`, the same DriverInfo).

    agent_tls=False departs from baremetal-operator on purpose: driver_info kernel_append_params
    `%default% ipa-enable-auto-tls=0` (Ironic's per-node override of [pxe]/[redfish]
    kernel_append_params, ironic/drivers/utils.py get_kernel_append_params) makes the ramdisk
    turn off IPA's automatic TLS (scripts/lib/ipa-ramdisk/init), so Ironic's commands to that
    agent are plain HTTP and leave through the egress relay."""
    body = {"name": name, "uuid": uuid, "driver": "redfish", "boot_interface": boot,
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
    if not agent_tls:
        body["driver_info"]["kernel_append_params"] = "%default% ipa-enable-auto-tls=0"
    return api.call("POST", "/v1/nodes", json=body).json()["uuid"]


def conductor_host(conductor):
    """The address in a conductor's name, as Ironic registers it and the kit locks under it
    (`ADDRESS:6189`, `[ADDRESS]:6189` for IPv6), or as 0.1.0's conductors locked nodes (the
    bare address)."""
    if conductor.startswith("["):
        return conductor[1:].split("]", 1)[0]
    return conductor.rsplit(":", 1)[0] if conductor.count(":") == 1 else conductor


def enrol_owned(api, name, host, bmc_url, bmc_auth, boot, allowed, agent_tls=True):
    """Enrols a host with the first of a fixed series of node UUIDs whose owner on the hash
    ring (the node's `conductor`) is in `allowed`: a node enrolled elsewhere is deleted and
    enrolled again under the next UUID. Returns (uuid, conductor, tries)."""
    for i in range(16):
        u = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"e2e-provision/{name}/{i}"))
        enrol(api, name, host, bmc_url, bmc_auth, boot, u, agent_tls)
        conductor = api.get(f"/v1/nodes/{u}?fields=conductor")["conductor"]
        if conductor_host(conductor) in allowed:
            # The boot MAC's port, PXE-enabled whatever the boot interface
            # (register.go createPortsForNode: bootMACAddress -> true).
            api.call("POST", "/v1/ports", json={"node_uuid": u, "address": host.mac,
                                                "pxe_enabled": True})
            return u, conductor, i + 1
        api.call("DELETE", f"/v1/nodes/{u}")
    raise Failure(f"{name}: no UUID of 16 hashes to one of {sorted(allowed)}")


def provision(api, uuid, label, verb, want, body=None, timeout=STEP, stuck=None):
    """PUT /v1/nodes/<uuid>/states/provision {target: verb}, then waits for `want` (failing at
    once on a *failed state, or when stuck(node) names a reason)."""
    api.call("PUT", f"/v1/nodes/{uuid}/states/provision", json={"target": verb, **(body or {})})
    why = []

    def done():
        n = api.get(f"/v1/nodes/{uuid}?fields=provision_state,last_error,reservation",
                    timeout=10)
        state = n["provision_state"]
        if state == want or state.endswith("failed") or state == "error":
            return n
        if stuck and stuck(n):
            why.append(stuck(n))
            return n
        return None
    # wait_for retries on exceptions: a failed state is returned, then raised here.
    n = wait_for(f"{label} to reach {want}", done, timeout, interval=1)
    if why:
        raise Failure(f"{label}: {n['provision_state']}: {why[0]}")
    if n["provision_state"] != want:
        raise Failure(f"{label}: {n['provision_state']}: {n.get('last_error')}")


def vm_client(rec):
    """Whether an access record's client is a VM (the DHCP range, host part 100-199)."""
    return report.is_vm(rec.get("client", ""))


def pxe_chain(run, kit, owner, uuid, timeout):
    """The PXE chain of a host, from the logs: boot.ipxe and the per-node config through a
    sidecar's plain boot route (from the VM's DHCP address), then the deploy kernel from the
    owning conductor's httpd."""
    def seen():
        recs = [r for c in CPS for r in report.parse(kit.log(c, "ironic-proxy"))]
        boot = [r for r in recs if r.get("path") == "/boot.ipxe" and vm_client(r)
                and r.get("status") == "200"]
        conf = [r for r in recs if r.get("path", "").startswith("/pxelinux.cfg/")
                and r.get("status") == "200"]
        kernel = [ln for ln in open(kit.log(owner, "httpd"), errors="replace")
                  if f"/{uuid}/deploy_kernel" in ln and '"status": 200' in ln]
        return (boot, conf, kernel) if boot and conf and kernel else None
    got = wait_for("the PXE chain (boot.ipxe, the node's config, the deploy kernel)", seen,
                   timeout or 1, interval=2)
    run.check("host-a: PXE chain through the sidecars", True,
              f"boot.ipxe {len(got[0])}x, config {len(got[1])}x via the boot route; deploy "
              f"kernel from {owner}'s httpd {len(got[2])}x")


def vmedia_chain(run, kit, topo, owner, uuid):
    """Host B's virtual media, from the logs: the ISO its owner built (under /redfish/),
    fetched by sushy-tools (the BMC's address) from the owner's vmedia-tls listener, 200."""
    recs = [r for r in report.parse(kit.log(owner, "ironic-proxy"))
            if r.get("listener") == "vmedia-tls" and r.get("path", "").startswith("/redfish/")]
    ok = [r for r in recs if r.get("status") == "200" and topo.ip("bmc") in r.get("client", "")
          and uuid in r.get("path", "")]
    elsewhere = [c for c in CPS if c != owner and any(
        r.get("listener") == "vmedia-tls" for r in report.parse(kit.log(c, "ironic-proxy")))]
    run.check("host-b: virtual media from its owner's sidecar over TLS", bool(ok),
              f"{len(ok)} GET {ok[0]['path'] if ok else '-'} by the BMC "
              f"({topo.ip('bmc')}) on {owner}'s vmedia-tls listener"
              f"; statuses {sorted({r.get('status') for r in recs})}; on other nodes' "
              f"vmedia-tls: {elsewhere or 'none'}")


def vmedia_chain_lb(run, kit, topo, owner, uuid):
    """Host B's virtual media in the statefulset layout, from the logs: the ISO its owner built,
    fetched by sushy-tools (the BMC's address) through the LoadBalancer, on the vmedia-tls
    listener of whichever pod the LoadBalancer picked, whose sidecar found it on the owner's
    httpd (the access record's upstream: the owner's address, or 127.0.0.1 on the owner)."""
    got = [(c, r) for c in CPS for r in report.parse(kit.log(c, "ironic-proxy"))
           if r.get("listener") == "vmedia-tls" and r.get("path", "").startswith("/redfish/")
           and uuid in r.get("path", "")]
    ok = [(c, r) for c, r in got if r.get("status") == "200"
          and topo.ip("bmc") in r.get("client", "")]

    def on_owner(c, r):
        up = r.get("upstream", "")
        return up.startswith(f"{topo.ip(owner)}:") or (c == owner and up.startswith("127.0.0.1:"))
    run.check("host-b: virtual media through the LoadBalancer, found on its owner",
              bool(ok) and all(on_owner(c, r) for c, r in ok),
              f"{len(ok)} GET {ok[0][1]['path'] if ok else '-'} by the BMC ({topo.ip('bmc')}), "
              f"answered 200 by the sidecar of {', '.join(sorted({c for c, _ in ok})) or '-'} "
              f"from {', '.join(sorted({r.get('upstream', '-') for _, r in ok})) or '-'} "
              f"(owner {owner}, {topo.ip(owner)}); statuses "
              f"{sorted({r.get('status') for _, r in got})}")


def publish_image(kit, label, tmp):
    """The whole-disk image with its marker, on every node's httpd (/images/)."""
    marker = f"E2E-PROVISION-MARKER {label}"
    img = os.path.join(tmp, f"{label}.img")
    size, digest = image.make(img, marker)
    for role in CPS:
        dst = os.path.join(kit.shared(role), "html", "images", f"{label}.img")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(img, dst)
        os.chmod(dst, 0o644)
    return marker, img, size, digest


# How many times a deploy failed by a fault is retried, as baremetal-operator keeps retrying
# with a growing backoff; a fault takes a host over once.
RETRIES = 3


def heartbeats(ctx, uuid):
    """How many heartbeats of the node's agent Ironic's API accepted (202), as the sidecars'
    access logs show them. The API calls the conductor synchronously (the heartbeat RPC), and
    the conductor stores the agent's certificate before anything else, whatever the node's
    state (ironic/conductor/manager.py heartbeat, utils.store_agent_certificate), so an
    accepted heartbeat means the conductor that owns the node now has it."""
    path = f"/v1/heartbeat/{uuid}"
    return sum(1 for c in CPS
               for r in report.parse(ctx.kit.log(c, "ironic-proxy"))
               if r.get("path") == path and r.get("status") == "202")


def deploy(ctx, label, retry_if=None):
    """As baremetal-operator provisions (pkg/provisioner/ironic/ironic.go Provision and
    getInstanceUpdateOpts: instance_info image_source, image_os_hash_algo/value,
    image_disk_format; the config drive with the target `active`): a whole-disk image on every
    node's httpd, which IPA downloads from `ctx.image_base`: in the standalone layout a
    conductor node's boot route (/images/* on the sidecar's plain API port) on the node
    `ctx.image_role` (not host A's owner, which the kill fault takes down); in the statefulset
    layout the LoadBalancer's vmedia-TLS port (any pod's sidecar, its own httpd behind it).
    Then the disk's content and the deployed image's marker on the serial console.

    retry_if(): called when the deploy fails; if it says the failure is the fault's, the
    deploy is retried once through the proxies."""
    api, kit, run = ctx.api, ctx.kit, ctx.run
    uuid, host = ctx.uuids[label], ctx.hosts[label]
    marker, img, size, digest = publish_image(kit, label, ctx.tmp)
    url = f"{ctx.image_base}/{label}.img"
    api.call("PATCH", f"/v1/nodes/{uuid}", json=[
        {"op": "add", "path": "/instance_info/image_source", "value": url},
        {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
        {"op": "add", "path": "/instance_info/image_os_hash_value", "value": digest},
        {"op": "add", "path": "/instance_info/image_disk_format", "value": "raw"}])
    configdrive = {"meta_data": {"uuid": uuid, "name": label, "hostname": label},
                   "user_data": f"#cloud-config\nhostname: {label}\n"}
    body = {"configdrive": configdrive}
    stuck = ctx.stuck.get(label)
    retries = []
    while True:
        # Where this deploy's console begins: a boot from disk before a retried deploy would
        # print the same marker earlier (an iPXE boot's kernel prints nothing there to tell).
        since = len(host.console_text())
        try:
            provision(api, uuid, label, "active", "active", body=body, timeout=DEPLOY,
                      stuck=stuck if not retries else None)
            break
        except Failure as e:
            if stuck and "never releases" in str(e):
                raise
            why = retry_if() if retry_if else None
            if not why or len(retries) == RETRIES:
                raise
            # baremetal-operator records the failure and comes back after a backoff that
            # grows with each (internal/controller/metal3.io/action_result.go calculateBackoff:
            # 2^errors minutes less up to half of it), then deploys again. Here the wait is
            # the event that backoff waits out: the agent's next heartbeat, which reaches the
            # conductor that took the node over, and which stores the agent's certificate
            # there (ironic/conductor/utils.py store_agent_certificate: "assuming take over").
            # A deploy sent before it reaches the new conductor is refused by Ironic itself
            # ("Agent CA ... is neither a path nor a boolean": the dead conductor's path).
            seen = heartbeats(ctx, uuid)
            run.check(f"{label}: deploy failed by Ironic's rule after the fault", True,
                      f"{e}; {why}; waiting for the agent's next accepted heartbeat, then "
                      f"`active` again through the proxies (retry {len(retries) + 1})")
            wait_for(f"{label}'s agent to heartbeat again after the failure",
                     lambda: heartbeats(ctx, uuid) > seen, STEP, interval=2)
            retries.append(str(e))
    ctx.retries[label] = retries
    n = api.get(f"/v1/nodes/{uuid}?fields=conductor,driver_internal_info")
    agent = (n.get("driver_internal_info") or {}).get("agent_url", "-")
    run.check(f"deployed {label}: active", True, f"owner {n['conductor']}, image {url} "
              f"({size} B, sha256 {digest[:16]}), agent_url was {agent}")
    # Only what the console printed since the last deploy began counts.
    seconds = bmc.wait_console(host, marker, 600, part=lambda text: text[since:])
    run.check(f"{label} boots the deployed image from its disk", True,
              f"marker {marker!r} on the serial console after the last deploy began, "
              f"{seconds:.0f} s after active")
    ok, detail = image.disk_matches(host.disk, img)
    run.check(f"{label} disk holds the image", ok, detail)


def lifecycle(ctx, label, until):
    """manage (done at enrolment) -> inspect -> provide -> deploy, for one host."""
    api, run, kit = ctx.api, ctx.run, ctx.kit
    uuid = ctx.uuids[label]
    provision(api, uuid, label, "inspect", "manageable")
    if ctx.boot[label] == "ipxe":
        pxe_chain(run, kit, ctx.owners[label], uuid, 0)
    elif ctx.lb:
        vmedia_chain_lb(run, kit, kit.topo, ctx.owners[label], uuid)
    else:
        vmedia_chain(run, kit, kit.topo, ctx.owners[label], uuid)
    inv = api.get(f"/v1/nodes/{uuid}/inventory", expect=(200,))
    run.check(f"inspected {label}", True,
              f"{len(inv['inventory'].get('interfaces', []))} interfaces, "
              f"{len(inv['inventory'].get('disks', []))} disks, memory "
              f"{inv['inventory'].get('memory', {}).get('physical_mb')} MB")
    if until == "inspected":
        return
    provision(api, uuid, label, "provide", "available")
    run.check(f"cleaned {label} (provide: metadata erase)", True)
    if until == "available":
        return
    deploy(ctx, label, retry_if=ctx.retry_if.get(label))
