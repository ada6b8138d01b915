//! Trust changes close distrusted connections at once (issue 53): after the trust bundle drops
//! a CA, every mutual-TLS connection whose client chain came from it is closed within
//! `watch_interval`, idle or not, without the client sending anything. A request in flight is
//! answered first (`Connection: close` on HTTP/1.1, GOAWAY on HTTP/2). A connection from a CA
//! still trusted carries on. Each close is counted in
//! `ironic_proxy_untrusted_connections_closed_total` and logged once, naming the listener and
//! the client.
//!
//! Each test waits for the event it needs (the listener's "TLS configuration follows the new
//! identity" log line, a close log line, the socket's EOF, the upstream receiving a request);
//! the timeouts only bound a failure.

use crate::support::upstream::{default_reply, Recorded, Responder};
use crate::support::{tls_client_config, Ca, HttpConn, Proxy, Sandbox, Tls, Upstream, IO_TIMEOUT};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

const CLOSED: &str = "ironic_proxy_untrusted_connections_closed_total";

/// Writes `contents` next to `dest` and renames it over `dest`, as a Secret update does.
fn rename_over(dest: &Path, contents: &str) {
    let tmp = dest.with_extension("tmp");
    std::fs::write(&tmp, contents).expect("write");
    std::fs::rename(&tmp, dest).expect("rename");
}

/// A sandbox trusting its own CA and a second one (a CA rotation under way).
fn rotating() -> (Sandbox, Ca) {
    let sb = Sandbox::new();
    let ca2 = Ca::new("ironic-proxy second test CA");
    rename_over(&sb.path("ca.crt"), &format!("{}{}", sb.ca.pem, ca2.pem));
    (sb, ca2)
}

/// A proxy whose connections no timeout closes while a test runs (an hour each, against the
/// sandbox's seconds): a connection that closes was closed by the trust change.
fn proxy_without_timeouts(sb: &Sandbox, listener: &str, up: &Upstream) -> Proxy {
    sb.proxy()
        .listener(listener, Tls::Mutual, &up.address())
        .watch_interval("100ms")
        .limit_dur("idle_timeout", "1h")
        .limit_dur("request_head_timeout", "1h")
        .start()
}

/// The rotation's last step: the sandbox's CA leaves the bundle; returns once `listener`
/// follows the new trust.
fn drop_first_ca(sb: &Sandbox, ca2: &Ca, proxy: &Proxy, listener: &str) {
    rename_over(&sb.path("ca.crt"), &ca2.pem);
    proxy
        .wait_log(IO_TIMEOUT, |l| {
            l.contains("TLS configuration follows the new identity") && l.contains(listener)
        })
        .expect("the listener follows the new trust within the watch interval");
}

#[test]
fn idle_clients_of_a_ca_dropped_from_trust_are_disconnected_without_sending_anything() {
    let (sb, ca2) = rotating();
    let up = Upstream::start(&sb.socket("rpc"));
    let proxy = proxy_without_timeouts(&sb, "json-rpc", &up);
    let addr = proxy.addr("json-rpc");
    let old_leaf = sb.ca.client_leaf(&["conductor-1.ironic.test"]);
    let new_leaf = ca2.client_leaf(&["conductor-2.ironic.test"]);
    let old_cfg = tls_client_config(&sb.ca.pem, Some(&old_leaf), &[b"http/1.1"]);
    let new_cfg = tls_client_config(&sb.ca.pem, Some(&new_leaf), &[b"http/1.1"]);
    // Idle after a request (a pooled keep-alive connection), and idle since its handshake.
    let mut used = HttpConn::tls(addr, old_cfg.clone()).expect("CA 1 client connects");
    let mut silent = HttpConn::tls(addr, old_cfg).expect("CA 1 client connects");
    let mut kept = HttpConn::tls(addr, new_cfg).expect("CA 2 client connects");
    for (conn, path) in [(&mut used, "/old/1"), (&mut kept, "/new/1")] {
        let r = conn.get(path).expect("answered");
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("connection"), None, "{path}: keep-alive");
    }
    let used_addr = used.stream().get_ref().local_addr().expect("local address");

    drop_first_ca(&sb, &ca2, &proxy, "json-rpc");
    // Neither sends a byte: the proxy closes both (a clean TLS close, no response).
    for (name, conn) in [("used", &mut used), ("silent", &mut silent)] {
        assert!(
            conn.wait_closed(IO_TIMEOUT).is_some(),
            "{name}: the proxy closes the idle distrusted connection"
        );
    }
    let logged = proxy
        .wait_log(IO_TIMEOUT, |l| {
            l.contains("no longer verifies") && l.contains(&used_addr.to_string())
        })
        .expect("the close is logged with the client's address");
    assert!(
        logged.contains("json-rpc")
            && logged.contains("conductor-1.ironic.test")
            && logged.contains("in_flight=0")
            && logged.contains("INFO"),
        "{logged}"
    );
    assert_eq!(proxy.metric(CLOSED, &[("listener", "json-rpc")]), 2.0);
    let closes = proxy
        .logs()
        .iter()
        .filter(|l| l.contains("no longer verifies"))
        .count();
    assert_eq!(closes, 2, "one line per closed connection");

    // CA 2's connection verifies against the new bundle and carries on.
    for path in ["/new/2", "/new/3"] {
        let r = kept.get(path).expect("answered");
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("connection"), None, "{path}: still keep-alive");
    }
    let paths: Vec<String> = up.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/old/1", "/new/1", "/new/2", "/new/3"]);
    assert_eq!(
        proxy.metric(CLOSED, &[("listener", "json-rpc")]),
        2.0,
        "only the distrusted connections were closed"
    );
}

#[test]
fn a_request_in_flight_when_its_ca_is_dropped_is_answered_with_connection_close() {
    let (sb, ca2) = rotating();
    // The upstream holds `/slow` until the test releases it, and says when it has it.
    let (arrived_tx, arrived) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let gate = Mutex::new((arrived_tx, released));
    let up = Upstream::start_with(
        &sb.socket("rpc"),
        Arc::new(move |r: &Recorded| {
            if r.path == "/slow" {
                let gate = gate.lock().expect("gate");
                gate.0.send(()).expect("the test waits");
                gate.1.recv_timeout(IO_TIMEOUT).expect("released");
            }
            default_reply(r)
        }) as Responder,
    );
    let proxy = proxy_without_timeouts(&sb, "json-rpc", &up);
    let leaf = sb.ca.client_leaf(&["conductor-1.ironic.test"]);
    let cfg = tls_client_config(&sb.ca.pem, Some(&leaf), &[b"http/1.1"]);
    let mut conn = HttpConn::tls(proxy.addr("json-rpc"), cfg).expect("connects");
    conn.send(b"GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .expect("send");
    arrived
        .recv_timeout(IO_TIMEOUT)
        .expect("the request reaches the upstream");

    drop_first_ca(&sb, &ca2, &proxy, "json-rpc");
    let logged = proxy
        .wait_log(IO_TIMEOUT, |l| l.contains("no longer verifies"))
        .expect("found at the change, while the request is in flight");
    assert!(logged.contains("in_flight=1"), "{logged}");
    release.send(()).expect("the upstream waits");
    let r = conn
        .read_response()
        .expect("the request in flight is answered");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"));
    assert!(
        conn.wait_closed(IO_TIMEOUT).is_some(),
        "the proxy closes the connection after the answer"
    );
    assert_eq!(proxy.metric(CLOSED, &[("listener", "json-rpc")]), 1.0);
}

#[test]
fn an_idle_http2_connection_of_a_ca_dropped_from_trust_gets_goaway() {
    let (sb, ca2) = rotating();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = proxy_without_timeouts(&sb, "api", &up);
    let addr = proxy.addr("api");
    let leaf = sb.ca.client_leaf(&["conductor-1.ironic.test"]);
    let cfg = tls_client_config(&sb.ca.pem, Some(&leaf), &[b"h2"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
        let tls = tokio_rustls::TlsConnector::from(cfg)
            .connect(name, tcp)
            .await
            .expect("handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .expect("HTTP/2 handshake");
        let mut conn = tokio::spawn(conn);
        let get = |path: &str| {
            http::Request::get(format!("https://localhost{path}"))
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .expect("request")
        };
        let r = sender.send_request(get("/h2/1")).await.expect("answered");
        assert_eq!(r.status(), 200);

        drop_first_ca(&sb, &ca2, &proxy, "api");
        // No request: the proxy sends GOAWAY and closes; hyper's client ends cleanly.
        let ended = tokio::time::timeout(IO_TIMEOUT, &mut conn).await;
        assert!(
            matches!(ended, Ok(Ok(Ok(())))),
            "the proxy ends the idle connection gracefully (GOAWAY, then close): {ended:?}"
        );
        assert!(
            sender.send_request(get("/h2/2")).await.is_err(),
            "no request after the close"
        );
    });
    assert_eq!(proxy.metric(CLOSED, &[("listener", "api")]), 1.0);
    let paths: Vec<String> = up.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/h2/1"]);
}
