//! `allow` rules of mutual listeners: which verified client identities may pass.
//!
//! A rule is an exact DNS name (`conductor-0.ironic.metal3.svc`), a one-label wildcard
//! (`*.ironic.metal3.svc` matches `a.ironic.metal3.svc`, not `a.b.ironic.metal3.svc` nor the bare
//! suffix, as RFC 6125 §6.4.3 wildcards), or `ip:CIDR` (`ip:10.0.0.0/8`, `ip:10.0.0.5`).
//! DNS comparison is ASCII case-insensitive and ignores one trailing dot. An empty rule list
//! allows any certificate that chains to the trust bundle.

use ipnet::IpNet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowRule {
    Dns(String),
    /// `*.suffix`: stores `.suffix` lower-cased.
    Wildcard(String),
    Ip(IpNet),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllowError {
    #[error("empty rule")]
    Empty,
    #[error("invalid CIDR {0:?} (expected ip:10.0.0.0/8 or ip:10.0.0.5)")]
    Cidr(String),
    #[error("invalid DNS name {0:?}")]
    Name(String),
    #[error("wildcard must be a whole leftmost label, as in *.ironic.metal3.svc: {0:?}")]
    Wildcard(String),
}

fn valid_dns(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn normalize(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

impl FromStr for AllowRule {
    type Err = AllowError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(AllowError::Empty);
        }
        if let Some(cidr) = s.strip_prefix("ip:") {
            let net = match cidr.parse::<IpNet>() {
                Ok(net) => net.trunc(),
                Err(_) => cidr
                    .parse::<IpAddr>()
                    .map(IpNet::from)
                    .map_err(|_| AllowError::Cidr(cidr.to_owned()))?,
            };
            return Ok(Self::Ip(net));
        }
        let name = normalize(s);
        if let Some(suffix) = name.strip_prefix("*.") {
            if !valid_dns(suffix) || !suffix.contains('.') {
                return Err(AllowError::Wildcard(s.to_owned()));
            }
            return Ok(Self::Wildcard(format!(".{suffix}")));
        }
        if name.contains('*') {
            return Err(AllowError::Wildcard(s.to_owned()));
        }
        if !valid_dns(&name) {
            return Err(AllowError::Name(s.to_owned()));
        }
        Ok(Self::Dns(name))
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dns(n) => f.write_str(n),
            Self::Wildcard(s) => write!(f, "*{s}"),
            Self::Ip(net) => write!(f, "ip:{net}"),
        }
    }
}

impl AllowRule {
    fn matches_dns(&self, name: &str) -> bool {
        let name = normalize(name);
        match self {
            Self::Dns(n) => *n == name,
            Self::Wildcard(suffix) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|label| !label.is_empty() && !label.contains('.')),
            Self::Ip(_) => false,
        }
    }

    fn matches_ip(&self, ip: IpAddr) -> bool {
        match self {
            Self::Ip(net) => net.contains(&ip),
            _ => false,
        }
    }
}

/// True when some SAN of the client matches some rule (or there are no rules).
pub fn is_allowed(rules: &[AllowRule], dns_sans: &[String], ip_sans: &[IpAddr]) -> bool {
    rules.is_empty()
        || rules.iter().any(|rule| {
            dns_sans.iter().any(|n| rule.matches_dns(n))
                || ip_sans.iter().any(|ip| rule.matches_ip(*ip))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(list: &[&str]) -> Vec<AllowRule> {
        list.iter().map(|r| r.parse().unwrap()).collect()
    }

    #[test]
    fn exact_and_wildcard() {
        let r = rules(&["*.ironic.metal3.svc", "admin.example.org"]);
        let ok = |n: &str| is_allowed(&r, &[n.to_owned()], &[]);
        assert!(ok("a.ironic.metal3.svc"));
        assert!(ok("A.IRONIC.metal3.svc."));
        assert!(ok("admin.example.org"));
        assert!(!ok("ironic.metal3.svc"));
        assert!(!ok("a.b.ironic.metal3.svc"));
        assert!(!ok(".ironic.metal3.svc"));
        assert!(!ok("xironic.metal3.svc"));
        assert!(!ok("evil-admin.example.org"));
    }

    #[test]
    fn cidr_and_single_ip() {
        let r = rules(&["ip:10.0.0.0/8", "ip:fd00::1"]);
        assert!(is_allowed(&r, &[], &["10.1.2.3".parse().unwrap()]));
        assert!(is_allowed(&r, &[], &["fd00::1".parse().unwrap()]));
        assert!(!is_allowed(&r, &[], &["11.0.0.1".parse().unwrap()]));
        assert!(
            !is_allowed(&r, &["10.1.2.3".to_owned()], &[]),
            "a DNS SAN is not an IP"
        );
    }

    #[test]
    fn empty_rules_allow_any_verified_identity() {
        assert!(is_allowed(&[], &[], &[]));
    }

    #[test]
    fn bad_rules_are_rejected() {
        for bad in [
            "",
            "ip:10.0.0.0/33",
            "ip:nope",
            "*",
            "*.svc",
            "a.*.svc",
            "**.a.b",
            "a..b",
        ] {
            assert!(bad.parse::<AllowRule>().is_err(), "{bad:?} parsed");
        }
    }
}
