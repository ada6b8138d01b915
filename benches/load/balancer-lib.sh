# Shared by benches/load/balancer-split and benches/load/balancer-lowrate (sourced, not run):
# a work directory removed on exit with every process started, a CA and a server certificate
# for localhost, the load benchmark's backend on a unix socket, and one ironic-proxy sidecar in
# front of it, the balancers' one peer, found by DNS as `localhost:$peer_port`.
#
# Set before sourcing: NAME (messages, the work directory's name), R (the release directory with
# ironic-proxy and the examples) and optionally PIN, a command prefix for the backend and the
# peer (`taskset -c 0`). Then call start_peer.
W=$(mktemp -d "/tmp/$NAME.XXXXXX")
PIDS_ALL=()
cleanup() {
  for p in "${PIDS_ALL[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
# The address a listener bound, from a proxy's text log.
addr_of() { sed -n "s/.*listening listener=$2 addr=\([0-9.:]*\).*/\1/p" "$1" | tail -1; }
wait_for() { # FILE PATTERN
  for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "$NAME: no '$2' in $1:" >&2; cat "$1" >&2; return 1
}
identity() {
  cat <<T
[identity]
trust = "$W/ca/ca.crt"
cert = "$W/server/tls.crt"
key = "$W/server/tls.key"
[admin]
listen = "127.0.0.1:0"
T
}
# The kit balancer's shape: a TLS listener whose upstream is the DNS-found peer over TLS,
# least_request, active health checks.
balancer_config() {
  identity
  cat <<T
[[listeners]]
name = "balancer"
listen = "127.0.0.1:0"
tls = "server"
[listeners.upstream]
dns = "localhost:$peer_port"
tls = true
balance = "least_request"
health = { path = "/health", interval = "2s", timeout = "1s", unhealthy_after = 2, healthy_after = 1 }
T
}
start_peer() {
  "$R/ironic-proxy" ca init --out "$W/ca" --name "$NAME CA" >/dev/null
  "$R/ironic-proxy" cert issue --ca-cert "$W/ca/ca.crt" --ca-key "$W/ca/ca.key" --dns localhost \
    --ip 127.0.0.1 --out "$W/server" >/dev/null
  ${PIN:-} "$R/examples/load-backend" --unix "$W/backend.sock" >/dev/null &
  PIDS_ALL+=($!)
  for _ in $(seq 200); do [ -S "$W/backend.sock" ] && break; sleep 0.05; done
  { identity; cat <<T
[[listeners]]
name = "server"
listen = "127.0.0.1:0"
tls = "server"
upstream = "unix:$W/backend.sock"
T
  } >"$W/peer.toml"
  RUST_LOG=warn,ironic_proxy::server=info ${PIN:-} "$R/ironic-proxy" run --config "$W/peer.toml" \
    2>"$W/peer.log" &
  PIDS_ALL+=($!)
  wait_for "$W/peer.log" "listening listener=server"
  peer_port=$(addr_of "$W/peer.log" server | sed 's/.*://')
}
