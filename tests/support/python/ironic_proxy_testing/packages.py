"""Package installs: Debian packages through the shell helper every script sources
(scripts/lib/packages.sh, one set of rules), Python packages with pip into a virtualenv of the
harness's own (Debian refuses `pip install` into the system Python, PEP 668)."""

import os
import subprocess
from pathlib import Path

from .procs import Failure

ROOT = Path(__file__).resolve().parents[4]
HELPER = ROOT / "scripts" / "lib" / "packages.sh"


def need_packages(*specs, no_recommends=False, who="harness"):
    """scripts/lib/packages.sh's `need_packages CHECK:PACKAGE...`: installs only what is
    missing, with one `apt-get update`; Failure when apt-get fails."""
    flags = ["--no-install-recommends"] if no_recommends else []
    script = f'. "{HELPER}" && need_packages "$@"'
    done = subprocess.run(["bash", "-c", script, "need_packages", *flags, *specs],
                          env={**os.environ, "PACKAGES_WHO": who})  # fmt: skip
    if done.returncode != 0:
        raise Failure(f"{who}: installing Debian packages for {' '.join(specs)} failed")


def venv(path, pins, imports, python="/usr/bin/python3", who="harness"):
    """A virtualenv at `path` in which `imports` (e.g. "jinja2, yaml") import; made with
    `python -m venv --clear` and `pip install pins` when they do not. Returns its python3."""
    py = os.path.join(path, "bin", "python3")
    ok = os.path.exists(py) and subprocess.run([py, "-c", f"import {imports}"],
                                               capture_output=True).returncode == 0  # fmt: skip
    if not ok:
        need_packages("py:ensurepip+venv:python3-venv", who=who)
        print(f"setup: installing {' '.join(pins)} into {path}")
        subprocess.run([python, "-m", "venv", "--clear", path], check=True)
        subprocess.run([os.path.join(path, "bin", "pip"), "install", "-q",
                        "--disable-pip-version-check", *pins], check=True)  # fmt: skip
    return py
