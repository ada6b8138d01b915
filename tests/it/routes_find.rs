//! Routes, boot files found across peers, and one port for TLS and plain HTTP (issue 12): the
//! real binary with `tls = "optional"`, a find route over three real file servers (one `local`,
//! two found through a real dnsmasq), the API's default upstream on a unix socket, and real
//! clients (a byte-exact HTTP/1.1 client, curl, openssl s_client).
//!
//! What is checked is what a booting machine and an attacker see: the status and bytes served,
//! which file server was asked, and what reached the API upstream (nothing, for refusals).
//! Real time (real processes); every wait polls with a deadline.

use crate::support;
use crate::support::{backend, dnsmasq, files};

use backend::{bind_same_port, ip};
use dnsmasq::Dnsmasq;
use files::{FileServer, Mode};
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};
use support::proxy::{start_ready, Proxy};
use support::{curl, poll_until, run, HttpConn, Sandbox, Upstream};

const NAME: &str = "boot.metal3.svc";
const MAC: &str = "/pxelinux.cfg/52-54-00-00-00-02";

/// Three file servers (`files[0]` is the route's `local`, the others are DNS peers), the API
/// upstream, and the proxy.
struct Cluster {
    sb: Sandbox,
    files: Vec<FileServer>,
    _dns: Dnsmasq,
    api: Upstream,
    proxy: Proxy,
}

fn config(sb: &Sandbox, admin: u16, port: u16, routes: &str, api: &Upstream) -> String {
    format!(
        r#"
[identity]
trust = "{dir}/ca.crt"
cert = "{dir}/tls.crt"
key = "{dir}/tls.key"

[admin]
listen = "127.0.0.1:{admin}"

[limits]
request_head_timeout = "5s"
upstream_timeout = "5s"
drain_timeout = "2s"

[[listeners]]
name = "api"
listen = "127.0.0.1:{port}"
tls = "optional"
upstream = "{api}"
{routes}
"#,
        dir = sb.dir.path().display(),
        api = api.address(),
    )
}

impl Cluster {
    fn start(net: u8, find_timeout: &str) -> Self {
        let sb = Sandbox::new();
        let ips: Vec<IpAddr> = (1..=3).map(|h| ip(net, h)).collect();
        let listeners = bind_same_port(&ips);
        let fport = listeners[0].local_addr().expect("address").port();
        let files: Vec<FileServer> = listeners.into_iter().map(FileServer::start).collect();
        let mut dns = Dnsmasq::start("metal3.svc", 1);
        let peers: Vec<String> = ips[1..].iter().map(ToString::to_string).collect();
        dns.set_hosts(&[(&peers[0], NAME), (&peers[1], NAME)]);
        let api = Upstream::start(&sb.socket("api"));
        let routes = format!(
            r#"
[[listeners.routes]]
paths = ["/pxelinux.cfg/*", "/grub.cfg-01-*", "/boot.ipxe"]
plaintext = true
[listeners.routes.upstream]
local = "{local}:{fport}"
dns = "{NAME}:{fport}"
find = "newest"
find_timeout = "{find_timeout}"
health = {{ path = "/health", interval = "300ms", timeout = "300ms", unhealthy_after = 1, healthy_after = 1 }}

[[listeners.routes]]
paths = ["/images/*"]
methods = ["GET", "HEAD"]
plaintext = true
upstream = "{local}:{fport}"

[dns]
servers = ["{dns}"]
refresh = "1s"
"#,
            local = ips[0],
            dns = dns.addr(),
        );
        let proxy = start_ready(Duration::from_secs(10), || {
            let (admin, port) = (support::free_port(), support::free_port());
            let path = sb.path("proxy.toml");
            std::fs::write(&path, config(&sb, admin, port, &routes, &api)).expect("config");
            let ports = [("api".to_owned(), port)].into_iter().collect();
            Proxy::spawn(&path, admin, ports, false, None)
        });
        let c = Self {
            sb,
            files,
            _dns: dns,
            api,
            proxy,
        };
        c.wait_healthy(3);
        c
    }

    /// Waits until the find route has `n` healthy endpoints.
    fn wait_healthy(&self, n: u32) {
        let labels = [("upstream", "api/routes[0]"), ("state", "healthy")];
        let ok = poll_until(Duration::from_secs(10), || {
            (self
                .proxy
                .metric("ironic_proxy_upstream_endpoints", &labels)
                == f64::from(n))
            .then_some(())
        });
        assert!(
            ok.is_some(),
            "{n} healthy endpoints: {}",
            self.proxy.metrics()
        );
    }

    /// A plain HTTP/1.1 request on a new connection.
    fn plain(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> support::Response {
        let mut c = HttpConn::tcp(self.proxy.addr("api")).expect("connect");
        c.request(method, path, headers, b"").expect("response")
    }

    fn get(&self, path: &str) -> support::Response {
        self.plain("GET", path, &[])
    }

    fn asked(&self) -> Vec<usize> {
        self.files.iter().map(|f| f.hits().len()).collect()
    }

    fn clear(&self) {
        for f in &self.files {
            f.clear_hits();
        }
    }
}

fn ago(secs: u64) -> SystemTime {
    SystemTime::now() - Duration::from_secs(secs)
}

#[test]
fn the_owner_s_copy_is_found_the_newest_wins_and_nobody_s_is_404() {
    let c = Cluster::start(61, "2s");

    // On the second endpoint only (a DNS peer): served from it; every endpoint was asked once,
    // each request marked with our Via.
    c.files[1].put(MAC, b"#!ipxe\nkernel http://owner-1/k\n", ago(60));
    let r = c.get(MAC);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.body, b"#!ipxe\nkernel http://owner-1/k\n");
    assert_eq!(c.asked(), [1, 1, 1]);
    for f in &c.files {
        let hit = &f.hits()[0];
        assert!(
            hit.header("via")
                .is_some_and(|v| v.contains("ironic-proxy")),
            "{hit:?}"
        );
    }
    assert!(
        c.api.requests().is_empty(),
        "the API saw a boot-file request"
    );

    // HEAD answers with the headers GET answers with.
    let url = c.proxy.http_url("api", MAC);
    let head = curl(&["-I", &url]);
    let get = curl(&["-D", "-", "-o", "/dev/null", &url]);
    assert!(head.ok() && get.ok(), "{head:?} {get:?}");
    let fields = |out: &str| -> Vec<String> {
        let mut v: Vec<String> = out
            .lines()
            .map(|l| l.trim().to_ascii_lowercase())
            .filter(|l| !l.is_empty() && !l.starts_with("date:"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(fields(&head.stdout), fields(&get.stdout));
    assert!(
        fields(&head.stdout)
            .iter()
            .any(|l| l == "content-length: 31"),
        "{}",
        head.stdout
    );

    // On two endpoints: the newer copy wins, wherever it is.
    c.files[0].put(MAC, b"old copy on local", ago(3600));
    c.files[2].put(MAC, b"new copy on peer 2", ago(10));
    c.files[1].remove(MAC);
    assert_eq!(c.get(MAC).body, b"new copy on peer 2");
    // The same Last-Modified: local's.
    let t = ago(100);
    c.files[0].put("/grub.cfg-01-52-54-00-00-00-03", b"local", t);
    c.files[2].put("/grub.cfg-01-52-54-00-00-00-03", b"peer", t);
    assert_eq!(c.get("/grub.cfg-01-52-54-00-00-00-03").body, b"local");

    // Nobody has it: 404, the proxy's JSON, no Retry-After (iPXE would retry forever).
    let r = c.get("/pxelinux.cfg/52-54-00-00-00-99");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"], "not_found");
    assert!(!r.has_header("retry-after"));
    let found = [("listener", "api"), ("outcome", "found")];
    let missing = [("listener", "api"), ("outcome", "not_found")];
    assert_eq!(c.proxy.metric("ironic_proxy_find_total", &found), 5.0);
    assert_eq!(c.proxy.metric("ironic_proxy_find_total", &missing), 1.0);
}

#[test]
fn failing_slow_garbage_and_killed_endpoints_give_502_unless_another_has_the_file() {
    let mut c = Cluster::start(62, "500ms");
    let other = "/pxelinux.cfg/52-54-00-00-00-01";
    c.files[0].put(other, b"on local", ago(60));

    for (mode, what) in [
        (Mode::Status(500), "a 500"),
        (Mode::Garbage, "garbage"),
        (Mode::Slow(Duration::from_secs(3)), "too slow"),
    ] {
        c.files[2].set_mode(mode);
        let t = Instant::now();
        let r = c.get(MAC);
        assert_eq!(r.status, 502, "{what}: nobody else has it");
        assert!(!r.has_header("retry-after"), "{what}");
        assert_eq!(c.get(other).body, b"on local", "{what}: local has it");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{what}: bounded by find_timeout"
        );
        c.files[2].set_mode(Mode::Normal);
        // A peer counted as failed may be ejected by passive health; let it come back.
        c.wait_healthy(3);
    }

    // The owner killed: its nodes' files 502 (it may be the one that has them), before and after
    // its health checks fail; the others' still 200.
    c.files[1].put(MAC, b"owner", ago(5));
    assert_eq!(c.get(MAC).status, 200);
    c.files[1].stop();
    assert_eq!(c.get(MAC).status, 502, "owner refused the connection");
    c.wait_healthy(2);
    assert_eq!(c.get(MAC).status, 502, "owner unhealthy: still not a 404");
    assert_eq!(c.get(other).status, 200);
    c.files[1].restart();
    c.wait_healthy(3);
    assert_eq!(c.get(MAC).body, b"owner");
    assert_eq!(
        c.proxy.admin_get("/readyz").expect("readyz").status,
        200,
        "the proxy kept serving"
    );
}

#[test]
fn refused_paths_and_methods_reach_no_upstream() {
    let c = Cluster::start(63, "1s");
    c.files[0].put(MAC, b"x", ago(5));
    let long = format!("/pxelinux.cfg/{}", "a".repeat(8192));
    for path in [
        "/pxelinux.cfg/../v1/nodes",
        "/pxelinux.cfg/%2e%2e/v1/nodes",
        "/pxelinux.cfg/%2E%2E/v1/nodes",
        "/images/..%2fv1",
        "/pxelinux.cfg/x%2fy",
        "/pxelinux.cfg/x%2Fy",
        "/pxelinux.cfg/x%5cy",
        "/pxelinux.cfg//etc/passwd",
        "//v1/nodes",
        "/v1/./nodes",
        "/pxelinux.cfg/%00",
        long.as_str(),
    ] {
        let r = c.get(path);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.json()["error"], "bad_request", "{path}");
    }
    // Over TLS too: the path rules hold for every request of a listener with routes.
    let https = curl(&[
        "--cacert",
        c.sb.path("ca.crt").to_str().expect("path"),
        "--path-as-is",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &c.proxy.url("api", "/pxelinux.cfg/../v1/nodes"),
    ]);
    assert_eq!(https.stdout, "400", "{https:?}");

    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        for path in [MAC, "/boot.ipxe", "/images/ipa.kernel"] {
            let r = c.plain(method, path, &[]);
            assert_eq!(r.status, 405, "{method} {path}");
            assert_eq!(r.header("allow"), Some("GET, HEAD"), "{method} {path}");
        }
    }
    assert_eq!(c.asked(), [0, 0, 0], "a file server was asked");
    assert!(c.api.requests().is_empty(), "the API was asked");
    // Still serving.
    assert_eq!(c.get(MAC).status, 200);
}

#[test]
fn one_port_serves_tls_to_handshakes_and_only_boot_routes_over_plain_http() {
    let c = Cluster::start(64, "1s");
    c.files[1].put(
        "/boot.ipxe",
        b"#!ipxe\nchain pxelinux.cfg/${mac:hexhyp}\n",
        ago(5),
    );
    c.files[0].put("/images/ipa.kernel", b"kernel bytes", ago(5));
    let ca = c.sb.path("ca.crt");
    let ca = ca.to_str().expect("path");
    let code = |args: &[&str]| {
        let mut all = vec!["-o", "/dev/null", "-w", "%{http_code}"];
        all.extend_from_slice(args);
        curl(&all).stdout
    };

    // Plain HTTP: the boot routes answer, everything else is 403 and never forwarded.
    assert_eq!(code(&[&c.proxy.http_url("api", "/boot.ipxe")]), "200");
    assert_eq!(
        code(&[&c.proxy.http_url("api", "/images/ipa.kernel")]),
        "200"
    );
    for path in [
        "/v1/nodes",
        "/",
        "/PXELINUX.CFG/52-54-00-00-00-02",
        "/boot.ipxe.bak",
    ] {
        assert_eq!(code(&[&c.proxy.http_url("api", path)]), "403", "{path}");
    }
    let r = c.get("/v1");
    assert_eq!(r.json()["error"], "forbidden");
    assert!(c.api.requests().is_empty(), "plain HTTP reached the API");

    // TLS on the same port: the API as before, and the boot routes too.
    let v1 = curl(&["--cacert", ca, &c.proxy.url("api", "/v1/nodes")]);
    assert!(
        v1.ok() && v1.stdout.contains("\"upstream\":\"ok\""),
        "{v1:?}"
    );
    let seen = c.api.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-forwarded-proto"), Some("https"));
    assert_eq!(
        code(&["--cacert", ca, &c.proxy.url("api", "/boot.ipxe")]),
        "200"
    );

    // openssl s_client: a raw TLS session on the port.
    let addr = c.proxy.addr("api").to_string();
    let out = run(
        std::process::Command::new("openssl").args([
            "s_client",
            "-connect",
            &addr,
            "-CAfile",
            ca,
            "-quiet",
            "-verify_return_error",
        ]),
        b"GET /v1/ports HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert!(out.stdout.starts_with("HTTP/1.1 200"), "{out:?}");
    assert_eq!(c.api.requests().len(), 2);

    // A client that sends nothing, then one that sends a byte that is neither: the proxy keeps
    // serving both kinds.
    let silent = std::net::TcpStream::connect(c.proxy.addr("api")).expect("connect");
    let mut junk = HttpConn::tcp(c.proxy.addr("api")).expect("connect");
    junk.send(b"\x00\x01\x02\r\n\r\n").expect("send");
    let (answer, closed) = junk.head_then_drain(Duration::from_secs(2));
    assert_eq!(
        support::status_lines(&answer),
        [400],
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    assert!(closed);
    assert_eq!(code(&[&c.proxy.http_url("api", "/boot.ipxe")]), "200");
    assert_eq!(code(&["--cacert", ca, &c.proxy.url("api", "/v1")]), "200");
    drop(silent);
}

#[test]
fn a_request_that_came_through_a_proxy_is_asked_of_local_only() {
    let c = Cluster::start(65, "1s");
    c.files[1].put(MAC, b"peer's", ago(5));
    c.files[0].put("/boot.ipxe", b"local's", ago(5));
    let via = [("Via", "1.1 ironic-proxy")];
    let r = c.plain("GET", MAC, &via);
    assert_eq!(r.status, 404, "a peer's fan-out must not fan out again");
    assert_eq!(c.asked(), [1, 0, 0]);
    c.clear();
    assert_eq!(c.plain("GET", "/boot.ipxe", &via).body, b"local's");
    assert_eq!(c.asked(), [1, 0, 0]);
}

#[test]
fn a_none_listener_restricts_plain_http_only_when_it_has_a_plaintext_route() {
    let sb = Sandbox::new();
    let api = Upstream::start(&sb.socket("api"));
    let files = FileServer::start(
        support::ports::KeptListener::bind(([127, 0, 0, 1], support::free_port()).into())
            .expect("bind a reserved port"),
    );
    files.put("/images/ipa.kernel", b"kernel", ago(5));
    let route = |plaintext: bool| {
        format!(
            "[[listeners.routes]]\npaths = [\"/images/*\"]\nplaintext = {plaintext}\n\
             upstream = \"{}\"\n",
            files.addr
        )
    };
    for plaintext in [false, true] {
        let routes = route(plaintext);
        let proxy = start_ready(Duration::from_secs(10), || {
            let (admin, port) = (support::free_port(), support::free_port());
            let text = config(&sb, admin, port, &routes, &api).replace("\"optional\"", "\"none\"");
            let path = sb.path("none.toml");
            std::fs::write(&path, text).expect("config");
            let ports = [("api".to_owned(), port)].into_iter().collect();
            Proxy::spawn(&path, admin, ports, false, None)
        });
        let mut c = HttpConn::tcp(proxy.addr("api")).expect("connect");
        assert_eq!(c.get("/images/ipa.kernel").expect("GET").body, b"kernel");
        let mut c = HttpConn::tcp(proxy.addr("api")).expect("connect");
        let v1 = c.get("/v1/nodes").expect("GET").status;
        // Without a plaintext route a `none` listener serves everything as before.
        assert_eq!(
            v1,
            if plaintext { 403 } else { 200 },
            "plaintext = {plaintext}"
        );
    }
    assert_eq!(
        api.requests().len(),
        1,
        "only the unrestricted listener forwarded /v1"
    );
}

#[test]
fn the_chosen_body_is_streamed_not_buffered() {
    let c = Cluster::start(66, "2s");
    // 64 MiB on a peer: buffered whole, it alone would lift the proxy's peak RSS above it.
    let big: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    c.files[2].put("/pxelinux.cfg/big", &big, ago(5));
    let out = c.sb.path("big.out");
    let r = curl(&[
        "-o",
        out.to_str().expect("path"),
        "-w",
        "%{http_code}",
        &c.proxy.http_url("api", "/pxelinux.cfg/big"),
    ]);
    assert_eq!(r.stdout, "200", "{r:?}");
    assert!(
        std::fs::read(&out).expect("body") == big,
        "the body differs"
    );
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", c.proxy.pid())).expect("status");
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    assert!(
        peak_kib < 48 * 1024,
        "peak RSS {peak_kib} KiB for a 64 MiB file"
    );
}
