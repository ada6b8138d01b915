//! Scale-out checks: whether this node's addresses fit what the rest of the cluster was told
//! about its members. A node added to a cluster that shares one configuration (one pod
//! template, one set of `IRONIC_PROXY_*` variables) is only reachable when each of its addresses
//! lies inside:
//!
//! - the CA's name constraints (`ca init --permit-ip`/`--permit-dns`): outside them no verifier
//!   accepts a certificate for the address, and issuing one is refused;
//! - the peers' `allow` rules of the mutual JSON-RPC listener (`IRONIC_PROXY_PEER_CIDRS`): the
//!   peers run the same rules, so a certificate our own rules refuse is refused by them;
//! - the egress `targets` (the same CIDRs): a peer's egress answers 403 to a call for an address
//!   outside them, so calls to this conductor's `[DEFAULT]host` never leave the caller;
//! - the API `fallback` of a sidecar (`IRONIC_PROXY_FALLBACK`), when one is set: while DNS gives
//!   no peer, only the listed nodes get API requests;
//! - and every extra IP SAN such as a VIP (`IRONIC_PROXY_API_VIPS`) inside the constraints.
//!
//! Each finding names the variable the address came from when a profile's environment set it,
//! so the fix is in the message. Pure: reads the issuer certificate's file, nothing else.

use super::{Config, Env, IdentitySource, TlsMode};
use crate::pki::NameConstraints;
use crate::pki::San;
use std::net::IpAddr;

/// One scale-out check's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleFinding {
    /// `ca`, `peer_cidrs`, `egress_targets`, `fallback`.
    pub check: &'static str,
    pub ok: bool,
    /// False for what only degrades the cluster (the fallback, used only while DNS is down):
    /// `check` then warns instead of refusing.
    pub blocking: bool,
    pub detail: String,
}

/// Where an address of ours came from, for messages.
fn origin(ip: IpAddr, env: &dyn Env) -> &'static str {
    let has = |var: &str| {
        env.var(var).is_some_and(|v| {
            v.split(',').any(|p| {
                let p = p.trim();
                let host = p.split_once('/').map_or(p, |(h, _)| h);
                host.trim_start_matches('[').trim_end_matches(']').parse() == Ok(ip)
            })
        })
    };
    [
        "POD_IPS",
        "IRONIC_PROXY_API_VIPS",
        "IRONIC_IP",
        "PROVISIONING_IP",
    ]
    .into_iter()
    .find(|v| has(v))
    .unwrap_or("identity.ip_addresses")
}

/// `NAME (from VAR)` when the variable is set, else `key`.
fn named(var: &'static str, key: &str, env: &dyn Env) -> String {
    match env.var(var).filter(|v| !v.is_empty()) {
        Some(v) => format!("{var}={v}"),
        None => key.to_owned(),
    }
}

/// This node's certificate names: (DNS names, IPs), from the issuer settings.
fn own_names(config: &Config) -> Option<(&[String], &[IpAddr])> {
    match &config.identity.as_ref()?.source {
        IdentitySource::Issuer(ic) => Some((&ic.dns_names, &ic.ip_addresses)),
        IdentitySource::Files { .. } => None,
    }
}

/// The name constraints of the issuer certificate, if it has any; an error in words.
fn issuer_constraints(config: &Config) -> Result<Option<NameConstraints>, String> {
    let Some(IdentitySource::Issuer(ic)) = config.identity.as_ref().map(|i| &i.source) else {
        return Ok(None);
    };
    let pem = std::fs::read_to_string(&ic.issuer_cert)
        .map_err(|e| format!("{}: {e}", ic.issuer_cert.display()))?;
    let der = crate::identity::expiry::pem_certs(&pem)
        .into_iter()
        .next()
        .ok_or_else(|| format!("{}: no certificate", ic.issuer_cert.display()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| format!("{}: {e}", ic.issuer_cert.display()))?;
    NameConstraints::from_cert(&cert).map_err(|e| crate::error::chain(&e))
}

/// Every scale-out check that applies to `config` (none without an issued identity).
pub fn scale_out(config: &Config, env: &dyn Env) -> Vec<ScaleFinding> {
    let mut out = Vec::new();
    let Some((dns, ips)) = own_names(config) else {
        return out;
    };
    let mut push = |check, ok, detail: String| {
        out.push(ScaleFinding {
            check,
            ok,
            blocking: check != "fallback",
            detail,
        });
    };

    match issuer_constraints(config) {
        Err(e) => push(
            "ca",
            false,
            format!("cannot read the CA's name constraints: {e}"),
        ),
        Ok(None) => push("ca", true, "the CA has no name constraints".to_owned()),
        Ok(Some(c)) => {
            let outside: Vec<String> = ips
                .iter()
                .filter(|ip| !c.permits(&San::Ip(**ip)))
                .map(|ip| format!("IP:{ip} (from {})", origin(*ip, env)))
                .chain(
                    dns.iter()
                        .filter(|d| !c.permits(&San::Dns((*d).clone())))
                        .map(|d| format!("DNS:{d}")),
                )
                .collect();
            if outside.is_empty() {
                push(
                    "ca",
                    true,
                    format!(
                        "our {} name(s) are inside the CA's constraints ({c})",
                        ips.len() + dns.len()
                    ),
                );
            } else {
                push(
                    "ca",
                    false,
                    format!(
                        "{} outside the CA's name constraints ({c}): no peer accepts a certificate \
                         for it and the CA refuses to sign one; create a CA whose --permit-ip / \
                         --permit-dns cover this node and roll it out, or give this node an \
                         address inside them",
                        outside.join(", ")
                    ),
                );
            }
        }
    }

    for l in &config.listeners {
        if l.jsonrpc && l.tls == TlsMode::Mutual && !l.allow.is_empty() {
            let ok = crate::tls::allow::is_allowed(&l.allow, dns, ips);
            let rules = named(
                "IRONIC_PROXY_PEER_CIDRS",
                &format!("listeners[{}].allow", l.name),
                env,
            );
            let detail = if ok {
                format!(
                    "the peers' {} listener admits our certificate ({rules})",
                    l.name
                )
            } else {
                let ours: Vec<String> = ips
                    .iter()
                    .map(|ip| format!("{ip} (from {})", origin(*ip, env)))
                    .chain(dns.iter().cloned())
                    .collect();
                format!(
                    "none of our names ({}) is in {rules}: peers sharing this configuration \
                     refuse our JSON-RPC calls (403); add this node's network to it on every node",
                    ours.join(", ")
                )
            };
            push("peer_cidrs", ok, detail);
        }
        if let Some(e) = &l.egress {
            // A VIP is an address clients dial, never a conductor's `[DEFAULT]host`: peers'
            // JSON-RPC calls never go to it, so it need not be an egress target.
            let outside: Vec<String> = ips
                .iter()
                .filter(|ip| origin(**ip, env) != "IRONIC_PROXY_API_VIPS")
                .filter(|ip| !e.allows_host(&ip.to_string()))
                .map(|ip| format!("{ip} (from {})", origin(*ip, env)))
                .collect();
            let rules = named(
                "IRONIC_PROXY_PEER_CIDRS",
                &format!("listeners[{}].egress.targets", l.name),
                env,
            );
            if outside.is_empty() {
                push(
                    "egress_targets",
                    true,
                    format!("our addresses are egress targets ({rules})"),
                );
            } else {
                push(
                    "egress_targets",
                    false,
                    format!(
                        "{} outside {rules}: the peers' egress refuses JSON-RPC calls to this \
                         conductor (403 target_refused); add this node's network on every node",
                        outside.join(", ")
                    ),
                );
            }
        }
        let up = &l.upstream;
        if up.local.is_some() && !up.fallback.is_empty() {
            let listed: Vec<String> = up.fallback.iter().map(ToString::to_string).collect();
            let fallback = named(
                "IRONIC_PROXY_FALLBACK",
                &format!("listeners[{}].upstream.fallback", l.name),
                env,
            );
            if up.fallback.iter().any(|a| ips.contains(&a.ip())) {
                push(
                    "fallback",
                    true,
                    format!("this node is in the fallback ({fallback})"),
                );
            } else {
                let ours: Vec<String> = ips.iter().map(ToString::to_string).collect();
                push(
                    "fallback",
                    false,
                    format!(
                        "none of our addresses ({}) is in {fallback} ({}): while DNS gives no \
                         peer, no node sends API requests here; add this node's address",
                        ours.join(", "),
                        listed.join(", ")
                    ),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
