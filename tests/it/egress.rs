//! `[listeners.egress]` (issue 34): Ironic's JSON-RPC client speaks plain HTTP to its own
//! sidecar through `HTTP_PROXY`, and the sidecar originates mutual TLS to the peer with its live
//! identity. Two real proxies: the caller's egress listener, and the callee's mutual JSON-RPC
//! listener in front of a recording unix-socket upstream (the callee's Ironic). Real clients:
//! curl (`-x`, `--proxy-user`) and Python `requests` with `proxies=` (what keystoneauth's session
//! does with `HTTP_PROXY`). Every refusal is checked for its status and for nothing forwarded:
//! neither the callee's Ironic nor a listener on the refused host or port ever sees a byte.

use crate::support::files::FileServer;
use crate::support::node::{self, Node};
use crate::support::ports::KeptListener;
use crate::support::{curl, python, HttpConn, Upstream};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

const LOCALHOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
const USER: &str = "ironic";
const PASSWORD: &str = "s3cret-egress";
const EGRESS: &str = "json-rpc-egress";

/// A JSON-RPC call as Ironic's client sends it.
const CALL: &str = r#"{"jsonrpc": "2.0", "method": "do_node_deploy", "params": {"node_id": "n1", "context": {}}, "id": "1"}"#;

/// The caller's config: an issuer-mode identity (`egress-a.ironic.test`) valid `validity`,
/// renewing `renew_before` its end, and one egress listener that may dial `localhost` and
/// 127.0.0.1 on `port` only.
fn egress_config(
    ca: &(std::path::PathBuf, std::path::PathBuf),
    credentials: &Path,
    port: u16,
    validity: &str,
    renew_before: &str,
) -> impl Fn(u16, SocketAddr) -> String {
    let mut identity = node::issuer_identity(ca, &["egress-a.ironic.test"], &[], validity);
    identity.push_str(&format!("renew_before = \"{renew_before}\"\n"));
    let cred = node::tp(credentials);
    move |admin, listen| {
        format!(
            r#"{identity}
[admin]
listen = "127.0.0.1:{admin}"

[[listeners]]
name = "{EGRESS}"
listen = "{listen}"
tls = "none"
jsonrpc = true
[listeners.egress]
credentials = {cred}
targets = ["localhost", "127.0.0.1"]
ports = [{port}]
"#
        )
    }
}

/// The callee (a peer sidecar: mutual, `jsonrpc = true`, certificate for localhost and
/// 127.0.0.1) in front of its Ironic, and the caller with its egress listener.
struct Rig {
    dir: tempfile::TempDir,
    ironic: Upstream,
    peer: Node,
    egress: Node,
}

impl Rig {
    fn start(validity: &str, renew_before: &str, peer_idle: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let ca = node::ca_init(&d.join("ca"), &[]);
        let ironic = Upstream::start(&d.join("rpc.sock"));
        let peer_id = node::issuer_identity(&ca, &["localhost"], &["127.0.0.1"], "1h");
        let extra = format!("jsonrpc = true\n\n[limits]\nidle_timeout = \"{peer_idle}\"\n");
        let peer = Node::start(
            d,
            "peer",
            LOCALHOST,
            node::issuer_node(peer_id, None, &ironic.path, extra),
        );
        let cred = d.join("egress.credentials");
        std::fs::write(&cred, format!("{USER}:{PASSWORD}\n")).expect("credentials");
        let egress = Node::start(
            d,
            "egress",
            LOCALHOST,
            egress_config(&ca, &cred, peer.listen.port(), validity, renew_before),
        );
        Self {
            dir,
            ironic,
            peer,
            egress,
        }
    }

    fn proxy(&self) -> String {
        format!("http://{}", self.egress.listen)
    }

    /// curl through the egress listener: `POST target` with the JSON-RPC call; returns
    /// (status, response headers and body as curl printed them).
    fn curl(&self, target: &str, extra: &[&str]) -> (u16, String) {
        let proxy = self.proxy();
        let mut args = vec![
            "-i",
            "-x",
            &proxy,
            "-H",
            "content-type: application/json",
            "--data",
            CALL,
            "-w",
            "\n%{http_code}",
        ];
        args.extend_from_slice(extra);
        args.push(target);
        let out = curl(&args);
        let text = out.stdout.trim_end().to_owned();
        let status = text
            .rsplit('\n')
            .next()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("curl printed no status: {out:?}"));
        (status, text)
    }

    fn egress_count(&self, outcome: &str) -> f64 {
        self.egress.metric(
            "ironic_proxy_egress_requests_total",
            &[("listener", EGRESS), ("outcome", outcome)],
        )
    }
}

fn creds() -> String {
    format!("{USER}:{PASSWORD}")
}

/// A listener that counts the connections it is offered, for "nothing was dialled".
struct Catcher(TcpListener);

impl Catcher {
    fn on(ip: [u8; 4]) -> Self {
        let l = TcpListener::bind(SocketAddr::from((ip, 0))).expect("bind catcher");
        l.set_nonblocking(true).expect("nonblocking");
        Self(l)
    }

    fn port(&self) -> u16 {
        self.0.local_addr().expect("address").port()
    }

    fn accepted(&self) -> usize {
        std::iter::from_fn(|| self.0.accept().ok()).count()
    }
}

#[test]
fn egress_forwards_json_rpc_over_mutual_tls_and_refuses_everything_else_unforwarded() {
    let rig = Rig::start("1h", "20m", "10s");
    let port = rig.peer.listen.port();
    let target = format!("http://localhost:{port}/");

    // curl, absolute form through the proxy.
    let (status, text) = rig.curl(&target, &["--proxy-user", &creds()]);
    assert_eq!(status, 200, "{text}\n{:?}", rig.egress.logs());
    let seen = rig.ironic.wait_for(1, Duration::from_secs(5));
    let r = &seen[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/"));
    assert_eq!(r.header("host"), Some(format!("localhost:{port}").as_str()));
    assert_eq!(r.body, CALL.as_bytes());
    assert!(r.header("proxy-authorization").is_none(), "{:?}", r.headers);
    assert!(r.header("proxy-connection").is_none(), "{:?}", r.headers);
    // The peer verified the egress's client certificate: its identity reached its Ironic.
    let xfcc = r.header("x-forwarded-client-cert").unwrap_or_default();
    assert!(xfcc.contains("egress-a.ironic.test"), "{xfcc}");

    // Python requests with proxies= (keystoneauth's session does the same from HTTP_PROXY):
    // 20 calls on one session, to the name and to the IP.
    const CLIENT: &str = r#"
import sys, time, requests
proxy, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = requests.Session()
s.proxies = {"http": proxy}
times = []
for i in range(n):
    t = time.monotonic()
    r = s.post(url, json={"jsonrpc": "2.0", "method": "validate_driver_interfaces", "params": {}, "id": str(i)}, timeout=30)
    times.append(time.monotonic() - t)
    print(r.status_code)
print("fastest-keep-alive-ms", min(times[2:]) * 1000)
"#;
    let with_creds = format!("http://{USER}:{PASSWORD}@{}", rig.egress.listen);
    for url in [target.clone(), format!("http://127.0.0.1:{port}/")] {
        let out = python(CLIENT, &[&with_creds, &url, "20"]);
        assert!(out.ok(), "{out:?}");
        assert_eq!(
            out.stdout.lines().filter(|l| *l == "200").count(),
            20,
            "{out:?}"
        );
        // urllib3's proxy connections have no TCP_NODELAY: without the egress's quick ACKs
        // every keep-alive call after the second waited for a delayed ACK (Linux: at least
        // 40 ms, TCP_DELACK_MIN). So even the fastest of 18 such calls took 40 ms; with quick
        // ACKs most take a few. The fastest one is asserted, not a mean, so that a loaded
        // machine slowing some calls cannot fail the test.
        let ms: f64 = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("fastest-keep-alive-ms "))
            .and_then(|v| v.trim().parse().ok())
            .expect("timing printed");
        eprintln!("Python requests through egress, fastest keep-alive call: {ms:.1} ms");
        assert!(
            ms < 40.0,
            "{ms} ms for the fastest keep-alive call: delayed ACKs"
        );
    }
    let forwarded = 41.0;
    assert_eq!(rig.ironic.requests().len(), 41);
    // Counted at both ends: the caller's egress, the callee's JSON-RPC listener.
    assert_eq!(rig.egress_count("forwarded"), forwarded);
    let callee = rig.peer.metric(
        "ironic_proxy_jsonrpc_calls_total",
        &[("listener", "json-rpc")],
    );
    assert_eq!(callee, forwarded);
    let caller_rpc = rig.egress.metric(
        "ironic_proxy_jsonrpc_calls_total",
        &[
            ("listener", EGRESS),
            ("method", "validate_driver_interfaces"),
        ],
    );
    assert_eq!(caller_rpc, 40.0);
    assert!(rig
        .egress
        .wait_log(Duration::from_secs(5), |l| l.contains("do_node_deploy"))
        .is_some());
    // Keep-alive towards the peer: 41 calls, a few TLS connections at most.
    let conns = rig.ironic.connections();
    eprintln!("41 calls through egress; the callee's Ironic saw {conns} connection(s)");

    // Refusals: right status, nothing forwarded anywhere.
    let other_host = Catcher::on([127, 0, 0, 2]);
    let other_port = Catcher::on([127, 0, 0, 1]);
    let before = rig.ironic.requests().len();
    let (s, text) = rig.curl(&target, &[]);
    assert_eq!(s, 407, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("proxy-authenticate: basic realm=\"ironic-proxy egress\""),
        "{text}"
    );
    let (s, text) = rig.curl(&target, &["--proxy-user", "ironic:wrong"]);
    assert_eq!(s, 407, "{text}");
    let (s, text) = rig.curl(&target, &["--proxy-user", "nobody:s3cret-egress"]);
    assert_eq!(s, 407, "{text}");
    let not_peer = format!("http://127.0.0.2:{}/", other_host.port());
    let (s, text) = rig.curl(&not_peer, &["--proxy-user", &creds()]);
    assert_eq!(s, 403, "{text}");
    let not_port = format!("http://localhost:{}/", other_port.port());
    let (s, text) = rig.curl(&not_port, &["--proxy-user", &creds()]);
    assert_eq!(s, 403, "{text}");
    let basic = format!(
        "Basic {}",
        node_b64(format!("{USER}:{PASSWORD}").as_bytes())
    );
    let mut c = HttpConn::tcp(rig.egress.listen).expect("connect");
    let connect = format!(
        "CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost:{port}\r\nProxy-Authorization: {basic}\r\n\r\n"
    );
    c.send(connect.as_bytes()).expect("send");
    assert_eq!(c.read_response().expect("answer").status, 405);
    let mut c = HttpConn::tcp(rig.egress.listen).expect("connect");
    let origin = format!(
        "POST / HTTP/1.1\r\nHost: localhost:{port}\r\nProxy-Authorization: {basic}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{CALL}",
        CALL.len()
    );
    c.send(origin.as_bytes()).expect("send");
    assert_eq!(c.read_response().expect("answer").status, 400);
    // https:// would be a tunnel (CONNECT) or TLS in the proxy's own name: neither.
    let mut c = HttpConn::tcp(rig.egress.listen).expect("connect");
    let https = format!(
        "GET https://localhost:{port}/ HTTP/1.1\r\nHost: localhost:{port}\r\nProxy-Authorization: {basic}\r\n\r\n"
    );
    c.send(https.as_bytes()).expect("send");
    assert_eq!(c.read_response().expect("answer").status, 400);

    // A barrier instead of a wait: one allowed call through the same egress, awaited at the
    // peer's Ironic. A refused request that had been sent on would have arrived before it.
    let (s, text) = rig.curl(&target, &["--proxy-user", &creds()]);
    assert_eq!(s, 200, "{text}");
    // Keep-Alive is hop-by-hop: neither the peer's nor one of the egress's own reaches Ironic's
    // client (the peer's sidecar sends one; a forward proxy's client may be a proxy too).
    assert!(
        !text.to_ascii_lowercase().contains("\nkeep-alive:"),
        "a Keep-Alive field in the answer: {text}"
    );
    let seen = rig.ironic.wait_for(before + 1, Duration::from_secs(5));
    assert_eq!(
        seen.len(),
        before + 1,
        "nothing but the barrier call reached the peer's Ironic"
    );
    assert_eq!(
        other_host.accepted(),
        0,
        "the refused host was never dialled"
    );
    assert_eq!(
        other_port.accepted(),
        0,
        "the refused port was never dialled"
    );
    for (outcome, n) in [
        ("no_credentials", 1.0),
        ("bad_credentials", 2.0),
        ("target_refused", 1.0),
        ("port_refused", 1.0),
        ("connect_refused", 1.0),
        ("origin_form", 2.0),
        ("forwarded", forwarded + 1.0),
    ] {
        assert_eq!(
            rig.egress_count(outcome),
            n,
            "{outcome}\n{}",
            rig.egress.metrics()
        );
    }
    drop(rig.dir);
}

/// `plain_ports` (the image server that shares a peer's IP): curl through the egress, as
/// Python's requests does when `no_proxy` cannot exclude one port of an IP, reaches a plain
/// HTTP file server as a plain request, without `Proxy-Authorization`; the same port on a host
/// outside `targets` is 403 and never dialled; credentials are still required.
#[test]
fn egress_relays_plain_ports_in_plain_http_to_targets_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let ca = node::ca_init(&d.join("ca"), &[]);
    let httpd = FileServer::start(
        KeptListener::bind((LOCALHOST, crate::support::free_port()).into()).expect("bind"),
    );
    let image = b"deploy ramdisk bytes\n".repeat(1000);
    httpd.put(
        "/images/ipa.initramfs",
        &image,
        std::time::SystemTime::now(),
    );
    let other_host = Catcher::on([127, 0, 0, 2]);
    let cred = d.join("egress.credentials");
    std::fs::write(&cred, format!("{USER}:{PASSWORD}\n")).expect("credentials");
    // `ports` names a port nothing listens on: only the plain ports are used here.
    let base = egress_config(&ca, &cred, 1, "1h", "20m");
    let plain = [httpd.addr.port(), other_host.port()];
    let egress = Node::start(d, "egress", LOCALHOST, move |admin, listen| {
        format!(
            "{}plain_ports = [{}, {}]\n",
            base(admin, listen),
            plain[0],
            plain[1]
        )
    });
    let proxy = format!("http://{}", egress.listen);
    let get = |target: &str, auth: &[&str]| {
        let mut args = vec!["-x", &proxy, "-w", "\n%{http_code}"];
        args.extend_from_slice(auth);
        args.push(target);
        let out = curl(&args);
        let text = out.stdout;
        let (body, status) = text.rsplit_once('\n').expect("status line");
        (
            status.trim().parse::<u16>().expect("status"),
            body.to_owned(),
        )
    };
    let url = format!(
        "http://127.0.0.1:{}/images/ipa.initramfs",
        httpd.addr.port()
    );
    let head = d.join("answer-head");
    let (status, body) = get(
        &url,
        &["--proxy-user", &creds(), "-D", head.to_str().expect("path")],
    );
    assert_eq!(status, 200, "{body:.200}");
    assert_eq!(body.as_bytes(), &image[..]);
    // The plain path: no Keep-Alive field in the answer (hop-by-hop; see the TLS path's test).
    let head = std::fs::read_to_string(&head).expect("answer head");
    assert!(
        !head.to_ascii_lowercase().contains("keep-alive:"),
        "a Keep-Alive field in the answer: {head}"
    );
    let hits = httpd.hits();
    assert_eq!(
        hits.len(),
        1,
        "one plain HTTP request parsed by the file server"
    );
    let hit = &hits[0];
    assert_eq!(hit.header("proxy-authorization"), None, "{:?}", hit.headers);
    assert_eq!(
        hit.header("host"),
        Some(format!("127.0.0.1:{}", httpd.addr.port()).as_str())
    );
    assert_eq!(
        egress.metric(
            "ironic_proxy_egress_requests_total",
            &[("listener", EGRESS), ("outcome", "plain")],
        ),
        1.0
    );

    // No credentials: 407, nothing relayed.
    let (status, _) = get(&url, &[]);
    assert_eq!(status, 407);
    // A plain port on a host outside targets: 403, never dialled.
    let off = format!(
        "http://127.0.0.2:{}/images/ipa.initramfs",
        other_host.port()
    );
    let (status, body) = get(&off, &["--proxy-user", &creds()]);
    assert_eq!(status, 403, "{body}");
    // A barrier instead of a wait: the allowed download once more, answered by the file
    // server. A refused request that had been sent on would have arrived before it.
    let (status, body) = get(&url, &["--proxy-user", &creds()]);
    assert_eq!(status, 200, "{body:.200}");
    assert_eq!(
        other_host.accepted(),
        0,
        "the refused host was never dialled"
    );
    assert_eq!(
        httpd.hits().len(),
        2,
        "the refused requests reached no server (two downloads did)"
    );
    for (outcome, n) in [
        ("target_refused", 1.0),
        ("no_credentials", 1.0),
        ("plain", 2.0),
    ] {
        let got = egress.metric(
            "ironic_proxy_egress_requests_total",
            &[("listener", EGRESS), ("outcome", outcome)],
        );
        assert_eq!(got, n, "{outcome}\n{}", egress.metrics());
    }
}

/// Standard base64 without a crate: what a client puts in `Proxy-Authorization`.
fn node_b64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut o = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                o.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                o.push('=');
            }
        }
    }
    o
}

#[test]
fn egress_new_connections_during_identity_rotation_all_succeed() {
    // The caller renews about every 1.5 s; the callee closes connections idle for 200 ms, so
    // calls 300 ms apart each need a new TLS connection from the egress, with whatever
    // certificate is current at that moment.
    let rig = Rig::start("3s", "1500ms", "200ms");
    let port = rig.peer.listen.port();
    let target = format!("http://localhost:{port}/");
    let start = Instant::now();
    let mut statuses = Vec::new();
    while start.elapsed() < Duration::from_secs(12) {
        statuses.push(rig.curl(&target, &["--proxy-user", &creds()]).0);
        std::thread::sleep(Duration::from_millis(300));
    }
    let renewals = rig
        .egress
        .metric("ironic_proxy_certificate_renewals_total", &[]);
    let seen = rig.ironic.requests();
    let mut certs: Vec<&str> = seen
        .iter()
        .filter_map(|r| r.header("x-forwarded-client-cert"))
        .collect();
    certs.sort_unstable();
    certs.dedup();
    let conns = rig.ironic.connections();
    eprintln!(
        "{} calls during {renewals} renewals: {} answered 200; the callee saw {} distinct client \
         certificates; its Ironic {conns} connections",
        statuses.len(),
        statuses.iter().filter(|s| **s == 200).count(),
        certs.len()
    );
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(seen.len(), statuses.len());
    assert!(renewals >= 5.0, "renewals: {renewals}");
    assert!(
        certs.len() >= 5,
        "client certificates seen: {}",
        certs.len()
    );
    assert_eq!(rig.egress_count("peer_failed"), 0.0);
}

/// `others = "relay"` (issue 42): curl through the egress reaches plain HTTP servers that are
/// neither a TLS target nor a plain port (a host outside `targets`, and IPv6) as a direct
/// request would: origin form, no `Proxy-Authorization`, no `X-Forwarded-*` of ours, `Via`
/// added; counted `relayed`. A port of `ports` on a host outside `targets` stays 403 and is
/// never dialled, and so does the egress's own address.
#[test]
fn egress_relays_other_plain_http_and_keeps_tls_ports_to_targets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let ca = node::ca_init(&d.join("ca"), &[]);
    let v6 = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
    let servers: Vec<FileServer> = [IpAddr::V4([127, 0, 0, 3].into()), v6]
        .into_iter()
        .map(|ip| {
            let addr = SocketAddr::new(ip, node::free_port_on(ip));
            let s = FileServer::start(KeptListener::bind(addr).expect("bind"));
            s.put(
                "/v1/commands",
                b"{\"ok\": true}\n",
                std::time::SystemTime::now(),
            );
            s
        })
        .collect();
    let tls_port = Catcher::on([127, 0, 0, 3]);
    let cred = d.join("egress.credentials");
    std::fs::write(&cred, format!("{USER}:{PASSWORD}\n")).expect("credentials");
    let base = egress_config(&ca, &cred, tls_port.port(), "1h", "20m");
    let egress = Node::start(d, "egress", LOCALHOST, move |admin, listen| {
        format!("{}others = \"relay\"\n", base(admin, listen))
    });
    let proxy = format!("http://{}", egress.listen);
    let get = |target: &str| {
        let out = curl(&[
            "-x",
            &proxy,
            "--proxy-user",
            &creds(),
            "-H",
            "x-request-id: r1",
            "-w",
            "\n%{http_code}",
            target,
        ]);
        let (body, status) = out.stdout.rsplit_once('\n').expect("status line");
        (
            status.trim().parse::<u16>().expect("status"),
            body.to_owned(),
        )
    };
    for s in &servers {
        let url = match s.addr {
            SocketAddr::V6(a) => format!("http://[{}]:{}/v1/commands", a.ip(), a.port()),
            SocketAddr::V4(a) => format!("http://{a}/v1/commands"),
        };
        let (status, body) = get(&url);
        assert_eq!((status, body.as_str()), (200, "{\"ok\": true}\n"), "{url}");
        let hits = s.hits();
        assert_eq!(hits.len(), 1, "{url}");
        let hit = &hits[0];
        assert_eq!(
            hit.header("via"),
            Some("1.1 ironic-proxy"),
            "{:?}",
            hit.headers
        );
        assert_eq!(hit.header("x-request-id"), Some("r1"));
        for absent in ["proxy-authorization", "proxy-connection", "x-forwarded-for"] {
            assert_eq!(hit.header(absent), None, "{absent}: {:?}", hit.headers);
        }
    }
    let count = |outcome| {
        egress.metric(
            "ironic_proxy_egress_requests_total",
            &[("listener", EGRESS), ("outcome", outcome)],
        )
    };
    assert_eq!(count("relayed"), 2.0, "{}", egress.metrics());
    // The TLS port on a host outside targets, and the egress itself: 403, never dialled.
    let (status, _) = get(&format!("http://127.0.0.3:{}/", tls_port.port()));
    assert_eq!(status, 403);
    let (status, _) = get(&format!("http://{}/", egress.listen));
    assert_eq!(status, 403);
    // Past an answer the catcher would have accepted a connection by now; it took none.
    assert_eq!(count("target_refused"), 2.0, "{}", egress.metrics());
    assert_eq!(
        tls_port.accepted(),
        0,
        "the refused TLS port was never dialled"
    );
    assert_eq!(count("relayed"), 2.0);
}
