//! Reading certificates: DER parsing with our error, and certificate times.

use super::PkiError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

/// Parses one DER certificate, mapping the parser's error into ours.
pub(crate) fn parse(der: &[u8]) -> Result<X509Certificate<'_>, PkiError> {
    match X509Certificate::from_der(der) {
        Ok((_, cert)) => Ok(cert),
        Err(x509_parser::nom::Err::Error(e) | x509_parser::nom::Err::Failure(e)) => {
            Err(PkiError::BadCertificate { source: e })
        }
        Err(x509_parser::nom::Err::Incomplete(_)) => Err(PkiError::BadCertificate {
            source: x509_parser::error::X509Error::InvalidCertificate,
        }),
    }
}

/// A certificate time (seconds since the epoch, possibly negative) as a `SystemTime`.
pub(crate) fn system_time(unix: i64) -> SystemTime {
    let magnitude = Duration::from_secs(unix.unsigned_abs());
    if unix >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    // humantime cannot format times before the epoch; no certificate we care about has one.
    if t < UNIX_EPOCH {
        return "before 1970".to_owned();
    }
    humantime::format_rfc3339_seconds(t).to_string()
}
