//! TLS origination to peers (issue 4, `tls = true`): three peers behind one name, one with a
//! certificate from our CA for its IP, one from another CA, one from our CA without its IP. Only
//! the first ever receives a request (each peer's own record says so), it sees our client
//! certificate, and the two refusals are logged and counted by reason.

use crate::support::{backend, dnsmasq, node};

use backend::{bind_same_port, ip, Backend, BackendTls};
use dnsmasq::Dnsmasq;
use node::{Lb, Node};
use std::net::IpAddr;
use std::time::Duration;

#[test]
fn only_a_peer_with_a_trusted_certificate_for_its_ip_receives_requests() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let ca = node::ca_init(&d.join("ca"), &[]);
    let other_ca = node::ca_init(&d.join("other-ca"), &["--name", "someone else's CA"]);
    let ca_pem = std::fs::read_to_string(&ca.0).expect("ca.crt");

    let ips = [ip(33, 1), ip(33, 2), ip(33, 3)];
    let listeners = bind_same_port(&ips);
    let port = listeners[0].local_addr().expect("address").port();
    let certs = [
        node::cert_issue(&ca, &d.join("good"), &["--ip", "127.0.33.1"]),
        node::cert_issue(&other_ca, &d.join("foreign"), &["--ip", "127.0.33.2"]),
        node::cert_issue(
            &ca,
            &d.join("misnamed"),
            &["--dns", "peer-3.ironic.metal3.svc", "--ip", "127.0.33.99"],
        ),
    ];
    let peers: Vec<Backend> = listeners
        .into_iter()
        .zip(["good", "foreign", "misnamed"])
        .zip(&certs)
        .map(|((l, id), pem)| {
            let tls = BackendTls {
                cert_pem: pem.cert.clone(),
                key_pem: pem.key.clone(),
                client_ca_pem: Some(ca_pem.clone()),
            };
            Backend::start_tls(id, l, &tls)
        })
        .collect();
    let mut dns = Dnsmasq::start("metal3.svc", 1);
    let records: Vec<(String, &str)> = ips
        .iter()
        .map(|ip| (ip.to_string(), "ironic.metal3.svc"))
        .collect();
    let records: Vec<(&str, &str)> = records.iter().map(|(a, n)| (a.as_str(), *n)).collect();
    dns.set_hosts(&records);

    let mut lb = Lb::new(dns.addr(), &format!("ironic.metal3.svc:{port}"));
    lb.tls_peers = true;
    lb.listener_tls = "server".into();
    lb.identity = Some(format!(
        r#"[identity]
trust = {ca}
issuer_cert = {ca}
issuer_key = {key}
dns_names = ["lb.ironic.metal3.svc", "localhost"]
ip_addresses = ["127.0.0.1"]
validity = "1h"
"#,
        ca = node::tp(&ca.0),
        key = node::tp(&ca.1)
    ));
    let proxy = Node::start(d, "lb", IpAddr::from([127, 0, 0, 1]), lb.render());

    let cfg = node::client_config(&ca_pem, None);
    let mut conn = node::tls_conn(proxy.listen, "localhost", cfg).expect("TLS to the proxy");
    for i in 0..60 {
        let r = conn.get(&format!("/v1/nodes/{i}")).expect("GET");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-backend"), Some("good"));
    }
    // Wait until health checks have been tried against every refused peer more than once, and
    // counted under each reason.
    let reasons = ["unknown_issuer", "name_mismatch"];
    crate::support::poll_until(Duration::from_secs(10), || {
        let tried = peers[1..].iter().all(|p| p.handshake_failures() >= 2);
        let counted = reasons.iter().all(|r| {
            proxy.metric(
                "ironic_proxy_peer_tls_failures_total",
                &[("upstream", "api"), ("reason", r)],
            ) >= 2.0
        });
        (tried && counted).then_some(())
    })
    .unwrap_or_else(|| panic!("refused peers tried and counted:\n{}", proxy.metrics()));
    let counted: Vec<f64> = reasons
        .iter()
        .map(|r| {
            proxy.metric(
                "ironic_proxy_peer_tls_failures_total",
                &[("upstream", "api"), ("reason", r)],
            )
        })
        .collect();
    eprintln!(
        "peer TLS: good peer {} requests; foreign CA: {} requests, {} refused handshakes; \
         missing IP SAN: {} requests, {} refused handshakes; counted {reasons:?} = {counted:?}",
        peers[0].hit_count(),
        peers[1].hit_count() + peers[1].checks().len(),
        peers[1].handshake_failures(),
        peers[2].hit_count() + peers[2].checks().len(),
        peers[2].handshake_failures(),
    );

    // What each peer received, by its own record.
    assert_eq!(peers[0].hit_count(), 60);
    for p in &peers[1..] {
        assert_eq!(p.hit_count(), 0, "{} got no request", p.id());
        assert!(
            p.checks().is_empty(),
            "{} got no health check either",
            p.id()
        );
        assert!(
            p.handshake_failures() > 0,
            "{} was tried and refused",
            p.id()
        );
    }
    // The good peer saw our certificate, for our names.
    let ours = peers[0].hits()[0]
        .client_cert
        .clone()
        .expect("the proxy presented a client certificate");
    let mut sans = node::sans(&ours);
    sans.sort();
    assert_eq!(
        sans,
        ["DNS:lb.ironic.metal3.svc", "DNS:localhost", "IP:127.0.0.1"]
    );
    assert!(peers[0].hits().iter().all(|h| h.client_cert.is_some()));

    // Counted and logged, by reason.
    for (reason, n) in reasons.iter().zip(&counted) {
        assert!(*n > 0.0, "peer TLS failures counted as {reason}: {n}");
        assert!(
            proxy
                .logs()
                .iter()
                .any(|l| l.contains("peer TLS failed") && l.contains(reason)),
            "a log line gives the reason {reason}"
        );
    }
}
