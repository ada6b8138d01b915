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
