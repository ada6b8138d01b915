"""Loopback ports.

Where the harness itself serves, it binds 127.0.0.1:0 and keeps the socket (`listener`): no
window in which another process can take the port. ironic-proxy, Ironic, dnsmasq, HAProxy and
nginx bind their own listen addresses from a config file or flag, so for them `free_port`
returns a port that was free a moment ago; the child binds it and the harness fails loudly if it
cannot (`wait_port` times out, or the child exits), which is what the harnesses did before.
"""

import socket
import time

from .procs import Failure


def _free(family_type, host, port):
    with socket.socket(socket.AF_INET, family_type) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_in_use(host, port):
    """True when a TCP socket cannot bind host:port now."""
    return not _free(socket.SOCK_STREAM, host, port)


def free_port(host="127.0.0.1", *, udp=False, also_on=()):
    """A TCP port the kernel picked on host, free now; with `udp`, free for UDP too (dnsmasq
    serves both); `also_on`: other loopback addresses where the same port must be free (one
    port for a service on several addresses)."""
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    for _ in range(100):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if udp and port_in_use(host, port):
            continue
        if all(_free(socket.SOCK_STREAM, ip, port) for ip in also_on):
            return port
    raise Failure(f"no free port found on {host}")


def listener(host="127.0.0.1", backlog=128):
    """A TCP socket listening on host:0, kept bound: hand it (or its port) to the server the
    harness runs itself."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen(backlog)
    return s


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
