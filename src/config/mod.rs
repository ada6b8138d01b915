//! Configuration: the TOML file of docs/reference.md, parsed into typed values.
//!
//! Parse, don't validate: [`Config::parse`] reads TOML, interpolates `${VAR}` in every string,
//! mirrors it into `raw` structs that reject unknown keys, then converts each field into its
//! type, collecting every error with its key path (`listeners[1].upstream.dns`) before failing.
//! Nothing here touches the filesystem except [`Config::load`] reading the file itself; whether
//! certificate files exist and parse is the identity module's business (`check` runs both).

mod interp;
pub mod profile;
mod raw;
mod render;
mod routes;
#[cfg(test)]
mod tests;

pub use crate::identity::{ExportConfig, IdentityConfig, IdentitySource, IssuerConfig};
pub use crate::tls::TlsMode;
pub use interp::{expand, Env, InterpError, ProcessEnv};
pub use routes::{Find, PathPattern, RouteConfig};

use crate::tls::allow::AllowRule;
use raw::{RawConfig, RawHealth, RawListener, RawUpstream};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One bad field: its key path and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FieldError {
    pub path: String,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Syntax error; `message` is toml's on one line (its own Display draws a snippet).
    #[error("invalid TOML at line {line}, column {column}: {message}")]
    Toml {
        line: usize,
        column: usize,
        message: String,
        #[source]
        source: Box<toml::de::Error>,
    },
    /// Every field error found; displayed on one line, the first one first.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Fields(Vec<FieldError>),
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

fn msg(m: impl Into<String>) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(Msg(m.into()))
}

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
pub struct AdminConfig {
    pub listen: SocketAddr,
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
        }
    }
}

/// Where a listener binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// Where an upstream is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamAddr {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Balance {
    LeastRequest,
    RoundRobin,
}

#[derive(Clone, Debug)]
pub struct ListenerConfig {
    pub name: String,
    pub listen: ListenAddr,
    pub tls: TlsMode,
    pub http2: bool,
    /// The listener carries Ironic's JSON-RPC: each call's method is logged and counted.
    pub jsonrpc: bool,
    pub allow: Vec<AllowRule>,
    pub upstream: UpstreamConfig,
    /// `[listeners.auth]`: HTTP Basic authentication.
    pub auth: Option<crate::auth::AuthConfig>,
    /// Path routes to other upstreams; `upstream` serves every other path.
    pub routes: Vec<RouteConfig>,
}

#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    pub local: Option<UpstreamAddr>,
    /// `name:port` or `srv:_service._proto.name`, resolved by the discovery module.
    pub dns: Option<String>,
    /// Peers used only while `dns` has given none (discovery::DiscoveryOptions::fallback).
    pub fallback: Vec<SocketAddr>,
    pub tls: bool,
    pub balance: Balance,
    pub health: HealthConfig,
    /// Further tries on another endpoint (default 2).
    pub retries: u32,
}

#[derive(Clone, Debug)]
pub struct HealthConfig {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub unhealthy_after: u32,
    pub healthy_after: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            path: "/".into(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            unhealthy_after: 2,
            healthy_after: 1,
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(a) => write!(f, "{a}"),
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
            Self::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Self::Tcp { host, port } => write!(f, "{host}:{port}"),
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

fn parse_unix_path(p: &str) -> Result<PathBuf, Box<dyn std::error::Error + Send + Sync>> {
    if p.is_empty() || !p.starts_with('/') {
        return Err(msg(format!("unix socket path must be absolute: {p:?}")));
    }
    Ok(PathBuf::from(p))
}

impl std::str::FromStr for ListenAddr {
    type Err = Box<dyn std::error::Error + Send + Sync>;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(Self::Unix(parse_unix_path(p)?));
        }
        s.parse::<SocketAddr>().map(Self::Tcp).map_err(|_| {
            msg(format!(
                "invalid listen address {s:?} (expected ip:port, [ipv6]:port or unix:/path)"
            ))
        })
    }
}

impl std::str::FromStr for UpstreamAddr {
    type Err = Box<dyn std::error::Error + Send + Sync>;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(Self::Unix(parse_unix_path(p)?));
        }
        if let Ok(sa) = s.parse::<SocketAddr>() {
            return Ok(Self::Tcp {
                host: sa.ip().to_string(),
                port: sa.port(),
            });
        }
        let bad = || {
            msg(format!(
                "invalid upstream address {s:?} (expected unix:/path or host:port)"
            ))
        };
        let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        // A DNS name or IPv4 address; IPv6 only in brackets (parsed above), as "fd00::1:6385"
        // is ambiguous. The host becomes part of request URIs, so nothing else may pass.
        let name_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_');
        if host.is_empty() || !host.bytes().all(name_char) || port == 0 {
            return Err(bad());
        }
        Ok(Self::Tcp {
            host: host.to_owned(),
            port,
        })
    }
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
                    source: Box::new(source),
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
        });
        if limits.max_connections == 0 {
            f.push("limits.max_connections", msg("must be at least 1"));
        }
        if limits.header_bytes < 8192 {
            f.push("limits.header_bytes", msg("must be at least 8192"));
        }

        let admin = raw.admin.and_then(|a| {
            f.parse::<SocketAddr>("admin.listen", &a.listen)
                .map(|listen| AdminConfig { listen })
        });

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
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.path().to_string();
        let path = match (prefix.is_empty(), inner.as_str()) {
            (true, ".") => "config".to_owned(),
            (true, _) => inner,
            (false, ".") => prefix.to_owned(),
            (false, _) => format!("{prefix}.{inner}"),
        };
        ConfigError::Fields(vec![FieldError {
            path,
            // `message()`, not Display: Display appends "in `key`" on further lines.
            source: msg(one_line(e.into_inner().message())),
        }])
    })
}

/// Errors are printed as one line on stderr (exit 1 with a one-line reason).
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

fn identity_from_raw(id: raw::RawIdentity, f: &mut Fields) -> Option<IdentityConfig> {
    let Some(trust) = id.trust else {
        f.push(
            "identity.trust",
            msg("is required (PEM bundle of trusted CAs)"),
        );
        return None;
    };
    let issuer = id.issuer_cert.is_some() || id.issuer_key.is_some();
    let files = id.cert.is_some() || id.key.is_some();
    let source = match (issuer, files) {
        (true, true) => {
            f.push(
                "identity",
                msg("use either issuer_cert/issuer_key or cert/key, not both"),
            );
            return None;
        }
        (false, false) => {
            f.push(
                "identity",
                msg("needs issuer_cert + issuer_key, or cert + key"),
            );
            return None;
        }
        (false, true) => match (id.cert, id.key) {
            (Some(cert), Some(key)) => IdentitySource::Files {
                cert: cert.into(),
                key: key.into(),
            },
            (None, _) => {
                f.push("identity.cert", msg("is required with identity.key"));
                return None;
            }
            (_, None) => {
                f.push("identity.key", msg("is required with identity.cert"));
                return None;
            }
        },
        (true, false) => {
            let validity = f.dur(
                "identity.validity",
                id.validity.as_ref(),
                Duration::from_secs(86_400),
            );
            let renew_before = f.dur(
                "identity.renew_before",
                id.renew_before.as_ref(),
                validity / 3,
            );
            if renew_before >= validity {
                f.push(
                    "identity.renew_before",
                    msg("must be shorter than identity.validity"),
                );
            }
            let dns_names = id.dns_names.unwrap_or_default();
            let ip_addresses: Vec<IpAddr> = id
                .ip_addresses
                .unwrap_or_default()
                .iter()
                .enumerate()
                .filter_map(|(i, s)| f.parse::<IpAddr>(&format!("identity.ip_addresses[{i}]"), s))
                .collect();
            for (i, n) in dns_names.iter().enumerate() {
                if n.parse::<AllowRule>()
                    .map_or(true, |r| !matches!(r, AllowRule::Dns(_)))
                {
                    f.push(
                        format!("identity.dns_names[{i}]"),
                        msg(format!("invalid DNS name {n:?}")),
                    );
                }
            }
            if dns_names.is_empty() && ip_addresses.is_empty() {
                f.push(
                    "identity.dns_names",
                    msg("issuer mode needs at least one dns_names or ip_addresses entry"),
                );
            }
            match (id.issuer_cert, id.issuer_key) {
                (Some(c), Some(k)) => IdentitySource::Issuer(IssuerConfig {
                    issuer_cert: c.into(),
                    issuer_key: k.into(),
                    dns_names,
                    ip_addresses,
                    validity,
                    renew_before,
                }),
                (None, _) => {
                    f.push(
                        "identity.issuer_cert",
                        msg("is required with identity.issuer_key"),
                    );
                    return None;
                }
                (_, None) => {
                    f.push(
                        "identity.issuer_key",
                        msg("is required with identity.issuer_cert"),
                    );
                    return None;
                }
            }
        }
    };
    let mode = match id.export_mode.as_deref() {
        None => 0o640,
        Some(m) => match u32::from_str_radix(m.trim_start_matches("0o"), 8) {
            Ok(v) if v <= 0o777 => v,
            _ => {
                f.push(
                    "identity.export_mode",
                    msg(format!("invalid octal file mode {m:?}")),
                );
                0o640
            }
        },
    };
    let export = id.export_dir.map(|dir| ExportConfig {
        dir: dir.into(),
        mode,
        group: id.export_group,
    });
    let watch_interval = f.dur(
        "identity.watch_interval",
        id.watch_interval.as_ref(),
        Duration::from_secs(2),
    );
    Some(IdentityConfig {
        trust: trust.into(),
        source,
        export,
        watch_interval,
    })
}

fn listener_from_raw(l: RawListener, path: &str, f: &mut Fields) -> Option<ListenerConfig> {
    let listen = f.parse::<ListenAddr>(&format!("{path}.listen"), &l.listen);
    let tls = match l.tls.as_deref().unwrap_or("none") {
        "none" => TlsMode::None,
        "server" => TlsMode::Server,
        "mutual" => TlsMode::Mutual,
        "optional" => TlsMode::Optional,
        other => {
            f.push(
                format!("{path}.tls"),
                msg(format!(
                    "{other:?} is not one of none, server, mutual, optional"
                )),
            );
            TlsMode::None
        }
    };
    let allow: Vec<AllowRule> = l
        .allow
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter_map(|(i, r)| f.parse::<AllowRule>(&format!("{path}.allow[{i}]"), r))
        .collect();
    if !allow.is_empty() && tls != TlsMode::Mutual {
        f.push(
            format!("{path}.allow"),
            msg("only applies to tls = \"mutual\" listeners"),
        );
    }
    if tls == TlsMode::None && l.http2 == Some(true) {
        f.push(
            format!("{path}.http2"),
            msg("h2 is offered through ALPN, so it needs tls"),
        );
    }
    let upstream = upstream_from_raw(l.upstream, &format!("{path}.upstream"), f);
    let auth = l
        .auth
        .and_then(|v| crate::auth::from_toml(v, &format!("{path}.auth"), &mut |p, e| f.push(p, e)));
    let routes = routes::routes_from_raw(l.routes, path, tls, f);
    let name = l.name.unwrap_or_else(|| l.listen.clone());
    Some(ListenerConfig {
        name,
        listen: listen?,
        tls,
        http2: l.http2.unwrap_or(tls != TlsMode::None),
        jsonrpc: l.jsonrpc.unwrap_or(false),
        allow,
        upstream: upstream?,
        auth,
        routes,
    })
}

fn upstream_from_raw(v: toml::Value, path: &str, f: &mut Fields) -> Option<UpstreamConfig> {
    let raw: RawUpstream = match v {
        toml::Value::String(s) => RawUpstream {
            local: Some(s),
            dns: None,
            fallback: None,
            tls: None,
            balance: None,
            health: None,
            retries: None,
        },
        table @ toml::Value::Table(_) => match deserialize(table, path) {
            Ok(r) => r,
            Err(ConfigError::Fields(mut errs)) => {
                f.errors.append(&mut errs);
                return None;
            }
            Err(_) => return None,
        },
        _ => {
            f.push(
                path,
                msg("must be \"unix:/path\", \"host:port\" or a table"),
            );
            return None;
        }
    };
    let local = raw
        .local
        .as_deref()
        .and_then(|s| f.parse::<UpstreamAddr>(&format!("{path}.local"), s));
    if let Some(dns) = &raw.dns {
        if let Err(e) = dns.parse::<crate::discovery::Target>() {
            f.push(format!("{path}.dns"), Box::new(e));
        }
    }
    if raw.local.is_none() && raw.dns.is_none() {
        f.push(path, msg("needs local, dns, or both"));
    }
    let fallback: Vec<SocketAddr> = raw
        .fallback
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter_map(|(i, s)| f.parse::<SocketAddr>(&format!("{path}.fallback[{i}]"), s))
        .collect();
    if !fallback.is_empty() && raw.dns.is_none() {
        f.push(
            format!("{path}.fallback"),
            msg("is only used while dns gives no peer: it needs dns (a fixed peer is local)"),
        );
    }
    let balance = match raw.balance.as_deref().unwrap_or("least_request") {
        "least_request" => Balance::LeastRequest,
        "round_robin" => Balance::RoundRobin,
        other => {
            f.push(
                format!("{path}.balance"),
                msg(format!("{other:?} is not least_request or round_robin")),
            );
            Balance::LeastRequest
        }
    };
    let health = raw.health.map_or_else(HealthConfig::default, |h| {
        health_from_raw(h, &format!("{path}.health"), f)
    });
    Some(UpstreamConfig {
        local,
        dns: raw.dns,
        fallback,
        tls: raw.tls.unwrap_or(false),
        balance,
        health,
        retries: raw.retries.unwrap_or(2),
    })
}

fn health_from_raw(h: RawHealth, path: &str, f: &mut Fields) -> HealthConfig {
    let d = HealthConfig::default();
    let cfg = HealthConfig {
        path: h.path.unwrap_or(d.path),
        interval: f.dur(&format!("{path}.interval"), h.interval.as_ref(), d.interval),
        timeout: f.dur(&format!("{path}.timeout"), h.timeout.as_ref(), d.timeout),
        unhealthy_after: h.unhealthy_after.unwrap_or(d.unhealthy_after),
        healthy_after: h.healthy_after.unwrap_or(d.healthy_after),
    };
    if !cfg.path.starts_with('/') {
        f.push(format!("{path}.path"), msg("must start with /"));
    }
    if cfg.unhealthy_after == 0 || cfg.healthy_after == 0 {
        f.push(
            path,
            msg("unhealthy_after and healthy_after must be at least 1"),
        );
    }
    cfg
}
