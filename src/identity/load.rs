//! Reading PEM files: certificate chains, private keys and trust bundles.

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no PEM CERTIFICATE found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: invalid PEM")]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("{path}: no PEM private key found")]
    NoKey { path: PathBuf },
    #[error("{path}: certificate cannot be parsed")]
    Parse {
        path: PathBuf,
        #[source]
        source: x509_parser::nom::Err<x509_parser::error::X509Error>,
    },
    #[error("{path}: no usable CA certificate in the trust bundle ({rejected} rejected)")]
    Trust { path: PathBuf, rejected: usize },
}

fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })
}

pub struct Chain {
    pub certs: Vec<CertificateDer<'static>>,
    pub pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub serial: String,
}

pub(crate) fn parse_certs(
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, LoadError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| LoadError::Pem {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(LoadError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Validity window and serial of a DER certificate.
pub(crate) fn validity(
    path: &Path,
    der: &[u8],
) -> Result<(SystemTime, SystemTime, String), LoadError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| LoadError::Parse {
        path: path.to_owned(),
        source: e,
    })?;
    let to_time = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
        } else {
            SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
        }
    };
    let v = cert.validity();
    Ok((
        to_time(v.not_before),
        to_time(v.not_after),
        cert.raw_serial_as_string(),
    ))
}

/// A leaf followed by intermediates.
pub fn load_chain(path: &Path) -> Result<Chain, LoadError> {
    let bytes = read(path)?;
    let certs = parse_certs(path, &bytes)?;
    let (not_before, not_after, serial) = validity(path, &certs[0])?;
    Ok(Chain {
        certs,
        pem: String::from_utf8_lossy(&bytes).into_owned(),
        not_before,
        not_after,
        serial,
    })
}

pub struct Key {
    pub key: PrivateKeyDer<'static>,
    pub pem: String,
}

pub fn load_key(path: &Path) -> Result<Key, LoadError> {
    let bytes = read(path)?;
    let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => LoadError::NoKey {
            path: path.to_owned(),
        },
        source => LoadError::Pem {
            path: path.to_owned(),
            source,
        },
    })?;
    Ok(Key {
        key,
        pem: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// A PEM bundle of trusted CAs (several at once during a CA rotation).
pub fn load_trust(path: &Path) -> Result<(RootCertStore, String), LoadError> {
    let bytes = read(path)?;
    let certs = parse_certs(path, &bytes)?;
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(LoadError::Trust {
            path: path.to_owned(),
            rejected: ignored,
        });
    }
    Ok((roots, String::from_utf8_lossy(&bytes).into_owned()))
}
