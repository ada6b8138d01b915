//! An upstream table (a listener's or a route's): `local`, `dns`, `fallback`, TLS towards peers,
//! balancing, retries and health checks, from raw to typed values.

use super::raw::{RawHealth, RawUpstream};
use super::{deserialize, msg, ConfigError, Fields, UpstreamAddr, UpstreamConfig};
use crate::balance::{HealthOptions, Policy};
use crate::discovery::Target;
use std::net::SocketAddr;

pub(super) fn upstream_from_raw(
    v: toml::Value,
    path: &str,
    f: &mut Fields,
) -> Option<UpstreamConfig> {
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
    let dns = raw
        .dns
        .as_deref()
        .and_then(|s| f.parse::<Target>(&format!("{path}.dns"), s));
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
    let balance = raw
        .balance
        .as_deref()
        .map_or(Some(Policy::default()), |s| {
            f.parse::<Policy>(&format!("{path}.balance"), s)
        })
        .unwrap_or_default();
    let health = raw.health.map_or_else(HealthOptions::default, |h| {
        health_from_raw(h, &format!("{path}.health"), f)
    });
    Some(UpstreamConfig {
        local,
        dns,
        fallback,
        tls: raw.tls.unwrap_or(false),
        balance,
        health,
        retries: raw.retries.unwrap_or(2),
    })
}

fn health_from_raw(h: RawHealth, path: &str, f: &mut Fields) -> HealthOptions {
    let d = HealthOptions::default();
    let cfg = HealthOptions {
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
