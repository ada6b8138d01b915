//! Configuration: the TOML file of docs/reference.md, parsed into typed values.
//!
//! Parse, don't validate: [`Config::parse`] reads TOML, interpolates `${VAR}` in every string,
//! mirrors it into `raw` structs that reject unknown keys, then converts each field into its
//! type, collecting every error with its key path (`listeners[1].upstream.dns`) before failing.
//! Nothing here touches the filesystem except [`Config::load`] reading the file itself; whether
//! certificate files exist and parse is the identity module's business (`check` runs both).

mod admin;
mod egress;
mod identity;
mod interp;
mod listener;
pub mod profile;
mod raw;
mod render;
mod routes;
mod scale;
#[cfg(test)]
mod tests;
mod upstream;

pub use crate::identity::{ExportConfig, IdentityConfig, IdentitySource, IssuerConfig};
pub use crate::tls::TlsMode;
pub use admin::AdminConfig;
pub use egress::{EgressConfig, Others as EgressOthers};
pub use interp::{expand, Env, InterpError, ProcessEnv};
pub use listener::{ListenAddr, ListenerConfig, UpstreamAddr, UpstreamConfig};
pub use routes::{Find, PathPattern, RouteConfig};
pub use scale::{scale_out, ScaleFinding};

use identity::identity_from_raw;
use listener::listener_from_raw;
use raw::RawConfig;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One bad field: its key path and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{path}")]
pub struct FieldError {
    pub path: String,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Syntax error; `message` is toml's on one line (its own Display draws a multi-line
    /// snippet, so it is not kept as the source).
    #[error("invalid TOML at line {line}, column {column}: {message}")]
    Toml {
        line: usize,
        column: usize,
        message: String,
    },
    /// Every field error found; displayed on one line, the first one first.
    #[error("{}", .0.iter().map(|e| crate::error::chain(e)).collect::<Vec<_>>().join("; "))]
    Fields(Vec<FieldError>),
}

use crate::error::{message as msg, one_line};

#[derive(Clone, Debug)]
pub struct Config {
    pub identity: Option<IdentityConfig>,
    pub admin: Option<AdminConfig>,
    pub dns: DnsConfig,
    pub limits: Limits,
    pub listeners: Vec<ListenerConfig>,
    /// `[tls]`: versions, suites and groups for every listener and for peers.
    pub tls: crate::crypto::policy::TlsPolicy,
}

#[derive(Clone, Debug)]
pub struct DnsConfig {
    /// Empty: the system resolver configuration.
    pub servers: Vec<SocketAddr>,
    pub refresh: Duration,
    /// How long the last known endpoints are kept after NXDOMAIN or an empty answer.
    pub hold_on_empty: Duration,
}

#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_bytes: usize,
    pub request_head_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub upstream_timeout: Duration,
    pub max_body_bytes: u64,
    pub drain_timeout: Duration,
    /// After this long without a request, memory that serving took is given back (`0s`: never).
    pub idle_trim: Duration,
    /// Connections open at once to one upstream endpoint, idle or busy; requests beyond wait
    /// for one (0: no bound).
    pub upstream_connections: usize,
    /// Listen so that a new process can bind the same addresses while this one still serves,
    /// and take every new connection from then on (`listen::bind`): a restart without a
    /// refused connection.
    pub handover: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            header_bytes: 65_536,
            request_head_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            upstream_timeout: Duration::from_secs(120),
            max_body_bytes: 104_857_600,
            drain_timeout: Duration::from_secs(30),
            idle_trim: Duration::from_secs(5),
            upstream_connections: 128,
            handover: false,
        }
    }
}

/// Parses `"250ms"`, `"10s"`, `"24h"`.
pub fn parse_duration(s: &str) -> Result<Duration, Box<dyn std::error::Error + Send + Sync>> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| {
        msg(format!(
            "invalid duration {s:?} ({e}); use e.g. \"250ms\", \"10s\", \"24h\""
        ))
    })?;
    Ok(d)
}

/// Collects field errors while converting.
struct Fields {
    errors: Vec<FieldError>,
}

impl Fields {
    fn push(&mut self, path: impl Into<String>, source: Box<dyn std::error::Error + Send + Sync>) {
        self.errors.push(FieldError {
            path: path.into(),
            source,
        });
    }

    fn dur(&mut self, path: &str, v: Option<&String>, default: Duration) -> Duration {
        match v.map(|s| parse_duration(s)) {
            None => default,
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                self.push(path, e);
                default
            }
        }
    }

    fn parse<T: std::str::FromStr>(&mut self, path: &str, v: &str) -> Option<T>
    where
        T::Err: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match v.parse::<T>() {
            Ok(t) => Some(t),
            Err(e) => {
                self.push(path, e.into());
                None
            }
        }
    }
}

impl Config {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path, env: &dyn Env) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, env)
    }

    /// Parses configuration text.
    pub fn parse(text: &str, env: &dyn Env) -> Result<Self, ConfigError> {
        let tree: toml::Value = toml::from_str::<toml::Table>(text)
            .map(toml::Value::Table)
            .map_err(|source| {
                let at = source.span().map_or(0, |r| r.start.min(text.len()));
                let before = &text[..at];
                ConfigError::Toml {
                    line: before.matches('\n').count() + 1,
                    column: before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1,
                    message: one_line(source.message()),
                }
            })?;
        Self::from_tree(tree, env)
    }

    /// Interpolates and types an already-read TOML tree (the built-in profiles assemble theirs).
    fn from_tree(mut tree: toml::Value, env: &dyn Env) -> Result<Self, ConfigError> {
        let mut interp_errors = Vec::new();
        interp::expand_tree(&mut tree, "", env, &mut interp_errors);
        if !interp_errors.is_empty() {
            return Err(ConfigError::Fields(
                interp_errors
                    .into_iter()
                    .map(|(path, e)| FieldError {
                        path,
                        source: Box::new(e),
                    })
                    .collect(),
            ));
        }
        let raw: RawConfig = deserialize(tree, "")?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let mut f = Fields { errors: Vec::new() };
        let d = Limits::default();
        let limits = raw.limits.map_or_else(Limits::default, |l| Limits {
            max_connections: l.max_connections.map_or(d.max_connections, |v| v as usize),
            header_bytes: l.header_bytes.map_or(d.header_bytes, |v| v as usize),
            request_head_timeout: f.dur(
                "limits.request_head_timeout",
                l.request_head_timeout.as_ref(),
                d.request_head_timeout,
            ),
            body_timeout: f.dur(
                "limits.body_timeout",
                l.body_timeout.as_ref(),
                d.body_timeout,
            ),
            idle_timeout: f.dur(
                "limits.idle_timeout",
                l.idle_timeout.as_ref(),
                d.idle_timeout,
            ),
            upstream_timeout: f.dur(
                "limits.upstream_timeout",
                l.upstream_timeout.as_ref(),
                d.upstream_timeout,
            ),
            max_body_bytes: l.max_body_bytes.unwrap_or(d.max_body_bytes),
            drain_timeout: f.dur(
                "limits.drain_timeout",
                l.drain_timeout.as_ref(),
                d.drain_timeout,
            ),
            idle_trim: f.dur("limits.idle_trim", l.idle_trim.as_ref(), d.idle_trim),
            upstream_connections: l
                .upstream_connections
                .map_or(d.upstream_connections, |v| v as usize),
            handover: l.handover.unwrap_or(d.handover),
        });
        if limits.max_connections == 0 {
            f.push("limits.max_connections", msg("must be at least 1"));
        }
        if limits.header_bytes < 8192 {
            f.push("limits.header_bytes", msg("must be at least 8192"));
        }

        let admin = raw.admin.and_then(|a| admin::admin_from_raw(a, &mut f));

        let dns = match raw.dns {
            None => DnsConfig {
                servers: Vec::new(),
                refresh: Duration::from_secs(5),
                hold_on_empty: Duration::from_secs(30),
            },
            Some(dns) => DnsConfig {
                servers: dns
                    .servers
                    .unwrap_or_default()
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        // A bare IP means port 53.
                        let with_port = s
                            .parse::<IpAddr>()
                            .map(|ip| SocketAddr::new(ip, 53).to_string())
                            .unwrap_or_else(|_| s.clone());
                        f.parse::<SocketAddr>(&format!("dns.servers[{i}]"), &with_port)
                    })
                    .collect(),
                refresh: f.dur("dns.refresh", dns.refresh.as_ref(), Duration::from_secs(5)),
                hold_on_empty: f.dur(
                    "dns.hold_on_empty",
                    dns.hold_on_empty.as_ref(),
                    Duration::from_secs(30),
                ),
            },
        };

        let identity = raw.identity.and_then(|id| identity_from_raw(id, &mut f));
        let tls = raw.tls.map_or_else(Default::default, |v| {
            crate::crypto::policy::from_toml(v, &mut |p, e| f.push(p, e))
        });

        let mut listeners = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (i, l) in raw.listeners.into_iter().enumerate() {
            let path = format!("listeners[{i}]");
            if let Some(l) = listener_from_raw(l, &path, &mut f) {
                if !names.insert(l.name.clone()) {
                    f.push(
                        format!("{path}.name"),
                        msg(format!("duplicate listener name {:?}", l.name)),
                    );
                }
                if l.egress.is_some() && identity.is_none() {
                    f.push(
                        format!("{path}.egress"),
                        msg("an egress listener presents the sidecar's identity: it needs an [identity] table"),
                    );
                }
                if l.tls != TlsMode::None && identity.is_none() {
                    f.push(
                        format!("{path}.tls"),
                        msg("a TLS listener needs an [identity] table"),
                    );
                }
                listeners.push(l);
            }
        }
        if listeners.is_empty() && f.errors.is_empty() {
            f.push("listeners", msg("at least one [[listeners]] is required"));
        }
        if !f.errors.is_empty() {
            return Err(ConfigError::Fields(f.errors));
        }
        Ok(Self {
            identity,
            admin,
            dns,
            limits,
            listeners,
            tls,
        })
    }
}

fn deserialize<T: serde::de::DeserializeOwned>(
    v: toml::Value,
    prefix: &str,
) -> Result<T, ConfigError> {
    crate::error::toml_table(v, prefix).map_err(|(path, m)| {
        ConfigError::Fields(vec![FieldError {
            path,
            source: Box::new(m),
        }])
    })
}
