//! Built-in profiles (issue 10): `run --profile` and `check --profile` configure a whole role from
//! environment variables alone; `run` without a config says it serves the dev configuration;
//! `check` honours `IRONIC_PROXY_CONFIG`. The real binary, real curl, a recording upstream on
//! the unix sockets where ironic-image's Ironic would be.

use crate::support;
use crate::support::{node, role};

use role::Role;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use support::{curl, Upstream};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `ironic-proxy ARGS` with `set`, and every other variable a profile reads removed.
fn cli(args: &[&str], set: &[(&str, &str)]) -> support::Output {
    let unset: Vec<&str> = role::PROFILE_VARS
        .iter()
        .copied()
        .filter(|v| !set.iter().any(|(k, _)| k == v))
        .collect();
    support::proxy::command(args, set, &unset)
}

#[test]
fn run_without_config_or_profile_warns_that_it_serves_the_dev_configuration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = SocketAddr::new(LO, node::free_port_on(LO));
    let env = |extra: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("IRONIC_PROXY_DEV_CERTS", format!("{ROOT}/certs-dev")),
            ("IRONIC_PROXY_RUN_DIR", s(dir.path())),
            ("IRONIC_PROXY_API_LISTEN", "127.0.0.1:0".into()),
            ("IRONIC_PROXY_RPC_LISTEN", "127.0.0.1:0".into()),
            ("IRONIC_PROXY_ADMIN_LISTEN", admin.to_string()),
        ];
        v.extend_from_slice(extra);
        v
    };
    let dev = Role::spawn(&["run"], &env(&[]), admin);
    let line = dev.wait_log("DEV configuration", Duration::from_secs(10));
    let line = line.unwrap_or_else(|| panic!("no warning: {:?}", dev.logs()));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("private keys are public"), "{line}");
    drop(dev);
    // With a config file (here the same dev file, named), no warning.
    let named = Role::spawn(
        &["run", "--config", &format!("{ROOT}/config/default.toml")],
        &env(&[]),
        admin,
    );
    assert!(named.wait_log("ready", Duration::from_secs(10)).is_some());
    assert!(
        !named.logs().iter().any(|l| l.contains("DEV configuration")),
        "{:?}",
        named.logs()
    );
}

#[test]
fn check_reads_the_file_named_by_ironic_proxy_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[[listeners]]\nlisten = \"127.0.0.1:6385\"\nupstream = \"unix:/run/api.sock\"\n",
    )
    .expect("write");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[listeners]]\nlisten = \"127.0.0.1:6385\"\nupstream = \"unix:/run/api.sock\"\n\
         tls = \"sometimes\"\n",
    )
    .expect("write");
    let o = cli(&["check"], &[("IRONIC_PROXY_CONFIG", &s(&good))]);
    assert!(o.ok(), "{o:?}");
    assert!(o.stdout.contains("listen = \"127.0.0.1:6385\""), "{o:?}");
    let o = cli(&["check"], &[("IRONIC_PROXY_CONFIG", &s(&bad))]);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.stderr.contains("listeners[0].tls"), "{o:?}");
    // Neither a file nor a profile: a usage error, not the dev default.
    let o = cli(&["check"], &[]);
    assert_eq!(o.code, Some(2), "{o:?}");
}

/// The environment of a sidecar on 127.0.0.1 whose Ironic sockets are in `dir`.
fn sidecar_env(
    dir: &Path,
    ca: &Path,
    admin: SocketAddr,
    api: u16,
    rpc: u16,
) -> Vec<(&'static str, String)> {
    vec![
        ("POD_NAME", "ironic-0".into()),
        ("POD_NAMESPACE", "metal3".into()),
        ("POD_IPS", "127.0.0.1".into()),
        ("IRONIC_PROXY_PEER_CIDRS", "127.0.0.0/8".into()),
        ("IRONIC_PROXY_TRUST", s(&ca.join("ca.crt"))),
        ("IRONIC_PROXY_ISSUER_DIR", s(ca)),
        ("IRONIC_PROXY_EXPORT_DIR", s(&dir.join("export"))),
        ("IRONIC_PROXY_API_SOCKET", s(&dir.join("ironic.sock"))),
        ("IRONIC_PROXY_RPC_SOCKET", s(&dir.join("json-rpc.sock"))),
        ("IRONIC_PROXY_ADMIN_LISTEN", admin.to_string()),
        ("IRONIC_PROXY_BIND", "127.0.0.1".into()),
        ("IRONIC_PROXY_API_PORT", api.to_string()),
        ("IRONIC_PROXY_RPC_PORT", rpc.to_string()),
        ("IRONIC_PROXY_PEERS", "none".into()),
        // Serving the API without authentication is asked for explicitly (issue 32).
        ("IRONIC_PROXY_HTPASSWD", "none".into()),
    ]
}

/// A sidecar's environment for `check` (nothing is bound): a CA made in `dir`, the default
/// ports, and DNS peers on (no `IRONIC_PROXY_PEERS`).
fn check_env(dir: &Path) -> Vec<(&'static str, String)> {
    let ca = dir.join("ca");
    node::ca_init(&ca, &[]);
    let mut env = sidecar_env(dir, &ca, "127.0.0.1:9901".parse().unwrap(), 6385, 6189);
    env.retain(|(k, _)| *k != "IRONIC_PROXY_PEERS");
    env
}

#[test]
fn check_profile_prints_the_effective_config_or_names_the_missing_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut env = check_env(dir.path());
    env.push((
        "IRONIC_PROXY_FALLBACK",
        "10.0.0.5:6385,[fd00::5]:6385".into(),
    ));
    let set: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let o = cli(&["check", "--profile", "sidecar"], &set);
    assert!(o.ok(), "{o:?}");
    for expected in [
        "listen = \"127.0.0.1:6189\"",
        "tls = \"mutual\"",
        "\"ip:127.0.0.0/8\"",
        "local = \"unix:",
        "dns = \"ironic.metal3.svc.cluster.local:6385\"",
        "fallback = [\"10.0.0.5:6385\", \"[fd00::5]:6385\"]",
    ] {
        assert!(o.stdout.contains(expected), "{expected} in\n{}", o.stdout);
    }
    // The same from IRONIC_PROXY_PROFILE.
    let mut with_var = set.clone();
    with_var.push(("IRONIC_PROXY_PROFILE", "sidecar"));
    let again = cli(&["check"], &with_var);
    assert_eq!(again.stdout, o.stdout);
    // A required variable missing: exit 1, one line naming it and the key.
    let without: Vec<(&str, &str)> = set
        .iter()
        .copied()
        .filter(|(k, _)| *k != "IRONIC_PROXY_PEER_CIDRS")
        .collect();
    let o = cli(&["check", "--profile", "sidecar"], &without);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
    assert!(o.stderr.contains("listeners[0].allow[1]"), "{o:?}");
    assert!(
        o.stderr.contains("IRONIC_PROXY_PEER_CIDRS is not set"),
        "{o:?}"
    );
    let o = cli(&["check", "--profile", "nope"], &set);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(
        o.stderr
            .contains("known: sidecar, sidecar-openshift, balancer"),
        "{o:?}"
    );
}

#[test]
fn the_sidecar_profile_runs_from_the_environment_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    node::ca_init(&ca, &[]);
    let api_up = Upstream::start(&dir.path().join("ironic.sock"));
    let rpc_up = Upstream::start(&dir.path().join("json-rpc.sock"));
    let admin = SocketAddr::new(LO, node::free_port_on(LO));
    let (api, rpc) = (node::free_port_on(LO), node::free_port_on(LO));
    let env = sidecar_env(dir.path(), &ca, admin, api, rpc);
    let mut sidecar = Role::spawn(&["run", "--profile", "sidecar"], &env, admin);
    sidecar.wait_ready(Duration::from_secs(20));
    assert!(!sidecar
        .logs()
        .iter()
        .any(|l| l.contains("DEV configuration")));
    // IRONIC_PROXY_HTPASSWD=none: the API serves without authentication, as asked.
    assert!(
        !sidecar.logs().iter().any(|l| l.contains("WARN")),
        "{:?}",
        sidecar.logs()
    );
    let cacert = s(&ca.join("ca.crt"));
    // API: server TLS with the self-issued certificate for the pod IP, verified by curl.
    let o = curl(&[
        "--cacert",
        &cacert,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("https://127.0.0.1:{api}/v1/nodes"),
    ]);
    assert_eq!(o.stdout, "200", "{o:?}");
    assert_eq!(
        api_up.requests().last().map(|r| r.path.clone()).as_deref(),
        Some("/v1/nodes")
    );
    // JSON-RPC: mutual TLS; the exported certificate (what Ironic's client presents) passes,
    // no certificate does not reach the socket.
    let export = dir.path().join("export");
    let url = format!("https://127.0.0.1:{rpc}/");
    let with_cert = curl(&[
        "--cacert",
        &cacert,
        "--cert",
        &s(&export.join("tls.crt")),
        "--key",
        &s(&export.join("tls.key")),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-d",
        "{}",
        &url,
    ]);
    assert_eq!(with_cert.stdout, "200", "{with_cert:?}");
    let without = curl(&[
        "--cacert",
        &cacert,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-d",
        "{}",
        &url,
    ]);
    assert_ne!(without.stdout, "200", "{without:?}");
    assert_eq!(rpc_up.requests().len(), 1);
}

#[test]
fn mounted_certificates_and_the_openshift_port_come_from_switches_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = node::ca_init(&dir.path().join("ca"), &[]);
    // Where the Ironic standalone operator would mount its TLS secret.
    let mounted = dir.path().join("certs-ironic");
    node::cert_issue(&ca, &mounted, &["--ip", "127.0.0.1"]);
    let mut env = sidecar_env(
        dir.path(),
        &dir.path().join("ca"),
        "127.0.0.1:9901".parse().expect("addr"),
        6385,
        6189,
    );
    env.retain(|(k, _)| *k != "IRONIC_PROXY_API_PORT");
    env.push(("IRONIC_PROXY_IDENTITY", "files".into()));
    env.push(("IRONIC_PROXY_CERT_DIR", s(&mounted)));
    let set: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let o = cli(&["check", "--profile", "sidecar-openshift"], &set);
    assert!(o.ok(), "{o:?}");
    let cert = format!("cert = \"{}\"", s(&mounted.join("tls.crt")));
    assert!(o.stdout.contains(&cert), "{}", o.stdout);
    assert!(!o.stdout.contains("issuer_key"), "{}", o.stdout);
    assert!(
        o.stdout.contains("listen = \"127.0.0.1:6388\""),
        "{}",
        o.stdout
    );
    // A switch with a value it does not know: exit 1 naming it.
    let mut bad = set.clone();
    bad.retain(|(k, _)| *k != "IRONIC_PROXY_IDENTITY");
    bad.push(("IRONIC_PROXY_IDENTITY", "cert-manager"));
    let o = cli(&["check", "--profile", "sidecar"], &bad);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.stderr.contains("IRONIC_PROXY_IDENTITY"), "{o:?}");
}

/// config/sidecar-boot.toml (the sidecar with boot files on the API port, docs/operator-guide.md)
/// checks with a sidecar's environment, and `check` shows the one port's two faces, the boot
/// routes, the API's auth and JSON-RPC visibility; without the required variable it names it.
#[test]
fn the_boot_file_sidecar_config_checks_with_a_sidecars_environment() {
    const BOOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/sidecar-boot.toml");
    let dir = tempfile::tempdir().expect("tempdir");
    let htpasswd = dir.path().join("htpasswd");
    std::fs::write(&htpasswd, htpasswd_entry("admin", "s3cret")).unwrap();
    let mut env = check_env(dir.path());
    env.retain(|(k, _)| *k != "IRONIC_PROXY_HTPASSWD");
    env.push(("IRONIC_PROXY_HTPASSWD", s(&htpasswd)));
    let egress = dir.path().join("egress");
    std::fs::write(&egress, "ironic:0123456789abcdef").unwrap();
    env.push(("IRONIC_PROXY_EGRESS_CREDENTIALS", s(&egress)));
    let token = dir.path().join("metrics-token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    env.push(("IRONIC_PROXY_METRICS_TOKEN_FILE", s(&token)));
    let set: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let o = cli(&["check", "--config", BOOT], &set);
    assert!(o.ok(), "{o:?}");
    // The admin listener as the profile's: loopback unless IRONIC_PROXY_ADMIN_LISTEN names
    // the pod IP, never every address; /metrics behind the token.
    assert!(o.stdout.contains("bearer_token_file = "), "{}", o.stdout);
    assert!(!o.stdout.contains("[::]:9901"), "{}", o.stdout);
    for expected in [
        "tls = \"optional\"",
        "jsonrpc = true",
        "find = \"newest\"",
        "\"/pxelinux.cfg/*\"",
        "plaintext = true",
        "htpasswd = ",
        "\"ip:127.0.0.0/8\"",
        "name = \"json-rpc-egress\"",
    ] {
        assert!(o.stdout.contains(expected), "{expected} in\n{}", o.stdout);
    }
    let without: Vec<(&str, &str)> = set
        .iter()
        .copied()
        .filter(|(k, _)| *k != "IRONIC_PROXY_PEER_CIDRS")
        .collect();
    let o = cli(&["check", "--config", BOOT], &without);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(
        o.stderr.contains("IRONIC_PROXY_PEER_CIDRS is not set"),
        "{o:?}"
    );
    let without: Vec<(&str, &str)> = set
        .iter()
        .copied()
        .filter(|(k, _)| *k != "IRONIC_PROXY_METRICS_TOKEN_FILE")
        .collect();
    let o = cli(&["check", "--config", BOOT], &without);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(
        o.stderr
            .contains("IRONIC_PROXY_METRICS_TOKEN_FILE is not set"),
        "{o:?}"
    );
}

/// An htpasswd line as `htpasswd -B` writes it (`$2y$`, its default cost 5).
fn htpasswd_entry(user: &str, password: &str) -> String {
    let h = bcrypt::hash_with_result(password, 5).expect("bcrypt");
    format!("{user}:{}\n", h.format_for_version(bcrypt::Version::TwoY))
}

/// `curl ARGS URL` against the API: status line code and the headers, one per line.
fn api_call(cacert: &str, url: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec!["--cacert", cacert, "-o", "/dev/null", "-D", "-"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-w", "%{http_code}", url]);
    let o = curl(&args);
    let code = o
        .stdout
        .get(o.stdout.len().saturating_sub(3)..)
        .unwrap_or("");
    (code.to_owned(), o.stdout.clone())
}

#[test]
fn the_htpasswd_and_tls_variables_protect_the_sidecar_api_but_not_json_rpc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    node::ca_init(&ca, &[]);
    let htpasswd = dir.path().join("htpasswd");
    std::fs::write(&htpasswd, htpasswd_entry("ironic", "s3cret")).expect("htpasswd");
    let api_up = Upstream::start(&dir.path().join("ironic.sock"));
    let rpc_up = Upstream::start(&dir.path().join("json-rpc.sock"));
    let admin = SocketAddr::new(LO, node::free_port_on(LO));
    let (api, rpc) = (node::free_port_on(LO), node::free_port_on(LO));
    let mut env = sidecar_env(dir.path(), &ca, admin, api, rpc);
    env.retain(|(k, _)| *k != "IRONIC_PROXY_HTPASSWD");
    env.push(("IRONIC_PROXY_HTPASSWD", s(&htpasswd)));
    env.push(("IRONIC_PROXY_AUTH_REALM", "Ironic API".into()));
    env.push(("IRONIC_PROXY_TLS_MIN_VERSION", "1.3".into()));
    let mut sidecar = Role::spawn(&["run", "--profile", "sidecar"], &env, admin);
    sidecar.wait_ready(Duration::from_secs(20));
    assert!(
        !sidecar
            .logs()
            .iter()
            .any(|l| l.contains("without authentication")),
        "{:?}",
        sidecar.logs()
    );
    let cacert = s(&ca.join("ca.crt"));
    let nodes = format!("https://127.0.0.1:{api}/v1/nodes");
    // No credentials, then wrong ones: 401 with the challenge, nothing reaches Ironic.
    let (code, head) = api_call(&cacert, &nodes, &[]);
    assert_eq!(code, "401", "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: basic realm=\"ironic api\""),
        "{head}"
    );
    let (code, head) = api_call(&cacert, &nodes, &["-u", "ironic:wrong"]);
    assert_eq!(code, "401", "{head}");
    assert!(api_up.requests().is_empty(), "{:?}", api_up.requests());
    // The right ones: 200, and Authorization reaches Ironic (forwarded, like httpd does).
    let (code, head) = api_call(&cacert, &nodes, &["-u", "ironic:s3cret"]);
    assert_eq!(code, "200", "{head}");
    let seen = api_up.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, "/v1/nodes");
    assert!(seen[0].header("authorization").is_some(), "{seen:?}");
    // The ramdisk agent's path is public.
    let lookup = format!("https://127.0.0.1:{api}/v1/lookup?addresses=52:54:00:00:00:01");
    let (code, head) = api_call(&cacert, &lookup, &[]);
    assert_eq!(code, "200", "{head}");
    assert_eq!(api_up.requests().len(), 2);
    // JSON-RPC: mTLS only, no Basic auth of ours; Ironic's own http_basic header passes
    // through untouched.
    let export = dir.path().join("export");
    let o = curl(&[
        "--cacert",
        &cacert,
        "--cert",
        &s(&export.join("tls.crt")),
        "--key",
        &s(&export.join("tls.key")),
        "-H",
        "Authorization: Basic aXJvbmljOnJwYw==",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-d",
        "{}",
        &format!("https://127.0.0.1:{rpc}/"),
    ]);
    assert_eq!(o.stdout, "200", "{o:?}");
    let calls = rpc_up.requests();
    assert_eq!(
        calls.last().and_then(|r| r.header("authorization")),
        Some("Basic aXJvbmljOnJwYw==")
    );
    // IRONIC_PROXY_TLS_MIN_VERSION=1.3: openssl offering only TLS 1.2 is refused, 1.3 works,
    // on both listeners.
    for port in [api, rpc] {
        for (version, ok) in [("-tls1_2", false), ("-tls1_3", true)] {
            let o = support::run_timeout(
                std::process::Command::new("openssl")
                    .args([
                        "s_client", "-brief", version, "-CAfile", &cacert, "-connect",
                    ])
                    .arg(format!("127.0.0.1:{port}")),
                b"",
                Duration::from_secs(10),
            );
            let all = format!("{}{}", o.stdout, o.stderr);
            // `-brief` prints the protocol only once a handshake completed.
            assert_eq!(
                all.contains("Protocol version: "),
                ok,
                "{port} {version}: {all}"
            );
        }
    }
}

#[test]
fn check_prints_auth_and_tls_from_the_variables_and_names_a_bad_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    node::ca_init(&ca, &[]);
    let htpasswd = dir.path().join("htpasswd");
    std::fs::write(&htpasswd, htpasswd_entry("ironic", "s3cret")).expect("htpasswd");
    let env = sidecar_env(
        dir.path(),
        &ca,
        "127.0.0.1:9901".parse().expect("addr"),
        6385,
        6189,
    );
    let mut base: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    base.retain(|(k, _)| *k != "IRONIC_PROXY_HTPASSWD");
    // Unset: the profile refuses to serve the API (exit 1, one line naming the variable).
    for command in ["check", "run"] {
        let o = cli(&[command, "--profile", "sidecar"], &base);
        assert_eq!(o.code, Some(1), "{command}: {o:?}");
        assert_eq!(o.stderr.lines().count(), 1, "{command}: {o:?}");
        assert!(
            o.stderr
                .starts_with("ironic-proxy: IRONIC_PROXY_HTPASSWD is not set"),
            "{command}: {o:?}"
        );
    }
    // `none`: off on purpose, no warning.
    let mut off = base.clone();
    off.push(("IRONIC_PROXY_HTPASSWD", "none"));
    let o = cli(&["check", "--profile", "sidecar"], &off);
    assert!(o.ok(), "{o:?}");
    assert!(!o.stdout.contains("[listeners.auth]"), "{}", o.stdout);
    assert!(!o.stderr.contains("IRONIC_PROXY_HTPASSWD"), "{o:?}");
    // Set, with an OpenShift Intermediate-like policy: both tables in the effective config.
    let path = s(&htpasswd);
    for profile in ["sidecar", "balancer"] {
        let mut on = base.clone();
        on.retain(|(k, _)| *k != "IRONIC_PROXY_PEERS");
        on.push(("IRONIC_PROXY_HTPASSWD", &path));
        on.push(("IRONIC_PROXY_TLS_MIN_VERSION", "1.2"));
        on.push((
            "IRONIC_PROXY_TLS_CIPHER_SUITES",
            "TLS_AES_128_GCM_SHA256,ECDHE-ECDSA-AES128-GCM-SHA256",
        ));
        on.push(("IRONIC_PROXY_TLS_GROUPS", "X25519,secp256r1"));
        on.push(("IRONIC_PROXY_FALLBACK", "127.0.0.1:6388"));
        let o = cli(&["check", "--profile", profile], &on);
        assert!(o.ok(), "{profile}: {o:?}");
        assert!(!o.stderr.contains("IRONIC_PROXY_HTPASSWD"), "{o:?}");
        for expected in [
            "[listeners.auth]".to_owned(),
            format!("htpasswd = \"{path}\""),
            "[tls]".to_owned(),
            "min_version = \"1.2\"".to_owned(),
            "\"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256\"".to_owned(),
            "\"secp256r1\"".to_owned(),
        ] {
            assert!(
                o.stdout.contains(&expected),
                "{profile}: {expected} in\n{}",
                o.stdout
            );
        }
    }
    // An unknown suite: exit 1, one line naming the key and the variable. One rustls does
    // not implement is dropped with a warning, and with nothing left that is an error too.
    let mut bad = off.clone();
    bad.push((
        "IRONIC_PROXY_TLS_CIPHER_SUITES",
        "DHE-RSA-AES128-GCM-SHA257",
    ));
    let o = cli(&["check", "--profile", "sidecar"], &bad);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(
        o.stderr
            .contains("tls.cipher_suites[0] (from IRONIC_PROXY_TLS_CIPHER_SUITES)"),
        "{o:?}"
    );
    let mut bad = off.clone();
    bad.push((
        "IRONIC_PROXY_TLS_CIPHER_SUITES",
        "DHE-RSA-AES128-GCM-SHA256",
    ));
    let o = cli(&["check", "--profile", "sidecar"], &bad);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(
        o.stderr.contains(
            "tls.cipher_suites (from IRONIC_PROXY_TLS_CIPHER_SUITES): no suite this build can \
             offer is listed (dropped, not offered by this build: DHE-RSA-AES128-GCM-SHA256)"
        ),
        "{o:?}"
    );
    // A missing htpasswd file is named too.
    let mut missing = base.clone();
    let gone = s(&dir.path().join("no-such-htpasswd"));
    missing.push(("IRONIC_PROXY_HTPASSWD", &gone));
    let o = cli(&["check", "--profile", "sidecar"], &missing);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.stderr.contains("no-such-htpasswd"), "{o:?}");
}

#[test]
fn the_balancer_profile_checks_credentials_at_the_front_door() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    node::ca_init(&ca, &[]);
    let htpasswd = dir.path().join("htpasswd");
    std::fs::write(&htpasswd, htpasswd_entry("ironic", "s3cret")).expect("htpasswd");
    // OpenShift's split: the sidecar (API on its own port) behind the balancer, both protected.
    let api_up = Upstream::start(&dir.path().join("ironic.sock"));
    let _rpc_up = Upstream::start(&dir.path().join("json-rpc.sock"));
    let sidecar_admin = SocketAddr::new(LO, node::free_port_on(LO));
    let (api, rpc) = (node::free_port_on(LO), node::free_port_on(LO));
    let mut env = sidecar_env(dir.path(), &ca, sidecar_admin, api, rpc);
    env.retain(|(k, _)| *k != "IRONIC_PROXY_HTPASSWD");
    env.push(("IRONIC_PROXY_HTPASSWD", s(&htpasswd)));
    let mut sidecar = Role::spawn(
        &["run", "--profile", "sidecar-openshift"],
        &env,
        sidecar_admin,
    );
    sidecar.wait_ready(Duration::from_secs(20));
    let lb_admin = SocketAddr::new(LO, node::free_port_on(LO));
    let lb = node::free_port_on(LO);
    // No cluster DNS here: a closed port answers nothing, so the fallback is the peer.
    let no_dns = SocketAddr::new(LO, node::free_port_on(LO));
    let lb_env: Vec<(&str, String)> = vec![
        ("POD_NAMESPACE", "metal3".into()),
        ("POD_IPS", "127.0.0.1".into()),
        ("IRONIC_PROXY_TRUST", s(&ca.join("ca.crt"))),
        ("IRONIC_PROXY_ISSUER_DIR", s(&ca)),
        ("IRONIC_PROXY_ADMIN_LISTEN", lb_admin.to_string()),
        ("IRONIC_PROXY_BIND", "127.0.0.1".into()),
        ("IRONIC_PROXY_API_PORT", lb.to_string()),
        ("IRONIC_PROXY_FALLBACK", format!("127.0.0.1:{api}")),
        ("IRONIC_PROXY_DNS_SERVERS", no_dns.to_string()),
        ("IRONIC_PROXY_HTPASSWD", s(&htpasswd)),
        ("IRONIC_PROXY_AUTH_REALM", "Ironic API".into()),
    ];
    let mut balancer = Role::spawn(&["run", "--profile", "balancer"], &lb_env, lb_admin);
    balancer.wait_ready(Duration::from_secs(30));
    let cacert = s(&ca.join("ca.crt"));
    let nodes = format!("https://127.0.0.1:{lb}/v1/nodes");
    let (code, head) = api_call(&cacert, &nodes, &[]);
    assert_eq!(code, "401", "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: basic realm=\"ironic api\""),
        "{head}"
    );
    // Only health checks (`/`, public, so they pass the sidecar's auth) reached Ironic.
    assert!(
        api_up.requests().iter().all(|r| r.path == "/"),
        "{:?}",
        api_up.requests()
    );
    // The right credentials pass the balancer and, forwarded, the sidecar.
    let (code, head) = api_call(&cacert, &nodes, &["-u", "ironic:s3cret"]);
    assert_eq!(code, "200", "{head}");
    assert_eq!(
        api_up.requests().last().map(|r| r.path.clone()).as_deref(),
        Some("/v1/nodes")
    );
    // The agent's lookup passes both without credentials.
    let lookup = format!("https://127.0.0.1:{lb}/v1/lookup?addresses=52:54:00:00:00:01");
    let (code, head) = api_call(&cacert, &lookup, &[]);
    assert_eq!(code, "200", "{head}");
    assert!(api_up
        .requests()
        .last()
        .is_some_and(|r| r.path.starts_with("/v1/lookup")));
}

/// Issue 33: `IRONIC_PROXY_NETWORKING_RPC_SOCKET` puts an mTLS listener in front of the
/// networking service's JSON-RPC socket with the conductors' authorisation, and
/// `IRONIC_PROXY_IPXE_TLS_PORT` serves the boot files over TLS, found on the httpd that has them.
#[test]
fn the_networking_rpc_and_ipxe_tls_listeners_run_from_their_variables() {
    use support::files::FileServer;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    node::ca_init(&ca, &[]);
    let _api = Upstream::start(&dir.path().join("ironic.sock"));
    let _rpc = Upstream::start(&dir.path().join("json-rpc.sock"));
    let networking = Upstream::start(&dir.path().join("networking.sock"));
    let httpd = FileServer::start(
        support::ports::KeptListener::bind((LO, support::free_port()).into())
            .expect("bind a reserved port"),
    );
    let now = std::time::SystemTime::now();
    httpd.put(
        "/boot.ipxe",
        b"#!ipxe\nchain pxelinux.cfg/${mac:hexhyp}\n",
        now,
    );
    httpd.put(
        "/pxelinux.cfg/52-54-00-00-00-02",
        b"#!ipxe\nkernel k\n",
        now,
    );
    let admin = SocketAddr::new(LO, node::free_port_on(LO));
    let (api, rpc) = (node::free_port_on(LO), node::free_port_on(LO));
    let (net, ipxe) = (node::free_port_on(LO), node::free_port_on(LO));
    let mut env = sidecar_env(dir.path(), &ca, admin, api, rpc);
    env.push((
        "IRONIC_PROXY_NETWORKING_RPC_SOCKET",
        s(&dir.path().join("networking.sock")),
    ));
    env.push(("IRONIC_PROXY_NETWORKING_RPC_PORT", net.to_string()));
    env.push(("IRONIC_PROXY_IPXE_TLS_PORT", ipxe.to_string()));
    env.push(("IRONIC_PROXY_HTTPD_PORT", httpd.addr.port().to_string()));
    let mut sidecar = Role::spawn(&["run", "--profile", "sidecar"], &env, admin);
    sidecar.wait_ready(Duration::from_secs(20));
    let cacert = s(&ca.join("ca.crt"));
    let export = dir.path().join("export");
    let (crt, key) = (s(&export.join("tls.crt")), s(&export.join("tls.key")));
    let url = format!("https://127.0.0.1:{net}/");
    let body = r#"{"jsonrpc":"2.0","method":"update_port","params":{},"id":1}"#;
    let mut args = vec!["--cacert", &cacert, "-o", "/dev/null", "-w", "%{http_code}"];
    args.extend(["-H", "Content-Type: application/json", "-d", body]);
    let mut with_cert = args.clone();
    with_cert.extend(["--cert", &crt, "--key", &key, &url]);
    let o = curl(&with_cert);
    assert_eq!(o.stdout, "200", "{o:?}");
    assert_eq!(networking.requests().len(), 1);
    let mut without = args.clone();
    without.push(&url);
    let o = curl(&without);
    assert_ne!(o.stdout, "200", "{o:?}");
    assert_eq!(networking.requests().len(), 1, "no certificate, no request");
    // The access log names the listener and the JSON-RPC method.
    let logged = sidecar.wait_log("update_port", Duration::from_secs(5));
    assert!(
        logged.is_some_and(|l| l.contains("networking-json-rpc")),
        "{:?}",
        sidecar.logs()
    );
    // iPXE over TLS: the files, verified against the CA; an unknown MAC gets 404.
    let get = |path: &str| {
        curl(&[
            "--cacert",
            &cacert,
            "-s",
            "-w",
            "\n%{http_code}",
            &format!("https://127.0.0.1:{ipxe}{path}"),
        ])
        .stdout
    };
    assert!(
        get("/boot.ipxe").ends_with("hexhyp}\n\n200"),
        "{}",
        get("/boot.ipxe")
    );
    let o = get("/pxelinux.cfg/52-54-00-00-00-02");
    assert!(
        o.starts_with("#!ipxe\nkernel k") && o.ends_with("200"),
        "{o}"
    );
    assert!(get("/pxelinux.cfg/52-54-00-00-00-09").ends_with("404"));
}

/// `PROVISIONING_INTERFACE` gives the SAN that ironic-image's own pipeline gives as
/// `IRONIC_IP` (scripts/ironic-common.sh: `ip -br addr show scope global up dev IFACE | awk
/// '{print $3}' | sed -e 's%/.*%%' | head -n 1`), run side by side in a new network namespace
/// with a veth interface (needs root and `unshare`, like the other namespace tests).
#[test]
fn provisioning_interface_gives_the_address_ironic_images_pipeline_gives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = check_env(dir.path());
    let pipeline = "ip -br addr show scope global up dev prov0 | awk '{print $3}' \
                    | sed -e 's%/.*%%' | head -n 1";
    for (addrs, want) in [
        ("fd00:9::5/64 10.9.0.5/24 10.9.0.6/24", "10.9.0.5"),
        // The kernel lists an interface's IPv6 addresses newest first; `ip` shows that order.
        ("fd00:9::5/64 fd00:9::6/64", "fd00:9::6"),
    ] {
        let script = format!(
            "set -e; ip link set lo up; ip link add prov0 type veth peer name prov1; ip link set prov1 up; \
             for a in {addrs}; do ip addr add $a dev prov0 nodad 2>/dev/null \
             || ip addr add $a dev prov0; done; ip link set prov0 up; \
             echo \"IMAGE=$({pipeline})\"; exec \"$0\" check --profile sidecar"
        );
        let mut cmd = std::process::Command::new("unshare");
        cmd.args([
            "--net",
            "sh",
            "-c",
            &script,
            env!("CARGO_BIN_EXE_ironic-proxy"),
        ]);
        for k in role::PROFILE_VARS {
            cmd.env_remove(k);
        }
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        cmd.env("PROVISIONING_INTERFACE", "prov0");
        let o = support::run(&mut cmd, b"");
        assert!(o.ok(), "{o:?}");
        assert!(o.stdout.starts_with(&format!("IMAGE={want}\n")), "{o:?}");
        assert!(
            o.stdout
                .contains(&format!("ip_addresses = [\"127.0.0.1\", \"{want}\"]")),
            "{}",
            o.stdout
        );
    }
}
