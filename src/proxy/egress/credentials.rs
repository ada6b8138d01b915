//! The egress listener's credentials file: `user:password` on one line (compared in constant
//! time), or an htpasswd file of bcrypt hashes (verified by the listener authentication's
//! [`Gate`], off the event loop and cached). Re-read when it changes, like the htpasswd files.

use crate::auth::{htpasswd::Users, AuthConfig, Gate, HtpasswdError, Outcome};
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use http::{HeaderMap, HeaderName};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("listeners[{index}].egress.credentials")]
    File {
        index: usize,
        #[source]
        source: HtpasswdError,
    },
    #[error("listeners[{index}].egress.credentials")]
    Auth {
        index: usize,
        #[source]
        source: crate::auth::AuthError,
    },
}

/// The realm of the egress listener's `Proxy-Authenticate` challenge.
pub(crate) const REALM: &str = "ironic-proxy egress";

/// What a credentials file holds.
pub(crate) enum Credentials {
    /// `user:password`, as the client sends it once decoded.
    Plain(Arc<ArcSwap<Vec<u8>>>),
    Htpasswd(Arc<Gate>),
}

/// `user:password` from a file that is not htpasswd: one non-empty line, no bcrypt hash.
pub(crate) fn plain(bytes: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let (line, None) = (lines.next()?, lines.next()) else {
        return None;
    };
    let (user, password) = line.split_once(':')?;
    (!user.is_empty() && !password.is_empty() && !password.starts_with("$2"))
        .then(|| line.as_bytes().to_vec())
}

/// Reads the file once: how many users it holds (`check`).
pub fn check(index: usize, path: &Path) -> Result<usize, CredentialsError> {
    let bytes = std::fs::read(path).map_err(|source| CredentialsError::File {
        index,
        source: HtpasswdError::Read {
            path: path.to_owned(),
            source,
        },
    })?;
    if plain(&bytes).is_some() {
        return Ok(1);
    }
    Users::parse(&bytes)
        .map(|u| u.len())
        .map_err(|source| CredentialsError::File { index, source })
}

impl Credentials {
    /// Loads `path` and follows it every `every`.
    pub(crate) fn start(
        listener: &str,
        index: usize,
        path: &Path,
        every: Duration,
        metrics: &Metrics,
    ) -> Result<Self, CredentialsError> {
        check(index, path)?;
        let bytes = std::fs::read(path).unwrap_or_default();
        if let Some(p) = plain(&bytes) {
            let slot = Arc::new(ArcSwap::from_pointee(p));
            tokio::spawn(follow(Arc::downgrade(&slot), path.to_owned(), bytes, every));
            return Ok(Self::Plain(slot));
        }
        let cfg = AuthConfig {
            htpasswd: path.to_owned(),
            realm: REALM.to_owned(),
            public: Vec::new(),
            forward_authorization: false,
        };
        Gate::start(listener, index, &cfg, every, metrics)
            .map(Self::Htpasswd)
            .map_err(|source| CredentialsError::Auth { index, source })
    }

    /// Checks the Basic credentials in `field`.
    pub(crate) async fn check(&self, headers: &HeaderMap, field: &HeaderName) -> Outcome {
        match self {
            Self::Htpasswd(gate) => gate.check_field(headers, field).await,
            Self::Plain(expected) => {
                let mut values = headers.get_all(field).iter();
                let (Some(value), None) = (values.next(), values.next()) else {
                    return if headers.contains_key(field) {
                        Outcome::Malformed
                    } else {
                        Outcome::NoCredentials
                    };
                };
                let Some((user, password)) = crate::auth::parse_basic(value.as_bytes()) else {
                    return Outcome::Malformed;
                };
                let mut given = user.into_bytes();
                given.push(b':');
                given.extend_from_slice(&password);
                let expected = expected.load();
                // Only the length can show through timing, never which byte differs.
                let same = aws_lc_rs::constant_time::verify_slices_are_equal(&given, &expected);
                if same.is_ok() {
                    Outcome::Ok
                } else {
                    Outcome::WrongPassword
                }
            }
        }
    }
}

/// Re-reads a plain credentials file when its bytes change; a file that no longer holds one
/// `user:password` line keeps the last good one.
async fn follow(slot: Weak<ArcSwap<Vec<u8>>>, path: PathBuf, mut seen: Vec<u8>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(slot) = slot.upgrade() else { return };
        let Ok(now) = std::fs::read(&path) else {
            continue;
        };
        if now == seen {
            continue;
        }
        match plain(&now) {
            Some(p) => {
                tracing::info!(file = %path.display(), "egress credentials reloaded");
                slot.store(Arc::new(p));
            }
            None => tracing::warn!(file = %path.display(),
                "egress credentials file is not one user:password line; keeping the current one"),
        }
        seen = now;
    }
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn a_plain_file_is_one_user_password_line() {
        assert_eq!(
            plain(b"ironic:s3cret\n").as_deref(),
            Some(&b"ironic:s3cret"[..])
        );
        assert_eq!(
            plain(b"\nironic:a:b\n\n").as_deref(),
            Some(&b"ironic:a:b"[..])
        );
        assert!(plain(b"ironic:$2y$05$abcdefghijklmnopqrstuv").is_none());
        assert!(plain(b"a:b\nc:d\n").is_none());
        assert!(plain(b":pw").is_none());
        assert!(plain(b"user:").is_none());
        assert!(plain(b"nocolon").is_none());
    }
}
