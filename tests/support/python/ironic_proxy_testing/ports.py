"""Loopback ports, reserved as the Rust tests reserve theirs (tests/it/support/ports.rs).

A server the harness runs itself binds 127.0.0.1:0 and keeps its socket (relay_cost.py's,
validate-monitoring's silent DNS). ironic-proxy, Ironic, dnsmasq, HAProxy, nginx and Prometheus
bind their own listen addresses from a config file or flag, so for them `free_port` hands out a
port that the child binds itself, chosen so that nothing else is given it meanwhile:

- outside the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), so no
  `connect()` or `bind(:0)` of any process gets it;
- claimed by a file named after it holding our PID in $TMPDIR/ironic-proxy-test-ports/, the
  directory the Rust tests claim theirs in (created with O_EXCL; a claim whose process is gone
  is taken over), so two runs, Rust or Python, in this worktree or another, never share one;
- never handed out twice by this process, and free when handed out (a service may hold it).

A child that cannot bind its port fails loudly (`wait_port` times out or the child exits).
"""

import os
import socket
import sys
import tempfile
import time
import zlib

from .procs import Failure

FLOOR = 10_000  # below: well-known and registered services (ports.rs's FLOOR)
_handed_out = set()


def _free(kind, host, port):
    with socket.socket(socket.AF_INET, kind) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_in_use(host, port):
    """True when a TCP socket cannot bind host:port now."""
    return not _free(socket.SOCK_STREAM, host, port)


def _candidates():
    """The range ports come from: below the ephemeral range, or above it when it starts lower
    than FLOOR + 1000 (as ports.rs)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        first, last = (int(n) for n in f.read().split())
    if first > FLOOR + 1000:
        return FLOOR, first - 1
    if last >= 65535 - 1000:
        raise Failure(f"no room outside the ephemeral range {first}-{last}")
    return last + 1, 65535


def _claim(path):
    """Claims path for this process (as ports.rs's `take`): created holding our PID, or taken
    over from a process that is gone. An empty claim is being written for its first 10 s."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                with open(path) as f:
                    owner = f.read().strip()
                if owner.isdigit():
                    alive = os.path.exists(f"/proc/{owner}")
                else:
                    alive = time.time() - os.stat(path).st_mtime < 10
            except OSError:
                alive = False
            if alive:
                return False
            try:
                os.remove(path)
            except OSError:
                pass
            continue
        except OSError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _lock_dir():
    d = os.path.join(tempfile.gettempdir(), "ironic-proxy-test-ports")
    os.makedirs(d, exist_ok=True)
    try:
        os.chmod(d, 0o1777)  # shared by every user's tests on the machine
    except OSError:
        pass
    return d


def free_port(host="127.0.0.1", *, udp=False, also_on=()):
    """A port reserved for this process (see the module), free for TCP on host now; with `udp`
    free for UDP too (dnsmasq serves both); `also_on`: other loopback addresses where the same
    port must be free (one service on several addresses)."""
    lo, hi = _candidates()
    span = hi - lo + 1
    # Each harness scans from its own point, so its runs take the same ports when they can.
    start = zlib.crc32(os.path.basename(sys.argv[0] or "python").encode()) % span
    d = _lock_dir()
    for i in range(span):
        port = lo + (start + i) % span
        if port in _handed_out or not _claim(os.path.join(d, str(port))):
            continue
        _handed_out.add(port)  # reserved for this process from now on, used or not
        hosts = [host, *also_on]
        if all(_free(socket.SOCK_STREAM, h, port) for h in hosts) and (
            not udp or _free(socket.SOCK_DGRAM, host, port)
        ):
            return port
    raise Failure(f"no free port in {lo}-{hi} outside the ephemeral range")


def wait_port(port, host="127.0.0.1", timeout=10.0):
    """Returns once host:port accepts a TCP connection; Failure after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.005)
    raise Failure(f"port {port} on {host} not accepting after {timeout}s")
