"""CPU and memory accounting from /proc: what a process (and its children) spent, per phase."""

import os
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (which may hold spaces and ')'):
    index 0 is field 3 (state), so utime (field 14) is index 11 and stime (15) index 12."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree(pid):
    """pid and all its descendants (HAProxy and nginx workers, a shell's children)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(_stat_fields(d)[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pids):
    """utime + stime of a pid (or of each of a list of pids), in seconds; a process that is
    gone counts 0."""
    if isinstance(pids, int):
        pids = [pids]
    ticks = 0
    for p in pids:
        try:
            f = _stat_fields(p)
        except OSError:
            continue
        ticks += int(f[11]) + int(f[12])
    return ticks / HZ


def core_times(core):
    """(all jiffies, idle + iowait jiffies) of one CPU core, from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            v = [int(x) for x in line.split()[1:]]
            return sum(v), v[3] + v[4]
    raise RuntimeError(f"no cpu{core} in /proc/stat")


def memory_kib(pids):
    """(RSS, PSS) in KiB summed over pids, from /proc/PID/smaps_rollup."""
    rss = pss = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss, pss


def peak_rss_kib(pids):
    """Sum over pids of VmHWM (each process's peak resident set since it started), in KiB."""
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total
