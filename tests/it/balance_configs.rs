//! The shipped roles (issue 4, built-in profiles since issue 10): `balancer` is a load balancer
//! with DNS peers only and TLS to them, `sidecar` a sidecar with `local` plus DNS peers, and both
//! pass `ironic-proxy check --profile` with the variables their pods set (those of
//! `scripts/validate-k8s`) and a sample CA from `ironic-proxy ca init`. `check` writes nothing,
//! its output is itself a valid config, and a missing required variable is named.

use crate::support;
use crate::support::node;

use std::path::Path;

/// What the pod spec sets (the sample values of `scripts/validate-k8s`) and the path variables
/// pointed into `dir`.
fn pod_env(dir: &Path) -> Vec<(&'static str, String)> {
    let p = |n: &str| dir.join(n).display().to_string();
    vec![
        ("POD_NAME", "ironic-x7k2p".into()),
        ("POD_NAMESPACE", "metal3".into()),
        ("POD_IPS", "192.168.111.21".into()),
        ("IRONIC_PROXY_PEER_CIDRS", "192.168.111.0/24".into()),
        ("IRONIC_PROXY_API_VIPS", "192.168.111.249".into()),
        ("IRONIC_PROXY_TRUST", p("ca/ca-bundle.crt")),
        ("IRONIC_PROXY_ISSUER_DIR", p("ca")),
        ("IRONIC_PROXY_EXPORT_DIR", p("export")),
        ("IRONIC_PROXY_API_SOCKET", p("run/ironic.sock")),
        ("IRONIC_PROXY_RPC_SOCKET", p("run/ironic-json-rpc.sock")),
        // A profile serving the API without IRONIC_PROXY_HTPASSWD refuses to start.
        ("IRONIC_PROXY_HTPASSWD", "none".into()),
    ]
}

/// Every variable the configs read, so that the test's own environment cannot leak in.
const VARS: &[&str] = &[
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IPS",
    "IRONIC_PROXY_PEER_CIDRS",
    "IRONIC_PROXY_API_VIPS",
    "IRONIC_PROXY_TRUST",
    "IRONIC_PROXY_ISSUER_DIR",
    "IRONIC_PROXY_EXPORT_DIR",
    "IRONIC_PROXY_API_SOCKET",
    "IRONIC_PROXY_RPC_SOCKET",
    "IRONIC_PROXY_FALLBACK",
    "IRONIC_PROXY_PROFILE",
    "IRONIC_PROXY_IDENTITY",
    "IRONIC_PROXY_PEERS",
    "IRONIC_PROXY_SERVICE",
    "IRONIC_PROXY_CLUSTER_DOMAIN",
    "IRONIC_PROXY_ADMIN_LISTEN",
    "IRONIC_PROXY_BIND",
    "IRONIC_PROXY_API_PORT",
    "IRONIC_PROXY_PEER_API_PORT",
    "IRONIC_PROXY_CONFIG",
];

/// `ironic-proxy check ARGS` with `env` and every other variable the roles read removed.
fn check(args: &[&str], env: &[(&str, String)]) -> support::Output {
    let set: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let unset: Vec<&str> = VARS
        .iter()
        .copied()
        .filter(|v| !set.iter().any(|(k, _)| k == v))
        .collect();
    let mut full = vec!["check"];
    full.extend_from_slice(args);
    support::proxy::command(&full, &set, &unset)
}

/// The `[listeners.upstream]` table of the listener `name` in an effective config.
fn upstream(text: &str, name: &str) -> toml::Table {
    let doc: toml::Table = toml::from_str(text).expect("TOML");
    let listeners = doc["listeners"].as_array().expect("[[listeners]]");
    let l = listeners
        .iter()
        .find(|l| l["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no listener {name} in {text}"));
    l["upstream"].as_table().expect("an upstream table").clone()
}

#[test]
fn balancer_and_sidecar_profiles_pass_check_with_their_pod_environment() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    // The sample CA, as validate-k8s makes it; the Secret holds the bundle beside it.
    let ca = node::ca_init(
        &d.join("ca"),
        &[
            "--permit-dns",
            "metal3.svc",
            "--permit-ip",
            "192.168.111.0/24",
        ],
    );
    std::fs::copy(&ca.0, d.join("ca/ca-bundle.crt")).expect("bundle");
    for sub in ["export", "run"] {
        std::fs::create_dir(d.join(sub)).expect("dir");
    }
    let env = pod_env(d);
    for (profile, wants) in [
        (
            "balancer",
            &[
                "dns = \"ironic.metal3.svc.cluster.local:6388\"",
                "ip_addresses = [\"192.168.111.21\", \"192.168.111.249\"]",
                "tls = true",
            ][..],
        ),
        (
            "sidecar",
            &[
                "dns = \"ironic.metal3.svc.cluster.local:6385\"",
                "dns_names = [\"ironic-x7k2p.ironic.metal3.svc\", \"ironic.metal3.svc\"]",
                "allow = [\"*.ironic.metal3.svc\", \"ip:192.168.111.0/24\"]",
            ][..],
        ),
    ] {
        let out = check(&["--profile", profile], &env);
        assert!(out.ok(), "check --profile {profile}: {out:?}");
        for want in wants {
            assert!(
                out.stdout.contains(want),
                "{profile}: effective config shows {want}:\n{}",
                out.stdout
            );
        }
        assert!(
            !out.stdout.contains("BEGIN") && !out.stdout.contains("PRIVATE"),
            "no key material printed"
        );
        // The shapes the issue asks for.
        let up = upstream(&out.stdout, "api");
        assert_eq!(up.get("tls").and_then(toml::Value::as_bool), Some(true));
        assert_eq!(up.contains_key("local"), profile == "sidecar", "{up:?}");
        assert!(up.contains_key("dns"), "{up:?}");
        // The effective config is itself a config that checks to the same text.
        let effective = d.join("effective.toml");
        std::fs::write(&effective, &out.stdout).expect("write effective config");
        let again = check(&["--config", &effective.display().to_string()], &env);
        assert!(again.ok(), "the effective config checks: {again:?}");
        assert_eq!(again.stdout, out.stdout);
    }
    let sidecar_out = check(&["--profile", "sidecar"], &env).stdout;
    let socket = format!("local = \"unix:{}/ironic.sock\"", d.join("run").display());
    assert!(sidecar_out.contains(&socket), "{sidecar_out}");
    assert_eq!(
        std::fs::read_dir(d.join("export"))
            .expect("export dir")
            .count(),
        0,
        "check writes nothing into export_dir"
    );

    // A required variable the pod forgot is named.
    let without: Vec<(&str, String)> = env.into_iter().filter(|(k, _)| *k != "POD_IPS").collect();
    for profile in ["balancer", "sidecar"] {
        let out = check(&["--profile", profile], &without);
        assert_eq!(out.code, Some(1), "{out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
        assert!(out.stderr.contains("POD_IPS"), "{}", out.stderr);
    }
}
