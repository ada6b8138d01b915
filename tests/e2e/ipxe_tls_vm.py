"""iPXE's HTTPS boot through ironic-proxy's TLS listeners (issue 44; `scripts/e2e-boot --tls`).

Two ways, the same cases:

- **Clients** (the default, in scripts/test): no package of Debian, PyPI, crates.io or npm ships
  an iPXE with HTTPS (Debian 12's 1.0.0+git-20190125 has no https:// opener), and an iPXE built
  from its source may not be built by a committed script. So the routes are checked with real
  TLS clients restricted to what iPXE offers (tests/e2e/ipxe_tls.py): curl fetches every file
  iPXE would, with the run's CA and the dialled IP checked; each refusal is shown by curl,
  `openssl s_client -verify_ip` and Python's ssl.
- **A real iPXE** (by hand): `IPXE_TLS_DIR` names a folder with `1af41000.rom`, a virtio-net
  option ROM with HTTPS that trusts `test-ca/ca.crt` (whose `ca.key` is there too), built by the
  developer from iPXE's source. The run's CA is then that test CA: every sidecar and the load
  balancer issue their own leaf from it, for the IPs the VM dials, and each refusal is iPXE's own
  error line on the serial console.

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
import socket
import ssl
import subprocess
import time

import harness as h  # puts tests/support/python on sys.path too
from ironic_proxy_testing import pki
import ipxe_tls
import vm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIALLED = "10.0.2.2"  # QEMU user network: the host's 127.0.0.1


def with_rom():
    """True when IPXE_TLS_DIR names a real HTTPS iPXE (the VM way); unset: the clients way."""
    return bool(os.environ.get("IPXE_TLS_DIR"))


def pinned():
    """(ROM, test CA dir) from $IPXE_TLS_DIR; a file missing there fails the run, never
    skips."""
    d = os.environ["IPXE_TLS_DIR"]
    rom, ca = os.path.join(d, "1af41000.rom"), os.path.join(d, "test-ca")
    missing = [p for p in (rom, f"{ca}/ca.crt", f"{ca}/ca.key") if not os.path.isfile(p)]
    if missing:
        raise h.Failure(f"IPXE_TLS_DIR={d}: missing {', '.join(missing)}")
    return rom, ca


def use_test_ca(ca_dir, proxy_bin):
    """The run's CA: the test CA the ROM trusts (its ca.crt and public ca.key), or with no ROM
    a CA made for this run."""
    if not with_rom():
        pki.ca_init(proxy_bin, ca_dir, name="e2e-boot TLS CA", what="ca init")
        return
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


# case -> (CA: "test" or "other", IP SANs, [tls] policy, iPXE's error line). The VM dials
# DIALLED, the clients 127.0.0.1: the second case's leaf carries only the address not dialled.
REFUSALS = {
    "leaf from another CA": ("other", [DIALLED, "127.0.0.1"], "",
                             "Invalid argument (https://ipxe.org/1c2ee002)"),
    "leaf without the dialled IP": ("test", None, "",
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
    which, ips, policy, line = REFUSALS[name]
    if ips is None:
        ips = ["127.0.0.1"] if with_rom() else [DIALLED]
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
        if not with_rom():
            refusal_clients(run, name, port, log)
            return
        rom, _ = pinned()
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


def python_ssl(port, ca):
    """Python's ssl as iPXE verifies: the run's CA, the dialled IP checked, TLS 1.2 at most.
    Returns "" on a handshake that verified, else the error."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
                return ""
    except (ssl.SSLError, ssl.CertificateError, OSError) as e:
        return f"{type(e).__name__}: {e}"


def refusal_clients(run, name, port, log):
    """A refusal seen by three real TLS clients offering what iPXE offers, each verifying the
    run's CA and the dialled IP: curl, openssl s_client -verify_ip, Python's ssl; nothing may
    be served."""
    at = f"127.0.0.1:{port}"
    request = f"GET /boot.ipxe HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\n\r\n"
    status, body = ipxe_tls.curl(f"https://{at}/boot.ipxe", ipxe_tls.CURRENT, run.ca)
    info, out, err = ipxe_tls.s_client(at, ipxe_tls.CURRENT, run.ca, request, timeout=30,
                                       verify_ip="127.0.0.1")
    verified = info.get("Verification") == "OK"
    said = next((l.strip() for l in err.splitlines() if "error" in l.lower()), err[-200:])
    py = python_ssl(port, run.ca)
    served = [e for e in h.proxy_events(log) if e.get("target") == "access"]
    print(f"e2e-boot: TLS refusal, {name}: curl {status}; openssl {said!r}; python {py!r}",
          flush=True)
    run.check(f"TLS boot listener with a {name}: curl, openssl and Python's ssl (iPXE's offer, "
              "the run's CA, the dialled IP checked) all refuse it, nothing served",
              status == 0 and not body and not verified and not out and py
              and not served, f"curl {status} {body[:60]!r}; openssl verified {verified} "
              f"{out[:60]!r}; python {py!r}; access lines {len(served)}")  # fmt: skip


def boot_clients(run, via, u, url):
    """What iPXE fetches for node u through one TLS listener, by curl with iPXE's offer: the
    boot script, the node's config found across conductors, and the kernel the config names on
    the owner's boot-TLS listener; each byte-equal to the owner's file."""
    owner, config = run.owner(u), run.mac_path(u)
    base = url.rsplit("/", 1)[0]
    got = {}
    # boot.ipxe is found on whichever conductor wrote it last: any one's copy.
    scripts = []
    for i in run.instances:
        try:
            scripts.append(run.on_disk(i, "/boot.ipxe"))
        except OSError:
            pass
    status, body = ipxe_tls.curl(url, ipxe_tls.CURRENT, run.ca)
    got["boot.ipxe"] = (status, body in scripts)
    for what, link, disk in [
        ("config", base + config, run.on_disk(owner, config)),
        ("kernel", f"https://{owner.ip}:{run.ipxe_tls_port}/{u}/kernel",
         run.on_disk(owner, f"/{u}/kernel")),
    ]:
        status, body = ipxe_tls.curl(link, ipxe_tls.CURRENT, run.ca)
        got[what] = (status, body == disk)
    named = f"https://{owner.ip}:{run.ipxe_tls_port}" in run.on_disk(owner, config).decode(
        errors="replace")
    run.check(f"TLS boot through the {via} (curl with iPXE's offer): node {u[:8]}'s boot.ipxe "
              "and config found across conductors, the config naming the owner's TLS listener, "
              "its kernel from the owner, byte-equal",
              all(g == (200, True) for g in got.values()) and named, f"{got} named={named}")


def run_all(run, dns_port, route):
    """Every node once, through the first sidecar or the load balancer (alternating within
    each owner's nodes, so each path boots a node of every conductor), then the three
    refusals: by a real iPXE in a VM when IPXE_TLS_DIR names one, else by real TLS clients."""
    first = run.instances[0]
    if not with_rom():
        print("e2e-boot: --tls by TLS clients restricted to iPXE's offer (no HTTPS iPXE "
              "here: IPXE_TLS_DIR unset; tests/e2e/ipxe_tls_vm.py)", flush=True)
        for k, u in enumerate(sorted(run.nodes, key=lambda u: run.owner(u).ip)):
            if k % 2 == 0:
                boot_clients(run, "sidecar", u,
                             f"https://{first.ip}:{run.ipxe_tls_port}/boot.ipxe")
            else:
                boot_clients(run, "load balancer", u,
                             f"https://127.0.0.1:{h.LB_PORT}/boot.ipxe")
        for name in REFUSALS:
            refusal(run, name, dns_port, route)
        return
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
