//! Parked HTTP/1.1 connections, against the real binary: a keep-alive connection idle for a
//! tenth of a second gives its HTTP buffers back (`ironic_proxy_parked_connections` counts it), and its
//! next request is served exactly as on a connection that never parked: the same headers
//! reach the upstream (the client certificate's identity included), pipelined requests keep
//! their order, a smuggling head is refused as anywhere else, and the drain and a closing
//! client end a parked connection at once.

use crate::support;

use std::time::{Duration, Instant};
use support::{poll_until, tls_client_config, HttpConn, Sandbox, Stream, Tls, Upstream};

/// How long a connection may take to park: it parks between 1 and 2 s of idleness, on a
/// loaded test machine later.
const PARKS_WITHIN: Duration = Duration::from_secs(10);

fn parked(proxy: &support::Proxy, listener: &str) -> f64 {
    proxy.metric("ironic_proxy_parked_connections", &[("listener", listener)])
}

/// Waits until `listener` has `n` parked connections.
fn wait_parked(proxy: &support::Proxy, listener: &str, n: f64) {
    let seen = poll_until(PARKS_WITHIN, || {
        (parked(proxy, listener) == n).then_some(())
    });
    assert!(
        seen.is_some(),
        "{listener}: expected {n} parked connections, have {}",
        parked(proxy, listener)
    );
}

/// One request, a park, then the next request on the same connection: both answered, and the
/// upstream receives the same headers for both.
fn park_and_reuse<S: Stream>(
    proxy: &support::Proxy,
    up: &Upstream,
    listener: &str,
    c: &mut HttpConn<S>,
) {
    let before = up.all().len();
    assert_eq!(c.get(&format!("/{listener}/before")).unwrap().status, 200);
    wait_parked(proxy, listener, 1.0);
    assert_eq!(
        proxy.metric("ironic_proxy_active_connections", &[("listener", listener)]),
        1.0,
        "{listener}: a parked connection is still open"
    );
    let r = c.get(&format!("/{listener}/after")).unwrap();
    assert_eq!(r.status, 200, "{listener}: {}", r.text());
    assert_eq!(
        parked(proxy, listener),
        0.0,
        "{listener}: woken by its request"
    );
    let seen = up.all();
    let [a, b] = &seen[before..] else {
        panic!("{listener}: two requests expected upstream: {seen:?}")
    };
    assert_eq!(a.path, format!("/{listener}/before"));
    assert_eq!(b.path, format!("/{listener}/after"));
    let names = |r: &support::upstream::Recorded| {
        let mut h: Vec<(String, String)> = r
            .headers
            .iter()
            .filter(|(n, _)| n != "x-request-id")
            .cloned()
            .collect();
        h.sort();
        h
    };
    assert_eq!(
        names(a),
        names(b),
        "{listener}: the upstream sees the same headers before and after the park"
    );
}

#[test]
fn an_idle_keep_alive_connection_parks_and_serves_its_next_request_unchanged() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(
            &up,
            &[
                ("plain", Tls::None),
                ("api", Tls::Server),
                ("json-rpc", Tls::Mutual),
            ],
        )
        .start();

    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    park_and_reuse(&proxy, &up, "plain", &mut c);

    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut t = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    park_and_reuse(&proxy, &up, "api", &mut t);

    let leaf = sb.ca.client_leaf(&["conductor-1.ironic.test"]);
    let cfg = tls_client_config(&sb.ca.pem, Some(&leaf), &[b"http/1.1"]);
    let mut m = HttpConn::tls(proxy.addr("json-rpc"), cfg).unwrap();
    park_and_reuse(&proxy, &up, "json-rpc", &mut m);
    let xfcc = up
        .all()
        .last()
        .unwrap()
        .header("x-forwarded-client-cert")
        .map(str::to_owned);
    assert!(
        xfcc.as_deref()
            .is_some_and(|v| v.contains("conductor-1.ironic.test")),
        "the client certificate's identity survives the park: {xfcc:?}"
    );

    // Parked again, then two requests in one write: both answered, in order.
    wait_parked(&proxy, "api", 1.0);
    t.send(
        b"GET /api/p1 HTTP/1.1\r\nHost: localhost\r\n\r\nGET /api/p2 HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .unwrap();
    for want in ["/api/p1", "/api/p2"] {
        let r = t.read_response().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(support::json_object(&r.text())["path"], want);
    }
    assert_eq!(
        up.connections(),
        3,
        "one upstream connection per listener, reused throughout"
    );
}

#[test]
fn a_woken_connection_refuses_smuggling_and_malformed_heads_as_a_fresh_one() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb.proxy_to(&up, &[("api", Tls::Server)]).start();
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut t = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    assert_eq!(t.get("/first").unwrap().status, 200);
    wait_parked(&proxy, "api", 1.0);
    // Both framings at once: the framing guard refuses it, woken connection or not.
    t.send(
        b"POST /smuggled HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\
          Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /inner HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .unwrap();
    let r = t.read_response().unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    // A head hyper's parser refuses on a woken connection: the proxy's JSON error replaces
    // hyper's empty answer, as on a fresh connection.
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut t = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    assert_eq!(t.get("/second").unwrap().status, 200);
    wait_parked(&proxy, "api", 1.0);
    t.send(b"GET /bad HTTP/1.1\r\nHost: localhost\r\nno colon here\r\n\r\n")
        .unwrap();
    let r = t.read_response().unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let paths: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        paths,
        ["/first", "/second"],
        "nothing after the refused head reaches the upstream"
    );
}

#[test]
fn a_parked_connection_ends_when_its_client_closes_or_the_server_drains() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let mut proxy = sb
        .proxy_to(&up, &[("api", Tls::Server)])
        .limit_dur("drain_timeout", "5s")
        .start();
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);

    // The client goes away while parked: no longer counted, not open.
    let mut gone = HttpConn::tls(proxy.addr("api"), cfg.clone()).unwrap();
    assert_eq!(gone.get("/gone").unwrap().status, 200);
    wait_parked(&proxy, "api", 1.0);
    drop(gone);
    let closed = poll_until(Duration::from_secs(5), || {
        (parked(&proxy, "api") == 0.0
            && proxy.metric("ironic_proxy_active_connections", &[("listener", "api")]) == 0.0)
            .then_some(())
    });
    assert!(
        closed.is_some(),
        "a parked connection whose client closed must end"
    );

    // The server drains: the parked connection closes at once, the process exits 0 long
    // before drain_timeout.
    let mut idle = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    assert_eq!(idle.get("/idle").unwrap().status, 200);
    wait_parked(&proxy, "api", 1.0);
    let signalled = Instant::now();
    proxy.signal("TERM");
    assert!(
        idle.wait_closed(Duration::from_secs(3)).is_some(),
        "a parked connection must not hold up the drain"
    );
    let exit = proxy.wait_exit(Duration::from_secs(6));
    assert_eq!(exit.and_then(|s| s.code()), Some(0));
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "exited {:?} after SIGTERM with only a parked connection open",
        signalled.elapsed()
    );
}
