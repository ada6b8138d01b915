"""Checks 1 to 6 of scripts/check-docs: variables, defaults, site keys, Secrets, ports."""

import glob
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import yaml

SUPPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "support")
sys.path.insert(0, os.path.join(SUPPORT, "python"))
from ironic_proxy_testing import pki  # noqa: E402

from .common import (BIN, PROFILES, ROOT, VARIANTS, count, fail, kit_docs, pod_specs,
                     profile_vars, prose_lines, read, rust_profile_vars, source_text,
                     upstream_auth_files, upstream_tree, walk)

# Variables of other programs that documents name, with whose they are (no tree of theirs here).
OTHERS = {"IRONIC_ENDPOINT": "baremetal-operator's Ironic URL"}


# ------------------------------------------------------------------ 1, 2, 3: variables
def check_variables(all_docs, ref):
    # Ours (IRONIC_PROXY_*, the kit's IRONIC_NO_PROXY) and ironic-image's (IRONIC_*): a name a
    # document gives must be in this repository's code, profiles, kit or scripts, or in
    # ironic-image's tree. `$NAME`/`${NAME}` is a shell variable the document itself sets.
    universe = source_text(["src/**/*", "config/**/*", "scripts/*", "tests/**/*", "benches/**/*",
                            "Dockerfile", ".ci/*", "Cargo.toml"])
    upstream = source_text([os.path.join(upstream_tree(), "**", "*")])
    pattern = r"(?<![\w$])(?<!\$\{)IRONIC_[A-Z0-9_]*[A-Z0-9]"
    known = set(re.findall(r"IRONIC_[A-Z0-9_]*[A-Z0-9]", universe + upstream))
    for path, text in all_docs:
        for n, line, _ in prose_lines(text):
            for v in re.findall(pattern, line):
                count("variables named")
                if v in known or v in OTHERS:
                    continue
                fail(f"{path}:{n}", f"{v} is in no code, profile, kit or script here, nor in "
                     "ironic-image")

    sec = ref[ref.index("\n## Built-in profiles"):]
    sec = sec[:re.search(r"\n#{2,3} ", sec[4:]).start() + 4]
    rows = {}
    for line in sec.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 3 and cells[0].startswith("`"):
            for v in re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[0]):
                rows[v] = cells
    tomlv = profile_vars()
    rust = rust_profile_vars()
    for v in sorted(set(tomlv) | rust):
        if v not in rows:
            fail("docs/reference.md", f"the profiles read {v}; the variable table lacks it")
    for v in sorted(rows):
        if v not in tomlv and v not in rust:
            fail("docs/reference.md", f"the variable table lists {v}, which no profile reads")
    for v, per in sorted(tomlv.items()):
        if v not in rows:
            continue
        row = " | ".join(rows[v][1:])
        for prof, default in sorted(per.items()):
            count("profile defaults")
            if default is None:
                ok = "required" in rows[v][1]
                want = "required"
            elif default == "":
                ok = re.search(r"empty|unset|none|system resolver", rows[v][1]) is not None
                want = "empty"
            else:
                ok = f"`{default}`" in row
                want = f"`{default}`"
            if not ok:
                fail("docs/reference.md", f"{v}: config/profiles/{prof} defaults to {want!s}; "
                     f"the table says {rows[v][1]!r}")

    # The kit's own names: a proxy container's are profile variables (the reference); another
    # container's (IRONIC_PROXY_EGRESS_AUTH of Ironic's) must be explained in some document.
    every_doc = "\n".join(t for _, t in all_docs)
    for path, obj in kit_docs():
        for spec in pod_specs(obj):
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                proxy = "ironic-proxy" in str(c.get("image", ""))
                for e in c.get("env", []) or []:
                    name = e.get("name", "")
                    if not name.startswith("IRONIC_PROXY_"):
                        continue
                    if proxy and f"`{name}`" not in ref:
                        fail(path, f"the kit sets {name} on {c['name']}; docs/reference.md "
                             "does not document it")
                    elif not proxy and f"`{name}`" not in every_doc:
                        fail(path, f"the kit sets {name} on {c['name']}; no document says it")
    return rows


# ------------------------------------------------------------------ 4, 5: site keys, Secrets
def check_site_and_secrets(all_docs):
    install = read("docs/install.md")
    site = yaml.safe_load(read("config/k8s/common/site.yaml"))
    for key in site.get("data", {}):
        count("site keys")
        if f"`{key}`" not in install:
            fail("docs/install.md", f"the site ConfigMap has {key}; the install page does not say it")
    # And back: every key of install.md's site table (`| key | set it to |`) is in the ConfigMap.
    start = install.index("| key | set it to |")
    for n, line in enumerate(install[start:].splitlines()[2:], 1):
        if not line.startswith("|"):
            break
        for key in re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]):
            count("site keys")
            if key not in site.get("data", {}):
                fail("docs/install.md", f"the site table names {key}; config/k8s/common/site.yaml "
                     "has no such key")

    paths = set(upstream_auth_files())
    for name, per in profile_vars().items():
        for default in per.values():
            if default and default.startswith("/"):
                paths.add(default)
    for p in glob.glob(os.path.join(ROOT, "config", "profiles", "*.toml")):
        with open(p, encoding="utf-8") as f:
            for m in re.finditer(r'"\$\{[A-Z_0-9]+:-(/[^}]*)\}(/[^"]*)"', f.read()):
                paths.add(m.group(1) + m.group(2))

    kit_keys = {}  # Secret -> keys, from the variants
    all_secrets = set()
    for path, obj in kit_docs():
        variant = path.split("/")[2]
        for d in walk(obj):
            if "secretName" in d:
                all_secrets.add(d["secretName"])
            if isinstance(d.get("secretKeyRef"), dict):
                all_secrets.add(d["secretKeyRef"]["name"])
            for k in ("apiCredentialsName", "credentialsName", "certificateName"):
                if isinstance(d.get(k), str):
                    all_secrets.add(d[k])
        if variant not in VARIANTS and variant != "common":
            continue
        for spec in pod_specs(obj):
            volumes = {v["name"]: v["secret"] for v in spec.get("volumes", []) if "secret" in v}
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                values = {e.get("value") for e in c.get("env", []) if isinstance(e.get("value"), str)}
                for e in c.get("env", []):
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                    if ref:
                        kit_keys.setdefault(ref["name"], set()).add(ref["key"])
                for m in c.get("volumeMounts", []):
                    sec = volumes.get(m["name"])
                    if not sec:
                        continue
                    keys = kit_keys.setdefault(sec["secretName"], set())
                    if sec.get("items"):
                        keys.update(i["key"] for i in sec["items"])
                        continue
                    for p in paths | values:
                        if p.startswith(m["mountPath"].rstrip("/") + "/"):
                            keys.add(p[len(m["mountPath"].rstrip("/")) + 1:])

    # The Secrets baremetal-operator mounts (its config/components basic-auth and tls), which
    # components/bmo names for it and the quick start makes: part of the kit's contract too.
    with open(os.path.join(ROOT, "config", "k8s", "components", "bmo", "kustomization.yaml"),
              encoding="utf-8") as f:
        all_secrets |= set(re.findall(r"#\s+-\s+Secret ([a-z0-9]+(?:-[a-z0-9]+)+),", f.read()))

    table = {}
    start = install.index("## 3. Create the Secrets")
    for line in install[start:install.index("\n## ", start + 5)].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 2:
            table[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[1]))
    for secret in sorted(set(kit_keys) | set(table)):
        count("Secrets")
        want, have = kit_keys.get(secret), table.get(secret)
        if want is None:
            fail("docs/install.md", f"the Secrets table has {secret}; the kit mounts no such Secret")
        elif have is None:
            fail("docs/install.md", f"the kit mounts the Secret {secret} (keys {sorted(want)}); "
                 "the Secrets table lacks it")
        elif want != have:
            fail("docs/install.md", f"Secret {secret}: the table says keys {sorted(have)}, the kit "
                 f"reads {sorted(want)}")
    pats = [r"[Ss]ecrets?\s+`([a-z0-9]+(?:-[a-z0-9]+)+)`", r"`([a-z0-9]+(?:-[a-z0-9]+)+)`\s+Secret",
            r"secret generic ([a-z0-9]+(?:-[a-z0-9]+)+)", r"secretName: ([a-z0-9]+(?:-[a-z0-9]+)+)"]
    every_doc = "\n".join(t for _, t in all_docs)
    for secret in sorted(all_secrets):
        if f"`{secret}`" not in every_doc:
            fail("config/k8s", f"the kit uses the Secret {secret}; no document names it")
    # Lists: in a sentence about Secrets, every `name` followed by its keys in parentheses.
    for path, text in all_docs:
        for para in re.split(r"\n\s*\n", text):
            for sentence in re.split(r"\.\s", para.replace("\n", " ")):
                if "Secret" not in sentence:
                    continue
                for s in re.findall(r"`([a-z0-9]+(?:-[a-z0-9]+)+)` \(", sentence):
                    count("Secret names")
                    if s not in all_secrets:
                        fail(path, f"names the Secret {s} in a list of Secrets, which the kit "
                             f"does not have (it has {', '.join(sorted(all_secrets))})")
    for path, text in all_docs:
        for n, line, _ in prose_lines(text):
            for pat in pats:
                for s in re.findall(pat, line):
                    count("Secret names")
                    if s not in all_secrets:
                        fail(f"{path}:{n}", f"names the Secret {s}, which the kit does not have "
                             f"(it has {', '.join(sorted(all_secrets))})")


# ------------------------------------------------------------------ 6: ports
PROFILE_TABLES = {}  # table -> profile -> the effective table, filled by effective()


def effective(profile, container_env, tmp):
    env = {"PATH": os.environ.get("PATH", ""), "POD_NAME": "ironic-0", "POD_NAMESPACE": "metal3",
           "POD_IPS": "127.0.0.1", "IRONIC_PROXY_PEER_CIDRS": "127.0.0.0/8"}
    env.update(container_env)
    env.update({"IRONIC_PROXY_TRUST": f"{tmp}/ca/ca.crt", "IRONIC_PROXY_ISSUER_DIR": f"{tmp}/ca",
                "IRONIC_PROXY_EXPORT_DIR": f"{tmp}/export", "IRONIC_PROXY_HTPASSWD": "none"})
    if "IRONIC_PROXY_EGRESS_CREDENTIALS" in env:
        env["IRONIC_PROXY_EGRESS_CREDENTIALS"] = f"{tmp}/credentials"
    if "IRONIC_PROXY_METRICS_TOKEN_FILE" in env:
        with open(f"{tmp}/metrics-token", "w") as f:
            f.write("sample-token\n")
        env["IRONIC_PROXY_METRICS_TOKEN_FILE"] = f"{tmp}/metrics-token"
    run = subprocess.run([BIN, "check", "--profile", profile], env=env, capture_output=True,
                         text=True, timeout=60)
    if run.returncode != 0:
        sys.exit(f"check-docs: {BIN} check --profile {profile}: {run.stderr.strip()}")
    cfg = tomllib.loads(run.stdout)
    for table in ("dns", "limits"):
        PROFILE_TABLES.setdefault(table, {})[profile] = cfg.get(table, {})
    ports = {l["name"]: int(l["listen"].rsplit(":", 1)[1]) for l in cfg.get("listeners", [])}
    if "admin" in cfg:
        listen = cfg["admin"]["listen"]
        listen = listen if isinstance(listen, list) else [listen]
        admin_ports = {int(a.rsplit(":", 1)[1]) for a in listen}
        if len(admin_ports) != 1:
            sys.exit(f"check-docs: {profile}: admin listens on several ports {sorted(admin_ports)}")
        ports["admin"] = admin_ports.pop()
    return ports


def check_ports():
    kit = {}  # profile -> the literal env of the kit container that runs it
    for path, obj in kit_docs():
        if path.split("/")[2] not in VARIANTS:
            continue
        for spec in pod_specs(obj):
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                env = {e["name"]: e["value"] for e in c.get("env", []) if isinstance(e.get("value"), str)}
                if env.get("IRONIC_PROXY_PROFILE") in PROFILES:
                    kit[env.pop("IRONIC_PROXY_PROFILE")] = env
    missing = set(PROFILES) - set(kit)
    if missing:
        fail("config/k8s", f"no kit container runs the profile(s) {sorted(missing)}")
    with tempfile.TemporaryDirectory() as tmp:
        pki.ca_init(BIN, f"{tmp}/ca")
        with open(f"{tmp}/credentials", "w") as f:
            f.write("ironic:0123456789abcdef\n")
        actual = {p: effective(p, env, tmp) for p, env in kit.items()}
    install = read("docs/install.md")
    rows = 0
    for n, line, fenced in prose_lines(install):
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if fenced or not m:
            continue
        port = int(m.group(1))
        for prof, listener, admin in re.findall(
                r"`(sidecar-openshift|sidecar|balancer)`:\s*(?:`([a-z0-9-]+)`|(admin))", m.group(2)):
            rows += 1
            count("ports")
            name = listener or admin
            got = actual.get(prof, {}).get(name)
            if got != port:
                fail(f"docs/install.md:{n}", f"says {prof}'s {name} listens on {port}; "
                     f"`check --profile {prof}` with the kit's variables says {got}")
    if rows == 0:
        fail("docs/install.md", "no ports table with `profile`: `listener` cells found")
