#!/usr/bin/env python3
"""`scripts/validate-k8s --server`: the kit against a real API server (scripts/kube-up's).

Every variant (config/k8s/standalone, openshift, statefulset) with every component that fits
it (its `# Variants:` line; none: every variant), rendered by `kubectl kustomize` into a namespace of its own, created
with the kit's Pod Security labels (config/k8s/common/namespace.yaml), then applied with
`--dry-run=server`: admission (Pod Security, defaulting, validation of every field, immutable
names) decides. Then the proof that a manifest breaking the labels is refused: the standalone
DaemonSet's pod (host network, dnsmasq's capabilities) as a Pod, in a namespace at
`pod-security.kubernetes.io/enforce: baseline`, must be refused by Pod Security admission, and
the same Pod accepted in the kit's namespace. Pod Security enforces on Pods only (a workload
object gets a warning), hence the Pod.

Exit 0 only when every variant is accepted and the refusal happens; each line says what ran.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "config" / "k8s"
KUBECTL = Path(os.environ.get("IRONIC_PROXY_KUBECTL", "/var/lib/ironic-proxy-kube/kubectl"))
failed = []


def report(ok, subject, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {subject}: {detail}", flush=True)
    if not ok:
        failed.append(subject)


def kubectl(*args, stdin=None):
    return subprocess.run([str(KUBECTL), *args], input=stdin, capture_output=True, text=True,
                          timeout=120)


def components(variant):
    """The components whose `# Variants:` line names the variant."""
    out = []
    for d in sorted((KIT / "components").iterdir()):
        k = d / "kustomization.yaml"
        if not k.exists():
            continue
        m = re.search(r"^# Variants: (.*)$", k.read_text(), re.M)
        # No such line: the component fits every variant.
        if not m or variant in [v.strip(" .") for v in m.group(1).split(",")]:
            out.append(d.name)
    return out


def render(variant, ns, comps):
    with tempfile.TemporaryDirectory(dir=KIT) as d:
        rel = lambda p: os.path.relpath(p, d)  # noqa: E731 - kustomize wants relative paths
        text = {"namespace": ns, "resources": [rel(KIT / variant)],
                "components": [rel(KIT / "components" / c) for c in comps]}
        Path(d, "kustomization.yaml").write_text(yaml.safe_dump(text))
        p = subprocess.run(["kubectl", "kustomize", d], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-400:])
    return [o for o in yaml.safe_load_all(p.stdout) if o]


def namespace(ns, level=None):
    """The namespace for real (a dry run of it would leave nothing to put objects in), with the
    kit's labels, or the given enforce level."""
    labels = yaml.safe_load((KIT / "common" / "namespace.yaml").read_text())["metadata"]["labels"]
    if level:
        labels = {k: (level if k.startswith("pod-security") else v) for k, v in labels.items()}
    obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
    p = kubectl("apply", "-f", "-", stdin=json.dumps(obj))
    if p.returncode != 0:
        raise RuntimeError(f"namespace {ns}: {p.stderr.strip()[-300:]}")


def main():
    if not KUBECTL.exists() or kubectl("get", "--raw", "/readyz").stdout.strip() != "ok":
        print(f"validate-k8s --server: no cluster answers through {KUBECTL}: run scripts/kube-up "
              "first", file=sys.stderr)
        return 1
    version = json.loads(kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    print(f"validate-k8s --server: API server {version}")
    for variant in ("standalone", "openshift", "statefulset"):
        comps = components(variant)
        ns = f"vk-{variant}"
        try:
            namespace(ns)
            objs = [o for o in render(variant, ns, comps) if o["kind"] != "Namespace"]
        except RuntimeError as e:
            report(False, f"{variant} + {', '.join(comps)}", str(e))
            continue
        p = kubectl("apply", "--dry-run=server", "-f", "-",
                    stdin="\n---\n".join(json.dumps(o) for o in objs))
        warn = [l for l in p.stderr.splitlines() if l.startswith("Warning")]
        report(p.returncode == 0, f"{variant} + {', '.join(comps)} in {ns} (privileged)",
               f"{len(objs)} objects accepted by the API server (--dry-run=server)"
               + (f"; {len(warn)} warnings: {warn[:2]}" if warn else "")
               if p.returncode == 0 else p.stderr.strip()[-600:])
    # The refusal: the kit's host-network pod where the level does not admit it.
    ds = next(o for o in render("standalone", "vk-baseline", ["dhcp"])
              if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "ironic")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "ironic-pod-security-check", "namespace": "vk-baseline"},
           "spec": ds["spec"]["template"]["spec"]}
    namespace("vk-baseline", level="baseline")
    p = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    said = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    report(p.returncode != 0 and "violates PodSecurity" in p.stderr,
           "the kit's Ironic pod in a namespace at enforce=baseline is refused",
           said[:400] or "accepted")
    pod["metadata"]["namespace"] = "vk-standalone"
    p = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    report(p.returncode == 0, "the same pod in the kit's namespace (enforce=privileged) is "
           "accepted", p.stdout.strip() or p.stderr.strip()[-300:])
    for ns in ("vk-standalone", "vk-openshift", "vk-statefulset", "vk-baseline"):
        kubectl("delete", "namespace", ns, "--wait=false")
    print(f"validate-k8s --server: {'FAILED: ' + ', '.join(failed) if failed else 'passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
