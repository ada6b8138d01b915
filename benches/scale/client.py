#!/usr/bin/env python3
"""The scale benchmark's clients, over TLS 1.3 (verified against --ca) or plain TCP (--plain,
the backend hit directly). Each prints one JSON line; every failure is counted in `errors`.

- `listing`: `--count` sequential `GET PATH` on one keep-alive connection (opened before the
  first request, so no handshake is timed); per request the time to the first byte of the
  answer and to its last byte, in microseconds, and the body bytes.
- `storm`: `--agents` ramdisk agents starting evenly over `--spread` seconds. Each, as
  ironic-python-agent after a reboot: a new TCP connection and full TLS handshake (no
  resumption), `GET /v1/lookup?addresses=...`, `POST /v1/heartbeat/<uuid>`, then `--beats` more
  heartbeats `--interval` seconds apart on the same keep-alive connection. Reports the
  connections completed per second (over the spread and the busiest second), and p50/p99 of the
  handshake, the lookup, the first heartbeat (the storm) and the later ones (keep-alive).

Usage: client.py listing --addr 127.0.0.1:PORT [--plain|--ca F] --path P --count N
       client.py storm --addr 127.0.0.1:PORT [--plain|--ca F] --agents N --spread S
                       [--beats K --interval S]
"""

import argparse
import asyncio
import json
import resource
import socket
import ssl
import time

UA = "ironic-python-agent/9.13.1"
API = "X-OpenStack-Ironic-API-Version: 1.68"


def tls_context(ca):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def parse_head(head):
    """(status, content-length or None, chunked) of a response head."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked = None, False
    for h in lines[1:]:
        k, _, v = h.partition(b":")
        k = k.strip().lower()
        if k == b"content-length":
            length = int(v)
        elif k == b"transfer-encoding" and b"chunked" in v.lower():
            chunked = True
    return status, length, chunked


def percentile(v, p):
    if not v:
        return 0
    v = sorted(v)
    return v[min(len(v) - 1, max(0, int(len(v) * p + 0.999999) - 1))]


# ------------------------------------------------------------------------------------ listing

def read_answer(sock, buf, t0):
    """Reads one answer; returns (status, body bytes, µs to first byte, µs to last byte)."""
    view = memoryview(buf)
    data = b""
    first = None
    while b"\r\n\r\n" not in data:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("closed before the head")
        if first is None:
            first = time.perf_counter()
        data += bytes(view[:n])
    head, _, rest = data.partition(b"\r\n\r\n")
    status, length, chunked = parse_head(head)
    if chunked:
        # Chunked: read to the terminating chunk (the tail check is enough for a bench).
        got = bytearray(rest)
        while not got.endswith(b"0\r\n\r\n"):
            n = sock.recv_into(view)
            if n == 0:
                raise ConnectionError("closed mid-body")
            got += view[:n]
        body = len(got)
    else:
        body = len(rest)
        while body < length:
            n = sock.recv_into(view)
            if n == 0:
                raise ConnectionError("closed mid-body")
            body += n
    end = time.perf_counter()
    return status, body, (first - t0) * 1e6, (end - t0) * 1e6


def listing(a):
    host, port = a.addr.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=60)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock = raw if a.plain else tls_context(a.ca).wrap_socket(raw, server_hostname="localhost")
    req = (f"GET {a.path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: python-ironicclient\r\n"
           f"Accept: application/json\r\n{API}\r\n\r\n").encode()
    buf = bytearray(1 << 20)
    out = {"ok": 0, "errors": 0, "bytes": 0, "ttfb_us": [], "ttlb_us": [], "first_error": ""}
    for _ in range(a.count):
        try:
            t0 = time.perf_counter()
            sock.sendall(req)
            status, body, ttfb, ttlb = read_answer(sock, buf, t0)
            if status != 200:
                raise ConnectionError(f"status {status}")
            out["ok"] += 1
            out["bytes"] += body
            out["ttfb_us"].append(round(ttfb))
            out["ttlb_us"].append(round(ttlb))
        except (OSError, ValueError, IndexError) as e:
            out["errors"] += 1
            out["first_error"] = out["first_error"] or repr(e)
            break
    sock.close()
    print(json.dumps(out))


# -------------------------------------------------------------------------------------- storm

async def exchange(reader, writer, req):
    """Sends `req`, reads one answer whole; returns its status."""
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status, length, chunked = parse_head(head[:-4])
    if chunked:
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


def heartbeat(uuid, i):
    body = json.dumps({"callback_url": f"https://10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:9999",
                       "agent_version": "9.13.1",
                       "agent_token": "xG5Hb7dV2cQ9kL0pR4sT8uW1yZ3aB6eF9hJ2mN5qS8vWd1",
                       "agent_verify_ca": "/etc/ironic-python-agent/ca.crt",
                       "agent_status": "start"}).encode()
    return (f"POST /v1/heartbeat/{uuid} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: {UA}\r\n"
            f"Accept: */*\r\n{API}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def agent(i, a, ctx, start, r):
    await asyncio.sleep(max(0.0, start + i * a.spread / a.agents - time.perf_counter()))
    host, port = a.addr.rsplit(":", 1)
    uuid = f"6d85703a-0000-0000-0000-{i:012x}"
    mac = f"52:54:00:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}"
    lookup = (f"GET /v1/lookup?addresses={mac}&node_uuid={uuid} HTTP/1.1\r\nHost: localhost\r\n"
              f"User-Agent: {UA}\r\nAccept: */*\r\n{API}\r\n\r\n").encode()
    beat = heartbeat(uuid, i)
    writer = None
    step = "connect"
    try:
        t0 = time.perf_counter()
        reader, writer = await asyncio.open_connection(
            host, int(port), ssl=ctx, server_hostname=None if ctx is None else "localhost")
        t1 = time.perf_counter()
        r["handshake"].append((t1 - t0) * 1e6)
        r["connected_at"].append(t1 - start)
        step = "lookup"
        if (st := await exchange(reader, writer, lookup)) != 200:
            raise ConnectionError(f"lookup status {st}")
        t2 = time.perf_counter()
        r["lookup"].append((t2 - t1) * 1e6)
        step = "heartbeat"
        if (st := await exchange(reader, writer, beat)) != 202:
            raise ConnectionError(f"heartbeat status {st}")
        r["storm_beat"].append((time.perf_counter() - t2) * 1e6)
        r["agents_ok"] += 1
        for _ in range(a.beats):
            await asyncio.sleep(a.interval)
            step = "keep-alive heartbeat"
            t = time.perf_counter()
            if (st := await exchange(reader, writer, beat)) != 202:
                raise ConnectionError(f"heartbeat status {st}")
            r["beat"].append((time.perf_counter() - t) * 1e6)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
            ssl.SSLError) as e:
        r["errors"] += 1
        r["first_error"] = r["first_error"] or f"agent {i} {step}: {e!r}"
    finally:
        if writer is not None:
            writer.close()


async def storm(a):
    ctx = None if a.plain else tls_context(a.ca)
    r = {"agents_ok": 0, "errors": 0, "first_error": "", "handshake": [], "lookup": [],
         "storm_beat": [], "beat": [], "connected_at": []}
    start = time.perf_counter() + 0.2
    await asyncio.gather(*(agent(i, a, ctx, start, r) for i in range(a.agents)))
    at = sorted(r.pop("connected_at"))
    per_second = {}
    for t in at:
        per_second[int(t)] = per_second.get(int(t), 0) + 1
    out = {"agents": a.agents, "agents_ok": r["agents_ok"], "errors": r["errors"],
           "first_error": r["first_error"],
           "last_connected_s": round(at[-1], 3) if at else 0,
           "accepted_per_s": round(len(at) / max(a.spread, at[-1] if at else 0), 1),
           "accepted_busiest_s": max(per_second.values(), default=0),
           "client_cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 2)}
    for k in ("handshake", "lookup", "storm_beat", "beat"):
        out[f"{k}_n"] = len(r[k])
        out[f"{k}_p50_us"] = round(percentile(r[k], 0.5))
        out[f"{k}_p99_us"] = round(percentile(r[k], 0.99))
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("listing", "storm"))
    ap.add_argument("--addr", required=True)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--ca")
    ap.add_argument("--path", default="/v1/nodes?detail=true")
    ap.add_argument("--count", type=int, default=5)
    ap.add_argument("--agents", type=int, default=2000)
    ap.add_argument("--spread", type=float, default=5.0)
    ap.add_argument("--beats", type=int, default=2)
    ap.add_argument("--interval", type=float, default=5.0)
    a = ap.parse_args()
    if not a.plain and not a.ca:
        ap.error("--ca is required with TLS")
    # One descriptor per agent: up to the hard limit (no CAP_SYS_RESOURCE needed).
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if a.mode == "listing":
        listing(a)
    else:
        asyncio.run(storm(a))


if __name__ == "__main__":
    main()
