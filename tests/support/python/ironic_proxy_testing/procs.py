"""Running commands and stopping the processes a harness started, by PID only (never by name)."""

import os
import signal
import subprocess
import time


class Failure(Exception):
    """A step of a harness failed; the message says which and why."""


def run(argv, what, timeout=120, env=None, cwd=None, input=None):
    """Runs argv to completion with its output captured (`input`: its standard input); Failure
    naming `what`, the command and the end of its output when it fails or outlives `timeout`
    seconds."""
    argv = [str(a) for a in argv]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=cwd, input=input)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise Failure(f"{what}: timed out after {timeout} s: {' '.join(argv)}") from None
    if p.returncode != 0:
        out = (p.stderr.strip() or p.stdout.strip())[-2000:]
        raise Failure(f"{what} failed (exit {p.returncode}): {' '.join(argv)}\n{out}")
    return p


def stop(p, timeout=10):
    """SIGTERM to the process we started (a Popen), SIGKILL when it outlives `timeout` seconds;
    returns its exit status. A process that has already exited is only reaped."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
    return p.returncode


def stop_all(procs, timeout=10):
    """`stop` for each, newest first: SIGTERM to all, then one shared deadline, then SIGKILL."""
    procs = [p for p in reversed(list(procs)) if p is not None]
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def wait_for(what, fn, timeout, interval=0.2):
    """Calls fn until it returns a truthy value, which is returned; Failure after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - reported below if it persists
            last = e
        if time.monotonic() > deadline:
            detail = f" (last error: {last!r})" if last else ""
            raise Failure(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def stop_tree(p, sig=signal.SIGTERM, timeout=10):
    """Sends sig to the process we started (a Popen) and waits `timeout` seconds; then SIGKILL
    to it and every descendant it left (a master's workers), by PID, youngest first."""
    from .cpu import tree

    p.send_signal(sig)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in reversed(tree(p.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        p.wait()
