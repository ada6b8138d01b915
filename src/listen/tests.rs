//! The accept queue at drain: connections the kernel completed before the drain, never
//! accepted by the loop, are taken and answered, not closed with the socket. Real sockets on
//! 127.0.0.1:0 in front of a real HTTP/1.1 upstream on a unix socket in a temp dir.

use super::driver::tests::upstream;
use super::{bind, Listener};
use crate::balance::health::HealthOptions;
use crate::config::{Limits, ListenAddr, ListenerConfig, UpstreamAddr, UpstreamConfig};
use crate::metrics::Metrics;
use crate::proxy::pool::{Pool, PoolOptions};
use crate::proxy::Proxy;
use crate::tls::TlsMode;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Upper bound on every wait below; each normally takes milliseconds.
const HANG: Duration = Duration::from_secs(20);

fn config(upstream: UpstreamAddr) -> ListenerConfig {
    ListenerConfig {
        name: "t".into(),
        listen: ListenAddr::Tcp(([127, 0, 0, 1], 0).into()),
        tls: TlsMode::None,
        http2: false,
        jsonrpc: false,
        allow: Vec::new(),
        upstream: UpstreamConfig {
            local: Some(upstream),
            dns: None,
            fallback: Vec::new(),
            tls: false,
            balance: Default::default(),
            health: HealthOptions::default(),
            retries: 0,
        },
        auth: None,
        routes: Vec::new(),
        egress: None,
    }
}

/// A client stream of either kind.
trait Client: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> Client for T {}

async fn connect(at: &ListenAddr) -> std::io::Result<Box<dyn Client>> {
    Ok(match at {
        ListenAddr::Tcp(a) => Box::new(tokio::net::TcpStream::connect(a).await?),
        ListenAddr::Unix(p) => Box::new(tokio::net::UnixStream::connect(p).await?),
    })
}

/// `N` connections completed by the kernel into the accept queue of a listener at `listen`
/// that never accepted them, then the drain: each is answered with `Connection: close`.
async fn queued_connections_are_answered(listen: ListenAddr, dir: &tempfile::TempDir) {
    const N: usize = 8;
    let mut cfg = config(upstream(dir));
    cfg.listen = listen;
    let limits = Limits::default();
    let metrics = Metrics::new();
    let Some(addr @ UpstreamAddr::Unix(_)) = cfg.upstream.local.clone() else {
        unreachable!("set above");
    };
    let pool = Pool::new(PoolOptions::local("t", addr, 16 * 1024, metrics.clone()));
    let proxy = Arc::new(Proxy::new("t", pool, limits.clone(), metrics.clone()));
    let bound = bind("t", &cfg.listen, false).await.expect("bind");
    let at = bound.local_addr();
    // Nothing accepts yet: the kernel completes each connection into the accept queue.
    let mut clients = Vec::new();
    for _ in 0..N {
        clients.push(connect(&at).await.expect("connect"));
    }
    let listener = Listener::new(cfg, bound, None, proxy, limits, metrics);
    let (tx, shutdown) = watch::channel(true);
    // The drain began before the loop first looked: every connection is still queued.
    tokio::time::timeout(HANG, listener.run(shutdown))
        .await
        .expect("the loop ends on the drain without waiting for new connections");
    assert!(
        connect(&at).await.is_err(),
        "{at}: the socket is closed once the queue is taken"
    );
    for (i, c) in clients.iter_mut().enumerate() {
        c.write_all(format!("GET /{i} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut got = Vec::new();
        tokio::time::timeout(HANG, c.read_to_end(&mut got))
            .await
            .expect("the connection closes after its answer")
            .unwrap_or_else(|e| panic!("{at} connection {i}: {e}"));
        let got = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(
            got.starts_with("http/1.1 200"),
            "{at} connection {i}: {got:?}"
        );
        assert!(
            got.contains("\r\nconnection: close\r\n"),
            "{at} connection {i}: {got:?}"
        );
        assert!(got.ends_with("ok"), "{at} connection {i}: {got:?}");
    }
    drop(tx);
}

#[tokio::test]
async fn connections_queued_at_the_drain_are_answered_with_connection_close() {
    let dir = tempfile::tempdir().expect("temp dir");
    queued_connections_are_answered(ListenAddr::Tcp(([127, 0, 0, 1], 0).into()), &dir).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("listener.sock");
    queued_connections_are_answered(ListenAddr::Unix(sock), &dir).await;
}
