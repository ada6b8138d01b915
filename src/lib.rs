//! ironic-proxy: TLS and mutual-TLS termination, self-issued identity and DNS load balancing for
//! OpenStack Ironic. The binary in `main.rs` is a thin shell over this library.
//!
//! Module map (each behaves like a small crate with its own error type):
//! - [`error`], [`crypto`]: the bottom layer: error chains, the process-wide crypto provider and
//!   `[tls]` policy.
//! - [`config`]: TOML -> typed configuration, `${VAR}` interpolation, key-path errors.
//! - [`pki`]: CA creation, leaf issuance and certificate inspection (pure functions).
//! - [`cli`]: the `ca` and `cert` commands, which write what `pki` mints to files.
//! - [`identity`]: the live certificate, key and trust bundle; reload, rotation and export.
//! - [`tls`]: rustls configurations, client identity and `allow` authorisation.
//! - [`listen`]: accept loops, connection limits and timeouts, graceful drain.
//! - [`proxy`]: the forwarding service: header hygiene, upstream pools, error mapping.
//! - [`discovery`]: DNS resolution loop producing endpoint sets.
//! - [`balance`]: endpoint picking and health state.
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`auth`]: HTTP Basic authentication per listener (htpasswd, public paths).
//! - [`metrics`]: the Prometheus registry and every metric family.

#![warn(clippy::unwrap_used)]

pub mod admin;
pub mod auth;
pub mod balance;
pub mod cli;
pub mod config;
pub mod crypto;
pub mod discovery;
pub mod doctor;
pub mod error;
pub mod identity;
pub mod listen;
pub mod metrics;
pub mod pki;
pub mod proxy;
pub mod server;
pub mod signal;
pub mod tls;
