#!/bin/sh
# Debian packages the test suite needs beyond the Rust toolchain.
#
# - dnsmasq: the real DNS server of tests/it/discovery_dns.rs (tests/it/support/dnsmasq.rs
#   starts one per test on 127.0.0.1 and a free port; no system service is used or needed).
#
# Run as root (CI runs as root). Idempotent.
set -eu
missing=""
[ -x /usr/sbin/dnsmasq ] || command -v dnsmasq >/dev/null 2>&1 || missing="$missing dnsmasq"
if [ -n "$missing" ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
fi
