"""`scripts/check-docs --self-test`: each seeded disagreement, in a copy of the tree, must fail
with its message; then the tree itself is checked. So the checks are shown able to fail on every
run, not once by hand."""

import os
import shutil
import subprocess
import sys
import tempfile

from .common import BIN, ROOT, upstream_tree

# (what, file, text to replace, replacement, what the failure must say)
SEEDS = [
    ("a port", "docs/install.md", "| 6189 |", "| 6190 |", "listens on 6190"),
    ("a profile default", "config/profiles/balancer.toml", "${IRONIC_PROXY_DNS_REFRESH:-5s}",
     "${IRONIC_PROXY_DNS_REFRESH:-7s}", "IRONIC_PROXY_DNS_REFRESH"),
    ("a Secret's key", "docs/install.md", "| `ironic-mariadb` | `username`, `password` |",
     "| `ironic-mariadb` | `user`, `password` |", "Secret ironic-mariadb"),
    ("a variable", "docs/operate.md", "IRONIC_PROXY_DNS_REFRESH", "IRONIC_PROXY_DNS_REFRESHES",
     "IRONIC_PROXY_DNS_REFRESHES"),
    ("a flag", "docs/install.md", "--permit-dns \"$NS.svc\"", "--permit-dnz \"$NS.svc\"",
     "--permit-dnz"),
    ("a key default", "docs/reference.md", "default `10000`", "default `1024`",
     "max_connections"),
    ("a section link", "docs/troubleshoot.md", "operate.md#scale-out", "operate.md#scaling-out",
     "#scaling-out"),
    ("a skopeo copy", "docs/install.md", "skopeo copy --preserve-digests oci-archive",
     "skopeo copy oci-archive", "without --preserve-digests"),
    ("a hedge", "docs/install.md", "`ca init` writes it with `ca.crt` and `ca.key`.",
     "A binary that does not write it yet: copy `ca.crt`.", "hedges about a version"),
    ("a checkout", "docs/install.md", "To run them yourself you need that checkout.\n",
     "To run them yourself:\n\n```sh\nscripts/validate-k8s\n```\n", "without saying it needs a checkout"),
    ("the admin listener", "docs/install.md", "never `[::]`, which on the host network would",
     "and `[::]`. The admin listener binds `[::]` too, which on the host network would",
     "says the admin listener binds [::]"),
    ("a doctor sample", "docs/install.md", "PASS scale.ca: the CA has no name constraints\n", "",
     "sample output lacks the scale"),
    ("a doctor FAIL row", "docs/troubleshoot.md",
     "<a id=\"doctor-admin\"></a>`admin: ADDR: ...` / `admin: ADDR/readyz answers 503: <reason>`",
     "-", "`FAIL admin:"),
    ("a doctor check order", "docs/reference.md", "| `identity.sans` |", "| `admin` |",
     "doctor's table lists doctor-identity-expiry after doctor-admin"),
    ("a doctor FAIL line's link", "docs/troubleshoot.md", "<a id=\"doctor-peers-dns-each\"></a>",
     "", "link #doctor-peers-dns-each; no row"),
    ("a help text's count", "src/cli/kit.rs", "the kit's five Secrets", "the kit's four Secrets",
     "says four Secrets; `kit secrets` prints 5"),
    ("the README's doctor order", "README.md", "`scale.*`, `upstream[...]`",
     "`upstream[...]`, `scale.*`", "doctor's list gives scale.* after upstream[...]"),
    ("a command missing from the table", "README.md",
     "| `ironic-proxy kit check --site DIR --ca-dir DIR` |", "| `ironic-proxy kit` |",
     "no row for `ironic-proxy kit check`"),
    ("a count", "docs/compatibility.md", "x 12 variants in", "x 11 variants in",
     "under a heading of 11 variants"),
    ("a file name", "README.md", "$(cat ironic-python-agent.kernel.sha256)",
     "$(cat ipa-kernel.sha256)", "the quick start reads ipa-kernel.sha256"),
    ("a variable a command reads", "docs/troubleshoot.md",
     "`doctor` reads what `run` reads in the same container: the file `IRONIC_PROXY_CONFIG` names",
     "`doctor` reads the pod's profile from `IRONIC_PROXY_PROFILE`. Also the file",
     "without IRONIC_PROXY_CONFIG"),
    ("a section twice", "docs/e2e.md", "## What it does not cover\n",
     "## What it does not cover\n\n## Run it\n", "#run-it appears twice"),
    ("a kit check row", "docs/troubleshoot.md", "<a id=\"kit-check-vip-ca\"></a>", "",
     "linking #kit-check-vip-ca; no row"),
]
COPY = ["README.md", "BENCHMARKS.md", "Cargo.toml", "Dockerfile", "docs", "config", "src",
        "scripts", "tests", "benches", ".ci"]


def run(entry):
    env = dict(os.environ, IRONIC_PROXY_BIN=BIN, UPSTREAM_IRONIC_IMAGE=upstream_tree())
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in COPY:
            src = os.path.join(ROOT, name)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(tmp, name), ignore=shutil.ignore_patterns(
                    "target", "corpus", "__pycache__"))
            elif os.path.isfile(src):
                shutil.copy2(src, os.path.join(tmp, name))
        for what, path, old, new, expect in SEEDS:
            with open(os.path.join(tmp, path), encoding="utf-8") as f:
                text = f.read()
            if old not in text:
                print(f"FAIL self-test: seed {what!r}: {path} no longer holds {old!r}")
                failed += 1
                continue
            with open(os.path.join(tmp, path), "w", encoding="utf-8") as f:
                f.write(text.replace(old, new))
            out = subprocess.run([sys.executable, entry], env=dict(env, CHECK_DOCS_ROOT=tmp),
                                 capture_output=True, text=True)
            with open(os.path.join(tmp, path), "w", encoding="utf-8") as f:
                f.write(text)
            if out.returncode == 1 and expect in out.stdout:
                print(f"ok   self-test: {what} ({path}) fails: "
                      f"{next(l for l in out.stdout.splitlines() if expect in l)}")
            else:
                print(f"FAIL self-test: {what} ({path}): exit {out.returncode}, no line with "
                      f"{expect!r}:\n{out.stdout}{out.stderr}")
                failed += 1
    return failed
