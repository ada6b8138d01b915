//! Certificate authority creation, leaf issuance and certificate inspection.
//!
//! This module owns every certificate the product mints; the `ca` and `cert` commands that
//! write them to files are [`crate::cli::pki`]. Issuance is a pure function of a loaded [`Issuer`] and a [`LeafRequest`]: it
//! touches no file, so the identity module can call it in memory on every renewal and the key of a
//! pod's leaf never exists anywhere but in the process (and in `export_dir`, when asked).
//!
//! Guarantees:
//! - An [`Issuer`] is only built from a CA certificate that is valid now, says `CA:TRUE`, may sign
//!   certificates, and whose public key matches the private key given with it.
//! - [`issue_leaf`] never signs a SAN that the CA's own name constraints (RFC 5280 §4.2.1.10)
//!   would make verifiers reject: it refuses and names the SAN instead. It re-parses what it signed
//!   and checks the issuer name is byte-identical to the CA subject, which chain building needs.
//! - Every leaf is ECDSA P-256 with a fresh key, `serverAuth` + `clientAuth`, `digitalSignature`,
//!   `CA:FALSE`, a random positive serial, and `notBefore` backdated by a minute for clock skew.
//!
//! Keys are written by the CLI with mode 0600 from the moment the file exists (see
//! [`crate::cli::pki::run_ca`]).

mod ca;
mod constraints;
mod der;
mod issuer;
mod leaf;
mod summary;
// Tests assert with `unwrap`: a panic there is the failure report.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use std::path::PathBuf;

pub use ca::{generate_ca, CaSpec, GeneratedCa};
pub(crate) use constraints::{NameConstraints, San};
pub(crate) use der::rfc3339;
pub use issuer::Issuer;
pub use leaf::{issue_leaf, IssuedLeaf, LeafRequest};
pub use summary::{summarize, CertSummary};

/// How far `notBefore` is set in the past, so that peers whose clocks lag a little already accept
/// a certificate issued this instant.
pub const BACKDATE: std::time::Duration = std::time::Duration::from_secs(60);

/// Everything that can go wrong in this module.
///
/// `Display` is one line naming the problem (the file, the SAN, ...); the underlying cause, when
/// there is one, is kept as [`std::error::Error::source`] rather than repeated in the message.
/// Print the whole chain (`crate::error::chain` walks `source()`) for the one-line report.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} already exists (pass --force to overwrite)", path.display())]
    Exists { path: PathBuf },
    /// Wraps a load failure with the files it came from.
    #[error("CA certificate {} with key {}", cert.display(), key.display())]
    LoadCa {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: Box<Self>,
    },
    #[error("{}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<Self>,
    },
    #[error("no PEM CERTIFICATE block found")]
    NoCertificate,
    #[error("certificate is not valid X.509")]
    BadCertificate {
        #[source]
        source: x509_parser::error::X509Error,
    },
    #[error("certificate extension {extension} is malformed")]
    BadExtension {
        extension: &'static str,
        #[source]
        source: x509_parser::error::X509Error,
    },
    #[error("no usable private key found (PEM PKCS#8, SEC1 or PKCS#1 expected)")]
    BadKey {
        #[source]
        source: Option<rcgen::Error>,
    },
    #[error("private key does not match the CA certificate's public key")]
    KeyMismatch,
    #[error("certificate is not a CA (basicConstraints CA:TRUE is missing)")]
    NotCa,
    #[error("CA certificate's keyUsage does not allow keyCertSign")]
    CaCannotSign,
    #[error("CA certificate expired at {}", der::rfc3339(*not_after))]
    CaExpired { not_after: std::time::SystemTime },
    #[error("CA certificate is not valid before {}", der::rfc3339(*not_before))]
    CaNotYetValid { not_before: std::time::SystemTime },
    #[error("CA certificate has {kind} name constraints, which this tool cannot honour")]
    UnsupportedConstraint { kind: &'static str },
    #[error("no subject alternative name requested: give at least one DNS name or IP address")]
    NoSans,
    #[error("invalid DNS name {name:?}: {reason}")]
    InvalidDnsName {
        name: String,
        reason: crate::dns_name::DnsNameError,
    },
    #[error("SAN {san} is outside the CA's name constraints ({constraints})")]
    SanNotPermitted { san: String, constraints: String },
    #[error("validity must be at least one second and end before year 9999")]
    InvalidValidity,
    #[error("CA subject name cannot be reproduced byte for byte in the issuer field")]
    IssuerNameMismatch,
    #[error("key generation failed")]
    KeyGen {
        #[source]
        source: rcgen::Error,
    },
    #[error("signing the certificate failed")]
    Sign {
        #[source]
        source: rcgen::Error,
    },
}
