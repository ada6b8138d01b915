"""The README's quick start rendered for a topology: what the standalone run starts.

scripts/check-quickstart runs the README's block against a release folder (`--dist`) with:
- the site's facts of this topology in place of the example's (`--set`, the block's first
  command): the networks the run's CA permits, the three nodes, the balancer's VIP, the
  provisioning interface, the DHCP range, MariaDB on `svc` and its administrator, and the
  deploy ramdisk's URL on `svc` with its sums;
- the operator's files (`--file`): the MariaDB administrator's password, the ramdisk's sums;
- the run's CA in place of `ironic-proxy ca init`'s (`--ca-dir`): the deploy ramdisk trusts it,
  and is cached by a hash that includes it;
- `--no-entrypoints`: this run starts the containers itself, with the real programs.

The block's own `ironic-proxy kit check` then checks these facts, and its applied.yaml (every
object, Secrets included) is what kit.Kit starts: the DaemonSet with the deploy-ramdisk init
container, the database Jobs, the DHCP Deployment and the ConfigMap baremetal-operator reads.
"""

import hashlib
import os
import subprocess
import sys

import yaml

from ironic_proxy_testing.procs import Failure
from ironic_proxy_testing.topology import SUBNETS

from .kit import ROOT

ADMIN = "dbadmin"
IPA_PORT = 8081


def settings(topo):
    """The quick start's first command for this topology. IPv4 first: the block's DHCP range and
    provisioning network are IPv4 (NET4); the IPv6 and dual runs set theirs in kit.Kit._site."""
    v4 = [ip for ip in topo.addresses("vip") if ":" not in ip]
    vip = (v4 or topo.addresses("vip"))[0]
    first, last, prefix = next((r for r in _v4_ranges(topo)), ("172.22.0.100", "172.22.0.199",
                                                               24))
    return {"NS": "metal3", "REGISTRY": "registry.e2e-provision.invalid",
            "NET4": SUBNETS["ipv4"][0], "NET6": SUBNETS["ipv6"][0],
            "NODES": ",".join(topo.addresses(r)[0] for r in ("cp1", "cp2", "cp3")),
            "VIP": vip, "IFACE": "prov0",
            "DHCP": f"{first},{last},{'255.255.255.0' if prefix == 24 else prefix}",
            "DB_HOST": topo.url_host("svc"), "DB_ADMIN": ADMIN,
            "IPA": f"http://{topo.url_host('svc')}:{IPA_PORT}"}


def _v4_ranges(topo):
    return [r for r in topo.dhcp_ranges() if ":" not in r[0]]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def render(topo, tmp, dist, ca_dir, ipa, admin_password):
    """Runs the quick start for this topology; returns (the applied objects, its output)."""
    files = {}
    for name, body in (("mariadb-admin.password", admin_password + "\n"),
                       # As scripts/build-ipa-ramdisk writes them: `sha256sum FILE`'s line.
                       ("ironic-python-agent.kernel.sha256",
                        f"{sha256(ipa[0])}  ironic-python-agent.kernel\n"),
                       ("ironic-python-agent.initramfs.sha256",
                        f"{sha256(ipa[1])}  ironic-python-agent.initramfs\n")):
        files[name] = os.path.join(tmp, "operator-" + name)
        with open(files[name], "w") as f:
            f.write(body)
    out = os.path.join(tmp, "quickstart")
    argv = [sys.executable, os.path.join(ROOT, "scripts", "check-quickstart"), "--dist", dist,
            "--no-entrypoints", "--ca-dir", ca_dir, "--out", out]
    for k, v in settings(topo).items():
        argv += ["--set", f"{k}={v}"]
    for k, v in files.items():
        argv += ["--file", f"{k}={v}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    with open(os.path.join(tmp, "quickstart.log"), "w") as f:
        f.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise Failure(f"the quick start for this topology failed (exit {done.returncode}): "
                      f"{(done.stdout + done.stderr).strip()[-1500:]}")
    with open(os.path.join(out, "applied.yaml")) as f:
        objs = [d for d in yaml.safe_load_all(f) if d]
    return objs, done.stdout


def serve_ipa(topo, tmp, ipa):
    """The deploy ramdisk at the quick start's IPA URL: a static HTTP server on svc serving
    ironic-python-agent.kernel and .initramfs (the names the block appends to $IPA)."""
    root = os.path.join(tmp, "ipa-images")
    os.makedirs(root, exist_ok=True)
    for src, name in ((ipa[0], "ironic-python-agent.kernel"),
                      (ipa[1], "ironic-python-agent.initramfs")):
        dst = os.path.join(root, name)
        if not os.path.lexists(dst):
            os.symlink(os.path.abspath(src), dst)
    static = os.path.join(ROOT, "tests", "e2e", "static_httpd.py")
    return topo.start("svc", "ipa-images", ["/usr/bin/python3", static, str(IPA_PORT),
                                             "--bind", "::", "--directory", root],
                      os.path.join(tmp, "svc-ipa-images.log"))
