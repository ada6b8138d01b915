//! Trust changes reach idle connections, on the paused clock: mutual-TLS connections (their
//! client chains from real CAs, checked by the listener's real verifier, see `tls::trust`)
//! served over in-memory pipes. A connection whose chain the new trust no longer verifies is
//! closed with no time passing, so never by a timeout; one in flight gets its answer first.

use super::tests::{connect_live, get, settle, upstream};
use crate::config::{Limits, UpstreamAddr};
use crate::identity::Material;
use crate::pki::GeneratedCa;
use crate::tls::trust::tests::{ca, client_chain, material, publish};
use crate::tls::trust::{ListenerTrust, LiveChain};
use crate::tls::{listener_tls, Reloadable, ReloadableServer, TlsMode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// A mutual listener's TLS following published identity generations; CA 1 and CA 2 trusted at
/// first.
struct Trust {
    dir: tempfile::TempDir,
    ca1: GeneratedCa,
    ca2: GeneratedCa,
    tx: watch::Sender<Arc<Material>>,
    tls: Arc<ReloadableServer>,
    listener: Arc<ListenerTrust>,
    closed: Counter,
}

impl Trust {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ca1, ca2) = (ca("ca-1"), ca("ca-2"));
        let both = format!("{}{}", ca1.cert_pem, ca2.cert_pem);
        let (tx, rx) = watch::channel(Arc::new(material(dir.path(), &ca1, &both)));
        let (tls, _follower) = Reloadable::follow(rx, "api".to_owned(), |m| {
            listener_tls(m, TlsMode::Mutual, true)
        })
        .expect("listener TLS");
        let closed = Counter::default();
        let listener = ListenerTrust::new("api".to_owned(), tls.clone(), closed.clone());
        Self {
            dir,
            ca1,
            ca2,
            tx,
            tls,
            listener,
            closed,
        }
    }

    /// A connection's chain from `ca`, verified at its handshake under the current trust.
    fn live(&self, ca: &GeneratedCa) -> Arc<LiveChain> {
        let (generation, current) = self.tls.load_with_generation();
        let trust = current.clients.as_ref().expect("a mutual listener");
        Arc::new(LiveChain::new(
            self.listener.clone(),
            client_chain(ca),
            generation,
            trust,
        ))
    }

    /// The rotation's last step: CA 1 leaves the trust bundle.
    async fn drop_ca1(&self) {
        let m = material(self.dir.path(), &self.ca2, &self.ca2.cert_pem);
        publish(&self.tx, &self.tls, m).await;
    }
}

/// Reads until the server closes; what it sent on the way.
async fn until_closed(c: &mut DuplexStream) -> String {
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.expect("read");
    String::from_utf8_lossy(&rest).into_owned()
}

#[tokio::test(start_paused = true)]
async fn idle_connections_of_a_ca_dropped_from_trust_close_when_it_changes_others_stay() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = Limits::default();
    let addr = upstream(&dir);
    let trust = Trust::new();
    let connect = |ca| connect_live(addr.clone(), &limits, false, Some(trust.live(ca)));
    // Parked after its first response; idle after a few, not parked yet; never asked
    // anything since its handshake.
    let (mut parked, gauge, _d1) = connect(&trust.ca1);
    assert!(get(&mut parked, "/p").await.starts_with("HTTP/1.1 200"));
    let (mut busy, _, _d2) = connect(&trust.ca1);
    for path in ["/b1", "/b2"] {
        assert!(get(&mut busy, path).await.starts_with("HTTP/1.1 200"));
    }
    let (mut fresh, _, _d3) = connect(&trust.ca1);
    let (mut kept, _, _d4) = connect(&trust.ca2);
    assert!(get(&mut kept, "/k1").await.starts_with("HTTP/1.1 200"));
    settle().await;
    assert_eq!(gauge.get(), 1, "the first connection is parked");
    assert_eq!(trust.closed.get(), 0);

    let changed = Instant::now();
    trust.drop_ca1().await;
    for (name, c) in [
        ("parked", &mut parked),
        ("idle", &mut busy),
        ("fresh", &mut fresh),
    ] {
        let sent = until_closed(c).await;
        assert!(sent.is_empty(), "{name}: closed silently, got {sent:?}");
    }
    assert_eq!(
        Instant::now(),
        changed,
        "closed at the change, not by a timeout"
    );
    assert_eq!(trust.closed.get(), 3, "each close counted once");

    // CA 2's connection still verifies: it carries on, keep-alive.
    let r = get(&mut kept, "/k2").await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(!r.to_ascii_lowercase().contains("connection: close"), "{r}");
    assert_eq!(trust.closed.get(), 3);
}

/// An upstream that answers `ok` once `release` is notified, after notifying `arrived`.
fn gated_upstream(
    dir: &tempfile::TempDir,
    arrived: Arc<Notify>,
    release: Arc<Notify>,
) -> UpstreamAddr {
    let sock = dir.path().join("gated.sock");
    let listener = tokio::net::UnixListener::bind(&sock).expect("bind the upstream socket");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (arrived, release) = (arrived.clone(), release.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let (arrived, release) = (arrived.clone(), release.clone());
                    async move {
                        arrived.notify_one();
                        release.notified().await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(b"ok"),
                        )))
                    }
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

#[tokio::test(start_paused = true)]
async fn a_request_in_flight_at_the_change_is_answered_connection_close_then_closed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = Limits::default();
    let (arrived, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let addr = gated_upstream(&dir, arrived.clone(), release.clone());
    let trust = Trust::new();
    let (mut c, _, _drain) = connect_live(addr, &limits, false, Some(trust.live(&trust.ca1)));
    c.write_all(b"GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("write");
    arrived.notified().await;

    trust.drop_ca1().await;
    settle().await;
    assert_eq!(
        trust.closed.get(),
        1,
        "found at the change, with the request in flight"
    );
    release.notify_one();
    let changed = Instant::now();
    let answer = until_closed(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with("ok"),
        "the whole answer, then the close: {answer}"
    );
    assert_eq!(
        Instant::now(),
        changed,
        "closed after the answer, not by a timeout"
    );
    assert_eq!(trust.closed.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_http2_connection_of_a_ca_dropped_from_trust_goes_away_idle_or_after_its_streams() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = Limits::default();
    let (arrived, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let addr = gated_upstream(&dir, arrived.clone(), release.clone());
    let trust = Trust::new();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let (c, _, drain) = connect_live(addr.clone(), &limits, true, Some(trust.live(&trust.ca1)));
        let (send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(c),
        )
        .await
        .expect("HTTP/2 handshake");
        clients.push((send, tokio::spawn(conn), drain));
    }
    let get = |path: &str| {
        http::Request::get(format!("http://localhost{path}"))
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request")
    };
    // The first connection idle after one stream; the second with a stream in flight.
    let first = clients[0].0.send_request(get("/one"));
    arrived.notified().await;
    release.notify_one();
    assert_eq!(
        first.await.expect("answered").status(),
        http::StatusCode::OK
    );
    let in_flight = tokio::spawn(clients[1].0.send_request(get("/two")));
    arrived.notified().await;

    let changed = Instant::now();
    trust.drop_ca1().await;
    let (_, idle, _d) = clients.remove(0);
    idle.await
        .expect("the client connection task")
        .expect("the idle connection: GOAWAY, then a clean close");
    assert_eq!(trust.closed.get(), 2, "both found at the change");
    release.notify_one();
    let resp = in_flight
        .await
        .expect("the request task")
        .expect("the stream in flight is answered");
    assert_eq!(resp.status(), http::StatusCode::OK);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"ok");
    let (mut send, busy, _d) = clients.remove(0);
    busy.await
        .expect("the client connection task")
        .expect("GOAWAY after the stream, then a clean close");
    assert!(send.ready().await.is_err(), "no new stream after GOAWAY");
    assert_eq!(
        Instant::now(),
        changed,
        "ended at the change, not by a timeout"
    );
}
