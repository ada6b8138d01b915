"""Upstream code at a pinned commit: a work tree of a public repository, for the tests to run.

The pins live in one file, tests/support/upstream-pins (name, repository, ref, commit). For a
pin, `tree(name)` returns a directory holding that commit's files:

- the directory its variable names (`UPSTREAM_<NAME>`, upper case, `-` and `.` as `_`, e.g.
  UPSTREAM_IRONIC_IMAGE_RELEASE_38_0), used as it is: a developer's own checkout;
- else a clone of https://github.com/OWNER/NAME at the pinned commit, cached under
  ~/.cache/ironic-proxy/upstream/OWNER/NAME/COMMIT (made once, in a temporary directory renamed
  into place, so a broken clone is never taken for a good one).

When neither gives the tree it raises Failure naming the repository, the commit and the
variable: a test that needs upstream's code fails without it, it never skips.

Shell scripts use the same code through scripts/lib/upstream.sh; from the command line:

    python3 tests/support/python/ironic_proxy_testing/upstream.py NAME   # prints the tree
    python3 tests/support/python/ironic_proxy_testing/upstream.py --list # name repo commit
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ironic_proxy_testing.procs import Failure
else:
    from .procs import Failure

ROOT = Path(__file__).resolve().parents[4]
PINS = ROOT / "tests" / "support" / "upstream-pins"


class Pin:
    def __init__(self, name, repo, ref, commit):
        self.name, self.repo, self.ref, self.commit = name, repo, ref, commit

    @property
    def url(self):
        return f"https://github.com/{self.repo}"

    @property
    def variable(self):
        return "UPSTREAM_" + re.sub(r"[^A-Z0-9]", "_", self.name.upper())

    def describe(self):
        return f"{self.repo} at {self.commit} ({self.ref})"


def pins():
    """{name: Pin}, in the file's order."""
    out = {}
    for line in PINS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        if len(line) != 4 or not re.fullmatch(r"[0-9a-f]{40}", line[3]):
            raise Failure(f"{PINS}: a line must be NAME OWNER/REPO REF COMMIT (40 hex): {line}")
        out[line[0]] = Pin(*line)
    return out


def pin(name):
    known = pins()
    if name not in known:
        raise Failure(f"no upstream pin named {name!r} in {PINS} (known: {', '.join(known)})")
    return known[name]


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "ironic-proxy" / "upstream"


def _git(*args, cwd=None):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def _head(path):
    done = _git("rev-parse", "HEAD", cwd=path)
    return done.stdout.strip() if done.returncode == 0 else None


def tree(name, log=print):
    """The work tree of pin `name` (see the module's text); Failure when it cannot be had."""
    p = pin(name)
    given = os.environ.get(p.variable)
    if given:
        if not os.path.isdir(given):
            raise Failure(f"{p.variable}={given}: no such directory (it should hold "
                          f"{p.describe()})")
        return os.path.abspath(given)
    dest = cache_dir() / p.repo / p.commit
    if dest.is_dir() and _head(dest) == p.commit:
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{p.commit[:12]}-", dir=dest.parent))
    try:
        log(f"setup: cloning {p.url} at {p.commit[:12]} ({p.ref}) into {dest}")
        steps = [
            ("clone", "-q", "--no-checkout", p.url, str(work)),
            # A ref outside the default clone (a pull request's head) is fetched by name.
            ("-C", str(work), "fetch", "-q", "origin", f"+{p.ref}:refs/upstream-pin"),
            ("-C", str(work), "-c", "advice.detachedHead=false", "checkout", "-q", p.commit),
        ]
        for step in steps:
            done = _git(*step)
            if done.returncode != 0:
                raise Failure(
                    f"upstream tree {name}: cannot clone {p.describe()} "
                    f"(git {' '.join(step[:3])}: {done.stderr.strip() or done.returncode}); "
                    f"make {p.url} reachable (on a machine without GitHub: "
                    f"git config --global url.PATH.insteadOf {p.url}) or set {p.variable} "
                    "to a work tree of that commit")
        if _head(work) != p.commit:
            raise Failure(f"upstream tree {name}: the clone's HEAD is not {p.commit}")
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return str(dest)


def main(argv):
    if argv == ["--list"]:
        for p in pins().values():
            print(p.name, p.repo, p.commit, p.variable)
        return 0
    if len(argv) != 1:
        print("usage: upstream.py NAME | --list", file=sys.stderr)
        return 2
    try:
        print(tree(argv[0], log=lambda m: print(m, file=sys.stderr)))
    except Failure as e:
        print(f"upstream: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
