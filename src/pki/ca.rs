//! Creating a new certificate authority.

use std::time::{Duration, SystemTime};

use ipnet::IpNet;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

use super::constraints::{check_dns_suffix, NameConstraints};
use super::leaf::{random_serial, window};
use super::PkiError;

/// What a new CA should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaSpec {
    /// The subject common name.
    pub name: String,
    pub validity: Duration,
    /// DNS suffixes leaves may use (`metal3.svc` holds `metal3.svc` and its subdomains;
    /// `.metal3.svc` only its subdomains).
    pub permit_dns: Vec<String>,
    /// Networks leaves' IP addresses must be in.
    pub permit_ip: Vec<IpNet>,
}

impl Default for CaSpec {
    fn default() -> Self {
        Self {
            name: "ironic-proxy CA".to_owned(),
            validity: Duration::from_secs(10 * 31_557_600),
            permit_dns: Vec::new(),
            permit_ip: Vec::new(),
        }
    }
}

/// A freshly created CA in PEM; load it with [`super::Issuer::from_pem`] to sign leaves.
pub struct GeneratedCa {
    pub cert_pem: String,
    /// PKCS#8 (`BEGIN PRIVATE KEY`).
    pub key_pem: String,
}

impl std::fmt::Debug for GeneratedCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedCa")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// Creates a self-signed CA with a new ECDSA P-256 key.
///
/// `basicConstraints` is critical `CA:TRUE, pathlen:0` (it signs leaves, never intermediates);
/// key usage is `keyCertSign` + `cRLSign`. When `permit_dns` or `permit_ip` is non-empty, a
/// critical name constraints extension permits exactly those, and a SAN type with nothing
/// permitted is excluded entirely, so a leaked key cannot mint a certificate that verifiers
/// accept for any other name or address.
pub fn generate_ca(spec: &CaSpec) -> Result<GeneratedCa, PkiError> {
    for suffix in &spec.permit_dns {
        check_dns_suffix(suffix)?;
    }
    let (not_before, not_after) = window(SystemTime::now(), spec.validity)?;

    let mut params = CertificateParams::default();
    params.serial_number = Some(random_serial()?);
    params.not_before = not_before;
    params.not_after = not_after;
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, spec.name.as_str());
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.name_constraints = NameConstraints::permitting(&spec.permit_dns, &spec.permit_ip)
        .map(|constraints| constraints.to_rcgen());

    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|source| PkiError::KeyGen { source })?;
    let cert = params
        .self_signed(&key)
        .map_err(|source| PkiError::Sign { source })?;
    Ok(GeneratedCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}
