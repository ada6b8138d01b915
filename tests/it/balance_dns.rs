//! Discovery and balancing end to end (issue 4): the real binary, a real dnsmasq publishing one
//! name with an A record per backend, and real HTTP backends on distinct loopback addresses that
//! share one port. Records are removed and added, backends killed and restarted, and the DNS
//! server stopped while clients keep sending GETs; what the clients saw and what each backend
//! received are compared.
//!
//! Real time (real processes); every wait polls with a deadline, every load loop is bounded.

use crate::support;
use crate::support::{backend, dnsmasq, node};

use backend::{bind_same_port, ip, Backend};
use dnsmasq::Dnsmasq;
use node::{endpoints, Lb, Load, Node, Outcome};
use std::net::IpAddr;
use std::time::{Duration, Instant};
use support::poll_until;

const ZONE: &str = "metal3.svc";
const NAME: &str = "api.metal3.svc";
/// dnsmasq's `--local-ttl`, seconds.
const TTL: u64 = 1;
/// `[dns] refresh` of every proxy here.
const REFRESH: Duration = Duration::from_secs(1);
/// `health.interval` of every proxy here.
const INTERVAL: Duration = Duration::from_secs(1);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(1);

/// Backends `127.0.<net>.1..=n` on one port, and a dnsmasq (records for the first `published`).
struct Farm {
    backends: Vec<Backend>,
    dns: Dnsmasq,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Farm {
    fn new(net: u8, n: u8, published: usize) -> Self {
        let ips: Vec<IpAddr> = (1..=n).map(|h| ip(net, h)).collect();
        let listeners = bind_same_port(&ips);
        let port = listeners[0].local_addr().expect("address").port();
        let backends: Vec<Backend> = listeners
            .into_iter()
            .enumerate()
            .map(|(i, l)| Backend::start(&format!("b{}", i + 1), l))
            .collect();
        let mut farm = Self {
            backends,
            dns: Dnsmasq::start(ZONE, u32::try_from(TTL).expect("ttl")),
            port,
            _dir: tempfile::tempdir().expect("temp dir"),
        };
        farm.publish(&(0..published).collect::<Vec<_>>());
        farm
    }

    /// Publishes A records for the backends at `which` (indices) only.
    fn publish(&mut self, which: &[usize]) {
        let ips: Vec<String> = which
            .iter()
            .map(|i| self.backends[*i].addr.ip().to_string())
            .collect();
        let records: Vec<(&str, &str)> = ips.iter().map(|ip| (ip.as_str(), NAME)).collect();
        self.dns.set_hosts(&records);
    }

    fn lb(&self) -> Lb {
        Lb::new(self.dns.addr(), &format!("{NAME}:{}", self.port))
    }

    fn start(&self, lb: &Lb, name: &str) -> Node {
        Node::start(
            self._dir.path(),
            name,
            IpAddr::from([127, 0, 0, 1]),
            lb.render(),
        )
    }

    fn counts(&self) -> Vec<usize> {
        self.backends.iter().map(Backend::hit_count).collect()
    }
}

/// Waits until `n` endpoints of the `api` upstream are healthy.
fn wait_healthy(proxy: &Node, n: usize) {
    proxy.wait_metric(
        "ironic_proxy_upstream_endpoints",
        &[("upstream", "api"), ("state", "healthy")],
        Duration::from_secs(10),
        |v| v == n as f64,
    );
}

/// Waits until every backend in `which` has received a request.
fn wait_all_hit(farm: &Farm, which: &[usize]) {
    poll_until(Duration::from_secs(10), || {
        which
            .iter()
            .all(|i| farm.backends[*i].hit_count() > 0)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("not every backend got traffic: {:?}", farm.counts()));
}

fn assert_no_failures(what: &str, outcomes: &[Outcome]) {
    let failed = node::failures(outcomes);
    assert!(
        failed.is_empty(),
        "{what}: {} of {} requests failed: {:?}",
        failed.len(),
        outcomes.len(),
        &failed[..failed.len().min(10)]
    );
}

#[test]
fn round_robin_spreads_requests_evenly_over_three_upstreams() {
    let farm = Farm::new(21, 3, 3);
    let proxy = farm.start(&farm.lb(), "round-robin");
    wait_healthy(&proxy, 3);

    let outcomes = Load::start(proxy.listen, 3, 100, Duration::from_secs(30)).wait();
    assert_no_failures("round robin", &outcomes);
    assert_eq!(outcomes.len(), 300);
    let per: Vec<usize> = ["b1", "b2", "b3"]
        .iter()
        .map(|id| node::answered_by(&outcomes, id))
        .collect();
    let spread = per
        .iter()
        .map(|n| (*n as f64 - 100.0).abs())
        .fold(0.0, f64::max);
    eprintln!("round robin over 300 requests: {per:?}, largest deviation {spread:.1} %");
    assert!(spread <= 15.0, "within ±15 % of 100 each: {per:?}");
    assert_eq!(farm.counts(), per, "the backends agree with the client");
}

#[test]
fn least_request_sends_clearly_fewer_requests_to_a_slow_upstream() {
    let farm = Farm::new(22, 3, 3);
    farm.backends[2].set_delay(Duration::from_millis(200));
    let mut lb = farm.lb();
    lb.balance = "least_request".into();
    let proxy = farm.start(&lb, "least-request");
    wait_healthy(&proxy, 3);

    // Concurrent clients, so that requests are in flight together.
    let outcomes = Load::start(proxy.listen, 8, 40, Duration::from_secs(40)).wait();
    assert_no_failures("least request", &outcomes);
    let per: Vec<usize> = ["b1", "b2", "b3"]
        .iter()
        .map(|id| node::answered_by(&outcomes, id))
        .collect();
    let total: usize = per.iter().sum();
    let slow_share = per[2] as f64 / total as f64 * 100.0;
    eprintln!(
        "least request over {total} requests from 8 clients: fast {} and {}, slow (200 ms) {} \
         = {slow_share:.1} %",
        per[0], per[1], per[2]
    );
    assert!(
        per[2] * 2 < per[0].min(per[1]),
        "the slow upstream gets less than half of what each fast one gets: {per:?}"
    );
    assert!(
        slow_share < 20.0,
        "slow share {slow_share:.1} % (fair: 33 %)"
    );
}

#[test]
fn removed_records_lose_traffic_quickly_and_added_ones_wait_for_their_health_check() {
    // b1..b3 published; b4 runs, failing its health check, and is published later.
    let mut farm = Farm::new(23, 4, 3);
    farm.backends[3].set_healthy(false);
    let proxy = farm.start(&farm.lb(), "follow-dns");
    wait_healthy(&proxy, 3);
    let load = Load::start(proxy.listen, 2, 200_000, Duration::from_secs(40));
    wait_all_hit(&farm, &[0, 1, 2]);

    // Remove b3's record.
    let removed = Instant::now();
    farm.publish(&[0, 1]);
    let bound = REFRESH + Duration::from_secs(TTL);
    // Exercised: the whole refresh + TTL bound passes before b3's last request is judged.
    std::thread::sleep(bound + SLACK + Duration::from_millis(500));
    let last = farm.backends[2]
        .hits()
        .last()
        .map(|h| h.at)
        .expect("b3 had traffic");
    let left = last.saturating_duration_since(removed);
    let after: Vec<usize> = farm.backends[..2]
        .iter()
        .map(|b| b.hits().iter().filter(|h| h.at > last).count())
        .collect();
    eprintln!(
        "record removed: b3's last request {left:?} after the removal (refresh + TTL = \
         {bound:?}); b1, b2 got {after:?} since"
    );
    assert!(
        left <= bound + SLACK,
        "traffic left b3 {left:?} after its record went, more than refresh + TTL"
    );
    assert!(after.iter().all(|n| *n > 0), "traffic went on: {after:?}");

    // Add b4's record while its health check fails: it is checked, and gets nothing.
    farm.publish(&[0, 1, 3]);
    poll_until(Duration::from_secs(5), || {
        (farm.backends[3].checks().len() >= 2).then_some(())
    })
    .expect("the new endpoint is health-checked");
    // Two more failed checks of b4: the proxy has judged it failing again, and must still send
    // it nothing.
    let checked = farm.backends[3].checks().len();
    poll_until(INTERVAL * 5, || {
        (farm.backends[3].checks().len() >= checked + 2).then_some(())
    })
    .expect("the failing endpoint is checked again");
    assert_eq!(
        farm.backends[3].hit_count(),
        0,
        "no traffic before a passing health check"
    );

    // Its health check passes: it gets traffic, and only after that check.
    let healed = Instant::now();
    farm.backends[3].set_healthy(true);
    poll_until(INTERVAL + SLACK + SLACK, || {
        (farm.backends[3].hit_count() > 0).then_some(())
    })
    .expect("the new endpoint gets traffic once healthy");
    let first_hit = farm.backends[3].hits()[0].at;
    let first_pass = farm.backends[3]
        .checks()
        .iter()
        .find(|(_, ok)| *ok)
        .map(|(at, _)| *at)
        .expect("a passing check");
    eprintln!(
        "record added: first request {:?} after its health check started passing",
        first_hit.saturating_duration_since(healed)
    );
    assert!(
        first_hit >= first_pass,
        "traffic only after a passing check"
    );

    let outcomes = load.finish();
    assert_no_failures("records removed and added", &outcomes);
    eprintln!("{} GETs while records changed, 0 failed", outcomes.len());
}

#[test]
fn a_killed_upstream_is_ejected_without_failed_requests_and_readmitted_on_restart() {
    let mut farm = Farm::new(24, 3, 3);
    let mut lb = farm.lb();
    lb.balance = "least_request".into();
    let proxy = farm.start(&lb, "kill");
    wait_healthy(&proxy, 3);
    let load = Load::start(proxy.listen, 3, 200_000, Duration::from_secs(40));
    wait_all_hit(&farm, &[0, 1, 2]);

    farm.backends[1].stop();
    let killed = Instant::now();
    let mut seen_ejected = false;
    poll_until(Duration::from_secs(8), || {
        seen_ejected |= endpoints(&proxy, "ejected") > 0.0;
        let out = endpoints(&proxy, "ejected") + endpoints(&proxy, "unhealthy");
        (endpoints(&proxy, "healthy") == 2.0 && out == 1.0).then_some(())
    })
    .unwrap_or_else(|| panic!("b2 is out of the healthy set:\n{}", proxy.metrics()));
    let out_after = killed.elapsed();
    // Exercised: the load runs one health interval with b2 out.
    std::thread::sleep(INTERVAL);
    let during = load.outcomes().len();

    farm.backends[1].restart();
    let restarted = Instant::now();
    let before = farm.backends[1].hit_count();
    poll_until(INTERVAL + SLACK + SLACK, || {
        (farm.backends[1].hit_count() > before).then_some(())
    })
    .expect("b2 gets traffic again after its restart");
    let back_after = restarted.elapsed();
    wait_healthy(&proxy, 3);
    let so_far = load.outcomes().len();
    poll_until(Duration::from_secs(5), || {
        (load.outcomes().len() >= so_far + 20).then_some(())
    })
    .expect("the load goes on once all three are healthy");

    let outcomes = load.finish();
    let retries = proxy.metric("ironic_proxy_upstream_retries_total", &[]);
    eprintln!(
        "kill: b2 out of the healthy set after {out_after:?} (ejected state seen: \
         {seen_ejected}); restart: traffic again after {back_after:?}; {} GETs ({during} by \
         the restart), {} failed, {retries} retried",
        outcomes.len(),
        node::failures(&outcomes).len()
    );
    assert_no_failures("kill and restart", &outcomes);
}

#[test]
fn a_dead_dns_server_leaves_traffic_on_the_last_known_endpoints() {
    let mut farm = Farm::new(25, 2, 2);
    let proxy = farm.start(&farm.lb(), "dns-down");
    wait_healthy(&proxy, 2);
    let load = Load::start(proxy.listen, 2, 200_000, Duration::from_secs(40));
    wait_all_hit(&farm, &[0, 1]);

    let before = proxy.metric("ironic_proxy_dns_failures_total", &[("upstream", "api")]);
    farm.dns.stop();
    let stopped = Instant::now();
    // A server that does not answer costs each resolution its timeouts: allow several seconds.
    proxy.wait_metric(
        "ironic_proxy_dns_failures_total",
        &[("upstream", "api")],
        Duration::from_secs(15),
        |v| v > before,
    );
    let failed_at = Instant::now();
    // Exercised: a refresh cycle passes with DNS down; the known endpoints must survive it.
    std::thread::sleep(REFRESH);
    let after: Vec<usize> = farm
        .backends
        .iter()
        .map(|b| b.hits().iter().filter(|h| h.at > failed_at).count())
        .collect();
    let outcomes = load.finish();
    eprintln!(
        "DNS down for {:?}: a failed resolution counted, backends still got {after:?} since; \
         {} GETs, {} failed",
        stopped.elapsed(),
        outcomes.len(),
        node::failures(&outcomes).len()
    );
    assert!(
        after.iter().all(|n| *n > 0),
        "both known endpoints keep getting traffic: {after:?}"
    );
    assert_no_failures("DNS down", &outcomes);
    assert_eq!(endpoints(&proxy, "healthy"), 2.0);
    assert_eq!(
        proxy.admin_get("/readyz").expect("readyz").status,
        200,
        "still ready"
    );
}
