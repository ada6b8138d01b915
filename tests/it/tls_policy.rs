//! `[tls]`: the policy holds on a real listener against `openssl s_client` offering what it
//! forbids (versions, suites, groups), `check` prints the effective policy, and bad names are
//! config errors naming the key.

use crate::support;

use std::process::Command;
use std::time::Duration;
use support::{run_timeout, Proxy, Sandbox, Tls, Upstream};

const BIN: &str = env!("CARGO_BIN_EXE_ironic-proxy");

/// Starts a proxy with `tls` as its `[tls]` table.
fn start(sb: &Sandbox, up: &Upstream, tls: &str) -> Proxy {
    let builder = sb.proxy().listener("api", Tls::Server, &up.address());
    support::proxy::start_ready(Duration::from_secs(10), || {
        let (config, admin, ports) = builder.write_config();
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, format!("[tls]\n{tls}\n{text}")).unwrap();
        Proxy::spawn(&config, admin, ports, false, None)
    })
}

/// Whether `openssl s_client` with `args` completes a handshake and gets a response.
fn handshake(sb: &Sandbox, port: u16, args: &[&str]) -> (bool, String) {
    let out = run_timeout(
        Command::new("openssl")
            .args(["s_client", "-quiet", "-connect"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-CAfile")
            .arg(sb.path("ca.crt"))
            .args(args),
        b"GET /v1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(10),
    );
    let all = format!("{}{}", out.stdout, out.stderr);
    (out.stdout.contains("HTTP/1.1 200"), all)
}

#[test]
fn modern_refuses_tls12_and_unlisted_suites_and_groups() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = start(
        &sb,
        &up,
        "min_version = \"1.3\"\ncipher_suites = [\"TLS_AES_256_GCM_SHA384\", \
         \"TLS_AES_128_GCM_SHA256\"]\ngroups = [\"secp256r1\"]",
    );
    let port = proxy.port("api");
    let cases: &[(&[&str], bool)] = &[
        (&["-tls1_3"], true),
        (&["-tls1_2"], false),
        (
            &["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"],
            true,
        ),
        (
            &["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"],
            false,
        ),
        (&["-tls1_3", "-groups", "P-256"], true),
        (&["-tls1_3", "-groups", "P-384"], false),
    ];
    for (args, ok) in cases {
        let (got, out) = handshake(&sb, port, args);
        assert_eq!(got, *ok, "{args:?}: {out}");
    }
    let failures = support::metric(
        &proxy.metrics(),
        "ironic_proxy_tls_handshake_failures_total",
        &[("listener", "api")],
    );
    assert_eq!(failures, Some(3.0), "{}", proxy.metrics());
}

#[test]
fn intermediate_takes_tls12_with_listed_ciphers_only() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = start(
        &sb,
        &up,
        // (ChaCha20 is left out: a FIPS build refuses it, and this test runs in both.)
        "min_version = \"1.2\"\ncipher_suites = [\"TLS_AES_128_GCM_SHA256\", \
         \"TLS_AES_256_GCM_SHA384\", \"ECDHE-ECDSA-AES128-GCM-SHA256\", \"ECDHE-RSA-AES128-GCM-SHA256\", \
         \"ECDHE-ECDSA-AES256-GCM-SHA384\", \"ECDHE-RSA-AES256-GCM-SHA384\"]",
    );
    let port = proxy.port("api");
    let cases: &[(&[&str], bool)] = &[
        (&["-tls1_3"], true),
        (&["-tls1_2"], true),
        (
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"],
            true,
        ),
        (
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"],
            false,
        ),
        (&["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA256"], false),
        (&["-tls1_1"], false),
    ];
    for (args, ok) in cases {
        let (got, out) = handshake(&sb, port, args);
        assert_eq!(got, *ok, "{args:?}: {out}");
    }
}

/// No session is resumed, in TLS 1.3 or 1.2: Python's `ssl` (what requests uses) offers the
/// session of its last connection, after reading a whole response (the point where TLS 1.3
/// tickets would have arrived), and every handshake is a full one. Against a server that
/// issues tickets (rustls' defaults) the same script reports `reused`.
#[test]
fn sessions_are_never_resumed() {
    const SCRIPT: &str = r#"
import socket, ssl, sys
port, ca = int(sys.argv[1]), sys.argv[2]
for name, v in (("1.3", ssl.TLSVersion.TLSv1_3), ("1.2", ssl.TLSVersion.TLSv1_2)):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.minimum_version = ctx.maximum_version = v
    session, got = None, []
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as s:
                s.sendall(b"GET /v1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
                assert data.startswith(b"HTTP/1.1 200"), data[:40]
                got.append(s.session_reused)
                session = s.session
    print(name, "reused" if any(got) else "full", got)
"#;
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = start(&sb, &up, "min_version = \"1.2\"");
    let port = proxy.port("api").to_string();
    let ca = sb.path("ca.crt");
    let out = support::python(SCRIPT, &[&port, ca.to_str().unwrap()]);
    assert!(out.ok(), "{out:?}");
    assert_eq!(
        out.stdout, "1.3 full [False, False, False]\n1.2 full [False, False, False]\n",
        "{out:?}"
    );
}

#[test]
fn check_prints_the_policy_and_bad_names_name_the_key() {
    let sb = Sandbox::new();
    let (config, _, _) = sb
        .proxy()
        .listener("api", Tls::Server, "unix:/run/x.sock")
        .write_config();
    let base = std::fs::read_to_string(&config).unwrap();
    let check = |tls: &str| {
        std::fs::write(&config, format!("[tls]\n{tls}\n{base}")).unwrap();
        support::run(
            Command::new(BIN).arg("check").arg("--config").arg(&config),
            b"",
        )
    };
    let out = check("min_version = \"1.3\"");
    assert!(out.ok(), "{out:?}");
    let fips = if cfg!(feature = "fips") { "yes" } else { "no" };
    assert!(
        out.stdout.contains(&format!(
            "[tls]\n# crypto: aws-lc-rs, FIPS module: {fips}\n"
        )),
        "{}",
        out.stdout
    );
    // rustls' defaults; a FIPS build has no ChaCha20.
    let suites = if cfg!(feature = "fips") {
        "[\"TLS_AES_256_GCM_SHA384\", \"TLS_AES_128_GCM_SHA256\"]"
    } else {
        "[\"TLS_AES_256_GCM_SHA384\", \"TLS_AES_128_GCM_SHA256\", \"TLS_CHACHA20_POLY1305_SHA256\"]"
    };
    assert!(
        out.stdout.contains(&format!(
            "min_version = \"1.3\"\ncipher_suites = {suites}\n"
        )),
        "{}",
        out.stdout
    );
    for (tls, key) in [
        (
            "cipher_suites = [\"TLS_AES_128_GCM_SHA256\", \"X\", \"DHE-RSA-AES128-GCM-SHA256\"]",
            "tls.cipher_suites[1]",
        ),
        (
            "min_version = \"1.3\"\ncipher_suites = [\"ECDHE-RSA-AES128-GCM-SHA256\"]",
            "tls.cipher_suites: min_version",
        ),
        ("groups = [\"brainpoolP256r1\"]", "tls.groups[0]"),
        // Known but not offered, and nothing else listed: nothing left to offer.
        (
            "groups = [\"ffdhe2048\", \"secp521r1\"]",
            "tls.groups: no group",
        ),
        ("min_version = \"1.0\"", "tls.min_version"),
    ] {
        let out = check(tls);
        assert_eq!(out.code, Some(1), "{tls}: {out:?}");
        assert!(out.stderr.contains(key), "{key}: {}", out.stderr);
    }
}

/// A peer (openssl s_server) that speaks only TLS 1.2 serves through a load balancer whose
/// policy allows 1.2, and fails, counted in `ironic_proxy_peer_tls_failures_total`, when the
/// policy says 1.3.
#[test]
fn a_peer_that_only_speaks_what_the_policy_forbids_fails_and_is_counted() {
    use crate::support::dnsmasq;
    let sb = Sandbox::new();
    let mut dns = dnsmasq::Dnsmasq::start("metal3.svc", 5);
    dns.set_hosts(&[("127.0.0.1", "peer.metal3.svc")]);
    let peer_port = support::free_port();
    let mut peer = Command::new("openssl")
        .args(["s_server", "-quiet", "-tls1_2", "-www", "-accept"])
        .arg(format!("127.0.0.1:{peer_port}"))
        .arg("-cert")
        .arg(sb.path("tls.crt"))
        .arg("-key")
        .arg(sb.path("tls.key"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let run = |min: &str| {
        let (admin, port) = (support::free_port(), support::free_port());
        let config = sb.path(&format!("lb-{min}.toml"));
        std::fs::write(
            &config,
            format!(
                "[tls]\nmin_version = \"{min}\"\n\n[identity]\ntrust = \"{ca}\"\ncert = \"{crt}\"\n\
                 key = \"{key}\"\n\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\n[dns]\n\
                 servers = [\"{dns}\"]\nrefresh = \"1s\"\n\n[[listeners]]\nname = \"lb\"\n\
                 listen = \"127.0.0.1:{port}\"\ntls = \"none\"\n[listeners.upstream]\n\
                 dns = \"peer.metal3.svc:{peer_port}\"\ntls = true\n\
                 health = {{ path = \"/\", interval = \"200ms\", timeout = \"1s\" }}\n",
                ca = sb.path("ca.crt").display(),
                crt = sb.path("tls.crt").display(),
                key = sb.path("tls.key").display(),
                dns = dns.addr(),
            ),
        )
        .unwrap();
        let ports = [("lb".to_owned(), port)].into_iter().collect();
        Proxy::spawn(&config, admin, ports, false, None)
    };
    // 0 until the admin listener answers.
    let failures = |p: &Proxy| {
        let text = p
            .admin_get("/metrics")
            .map(|r| r.text())
            .unwrap_or_default();
        support::metric(
            &text,
            "ironic_proxy_peer_tls_failures_total",
            &[("upstream", "lb")],
        )
        .unwrap_or(0.0)
    };
    // TLS 1.2 allowed: the peer answers (s_server -www: 200 and a status page).
    let mut ok = run("1.2");
    let served = support::poll_until(Duration::from_secs(10), || {
        let mut c = support::HttpConn::tcp(ok.addr("lb")).ok()?;
        let r = c
            .request("GET", "/", &[("Connection", "close")], b"")
            .ok()?;
        (r.status == 200).then_some(r)
    });
    assert!(served.is_some(), "{:?}", ok.logs());
    assert_eq!(failures(&ok), 0.0);
    ok.kill();
    // TLS 1.3 only: every attempt fails the handshake and is counted; the client gets 502/503.
    let refused = run("1.3");
    let counted = support::poll_until(Duration::from_secs(10), || {
        (failures(&refused) >= 1.0).then_some(())
    });
    assert!(counted.is_some(), "{:?}", refused.logs());
    let mut c = support::HttpConn::tcp(refused.addr("lb")).unwrap();
    let r = c
        .request("GET", "/", &[("Connection", "close")], b"")
        .unwrap();
    assert!(matches!(r.status, 502 | 503), "{}", r.status);
    let _ = peer.kill();
    let _ = peer.wait();
}

/// OpenShift's Old profile as a `[tls]` table (openshift/api types_tlssecurityprofile.go: 24
/// ciphers, of which rustls offers the 9 AEAD ECDHE ones, and TLS 1.0+): the proxy starts with
/// one warning per list naming what it drops, and offers nothing it dropped.
#[test]
#[cfg(not(feature = "fips"))]
fn openshifts_old_profile_starts_and_offers_only_what_rustls_has() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = start(
        &sb,
        &up,
        "min_version = \"1.2\"\ncipher_suites = [\"TLS_AES_128_GCM_SHA256\", \
         \"TLS_AES_256_GCM_SHA384\", \"TLS_CHACHA20_POLY1305_SHA256\", \
         \"ECDHE-ECDSA-AES128-GCM-SHA256\", \"ECDHE-RSA-AES128-GCM-SHA256\", \
         \"ECDHE-ECDSA-AES256-GCM-SHA384\", \"ECDHE-RSA-AES256-GCM-SHA384\", \
         \"ECDHE-ECDSA-CHACHA20-POLY1305\", \"ECDHE-RSA-CHACHA20-POLY1305\", \
         \"ECDHE-ECDSA-AES128-SHA256\", \"ECDHE-RSA-AES128-SHA256\", \"ECDHE-ECDSA-AES128-SHA\", \
         \"ECDHE-RSA-AES128-SHA\", \"ECDHE-ECDSA-AES256-SHA384\", \"ECDHE-RSA-AES256-SHA384\", \
         \"ECDHE-ECDSA-AES256-SHA\", \"ECDHE-RSA-AES256-SHA\", \"AES128-GCM-SHA256\", \
         \"AES256-GCM-SHA384\", \"AES128-SHA256\", \"AES256-SHA256\", \"AES128-SHA\", \
         \"AES256-SHA\", \"DES-CBC3-SHA\"]\n\
         groups = [\"X25519MLKEM768\", \"X25519\", \"secp256r1\", \"secp384r1\", \
         \"secp521r1\", \"SecP384r1MLKEM1024\"]",
    );
    let port = proxy.port("api");
    // Readiness comes from the admin endpoint: stderr may not have been read that far yet.
    proxy.wait_log(Duration::from_secs(5), |l| {
        l.contains("tls.groups: this build")
    });
    let warnings: Vec<String> = proxy
        .logs()
        .into_iter()
        .filter(|l| l.contains("WARN") && l.contains("cannot offer"))
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("ECDHE-ECDSA-AES128-SHA256"),
        "{warnings:?}"
    );
    assert!(warnings[0].contains("DES-CBC3-SHA"), "{warnings:?}");
    assert!(
        warnings[1].contains("tls.groups: this build cannot offer secp521r1, SecP384r1MLKEM1024"),
        "{warnings:?}"
    );
    let cases: &[(&[&str], bool)] = &[
        (
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"],
            true,
        ),
        (&["-tls1_3", "-groups", "secp384r1"], true),
        (&["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA"], false),
        (&["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-SHA384"], false),
        (&["-tls1_2", "-groups", "secp521r1"], false),
        (&["-tls1_3", "-groups", "secp521r1"], false),
        (
            &["-tls1_1", "-cipher", "ECDHE-ECDSA-AES128-SHA@SECLEVEL=0"],
            false,
        ),
    ];
    for (args, ok) in cases {
        let (got, out) = handshake(&sb, port, args);
        assert_eq!(got, *ok, "{args:?}: {out}");
    }
}
