"""A wrong-password flood from a process of its own (tests/it/auth_basic.rs, the flood test).

Usage: flood.py HOST PORT USER PREFIX CONNECTIONS

Opens CONNECTIONS keep-alive connections and prints "ready", then reads commands from stdin, one
per line: a number N sends N requests back to back on every connection (`GET /v1/nodes` with
Basic credentials of USER and a password never sent before, PREFIX and a counter: a guessing
attack, so that no request can share another's verification), "N bare" the same requests without
credentials (the control: each is answered 401 at once, nothing to verify), and when every
answer is in prints one JSON line {"status": count, ..., "reconnects": n} (status "0": the
connection failed, it is reopened for the next request; a connection found closed before a
request got any answer is reopened and the request sent again once, counted in "reconnects").
End of input ends it. One thread and non-blocking sockets, under SCHED_IDLE once ready, so the
flood costs little CPU next to what it measures: the load generator is not the system under test.
"""

import base64
import itertools
import json
import os
import selectors
import socket
import sys


def main():
    host, port, user, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    conns = int(sys.argv[5])
    guesses = itertools.count()

    bare = False

    def request():
        if bare:
            return f"GET /v1/nodes HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        token = base64.b64encode(f"{user}:{prefix}{next(guesses)}".encode()).decode()
        return (f"GET /v1/nodes HTTP/1.1\r\nHost: {host}\r\nAuthorization: Basic {token}\r\n"
                "\r\n").encode()

    sel = selectors.DefaultSelector()

    class Conn:
        def __init__(self):
            self.sock = None
            self.buf = b""
            self.left = 0
            self.retried = False

        def open(self):
            self.sock = socket.create_connection((host, port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.setblocking(False)
            sel.register(self.sock, selectors.EVENT_READ, self)

        def close(self):
            if self.sock is not None:
                sel.unregister(self.sock)
                self.sock.close()
                self.sock = None
            self.buf = b""

        def send(self):
            if self.sock is None:
                self.open()
            self.sock.setblocking(True)
            self.sock.sendall(request())
            self.sock.setblocking(False)

        def response(self):
            """(status, closing) of one complete response at the start of buf, or None."""
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return None
            head = self.buf[:end].decode("latin-1").split("\r\n")
            status = int(head[0].split()[1])
            length, closing = 0, False
            for line in head[1:]:
                name, _, value = line.partition(":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection" and "close" in value:
                    closing = True
            if len(self.buf) < end + 4 + length:
                return None
            self.buf = self.buf[end + 4 + length:]
            return status, closing

    pool = [Conn() for _ in range(conns)]
    for c in pool:
        c.open()
    # The flood itself runs under SCHED_IDLE (sched(7)): it takes only the CPU the proxy and the
    # measuring client leave, and a woken normal thread preempts it at once. Start-up (Python's
    # imports, the connections) ran at normal priority, so that a busy machine cannot starve it
    # before it is ready.
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        per, bare = int(words[0]), words[1:] == ["bare"]
        counts, pending, reconnects = {}, 0, 0

        def record(c, status):
            nonlocal pending
            counts[str(status)] = counts.get(str(status), 0) + 1
            c.left -= 1
            c.retried = False
            if c.left > 0:
                try:
                    c.send()
                except OSError:
                    c.close()
                    record(c, 0)
            else:
                pending -= 1

        for c in pool:
            c.left = per
            pending += 1
        for c in pool:
            try:
                c.send()
            except OSError:
                c.close()
                record(c, 0)
        while pending:
            for key, _ in sel.select():
                c = key.data
                try:
                    data = c.sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    stale = not c.buf and not c.retried
                    c.close()
                    if stale:
                        # Closed while idle before this request reached it: sent again once on
                        # a new connection, as HTTP clients do (RFC 9112 section 9.3.1).
                        c.retried = True
                        reconnects += 1
                        try:
                            c.send()
                            continue
                        except OSError:
                            c.close()
                    record(c, 0)
                    continue
                c.buf += data
                got = c.response()
                if got is not None:
                    status, closing = got
                    if closing:
                        c.close()
                    record(c, status)
        counts["reconnects"] = reconnects
        print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
