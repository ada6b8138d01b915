"""Shared state and sources of truth of scripts/check-docs: the documents, the kit, the profiles,
ironic-image's pinned tree, and the failure list every check appends to."""

import glob
import os
import re
import sys

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "support", "python"))
from ironic_proxy_testing import Failure, upstream  # noqa: E402

# CHECK_DOCS_ROOT: a copy of the tree (--self-test seeds disagreements into one).
ROOT = os.environ.get("CHECK_DOCS_ROOT") or os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

BIN = os.environ.get("IRONIC_PROXY_BIN", os.path.join(ROOT, "target", "debug", "ironic-proxy"))
VARIANTS = ("standalone", "openshift", "statefulset")
PROFILES = ("sidecar", "sidecar-openshift", "balancer")
# Named by the fourth milestone's contract (docs name them) and built on other branches: a flag
# or subcommand listed here may be missing from --help. Once --help has it, this check fails
# until the entry is removed, so the list cannot outlive the merge.
PENDING = set()

failures = []
# How many statements each check compared, printed at the end: a check that found nothing to
# compare is itself a failure (a renamed heading or table must not turn a check off).
counts = {}


def count(what, n=1):
    counts[what] = counts.get(what, 0) + n


def fail(where, msg):
    failures.append(f"{where}: {msg}")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def docs():
    """README.md and every document under docs/ but the history diary, as (path, text)."""
    paths = ["README.md"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [(p, read(p)) for p in paths if not p.endswith("benchmarks-history-2026.md")]


def prose_lines(text):
    """(line number, line, inside a fenced block) for every line."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            yield n, line, True
            continue
        yield n, line, fenced


# ------------------------------------------------------------------ sources of truth
def source_text(globs):
    out = []
    for g in globs:
        for p in glob.glob(os.path.join(ROOT, g), recursive=True):
            if os.path.isfile(p) and not p.endswith(".md"):
                with open(p, encoding="utf-8", errors="replace") as f:
                    out.append(f.read())
    return "\n".join(out)


def kit_docs():
    """Every YAML document under config/k8s, as (file, object)."""
    out = []
    for p in sorted(glob.glob(os.path.join(ROOT, "config", "k8s", "**", "*.yaml"), recursive=True)):
        with open(p, encoding="utf-8") as f:
            for d in yaml.safe_load_all(f):
                if isinstance(d, dict):
                    out.append((os.path.relpath(p, ROOT), d))
    return out


def walk(o):
    if isinstance(o, dict):
        yield o
        for v in o.values():
            yield from walk(v)
    elif isinstance(o, list):
        for v in o:
            yield from walk(v)


def pod_specs(obj):
    """Pod specs of a workload (DaemonSet, Job, ...) and the IrSO recipe's overrides."""
    for d in walk(obj):
        if "containers" in d or "initContainers" in d:
            yield d


def profile_vars():
    """{var: {profile file: default or None}} from config/profiles/*.toml."""
    out = {}
    for p in sorted(glob.glob(os.path.join(ROOT, "config", "profiles", "*.toml"))):
        name = os.path.basename(p)
        with open(p, encoding="utf-8") as f:
            text = "\n".join(l for l in f.read().splitlines() if not l.lstrip().startswith("#"))
        for m in re.finditer(r"\$\{([A-Z_][A-Z0-9_]*)(?::-([^}]*))?\}", text):
            out.setdefault(m.group(1), {})[name] = m.group(2)
    return out


def rust_profile_vars():
    files = [p for p in glob.glob(os.path.join(ROOT, "src", "config", "profile", "*.rs"))
             if not p.endswith("tests.rs")]
    out = set()
    for p in files:
        with open(p, encoding="utf-8") as f:
            for m in re.finditer(r'"((?:IRONIC|POD|PROVISIONING)_[A-Z0-9_]+)"', f.read()):
                out.add(m.group(1))
    # Cipher-suite names are string literals too; they are not variables.
    return {v for v in out if not v.startswith("TLS_")}


def upstream_tree():
    """The pinned ironic-image tree (main), as every harness gets it: it says which files its
    scripts read and which variables it has. None to be had: check-docs fails."""
    try:
        return upstream.tree("ironic-image")
    except Failure as e:
        sys.exit(f"check-docs: {e}")


def upstream_auth_files():
    """Files ironic-image's scripts read under /auth."""
    return set(re.findall(r"/auth/[a-z-]+/[A-Za-z0-9._-]+",
                          source_text([os.path.join(upstream_tree(), "scripts", "*")])))
