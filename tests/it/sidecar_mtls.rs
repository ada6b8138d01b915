//! Mutual TLS on a `mutual` listener with real clients (curl, openssl s_client, Python
//! requests): bad client certificates are refused at the handshake and counted; a valid
//! certificate outside `allow` gets a 403 JSON body; the upstream sees none of them.

use crate::support;

use std::path::Path;
use std::process::Command;
use support::{curl, json_object, python, run, LeafSpec, Output, Sandbox, Tls, Upstream};

/// curl to `url` presenting `cert` (paths), printing only the status code.
fn curl_status(ca: &Path, cert: Option<(&Path, &Path)>, url: &str) -> Output {
    let mut args = vec![
        "--cacert".to_owned(),
        ca.display().to_string(),
        "-o".to_owned(),
        "/dev/null".to_owned(),
        "-w".to_owned(),
        "%{http_code}".to_owned(),
    ];
    if let Some((crt, key)) = cert {
        args.extend([
            "--cert".to_owned(),
            crt.display().to_string(),
            "--key".to_owned(),
            key.display().to_string(),
        ]);
    }
    args.push(url.to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    curl(&args)
}

/// `openssl s_client` sending one request; returns what it printed (stdout + stderr).
fn s_client(ca: &Path, cert: Option<(&Path, &Path)>, port: u16) -> Output {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-quiet", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-CAfile")
        .arg(ca);
    if let Some((crt, key)) = cert {
        cmd.arg("-cert").arg(crt).arg("-key").arg(key);
    }
    run(
        &mut cmd,
        b"GET /via-openssl HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
}

#[test]
fn bad_client_certificates_are_refused_at_the_handshake_and_counted() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("rpc"));
    let proxy = sb
        .proxy()
        .listener("json-rpc", Tls::Mutual, &up.address())
        .allow(&["*.ironic.test"])
        .start();
    let ca = sb.path("ca.crt");
    let url = proxy.url("json-rpc", "/");
    let port = proxy.port("json-rpc");

    // Control: a good certificate gets through with both clients.
    let good = sb.ca.client_leaf(&["conductor-1.ironic.test"]);
    let good = sb.client_files(&good, "good");
    let out = curl_status(&ca, Some((&good.0, &good.1)), &url);
    assert_eq!(out.stdout, "200", "valid certificate: {out:?}");
    let out = s_client(&ca, Some((&good.0, &good.1)), port);
    assert!(
        out.stdout.contains("HTTP/1.1 200"),
        "valid certificate via openssl: {out:?}"
    );
    assert_eq!(up.all().len(), 2);

    let other_ca = support::Ca::new("someone else's CA");
    // (case, certificate, metric reason, TLS alert openssl reports)
    let cases: Vec<(&str, Option<support::Leaf>, &str, &str)> = vec![
        (
            "no certificate",
            None,
            "no_client_cert",
            "certificate required",
        ),
        (
            "another CA",
            Some(other_ca.client_leaf(&["conductor-1.ironic.test"])),
            "bad_certificate",
            "unknown ca",
        ),
        (
            "expired",
            Some(
                sb.ca
                    .leaf(&LeafSpec::client(&["conductor-1.ironic.test"]).expired()),
            ),
            "bad_certificate",
            "certificate expired",
        ),
        (
            "serverAuth only",
            Some(
                sb.ca
                    .leaf(&LeafSpec::new(&["conductor-1.ironic.test"]).server_only()),
            ),
            "bad_certificate",
            "unsupported certificate",
        ),
    ];
    let mut expected_by_reason = std::collections::BTreeMap::<&str, f64>::new();
    for (i, (name, leaf, reason, alert)) in cases.iter().enumerate() {
        let files = leaf
            .as_ref()
            .map(|l| sb.client_files(l, &format!("bad{i}")));
        let cert = files.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));

        let out = curl_status(&ca, cert, &url);
        assert!(!out.ok(), "{name}: curl must fail: {out:?}");
        assert_eq!(
            out.stdout, "000",
            "{name}: no HTTP response at all: {out:?}"
        );

        let out = s_client(&ca, cert, port);
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(
            !all.contains("HTTP/1.1"),
            "{name}: openssl got a response: {all}"
        );
        assert!(
            all.contains(&format!("alert {alert}")),
            "{name}: TLS alert \"{alert}\" expected: {all}"
        );
        *expected_by_reason.entry(reason).or_default() += 2.0;
    }

    assert_eq!(
        up.all().len(),
        2,
        "the upstream saw only the two good requests"
    );
    let metrics = proxy.metrics();
    let total = support::metric(
        &metrics,
        "ironic_proxy_tls_handshake_failures_total",
        &[("listener", "json-rpc")],
    );
    assert_eq!(
        total,
        Some(8.0),
        "two clients x four bad certificates:\n{metrics}"
    );
    for (reason, n) in expected_by_reason {
        assert_eq!(
            support::metric(
                &metrics,
                "ironic_proxy_tls_handshake_failures_total",
                &[("listener", "json-rpc"), ("reason", reason)],
            ),
            Some(n),
            "reason {reason}:\n{metrics}"
        );
    }
}

#[test]
fn valid_certificate_outside_allow_gets_403_json_and_never_reaches_the_upstream() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("rpc"));
    let proxy = sb
        .proxy()
        .listener("json-rpc", Tls::Mutual, &up.address())
        .allow(&["*.ironic.test", "ip:10.0.0.0/8"])
        .start();
    let ca = sb.path("ca.crt");
    let url = proxy.url("json-rpc", "/v1/rpc");

    let refused: &[&[&str]] = &[
        &["intruder.other.test", "192.168.1.1"],
        &["a.b.ironic.test"],
        &["ironic.test"],
        &["xironic.test"],
        &["11.0.0.1"],
    ];
    for (i, sans) in refused.iter().enumerate() {
        let leaf = sb.ca.client_leaf(sans);
        let (crt, key) = sb.client_files(&leaf, &format!("out{i}"));
        let out = curl(&[
            "--cacert",
            ca.to_str().unwrap(),
            "--cert",
            crt.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
            "-w",
            "\n%{http_code}",
            &url,
        ]);
        assert!(out.ok(), "{sans:?}: the handshake succeeds: {out:?}");
        let (body, status) = out.stdout.rsplit_once('\n').expect("body and status");
        assert_eq!(status, "403", "{sans:?}: {out:?}");
        let json = json_object(body);
        assert_eq!(json["error"], "forbidden", "{sans:?}: {json:?}");
        assert_eq!(json["status"], "403");
    }

    // Python requests, as Ironic's JSON-RPC client: 403 on every request of the session (each
    // 403 closes its connection, so the session opens a new one for the next).
    let leaf = sb.ca.client_leaf(&["conductor.elsewhere.test"]);
    let (crt, key) = sb.client_files(&leaf, "py");
    let out = python(
        r#"
import sys, requests
s = requests.Session()
for i in range(2):
    r = s.post(sys.argv[1], json={"method": "x", "id": i}, cert=(sys.argv[3], sys.argv[4]),
               verify=sys.argv[2], timeout=10)
    print(r.status_code, r.json()["error"], r.headers.get("connection"))
"#,
        &[
            &url,
            ca.to_str().unwrap(),
            crt.to_str().unwrap(),
            key.to_str().unwrap(),
        ],
    );
    assert_eq!(
        out.stdout, "403 forbidden close\n403 forbidden close\n",
        "{out:?}"
    );
    assert!(
        up.all().is_empty(),
        "nothing outside allow reaches the upstream: {:?}",
        up.all()
    );

    // Inside allow, by wildcard and by IP: through.
    for (i, sans) in [&["conductor-0.ironic.test"][..], &["10.9.8.7"]]
        .iter()
        .enumerate()
    {
        let leaf = sb.ca.client_leaf(sans);
        let (crt, key) = sb.client_files(&leaf, &format!("in{i}"));
        let out = curl_status(&ca, Some((&crt, &key)), &url);
        assert_eq!(out.stdout, "200", "{sans:?}: {out:?}");
    }
    assert_eq!(up.all().len(), 2);
    assert_eq!(
        proxy.metric("ironic_proxy_tls_handshake_failures_total", &[]),
        0.0,
        "403s are not handshake failures"
    );
}
