//! `allow` rules of mutual listeners: which verified client identities may pass.
//!
//! A rule is an exact DNS name (`conductor-0.ironic.metal3.svc`), a one-label wildcard
//! (`*.ironic.metal3.svc` matches `a.ironic.metal3.svc`, not `a.b.ironic.metal3.svc` nor the bare
//! suffix, as RFC 6125 §6.4.3 wildcards), or `ip:CIDR` (`ip:10.0.0.0/8`, `ip:10.0.0.5`).
//! Names follow `dns_name::DnsName`'s syntax (rustls'), so a rule never names something no certificate
//! that rustls verifies can carry. DNS comparison is ASCII case-insensitive and ignores one
//! trailing dot. An empty rule list allows any certificate that chains to the trust bundle.

use crate::dns_name::{DnsName, DnsNameError, WildcardName};
use ipnet::IpNet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowRule {
    Dns(DnsName),
    /// `*.suffix`.
    Wildcard(WildcardName),
    Ip(IpNet),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllowError {
    #[error("empty rule")]
    Empty,
    #[error("invalid CIDR {0:?} (expected ip:10.0.0.0/8 or ip:10.0.0.5)")]
    Cidr(String),
    #[error("invalid DNS name {rule:?}: {reason}")]
    Name { rule: String, reason: DnsNameError },
    #[error("wildcard must be a whole leftmost label, as in *.ironic.metal3.svc: {0:?}")]
    Wildcard(String),
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
        let refused = |reason| match reason {
            DnsNameError::Wildcard => AllowError::Wildcard(s.to_owned()),
            reason => AllowError::Name {
                rule: s.to_owned(),
                reason,
            },
        };
        if s.contains('*') {
            return WildcardName::parse(s).map(Self::Wildcard).map_err(refused);
        }
        DnsName::parse(s).map(Self::Dns).map_err(refused)
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dns(name) => fmt::Display::fmt(name, f),
            Self::Wildcard(pattern) => fmt::Display::fmt(pattern, f),
            Self::Ip(net) => write!(f, "ip:{net}"),
        }
    }
}

impl AllowRule {
    /// `name` is a SAN as the peer's certificate carries it: any string.
    fn matches_dns(&self, name: &str) -> bool {
        match self {
            Self::Dns(rule) => rule.matches(name),
            Self::Wildcard(rule) => rule.matches(name),
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

    /// A rule takes exactly the names rustls verifies (`_` included, as SRV-style names are),
    /// and says which rule it broke.
    #[test]
    fn rules_take_the_names_a_certificate_can_carry() {
        for (rule, shown) in [
            ("_conductor.ironic.svc", "_conductor.ironic.svc"),
            ("Admin.Example.ORG.", "admin.example.org"),
            ("*.IRONIC.svc.", "*.ironic.svc"),
            ("localhost", "localhost"),
        ] {
            let parsed: AllowRule = rule.parse().unwrap();
            assert_eq!(parsed.to_string(), shown);
            assert_eq!(shown.parse::<AllowRule>().unwrap(), parsed);
        }
        for (bad, reason) in [
            ("-a.example", DnsNameError::Hyphen),
            ("a-.example", DnsNameError::Hyphen),
            ("host.123", DnsNameError::NumericLast),
            ("a.0x1f", DnsNameError::NumericLast),
            ("a b.example", DnsNameError::Character(' ')),
            ("é.example", DnsNameError::Character('é')),
            ("*.a..b", DnsNameError::EmptyLabel),
        ] {
            let err = bad.parse::<AllowRule>().unwrap_err();
            let want = AllowError::Name {
                rule: bad.to_owned(),
                reason,
            };
            assert_eq!(err, want, "{bad:?}");
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        for bad in ["*", "*.svc", "a.*.svc", "**.a.b", "*a.b.c"] {
            let err = bad.parse::<AllowRule>().unwrap_err();
            assert_eq!(err, AllowError::Wildcard(bad.to_owned()), "{bad:?}");
        }
    }
}
