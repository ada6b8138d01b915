//! ironic-proxy: TLS and mutual-TLS termination, self-issued identity and DNS load balancing for
//! OpenStack Ironic. The binary in `main.rs` is a thin shell over this library.
//!
//! Module map (each behaves like a small crate with its own error type; only `config`, `pki`,
//! `cli` and `error` are public, the rest is re-exported item by item below):
//! - [`error`], [`crypto`], `dns_name`: the bottom layer: error chains, the process-wide crypto
//!   provider and `[tls]` policy, the one DNS-name type (rustls' syntax, with reasons).
//! - [`config`]: TOML -> typed configuration, `${VAR}` interpolation, key-path errors.
//! - [`pki`]: CA creation, leaf issuance and certificate inspection (pure functions).
//! - [`cli`]: the `ca` and `cert` commands, which write what `pki` mints to files.
//! - [`identity`]: the live certificate, key and trust bundle; reload, rotation and export.
//! - [`tls`]: rustls configurations, client identity and `allow` authorisation.
//! - [`listen`]: accept loops, connection limits and timeouts, graceful drain.
//! - [`proxy`]: the forwarding service: header hygiene, upstream pools, error mapping.
//! - `http1`: HTTP/1.1 framing (heads, body framing, the chunked decoder), for the upstream
//!   client, the listener's framing guard and `doctor`.
//! - [`discovery`]: DNS resolution loop producing endpoint sets.
//! - [`balance`]: endpoint picking and health state.
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`auth`]: HTTP Basic authentication per listener (htpasswd, public paths).
//! - [`metrics`]: the Prometheus registry and every metric family.
//! - [`logging`]: the stderr writer behind `tracing`; access lines written in batches.
//! - `memory_release`: once ready, the executable's pages that only start-up used are given back.

#![warn(clippy::unwrap_used)]

// Private: what is not re-exported below and not used inside the crate is dead code, which the
// compiler reports.
mod admin;
mod auth;
mod balance;
pub mod cli;
pub mod config;
mod crypto;
mod discovery;
mod dns_name;
mod doctor;
pub mod error;
mod http1;
mod identity;
mod listen;
mod logging;
mod memory_release;
mod metrics;
pub mod pki;
mod proxy;
mod server;
mod signal;
mod tls;

// What the binary runs.
pub use admin::check_token as check_metrics_token;
pub use auth::check as check_auth;
pub use doctor::boot_tls::warnings as boot_tls_warnings;
pub use doctor::{run as doctor, Options as DoctorOptions};
pub use identity::check as check_identity;
#[doc(hidden)]
pub use logging::access::Line as AccessLine;
pub use logging::{AccessFormat, AccessJson, Stderr as LogWriter, Timestamp as LogTimestamp};
pub use proxy::egress::credentials::check as check_egress;
pub use server::{runtime, Server};
pub use signal::Signals;

// Embedding the parts without a config file or a socket: the benches, the fuzz targets and the
// discovery tests.
pub use balance::{Load, Picker, Policy};
pub use crypto::provider as crypto_provider;
pub use discovery::{spawn as spawn_discovery, DiscoveryOptions, Endpoint, EndpointSet, Target};
pub use identity::{load_chain, load_files, load_key, load_trust, Material};
pub use listen::serve_stream;
pub use metrics::{Metrics, UpstreamLabels};
pub use proxy::find_newest::Finder;
pub use proxy::pool::{Pool, PoolOptions};
#[doc(hidden)]
pub use proxy::upstream::{read_response_over, ResponseRead};
pub use proxy::{headers, jsonrpc, route, ConnInfo, Proxy};
pub use tls::stream::{accept as accept_tls, ServerStream as TlsServerStream};
pub use tls::{allow, server_config, ClientIdentity};
