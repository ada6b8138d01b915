//! Adversarial TLS and mutual TLS (issue 5, item 1) against real `server` and `mutual`
//! listeners: plaintext to a TLS port, TLS 1.0/1.1, TLS 1.2 suites without ECDHE or AEAD (raw
//! ClientHellos we build byte by byte, and `openssl s_client`), no SNI, stalled and partial
//! handshakes cut by `request_head_timeout`; client certificates that must be refused at the
//! handshake (none, another CA, expired, not yet valid, serverAuth only, a self-signed lookalike,
//! a fake CA with the real one's name, a leaf signed by a leaf), with TLS 1.3 and TLS 1.2
//! clients. After every case the proxy serves a normal request and the upstream got nothing.

use crate::support;
use crate::support::adversary;

use adversary::{Rig, Target};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Leaf, LeafSpec};

/// How far past the head timeout a cut may come before the test calls it a hang ([`HANG`]:
/// exact deadlines are the paused-clock tests').
const SLACK: Duration = support::HANG;

fn rig() -> Rig {
    Rig::new(|b| b.limit_dur("request_head_timeout", "2s"))
}

fn failures(rig: &Rig, listener: &str) -> f64 {
    rig.proxy.metric(
        "ironic_proxy_tls_handshake_failures_total",
        &[("listener", listener)],
    )
}

fn failures_for(rig: &Rig, listener: &str, reason: &str) -> f64 {
    rig.proxy.metric(
        "ironic_proxy_tls_handshake_failures_total",
        &[("listener", listener), ("reason", reason)],
    )
}

fn assert_nothing_reached(rig: &Rig, mark: &[usize], what: &str) {
    let r = rig.reached_since(mark);
    assert!(
        r.requests.is_empty() && r.partial == 0,
        "{what}: the upstream must get nothing: {:?}",
        r.requests
    );
}

// ------------------------------------------------------------------------------------------------
// Raw ClientHellos (RFC 5246 §7.4.1.2, RFC 8446 §4.1.2).

fn u16be(v: usize) -> [u8; 2] {
    u16::try_from(v).expect("fits").to_be_bytes()
}

fn ext(kind: u16, body: &[u8]) -> Vec<u8> {
    [&kind.to_be_bytes()[..], &u16be(body.len()), body].concat()
}

/// A ClientHello offering `version` (no supported_versions extension: TLS 1.2 or older
/// negotiation) and exactly `suites`, with the groups and signature schemes an ECDSA P-256
/// server needs, so the only thing wrong is the version or the suites.
fn client_hello(version: u16, suites: &[u16]) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&u16be(suites.len() * 2));
    for s in suites {
        body.extend_from_slice(&s.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]); // null compression
    let groups = [0x00, 0x04, 0x00, 0x1d, 0x00, 0x17]; // x25519, secp256r1
    let points = [0x01, 0x00];
    let sigs = [0x00, 0x06, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01];
    let exts = [
        ext(0x000a, &groups),
        ext(0x000b, &points),
        ext(0x000d, &sigs),
    ]
    .concat();
    body.extend_from_slice(&u16be(exts.len()));
    body.extend_from_slice(&exts);
    let len = u32::try_from(body.len()).expect("fits").to_be_bytes();
    let hs = [&[0x01, len[1], len[2], len[3]][..], &body].concat();
    [&[0x16, 0x03, 0x01][..], &u16be(hs.len()), &hs].concat()
}

/// What the server answered a raw ClientHello: the first record's content type and, for an
/// alert, its description.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Alert(u8),
    Handshake,
    Closed,
    Other(Vec<u8>),
}

fn raw_hello(addr: SocketAddr, hello: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(hello).expect("send ClientHello");
    let mut buf = [0u8; 7];
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    match (got, buf[0]) {
        (0, _) => Answer::Closed,
        (7, 0x15) => Answer::Alert(buf[6]),
        (_, 0x16) => Answer::Handshake,
        _ => Answer::Other(buf[..got].to_vec()),
    }
}

const ALERT_HANDSHAKE_FAILURE: u8 = 40;
const ALERT_PROTOCOL_VERSION: u8 = 70;
const ECDHE_ECDSA_AES128_GCM: u16 = 0xc02b;

fn openssl(args: &[&str]) -> support::Output {
    support::run(
        Command::new("openssl").arg("s_client").args(args),
        b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
}

#[test]
fn old_protocols_and_weak_suites_are_refused() {
    let rig = rig();
    for t in [Target::Server, Target::Mutual] {
        let addr = rig.addr(t);
        let before = failures(&rig, t.listener());
        let mark = rig.tap.mark();

        // Control: TLS 1.2 with ECDHE-ECDSA-AES128-GCM-SHA256 gets a ServerHello.
        assert_eq!(
            raw_hello(addr, &client_hello(0x0303, &[ECDHE_ECDSA_AES128_GCM])),
            Answer::Handshake,
            "[{t:?}] control hello"
        );
        // TLS 1.0 and 1.1 (and SSL 3.0) with suites that would otherwise be fine for them.
        for (name, version) in [
            ("SSL 3.0", 0x0300),
            ("TLS 1.0", 0x0301),
            ("TLS 1.1", 0x0302),
        ] {
            let a = raw_hello(addr, &client_hello(version, &[0xc009, 0xc013, 0x002f]));
            assert_eq!(
                a,
                Answer::Alert(ALERT_PROTOCOL_VERSION),
                "[{t:?}] {name} must get a protocol_version alert"
            );
        }
        // TLS 1.2 offering only suites without ECDHE or without AEAD.
        let weak: &[(&str, u16)] = &[
            ("RSA-AES128-SHA", 0x002f),
            ("RSA-AES128-GCM-SHA256", 0x009c),
            ("RSA-AES256-GCM-SHA384", 0x009d),
            ("DHE-RSA-AES128-GCM-SHA256", 0x009e),
            ("RSA-3DES-EDE-CBC-SHA", 0x000a),
            ("ECDHE-ECDSA-AES128-SHA (CBC)", 0xc009),
            ("ECDHE-ECDSA-AES256-SHA384 (CBC)", 0xc024),
            ("ECDHE-RSA-AES128-SHA (CBC)", 0xc013),
            ("ECDHE-ECDSA-RC4-SHA", 0xc007),
            ("ECDHE-ECDSA-NULL-SHA", 0xc006),
            ("RSA-NULL-SHA256", 0x003b),
            ("PSK-AES128-GCM-SHA256", 0x00a8),
            ("ECDH-ECDSA-AES128-GCM-SHA256 (static ECDH)", 0xc02d),
        ];
        for (name, suite) in weak {
            let a = raw_hello(addr, &client_hello(0x0303, &[*suite]));
            assert_eq!(
                a,
                Answer::Alert(ALERT_HANDSHAKE_FAILURE),
                "[{t:?}] TLS 1.2 with only {name} must get a handshake_failure alert"
            );
        }
        let counted = failures(&rig, t.listener()) - before;
        assert!(
            counted >= (3 + weak.len()) as f64,
            "[{t:?}] refusals counted: {counted}"
        );
        assert_nothing_reached(&rig, &mark, "old protocols");
        rig.normal_request(t).expect("normal request afterwards");
    }

    // The same with openssl, as an operator would try it. Debian's OpenSSL refuses TLS < 1.2 at
    // its default security level on the client side, so the level is lowered to 0: what is
    // refused is then refused by the proxy.
    let port = rig.addr(Target::Server).port().to_string();
    let connect = format!("127.0.0.1:{port}");
    let ca = rig.sb.path("ca.crt");
    let ca = ca.to_str().expect("path");
    let mut report = Vec::new();
    for (what, extra) in [
        ("-tls1_1", vec!["-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0"]),
        ("-tls1", vec!["-tls1", "-cipher", "DEFAULT:@SECLEVEL=0"]),
        (
            "-tls1_2 AES128-SHA",
            vec!["-tls1_2", "-cipher", "AES128-SHA"],
        ),
        (
            "-tls1_2 AES128-GCM-SHA256",
            vec!["-tls1_2", "-cipher", "AES128-GCM-SHA256"],
        ),
        (
            "-tls1_2 ECDHE-ECDSA-AES128-SHA",
            vec!["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA"],
        ),
        (
            "-tls1_2 DHE-RSA-AES128-GCM-SHA256",
            vec!["-tls1_2", "-cipher", "DHE-RSA-AES128-GCM-SHA256"],
        ),
    ] {
        let mut args = vec!["-connect", &connect, "-CAfile", ca, "-quiet"];
        args.extend(extra.iter().copied());
        let out = openssl(&args);
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(
            !all.contains("HTTP/1.1"),
            "openssl {what} got a response: {all}"
        );
        let line = all
            .lines()
            .find(|l| l.contains("alert") || l.contains("no protocols") || l.contains("no cipher"))
            .unwrap_or("(no alert line)")
            .trim()
            .to_owned();
        report.push(format!("openssl {what}: refused ({line})"));
    }
    let ok = openssl(&[
        "-connect",
        &connect,
        "-CAfile",
        ca,
        "-quiet",
        "-tls1_2",
        "-cipher",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
    ]);
    assert!(
        ok.stdout.contains("HTTP/1.1 200"),
        "openssl TLS 1.2 ECDHE-ECDSA-AES128-GCM-SHA256 works: {ok:?}"
    );
    eprintln!("{}", report.join("\n"));
}

#[test]
fn plaintext_http_to_a_tls_port_gets_no_http_answer() {
    let rig = rig();
    for t in [Target::Server, Target::Mutual] {
        let before = failures(&rig, t.listener());
        let mark = rig.tap.mark();
        let mut s = TcpStream::connect(rig.addr(t)).expect("connect");
        s.set_read_timeout(Some(SLACK)).expect("timeout");
        let timeouts = failures_for(&rig, t.listener(), "timeout");
        s.write_all(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("send");
        let mut got = Vec::new();
        let closed = s.read_to_end(&mut got).is_ok();
        assert!(closed, "[{t:?}] closed");
        // At once, not at the head timeout: the failure is counted under another reason.
        assert_eq!(
            failures_for(&rig, t.listener(), "timeout"),
            timeouts,
            "[{t:?}] closed at once, not at the head timeout"
        );
        assert!(
            !String::from_utf8_lossy(&got).contains("HTTP/"),
            "[{t:?}] no HTTP answer on a TLS port: {got:?}"
        );
        assert!(
            got.is_empty() || got[0] == 0x15,
            "[{t:?}] a TLS alert or nothing: {got:?}"
        );
        assert_nothing_reached(&rig, &mark, "plaintext");
        assert_eq!(
            failures(&rig, t.listener()) - before,
            1.0,
            "[{t:?}] counted"
        );
        rig.normal_request(t).expect("normal request afterwards");
    }
}

/// A rustls client config trusting the sandbox CA, presenting `client`, limited to `versions`.
fn client_config(
    rig: &Rig,
    client: Option<(&str, &str)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(rig.sb.ca.pem.as_bytes()) {
        roots.add(c.expect("CA")).expect("add CA");
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(versions)
    .expect("versions")
    .with_root_certificates(roots);
    let mut cfg = match client {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<_, _>>()
                    .expect("cert"),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key"),
            )
            .expect("client auth"),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// Handshake with `name` as the server name, then one GET: the status, or the error.
fn try_get(
    addr: SocketAddr,
    name: ServerName<'static>,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<u16, String> {
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(cfg, name).map_err(|e| e.to_string())?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn
            .complete_io(&mut s.sock)
            .map_err(|e| format!("handshake: {e}"))?;
    }
    let mut c = support::HttpConn::new(s);
    c.get("/tls-case")
        .map(|r| r.status)
        .map_err(|e| format!("request: {e}"))
}

#[test]
fn no_sni_works_as_ironic_dials_ips() {
    let rig = rig();
    let ip = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let tls13 = [&rustls::version::TLS13];
    let tls12 = [&rustls::version::TLS12];
    for t in [Target::Server, Target::Mutual] {
        let client = (t == Target::Mutual)
            .then_some((rig.client.cert_pem.as_str(), rig.client.key_pem.as_str()));
        for versions in [&tls13[..], &tls12[..]] {
            // rustls sends no SNI for an IP address (RFC 6066 §3).
            let got = try_get(
                rig.addr(t),
                ip.clone(),
                client_config(&rig, client, versions),
            );
            assert_eq!(got, Ok(200), "[{t:?}] without SNI");
        }
    }
    let port = rig.addr(Target::Server).port().to_string();
    let out = openssl(&[
        "-connect",
        &format!("127.0.0.1:{port}"),
        "-noservername",
        "-CAfile",
        rig.sb.path("ca.crt").to_str().expect("path"),
        "-verify_ip",
        "127.0.0.1",
        "-verify_return_error",
        "-quiet",
    ]);
    assert!(
        out.stdout.contains("HTTP/1.1 200"),
        "openssl -noservername: {out:?}"
    );
}

#[test]
fn stalled_and_partial_handshakes_are_cut_by_request_head_timeout() {
    let rig = rig();
    for t in [Target::Server, Target::Mutual] {
        let before = failures_for(&rig, t.listener(), "timeout");
        let full = client_hello(0x0303, &[ECDHE_ECDSA_AES128_GCM]);
        for (name, sent) in [
            ("nothing", &b""[..]),
            ("half a record header", &full[..3]),
            ("part of a ClientHello", &full[..full.len() / 2]),
        ] {
            // Timed from before the connect: the proxy's clock starts at accept.
            let started = Instant::now();
            let mut s = TcpStream::connect(rig.addr(t)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(3) + SLACK))
                .expect("timeout");
            s.write_all(sent).expect("send");
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            let took = started.elapsed();
            assert!(
                took >= Duration::from_millis(1800) && took < Duration::from_secs(2) + SLACK,
                "[{t:?}] {name}: closed after {took:?}, request_head_timeout is 2s"
            );
            assert!(
                !String::from_utf8_lossy(&got).contains("HTTP/"),
                "[{t:?}] {name}"
            );
        }
        // A completed handshake and then silence: the same deadline, counted from accept.
        let cfg = rig.tls_config(t);
        let started = Instant::now();
        let mut c = support::HttpConn::tls(rig.addr(t), cfg).expect("handshake");
        let (b, closed) = c.drain(Duration::from_secs(3) + SLACK);
        let took = started.elapsed();
        assert!(b.is_empty() && closed, "[{t:?}] silent after the handshake");
        assert!(
            took < Duration::from_secs(2) + SLACK,
            "[{t:?}] closed after {took:?}"
        );
        let counted = failures_for(&rig, t.listener(), "timeout") - before;
        assert_eq!(counted, 3.0, "[{t:?}] three handshake timeouts counted");
        rig.normal_request(t).expect("normal request afterwards");
    }
}

/// A self-signed certificate (clientAuth) with `cn` and DNS `san`.
fn self_signed(cn: &str, san: &str) -> (String, String) {
    let mut p = rcgen::CertificateParams::new(vec![san.to_owned()]).expect("params");
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = p.self_signed(&key).expect("self-sign");
    (cert.pem(), key.serialize_pem())
}

/// A clientAuth leaf for `san` signed with `issuer`'s key (a leaf, not a CA), chain included.
fn signed_by_leaf(issuer: &Leaf, san: &str) -> (String, String) {
    let key = rcgen::KeyPair::from_pem(&issuer.key_pem).expect("issuer key");
    let issuer_cert = rcgen::Issuer::from_ca_cert_pem(&issuer.cert_pem, key).expect("issuer");
    let mut p = rcgen::CertificateParams::new(vec![san.to_owned()]).expect("params");
    p.distinguished_name.push(rcgen::DnType::CommonName, san);
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf_key = rcgen::KeyPair::generate().expect("key");
    let cert = p.signed_by(&leaf_key, &issuer_cert).expect("sign");
    (
        format!("{}{}", cert.pem(), issuer.cert_pem),
        leaf_key.serialize_pem(),
    )
}

#[test]
fn bad_client_certificates_are_refused_at_the_handshake() {
    let rig = rig();
    let addr = rig.addr(Target::Mutual);
    let good = rig.sb.ca.client_leaf(&["conductor-1.ironic.test"]);
    let now = time::OffsetDateTime::now_utc();
    let not_yet = LeafSpec {
        not_before: now + time::Duration::days(1),
        not_after: now + time::Duration::days(2),
        ..LeafSpec::client(&["conductor-1.ironic.test"])
    };
    // Same name as the sandbox CA, another key.
    let fake_ca = support::Ca::new("ironic-proxy test CA");
    let pem = |l: Leaf| (l.cert_pem, l.key_pem);
    // (case, certificate and key PEM, metric reason)
    type Pems = Option<(String, String)>;
    let cases: Vec<(&str, Pems, &str)> = vec![
        ("no certificate", None, "no_client_cert"),
        (
            "another CA",
            Some(pem(
                support::Ca::new("other CA").client_leaf(&["conductor-1.ironic.test"])
            )),
            "bad_certificate",
        ),
        (
            "expired",
            Some(pem(rig.sb.ca.leaf(
                &LeafSpec::client(&["conductor-1.ironic.test"]).expired(),
            ))),
            "bad_certificate",
        ),
        (
            "not yet valid",
            Some(pem(rig.sb.ca.leaf(&not_yet))),
            "bad_certificate",
        ),
        (
            "serverAuth only",
            Some(pem(rig.sb.ca.leaf(
                &LeafSpec::new(&["conductor-1.ironic.test"]).server_only(),
            ))),
            "bad_certificate",
        ),
        (
            "self-signed lookalike",
            Some(self_signed(
                "conductor-1.ironic.test",
                "conductor-1.ironic.test",
            )),
            "bad_certificate",
        ),
        (
            "self-signed with the CA's name",
            Some(self_signed(
                "ironic-proxy test CA",
                "conductor-1.ironic.test",
            )),
            "bad_certificate",
        ),
        (
            "fake CA with the real CA's name",
            Some(pem(fake_ca.client_leaf(&["conductor-1.ironic.test"]))),
            "bad_certificate",
        ),
        (
            "leaf signed by a leaf",
            Some(signed_by_leaf(&good, "conductor-9.ironic.test")),
            "bad_certificate",
        ),
    ];
    // Control.
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let cfg = client_config(&rig, Some((&good.cert_pem, &good.key_pem)), versions);
        assert_eq!(
            try_get(addr, ServerName::try_from("localhost").expect("name"), cfg),
            Ok(200)
        );
    }
    let mut report = Vec::new();
    for (name, cert, reason) in &cases {
        for versions in [
            &[&rustls::version::TLS13][..],
            &[&rustls::version::TLS12][..],
        ] {
            let before = failures_for(&rig, "rpc", reason);
            let mark = rig.tap.mark();
            let cfg = client_config(
                &rig,
                cert.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
                versions,
            );
            let got = try_get(addr, ServerName::try_from("localhost").expect("name"), cfg);
            let v = if versions[0] == &rustls::version::TLS13 {
                "TLS 1.3"
            } else {
                "TLS 1.2"
            };
            let err = got.expect_err(&format!("{name} over {v}: must be refused"));
            assert!(
                !err.contains("HTTP"),
                "{name} over {v}: no HTTP exchange: {err}"
            );
            let counted = support::poll_until(support::HANG, || {
                let n = failures_for(&rig, "rpc", reason) - before;
                (n >= 1.0).then_some(n)
            });
            assert_eq!(counted, Some(1.0), "{name} over {v}: counted as {reason}");
            assert_nothing_reached(&rig, &mark, name);
            report.push(format!("{name} / {v}: {err}"));
        }
        rig.normal_request(Target::Mutual)
            .unwrap_or_else(|e| panic!("after {name}: {e}"));
    }
    // And with openssl for the cases sidecar_mtls.rs does not cover.
    let port = addr.port().to_string();
    let ca = rig.sb.path("ca.crt");
    for (i, (name, cert, _)) in cases.iter().enumerate().skip(3) {
        let (c, k) = cert.as_ref().expect("a certificate");
        let (cp, kp) = (
            rig.sb.path(&format!("bad{i}.crt")),
            rig.sb.path(&format!("bad{i}.key")),
        );
        std::fs::write(&cp, c).expect("write");
        std::fs::write(&kp, k).expect("write");
        let out = openssl(&[
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-CAfile",
            ca.to_str().expect("path"),
            "-cert",
            cp.to_str().expect("path"),
            "-key",
            kp.to_str().expect("path"),
            "-quiet",
        ]);
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(
            !all.contains("HTTP/1.1"),
            "openssl {name}: got a response: {all}"
        );
        assert!(all.contains("alert"), "openssl {name}: a TLS alert: {all}");
    }
    eprintln!("{}", report.join("\n"));
    assert!(adversary::alive(&rig.proxy));
}
