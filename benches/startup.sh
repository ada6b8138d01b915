#!/usr/bin/env bash
# Start-to-ready time and idle memory of the release binary with the embedded-style config
# (config/default.toml: a `server` and a `mutual` listener forwarding to unix sockets).
#
#   benches/startup.sh [RUNS]      (default 20 runs)
#
# Builds `cargo build --release`, generates a throwaway CA and server certificate with openssl,
# then for each run: spawns `ironic-proxy run --config F`, polls GET /readyz on the admin port
# (every 0.5 ms) until the first 200, and reads Rss/Pss from /proc/PID/smaps_rollup after one
# idle second. The last run also measures memory after 200 HTTPS requests over keep-alive to a
# demo upstream. Prints a table and a summary. Needs: cargo, openssl, python3, curl.
set -euo pipefail

RUNS="${1:-20}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

echo "building release binary..." >&2
cargo build --release --quiet
BIN="$ROOT/target/release/ironic-proxy"

WORK="$(mktemp -d -t ironic-proxy-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# Dev certificates in the layout config/default.toml expects (certs-dev/{ca,tls}.{crt,key}).
CERTS="$WORK/certs"
mkdir -p "$CERTS"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=bench CA" -keyout "$CERTS/ca.key" -out "$CERTS/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" \
    2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
    -keyout "$CERTS/tls.key" -out "$WORK/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' \
    >"$WORK/ext"
openssl x509 -req -days 1 -in "$WORK/tls.csr" -CA "$CERTS/ca.crt" -CAkey "$CERTS/ca.key" \
    -extfile "$WORK/ext" -out "$CERTS/tls.crt" 2>/dev/null

exec python3 - "$BIN" "$ROOT/config/default.toml" "$WORK" "$RUNS" <<'PY'
import os, re, socket, statistics, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler
from socketserver import ThreadingMixIn, UnixStreamServer

binary, default_config, work, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
run_dir = os.path.join(work, "run")
os.makedirs(run_dir, exist_ok=True)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def write_config():
    """config/default.toml with a free admin port (the embedded config pins 9901)."""
    admin = free_port()
    text = open(default_config).read()
    text, n = re.subn(r'listen = "127\.0\.0\.1:9901"', f'listen = "127.0.0.1:{admin}"', text)
    assert n == 1, "admin listen line not found in config/default.toml"
    path = os.path.join(work, "proxy.toml")
    open(path, "w").write(text)
    env = dict(os.environ,
               IRONIC_PROXY_DEV_CERTS=os.path.join(work, "certs"),
               IRONIC_PROXY_RUN_DIR=run_dir,
               IRONIC_PROXY_API_LISTEN=f"127.0.0.1:{free_port()}",
               IRONIC_PROXY_RPC_LISTEN=f"127.0.0.1:{free_port()}",
               RUST_LOG="warn")
    return path, admin, env

def ready(admin):
    try:
        with socket.create_connection(("127.0.0.1", admin), timeout=0.5) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False

def memory(pid):
    kib = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        parts = line.split()
        if parts[0] in ("Rss:", "Pss:"):
            kib[parts[0][:-1]] = int(parts[1])
    return kib["Rss"], kib["Pss"]

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b'{"name":"ironic","version":"bench"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def address_string(self):
        return "unix"
    def log_message(self, *args):
        pass

class Upstream(ThreadingMixIn, UnixStreamServer):
    daemon_threads = True

rows = []
for i in range(runs):
    config, admin, env = write_config()
    t0 = time.perf_counter()
    proc = subprocess.Popen([binary, "run", "--config", config], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while not ready(admin):
        if proc.poll() is not None:
            sys.exit(f"proxy exited: {proc.stderr.read().decode()}")
        if time.perf_counter() - t0 > 10:
            sys.exit("proxy not ready after 10 s")
        time.sleep(0.0005)
    ready_ms = (time.perf_counter() - t0) * 1000
    time.sleep(1.0)
    rss, pss = memory(proc.pid)
    row = [i + 1, ready_ms, rss, pss, None, None]
    if i == runs - 1:
        sock = os.path.join(run_dir, "api.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        up = Upstream(sock, Handler)
        threading.Thread(target=up.serve_forever, daemon=True).start()
        url = f"https://127.0.0.1:{env['IRONIC_PROXY_API_LISTEN'].rsplit(':', 1)[1]}/v1"
        out = subprocess.run(["curl", "-s", "-w", "%{http_code}\n",
                              "--cacert", os.path.join(work, "certs", "ca.crt")]
                             + ["-o", "/dev/null", url] * 200,
                             capture_output=True, text=True, check=True)
        codes = out.stdout.split()
        assert codes == ["200"] * 200, f"warm-up requests failed: {set(codes)}"
        time.sleep(1.0)
        row[4], row[5] = memory(proc.pid)
        up.shutdown()
    proc.terminate()
    proc.wait(timeout=10)
    rows.append(row)

version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
print(f"{version} (release), config/default.toml, {runs} runs, {os.cpu_count()} CPUs")
print()
print(f"{'run':>4} {'start-to-ready ms':>18} {'idle RSS KiB':>13} {'idle PSS KiB':>13}")
for r in rows:
    print(f"{r[0]:>4} {r[1]:>18.2f} {r[2]:>13} {r[3]:>13}")
ready_ms = [r[1] for r in rows]
rss = [r[2] for r in rows]
pss = [r[3] for r in rows]
print()
print(f"{'':>4} {'min':>10} {'median':>10} {'max':>10}")
print(f"{'ready ms':>12} {min(ready_ms):>6.2f} {statistics.median(ready_ms):>10.2f} {max(ready_ms):>10.2f}")
print(f"{'idle RSS KiB':>12} {min(rss):>6} {statistics.median(rss):>10.0f} {max(rss):>10}")
print(f"{'idle PSS KiB':>12} {min(pss):>6} {statistics.median(pss):>10.0f} {max(pss):>10}")
last = rows[-1]
print()
print(f"after 200 HTTPS requests on one keep-alive connection (last run): "
      f"RSS {last[4]} KiB, PSS {last[5]} KiB")
PY
