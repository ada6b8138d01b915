#!/usr/bin/env python3
"""Demo upstream for scripts/dev: answers every request on each unix socket given with JSON
describing what it received (method, path, headers), as Ironic would sit behind the proxy."""
import http.server
import json
import os
import socketserver
import sys
import threading


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        out = json.dumps({
            "socket": self.server.server_address,
            "method": self.command,
            "path": self.path,
            "headers": dict(self.headers),
            "body_bytes": len(body),
        }, indent=1).encode() + b"\n"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        sock, _ = super().get_request()
        return sock, ("unix", 0)


servers = []
for path in sys.argv[1:]:
    if os.path.exists(path):
        os.unlink(path)
    servers.append(Server(path, Handler))
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
