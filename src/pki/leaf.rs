//! Leaf issuance: a fresh key and a certificate for exactly the requested names.

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;

use super::constraints::{check_dns_name, San};
use super::{Issuer, PkiError, BACKDATE};

/// What a leaf should say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafRequest {
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    /// From now; the leaf is additionally backdated by [`BACKDATE`] and never outlives the CA.
    pub validity: Duration,
}

/// A signed leaf and its private key.
pub struct IssuedLeaf {
    pub cert_der: CertificateDer<'static>,
    /// The leaf only, no chain.
    pub cert_pem: String,
    /// PKCS#8.
    pub key_der: PrivateKeyDer<'static>,
    /// PKCS#8 (`BEGIN PRIVATE KEY`).
    pub key_pem: String,
    /// Upper-case hex without separators, as `openssl x509 -serial` prints it.
    pub serial_hex: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl fmt::Debug for IssuedLeaf {
    /// Never prints the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedLeaf")
            .field("serial_hex", &self.serial_hex)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Generates a fresh ECDSA P-256 key in memory and signs a leaf for it.
///
/// The leaf has `serverAuth` + `clientAuth` extended key usage, `digitalSignature` key usage,
/// `CA:FALSE`, the SANs exactly as asked (DNS names first, then IPs, each in the order given), a
/// random positive 126-bit serial, `notBefore` = now − [`BACKDATE`] and `notAfter` = now +
/// `validity`, cut to the CA's own `notAfter` when the CA expires sooner (a leaf cannot be
/// trusted longer than its CA anyway; compare [`IssuedLeaf::not_after`] to tell).
///
/// The subject is `CN=<first DNS name>`. A leaf with IP addresses only gets an empty subject and a
/// critical SAN extension (RFC 5280 §4.2.1.6): OpenSSL checks a common name that looks like a host
/// name, which `10.0.0.5` does, against the CA's DNS name constraints and would reject the leaf.
///
/// Refuses, naming the SAN, a DNS name that is not a valid host name and any SAN outside the CA's
/// name constraints; refuses an empty SAN list and a CA that is not valid now.
pub fn issue_leaf(issuer: &Issuer, req: &LeafRequest) -> Result<IssuedLeaf, PkiError> {
    let sans = checked_sans(issuer, req)?;
    let now = SystemTime::now();
    issuer.check_valid_at(now)?;
    let (not_before, mut not_after) = window(now, req.validity)?;
    not_after = not_after.min(OffsetDateTime::from(issuer.not_after()));

    let mut params = CertificateParams::default();
    params.serial_number = Some(random_serial()?);
    params.not_before = not_before;
    params.not_after = not_after;
    params.distinguished_name = DistinguishedName::new();
    if let Some(first) = req.dns_names.first() {
        params
            .distinguished_name
            .push(DnType::CommonName, first.as_str());
    }
    params.subject_alt_names = sans
        .into_iter()
        .map(|san| match san {
            San::Dns(name) => {
                let name = name
                    .try_into()
                    .map_err(|source| PkiError::Sign { source })?;
                Ok(SanType::DnsName(name))
            }
            San::Ip(ip) => Ok(SanType::IpAddress(ip)),
        })
        .collect::<Result<_, PkiError>>()?;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;

    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|source| PkiError::KeyGen { source })?;
    let cert = params
        .signed_by(&key, issuer.signer())
        .map_err(|source| PkiError::Sign { source })?;

    let parsed = super::der::parse(cert.der())?;
    if parsed.issuer().as_raw() != issuer.subject_raw.as_slice() {
        return Err(PkiError::IssuerNameMismatch);
    }
    let serial_hex = parsed
        .raw_serial()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect();

    Ok(IssuedLeaf {
        cert_pem: cert.pem(),
        cert_der: cert.der().clone(),
        key_pem: key.serialize_pem(),
        key_der: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        serial_hex,
        not_before: not_before.into(),
        not_after: not_after.into(),
    })
}

/// The SANs of `req`, syntax-checked and checked against the CA's name constraints.
fn checked_sans(issuer: &Issuer, req: &LeafRequest) -> Result<Vec<San>, PkiError> {
    let dns = req.dns_names.iter().map(|name| {
        check_dns_name(name)?;
        Ok(San::Dns(name.clone()))
    });
    let ip = req.ip_addresses.iter().map(|ip| Ok(San::Ip(*ip)));
    let sans = dns.chain(ip).collect::<Result<Vec<_>, PkiError>>()?;
    if sans.is_empty() {
        return Err(PkiError::NoSans);
    }
    if let Some(constraints) = &issuer.constraints {
        if let Some(san) = sans.iter().find(|san| !constraints.permits(san)) {
            return Err(PkiError::SanNotPermitted {
                san: san.to_string(),
                constraints: constraints.to_string(),
            });
        }
    }
    Ok(sans)
}

/// `notBefore` and `notAfter` for a certificate issued at `now`, in whole seconds (what the
/// certificate can encode), so the times we report equal the times in the certificate.
pub(crate) fn window(
    now: SystemTime,
    validity: Duration,
) -> Result<(OffsetDateTime, OffsetDateTime), PkiError> {
    /// 9999-12-31T23:59:59Z, the last instant a certificate (GeneralizedTime) can express.
    const MAX_UNIX: u64 = 253_402_300_799;
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map_err(|_| PkiError::InvalidValidity)?
        .as_secs();
    let end = secs
        .checked_add(validity.as_secs())
        .filter(|end| validity >= Duration::from_secs(1) && *end <= MAX_UNIX)
        .ok_or(PkiError::InvalidValidity)?;
    let not_before = OffsetDateTime::from(UNIX_EPOCH + Duration::from_secs(secs) - BACKDATE);
    let not_after = OffsetDateTime::from(UNIX_EPOCH + Duration::from_secs(end));
    Ok((not_before, not_after))
}

/// 16 random bytes with the top bit clear (a positive INTEGER) and the next bit set (no leading
/// zero byte to trim, so every serial is 16 bytes long): 126 bits from the system CSPRNG.
pub(crate) fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = [0u8; 16];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| PkiError::KeyGen {
        source: rcgen::Error::RingUnspecified,
    })?;
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}
