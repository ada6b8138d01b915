//! SIGTERM/SIGINT drain of the real binary: in-flight requests complete, new connections are
//! refused, `/readyz` turns 503, idle keep-alive connections close, connections opened before
//! the signal that had not sent a request yet are answered (`Connection: close`), and the
//! process exits 0 within `limits.drain_timeout`.

use crate::support;

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::{
    curl, json_object, poll_until, tls_client_config, HttpConn, Proxy, Sandbox, Tls, Upstream, HANG,
};

/// True when a new TCP connection to `addr` is refused by the kernel (nothing listens).
fn refused(addr: std::net::SocketAddr) -> bool {
    matches!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused
    )
}

/// Waits for the proxy to exit after its signal: status 0, and the drain ended by itself
/// ("drained"), not at drain_timeout. Returns the log lines.
fn exits_0_drained(proxy: &mut Proxy, why: &str) -> Vec<String> {
    let exit = proxy.wait_exit(HANG);
    assert_eq!(
        exit.and_then(|s| s.code()),
        Some(0),
        "exit status after the signal"
    );
    let logs = proxy.logs();
    assert!(
        logs.iter().any(|l| l.contains("drained"))
            && !logs.iter().any(|l| l.contains("drain timeout")),
        "{why}: {logs:?}"
    );
    logs
}

#[test]
fn sigterm_finishes_in_flight_requests_refuses_new_connections_and_exits_0() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let mut proxy = sb
        .proxy()
        .listener("api", Tls::Server, &up.address())
        .listener("plain", Tls::None, &up.address())
        // Far longer than the slow request: the drain must end with it ("drained"), not with
        // the timeout ("drain timeout"), which the logs tell apart without timing the exit.
        .limit_dur("drain_timeout", "60s")
        .limit_dur("upstream_timeout", "60s")
        .start();
    let api = proxy.addr("api");
    let plain = proxy.addr("plain");

    // An idle keep-alive connection from before the signal.
    let mut idle = HttpConn::tcp(plain).unwrap();
    assert_eq!(idle.get("/warm").unwrap().status, 200);

    // A slow request in flight when the signal arrives, and still while the checks below run
    // (5 s: they wait for events, each normally within milliseconds).
    let ca = sb.path("ca.crt").display().to_string();
    let url = proxy.url("api", "/slow?delay_ms=5000");
    let slow = std::thread::spawn(move || curl(&["--cacert", &ca, "-w", "\n%{http_code}", &url]));
    up.wait_for(2, Duration::from_secs(5));

    let signalled = Instant::now();
    proxy.signal("TERM");

    let readyz = poll_until(HANG, || {
        proxy.admin_get("/readyz").ok().filter(|r| r.status == 503)
    });
    let readyz = readyz.expect("/readyz must answer 503 while draining");
    assert!(readyz.text().contains("draining"), "{}", readyz.text());

    let refused_after = poll_until(HANG, || {
        (refused(api) && refused(plain)).then(|| signalled.elapsed())
    });
    assert!(
        refused_after.is_some(),
        "new connections must be refused while the slow request drains"
    );
    assert!(
        idle.wait_closed(HANG).is_some(),
        "an idle keep-alive connection must not hold up the drain"
    );
    assert!(
        !slow.is_finished(),
        "refused and closed while the slow request was still in flight"
    );

    let out = slow.join().unwrap();
    assert!(out.ok(), "{out:?}");
    let (body, status) = out.stdout.rsplit_once('\n').unwrap();
    assert_eq!(status, "200", "the in-flight request completes: {out:?}");
    assert_eq!(json_object(body)["path"], "/slow");

    exits_0_drained(
        &mut proxy,
        "the drain ended with the request, not at drain_timeout",
    );
    let paths: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/warm", "/slow?delay_ms=5000"]);
}

#[test]
fn a_request_longer_than_drain_timeout_is_cut_and_the_process_exits_0_on_time() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let mut proxy = sb
        .proxy()
        .listener("plain", Tls::None, &up.address())
        .limit_dur("drain_timeout", "1s")
        .limit_dur("upstream_timeout", "120s")
        .start();
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    c.send(b"GET /very-slow?delay_ms=60000 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    up.wait_for(1, Duration::from_secs(5));
    let signalled = Instant::now();
    proxy.signal("TERM");
    // The request would end after 60 s: an exit before that is the drain timeout's. Not before
    // the timeout; the upper bound only catches a hang.
    let exit = proxy.wait_exit(Duration::from_secs(1) + HANG);
    let took = signalled.elapsed();
    assert_eq!(exit.and_then(|s| s.code()), Some(0));
    assert!(
        took >= Duration::from_millis(900),
        "exit {took:?} after SIGTERM with drain_timeout 1s"
    );
    assert!(
        proxy.logs().iter().any(|l| l.contains("drain timeout")),
        "{:?}",
        proxy.logs()
    );
    // The cut connection is closed, not left hanging.
    let (_, closed) = c.drain(HANG);
    assert!(closed);
}

#[test]
fn sigint_drains_like_sigterm() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let mut proxy = sb
        .proxy()
        .listener("plain", Tls::None, &up.address())
        .start();
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    assert_eq!(c.get("/x").unwrap().status, 200);
    proxy.signal("INT");
    // Nothing in flight: the drain ends at once ("drained"), not at drain_timeout.
    exits_0_drained(&mut proxy, "nothing in flight: exit at once");
}

/// A signal sent the moment `/readyz` says 200 is handled, not fatal: the handlers must be in
/// place before the proxy reports ready (a reloader may send SIGHUP right after start, the
/// kubelet SIGTERM). Timing-dependent, so it tries a few starts; it cannot pass by accident.
#[test]
fn signals_sent_right_after_ready_are_handled() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let builder = sb.proxy().listener("api", Tls::Server, &up.address());
    for i in 0..6 {
        let mut proxy = builder.start();
        proxy.signal("HUP");
        proxy.signal("TERM");
        let exit = proxy.wait_exit(Duration::from_secs(5));
        assert_eq!(
            exit.and_then(|s| s.code()),
            Some(0),
            "start {i}: SIGHUP then SIGTERM right after ready must drain and exit 0, got {exit:?}"
        );
    }
}

/// A TLS client over an already connected TCP stream: the handshake runs now.
fn tls_over(
    tcp: TcpStream,
    cfg: std::sync::Arc<rustls::ClientConfig>,
) -> std::io::Result<support::TlsStream> {
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("server name");
    let conn = rustls::ClientConnection::new(cfg, name).map_err(std::io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}

/// Connections the kernel completed before SIGTERM (accepted by the loop, or still in the
/// accept queue) that have not sent a request are not closed unanswered: each one's request,
/// sent after the listener stopped accepting, gets its response with `Connection: close`,
/// then the connection closes. On a plain and a TLS listener (the handshake too runs after
/// the signal). A balancer's client cannot tell a connection closed unanswered from a lost
/// request.
#[test]
fn sigterm_answers_connections_opened_before_it_that_had_not_sent_a_request() {
    const N: usize = 8;
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let mut proxy = sb
        .proxy()
        .listener("api", Tls::Server, &up.address())
        .listener("plain", Tls::None, &up.address())
        .limit_dur("drain_timeout", "60s")
        // The head deadline runs from accept, before the signal: the 2 * N connections are
        // served one after another, so under load the last ones would otherwise meet the
        // sandbox's 5 s deadline and be closed unanswered, as the deadline requires.
        .limit_dur("request_head_timeout", "120s")
        .start();
    let (api, plain) = (proxy.addr("api"), proxy.addr("plain"));
    let open = |addr| {
        let s = TcpStream::connect_timeout(&addr, HANG).expect("connect before the signal");
        s.set_read_timeout(Some(HANG)).unwrap();
        s.set_write_timeout(Some(HANG)).unwrap();
        s
    };
    let plains: Vec<TcpStream> = (0..N).map(|_| open(plain)).collect();
    let tlss: Vec<TcpStream> = (0..N).map(|_| open(api)).collect();

    proxy.signal("TERM");
    assert!(
        proxy.wait_log(HANG, |l| l.contains("draining")).is_some(),
        "no `draining` line: {:?}",
        proxy.logs()
    );
    // Both sockets closed: the connections' tasks have seen the drain (the old code closed
    // them unanswered by then).
    assert!(
        poll_until(HANG, || (refused(api) && refused(plain)).then_some(())).is_some(),
        "the listeners stop accepting on SIGTERM"
    );

    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut answered = 0;
    let check = |what: String, r: std::io::Result<support::Response>| {
        let r = r.unwrap_or_else(|e| panic!("{what}: no answer after SIGTERM: {e}"));
        assert_eq!(r.status, 200, "{what}");
        assert_eq!(
            r.header("connection"),
            Some("close"),
            "{what}: {:?}",
            r.headers
        );
    };
    for (i, s) in plains.into_iter().enumerate() {
        let mut c = HttpConn::new(s);
        check(format!("plain {i}"), c.get(&format!("/plain/{i}")));
        assert!(
            c.wait_closed(HANG).is_some(),
            "plain {i} closes after its answer"
        );
        answered += 1;
    }
    for (i, s) in tlss.into_iter().enumerate() {
        let s = tls_over(s, cfg.clone())
            .unwrap_or_else(|e| panic!("tls {i}: handshake after SIGTERM: {e}"));
        let mut c = HttpConn::new(s);
        check(format!("tls {i}"), c.get(&format!("/tls/{i}")));
        assert!(
            c.wait_closed(HANG).is_some(),
            "tls {i} closes after its answer"
        );
        answered += 1;
    }
    assert_eq!(answered, 2 * N);
    assert_eq!(
        up.all().len(),
        2 * N,
        "every request reached the upstream once"
    );

    let logs = exits_0_drained(
        &mut proxy,
        "the drain ended with the last answer, not at drain_timeout",
    );
    for name in ["api", "plain"] {
        assert!(
            logs.iter().any(|l| l.contains("stopped accepting")
                && l.contains(&format!("listener={name}"))),
            "{name}: no `stopped accepting` line: {logs:?}"
        );
    }
}
