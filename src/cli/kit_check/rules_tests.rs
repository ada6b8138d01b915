//! Tests of [`super`] (rules.rs) and of the DHCP checks beside it (dhcp.rs), which share its
//! site helpers.

use super::super::dhcp::dhcp;
use super::super::facts::DHCP_RANGE;
use super::*;

fn site(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn verdicts(lines: &[Line]) -> Vec<(&str, bool)> {
    lines.iter().map(|l| (l.name, l.ok)).collect()
}

#[test]
fn addresses_without_constraints_pass_and_a_vip_on_a_node_fails() {
    let s = site(&[
        (NODE_ADDRESSES, "10.0.0.1,fd00::1"),
        (PEER_CIDRS, "10.0.0.0/24,fd00::/64"),
        (API_VIPS, "fd00::1"),
    ]);
    let lines = addresses(&s, Some(&None), &Layout::default());
    assert_eq!(
        verdicts(&lines),
        [
            ("nodes.ca", true),
            ("nodes.peer_cidrs", true),
            ("vip.ca", true),
            ("vip.nodes", false)
        ]
    );
    // Unset node addresses: both node checks fail naming the fact; no VIP passes.
    let lines = addresses(&site(&[]), Some(&None), &Layout::default());
    assert_eq!(
        verdicts(&lines),
        [
            ("nodes.ca", false),
            ("nodes.peer_cidrs", false),
            ("vip.ca", true)
        ]
    );
    assert_eq!(lines[0].detail, "IRONIC_PROXY_NODE_ADDRESSES is not set");
    // An unreadable CA: the node check says so instead of guessing.
    let lines = addresses(&s, None, &Layout::default());
    assert!(
        lines[0].detail.contains("the CA could not be read"),
        "{lines:?}"
    );
}

#[test]
fn dhcp_needs_its_network_and_is_optional() {
    let none = dhcp(&site(&[]), &Layout::default());
    assert_eq!(
        verdicts(&none),
        [("dhcp.ranges", true), ("dhcp.overlap", true)]
    );
    let lines = dhcp(
        &site(&[(DHCP_RANGE, "172.22.0.10,172.22.0.100")]),
        &Layout::default(),
    );
    assert_eq!(
        verdicts(&lines),
        [("dhcp.ranges", false), ("dhcp.overlap", true)]
    );
    assert!(lines[0]
        .detail
        .contains("IRONIC_PROXY_PROVISIONING_CIDRS is not"));
    let lines = dhcp(
        &site(&[
            (DHCP_RANGE, "fd2e::10,fd2e::ff;::,constructor:eth0"),
            (facts::PROVISIONING_CIDRS, "fd2e::/64"),
            (API_VIPS, "fd2e::20"),
        ]),
        &Layout::default(),
    );
    assert_eq!(
        verdicts(&lines),
        [("dhcp.ranges", true), ("dhcp.overlap", false)]
    );
    assert!(lines[0].detail.contains("not checked"), "{:?}", lines[0]);
    assert!(
        lines[1]
            .detail
            .starts_with("fd2e::20 (IRONIC_PROXY_API_VIPS) in fd2e::10-fd2e::ff"),
        "{:?}",
        lines[1]
    );
}

#[test]
fn an_unbracketed_ipv6_database_host_fails_the_site_line() {
    let overlay = |host: &str| Overlay {
        site_found: true,
        site: site(&[(MARIADB_HOST, host)]),
        ..Overlay::default()
    };
    let dir = Path::new(".");
    let line = super::site(dir, &overlay("fd00::5"));
    assert!(!line.ok, "{}", line.detail);
    assert!(line.detail.contains("without brackets"), "{}", line.detail);
    assert_eq!(line.fix, "write it as [fd00::5]");
    for good in [
        "[fd00::5]",
        "[fd00::5]:3307",
        "192.168.111.5",
        "mariadb.metal3.svc:3307",
    ] {
        let line = super::site(dir, &overlay(good));
        assert!(line.ok, "{good}: {}", line.detail);
    }
}
