//! `ironic-proxy doctor` against a real deployment on loopback: a proxy with a self-issued
//! identity exported to a directory, a local upstream on a unix socket, and TLS peers found
//! through a real DNS server (dnsmasq). A healthy mesh passes every check (exit 0); each fault an
//! operator meets in active/active Ironic gives its exact verdict line and exit 1: a peer whose
//! certificate lacks the IP dialled, an expired CA in the trust bundle, a peer that is down, DNS
//! that does not answer, exported files older than the live identity, the local socket missing.

use crate::support;
use crate::support::{backend, dnsmasq, node};

use backend::{bind_same_port, ip, Backend, BackendTls, HEALTH_PATH};
use dnsmasq::Dnsmasq;
use node::{tp, Node};
use std::net::{IpAddr, UdpSocket};
use std::path::PathBuf;

/// What to break.
#[derive(Default, Clone, Copy)]
struct Faults {
    /// The second peer's certificate names another IP.
    misnamed_peer: bool,
    /// The second peer is not running (its DNS record stays).
    peer_down: bool,
    /// The trust bundle also holds a CA that expired.
    expired_ca: bool,
    /// `[dns] servers` names a server that never answers.
    silent_dns: bool,
    /// The local upstream's socket does not exist.
    local_missing: bool,
}

struct Mesh {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    proxy: Node,
    port: u16,
    peers: [IpAddr; 2],
    _backends: Vec<Backend>,
    _dns: Option<Dnsmasq>,
    _silent: Option<UdpSocket>,
    _local: Option<support::Upstream>,
}

impl Mesh {
    /// `net` picks the 127.0.<net>.x addresses of the peers, distinct per test.
    fn start(net: u8, f: Faults) -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let d = tmp.path().to_owned();
        let ca = node::ca_init(&d.join("ca"), &[]);
        let ca_pem = std::fs::read_to_string(&ca.0).expect("ca.crt");
        let peers = [ip(net, 1), ip(net, 2)];
        let listeners = bind_same_port(&peers);
        let port = listeners[0].local_addr().expect("address").port();
        let mut backends = Vec::new();
        for (i, l) in listeners.into_iter().enumerate() {
            if i == 1 && f.peer_down {
                // Refused from now on; the port stays reserved for this process (no one else
                // binds it, the kernel never picks it).
                drop(l);
                continue;
            }
            let named = if i == 1 && f.misnamed_peer {
                format!("127.0.{net}.99")
            } else {
                peers[i].to_string()
            };
            let pem = node::cert_issue(&ca, &d.join(format!("peer{i}")), &["--ip", &named]);
            let tls = BackendTls {
                cert_pem: pem.cert,
                key_pem: pem.key,
                client_ca_pem: Some(ca_pem.clone()),
            };
            backends.push(Backend::start_tls(&format!("peer{i}"), l, &tls));
        }
        let (dns, silent, dns_addr) = if f.silent_dns {
            let s = UdpSocket::bind("127.0.0.1:0").expect("bind a silent DNS socket");
            let a = s.local_addr().expect("address");
            (None, Some(s), a)
        } else {
            let mut dns = Dnsmasq::start("metal3.svc", 5);
            let records: Vec<String> = peers.iter().map(ToString::to_string).collect();
            let records: Vec<(&str, &str)> = records
                .iter()
                .map(|a| (a.as_str(), "ironic.metal3.svc"))
                .collect();
            dns.set_hosts(&records);
            let a = dns.addr();
            (Some(dns), None, a)
        };
        let mut trust = ca_pem;
        if f.expired_ca {
            trust.push_str(&expired_ca_pem());
        }
        std::fs::write(d.join("trust.crt"), trust).expect("write trust");
        let sock = d.join("ironic.sock");
        let local = (!f.local_missing).then(|| support::Upstream::start(&sock));
        let identity = format!(
            "[identity]\ntrust = {}\nissuer_cert = {}\nissuer_key = {}\n\
             dns_names = [\"localhost\"]\nip_addresses = [\"127.0.0.1\"]\nvalidity = \"1h\"\n\
             export_dir = {}\n",
            tp(&d.join("trust.crt")),
            tp(&ca.0),
            tp(&ca.1),
            tp(&d.join("export"))
        );
        let local_addr = node::toml_str(&format!("unix:{}", sock.display()));
        let render = move |admin: u16, listen: std::net::SocketAddr| {
            format!(
                r#"{identity}
[admin]
listen = "127.0.0.1:{admin}"

[dns]
servers = ["{dns_addr}"]
refresh = "1s"

[[listeners]]
name = "api"
listen = "{listen}"
tls = "server"
[listeners.upstream]
local = {local_addr}
dns = "ironic.metal3.svc:{port}"
tls = true
health = {{ path = "{HEALTH_PATH}", interval = "500ms" }}
"#
            )
        };
        let proxy = if f.local_missing || f.silent_dns {
            // Not ready by design in some of these: only wait for the process to serve.
            let n = Node::spawn(&d, "doctored", IpAddr::from([127, 0, 0, 1]), render);
            support::poll_until(std::time::Duration::from_secs(10), || {
                n.admin_get("/healthz").ok().filter(|r| r.status == 200)
            })
            .expect("the proxy serves /healthz");
            n
        } else {
            Node::start(&d, "doctored", IpAddr::from([127, 0, 0, 1]), render)
        };
        Self {
            _dir: tmp,
            dir: d,
            proxy,
            port,
            peers,
            _backends: backends,
            _dns: dns,
            _silent: silent,
            _local: local,
        }
    }

    fn doctor(&self, extra: &[&str]) -> support::Output {
        let config = self.proxy.config.display().to_string();
        let mut args = vec!["doctor", "--config", &config];
        args.extend_from_slice(extra);
        let out = node::cli(&args, &[]);
        eprintln!("doctor exit {:?}:\n{}{}", out.code, out.stdout, out.stderr);
        out
    }

    fn peer(&self, i: usize) -> String {
        format!("upstream[api].peer[{}:{}]", self.peers[i], self.port)
    }
}

/// A CA certificate whose validity ended a year ago.
fn expired_ca_pem() -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "retired ironic CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.not_before = time::OffsetDateTime::from_unix_timestamp(1_704_067_200).expect("2024");
    params.not_after = time::OffsetDateTime::from_unix_timestamp(1_735_689_600).expect("2025");
    let key = rcgen::KeyPair::generate().expect("key");
    params.self_signed(&key).expect("self-sign").pem()
}

/// `line`, a FAIL line without its link, is in the output, ending with the link to its row of
/// docs/troubleshoot.md, which exists.
fn has_line(out: &support::Output, line: &str) {
    let name = line["FAIL ".len()..]
        .split_once(": ")
        .expect("FAIL name: detail")
        .0;
    // The name without its bracketed parts (listener, peer address, index).
    let mut bare = String::new();
    let mut depth = 0;
    for c in name.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            c if depth == 0 => bare.push(if c == '.' || c == '_' { '-' } else { c }),
            _ => {}
        }
    }
    let each = if name.ends_with(']') { "-each" } else { "" };
    let anchor = format!("doctor-{bare}{each}");
    let full = format!("{line} (see docs/troubleshoot.md#{anchor})");
    assert!(
        out.stdout.lines().any(|l| l == full),
        "expected the line\n  {full}\nin\n{}",
        out.stdout
    );
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/troubleshoot.md"))
        .expect("troubleshoot.md");
    assert!(
        doc.contains(&format!("id=\"{anchor}\"")),
        "no row #{anchor} in troubleshoot.md"
    );
    assert_eq!(out.code, Some(1), "a failed check exits 1");
}

#[test]
fn a_healthy_mesh_passes_every_check() {
    let m = Mesh::start(51, Faults::default());
    let out = m.doctor(&[]);
    assert_eq!(out.code, Some(0), "{}", out.stdout);
    for want in [
        "PASS identity.sans: covers every configured name: DNS:localhost, IP:127.0.0.1",
        "PASS identity.chain: chains to identity.trust",
        "PASS trust[0]: CN=ironic-proxy CA",
        "PASS export: ",
        &format!(
            "PASS upstream[api].local: unix:{} accepts connections",
            m.dir.join("ironic.sock").display()
        ),
        &format!("{}.name: the certificate covers {}", m.peer(0), m.peers[0]),
        &format!("{}.name: the certificate covers {}", m.peer(1), m.peers[1]),
        &format!("{}.http: GET /health answered 200", m.peer(1)),
        &format!("{}.clock: the peer's clock is 0s", m.peer(0)),
        "PASS admin: ",
    ] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.starts_with(want) || l.contains(want)),
            "{want:?} in\n{}",
            out.stdout
        );
    }
    assert!(!out.stdout.contains("FAIL"), "{}", out.stdout);
    // --json: one object, the same checks.
    let json = m.doctor(&["--json"]);
    assert_eq!(json.code, Some(0));
    assert!(
        json.stdout
            .starts_with("{\"ok\":true,\"checks\":[{\"check\":\"identity.live\""),
        "{}",
        json.stdout
    );
    let lines = out.stdout.lines().count() - 1;
    assert_eq!(json.stdout.matches("\"verdict\":\"pass\"").count(), lines);
}

#[test]
fn a_peer_whose_certificate_lacks_the_dialled_ip() {
    let m = Mesh::start(
        52,
        Faults {
            misnamed_peer: true,
            ..Faults::default()
        },
    );
    let out = m.doctor(&[]);
    has_line(
        &out,
        &format!(
            "FAIL {}.name: the certificate does not cover {}, the address dialled (it names IP:127.0.52.99)",
            m.peer(1),
            m.peers[1]
        ),
    );
}

#[test]
fn an_expired_trust_bundle_entry() {
    let m = Mesh::start(
        53,
        Faults {
            expired_ca: true,
            ..Faults::default()
        },
    );
    let out = m.doctor(&[]);
    has_line(
        &out,
        "FAIL trust[1]: CN=retired ironic CA expired at 2025-01-01T00:00:00Z",
    );
}

#[test]
fn a_peer_that_is_down() {
    let m = Mesh::start(
        54,
        Faults {
            peer_down: true,
            ..Faults::default()
        },
    );
    let out = m.doctor(&[]);
    has_line(
        &out,
        &format!("FAIL {}.tcp: Connection refused (os error 111)", m.peer(1)),
    );
}

#[test]
fn dns_that_does_not_answer() {
    let m = Mesh::start(
        55,
        Faults {
            silent_dns: true,
            ..Faults::default()
        },
    );
    let out = m.doctor(&[]);
    let prefix = format!(
        "FAIL upstream[api].dns: ironic.metal3.svc:{}: no answer from DNS: ",
        m.port
    );
    assert!(
        out.stdout.lines().any(|l| l.starts_with(&prefix)),
        "{prefix:?} in\n{}",
        out.stdout
    );
    assert_eq!(out.code, Some(1));
}

#[test]
fn exported_files_older_than_the_live_identity() {
    let m = Mesh::start(56, Faults::default());
    let export = m.dir.join("export").join("tls.crt");
    let live_pem = std::fs::read_to_string(&export).expect("exported tls.crt");
    let live = node::pem_der(&live_pem);
    // What a failed export leaves behind: the files of an earlier certificate.
    let old = support::pki::Ca::new("ironic-proxy CA").server_leaf();
    std::fs::write(&export, &old.cert_pem).expect("overwrite the exported tls.crt");
    let hex = |der: &[u8]| node::serial(der).replace(':', "");
    let (live_serial, old_serial) = (hex(&live), hex(&old.der));
    let issued = |der: &[u8]| {
        let (_, c) = x509_parser::parse_x509_certificate(der).expect("parse");
        let t = c.validity().not_before.to_datetime();
        t.format(&time::format_description::well_known::Rfc3339)
            .expect("format")
    };
    let out = m.doctor(&[]);
    has_line(
        &out,
        &format!(
            "FAIL export: {} (serial {old_serial}, issued {}) is older than the live certificate \
             (serial {live_serial}, issued {})",
            export.display(),
            issued(&old.der),
            issued(&live)
        ),
    );
}

#[test]
fn the_local_socket_missing() {
    let m = Mesh::start(
        57,
        Faults {
            local_missing: true,
            ..Faults::default()
        },
    );
    let out = m.doctor(&[]);
    has_line(
        &out,
        &format!(
            "FAIL upstream[api].local: unix:{}: cannot connect: No such file or directory (os error 2)",
            m.dir.join("ironic.sock").display()
        ),
    );
}

/// Scale-out (issue 43): a fourth node whose pod IP is outside the CA's `--permit-ip` and the
/// peer CIDRs. `check --profile sidecar` refuses it, one line per cause naming the variable;
/// `doctor` says the same in its `scale.*` lines. With the address inside, `check` passes.
#[test]
fn check_and_doctor_name_a_node_outside_the_ca_and_the_peer_cidrs() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let d = tmp.path();
    node::ca_init(
        &d.join("ca"),
        &["--permit-ip", "127.0.0.0/30", "--permit-dns", "metal3.svc"],
    );
    std::fs::write(d.join("egress"), "ironic-rpc:secret\n").expect("write credentials");
    // A DNS server that answers (NXDOMAIN for the API's service name): `doctor` waits for its
    // answer, where a silent address cost it a query timeout per address family and, on a
    // loaded machine, the whole run past the CLI's bound.
    let dns = Dnsmasq::start("cluster.local", 5);
    let s = |p: PathBuf| p.display().to_string();
    let base = [
        ("POD_NAME", "ironic-3".to_owned()),
        ("POD_NAMESPACE", "metal3".to_owned()),
        ("IRONIC_PROXY_PEER_CIDRS", "127.0.0.0/30".to_owned()),
        ("IRONIC_PROXY_TRUST", s(d.join("ca").join("ca.crt"))),
        ("IRONIC_PROXY_ISSUER_DIR", s(d.join("ca"))),
        ("IRONIC_PROXY_EXPORT_DIR", s(d.join("export"))),
        ("IRONIC_PROXY_HTPASSWD", "none".to_owned()),
        ("IRONIC_PROXY_EGRESS_CREDENTIALS", s(d.join("egress"))),
        ("IRONIC_PROXY_DNS_SERVERS", dns.addr().to_string()),
    ];
    let with_ip = |ip: &'static str| {
        let mut e: Vec<(&str, &str)> = base.iter().map(|(k, v)| (*k, v.as_str())).collect();
        e.push(("POD_IPS", ip));
        e
    };
    let o = node::cli(&["check", "--profile", "sidecar"], &with_ip("127.0.0.9"));
    assert_eq!(o.code, Some(1), "{o:?}");
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(
        lines,
        [
            "ironic-proxy: scale-out: ca: IP:127.0.0.9 (from POD_IPS) outside the CA's name \
             constraints (permitted DNS:metal3.svc, IP:127.0.0.0/30): no peer accepts a \
             certificate for it and the CA refuses to sign one; create a CA whose --permit-ip / \
             --permit-dns cover this node and roll it out, or give this node an address inside \
             them",
            "ironic-proxy: scale-out: egress_targets: 127.0.0.9 (from POD_IPS) outside \
             IRONIC_PROXY_PEER_CIDRS=127.0.0.0/30: the peers' egress refuses JSON-RPC calls to \
             this conductor (403 target_refused); add this node's network on every node",
        ],
        "{o:?}"
    );
    let doctor = node::cli(&["doctor", "--profile", "sidecar"], &with_ip("127.0.0.9"));
    assert_eq!(doctor.code, Some(1), "{doctor:?}");
    for prefix in [
        "FAIL scale.ca: IP:127.0.0.9 (from POD_IPS) outside the CA's name constraints",
        "FAIL scale.egress_targets: 127.0.0.9 (from POD_IPS) outside IRONIC_PROXY_PEER_CIDRS",
        "PASS scale.peer_cidrs: the peers' json-rpc listener admits our certificate",
    ] {
        assert!(
            doctor.stdout.lines().any(|l| l.starts_with(prefix)),
            "{prefix:?} in\n{}",
            doctor.stdout
        );
    }
    // The node inside both ranges: check passes.
    let fixed = node::cli(&["check", "--profile", "sidecar"], &with_ip("127.0.0.2"));
    assert!(fixed.ok(), "{fixed:?}");
}

/// `doctor --peers` (issue 43) with one sidecar whose conductor list (its local API, a recording
/// upstream standing in for Ironic: `GET /v1/conductors`, JSON-RPC answers as Ironic 39 gives
/// them) names itself, a peer from another CA, a peer whose certificate names another IP, a
/// conductor whose sidecar is down and one whose sidecar never answers. One line per peer with
/// its cause (TLS, SAN, refused, timeout); the call to its own `[DEFAULT]host` through the
/// egress passes; a dead conductor is named, not dialled; a node it still holds fails
/// `ironic.locks`.
#[test]
fn doctor_peers_calls_each_conductor_and_its_own_host_through_the_egress() {
    use crate::support::upstream::{Reply, Upstream};
    use std::sync::Arc;
    let tmp = tempfile::tempdir().expect("temp dir");
    let d = tmp.path().to_owned();
    let ca = node::ca_init(&d.join("ca"), &[]);
    let ca_pem = std::fs::read_to_string(&ca.0).expect("ca.crt");
    let other_ca = node::ca_init(&d.join("other-ca"), &[]);
    // Peers on 127.0.61.{1,2,3}, one port; the sidecar's own json-rpc listener on that port too.
    let ips = [ip(61, 1), ip(61, 2), ip(61, 3), ip(61, 4), ip(61, 5)];
    let mut listeners = bind_same_port(&ips);
    let port = listeners[0].local_addr().expect("address").port();
    let own = listeners.remove(0);
    // Bound, never accepting: the kernel completes TCP, nobody answers the TLS hello.
    let _silent = listeners.pop().expect("fifth");
    let down = listeners.pop().expect("fourth");
    let mut backends = Vec::new();
    for (i, (l, from)) in listeners.into_iter().zip([&other_ca, &ca]).enumerate() {
        let named = if i == 1 {
            "127.0.61.99".to_owned()
        } else {
            ips[i + 1].to_string()
        };
        let pem = node::cert_issue(from, &d.join(format!("peer{i}")), &["--ip", &named]);
        let tls = BackendTls {
            cert_pem: pem.cert,
            key_pem: pem.key,
            client_ca_pem: Some(ca_pem.clone()),
        };
        backends.push(Backend::start_tls(&format!("peer{i}"), l, &tls));
    }
    let conductors = format!(
        "{{\"conductors\": [{}, {{\"hostname\": \"127.0.61.9\", \"alive\": false}}]}}",
        ips.iter()
            .map(|ip| format!("{{\"hostname\": \"{ip}\", \"alive\": true}}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let ironic = Upstream::start_with(
        &d.join("ironic.sock"),
        Arc::new(move |r| {
            let body = if r.path.starts_with("/v1/conductors") {
                conductors.clone()
            } else if r.path.starts_with("/v1/nodes") {
                // One node locked by a live conductor, one by the dead one, one free.
                "{\"nodes\": [{\"uuid\": \"n1\", \"name\": \"a\", \"reservation\": \
                 \"127.0.61.2\"}, {\"uuid\": \"n2\", \"name\": \"b\", \"reservation\": \
                 \"127.0.61.9\"}, {\"uuid\": \"n3\", \"name\": null, \"reservation\": \
                 null}]}"
                    .to_owned()
            } else {
                // What Ironic 39's JSON-RPC server answers to an unknown method.
                let id = serde_json::from_slice::<serde_json::Value>(&r.body)
                    .ok()
                    .and_then(|v| v.get("id").cloned())
                    .unwrap_or_default();
                format!(
                    "{{\"jsonrpc\": \"2.0\", \"error\": {{\"code\": -32601, \"message\": \
                     \"Method x was not found\"}}, \"id\": {id}}}"
                )
            };
            Reply {
                status: 200,
                headers: vec![("content-type".into(), "application/json".into())],
                body: body.into_bytes(),
                delay: std::time::Duration::ZERO,
            }
        }),
    );
    std::fs::write(d.join("egress"), "ironic-rpc:s3cret\n").expect("credentials");
    let mut identity = node::issuer_identity(&ca, &[], &["127.0.61.1"], "1h");
    identity.push_str(&format!("export_dir = {}\n", tp(&d.join("export"))));
    let sock = node::toml_str(&format!("unix:{}", ironic.path.display()));
    let cred = tp(&d.join("egress"));
    // The sidecar binds it next: reserved for this process outside the ephemeral range.
    drop(own);
    drop(down); // refused from now on; the port stays reserved for this process
    let egress_port = node::free_port_on(IpAddr::from([127, 0, 0, 1]));
    let render = move |admin: u16, listen: std::net::SocketAddr| {
        format!(
            r#"{identity}
[admin]
listen = "127.0.0.1:{admin}"

[[listeners]]
name = "json-rpc"
listen = "127.0.61.1:{port}"
tls = "mutual"
jsonrpc = true
upstream = {sock}

[[listeners]]
name = "api"
listen = "{listen}"
tls = "server"
upstream = {sock}

[[listeners]]
name = "json-rpc-egress"
listen = "127.0.0.1:{egress_port}"
tls = "none"
jsonrpc = true
[listeners.egress]
credentials = {cred}
targets = ["127.0.61.0/24"]
ports = [{port}]
others = "relay"
"#
        )
    };
    let _proxy = Node::start(&d, "peers", IpAddr::from([127, 0, 0, 1]), render);
    let config = d.join("peers.toml").display().to_string();
    let out = node::cli(&["doctor", "--config", &config, "--peers"], &[]);
    eprintln!("{}{}", out.stdout, out.stderr);
    assert_eq!(out.code, Some(1), "{out:?}");
    let p = |i: usize| format!("peers[{}:{port}]", ips[i]);
    for prefix in [
        "PASS peers.conductors: Ironic at unix:".to_owned(),
        format!(
            "{}: mutual TLS with our certificate, JSON-RPC round trip in ",
            p(0)
        ),
        format!(
            "FAIL {}: TLS: the peer's certificate is not trusted: ",
            p(1)
        ),
        format!(
            "FAIL {}: SAN: the peer's certificate does not cover {}, the address dialled \
             (it names IP:127.0.61.99)",
            p(2),
            ips[2]
        ),
        format!("FAIL {}: refused: Connection refused (os error 111)", p(3)),
        "FAIL ironic.locks: node n2 (b) reserved by 127.0.61.9 (registered, not alive)".to_owned(),
        format!("FAIL {}: timeout: no TLS handshake within 3s", p(4)),
        format!(
            "PASS egress[json-rpc-egress].json-rpc: POST http://127.0.61.1:{port}/ through \
             127.0.0.1:{egress_port}"
        ),
    ] {
        let prefix = prefix.trim_start_matches("PASS ").to_owned();
        assert!(
            out.stdout.lines().any(|l| l.contains(&prefix)),
            "{prefix:?} in\n{}",
            out.stdout
        );
    }
    assert!(
        out.stdout.contains("live conductor(s)") && out.stdout.contains("not dialled: 127.0.61.9")
    );
    assert!(out
        .stdout
        .contains("Ironic answered: Method x was not found"));
    // others = "relay": a plain request to our own admin listener is relayed.
    assert!(
        out.stdout.lines().any(|l| {
            l.starts_with("PASS egress[json-rpc-egress].relay: GET http://127.0.0.1:")
                && l.ends_with("relayed in plain HTTP: 200")
        }),
        "{}",
        out.stdout
    );
    drop(backends);
}
