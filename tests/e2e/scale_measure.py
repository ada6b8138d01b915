"""What the scale e2e measures (docs/e2e.md "Scale"): CPU per party from /proc, peak RSS and
connections of the proxies, requests per path from the proxies' access logs (or HAProxy's log),
balancer spread and errors by the party that failed."""

import collections
import datetime
import os
import re
import threading
import time
from pathlib import Path

import harness as h
import scale_setup as ss
from ironic_proxy_testing import cpu


def own_and_reaped(pid):
    """utime + stime + cutime + cstime of one process, in seconds: its own CPU and that of the
    children it waited for (Ironic's short-lived helpers, werkzeug's reloader child)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in f[11:15]) / cpu.HZ


def group_cpu(roots):
    """CPU seconds of process trees: every live descendant's own CPU, plus what each root
    reaped (children that already exited)."""
    total = 0.0
    for root in roots:
        pids = cpu.tree(root)
        total += own_and_reaped(root) + cpu.cpu_seconds([p for p in pids if p != root])
    return total


def oncpu_seconds(root):
    """Time on CPU of a process tree from the scheduler (`/proc/PID/task/TID/schedstat`, first
    field, ns), summed over every live thread: exact, where utime + stime are sampled at the
    tick (10 ms), too coarse for a proxy that spends well under a second in a run."""
    total = 0
    for pid in cpu.tree(root):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def machine_busy():
    """Busy seconds of the whole machine (every core, every process, other users' too)."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / cpu.HZ


class Sampler(threading.Thread):
    """Every 2 s: open client connections of each proxy (its `active_connections`, or HAProxy's
    `scur`), kept as a peak per proxy."""

    def __init__(self, sources):
        super().__init__(daemon=True)
        self.sources = sources  # name -> callable returning open connections
        self.peak = collections.Counter()
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            for name, fn in self.sources.items():
                try:
                    self.peak[name] = max(self.peak[name], fn())
                except Exception:  # noqa: BLE001, S110 - a missed sample is no failure
                    pass
            self._stop_event.wait(2)

    def stop(self):
        self._stop_event.set()
        self.join(timeout=10)


def proxy_connections(admin_url):
    return int(h.metric(h.scrape(admin_url), "ironic_proxy_active_connections"))


# --- access logs -------------------------------------------------------------------------------


def api_path(path):
    """The kind of an API request, by its path."""
    p = path.split("?", 1)[0]
    if p.startswith("/v1/lookup"):
        return "agent lookup"
    if p.startswith("/v1/heartbeat/"):
        return "agent heartbeat"
    if p.startswith("/v1/continue_inspection"):
        return "agent inspection data"
    if p == "/" or p == "/v1" or p == "/v1/":
        return "GET / (versions; health checks)"
    return "BMO API"


def egress_path(upstream):
    """The kind of an egress request, by the endpoint it went to."""
    port = int(upstream.rsplit(":", 1)[1]) if ":" in upstream else 0
    if port == h.RPC_PORT:
        return "JSON-RPC"
    if ss.AGENT_PORT <= port < ss.AGENT_PORT + 1000:
        return "agent commands"
    if ss.SUSHY_PORT <= port < ss.SUSHY_PORT + 1000:
        return "Redfish"
    if port == ss.IMAGE_PORT:
        return "image server"
    return f"other ({upstream})"


class Paths:
    """Requests per (hop, kind): count, 5xx, peak per second, and errors by blame."""

    def __init__(self):
        self.count = collections.Counter()
        self.per_second = collections.defaultdict(collections.Counter)
        self.status = collections.defaultdict(collections.Counter)
        self.blame = collections.Counter()  # (hop, blame, status) of >= 500 or blamed lines
        self.spread = collections.Counter()  # balancer upstream -> requests
        self.examples = []
        self.served = collections.Counter()  # proxy process -> requests it answered
        self.clients = collections.defaultdict(set)  # proxy process -> client ip:port seen

    def add(self, hop, kind, second, status, blame="-", what="", proc=None, client=None):
        key = (hop, kind)
        self.count[key] += 1
        if proc:
            self.served[proc] += 1
            if client and not client.endswith("unix"):
                # A client's source port is its connection (ports are not reused within a run
                # of minutes on an idle ephemeral range): distinct ports = connections that
                # carried at least one request = TLS handshakes on a TLS listener.
                self.clients[proc].add(client)
        self.per_second[key][second] += 1
        self.status[key][status // 100 * 100] += 1
        if status >= 500 or blame == "proxy":
            self.blame[(hop, blame, status)] += 1
            if len(self.examples) < 12:
                self.examples.append(f"{hop} {kind} {status} blame={blame} {what}"[:200])

    def peak(self, key):
        return max(self.per_second[key].values(), default=0)

    def lines(self):
        out = []
        for key in sorted(self.count):
            s = dict(sorted(self.status[key].items()))
            out.append(f"{key[0]:<22} {key[1]:<24} {self.count[key]:>8}  peak "
                       f"{self.peak(key):>4}/s  status {s}")  # fmt: skip
        return out


def read_proxy_logs(paths, lb_log, sidecar_logs, since):
    """Access lines of the balancer (`api`) and sidecars (`api`, `json-rpc`,
    `json-rpc-egress`) from `since` (epoch seconds) on."""
    for e in h.proxy_events(lb_log):
        f = e.get("fields", e)
        if e.get("target") != "access" or h.event_time(e) < since:
            continue
        st, up = int(f.get("status", 0)), f.get("upstream", "-")
        paths.add("balancer", api_path(f.get("path", "")), int(h.event_time(e)), st,
                  f.get("blame", "-"), f.get("path", ""), "balancer", f.get("client"))  # fmt: skip
        paths.spread[up.split("(")[0].strip()] += 1
    for ip, log in sidecar_logs.items():
        for e in h.proxy_events(log):
            f = e.get("fields", e)
            if e.get("target") != "access" or h.event_time(e) < since:
                continue
            lst, st = f.get("listener"), int(f.get("status", 0))
            sec, blame = int(h.event_time(e)), f.get("blame", "-")
            who = (f"sidecar {ip}", f"{lst} {f.get('client')}")
            if lst == "json-rpc-egress":
                kind = egress_path(f.get("upstream", "-"))
                paths.add("sidecar egress", kind, sec, st, blame,
                          f"{ip} {f.get('path')} {f.get('upstream')}", *who)  # fmt: skip
            elif lst == "json-rpc":
                paths.add("sidecar json-rpc in", "JSON-RPC", sec, st, blame,
                          f"{ip} {f.get('rpc_method')}", *who)  # fmt: skip
            else:
                paths.add("sidecar api", api_path(f.get("path", "")), sec, st, blame,
                          f"{ip} {f.get('path')}", *who)  # fmt: skip


# HAProxy's `option httplog` line: client [date] frontend backend/server timers status bytes ...
_HTTPLOG = re.compile(
    r"(\S+) \[(\d+/\w+/\d+:\d+:\d+:\d+)\.\d+\] (\S+) (\S+)/(\S+) \S+ (-?\d+) .*?\"(\S+) (\S+)"
)


def read_haproxy_log(paths, log, since):
    with open(log, errors="replace") as f:
        for line in f:
            m = _HTTPLOG.search(line)
            if not m or m.group(3) != "api~":
                continue
            t = datetime.datetime.strptime(m.group(2), "%d/%b/%Y:%H:%M:%S")
            sec = int(time.mktime(t.timetuple()))  # HAProxy logs local time
            if sec < int(since):
                continue
            st = int(m.group(6))
            server = m.group(5)
            # HAProxy's own answers (no server, or a 5xx with a termination state) are its.
            blame = "proxy" if server in ("<NOSRV>", "-") or st in (502, 503, 504) else "-"
            paths.add("balancer", api_path(m.group(8)), sec, st, blame, m.group(8), "HAProxy",
                      m.group(1))  # fmt: skip
            paths.spread[server] += 1


def ironic_errors(instances):
    """ERROR lines of Ironic's logs, by message start."""
    c = collections.Counter()
    for inst in instances:
        try:
            with open(inst.ironic_log, errors="replace") as f:
                for line in f:
                    if " ERROR " in line:
                        msg = line.split(" ERROR ", 1)[1].strip()
                        c[re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<uuid>", msg)[:140]] += 1
        except OSError:
            continue
    return c


def tool_errors(logs):
    """ERROR and Traceback lines of sushy-tools and fake-ipa logs, by message start."""
    c = collections.Counter()
    for log in logs:
        try:
            with open(log, errors="replace") as f:
                for line in f:
                    if "ERROR" in line or line.startswith("Traceback"):
                        msg = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<uuid>", line.strip())
                        msg = re.sub(r"^\S+ \S+ ", "", msg)
                        c[f"{os.path.basename(log).split('-')[0]}: {msg[:140]}"] += 1
        except OSError:
            continue
    return c
