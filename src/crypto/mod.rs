//! The process-wide cryptography: one rustls provider (aws-lc-rs, or its FIPS-validated module
//! with the `fips` feature), restricted by the `[tls]` policy. At the bottom of the crate:
//! listeners, peers, the identity and `doctor` all take their provider from here.

pub(crate) mod policy;

/// The process-wide crypto provider, restricted to the `[tls]` policy.
pub fn provider() -> rustls::crypto::CryptoProvider {
    let mut p = base_provider();
    policy::current().apply(&mut p);
    p
}

/// True when every algorithm in use comes from the FIPS-validated AWS-LC module (a build with
/// the `fips` feature; see docs/operator-guide.md).
pub(crate) fn fips() -> bool {
    provider().fips()
}

/// aws-lc-rs with rustls' defaults, before the policy.
fn base_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}
