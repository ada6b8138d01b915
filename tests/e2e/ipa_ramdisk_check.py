#!/usr/bin/env python3
"""A stock deploy ramdisk verifies the API with the CA the boot brings (issues 49, 64).

Builds (or finds in the cache) scripts/build-ipa-ramdisk's output with no CA inside, as any IPA
build comes, and shows that it holds none. Then boots it twice in QEMU with TCG on user-mode
networking (the guest's 10.0.2.2 is the host's 127.0.0.1), each boot bringing a fresh CA of this
run the way the kit's Ironic hands it out:

- iPXE: ironic-image's extra initrd, made by its own `generate_cacert_bundle_initrd`
  (scripts/tls-common.sh of the pinned ironic-image clone) and loaded after the ramdisk as
  ironic-image's ipxe_config.template and inspector.ipxe.j2 load it (iPXE hands the kernel its
  initrds one after the other; QEMU gets the same bytes as one file);
- virtual media: an ISO made by Ironic's own code (`ironic.common.images.
  create_isolinux_image_for_bios`) with the files Ironic injects when `[agent]api_ca_file` is
  set (`ironic.drivers.modules.image_utils`: the CA and `ironic-tls.conf`), booted from a CD
  with `boot_method=vmedia` as Ironic's redfish boot interface adds it.

Both with `ipa-insecure=0`, as the kit renders it. In each, a TLS server on 127.0.0.1 serves the
IPA API URL: first with a certificate from another CA, which IPA must refuse (the client's
unknown-CA alert reaches the server, IPA logs the failed verification); then with a certificate
from the boot's CA, and IPA's `GET /v1/lookup?...` must arrive over TLS. Every step waits for
its event, bounded by a deadline.

    python3 tests/e2e/ipa_ramdisk_check.py [--memory MIB] [--keep DIR] [--ironic-venv DIR]

Installs what it needs (QEMU, genisoimage, isolinux, zstd, cpio; Ironic from PyPI into a
virtualenv); fails, never skips. Needs root (the ramdisk build).
"""

import argparse
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support", "python"))
from ironic_proxy_testing import packages, upstream  # noqa: E402

QEMU = "qemu-system-x86_64"
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                     "ironic-proxy")
# TCG on a shared 2-core machine: boot plus IPA's start takes minutes, not seconds.
DEADLINE = 1200
SAN = "IP:10.0.2.2"
# Debian's isolinux, for Ironic's [DEFAULT]isolinux_bin (its default is another distribution's).
ISOLINUX_BIN = "/usr/lib/ISOLINUX/isolinux.bin"
# What the ramdisk must not hold: a CA or a cafile of its own (anything inside these folders).
OWN_TRUST = ("etc/ironic-python-agent/", "etc/ironic-python-agent.d/",
             "usr/local/share/ca-certificates/")


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(directory, name):
    """A self-signed CA in DIRECTORY/ca.{crt,key}."""
    os.makedirs(directory, exist_ok=True)
    crt, key = os.path.join(directory, "ca.crt"), os.path.join(directory, "ca.key")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", crt, "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return crt, key


def leaf(directory, name, ca_crt, ca_key):
    """A server certificate for the guest's view of the host (10.0.2.2), signed by the CA."""
    crt, key, csr = (os.path.join(directory, f"{name}.{e}") for e in ("crt", "key", "csr"))
    ext = os.path.join(directory, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(f"subjectAltName={SAN}\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    openssl("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
            "-out", crt, "-days", "2", "-extfile", ext)
    return crt, key


def initramfs_names(path):
    """The paths in the ramdisk's (zstd-compressed newc) archive."""
    unzstd = subprocess.Popen(["zstd", "-dc", path], stdout=subprocess.PIPE)
    listing = subprocess.run(["cpio", "-t", "--quiet"], stdin=unzstd.stdout,
                             capture_output=True, text=True, check=True)
    unzstd.wait()
    return [n[2:] if n.startswith("./") else n for n in listing.stdout.splitlines()]


def ipxe_bundle(ca_crt, work):
    """ironic-image's extra initrd for iPXE boots, made by its own function
    (scripts/tls-common.sh `generate_cacert_bundle_initrd`, taken whole from the pinned clone)
    from IPA_CACERT_FILE, which its runironic fills from WEBSERVER_CACERT_FILE."""
    src = os.path.join(upstream.tree("ironic-image"), "scripts", "tls-common.sh")
    text = open(src).read()
    start = text.index("generate_cacert_bundle_initrd()")
    end = text.index("\n)\n", start) + 3
    out = os.path.join(work, "ipa-cacert-bundle")
    script = text[start:end] + '\ngenerate_cacert_bundle_initrd "$1"\n'
    # (cpio's block count on stderr is dropped)
    subprocess.run(["bash", "-c", script, "bundle", out], check=True, stderr=subprocess.DEVNULL,
                   env=dict(os.environ, IPA_CACERT_FILE=ca_crt))
    return out


def ipxe_initrd(ramdisk, bundle, work):
    """The two initrds as iPXE hands them to the kernel: one after the other, each starting
    on a 4-byte boundary (the kernel unpacks every archive it finds, compressed or not)."""
    out = os.path.join(work, "ipxe-initrds")
    with open(out, "wb") as f:
        for part in (ramdisk, bundle):
            data = open(part, "rb").read()
            f.write(data + b"\0" * (-len(data) % 4))
    return out


def vmedia_iso(venv_py, kernel, initramfs, ca_crt, cmdline, work):
    """The ISO Ironic builds for a virtual-media boot of the agent, by Ironic's own code: the
    files image_utils.prepare_deploy_iso injects when [agent]api_ca_file is set, and the kernel
    command line parsed as Ironic parses it."""
    out = os.path.join(work, "deploy.iso")
    code = """
import sys
import warnings
warnings.simplefilter("ignore")
from ironic.conductor import utils  # first, as in the conductor (its modules import in a circle)
from ironic.conf import CONF
from ironic.drivers.modules import image_utils
from ironic.common import images, kernel_parameters
CONF([], project="ironic")
CONF.set_override("isolinux_bin", sys.argv[5])
ca = sys.argv[4]
inject = {ca: image_utils._TLS_REMOTE_FILE,
          image_utils._TLS_CONFIG_TEMPLATE.encode(): "etc/ironic-python-agent.d/ironic-tls.conf"}
images.create_isolinux_image_for_bios(
    sys.argv[1], sys.argv[2], sys.argv[3],
    kernel_cmd_line=kernel_parameters.KernelCommandLine.parse(sys.argv[6]),
    inject_files=inject)
"""
    subprocess.run([venv_py, "-c", code, out, kernel, initramfs, ca_crt, ISOLINUX_BIN, cmdline],
                   check=True)
    return out


class Api(http.server.BaseHTTPRequestHandler):
    """Just enough of Ironic's API for IPA to reach its lookup: the version document, and a 404
    for the lookup itself (IPA then retries, which is all this test needs)."""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.server.events.append(("request", f"{self.command} {self.path}"))
        if self.path == "/":
            body = {"default_version": {"id": "v1", "version": "1.99", "min_version": "1.1"},
                    "versions": [{"id": "v1", "version": "1.99", "min_version": "1.1"}]}
            status = 200
        else:
            body = {"error_message": json.dumps({"faultstring": "Node not found"})}
            status = 404
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class TlsServer(http.server.ThreadingHTTPServer):
    """Serves with whichever certificate `context` holds when a connection arrives, and records
    every handshake failure and request in `events`, in order."""

    daemon_threads = True

    def __init__(self, context):
        super().__init__(("127.0.0.1", 0), Api)
        self.context = context
        self.events = []

    def get_request(self):
        sock, addr = self.socket.accept()
        context = self.context
        try:
            sock.settimeout(60)
            tls = context.wrap_socket(sock, server_side=True)
            tls.settimeout(None)
        except (ssl.SSLError, OSError) as e:
            self.events.append(("handshake-failed", str(e)))
            sock.close()
            raise
        return tls, addr


def server_context(crt, key):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    return context


def tail(path, lines=60):
    try:
        with open(path, "rb") as f:
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return "(no serial log)"


def serial_lines(path, *needles):
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    return [line.strip() for line in text.splitlines() if any(n in line for n in needles)]


class Boot:
    """One VM booting the ramdisk by one path, with the TLS server its agent dials."""

    def __init__(self, name, work, impostor, memory):
        self.name = name
        self.server = TlsServer(server_context(*impostor))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.serial = os.path.join(self.dir, "serial.log")
        self.memory = memory
        self.qemu = None

    def cmdline(self, extra=""):
        # ironic-image renders ipa-insecure from IRONIC_IPA_INSECURE, which the kit sets to 0.
        return (f"console=ttyS0,115200 ipa-insecure=0 ipa-api-url=https://10.0.2.2:{self.port} "
                f"ipa-lookup-timeout=1200 {extra}").strip()

    def start(self, boot_args):
        disk = os.path.join(self.dir, "disk.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", disk, "8G"], check=True)
        self.qemu = subprocess.Popen(
            [QEMU, "-accel", "tcg", "-m", str(self.memory), "-smp", "1",
             "-display", "none", "-monitor", "none", "-no-reboot", *boot_args,
             "-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0",
             "-drive", f"file={disk},format=qcow2,if=virtio",
             "-device", "virtio-rng-pci", "-serial", f"file:{self.serial}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.booted = time.monotonic()

    def wait(self, what, predicate):
        deadline = self.booted + DEADLINE
        while time.monotonic() < deadline:
            found = predicate()
            if found:
                return found
            if self.qemu.poll() is not None:
                sys.exit(f"FAIL {self.name}: QEMU exited ({self.qemu.returncode}) while waiting "
                         f"for {what}\n" + tail(self.serial))
            time.sleep(0.5)
        sys.exit(f"FAIL {self.name}: no {what} within {DEADLINE} s\n" + tail(self.serial))

    def say(self, text):
        print(f"{self.name}: {time.monotonic() - self.booted:.0f} s: {text}", flush=True)

    def refused(self):
        """The impostor's certificate: IPA refuses it, and says why."""
        refusal = self.wait("refused handshake", lambda: next(
            (e for e in self.server.events if e[0] == "handshake-failed"), None))
        self.say(f"another CA's certificate: the server saw {refusal[1]}")
        if "unknown ca" not in refusal[1].lower():
            sys.exit(f"FAIL {self.name}: the handshake failed, but not by the client's "
                     "unknown-CA alert")
        self.wait("CERTIFICATE_VERIFY_FAILED on the serial console",
                  lambda: serial_lines(self.serial, "CERTIFICATE_VERIFY_FAILED"))

    def accepted(self, good):
        """The boot's CA: the lookup arrives over TLS."""
        self.server.context = server_context(*good)
        lookup = self.wait("GET /v1/lookup", lambda: next(
            (e for e in self.server.events
             if e[0] == "request" and e[1].startswith("GET /v1/lookup?")), None))
        self.say(f"a certificate of the boot's CA: {lookup[1][:80]}")

    def stop(self):
        if self.qemu and self.qemu.poll() is None:
            self.qemu.terminate()
            self.qemu.wait(timeout=30)
        self.server.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory", type=int, default=2048, help="guest memory in MiB")
    parser.add_argument("--keep", help="keep the serial logs and certificates in this directory")
    parser.add_argument("--ironic-venv", help="a virtualenv with Ironic (else one is made in "
                        "the cache from tests/e2e/provision/requirements.txt)")
    args = parser.parse_args()

    packages.need_packages(f"{QEMU}:qemu-system-x86", "qemu-img:qemu-utils", "openssl:openssl",
                           "mkisofs:genisoimage", f"{ISOLINUX_BIN}:isolinux,syslinux-common",
                           "zstd:zstd", "cpio:cpio", no_recommends=True, who="ipa_ramdisk_check")
    if args.ironic_venv:
        venv_py = os.path.join(args.ironic_venv, "bin", "python3")
    else:
        req = os.path.join(ROOT, "tests", "e2e", "provision", "requirements.txt")
        pins = [l.strip() for l in open(req) if l.strip() and not l.startswith("#")]
        venv_py = packages.venv(os.path.join(CACHE, "ipa-check-ironic-venv"), pins,
                                "ironic.common.images", who="ipa_ramdisk_check")

    work = args.keep or tempfile.mkdtemp(prefix="ipa-ramdisk-check.")
    os.makedirs(work, exist_ok=True)
    ca_crt, ca_key = make_ca(os.path.join(work, "ca"), "ipa_ramdisk_check CA")
    other_crt, other_key = make_ca(os.path.join(work, "other-ca"), "some other CA")
    good = leaf(work, "api", ca_crt, ca_key)
    bad = leaf(work, "impostor", other_crt, other_key)

    started = time.monotonic()
    build = subprocess.run([os.path.join(ROOT, "scripts", "build-ipa-ramdisk")],
                           stdout=subprocess.PIPE, text=True)
    if build.returncode != 0:
        sys.exit("FAIL: scripts/build-ipa-ramdisk failed")
    ramdisk = build.stdout.strip().splitlines()[-1]
    kernel = os.path.join(ramdisk, "ironic-python-agent.kernel")
    initramfs = os.path.join(ramdisk, "ironic-python-agent.initramfs")
    print(f"ramdisk {ramdisk} ready in {time.monotonic() - started:.0f} s", flush=True)
    passed = 0

    # 0. The ramdisk trusts nothing of its own: no CA, no cafile.
    own = [n for n in initramfs_names(initramfs) if n.startswith(OWN_TRUST)]
    if own:
        sys.exit(f"FAIL: the stock ramdisk holds trust of its own: {own}")
    print("the ramdisk holds no CA and no IPA configuration (its archive listed)")
    passed += 1

    ipxe = Boot("ipxe", work, bad, args.memory)
    vmedia = Boot("vmedia", work, bad, args.memory)
    boots = [ipxe, vmedia]
    try:
        bundle = ipxe_bundle(ca_crt, ipxe.dir)
        ipxe.start(["-kernel", kernel, "-initrd", ipxe_initrd(initramfs, bundle, ipxe.dir),
                    "-append", ipxe.cmdline()])
        iso = vmedia_iso(venv_py, kernel, initramfs, ca_crt,
                         vmedia.cmdline("boot_method=vmedia"), vmedia.dir)
        vmedia.start(["-cdrom", iso, "-boot", "d"])
        for boot in boots:
            boot.refused()
            passed += 1
        for boot in boots:
            boot.accepted(good)
            passed += 1
        # Where the trust came from: ironic-image's initrd, unpacked beside the ramdisk, as this
        # ramdisk's init lists it; the ISO's files, copied by IPA itself.
        want = {ipxe: "configuration: /etc/ironic-python-agent.d/ironic-tls.conf cafile = "
                      "/etc/ironic-python-agent/ironic.crt",
                vmedia: "Copying configuration from "}
        for boot, line in want.items():
            boot.wait(repr(line), lambda b=boot, ln=line: serial_lines(b.serial, ln))
            passed += 1
        for boot in boots:
            tools = serial_lines(boot.serial, "ironic-proxy-ipa: tools:")
            if tools != ["ironic-proxy-ipa: tools: all present"]:
                sys.exit(f"FAIL {boot.name}: the ramdisk lacks programs IPA runs: {tools}")
        print("serial consoles, the lines that show it (the first refusal of each):")
        for boot in boots:
            lines = serial_lines(boot.serial, "Command line:", "ironic-proxy-ipa: configuration",
                                 "Early logging: Copying configuration")
            lines += serial_lines(boot.serial, "SSLCertVerificationError: [SSL: CERTIFICATE_")[:1]
            for line in lines:
                print(f"  {boot.name}: {line[:240]}")
    finally:
        for boot in boots:
            boot.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"ipa_ramdisk_check: {passed} passed, 0 failed "
          f"({time.monotonic() - started:.0f} s, {args.memory} MiB guests)")


if __name__ == "__main__":
    main()
