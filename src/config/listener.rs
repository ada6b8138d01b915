//! `[[listeners]]` and their upstreams: addresses, TLS mode, `allow`, the upstream table with its
//! balancing and health checks, from raw tables to typed values.

use super::raw::RawListener;
use super::upstream::upstream_from_raw;
use super::{msg, routes, Fields, RouteConfig, TlsMode};
use crate::balance::{HealthOptions, Policy};
use crate::discovery::Target;
use crate::tls::allow::AllowRule;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

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
    /// `[listeners.egress]`: the listener is a forward proxy to peers; `upstream` is empty.
    pub egress: Option<super::EgressConfig>,
}

#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    pub local: Option<UpstreamAddr>,
    /// `name:port` or `srv:_service._proto.name`, resolved by the discovery module.
    pub dns: Option<Target>,
    /// Peers used only while `dns` has given none (discovery::DiscoveryOptions::fallback).
    pub fallback: Vec<SocketAddr>,
    pub tls: bool,
    pub balance: Policy,
    pub health: HealthOptions,
    /// Further tries on another endpoint (default 2).
    pub retries: u32,
}

impl UpstreamConfig {
    /// The upstream of an egress listener: no endpoint of its own.
    fn none() -> Self {
        Self {
            local: None,
            dns: None,
            fallback: Vec::new(),
            tls: false,
            balance: Policy::default(),
            health: HealthOptions::default(),
            retries: 0,
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
        // A DNS name (an IPv4 address was parsed above); IPv6 only in brackets (parsed above),
        // as "fd00::1:6385" is ambiguous. The host becomes part of request URIs, so nothing but
        // a name may pass; it is kept as written (a trailing dot skips the search domains).
        if port == 0 {
            return Err(bad());
        }
        if let Err(why) = crate::dns_name::DnsName::parse(host) {
            return Err(msg(format!(
                "invalid upstream address {s:?}: the host is not a DNS name: {why}"
            )));
        }
        Ok(Self::Tcp {
            host: host.to_owned(),
            port,
        })
    }
}

pub(super) fn listener_from_raw(
    l: RawListener,
    path: &str,
    f: &mut Fields,
) -> Option<ListenerConfig> {
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
    let egress = l.egress.and_then(|e| {
        let at = format!("{path}.egress");
        super::egress::egress_from_raw(e, &at, listen.as_ref(), tls, f)
    });
    let upstream = match (l.upstream, egress.is_some()) {
        (Some(v), false) => upstream_from_raw(v, &format!("{path}.upstream"), f),
        (None, true) => Some(UpstreamConfig::none()),
        (None, false) => {
            f.push(
                format!("{path}.upstream"),
                msg("missing: every listener needs one"),
            );
            None
        }
        (Some(_), true) => {
            f.push(
                format!("{path}.upstream"),
                msg("an egress listener forwards to the host each request names; it has none"),
            );
            None
        }
    };
    if egress.is_some() && (l.auth.is_some() || !l.routes.is_empty() || !allow.is_empty()) {
        f.push(
            format!("{path}.egress"),
            msg("an egress listener takes no auth, routes or allow (its credentials are its own)"),
        );
    }
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
        egress,
    })
}
