#!/bin/sh
# Regenerates the DEV ONLY certificates in this directory with ironic-proxy's own CLI.
# Run from the repository root: sh certs-dev/regenerate.sh
set -eu
cargo build --quiet
bin=target/debug/ironic-proxy
dir=certs-dev

"$bin" ca init --out "$dir" --force --validity 20y \
    --name "ironic-proxy DEV ONLY CA (never deploy)" \
    --permit-dns localhost --permit-dns invalid --permit-dns svc --permit-dns cluster.local \
    --permit-ip 127.0.0.0/8 --permit-ip ::1 --permit-ip 10.0.0.0/8 \
    --permit-ip 172.16.0.0/12 --permit-ip 192.168.0.0/16 --permit-ip fc00::/7

"$bin" cert issue --ca-cert "$dir/ca.crt" --ca-key "$dir/ca.key" --out "$dir" --force \
    --dns localhost --ip 127.0.0.1 --ip ::1 --validity 10y

tmp=$(mktemp -d)
"$bin" cert issue --ca-cert "$dir/ca.crt" --ca-key "$dir/ca.key" --out "$tmp" \
    --dns client.dev.invalid --validity 10y
mv "$tmp/tls.crt" "$dir/client.crt"
mv "$tmp/tls.key" "$dir/client.key"
rmdir "$tmp"
