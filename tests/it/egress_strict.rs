//! The egress's request target and `Host` are strict (issue 42): a port is 1-65535 in ASCII
//! digits and never replaced by a default, brackets hold an IPv6 literal, a name has at most
//! one trailing dot, and each invalid one is 400 `bad_target` with nothing dialled. The
//! userinfo of an absolute target never reaches a log line. Raw requests over TCP, since curl
//! would refuse most of these targets before sending them; plain HTTP file servers on
//! 127.0.0.1 and 127.0.0.2 record what reaches them.

use crate::support::files::FileServer;
use crate::support::node;
use crate::support::ports::KeptListener;
use crate::support::proxy::{start_ready, Proxy};
use crate::support::HttpConn;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

const EGRESS: &str = "json-rpc-egress";
/// `Basic` of `ironic:s3cret-egress`.
const BASIC: &str = "Basic aXJvbmljOnMzY3JldC1lZ3Jlc3M=";
const SECRET: &str = "hunter2-in-the-target";

/// The egress process and its listener's address.
struct Egress {
    proxy: Proxy,
    listen: SocketAddr,
}

impl AsMut<Proxy> for Egress {
    fn as_mut(&mut self) -> &mut Proxy {
        &mut self.proxy
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    egress: Egress,
    /// On 127.0.0.1 and 127.0.0.2; both ports are in `plain_ports`, and so is 80.
    servers: [FileServer; 2],
}

impl Rig {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let ca = node::ca_init(&d.join("ca"), &[]);
        let servers = [[127, 0, 0, 1], [127, 0, 0, 2]].map(|ip: [u8; 4]| {
            let ip = IpAddr::V4(Ipv4Addr::from(ip));
            let addr = SocketAddr::new(ip, node::free_port_on(ip));
            let s = FileServer::start(KeptListener::bind(addr).expect("bind"));
            s.put("/x", b"reached\n", std::time::SystemTime::now());
            s
        });
        let cred = d.join("egress.credentials");
        std::fs::write(&cred, "ironic:s3cret-egress\n").expect("credentials");
        let identity = node::issuer_identity(&ca, &["egress-a.ironic.test"], &[], "1h");
        let (cred, plain) = (
            node::tp(&cred),
            [servers[0].addr.port(), servers[1].addr.port()],
        );
        let render = move |admin: u16, listen: SocketAddr| {
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
targets = ["localhost", "127.0.0.1", "127.0.0.2"]
ports = [1]
plain_ports = [80, {}, {}]
"#,
                plain[0], plain[1]
            )
        };
        // Debug, so that every line the refusals could write is there to be read.
        let egress = start_ready(Duration::from_secs(15), || {
            let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
            let listen = SocketAddr::new(ip, node::free_port_on(ip));
            let admin = crate::support::free_port();
            let config = d.join("egress.toml");
            std::fs::write(&config, render(admin, listen)).expect("config");
            let proxy = Proxy::spawn_env(
                &config,
                admin,
                HashMap::new(),
                false,
                Some("egress"),
                &[("RUST_LOG", "debug")],
            );
            Egress { proxy, listen }
        });
        Self {
            _dir: dir,
            egress,
            servers,
        }
    }

    /// Sends `GET <target>` with `Host: <host>` (none when `None`) and the credentials, on a
    /// connection of its own; the status.
    fn status(&self, target: &str, host: Option<&str>) -> u16 {
        let mut c = HttpConn::tcp(self.egress.listen).expect("connect");
        let host = host.map(|h| format!("Host: {h}\r\n")).unwrap_or_default();
        let raw = format!("GET {target} HTTP/1.1\r\n{host}Proxy-Authorization: {BASIC}\r\n\r\n");
        c.send(raw.as_bytes()).expect("send");
        c.read_response().expect("an answer").status
    }

    fn count(&self, outcome: &str) -> f64 {
        self.egress.proxy.metric(
            "ironic_proxy_egress_requests_total",
            &[("listener", EGRESS), ("outcome", outcome)],
        )
    }

    fn hits(&self) -> usize {
        self.servers.iter().map(|s| s.hits().len()).sum()
    }
}

#[test]
fn egress_refuses_invalid_ports_brackets_and_dots_in_the_target_and_host_with_400() {
    let rig = Rig::start();
    let p1 = rig.servers[0].addr.port();
    let p2 = rig.servers[1].addr.port();
    let good = format!("127.0.0.2:{p2}");

    // The control: valid targets are relayed, so a 400 below is the target's doing.
    assert_eq!(rig.status(&format!("http://{good}/x"), Some(&good)), 200);
    assert_eq!(
        rig.status(&format!("http://LocalHost:{p1}/x"), Some("localhost")),
        200
    );
    assert_eq!(rig.hits(), 2);

    let bad_targets = [
        // Past 65535: http's `port_u16` gave None, and the egress dialled port 80.
        "http://127.0.0.2:65616/x".to_owned(),
        "http://127.0.0.2:99999/x".to_owned(),
        "http://127.0.0.2:1a/x".to_owned(),
        "http://127.0.0.2:-1/x".to_owned(),
        "http://127.0.0.2:/x".to_owned(),
        "http://127.0.0.2:0/x".to_owned(),
        // Rust's u16 parser takes a leading '+'.
        format!("http://127.0.0.2:+{p2}/x"),
        // Brackets hold an IPv6 literal, nothing else.
        format!("http://[127.0.0.2]:{p2}/x"),
        format!("http://[localhost]:{p1}/x"),
        // One trailing dot at most (docs/reference.md, `targets`).
        format!("http://localhost..:{p1}/x"),
        format!("http://127.0.0.2.:{p2}/x"),
    ];
    // Every case is tried, and every one that is not 400 reported.
    let mut wrong = Vec::new();
    for t in &bad_targets {
        let s = rig.status(t, Some(&good));
        if s != 400 {
            wrong.push(format!("target {t}: {s}"));
        }
    }
    // The same rules for `Host`, even though the target's authority is what is used.
    let target = format!("http://{good}/x");
    let bad_hosts = [
        "127.0.0.2:1a".to_owned(),
        "127.0.0.2:-1".to_owned(),
        "127.0.0.2:65616".to_owned(),
        "127.0.0.2:".to_owned(),
        format!("127.0.0.2:+{p2}"),
        format!("[127.0.0.2]:{p2}"),
        "localhost..".to_owned(),
        String::new(),
    ];
    for h in &bad_hosts {
        let s = rig.status(&target, Some(h));
        if s != 400 {
            wrong.push(format!("Host {h:?}: {s}"));
        }
    }
    // HTTP/1.1 requires one Host (RFC 9112 §3.2).
    let s = rig.status(&target, None);
    if s != 400 {
        wrong.push(format!("no Host: {s}"));
    }
    assert!(wrong.is_empty(), "not 400: {wrong:#?}");

    let refused = (bad_targets.len() + bad_hosts.len() + 1) as f64;
    assert_eq!(
        rig.count("bad_target"),
        refused,
        "{}",
        rig.egress.proxy.metrics()
    );
    assert_eq!(rig.count("plain"), 2.0);
    assert_eq!(rig.hits(), 2, "no refused request reached a server");
}

#[test]
fn egress_never_logs_the_userinfo_of_a_target() {
    let rig = Rig::start();
    let p2 = rig.servers[1].addr.port();
    // A host in targets, and one outside them (which used to log its refusal with the target).
    for host in [format!("127.0.0.2:{p2}"), format!("127.0.0.3:{p2}")] {
        let target = format!("http://user:{SECRET}@{host}/x");
        assert_eq!(rig.status(&target, Some(&host)), 400, "{target}");
    }
    assert_eq!(
        rig.count("bad_target"),
        2.0,
        "{}",
        rig.egress.proxy.metrics()
    );
    // Both requests' access lines are written after anything else they log.
    let lines = rig
        .egress
        .proxy
        .wait_access_logs(2, Duration::from_secs(10));
    assert!(lines.iter().all(|l| l.contains("400")), "{lines:#?}");
    let leaked: Vec<String> = rig
        .egress
        .proxy
        .logs()
        .into_iter()
        .filter(|l| l.contains(SECRET) || l.contains("user:"))
        .collect();
    assert!(leaked.is_empty(), "userinfo in the log: {leaked:#?}");
    assert_eq!(rig.hits(), 0);
}
