#!/usr/bin/env bash
# Debian packages the test suite needs beyond the Rust toolchain.
#
# - dnsmasq: the real DNS server of tests/it/discovery_dns.rs (tests/it/support/dnsmasq.rs
#   starts one per test on 127.0.0.1 and a free port; no system service is used or needed).
#
# Run as root (CI runs as root) or with sudo. Idempotent.
set -euo pipefail
. "$(dirname "$0")/lib/packages.sh"
need_packages --no-install-recommends dnsmasq:dnsmasq
