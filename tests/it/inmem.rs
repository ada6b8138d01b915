//! Framing, header and limit cases in memory: the client is one end of a `tokio::io::duplex`,
//! the other end is served by `ironic_proxy::serve_stream` (a listener's connection handling,
//! without the accept loop or TLS), and the upstream is a real HTTP/1.1 server (hyper) on a
//! unix socket in a temp dir that records every request head it receives.
//!
//! The runtime's clock is paused: timeouts fire as soon as nothing else can run, so a 2 s head
//! timeout takes no wall time and is measured exactly on the virtual clock. The same cases run
//! against the real binary and real clients in `adversarial_framing`, `adversarial_limits` and
//! `sidecar_forwarding`; these show the connection layer's part on its own, with no ports and
//! no sleeps.

use crate::support;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ironic_proxy::config::{Limits, UpstreamAddr};
use ironic_proxy::{serve_stream, ConnInfo, Metrics, Pool, PoolOptions, Proxy};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::UnixListener;
use tokio::time::Instant;

/// Longer than every timeout of [`limits`]: a connection still open then is a bug.
const GIVE_UP: Duration = Duration::from_secs(600);

/// The adversarial suites' limits (docs/adversarial.md): short timeouts, 16 KiB of header.
fn limits() -> Limits {
    Limits {
        max_connections: 16,
        header_bytes: 16 * 1024,
        request_head_timeout: Duration::from_secs(2),
        body_timeout: Duration::from_secs(3),
        idle_timeout: Duration::from_secs(2),
        upstream_timeout: Duration::from_secs(30),
        max_body_bytes: 1024 * 1024,
        drain_timeout: Duration::from_secs(1),
        idle_trim: Duration::ZERO,
        upstream_connections: 128,
        handover: false,
    }
}

/// One request head as the upstream received it.
#[derive(Debug)]
struct Head {
    path: String,
    headers: http::HeaderMap,
}

/// The proxy of one listener in front of a recording upstream; the temp dir holds its socket.
struct Rig {
    proxy: Arc<Proxy>,
    limits: Limits,
    seen: Arc<Mutex<Vec<Head>>>,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// Must run inside the test's runtime: the upstream is a task on it.
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let sock = dir.path().join("upstream.sock");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let listener = UnixListener::bind(&sock).expect("bind the upstream socket");
        tokio::spawn(upstream(listener, seen.clone()));
        let limits = limits();
        let metrics = Metrics::new();
        let pool = Pool::new(PoolOptions::local(
            "inmem",
            UpstreamAddr::Unix(sock),
            limits.header_bytes,
            metrics.clone(),
        ));
        let proxy = Arc::new(Proxy::new("inmem", pool, limits.clone(), metrics));
        Self {
            proxy,
            limits,
            seen,
            _dir: dir,
        }
    }

    /// A client connection, served like a plain (`tls = "none"`) listener's over HTTP/1.1.
    fn connect(&self) -> DuplexStream {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let info = ConnInfo::new(Some(([127, 0, 0, 1], 40000).into()), false);
        let (proxy, limits) = (self.proxy.clone(), self.limits.clone());
        tokio::spawn(async move { serve_stream(server, false, proxy, info, &limits).await });
        client
    }

    /// Sends `raw` on a new connection and reads until the proxy closes it: what it answered,
    /// and when it closed (on the paused clock) from the first byte written.
    async fn send(&self, raw: &[u8]) -> (Vec<u8>, Duration) {
        let mut c = self.connect();
        let started = Instant::now();
        c.write_all(raw).await.expect("write");
        read_until_closed(&mut c, started).await
    }

    /// Asserts that `raw` gets one answer, `status`, then a close, and that nothing reached
    /// the upstream; returns when the connection closed.
    async fn assert_refused(&self, raw: &[u8], status: u16) -> Duration {
        let (got, closed) = self.send(raw).await;
        assert_eq!(support::status_lines(&got), [status], "{:?}", text(&got));
        assert!(self.paths().is_empty(), "forwarded: {:?}", self.paths());
        closed
    }

    /// A request the proxy forwards: the rig still serves after a refusal.
    async fn assert_serves(&self) {
        let (got, _) = self
            .send(b"GET /after HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await;
        assert_eq!(support::status_lines(&got), [200], "{:?}", text(&got));
        assert_eq!(self.paths().last().map(String::as_str), Some("/after"));
    }

    /// Paths the upstream has received, in order.
    fn paths(&self) -> Vec<String> {
        self.seen
            .lock()
            .expect("seen")
            .iter()
            .map(|h| h.path.clone())
            .collect()
    }
}

async fn upstream(listener: UnixListener, seen: Arc<Mutex<Vec<Head>>>) {
    while let Ok((stream, _)) = listener.accept().await {
        let seen = seen.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    seen.lock().expect("seen").push(Head {
                        path: req.uri().path().to_owned(),
                        headers: req.headers().clone(),
                    });
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                        b"{\"ok\":true}",
                    ))))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn read_until_closed(
    conn: &mut (impl AsyncRead + Unpin),
    started: Instant,
) -> (Vec<u8>, Duration) {
    let mut got = Vec::new();
    tokio::time::timeout(GIVE_UP, conn.read_to_end(&mut got))
        .await
        .expect("the proxy closes the connection")
        .expect("read");
    (got, started.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Content-Length with Transfer-Encoding (RFC 9112 §6.3 (3): reject, or use TE and close): we
/// reject with 400 and close, so the request hidden in the body, `/tail`, never becomes one.
#[tokio::test(start_paused = true)]
async fn content_length_with_transfer_encoding_is_refused_and_the_smuggled_request_never_sent() {
    let rig = Rig::start();
    rig.assert_refused(
        b"POST /a HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\
          Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /tail HTTP/1.1\r\nHost: localhost\r\n\r\n",
        400,
    )
    .await;
    rig.assert_serves().await;
}

/// Two different Content-Length values (RFC 9112 §6.3 (5)): 400, close, nothing forwarded.
#[tokio::test(start_paused = true)]
async fn conflicting_content_lengths_are_refused() {
    let rig = Rig::start();
    rig.assert_refused(
        b"POST /a HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n\
          hello!",
        400,
    )
    .await;
    rig.assert_serves().await;
}

/// A header block over `header_bytes` (16 KiB here): 431 (RFC 6585 §5), close, nothing
/// forwarded. Just under the limit is served, so the limit is the one configured.
#[tokio::test(start_paused = true)]
async fn a_header_block_over_the_limit_gets_431_and_is_not_forwarded() {
    let rig = Rig::start();
    let head = |filler: usize| {
        format!(
            "GET /big HTTP/1.1\r\nHost: localhost\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(filler)
        )
    };
    rig.assert_refused(head(100 * 1024).as_bytes(), 431).await;
    let (got, _) = rig.send(head(12 * 1024).as_bytes()).await;
    assert_eq!(support::status_lines(&got), [200], "{:?}", text(&got));
    assert_eq!(rig.paths(), ["/big"]);
}

/// A slowloris head, one byte every 200 ms, never finishes: the connection is closed at
/// `request_head_timeout` (2 s) from its first byte, however steadily it trickles, without an
/// answer or with 408 (RFC 9110 §15.5.9), and nothing is forwarded.
#[tokio::test(start_paused = true)]
async fn a_slowloris_head_is_cut_at_the_head_timeout() {
    let rig = Rig::start();
    let (mut rd, mut wr) = tokio::io::split(rig.connect());
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        let head = b"GET /slow HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
        for b in head.iter().chain(std::iter::repeat(&b'a')) {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            // Exercised: the client trickles its head; on the paused clock this costs no time.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let (got, closed) = read_until_closed(&mut rd, started).await;
    trickle.abort();
    let statuses = support::status_lines(&got);
    assert!(statuses.is_empty() || statuses == [408], "{:?}", text(&got));
    assert!(
        closed >= Duration::from_secs(2) && closed < Duration::from_millis(2300),
        "closed after {closed:?}, the head timeout is 2 s"
    );
    assert!(rig.paths().is_empty(), "forwarded: {:?}", rig.paths());
}

/// A body that stops after 10 of its 100 bytes: 408 at `body_timeout` (3 s), and the upstream
/// never sees a request it could not complete (bodies this small are buffered first).
#[tokio::test(start_paused = true)]
async fn a_stalled_body_gets_408_at_the_body_timeout() {
    let rig = Rig::start();
    let closed = rig
        .assert_refused(
            b"POST /stall HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n0123456789",
            408,
        )
        .await;
    assert!(
        closed >= Duration::from_secs(3) && closed < Duration::from_millis(3300),
        "answered after {closed:?}, the body timeout is 3 s"
    );
}

/// Hop-by-hop fields (RFC 9110 §7.6.1), including those the client names in `Connection`, do
/// not reach the upstream; the end-to-end ones do, with `X-Forwarded-For` added.
#[tokio::test(start_paused = true)]
async fn hop_by_hop_fields_stay_on_the_client_connection() {
    let rig = Rig::start();
    let (got, _) = rig
        .send(
            b"GET /v1/nodes HTTP/1.1\r\nHost: localhost\r\nConnection: close, X-Secret\r\n\
              X-Secret: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nX-Kept: yes\r\n\r\n",
        )
        .await;
    assert_eq!(support::status_lines(&got), [200], "{:?}", text(&got));
    let seen = rig.seen.lock().expect("seen");
    let [head] = seen.as_slice() else {
        panic!("one request reaches the upstream: {seen:?}");
    };
    assert_eq!(head.path, "/v1/nodes");
    for gone in ["x-secret", "keep-alive", "te"] {
        assert!(
            !head.headers.contains_key(gone),
            "{gone} forwarded: {head:?}"
        );
    }
    assert_eq!(
        head.headers.get("x-kept").map(|v| v.as_bytes()),
        Some(&b"yes"[..])
    );
    assert_eq!(
        head.headers.get("x-forwarded-for").map(|v| v.as_bytes()),
        Some(&b"127.0.0.1"[..])
    );
}

/// A response that keeps the connection tells the client how long an idle connection stays
/// open (`Keep-Alive: timeout=N`, the listener's `idle_timeout`), and the connection does close
/// once idle that long; a response that ends the connection says nothing of the kind.
#[tokio::test(start_paused = true)]
async fn kept_connections_are_told_the_idle_timeout_they_get() {
    let rig = Rig::start();
    let (got, closed) = rig
        .send(b"GET /v1/nodes HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await;
    let got = text(&got).to_ascii_lowercase();
    assert!(got.starts_with("http/1.1 200"), "{got:?}");
    assert!(got.contains("\r\nkeep-alive: timeout=2\r\n"), "{got:?}");
    assert!(
        closed >= rig.limits.idle_timeout,
        "closed after {closed:?}, before the {:?} advertised",
        rig.limits.idle_timeout
    );

    let (got, _) = rig
        .send(b"GET /v1/nodes HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await;
    let got = text(&got).to_ascii_lowercase();
    assert!(got.starts_with("http/1.1 200"), "{got:?}");
    assert!(!got.contains("keep-alive"), "{got:?}");
}
