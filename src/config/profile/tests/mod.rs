//! Every built-in profile from an environment alone: what it needs, what it builds.

use std::collections::HashMap;

use super::*;
use crate::config::{IdentitySource, ListenAddr, TlsMode};

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// What the downward API and the operator give a pod.
fn pod() -> HashMap<String, String> {
    env(&[
        ("POD_NAME", "ironic-0"),
        ("POD_NAMESPACE", "metal3"),
        ("POD_IPS", "192.168.111.21,fd00:1101::21"),
        ("IRONIC_PROXY_PEER_CIDRS", "192.168.111.0/24,fd00:1101::/64"),
        ("IRONIC_PROXY_HTPASSWD", "/auth/ironic/htpasswd"),
    ])
}

fn error(name: &str, e: &HashMap<String, String>) -> String {
    let err = load(name, e).expect_err("must fail");
    crate::error::chain(&err)
}

#[test]
fn the_sidecar_takes_irso_paths_ports_and_every_pod_ip() {
    let c = load("sidecar", &pod()).expect("sidecar");
    let id = c.identity.as_ref().expect("identity");
    assert_eq!(id.trust.to_str(), Some("/certs/ca/trusted/ca.crt"));
    let IdentitySource::Issuer(issuer) = &id.source else {
        panic!("issues its own leaf by default");
    };
    assert_eq!(
        issuer.issuer_key.to_str(),
        Some("/certs/ca/ironic-proxy/ca.key")
    );
    let ips: Vec<String> = issuer
        .ip_addresses
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(ips, ["192.168.111.21", "fd00:1101::21"]);
    assert_eq!(
        issuer.dns_names,
        ["ironic-0.ironic.metal3.svc", "ironic.metal3.svc"]
    );
    let rpc = &c.listeners[0];
    assert_eq!((rpc.name.as_str(), rpc.tls), ("json-rpc", TlsMode::Mutual));
    assert_eq!(rpc.listen.to_string(), "[::]:6189");
    assert_eq!(rpc.allow.len(), 3, "{:?}", rpc.allow);
    assert_eq!(
        rpc.upstream
            .local
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("unix:/shared/ironic-json-rpc.sock")
    );
    let api = &c.listeners[1];
    assert_eq!(api.listen.to_string(), "[::]:6385");
    assert!(matches!(api.listen, ListenAddr::Tcp(_)));
    assert_eq!(
        api.upstream
            .local
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("unix:/shared/ironic.sock")
    );
    assert_eq!(
        api.upstream
            .dns
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("ironic.metal3.svc.cluster.local:6385")
    );
    assert!(api.upstream.fallback.is_empty());
    assert_eq!(
        c.admin
            .as_ref()
            .map(|a| a.listen.iter().map(ToString::to_string).collect::<Vec<_>>()),
        Some(vec![
            "192.168.111.21:9901".to_owned(),
            "[fd00:1101::21]:9901".to_owned(),
            "127.0.0.1:9901".to_owned()
        ])
    );
}

#[test]
fn the_openshift_sidecar_serves_the_api_on_6388_unless_told_otherwise() {
    let c = load("sidecar-openshift", &pod()).expect("sidecar-openshift");
    assert_eq!(c.listeners[1].listen.to_string(), "[::]:6388");
    assert_eq!(
        c.listeners[1]
            .upstream
            .dns
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("ironic.metal3.svc.cluster.local:6388")
    );
    let mut e = pod();
    e.insert("IRONIC_PROXY_API_PORT".into(), "7000".into());
    let c = load("sidecar-openshift", &e).expect("override");
    assert_eq!(c.listeners[1].listen.to_string(), "[::]:7000");
}

#[test]
fn the_balancer_has_peers_only_with_a_fallback_from_the_environment() {
    let mut e = pod();
    e.insert(
        "IRONIC_PROXY_FALLBACK".into(),
        "192.168.111.21:6388,[fd00:1101::21]:6388".into(),
    );
    e.insert("IRONIC_PROXY_API_VIPS".into(), "192.168.111.5".into());
    let c = load("balancer", &e).expect("balancer");
    let api = &c.listeners[0];
    assert!(api.upstream.local.is_none());
    assert!(api.upstream.tls);
    let fallback: Vec<String> = api
        .upstream
        .fallback
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(fallback, ["192.168.111.21:6388", "[fd00:1101::21]:6388"]);
    let Some(IdentitySource::Issuer(issuer)) = c.identity.as_ref().map(|i| &i.source) else {
        panic!("issuer");
    };
    assert_eq!(issuer.ip_addresses.len(), 3);
}

#[test]
fn the_sidecars_certificate_names_its_vips_too() {
    let mut e = pod();
    e.insert(
        "IRONIC_PROXY_API_VIPS".into(),
        "192.168.111.5, fd00:1101::5".into(),
    );
    for profile in ["sidecar", "sidecar-openshift"] {
        let c = load(profile, &e).expect(profile);
        let Some(IdentitySource::Issuer(issuer)) = c.identity.as_ref().map(|i| &i.source) else {
            panic!("issuer");
        };
        let ips: Vec<String> = issuer
            .ip_addresses
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            ips,
            [
                "192.168.111.21",
                "fd00:1101::21",
                "192.168.111.5",
                "fd00:1101::5"
            ],
            "{profile}"
        );
    }
    e.insert("IRONIC_PROXY_API_VIPS".into(), "vip.example".into());
    let msg = error("sidecar", &e);
    assert!(
        msg.contains("identity.ip_addresses[2]: invalid IP address"),
        "{msg}"
    );
}

#[test]
fn a_missing_variable_is_named_with_its_key() {
    let mut e = pod();
    e.remove("IRONIC_PROXY_PEER_CIDRS");
    let msg = error("sidecar", &e);
    assert!(msg.contains("profile sidecar"), "{msg}");
    assert!(msg.contains("listeners[0].allow[1]"), "{msg}");
    assert!(msg.contains("IRONIC_PROXY_PEER_CIDRS is not set"), "{msg}");
    let mut e = pod();
    e.insert("POD_IPS".into(), "10.0.0.300".into());
    let msg = error("sidecar", &e);
    assert!(msg.contains("identity.ip_addresses[0]"), "{msg}");
}

#[test]
fn mounted_certificates_and_no_peers_are_switches() {
    let mut e = pod();
    e.insert("IRONIC_PROXY_IDENTITY".into(), "files".into());
    e.insert("IRONIC_PROXY_PEERS".into(), "none".into());
    let c = load("sidecar", &e).expect("files");
    let Some(IdentitySource::Files { cert, key }) = c.identity.as_ref().map(|i| &i.source) else {
        panic!("files");
    };
    assert_eq!(cert.to_str(), Some("/certs/ironic/tls.crt"));
    assert_eq!(key.to_str(), Some("/certs/ironic/tls.key"));
    let api = &c.listeners[1].upstream;
    assert!(api.dns.is_none() && api.fallback.is_empty() && !api.tls);
    e.insert(
        "IRONIC_PROXY_PEERS".into(),
        "srv:_api._tcp.ironic.metal3.svc".into(),
    );
    let c = load("sidecar", &e).expect("srv peers");
    assert_eq!(
        c.listeners[1]
            .upstream
            .dns
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("srv:_api._tcp.ironic.metal3.svc")
    );
    e.insert("IRONIC_PROXY_IDENTITY".into(), "cert-manager".into());
    let msg = error("sidecar", &e);
    assert!(
        msg.contains("IRONIC_PROXY_IDENTITY=\"cert-manager\""),
        "{msg}"
    );
    let mut e = pod();
    e.insert("IRONIC_PROXY_PEERS".into(), "none".into());
    assert!(error("balancer", &e).contains("no local Ironic"));
}

#[test]
fn unknown_profiles_list_the_known_ones() {
    let msg = error("sidekick", &pod());
    assert!(
        msg.contains("sidecar, sidecar-openshift, balancer"),
        "{msg}"
    );
}

#[test]
fn every_profile_renders_an_effective_config_that_parses_back() {
    for name in names() {
        let mut e = pod();
        e.insert("IRONIC_PROXY_FALLBACK".into(), "10.0.0.1:6385".into());
        e.insert(
            "IRONIC_PROXY_HTPASSWD".into(),
            "/auth/ironic/htpasswd".into(),
        );
        // secp384r1: approved in the FIPS build too (X25519 is not).
        e.insert("IRONIC_PROXY_TLS_GROUPS".into(), "secp384r1".into());
        let c = load(name, &e).unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = c.render();
        assert!(
            text.contains("htpasswd = \"/auth/ironic/htpasswd\""),
            "{text}"
        );
        assert!(text.contains("groups = [\"secp384r1\"]"), "{text}");
        let again = Config::parse(&text, &env(&[]))
            .unwrap_or_else(|e| panic!("{name} renders {text}: {e}"));
        assert_eq!(again.render(), text, "{name}");
    }
}

#[test]
fn the_htpasswd_variable_protects_the_api_listener_and_never_json_rpc() {
    let mut e = pod();
    e.insert("IRONIC_PROXY_AUTH_REALM".into(), "Ironic API".into());
    for name in ["sidecar", "sidecar-openshift"] {
        let c = load(name, &e).expect(name);
        assert_eq!(c.listeners[0].name, "json-rpc");
        assert!(c.listeners[0].auth.is_none(), "{name}: JSON-RPC has mTLS");
        let auth = c.listeners[1].auth.as_ref().expect("api auth");
        assert_eq!(auth.htpasswd.to_str(), Some("/auth/ironic/htpasswd"));
        assert_eq!(auth.realm, "Ironic API");
        assert!(auth.forward_authorization);
        assert!(crate::auth::public::is_public(&auth.public, "/v1/lookup"));
        assert!(!crate::auth::public::is_public(&auth.public, "/v1/nodes"));
    }
    let c = load("balancer", &e).expect("balancer");
    let auth = c.listeners[0].auth.as_ref().expect("balancer api auth");
    assert_eq!(auth.htpasswd.to_str(), Some("/auth/ironic/htpasswd"));
    // `none`: off on purpose; a realm then has nothing to name.
    e.insert("IRONIC_PROXY_HTPASSWD".into(), "none".into());
    let msg = error("sidecar", &e);
    assert!(msg.contains("IRONIC_PROXY_AUTH_REALM"), "{msg}");
    e.remove("IRONIC_PROXY_AUTH_REALM");
    let c = load("sidecar", &e).expect("none");
    assert!(c.listeners.iter().all(|l| l.auth.is_none()));
    // A bad realm is reported at its key and with the variable.
    e.insert(
        "IRONIC_PROXY_HTPASSWD".into(),
        "/auth/ironic/htpasswd".into(),
    );
    e.insert("IRONIC_PROXY_AUTH_REALM".into(), "say \"hi\"".into());
    let msg = error("sidecar", &e);
    assert!(
        msg.contains("listeners[1].auth.realm (from IRONIC_PROXY_AUTH_REALM)"),
        "{msg}"
    );
}

#[test]
fn the_tls_variables_set_the_policy_and_bad_names_name_the_variable() {
    use crate::crypto::policy::MinVersion;
    let c = load("sidecar", &pod()).expect("defaults");
    assert_eq!(c.tls.min_version, MinVersion::Tls12);
    assert!(c.tls.cipher_suites.is_none() && c.tls.groups.is_none());
    let mut e = pod();
    // OpenShift's Modern profile: TLS 1.3 only.
    e.insert("IRONIC_PROXY_TLS_MIN_VERSION".into(), "1.3".into());
    e.insert(
        "IRONIC_PROXY_TLS_CIPHER_SUITES".into(),
        "TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384,".into(),
    );
    // FIPS-approved groups, so that the FIPS build runs this test too.
    e.insert("IRONIC_PROXY_TLS_GROUPS".into(), "secp384r1,P-256".into());
    for name in names() {
        e.insert("IRONIC_PROXY_FALLBACK".into(), "10.0.0.1:6385".into());
        let c = load(name, &e).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(c.tls.min_version, MinVersion::Tls13, "{name}");
        assert_eq!(c.tls.cipher_suites.as_ref().map(Vec::len), Some(2));
        assert_eq!(c.tls.groups.as_ref().map(Vec::len), Some(2));
    }
    let cases = [
        ("IRONIC_PROXY_TLS_MIN_VERSION", "1.1", "tls.min_version"),
        (
            "IRONIC_PROXY_TLS_CIPHER_SUITES",
            "TLS_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA257",
            "tls.cipher_suites[1]",
        ),
        ("IRONIC_PROXY_TLS_CIPHER_SUITES", ",", "tls.cipher_suites"),
        // Known, not offered, and nothing else: the list is empty.
        (
            "IRONIC_PROXY_TLS_CIPHER_SUITES",
            "DES-CBC3-SHA",
            "tls.cipher_suites",
        ),
        (
            "IRONIC_PROXY_TLS_GROUPS",
            "brainpoolP256r1",
            "tls.groups[0]",
        ),
        ("IRONIC_PROXY_TLS_GROUPS", "secp521r1", "tls.groups"),
    ];
    for (var, value, key) in cases {
        let mut e = pod();
        e.insert(var.into(), value.into());
        let msg = error("sidecar", &e);
        assert!(msg.contains(&format!("{key} (from {var})")), "{msg}");
    }
}

mod openshift;
