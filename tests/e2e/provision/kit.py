"""The standalone kit (config/k8s/standalone + components/boot-files) on the nodes of a
topology, or the statefulset kit (config/k8s/statefulset: one pod of the StatefulSet per
namespace on a pod network), started the way scripts/check-entrypoints starts it (the rendered
workload's environment, volumes, users and ironic-image's own entrypoint scripts in a private
root), but with the real long-running programs in each node's network namespace:

- `ironic`, `ironic-dbsync`: Ironic from PyPI (a virtualenv bound into the root);
- `ironic-proxy run`: the sidecar, from the binary under test;
- `httpd`: the boot file server on HTTP_PORT serving /shared/html, as ironic-image's httpd does
  (runhttpd renders its files first; tests/e2e/static_httpd.py then serves them: Apache's
  CentOS configuration does not run on Debian).

The site overlay an operator writes is applied to the rendered objects: the peer CIDRs, the
database host, the sidecar's boot-TLS file (virtual media over TLS), the API's public address
(the balancer's VIP: what IPA calls) and the kernel's console. For the statefulset kit: the pod
network as the peer CIDRs, the LoadBalancer address as IRONIC_PROXY_API_VIPS (the manifest's
own command turns it into every URL a BMC or a ramdisk is given), and each pod's name
(ironic-0, -1, -2) and resolv.conf as kubelet writes them (the cluster DNS, its search path).
"""

import base64
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

from ironic_proxy_testing import upstream
from ironic_proxy_testing.procs import Failure, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
NAMESPACE = "metal3"
HTTP_PORT = 6180
API_PORT = 6385
VMEDIA_TLS_PORT = 6183
CLUSTER_DOMAIN = "cluster.local"


def check_entrypoints():
    """scripts/check-entrypoints as a module: render(), Pod, Sandbox and the recorders."""
    path = os.path.join(ROOT, "scripts", "check-entrypoints")
    loader = importlib.machinery.SourceFileLoader("check_entrypoints", path)
    spec = importlib.util.spec_from_loader("check_entrypoints", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def applied_secrets(objs):
    """{Secret name: {key: bytes}} of the applied objects (data base64, stringData text)."""
    out = {}
    for o in objs:
        if o["kind"] == "Secret":
            d = {k: base64.b64decode(v) for k, v in (o.get("data") or {}).items()}
            d.update({k: v.encode() for k, v in (o.get("stringData") or {}).items()})
            out[o["metadata"]["name"]] = d
    return out


def env_set(c, name, value):
    """Sets (or replaces) one environment variable of a container spec."""
    env = c.setdefault("env", [])
    env[:] = [e for e in env if e["name"] != name]
    env.append({"name": name, "value": value})


class Kit:
    def __init__(self, topo, tmp, proxy_bin, ironic_venv, password, egress, ca_dir,
                 ca_next_dir=None, variant="standalone", lb=None, nodes=("cp1", "cp2", "cp3"),
                 dns=None, objs=None):
        """variant statefulset: `lb` the LoadBalancer address, `nodes` the roles holding the
        pods ironic-0, -1, -2 in that order, `dns` the cluster DNS server's address.
        `objs`: what the quick start applied (quickstart.render), Secrets included; the kit is
        then those objects, and `password` and `egress` are not used."""
        self.ce = check_entrypoints()
        self.variant, self.lb, self.nodes, self.dns = variant, lb, list(nodes), dns
        self.topo, self.tmp, self.bin = topo, tmp, proxy_bin
        self.venv = ironic_venv
        self.src = upstream.tree("ironic-image")
        sb_dir = os.path.join(tmp, "sandbox")
        os.makedirs(sb_dir)
        os.chmod(sb_dir, 0o755)
        self.sb = self.ce.Sandbox(sb_dir, self.src, proxy_bin)
        self.sb.binds += [ironic_venv, os.path.join(ROOT, "tests", "e2e")]
        self._real_programs(sb_dir)
        # The operator CA: given (the deploy ramdisk is built with its certificate inside, so
        # it outlives a run), copied so that a rotation in the run changes only the copy.
        self.ca = os.path.join(tmp, "ca")
        shutil.copytree(ca_dir, self.ca)
        # The CA a rotation switches to (docs/operate.md "Rotate the CA"), made beforehand: the
        # deploy ramdisk is built with both certificates (scripts/e2e-provision says why).
        self.ca_next = None
        if ca_next_dir:
            self.ca_next = os.path.join(tmp, "ca-next")
            shutil.copytree(ca_next_dir, self.ca_next)
        # What API clients outside the pods trust (the harness, sushy-tools fetching virtual
        # media): one file, rewritten in place by a rotation.
        self.client_ca = os.path.join(tmp, "clients-ca.crt")
        shutil.copyfile(os.path.join(self.ca, "ca.crt"), self.client_ca)
        self.password, self.egress = password, egress
        self.quickstart = objs is not None
        self.secrets = applied_secrets(objs) if objs else self._secrets()
        if self.quickstart:
            ca_pem = self.secrets["ironic-proxy-ca"]["ca.crt"]
            if ca_pem != open(os.path.join(self.ca, "ca.crt"), "rb").read():
                raise Failure("the quick start's Secret ironic-proxy-ca is not the run's CA")
            with open(os.path.join(tmp, "htpasswd"), "wb") as f:
                f.write(self.secrets["ironic-htpasswd"]["htpasswd"])
        # The balancer's mounts of the Secret ironic-proxy-ca (as the DaemonSet mounts it): the
        # issuer directory and the trust bundle (key ca-bundle.crt as ca.crt).
        self.lb_ca = os.path.join(tmp, "lb", "ca")
        self.lb_trust = os.path.join(tmp, "lb", "trusted")
        self._lb_volumes(self.secrets["ironic-proxy-ca"])
        if objs:
            self.objs = objs
        elif variant == "statefulset":
            self.objs = self.ce.render(os.path.join(ROOT, "config", "k8s", "statefulset"))
        else:
            self.objs = self.ce.render(os.path.join(ROOT, "config", "k8s", "standalone"),
                                       ["../components/boot-files"])
        self.cms = {o["metadata"]["name"]: o for o in self.objs if o["kind"] == "ConfigMap"}
        if variant == "statefulset":
            self._site_statefulset()
        else:
            self._site()
        self.pods = {}

    # ------------------------------------------------------------------ the image, real
    def _real_programs(self, sb_dir):
        """The image layer's recorders replaced by the real programs."""
        layer = os.path.join(sb_dir, "layer-ironic-image")
        static = os.path.join(ROOT, "tests", "e2e", "static_httpd.py")
        progs = {
            "usr/bin/ironic": f'exec {self.venv}/bin/ironic "$@"',
            "usr/bin/ironic-dbsync": f'exec {self.venv}/bin/ironic-dbsync "$@"',
            # runhttpd has rendered inspector.ipxe into /shared/html: serve that root.
            "usr/sbin/httpd": f'exec /usr/bin/python3 {static} "$HTTP_PORT" --bind "::" '
                              '--directory /shared/html',
        }
        # ironic-image's [DEFAULT]isolinux_bin (CentOS's path): Debian's isolinux, for the
        # virtual media ISO of a BIOS host.
        iso = os.path.join(layer, "usr/share/syslinux/isolinux.bin")
        os.makedirs(os.path.dirname(iso), exist_ok=True)
        shutil.copyfile("/usr/lib/ISOLINUX/isolinux.bin", iso)
        # The image's iPXE binaries (from metal3-io/ipxe-binaries, copied to /tftpboot by its
        # Dockerfile): Debian's builds, which rundnsmasq copies into /shared/tftpboot.
        for src, name in (("undionly.kpxe", "undionly.kpxe"),
                          ("snponly.efi", "snponly-x86_64.efi")):
            shutil.copyfile(f"/usr/lib/ipxe/{src}", os.path.join(layer, "tftpboot", name))
        # dnsmasq: Debian's, in place of the recorder, with the file capabilities ironic-image
        # gives it (configure-nonroot.sh: setcap cap_net_raw,cap_net_admin,
        # cap_net_bind_service=+eip), which the DHCP component's user 997 needs for ports 67
        # and 69 (a container runtime gives a non-root process no added capability itself).
        dnsmasq = os.path.join(layer, "usr/sbin/dnsmasq")
        os.unlink(dnsmasq)
        shutil.copyfile("/usr/sbin/dnsmasq", dnsmasq)
        os.chmod(dnsmasq, 0o755)
        subprocess.run(["setcap", "cap_net_raw,cap_net_admin,cap_net_bind_service=+eip",
                        dnsmasq], check=True)
        for rel, body in progs.items():
            path = os.path.join(layer, rel)
            with open(path, "w") as f:
                f.write(f"#!/bin/sh\n{body}\n")
            os.chmod(path, 0o755)

    def _secrets(self):
        """The Secrets docs/install.md has an operator create, for this topology."""
        read = lambda p: open(p, "rb").read()
        ht = subprocess.run(["htpasswd", "-nbB", "admin", self.password], check=True,
                            capture_output=True, text=True).stdout.strip().encode() + b"\n"
        with open(os.path.join(self.tmp, "htpasswd"), "wb") as f:
            f.write(ht)
        ca = {"ca.crt": read(f"{self.ca}/ca.crt"), "ca.key": read(f"{self.ca}/ca.key"),
              "ca-bundle.crt": read(f"{self.ca}/ca.crt")}
        db = {"username": b"ironic", "password": self.password.encode()}
        return {"ironic-proxy-ca": ca, "ironic-mariadb": db,
                "ironic-proxy-egress": {"credentials": self.egress.encode()},
                "ironic-proxy-metrics": {"token": b"e2e-provision-metrics\n"},
                "ironic-htpasswd": {"htpasswd": ht}}

    def api_auth(self):
        """(user, password) of the API: the Secret baremetal-operator reads (quick start), else
        the run's own."""
        if self.quickstart:
            c = self.secrets["ironic-credentials"]
            return c["username"].decode().strip(), c["password"].decode().strip()
        return "admin", self.password

    def _site(self):
        """The operator's overlay on the rendered kit: the site facts (given by the quick
        start's first command already, for IPv4), then what the run needs of its containers."""
        vip = self.topo.url_host("vip")
        if not self.quickstart or self.topo.stack != "ipv4":
            self._site_facts()
        self._containers_overlay(vip)

    def _site_facts(self):
        site = self.cms["ironic-proxy-site"]["data"]
        site["IRONIC_PROXY_PEER_CIDRS"] = ",".join(self.topo.cidrs())
        # The site facts of config/k8s/common/site.yaml for this topology: every sidecar's
        # certificate carries the VIP, which the CA's constraints must cover.
        site["IRONIC_PROXY_API_VIPS"] = ",".join(self.topo.addresses("vip"))
        site["IRONIC_PROXY_NODE_ADDRESSES"] = ",".join(
            ip for r in ("cp1", "cp2", "cp3") for ip in self.topo.addresses(r))
        site["IRONIC_PROXY_PROVISIONING_CIDRS"] = ",".join(self.topo.cidrs())
        site["DHCP_RANGE"] = ";".join(
            f"{a},{b},{'255.255.255.0' if p == 24 else p}" for a, b, p in self.topo.dhcp_ranges())
        site["MARIADB_HOST"] = self.topo.url_host("svc")
        site["RUST_LOG"] = "info"

    def _containers_overlay(self, vip):
        ds = self.daemonset()
        for c in self.ce.containers(ds):
            if c["name"] == "ironic-proxy":
                env_set(c, "IRONIC_PROXY_CONFIG", "/etc/ironic-proxy/sidecar-boot-tls.toml")
                env_set(c, "IRONIC_PROXY_DNS_SERVERS", f"{self.topo.url_host('svc')}:53")
                env_set(c, "VMEDIA_TLS_PORT", str(VMEDIA_TLS_PORT))
                # Metrics for the per-path counts: the file has no token option.
                env_set(c, "IRONIC_PROXY_ADMIN_LISTEN", "[::]:9901")
            if c["name"] == "httpd":
                # Its inspector.ipxe boots inspection as ironic.conf boots the rest: the
                # ramdisk's console on the serial port, no LLDP wait (as for `ironic` below).
                env_set(c, "IRONIC_KERNEL_PARAMS", "console=ttyS0,115200")
                env_set(c, "IRONIC_IPA_COLLECT_LLDP", "0")
            if c["name"] == "ironic":
                # What IPA calls for lookup and heartbeats ([service_catalog]
                # endpoint_override): the balancer's VIP, verified against the CA in the
                # ramdisk (no ipa-insecure).
                env_set(c, "IRONIC_BASE_URL", f"https://{vip}:{API_PORT}")
                # An IPv6 literal goes in brackets (RFC 3986): Kubernetes' $(VAR) expansion
                # and ironic-image's own default (configure-ironic.sh, IRONIC_EXTERNAL_IP)
                # add none, and Ironic refuses the option without them.
                pod_ip = "[$(PROVISIONING_IP)]" if self.topo.stack == "ipv6" else \
                    "$(PROVISIONING_IP)"
                env_set(c, "IRONIC_EXTERNAL_HTTP_URL", f"https://{pod_ip}:{VMEDIA_TLS_PORT}")
                env_set(c, "IRONIC_KERNEL_PARAMS", "console=ttyS0,115200")
                env_set(c, "IPA_FORWARD_CONSOLE", "yes")
                # Ironic 39's default `[agent] require_tls = true` refuses an agent that
                # serves plain HTTP; host-b's does (enrolled with ipa-enable-auto-tls=0), so
                # that Ironic's commands to it take the egress relay. host-a's agent keeps
                # automatic TLS. An oslo.config environment override, as IrSO's extraConfig.
                env_set(c, "OS_AGENT__REQUIRE_TLS", "false")
                # No LLDP on the bridge: IPA's inspection would wait 30 s for it three times.
                env_set(c, "IRONIC_IPA_COLLECT_LLDP", "0")
                # One API worker per instance (ironic-image: 0 = one per CPU): three instances
                # and the VMs share two cores.
                env_set(c, "NUMWORKERS", "1")

    def _site_statefulset(self):
        """The operator's overlay on the statefulset kit: the pod network, the LoadBalancer
        address and the database; for the run, what `_site` sets for the ramdisk and for
        Ironic's commands to a plain-HTTP agent."""
        site = self.cms["ironic-proxy-site"]["data"]
        site["IRONIC_PROXY_PEER_CIDRS"] = ",".join(self.topo.cidrs())
        site["IRONIC_PROXY_API_VIPS"] = self.lb
        site["MARIADB_HOST"] = self.topo.ip("svc")
        site["RUST_LOG"] = "info"
        for c in self.ce.containers(self.workload()):
            if c["name"] == "httpd":
                env_set(c, "IRONIC_KERNEL_PARAMS", "console=ttyS0,115200")
                env_set(c, "IRONIC_IPA_COLLECT_LLDP", "0")
            if c["name"] == "ironic":
                env_set(c, "IRONIC_KERNEL_PARAMS", "console=ttyS0,115200")
                env_set(c, "IPA_FORWARD_CONSOLE", "yes")
                env_set(c, "OS_AGENT__REQUIRE_TLS", "false")
                env_set(c, "IRONIC_IPA_COLLECT_LLDP", "0")
                env_set(c, "NUMWORKERS", "1")

    def daemonset(self):
        return next(o for o in self.objs if o["kind"] == "DaemonSet"
                    and o["metadata"]["name"] == "ironic")

    def workload(self):
        """The Ironic pods' workload: the DaemonSet, or the StatefulSet."""
        kind = "StatefulSet" if self.variant == "statefulset" else "DaemonSet"
        return next(o for o in self.objs if o["kind"] == kind
                    and o["metadata"]["name"] == "ironic")

    def pod_name(self, role):
        """A StatefulSet pod's name (ironic-<ordinal>), None for a DaemonSet's."""
        if self.variant != "statefulset" or role not in self.nodes:
            return None
        return f"ironic-{self.nodes.index(role)}"

    def conductor(self, role):
        """The conductor's [DEFAULT]host on a node: its address, or its pod's DNS name."""
        name = self.pod_name(role)
        return f"{name}.ironic.{NAMESPACE}.svc" if name else self.topo.ip(role)

    def resolv_conf(self):
        """/etc/resolv.conf as kubelet writes it for a pod of dnsPolicy ClusterFirst
        (pkg/kubelet/network/dns/dns.go): the cluster DNS, the namespace's search path,
        ndots:5."""
        return (f"search {NAMESPACE}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} "
                f"{CLUSTER_DOMAIN}\nnameserver {self.dns}\noptions ndots:5\n")

    def fam(self, role):
        ips = self.topo.addresses(role)
        fam = {"host": ips[0], "pod": ips[0], "prefix": self.topo.prefix(ips[0])}
        if len(self.topo.subnets) == 2:
            fam.update(host6=ips[1], pod6=ips[1])
        return fam

    def pod(self, role, obj=None):
        """The DaemonSet's pod on a node: its volumes on disk, kept for the node's life (a
        restarted container finds its emptyDirs as kubelet keeps them)."""
        if obj is None and role in self.pods:
            return self.pods[role]
        pod = self.ce.Pod(self.tmp, role, obj or self.workload(), self.fam(role), self.cms,
                          self.secrets, name=None if obj else self.pod_name(role))
        if obj is None:
            self.pods[role] = pod
        return pod

    def shared(self, role):
        """The node's /shared (the emptyDir ironic-shared) on the host."""
        return os.path.join(self.pod(role).dir, "vol", "ironic-shared")

    def export_dir(self, role):
        return os.path.join(self.pod(role).dir, "vol", "ironic-proxy-tls")

    # ------------------------------------------------------------------ Secret updates
    def _lb_volumes(self, ca):
        atomic_volume(self.lb_ca, {k: ca[k] for k in ("ca.crt", "ca.key", "ca-bundle.crt")},
                      0o440)
        atomic_volume(self.lb_trust, {"ca.crt": ca["ca-bundle.crt"]}, 0o440)

    def update_ca_secret(self, issuer_dir, bundle_pem):
        """docs/operate.md's `update ISSUER_DIR BUNDLE_FILE`: the Secret ironic-proxy-ca with
        that issuer and bundle, brought to every pod that mounts it as kubelet does (each
        volume's files swapped at once), the balancer's mounts included."""
        read = lambda p: open(p, "rb").read()
        ca = {"ca.crt": read(f"{issuer_dir}/ca.crt"), "ca.key": read(f"{issuer_dir}/ca.key"),
              "ca-bundle.crt": bundle_pem}
        self.secrets["ironic-proxy-ca"] = ca
        for pod in self.pods.values():
            for name, v in pod.volumes.items():
                src = v.get("secret") or {}
                if src.get("secretName") != "ironic-proxy-ca":
                    continue
                items = src.get("items") or [{"key": k, "path": k} for k in ca]
                atomic_volume(os.path.join(pod.dir, "vol", name),
                              {it["path"]: ca[it["key"]] for it in items},
                              src.get("defaultMode", 0o644), pod.fs_group)
        self._lb_volumes(ca)

    def set_client_ca(self, pem):
        """What the API clients outside the pods trust, replaced in one rename."""
        tmp = self.client_ca + ".new"
        with open(tmp, "wb") as f:
            f.write(pem)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.client_ca)

    # ------------------------------------------------------------------ running containers
    def container(self, role, name, pod=None, env_extra=None, pre_extra=()):
        """Starts one container of the node's pod in the node's namespace (a long-running
        process of the topology, named after the container)."""
        pod = pod or self.pod(role)
        c = next(c for c in self.ce.containers(pod.obj) if c["name"] == name)
        env = dict(pod.env(c), **(env_extra or {}))
        if "ironic-proxy" in c.get("image", ""):
            argv = ["/usr/local/bin/ironic-proxy", *c.get("args", [])]
        else:
            argv = self.ce.container_argv(c, env)
        rec = tempfile.mkdtemp(prefix="rec.", dir=pod.dir)
        pre = ()
        if self.dns and not pod.host_net:
            # Inside the container's root, before it starts (the root is read-only after).
            conf = self.resolv_conf().replace("\n", "\\n")
            # A fresh file, never through a link the copied /etc may hold.
            pre = [f"rm -f $R/etc/resolv.conf && printf '{conf}' > $R/etc/resolv.conf"]
        pre = list(pre) + list(pre_extra)
        # exec'd: the program keeps the process group the topology stops (Ironic's master
        # calls setsid, and would outlive the run as an orphan).
        _, script = self.sb.script(pod, c, argv, env, rec, netns=True, pre=pre, exec_=True)
        log = os.path.join(self.tmp, f"{role}-{name}.log")
        return self.topo.start(role, name, ["unshare", "-m", "bash", script], log)

    def job(self, role, component, env_extra=None, pre_extra=()):
        """The kit's Job of that component (label app.kubernetes.io/component), run to
        completion on a node; its name."""
        job = next(o for o in self.objs if o["kind"] == "Job" and
                   o["metadata"].get("labels", {}).get("app.kubernetes.io/component") ==
                   component)
        pod = self.pod(role, obj=job)
        c = self.ce.containers(job)[0]
        p = self.container(role, c["name"], pod=pod, env_extra=env_extra, pre_extra=pre_extra)
        code = p.wait(timeout=600)
        if code != 0:
            raise Failure(f"Job {job['metadata']['name']} exit {code}; see "
                          f"{self.tmp}/{role}-{c['name']}.log")
        return job["metadata"]["name"]

    def db_upgrade(self, role):
        """The kit's schema Job (ironic-image's rundatabase-upgrade)."""
        return self.job(role, "db-upgrade")

    def db_create(self, role):
        """components/database's Job: Ironic's database and account on the existing MariaDB,
        as the Secret mariadb-admin's administrator. ironic-image's Python has PyMySQL; the
        sandbox's python3.12 gets it as scripts/check-entrypoints gives it."""
        pymysql = self.ce.ensure_pymysql()
        return self.job(role, "db-create", env_extra={"PYTHONPATH": "/opt/pymysql"},
                        pre_extra=[f"mkdir -p $R/opt/pymysql && mount --bind {pymysql} "
                                   "$R/opt/pymysql"])

    def deployment(self, name):
        return next(o for o in self.objs if o["kind"] == "Deployment"
                    and o["metadata"]["name"] == name)

    def init(self, role, name):
        """One init container of the node's pod, run to completion (kubelet's order)."""
        p = self.container(role, name)
        code = p.wait(timeout=600)
        if code != 0:
            raise Failure(f"init container {name} on {role} exit {code}; see "
                          f"{self.log(role, name)}")

    def start_node(self, role, ipa=None):
        """The pod's containers in kubelet's order: the native sidecar first (Ironic waits for
        its startup probe: the exported certificate), then Ironic and httpd."""
        names = [c["name"] for c in self.ce.containers(self.workload())]
        if "deploy-ramdisk" in names:
            # components/deploy-ramdisk: the kernel and ramdisk fetched from the ConfigMap's
            # URLs and checked against its sums, before the sidecar (the pod's order).
            self.init(role, "deploy-ramdisk")
        elif ipa:
            images = os.path.join(self.shared(role), "html", "images")
            os.makedirs(images, exist_ok=True)
            for src, name in ((ipa[0], "ironic-python-agent.kernel"),
                              (ipa[1], "ironic-python-agent.initramfs")):
                dst = os.path.join(images, name)
                if not os.path.exists(dst):
                    shutil.copyfile(src, dst)
            shutil.chown(os.path.join(self.shared(role), "html"), 997, 994)
        self.container(role, "ironic-proxy")
        wait_for(f"the sidecar of {role} to export its certificate",
                 lambda: os.path.exists(os.path.join(self.export_dir(role), "tls.crt")), 60)
        self.container(role, "ironic")
        self.container(role, "httpd")

    def exec(self, role, name, argv, timeout=120):
        """`kubectl exec` into a running container of the node's pod: argv with the
        container's environment, user and volumes, in the node's namespace; (exit, output)."""
        pod = self.pod(role)
        c = next(c for c in self.ce.containers(pod.obj) if c["name"] == name)
        env = pod.env(c)
        rec = tempfile.mkdtemp(prefix="rec.", dir=pod.dir)
        _, script = self.sb.script(pod, c, argv, env, rec, netns=True, exec_=True)
        done = subprocess.run(self.topo.wrap(role, ["unshare", "-m", "bash", script]),
                              capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr

    def log(self, role, name):
        return os.path.join(self.tmp, f"{role}-{name}.log")


def atomic_volume(path, files, mode, group=None):
    """A Secret volume as kubelet's atomic writer keeps it (pkg/volume/util/atomic_writer.go):
    the files in a fresh timestamped directory, `..data` pointing at it (replaced by a rename,
    so a reader sees either every old file or every new one), one symlink per file through
    `..data`. Makes the volume or updates it."""
    os.makedirs(path, exist_ok=True)
    ts = tempfile.mkdtemp(prefix="..2026_12_06_", dir=path)
    for rel, data in files.items():
        f = os.path.join(ts, rel)
        os.makedirs(os.path.dirname(f), exist_ok=True)
        with open(f, "wb") as out:
            out.write(data)
        m = mode
        if group is not None:
            os.chown(f, 0, group)
            m |= 0o440
        os.chmod(f, m)
        top = os.path.join(path, rel.split("/")[0])
        if not os.path.lexists(top):
            os.symlink(os.path.join("..data", rel.split("/")[0]), top)
    for d in (path, ts):
        os.chmod(d, 0o755 if group is None else 0o2755)
        if group is not None:
            os.chown(d, 0, group)
    data_link = os.path.join(path, "..data")
    old = os.readlink(data_link) if os.path.lexists(data_link) else None
    os.symlink(os.path.basename(ts), data_link + "_tmp")
    os.rename(data_link + "_tmp", data_link)
    if old:
        shutil.rmtree(os.path.join(path, old), ignore_errors=True)


def wait_listening(topo, role, port, timeout=120, what=None):
    """Waits until something listens on TCP port in a role's namespace."""
    def up():
        out = subprocess.run(topo.wrap(role, ["ss", "-Htln", f"sport = :{port}"]),
                             capture_output=True, text=True).stdout
        return out.strip() != ""
    wait_for(what or f"port {port} in {role}", up, timeout, interval=0.5)


def now():
    return time.strftime("%H:%M:%S")


if __name__ == "__main__":
    sys.exit("a module of tests/e2e/provision_e2e.py")
