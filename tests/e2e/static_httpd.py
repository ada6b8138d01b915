"""`python3 -m http.server` with one JSON log line per request, User-Agent included.

The boot-file end-to-end test serves each Ironic instance's [deploy]http_root with Python's
static server (it follows symlinks and sends Last-Modified, as Ironic's httpd does). Its own log
names neither the client's User-Agent nor the bytes sent; this one does, so the test can tell
what iPXE fetched directly (the kernel and ramdisk, on the owner's http_url) and what reached
this server through the proxy (boot.ipxe and the node's config, with iPXE's User-Agent passed
on). Serving is http.server's SimpleHTTPRequestHandler, over HTTP/1.1.

    python3 static_httpd.py PORT --bind IP --directory DIR
"""

import argparse
import functools
import http.server
import json
import socket
import sys
import time


class Handler(http.server.SimpleHTTPRequestHandler):
    # HTTP/1.1 with keep-alive, as ironic-image's Apache httpd answers (http.server's default is
    # HTTP/1.0, one request per connection).
    protocol_version = "HTTP/1.1"

    def send_response(self, code, message=None):
        self._status = code
        super().send_response(code, message)

    def send_header(self, keyword, value):
        if keyword.lower() == "content-length":
            self._length = int(value)
        super().send_header(keyword, value)

    def log_request(self, code="-", size="-"):
        pass  # one line per request, written by handle_one_request below

    def log_error(self, format, *args):  # noqa: A002 - http.server's signature
        pass

    def handle_one_request(self):
        self._status, self._length = None, None
        super().handle_one_request()
        if self._status is None:
            return
        line = {
            "time": time.time(),
            "client": f"{self.client_address[0]}:{self.client_address[1]}",
            "method": self.command,
            "path": self.path,
            "status": self._status,
            "bytes": self._length if self.command == "GET" else 0,
            "user_agent": self.headers.get("User-Agent", "-") if self.headers else "-",
        }
        sys.stderr.write(json.dumps(line) + "\n")
        sys.stderr.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("port", type=int)
    p.add_argument("--bind", required=True)
    p.add_argument("--directory", required=True)
    a = p.parse_args()
    handler = functools.partial(Handler, directory=a.directory)
    server = http.server.ThreadingHTTPServer
    if ":" in a.bind:  # an IPv6 address; "::" also takes IPv4 (dual-stack socket)
        server = type("Server6", (server,), {"address_family": socket.AF_INET6})
    server((a.bind, a.port), handler).serve_forever()


if __name__ == "__main__":
    main()
