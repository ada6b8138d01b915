//! The integration tests: one test binary, one module per capability, most driving the real
//! `ironic-proxy` binary with real sockets and real clients (curl, openssl, Python, dnsmasq);
//! `inmem` drives the connection layer over an in-memory stream on a paused clock. Shared
//! builders live in [`support`].
//!
//! One binary links once instead of once per file; nextest still runs every test in its own
//! process, so tests never share process-global state. Run one file's tests with
//! `cargo nextest run --test it <module>::`, e.g. `cargo nextest run --test it sidecar_mtls::`.

mod support;

mod access_log_flush;
mod admin_exposure;
mod adversarial_framing;
mod adversarial_h2;
mod adversarial_headers;
mod adversarial_limits;
mod adversarial_tls;
mod adversarial_upstream;
mod auth_basic;
mod balance_configs;
mod balance_degraded;
mod balance_dns;
mod balance_local;
mod balance_peer_tls;
mod discovery_dns;
mod doctor;
mod dual_stack;
mod egress;
mod egress_identity;
mod egress_strict;
mod faults_load;
mod handover;
mod identity_ca_rotation;
mod identity_export;
mod identity_failures;
mod identity_rotation;
mod inmem;
mod jsonrpc_visibility;
mod kit_cli;
mod memory_trim;
mod pki_cli;
mod profiles;
mod rotation_live;
mod routes_auth;
mod routes_find;
mod sidecar_admin;
mod sidecar_config;
mod sidecar_drain;
mod sidecar_forwarding;
mod sidecar_limits;
mod sidecar_lone_upstream;
mod sidecar_mtls;
mod sidecar_parking;
mod sidecar_reload;
mod sidecar_vip;
mod statefulset_vmedia;
mod stop_sequence;
mod tls_policy;
mod trust_change;
