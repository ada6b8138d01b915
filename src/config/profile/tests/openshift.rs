//! Issue 32 and 33 parts of the profiles: the API is never served without authentication
//! unless told so, OpenShift's TLS profile as cluster-baremetal-operator renders it, the
//! address ironic-image uses as `[DEFAULT]host`, and the optional listeners.

use super::*;
use crate::crypto::policy::MinVersion;

/// What CBO (provisioning/tls_profile.go) sets on Ironic's containers for a profile of
/// openshift/api config/v1 types_tlssecurityprofile.go: Apache's `SSLProtocol`, the TLS 1.2
/// ciphers (OpenSSL names) and the TLS 1.3 ones, `:`-joined, and the groups.
fn cbo(protocol: &str, tls12: &[&str], tls13: &[&str], curves: &[&str]) -> HashMap<String, String> {
    let mut e = pod();
    e.insert("IRONIC_SSL_PROTOCOL".into(), protocol.into());
    if !tls12.is_empty() {
        e.insert("IRONIC_TLS_12_CIPHERS".into(), tls12.join(":"));
    }
    if !tls13.is_empty() {
        e.insert("IRONIC_TLS_13_CIPHERS".into(), tls13.join(":"));
    }
    if !curves.is_empty() {
        e.insert("IRONIC_TLS_CURVES".into(), curves.join(":"));
    }
    e
}

// The expected lists hold ciphers and groups a FIPS build does not offer.
#[cfg(not(feature = "fips"))]
const TLS13: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];
#[cfg(not(feature = "fips"))]
const INTERMEDIATE12: &[&str] = &[
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
];
#[cfg(not(feature = "fips"))]
const OLD12_MORE: &[&str] = &[
    "ECDHE-ECDSA-AES128-SHA256",
    "ECDHE-RSA-AES128-SHA256",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA384",
    "ECDHE-RSA-AES256-SHA384",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA256",
    "AES256-SHA256",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
];
#[cfg(not(feature = "fips"))]
const DEFAULT_GROUPS: &[&str] = &["X25519MLKEM768", "X25519", "secp256r1", "secp384r1"];

#[cfg(not(feature = "fips"))]
fn group_names(c: &Config) -> Vec<String> {
    c.tls
        .groups
        .iter()
        .flatten()
        .map(|g| format!("{:?}", g.name()))
        .collect()
}

#[test]
fn the_api_is_never_served_without_authentication_unless_told_none() {
    for name in names() {
        let mut e = pod();
        e.insert("IRONIC_PROXY_FALLBACK".into(), "10.0.0.1:6385".into());
        e.remove("IRONIC_PROXY_HTPASSWD");
        let msg = error(name, &e);
        assert_eq!(msg.lines().count(), 1, "{msg}");
        assert!(msg.starts_with("IRONIC_PROXY_HTPASSWD is not set"), "{msg}");
        assert!(msg.contains("none"), "{msg}");
        e.insert("IRONIC_PROXY_HTPASSWD".into(), String::new());
        assert!(error(name, &e).starts_with("IRONIC_PROXY_HTPASSWD is not set"));
        e.insert("IRONIC_PROXY_HTPASSWD".into(), "none".into());
        let c = load(name, &e).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert!(c.listeners.iter().all(|l| l.auth.is_none()), "{name}");
    }
}

#[test]
#[cfg(not(feature = "fips"))]
fn every_cbo_rendering_starts_with_what_rustls_offers() {
    // Old: TLS 1.0+, 24 ciphers of which rustls offers the 9 AEAD ECDHE ones.
    let mut old12 = INTERMEDIATE12.to_vec();
    old12.extend_from_slice(OLD12_MORE);
    let old = cbo(
        "-ALL +TLSv1 +TLSv1.1 +TLSv1.2 +TLSv1.3",
        &old12,
        TLS13,
        DEFAULT_GROUPS,
    );
    let intermediate = cbo(
        "-ALL +TLSv1.2 +TLSv1.3",
        INTERMEDIATE12,
        TLS13,
        DEFAULT_GROUPS,
    );
    // Modern: CBO sets no TLS 1.2 list (no cipher without the TLS_ prefix).
    let modern = cbo("-ALL +TLSv1.3", &[], TLS13, DEFAULT_GROUPS);
    // Custom: groups rustls cannot offer besides one it can.
    let custom = cbo(
        "-ALL +TLSv1.2 +TLSv1.3",
        &INTERMEDIATE12[..2],
        &TLS13[..1],
        &["SecP384r1MLKEM1024", "secp521r1", "secp384r1"],
    );
    let cases = [
        ("old", old, MinVersion::Tls12, 9, DEFAULT_GROUPS.to_vec()),
        (
            "intermediate",
            intermediate,
            MinVersion::Tls12,
            9,
            DEFAULT_GROUPS.to_vec(),
        ),
        (
            "modern",
            modern,
            MinVersion::Tls13,
            9,
            DEFAULT_GROUPS.to_vec(),
        ),
        ("custom", custom, MinVersion::Tls12, 3, vec!["secp384r1"]),
    ];
    for (what, e, min, suites, groups) in cases {
        for name in ["sidecar", "sidecar-openshift"] {
            let c = load(name, &e).unwrap_or_else(|err| panic!("{what} {name}: {err}"));
            assert_eq!(c.tls.min_version, min, "{what}");
            assert_eq!(
                c.tls.cipher_suites.as_ref().map(Vec::len),
                Some(suites),
                "{what}"
            );
            assert_eq!(group_names(&c), groups, "{what}");
            // The effective configuration is itself a valid one.
            Config::parse(&c.render(), &env(&[])).unwrap_or_else(|err| panic!("{what}: {err}"));
        }
    }
}

#[test]
#[cfg(not(feature = "fips"))]
fn our_variables_win_over_openshifts_and_every_openshift_group_name_is_understood() {
    let mut e = cbo("-ALL +TLSv1.3", &[], TLS13, &["secp384r1"]);
    e.insert("IRONIC_PROXY_TLS_MIN_VERSION".into(), "1.2".into());
    e.insert(
        "IRONIC_PROXY_TLS_GROUPS".into(),
        "x25519, SECP256R1MLKEM768".into(),
    );
    let c = load("sidecar", &e).expect("ours");
    assert_eq!(c.tls.min_version, MinVersion::Tls12);
    assert_eq!(group_names(&c), ["X25519", "secp256r1MLKEM768"]);
    // All seven of OpenShift's names, in any case, in the [tls] table itself.
    e.insert(
        "IRONIC_PROXY_TLS_GROUPS".into(),
        "X25519,SECP256R1,secp384r1,secp521r1,x25519mlkem768,SecP256r1MLKEM768,\
         SecP384r1MLKEM1024"
            .into(),
    );
    let c = load("sidecar", &e).expect("all seven");
    assert_eq!(group_names(&c).len(), 5);
    assert_eq!(c.tls.dropped, ["secp521r1", "SecP384r1MLKEM1024"]);
    assert!(c
        .render()
        .contains("# dropped, not offered by this build: secp521r1"));
}

#[test]
fn openshift_lists_with_nothing_offered_name_the_variable() {
    let e = cbo("-ALL +TLSv1.3", &[], &[], &["secp521r1"]);
    let msg = error("sidecar", &e);
    assert!(msg.starts_with("IRONIC_TLS_CURVES=\"secp521r1\""), "{msg}");
    let e = cbo("-ALL +TLSv1.3", &[], &["TLS_AES_128_CCM_SHA256"], &[]);
    let msg = error("sidecar", &e);
    assert!(
        msg.contains("tls.cipher_suites (from IRONIC_TLS_13_CIPHERS): min_version"),
        "{msg}"
    );
    let e = cbo(
        "-ALL +TLSv1.2",
        &["DES-CBC3-SHA"],
        &["TLS_AES_128_CCM_SHA256"],
        &[],
    );
    let msg = error("sidecar", &e);
    assert!(
        msg.starts_with("IRONIC_TLS_12_CIPHERS=\"DES-CBC3-SHA\""),
        "{msg}"
    );
    let e = cbo("-ALL +SSLv3", &[], &[], &[]);
    assert!(error("sidecar", &e).starts_with("IRONIC_SSL_PROTOCOL="));
    // ironic-image's own default for virtual media, `ALL`, is TLS 1.2 and up here.
    let c = load("sidecar", &cbo("ALL", &[], &[], &[])).expect("ALL");
    assert_eq!(c.tls.min_version, MinVersion::Tls12);
    let c = load(
        "sidecar",
        &cbo("all -TLSv1.2 -TLSv1 -TLSv1.1", &[], &[], &[]),
    )
    .expect("1.3");
    assert_eq!(c.tls.min_version, MinVersion::Tls13);
}

fn sans(c: &Config) -> Vec<String> {
    let Some(IdentitySource::Issuer(issuer)) = c.identity.as_ref().map(|i| &i.source) else {
        panic!("issuer");
    };
    issuer
        .ip_addresses
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn ironic_images_address_inputs_become_a_san_in_its_order() {
    let mut e = pod();
    e.insert("PROVISIONING_INTERFACE".into(), "no-such-if0".into());
    let msg = error("sidecar", &e);
    assert!(
        msg.starts_with("PROVISIONING_INTERFACE=\"no-such-if0\": no such"),
        "{msg}"
    );
    // PROVISIONING_IP (with a prefix, as ipcalc takes it) comes before the interface.
    e.insert("PROVISIONING_IP".into(), "172.22.0.3/24".into());
    assert_eq!(
        sans(&load("sidecar", &e).expect("provisioning ip")),
        ["192.168.111.21", "fd00:1101::21", "172.22.0.3"]
    );
    // IRONIC_IP before everything; an address already in POD_IPS is not repeated.
    e.insert("IRONIC_IP".into(), "fd00:1101::21".into());
    assert_eq!(
        sans(&load("sidecar", &e).expect("dup")),
        ["192.168.111.21", "fd00:1101::21"]
    );
    e.insert("IRONIC_IP".into(), "fd00:5::1".into());
    let c = load("sidecar-openshift", &e).expect("ironic ip");
    assert_eq!(sans(&c), ["192.168.111.21", "fd00:1101::21", "fd00:5::1"]);
    e.insert("IRONIC_IP".into(), "ironic.example".into());
    assert!(error("sidecar", &e).starts_with("IRONIC_IP=\"ironic.example\": not an IP"));
    // The balancer is not a conductor: it has no [DEFAULT]host.
    e.insert("IRONIC_IP".into(), "10.9.9.9".into());
    e.insert("IRONIC_PROXY_FALLBACK".into(), "10.0.0.1:6385".into());
    assert!(!sans(&load("balancer", &e).expect("balancer")).contains(&"10.9.9.9".to_owned()));
}

#[test]
fn the_networking_rpc_and_boot_tls_listeners_are_switched_on_by_variables() {
    let mut e = pod();
    e.insert(
        "IRONIC_PROXY_NETWORKING_RPC_SOCKET".into(),
        "/shared/ironic-networking.sock".into(),
    );
    e.insert("IRONIC_PROXY_IPXE_TLS_PORT".into(), "8084".into());
    e.insert("IRONIC_PROXY_VMEDIA_TLS_PORT".into(), "6183".into());
    let c = load("sidecar", &e).expect("all listeners");
    // What `check` prints is itself a valid configuration.
    let text = c.render();
    Config::parse(&text, &env(&[])).unwrap_or_else(|err| panic!("{text}: {err}"));
    let names: Vec<&str> = c.listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "json-rpc",
            "api",
            "networking-json-rpc",
            "ipxe-tls",
            "vmedia-tls"
        ]
    );
    let (rpc, net) = (&c.listeners[0], &c.listeners[2]);
    assert_eq!(net.listen.to_string(), "[::]:6190");
    assert_eq!((net.tls, net.jsonrpc), (TlsMode::Mutual, true));
    assert_eq!(net.allow, rpc.allow, "the conductors' authorisation");
    assert!(net.auth.is_none());
    assert_eq!(
        net.upstream
            .local
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("unix:/shared/ironic-networking.sock")
    );
    for (l, port, paths) in [
        (&c.listeners[3], 8084, "/boot.ipxe"),
        (&c.listeners[4], 6183, "/redfish/*"),
    ] {
        assert_eq!(l.listen.to_string(), format!("[::]:{port}"));
        assert_eq!(l.tls, TlsMode::Server);
        let route = &l.routes[0];
        assert_eq!(route.find, Some(crate::config::routes::Find::Newest));
        assert!(
            route.paths.iter().any(|p| p.to_string() == paths),
            "{:?}",
            route.paths
        );
        assert_eq!(
            route
                .upstream
                .dns
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            Some("ironic.metal3.svc.cluster.local:6180")
        );
    }
    e.insert("IRONIC_PROXY_PEERS".into(), "none".into());
    e.insert("IRONIC_PROXY_NETWORKING_RPC_PORT".into(), "7190".into());
    let c = load("sidecar", &e).expect("no peers");
    assert_eq!(c.listeners[2].listen.to_string(), "[::]:7190");
    assert!(c.listeners[3].routes[0].upstream.dns.is_none());
    e.insert("IRONIC_PROXY_IPXE_TLS_PORT".into(), "https".into());
    assert!(error("sidecar", &e).starts_with("IRONIC_PROXY_IPXE_TLS_PORT=\"https\""));
    // The balancer has none of them.
    let mut e = pod();
    e.insert("IRONIC_PROXY_FALLBACK".into(), "10.0.0.1:6385".into());
    e.insert("IRONIC_PROXY_IPXE_TLS_PORT".into(), "8084".into());
    assert_eq!(load("balancer", &e).expect("balancer").listeners.len(), 1);
}
