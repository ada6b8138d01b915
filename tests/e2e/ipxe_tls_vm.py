"""A real HTTPS iPXE booting through ironic-proxy's TLS listeners (issue 44; `scripts/e2e-boot
--tls`).

The iPXE is the pinned v2.0.0 build in ../shared/upstream/ipxe (its README: a virtio-net option
ROM with HTTPS, trusting only ipxe/test-ca, whose key is public test material; TLS 1.2 only,
ECDSA or RSA leaves, X25519/P-256/P-384; it checks the certificate's IP SAN against the URL and
writes its console to the serial port too). In --tls mode the run's CA *is* that test CA: every
sidecar and the load balancer issue their own leaf from it, for the IPs the VM dials.

- Through a sidecar: boot file `https://<first sidecar IP>:8084/boot.ipxe`, its `boot-tls`
  listener (QEMU's user network connects from the host to 127.0.0.x): boot.ipxe and the node's
  config found across conductors, the kernel and ramdisk from `https://<owner>:8084/...`
  ([deploy]http_url), the owner's sidecar fronting the owner's httpd.
- Through the load balancer: `https://10.0.2.2:6385/boot.ipxe` (the host's 127.0.0.1: its leaf
  carries 10.0.2.2), its find route over the sidecars.
- Refusals, each with iPXE's own error line on the serial console (the README's codes): a
  listener whose leaf is from another CA (`Invalid argument`, 1c2ee002), one whose leaf lacks the
  dialled IP (`Permission denied`, 0216ea3c), one under a `[tls]` policy of TLS 1.3 only
  (`Operation not permitted`, 410de13c). Each is an ironic-proxy of its own on 127.0.0.1 with
  the sidecar's boot-TLS listener and find route and that one difference.
"""

import os
import shutil
import subprocess
import time

import harness as h  # puts tests/support/python on sys.path too
from ironic_proxy_testing import pki
import vm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIALLED = "10.0.2.2"  # QEMU user network: the host's 127.0.0.1


def pinned():
    """(ROM, test CA dir): $IPXE_TLS_DIR, else ../shared/upstream/ipxe beside the repository.
    Missing: the run fails (h.Failure), never skips."""
    d = os.environ.get("IPXE_TLS_DIR") or os.path.normpath(
        os.path.join(REPO, "..", "shared", "upstream", "ipxe")
    )
    rom, ca = os.path.join(d, "1af41000.rom"), os.path.join(d, "test-ca")
    missing = [p for p in (rom, f"{ca}/ca.crt", f"{ca}/ca.key") if not os.path.isfile(p)]
    if missing:
        raise h.Failure(f"the pinned HTTPS iPXE is missing: {', '.join(missing)} (set "
                        "IPXE_TLS_DIR to ../shared/upstream/ipxe)")  # fmt: skip
    return rom, ca


def use_test_ca(ca_dir):
    """The run's CA is the test CA the ROM trusts: its ca.crt and (public) ca.key."""
    _, ca = pinned()
    os.makedirs(ca_dir)
    for name in ("ca.crt", "ca.key"):
        shutil.copyfile(os.path.join(ca, name), os.path.join(ca_dir, name))
    os.chmod(os.path.join(ca_dir, "ca.key"), 0o600)


def refusal_config(name, port, ca_dir, ips, tls_policy, dns_port, first_ip, http_port, route):
    """A sidecar-shaped proxy with only the boot-TLS listener, on 127.0.0.1:port."""
    return f"""# iPXE-over-TLS refusal case {name} (written by tests/e2e/ipxe_tls_vm.py).
[identity]
trust = "{ca_dir}/ca.crt"
issuer_cert = "{ca_dir}/ca.crt"
issuer_key = "{ca_dir}/ca.key"
ip_addresses = [{", ".join(f'"{ip}"' for ip in ips)}]
validity = "1h"

[admin]
listen = "127.0.0.1:{h.free_port()}"
{tls_policy}
[dns]
servers = ["127.0.0.1:{dns_port}"]
refresh = "2s"

[[listeners]]
name = "boot-tls"
listen = "127.0.0.1:{port}"
tls = "server"
http2 = false
upstream = "{first_ip}:{http_port}"
{route}"""


# case -> (CA: "test" or "other", IP SANs, [tls] policy, iPXE's error line)
REFUSALS = {
    "leaf from another CA": ("other", [DIALLED, "127.0.0.1"], "",
                             "Invalid argument (https://ipxe.org/1c2ee002)"),
    "leaf without the dialled IP": ("test", ["127.0.0.1"], "",
                                    "Permission denied (https://ipxe.org/0216ea3c)"),
    "[tls] TLS 1.3 only": ("test", [DIALLED, "127.0.0.1"], '\n[tls]\nmin_version = "1.3"\n',
                           "Operation not permitted (https://ipxe.org/410de13c)"),
}  # fmt: skip


def transcript(b, marks):
    """The serial console's lines of interest with seconds from QEMU's start."""
    return ", ".join(f"{m!r} {b.seen[m]:.1f} s" for m in marks if m in b.seen)


def boot_node(run, via, u, url, first_hop_log, first_hop_listener):
    """One VM for node u through one TLS listener; checks what it fetched and from whom."""
    rom, _ = pinned()
    mac = run.nodes[u]
    owner, config = run.owner(u), run.mac_path(u)
    marker = f"e2e kernel {u} on {mac}"
    marks = ["iPXE 2.0.0", f"{url}... ok", f"{config.lstrip('/')}... ok", "/kernel... ok",
             marker]  # fmt: skip
    b = vm.boot(run.vm_dir, f"tls-{via}-{u[:8]}", mac, url, [marker], then=["iPXE>"], rom=rom)
    time.sleep(0.3)  # access lines are written at most 100 ms after the request
    first = [(e["method"], e["path"], e["status"]) for e in run.access_any(first_hop_log,
                                                                         first_hop_listener, b)]
    kernel_path = f"/{u}/kernel"
    via_owner = [(e["path"], e["status"]) for e in run.access_any(owner.sidecar_log,
                                                                 "boot-tls", b)]
    served = {e["path"].rsplit("/", 1)[-1]: e["bytes"] for e in run.httpd_lines(owner, b)
              if e["path"] in (kernel_path, f"/{u}/ramdisk") and e["status"] == 200}
    bad = []
    if marker not in b.seen:
        tail = [line for line in b.serial.splitlines() if line.strip()][-4:]
        bad.append(f"never on the console: {marker!r}; serial ends {tail}")
    want = [("GET", "/boot.ipxe", 200), ("GET", config, 200)]
    if first[:2] != want:
        bad.append(f"{first_hop_listener} access log {first}, expected {want} first")
    if (kernel_path, 200) not in via_owner:
        bad.append(f"owner {owner.ip}'s boot-tls served {via_owner}, not {kernel_path}")
    for name in ("kernel", "ramdisk"):
        if served.get(name) != os.path.getsize(f"{owner.http_root}/{u}/{name}"):
            bad.append(f"owner's httpd served {name} {served.get(name)} bytes")
    print(f"e2e-boot: TLS iPXE VM via the {via}, node {u[:8]} (owner {owner.ip}): "
          f"{transcript(b, marks)}; first hop {first}; owner's boot-tls {via_owner}",
          flush=True)  # fmt: skip
    print("  serial:\n    " + "\n    ".join(l for l in b.serial.splitlines() if l.strip()),
          flush=True)  # fmt: skip
    run.check(f"pinned HTTPS iPXE through the {via}'s TLS listener: node {u[:8]}'s boot.ipxe "
              "and config found across conductors, its kernel from the owner, all over TLS",
              not bad, "; ".join(bad))  # fmt: skip
    return b.seen.get(marker)


def refusal(run, name, dns_port, route):
    """One refusal case: its proxy, one VM, iPXE's own error line on the serial console."""
    rom, _ = pinned()
    which, ips, policy, line = REFUSALS[name]
    slug = "".join(c if c.isalnum() else "-" for c in name)
    d = os.path.join(run.root, f"refusal-{slug}")
    os.makedirs(d)
    ca_dir = run.ca_dir
    if which == "other":
        ca_dir = os.path.join(d, "other-ca")
        pki.ca_init(run.bin, ca_dir, name="a CA not in the ROM", what="ca init (other)")
    port = h.free_port()
    conf, log = os.path.join(d, "proxy.toml"), os.path.join(d, "proxy.log")
    first = run.instances[0]
    with open(conf, "w") as f:
        f.write(refusal_config(name, port, ca_dir, ips, policy, dns_port, first.ip,
                               run.http_port, route))  # fmt: skip
    checked = h.run([run.bin, "check", "--config", conf], f"check {name}").stderr
    # `check` warns exactly when the policy leaves iPXE nothing (src/doctor/boot_tls.rs).
    warned = "cannot serve iPXE" in checked
    run.check(f"`ironic-proxy check` {'warns' if policy else 'is silent'} about iPXE for the "
              f"listener with a {name}", warned == bool(policy), checked.strip()[-300:])
    proc = run.start_proxy(f"refusal {name}", conf, log)
    try:
        h.wait_for(f"{name} proxy listening", lambda: h.port_in_use("127.0.0.1", port), 20)
        # `doctor` on the running proxy: WARN for that listener exactly with the 1.3 policy.
        try:
            doc = subprocess.run([run.bin, "doctor", "--config", conf], capture_output=True,
                                 text=True, timeout=60).stdout  # fmt: skip
        except subprocess.TimeoutExpired:
            doc = "doctor did not finish in 60 s"
        said = next((l for l in doc.splitlines() if "listener[boot-tls].ipxe_tls" in l), "")
        run.check(f"`ironic-proxy doctor` says {'WARN' if policy else 'PASS'} for iPXE on the "
                  f"listener with a {name}",
                  said.startswith("WARN" if policy else "PASS"), said or doc[-300:])
        url = f"https://{DIALLED}:{port}/boot.ipxe"
        u = next(iter(run.nodes))
        b = vm.boot(run.vm_dir, f"refusal-{slug}", run.nodes[u], url, [line],
                    then=["No more network devices"], rom=rom)  # fmt: skip
        time.sleep(0.3)
        failed = [e.get("detail") for e in h.proxy_events(log)
                  if e.get("message") == "TLS handshake failed"]  # fmt: skip
        served = [e for e in h.proxy_events(log) if e.get("target") == "access"]
        shown = next((l.strip() for l in b.serial.splitlines() if "boot.ipxe..." in l), "")
        print(f"e2e-boot: TLS refusal, {name}: iPXE {shown!r} at "
              f"{b.seen.get(line, 0):.1f} s; proxy: {failed[:2]}", flush=True)  # fmt: skip
        run.check(f"pinned HTTPS iPXE refuses a listener with a {name}: its serial console "
                  f"says {line!r}, nothing served",
                  line in b.seen and not served,
                  f"serial {b.serial[-300:]!r}, access lines {len(served)}")  # fmt: skip
    finally:
        run.procs.stop(proc)


def run_all(run, dns_port, route):
    """Every node once, through the first sidecar or the load balancer (alternating within
    each owner's nodes, so each path boots a node of every conductor), then the three
    refusals."""
    first = run.instances[0]
    times = {"sidecar": [], "lb": []}
    for k, u in enumerate(sorted(run.nodes, key=lambda u: run.owner(u).ip)):
        via = ("sidecar", "lb")[k % 2]
        if via == "sidecar":
            url = f"https://{first.ip}:{run.ipxe_tls_port}/boot.ipxe"
            t = boot_node(run, via, u, url, first.sidecar_log, "boot-tls")
        else:
            url = f"https://{DIALLED}:{h.LB_PORT}/boot.ipxe"
            t = boot_node(run, via, u, url, run.lb_log, "api")
        if t:
            times[via].append(t)
    for via, ts in times.items():
        if ts:
            print(f"e2e-boot: TLS iPXE through the {via}: QEMU start to the kernel min "
                  f"{min(ts):.1f} s, max {max(ts):.1f} s over {len(ts)} nodes", flush=True)
    for name in REFUSALS:
        refusal(run, name, dns_port, route)
