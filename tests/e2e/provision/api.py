"""The Ironic API as baremetal-operator calls it: through the balancer's VIP, TLS verified
against the proxies' CA, Basic auth, the newest microversion. Requests are made from a thread
that lives in a namespace on the provisioning network (a network namespace is per thread:
setns(2) on that thread only), so the harness itself stays in the root namespace."""

import ctypes
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

CLONE_NEWNET = 0x40000000
HEADERS = {"X-OpenStack-Ironic-API-Version": "latest"}


def _enter(netns):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
    finally:
        os.close(fd)


class Api:
    def __init__(self, netns, base, auth, ca):
        self.base, self.auth, self.ca = base, auth, ca
        self.pool = ThreadPoolExecutor(max_workers=6, initializer=_enter, initargs=(netns,))
        self.local = threading.local()

    def _session(self):
        s = getattr(self.local, "s", None)
        if s is None:
            s = self.local.s = requests.Session()
            s.auth, s.verify = self.auth, self.ca
            s.headers.update(HEADERS)
        return s

    def call(self, method, path, json=None, expect=(200, 201, 202, 204), timeout=30,
             base=None):
        def go():
            # verify per request: a session's verify loses to REQUESTS_CA_BUNDLE in the
            # environment (requests' merge_environment_settings).
            return self._session().request(method, (base or self.base) + path, json=json,
                                           timeout=timeout, verify=self.ca)
        r = self.pool.submit(go).result()
        if expect and r.status_code not in expect:
            raise RuntimeError(f"{method} {path}: HTTP {r.status_code}: {r.text[:500]}")
        return r

    def get(self, path, **kw):
        return self.call("GET", path, **kw).json()

    def raw(self, fn):
        """Runs fn() on a thread in the namespace (a socket probe, another client)."""
        return self.pool.submit(fn).result()

    def close(self):
        self.pool.shutdown(wait=False, cancel_futures=True)


class Timeline:
    """Provision states of nodes polled every `interval` s: (seconds since start, state,
    target, conductor) per change."""

    def __init__(self, api, interval=2.0):
        self.api, self.interval = api, interval
        self.t0 = time.monotonic()
        self.nodes = {}  # uuid -> label
        self.events = {}  # label -> [(t, state, target, conductor, last_error)]
        self.stop_evt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def watch(self, uuid, label):
        self.nodes[uuid] = label
        self.events.setdefault(label, [])

    def _run(self):
        while not self.stop_evt.wait(self.interval):
            for u, label in list(self.nodes.items()):
                try:
                    n = self.api.get(f"/v1/nodes/{u}?fields=provision_state,"
                                     "target_provision_state,conductor,last_error,power_state",
                                     timeout=10)
                except Exception:  # noqa: BLE001 - a failed poll is counted by the proxies
                    continue
                row = (n["provision_state"], n.get("target_provision_state"),
                       n.get("conductor"), n.get("power_state"))
                ev = self.events[label]
                if not ev or ev[-1][1:5] != row:
                    ev.append((round(time.monotonic() - self.t0, 1), *row,
                               (n.get("last_error") or "")[:200]))

    def state(self, label):
        ev = self.events.get(label) or []
        return ev[-1][1] if ev else None

    def print(self):
        for label, ev in self.events.items():
            print(f"timeline {label}:")
            for t, state, target, conductor, power, err in ev:
                tgt = f" -> {target}" if target else ""
                e = f"  [{err}]" if err else ""
                print(f"  {t:7.1f} s  {state}{tgt}  (conductor {conductor}, {power}){e}")

    def close(self):
        self.stop_evt.set()
