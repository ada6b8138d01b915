//! The egress gate in process: its refusals, their order and their counts, for what a real
//! client cannot produce here (a peer address off loopback on a loopback-only listener).

use super::{Egress, Outcome, Route};
use crate::config::{Config, EgressConfig};
use crate::metrics::Metrics;
use crate::proxy::upstream::EndpointLimits;
use crate::proxy::{ConnInfo, ProxyError};
use crate::tls::Reloadable;
use base64::Engine as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

fn config(credentials: &std::path::Path) -> EgressConfig {
    config_with(credentials, "refuse")
}

fn config_with(credentials: &std::path::Path, others: &str) -> EgressConfig {
    let text = format!(
        "[identity]\ncert = \"/c\"\nkey = \"/k\"\ntrust = \"/t\"\n[[listeners]]\n\
         listen = \"127.0.0.1:8090\"\n[listeners.egress]\ncredentials = \"{}\"\n\
         targets = [\"*.ironic.test\", \"10.0.10.0/24\"]\nports = [6189]\n\
         plain_ports = [6180]\nothers = \"{others}\"\n",
        credentials.display()
    );
    let c = Config::parse(&text, &HashMap::<String, String>::new()).expect("config");
    c.listeners[0].egress.clone().expect("egress")
}

fn egress(dir: &std::path::Path) -> (Arc<Egress>, Metrics) {
    egress_with(dir, "refuse")
}

fn egress_with(dir: &std::path::Path, others: &str) -> (Arc<Egress>, Metrics) {
    let cred = dir.join("cred");
    std::fs::write(&cred, "ironic:pw\n").expect("write");
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(crate::crypto::provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let metrics = Metrics::new();
    let e = Egress::start(
        "egress",
        0,
        &config_with(&cred, others),
        Reloadable::fixed(Arc::new(client)),
        Duration::from_secs(60),
        EndpointLimits::with_head(65536),
        &metrics,
    )
    .expect("start");
    (e, metrics)
}

fn request(method: &str, target: &str, auth: Option<&str>) -> http::Request<()> {
    let mut b = http::Request::builder().method(method).uri(target);
    // What a client sends with an absolute target: Host from its authority.
    if let Some(a) = target
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.authority().cloned())
    {
        b = b.header("host", a.as_str());
    }
    if let Some(a) = auth {
        let token = base64::engine::general_purpose::STANDARD.encode(a);
        b = b.header("proxy-authorization", format!("Basic {token}"));
    }
    b.body(()).expect("request")
}

fn status(r: &Result<super::Admitted, ProxyError>) -> u16 {
    r.as_ref().err().map_or(200, |e| e.status().as_u16())
}

/// Client, method, target, credentials, the status and the outcome counted.
type Case<'a> = (
    &'a ConnInfo,
    &'a str,
    &'a str,
    Option<&'a str>,
    u16,
    Outcome,
);

#[tokio::test]
async fn refusals_come_in_order_and_are_counted_and_a_good_request_gets_its_peer_pool() {
    let dir = tempfile::tempdir().expect("dir");
    let (e, _) = egress(dir.path());
    let local = ConnInfo::new(Some("127.0.0.1:40000".parse().expect("addr")), false);
    let remote = ConnInfo::new(Some("10.0.10.9:40000".parse().expect("addr")), false);
    let unix = ConnInfo::new(None, false);
    let good = "http://a.ironic.test:6189/";
    let cases: [Case<'_>; 12] = [
        // Off loopback: refused before anything else is looked at, even with credentials.
        (
            &remote,
            "POST",
            good,
            Some("ironic:pw"),
            403,
            Outcome::NotLoopback,
        ),
        (
            &unix,
            "POST",
            good,
            Some("ironic:pw"),
            403,
            Outcome::NotLoopback,
        ),
        (
            &local,
            "CONNECT",
            "a.ironic.test:6189",
            Some("ironic:pw"),
            405,
            Outcome::Connect,
        ),
        (
            &local,
            "POST",
            "/",
            Some("ironic:pw"),
            400,
            Outcome::OriginForm,
        ),
        (
            &local,
            "POST",
            "https://a.ironic.test:6189/",
            Some("ironic:pw"),
            400,
            Outcome::OriginForm,
        ),
        (&local, "POST", good, None, 407, Outcome::NoCredentials),
        (
            &local,
            "POST",
            good,
            Some("ironic:wrong"),
            407,
            Outcome::BadCredentials,
        ),
        (
            &local,
            "POST",
            good,
            Some("ironic:pw2"),
            407,
            Outcome::BadCredentials,
        ),
        (
            &local,
            "POST",
            "http://a.b.ironic.test:6189/",
            Some("ironic:pw"),
            403,
            Outcome::TargetRefused,
        ),
        (
            &local,
            "POST",
            "http://10.0.11.1:6189/",
            Some("ironic:pw"),
            403,
            Outcome::TargetRefused,
        ),
        (
            &local,
            "POST",
            "http://10.0.10.1:22/",
            Some("ironic:pw"),
            403,
            Outcome::PortRefused,
        ),
        (
            &local,
            "POST",
            "http://10.0.10.1/",
            Some("ironic:pw"),
            403,
            Outcome::PortRefused,
        ),
    ];
    for (conn, method, target, auth, want, outcome) in cases {
        let before = e.counters[outcome as usize].get();
        let mut req = request(method, target, auth);
        let got = e.admit(&mut req, conn).await;
        assert_eq!(status(&got), want, "{method} {target} {auth:?}");
        assert_eq!(e.counters[outcome as usize].get(), before + 1, "{target}");
    }
    let mut req = request("POST", good, Some("ironic:pw"));
    let pool = e.admit(&mut req, &local).await.expect("admitted").pool;
    assert!(req.headers().get("proxy-authorization").is_none());
    assert_eq!(pool.name, "egress/a.ironic.test:6189");
    // The same destination (any case, a trailing dot) shares its pool and its connections.
    let mut req = request("POST", "http://A.Ironic.Test.:6189/", Some("ironic:pw"));
    let again = e.admit(&mut req, &local).await.expect("admitted").pool;
    assert!(Arc::ptr_eq(&pool, &again));
    let mut req = request("POST", "http://10.0.10.7:6189/", Some("ironic:pw"));
    let ip = e.admit(&mut req, &local).await.expect("admitted");
    assert_eq!(ip.pool.name, "egress/10.0.10.7:6189");
    assert_eq!(ip.route, Route::Tls);
    // A plain port: the same gate, then a plain pool; off targets it is refused first.
    let mut req = request(
        "GET",
        "http://10.0.10.7:6180/images/x.qcow2",
        Some("ironic:pw"),
    );
    let plain = e.admit(&mut req, &local).await.expect("admitted");
    assert_eq!(plain.route, Route::Plain);
    assert!(req.headers().get("proxy-authorization").is_none());
    assert_eq!(plain.pool.name, "egress/10.0.10.7:6180");
    for (target, auth, want, outcome) in [
        (
            "http://10.0.11.1:6180/",
            Some("ironic:pw"),
            403,
            Outcome::TargetRefused,
        ),
        ("http://10.0.10.7:6180/", None, 407, Outcome::NoCredentials),
    ] {
        let before = e.counters[outcome as usize].get();
        let mut req = request("GET", target, auth);
        assert_eq!(status(&e.admit(&mut req, &local).await), want, "{target}");
        assert_eq!(e.counters[outcome as usize].get(), before + 1, "{target}");
    }
}

#[tokio::test]
async fn an_htpasswd_file_is_verified_with_bcrypt_through_the_auth_cache() {
    let dir = tempfile::tempdir().expect("dir");
    let cred = dir.path().join("egress.htpasswd");
    let hash = bcrypt::hash("pw", 4).expect("hash");
    std::fs::write(&cred, format!("ironic:{hash}\n")).expect("write");
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(crate::crypto::provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let metrics = Metrics::new();
    let e = Egress::start(
        "egress",
        0,
        &config(&cred),
        Reloadable::fixed(Arc::new(client)),
        Duration::from_secs(60),
        EndpointLimits::with_head(65536),
        &metrics,
    )
    .expect("start");
    let local = ConnInfo::new(Some("127.0.0.1:40000".parse().expect("addr")), false);
    let good = "http://a.ironic.test:6189/";
    for (auth, want) in [("ironic:pw", 200), ("ironic:pw", 200), ("ironic:no", 407)] {
        let mut req = request("POST", good, Some(auth));
        assert_eq!(status(&e.admit(&mut req, &local).await), want, "{auth}");
    }
    // The second good one came from the cache, as on any listener with [listeners.auth].
    let text = metrics.encode();
    assert!(
        text.contains("ironic_proxy_auth_total{listener=\"egress\",outcome=\"ok_cached\"} 1"),
        "{text}"
    );
}

/// `others = "relay"`: the rest goes out in plain HTTP, counted `relayed` once forwarded; a TLS
/// port off `targets` stays 403, and so do the listener's own and unspecified addresses.
#[tokio::test]
async fn others_relay_takes_the_rest_in_plain_http_and_never_a_tls_port_off_targets() {
    let dir = tempfile::tempdir().expect("dir");
    let (e, _) = egress_with(dir.path(), "relay");
    let local = ConnInfo::new(Some("127.0.0.1:40000".parse().expect("addr")), false);
    let admit = |target: &'static str| {
        let e = e.clone();
        let local = local.clone();
        async move {
            let mut req = request("GET", target, Some("ironic:pw"));
            e.admit(&mut req, &local).await
        }
    };
    for (target, route, pool) in [
        (
            "http://10.0.10.7:6189/",
            Route::Tls,
            "egress/10.0.10.7:6189",
        ),
        (
            "http://10.0.10.7:6180/",
            Route::Plain,
            "egress/10.0.10.7:6180",
        ),
        // An agent inside the peers' CIDR, one outside, IPv6, a name, the image port anywhere.
        (
            "http://10.0.10.9:9999/v1/commands",
            Route::Relay,
            "egress/relayed",
        ),
        ("http://192.0.2.7:9999/", Route::Relay, "egress/relayed"),
        ("http://[fd00:1::9]:9999/", Route::Relay, "egress/relayed"),
        (
            "http://images.example.org./x.qcow2",
            Route::Relay,
            "egress/relayed",
        ),
        ("http://10.0.11.1:6180/", Route::Relay, "egress/relayed"),
    ] {
        let a = admit(target)
            .await
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!((a.route, a.pool.name.as_ref()), (route, pool), "{target}");
    }
    // One pool per destination, the name as written (its trailing dot too).
    let a = admit("http://Images.Example.ORG.:80/y")
        .await
        .expect("admitted");
    let b = admit("http://images.example.org./x.qcow2")
        .await
        .expect("admitted");
    assert!(Arc::ptr_eq(&a.pool, &b.pool));
    for (target, outcome) in [
        ("http://192.0.2.7:6189/", Outcome::TargetRefused),
        ("http://evil.example.org:6189/", Outcome::TargetRefused),
        ("http://127.0.0.1:8090/", Outcome::TargetRefused),
        ("http://0.0.0.0:9999/", Outcome::TargetRefused),
        ("http://[::]:9999/", Outcome::TargetRefused),
    ] {
        let before = e.counters[outcome as usize].get();
        assert_eq!(status(&admit(target).await), 403, "{target}");
        assert_eq!(e.counters[outcome as usize].get(), before + 1, "{target}");
    }
    // Counted when the forwarding ends.
    let before = e.counters[Outcome::Relayed as usize].get();
    e.count_result::<()>(&Ok(()), Route::Relay);
    assert_eq!(e.counters[Outcome::Relayed as usize].get(), before + 1);
}

/// Many plain destinations (a conductor's BMCs and agents) cost nothing once unused: their
/// pools run no task and publish no series, and leave the map at the next sweep, so they never
/// fill it and push out the peers' pools; a pool a request still holds, and a peer's, stay.
#[tokio::test(start_paused = true)]
async fn unused_plain_destinations_leave_at_the_sweep_and_publish_no_series() {
    let dir = tempfile::tempdir().expect("dir");
    let (e, metrics) = egress_with(dir.path(), "relay");
    let local = ConnInfo::new(Some("127.0.0.1:40000".parse().expect("addr")), false);
    let admit = |target: String| {
        let (e, local) = (e.clone(), local.clone());
        async move {
            let mut req = request("GET", &target, Some("ironic:pw"));
            e.admit(&mut req, &local).await.expect("admitted")
        }
    };
    let peer = admit("http://10.0.10.7:6189/".into()).await;
    assert_eq!(peer.route, Route::Tls);
    let held = admit("http://192.0.2.1:9999/".into()).await;
    // More destinations than the map keeps, one after the other, each done with at once.
    for i in 0..1500u32 {
        let a = admit(format!("http://192.0.2.{}:{}/", 2 + i % 200, 10000 + i)).await;
        assert_eq!(a.route, Route::Relay);
        if i % 500 == 499 {
            // A second passes between batches: the sweep runs.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        destinations(&e),
        2,
        "only the pool a request holds and the peer's are left"
    );
    let again = admit("http://192.0.2.1:9999/".into()).await;
    assert!(
        Arc::ptr_eq(&held.pool, &again.pool),
        "the held pool was kept"
    );
    let peer_again = admit("http://10.0.10.7:6189/".into()).await;
    assert!(
        Arc::ptr_eq(&peer.pool, &peer_again.pool),
        "the peer's pool was never pushed out"
    );
    drop((held, again));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(destinations(&e), 1, "the relayed pool left once unused");
    // The relayed destinations share one label (`upstream_retries_total` has it once); no
    // health series of their own.
    let text = metrics.encode();
    let health: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("egress/relayed") && l.contains("upstream_endpoint"))
        .take(3)
        .collect();
    assert!(
        health.is_empty(),
        "series for plain destinations: {health:?}"
    );
    assert!(
        text.contains("upstream_endpoint_healthy{upstream=\"egress/10.0.10.7:6189\""),
        "the peer's pool publishes its series"
    );
}

/// Pools in the egress's map now.
fn destinations(e: &Egress) -> usize {
    e.pools.lock().map_or(0, |p| p.len())
}
