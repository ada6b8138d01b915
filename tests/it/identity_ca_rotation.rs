//! CA rotation in issuer mode (issue 3, item 4): the trust bundle holds the old and the new CA;
//! when the issuer files switch to the new CA, the next leaf comes from it at once (no SIGHUP, no
//! restart), clients trusting either CA keep connecting, and the exported `ca.crt` follows the
//! bundle. Then the old CA is dropped from the bundle and clients of the old CA alone are refused.

use crate::support;
use crate::support::node;

use node::Node;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use support::Upstream;
use x509_parser::prelude::FromDer;

fn issuer_cn(der: &[u8]) -> String {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).expect("leaf parses");
    cert.issuer().to_string()
}

#[test]
fn switching_the_issuer_to_a_new_ca_reissues_at_once_and_both_cas_are_trusted_meanwhile() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let old = node::ca_init(&d.join("old"), &["--name", "old-ca"]);
    let new = node::ca_init(&d.join("new"), &["--name", "new-ca"]);
    let old_pem = std::fs::read_to_string(&old.0).expect("old ca");
    let new_pem = std::fs::read_to_string(&new.0).expect("new ca");
    // What the Secret holds: the issuing pair and the bundle.
    let live = d.join("secret");
    std::fs::create_dir_all(&live).expect("secret dir");
    let (cert, key, bundle) = (
        live.join("ca.crt"),
        live.join("ca.key"),
        live.join("ca-bundle.crt"),
    );
    std::fs::copy(&old.0, &cert).expect("issuer cert");
    std::fs::copy(&old.1, &key).expect("issuer key");
    std::fs::write(&bundle, format!("{old_pem}{new_pem}")).expect("bundle");
    let export = d.join("export");
    let up = Upstream::start(&d.join("api.sock"));
    let (t, c, k, e) = (
        node::tp(&bundle),
        node::tp(&cert),
        node::tp(&key),
        node::tp(&export),
    );
    let sock = node::toml_str(&format!("unix:{}", up.path.display()));
    let proxy = Node::start(
        d,
        "rotating-ca",
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        |admin, listen: SocketAddr| {
            format!(
                r#"[identity]
trust = {t}
issuer_cert = {c}
issuer_key = {k}
dns_names = ["localhost"]
ip_addresses = ["127.0.0.1"]
validity = "1h"
renew_before = "20m"
export_dir = {e}
watch_interval = "100ms"

[admin]
listen = "127.0.0.1:{admin}"

[[listeners]]
name = "api"
listen = "{listen}"
tls = "server"
upstream = {sock}
"#
            )
        },
    );
    let leaf_trusting = |ca_pem: &str| -> std::io::Result<Vec<u8>> {
        let mut conn =
            node::tls_conn(proxy.listen, "localhost", node::client_config(ca_pem, None))?;
        let leaf = support::peer_leaf(conn.stream());
        let r = conn.get("/v1/nodes")?;
        assert_eq!(r.status, 200);
        Ok(leaf)
    };
    let first = leaf_trusting(&old_pem).expect("old CA clients connect");
    assert_eq!(issuer_cn(&first), "CN=old-ca");

    // Switch the issuer (as `kubectl apply` of a new Secret would: new files renamed in).
    let tmp = |p: &Path| {
        p.with_file_name(format!(
            "{}.tmp",
            p.file_name().and_then(|n| n.to_str()).unwrap_or("x")
        ))
    };
    std::fs::copy(&new.0, tmp(&cert)).expect("stage cert");
    std::fs::copy(&new.1, tmp(&key)).expect("stage key");
    std::fs::rename(tmp(&key), &key).expect("swap key");
    std::fs::rename(tmp(&cert), &cert).expect("swap cert");

    let reissued = support::poll_until(Duration::from_secs(10), || {
        leaf_trusting(&new_pem)
            .ok()
            .filter(|leaf| issuer_cn(leaf) == "CN=new-ca")
    })
    .expect("a leaf from the new CA within the watch interval");
    assert_ne!(node::serial(&reissued), node::serial(&first));
    assert!(proxy.metric("ironic_proxy_certificate_renewals_total", &[]) >= 1.0);
    // Both CAs are still trusted by the proxy's own export, so peers of either generation verify.
    let exported = std::fs::read_to_string(export.join("ca.crt")).expect("exported ca.crt");
    assert!(exported.contains(old_pem.trim()) && exported.contains(new_pem.trim()));
    let exported_leaf = std::fs::read_to_string(export.join("tls.crt")).expect("exported tls.crt");
    assert_eq!(issuer_cn(&node::pem_der(&exported_leaf)), "CN=new-ca");

    // Drop the old CA from the bundle: the export follows, and a client holding only the old CA
    // can no longer verify us (we are issued by the new one).
    std::fs::write(&bundle, &new_pem).expect("bundle without the old CA");
    support::poll_until(Duration::from_secs(10), || {
        let now = std::fs::read_to_string(export.join("ca.crt")).ok()?;
        (!now.contains(old_pem.trim())).then_some(())
    })
    .expect("export_dir/ca.crt drops the old CA");
    assert!(
        leaf_trusting(&old_pem).is_err(),
        "a client trusting only the old CA must fail"
    );
    leaf_trusting(&new_pem).expect("new CA clients connect");
}
