//! Error reporting shared by every module: one line naming the problem and then its causes.
//!
//! The convention, crate-wide: an error's message names what failed in this module's words and
//! never repeats its cause; the cause is returned by `source()` (thiserror's `#[source]` or
//! `#[from]`), so [`chain`] prints each link once: `cannot load the identity: cannot read
//! /certs/tls.crt: No such file or directory (os error 2)`.

/// `a: b: c` from an error and its sources.
/// Always one line: multi-line messages (TOML's caret diagrams) keep their first line only.
pub fn chain(e: &dyn std::error::Error) -> String {
    let first_line = |e: &dyn std::error::Error| {
        let text = e.to_string();
        text.lines()
            .next()
            .unwrap_or_default()
            .trim_end()
            .to_owned()
    };
    let mut s = first_line(e);
    let mut cur = e.source();
    while let Some(c) = cur {
        let part = first_line(c);
        if !part.is_empty() && !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = c.source();
    }
    s
}

/// An error that is only its message: what a config check found wrong with a value.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Message(pub(crate) String);

/// A boxed [`Message`], as the config modules collect field errors.
pub(crate) fn message(m: impl Into<String>) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(Message(m.into()))
}

/// Deserializes a TOML table into its raw mirror; a failure is the key path of the bad field
/// below `prefix` (`listeners[0].auth.public`, or `prefix` itself for the table) and serde's
/// message on one line. Shared by every module that types a config table.
pub(crate) fn toml_table<T: serde::de::DeserializeOwned>(
    v: toml::Value,
    prefix: &str,
) -> Result<T, (String, Message)> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.path().to_string();
        let path = match (prefix.is_empty(), inner.as_str()) {
            (true, ".") => "config".to_owned(),
            (true, _) => inner,
            (false, ".") => prefix.to_owned(),
            (false, _) => format!("{prefix}.{inner}"),
        };
        // `message()`, not Display: Display appends "in `key`" on further lines.
        (path, Message(one_line(e.into_inner().message())))
    })
}

/// Errors are printed as one line on stderr (exit 1 with a one-line reason).
pub(crate) fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::path::PathBuf;

    fn io() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")
    }

    /// The crate's convention: a message never repeats its cause, which comes from `source()`
    /// only; so `chain` prints each cause once without relying on its de-duplication.
    #[test]
    fn messages_do_not_repeat_their_cause() {
        let load = || crate::identity::LoadError::Read {
            path: PathBuf::from("/certs/tls.crt"),
            source: io(),
        };
        let samples: Vec<Box<dyn Error>> = vec![
            Box::new(load()),
            Box::new(crate::identity::IdentityError::File {
                key: "identity.cert",
                source: load(),
            }),
            Box::new(crate::identity::rotate::RotateError::Export {
                dir: PathBuf::from("/export"),
                source: io(),
            }),
            Box::new(crate::listen::ListenError::Bind {
                name: "api".into(),
                addr: "127.0.0.1:1".into(),
                source: io(),
            }),
            Box::new(crate::proxy::upstream::SendError::Connect(io())),
            Box::new(crate::server::ServerError::Admin {
                addr: "127.0.0.1:1".parse().unwrap(),
                source: io(),
            }),
            Box::new(crate::config::ConfigError::Read {
                path: PathBuf::from("/etc/ironic-proxy.toml"),
                source: io(),
            }),
            Box::new(crate::proxy::ProxyError::BadGateway {
                endpoint: "local".into(),
                cause: crate::proxy::Gateway::Send(
                    crate::proxy::upstream::SendError::Connect(io()),
                ),
            }),
        ];
        for e in samples {
            let cause = e.source().expect("a sample with a cause").to_string();
            assert!(!e.to_string().contains(&cause), "{e} repeats {cause}");
            let chain = super::chain(e.as_ref());
            assert_eq!(chain.matches("no such file").count(), 1, "{chain}");
        }
    }

    #[test]
    fn the_chain_is_one_line_of_every_cause() {
        let e = crate::identity::IdentityError::File {
            key: "identity.cert",
            source: crate::identity::LoadError::Read {
                path: PathBuf::from("/certs/tls.crt"),
                source: io(),
            },
        };
        assert_eq!(
            super::chain(&e),
            "identity.cert: cannot load: cannot read /certs/tls.crt: no such file"
        );
    }
}
