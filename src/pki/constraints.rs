//! X.509 name constraints (RFC 5280 §4.2.1.10) for the two SAN types we issue: DNS names and IP
//! addresses, and the syntax checks for those names.
//!
//! Matching follows what verifiers do, so that we refuse exactly what they would reject:
//! - a DNS subtree `example.com` holds `example.com` and any name made by adding labels on the
//!   left (`a.example.com`, not `badexample.com`); a leading dot (`.example.com`) holds only
//!   subdomains (OpenSSL and webpki agree on this extension of the RFC); an empty subtree holds
//!   every name; a subtree webpki cannot read (a trailing dot, a bad label) fails every DNS SAN;
//! - an IP subtree is an address and mask; an address of the other family is never inside it;
//! - a SAN must lie outside every excluded subtree, and, when there are permitted subtrees of its
//!   type, inside one of them. Types with no permitted subtree are unconstrained.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, GeneralSubtree};

use super::PkiError;
use crate::dns_name::{check_san, DnsSuffix, WildcardName};

/// A subject alternative name of a leaf we are asked to sign.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum San {
    Dns(String),
    Ip(IpAddr),
}

impl fmt::Display for San {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dns(name) => write!(f, "DNS:{name}"),
            Self::Ip(ip) => write!(f, "IP:{ip}"),
        }
    }
}

/// Subtrees of one kind (permitted or excluded), by name type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Subtrees {
    pub(crate) dns: Vec<String>,
    pub(crate) ip: Vec<IpNet>,
}

impl Subtrees {
    fn is_empty(&self) -> bool {
        self.dns.is_empty() && self.ip.is_empty()
    }

    fn to_rcgen(&self) -> Vec<rcgen::GeneralSubtree> {
        let dns = self
            .dns
            .iter()
            .map(|d| rcgen::GeneralSubtree::DnsName(d.clone()));
        let ip = self.ip.iter().map(|net| {
            let subnet = rcgen::CidrSubnet::from_addr_prefix(net.network(), net.prefix_len());
            rcgen::GeneralSubtree::IpAddress(subnet)
        });
        dns.chain(ip).collect()
    }
}

/// The name constraints of a CA, reduced to the types that matter for our leaves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NameConstraints {
    pub(crate) permitted: Subtrees,
    pub(crate) excluded: Subtrees,
}

impl NameConstraints {
    /// Constraints for a new CA that permit exactly the given suffixes and networks.
    ///
    /// A name type that is given no permitted subtree would be unconstrained under RFC 5280, which
    /// is not what an operator who wrote `--permit-dns` alone means: a leaked CA key could still
    /// mint a certificate for any IP address. So once anything is permitted, a type with nothing
    /// permitted is excluded entirely (IPs by `0.0.0.0/0` and `::/0`, DNS names by the empty
    /// subtree). Returns `None` when nothing is permitted: no constraints at all.
    pub(crate) fn permitting(dns: &[String], ip: &[IpNet]) -> Option<Self> {
        if dns.is_empty() && ip.is_empty() {
            return None;
        }
        let mut constraints = Self::default();
        constraints.permitted.dns = dns.to_vec();
        constraints.permitted.ip = ip.iter().map(IpNet::trunc).collect();
        if dns.is_empty() {
            constraints.excluded.dns.push(String::new());
        }
        if ip.is_empty() {
            let all_v4: IpNet = "0.0.0.0/0".parse().expect("literal is a valid network");
            let all_v6: IpNet = "::/0".parse().expect("literal is a valid network");
            constraints.excluded.ip = vec![all_v4, all_v6];
        }
        Some(constraints)
    }

    /// Reads the name constraints extension of a CA certificate, if it has one.
    pub(crate) fn from_cert(cert: &X509Certificate<'_>) -> Result<Option<Self>, PkiError> {
        let ext = cert
            .name_constraints()
            .map_err(|source| PkiError::BadExtension {
                extension: "nameConstraints",
                source,
            })?;
        let Some(ext) = ext else { return Ok(None) };
        let mut constraints = Self::default();
        if let Some(subtrees) = &ext.value.permitted_subtrees {
            constraints.permitted = read_subtrees(subtrees)?;
        }
        if let Some(subtrees) = &ext.value.excluded_subtrees {
            constraints.excluded = read_subtrees(subtrees)?;
        }
        Ok(Some(constraints))
    }

    pub(crate) fn to_rcgen(&self) -> rcgen::NameConstraints {
        rcgen::NameConstraints {
            permitted_subtrees: self.permitted.to_rcgen(),
            excluded_subtrees: self.excluded.to_rcgen(),
        }
    }

    /// Whether a verifier honouring these constraints accepts `san`.
    pub(crate) fn permits(&self, san: &San) -> bool {
        match san {
            San::Dns(name) => {
                let mut bases = self.permitted.dns.iter().chain(&self.excluded.dns);
                if !bases.all(|base| readable(base)) {
                    return false;
                }
                let excluded = self
                    .excluded
                    .dns
                    .iter()
                    .any(|base| dns_within(name, base) || wildcard_reaches(name, base));
                let permitted = self.permitted.dns.is_empty()
                    || self.permitted.dns.iter().any(|base| dns_within(name, base));
                !excluded && permitted
            }
            San::Ip(ip) => {
                let excluded = self.excluded.ip.iter().any(|net| net.contains(ip));
                let permitted = self.permitted.ip.is_empty()
                    || self.permitted.ip.iter().any(|net| net.contains(ip));
                !excluded && permitted
            }
        }
    }

    /// Whether every address of `net` is accepted: inside one permitted IP subtree (when there
    /// are any) and overlapping no excluded one. A network covered only by the union of two
    /// permitted subtrees counts as not covered (`kit check` asks for one `--permit-ip` that
    /// holds the pod network).
    pub(crate) fn permits_network(&self, net: &IpNet) -> bool {
        let overlaps = |a: &IpNet, b: &IpNet| a.contains(&b.network()) || b.contains(&a.network());
        let excluded = self.excluded.ip.iter().any(|e| overlaps(e, net));
        let permitted =
            self.permitted.ip.is_empty() || self.permitted.ip.iter().any(|p| p.contains(net));
        !excluded && permitted
    }
}

impl fmt::Display for NameConstraints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list(subtrees: &Subtrees) -> String {
            let dns = subtrees.dns.iter().map(|d| match d.as_str() {
                "" => "DNS:<any>".to_owned(),
                d => format!("DNS:{d}"),
            });
            let ip = subtrees.ip.iter().map(|net| format!("IP:{net}"));
            dns.chain(ip).collect::<Vec<_>>().join(", ")
        }
        let mut parts = Vec::new();
        if !self.permitted.is_empty() {
            parts.push(format!("permitted {}", list(&self.permitted)));
        }
        if !self.excluded.is_empty() {
            parts.push(format!("excluded {}", list(&self.excluded)));
        }
        f.write_str(&parts.join("; "))
    }
}

fn read_subtrees(subtrees: &[GeneralSubtree<'_>]) -> Result<Subtrees, PkiError> {
    let mut out = Subtrees::default();
    for subtree in subtrees {
        match &subtree.base {
            GeneralName::DNSName(name) => out.dns.push((*name).to_owned()),
            GeneralName::IPAddress(bytes) => out.ip.push(ip_subtree(bytes)?),
            // webpki rejects every certificate under a CA with directoryName constraints, and our
            // leaves always have a subject, so refusing to issue is the honest answer.
            GeneralName::DirectoryName(_) => {
                return Err(PkiError::UnsupportedConstraint {
                    kind: "directoryName",
                })
            }
            // Our leaves never carry e-mail, URI or other names, so those constraints cannot be
            // violated by what we sign.
            _ => {}
        }
    }
    Ok(out)
}

fn ip_subtree(bytes: &[u8]) -> Result<IpNet, PkiError> {
    let unsupported = PkiError::UnsupportedConstraint {
        kind: "malformed iPAddress",
    };
    let (addr, mask): (IpAddr, IpAddr) = match bytes.len() {
        8 => {
            let addr: [u8; 4] = bytes[..4].try_into().expect("length checked");
            let mask: [u8; 4] = bytes[4..].try_into().expect("length checked");
            (addr.into(), mask.into())
        }
        32 => {
            let addr: [u8; 16] = bytes[..16].try_into().expect("length checked");
            let mask: [u8; 16] = bytes[16..].try_into().expect("length checked");
            (addr.into(), mask.into())
        }
        _ => return Err(unsupported),
    };
    // A non-contiguous mask is legal DER but no verifier we care about treats it sensibly.
    IpNet::with_netmask(addr, mask)
        .map(|net| net.trunc())
        .map_err(|_| unsupported)
}

/// Whether DNS name `name` lies in the subtree `base` (see the module documentation). A base that
/// is not a valid subtree holds nothing.
pub(crate) fn dns_within(name: &str, base: &str) -> bool {
    base.is_empty() || DnsSuffix::parse(base).is_ok_and(|base| base.contains(name))
}

/// Whether a wildcard name could expand into `base` (`*.example.com` reaches
/// `evil.example.com`), which verifiers treat as a hit on an excluded subtree.
fn wildcard_reaches(name: &str, base: &str) -> bool {
    let (Ok(name), Ok(base)) = (WildcardName::parse(name), DnsSuffix::parse(base)) else {
        return false;
    };
    base.name()
        .as_str()
        .split_once('.')
        .is_some_and(|(_, rest)| rest == name.suffix().as_str())
}

/// Whether webpki can read `base` as a DNS subtree: empty (every name) or a [`DnsSuffix`]. It
/// fails every DNS SAN checked against one it cannot (`MalformedNameConstraint`).
fn readable(base: &str) -> bool {
    base.is_empty() || DnsSuffix::parse(base).is_ok()
}

/// Checks `name` is a DNS SAN verifiers accept and we issue (`check_san`): a host name, without
/// `_` or a trailing dot, or a `*.` wildcard before at least two labels; its last label is not a
/// number, so an IP address given as a DNS name is refused.
pub(crate) fn check_dns_name(name: &str) -> Result<(), PkiError> {
    check_san(name).map_err(|reason| PkiError::InvalidDnsName {
        name: name.to_owned(),
        reason,
    })
}

/// Checks a `--permit-dns` suffix: a [`DnsSuffix`], a DNS name optionally with a leading dot.
pub(crate) fn check_dns_suffix(suffix: &str) -> Result<(), PkiError> {
    DnsSuffix::parse(suffix)
        .map(drop)
        .map_err(|reason| PkiError::InvalidDnsName {
            name: suffix.to_owned(),
            reason,
        })
}
