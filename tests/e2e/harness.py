"""Processes and files of the end-to-end test: MariaDB, dnsmasq, the ironic-proxy sidecars and
load balancer, the Ironic instances, and the readers of their logs and metrics.

Everything runs on 127.0.0.0/8 from one temporary directory. Every process is started in its
own session (setsid), so that it and its children form one process group whose id is the pid
we started; stopping signals that group only. Ironic needs this anyway: its SIGUSR2 handler
signals its whole process group (docs/e2e.md).
"""

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support/python"))
# The harnesses' h.Failure, h.run, h.wait_for and h.port_in_use are the shared package's.
from ironic_proxy_testing import ports  # noqa: E402
from ironic_proxy_testing.ports import port_in_use  # noqa: E402, F401
from ironic_proxy_testing.procs import Failure, run, wait_for  # noqa: E402, F401

IPS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
RPC_PORT = 8089  # Ironic's default [json_rpc]port; the sidecars listen on it on every instance
API_PORT = 6385
ADMIN_PORT = 9901  # sidecar admin, on the instance's own IP
LB_HOST = "127.0.0.1"
LB_PORT = 6385
SERVICE = "ironic.metal3.svc"
API_VERSION = "latest"  # the conductor field needs >= 1.49
HEADERS = {"X-OpenStack-Ironic-API-Version": API_VERSION}

# Sidecar certificates: short enough that they rotate several times during the run.
# Every ~6 s, so that each node flow (7 s or more) sees at least one renewal on every instance.
SIDECAR_VALIDITY = "12s"
SIDECAR_VALIDITY_SECONDS = 12
SIDECAR_RENEW_BEFORE = "6s"


def free_port(host="127.0.0.1"):
    """A port free for both TCP and UDP on host (dnsmasq serves both)."""
    return ports.free_port(host, udp=True)


class Procs:
    """The processes this test started, stopped by process group, newest first."""

    def __init__(self):
        self.started = []  # (name, Popen)
        self.containers = {}  # attached `podman run` (Popen) -> its container's name

    def start(self, name, argv, log_path, env=None, container=None):
        """Starts argv with its output appended to log_path. `container`: argv is an attached
        `podman run --name <container>` (tests/e2e/container.py), stopped through its client
        and removed by that name once the client is gone."""
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the child from here on
        log.write(f"==== {time.strftime('%H:%M:%S')} start {' '.join(argv)}\n".encode())
        log.flush()
        p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        self.started.append((name, p))
        if container:
            self.containers[p] = container
        return p

    @staticmethod
    def group_alive(p):
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self, p, sig=signal.SIGTERM, timeout=30, group=False):
        """Sends sig to the process (or to its whole group), waits for the whole group to exit,
        SIGKILLs the group after timeout. Returns the seconds it took."""
        start = time.monotonic()
        if p.poll() is None or self.group_alive(p):
            try:
                if group:
                    os.killpg(p.pid, sig)
                else:
                    p.send_signal(sig)
            except ProcessLookupError:
                pass
        self.wait_gone(p, start + timeout)
        self.remove_container(p)
        return time.monotonic() - start

    def remove_container(self, p):
        """The container of an attached `podman run` whose client is gone: removed (`--rm`
        did it already after a clean exit), and checked gone, so a stop is a stop."""
        name = self.containers.get(p)
        if name is None:
            return
        subprocess.run(
            ["podman", "rm", "--force", "--ignore", "--time", "0", name],
            capture_output=True,
            timeout=60,
        )
        left = subprocess.run(["podman", "container", "exists", name], capture_output=True)
        if left.returncode == 0:
            raise Failure(f"container {name} still exists after `podman rm --force`")

    def wait_gone(self, p, deadline):
        while time.monotonic() < deadline:
            p.poll()
            if p.returncode is not None and not self.group_alive(p):
                return
            time.sleep(0.05)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)

    def kill(self, p):
        """SIGKILL to the whole group: the process dies as if its machine had. A container's
        process gets it through podman first (the client does not forward SIGKILL)."""
        if p in self.containers:
            subprocess.run(
                ["podman", "kill", "--signal", "KILL", self.containers[p]],
                capture_output=True,
                timeout=60,
            )
        return self.stop(p, sig=signal.SIGKILL, timeout=10, group=True)

    def cleanup(self, first=(), last=()):
        """Stops everything still running in three waves: `first` (the load balancer), the
        others all at once, then `last` (the database Ironic needs to stop cleanly). SIGKILL
        for whatever outlives 20 s; then every container started is removed, by its name."""
        alive = [p for _, p in reversed(self.started) if p.poll() is None or self.group_alive(p)]
        middle = [p for p in alive if p not in first and p not in last]
        for wave in ([p for p in alive if p in first], middle, [p for p in alive if p in last]):
            for p in wave:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 20
            for p in wave:
                try:
                    self.wait_gone(p, deadline)
                except Exception as e:  # noqa: BLE001 - keep cleaning up the others
                    print(f"e2e: could not stop pid {p.pid}: {e}")
        for _, p in self.started:
            try:
                self.remove_container(p)
            except Exception as e:  # noqa: BLE001 - keep cleaning up the others
                print(f"e2e: could not remove container {self.containers[p]}: {e}")


# --- MariaDB -------------------------------------------------------------------------------


class MariaDB:
    """A private MariaDB: own datadir and socket, no TCP (docs/e2e.md)."""

    def __init__(self, root, procs):
        self.dir = os.path.join(root, "mysql")
        self.socket = os.path.join(root, "mysql.sock")
        self.log = os.path.join(root, "mariadb.log")
        self.procs = procs
        self.proc = None

    @property
    def url(self):
        return (
            "mysql+pymysql://ironic:ironic@localhost/ironic"
            f"?unix_socket={self.socket}&charset=utf8mb4"
        )

    def start(self):
        run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.dir}",
                "--user=root",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            "mariadb-install-db",
        )
        self.proc = self.procs.start(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                "--user=root",
                f"--datadir={self.dir}",
                f"--socket={self.socket}",
                f"--pid-file={os.path.join(self.dir, 'mariadbd.pid')}",
                "--skip-networking",
                # A test database: durability is not the point, speed on 2 cores is.
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-buffer-pool-size=128M",
                "--max-connections=500",
            ],
            self.log,
        )

        def up():
            if self.proc.poll() is not None:
                raise Failure(f"mariadbd exited with {self.proc.returncode}; see {self.log}")
            return os.path.exists(self.socket) and self.sql("SELECT 1", quiet=True)

        wait_for("MariaDB to accept connections", up, 60)
        self.sql(
            "CREATE DATABASE ironic CHARACTER SET utf8mb4;"
            "CREATE USER 'ironic'@'localhost' IDENTIFIED BY 'ironic';"
            "GRANT ALL PRIVILEGES ON ironic.* TO 'ironic'@'localhost';"
        )

    def sql(self, statement, quiet=False):
        p = subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={self.socket}", "-uroot", "-e", statement],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if p.returncode != 0:
            if quiet:
                return False
            raise Failure(f"SQL failed: {statement}: {p.stderr.strip()}")
        return True

    def connect(self):
        import pymysql  # from the Ironic virtualenv

        return pymysql.connect(
            unix_socket=self.socket,
            user="ironic",
            password="ironic",
            database="ironic",
            autocommit=True,  # every query sees the latest commits
        )


# --- dnsmasq -------------------------------------------------------------------------------


def start_dnsmasq(root, procs, port, ips):
    """The cluster DNS stand-in: A records of the headless Service, one per instance."""
    hosts = os.path.join(root, "dns-hosts")
    with open(hosts, "w") as f:
        for ip in ips:
            f.write(f"{ip} {SERVICE}\n")
    dnsmasq = "/usr/sbin/dnsmasq" if os.path.exists("/usr/sbin/dnsmasq") else "dnsmasq"
    return procs.start(
        "dnsmasq",
        [
            dnsmasq,
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            f"--addn-hosts={hosts}",
            "--local=/metal3.svc/",
            "--local-ttl=5",
            "--listen-address=127.0.0.1",
            f"--port={port}",
            "--bind-interfaces",
            "--user=root",
            f"--pid-file={os.path.join(root, 'dnsmasq.pid')}",
            "--log-facility=-",
        ],
        os.path.join(root, "dnsmasq.log"),
    )


# --- configuration files -------------------------------------------------------------------



def spread_uuids(per_conductor):
    """Node UUIDs that Ironic's hash ring (tooz, md5, 2^5 partitions, as ironic_conf configures
    it) gives `per_conductor` to each of IPS, so that a test's nodes always cross conductors:
    with random UUIDs, 3 nodes all land on one conductor 1 time in 9. Tests assert the
    conductor Ironic reports, never this guess."""
    from tooz import hashring

    ring = hashring.HashRing(IPS, partitions=2**5, hash_function="md5")
    want = {ip: per_conductor for ip in IPS}
    picked = []
    while sum(want.values()):
        u = str(uuid.uuid4())
        owner = ring.get_nodes(u.encode()).pop()
        if want[owner]:
            want[owner] -= 1
            picked.append(u)
    return picked

def sidecar_config(inst, ca_dir, peer_ips):
    """The sidecar of one instance: mutual TLS for JSON-RPC, TLS for the API, both forwarded to
    Ironic's unix sockets; identity self-issued for the instance's IP and exported for Ironic's
    JSON-RPC client. Same shape as the built-in sidecar profile (config/profiles/sidecar.toml)
    with the test's addresses, a short validity and no DNS peers (a request that came through a
    proxy only goes local)."""
    allow = ", ".join(f'"ip:{ip}/32"' for ip in peer_ips)
    return f"""# Sidecar of the Ironic instance {inst.ip} (written by tests/e2e/harness.py).
[identity]
trust = "{ca_dir}/ca.crt"
issuer_cert = "{ca_dir}/ca.crt"
issuer_key = "{ca_dir}/ca.key"
ip_addresses = ["{inst.ip}"]
validity = "{SIDECAR_VALIDITY}"
renew_before = "{SIDECAR_RENEW_BEFORE}"
export_dir = "{inst.tls_dir}"
watch_interval = "1s"

[admin]
listen = "{inst.ip}:{ADMIN_PORT}"

[limits]
drain_timeout = "5s"

[[listeners]]
name = "json-rpc"
listen = "{inst.ip}:{RPC_PORT}"
tls = "mutual"
# The three conductors, and nobody else from the same CA.
allow = [{allow}]
# Each call's method in the access log and metrics (issue 14, tests/e2e/operate_checks.py).
jsonrpc = true
upstream = "unix:{inst.rpc_sock}"

[[listeners]]
name = "api"
listen = "{inst.ip}:{API_PORT}"
tls = "server"
upstream = "unix:{inst.api_sock}"
"""


def sidecar_profile_env(inst, ca_dir, peer_ips):
    """The same sidecar as `sidecar_config`, as `ironic-proxy run --profile sidecar` builds it
    from environment variables alone (config/profiles/sidecar.toml): what a pod spec sets."""
    return {
        "POD_NAME": "ironic-" + inst.ip.rsplit(".", 1)[1],
        "POD_NAMESPACE": "metal3",
        "POD_IPS": inst.ip,
        "IRONIC_PROXY_PEER_CIDRS": ",".join(f"{ip}/32" for ip in peer_ips),
        "IRONIC_PROXY_TRUST": f"{ca_dir}/ca.crt",
        "IRONIC_PROXY_ISSUER_DIR": ca_dir,
        "IRONIC_PROXY_CERT_VALIDITY": SIDECAR_VALIDITY,
        "IRONIC_PROXY_CERT_RENEW_BEFORE": SIDECAR_RENEW_BEFORE,
        "IRONIC_PROXY_EXPORT_DIR": inst.tls_dir,
        "IRONIC_PROXY_WATCH_INTERVAL": "1s",
        "IRONIC_PROXY_ADMIN_LISTEN": f"{inst.ip}:{ADMIN_PORT}",
        "IRONIC_PROXY_DRAIN_TIMEOUT": "5s",
        "IRONIC_PROXY_BIND": inst.ip,
        "IRONIC_PROXY_RPC_PORT": str(RPC_PORT),
        "IRONIC_PROXY_API_PORT": str(API_PORT),
        "IRONIC_PROXY_RPC_SOCKET": inst.rpc_sock,
        "IRONIC_PROXY_API_SOCKET": inst.api_sock,
        # A request that came through a proxy only goes local, as in sidecar_config.
        "IRONIC_PROXY_PEERS": "none",
        # sidecar_config's API has no [listeners.auth]: a profile must be told so (it refuses
        # to serve the API without IRONIC_PROXY_HTPASSWD). auth_e2e.py sets the htpasswd file.
        "IRONIC_PROXY_HTPASSWD": "none",
    }


def lb_config(ca_dir, admin_port, dns_port, host=LB_HOST):
    """The DaemonSet-style load balancer: peers from DNS only, TLS to them. `host`: its address
    (the scale e2e runs on addresses of its own)."""
    return f"""# DaemonSet-style load balancer (written by tests/e2e/harness.py).
[identity]
trust = "{ca_dir}/ca.crt"
issuer_cert = "{ca_dir}/ca.crt"
issuer_key = "{ca_dir}/ca.key"
ip_addresses = ["{host}"]
validity = "1h"

[admin]
listen = "127.0.0.1:{admin_port}"

[dns]
servers = ["127.0.0.1:{dns_port}"]
refresh = "2s"

[limits]
drain_timeout = "5s"

[[listeners]]
name = "api"
listen = "{host}:{LB_PORT}"
tls = "server"

[listeners.upstream]
dns = "{SERVICE}:{API_PORT}"
tls = true
balance = "least_request"
# The health settings of the built-in balancer profile (config/profiles/balancer.toml).
health = {{ path = "/", interval = "2s", timeout = "1s", unhealthy_after = 2, healthy_after = 1 }}
"""


def ironic_conf(inst, db_url):
    """ironic.conf of one all-in-one instance (docs/e2e.md, with the short timers)."""
    fake_and_none = ["bios", "console", "firmware", "inspect", "raid", "rescue", "vendor"]
    lines = "\n".join(f"enabled_{i}_interfaces = fake,no-{i}" for i in fake_and_none)
    return f"""[DEFAULT]
host = {inst.ip}
my_ip = {inst.ip}
auth_strategy = noauth
rpc_transport = json-rpc
hash_ring_reset_interval = 5
hash_partition_exponent = 5
hash_ring_algorithm = md5
enabled_hardware_types = fake-hardware
enabled_boot_interfaces = fake
enabled_deploy_interfaces = fake
enabled_management_interfaces = fake
enabled_power_interfaces = fake
{lines}
enabled_network_interfaces = noop
enabled_storage_interfaces = noop
debug = False

[api]
unix_socket = {inst.api_sock}
# 0660: a sidecar of the ironic user's group can connect (the one from the image, 997:994, in
# a setgid directory of group 994; tests/e2e/container.py), as in ironic-image's pod.
unix_socket_mode = 0660
public_endpoint = https://{inst.ip}:{API_PORT}

[json_rpc]
auth_strategy = noauth
unix_socket = {inst.rpc_sock}
unix_socket_mode = 0660
port = {RPC_PORT}
client_use_ssl = True
cafile = {inst.tls_dir}/ca.crt
certfile = {inst.tls_dir}/tls.crt
keyfile = {inst.tls_dir}/tls.key

[conductor]
heartbeat_interval = 2
heartbeat_timeout = 10
sync_local_state_interval = 5
check_provision_state_interval = 5

[dhcp]
dhcp_provider = none

[database]
connection = {db_url}
"""


class Instance:
    """One Ironic instance (all-in-one) and its sidecar, on its own loopback IP."""

    def __init__(self, root, ip):
        self.ip = ip
        self.dir = os.path.join(root, "i" + ip.rsplit(".", 1)[1])
        os.makedirs(self.dir)
        self.tls_dir = os.path.join(self.dir, "tls")
        self.api_sock = os.path.join(self.dir, "api.sock")
        self.rpc_sock = os.path.join(self.dir, "rpc.sock")
        self.conf = os.path.join(self.dir, "ironic.conf")
        self.sidecar_conf = os.path.join(self.dir, "sidecar.toml")
        # When set: the sidecar runs `--profile sidecar` with these variables, no file.
        self.profile_env = None
        self.sidecar_log = os.path.join(self.dir, "sidecar.log")
        self.ironic_log = os.path.join(self.dir, "ironic.log")
        self.sidecar = None
        self.ironic = None

    @property
    def api_url(self):
        return f"https://{self.ip}:{API_PORT}"

    @property
    def admin_url(self):
        return f"http://{self.ip}:{ADMIN_PORT}"


# --- metrics, certificates and logs --------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(admin_url):
    """The Prometheus text of an admin listener as [(name, {labels}, value)]."""
    r = requests.get(admin_url + "/metrics", timeout=5)
    r.raise_for_status()
    out = []
    for line in r.text.splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(3) or ""))
            out.append((m.group(1), labels, float(m.group(4))))
    return out


def metric(samples, name, **labels):
    return sum(
        v for n, ls, v in samples if n == name and all(ls.get(k) == w for k, w in labels.items())
    )


def cert_serial(path):
    """Serial number (hex) of the first certificate in a PEM file."""
    from cryptography import x509  # from the Ironic virtualenv

    with open(path, "rb") as f:
        return format(x509.load_pem_x509_certificate(f.read()).serial_number, "x")


def proxy_events(log_path):
    """The JSON log events of one ironic-proxy log file (across restarts: it is appended)."""
    events = []
    with open(log_path, errors="replace") as f:
        for line in f:
            if not line.startswith("{"):
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def event_time(e):
    """Seconds since the epoch of a JSON log event's timestamp."""
    return datetime.datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()


def tail(path, lines=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"({e})"


# --- egress (issue 34): Ironic's JSON-RPC client without TLS ---------------------------------

EGRESS_PORT = 8090  # the sidecar's egress listener, on the instance's own loopback IP
EGRESS_USER = "ironic-rpc"
# A fake ramdisk agent (tests/e2e/ironic_e2e.py, --egress): an address that is no conductor's,
# inside the peers' CIDR (PEER_CIDR) as Metal3's agents are inside the conductors' subnet.
AGENT_IP = "127.0.0.5"
AGENT_PORT = 9999
PEER_CIDR = "127.0.0.0/29"
# An image server outside every target.
IMAGE_IP = "127.0.0.9"


def egress_listener(inst, peer_ips, credentials):
    """The egress listener appended to `sidecar_config`: the same as the built-in profile's
    (config/profiles/sidecar.toml) with the test's addresses, the peers' CIDR among them, and
    `others = "relay"` as the profile sets it."""
    targets = ", ".join([f'"{ip}/32"' for ip in peer_ips] + [f'"{PEER_CIDR}"'])
    return f"""
[[listeners]]
name = "json-rpc-egress"
listen = "{inst.ip}:{EGRESS_PORT}"
tls = "none"
jsonrpc = true
[listeners.egress]
credentials = "{credentials}"
targets = ["*.ironic.metal3.svc", {targets}]
ports = [{RPC_PORT}]
others = "relay"
"""


def egress_profile_env(inst, credentials):
    """What `sidecar_profile_env` adds for the profile's egress listener."""
    return {
        "IRONIC_PROXY_EGRESS_CREDENTIALS": credentials,
        "IRONIC_PROXY_EGRESS_LISTEN": f"{inst.ip}:{EGRESS_PORT}",
    }


def egress_ironic_conf(conf):
    """`ironic_conf` for egress: plain HTTP to the peers (through HTTP_PROXY), and no
    certificate, key or CA for Ironic to read."""
    out = []
    for line in conf.splitlines():
        if line.startswith(("cafile", "certfile", "keyfile")):
            continue
        out.append("client_use_ssl = False" if line.startswith("client_use_ssl") else line)
    return "\n".join(out) + "\n"


def egress_env(inst, password):
    """Ironic's environment for egress, as the kit sets it: keystoneauth (JSON-RPC) and requests
    send every http:// URL to HTTP_PROXY; no_proxy names loopback only (127.0.0.1, not the
    conductors' 127.0.0.2-4), and the egress relays what is not JSON-RPC."""
    no_proxy = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": f"http://{EGRESS_USER}:{password}@{inst.ip}:{EGRESS_PORT}",
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }
