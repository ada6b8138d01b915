//! The folder `ironic-proxy ca init` writes, as `kit secrets` and `kit check` read it: ca.crt,
//! ca.key and ca-bundle.crt, checked to belong together. Below both commands: neither imports
//! the other for it.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::pki::{Issuer, PkiError};

#[derive(Debug, thiserror::Error)]
pub enum CaDirError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} does not contain the CA certificate {}: proxies would not trust their own leaves", bundle.display(), ca.display())]
    BundleWithoutCa { bundle: PathBuf, ca: PathBuf },
    #[error("{}", path.display())]
    Bundle {
        path: PathBuf,
        #[source]
        source: PkiError,
    },
    #[error("CA directory")]
    Ca(#[source] PkiError),
}

/// ca.crt and ca.key (checked to be a usable CA and its key) and ca-bundle.crt (checked to hold
/// that CA), as the Secret's data.
pub(crate) fn ca_files(dir: &Path) -> Result<[(&'static str, Vec<u8>); 3], CaDirError> {
    let (crt, key, bundle) = (
        dir.join("ca.crt"),
        dir.join("ca.key"),
        dir.join("ca-bundle.crt"),
    );
    let issuer = Issuer::from_files(&crt, &key).map_err(CaDirError::Ca)?;
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| CaDirError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let bundle_pem = read(&bundle)?;
    let bundle_err = |source| CaDirError::Bundle {
        path: bundle.clone(),
        source,
    };
    let certs = CertificateDer::pem_slice_iter(&bundle_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bundle_err(PkiError::NoCertificate))?;
    if certs.is_empty() {
        return Err(bundle_err(PkiError::NoCertificate));
    }
    if !certs.iter().any(|c| c == issuer.cert_der()) {
        return Err(CaDirError::BundleWithoutCa { bundle, ca: crt });
    }
    Ok([
        ("ca.crt", read(&crt)?),
        ("ca.key", read(&key)?),
        ("ca-bundle.crt", bundle_pem),
    ])
}
