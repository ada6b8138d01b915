//! The bearer token that `/metrics` requires (`[admin] bearer_token_file`).
//!
//! The file holds one token (RFC 6750 `b64token`: visible ASCII, no spaces); trailing CR/LF are
//! dropped, since `echo token > file` and `kubectl create secret --from-file` both leave one.
//! Only its SHA-256 digest is kept, and a request's token is hashed and compared in constant
//! time, so neither which byte differs nor the token's length shows through timing.
//!
//! The file is re-read every `watch_interval` and swapped in when its bytes change (a
//! Kubernetes Secret update, a rotation by hand); a file that is missing, empty or not a token
//! keeps the last good token, logs a warning and counts
//! `ironic_proxy_reload_failures_total{what="metrics_token"}`.

use crate::metrics::{AuthLabels, Metrics, ReloadLabels};
use arc_swap::ArcSwap;
use aws_lc_rs::digest::{digest, SHA256};
use http::HeaderMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("admin.bearer_token_file: cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("admin.bearer_token_file: {} holds no token (empty once trailing newlines are dropped)", path.display())]
    Empty { path: PathBuf },
    #[error(
        "admin.bearer_token_file: {} is not one bearer token (byte {at}: a token is visible \
         ASCII without spaces, RFC 6750 b64token)",
        path.display()
    )]
    NotAToken { path: PathBuf, at: usize },
}

/// Why a scrape was refused (also its `ironic_proxy_auth_total` outcome).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No `Authorization` field.
    NoCredentials,
    /// Not exactly one `Authorization: Bearer <token>` field.
    Malformed,
    WrongToken,
}

impl Refusal {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::NoCredentials => "no_credentials",
            Self::Malformed => "malformed",
            Self::WrongToken => "wrong_token",
        }
    }
}

/// The token's digest, swapped when the file changes.
pub(crate) struct MetricsToken {
    digest: ArcSwap<[u8; 32]>,
    metrics: Metrics,
}

/// Longest `Authorization` value looked at; a longer one is malformed without being hashed.
/// Kubernetes service-account tokens (JWTs) are about 1 KB.
const MAX_VALUE: usize = 16 * 1024;

impl MetricsToken {
    /// Reads the file (an error names it and why) and follows it every `every`; the task
    /// returned ends when the token is dropped.
    pub(crate) fn start(
        path: &Path,
        every: Duration,
        metrics: &Metrics,
    ) -> Result<(Arc<Self>, tokio::task::JoinHandle<()>), TokenError> {
        let bytes = std::fs::read(path).map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        let token = Arc::new(Self {
            digest: ArcSwap::from_pointee(parse(path, &bytes)?),
            metrics: metrics.clone(),
        });
        let task = tokio::spawn(follow(
            Arc::downgrade(&token),
            path.to_owned(),
            bytes,
            every,
        ));
        Ok((token, task))
    }

    /// Admits a `/metrics` request, or says why not; counts the outcome either way.
    pub(crate) fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let verdict = self.verdict(headers);
        let outcome = verdict.err().map_or("ok", Refusal::label);
        self.metrics
            .auth
            .get_or_create(&AuthLabels {
                listener: "admin".to_owned(),
                outcome,
            })
            .inc();
        verdict
    }

    fn verdict(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
        let value = match (values.next(), values.next()) {
            (None, _) => return Err(Refusal::NoCredentials),
            (Some(v), None) => v.as_bytes(),
            (Some(_), Some(_)) => return Err(Refusal::Malformed),
        };
        // RFC 6750 §2.1: "Bearer" 1*SP b64token; the scheme is case-insensitive (RFC 9110
        // §11.1).
        if value.len() > MAX_VALUE || value.len() < 7 || !value[..6].eq_ignore_ascii_case(b"bearer")
        {
            return Err(Refusal::Malformed);
        }
        let rest = &value[6..];
        let given = rest.trim_ascii_start();
        if given.len() == rest.len() || given.is_empty() || given.contains(&b' ') {
            return Err(Refusal::Malformed);
        }
        let expected = self.digest.load();
        let ok = aws_lc_rs::constant_time::verify_slices_are_equal(
            digest(&SHA256, given).as_ref(),
            &expected[..],
        );
        ok.map_err(|_| Refusal::WrongToken)
    }
}

/// Reads the token file once (`ironic-proxy check`).
pub fn check(path: &Path) -> Result<(), TokenError> {
    let bytes = std::fs::read(path).map_err(|source| TokenError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &bytes).map(|_| ())
}

/// The digest of the token the file holds.
fn parse(path: &Path, bytes: &[u8]) -> Result<[u8; 32], TokenError> {
    let mut token = bytes;
    while let [head @ .., b'\n' | b'\r'] = token {
        token = head;
    }
    if token.is_empty() {
        return Err(TokenError::Empty {
            path: path.to_owned(),
        });
    }
    if let Some(at) = token.iter().position(|b| !b.is_ascii_graphic()) {
        return Err(TokenError::NotAToken {
            path: path.to_owned(),
            at,
        });
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, token).as_ref());
    Ok(out)
}

/// Re-reads the file when its bytes change, until the token is dropped. `seen` is what the
/// last read gave (`None`: unreadable), so each change is reported once, not on every tick.
async fn follow(token: Weak<MetricsToken>, path: PathBuf, seen: Vec<u8>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let labels = ReloadLabels {
        what: "metrics_token",
    };
    let mut seen = Some(seen);
    loop {
        tick.tick().await;
        let Some(token) = token.upgrade() else { return };
        let now = std::fs::read(&path);
        if now.as_ref().ok() == seen.as_ref() {
            continue;
        }
        let parsed = match now {
            Ok(bytes) => {
                let d = parse(&path, &bytes);
                seen = Some(bytes);
                d
            }
            Err(source) => {
                seen = None;
                Err(TokenError::Read {
                    path: path.clone(),
                    source,
                })
            }
        };
        match parsed {
            Ok(d) => {
                token.digest.store(Arc::new(d));
                tracing::info!(file = %path.display(), "metrics bearer token reloaded");
                token.metrics.reloads.get_or_create(&labels).inc();
            }
            Err(e) => {
                tracing::warn!(
                    error = %crate::error::chain(&e),
                    "metrics bearer token reload failed; keeping the current token"
                );
                token.metrics.reload_failures.get_or_create(&labels).inc();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn token(secret: &[u8]) -> MetricsToken {
        MetricsToken {
            digest: ArcSwap::from_pointee(parse(Path::new("t"), secret).unwrap()),
            metrics: Metrics::new(),
        }
    }

    fn with(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                http::header::AUTHORIZATION,
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_file_holds_one_token_and_trailing_newlines_go() {
        let p = Path::new("f");
        assert_eq!(parse(p, b"abc\n").unwrap(), parse(p, b"abc").unwrap());
        assert_eq!(parse(p, b"abc\r\n\n").unwrap(), parse(p, b"abc").unwrap());
        assert!(matches!(parse(p, b"\n\n"), Err(TokenError::Empty { .. })));
        assert!(matches!(parse(p, b""), Err(TokenError::Empty { .. })));
        assert!(matches!(
            parse(p, b"ab c\n"),
            Err(TokenError::NotAToken { at: 2, .. })
        ));
        assert!(matches!(
            parse(p, b"abc\ndef"),
            Err(TokenError::NotAToken { at: 3, .. })
        ));
    }

    #[test]
    fn bearer_fields_are_read_strictly() {
        let t = token(b"s3cret.token-_~+/=\n");
        assert_eq!(t.check(&with(&["Bearer s3cret.token-_~+/="])), Ok(()));
        assert_eq!(t.check(&with(&["bearer   s3cret.token-_~+/="])), Ok(()));
        assert_eq!(t.check(&with(&[])), Err(Refusal::NoCredentials));
        assert_eq!(
            t.check(&with(&["Bearer s3cret.token-_~+/"])),
            Err(Refusal::WrongToken)
        );
        assert_eq!(
            t.check(&with(&["Bearer s3cret.token-_~+/=="])),
            Err(Refusal::WrongToken)
        );
        for bad in [
            "Bearer",
            "Bearer ",
            "Bearers3cret.token-_~+/=",
            "Basic czNjcmV0",
            "Bearer s3cret token",
        ] {
            assert_eq!(t.check(&with(&[bad])), Err(Refusal::Malformed), "{bad:?}");
        }
        // Two fields, even both right: which one counts is ambiguous.
        assert_eq!(
            t.check(&with(&[
                "Bearer s3cret.token-_~+/=",
                "Bearer s3cret.token-_~+/="
            ])),
            Err(Refusal::Malformed)
        );
        let long = format!("Bearer {}", "a".repeat(MAX_VALUE));
        assert_eq!(t.check(&with(&[&long])), Err(Refusal::Malformed));
    }
}
