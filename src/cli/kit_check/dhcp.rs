//! `kit check`'s DHCP checks on the site facts: the ranges inside the provisioning networks and
//! clear of the nodes and the VIP, or, in the pod-network layout, no DHCP at all. Pure.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::facts::{self, Item, API_VIPS, DHCP_RANGE, NODE_ADDRESSES};
use super::objects::Layout;
use super::rules::fact;
use super::Line;

/// `dhcp.ranges` (inside the provisioning networks) and `dhcp.overlap` (no node address or VIP
/// inside a range); in the pod-network layout `dhcp.layout` instead: no dnsmasq, virtual media
/// only.
pub(super) fn dhcp(site: &BTreeMap<String, String>, layout: &Layout) -> Vec<Line> {
    if layout.pods.is_some() {
        return vec![if layout.dnsmasq {
            Line::fail(
                "dhcp.layout",
                "components/dhcp is in an overlay of statefulset/: its dnsmasq would hand out \
                 boot URLs on a node's address, where no Ironic pod of this layout listens",
                "remove components/dhcp (and boot-files) from the overlay: statefulset/ is \
                 virtual media only; for DHCP and PXE use standalone/ (docs/install.md, \
                 \"Choose a layout\")",
            )
        } else {
            Line::pass(
                "dhcp.layout",
                format!("pod network, virtual media only: no dnsmasq ({DHCP_RANGE} is not read)"),
            )
        }];
    }
    let Some(value) = fact(site, DHCP_RANGE) else {
        let none = format!("no {DHCP_RANGE}: no DHCP server is configured");
        return vec![
            Line::pass("dhcp.ranges", none.clone()),
            Line::pass("dhcp.overlap", none),
        ];
    };
    let items = match facts::dhcp_ranges(value) {
        Ok(i) => i,
        Err(e) => {
            let fix = "write DHCP_RANGE as ironic-image reads it: START,END[,PREFIX][,LEASE], \
                       ranges separated by ';'";
            return vec![
                Line::fail("dhcp.ranges", e.clone(), fix),
                Line::fail("dhcp.overlap", e, fix),
            ];
        }
    };
    let ranges: Vec<facts::Range> = items
        .iter()
        .filter_map(|i| match i {
            Item::Range(r) => Some(*r),
            Item::Constructed(_) => None,
        })
        .collect();
    let constructed: Vec<&str> = items
        .iter()
        .filter_map(|i| match i {
            Item::Constructed(c) => Some(c.as_str()),
            Item::Range(_) => None,
        })
        .collect();
    let note = if constructed.is_empty() {
        String::new()
    } else {
        format!(
            "; not checked (addresses from the node's interface): {}",
            constructed.join(", ")
        )
    };
    let shown = ranges
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let prov = fact(site, facts::PROVISIONING_CIDRS)
        .map(|v| facts::networks(facts::PROVISIONING_CIDRS, v));
    let inside = match prov {
        None => Line::fail(
            "dhcp.ranges",
            format!(
                "{DHCP_RANGE} is set but {} is not",
                facts::PROVISIONING_CIDRS
            ),
            format!(
                "set {} to the provisioning network(s)",
                facts::PROVISIONING_CIDRS
            ),
        ),
        Some(Err(e)) => Line::fail("dhcp.ranges", e, "CIDRs, comma-separated"),
        Some(Ok(nets)) => {
            let bad: Vec<String> = ranges
                .iter()
                .filter(|r| !nets.iter().any(|n| r.inside(n)))
                .map(ToString::to_string)
                .collect();
            if bad.is_empty() {
                Line::pass(
                    "dhcp.ranges",
                    format!("{shown} inside {}{note}", facts::PROVISIONING_CIDRS),
                )
            } else {
                Line::fail(
                    "dhcp.ranges",
                    format!(
                        "{} not inside one of {} ({}): dnsmasq would lease addresses the \
                         provisioning network does not route",
                        bad.join(", "),
                        facts::PROVISIONING_CIDRS,
                        nets.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "move the range inside the provisioning network, or correct the network",
                )
            }
        }
    };
    let mut taken: Vec<(IpAddr, &str)> = Vec::new();
    for name in [NODE_ADDRESSES, API_VIPS] {
        if let Some(Ok(ips)) = fact(site, name).map(|v| facts::addresses(name, v)) {
            taken.extend(ips.into_iter().map(|ip| (ip, name)));
        }
    }
    let clashes: Vec<String> = ranges
        .iter()
        .flat_map(|r| {
            taken
                .iter()
                .filter(|(ip, _)| r.contains(*ip))
                .map(move |(ip, from)| format!("{ip} ({from}) in {r}"))
        })
        .collect();
    let overlap = if clashes.is_empty() {
        Line::pass(
            "dhcp.overlap",
            format!("no node address or VIP inside {shown}{note}"),
        )
    } else {
        Line::fail(
            "dhcp.overlap",
            format!(
                "{}: dnsmasq would lease an address a node or the VIP already has",
                clashes.join(", ")
            ),
            "shrink the DHCP range so it leaves out the nodes' addresses and the VIP",
        )
    };
    vec![inside, overlap]
}

/// The site key naming the provisioning NIC when it is not the node's Kubernetes address's.
pub(super) const PROVISIONING_INTERFACE: &str = "PROVISIONING_INTERFACE";

/// `provisioning.network` (host-network layouts, with `IRONIC_PROXY_PROVISIONING_CIDRS` set):
/// hosts being provisioned reach Ironic, httpd and dnsmasq at the address the kit's containers
/// take: `PROVISIONING_INTERFACE`'s when set (a separate provisioning NIC), else the node's
/// Kubernetes address, which must then lie on the provisioning network.
pub(super) fn provisioning(site: &BTreeMap<String, String>, layout: &Layout) -> Option<Line> {
    if layout.pods.is_some() || !layout.host_network {
        return None;
    }
    // A CIDR that does not parse is dhcp.ranges' to name.
    let Ok(nets) = fact(site, facts::PROVISIONING_CIDRS)
        .map(|v| facts::networks(facts::PROVISIONING_CIDRS, v))?
    else {
        return None;
    };
    let name = "provisioning.network";
    if let Some(iface) = fact(site, PROVISIONING_INTERFACE) {
        let valid = !iface.is_empty()
            && iface.len() <= 15
            && !iface.contains(['/', ':'])
            && !iface.contains(char::is_whitespace);
        return Some(if valid {
            Line::pass(
                name,
                format!(
                    "a separate provisioning NIC: ironic, httpd, dnsmasq and the sidecar take the \
                     address of {iface} on every node (the node addresses are not checked \
                     against {})",
                    facts::PROVISIONING_CIDRS
                ),
            )
        } else {
            Line::fail(
                name,
                format!("{PROVISIONING_INTERFACE} {iface:?} is not an interface name"),
                "the provisioning NIC's name, the same on every control-plane node (at most 15 \
                 characters, no '/', ':' or spaces), or empty when the provisioning network is \
                 on the nodes' Kubernetes addresses",
            )
        });
    }
    let nodes =
        fact(site, NODE_ADDRESSES).and_then(|v| facts::addresses(NODE_ADDRESSES, v).ok())?;
    // Only the families the provisioning network has: a dual-stack node on an IPv4-only
    // provisioning network is fine.
    let outside: Vec<String> = nodes
        .iter()
        .filter(|ip| nets.iter().any(|n| n.addr().is_ipv4() == ip.is_ipv4()))
        .filter(|ip| !nets.iter().any(|n| n.contains(*ip)))
        .map(ToString::to_string)
        .collect();
    Some(if outside.is_empty() {
        Line::pass(
            name,
            format!(
                "the node addresses are on the provisioning network ({}), where hosts reach \
                 Ironic, httpd and dnsmasq",
                facts::PROVISIONING_CIDRS
            ),
        )
    } else {
        Line::fail(
            name,
            format!(
                "{} ({NODE_ADDRESSES}) outside {}: with {PROVISIONING_INTERFACE} empty, hosts \
                 being provisioned reach Ironic, httpd and dnsmasq at the node's Kubernetes \
                 address",
                outside.join(", "),
                facts::PROVISIONING_CIDRS
            ),
            format!(
                "if the provisioning network is on another NIC of the nodes, set \
                 {PROVISIONING_INTERFACE} to its name (the same on every node; docs/install.md, \
                 \"A separate provisioning network\"); else correct {}",
                facts::PROVISIONING_CIDRS
            ),
        )
    })
}

#[cfg(test)]
mod provisioning_tests {
    use super::*;

    fn site(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const HOST: Layout = Layout {
        host_network: true,
        pods: None,
        dnsmasq: true,
    };

    #[test]
    fn nodes_off_the_provisioning_network_fail_unless_an_interface_is_named() {
        let cidrs = (facts::PROVISIONING_CIDRS, "192.168.111.0/24");
        let on = site(&[cidrs, (NODE_ADDRESSES, "192.168.111.21,fd00::21")]);
        assert!(provisioning(&on, &HOST).expect("line").ok);
        let off = site(&[cidrs, (NODE_ADDRESSES, "10.0.0.21,10.0.0.22")]);
        let line = provisioning(&off, &HOST).expect("line");
        assert!(!line.ok);
        assert!(
            line.detail.starts_with("10.0.0.21, 10.0.0.22 "),
            "{}",
            line.detail
        );
        assert!(
            line.fix.contains("set PROVISIONING_INTERFACE"),
            "{}",
            line.fix
        );
        let nic = site(&[
            cidrs,
            (NODE_ADDRESSES, "10.0.0.21"),
            (PROVISIONING_INTERFACE, "eno2"),
        ]);
        assert!(provisioning(&nic, &HOST).expect("line").ok);
        let bad = site(&[cidrs, (PROVISIONING_INTERFACE, "eno 2")]);
        assert!(!provisioning(&bad, &HOST).expect("line").ok);
        // No provisioning network given, or the pod-network layout: not checked.
        assert!(provisioning(&site(&[(NODE_ADDRESSES, "10.0.0.21")]), &HOST).is_none());
        let pods = Layout {
            host_network: false,
            pods: Some(vec!["ironic-0".into()]),
            dnsmasq: false,
        };
        assert!(provisioning(&off, &pods).is_none());
    }
}
