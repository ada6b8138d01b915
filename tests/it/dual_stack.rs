//! IPv6 end to end (issue 10): sidecars and the load balancer from the built-in profiles, bound
//! to IPv6 addresses, peers found through AAAA records of a real dnsmasq and reached through the
//! balancer, mutual TLS on JSON-RPC, and certificates with IPv6 SANs verified by curl.
//!
//! IPv6 has one loopback address, so the test creates a network namespace (`ip netns`, root)
//! with `fd00::11` and `fd00::12` on its loopback beside `::1`, and runs dnsmasq, the proxies and
//! curl inside it. The recording upstreams (Ironic's sockets) are unix sockets in a temporary
//! directory, which the namespace shares. Ports inside the namespace are fixed: it is the test's
//! own, empty network stack, so nothing else can hold them.

use crate::support;
use crate::support::node;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{poll_until, Upstream};

const BIN: &str = env!("CARGO_BIN_EXE_ironic-proxy");
const PEERS: [&str; 2] = ["fd00::11", "fd00::12"];
const API: u16 = 6385;
const RPC: u16 = 6189;

/// A network namespace with IPv6 addresses on its loopback; deleted on drop.
struct Netns {
    name: String,
    children: Vec<Child>,
}

impl Netns {
    /// `None` when this process may not create namespaces (not root).
    fn create(addrs: &[&str]) -> Option<Self> {
        let name = format!("ironic-proxy-v6-{}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .ok()?;
        if !ok.success() {
            return None;
        }
        let ns = Self {
            name,
            children: Vec::new(),
        };
        ns.run(&["ip", "link", "set", "lo", "up"]);
        for a in addrs {
            ns.run(&[
                "ip",
                "-6",
                "addr",
                "add",
                &format!("{a}/128"),
                "dev",
                "lo",
                "nodad",
            ]);
        }
        Some(ns)
    }

    fn command(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(argv);
        c
    }

    fn run(&self, argv: &[&str]) -> support::Output {
        let o = support::run(&mut self.command(argv), b"");
        assert!(o.ok(), "{argv:?} in {}: {o:?}", self.name);
        o
    }

    /// Starts a long-running process in the namespace (`ip netns exec` execs it: same PID),
    /// stderr to `log`.
    fn spawn(&mut self, argv: &[&str], env: &[(&str, String)], log: &Path) {
        let mut c = self.command(argv);
        c.env_remove("IRONIC_PROXY_CONFIG")
            .env_remove("IRONIC_PROXY_PROFILE")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"));
        for (k, v) in env {
            c.env(k, v);
        }
        self.children
            .push(c.spawn().expect("spawn in the namespace"));
    }

    /// curl inside the namespace: `-sS --max-time 10 ARGS`.
    fn curl(&self, args: &[&str]) -> support::Output {
        let mut argv = vec!["curl", "-sS", "--max-time", "10"];
        argv.extend_from_slice(args);
        support::run(&mut self.command(&argv), b"")
    }

    /// Waits until `url` answers 200 (an admin `/readyz`).
    fn wait_200(&self, url: &str, log: &Path) {
        poll_until(Duration::from_secs(20), || {
            let o = self.curl(&["-o", "/dev/null", "-w", "%{http_code}", url]);
            (o.stdout == "200").then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "{url} never ready:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn ipv6_peers_found_through_aaaa_are_reached_through_the_balancer_with_tls_and_mtls() {
    let ns = Netns::create(&PEERS);
    if !support::precondition(
        "netns",
        ns.is_some(),
        "a network namespace (`ip netns add`: root and iproute2)",
    ) {
        return;
    }
    let mut ns = ns.expect("created");
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("dnsmasq's user reads the hosts file");
    let ca = node::ca_init(&d.join("ca"), &[]);
    let ca_crt = s(&ca.0);

    // Cluster DNS: AAAA records of both peers under the headless Service's name.
    let hosts = d.join("hosts");
    let records: String = PEERS
        .iter()
        .map(|ip| format!("{ip} ironic.metal3.svc.cluster.local\n"))
        .collect();
    std::fs::write(&hosts, records).expect("hosts");
    std::fs::set_permissions(&hosts, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    ns.spawn(
        &[
            "/usr/sbin/dnsmasq",
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            &format!("--addn-hosts={}", s(&hosts)),
            "--local=/cluster.local/",
            "--local-ttl=1",
            "--listen-address=::1",
            "--port=5353",
            "--bind-interfaces",
            "--log-facility=-",
        ],
        &[],
        &d.join("dnsmasq.log"),
    );

    // Two sidecars, `--profile sidecar`, each on its own IPv6 address, Ironic's sockets being
    // recording upstreams.
    let mut ironic = Vec::new();
    for (i, ip) in PEERS.iter().enumerate() {
        let run = d.join(format!("i{i}"));
        std::fs::create_dir(&run).expect("dir");
        let api = Upstream::start(&run.join("ironic.sock"));
        let rpc = Upstream::start(&run.join("json-rpc.sock"));
        let log = run.join("sidecar.log");
        let env = vec![
            ("POD_NAME", format!("ironic-{i}")),
            ("POD_NAMESPACE", "metal3".to_owned()),
            // Every pod IP: the IPv6 one and an IPv4 one (dual-stack).
            ("POD_IPS", format!("{ip},127.0.0.1")),
            (
                "IRONIC_PROXY_PEER_CIDRS",
                "fd00::/64,127.0.0.0/8".to_owned(),
            ),
            ("IRONIC_PROXY_TRUST", ca_crt.clone()),
            ("IRONIC_PROXY_ISSUER_DIR", s(&d.join("ca"))),
            ("IRONIC_PROXY_EXPORT_DIR", s(&run.join("export"))),
            ("IRONIC_PROXY_API_SOCKET", s(&run.join("ironic.sock"))),
            ("IRONIC_PROXY_RPC_SOCKET", s(&run.join("json-rpc.sock"))),
            ("IRONIC_PROXY_BIND", format!("[{ip}]")),
            ("IRONIC_PROXY_ADMIN_LISTEN", format!("[{ip}]:9901")),
            ("IRONIC_PROXY_PEERS", "none".to_owned()),
            ("IRONIC_PROXY_HTPASSWD", "none".to_owned()),
        ];
        ns.spawn(&[BIN, "run", "--profile", "sidecar"], &env, &log);
        ns.wait_200(&format!("http://[{ip}]:9901/readyz"), &log);
        ironic.push((api, rpc, run));
    }

    // The balancer on [::1], `--profile balancer`, peers from the AAAA records.
    let lb_log = d.join("lb.log");
    let env = vec![
        ("POD_NAMESPACE", "metal3".to_owned()),
        ("POD_IPS", "::1".to_owned()),
        ("IRONIC_PROXY_TRUST", ca_crt.clone()),
        ("IRONIC_PROXY_ISSUER_DIR", s(&d.join("ca"))),
        ("IRONIC_PROXY_BIND", "[::1]".to_owned()),
        ("IRONIC_PROXY_ADMIN_LISTEN", "[::1]:9902".to_owned()),
        ("IRONIC_PROXY_DNS_SERVERS", "[::1]:5353".to_owned()),
        ("IRONIC_PROXY_DNS_REFRESH", "1s".to_owned()),
        ("IRONIC_PROXY_PEER_API_PORT", API.to_string()),
        ("IRONIC_PROXY_HTPASSWD", "none".to_owned()),
    ];
    ns.spawn(&[BIN, "run", "--profile", "balancer"], &env, &lb_log);
    ns.wait_200("http://[::1]:9902/readyz", &lb_log);
    // Both peers healthy (readiness needs only one).
    poll_until(Duration::from_secs(15), || {
        let m = ns.curl(&["http://[::1]:9902/metrics"]).stdout;
        support::metric(
            &m,
            "ironic_proxy_upstream_endpoints",
            &[("upstream", "api"), ("state", "healthy")],
        )
        .filter(|v| *v == 2.0)
    })
    .unwrap_or_else(|| {
        panic!(
            "not both peers healthy:\n{}",
            std::fs::read_to_string(&lb_log).unwrap_or_default()
        )
    });

    // Requests through the balancer: curl verifies its certificate for ::1, they reach both
    // peers' Ironic, which see the IPv6 client.
    let url = format!("https://[::1]:{API}/v1/nodes");
    for _ in 0..30 {
        let o = ns.curl(&[
            "--cacert",
            &ca_crt,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ]);
        assert_eq!(o.stdout, "200", "{o:?}");
    }
    let served: Vec<usize> = ironic
        .iter()
        .map(|(api, _, _)| {
            api.requests()
                .iter()
                .filter(|r| r.path == "/v1/nodes")
                .count()
        })
        .collect();
    eprintln!("dual-stack: 30 requests through [::1] served by fd00::11 / fd00::12: {served:?}");
    assert_eq!(served.iter().sum::<usize>(), 30, "{served:?}");
    assert!(
        served.iter().all(|n| *n > 0),
        "both IPv6 peers served: {served:?}"
    );
    let forwarded = ironic[0].0.requests();
    let xff = forwarded
        .iter()
        .find(|r| r.path == "/v1/nodes")
        .and_then(|r| r.header("x-forwarded-for").map(str::to_owned));
    assert!(
        xff.as_deref().is_some_and(|v| v.contains("::1")),
        "the client's IPv6 address is forwarded: {xff:?}"
    );

    // Each sidecar directly: its certificate carries its IPv6 address (curl checks the IP SAN).
    for ip in PEERS {
        let o = ns.curl(&[
            "--cacert",
            &ca_crt,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("https://[{ip}]:{API}/"),
        ]);
        assert_eq!(o.stdout, "200", "{ip}: {o:?}");
    }
    let shown = node::cli(
        &["cert", "show", &s(&ironic[0].2.join("export/tls.crt"))],
        &[],
    );
    assert!(shown.stdout.contains("fd00::11"), "{shown:?}");
    assert!(shown.stdout.contains("127.0.0.1"), "{shown:?}");

    // JSON-RPC with mutual TLS over IPv6: peer 0's exported certificate (what its Ironic
    // presents) is accepted by peer 1; no certificate is refused before reaching the socket.
    let export = ironic[0].2.join("export");
    let rpc_url = format!("https://[{}]:{RPC}/", PEERS[1]);
    let with = ns.curl(&[
        "--cacert",
        &ca_crt,
        "--cert",
        &s(&export.join("tls.crt")),
        "--key",
        &s(&export.join("tls.key")),
        "-d",
        "{}",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &rpc_url,
    ]);
    assert_eq!(with.stdout, "200", "{with:?}");
    let without = ns.curl(&[
        "--cacert",
        &ca_crt,
        "-d",
        "{}",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &rpc_url,
    ]);
    assert_ne!(without.stdout, "200", "{without:?}");
    let rpc_seen = ironic[1].1.requests();
    assert_eq!(
        rpc_seen.len(),
        1,
        "only the authenticated call reached Ironic"
    );
    let xfcc = rpc_seen[0]
        .header("x-forwarded-client-cert")
        .unwrap_or_default();
    assert!(xfcc.contains("ironic-0.ironic.metal3.svc"), "{xfcc}");

    // `allow` from IRONIC_PROXY_PEER_CIDRS="fd00::/64,127.0.0.0/8": certificates of the same CA
    // with only an IP SAN pass by either CIDR, and not outside both.
    let status = |sans: &[&str], name: &str| {
        let pem = node::cert_issue(&ca, &d.join(name), sans);
        ns.curl(&[
            "--cacert",
            &ca_crt,
            "--cert",
            &s(&pem.cert_path),
            "--key",
            &s(&pem.key_path),
            // HTTP/1.1: over HTTP/2 a refused POST with a body sometimes ends in a stream error
            // instead of the 403 (seen with curl 7.88; reported, not this test's subject).
            "--http1.1",
            "-d",
            "{}",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &rpc_url,
        ])
    };
    for (ip, name, want) in [
        ("fd00::99", "in-v6", "200"),
        ("127.0.0.99", "in-v4", "200"),
        ("fd01::1", "out-v6", "403"),
        ("fd00:0:0:1::1", "next-v6-net", "403"),
    ] {
        let o = status(&["--ip", ip], name);
        assert_eq!(o.stdout, want, "client with IP SAN {ip}: {o:?}");
    }
    assert_eq!(
        ironic[1].1.requests().len(),
        3,
        "two allowed calls more, nothing else"
    );
}
