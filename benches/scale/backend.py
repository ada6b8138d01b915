#!/usr/bin/env python3
"""The scale benchmark's backend: answers shaped like Ironic's API, on a unix socket (what the
proxies forward to) and on 127.0.0.1 TCP (the "backend hit directly" baseline).

Like Ironic's own WSGI server (cheroot), one thread per connection writing on a blocking socket;
every answer is built once at start, so the backend only copies bytes into the kernel.

- `GET /v1/nodes?detail=true`: `{"nodes": [...]}` with `--nodes` nodes (10,000: ~51 MB), every
  node the document of node.json with its own uuid, name and addresses. With `&limit=N` the first
  N nodes and a `next` link, as Ironic pages (its `[api]max_limit` is 1,000 by default; a single
  10,000-node answer is what a raised max_limit gives).
- `GET /v1/lookup?addresses=...`: the lookup answer of Ironic's ramdisk API (node subset, agent
  config), 200.
- `POST /v1/heartbeat/<uuid>`: reads the JSON body whole, then 202 with no body (as Ironic).
  The heartbeat of benches/load/loadgen.rs (its `HEARTBEAT_PATH`, the latency probe) gets 200
  and a 195-byte node document instead, as benches/load/backend.rs answers it: loadgen counts
  only a 200 as a success.
- anything else (`/health`, `/small`): a 13-byte JSON body, 200.

Usage: backend.py --unix PATH [--tcp 127.0.0.1:PORT] [--nodes 10000]
Prints `ready <bytes of the full listing>` once both sockets listen.
"""

import argparse
import json
import os
import re
import socket
import socketserver
import sys
import threading
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE_UUID = "6d85703a-565d-469a-96ce-30b6de53079d"
SMALL = b'{"ok": true}\n'
# loadgen's heartbeat path, read from its source so the two cannot drift apart.
PROBE = re.search(r'HEARTBEAT_PATH: &str = "([^"]+)"',
                  (HERE.parent / "load" / "loadgen.rs").read_text()).group(1).encode()
PROBE_ANSWER = (b'{"uuid":"1be26c0b-03f2-4d2e-ae87-c02d7f33c123","provision_state":"deploying",'
                b'"target_provision_state":"active","power_state":"power on","last_error":null,'
                b'"updated_at":"2026-12-03T07:00:00+00:00"}')


def node_docs(count):
    """`count` serialized nodes: node.json with a per-node uuid, name and BMC/agent addresses."""
    text = json.dumps(json.loads((HERE / "node.json").read_text()))
    out = []
    for i in range(count):
        u = str(uuid.UUID(int=(0x6D85703A << 96) + i))
        out.append(text.replace(TEMPLATE_UUID, u)
                   .replace("worker-00000", f"worker-{i:05d}")
                   .replace("192.168.111.20:", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:"))
    return out


def listing(docs, limit):
    """Ironic's answer to `GET /v1/nodes?detail=true[&limit=N]`."""
    body = '{"nodes": [' + ", ".join(docs[:limit]) + "]"
    if limit < len(docs):
        body += (', "next": "https://172.22.0.2:6385/v1/nodes?detail=True&limit=%d&marker=%s"'
                 % (limit, json.loads(docs[limit - 1])["uuid"]))
    return (body + "}").encode()


def lookup_answer():
    """Ironic's `GET /v1/lookup` answer (ramdisk.py: `convert_with_links` of the node's
    restricted fields, `config()`), for the template node."""
    n = json.loads((HERE / "node.json").read_text())
    node = {k: n[k] for k in ("uuid", "properties", "instance_info", "driver_internal_info",
                              "links")}
    config = {
        "metrics": {"backend": "noop", "prepend_host": False, "prepend_uuid": False,
                    "prepend_host_reverse": True, "global_prefix": None},
        "metrics_statsd": {"statsd_host": "localhost", "statsd_port": 8125},
        "heartbeat_timeout": 300,
        "agent_containers": {"allow_arbitrary_containers": False, "allowed_containers": [],
                             "container_steps_file": "/etc/ironic-python-agent.d/mysteps.yaml",
                             "runner": "podman", "pull_options": "--tls-verify=false",
                             "run_options": "--rm --network=host --tls-verify=false"},
        "agent_token": "xG5Hb7dV2cQ9kL0pR4sT8uW1yZ3aB6eF9hJ2mN5qS8vWd1",
        "agent_token_required": True,
        "agent_md5_checksum_enable": False,
        "disable_deep_image_inspection": False,
        "permitted_image_formats": ["raw", "qcow2", "iso"],
    }
    return json.dumps({"node": node, "config": config}).encode()


def head(status, body_len, ctype=True):
    reason = {200: "OK", 202: "Accepted", 400: "Bad Request"}[status]
    h = f"HTTP/1.1 {status} {reason}\r\nServer: WSGIServer/0.2 CPython/3.11\r\n"
    if ctype:
        h += "Content-Type: application/json\r\n"
    h += f"Content-Length: {body_len}\r\nX-OpenStack-Ironic-API-Version: 1.99\r\n\r\n"
    return h.encode()


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        s = self.request
        rfile = s.makefile("rb", buffering=65536)
        answers = self.server.answers
        try:
            while True:
                line = rfile.readline(8192)
                if not line:
                    return
                method, target = line.split(b" ", 2)[:2]
                length, close = 0, False
                while True:
                    h = rfile.readline(8192)
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.partition(b":")
                    k = k.strip().lower()
                    if k == b"content-length":
                        length = int(v)
                    elif k == b"connection" and v.strip().lower() == b"close":
                        close = True
                body = rfile.read(length) if length else b""
                if target == PROBE and body:
                    s.sendall(head(200, len(PROBE_ANSWER)) + PROBE_ANSWER)
                elif method == b"POST" and target.startswith(b"/v1/heartbeat/"):
                    s.sendall(head(202 if body else 400, 0, ctype=False))
                else:
                    path, _, query = target.partition(b"?")
                    if path == b"/v1/nodes" and b"detail=true" in query:
                        big = answers["limit"] if b"limit=" in query else answers["all"]
                        s.sendall(head(200, len(big)))
                        s.sendall(big)
                    elif path == b"/v1/lookup":
                        s.sendall(head(200, len(answers["lookup"])) + answers["lookup"])
                    else:
                        s.sendall(head(200, len(SMALL)) + SMALL)
                if close:
                    return
        except (OSError, ValueError):
            return
        finally:
            rfile.close()


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 4096


class TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 4096

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unix", required=True)
    ap.add_argument("--tcp")
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--page", type=int, default=1000, help="nodes of a `&limit=` answer")
    a = ap.parse_args()
    docs = node_docs(a.nodes)
    answers = {"all": listing(docs, a.nodes), "limit": listing(docs, min(a.page, a.nodes)),
               "lookup": lookup_answer()}
    del docs
    servers = []
    if os.path.exists(a.unix):
        os.unlink(a.unix)
    servers.append(UnixServer(a.unix, Handler))
    if a.tcp:
        host, port = a.tcp.rsplit(":", 1)
        servers.append(TcpServer((host, int(port)), Handler))
    for srv in servers:
        srv.answers = answers
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(f"ready {len(answers['all'])} {len(answers['limit'])}", flush=True)
    # Until stdin closes (the driver exits or ends us).
    sys.stdin.read()


if __name__ == "__main__":
    main()
