//! The site facts `kit check` reads, parsed: address lists, networks and ironic-image's
//! `DHCP_RANGE`. Pure; each parser names the fact and the piece it cannot read.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// The control-plane nodes' addresses (where the host-network pods run), comma-separated.
pub(super) const NODE_ADDRESSES: &str = "IRONIC_PROXY_NODE_ADDRESSES";
/// The VIP(s) clients dial, comma-separated (the profiles read it too).
pub(super) const API_VIPS: &str = "IRONIC_PROXY_API_VIPS";
/// The networks of the Ironic pods' IPs, comma-separated (the sidecar's `allow`).
pub(super) const PEER_CIDRS: &str = "IRONIC_PROXY_PEER_CIDRS";
/// The provisioning networks, comma-separated.
pub(super) const PROVISIONING_CIDRS: &str = "IRONIC_PROXY_PROVISIONING_CIDRS";
/// ironic-image's ranges: `dhcp-range` values separated by `;` (ironic-config/dnsmasq.conf.j2).
pub(super) const DHCP_RANGE: &str = "DHCP_RANGE";
/// The database's host, the host part of ironic-image's database URL
/// (scripts/configure-ironic.sh: `mysql+pymysql://USER:PASSWORD@$MARIADB_HOST/DB`).
pub(super) const MARIADB_HOST: &str = "MARIADB_HOST";

/// The pieces of a comma-separated fact, trimmed, empty ones dropped.
fn pieces(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|p| !p.is_empty())
}

/// Addresses, as `POD_IPS` writes them (a `/prefix` is ignored, brackets allowed).
pub(super) fn addresses(fact: &str, value: &str) -> Result<Vec<IpAddr>, String> {
    pieces(value)
        .map(|p| {
            let host = p.split_once('/').map_or(p, |(h, _)| h);
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .parse()
                .map_err(|_| format!("{fact}: {p:?} is not an IP address"))
        })
        .collect()
}

/// Networks (`192.168.111.0/24`; a bare address is a /32 or /128).
pub(super) fn networks(fact: &str, value: &str) -> Result<Vec<IpNet>, String> {
    pieces(value)
        .map(|p| {
            p.parse::<IpNet>()
                .map(|n| n.trunc())
                .or_else(|_| p.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{fact}: {p:?} is not a network (CIDR)"))
        })
        .collect()
}

/// One `dhcp-range`: its first and last address, same family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Range {
    pub(super) start: IpAddr,
    pub(super) end: IpAddr,
}

impl Range {
    pub(super) fn contains(&self, ip: IpAddr) -> bool {
        self.start.is_ipv4() == ip.is_ipv4() && self.start <= ip && ip <= self.end
    }

    pub(super) fn inside(&self, net: &IpNet) -> bool {
        net.contains(&self.start) && net.contains(&self.end)
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

/// What one `DHCP_RANGE` item is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Item {
    Range(Range),
    /// `constructor:IFACE`: the addresses come from the interface on the node, unknown offline.
    Constructed(String),
}

/// `DHCP_RANGE`: items separated by `;`, each dnsmasq's
/// `[tag:T,][set:T,]START[,END][,MODE][,NETMASK|PREFIX][,LEASE]`. An item without an end is the
/// one address (dnsmasq's `static` and `proxy` modes lease no range).
pub(super) fn dhcp_ranges(value: &str) -> Result<Vec<Item>, String> {
    let mut out = Vec::new();
    for item in value.split(';').map(str::trim).filter(|i| !i.is_empty()) {
        let fields: Vec<&str> = item
            .split(',')
            .map(str::trim)
            .skip_while(|f| f.starts_with("tag:") || f.starts_with("set:"))
            .collect();
        if let Some(c) = fields.iter().find(|f| f.starts_with("constructor:")) {
            out.push(Item::Constructed(format!("{item} ({c})")));
            continue;
        }
        let bad = || format!("{DHCP_RANGE}: {item:?} does not start with an address");
        let start: IpAddr = fields.first().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let end = fields
            .get(1)
            .and_then(|f| f.parse::<IpAddr>().ok())
            .filter(|e| e.is_ipv4() == start.is_ipv4())
            .unwrap_or(start);
        if end < start {
            return Err(format!("{DHCP_RANGE}: {item:?} ends before it starts"));
        }
        out.push(Item::Range(Range { start, end }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn dhcp_range_reads_ironic_images_items() {
        let items = dhcp_ranges(
            "172.22.0.10,172.22.0.100,24; tag:p,fd2e:6f44:5dd8:c956::a,fd2e:6f44:5dd8:c956::ff,64,10m;\
             172.22.0.5,static;::,constructor:eth0,ra-only",
        )
        .unwrap();
        assert_eq!(
            items[0],
            Item::Range(Range {
                start: ip("172.22.0.10"),
                end: ip("172.22.0.100")
            })
        );
        let Item::Range(v6) = items[1] else { panic!() };
        assert_eq!(
            v6.to_string(),
            "fd2e:6f44:5dd8:c956::a-fd2e:6f44:5dd8:c956::ff"
        );
        assert_eq!(
            items[2],
            Item::Range(Range {
                start: ip("172.22.0.5"),
                end: ip("172.22.0.5")
            })
        );
        assert!(matches!(items[3], Item::Constructed(_)));
        assert!(dhcp_ranges("eth0,1.2.3.4").is_err());
        assert!(dhcp_ranges("10.0.0.9,10.0.0.1").is_err());
        assert_eq!(dhcp_ranges("").unwrap(), []);
    }

    #[test]
    fn ranges_contain_and_fit_by_family() {
        let r = Range {
            start: ip("172.22.0.10"),
            end: ip("172.22.0.100"),
        };
        assert!(r.contains(ip("172.22.0.10")) && r.contains(ip("172.22.0.100")));
        assert!(!r.contains(ip("172.22.0.9")) && !r.contains(ip("::1")));
        assert!(r.inside(&"172.22.0.0/24".parse().unwrap()));
        assert!(!r.inside(&"172.22.0.0/26".parse().unwrap()));
    }

    #[test]
    fn lists_name_the_fact_and_the_piece() {
        assert_eq!(
            addresses(NODE_ADDRESSES, "192.168.111.21, [fd00::21], 10.0.0.1/24").unwrap(),
            [ip("192.168.111.21"), ip("fd00::21"), ip("10.0.0.1")]
        );
        let e = addresses(NODE_ADDRESSES, "192.168.111.21,node-a").unwrap_err();
        assert_eq!(
            e,
            "IRONIC_PROXY_NODE_ADDRESSES: \"node-a\" is not an IP address"
        );
        assert_eq!(
            networks(PEER_CIDRS, "192.168.111.7/24,10.0.0.5").unwrap(),
            [
                "192.168.111.0/24".parse::<IpNet>().unwrap(),
                "10.0.0.5/32".parse().unwrap()
            ]
        );
        assert!(networks(PEER_CIDRS, "192.168.111.0/33").is_err());
    }
}
