//! What a certificate says, in the words `cert show` prints.

use std::fmt;
use std::net::IpAddr;
use std::time::SystemTime;

use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_NIST_EC_P521,
    OID_PKCS1_RSAENCRYPTION, OID_SIG_ED25519,
};
use x509_parser::public_key::PublicKey;

use super::der::{parse, rfc3339, system_time};
use super::PkiError;

/// The fields of one certificate that an operator checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertSummary {
    /// RFC 4514-style (`CN=x, O=y`); empty for an empty subject.
    pub subject: String,
    pub issuer: String,
    /// Upper-case hex without separators, as `openssl x509 -serial` prints it.
    pub serial_hex: String,
    /// `DNS:name`, `IP:address`, `URI:...`, `email:...`, in certificate order.
    pub sans: Vec<String>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// `ECDSA P-256`, `RSA 2048`, `Ed25519`, ...
    pub key_type: String,
    /// SHA-256 of the DER, upper-case hex pairs joined by colons (as `openssl x509 -fingerprint`).
    pub sha256_fingerprint: String,
    pub is_ca: bool,
}

impl CertSummary {
    /// A warning when the certificate is not valid at `now`, naming the bound it is past.
    pub fn validity_warning(&self, now: SystemTime) -> Option<String> {
        if now > self.not_after {
            Some(format!(
                "certificate expired at {}",
                rfc3339(self.not_after)
            ))
        } else if now < self.not_before {
            Some(format!(
                "certificate is not valid before {}",
                rfc3339(self.not_before)
            ))
        } else {
            None
        }
    }
}

impl fmt::Display for CertSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or_empty = |s: &str| {
            if s.is_empty() {
                "(empty)".to_owned()
            } else {
                s.to_owned()
            }
        };
        writeln!(f, "subject:     {}", or_empty(&self.subject))?;
        writeln!(f, "SANs:        {}", or_empty(&self.sans.join(", ")))?;
        writeln!(f, "issuer:      {}", or_empty(&self.issuer))?;
        writeln!(f, "serial:      {}", self.serial_hex)?;
        writeln!(f, "not before:  {}", rfc3339(self.not_before))?;
        writeln!(f, "not after:   {}", rfc3339(self.not_after))?;
        writeln!(f, "key type:    {}", self.key_type)?;
        writeln!(f, "CA:          {}", if self.is_ca { "yes" } else { "no" })?;
        write!(f, "SHA-256:     {}", self.sha256_fingerprint)
    }
}

/// Reads the fields of one DER certificate.
pub fn summarize(cert_der: &[u8]) -> Result<CertSummary, PkiError> {
    let cert = parse(cert_der)?;
    let sans = cert
        .subject_alternative_name()
        .map_err(|source| PkiError::BadExtension {
            extension: "subjectAltName",
            source,
        })?
        .map(|ext| ext.value.general_names.iter().map(describe_name).collect())
        .unwrap_or_default();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, cert_der);
    Ok(CertSummary {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        serial_hex: cert
            .raw_serial()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect(),
        sans,
        not_before: system_time(cert.validity().not_before.timestamp()),
        not_after: system_time(cert.validity().not_after.timestamp()),
        key_type: key_type(cert.public_key()),
        sha256_fingerprint: digest
            .as_ref()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":"),
        is_ca: cert.is_ca(),
    })
}

fn describe_name(name: &GeneralName<'_>) -> String {
    match name {
        GeneralName::DNSName(n) => format!("DNS:{n}"),
        GeneralName::IPAddress(bytes) => match <[u8; 4]>::try_from(*bytes) {
            Ok(v4) => format!("IP:{}", IpAddr::from(v4)),
            Err(_) => match <[u8; 16]>::try_from(*bytes) {
                Ok(v6) => format!("IP:{}", IpAddr::from(v6)),
                Err(_) => format!("IP:<{} bytes>", bytes.len()),
            },
        },
        GeneralName::URI(uri) => format!("URI:{uri}"),
        GeneralName::RFC822Name(mail) => format!("email:{mail}"),
        GeneralName::DirectoryName(dn) => format!("DirName:{dn}"),
        GeneralName::OtherName(oid, _) => format!("othername:{oid}"),
        GeneralName::RegisteredID(oid) => format!("RID:{oid}"),
        GeneralName::X400Address(_) => "X400Name:<unsupported>".to_owned(),
        GeneralName::EDIPartyName(_) => "EdiPartyName:<unsupported>".to_owned(),
    }
}

fn key_type(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> String {
    let alg = &spki.algorithm.algorithm;
    if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        return match curve {
            Some(c) if c == OID_EC_P256 => "ECDSA P-256".to_owned(),
            Some(c) if c == OID_NIST_EC_P384 => "ECDSA P-384".to_owned(),
            Some(c) if c == OID_NIST_EC_P521 => "ECDSA P-521".to_owned(),
            Some(c) => format!("ECDSA (curve {c})"),
            None => "ECDSA (unknown curve)".to_owned(),
        };
    }
    if *alg == OID_PKCS1_RSAENCRYPTION {
        return match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => format!("RSA {}", rsa.key_size()),
            _ => "RSA".to_owned(),
        };
    }
    if *alg == OID_SIG_ED25519 {
        return "Ed25519".to_owned();
    }
    format!("unknown ({alg})")
}
