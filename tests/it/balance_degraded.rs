//! A degraded cluster (issue 10): the load balancer starts while cluster DNS is down and has
//! never answered, with a static `fallback` list of control-plane addresses on its upstream. The
//! real binary, a real dnsmasq (stopped, then started), real HTTP backends on loopback
//! addresses sharing one port, and clients that keep reading throughout.
//!
//! What must hold: no endpoint at all until the fallback instance is up, then 0 failed reads;
//! when DNS comes back, the discovered peers take over and the fallback gets nothing more.

use crate::support;
use crate::support::{backend, dnsmasq, node};

use backend::{bind_same_port, ip, Backend};
use dnsmasq::Dnsmasq;
use node::{Lb, Load, Node};
use std::net::IpAddr;
use std::time::Duration;
use support::poll_until;

const NAME: &str = "ironic.metal3.svc";

#[test]
fn fallback_serves_while_dns_never_answered_and_discovered_peers_take_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    // b1 is the control-plane instance named in the fallback; b2 and b3 are what DNS will say.
    let ips = [ip(41, 1), ip(41, 2), ip(41, 3)];
    let listeners = bind_same_port(&ips);
    let port = listeners[0].local_addr().expect("address").port();
    let mut backends: Vec<Backend> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| Backend::start(&format!("b{}", i + 1), l))
        .collect();
    backends[0].stop();
    // DNS down: the server's port answers nothing (ICMP port unreachable).
    let mut dns = Dnsmasq::start("metal3.svc", 1);
    dns.stop();

    let lb = Lb::new(dns.addr(), &format!("{NAME}:{port}"));
    let render = lb.render();
    let fallback = format!("fallback = [\"{}:{port}\"]\n", ips[0]);
    let mut proxy = Node::spawn(dir.path(), "lb", IpAddr::from([127, 0, 0, 1]), |a, l| {
        // The upstream table is the last one `Lb` renders.
        format!("{}{fallback}", render(a, l))
    });
    // Running, not ready: the fallback instance is down, DNS has never answered.
    poll_until(Duration::from_secs(10), || {
        proxy.admin_get("/readyz").ok().filter(|r| r.status == 503)
    })
    .unwrap_or_else(|| panic!("never answered /readyz 503:\n{}", proxy.logs().join("\n")));
    assert!(proxy.wait_exit(Duration::ZERO).is_none(), "still running");

    // The first instance comes up: once the balancer sees it healthy, not one read fails.
    backends[0].restart();
    proxy.wait_metric(
        "ironic_proxy_upstream_endpoints",
        &[("upstream", "api"), ("state", "healthy")],
        Duration::from_secs(10),
        |v| v == 1.0,
    );
    let load = Load::start(proxy.listen, 4, usize::MAX, Duration::from_secs(60));
    poll_until(Duration::from_secs(10), || {
        (backends[0].hit_count() >= 50).then_some(())
    })
    .expect("the fallback instance serves");

    // DNS comes back with the two other instances: they take over from the fallback.
    dns.set_hosts(&[("127.0.41.2", NAME), ("127.0.41.3", NAME)]);
    dns.restart();
    poll_until(Duration::from_secs(15), || {
        (backends[1].hit_count() > 0 && backends[2].hit_count() > 0).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the discovered peers never served: {:?}\n{}",
            backends.iter().map(Backend::hit_count).collect::<Vec<_>>(),
            proxy.logs().join("\n")
        )
    });
    let b1_at_takeover = backends[0].hit_count();
    let (b2, b3) = (backends[1].hit_count(), backends[2].hit_count());
    poll_until(Duration::from_secs(10), || {
        (backends[1].hit_count() >= b2 + 100 && backends[2].hit_count() >= b3 + 100).then_some(())
    })
    .expect("the discovered peers keep serving");
    let outcomes = load.finish();
    let failed = node::failures(&outcomes);
    eprintln!(
        "degraded: {} reads after the first instance was up, {} failed; b1 (fallback) {} \
         (at takeover {b1_at_takeover}), b2 {}, b3 {}",
        outcomes.len(),
        failed.len(),
        backends[0].hit_count(),
        backends[1].hit_count(),
        backends[2].hit_count()
    );
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    // Once discovered, the fallback is no longer a peer: at most the requests in flight at the
    // switch reached it afterwards.
    assert!(
        backends[0].hit_count() <= b1_at_takeover + 4,
        "fallback still served: {} after {b1_at_takeover}",
        backends[0].hit_count()
    );
}
