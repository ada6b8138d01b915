//! Every `[limits]` key enforced by the real binary: max_connections, header_bytes,
//! request_head_timeout (slowloris heads and stalled TLS handshakes), body_timeout, idle_timeout
//! and max_body_bytes (Content-Length and chunked), with small values so each runs in seconds.

use crate::support;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::{
    curl, poll_until, python, tls_client_config, HttpConn, Response, Sandbox, Tls, Upstream, HANG,
};

/// Asserts that a connection was cut no earlier than `lo` seconds (a little under its timeout,
/// for the timer's rounding; every caller starts its clock before the proxy's) and before the
/// timeout plus [`HANG`], a bound
/// that only catches a hang; the exact deadlines are the paused-clock tests' (`src/listen/
/// conn.rs`: `deadlines_follow_the_connection_state`; `tests/it/inmem.rs`: the slowloris head
/// and the stalled body).
fn assert_cut(what: &str, took: Duration, lo: f64, timeout: Duration) {
    let s = took.as_secs_f64();
    assert!(
        s >= lo && took < timeout + HANG,
        "{what}: took {took:?}, expected at least {lo}s and no hang past {timeout:?}"
    );
}

#[test]
fn max_connections_closes_extra_connections_at_once_and_counts_them() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("plain", Tls::None)])
        .limit("max_connections", "2")
        .start();
    let addr = proxy.addr("plain");
    let mut c1 = HttpConn::tcp(addr).unwrap();
    let mut c2 = HttpConn::tcp(addr).unwrap();
    assert_eq!(c1.get("/1").unwrap().status, 200);
    assert_eq!(c2.get("/2").unwrap().status, 200);

    let mut c3 = HttpConn::tcp(addr).unwrap();
    // "At once": before any request (the counter below), within a bound that catches a hang.
    let closed = c3.wait_closed(HANG);
    assert!(
        closed.is_some(),
        "third connection must be closed at once, took {closed:?}"
    );
    assert_eq!(
        proxy.metric(
            "ironic_proxy_rejected_connections_total",
            &[("listener", "plain")]
        ),
        1.0
    );
    assert_eq!(
        proxy.metric("ironic_proxy_active_connections", &[("listener", "plain")]),
        2.0
    );
    // The two admitted connections keep working.
    assert_eq!(c1.get("/1b").unwrap().status, 200);

    // A slot frees when a connection closes.
    drop(c2);
    let c4 = poll_until(HANG, || {
        let mut c = HttpConn::tcp(addr).ok()?;
        c.get("/4").ok().filter(|r| r.status == 200).map(|_| c)
    });
    assert!(
        c4.is_some(),
        "a new connection must be admitted once one closed"
    );
    let paths: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/1", "/2", "/1b", "/4"]);
}

#[test]
fn a_hundred_header_fields_are_served_and_more_get_431() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("plain", Tls::None), ("api", Tls::Server)])
        .start();
    // `request` adds Host: 99 more fields make 100, hyper's bound and the framing guard's.
    let names: Vec<String> = (0..100).map(|i| format!("X-Field-{i}")).collect();
    let fields = |n: usize| {
        names[..n]
            .iter()
            .map(|h| (h.as_str(), "v"))
            .collect::<Vec<_>>()
    };
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    let r = c.request("GET", "/hundred", &fields(99), b"").unwrap();
    assert_eq!(r.status, 200, "100 fields: {}", r.text());
    let r = c.get("/after").unwrap();
    assert_eq!(r.status, 200, "the connection carries on");
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    let r = c.request("GET", "/101", &fields(100), b"").unwrap();
    assert_eq!(r.status, 431, "101 fields: {}", r.text());
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    let r = c.request("GET", "/101-tls", &fields(100), b"").unwrap();
    assert_eq!(r.status, 431, "101 fields over TLS: {}", r.text());
    let paths: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        paths,
        ["/hundred", "/after"],
        "the over-long heads never reach the upstream"
    );
    assert_eq!(
        up.all()[0]
            .headers
            .iter()
            .filter(|(n, _)| n.starts_with("x-field-"))
            .count(),
        99,
        "every field forwarded"
    );
}

#[test]
fn headers_larger_than_header_bytes_get_431() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("plain", Tls::None), ("api", Tls::Server)])
        .limit("header_bytes", "65536")
        .start();
    let fits = "a".repeat(60_000);
    let over = "a".repeat(70_000);
    let far_over = "a".repeat(200_000);

    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    let r = c.request("GET", "/fits", &[("X-Pad", &fits)], b"").unwrap();
    assert_eq!(r.status, 200, "a 60 kB head fits in the default 64 KiB");
    for (what, pad) in [("just over", &over), ("far over", &far_over)] {
        let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
        let r = c.request("GET", "/over", &[("X-Pad", pad)], b"").unwrap();
        assert_eq!(r.status, 431, "{what} header_bytes: {}", r.text());
    }
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    let r = c
        .request("GET", "/over-tls", &[("X-Pad", &over)], b"")
        .unwrap();
    assert_eq!(r.status, 431, "over TLS: {}", r.text());

    let paths: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/fits"], "oversized heads never reach the upstream");
}

#[test]
fn http2_headers_larger_than_header_bytes_are_refused() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("api", Tls::Server)])
        .limit("header_bytes", "16384")
        .start();
    let h2 = |pad: usize| {
        let header = format!("X-Pad: {}", "a".repeat(pad));
        curl(&[
            "--http2",
            "--cacert",
            sb.path("ca.crt").to_str().unwrap(),
            "-H",
            &header,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
            &proxy.url("api", "/h2"),
        ])
    };
    assert_eq!(h2(12_000).stdout, "200 2");
    let out = h2(17_000);
    assert_eq!(out.stdout, "431 2", "just over header_bytes: {out:?}");
    // Far over, h2 gives up on the header block as a whole: no response, but nothing forwarded.
    let out = h2(70_000);
    assert!(!out.ok(), "{out:?}");
    assert_eq!(
        up.all().len(),
        1,
        "only the head that fits reached the upstream"
    );
}

/// Writes `chunk` every `every` from another thread until the socket breaks or `stop` is set.
fn trickle(
    s: &TcpStream,
    chunk: &'static [u8],
    every: Duration,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
) {
    let mut w = s.try_clone().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let t = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(8);
        while !stop2.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
            if w.write_all(chunk).is_err() {
                return;
            }
            // Exercised: a slowloris client trickling its bytes.
            std::thread::sleep(every);
        }
    });
    (stop, t)
}

#[test]
fn request_head_timeout_cuts_slowloris_heads_and_stalled_handshakes() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("plain", Tls::None), ("api", Tls::Server)])
        .limit_dur("request_head_timeout", "1s")
        .start();

    // Slowloris: a header line every 100 ms, never the blank line.
    // Timed from before the connect: the proxy's clock starts at accept.
    let start = Instant::now();
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    c.send(b"GET /slowloris HTTP/1.1\r\nHost: x\r\n").unwrap();
    let (stop, t) = trickle(c.stream(), b"X-A: b\r\n", Duration::from_millis(100));
    let closed = c.wait_closed(Duration::from_secs(1) + HANG);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    t.join().unwrap();
    assert!(closed.is_some(), "slowloris connection must be closed");
    assert_cut("slowloris", start.elapsed(), 0.8, Duration::from_secs(1));

    // The next head on a keep-alive connection: timed from its first byte, even when it starts
    // after the connection has been idle for longer than the head timeout (idle_timeout is 10s).
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    assert_eq!(c.get("/first").unwrap().status, 200);
    // Exercised: the connection idles longer than the head timeout before the next head.
    std::thread::sleep(Duration::from_millis(1500));
    let start = Instant::now();
    c.send(b"GET /second HTTP/1.1\r\n").unwrap();
    assert!(
        c.wait_closed(Duration::from_secs(1) + HANG).is_some(),
        "stalled second head"
    );
    assert_cut("second head", start.elapsed(), 0.8, Duration::from_secs(1));

    // TLS: nothing at all, and a ClientHello that stops after its record header.
    for (what, bytes) in [
        ("silent", &b""[..]),
        (
            "partial ClientHello",
            &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01][..],
        ),
    ] {
        let start = Instant::now();
        let mut c = HttpConn::tcp(proxy.addr("api")).unwrap();
        c.send(bytes).unwrap();
        let (data, closed) = c.drain(Duration::from_secs(1) + HANG);
        assert!(closed, "{what}: stalled handshake must be cut");
        assert!(data.len() < 16, "{what}: at most an alert: {data:?}");
        assert_cut(what, start.elapsed(), 0.8, Duration::from_secs(1));
    }
    let paths: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/first"]);
    assert_eq!(
        proxy.metric(
            "ironic_proxy_tls_handshake_failures_total",
            &[("listener", "api"), ("reason", "timeout")]
        ),
        2.0
    );
}

#[test]
fn a_trickling_body_gets_408_within_body_timeout() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("plain", Tls::None)])
        .limit_dur("body_timeout", "1s")
        .start();
    for (path, head, drip) in [
        ("/cl", "Content-Length: 100\r\n", &b"a"[..]),
        (
            "/chunked",
            "Transfer-Encoding: chunked\r\n",
            &b"1\r\na\r\n"[..],
        ),
    ] {
        let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
        let start = Instant::now();
        c.send(format!("POST {path} HTTP/1.1\r\nHost: x\r\n{head}\r\n").as_bytes())
            .unwrap();
        let drip: &'static [u8] = if drip.len() == 1 { b"a" } else { b"1\r\na\r\n" };
        let (stop, t) = trickle(c.stream(), drip, Duration::from_millis(100));
        let r = c.read_response();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        t.join().unwrap();
        let r = r.unwrap_or_else(|e| panic!("{path}: expected a 408, got {e}"));
        assert_eq!(r.status, 408, "{path}: {}", r.text());
        assert_eq!(r.json()["error"], "request_timeout", "{path}");
        assert_cut(path, start.elapsed(), 0.9, Duration::from_secs(1));
    }
    assert!(
        up.requests().is_empty(),
        "no complete request reached the upstream: {:?}",
        up.requests()
    );
}

#[test]
fn idle_keep_alive_connections_are_closed_after_idle_timeout() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("plain", Tls::None), ("api", Tls::Server)])
        .limit_dur("idle_timeout", "1s")
        .start();

    // Busy: a request every 500 ms keeps one connection open well past 1 s.
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    for i in 0..5 {
        assert_eq!(
            c.get(&format!("/busy{i}")).unwrap().status,
            200,
            "request {i}"
        );
        // Exercised: a busy client, one request every 500 ms.
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(up.connections(), 1);

    // Idle after a response: closed about 1 s later, plain and TLS alike.
    let idle = c.wait_closed(Duration::from_secs(1) + HANG);
    assert!(idle.is_some(), "idle keep-alive connection must be closed");
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut t = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    // Timed from before the request: the idle clock starts when the answer is written.
    let start = Instant::now();
    assert_eq!(t.get("/tls").unwrap().status, 200);
    let (data, closed) = t.drain(Duration::from_secs(1) + HANG);
    assert!(
        closed && data.is_empty(),
        "idle TLS connection must be closed: {data:?}"
    );
    assert_cut("idle TLS", start.elapsed(), 0.8, Duration::from_secs(1));
}

#[test]
fn bodies_over_max_body_bytes_get_413_for_content_length_and_chunked() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("plain", Tls::None), ("api", Tls::Server)])
        .limit("max_body_bytes", "1000")
        .start();
    let addr = proxy.addr("plain");

    // Content-Length over the limit: refused from the head, before any body byte is sent.
    let mut c = HttpConn::tcp(addr).unwrap();
    c.send(b"POST /cl-big HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n")
        .unwrap();
    let r = c.read_response().unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"], "payload_too_large");

    // Exactly at the limit: through.
    let mut c = HttpConn::tcp(addr).unwrap();
    let r = c.request("POST", "/cl-max", &[], &[b'a'; 1000]).unwrap();
    assert_eq!(r.status, 200);

    // Chunked over the limit (3 x 400) and under it (2 x 400).
    let chunk = format!("190\r\n{}\r\n", "b".repeat(400));
    for (path, n, want) in [("/chunked-big", 3, 413), ("/chunked-ok", 2, 200)] {
        let mut c = HttpConn::tcp(addr).unwrap();
        let raw = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n",
            chunk.repeat(n)
        );
        c.send(raw.as_bytes()).unwrap();
        let r = c.read_response().unwrap();
        assert_eq!(r.status, want, "{path}: {}", r.text());
        if want == 413 {
            assert_eq!(r.json()["error"], "payload_too_large");
        }
    }

    // curl over TLS: HTTP/1.1 chunked, and with a length (curl sends `Expect: 100-continue` and
    // must get the 413 instead of a 100). HTTP/2 is left out: curl 7.88 reports a framing error
    // when the server ends an upload early with RST_STREAM(NO_ERROR) after a complete response,
    // which is what RFC 9113 §8.1 prescribes and what the proxy sends.
    let body = sb.path("big.bin");
    std::fs::write(&body, vec![b'c'; 2000]).unwrap();
    let data = format!("@{}", body.display());
    let ca = sb.path("ca.crt");
    let ca = ca.to_str().unwrap();
    for extra in [
        &["--http1.1", "-H", "Transfer-Encoding: chunked"][..],
        &["--http1.1"],
    ] {
        let mut args = vec![
            "--cacert",
            ca,
            "--data-binary",
            &data,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ];
        args.extend_from_slice(extra);
        let url = proxy.url("api", "/curl-big");
        args.push(&url);
        let out = curl(&args);
        assert_eq!(out.stdout, "413", "{extra:?}: {out:?}");
    }

    // Python requests (as Ironic's clients use it) sends the whole 6 MiB body before it reads
    // anything: the 413 goes out after 1000 bytes, and the proxy reads and drops the rest before
    // it closes (lingering close). A plain close would leave unread bytes that the kernel answers
    // with a reset, and requests would fail with "Connection reset by peer" instead of reading
    // the 413.
    const PY_UPLOAD: &str = r#"
import sys, requests
r = requests.post(sys.argv[1], data=b"h" * (6 << 20), verify=sys.argv[2])
print(r.status_code, r.json()["error"])
"#;
    let ca_path = sb.path("ca.crt");
    for url in [
        proxy.url("api", "/py-huge"),
        proxy.http_url("plain", "/py-huge"),
    ] {
        let out = python(PY_UPLOAD, &[&url, ca_path.to_str().unwrap()]);
        assert_eq!(out.stdout.trim(), "413 payload_too_large", "{url}: {out:?}");
    }

    let complete: Vec<(String, usize)> = up
        .requests()
        .iter()
        .map(|r| (r.path.clone(), r.body.len()))
        .collect();
    assert_eq!(
        complete,
        [
            ("/cl-max".to_owned(), 1000),
            ("/chunked-ok".to_owned(), 800)
        ],
        "only the bodies within the limit arrive complete"
    );
}

/// hyper's parser answers these heads itself, with an empty body; the proxy replaces that
/// answer with its own JSON error (`listen::conn::Http1`), on a fresh connection, after a
/// served request, and pipelined behind one, over plain HTTP and TLS; each one is counted and
/// gets its access-log line.
#[test]
fn every_refused_head_gets_the_proxy_json_error_body() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("plain", Tls::None), ("api", Tls::Server)])
        .limit("header_bytes", "8192")
        .start();
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    // Past hyper's 8 KiB buffer, small enough to fit the socket buffers whole: the client's
    // write never fails when the proxy stops reading.
    let huge = "a".repeat(20_000);
    let cases: [(&str, String, u16, &str); 3] = [
        (
            "conflicting Content-Length",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
                .to_owned(),
            400,
            "bad_request",
        ),
        (
            "space in a field name",
            "GET / HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n".to_owned(),
            400,
            "bad_request",
        ),
        (
            "20 kB header",
            format!("GET / HTTP/1.1\r\nHost: x\r\nX-Pad: {huge}\r\n\r\n"),
            431,
            "request_header_fields_too_large",
        ),
    ];
    let served = "GET /before HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut refused = 0;
    for (what, raw, status, code) in &cases {
        for before in ["fresh", "after a response", "pipelined"] {
            for tls in [false, true] {
                let what = format!("{what}, {before}, tls {tls}");
                let check = |r: Response| {
                    assert_eq!(r.status, *status, "{what}");
                    assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
                    assert_eq!(r.header("connection"), Some("close"), "{what}");
                    assert_eq!(r.json()["error"], *code, "{what}");
                };
                let exchange = |c: &mut dyn FnMut(&[u8]) -> Response| match before {
                    "fresh" => check(c(raw.as_bytes())),
                    "after a response" => {
                        assert_eq!(c(served.as_bytes()).status, 200, "{what}");
                        check(c(raw.as_bytes()));
                    }
                    _ => {
                        let both = [served.as_bytes(), raw.as_bytes()].concat();
                        assert_eq!(c(&both).status, 200, "{what}");
                        check(c(b""));
                    }
                };
                if tls {
                    let mut c = HttpConn::tls(proxy.addr("api"), cfg.clone()).unwrap();
                    exchange(&mut |b: &[u8]| {
                        c.send(b).unwrap();
                        c.read_response()
                            .unwrap_or_else(|e| panic!("{what}: no response: {e}"))
                    });
                } else {
                    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
                    exchange(&mut |b: &[u8]| {
                        c.send(b).unwrap();
                        c.read_response()
                            .unwrap_or_else(|e| panic!("{what}: no response: {e}"))
                    });
                }
                refused += 1;
            }
        }
    }
    // Two of every three connections also had a request served.
    let lines = proxy.wait_access_logs(refused + refused * 2 / 3, Duration::from_secs(5));
    let refusals: Vec<&String> = lines.iter().filter(|l| l.contains("status=4")).collect();
    assert_eq!(refusals.len(), refused, "{lines:#?}");
    assert!(up.all().iter().all(|r| r.path == "/before"));
}
