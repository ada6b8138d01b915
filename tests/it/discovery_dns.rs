//! DNS discovery end to end against a real dnsmasq: records added and removed while the loop
//! runs, empty answers held, a dead server leaving the last set in place, SRV records.
//!
//! Real time (real sockets cannot run on paused time); every wait polls with a deadline.

use crate::support::dnsmasq;

use std::time::Duration;

use dnsmasq::{Dnsmasq, SrvRecord};
use ironic_proxy::{spawn_discovery, DiscoveryOptions, Endpoint, EndpointSet, Target};
use ironic_proxy::{Metrics, UpstreamLabels};
use tokio::sync::watch;
use tokio::time::Instant;

const ZONE: &str = "metal3.svc";
const NAME: &str = "ironic.metal3.svc";
const REFRESH: Duration = Duration::from_millis(200);
const TTL_SECS: u32 = 1;
const HOLD: Duration = Duration::from_millis(1500);
const DEADLINE: Duration = Duration::from_secs(10);

struct Discovery {
    rx: watch::Receiver<EndpointSet>,
    metrics: Metrics,
    _task: tokio::task::JoinHandle<()>,
}

impl Discovery {
    fn start(dns: &Dnsmasq, target: &str) -> Self {
        let metrics = Metrics::new();
        let opts = DiscoveryOptions {
            servers: vec![dns.addr()],
            refresh: REFRESH,
            min_ttl: Duration::from_millis(100),
            hold_on_empty: HOLD,
            fallback: Vec::new(),
        };
        let target: Target = target.parse().expect("valid target");
        let (rx, task) = spawn_discovery("api".to_owned(), target, opts, metrics.clone())
            .expect("discovery starts");
        Self {
            rx,
            metrics,
            _task: task,
        }
    }

    /// Waits until the published set is `expected`; fails with what was seen instead.
    async fn expect(&mut self, expected: &[Endpoint]) {
        let waited = tokio::time::timeout(DEADLINE, self.rx.wait_for(|set| **set == expected));
        let arrived = waited.await.is_ok();
        assert!(
            arrived,
            "expected {expected:?} within {DEADLINE:?}, have {:?}",
            self.current()
        );
        self.rx.mark_unchanged();
    }

    fn current(&self) -> Vec<Endpoint> {
        self.rx.borrow().to_vec()
    }

    fn count(&self, which: &str) -> u64 {
        let labels = UpstreamLabels {
            upstream: "api".to_owned(),
        };
        match which {
            "resolutions" => self.metrics.dns_resolutions.get_or_create(&labels).get(),
            _ => self.metrics.dns_failures.get_or_create(&labels).get(),
        }
    }

    /// Waits until at least `n` more failed resolutions have been counted. A server that does
    /// not answer costs a query its 2 s timeout and one retry, so this allows 5 s per failure.
    async fn failures(&self, n: u64) {
        let target = self.count("failures") + n;
        let deadline = Instant::now() + Duration::from_secs(5 * n + 2);
        while self.count("failures") < target {
            assert!(
                Instant::now() < deadline,
                "fewer than {n} DNS failures counted"
            );
            // Poll interval of this wait (real DNS server, real time).
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn ep(addr: &str) -> Endpoint {
    let addr: std::net::SocketAddr = addr.parse().expect("test address");
    Endpoint {
        addr,
        tls_name: addr.ip().to_string(),
    }
}

fn named(addr: &str, tls_name: &str) -> Endpoint {
    Endpoint {
        addr: addr.parse().expect("test address"),
        tls_name: tls_name.to_owned(),
    }
}

fn srv(target: &str, port: u16) -> SrvRecord {
    SrvRecord {
        name: "_api._tcp.ironic.metal3.svc".to_owned(),
        target: target.to_owned(),
        port,
    }
}

#[tokio::test]
async fn records_added_and_removed_at_run_time_are_followed() {
    let mut dns = Dnsmasq::start(ZONE, TTL_SECS);
    dns.set_hosts(&[
        ("127.0.0.11", NAME),
        ("127.0.0.10", NAME),
        ("fd00::10", NAME),
    ]);
    let mut discovery = Discovery::start(&dns, "ironic.metal3.svc:6385");
    discovery
        .expect(&[
            ep("127.0.0.10:6385"),
            ep("127.0.0.11:6385"),
            ep("[fd00::10]:6385"),
        ])
        .await;

    dns.set_hosts(&[
        ("127.0.0.10", NAME),
        ("127.0.0.11", NAME),
        ("127.0.0.12", NAME),
    ]);
    discovery
        .expect(&[
            ep("127.0.0.10:6385"),
            ep("127.0.0.11:6385"),
            ep("127.0.0.12:6385"),
        ])
        .await;

    let removed = Instant::now();
    dns.set_hosts(&[("127.0.0.11", NAME), ("127.0.0.12", NAME)]);
    discovery
        .expect(&[ep("127.0.0.11:6385"), ep("127.0.0.12:6385")])
        .await;
    let took = removed.elapsed();
    // One second of slack for scheduling on a loaded 2-core CI machine.
    let bound = REFRESH + Duration::from_secs(TTL_SECS.into()) + Duration::from_secs(1);
    assert!(
        took <= bound,
        "a removal took {took:?}, more than refresh + TTL"
    );
    assert_eq!(discovery.count("failures"), 0, "{}", dns.log());
}

#[tokio::test]
async fn an_empty_answer_is_held_before_the_set_empties() {
    let mut dns = Dnsmasq::start(ZONE, TTL_SECS);
    dns.set_hosts(&[("127.0.0.10", NAME)]);
    let mut discovery = Discovery::start(&dns, "ironic.metal3.svc:6385");
    discovery.expect(&[ep("127.0.0.10:6385")]).await;

    let emptied = Instant::now();
    dns.set_hosts(&[]); // NXDOMAIN from now on
    discovery.expect(&[]).await;
    let held = emptied.elapsed();
    assert!(
        held >= HOLD,
        "the empty set was published after {held:?}, before the hold ended"
    );
    assert_eq!(
        discovery.count("failures"),
        0,
        "NXDOMAIN is an answer, not a failure"
    );

    dns.set_hosts(&[("127.0.0.11", NAME)]);
    discovery.expect(&[ep("127.0.0.11:6385")]).await;
}

#[tokio::test]
async fn a_dead_server_leaves_the_last_set_in_place_until_it_is_back() {
    let mut dns = Dnsmasq::start(ZONE, TTL_SECS);
    dns.set_hosts(&[("127.0.0.10", NAME), ("127.0.0.11", NAME)]);
    let mut discovery = Discovery::start(&dns, "ironic.metal3.svc:6385");
    let known = [ep("127.0.0.10:6385"), ep("127.0.0.11:6385")];
    discovery.expect(&known).await;

    dns.stop();
    // Long enough for cached answers to expire and resolutions to fail repeatedly.
    discovery.failures(2).await;
    assert_eq!(discovery.current(), known);
    assert!(
        !discovery.rx.has_changed().expect("running"),
        "nothing was published"
    );

    dns.set_hosts(&[("127.0.0.12", NAME)]);
    dns.restart();
    discovery.expect(&[ep("127.0.0.12:6385")]).await;
}

#[tokio::test]
async fn refused_queries_are_failures_not_empty_answers() {
    // dnsmasq answers REFUSED for names outside its --local zone.
    let dns = Dnsmasq::start(ZONE, TTL_SECS);
    let discovery = Discovery::start(&dns, "ironic.elsewhere.svc:6385");
    discovery.failures(3).await;
    assert!(discovery.current().is_empty());
    assert!(discovery.count("resolutions") >= 3);
}

#[tokio::test]
async fn srv_records_give_endpoints_named_after_their_targets() {
    let mut dns = Dnsmasq::start(ZONE, TTL_SECS);
    dns.set_hosts(&[
        ("127.0.0.20", "ironic-0.metal3.svc"),
        ("127.0.0.21", "ironic-1.metal3.svc"),
    ]);
    dns.set_srv(&[
        srv("ironic-0.metal3.svc", 6385),
        srv("ironic-1.metal3.svc", 6386),
    ]);
    let mut discovery = Discovery::start(&dns, "srv:_api._tcp.ironic.metal3.svc");
    discovery
        .expect(&[
            named("127.0.0.20:6385", "ironic-0.metal3.svc"),
            named("127.0.0.21:6386", "ironic-1.metal3.svc"),
        ])
        .await;

    // A target's address changes (SIGHUP), then a target leaves the SRV answer (restart).
    dns.set_hosts(&[
        ("127.0.0.20", "ironic-0.metal3.svc"),
        ("127.0.0.22", "ironic-1.metal3.svc"),
    ]);
    discovery
        .expect(&[
            named("127.0.0.20:6385", "ironic-0.metal3.svc"),
            named("127.0.0.22:6386", "ironic-1.metal3.svc"),
        ])
        .await;
    dns.set_srv(&[srv("ironic-1.metal3.svc", 6386)]);
    discovery
        .expect(&[named("127.0.0.22:6386", "ironic-1.metal3.svc")])
        .await;
}
