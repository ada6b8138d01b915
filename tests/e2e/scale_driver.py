"""Drives hosts through Ironic the way baremetal-operator does (metal3-io/baremetal-operator,
pkg/provisioner/ironic/, read at 02aa5059):

- register.go `enrollNode`: POST /v1/nodes with driver `redfish`, boot interface `ipxe`
  (pkg/hardwareutils/bmc/redfish.go), inspect interface `agent` (defaultInspectInterface),
  firmware and raid interfaces `redfish`, driver_info `redfish_address`, `redfish_system_id`,
  `redfish_username`, `redfish_password`, properties `capabilities` and `cpu_arch`;
  ironic.go `createNodePort`: POST /v1/ports with the boot MAC, `pxe_enabled`;
  `configureNode`: driver_info `deploy_kernel` / `deploy_ramdisk` (`setDeployImage`),
  `automated_clean`; then provision state `manage` (register.go).
- inspecthardware.go: `inspect`, waiting for `manageable`.
- ironic.go `Provision`: `provide` (automated cleaning) from `manageable`; from `available`
  `getInstanceUpdateOpts` / `setDirectDeployUpdateOptsForNode` (instance_uuid, instance_info
  `capabilities`, `image_source`, `image_disk_format`, `image_os_hash_algo` /
  `image_os_hash_value`, driver_info `force_persistent_boot_device`), then `active` with the
  config drive of `getConfigDrive` (meta_data, user_data).
- `HasCapacity` / `loadBusyHosts`: a host starts inspecting, cleaning or deploying only while
  fewer than the provisioning limit are busy (PROVISIONING_LIMIT, factory.go, default 20),
  counted from a node list (`fields=uuid,name,provision_state,boot_interface`).

Each host is reconciled on its own schedule (requeued after `requeue` seconds while Ironic works,
as BMO's provisionRequeueDelay), by a pool of workers (BMO's concurrent reconciles). A 409 (node
locked) is retried at the next reconcile, as BMO does; a failed state ends the host.
"""

import collections
import heapq
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

BUSY = {"cleaning", "clean wait", "inspecting", "inspect wait", "deploying", "wait call-back",
        "deleting"}  # fmt: skip
FAILED = {"deploy failed", "clean failed", "inspect failed", "error", "enroll failed",
          "manage failed"}  # fmt: skip
HEADERS = {"X-OpenStack-Ironic-API-Version": "1.89", "Content-Type": "application/json"}


class ApiError(Exception):
    pass


class Driver:
    def __init__(self, hosts, api_urls, ca, files, limit, requeue, workers):
        self.hosts = hosts
        self.api_urls = api_urls  # one (a balancer) or several (direct: round robin)
        self.ca = ca
        self.files = files
        self.limit = limit
        self.requeue = requeue
        self.workers = workers
        self.local = threading.local()
        self.lock = threading.Lock()
        self.state = {x.name: "new" for x in hosts}  # our view: new, enrolled, ..., done, failed
        self.node = {}  # name -> uuid
        self.active_at = {}  # name -> seconds from start
        self.failed = {}  # name -> reason
        self.retries = collections.Counter()  # name -> inspections started again
        self.requests = collections.Counter()  # "METHOD status"
        self.errors = []  # (party, text), party "ironic" (5xx) or "driver" (transport)
        self.busy_cache = (0.0, set())
        self.t0 = None
        self.picks = 0

    # --- HTTP ------------------------------------------------------------------------------

    def session(self):
        s = getattr(self.local, "s", None)
        if s is None:
            s = self.local.s = requests.Session()
        return s

    def url(self, path):
        with self.lock:
            self.picks += 1
            base = self.api_urls[self.picks % len(self.api_urls)]
        return base + path

    def call(self, method, path, body=None, ok=(200, 201, 202, 204)):
        """One API request; returns (status, json or None). 409 and 503 are returned for the
        caller to requeue (Ironic's node lock, BMO's "host busy"); other failures raise."""
        for attempt in range(3):
            try:
                r = self.session().request(method, self.url(path), json=body, headers=HEADERS,
                                           verify=self.ca, timeout=60)  # fmt: skip
            except requests.RequestException as e:
                self.note_error("driver", f"{method} {path}: {e!r}"[:300])
                if attempt == 2:
                    raise ApiError(f"{method} {path}: {e!r}") from e
                time.sleep(1)
                continue
            with self.lock:
                self.requests[f"{method} {r.status_code}"] += 1
            if r.status_code >= 500:
                self.note_error("ironic" if r.status_code == 500 else "balancer",
                                f"{method} {path}: HTTP {r.status_code}: {r.text[:200]}")  # fmt: skip
            if r.status_code in ok:
                return r.status_code, (r.json() if r.content else None)
            if r.status_code in (409, 503):
                return r.status_code, None
            if r.status_code >= 500 and attempt < 2:
                time.sleep(1)
                continue
            raise ApiError(f"{method} {path}: HTTP {r.status_code}: {r.text[:300]}")
        raise ApiError(f"{method} {path}: no answer")

    def note_error(self, party, text):
        with self.lock:
            self.errors.append((party, text))

    # --- BMO's capacity check ----------------------------------------------------------------

    def busy(self):
        """Busy hosts from a node list (loadBusyHosts), cached for a second."""
        with self.lock:
            t, names = self.busy_cache
            if time.monotonic() - t < 1.0:
                return names
        _, body = self.call("GET", "/v1/nodes?fields=uuid,name,provision_state,boot_interface")
        if body is None:
            raise ApiError("node list: busy (409/503)")
        names = {n["name"] for n in body["nodes"] if n["provision_state"] in BUSY}
        with self.lock:
            self.busy_cache = (time.monotonic(), names)
        return names

    def has_capacity(self, name):
        names = self.busy()
        if name in names or len(names) < self.limit:
            with self.lock:  # counted at once, so that one list admits no more than the limit
                t, cached = self.busy_cache
                self.busy_cache = (t, cached | {name})
            return True
        return False

    # --- one reconcile of one host -----------------------------------------------------------

    def reconcile(self, x):
        """Advances host x by at most one action; returns seconds until its next reconcile,
        or None when it is done."""
        st = self.state[x.name]
        if st == "new":
            return self.enrol(x)
        uuid = self.node[x.name]
        _, n = self.call("GET", f"/v1/nodes/{uuid}")
        if n is None:  # 409 or 503 (a balancer with no healthy endpoint): next reconcile
            return self.requeue
        ps = n["provision_state"]
        if ps == "inspect failed" and self.retries[x.name] < 2:
            # BMO retries a failed inspection (the host's error count and backoff).
            self.retries[x.name] += 1
            self.note_error("tools/ironic", f"{x.name}: inspect failed, inspecting again: "
                            f"{n.get('last_error')}"[:300])  # fmt: skip
            self.provision(uuid, {"target": "inspect"})
            return self.requeue
        if ps in FAILED:
            self.failed[x.name] = f"{ps}: {n.get('last_error')}"
            return None
        if n.get("target_provision_state") or ps in BUSY or ps == "verifying":
            return self.requeue
        if ps == "enroll":
            self.provision(uuid, {"target": "manage"})
            return 1.0
        if ps == "manageable":
            if st == "enrolled":  # inspection not started yet
                if not self.has_capacity(x.name):
                    return self.requeue
                if self.provision(uuid, {"target": "inspect"}) is not None:
                    self.state[x.name] = "inspected"
                return 0.5
            if not self.has_capacity(x.name):
                return self.requeue
            if self.provision(uuid, {"target": "provide"}) is not None:
                self.state[x.name] = "provided"
            return 0.5
        if ps == "available" and st in ("provided", "inspected"):
            if not self.has_capacity(x.name):
                return self.requeue
            self.set_instance(x, uuid)
            drive = {
                "meta_data": {"uuid": x.uuid, "metal3-namespace": "metal3",
                              "metal3-name": x.name, "local-hostname": x.name,
                              "local_hostname": x.name, "name": x.name},  # fmt: skip
                "user_data": f"#cloud-config\nhostname: {x.name}\n",
            }
            if self.provision(uuid, {"target": "active", "configdrive": drive}) is not None:
                self.state[x.name] = "deploying"
            return 0.5
        if ps == "active":
            self.state[x.name] = "done"
            self.active_at[x.name] = time.monotonic() - self.t0
            return None
        return self.requeue

    def enrol(self, x):
        body = {
            "name": x.name,
            "driver": "redfish",
            "boot_interface": "ipxe",
            "deploy_interface": "direct",
            "inspect_interface": "agent",
            "firmware_interface": "redfish",
            "raid_interface": "redfish",
            "driver_info": {
                "redfish_address": x.redfish_address,
                "redfish_system_id": f"/redfish/v1/Systems/{x.uuid}",
                "redfish_username": "admin",
                "redfish_password": "password",
            },
            "properties": {"capabilities": "boot_mode:uefi", "cpu_arch": "x86_64"},
        }
        code, n = self.call("POST", "/v1/nodes", body)
        if code in (409, 503):
            return self.requeue
        uuid = n["uuid"]
        self.node[x.name] = uuid
        self.call("POST", "/v1/ports", {"node_uuid": uuid, "address": x.mac, "pxe_enabled": True})
        patch = [
            {"op": "add", "path": "/driver_info/deploy_kernel",
             "value": "file://" + self.files["kernel"]},
            {"op": "add", "path": "/driver_info/deploy_ramdisk",
             "value": "file://" + self.files["ramdisk"]},
            {"op": "replace", "path": "/automated_clean", "value": True},
        ]  # fmt: skip
        while self.call("PATCH", f"/v1/nodes/{uuid}", patch)[0] in (409, 503):
            time.sleep(0.5)
        self.state[x.name] = "enrolled"
        return 0.5

    def set_instance(self, x, uuid):
        patch = [
            {"op": "add", "path": "/instance_uuid", "value": x.uuid},
            {"op": "add", "path": "/instance_info/capabilities", "value": {}},
            {"op": "add", "path": "/instance_info/image_source", "value": self.files["url"]},
            {"op": "add", "path": "/instance_info/image_disk_format", "value": "raw"},
            {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
            {"op": "add", "path": "/instance_info/image_os_hash_value",
             "value": self.files["sha256"]},
            {"op": "add", "path": "/driver_info/force_persistent_boot_device",
             "value": "Default"},
        ]  # fmt: skip
        while self.call("PATCH", f"/v1/nodes/{uuid}", patch)[0] in (409, 503):
            time.sleep(0.5)

    def provision(self, uuid, body):
        """PUT the provision state; None when Ironic said busy (409/503): requeued."""
        code, _ = self.call("PUT", f"/v1/nodes/{uuid}/states/provision", body)
        return None if code in (409, 503) else code

    # --- the loop ----------------------------------------------------------------------------

    def run(self, deadline, progress=None):
        """Reconciles every host until all are done or failed, or until `deadline` (monotonic).
        Returns the seconds to the last `active`, or None if not all hosts got there."""
        self.t0 = time.monotonic()
        queue = [(self.t0 + 0.01 * i, i) for i in range(len(self.hosts))]
        heapq.heapify(queue)
        pending = set()
        cond = threading.Condition()
        last_print = 0.0

        def work(i):
            x = self.hosts[i]
            try:
                delay = self.reconcile(x)
            except ApiError as e:
                self.note_error("driver", f"{x.name}: {e}"[:300])
                delay = self.requeue
            except Exception as e:  # noqa: BLE001 - a host's bug must not stop the others
                self.failed[x.name] = f"driver: {e!r}"
                delay = None
            with cond:
                pending.discard(i)
                if delay is not None:
                    heapq.heappush(queue, (time.monotonic() + delay, i))
                cond.notify()

        with ThreadPoolExecutor(self.workers) as pool:
            while True:
                with cond:
                    if not queue and not pending:
                        break
                    now = time.monotonic()
                    if now > deadline:
                        break
                    while queue and queue[0][0] <= now and len(pending) < self.workers:
                        _, i = heapq.heappop(queue)
                        pending.add(i)
                        pool.submit(work, i)
                    wait = (queue[0][0] - now) if queue else 1.0
                    cond.wait(timeout=max(0.05, min(wait, 1.0)))
                if progress and time.monotonic() - last_print > 15:
                    last_print = time.monotonic()
                    progress(self.summary_line())
        if len(self.active_at) == len(self.hosts):
            return max(self.active_at.values())
        return None

    def summary_line(self):
        c = collections.Counter(self.state.values())
        return (f"{time.monotonic() - self.t0:.0f} s: {len(self.active_at)} active, "
                f"{len(self.failed)} failed, states {dict(c)}")  # fmt: skip
