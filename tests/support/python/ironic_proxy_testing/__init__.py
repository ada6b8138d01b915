"""Test support shared by every Python harness of ironic-proxy (tests/e2e, tests/it/support,
benches, scripts): the test CA and leaves (`pki`), loopback ports (`ports`), CPU and memory
accounting from /proc (`cpu`), running and stopping processes by PID (`procs`) and package
installs (`packages`).

A harness imports it with one line relative to its own file, e.g. from tests/e2e:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support" / "python"))

It needs nothing outside the Python standard library.
"""

from .procs import Failure, run

__all__ = ["Failure", "run"]
