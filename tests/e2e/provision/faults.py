"""The faults of issue 49 while the hosts provision, each started by a state a host reaches
(polled through the balancer, as the timeline is):

- **kill**: SIGKILL to every process group of the node that owns host A (sidecar, Ironic,
  httpd: the node dies as a machine would) while it holds A's lock during A's deploy. Ironic's
  own rules decide what follows: the hash ring moves A to a live conductor; the survivors
  release the dead conductor's lock (ironic/conductor/manager.py `_check_orphan_nodes`, by
  the name it registered, which the kit makes the name it locks under) and fail a node in
  `deploying` (`utils.abort_on_conductor_take_over`); one in `wait call-back` continues on
  its new owner at the agent's next heartbeat. main.py retries a failed deploy through the
  proxies.
- **restart**: SIGTERM to the sidecar of the node that owns neither host, then its start (a
  native sidecar container restarting alone); then the balancer rolled as its DaemonSet rolls
  it (a new process beside the old one, then SIGTERM to the old), as soon as an agent has
  started and not yet been heard: during its first lookup, the moment a refusal strands a host.
- **rotate**: the CA by docs/operate.md "Rotate the CA": trust both (the Secret's bundle, and
  the API clients' bundle), wait until every live proxy has reloaded; switch the issuer, wait
  until every live proxy serves a leaf of the new CA; after both hosts are `active`, drop the
  old CA and show that the API answers with the new CA alone and no longer with the old.
"""

import os
import signal
import subprocess
import threading
import time

from ironic_proxy_testing.procs import wait_for

from . import hosts, services
from .kit import API_PORT, VMEDIA_TLS_PORT, wait_listening

CPS = ["cp1", "cp2", "cp3"]


def cert_count(path):
    try:
        return open(path, errors="replace").read().count("BEGIN CERTIFICATE")
    except OSError:
        return 0


def issuer_of(pem_path):
    p = subprocess.run(["openssl", "x509", "-in", pem_path, "-noout", "-issuer"],
                       capture_output=True, text=True)
    return p.stdout.strip()


def served_issuer(topo, role, host, port):
    """The issuer of the certificate a TLS listener presents (openssl s_client from a role's
    namespace; an IPv6 address in brackets, which -connect needs)."""
    at = f"{topo.url_host(host)}:{port}"
    p = subprocess.run(topo.wrap(role, [
        "sh", "-c", f"openssl s_client -connect {at} -servername {host} </dev/null "
        "2>/dev/null | openssl x509 -noout -issuer"]), capture_output=True, text=True,
        timeout=30)
    return p.stdout.strip()


def verifies_with(topo, role, host, port, ca):
    """Whether a TLS client trusting only `ca` accepts a listener's certificate."""
    p = subprocess.run(topo.wrap(role, [
        "sh", "-c", f"openssl s_client -connect {topo.url_host(host)}:{port} -verify_return_error "
        f"-CAfile {ca} </dev/null >/dev/null 2>&1"]), timeout=30)
    return p.returncode == 0


class Faults:
    """The three faults, driven by two threads (the kill watches A closely; restart and
    rotation do slow work). `events` holds (seconds since start, text) for the report."""

    def __init__(self, run, ctx, t0=None):
        self.run, self.ctx = run, ctx
        self.t0 = t0 or time.monotonic()  # the timeline's clock
        self.events = []
        self.dead = set()  # roles killed
        self.killed_at = None  # A's state when its owner died
        self.kill_time = None
        self.released_after = None  # seconds from the kill to the lock's release
        self.restarted = self.rotated = False
        self.rotation_step = 0
        self.stop_evt = threading.Event()
        self.errors = []
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (self._kill_loop, self._restart_loop, self._rotate_loop)]

    def start(self):
        for t in self.threads:
            t.start()

    def close(self):
        self.stop_evt.set()
        for t in self.threads:
            t.join(timeout=120)

    def note(self, text):
        t = round(time.monotonic() - self.t0, 1)
        self.events.append((t, text))
        print(f"fault {t:7.1f} s  {text}", flush=True)

    def _guard(self, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported as a failed check by main
            self.errors.append(f"{fn.__name__}: {type(e).__name__}: {e}")
            self.note(f"{fn.__name__} failed: {e}")

    def node(self, label):
        return self.ctx.api.get(f"/v1/nodes/{self.ctx.uuids[label]}?fields=provision_state,"
                                "target_provision_state,deploy_step,conductor,reservation",
                                timeout=10)

    # ------------------------------------------------------------------ kill A's owner
    def _kill_loop(self):
        """Kills A's owner while it holds A's lock during A's deploy: the hard moment. A's row
        is polled in the database (a lock lasts a few seconds: a Redfish call, a deploy step);
        when A is reserved by its owner the owner is frozen (SIGSTOP), and only if the lock is
        still there once none of its statements runs is every process of the node SIGKILLed
        (`_frozen_holder`); otherwise it thaws and the loop waits for the next lock. With the
        kit's conductor name (ADDRESS:6189, [json_rpc]port 8089) the survivors release the
        lock (manager.py `_check_orphan_nodes`) and fail a `deploying` node
        (`utils.abort_on_conductor_take_over`); main.py retries the deploy as
        baremetal-operator does."""
        ctx = self.ctx
        uuid = ctx.uuids["host-a"]
        owner = ctx.owners["host-a"]
        owner_ips = set(ctx.topo.addresses(owner))
        while not self.stop_evt.wait(0.2):
            try:
                state, target, reservation = ctx.db(
                    "SELECT provision_state, target_provision_state, reservation FROM nodes "
                    f"WHERE uuid = '{uuid}'")[0]
            except Exception:  # noqa: BLE001 - the next poll will do
                continue
            if state in ("active", "deploy failed", "error"):
                self.note(f"kill: host-a reached {state} before a lock of its owner was "
                          "caught: not killed")
                return
            if (target != "active" or state not in ("deploying", "wait call-back")
                    or not reservation or hosts.conductor_host(reservation) not in owner_ips):
                continue
            ctx.topo.signal(owner, signal.SIGSTOP)
            held = self._frozen_holder(owner)
            if held is None or hosts.conductor_host(held[1]) not in owner_ips:
                ctx.topo.signal(owner, signal.SIGCONT)
                continue
            self.killed_at = (held[0], f"locked by {held[1]}")
            self.note(f"kill: host-a in {held[0]}, locked by {held[1]} (read from the database "
                      f"with {owner} frozen); SIGKILL every process of {owner} "
                      f"({ctx.topo.ip(owner)}), its owner")
            self.kill_time = time.monotonic()
            ctx.topo.kill(owner)
            # The machine is gone, not only its processes: peers and clients now time out on
            # its addresses instead of being refused.
            links = ctx.topo.cut(owner)
            self.note(f"kill: {owner}'s addresses gone ({', '.join(links)} down)")
            self.dead.add(owner)
            self._released(uuid)
            return

    def _released(self, uuid):
        """How long Ironic took to release the dead conductor's lock on A, and what it did to
        A (the chaos table's figure); gives up after 300 s, which `stuck` reports."""
        while not self.stop_evt.wait(0.5):
            try:
                state, reservation = self.ctx.db(
                    "SELECT provision_state, reservation FROM nodes "
                    f"WHERE uuid = '{uuid}'")[0]
            except Exception:  # noqa: BLE001 - the next poll will do
                continue
            waited = time.monotonic() - self.kill_time
            if reservation is None or hosts.conductor_host(reservation) not in {
                    self.ctx.topo.ip(r) for r in self.dead}:
                self.released_after = round(waited, 1)
                self.note(f"kill: the dead owner's lock on host-a released {waited:.1f} s "
                          f"after the kill; host-a {state}")
                return
            if waited > 300:
                return

    def _frozen_holder(self, owner):
        """With every process of `owner` stopped (SIGSTOP): (A's state, A's reservation) read
        from MariaDB once none of the owner's connections runs a statement (a reservation the
        owner sent before it stopped has then either committed, and shows here, or waits
        uncommitted in a transaction, which the kill's closed connection rolls back); None when
        A is not reserved then, or the owner froze mid-statement for 10 s."""
        topo, db = self.ctx.topo, self.ctx.db
        owner_ips = set(topo.addresses(owner))
        deadline = time.monotonic() + 10
        while True:
            rows = db("SELECT host, command FROM information_schema.processlist "
                      "WHERE user = 'ironic'")
            busy = [r for r in rows if r[1] != "Sleep"
                    and r[0].rsplit(":", 1)[0].strip("[]") in owner_ips]
            if not busy:
                break
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)
        state, reservation = db("SELECT provision_state, reservation FROM nodes WHERE uuid = "
                                f"'{self.ctx.uuids['host-a']}'")[0]
        return (state, reservation) if reservation else None

    def stuck(self, n):
        """Why host A cannot move any more, or None: Ironic reserves a node under
        [DEFAULT]host (conductor/task_manager.py: Node.reserve(context, CONF.host, ...)) but
        registers the conductor as host:port when [json_rpc]port is not 8089
        (conductor/base_manager.py), and releases a dead conductor's reservations by that
        registered name (manager.py _check_orphan_nodes: reserved_by_any_of offline
        conductors; clear_node_reservations_for_conductor at start): the names never match,
        so a node locked by the killed conductor stays locked."""
        if not self.dead or not n.get("reservation"):
            return None
        dead = {self.ctx.topo.ip(r) for r in self.dead}
        holder = n["reservation"]
        if hosts.conductor_host(holder) in dead and time.monotonic() - self.kill_time > 300:
            return (f"host-a still reserved by {holder} (killed "
                    f"{time.monotonic() - self.kill_time:.0f} s ago): Ironic never releases it")
        return None

    # ------------------------------------------------------------------ restart, rotate
    def _states(self):
        try:
            return {label: self.node(label)["provision_state"] for label in self.ctx.uuids}
        except Exception:  # noqa: BLE001 - the next poll will do
            return None

    def _restart_loop(self):
        """The restart, on a thread of its own (a rotation step blocks for seconds): as soon as
        an agent has started in the ramdisk and not yet been heard, its first lookup under way.
        That is the moment a refused connection costs the host (see `first_lookup`), so it is
        the one chosen."""
        while not self.restarted and not self.stop_evt.wait(0.5):
            who = [lb for lb in self.ctx.uuids if self.first_lookup(lb)]
            if who:
                self.restart(f"{', '.join(who)}: the agent started, its first lookup under way")
                self.restarted = True

    def _rotate_loop(self):
        while not self.stop_evt.wait(1):
            states = self._states()
            if states and any(s in ("available", "deploying", "wait call-back", "active")
                              for s in states.values()):
                self.rotate_trust_both()
                self.rotate_switch()
                return

    def first_lookup(self, label):
        """Whether the agent of the host's current boot has started (the ramdisk's init prints
        `starting ironic-python-agent`) and not yet heartbeated (IPA's own `heartbeat
        successful` on the serial console). In that window IPA checks once that the API
        answers (`_find_routable_addr`) and, refused, exits; restarted, it finds its token
        already handed out and locks itself down (ironic_python_agent/agent.py). So the kit's
        balancer refuses no connection while it restarts (limits.handover)."""
        path = os.path.join(self.ctx.tmp, "vms", f"{label}.console.log")
        try:
            text = open(path, errors="replace").read()
        except OSError:
            return False
        boot = text[text.rfind("Linux version"):]
        return "starting ironic-python-agent" in boot and "heartbeat successful" not in boot

    def restart(self, why):
        ctx = self.ctx
        role = ctx.spare
        self.note(f"restart: {why}; SIGTERM to the sidecar of {role} (owns neither host)")
        took = ctx.topo.stop(role, "ironic-proxy", timeout=40)
        ctx.kit.container(role, "ironic-proxy")
        wait_listening(ctx.topo, role, API_PORT, what=f"{role}'s restarted sidecar")
        self.note(f"restart: {role}'s sidecar stopped in {took:.1f} s and listens again")
        # As its DaemonSet rolls it (maxSurge: 1): the new process first, on the same
        # addresses (limits.handover), then SIGTERM to the old one once the new one is ready.
        old = ctx.topo.started("svc", "balancer")
        services.start_balancer(ctx.topo, ctx.tmp, ctx.kit, ctx.proxy_bin, successor=True)
        took = ctx.topo.stop("svc", "balancer", timeout=40, proc=old)
        self.note(f"restart: a new balancer took the VIP over, the old one drained and "
                  f"stopped in {took:.1f} s")

    def live(self):
        return [r for r in CPS if r not in self.dead]

    def gone(self, role):
        """A node the kill fault took down while a rotation step waited on it (the two faults
        run on threads of their own): nothing more to wait for there."""
        return role in self.dead

    def rotate_trust_both(self):
        """Step 1: trust both. Every live sidecar exports the new bundle (a changed bundle
        re-issues the leaf); the balancer's renewal counter rises."""
        kit, topo = self.ctx.kit, self.ctx.topo
        old = open(os.path.join(kit.ca, "ca.crt"), "rb").read()
        new = open(os.path.join(kit.ca_next, "ca.crt"), "rb").read()
        before = self.balancer_renewals()
        self.note("rotate 1/3: trust both (Secret ironic-proxy-ca: old issuer, bundle old+new;"
                  " API clients' bundle old+new)")
        kit.set_client_ca(old + new)
        kit.update_ca_secret(kit.ca, old + new)
        for role in self.live():
            wait_for(f"{role}'s sidecar to export both CAs", lambda r=role: self.gone(r) or
                     cert_count(os.path.join(kit.export_dir(r), "ca.crt")) == 2, 120,
                     interval=1)
        wait_for("the balancer to reload the bundle",
                 lambda: self.balancer_renewals() > before, 120, interval=1)
        self.rotation_step = 1
        self.note(f"rotate 1/3: every live proxy trusts both ({', '.join(self.live())}, "
                  "balancer)")

    def rotate_switch(self):
        """Step 2: the new CA signs. A changed issuer re-issues at once
        (src/identity/rotate.rs), so no pod is restarted."""
        kit, topo = self.ctx.kit, self.ctx.topo
        old = open(os.path.join(kit.ca, "ca.crt"), "rb").read()
        new = open(os.path.join(kit.ca_next, "ca.crt"), "rb").read()
        want = issuer_of(os.path.join(kit.ca_next, "ca.crt")).replace("issuer=", "")
        self.note("rotate 2/3: switch the issuer (Secret: new issuer, bundle old+new)")
        kit.update_ca_secret(kit.ca_next, old + new)
        for role in self.live():
            wait_for(f"{role}'s sidecar to serve a leaf of the new CA",
                     lambda r=role: self.gone(r) or want in issuer_of(
                         os.path.join(kit.export_dir(r), "tls.crt")), 120, 1)
        vip = topo.ip("vip")
        wait_for("the balancer to serve a leaf of the new CA",
                 lambda: want in served_issuer(topo, "svc", vip, API_PORT), 120, 1)
        vmedia = {r: served_issuer(topo, "svc", topo.ip(r), VMEDIA_TLS_PORT)
                  for r in self.live()}
        self.rotation_step = 2
        self.note(f"rotate 2/3: leaves from the new CA on every live proxy (vmedia-tls: "
                  f"{', '.join(f'{r} {v}' for r, v in vmedia.items())})")

    def rotate_drop_old(self):
        """Step 3, after both hosts are active (the agents, which trust both, are gone): the
        new CA alone."""
        kit, topo = self.ctx.kit, self.ctx.topo
        new = open(os.path.join(kit.ca_next, "ca.crt"), "rb").read()
        before = self.balancer_renewals()
        self.note("rotate 3/3: drop the old CA (Secret: new issuer, bundle new; clients new)")
        kit.set_client_ca(new)
        kit.update_ca_secret(kit.ca_next, new)
        for role in self.live():
            wait_for(f"{role}'s sidecar to export the new CA alone", lambda r=role:
                     self.gone(r) or cert_count(os.path.join(kit.export_dir(r), "ca.crt")) == 1,
                     120, interval=1)
        wait_for("the balancer to reload the bundle",
                 lambda: self.balancer_renewals() > before, 120, interval=1)
        vip = topo.ip("vip")
        new_ok = verifies_with(topo, "svc", vip, API_PORT, os.path.join(kit.ca_next, "ca.crt"))
        old_ok = verifies_with(topo, "svc", vip, API_PORT, os.path.join(kit.ca, "ca.crt"))
        alive = self.ctx.api.get("/v1/conductors?fields=hostname,alive", timeout=20)
        n = sum(1 for c in alive["conductors"] if c["alive"])
        self.rotation_step = 3
        self.run.check("CA rotated (docs/operate.md, three steps, no restart)",
                       new_ok and not old_ok and n >= 1,
                       f"the VIP verifies with the new CA: {new_ok}, with the old: {old_ok}; "
                       f"API through the balancer with the new CA alone: {n} conductors alive")

    def balancer_renewals(self):
        """ironic_proxy_certificate_renewals_total on the balancer's admin listener."""
        topo = self.ctx.topo
        p = subprocess.run(topo.wrap("svc", [
            "curl", "-s", "--max-time", "5",
            f"http://{topo.url_host('svc')}:9902/metrics"]), capture_output=True, text=True,
            timeout=30)
        total = 0.0
        for line in p.stdout.splitlines():
            if line.startswith("ironic_proxy_certificate_renewals_total"):
                try:
                    total += float(line.rsplit(" ", 1)[1])
                except ValueError:
                    pass
        return total


class SidecarRestart:
    """The statefulset variant's one fault: the sidecar of a pod that owns no host is stopped
    (SIGTERM, its drain) and started again, as kubelet restarts a native sidecar container,
    once host B's agent heartbeats (`clean wait`). The LoadBalancer keeps sending that pod new
    connections meanwhile (it has no readiness; kube-proxy would until the pod's readiness
    probe fails), so a heartbeat may be refused and retried by IPA."""

    def __init__(self, ctx, role, t0):
        self.ctx, self.role, self.t0 = ctx, role, t0
        self.events, self.errors = [], []
        self.restarted = False
        self.stop_evt = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self.thread.start()

    def close(self):
        self.stop_evt.set()
        self.thread.join(timeout=120)

    def note(self, text):
        t = round(time.monotonic() - self.t0, 1)
        self.events.append((t, text))
        print(f"fault {t:7.1f} s  {text}", flush=True)

    def _loop(self):
        ctx = self.ctx
        uuid = ctx.uuids["host-b"]
        try:
            while not self.stop_evt.wait(1):
                try:
                    state = ctx.api.get(f"/v1/nodes/{uuid}?fields=provision_state",
                                        timeout=10)["provision_state"]
                except Exception:  # noqa: BLE001 - the next poll will do
                    continue
                if state == "clean wait":
                    break
                if state in ("available", "active") or state.endswith("failed"):
                    self.note(f"restart: host-b reached {state} without a clean wait seen")
                    return
            else:
                return
            name = ctx.kit.pod_name(self.role)
            self.note(f"restart: host-b in clean wait; SIGTERM to the sidecar of {name} "
                      f"({self.role}, owns no host)")
            took = ctx.topo.stop(self.role, "ironic-proxy", timeout=40)
            ctx.kit.container(self.role, "ironic-proxy")
            wait_listening(ctx.topo, self.role, API_PORT, what=f"{name}'s restarted sidecar")
            self.note(f"restart: {name}'s sidecar stopped in {took:.1f} s and listens again")
            self.restarted = True
        except Exception as e:  # noqa: BLE001 - reported as a failed check by main
            self.errors.append(f"restart: {type(e).__name__}: {e}")
            self.note(f"restart failed: {e}")
