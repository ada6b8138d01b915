//! Parking on the paused clock: a connection served over an in-memory pipe, in front of a real
//! HTTP/1.1 upstream on a unix socket in a temp dir. While the test task keeps running, the
//! clock stands still, so "parked with no time passing" is exact.

use super::PARK_AFTER;
use crate::config::{Limits, UpstreamAddr};
use crate::listen::conn::ConnClock;
use crate::listen::serve::ListenerContext;
use crate::listen::Listener;
use crate::metrics::Metrics;
use crate::proxy::pool::{Pool, PoolOptions};
use crate::proxy::{ConnInfo, Proxy};
use crate::tls::trust::LiveChain;
use bytes::Bytes;
use http_body_util::Full;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// An upstream that answers every request 200 with a short body (the listener's tests use it
/// too).
pub(in crate::listen) fn upstream(dir: &tempfile::TempDir) -> UpstreamAddr {
    let sock = dir.path().join("upstream.sock");
    let listener = tokio::net::UnixListener::bind(&sock).expect("bind the upstream socket");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    UpstreamAddr::Unix(sock)
}

/// Serves one client connection like a plain listener's; returns the client's end, the
/// listener's parked-connection gauge and the server's drain switch.
fn connect(addr: UpstreamAddr, limits: &Limits) -> (DuplexStream, Gauge, watch::Sender<bool>) {
    connect_as(addr, limits, false)
}

/// [`connect`], over HTTP/2 (prior knowledge) when `h2`.
fn connect_as(
    addr: UpstreamAddr,
    limits: &Limits,
    h2: bool,
) -> (DuplexStream, Gauge, watch::Sender<bool>) {
    connect_live(addr, limits, h2, None)
}

/// [`connect_as`], as a mutual listener's connection whose client presented `live`'s chain.
pub(super) fn connect_live(
    addr: UpstreamAddr,
    limits: &Limits,
    h2: bool,
    live: Option<Arc<LiveChain>>,
) -> (DuplexStream, Gauge, watch::Sender<bool>) {
    let metrics = Metrics::new();
    let pool = Pool::new(PoolOptions::local("t", addr, 16 * 1024, metrics.clone()));
    let proxy = Arc::new(Proxy::new("t", pool, limits.clone(), metrics));
    let parked = Gauge::default();
    let (client, server) = tokio::io::duplex(64 * 1024);
    let clock = ConnClock::new(
        Instant::now(),
        limits.request_head_timeout,
        limits.idle_timeout,
    );
    let (tx, shutdown) = watch::channel(false);
    let context = ListenerContext {
        proxy,
        limits,
        parked: parked.clone(),
    };
    let conn = Listener::serve(
        context,
        server,
        h2,
        ConnInfo::new(None, live.is_some()),
        live,
        clock,
        shutdown,
    );
    tokio::spawn(conn);
    (client, parked, tx)
}

/// Sends one GET and reads its whole response (the upstream's two-byte body).
pub(super) async fn get(c: &mut DuplexStream, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    c.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !(got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"ok")) {
        let n = c.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Lets every other task run without letting the clock move.
pub(super) async fn settle() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_connection_parks_as_soon_as_its_first_response_is_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = Limits::default();
    let (mut c, parked, _drain) = connect(upstream(&dir), &limits);

    let first = get(&mut c, "/first").await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let answered = Instant::now();
    settle().await;
    assert_eq!(parked.get(), 1, "parked right after its first response");
    assert_eq!(Instant::now(), answered, "and with no time passing");

    // Woken by its second request; from then on it parks after PARK_AFTER of idleness.
    let second = get(&mut c, "/second").await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    settle().await;
    assert_eq!(parked.get(), 0, "a later response does not park at once");
    tokio::time::sleep(PARK_AFTER * 3).await;
    assert_eq!(parked.get(), 1, "parked after PARK_AFTER");
    let third = get(&mut c, "/third").await;
    assert!(third.starts_with("HTTP/1.1 200"), "{third}");
    settle().await;
    assert_eq!(parked.get(), 0);
}

/// The drain reaches a connection that was polled many times since it started (its drain
/// future is polled only when the watch changed): parked or not, it closes at once.
#[tokio::test(start_paused = true)]
async fn the_drain_closes_a_connection_that_has_served_and_waits() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = Limits::default();
    let addr = upstream(&dir);
    for parked_at_drain in [true, false] {
        let (mut c, parked, drain) = connect(addr.clone(), &limits);
        for path in ["/one", "/two", "/three"] {
            assert!(get(&mut c, path).await.starts_with("HTTP/1.1 200"));
        }
        if parked_at_drain {
            tokio::time::sleep(PARK_AFTER * 3).await;
        }
        settle().await;
        assert_eq!(parked.get(), i64::from(parked_at_drain));
        let drained = Instant::now();
        drain.send(true).expect("the connection holds the watch");
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.expect("read");
        assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
        assert_eq!(Instant::now(), drained, "closed at once, not at a timeout");
    }
}

/// A connection that has not sent its first request when the drain begins (accepted just
/// before it, or taken from the accept queue) is not closed unanswered: its first request is
/// served with `Connection: close`, then the connection closes, with no time passing.
#[tokio::test(start_paused = true)]
async fn the_drain_answers_the_first_request_of_a_new_connection_then_closes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = Limits::default();
    let (mut c, _parked, drain) = connect(upstream(&dir), &limits);
    settle().await;
    let drained = Instant::now();
    drain.send(true).expect("the connection holds the watch");
    settle().await;
    let first = get(&mut c, "/first").await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        first
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "{first}"
    );
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.expect("read");
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert_eq!(
        Instant::now(),
        drained,
        "closed after the answer, not at a timeout"
    );
}

/// The wait for that first request is bounded: silent until `request_head_timeout` from
/// accept, the connection closes then, not earlier and not never.
#[tokio::test(start_paused = true)]
async fn a_silent_new_connection_closes_at_the_head_deadline_after_a_drain() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = Limits::default();
    let accepted = Instant::now();
    let (mut c, _parked, drain) = connect(upstream(&dir), &limits);
    drain.send(true).expect("the connection holds the watch");
    settle().await;
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.expect("read");
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    let closed = Instant::now().duration_since(accepted);
    assert!(
        closed >= limits.request_head_timeout,
        "closed after {closed:?}, before the head deadline"
    );
    assert!(
        closed
            <= limits.request_head_timeout + limits.request_head_timeout.min(limits.idle_timeout),
        "closed after {closed:?}"
    );
}

/// The same over HTTP/2: a connection drained before its first stream serves that stream,
/// then ends (hyper's graceful end, GOAWAY): the client's connection closes without error and
/// takes no second stream, with no time passing.
#[tokio::test(start_paused = true)]
async fn the_drain_answers_the_first_http2_stream_of_a_new_connection_then_goes_away() {
    use http_body_util::BodyExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = Limits::default();
    let (c, _parked, drain) = connect_as(upstream(&dir), &limits, true);
    let drained = Instant::now();
    drain.send(true).expect("the connection holds the watch");
    settle().await;
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(c),
    )
    .await
    .expect("HTTP/2 handshake after the drain");
    let conn = tokio::spawn(conn);
    let req = http::Request::get("http://localhost/first")
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("request");
    let resp = send
        .send_request(req)
        .await
        .expect("the first stream is answered");
    assert_eq!(resp.status(), http::StatusCode::OK);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"ok");
    conn.await
        .expect("the client connection task")
        .expect("GOAWAY, then a clean close");
    assert!(
        send.ready().await.is_err(),
        "no second stream after the drain"
    );
    assert_eq!(
        Instant::now(),
        drained,
        "ended after the stream, not at a timeout"
    );
}
