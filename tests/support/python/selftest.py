#!/usr/bin/env python3
"""Checks of ironic_proxy_testing and scripts/lib/packages.sh that need no network and no root:
ports are reserved as tests/it/support/ports.rs reserves them, need_packages installs exactly
what a check finds missing (apt-get is a recording stand-in first on PATH), /proc accounting
sees this process's own CPU, a leaf is issued by the proxy's CA commands when a binary is there.

    python3 tests/support/python/selftest.py [IRONIC_PROXY_BIN]

Exit 0 when every check passes; each failure is named.
"""

import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ironic_proxy_testing import Failure, cpu, pki, ports, procs  # noqa: E402
from ironic_proxy_testing.packages import HELPER, need_packages  # noqa: E402

failed = []


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail and not ok else ''}")
    if not ok:
        failed.append(what)


def test_ports():
    first, last = (int(n) for n in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    got = [ports.free_port() for _ in range(5)] + [ports.free_port(udp=True)]
    check("ports: all different", len(set(got)) == len(got), str(got))
    check("ports: outside the ephemeral range", all(not first <= p <= last for p in got), str(got))
    claims = os.path.join(tempfile.gettempdir(), "ironic-proxy-test-ports")
    mine = all(open(os.path.join(claims, str(p))).read() == str(os.getpid()) for p in got)
    check("ports: each claimed by a file holding our PID", mine)
    check("ports: free to bind", not any(ports.port_in_use("127.0.0.1", p) for p in got))


def test_packages():
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "apt.log")
        with open(os.path.join(d, "apt-get"), "w") as f:
            f.write(f'#!/bin/sh\necho "$*" >> {log}\n')
        os.chmod(os.path.join(d, "apt-get"), 0o755)
        os.environ["PATH"] = f"{d}:{os.environ['PATH']}"
        try:
            need_packages("sh:dash", "/:base-files", "py:os+sys:python3",
                          "no-such-command-here:pkg-a,pkg-b", "/no/such/file:pkg-c",
                          "py:no_such_module_here:pkg-d", no_recommends=True, who="selftest")  # fmt: skip
            calls = open(log).read().splitlines()
            want = ["-o DPkg::Lock::Timeout=600 update -qq",
                    "-o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "
                    "pkg-a pkg-b pkg-c pkg-d"]  # fmt: skip
            check("packages: one update, one install of exactly what is missing", calls == want,
                  str(calls))  # fmt: skip
            os.remove(log)
            need_packages("sh:dash", who="selftest")
            check("packages: nothing missing, apt-get not run", not os.path.exists(log))
            with open(os.path.join(d, "apt-get"), "w") as f:
                f.write("#!/bin/sh\nexit 100\n")
            try:
                need_packages("no-such-command-here:pkg-a", who="selftest")
                check("packages: a failing apt-get is a Failure", False)
            except Failure:
                check("packages: a failing apt-get is a Failure", True)
        finally:
            os.environ["PATH"] = os.environ["PATH"].split(":", 1)[1]
    check("packages: the shell helper exists", HELPER.is_file(), str(HELPER))


def test_cpu():
    before = cpu.cpu_seconds(os.getpid())
    deadline = time.monotonic() + 30
    while cpu.cpu_seconds([os.getpid()]) <= before and time.monotonic() < deadline:
        sum(range(10_000))
    check("cpu: utime + stime of this process grows while it computes",
          cpu.cpu_seconds(os.getpid()) > before)  # fmt: skip
    child = subprocess.Popen(["sleep", "30"])
    try:
        check("cpu: tree() finds a child", child.pid in cpu.tree(os.getpid()))
        rss, pss = cpu.memory_kib([os.getpid()])
        check("cpu: memory_kib reads this process's RSS and PSS", rss > 0 and pss > 0)
    finally:
        procs.stop(child)
    check("procs: stop ends a process", child.poll() is not None)


def test_upstream():
    """The upstream helper: the variable's tree used as given, a missing one refused by name,
    and an unreachable repository failing (never skipping) with repository, commit and
    variable named."""
    from ironic_proxy_testing import upstream
    pin = upstream.pin("utility-images")
    with tempfile.TemporaryDirectory() as d:
        saved = dict(os.environ)
        try:
            os.environ[pin.variable] = d
            check("upstream: the variable's tree is used as given", upstream.tree(pin.name) == d)
            os.environ[pin.variable] = os.path.join(d, "missing")
            try:
                upstream.tree(pin.name)
                check("upstream: a variable naming no directory fails", False)
            except Failure as e:
                check("upstream: a variable naming no directory fails", pin.variable in str(e),
                      str(e))
            del os.environ[pin.variable]
            # No cache, no redirection of the URL, and git may not use https: the clone
            # cannot happen.
            os.environ.update(XDG_CACHE_HOME=d, GIT_ALLOW_PROTOCOL="file",
                              GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
            try:
                upstream.tree(pin.name, log=lambda m: None)
                check("upstream: an unreachable repository fails", False)
            except Failure as e:
                said = str(e)
                check("upstream: an unreachable repository fails naming repository, commit "
                      "and variable", all(w in said for w in (pin.url, pin.commit,
                                                              pin.variable)), said)
            check("upstream: a failed clone leaves nothing in the cache",
                  not any(os.scandir(os.path.join(d, "ironic-proxy", "upstream", pin.repo))))
        finally:
            os.environ.clear()
            os.environ.update(saved)


def test_pki(binary):
    with tempfile.TemporaryDirectory() as d:
        pki.ca_init(binary, f"{d}/ca", name="selftest CA", permit_ip=["127.0.0.0/8"])
        pki.issue(binary, f"{d}/ca", f"{d}/leaf", ips=["127.0.0.1"])
        out = subprocess.run(["openssl", "verify", "-CAfile", f"{d}/ca/ca.crt",
                              f"{d}/leaf/tls.crt"], capture_output=True, text=True)  # fmt: skip
        check("pki: the leaf verifies against the CA (openssl verify)", out.returncode == 0,
              out.stderr.strip())  # fmt: skip
        try:
            pki.issue(binary, f"{d}/ca", f"{d}/bad", ips=["10.0.0.1"])
            check("pki: a leaf outside the CA's constraints is a Failure", False)
        except Failure:
            check("pki: a leaf outside the CA's constraints is a Failure", True)


def main():
    test_ports()
    test_packages()
    test_cpu()
    test_upstream()
    if len(sys.argv) > 1:
        test_pki(sys.argv[1])
    if failed:
        sys.exit(f"selftest: {len(failed)} failed: {', '.join(failed)}")
    print("selftest: ironic_proxy_testing and scripts/lib/packages.sh pass")


if __name__ == "__main__":
    main()
