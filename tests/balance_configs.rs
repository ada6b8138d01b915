//! The shipped configs (issue 4): `config/daemonset.toml` is a load balancer with DNS peers only
//! and TLS to them, `config/sidecar.toml` a sidecar with `local` plus DNS peers, and both pass
//! `ironic-proxy check` with the variables their pods set (those of `scripts/validate-k8s`) and
//! a sample CA from `ironic-proxy ca init`. `check` writes nothing, its output is itself a valid
//! config, and a missing required variable is named.

#[path = "support/node.rs"]
mod node;
mod support;

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// What the pod spec sets (the sample values of `scripts/validate-k8s`) and the path variables
/// pointed into `dir`.
fn pod_env(dir: &Path) -> Vec<(&'static str, String)> {
    let p = |n: &str| dir.join(n).display().to_string();
    vec![
        ("POD_NAME", "ironic-x7k2p".into()),
        ("POD_NAMESPACE", "metal3".into()),
        ("POD_IP", "192.168.111.21".into()),
        ("IRONIC_PROXY_PEER_CIDR", "192.168.111.0/24".into()),
        ("IRONIC_PROXY_API_VIP", "192.168.111.249".into()),
        ("IRONIC_PROXY_CA_DIR", p("ca")),
        ("IRONIC_PROXY_EXPORT_DIR", p("export")),
        ("IRONIC_PROXY_SOCKET_DIR", p("run")),
        ("IRONIC_PROXY_AUTH_DIR", p("auth")),
    ]
}

/// Every variable the configs read, so that the test's own environment cannot leak in.
const VARS: &[&str] = &[
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "IRONIC_PROXY_PEER_CIDR",
    "IRONIC_PROXY_API_VIP",
    "IRONIC_PROXY_CA_DIR",
    "IRONIC_PROXY_EXPORT_DIR",
    "IRONIC_PROXY_SOCKET_DIR",
    "IRONIC_PROXY_AUTH_DIR",
    "IRONIC_PROXY_SERVICE",
    "IRONIC_PROXY_CLUSTER_DOMAIN",
    "IRONIC_PROXY_ADMIN_LISTEN",
    "IRONIC_PROXY_BIND",
    "IRONIC_PROXY_API_PORT",
    "IRONIC_PROXY_PEER_API_PORT",
    "IRONIC_PROXY_CONFIG",
];

fn check(config: &Path, env: &[(&str, String)]) -> support::Output {
    let set: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let unset: Vec<&str> = VARS
        .iter()
        .copied()
        .filter(|v| !set.iter().any(|(k, _)| k == v))
        .collect();
    support::proxy::command(
        &["check", "--config", &config.display().to_string()],
        &set,
        &unset,
    )
}

/// The `[listeners.upstream]` table of the listener `name` in a config file.
fn upstream(config: &Path, name: &str) -> toml::Table {
    let text = std::fs::read_to_string(config).expect("config file");
    let doc: toml::Table = toml::from_str(&text).expect("TOML");
    let listeners = doc["listeners"].as_array().expect("[[listeners]]");
    let l = listeners
        .iter()
        .find(|l| l["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no listener {name} in {}", config.display()));
    l["upstream"].as_table().expect("an upstream table").clone()
}

#[test]
fn daemonset_and_sidecar_configs_pass_check_with_their_pod_environment() {
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
    for sub in ["export", "run", "auth"] {
        std::fs::create_dir(d.join(sub)).expect("dir");
    }
    // A sample htpasswd ("test", bcrypt cost 5) for the sidecar's [listeners.auth].
    std::fs::write(
        d.join("auth/htpasswd"),
        "ironic:$2b$05$kaQpdePScv6qt72sEXVIOORift9MoiLEeYvsNnGFO4FHxOejfZhHa\n",
    )
    .expect("htpasswd");
    let env = pod_env(d);
    let file = |name: &str| PathBuf::from(ROOT).join("config").join(name);
    let (daemonset, sidecar) = (file("daemonset.toml"), file("sidecar.toml"));

    // The shapes the issue asks for.
    let lb = upstream(&daemonset, "api");
    assert!(
        lb.contains_key("dns") && !lb.contains_key("local"),
        "{lb:?}"
    );
    assert_eq!(lb.get("tls").and_then(toml::Value::as_bool), Some(true));
    let sc = upstream(&sidecar, "api");
    assert!(sc.contains_key("dns") && sc.contains_key("local"), "{sc:?}");

    for (config, wants) in [
        (
            &daemonset,
            &[
                "dns = \"ironic.metal3.svc.cluster.local:6388\"",
                "ip_addresses = [\"192.168.111.21\", \"192.168.111.249\"]",
                "tls = true",
            ][..],
        ),
        (
            &sidecar,
            &[
                "dns = \"ironic.metal3.svc.cluster.local:6385\"",
                "dns_names = [\"ironic-x7k2p.ironic.metal3.svc\", \"ironic.metal3.svc\"]",
                "allow = [\"*.ironic.metal3.svc\", \"ip:192.168.111.0/24\"]",
            ][..],
        ),
    ] {
        let out = check(config, &env);
        assert!(out.ok(), "check {}: {out:?}", config.display());
        for want in wants {
            assert!(
                out.stdout.contains(want),
                "{}: effective config shows {want}:\n{}",
                config.display(),
                out.stdout
            );
        }
        assert!(
            !out.stdout.contains("BEGIN") && !out.stdout.contains("PRIVATE"),
            "no key material printed"
        );
        // The effective config is itself a config that checks to the same text.
        let effective = d.join("effective.toml");
        std::fs::write(&effective, &out.stdout).expect("write effective config");
        let again = check(&effective, &env);
        assert!(again.ok(), "the effective config checks: {again:?}");
        assert_eq!(again.stdout, out.stdout);
    }
    let sidecar_out = check(&sidecar, &env).stdout;
    let socket = format!("local = \"unix:{}/api.sock\"", d.join("run").display());
    assert!(sidecar_out.contains(&socket), "{sidecar_out}");
    assert_eq!(
        std::fs::read_dir(d.join("export"))
            .expect("export dir")
            .count(),
        0,
        "check writes nothing into export_dir"
    );

    // A required variable the pod forgot is named.
    let without: Vec<(&str, String)> = env.into_iter().filter(|(k, _)| *k != "POD_IP").collect();
    for config in [&daemonset, &sidecar] {
        let out = check(config, &without);
        assert_eq!(out.code, Some(1), "{out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
        assert!(out.stderr.contains("POD_IP"), "{}", out.stderr);
    }
}
