#!/usr/bin/env python3
"""The kit's load balancer DaemonSet rolled out on a real Kubernetes refuses no connection
(issue 62; the cluster of scripts/kube-up, issue 63).

On the cluster scripts/kube-up started (one node at least), in a namespace of its own with the
kit's Pod Security labels:

- the kit's balancer, `config/k8s/components/balancer/balancer.yaml` as the kit ships it (its
  image set to the one scripts/build-image made, imported into each node's containerd), with
  the Secrets and the site ConfigMap it reads;
- two stand-ins for Ironic's pods behind the headless Service `ironic` (port 6385), so that the
  balancer finds healthy peers and turns ready: ironic-proxy with a TLS listener whose leaf it
  issues from the same CA for its pod IP, in front of busybox's httpd. They are not Ironic;
  the balancer only needs an answering peer.

A client on the node's network opens one connection per request to NODE:6385 (TLS verified
against the CA, `GET /`) all along while `kubectl rollout restart` replaces the balancer pod:
with the kit's strategy (maxSurge 1, maxUnavailable 0, `limits.handover` in the profile) no
connection is refused, reset or failed, and the pod was replaced. Then the same with the strategy
the kit had before (maxUnavailable 1, maxSurge 0): connections are refused while the node has
no balancer, which shows the check can fail.

    python3 tests/e2e/kube_balancer_rollout.py [--keep]

Needs root, the cluster up (scripts/kube-up) and the image (scripts/build-image). Every wait is
for an event and bounded; the client's loop is bounded by a request count.
"""

import argparse
import glob
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support", "python"))
from ironic_proxy_testing.procs import Failure, run, wait_for  # noqa: E402

STATE = "/var/lib/ironic-proxy-kube"
RUN = "/run/ironic-proxy-kube"
NS = "ipk-rollout"
PORT = 6385
MAX_REQUESTS = 100_000


def sh(argv, what, stdin=None):
    """procs.run for the commands here (a rollout may wait up to its own 180 s)."""
    return run(argv, what, timeout=300, input=stdin).stdout


def kubectl(*args, stdin=None):
    """The cluster's kubectl, run in its network namespace (scripts/kube-up writes it)."""
    return sh([os.path.join(STATE, "kubectl"), *args], f"kubectl {' '.join(args[:3])}", stdin)


def nodes():
    doc = json.loads(kubectl("get", "nodes", "-o", "json"))
    out = []
    for n in doc["items"]:
        ip = next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
        out.append((n["metadata"]["name"], ip))
    return out


def import_image(image):
    """The image into every node's containerd (k8s.io namespace), as an OCI archive."""
    found = sorted(glob.glob(os.path.expanduser("~/.cache/ironic-proxy/kube/containerd-*/bin/ctr")))
    if not found:
        raise Failure("no ctr from scripts/kube-up's containerd build")
    ctr = found[-1]
    with tempfile.TemporaryDirectory() as d:
        archive = os.path.join(d, "image.tar")
        sh(["podman", "save", "--format", "oci-archive", "-o", archive, image],
           f"podman save {image}")
        for role in sorted(os.listdir(RUN)):
            sock = os.path.join(RUN, role, "containerd.sock")
            if os.path.exists(sock):
                sh([ctr, "--address", sock, "-n", "k8s.io", "images", "import", archive],
                   f"ctr import on {role}")


def yaml_docs(*docs):
    return "\n---\n".join(json.dumps(d) for d in docs)


def secrets(ca_dir, tmp):
    """The Secrets and ConfigMaps the balancer and the stand-ins read."""
    read = lambda p: open(p).read()
    htpasswd = sh(["htpasswd", "-nbB", "rollout", "rollout-password"], "htpasswd").strip()
    ca = {"ca.crt": read(f"{ca_dir}/ca.crt"), "ca.key": read(f"{ca_dir}/ca.key"),
          "ca-bundle.crt": read(f"{ca_dir}/ca.crt")}
    peer = f"""
[identity]
trust = "/ca/ca-bundle.crt"
issuer_cert = "/ca/ca.crt"
issuer_key = "/ca/ca.key"
ip_addresses = ["${{POD_IP}}"]
validity = "24h"
renew_before = "8h"

[admin]
listen = "127.0.0.1:9901"

[[listeners]]
name = "api"
listen = "0.0.0.0:{PORT}"
tls = "server"
upstream = "127.0.0.1:8080"
"""
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ironic-proxy-ca"},
         "stringData": ca},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ironic-htpasswd"},
         "stringData": {"htpasswd": htpasswd + "\n"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ironic-proxy-metrics"},
         "stringData": {"token": "rollout-metrics-token"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ironic-proxy-site"},
         "data": {"RUST_LOG": "info"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "peer"},
         "data": {"peer.toml": peer}},
    ]


def stand_ins(image):
    """Two answering peers behind the headless Service `ironic`."""
    labels = {"app.kubernetes.io/name": "ironic"}
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ironic"},
         "spec": {"clusterIP": "None", "selector": labels,
                  "ports": [{"name": "api", "port": PORT}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "ironic"},
         "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "automountServiceAccountToken": False,
                      "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                          "runAsGroup": 65532, "fsGroup": 65532,
                                          "seccompProfile": {"type": "RuntimeDefault"}},
                      "containers": [
                          {"name": "httpd", "image": "registry.k8s.io/pause:3.10",
                           "imagePullPolicy": "Never",
                           "command": ["/bin/busybox", "sh", "-c",
                                       "echo '{\"name\": \"stand-in\"}' > /www/index.html && "
                                       "exec /bin/busybox httpd -f -p 127.0.0.1:8080 -h /www"],
                           "securityContext": {"allowPrivilegeEscalation": False,
                                               "capabilities": {"drop": ["ALL"]}},
                           "volumeMounts": [{"name": "www", "mountPath": "/www"}]},
                          {"name": "ironic-proxy", "image": image,
                           "imagePullPolicy": "Never",
                           "args": ["run", "--config", "/etc/peer/peer.toml"],
                           "env": [{"name": "POD_IP", "valueFrom": {
                               "fieldRef": {"fieldPath": "status.podIP"}}}],
                           "securityContext": {"allowPrivilegeEscalation": False,
                                               "capabilities": {"drop": ["ALL"]}},
                           "volumeMounts": [{"name": "ca", "mountPath": "/ca"},
                                            {"name": "peer", "mountPath": "/etc/peer"}]}],
                      "volumes": [{"name": "www", "emptyDir": {}},
                                  {"name": "ca", "secret": {"secretName": "ironic-proxy-ca"}},
                                  {"name": "peer", "configMap": {"name": "peer"}}]}}}},
    ]


def balancer(image):
    """The kit's balancer DaemonSet as shipped, its image the local one."""
    text = open(os.path.join(ROOT, "config", "k8s", "components", "balancer",
                             "balancer.yaml")).read()
    text = text.replace("image: ironic-proxy\n", f"image: {image}\n")
    if image not in text:
        raise Failure("balancer.yaml: no `image: ironic-proxy` to set")
    return text


def one_request(addr, ctx):
    """One TLS connection, `GET /`, the whole answer read."""
    with socket.create_connection(addr, timeout=10) as raw:
        with ctx.wrap_socket(raw) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    status = data.split(b"\r\n", 1)[0]
    # 401: the balancer answered (the API is behind Basic auth); what counts is that it did,
    # on a connection it accepted.
    if b" 401 " not in status and b" 200 " not in status:
        raise OSError(f"answer {status!r}")


def client_main(node_ip, ca):
    """The client, run in the first node's network namespace (`ip netns exec`): one line per
    request on stdout, `ok` or `fail ...`, until stdin closes (or MAX_REQUESTS)."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False  # the leaf names the node's address, which the CA permits
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    for i in range(MAX_REQUESTS):
        if stop.is_set():
            return
        try:
            one_request((node_ip, PORT), ctx)
            print("ok", flush=True)
        except (OSError, ssl.SSLError) as e:
            print(f"fail request {i}: {type(e).__name__}: {e}", flush=True)
            time.sleep(0.05)  # a refused dial returns at once: pace the retries


class Client:
    """client_main in the node's network, its lines counted here."""

    def __init__(self, node_ip, ca):
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", "ipk-cp1", sys.executable, os.path.abspath(__file__),
             "--client", node_ip, ca], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        self.answered, self.failures = 0, []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            if line.strip() == "ok":
                self.answered += 1
            else:
                self.failures.append(line.strip())

    def finish(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)
        self.reader.join(timeout=30)
        return self.answered, self.failures


def pod_uid():
    doc = json.loads(kubectl("-n", NS, "get", "pods", "-l",
                             "app.kubernetes.io/name=ironic-proxy-lb", "-o", "json"))
    return sorted(p["metadata"]["uid"] for p in doc["items"])


def roll(node_ip, ca, what):
    """kubectl rollout restart under the client's load; returns (answered, failures)."""
    before = pod_uid()
    client = Client(node_ip, ca)
    wait_for("the client's first answers", lambda: client.answered >= 20 or client.failures,
             60)
    kubectl("-n", NS, "rollout", "restart", "daemonset/ironic-proxy-lb")
    kubectl("-n", NS, "rollout", "status", "daemonset/ironic-proxy-lb", "--timeout=180s")
    after = pod_uid()
    seen = client.answered
    wait_for("answers after the rollout", lambda: client.answered >= seen + 20, 60)
    answered, failures = client.finish()
    if before == after:
        raise Failure(f"{what}: the balancer pod was not replaced")
    return answered, failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the namespace in place")
    parser.add_argument("--client", nargs=2, metavar=("NODE_IP", "CA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(*args.client)
        return
    if not os.path.exists(os.path.join(STATE, "kubectl")):
        sys.exit("FAIL: no cluster: run scripts/kube-up first")
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        version = tomllib.load(f)["package"]["version"]
    image = f"localhost/ironic-proxy:{version}"
    passed = 0
    with tempfile.TemporaryDirectory() as tmp:
        ca_dir = os.path.join(tmp, "ca")
        binary = os.environ.get("IRONIC_PROXY_BIN", os.path.join(ROOT, "target", "debug",
                                                                 "ironic-proxy"))
        node_ips = [ip for _, ip in nodes()]
        sh([binary, "ca", "init", "--out", ca_dir, "--name", "rollout CA",
            *[a for ip in node_ips for a in ("--permit-ip", f"{ip}/32")],
            "--permit-ip", "10.244.0.0/16", "--permit-dns", f"{NS}.svc"], "ca init")
        import_image(image)
        for name, _ in nodes():
            kubectl("label", "--overwrite", "node", name,
                    "node-role.kubernetes.io/control-plane=")
        kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true")
        kubectl("create", "namespace", NS)
        kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=privileged")
        try:
            kubectl("-n", NS, "apply", "-f", "-",
                    stdin=yaml_docs(*secrets(ca_dir, tmp), *stand_ins(image)))
            kubectl("-n", NS, "rollout", "status", "deployment/ironic", "--timeout=180s")
            kubectl("-n", NS, "apply", "-f", "-", stdin=balancer(image))
            kubectl("-n", NS, "rollout", "status", "daemonset/ironic-proxy-lb",
                    "--timeout=180s")
            ca = os.path.join(ca_dir, "ca.crt")
            node_ip = node_ips[0]

            answered, failures = roll(node_ip, ca, "maxSurge 1")
            print(f"kit's strategy (maxSurge 1, maxUnavailable 0, limits.handover): "
                  f"{answered} requests answered, {len(failures)} failed, pod replaced")
            if failures:
                raise Failure(f"the rollout refused or failed connections: {failures[:5]}")
            passed += 1

            kubectl("-n", NS, "patch", "daemonset", "ironic-proxy-lb", "--type", "merge", "-p",
                    json.dumps({"spec": {"updateStrategy": {"type": "RollingUpdate",
                                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}}))
            answered, failures = roll(node_ip, ca, "maxSurge 0")
            print(f"the previous strategy (maxUnavailable 1, maxSurge 0): {answered} answered, "
                  f"{len(failures)} failed, e.g. {failures[:1]}")
            if not failures:
                raise Failure("stop-then-start refused nothing: the check cannot tell")
            passed += 1
        finally:
            if not args.keep:
                kubectl("delete", "namespace", NS, "--wait=false")
    print(f"kube_balancer_rollout: {passed} passed, 0 failed")


if __name__ == "__main__":
    try:
        main()
    except Failure as e:
        sys.exit(f"FAIL: {e}")
