//! Adversarial upstreams (issue 5, item 1): a scripted raw upstream behind real `server` and
//! `mutual` listeners closes mid-response, resets, stalls past `upstream_timeout`, sends
//! malformed status lines, duplicate or conflicting Content-Length, oversized heads, extra
//! responses and unsolicited 101s. The client sees 502 or 504, or an aborted response, never a
//! complete-looking wrong one; nothing of one response leaks into another client's; and the
//! proxy keeps serving. Client faults (malformed or abandoned request bodies) are never blamed on
//! the upstream: a balancer does not eject healthy peers because a client misbehaved.

use crate::support;
use crate::support::{backend, dnsmasq, node, wire};

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{tls_client_config, HttpConn, Sandbox, Tls};
use wire::{response, Act, Rogue, RogueHit};

fn script(hit: &RogueHit) -> Act {
    let t = hit.target().to_owned();
    let ok = |body: &str| response("200 OK", &["Content-Type: text/plain"], body.as_bytes());
    match t.as_str() {
        "/truncate-cl" => Act::ReplyClose(
            [&b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"[..], b"0123456789"].concat(),
        ),
        "/truncate-chunked" => Act::ReplyClose(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
        ),
        "/truncate-head" => Act::ReplyClose(b"HTTP/1.1 200 OK\r\nContent-Le".to_vec()),
        "/reset" => Act::Reset,
        "/early" => Act::Early(
            response("413 Payload Too Large", &["Connection: close"], b"refused"),
            Duration::from_secs(3),
        ),
        "/stall" => Act::Stall(Duration::from_secs(3)),
        "/slow-body" => Act::Slow(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello".to_vec(),
            Duration::from_millis(1500),
            b"world".to_vec(),
        ),
        "/bad-status" => Act::ReplyClose(b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n".to_vec()),
        "/bad-version" => Act::ReplyClose(b"HTTX/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec()),
        "/status-overflow" => {
            Act::ReplyClose(b"HTTP/1.1 1200 OK\r\nContent-Length: 0\r\n\r\n".to_vec())
        }
        "/bad-header" => Act::ReplyClose(
            b"HTTP/1.1 200 OK\r\nBad Header\r\nContent-Length: 0\r\n\r\n".to_vec(),
        ),
        "/nul-header" => Act::ReplyClose(
            b"HTTP/1.1 200 OK\r\nX-A: a\0b\r\nContent-Length: 0\r\n\r\n".to_vec(),
        ),
        "/obs-fold" => Act::ReplyClose(
            b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n".to_vec(),
        ),
        "/dup-cl-same" => Act::Reply(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
        ),
        "/cl-list" => Act::Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello".to_vec()),
        "/dup-cl-diff" => Act::ReplyClose(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!".to_vec(),
        ),
        "/cl-te" => Act::ReplyClose(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        ),
        "/cl-te-short" => Act::ReplyClose(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        ),
        "/cl-plus" => Act::ReplyClose(b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello".to_vec()),
        "/big-header" => Act::ReplyClose(
            format!(
                "HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 0\r\n\r\n",
                "b".repeat(100 * 1024)
            )
            .into_bytes(),
        ),
        "/many-headers" => Act::ReplyClose(
            format!(
                "HTTP/1.1 200 OK\r\n{}Content-Length: 0\r\n\r\n",
                (0..2000).map(|i| format!("x{i}: y\r\n")).collect::<String>()
            )
            .into_bytes(),
        ),
        "/double" => Act::Reply([ok("first"), ok("SMUGGLED-RESPONSE")].concat()),
        // Bodies where none may be (RFC 9112 §6.3 items 1-2): the bytes after the head must not
        // be read as the next response on a pooled connection.
        "/head-body" | "/204-body" | "/304-body" => {
            let status = match t.as_str() {
                "/204-body" => "204 No Content",
                "/304-body" => "304 Not Modified",
                _ => "200 OK",
            };
            let smuggled = ok("SMUGGLED-RESPONSE");
            Act::Reply(
                [
                    format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n", smuggled.len())
                        .into_bytes(),
                    smuggled,
                ]
                .concat(),
            )
        }
        "/101" => Act::Reply(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
                .to_vec(),
        ),
        "/close-delimited" => {
            Act::ReplyClose(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil-close".to_vec())
        }
        p if p.starts_with("/close-after/") => Act::ReplyClose(ok(p)),
        p if p.starts_with("/announce-close/") => Act::ReplyClose(response(
            "200 OK",
            &["Content-Type: text/plain", "Connection: close"],
            p.as_bytes(),
        )),
        _ => Act::Reply(ok(&t)),
    }
}

struct UpRig {
    sb: Sandbox,
    rogue: Rogue,
    proxy: support::Proxy,
    client: support::Leaf,
}

impl UpRig {
    /// `upstream_timeout` 1 s, below the scripted stalls (`/stall`, `/early`: 3 s).
    fn new() -> Self {
        Self::with_upstream_timeout("1s")
    }

    /// For tests that script no stall: an upstream answer is never cut by time, so a rogue
    /// slow to answer on a loaded machine (a thread per connection) cannot turn a case into a
    /// 504; the client's own read timeout still bounds a hang.
    fn patient() -> Self {
        Self::with_upstream_timeout("60s")
    }

    fn with_upstream_timeout(timeout: &str) -> Self {
        let sb = Sandbox::new();
        let rogue = Rogue::start(&sb.socket("rogue"), Arc::new(script));
        let proxy = sb
            .proxy()
            .listener("api", Tls::Server, &rogue.address())
            .listener("rpc", Tls::Mutual, &rogue.address())
            .limit_dur("upstream_timeout", timeout)
            .start();
        let client = sb.ca.client_leaf(&["conductor-0.ironic.test"]);
        Self {
            sb,
            rogue,
            proxy,
            client,
        }
    }

    fn conn(&self, listener: &str) -> HttpConn<support::TlsStream> {
        let leaf = (listener == "rpc").then_some(&self.client);
        let cfg = tls_client_config(&self.sb.ca.pem, leaf, &[b"http/1.1"]);
        HttpConn::tls(self.proxy.addr(listener), cfg).expect("TLS connect")
    }

    fn get(&self, listener: &str, path: &str) -> std::io::Result<support::Response> {
        self.conn(listener).get(path)
    }

    fn normal(&self, listener: &str, n: usize) {
        let path = format!("/normal/{n}");
        let r = self
            .get(listener, &path)
            .unwrap_or_else(|e| panic!("normal request on {listener}: {e}"));
        assert_eq!(
            (r.status, r.text()),
            (200, path),
            "normal request on {listener}"
        );
    }
}

#[test]
fn broken_upstream_answers_become_502_or_504_and_never_leak() {
    let rig = UpRig::new();
    let mut n = 0;
    let mut report = Vec::new();
    for listener in ["api", "rpc"] {
        // (path, status, proxy error code)
        for (path, status, code) in [
            ("/reset", 502, "bad_gateway"),
            ("/truncate-head", 502, "bad_gateway"),
            ("/stall", 504, "gateway_timeout"),
            ("/bad-status", 502, "bad_gateway"),
            ("/bad-version", 502, "bad_gateway"),
            ("/status-overflow", 502, "bad_gateway"),
            ("/bad-header", 502, "bad_gateway"),
            ("/nul-header", 502, "bad_gateway"),
            // RFC 9112 §5.2: a proxy MUST replace obs-fold with SP or answer 502.
            ("/obs-fold", 502, "bad_gateway"),
            ("/dup-cl-diff", 502, "bad_gateway"),
            ("/cl-plus", 502, "bad_gateway"),
            ("/big-header", 502, "bad_gateway"),
            ("/many-headers", 502, "bad_gateway"),
            ("/101", 502, "bad_gateway"),
        ] {
            let started = Instant::now();
            let r = rig
                .get(listener, path)
                .unwrap_or_else(|e| panic!("[{listener}] {path}: no answer: {e}"));
            let took = started.elapsed();
            assert_eq!(r.status, status, "[{listener}] {path}: {}", r.text());
            assert_eq!(r.json()["error"], code, "[{listener}] {path}");
            assert!(
                took < Duration::from_secs(3),
                "[{listener}] {path} took {took:?}"
            );
            report.push(format!("{path} -> {status} in {took:?}"));
            n += 1;
            rig.normal(listener, n);
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(rig.rogue.hits().iter().all(|h| !h.target().is_empty()));
}

#[test]
fn a_response_cut_mid_body_reaches_the_client_as_aborted() {
    let rig = UpRig::new();
    let mut n = 0;
    for listener in ["api", "rpc"] {
        for path in ["/truncate-cl", "/truncate-chunked"] {
            let mut c = rig.conn(listener);
            let got = c.get(path);
            // The client must be able to tell: either the read fails (too few bytes, no last
            // chunk) or the status is an error; never a complete 200.
            match got {
                Err(e) => {
                    assert!(
                        matches!(e.kind(), std::io::ErrorKind::UnexpectedEof)
                            || e.to_string().contains("close")
                            || e.to_string().contains("chunk"),
                        "[{listener}] {path}: {e}"
                    );
                }
                Ok(r) => panic!(
                    "[{listener}] {path}: a complete response was relayed: {} {:?}",
                    r.status,
                    r.text()
                ),
            }
            n += 1;
            rig.normal(listener, n);
        }
        // A slow but complete body is relayed complete (upstream_timeout is until the head).
        let r = rig.get(listener, "/slow-body").expect("slow body");
        assert_eq!((r.status, r.text().as_str()), (200, "helloworld"));
        // A close-delimited body (RFC 9112 §6.3 item 8) is complete at the close.
        let r = rig
            .get(listener, "/close-delimited")
            .expect("close-delimited");
        assert_eq!((r.status, r.text().as_str()), (200, "until-close"));
        n += 1;
        rig.normal(listener, n);
    }
}

#[test]
fn duplicate_length_in_a_response_is_never_relayed_ambiguous() {
    let rig = UpRig::patient();
    for listener in ["api", "rpc"] {
        for path in ["/dup-cl-same", "/cl-list", "/cl-te", "/cl-te-short"] {
            // One response read by its framing: waits for the answer however long it takes,
            // where waiting for a pause in the bytes read nothing when the proxy was slow.
            let r = rig
                .get(listener, path)
                .unwrap_or_else(|e| panic!("[{listener}] {path}: no answer: {e}"));
            let text = format!("{} {:?} {:?}", r.status, r.headers, r.text());
            let framing: Vec<String> = r
                .headers
                .iter()
                .filter(|(n, _)| {
                    n.eq_ignore_ascii_case("content-length")
                        || n.eq_ignore_ascii_case("transfer-encoding")
                })
                .map(|(n, v)| format!("{}: {v}", n.to_ascii_lowercase()))
                .collect();
            eprintln!("[{listener}] {path}: {} {}", r.status, framing.join(", "));
            // RFC 9110 §8.6 lets a recipient fold identical lengths into one; RFC 9112 §6.3 has
            // Transfer-Encoding override Content-Length (which a proxy MUST then remove). Either
            // that, or a 502: never two framing fields.
            if r.status == 502 {
                continue;
            }
            assert_eq!(r.status, 200, "[{listener}] {path}: {text}");
            assert_eq!(
                framing.len(),
                1,
                "[{listener}] {path}: exactly one framing field: {text}"
            );
            assert!(
                !framing.iter().any(|f| f.contains(',')),
                "[{listener}] {path}: {text}"
            );
            // And the body is exactly what the upstream's framing said, read by its relayed
            // framing (Transfer-Encoding wins over Content-Length, RFC 9112 §6.3 item 3).
            assert_eq!(r.text(), "hello", "[{listener}] {path}: {text}");
        }
        rig.normal(listener, 0);
    }
}

#[test]
fn an_extra_response_from_the_upstream_never_reaches_another_request() {
    let rig = UpRig::patient();
    let mut leaked = Vec::new();
    let rounds = 5;
    for i in 0..rounds {
        for listener in ["api", "rpc"] {
            for (method, path, status) in [
                ("GET", "/double", 200),
                ("HEAD", "/head-body", 200),
                ("GET", "/204-body", 204),
                ("GET", "/304-body", 304),
            ] {
                let mut c = rig.conn(listener);
                c.send(format!("{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                    .expect("send");
                let (raw, _) = c.head_then_drain(Duration::from_millis(200));
                let text = String::from_utf8_lossy(&raw).into_owned();
                assert!(
                    text.starts_with(&format!("HTTP/1.1 {status}")),
                    "[{listener}] {method} {path}: {text}"
                );
                if text.contains("SMUGGLED") && path != "/double" {
                    leaked.push(format!(
                        "[{listener}] {method} {path} relayed a body: {text:?}"
                    ));
                }
                // The next request, on a new client connection, must get its own answer: the
                // pooled upstream connection that carried the extra bytes must not be reused.
                let next = format!("/after/{i}");
                match rig.get(listener, &next) {
                    Ok(r) if r.status == 200 && r.text() == next => {}
                    Ok(r) => leaked.push(format!(
                        "[{listener}] {next} after {path} got {} {:?}",
                        r.status,
                        r.text()
                    )),
                    Err(e) => leaked.push(format!("[{listener}] {next} after {path}: {e}")),
                }
            }
        }
    }
    assert!(
        leaked.is_empty(),
        "responses leaked into other requests: {leaked:?}"
    );
}

#[test]
fn connections_the_upstream_closed_are_never_reused_and_keep_alive_ones_are() {
    let rig = UpRig::patient();
    let mut c = rig.conn("api");
    let n = 20;
    let posts = |prefix: &str| -> Vec<RogueHit> {
        rig.rogue
            .hits()
            .into_iter()
            .filter(|h| h.target().starts_with(prefix))
            .collect()
    };
    let mut post = |path: &str| {
        c.request("POST", path, &[("Content-Type", "application/json")], b"{}")
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    };

    // Closed with notice (`Connection: close`): never reused, every POST answered, once each.
    for i in 0..n {
        let path = format!("/announce-close/{i}");
        let r = post(&path);
        assert_eq!((r.status, r.text()), (200, path.clone()), "POST {path}");
    }
    let announced = posts("/announce-close/");
    assert_eq!(announced.len(), n, "each POST exactly once: {announced:?}");
    let conns: std::collections::HashSet<_> = announced.iter().map(|h| h.conn).collect();
    assert_eq!(
        conns.len(),
        n,
        "one upstream connection per closed exchange"
    );

    // Closed without notice right after each response, as a worker that exits does: a POST
    // that meets a connection closing under it may fail (502: RFC 9112 §9.3.1, a proxy MUST
    // NOT retry a non-idempotent request), but it is never sent twice and the proxy goes on.
    let mut failed = 0;
    for i in 0..n {
        let path = format!("/close-after/{i}");
        let r = post(&path);
        match r.status {
            200 => assert_eq!(r.text(), path),
            502 => failed += 1,
            s => panic!("POST {path}: {s} {}", r.text()),
        }
    }
    let silent = posts("/close-after/");
    let mut targets: Vec<_> = silent.iter().map(RogueHit::target).collect();
    targets.sort_unstable();
    targets.dedup();
    assert_eq!(targets.len(), silent.len(), "a POST sent twice: {silent:?}");
    assert!(
        silent.len() >= n - failed,
        "answered POSTs reached the upstream"
    );

    // An upstream that keeps its connections open gets them reused.
    let before = rig.rogue.connections();
    for i in 0..n {
        let path = format!("/kept/{i}");
        let r = c.get(&path).expect("GET");
        assert_eq!((r.status, r.text()), (200, path));
    }
    assert!(
        rig.rogue.connections() - before <= 1,
        "keep-alive upstream connections reused: {} new for {n} requests",
        rig.rogue.connections() - before
    );
}

#[test]
fn a_missing_upstream_socket_gives_502_on_every_listener() {
    let sb = Sandbox::new();
    let sock = sb.socket("absent");
    let proxy = sb
        .proxy()
        .listener("api", Tls::Server, &format!("unix:{}", sock.display()))
        .listener("rpc", Tls::Mutual, &format!("unix:{}", sock.display()))
        .listener("plain", Tls::None, &format!("unix:{}", sock.display()))
        .start();
    let client = sb.ca.client_leaf(&["conductor-0.ironic.test"]);
    for listener in ["api", "rpc", "plain"] {
        for (method, body) in [("GET", &b""[..]), ("POST", &b"{}"[..])] {
            let r = match listener {
                "plain" => HttpConn::tcp(proxy.addr(listener))
                    .expect("connect")
                    .request(method, "/v1/nodes", &[], body),
                _ => {
                    let leaf = (listener == "rpc").then_some(&client);
                    let cfg = tls_client_config(&sb.ca.pem, leaf, &[b"http/1.1"]);
                    HttpConn::tls(proxy.addr(listener), cfg)
                        .expect("connect")
                        .request(method, "/v1/nodes", &[], body)
                }
            }
            .expect("an answer");
            assert_eq!(r.status, 502, "[{listener}] {method}");
            assert_eq!(r.json()["error"], "bad_gateway");
        }
    }
    let up = support::Upstream::start(&sock);
    let mut c = HttpConn::tcp(proxy.addr("plain")).expect("connect");
    assert_eq!(c.get("/back").expect("back").status, 200);
    assert_eq!(up.requests().len(), 1);
}

#[test]
fn a_reset_during_a_large_request_body_gives_502() {
    let rig = UpRig::new();
    for listener in ["api", "rpc"] {
        let mut c = rig.conn(listener);
        let body = vec![b'r'; 512 * 1024];
        let mut raw = format!(
            "POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        raw.extend_from_slice(&body);
        let _ = c.send(&raw);
        let (bytes, _) = c.head_then_drain(Duration::from_secs(3));
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("HTTP/1.1 502"), "[{listener}]: {text}");
        rig.normal(listener, 0);
    }
}

/// An upstream refusing an upload answers before it has read the body and stops reading. The
/// client here sends a first chunk larger than the 64 KiB the proxy buffers (so the body is
/// streamed) and waits for an answer before sending more: the answer must reach it, not a 504
/// after `upstream_timeout` (1 s here) because the proxy waited for the body to be sent first.
#[test]
fn an_answer_before_the_request_body_is_all_sent_reaches_the_client() {
    let rig = UpRig::new();
    let first = vec![b'u'; 96 * 1024];
    for listener in ["api", "rpc"] {
        let mut c = rig.conn(listener);
        let mut raw = format!(
            "POST /early HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            first.len()
        )
        .into_bytes();
        raw.extend_from_slice(&first);
        raw.extend_from_slice(b"\r\n");
        c.send(&raw).expect("send the head and a first chunk");
        let r = c
            .read_response()
            .expect("an answer while the body is unfinished");
        assert_eq!(
            (r.status, r.text()),
            (413, "refused".to_owned()),
            "[{listener}]"
        );
        rig.normal(listener, 0);
    }
    // The connection that carried the unfinished request was never used again.
    let hits = rig.rogue.hits();
    let early: Vec<usize> = hits
        .iter()
        .filter(|h| h.target() == "/early")
        .map(|h| h.conn)
        .collect();
    assert_eq!(early.len(), 2);
    for hit in &hits {
        if hit.target() != "/early" {
            assert!(
                !early.contains(&hit.conn),
                "reused after an unfinished request: {hit:?}"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Client faults are not the upstream's.

#[test]
fn client_faults_never_eject_healthy_upstreams() {
    use backend::{bind_same_port, ip, Backend};
    let ips = [ip(41, 1), ip(41, 2)];
    let listeners = bind_same_port(&ips);
    let port = listeners[0].local_addr().expect("addr").port();
    let backends: Vec<Backend> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| Backend::start(&format!("b{}", i + 1), l))
        .collect();
    let mut dns = dnsmasq::Dnsmasq::start("metal3.svc", 1);
    dns.set_hosts(&[
        ("127.0.41.1", "api.metal3.svc"),
        ("127.0.41.2", "api.metal3.svc"),
    ]);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut lb = node::Lb::new(dns.addr(), &format!("api.metal3.svc:{port}"));
    // Long enough that only passive ejection could take an endpoint out during the attack.
    lb.interval = "10s".into();
    let proxy = node::Node::start(
        dir.path(),
        "lb",
        std::net::IpAddr::from([127, 0, 0, 1]),
        lb.render(),
    );
    proxy.wait_metric(
        "ironic_proxy_upstream_endpoints",
        &[("upstream", "api"), ("state", "healthy")],
        Duration::from_secs(15),
        |v| v == 2.0,
    );
    let load = node::Load::start(proxy.listen, 2, 100_000, Duration::from_secs(20));

    let big_chunk = format!("10000\r\n{}\r\n", "c".repeat(0x10000));
    let attacks: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "malformed small chunked body",
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            false,
        ),
        (
            "malformed chunked body after 128 KiB",
            format!(
                "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{big_chunk}{big_chunk}zz\r\n"
            )
            .into_bytes(),
            false,
        ),
        (
            "client gone after 128 KiB of a 1 MiB body",
            [
                format!("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", 1 << 20)
                    .into_bytes(),
                vec![b'a'; 128 * 1024],
            ]
            .concat(),
            true,
        ),
    ];
    let mut statuses = Vec::new();
    for round in 0..5 {
        for (name, raw, hang_up) in &attacks {
            let mut s = std::net::TcpStream::connect(proxy.listen).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let _ = s.write_all(raw);
            if *hang_up {
                // Exercised: the client hangs up a moment after writing, while the proxy reads
                // or forwards its bytes (the client's pace, not a wait for the proxy).
                std::thread::sleep(Duration::from_millis(100));
                drop(s);
                continue;
            }
            let mut c = HttpConn::new(s);
            let (bytes, _) = c.head_then_drain(Duration::from_secs(2));
            let st = support::status_lines(&bytes);
            statuses.push(format!("{round} {name}: {st:?}"));
            assert_eq!(st, [400], "{name}: a client fault is a 400");
        }
        // Once the proxy has closed every attacking connection (only the load's two remain
        // open), it has finished with their exchanges, and an ejection they caused would show.
        proxy.wait_metric(
            "ironic_proxy_active_connections",
            &[],
            Duration::from_secs(10),
            |v| v <= 2.0,
        );
        let ejected = node::endpoints(&proxy, "ejected");
        assert_eq!(
            ejected, 0.0,
            "round {round}: client faults ejected an upstream"
        );
    }
    let outcomes = load.finish();
    let failed = node::failures(&outcomes);
    eprintln!(
        "{} client-fault requests; concurrent GETs: {} sent, {} failed; endpoints healthy {}",
        statuses.len() + 5,
        outcomes.len(),
        failed.len(),
        node::endpoints(&proxy, "healthy")
    );
    assert!(
        failed.is_empty(),
        "GETs failed during the attack: {:?}",
        &failed[..failed.len().min(5)]
    );
    assert_eq!(node::endpoints(&proxy, "healthy"), 2.0);
    assert!(backends.iter().all(|b| b.hit_count() > 0));
}
