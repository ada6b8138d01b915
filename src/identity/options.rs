//! What the identity is built from: the `[identity]` table as typed values. The config module
//! parses it; the identity owns the types, so that it depends on nothing above it.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct IdentityConfig {
    /// PEM bundle of trusted CAs.
    pub trust: PathBuf,
    pub source: IdentitySource,
    pub export: Option<ExportConfig>,
    /// How often files are checked for changes (Secret volumes, cert-manager rewrites).
    pub watch_interval: Duration,
}

#[derive(Clone, Debug)]
pub enum IdentitySource {
    /// Static files, re-read on change and on SIGHUP.
    Files { cert: PathBuf, key: PathBuf },
    /// Self-issued from the operator CA.
    Issuer(IssuerConfig),
}

#[derive(Clone, Debug)]
pub struct IssuerConfig {
    pub issuer_cert: PathBuf,
    pub issuer_key: PathBuf,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub validity: Duration,
    pub renew_before: Duration,
}

#[derive(Clone, Debug)]
pub struct ExportConfig {
    pub dir: PathBuf,
    pub mode: u32,
    pub group: Option<u32>,
}
