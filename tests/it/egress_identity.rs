//! No identity field a client forged leaves the egress (issue 53, item 3). On each of its three
//! paths (mutual TLS to a port of `ports`, plain HTTP to a port of `plain_ports`, plain HTTP to
//! any other host by `others = "relay"`), a request carrying `X-Forwarded-Client-Cert` and
//! `Forwarded` in two case spellings, and the underscore spellings that WSGI servers read as
//! the same variable, reaches the peer without any of them, while the client's other fields
//! pass. On the mutual-TLS path the peer learns who called from the egress's own client
//! certificate. Raw requests over TCP, so that every spelling is sent as written; the peers are
//! hyper servers that record the fields they parsed (the TLS one asks for a client certificate).

use crate::support::backend::{Backend, BackendTls};
use crate::support::files::FileServer;
use crate::support::node::{self, Node};
use crate::support::ports::KeptListener;
use crate::support::{header, HttpConn};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

const EGRESS: &str = "json-rpc-egress";
/// `Basic` of `ironic:s3cret-egress`.
const BASIC: &str = "Basic aXJvbmljOnMzY3JldC1lZ3Jlc3M=";

/// Every spelling a client could forge an identity with; each value names itself `forged`.
const FORGED: [(&str, &str); 5] = [
    (
        "X-Forwarded-Client-Cert",
        "Hash=forged;URI=spiffe://forged/1",
    ),
    (
        "x-forwarded-client-cert",
        "Hash=forged;URI=spiffe://forged/2",
    ),
    ("Forwarded", "for=192.0.2.1;by=forged"),
    (
        "X_Forwarded_Client_Cert",
        "Hash=forged;URI=spiffe://forged/3",
    ),
    (
        "x_forwarded_client_cert",
        "Hash=forged;URI=spiffe://forged/4",
    ),
];

/// One egress listener and a peer on each of its paths.
struct Rig {
    _dir: tempfile::TempDir,
    egress: Node,
    /// Mutual TLS on 127.0.0.1 (certificate from the egress's CA), its port in `ports`.
    peer: Backend,
    /// Plain HTTP on 127.0.0.1, its port in `plain_ports`.
    plain: FileServer,
    /// Plain HTTP on 127.0.0.3, outside `targets`: reached by `others = "relay"`.
    other: FileServer,
}

fn file_server(ip: [u8; 4]) -> FileServer {
    let ip = IpAddr::V4(Ipv4Addr::from(ip));
    let s = FileServer::start(
        KeptListener::bind(SocketAddr::new(ip, node::free_port_on(ip))).expect("bind"),
    );
    s.put("/x", b"reached\n", std::time::SystemTime::now());
    s
}

impl Rig {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let ca = node::ca_init(&d.join("ca"), &[]);
        let leaf = node::cert_issue(&ca, &d.join("peer"), &["--ip", "127.0.0.1"]);
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let peer = Backend::start_tls(
            "peer",
            KeptListener::bind(SocketAddr::new(local, node::free_port_on(local))).expect("bind"),
            &BackendTls {
                cert_pem: leaf.cert,
                key_pem: leaf.key,
                client_ca_pem: Some(std::fs::read_to_string(&ca.0).expect("ca.crt")),
            },
        );
        let plain = file_server([127, 0, 0, 1]);
        let other = file_server([127, 0, 0, 3]);
        let cred = d.join("egress.credentials");
        std::fs::write(&cred, "ironic:s3cret-egress\n").expect("credentials");
        let identity = node::issuer_identity(&ca, &["egress-a.ironic.test"], &[], "1h");
        let cred = node::tp(&cred);
        let (tls_port, plain_port) = (peer.addr.port(), plain.addr.port());
        let egress = Node::start(d, "egress", local, move |admin, listen| {
            format!(
                r#"{identity}
[admin]
listen = "127.0.0.1:{admin}"

[[listeners]]
name = "{EGRESS}"
listen = "{listen}"
tls = "none"
[listeners.egress]
credentials = {cred}
targets = ["127.0.0.1"]
ports = [{tls_port}]
plain_ports = [{plain_port}]
others = "relay"
"#
            )
        });
        Self {
            _dir: dir,
            egress,
            peer,
            plain,
            other,
        }
    }

    /// `GET http://<addr>/x` through the egress with the credentials, a field of the client's
    /// own (`X-Request-Id`) and every forged spelling, on a connection of its own; the status.
    fn send_forged(&self, addr: SocketAddr) -> u16 {
        let mut c = HttpConn::tcp(self.egress.listen).expect("connect");
        let forged: String = FORGED
            .iter()
            .map(|(n, v)| format!("{n}: {v}\r\n"))
            .collect();
        let raw = format!(
            "GET http://{addr}/x HTTP/1.1\r\nHost: {addr}\r\nProxy-Authorization: {BASIC}\r\n\
             X-Request-Id: kept\r\n{forged}\r\n"
        );
        c.send(raw.as_bytes()).expect("send");
        c.read_response().expect("an answer").status
    }

    fn count(&self, outcome: &str) -> f64 {
        self.egress.metric(
            "ironic_proxy_egress_requests_total",
            &[("listener", EGRESS), ("outcome", outcome)],
        )
    }
}

/// The one request a peer received kept the client's own field and lost every forged one.
fn assert_none_forged(path: &str, hits: &[Vec<(String, String)>]) {
    assert_eq!(hits.len(), 1, "{path}: one request reached the peer");
    let fields = &hits[0];
    assert_eq!(
        header(fields, "x-request-id"),
        Some("kept"),
        "{path}: the client's other fields pass: {fields:?}"
    );
    let forged: Vec<_> = fields
        .iter()
        .filter(|(n, v)| {
            let n = n.to_ascii_lowercase();
            n == "x-forwarded-client-cert"
                || n == "forwarded"
                || n.contains('_')
                || v.contains("forged")
        })
        .collect();
    assert!(
        forged.is_empty(),
        "{path}: forged identity fields reached the peer: {forged:?}"
    );
}

#[test]
fn egress_mutual_tls_path_never_forwards_forged_identity_fields() {
    let rig = Rig::start();
    assert_eq!(rig.send_forged(rig.peer.addr), 200);
    assert_eq!(rig.count("forwarded"), 1.0, "{}", rig.egress.metrics());
    let hits = rig.peer.hits();
    assert_none_forged(
        "mutual TLS",
        &hits.iter().map(|h| h.headers.clone()).collect::<Vec<_>>(),
    );
    // The identity the peer gets is the egress's own, from its client certificate.
    let cert = hits[0]
        .client_cert
        .as_deref()
        .expect("a client certificate");
    assert!(
        node::sans(cert).contains(&"DNS:egress-a.ironic.test".to_owned()),
        "{:?}",
        node::sans(cert)
    );
}

#[test]
fn egress_plain_ports_path_never_forwards_forged_identity_fields() {
    let rig = Rig::start();
    assert_eq!(rig.send_forged(rig.plain.addr), 200);
    assert_eq!(rig.count("plain"), 1.0, "{}", rig.egress.metrics());
    let hits: Vec<_> = rig.plain.hits().into_iter().map(|h| h.headers).collect();
    assert_none_forged("plain_ports", &hits);
}

#[test]
fn egress_relay_path_never_forwards_forged_identity_fields() {
    let rig = Rig::start();
    assert_eq!(rig.send_forged(rig.other.addr), 200);
    assert_eq!(rig.count("relayed"), 1.0, "{}", rig.egress.metrics());
    let hits: Vec<_> = rig.other.hits().into_iter().map(|h| h.headers).collect();
    assert_none_forged("others = \"relay\"", &hits);
}
