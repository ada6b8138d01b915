//! The checks of `kit check` on the site facts: the overlay was read, the addresses against the
//! CA's constraints and the networks (the DHCP ranges: [`super::dhcp`]). Pure.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

use super::facts::{self, API_VIPS, MARIADB_HOST, NODE_ADDRESSES, PEER_CIDRS};
use super::model::{Overlay, SITE_CONFIGMAP};
use super::objects::Layout;
use super::Line;
use crate::pki::{NameConstraints, San};

/// The overlay was read and holds the site facts.
pub(super) fn site(dir: &Path, o: &Overlay) -> Line {
    let fix = "point --site at the overlay folder (its kustomization.yaml, the ConfigMap \
               ironic-proxy-site or a patch of it) and make each file named parse";
    if !o.errors.is_empty() {
        return Line::fail("site", o.errors.join("; "), fix);
    }
    if !o.site_found {
        return Line::fail(
            "site",
            format!(
                "no ConfigMap {SITE_CONFIGMAP} (nor a patch or configMapGenerator of it) in the \
                 {} file(s) read from {}",
                o.files.len(),
                dir.display()
            ),
            fix,
        );
    }
    if let Some(host) = fact(&o.site, MARIADB_HOST) {
        if host.parse::<Ipv6Addr>().is_ok() {
            return Line::fail(
                "site",
                format!(
                    "{MARIADB_HOST} {host}: an IPv6 literal without brackets; ironic-image puts \
                     it into its database URL (mysql+pymysql://USER:PASSWORD@{MARIADB_HOST}/DB), \
                     where Ironic cannot read it and does not start"
                ),
                format!("write it as [{host}]"),
            );
        }
    }
    Line::pass(
        "site",
        format!(
            "{} file(s) read from {}; ConfigMap {SITE_CONFIGMAP} with {} key(s)",
            o.files.len(),
            dir.display(),
            o.site.len()
        ),
    )
}

/// A fact's value, `None` when unset or empty.
pub(super) fn fact<'a>(site: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    site.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
}

fn list(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `nodes.ca` (when a workload uses the host network, or no pod-network StatefulSet is there),
/// `nodes.peer_cidrs` (conductors on the host network: no pod-network StatefulSet), `pods.ca`
/// (the pod-network layout), `vip.ca`, `vip.nodes`, `vip.pods`.
/// `ca` is `None` when the CA could not be read (its own line says why).
pub(super) fn addresses(
    site: &BTreeMap<String, String>,
    ca: Option<&Option<NameConstraints>>,
    layout: &Layout,
) -> Vec<Line> {
    let mut out = Vec::new();
    if layout.pods.is_some() {
        out.push(pods(site, ca));
    }
    let host = layout.host_network || layout.pods.is_none();
    // The conductors are on the nodes' addresses, so those must be JSON-RPC peers; with the
    // pod-network StatefulSet a host-network workload (the balancer, dnsmasq) is no peer.
    let conductors_on_nodes = layout.pods.is_none();
    let unset = format!("set {NODE_ADDRESSES} in {SITE_CONFIGMAP}: the control-plane nodes' addresses, comma-separated");
    let node_fact = if host {
        fact(site, NODE_ADDRESSES)
    } else {
        // Pod network only: no pod has a node's address, so the fact is not asked for.
        Some("")
    };
    let nodes = match node_fact.map(|v| facts::addresses(NODE_ADDRESSES, v)) {
        Some(Ok(n)) => Some(n),
        Some(Err(e)) => {
            out.push(Line::fail("nodes.ca", e.clone(), unset.clone()));
            if conductors_on_nodes {
                out.push(Line::fail("nodes.peer_cidrs", e, unset));
            }
            None
        }
        None => {
            let e = format!("{NODE_ADDRESSES} is not set");
            out.push(Line::fail("nodes.ca", e.clone(), unset.clone()));
            if conductors_on_nodes {
                out.push(Line::fail("nodes.peer_cidrs", e, unset));
            }
            None
        }
    };
    let vips = match fact(site, API_VIPS).map(|v| facts::addresses(API_VIPS, v)) {
        Some(Ok(v)) => v,
        Some(Err(e)) => {
            let fix = format!("{API_VIPS}: the VIP(s), comma-separated IP addresses");
            out.push(Line::fail("vip.ca", e, fix));
            Vec::new()
        }
        None => Vec::new(),
    };
    let ca_fix = "create a CA whose `ca init --permit-ip` covers the address and roll it out (a \
                  new CA is a rotation), or use an address inside the constraints";
    let outside = |ips: &[IpAddr]| -> Result<Vec<IpAddr>, String> {
        match ca {
            None => Err("the CA could not be read (the ca line)".to_owned()),
            Some(None) => Ok(Vec::new()),
            Some(Some(c)) => Ok(ips
                .iter()
                .copied()
                .filter(|ip| !c.permits(&San::Ip(*ip)))
                .collect()),
        }
    };
    let permitted = |c: Option<&Option<NameConstraints>>| match c {
        Some(Some(c)) => format!("({c})"),
        _ => "(the CA has no name constraints)".to_owned(),
    };
    if let Some(nodes) = nodes.as_ref().filter(|_| host) {
        out.push(match outside(nodes) {
            Err(e) => Line::fail("nodes.ca", e, "fix the ca line first"),
            Ok(bad) if bad.is_empty() => Line::pass(
                "nodes.ca",
                format!(
                    "{} inside the CA's name constraints {}",
                    list(nodes),
                    permitted(ca)
                ),
            ),
            Ok(bad) => Line::fail(
                "nodes.ca",
                format!(
                    "{} ({NODE_ADDRESSES}) outside the CA's name constraints {}: no sidecar \
                     there can get a certificate",
                    list(&bad),
                    permitted(ca)
                ),
                ca_fix,
            ),
        });
        let cidrs = fact(site, PEER_CIDRS).map(|v| facts::networks(PEER_CIDRS, v));
        let peers = match cidrs {
            None => Line::fail(
                "nodes.peer_cidrs",
                format!("{PEER_CIDRS} is not set"),
                format!("set {PEER_CIDRS} to the nodes' networks"),
            ),
            Some(Err(e)) => Line::fail(
                "nodes.peer_cidrs",
                e,
                format!("{PEER_CIDRS}: CIDRs, comma-separated"),
            ),
            Some(Ok(nets)) => {
                let bad: Vec<IpAddr> = nodes
                    .iter()
                    .copied()
                    .filter(|ip| !nets.iter().any(|n| n.contains(ip)))
                    .collect();
                if bad.is_empty() {
                    Line::pass(
                        "nodes.peer_cidrs",
                        format!("every node address is in {PEER_CIDRS}"),
                    )
                } else {
                    Line::fail(
                        "nodes.peer_cidrs",
                        format!(
                            "{} outside {PEER_CIDRS}: the other conductors refuse its JSON-RPC \
                             calls (403)",
                            list(&bad)
                        ),
                        format!("add the nodes' network to {PEER_CIDRS}"),
                    )
                }
            }
        };
        if conductors_on_nodes {
            out.push(peers);
        }
    }
    if fact(site, API_VIPS).is_some() && !vips.is_empty() {
        out.push(match outside(&vips) {
            Err(e) => Line::fail("vip.ca", e, "fix the ca line first"),
            Ok(bad) if bad.is_empty() => Line::pass(
                "vip.ca",
                format!(
                    "{} inside the CA's name constraints {}",
                    list(&vips),
                    permitted(ca)
                ),
            ),
            Ok(bad) => Line::fail(
                "vip.ca",
                format!(
                    "{} ({API_VIPS}) outside the CA's name constraints {}: the sidecars refuse \
                     to start with it in their certificate",
                    list(&bad),
                    permitted(ca)
                ),
                ca_fix,
            ),
        });
        if host {
            let taken: Vec<IpAddr> = vips
                .iter()
                .copied()
                .filter(|v| nodes.as_ref().is_some_and(|n| n.contains(v)))
                .collect();
            out.push(if taken.is_empty() {
                Line::pass("vip.nodes", "the VIP is no node's own address")
            } else {
                Line::fail(
                    "vip.nodes",
                    format!("{} is both a VIP and a node's address", list(&taken)),
                    "pick a free address in the nodes' network for the VIP",
                )
            });
        }
        if layout.pods.is_some() {
            let nets = fact(site, PEER_CIDRS)
                .and_then(|v| facts::networks(PEER_CIDRS, v).ok())
                .unwrap_or_default();
            let inside: Vec<IpAddr> = vips
                .iter()
                .copied()
                .filter(|v| nets.iter().any(|n| n.contains(v)))
                .collect();
            out.push(if inside.is_empty() {
                Line::pass(
                    "vip.pods",
                    format!("the LoadBalancer address is outside the pod network ({PEER_CIDRS})"),
                )
            } else {
                Line::fail(
                    "vip.pods",
                    format!(
                        "{} ({API_VIPS}) is inside the pod network ({PEER_CIDRS}): BMCs and \
                         hosts reach the Ironic pods only through the LoadBalancer's address, \
                         which must be on a network they route to, not a pod's",
                        list(&inside)
                    ),
                    "set IRONIC_PROXY_API_VIPS to the address your LoadBalancer implementation \
                     gives the Service ironic-vip, on the network the BMCs reach",
                )
            });
        }
    } else if fact(site, API_VIPS).is_none() && layout.pods.is_some() {
        out.push(Line::fail(
            "vip.ca",
            format!("{API_VIPS} is not set"),
            "set IRONIC_PROXY_API_VIPS to the LoadBalancer address of the Service ironic-vip: \
             Ironic's callback and virtual-media URLs name it, and every sidecar's certificate \
             carries it",
        ));
    } else if fact(site, API_VIPS).is_none() {
        out.push(Line::pass(
            "vip.ca",
            format!("no {API_VIPS}: clients dial the nodes' addresses"),
        ));
    }
    out
}

/// `pods.ca`: the pod network (`IRONIC_PROXY_PEER_CIDRS`), where every Ironic pod's address
/// and so its sidecar's IP SAN comes from, is inside the CA's constraints, whole.
fn pods(site: &BTreeMap<String, String>, ca: Option<&Option<NameConstraints>>) -> Line {
    let nets = match fact(site, PEER_CIDRS).map(|v| facts::networks(PEER_CIDRS, v)) {
        None => {
            return Line::fail(
                "pods.ca",
                format!("{PEER_CIDRS} is not set"),
                format!("set {PEER_CIDRS} to the cluster's pod network(s), comma-separated"),
            )
        }
        Some(Err(e)) => {
            return Line::fail(
                "pods.ca",
                e,
                format!("{PEER_CIDRS}: the pod network(s), CIDRs, comma-separated"),
            )
        }
        Some(Ok(n)) => n,
    };
    let shown = |n: &[ipnet::IpNet]| {
        n.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match ca {
        None => Line::fail(
            "pods.ca",
            "the CA could not be read (the ca line)",
            "fix the ca line first",
        ),
        Some(None) => Line::pass(
            "pods.ca",
            format!(
                "pod network {} ({PEER_CIDRS}); the CA has no name constraints",
                shown(&nets)
            ),
        ),
        Some(Some(c)) => {
            let bad: Vec<ipnet::IpNet> = nets
                .iter()
                .copied()
                .filter(|n| !c.permits_network(n))
                .collect();
            if bad.is_empty() {
                Line::pass(
                    "pods.ca",
                    format!(
                        "pod network {} ({PEER_CIDRS}) inside the CA's name constraints ({c})",
                        shown(&nets)
                    ),
                )
            } else {
                Line::fail(
                    "pods.ca",
                    format!(
                        "{} ({PEER_CIDRS}) not inside one --permit-ip of the CA ({c}): a pod \
                         given an address outside it cannot get a certificate",
                        shown(&bad)
                    ),
                    "create a CA with `ca init --permit-ip` covering the whole pod network \
                     (the CNI's pod CIDR) and roll it out, or correct IRONIC_PROXY_PEER_CIDRS",
                )
            }
        }
    }
}

/// `names.ca`: the DNS names every sidecar's certificate carries (the sidecar profile's
/// `<pod>.<service>.<namespace>.svc` and `<service>.<namespace>.svc`) are inside the CA's
/// constraints. The pod-network layout's pods are named `<statefulset>-<ordinal>`, each
/// checked; a DaemonSet's pod names are random, so one under the Service's subdomain stands
/// for them.
pub(super) fn names(o: &Overlay, ca: Option<&Option<NameConstraints>>, layout: &Layout) -> Line {
    let Some(ns) = &o.namespace else {
        return Line::fail(
            "names.ca",
            "the overlay sets no namespace: the sidecars' names <pod>.<service>.<namespace>.svc \
             are not known",
            "set `namespace:` in the overlay's kustomization.yaml",
        );
    };
    let service = fact(&o.site, "IRONIC_PROXY_SERVICE").unwrap_or("ironic");
    let sub = format!("{service}.{ns}.svc");
    let mut names = vec![sub.clone()];
    match &layout.pods {
        Some(pods) => names.extend(pods.iter().map(|p| format!("{p}.{sub}"))),
        None => names.push(format!("ironic-x7k2p.{sub}")),
    }
    let fix = format!(
        "create a CA whose `ca init --permit-dns` covers {sub} (e.g. --permit-dns {ns}.svc) \
         and roll it out"
    );
    match ca {
        None => Line::fail(
            "names.ca",
            "the CA could not be read (the ca line)",
            "fix the ca line first",
        ),
        Some(None) => Line::pass(
            "names.ca",
            format!("{}: the CA has no name constraints", names.join(", ")),
        ),
        Some(Some(c)) => {
            let bad: Vec<&String> = names
                .iter()
                .filter(|n| !c.permits(&San::Dns((*n).clone())))
                .collect();
            if bad.is_empty() {
                Line::pass(
                    "names.ca",
                    format!(
                        "{} inside the CA's name constraints ({c})",
                        names.join(", ")
                    ),
                )
            } else {
                Line::fail(
                    "names.ca",
                    format!(
                        "{} outside the CA's name constraints ({c}): the sidecars refuse to \
                         start with them in their certificate",
                        bad.iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    fix,
                )
            }
        }
    }
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
