//! A loaded, checked certificate authority that can sign leaves.

use std::fmt;
use std::path::Path;
use std::time::SystemTime;

use rcgen::KeyPair;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::constraints::NameConstraints;
use super::der::parse;
use super::PkiError;

const PEM_BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const PEM_END: &str = "-----END CERTIFICATE-----";

/// A CA certificate and its private key, checked to belong together and to be usable now.
pub struct Issuer {
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    signer: rcgen::Issuer<'static, KeyPair>,
    pub(crate) subject_raw: Vec<u8>,
    pub(crate) constraints: Option<NameConstraints>,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Issuer {
    /// Loads a CA from PEM text.
    ///
    /// `cert_pem` may hold several certificates (a bundle); the first one is the CA. `key_pem` may
    /// be PKCS#8, SEC1 (`EC PRIVATE KEY`) or PKCS#1 (`RSA PRIVATE KEY`).
    ///
    /// Errors: no certificate or key found, the key does not match the certificate, the
    /// certificate is not a CA or may not sign certificates, the CA is expired or not yet valid,
    /// or it carries name constraints we cannot honour.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let cert_der = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .next()
            .ok_or(PkiError::NoCertificate)?
            .map_err(|_| PkiError::NoCertificate)?;
        let key_der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|_| PkiError::BadKey { source: None })?;
        let key = KeyPair::try_from(&key_der).map_err(|e| PkiError::BadKey { source: Some(e) })?;

        let cert = parse(&cert_der)?;
        if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(PkiError::KeyMismatch);
        }
        let is_ca = cert
            .basic_constraints()
            .map_err(|source| PkiError::BadExtension {
                extension: "basicConstraints",
                source,
            })?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(PkiError::NotCa);
        }
        let key_usage = cert.key_usage().map_err(|source| PkiError::BadExtension {
            extension: "keyUsage",
            source,
        })?;
        if key_usage.is_some_and(|ku| !ku.value.key_cert_sign()) {
            return Err(PkiError::CaCannotSign);
        }
        let not_before = super::der::system_time(cert.validity().not_before.timestamp());
        let not_after = super::der::system_time(cert.validity().not_after.timestamp());
        let constraints = NameConstraints::from_cert(&cert)?;
        let subject_raw = cert.subject().as_raw().to_vec();

        let signer = rcgen::Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(|source| PkiError::Sign { source })?;
        let issuer = Self {
            cert_pem: first_pem_block(cert_pem),
            cert_der: cert_der.into_owned(),
            signer,
            subject_raw,
            constraints,
            not_before,
            not_after,
        };
        issuer.check_valid_at(SystemTime::now())?;
        Ok(issuer)
    }

    /// Reads and loads a CA from files; errors name both files.
    pub fn from_files(cert_path: &Path, key_path: &Path) -> Result<Self, PkiError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| PkiError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let (cert_pem, key_pem) = (read(cert_path)?, read(key_path)?);
        Self::from_pem(&cert_pem, &key_pem).map_err(|source| PkiError::LoadCa {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
            source: Box::new(source),
        })
    }

    /// The CA certificate alone, in PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate alone, in DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// The CA's name constraints as one line (`permitted DNS:x, IP:y; excluded ...`), if any.
    pub fn constraints(&self) -> Option<String> {
        self.constraints.as_ref().map(ToString::to_string)
    }

    pub(crate) fn signer(&self) -> &rcgen::Issuer<'static, KeyPair> {
        &self.signer
    }

    pub(crate) fn check_valid_at(&self, now: SystemTime) -> Result<(), PkiError> {
        if now < self.not_before {
            return Err(PkiError::CaNotYetValid {
                not_before: self.not_before,
            });
        }
        if now > self.not_after {
            return Err(PkiError::CaExpired {
                not_after: self.not_after,
            });
        }
        Ok(())
    }
}

impl fmt::Debug for Issuer {
    /// Never prints the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issuer")
            .field("constraints", &self.constraints)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// The first PEM certificate block of `text`, normalised to end with a newline.
fn first_pem_block(text: &str) -> String {
    let Some(start) = text.find(PEM_BEGIN) else {
        return String::new();
    };
    let block = &text[start..];
    let end = block
        .find(PEM_END)
        .map_or(block.len(), |i| i + PEM_END.len());
    let mut pem = block[..end].replace("\r\n", "\n");
    pem.push('\n');
    pem
}
