//! Scale-out findings for the built-in profiles with a CA constrained to the cluster's networks:
//! a node inside everything passes; a fourth node on another subnet, a node missing from the
//! fallback, a VIP outside the CA and a node outside `allow` each fail naming their cause.

use super::{scale_out, ScaleFinding};
use crate::config::profile::load;
use crate::config::Config;
use crate::pki::{generate_ca, CaSpec};
use std::collections::HashMap;

/// A CA for the cluster's networks, written to a temp dir; the variables of a pod using it.
fn cluster() -> (tempfile::TempDir, HashMap<String, String>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = generate_ca(&CaSpec {
        permit_dns: vec!["metal3.svc".into()],
        permit_ip: vec![
            "192.168.111.0/24".parse().expect("net"),
            "fd00:1101::/64".parse().expect("net"),
        ],
        ..CaSpec::default()
    })
    .expect("CA");
    std::fs::write(dir.path().join("ca.crt"), &ca.cert_pem).expect("write ca.crt");
    std::fs::write(dir.path().join("ca.key"), &ca.key_pem).expect("write ca.key");
    let env = [
        ("POD_NAME", "ironic-3"),
        ("POD_NAMESPACE", "metal3"),
        ("POD_IPS", "192.168.111.24,fd00:1101::24"),
        ("IRONIC_PROXY_PEER_CIDRS", "192.168.111.0/24,fd00:1101::/64"),
        ("IRONIC_PROXY_HTPASSWD", "none"),
        ("IRONIC_PROXY_EGRESS_CREDENTIALS", "/run/egress"),
        (
            "IRONIC_PROXY_ISSUER_DIR",
            dir.path().to_str().expect("utf-8 temp path"),
        ),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    (dir, env)
}

fn findings(profile: &str, env: &HashMap<String, String>) -> Vec<ScaleFinding> {
    let c: Config = load(profile, env).expect("profile loads");
    scale_out(&c, env)
}

fn failed(f: &[ScaleFinding]) -> Vec<(&'static str, String)> {
    f.iter()
        .filter(|f| !f.ok)
        .map(|f| (f.check, f.detail.clone()))
        .collect()
}

#[test]
fn a_node_inside_every_range_passes_each_check() {
    let (_dir, env) = cluster();
    let f = findings("sidecar", &env);
    let checks: Vec<&str> = f.iter().map(|f| f.check).collect();
    assert_eq!(checks, ["ca", "peer_cidrs", "egress_targets"], "{f:?}");
    assert!(failed(&f).is_empty(), "{f:?}");
}

#[test]
fn a_fourth_node_on_another_subnet_is_named_with_its_variable() {
    let (_dir, mut env) = cluster();
    env.insert("POD_IPS".into(), "192.168.112.24,fd00:1101::24".into());
    let bad = failed(&findings("sidecar", &env));
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert_eq!(bad[0].0, "ca");
    assert!(
        bad[0]
            .1
            .starts_with("IP:192.168.112.24 (from POD_IPS) outside the CA's name constraints"),
        "{}",
        bad[0].1
    );
    assert!(bad[0].1.contains("IP:192.168.111.0/24"), "{}", bad[0].1);
    assert_eq!(bad[1].0, "egress_targets");
    assert!(
        bad[1].1.starts_with(
            "192.168.112.24 (from POD_IPS) outside \
             IRONIC_PROXY_PEER_CIDRS=192.168.111.0/24,fd00:1101::/64"
        ),
        "{}",
        bad[1].1
    );
    // The fix: the peers' CIDRs and a CA that cover the new subnet. Here the node moves back
    // inside instead, and every check passes again.
    env.insert("POD_IPS".into(), "192.168.111.24,fd00:1101::24".into());
    assert!(failed(&findings("sidecar", &env)).is_empty());
}

#[test]
fn a_node_missing_from_the_fallback_is_named() {
    let (_dir, mut env) = cluster();
    env.insert(
        "IRONIC_PROXY_FALLBACK".into(),
        "192.168.111.21:6385,192.168.111.22:6385".into(),
    );
    let bad = failed(&findings("sidecar", &env));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].0, "fallback");
    assert!(
        bad[0]
            .1
            .contains("is in IRONIC_PROXY_FALLBACK=192.168.111.21:6385,192.168.111.22:6385"),
        "{}",
        bad[0].1
    );
    env.insert(
        "IRONIC_PROXY_FALLBACK".into(),
        "192.168.111.21:6385,192.168.111.24:6385".into(),
    );
    assert!(failed(&findings("sidecar", &env)).is_empty());
}

#[test]
fn a_vip_outside_the_ca_is_named() {
    let (_dir, mut env) = cluster();
    env.insert("IRONIC_PROXY_API_VIPS".into(), "10.0.0.5".into());
    let bad = failed(&findings("balancer", &env));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0]
            .1
            .starts_with("IP:10.0.0.5 (from IRONIC_PROXY_API_VIPS) outside"),
        "{}",
        bad[0].1
    );
}

#[test]
fn a_node_outside_ip_only_allow_rules_is_refused_by_its_peers() {
    let (dir, env) = cluster();
    let d = dir.path().display();
    let toml = format!(
        "[identity]\ntrust = \"{d}/ca.crt\"\nissuer_cert = \"{d}/ca.crt\"\n\
         issuer_key = \"{d}/ca.key\"\nip_addresses = [\"192.168.111.77\"]\n\
         [[listeners]]\nname = \"json-rpc\"\nlisten = \"127.0.0.1:8089\"\ntls = \"mutual\"\n\
         jsonrpc = true\nallow = [\"ip:192.168.111.0/28\"]\nupstream = \"unix:/tmp/x.sock\"\n"
    );
    let c = Config::parse(&toml, &HashMap::new()).expect("config");
    let bad = failed(&scale_out(&c, &HashMap::new()));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].0, "peer_cidrs");
    assert!(
        bad[0].1.starts_with(
            "none of our names (192.168.111.77 (from identity.ip_addresses)) is in \
             listeners[json-rpc].allow"
        ),
        "{}",
        bad[0].1
    );
    drop(env);
}

#[test]
fn a_sidecars_vip_is_checked_against_the_ca_but_is_no_egress_target() {
    let (_dir, mut env) = cluster();
    env.insert("IRONIC_PROXY_API_VIPS".into(), "10.0.0.5".into());
    let bad = failed(&findings("sidecar", &env));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].0, "ca");
    assert!(
        bad[0]
            .1
            .starts_with("IP:10.0.0.5 (from IRONIC_PROXY_API_VIPS) outside"),
        "{}",
        bad[0].1
    );
    // Inside the CA but outside the peer CIDRs: the VIP is no conductor's [DEFAULT]host, so the
    // peers' egress never has to reach it.
    let ca = generate_ca(&CaSpec::default()).expect("CA");
    let issuer = env["IRONIC_PROXY_ISSUER_DIR"].clone();
    std::fs::write(format!("{issuer}/ca.crt"), &ca.cert_pem).expect("write ca.crt");
    std::fs::write(format!("{issuer}/ca.key"), &ca.key_pem).expect("write ca.key");
    let f = findings("sidecar", &env);
    assert!(failed(&f).is_empty(), "{f:?}");
}
