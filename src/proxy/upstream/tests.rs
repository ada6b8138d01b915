use super::body::MAX_READ_SIZE;
use super::connect::Conn;
use super::*;
use crate::http1::{self as h1, BodyKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// A pooled connection over a unix socket pair, and the pair's far end.
fn connection() -> (Box<Connection>, UnixStream) {
    let (near, far) = UnixStream::pair().expect("a socket pair");
    (Connection::new(Conn::Unix(near), None, 0), far)
}

/// Lets the I/O driver see what happened on the sockets.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// An upstream on a unix socket whose first connection answers one request and then
/// closes when the next arrives (a keep-alive it closed while the request was on its way),
/// and whose later connections answer every request. Returns the requests' methods.
async fn closing_upstream(
    dir: &tempfile::TempDir,
) -> (Endpoint, tokio::task::JoinHandle<Vec<String>>) {
    let path = dir.path().join("up.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        for conn in 0.. {
            let Ok(Ok((mut s, _))) =
                tokio::time::timeout(Duration::from_millis(500), listener.accept()).await
            else {
                return seen;
            };
            let mut buf = vec![0u8; 4096];
            for n in 0.. {
                let Ok(len) = s.read(&mut buf).await else {
                    break;
                };
                if len == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buf[..len]).into_owned();
                seen.push(text.split(' ').next().unwrap_or_default().to_owned());
                if conn == 0 && n == 1 {
                    break; // closes without an answer
                }
                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if s.write_all(ok).await.is_err() {
                    break;
                }
            }
        }
        seen
    });
    let ep = Endpoint::new(
        UpstreamAddr::Unix(path),
        None,
        EndpointLimits::with_head(8192),
    );
    (ep, server)
}

async fn send(ep: &Endpoint, method: http::Method) -> Result<u16, SendError> {
    let mut req = http::Request::new(RequestBody::Full(Some("{}".into())));
    *req.method_mut() = method;
    *req.uri_mut() = http::Uri::from_static("/v1/heartbeat");
    let resp = ep.send(req).await?;
    let status = resp.status().as_u16();
    let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
    Ok(status)
}

/// The scale bench's storm: requests on keep-alive connections the sidecar had closed
/// failed and ejected the only healthy peer. A replayable request is sent again on a fresh
/// connection; one that is not fails as `Stale`, which does not blame the endpoint.
#[tokio::test]
async fn a_pooled_connection_closed_under_a_request_is_not_the_endpoints_failure() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ep, server) = closing_upstream(&dir).await;
    assert_eq!(send(&ep, http::Method::GET).await.expect("first"), 200);
    settle().await;
    let again = send(&ep, http::Method::GET).await;
    assert_eq!(again.expect("sent again on a fresh connection"), 200);
    drop(ep);
    assert_eq!(server.await.expect("server"), ["GET", "GET", "GET"]);

    let dir = tempfile::tempdir().expect("temp dir");
    let (ep, server) = closing_upstream(&dir).await;
    assert_eq!(send(&ep, http::Method::POST).await.expect("first"), 200);
    settle().await;
    let err = send(&ep, http::Method::POST)
        .await
        .expect_err("not replayable");
    assert!(matches!(err, SendError::Stale(_)), "{err:?}");
    assert!(!err.blames_endpoint());
    assert!(!err.is_connect());
    drop(ep);
    assert_eq!(server.await.expect("server"), ["POST", "POST"]);
}

#[test]
fn absolute_form_targets_become_origin_form_with_a_path() {
    for (target, origin) in [
        ("http://b:8#/close", "/"),
        ("http://b:8?x=1", "/?x=1"),
        ("http://b:8", "/"),
        ("https://b/a/c?q#f", "/a/c?q"),
    ] {
        let uri: http::Uri = target.parse().expect("a valid absolute-form target");
        assert_eq!(origin_form(&uri).to_string(), origin, "{target}");
    }
}

#[tokio::test(start_paused = true)]
async fn idle_connections_are_reused_most_recent_first_until_they_expire() {
    let idle = Idle::new(Slots::new(0), None);
    let (a, _far_a) = connection();
    let (b, _far_b) = connection();
    settle().await;
    idle.put(a);
    tokio::time::advance(Duration::from_secs(1)).await;
    idle.put(b);
    let first = idle.take().expect("a ready connection");
    idle.put(first);
    tokio::time::advance(IDLE_TIMEOUT - Duration::from_millis(500)).await;
    // The older one has expired by now, the one just given back has not.
    assert!(
        idle.take().is_some(),
        "the most recently used is still fresh"
    );
    assert!(
        idle.take().is_none(),
        "the other one expired and was dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn expired_idle_connections_are_closed_without_waiting_for_a_request() {
    let idle = Idle::new(Slots::new(0), None);
    let (a, mut far_a) = connection();
    let (b, _far_b) = connection();
    idle.put(a);
    tokio::time::advance(Duration::from_secs(2)).await;
    idle.put(b);
    tokio::time::advance(IDLE_TIMEOUT - Duration::from_secs(1)).await;
    idle.close_expired();
    assert_eq!(
        idle.conns.lock().unwrap().len(),
        1,
        "the older one is closed"
    );
    let mut byte = [0u8; 1];
    assert_eq!(
        far_a.read(&mut byte).await.unwrap(),
        0,
        "its upstream sees the close"
    );
}

#[tokio::test]
async fn a_connection_made_with_a_replaced_identity_is_never_handed_out_again() {
    use crate::tls::peer::PeerTls;
    use crate::tls::trust::tests::{ca, material};
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = ca("ca");
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(material(dir.path(), &ca, &ca.cert_pem)));
    let (client, follower) =
        crate::tls::Reloadable::follow(rx, "peers".to_owned(), crate::tls::peer::client_config)
            .expect("client configuration");
    let name = rustls_pki_types::ServerName::try_from("ironic-0.ironic.test").expect("name");
    let tls = PeerTls::new(client.clone(), name);
    let idle = Idle::new(Slots::new(0), Some(tls.clone()));
    let made = |generation| {
        let (near, far) = UnixStream::pair().expect("a socket pair");
        (Connection::new(Conn::Unix(near), None, generation), far)
    };
    let (a, _far_a) = made(tls.generation());
    let (b, _far_b) = made(tls.generation());
    let (c, _far_c) = made(tls.generation());
    idle.put(a);
    idle.put(c);
    let a = idle.take().expect("made with the current identity");
    // Sends a renewed identity and waits (yielding, on the paused clock) until the follower has
    // stored it.
    let renew = || async {
        let before = tls.generation();
        tx.send_replace(Arc::new(material(dir.path(), &ca, &ca.cert_pem)));
        for _ in 0..10_000 {
            if tls.generation() != before {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_ne!(tls.generation(), before, "the follower stored the renewal");
    };

    // A renewal: the follower stores the new client configuration.
    renew().await;
    assert!(
        idle.take().is_none(),
        "the idle one is dropped, not handed out"
    );
    idle.put(a);
    idle.put(b);
    assert_eq!(
        pooled(&idle),
        0,
        "one coming back from its request is dropped"
    );
    let (d, _far_d) = made(tls.generation());
    idle.put(d);
    assert!(
        idle.take().is_some(),
        "made after the renewal: pooled and reused"
    );
    // The sweep drops outdated ones that were pooled before a change.
    let (e, _far_e) = made(tls.generation());
    idle.put(e);
    renew().await;
    idle.close_expired();
    assert_eq!(pooled(&idle), 0, "the sweep closes it");
    follower.abort();
}

/// Through a pool as the egress builds one: an idle connection made with a replaced identity
/// is closed when the identity changes, not at the pool's next sweep or checkout.
#[tokio::test(start_paused = true)]
async fn an_idle_pooled_connection_of_a_replaced_identity_closes_when_it_changes() {
    use crate::metrics::Metrics;
    use crate::proxy::pool::{Pool, PoolOptions};
    use crate::tls::peer::{client_config, PeerTls};
    use crate::tls::trust::tests::{ca, material};
    use crate::tls::Reloadable;
    use tokio::time::Instant;
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = ca("ca");
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(material(dir.path(), &ca, &ca.cert_pem)));
    let (client, follower) =
        Reloadable::follow(rx, "egress".to_owned(), client_config).expect("client configuration");
    let name = rustls_pki_types::ServerName::try_from("ironic-0.ironic.test").expect("name");
    let tls = PeerTls::new(client.clone(), name);
    let pool = Pool::new(PoolOptions {
        name: "egress/peer".to_owned(),
        local: Some(UpstreamAddr::Unix(dir.path().join("never-dialled.sock"))),
        local_tls: Some(tls.clone()),
        dns: None,
        peer_tls: None,
        balance: crate::balance::Policy::default(),
        health: crate::balance::HealthOptions::default(),
        retries: 0,
        limits: EndpointLimits::with_head(16 * 1024),
        metrics: Metrics::new(),
        report: true,
    });
    let (_, member) = pool.pick(&[], false).expect("the local endpoint");
    // A connection made with the current identity, back in the pool after its request.
    let (near, mut far) = UnixStream::pair().expect("a socket pair");
    member
        .endpoint
        .idle
        .put(Connection::new(Conn::Unix(near), None, tls.generation()));
    // The pool's sweep runs at once when it starts, then every second: let that first run
    // pass, so that only the change can close the connection with no time passing.
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
    assert!(member.endpoint.idle.has_any());

    let before = tls.generation();
    let renewed = Instant::now();
    tx.send_replace(Arc::new(material(dir.path(), &ca, &ca.cert_pem)));
    let mut buf = [0u8; 16];
    let n = far.read(&mut buf).await.expect("read");
    assert_eq!(n, 0, "the pooled connection is closed, silently");
    assert_ne!(tls.generation(), before, "after the renewal was stored");
    assert_eq!(Instant::now(), renewed, "at the change, not at a sweep");
    assert!(!member.endpoint.idle.has_any());
    follower.abort();
}

#[tokio::test(start_paused = true)]
async fn a_connection_the_server_closed_or_wrote_to_is_never_handed_out() {
    let idle = Idle::new(Slots::new(0), None);
    let (a, far_a) = connection();
    let (b, far_b) = connection();
    idle.put(a);
    idle.put(b);
    settle().await;
    drop(far_a);
    far_b
        .try_write(b"HTTP/1.1 200 OK\r\n")
        .expect("room in the socket");
    settle().await;
    assert!(idle.take().is_none());
}

/// A response body over a socket pair, with the far end to write the upstream's bytes.
fn body(framing: BodyKind, keep_alive: bool) -> (UpstreamBody, UnixStream, Arc<Idle>) {
    let idle = Arc::new(Idle::new(Slots::new(0), None));
    let (conn, far) = connection();
    let body = UpstreamBody::new(
        conn,
        &h1::ResponseFraming {
            body: framing,
            keep_alive,
        },
        idle.clone(),
    );
    (body, far, idle)
}

fn pooled(idle: &Idle) -> usize {
    idle.conns.lock().unwrap().len()
}

#[tokio::test]
async fn a_body_read_to_its_end_gives_its_connection_back() {
    use http_body_util::BodyExt as _;
    for (kind, wire, data) in [
        (BodyKind::Length(5), &b"hello"[..], &b"hello"[..]),
        (
            BodyKind::Chunked,
            b"2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n",
            b"hello",
        ),
        (BodyKind::Empty, b"", b""),
    ] {
        let (b, mut far, idle) = body(kind, true);
        far.write_all(wire).await.unwrap();
        let got = b.collect().await.expect("a whole body").to_bytes();
        assert_eq!(&got[..], data);
        assert_eq!(pooled(&idle), 1, "{:?}", String::from_utf8_lossy(wire));
    }
    // Not when the upstream said close, nor for a body delimited by the close.
    let (b, mut far, idle) = body(BodyKind::Length(2), false);
    far.write_all(b"ok").await.unwrap();
    assert_eq!(&b.collect().await.unwrap().to_bytes()[..], b"ok");
    assert_eq!(pooled(&idle), 0);
    let (b, mut far, idle) = body(BodyKind::Close, false);
    far.write_all(b"until the end").await.unwrap();
    drop(far);
    assert_eq!(&b.collect().await.unwrap().to_bytes()[..], b"until the end");
    assert_eq!(pooled(&idle), 0);
}

#[tokio::test]
async fn a_body_begun_with_its_head_is_topped_up_to_one_frame_without_waiting() {
    use http_body_util::BodyExt as _;
    let whole = (0..70_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    // What came with the head is in the buffer; the rest is already in the socket: one
    // frame of as much as one read takes, then the rest.
    let (mut b, mut far, idle) = body(BodyKind::Length(whole.len() as u64), true);
    b.conn
        .as_mut()
        .unwrap()
        .buf
        .extend_from_slice(&whole[..8000]);
    far.write_all(&whole[8000..]).await.unwrap();
    settle().await;
    let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first.len(), MAX_READ_SIZE, "topped up to one read's most");
    let rest = b.collect().await.unwrap().to_bytes();
    assert_eq!([&first[..], &rest[..]].concat(), whole);
    assert_eq!(
        pooled(&idle),
        1,
        "read to its end, the connection goes back"
    );

    // The rest has not come yet: what we have is given at once, the rest when it comes.
    let (mut b, mut far, idle) = body(BodyKind::Length(10), true);
    b.conn.as_mut().unwrap().buf.extend_from_slice(b"hello");
    let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"hello");
    far.write_all(b"world").await.unwrap();
    assert_eq!(&b.collect().await.unwrap().to_bytes()[..], b"world");
    assert_eq!(pooled(&idle), 1);

    // The upstream closes after part of the rest: the bytes that came are given, then the
    // error, and the connection is not reused.
    let (mut b, mut far, idle) = body(BodyKind::Length(20), true);
    b.conn.as_mut().unwrap().buf.extend_from_slice(b"hello");
    far.write_all(b"world").await.unwrap();
    drop(far);
    settle().await;
    let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"helloworld");
    assert!(b.frame().await.unwrap().is_err(), "cut short");
    assert_eq!(pooled(&idle), 0);
}

#[tokio::test]
async fn a_body_cut_short_is_an_error_and_closes_its_connection() {
    use http_body_util::BodyExt as _;
    for (kind, wire) in [
        (BodyKind::Length(10), &b"short"[..]),
        (BodyKind::Chunked, b"5\r\nhel"),
        (BodyKind::Chunked, b"5\r\nhello\r\nzz\r\n"),
    ] {
        let (b, mut far, idle) = body(kind, true);
        far.write_all(wire).await.unwrap();
        drop(far);
        assert!(
            b.collect().await.is_err(),
            "{:?}",
            String::from_utf8_lossy(wire)
        );
        assert_eq!(pooled(&idle), 0);
    }
    // Dropped before its end: closed, not pooled.
    let (b, mut far, idle) = body(BodyKind::Length(10), true);
    far.write_all(b"part").await.unwrap();
    drop(b);
    assert_eq!(pooled(&idle), 0);
}

/// An upstream on a unix socket that holds its first answer until `hold` connections are
/// open, then answers every request at once. Returns the endpoint (bounded to `limit`
/// connections) and the count of connections the upstream accepted.
async fn holding_upstream(
    dir: &tempfile::TempDir,
    hold: usize,
    limit: usize,
) -> (Endpoint, Arc<AtomicUsize>) {
    let path = dir.path().join("up.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let accepted = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(tokio::sync::Notify::new());
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            if n >= hold {
                open.notify_waiters();
            }
            let (open, count) = (open.clone(), count.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                while matches!(s.read(&mut buf).await, Ok(len) if len > 0) {
                    let ready = open.notified();
                    if count.load(Ordering::SeqCst) < hold {
                        ready.await;
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if s.write_all(ok).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let limits = EndpointLimits {
        max_response_head: 8192,
        connections: limit,
    };
    (
        Endpoint::new(UpstreamAddr::Unix(path), None, limits),
        accepted,
    )
}

/// Six requests at once while the upstream holds its answers: with a bound of two, two
/// connections carry all six in turn; with no bound each request opens its own.
#[tokio::test]
async fn at_the_bound_requests_wait_for_a_connection_instead_of_opening_one() {
    for (limit, hold, expect) in [(2, 2, 2), (0, 6, 6)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ep, accepted) = holding_upstream(&dir, hold, limit).await;
        let ep = Arc::new(ep);
        let sends: Vec<_> = (0..6)
            .map(|_| {
                let ep = ep.clone();
                tokio::spawn(async move { send(&ep, http::Method::GET).await })
            })
            .collect();
        for s in sends {
            let status = tokio::time::timeout(Duration::from_secs(10), s)
                .await
                .expect("answered in time")
                .expect("task");
            assert_eq!(status.expect("sent"), 200, "bound {limit}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), expect, "bound {limit}");
        assert_eq!(ep.open_connections(), expect, "bound {limit}: kept idle");
    }
}

/// A health check at the bound does not queue behind the requests it would judge.
#[tokio::test]
async fn a_health_check_at_the_bound_connects_outside_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ep, accepted) = holding_upstream(&dir, 2, 1).await;
    let ep = Arc::new(ep);
    let busy = {
        let ep = ep.clone();
        tokio::spawn(async move { send(&ep, http::Method::GET).await })
    };
    // The request holds the only place; the probe's connection is the upstream's second,
    // which releases both answers.
    tokio::time::timeout(Duration::from_secs(10), async {
        while accepted.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the request connected");
    let probed = tokio::time::timeout(Duration::from_secs(10), ep.probe("/"))
        .await
        .expect("the probe did not wait for the request");
    assert!(probed.expect("answered"));
    assert_eq!(busy.await.expect("task").expect("sent"), 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}
