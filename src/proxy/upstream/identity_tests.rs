//! Pooled connections and identity changes, through a pool as the egress builds one: an idle
//! connection made with a replaced identity is closed when the identity changes, not at the
//! pool's next sweep or checkout.

use super::connect::Conn;
use super::connection::Connection;
use crate::config::UpstreamAddr;
use crate::metrics::Metrics;
use crate::proxy::pool::{Pool, PoolOptions};
use crate::proxy::upstream::EndpointLimits;
use crate::tls::peer::{client_config, PeerTls};
use crate::tls::trust::tests::{ca, material};
use crate::tls::Reloadable;
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn an_idle_pooled_connection_of_a_replaced_identity_closes_when_it_changes() {
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
