use super::*;
use std::collections::HashMap;

fn env() -> HashMap<String, String> {
    [("POD_IP", "10.1.2.3"), ("NS", "metal3")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const FULL: &str = r#"
[identity]
trust = "/etc/ironic-ca/ca.crt"
issuer_cert = "/etc/ironic-ca/ca.crt"
issuer_key  = "/etc/ironic-ca/ca.key"
dns_names   = ["pod.ironic.${NS}.svc"]
ip_addresses = ["${POD_IP}"]
validity     = "24h"
renew_before = "8h"
export_dir = "/run/ironic-proxy/tls"

[admin]
listen = "127.0.0.1:9901"

[dns]
servers = ["127.0.0.1:5353"]
refresh = "5s"

[limits]
max_connections = 100
request_head_timeout = "2s"
upstream_connections = 16

[[listeners]]
name     = "json-rpc"
listen   = "0.0.0.0:6189"
tls      = "mutual"
allow    = ["*.ironic.metal3.svc", "ip:10.0.0.0/8"]
upstream = "unix:/run/ironic/json-rpc.sock"

[[listeners]]
name   = "api"
listen = "0.0.0.0:6385"
tls    = "server"
[listeners.upstream]
local   = "unix:/run/ironic/api.sock"
dns     = "ironic.metal3.svc:6385"
tls     = true
balance = "round_robin"
health  = { path = "/", interval = "2s", timeout = "1s", unhealthy_after = 2, healthy_after = 1 }
"#;

fn err(text: &str) -> String {
    Config::parse(text, &env())
        .expect_err("config should be rejected")
        .to_string()
}

#[test]
fn parses_the_design_example() {
    let c = Config::parse(FULL, &env()).unwrap();
    let id = c.identity.unwrap();
    match id.source {
        IdentitySource::Issuer(i) => {
            assert_eq!(i.dns_names, ["pod.ironic.metal3.svc"]);
            assert_eq!(i.ip_addresses, ["10.1.2.3".parse::<IpAddr>().unwrap()]);
            assert_eq!(i.renew_before, Duration::from_secs(8 * 3600));
        }
        IdentitySource::Files { .. } => panic!("expected issuer mode"),
    }
    assert_eq!(c.limits.max_connections, 100);
    assert_eq!(c.limits.request_head_timeout, Duration::from_secs(2));
    assert_eq!(c.limits.upstream_connections, 16);
    assert_eq!(
        c.limits.body_timeout,
        Duration::from_secs(60),
        "default kept"
    );
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.listeners[0].tls, TlsMode::Mutual);
    assert_eq!(c.listeners[0].allow.len(), 2);
    assert_eq!(
        c.listeners[0].upstream.local,
        Some(UpstreamAddr::Unix("/run/ironic/json-rpc.sock".into()))
    );
    assert_eq!(
        c.listeners[1].upstream.balance,
        crate::balance::Policy::RoundRobin
    );
    assert!(c.listeners[1].upstream.tls);
    assert_eq!(
        c.dns.servers,
        ["127.0.0.1:5353".parse::<SocketAddr>().unwrap()]
    );
}

#[test]
fn errors_name_the_key() {
    let listener = "[[listeners]]\nlisten = \"127.0.0.1:1\"\nupstream = \"unix:/x\"\n";
    assert!(err(&format!("bogus = 1\n{listener}")).contains("bogus"));
    let e = err(&format!(
        "{listener}[[listeners]]\nlisten=\"127.0.0.1:2\"\nupstream=\"unix:/y\"\nfoo=1\n"
    ));
    assert!(e.starts_with("listeners[1]") && e.contains("foo"), "{e}");
    let e = err(&format!("[limits]\nbody_timeout = \"soon\"\n{listener}"));
    assert!(
        e.starts_with("limits.body_timeout: invalid duration"),
        "{e}"
    );
    let e = err("[[listeners]]\nlisten = \"nowhere\"\nupstream = \"unix:/x\"\n");
    assert!(e.starts_with("listeners[0].listen"), "{e}");
    let e = err("[[listeners]]\nlisten = \"127.0.0.1:1\"\nupstream = \"unix:/x\"\ntls=\"mutual\"\nallow=[\"ip:10.0.0.0/99\"]\n[identity]\ntrust=\"/t\"\ncert=\"/c\"\nkey=\"/k\"\n");
    assert!(e.starts_with("listeners[0].allow[0]"), "{e}");
    let e = err("[[listeners]]\nlisten = \"${UNSET_VAR}\"\nupstream = \"unix:/x\"\n");
    assert!(
        e.starts_with("listeners[0].listen") && e.contains("UNSET_VAR"),
        "{e}"
    );
    let e = err("[[listeners]]\nlisten = \"127.0.0.1:1\"\n[listeners.upstream]\nlocal = \"unix:/x\"\ndns = \"nope\"\n");
    assert!(e.starts_with("listeners[0].upstream.dns"), "{e}");
    let e = err("[[listeners]]\nlisten = \"127.0.0.1:1\"\n[listeners.upstream]\nlocal = \"unix:/x\"\nweight = 3\n");
    assert!(
        e.starts_with("listeners[0].upstream") && e.contains("weight"),
        "{e}"
    );
    let e =
        err("[[listeners]]\nlisten = \"127.0.0.1:1\"\nupstream = \"unix:/x\"\ntls = \"server\"\n");
    assert!(
        e.starts_with("listeners[0].tls") && e.contains("identity"),
        "{e}"
    );
}

#[test]
fn errors_are_one_line() {
    let e = err("[limits]\nbody_timeout = \"x\"\nidle_timeout = \"y\"\n[[listeners]]\nlisten = \"z\"\nupstream = \"unix:/x\"\n");
    assert!(!e.contains('\n'), "{e}");
    assert!(
        e.contains("limits.body_timeout")
            && e.contains("limits.idle_timeout")
            && e.contains("listeners[0].listen")
    );
}

#[test]
fn upstream_addresses() {
    assert_eq!(
        "unix:/run/a.sock".parse::<UpstreamAddr>().unwrap(),
        UpstreamAddr::Unix("/run/a.sock".into())
    );
    assert_eq!(
        "localhost:8080".parse::<UpstreamAddr>().unwrap(),
        UpstreamAddr::Tcp {
            host: "localhost".into(),
            port: 8080
        }
    );
    assert_eq!(
        "[::1]:80".parse::<UpstreamAddr>().unwrap(),
        UpstreamAddr::Tcp {
            host: "::1".into(),
            port: 80
        }
    );
    // Found by fuzz/ (target `config`): a host with `:` or `}` was accepted, and rendered as
    // `[a:b]:80`, which did not parse back.
    for bad in [
        "unix:relative",
        "host",
        "host:0",
        "host:99999",
        ":80",
        "a:b:80",
        "fd00::1:6385",
        "x}:80",
        "a/b:80",
        // Names rustls would not verify: one DNS-name type (crate::dns_name) decides.
        "10.0.0.256:6385",
        "-ironic.svc:6385",
        "ironic..svc:6385",
    ] {
        assert!(bad.parse::<UpstreamAddr>().is_err(), "{bad}");
    }
    let err = "ironic-.svc:6385".parse::<UpstreamAddr>().unwrap_err();
    assert!(err.to_string().contains("starts or ends with '-'"), "{err}");
    // A trailing dot (no search domains) and SRV-style underscores stay as written.
    for good in ["ironic.metal3.svc.:6385", "_api.ironic.svc:6385"] {
        let addr = good.parse::<UpstreamAddr>().unwrap();
        assert_eq!(addr.to_string(), good);
    }
}

#[test]
fn rendered_config_reads_back_unchanged() {
    // Found by fuzz/ (target `config`): `$${X}` rendered as `${X}` did not parse back, and
    // control characters were written in Rust's `\u{..}` form, which TOML rejects.
    let text = r#"
[[listeners]]
name = "a$$b ${NS} $x \u001b e\u0301 \"q\" \\"
listen = "127.0.0.1:6385"
upstream = "unix:/tmp/$${HOME}/\t.sock"
"#;
    let c = Config::parse(text, &env()).unwrap();
    assert_eq!(
        c.listeners[0].name,
        "a$b metal3 $x \u{1b} e\u{301} \"q\" \\"
    );
    let rendered = c.render();
    let again = Config::parse(&rendered, &HashMap::new()).expect("rendered config parses");
    assert_eq!(again.listeners[0].name, c.listeners[0].name);
    assert_eq!(
        again.listeners[0].upstream.local,
        c.listeners[0].upstream.local
    );
    assert_eq!(again.render(), rendered);
}

#[test]
fn jsonrpc_is_off_by_default_and_rendered_when_on() {
    let on = FULL.replacen(
        "tls      = \"mutual\"\n",
        "tls      = \"mutual\"\njsonrpc  = true\n",
        1,
    );
    let c = Config::parse(&on, &env()).expect("parses");
    assert!(c.listeners[0].jsonrpc);
    assert!(!c.listeners[1].jsonrpc);
    let rendered = c.render();
    assert_eq!(rendered.matches("jsonrpc = true").count(), 1, "{rendered}");
    let again = Config::parse(&rendered, &env()).expect("rendered config parses");
    assert!(again.listeners[0].jsonrpc);
    let bad = FULL.replacen(
        "tls      = \"mutual\"\n",
        "tls = \"mutual\"\njsonrpc = \"yes\"\n",
        1,
    );
    let e = Config::parse(&bad, &env()).expect_err("a string is not a bool");
    assert!(e.to_string().contains("listeners[0].jsonrpc"), "{e}");
}

/// `identity.dns_names` are the names of the leaf we issue, so they follow the certificate
/// rules (`DnsName::parse_host`): refused here, with the key and the reason, not at issuance.
#[test]
fn identity_dns_names_are_checked_as_certificate_names() {
    let cases = [
        (
            "pod.ironic.svc.",
            "a certificate name cannot end with a dot",
        ),
        ("a_b.ironic.svc", "'_' is for service (SRV) names"),
        (
            "*.ironic.metal3.svc",
            "only letters, digits, '-', '_' and '.' are allowed, not '*'",
        ),
        ("-pod.ironic.svc", "a label starts or ends with '-'"),
        ("pod.123", "the last label is a number"),
    ];
    for (name, reason) in cases {
        let text = FULL.replace("\"pod.ironic.${NS}.svc\"", &format!("{name:?}"));
        let e = err(&text);
        assert!(
            e.starts_with(&format!(
                "identity.dns_names[0]: invalid DNS name {name:?}: {reason}"
            )),
            "{e}"
        );
    }
    let upper = FULL.replace("pod.ironic.${NS}.svc", "Pod.Ironic.${NS}.svc");
    let c = Config::parse(&upper, &env()).unwrap();
    match c.identity.unwrap().source {
        IdentitySource::Issuer(i) => assert_eq!(i.dns_names, ["Pod.Ironic.metal3.svc"]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn max_connections_takes_an_integer_or_a_string_of_digits() {
    let with = |v: &str| FULL.replace("max_connections = 100", &format!("max_connections = {v}"));
    let mut vars = env();
    vars.insert("MAXC".into(), "2048".into());
    let c = Config::parse(&with("\"${MAXC:-1024}\""), &vars).unwrap();
    assert_eq!(c.limits.max_connections, 2048);
    let c = Config::parse(&with("\"${UNSET_MAXC:-1024}\""), &env()).unwrap();
    assert_eq!(c.limits.max_connections, 1024);
    for bad in [
        "\"12a\"",
        "\"-1\"",
        "\" 5\"",
        "\"\"",
        "\"99999999999\"",
        "-1",
    ] {
        let e = err(&with(bad));
        assert!(e.contains("limits.max_connections"), "{bad}: {e}");
    }
    assert!(err(&with("\"0\"")).contains("must be at least 1"));
}
