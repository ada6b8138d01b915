//! `ironic_proxy_certificate_expiry_timestamp_seconds` for one generation: the leaf served
//! (`certificate="leaf"`) and every CA of the trust bundle (`certificate="ca"`), each named by
//! subject and serial so that two CAs of a rotation (often with the same subject) stay apart.

use super::Material;
use crate::metrics::{CertificateLabels, Metrics};
use rustls_pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, X509Certificate};

/// A certificate's subject, serial (hex) and notAfter (Unix seconds), when it parses.
pub(crate) fn describe(der: &[u8]) -> Option<(String, String, i64)> {
    let (_, c) = X509Certificate::from_der(der).ok()?;
    Some((
        c.subject().to_string(),
        c.raw_serial_as_string().replace(':', ""),
        c.validity().not_after.timestamp(),
    ))
}

/// Every certificate of a PEM bundle, as DER (unparsable blocks skipped).
pub(crate) fn pem_certs(pem: &str) -> Vec<CertificateDer<'static>> {
    x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .filter_map(Result::ok)
        .filter(|p| p.label == "CERTIFICATE")
        .map(|p| CertificateDer::from(p.contents))
        .collect()
}

/// Replaces the family's series with those of `m`. A scrape racing a renewal can miss the
/// series for an instant; the next one has them.
pub(crate) fn record(metrics: &Metrics, m: &Material) {
    let family = &metrics.certificate_expiry;
    family.clear();
    if let Some(leaf) = m.certified_key.cert.first() {
        if let Some((subject, serial, not_after)) = describe(leaf) {
            family
                .get_or_create(&CertificateLabels {
                    certificate: "leaf",
                    subject,
                    serial,
                })
                .set(not_after);
        }
    }
    for ca in pem_certs(&m.trust_pem) {
        if let Some((subject, serial, not_after)) = describe(&ca) {
            family
                .get_or_create(&CertificateLabels {
                    certificate: "ca",
                    subject,
                    serial,
                })
                .set(not_after);
        }
    }
}
