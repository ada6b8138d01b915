//! The exported identity (issue 3): what `export_dir` holds checks out with `openssl` (chain,
//! exactly the configured SANs, both EKUs, the validity asked for, the file mode), and it is
//! usable as it is meant to be: Ironic's JSON-RPC client (Python `requests`) presenting one
//! sidecar's exported files passes another sidecar's mutual listener and is identified upstream.

use crate::support;
use crate::support::node;

use node::Node;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};
use support::{run, Upstream};

/// An issuer-mode sidecar: a mutual listener on `ip` in front of `sock`, exporting to `export`.
struct Sidecar<'a> {
    ca: &'a (PathBuf, PathBuf),
    dns: &'a [&'a str],
    ips: &'a [&'a str],
    validity: &'a str,
    export: &'a Path,
    export_mode: &'a str,
    allow: &'a [&'a str],
    sock: &'a Path,
}

impl Sidecar<'_> {
    fn render(&self) -> impl Fn(u16, SocketAddr) -> String {
        let mut identity = node::issuer_identity(self.ca, self.dns, self.ips, self.validity);
        identity.push_str(&format!(
            "export_dir = {}\nexport_mode = \"{}\"\n",
            node::tp(self.export),
            self.export_mode
        ));
        node::issuer_node(identity, Some(self.allow), self.sock, String::new())
    }
}

fn openssl(args: &[&str]) -> support::Output {
    run(Command::new("openssl").args(args), b"")
}

/// The value lines following `header` in `openssl x509 -text` output.
fn text_field<'a>(text: &'a str, header: &str) -> &'a str {
    let mut lines = text.lines();
    lines
        .find(|l| l.trim_start().starts_with(header))
        .unwrap_or_else(|| panic!("no {header} in\n{text}"));
    lines.next().map(str::trim).unwrap_or_default()
}

#[test]
fn exported_files_verify_and_carry_exactly_the_configured_identity() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A constrained CA, as the operator guide has it.
    let ca = node::ca_init(
        &dir.path().join("ca"),
        &["--permit-dns", "metal3.svc", "--permit-ip", "127.0.0.0/8"],
    );
    let export = dir.path().join("export");
    let up = Upstream::start(&dir.path().join("rpc.sock"));
    let sidecar = Sidecar {
        ca: &ca,
        dns: &["ironic-0.ironic.metal3.svc", "ironic.metal3.svc"],
        ips: &["127.0.0.1"],
        validity: "2h",
        export: &export,
        export_mode: "0440",
        allow: &[],
        sock: &up.path,
    };
    let issued_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let proxy = Node::start(
        dir.path(),
        "sidecar",
        IpAddr::from([127, 0, 0, 1]),
        sidecar.render(),
    );
    let (crt, key, ca_crt) = (
        export.join("tls.crt"),
        export.join("tls.key"),
        export.join("ca.crt"),
    );
    let s = |p: &Path| p.display().to_string();

    let v = openssl(&["verify", "-CAfile", &s(&ca_crt), &s(&crt)]);
    assert!(
        v.ok() && v.stdout.trim().ends_with(": OK"),
        "openssl verify: {v:?}"
    );

    let text = openssl(&["x509", "-in", &s(&crt), "-noout", "-text"]);
    assert!(text.ok(), "openssl x509 -text: {text:?}");
    let sans: BTreeSet<&str> = text_field(&text.stdout, "X509v3 Subject Alternative Name")
        .split(", ")
        .collect();
    let want: BTreeSet<&str> = [
        "DNS:ironic-0.ironic.metal3.svc",
        "DNS:ironic.metal3.svc",
        "IP Address:127.0.0.1",
    ]
    .into();
    assert_eq!(sans, want, "exactly the configured SANs");
    let ekus: BTreeSet<&str> = text_field(&text.stdout, "X509v3 Extended Key Usage")
        .split(", ")
        .collect();
    assert_eq!(
        ekus,
        [
            "TLS Web Server Authentication",
            "TLS Web Client Authentication"
        ]
        .into(),
        "both EKUs"
    );
    assert!(
        text.stdout.contains("CA:FALSE"),
        "a leaf, not a CA:\n{}",
        text.stdout
    );

    // The validity asked for: notAfter = issuance + 2 h (whole seconds).
    let leaf_pem = std::fs::read_to_string(&crt).expect("tls.crt");
    let der = node::pem_der(&leaf_pem);
    let lifetime = node::not_after(&der) - i64::try_from(issued_at).expect("time");
    assert!(
        (7195..=7210).contains(&lifetime),
        "notAfter is 2 h after issuance, got {lifetime} s"
    );

    // The key is the certificate's, ca.crt is the trust bundle, and the leaf is the one served.
    let key_pem = std::fs::read_to_string(&key).expect("tls.key");
    node::key_matches(&leaf_pem, &key_pem).expect("tls.key belongs to tls.crt");
    assert_eq!(
        std::fs::read(&ca_crt).expect("ca.crt"),
        std::fs::read(&ca.0).expect("trust")
    );
    let cfg = node::client_config(
        &std::fs::read_to_string(&ca.0).expect("ca"),
        Some((&leaf_pem, &key_pem)),
    );
    let mut conn = node::tls_conn(proxy.listen, "127.0.0.1", cfg).expect("TLS to the listener");
    assert_eq!(
        support::peer_leaf(conn.stream()),
        der,
        "the exported leaf is served"
    );
    let r = conn.get("/ping").expect("GET through the listener");
    assert_eq!(
        r.status, 200,
        "the exported pair passes our own mutual listener"
    );

    for file in [&crt, &key, &ca_crt] {
        let mode = std::fs::metadata(file).expect("exported file").mode() & 0o7777;
        assert_eq!(mode, 0o440, "{} has export_mode", file.display());
    }
}

const PY_GET: &str = r#"
import sys, requests
url, ca = sys.argv[1], sys.argv[2]
cert = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else None
try:
    r = requests.get(url, cert=cert, verify=ca, timeout=10)
    print(r.status_code)
except requests.exceptions.RequestException as e:
    print("error", type(e).__name__, e)
"#;

/// Python `requests` GET with the given exported files; returns what it printed.
fn py_get(url: &str, export: &Path, with_cert: bool) -> String {
    let ca = export.join("ca.crt").display().to_string();
    let crt = export.join("tls.crt").display().to_string();
    let key = export.join("tls.key").display().to_string();
    let mut args = vec![url, ca.as_str()];
    if with_cert {
        args.extend([crt.as_str(), key.as_str()]);
    }
    let out = support::python(PY_GET, &args);
    assert!(out.ok(), "python: {out:?}");
    out.stdout.trim().to_owned()
}

#[test]
fn one_sidecars_exported_identity_passes_another_sidecars_mutual_listener() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = node::ca_init(
        &dir.path().join("ca"),
        &["--permit-dns", "metal3.svc", "--permit-ip", "127.0.0.0/8"],
    );
    let mut sidecars = Vec::new();
    for (name, ip) in [("a", "127.0.0.2"), ("b", "127.0.0.3")] {
        let up = Upstream::start(&dir.path().join(format!("{name}.sock")));
        let export = dir.path().join(format!("export-{name}"));
        let pod = format!("ironic-{name}.ironic.metal3.svc");
        let sidecar = Sidecar {
            ca: &ca,
            dns: &[&pod],
            ips: &[ip],
            validity: "1h",
            export: &export,
            export_mode: "0640",
            allow: &["*.ironic.metal3.svc", "ip:127.0.0.0/24"],
            sock: &up.path,
        };
        let proxy = Node::start(dir.path(), name, ip.parse().expect("IP"), sidecar.render());
        sidecars.push((proxy, up, export, pod, ip));
    }

    for (from, to) in [(0, 1), (1, 0)] {
        let (_, _, export, pod, ip) = &sidecars[from];
        let (proxy, up, ..) = &sidecars[to];
        let url = format!("https://{}/v1/rpc-from-{pod}", proxy.listen);

        // Without a client certificate the handshake fails and nothing reaches Ironic.
        let before = up.all().len();
        let refused = py_get(&url, export, false);
        assert!(refused.starts_with("error"), "no client cert: {refused}");
        assert_eq!(up.all().len(), before);

        let status = py_get(&url, export, true);
        assert_eq!(status, "200", "{pod}'s exported files against {}", to);
        let rec = up.wait_for(before + 1, std::time::Duration::from_secs(5));
        let rec = rec.last().expect("one request");
        assert_eq!(rec.path, format!("/v1/rpc-from-{pod}"));
        let xfcc = rec
            .header("x-forwarded-client-cert")
            .expect("X-Forwarded-Client-Cert upstream");
        let leaf = node::pem_der(
            &std::fs::read_to_string(export.join("tls.crt")).expect("exported tls.crt"),
        );
        assert!(
            xfcc.starts_with(&format!("Hash={};", support::sha256_hex(&leaf))),
            "XFCC names the exported certificate: {xfcc}"
        );
        let parts: Vec<&str> = xfcc.split(';').collect();
        assert!(
            parts.contains(&format!("DNS={pod}").as_str()),
            "XFCC carries {pod}: {xfcc}"
        );
        assert!(
            parts.contains(&format!("IP={ip}").as_str()),
            "XFCC carries {ip}: {xfcc}"
        );
    }
}
