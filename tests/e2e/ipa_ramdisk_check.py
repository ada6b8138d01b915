#!/usr/bin/env python3
"""The deploy ramdisk boots and IPA verifies the API's certificate (issue 49).

Builds (or finds in the cache) scripts/build-ipa-ramdisk's output for a test CA, boots it in QEMU
with TCG on user-mode networking (the guest's 10.0.2.2 is the host's 127.0.0.1), and serves the
IPA API URL from a TLS server on 127.0.0.1. The server first presents a certificate from another
CA: IPA must refuse it (the client's TLS alert reaches the server, IPA logs the failed
verification). The server then presents a certificate from the ramdisk's CA, and IPA's
`GET /v1/lookup?...` must arrive over TLS. Every step waits for its event, bounded by a deadline.

    python3 tests/e2e/ipa_ramdisk_check.py [--memory MIB] [--keep DIR]

Fails, never skips, when QEMU or openssl is missing. Needs root (the ramdisk build).
"""

import argparse
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QEMU = "qemu-system-x86_64"
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                     "ironic-proxy")
# TCG on a shared 2-core machine: boot plus IPA's start takes minutes, not seconds.
DEADLINE = 1200
SAN = "IP:10.0.2.2"


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(directory, name):
    """A self-signed CA in DIRECTORY/ca.{crt,key}."""
    os.makedirs(directory, exist_ok=True)
    crt, key = os.path.join(directory, "ca.crt"), os.path.join(directory, "ca.key")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", crt, "-days", "3650", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return crt, key


def check_ca():
    """The CA the ramdisk is built with. It is kept with the cache so that the ramdisk (whose key
    includes the CA) is built once; it is remade when it expires within 7 days."""
    directory = os.path.join(CACHE, "ipa-check-ca")
    crt = os.path.join(directory, "ca.crt")
    fresh = os.path.exists(crt) and subprocess.run(
        ["openssl", "x509", "-in", crt, "-noout", "-checkend", str(7 * 86400)],
        capture_output=True).returncode == 0
    if not fresh:
        make_ca(directory, "ironic-proxy ipa_ramdisk_check CA")
    return crt, os.path.join(directory, "ca.key")


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


def wait_for(what, predicate, qemu, serial, deadline):
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if qemu.poll() is not None:
            sys.exit(f"FAIL: QEMU exited ({qemu.returncode}) while waiting for {what}\n"
                     + tail(serial))
        time.sleep(0.5)
    sys.exit(f"FAIL: no {what} within {DEADLINE} s\n" + tail(serial))


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory", type=int, default=2048, help="guest memory in MiB")
    parser.add_argument("--keep", help="keep the serial log and certificates in this directory")
    args = parser.parse_args()

    missing = [c for c in (QEMU, "openssl", "qemu-img") if shutil.which(c) is None]
    if missing:
        sys.exit("FAIL: missing " + ", ".join(missing)
                 + " (Debian: qemu-system-x86, qemu-utils, openssl)")

    work = args.keep or tempfile.mkdtemp(prefix="ipa-ramdisk-check.")
    os.makedirs(work, exist_ok=True)
    ca_crt, ca_key = check_ca()
    other_crt, other_key = make_ca(os.path.join(work, "other-ca"), "some other CA")
    good = leaf(work, "api", ca_crt, ca_key)
    bad = leaf(work, "impostor", other_crt, other_key)

    started = time.monotonic()
    build = subprocess.run([os.path.join(ROOT, "scripts", "build-ipa-ramdisk"), "--ca", ca_crt],
                           stdout=subprocess.PIPE, text=True)
    if build.returncode != 0:
        sys.exit("FAIL: scripts/build-ipa-ramdisk failed")
    ramdisk = build.stdout.strip().splitlines()[-1]
    print(f"ramdisk {ramdisk} ready in {time.monotonic() - started:.0f} s", flush=True)

    server = TlsServer(server_context(*bad))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    disk = os.path.join(work, "disk.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", disk, "8G"], check=True)
    serial = os.path.join(work, "serial.log")
    append = (f"console=ttyS0,115200 ipa-api-url=https://10.0.2.2:{port} "
              "ipa-lookup-timeout=1200")
    qemu = subprocess.Popen(
        [QEMU, "-accel", "tcg", "-m", str(args.memory), "-smp", "1",
         "-display", "none", "-monitor", "none", "-no-reboot",
         "-kernel", os.path.join(ramdisk, "ironic-python-agent.kernel"),
         "-initrd", os.path.join(ramdisk, "ironic-python-agent.initramfs"), "-append", append,
         "-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56",
         "-drive", f"file={disk},format=qcow2,if=virtio",
         "-device", "virtio-rng-pci", "-serial", f"file:{serial}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    booted = time.monotonic()
    deadline = booted + DEADLINE
    passed = 0
    try:
        # 1. Another CA's certificate: IPA refuses it, and says why.
        refusal = wait_for(
            "refused handshake",
            lambda: next((e for e in server.events if e[0] == "handshake-failed"), None),
            qemu, serial, deadline)
        print(f"{time.monotonic() - booted:.0f} s: impostor certificate: server saw {refusal[1]}")
        if "unknown ca" not in refusal[1].lower():
            sys.exit("FAIL: the handshake failed, but not by the client's unknown-CA alert")
        wait_for("CERTIFICATE_VERIFY_FAILED on the serial console",
                 lambda: serial_lines(serial, "CERTIFICATE_VERIFY_FAILED"), qemu, serial, deadline)
        passed += 1
        # 2. The ramdisk's CA: the lookup arrives over TLS.
        server.context = server_context(*good)
        lookup = wait_for(
            "GET /v1/lookup",
            lambda: next((e for e in server.events
                          if e[0] == "request" and e[1].startswith("GET /v1/lookup?")), None),
            qemu, serial, deadline)
        print(f"{time.monotonic() - booted:.0f} s: API certificate: {lookup[1]}")
        passed += 1
        wait_for("IPA's lookup retry on the serial console",
                 lambda: serial_lines(serial, "Failed looking up node", "lookup"),
                 qemu, serial, deadline)
        passed += 1
        tools = serial_lines(serial, "ironic-proxy-ipa: tools:")
        if tools != ["ironic-proxy-ipa: tools: all present"]:
            sys.exit(f"FAIL: the ramdisk lacks programs IPA runs: {tools}")
        passed += 1
        print("serial console, the lines that show it:")
        for line in serial_lines(serial, "ironic-proxy-ipa:", "CERTIFICATE_VERIFY_FAILED",
                                 "lookup", "Lookup", "10.0.2.2"):
            print("  " + line[:300])
    finally:
        qemu.terminate()
        qemu.wait(timeout=30)
        server.shutdown()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"ipa_ramdisk_check: {passed} passed, 0 failed "
          f"({time.monotonic() - booted:.0f} s from boot, {args.memory} MiB guest)")


if __name__ == "__main__":
    main()
