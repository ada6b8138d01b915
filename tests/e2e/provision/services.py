"""The shared services of the provisioning network, in the `svc` namespace: MariaDB on the
bridge, the cluster DNS stand-in (the headless Service's A/AAAA records), the deploy ramdisk's
URL (quickstart.serve_ipa) and the API load balancer on the VIP (`ironic-proxy run --profile
balancer`); and the one DHCP server, the kit's, on cp1."""

import os
import subprocess

from ironic_proxy_testing.procs import Failure, run, wait_for

from .kit import API_PORT, NAMESPACE, wait_listening

SERVICE = f"ironic.{NAMESPACE}.svc.cluster.local"


def start_mariadb(topo, tmp, password=None, admin=None):
    """MariaDB listening on the svc address (Ironic connects over TCP as a pod would), root
    through its socket only. With `password`: Ironic's database and account made here; with
    `admin` ((user, password)): an administrator reachable over TCP instead, the existing
    MariaDB the quick start's database Job logs in to."""
    datadir, sock = os.path.join(tmp, "mysql"), os.path.join(tmp, "mysql.sock")
    run(["mariadb-install-db", "--no-defaults", f"--datadir={datadir}", "--user=root",
         "--auth-root-authentication-method=socket", "--skip-test-db"], "mariadb-install-db")
    # Dual stack: both addresses (a list, MariaDB 10.11 and later). `::` listened on IPv6
    # only here, and Ironic's IPv4 connection was refused.
    bind = ",".join(topo.addresses("svc"))
    topo.start("svc", "mariadbd", [
        "mariadbd", "--no-defaults", "--user=root", f"--datadir={datadir}", f"--socket={sock}",
        f"--bind-address={bind}", "--port=3306", "--skip-name-resolve",
        f"--pid-file={datadir}/mariadbd.pid", "--innodb-flush-log-at-trx-commit=2",
        "--innodb-buffer-pool-size=128M", "--max-connections=500"],
        os.path.join(tmp, "svc-mariadb.log"))

    def sql(statement):
        return subprocess.run(["mariadb", "--no-defaults", f"--socket={sock}", "-uroot", "-e",
                               statement], capture_output=True, text=True, timeout=30)
    wait_for("MariaDB", lambda: sql("SELECT 1").returncode == 0, 60)
    if admin:
        done = sql(f"CREATE USER '{admin[0]}'@'%' IDENTIFIED BY '{admin[1]}';"
                   f"GRANT ALL ON *.* TO '{admin[0]}'@'%' WITH GRANT OPTION;")
    else:
        done = sql("CREATE DATABASE ironic CHARACTER SET utf8mb4;"
                   f"CREATE USER 'ironic'@'%' IDENTIFIED BY '{password}';"
                   "GRANT ALL PRIVILEGES ON ironic.* TO 'ironic'@'%';")
    if done.returncode != 0:
        raise Failure(f"MariaDB setup: {done.stderr.strip()}")
    return sock


def db_reader(sock):
    """A function running one SELECT as MariaDB's root (its socket) on Ironic's database:
    the rows as tuples of strings, NULL as None."""
    def query(statement):
        out = subprocess.run(["mariadb", "--no-defaults", f"--socket={sock}", "-uroot",
                              "--batch", "--skip-column-names", "ironic", "-e", statement],
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise Failure(f"MariaDB: {statement}: {out.stderr.strip()}")
        return [tuple(None if v == "NULL" else v for v in line.split("\t"))
                for line in out.stdout.splitlines()]
    return query


def start_dns(topo, tmp, pods=None):
    """dnsmasq as the cluster DNS on svc:53: the headless Service's records (every node's
    addresses) and, given `pods` ({role: pod name}, a StatefulSet's), each pod's own record
    <pod>.<service>.<namespace>.svc.<domain>; SIGHUP after rewriting the hosts file changes
    them."""
    hosts = os.path.join(tmp, "dns-hosts")
    with open(hosts, "w") as f:
        for role in ("cp1", "cp2", "cp3"):
            for ip in topo.addresses(role):
                f.write(f"{ip} {SERVICE}\n")
                if pods:
                    f.write(f"{ip} {pods[role]}.{SERVICE}\n")
    topo.start("svc", "dns", [
        "dnsmasq", "--keep-in-foreground", "--no-daemon", "--conf-file=/dev/null", "--port=53",
        f"--listen-address={topo.ip('svc')}", "--bind-interfaces", "--no-resolv",
        "--no-hosts", f"--addn-hosts={hosts}", "--local=/svc.cluster.local/",
        "--local-ttl=5", "--log-queries", "--user=root"], os.path.join(tmp, "svc-dns.log"))
    return hosts


DHCP_NODE = "cp1"


def start_dhcp(kit):
    """The one dnsmasq: the quick start's Deployment ironic-dnsmasq (components/dhcp) on a
    control-plane node's host network (cp1: the iPXE script URL is its own boot route, and the
    owner-kill fault never takes cp1): ironic-image's rundnsmasq, as user 997 with the file
    capabilities the image gives dnsmasq."""
    pod = kit.pod(DHCP_NODE, obj=kit.deployment("ironic-dnsmasq"))
    return kit.container(DHCP_NODE, "dnsmasq", pod=pod)


def balancer_env(topo, tmp, kit):
    return {**os.environ, "POD_NAMESPACE": NAMESPACE, "POD_IPS": topo.ip("svc"),
            "IRONIC_PROXY_API_VIPS": ",".join(topo.addresses("vip")),
            "IRONIC_PROXY_PEER_API_PORT": str(API_PORT),
            "IRONIC_PROXY_HTPASSWD": os.path.join(tmp, "htpasswd"),
            "IRONIC_PROXY_ISSUER_DIR": kit.lb_ca,
            "IRONIC_PROXY_TRUST": os.path.join(kit.lb_trust, "ca.crt"),
            "IRONIC_PROXY_DNS_SERVERS": f"{topo.url_host('svc')}:53",
            "IRONIC_PROXY_ADMIN_LISTEN": f"{topo.url_host('svc')}:9902",
            "IRONIC_PROXY_METRICS_TOKEN_FILE": "none",
            "RUST_LOG": "info"}


# From accept to the first request head, TLS handshake included: the profile's 10 s is too
# short for IPA under TCG on cores shared with five other test runs (seen: the handshake of its
# reachability probe cut at 10 s, and IPA exiting with "could not find a valid IP address").
# Profiles have no variable for it, so the balancer runs its profile written out by `check`.
HEAD_TIMEOUT = "120s"


def start_balancer(topo, tmp, kit, binary, successor=False):
    """The API's front door on the VIP: the `balancer` profile (its peers from the DNS
    records, TLS to them, Basic auth) as `ironic-proxy check --profile balancer` prints it,
    with a longer request_head_timeout. `successor`: another balancer already serves there;
    this one binds beside it (the profile's limits.handover) and is waited for by its own
    `ready` in the shared log."""
    env = balancer_env(topo, tmp, kit)
    effective = run(topo.wrap("svc", [binary, "check", "--profile", "balancer"]),
                    "balancer check", env=env).stdout  # fmt: skip
    if 'request_head_timeout = "10s"' not in effective:
        raise Failure("balancer profile: no request_head_timeout of 10s to replace")
    conf = os.path.join(tmp, "balancer.toml")
    with open(conf, "w") as f:
        f.write(effective.replace('request_head_timeout = "10s"',
                                  f'request_head_timeout = "{HEAD_TIMEOUT}"'))
    run(topo.wrap("svc", [binary, "check", "--config", conf]), "balancer check --config",
        env=env)  # fmt: skip
    if "handover = true" not in effective:
        raise Failure("balancer profile: no limits.handover")
    log = os.path.join(tmp, "svc-balancer.log")
    p = topo.start("svc", "balancer", [binary, "--log-format", "json", "run", "--config", conf],
                   log, env=env)
    if successor:
        def ready():
            if p.poll() is not None:
                raise Failure(f"the new balancer exited ({p.returncode}); see {log}")
            text = open(log, errors="replace").read()
            return '"ready"' in text[text.rfind("==== "):]
        wait_for("the new balancer to be ready beside the old one", ready, 60, interval=0.2)
    else:
        wait_listening(topo, "svc", API_PORT, what="the balancer")
    return p
