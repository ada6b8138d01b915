"""A provisioning network on one machine: a bridge with no address in the root namespace, and
network namespaces on it by veth, each holding one role's addresses (a control-plane node, the
shared services, the BMC emulator). Processes run inside a namespace and are stopped by PID.

    topo = Topology(stack="ipv4", roles=["cp1", "cp2", "cp3", "svc", "bmc"])
    topo.up()                                   # bridge + namespaces + addresses
    p = topo.start("cp1", "ironic", argv, log)  # in cp1's namespace, its own session
    topo.kill("cp1")                            # SIGKILL every process group started in cp1
    topo.down()                                 # stop what we started, delete ns and bridge

A routed layout (IPv4 only) has several networks, each a bridge and a sub-range of the run's
/24 (`Segment`); a role on more than one (a router) has an interface on each, and `route` gives
a namespace its routes through it:

    topo = Topology(roles=["rtr", "cp1", "bmc"], segments=[
        Segment("", "172.22.0.0/26", {"rtr": 1, "cp1": 11}),       # <tag>-br, prov0
        Segment("bmc", "172.22.0.64/28", {"rtr": 65, "bmc": 66})])  # <tag>-brbmc, bmc0
    topo.up()
    topo.route("cp1", "default", "172.22.0.1")

Invariants:
- The bridges carry no address and no route in the root namespace, so nothing on them reaches
  the machine's own networks, and the subnets cannot collide with them.
- Names carry a per-run tag (`pv` + 4 hex digits): runs side by side never share a namespace,
  an interface or a bridge, and `down` deletes only its own.
- Every process is started with its own session (`setsid`), so a kill reaches its children
  (Ironic's workers, a shell's exec'd program) through the process group, never by name.
- Interfaces in a namespace are named `prov0` (the name a kit's PROVISIONING_INTERFACE gives) on
  the first network, `<segment>0` on the others.
"""

import ipaddress
import os
import signal
import subprocess
import time
from typing import NamedTuple

from .procs import Failure, run

# Addresses per stack. IPv4 /24 and IPv6 /64 of documentation-like private ranges that no other
# e2e script uses (they live in namespaces we create; scripts/e2e keeps 127.0.0.1-4).
SUBNETS = {"ipv4": ["172.22.0.0/24"], "ipv6": ["fd2e:22::/64"],
           "dual": ["172.22.0.0/24", "fd2e:22::/64"]}  # fmt: skip
# The host part of each role's address, the same in every family.
HOSTS = {"svc": 2, "bmc": 3, "vip": 5, "cp1": 11, "cp2": 12, "cp3": 13}
DHCP_RANGE = (100, 199)
IFACE = "prov0"


class Segment(NamedTuple):
    """One network of a routed layout: the bridge `<tag>-br<name>` (the first segment's is
    `<tag>-br`), an IPv4 sub-range of the run's /24, and the roles on it with the host part of
    their address (counted from the /24's first address, as HOSTS)."""

    name: str
    cidr: str
    hosts: dict


def _ip(argv, what, check=True):
    p = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise Failure(f"{what}: ip {' '.join(argv)}: {p.stderr.strip()}")
    return p


class Topology:
    """The bridge and namespaces of one run; `up` builds them, `down` removes them."""

    def __init__(self, stack="ipv4", roles=("cp1", "cp2", "cp3", "svc", "bmc"), tag=None,
                 segments=None):
        """segments: None for one provisioning network (every role on it, its HOSTS address
        in each family of the stack); else the networks of a routed layout, IPv4 only, the
        first one the primary (`subnets`, `cidrs`), every role on at least one."""
        if stack not in SUBNETS:
            raise ValueError(f"stack {stack!r}: one of {', '.join(SUBNETS)}")
        if segments and stack != "ipv4":
            raise ValueError("a routed layout (segments) is IPv4 only")
        self.stack = stack
        self.roles = list(roles)
        self.tag = tag or f"pv{os.getpid() & 0xFFFF:04x}"
        self.bridge = f"{self.tag}-br"
        self.segments = list(segments or [])
        base = ipaddress.ip_network(SUBNETS["ipv4"][0])
        for seg in self.segments:
            net = ipaddress.ip_network(seg.cidr)
            bad = [r for r, n in seg.hosts.items() if base.network_address + n not in net]
            if not net.subnet_of(base) or bad:
                raise ValueError(f"segment {seg.name!r} {seg.cidr}: outside {base}, or "
                                 f"addresses outside it: {bad}")
        if self.segments:
            self.subnets = [ipaddress.ip_network(self.segments[0].cidr)]
        else:
            self.subnets = [ipaddress.ip_network(s) for s in SUBNETS[stack]]
        self.procs = {role: [] for role in self.roles}  # role -> [(name, Popen)]
        self.extra = {role: [] for role in {*HOSTS, *self.roles}}  # role -> more addresses
        self.built = False

    # ------------------------------------------------------------------ names and addresses
    def netns(self, role):
        return f"{self.tag}-{role}"

    def host_ip(self, n, family=None):
        """The address of host part n in each subnet (or in the one of `family`, 4 or 6)."""
        ips = [str(net.network_address + n) for net in self.subnets]
        if family is None:
            return ips
        return next(ip for ip in ips if ipaddress.ip_address(ip).version == family)

    def addresses(self, role):
        """Every address of a role, the stack's primary family first (IPv4 for dual); in a
        routed layout, its address on each segment in their order. A role without a namespace
        (`vip`) names addresses another role holds (`add_address`)."""
        return [ip for _, _, ip in self.links(role)] + self.extra[role]

    def links(self, role):
        """(bridge, interface, address) of each of a role's addresses on a network."""
        if not self.segments:
            return [(self.bridge, IFACE, ip) for ip in self.host_ip(HOSTS[role])] \
                if role in HOSTS else []
        base = ipaddress.ip_network(SUBNETS["ipv4"][0]).network_address
        return [(self.segment_bridge(seg.name), self.segment_iface(seg.name),
                 str(base + seg.hosts[role])) for seg in self.segments if role in seg.hosts]

    def segment_bridge(self, name):
        return self.bridge if name == self.segments[0].name else f"{self.tag}-br{name}"

    def segment_iface(self, name):
        return IFACE if name == self.segments[0].name else f"{name}0"

    def segment_cidr(self, name):
        return next(seg.cidr for seg in self.segments if seg.name == name)

    def ip(self, role):
        """A role's primary address."""
        return self.addresses(role)[0]

    def url_host(self, role_or_ip):
        """The host part of a URL: IPv6 literals in brackets (RFC 3986 3.2.2)."""
        ip = self.ip(role_or_ip) if role_or_ip in self.extra else role_or_ip
        return f"[{ip}]" if ":" in ip else ip

    def prefix(self, ip):
        nets = self.subnets + [ipaddress.ip_network(seg.cidr) for seg in self.segments]
        return next(n.prefixlen for n in nets if ipaddress.ip_address(ip) in n)

    def cidrs(self):
        return [str(n) for n in self.subnets]

    def dhcp_ranges(self):
        """(first, last, prefix length) per family, for a DHCP server on the bridge."""
        return [(str(n.network_address + DHCP_RANGE[0]), str(n.network_address + DHCP_RANGE[1]),
                 n.prefixlen) for n in self.subnets]  # fmt: skip

    # ------------------------------------------------------------------ build and remove
    def bridges(self):
        if not self.segments:
            return [self.bridge]
        return [self.segment_bridge(seg.name) for seg in self.segments]

    def up(self):
        """The bridges (no address, IPv6 off on them in the root namespace), then each role's
        namespace with loopback up and an interface on each of its networks holding its
        address there (no duplicate address detection: usable at once)."""
        self.built = True
        for br in self.bridges():
            _ip(["link", "add", br, "type", "bridge"], "bridge")
            # No link-local address either: the root namespace takes no part in the network.
            with open(f"/proc/sys/net/ipv6/conf/{br}/disable_ipv6", "w") as f:
                f.write("1")
            _ip(["link", "set", br, "up"], "bridge up")
        for role in self.roles:
            self._add_role(role)

    def _add_role(self, role):
        ns = self.netns(role)
        _ip(["netns", "add", ns], f"namespace {ns}")
        self.in_ns(role, ["ip", "link", "set", "lo", "up"], "loopback")
        links = {}
        for bridge, iface, ip in self.links(role):
            if iface not in links:
                outer = f"{self.tag}-{role}" + (str(len(links)) if links else "")
                _ip(["link", "add", outer, "type", "veth", "peer", "name", iface, "netns", ns],
                    f"veth of {role}")  # fmt: skip
                _ip(["link", "set", outer, "master", bridge, "up"], f"{outer} on {bridge}")
                self.in_ns(role, ["ip", "link", "set", iface, "up"], f"{iface} up")
                links[iface] = outer
            self.add_address(role, ip, record=False, iface=iface)

    def add_address(self, role, ip, record=True, iface=IFACE):
        """One more address on a role's interface (a VIP on prov0); `down` needs no record of
        it."""
        argv = ["ip", "addr", "add", f"{ip}/{self.prefix(ip)}", "dev", iface]
        if ":" in ip:
            argv.append("nodad")
        self.in_ns(role, argv, f"address {ip} on {role}")
        if record:
            self.extra[role].append(ip)

    def route(self, role, dst, via):
        """A route in a role's namespace (`default` or a CIDR) through a router's address."""
        self.in_ns(role, ["ip", "route", "add", dst, "via", via], f"route {dst} in {role}")

    def down(self):
        """Stops every process we started (newest first), then deletes the namespaces (their
        veths go with them) and the bridges. Safe to call twice and after a partial `up`."""
        for role in reversed(self.roles):
            self.stop(role)
        if not self.built:
            return
        for role in self.roles:
            _ip(["netns", "delete", self.netns(role)], "netns delete", check=False)
        for br in self.bridges():
            _ip(["link", "delete", br], "bridge delete", check=False)
        self.built = False

    # ------------------------------------------------------------------ processes
    def wrap(self, role, argv):
        """argv to run inside a role's namespace."""
        return ["ip", "netns", "exec", self.netns(role), *[str(a) for a in argv]]

    def in_ns(self, role, argv, what, timeout=60):
        """Runs argv to completion in a role's namespace (Failure when it fails)."""
        return run(self.wrap(role, argv), what, timeout=timeout)

    def start(self, role, name, argv, log_path, env=None):
        """Starts argv in a role's namespace, in its own session, output appended to log_path."""
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the child from here on
        log.write(f"==== {time.strftime('%H:%M:%S')} start {' '.join(map(str, argv))}\n".encode())
        log.flush()
        p = subprocess.Popen(self.wrap(role, argv), stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.procs[role].append((name, p))
        return p

    def started(self, role, name):
        """The newest process of that name started in a role (None if none)."""
        found = [p for n, p in self.procs[role] if n == name]
        return found[-1] if found else None

    def stop(self, role, name=None, sig=signal.SIGTERM, timeout=20, proc=None):
        """Sends sig to the process groups we started in a role (all, or those named `name`,
        or only `proc`), newest first; SIGKILL to any group alive after `timeout` s. Returns the
        seconds taken."""
        t0 = time.monotonic()
        chosen = [(n, p) for n, p in reversed(self.procs[role])
                  if name in (None, n) and proc in (None, p)]
        for _, p in chosen:
            _signal_group(p, sig)
        deadline = time.monotonic() + timeout
        for _, p in chosen:
            while _group_alive(p) and time.monotonic() < deadline:
                p.poll()
                time.sleep(0.05)
            if _group_alive(p):
                _signal_group(p, signal.SIGKILL)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs[role] = [(n, p) for n, p in self.procs[role] if (n, p) not in chosen]
        return time.monotonic() - t0

    def signal(self, role, sig):
        """Sends sig to every process group we started in a role (SIGSTOP freezes the node,
        SIGCONT thaws it)."""
        for _, p in self.procs[role]:
            _signal_group(p, sig)

    def kill(self, role, name=None):
        """SIGKILL to every process group we started in a role: the node dies as a machine
        would, nothing shuts down cleanly."""
        return self.stop(role, name, sig=signal.SIGKILL, timeout=10)

    def cut(self, role):
        """A node's addresses gone from the network, as when the machine loses power: the
        bridge side of each of its veths goes down, so what peers send to its addresses is
        never answered (their connections time out; nothing refuses them). Returns the links
        cut."""
        prefix = f"{self.tag}-{role}"
        names = [line.split(":")[1].strip().split("@")[0] for line in
                 _ip(["-o", "link", "show"], "ip link").stdout.splitlines()]
        cut = [n for n in names if n == prefix or (n.startswith(prefix) and
                                                  n[len(prefix):].isdigit())]
        for n in cut:
            _ip(["link", "set", n, "down"], f"{n} down")
        return cut

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()
        return False


def _signal_group(p, sig):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def _group_alive(p):
    p.poll()
    try:
        os.killpg(p.pid, 0)
    except ProcessLookupError:
        return False
    return True
