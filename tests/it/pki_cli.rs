//! The `ca` and `cert` commands, driven through the built binary in temp dirs, and their output
//! checked with the tools operators use: `openssl verify`, `openssl x509`, and rustls/webpki.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

fn ironic_proxy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ironic-proxy"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn openssl(args: &[&str]) -> Output {
    Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl is installed")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a command that must succeed; returns its stdout.
fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Asserts exit code 1 and exactly one line on stderr; returns that line.
fn fails_with_one_line(output: &Output) -> String {
    assert_eq!(
        output.status.code(),
        Some(1),
        "stderr: {}",
        text(&output.stderr)
    );
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr:?}");
    assert!(stderr.starts_with("ironic-proxy: "), "{stderr}");
    stderr
}

fn s(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// `ca init --out DIR extra...`; returns (ca.crt, ca.key).
fn ca_init(dir: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    let mut args = vec!["ca", "init", "--out", s(dir)];
    args.extend_from_slice(extra);
    ok(&ironic_proxy(&args));
    (dir.join("ca.crt"), dir.join("ca.key"))
}

/// `cert issue` with the given CA into `out`.
fn issue(ca: &(PathBuf, PathBuf), out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "cert",
        "issue",
        "--ca-cert",
        s(&ca.0),
        "--ca-key",
        s(&ca.1),
        "--out",
        s(out),
    ];
    args.extend_from_slice(extra);
    ironic_proxy(&args)
}

fn verify_ok(ca: &Path, leaf: &Path) -> bool {
    openssl(&["verify", "-CAfile", s(ca), s(leaf)])
        .status
        .success()
}

/// Seconds since the epoch of an `openssl x509 -dates` line value (`Nov 29 19:20:28 2026 GMT`).
fn openssl_time(value: &str) -> i64 {
    let parts: Vec<&str> = value.split_whitespace().collect();
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = months.iter().position(|m| *m == parts[0]).unwrap() as u8 + 1;
    let hms: Vec<u8> = parts[2].split(':').map(|x| x.parse().unwrap()).collect();
    let date = time::Date::from_calendar_date(
        parts[3].parse().unwrap(),
        time::Month::try_from(month).unwrap(),
        parts[1].parse().unwrap(),
    )
    .unwrap();
    date.with_hms(hms[0], hms[1], hms[2])
        .unwrap()
        .assume_utc()
        .unix_timestamp()
}

/// Signs a leaf with the CA in `ca` directly through rcgen, bypassing our checks.
fn mint_with_rcgen(
    ca: &(PathBuf, PathBuf),
    sans: Vec<SanType>,
    out: &Path,
) -> CertificateDer<'static> {
    let ca_key = KeyPair::from_pem(&fs::read_to_string(&ca.1).unwrap()).unwrap();
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&fs::read_to_string(&ca.0).unwrap(), ca_key).unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.subject_alt_names = sans;
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    fs::write(out, cert.pem()).unwrap();
    cert.der().clone()
}

/// Verifies `leaf` against the CA with rustls' webpki verifiers, as a client and as a server
/// certificate for `name`.
fn webpki_accepts(ca: &Path, leaf: &CertificateDer<'_>, name: &str) -> (bool, bool) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let roots = Arc::new(roots);
    let now = UnixTime::now();
    let client = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .unwrap();
    let server = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider)
        .build()
        .unwrap();
    let name = ServerName::try_from(name.to_owned()).unwrap();
    (
        client.verify_client_cert(leaf, &[], now).is_ok(),
        server
            .verify_server_cert(leaf, &[], &name, &[], now)
            .is_ok(),
    )
}

#[test]
fn issued_leaf_verifies_and_shows_exactly_what_was_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = ca_init(
        &tmp.path().join("ca"),
        &[
            "--permit-dns",
            "metal3.svc",
            "--permit-ip",
            "10.0.0.0/8",
            "--permit-ip",
            "::1",
        ],
    );
    let out = tmp.path().join("leaf");
    let args = [
        "--dns",
        "p0.ironic.metal3.svc",
        "--dns",
        "ironic.metal3.svc",
    ];
    ok(&issue(
        &ca,
        &out,
        &[&args[..], &["--ip", "10.0.0.5", "--ip", "::1"]].concat(),
    ));
    let (crt, key) = (out.join("tls.crt"), out.join("tls.key"));
    let verified = ok(&openssl(&["verify", "-CAfile", s(&ca.0), s(&crt)]));
    assert_eq!(verified.trim(), format!("{}: OK", s(&crt)));
    for purpose in ["sslserver", "sslclient"] {
        ok(&openssl(&[
            "verify",
            "-purpose",
            purpose,
            "-CAfile",
            s(&ca.0),
            s(&crt),
        ]));
    }

    let x509 = ok(&openssl(&["x509", "-noout", "-text", "-in", s(&crt)]));
    let lines: Vec<&str> = x509.lines().map(str::trim).collect();
    let after = |header: &str| lines[lines.iter().position(|l| l.starts_with(header)).unwrap() + 1];
    assert_eq!(
        after("X509v3 Subject Alternative Name"),
        "DNS:p0.ironic.metal3.svc, DNS:ironic.metal3.svc, IP Address:10.0.0.5, \
         IP Address:0:0:0:0:0:0:0:1"
    );
    assert_eq!(
        after("X509v3 Extended Key Usage"),
        "TLS Web Server Authentication, TLS Web Client Authentication"
    );
    assert!(lines.contains(&"X509v3 Key Usage: critical"));
    assert_eq!(after("X509v3 Key Usage"), "Digital Signature");
    assert_eq!(after("X509v3 Basic Constraints"), "CA:FALSE");
    assert!(
        lines.contains(&"Subject: CN = p0.ironic.metal3.svc"),
        "{x509}"
    );
    assert_eq!(x509.matches("BEGIN CERTIFICATE").count(), 0);
    assert_eq!(
        fs::read_to_string(&crt)
            .unwrap()
            .matches("BEGIN CERTIFICATE")
            .count(),
        1
    );

    let dates = ok(&openssl(&["x509", "-noout", "-dates", "-in", s(&crt)]));
    let field = |name: &str| {
        let line = dates.lines().find(|l| l.starts_with(name)).unwrap();
        openssl_time(line.split_once('=').unwrap().1)
    };
    // Default validity 24h, plus the one-minute backdate.
    assert_eq!(field("notAfter") - field("notBefore"), 24 * 3600 + 60);

    let key_mode = fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(key_mode, 0o600);
    let pubkeys: Vec<String> = [
        openssl(&["x509", "-noout", "-pubkey", "-in", s(&crt)]),
        openssl(&["pkey", "-pubout", "-in", s(&key)]),
    ]
    .iter()
    .map(ok)
    .collect();
    assert_eq!(pubkeys[0], pubkeys[1], "tls.key belongs to tls.crt");
}

#[test]
fn validity_flag_is_honoured() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = ca_init(&tmp.path().join("ca"), &["--validity", "30d"]);
    let out = tmp.path().join("leaf");
    ok(&issue(
        &ca,
        &out,
        &["--dns", "localhost", "--validity", "36h"],
    ));
    let dates = ok(&openssl(&[
        "x509",
        "-noout",
        "-dates",
        "-in",
        s(&out.join("tls.crt")),
    ]));
    let times: Vec<i64> = dates
        .lines()
        .map(|l| openssl_time(l.split_once('=').unwrap().1))
        .collect();
    assert_eq!(times[1] - times[0], 36 * 3600 + 60);
    let ca_dates = ok(&openssl(&["x509", "-noout", "-dates", "-in", s(&ca.0)]));
    let times: Vec<i64> = ca_dates
        .lines()
        .map(|l| openssl_time(l.split_once('=').unwrap().1))
        .collect();
    assert_eq!(times[1] - times[0], 30 * 86400 + 60);
}

#[test]
fn cert_issue_refuses_sans_outside_the_ca_constraints() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = ca_init(&tmp.path().join("ca"), &["--permit-dns", "metal3.svc"]);
    let out = tmp.path().join("leaf");
    let line = fails_with_one_line(&issue(&ca, &out, &["--dns", "evil.example.com"]));
    assert!(
        line.contains("SAN DNS:evil.example.com is outside"),
        "{line}"
    );
    // --permit-dns alone forbids every IP address.
    let line = fails_with_one_line(&issue(
        &ca,
        &out,
        &["--dns", "a.metal3.svc", "--ip", "10.1.1.1"],
    ));
    assert!(line.contains("SAN IP:10.1.1.1"), "{line}");
    let line = fails_with_one_line(&issue(&ca, &out, &[]));
    assert!(line.contains("no subject alternative name"), "{line}");
    assert!(!out.join("tls.crt").exists() && !out.join("tls.key").exists());
}

#[test]
fn leaves_minted_outside_constraints_are_rejected_by_openssl_and_webpki() {
    let tmp = tempfile::tempdir().unwrap();
    let both = ca_init(
        &tmp.path().join("both"),
        &["--permit-dns", "metal3.svc", "--permit-ip", "10.0.0.0/8"],
    );
    let dns_only = ca_init(&tmp.path().join("dns"), &["--permit-dns", "metal3.svc"]);
    let ip_only = ca_init(&tmp.path().join("ip"), &["--permit-ip", "10.0.0.0/8"]);
    let dns = |n: &str| SanType::DnsName(n.try_into().unwrap());
    let ip = |a: &str| SanType::IpAddress(a.parse().unwrap());
    let leaf_path = tmp.path().join("leaf.crt");

    // Controls: inside the constraints, the same minting passes both verifiers.
    let leaf = mint_with_rcgen(&both, vec![dns("a.metal3.svc"), ip("10.0.0.1")], &leaf_path);
    assert!(verify_ok(&both.0, &leaf_path));
    assert_eq!(webpki_accepts(&both.0, &leaf, "a.metal3.svc"), (true, true));
    let leaf = mint_with_rcgen(&ip_only, vec![ip("10.0.0.1")], &leaf_path);
    assert!(verify_ok(&ip_only.0, &leaf_path));
    assert_eq!(webpki_accepts(&ip_only.0, &leaf, "10.0.0.1"), (true, true));

    let cases = [
        (&both, vec![dns("evil.example.com")], "evil.example.com"),
        (
            &both,
            vec![dns("a.metal3.svc"), ip("192.168.1.1")],
            "a.metal3.svc",
        ),
        (
            &both,
            vec![dns("metal3.svc.evil.com")],
            "metal3.svc.evil.com",
        ),
        (
            &dns_only,
            vec![dns("a.metal3.svc"), ip("10.0.0.1")],
            "a.metal3.svc",
        ),
        (&ip_only, vec![dns("localhost"), ip("10.0.0.1")], "10.0.0.1"),
    ];
    for (ca, sans, name) in cases {
        let leaf = mint_with_rcgen(ca, sans.clone(), &leaf_path);
        let verify = openssl(&["verify", "-CAfile", s(&ca.0), s(&leaf_path)]);
        assert!(!verify.status.success(), "openssl accepted {sans:?}");
        let why = text(&verify.stdout) + &text(&verify.stderr);
        assert!(why.contains("subtree violation"), "{sans:?}: {why}");
        assert_eq!(
            webpki_accepts(&ca.0, &leaf, name),
            (false, false),
            "webpki accepted {sans:?}"
        );
    }
}

#[test]
fn bad_ca_material_exits_1_with_one_line_naming_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let a = ca_init(&tmp.path().join("a"), &[]);
    let b = ca_init(&tmp.path().join("b"), &[]);
    let out = tmp.path().join("leaf");
    let dns = ["--dns", "localhost"];

    let line = fails_with_one_line(&issue(&(a.0.clone(), b.1.clone()), &out, &dns));
    assert!(
        line.contains("does not match") && line.contains(s(&b.1)),
        "{line}"
    );

    let missing = tmp.path().join("missing.key");
    let line = fails_with_one_line(&issue(&(a.0.clone(), missing.clone()), &out, &dns));
    assert!(
        line.contains(&format!("cannot read {}", s(&missing))),
        "{line}"
    );
    // A directory is unreadable as a key even for root, who ignores file modes.
    let line = fails_with_one_line(&issue(&(a.0.clone(), tmp.path().to_owned()), &out, &dns));
    assert!(
        line.contains(&format!("cannot read {}", s(tmp.path()))),
        "{line}"
    );

    let garbage = tmp.path().join("garbage.key");
    fs::write(&garbage, "not a key").unwrap();
    let line = fails_with_one_line(&issue(&(a.0.clone(), garbage), &out, &dns));
    assert!(line.contains("no usable private key"), "{line}");

    // A leaf is not a CA.
    ok(&issue(&a, &out, &dns));
    let leaf = (out.join("tls.crt"), out.join("tls.key"));
    let line = fails_with_one_line(&issue(&leaf, &tmp.path().join("x"), &dns));
    assert!(line.contains("not a CA"), "{line}");

    // An expired CA, made directly with rcgen.
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    params.not_before = rcgen::date_time_ymd(2010, 1, 1);
    params.not_after = rcgen::date_time_ymd(2011, 1, 1);
    let expired = (tmp.path().join("old.crt"), tmp.path().join("old.key"));
    fs::write(&expired.0, params.self_signed(&key).unwrap().pem()).unwrap();
    fs::write(&expired.1, key.serialize_pem()).unwrap();
    let line = fails_with_one_line(&issue(&expired, &tmp.path().join("y"), &dns));
    assert!(line.contains("expired at 2011-01-01T00:00:00Z"), "{line}");
    assert!(line.contains(s(&expired.0)), "{line}");
}

#[test]
fn ca_init_writes_a_private_key_and_refuses_to_overwrite_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ca");
    let (crt, key) = ca_init(&dir, &["--name", "Test Ops CA"]);
    assert_eq!(
        fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::metadata(&crt).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let x509 = ok(&openssl(&["x509", "-noout", "-text", "-in", s(&crt)]));
    assert!(x509.contains("Subject: CN = Test Ops CA"), "{x509}");
    assert!(
        x509.contains("X509v3 Basic Constraints: critical"),
        "{x509}"
    );
    assert!(x509.contains("CA:TRUE"), "{x509}");
    assert!(x509.contains("Certificate Sign, CRL Sign"), "{x509}");
    assert!(x509.contains("ASN1 OID: prime256v1"), "{x509}");
    ok(&openssl(&["ec", "-check", "-noout", "-in", s(&key)]));
    let before = (fs::read(&crt).unwrap(), fs::read(&key).unwrap());

    let line = fails_with_one_line(&ironic_proxy(&["ca", "init", "--out", s(&dir)]));
    assert!(
        line.contains("already exists") && line.contains("--force"),
        "{line}"
    );
    assert_eq!((fs::read(&crt).unwrap(), fs::read(&key).unwrap()), before);

    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    ok(&ironic_proxy(&["ca", "init", "--out", s(&dir), "--force"]));
    assert_ne!(fs::read(&key).unwrap(), before.1);
    assert_eq!(
        fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let leftovers: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 3, "{leftovers:?}");
    // The trust bundle the kit mounts is rewritten with the new CA, never left on the old one.
    assert_eq!(
        fs::read(dir.join("ca-bundle.crt")).unwrap(),
        fs::read(&crt).unwrap()
    );
}

#[test]
fn ca_init_writes_the_trust_bundle_the_kit_mounts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ca");
    let (crt, _) = ca_init(&dir, &[]);
    let bundle = dir.join("ca-bundle.crt");
    assert_eq!(fs::read(&bundle).unwrap(), fs::read(&crt).unwrap());
    assert_eq!(
        fs::metadata(&bundle).unwrap().permissions().mode() & 0o777,
        0o644
    );
    // A leaf issued by the CA verifies against the bundle, as a peer's trust would check it.
    let leaf = tmp.path().join("leaf");
    ok(&issue(
        &(crt, dir.join("ca.key")),
        &leaf,
        &["--dns", "ironic.metal3.svc"],
    ));
    assert!(verify_ok(&bundle, &leaf.join("tls.crt")));
    // Nothing is written when only the bundle is in the way.
    let other = tmp.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("ca-bundle.crt"), b"kept").unwrap();
    let line = fails_with_one_line(&ironic_proxy(&["ca", "init", "--out", s(&other)]));
    assert!(line.contains("ca-bundle.crt already exists"), "{line}");
    assert_eq!(fs::read(other.join("ca-bundle.crt")).unwrap(), b"kept");
    assert!(!other.join("ca.key").exists());
}

#[test]
fn cert_show_prints_the_fields_and_warns_when_expired() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = ca_init(&tmp.path().join("ca"), &[]);
    let out = tmp.path().join("leaf");
    ok(&issue(
        &ca,
        &out,
        &["--dns", "localhost", "--ip", "127.0.0.1"],
    ));
    let crt = out.join("tls.crt");
    let shown = ironic_proxy(&["cert", "show", s(&crt)]);
    let stdout = ok(&shown);
    assert!(shown.stderr.is_empty(), "{}", text(&shown.stderr));
    let fingerprint = ok(&openssl(&[
        "x509",
        "-noout",
        "-fingerprint",
        "-sha256",
        "-in",
        s(&crt),
    ]));
    let fingerprint = fingerprint.trim().split_once('=').unwrap().1;
    for expected in [
        "subject:     CN=localhost".to_owned(),
        "SANs:        DNS:localhost, IP:127.0.0.1".to_owned(),
        "issuer:      CN=ironic-proxy CA".to_owned(),
        "key type:    ECDSA P-256".to_owned(),
        format!("SHA-256:     {fingerprint}"),
    ] {
        assert!(
            stdout.lines().any(|l| l == expected),
            "{expected:?} not in\n{stdout}"
        );
    }
    assert!(
        stdout.contains("not before:  ") && stdout.contains("not after:   "),
        "{stdout}"
    );

    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["old.example".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "old.example");
    params.not_before = rcgen::date_time_ymd(2010, 1, 1);
    params.not_after = rcgen::date_time_ymd(2011, 1, 1);
    let old = tmp.path().join("old.crt");
    fs::write(&old, params.self_signed(&key).unwrap().pem()).unwrap();
    let shown = ironic_proxy(&["cert", "show", s(&old)]);
    assert!(ok(&shown).contains("not after:   2011-01-01T00:00:00Z"));
    assert_eq!(
        text(&shown.stderr).trim(),
        format!(
            "warning: {}: certificate expired at 2011-01-01T00:00:00Z",
            s(&old)
        )
    );

    let not_pem = tmp.path().join("empty.pem");
    fs::write(&not_pem, "hello").unwrap();
    let line = fails_with_one_line(&ironic_proxy(&["cert", "show", s(&not_pem)]));
    assert!(
        line.contains(s(&not_pem)) && line.contains("no PEM CERTIFICATE"),
        "{line}"
    );
}

#[test]
fn ca_made_by_openssl_with_a_sec1_key_issues_verifiable_leaves() {
    let tmp = tempfile::tempdir().unwrap();
    let (crt, key) = (tmp.path().join("ca.crt"), tmp.path().join("ca.key"));
    ok(&openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        s(&key),
    ]));
    assert!(fs::read_to_string(&key)
        .unwrap()
        .contains("BEGIN EC PRIVATE KEY"));
    ok(&openssl(&[
        "req",
        "-x509",
        "-new",
        "-key",
        s(&key),
        "-out",
        s(&crt),
        "-days",
        "2",
        "-subj",
        "/C=US/O=Metal3 Ops/CN=Openssl CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]));
    let out = tmp.path().join("leaf");
    ok(&issue(
        &(crt.clone(), key),
        &out,
        &["--dns", "p0.metal3.svc", "--ip", "10.0.0.2"],
    ));
    assert!(verify_ok(&crt, &out.join("tls.crt")));
    let leaf = CertificateDer::from_pem_file(out.join("tls.crt")).unwrap();
    assert_eq!(webpki_accepts(&crt, &leaf, "10.0.0.2"), (true, true));
}

#[test]
fn usage_errors_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = s(tmp.path());
    for args in [
        vec!["ca", "init"],
        vec!["ca", "init", "--out", dir, "--validity", "forever"],
        vec!["ca", "init", "--out", dir, "--permit-ip", "10.0.0.0/33"],
        vec![
            "cert",
            "issue",
            "--ca-cert",
            "a",
            "--ca-key",
            "b",
            "--out",
            dir,
            "--ip",
            "x",
        ],
        vec!["cert", "frobnicate"],
    ] {
        let output = ironic_proxy(&args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn cert_issue_overwrites_only_with_force() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = ca_init(&tmp.path().join("ca"), &[]);
    let out = tmp.path().join("leaf");
    ok(&issue(&ca, &out, &["--dns", "localhost"]));
    let first = fs::read(out.join("tls.crt")).unwrap();
    let line = fails_with_one_line(&issue(&ca, &out, &["--dns", "localhost"]));
    assert!(line.contains("already exists"), "{line}");
    ok(&issue(&ca, &out, &["--dns", "localhost", "--force"]));
    assert_ne!(fs::read(out.join("tls.crt")).unwrap(), first);
    assert!(verify_ok(&ca.0, &out.join("tls.crt")));
}
