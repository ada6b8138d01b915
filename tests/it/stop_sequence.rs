//! The kit's stop order, replayed through a load balancer (issue 53, item 2): an Ironic pod that
//! is deleted leaves the Service's endpoints first; its containers' `preStop` delay lasts until
//! no DNS answer naming it is left; only then do Ironic and, last, the sidecar stop. Two real
//! sidecars (ironic-proxy, plain listeners on one port of two loopback addresses) in front of
//! two backends, a real dnsmasq publishing both, and a real load balancer that finds them
//! through it. Clients keep sending through the balancer while one sidecar is withdrawn and
//! stopped: no request fails, and the balancer never met a refused connection (it would have
//! retried it on the other sidecar, and counted the retry). Without the withdrawal first, the
//! balancer meets the sidecar's closing: a refused connection it retries, or a POST sent on a
//! pooled connection the draining sidecar has just closed, which it may not replay (a 502 to
//! the client): what the kit's delay is for.
//!
//! Real time (real processes); every wait is for an event (a metric, an exit), bounded.

use crate::support;
use crate::support::{backend, dnsmasq, node};

use backend::{bind_same_port, ip, Backend};
use dnsmasq::Dnsmasq;
use node::{free_port_on, Lb, Load, Node};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use support::HANG;

const ZONE: &str = "metal3.svc";
const NAME: &str = "ironic.metal3.svc";

/// A sidecar: one plain listener at `listen` in front of `backend` (Ironic's stand-in, which
/// answers `/health` for the balancer's checks).
fn sidecar(dir: &std::path::Path, name: &str, listen: SocketAddr, backend: SocketAddr) -> Node {
    support::proxy::start_ready(Duration::from_secs(15), || {
        Node::spawn_at(dir, name, listen, |admin, listen| {
            format!(
                r#"
[admin]
listen = "127.0.0.1:{admin}"

[limits]
drain_timeout = "10s"

[[listeners]]
name = "api"
listen = "{listen}"
tls = "none"
upstream = "{backend}"
"#
            )
        })
    })
}

#[test]
fn a_sidecar_stopped_in_the_kits_order_refuses_no_connection_through_the_balancer() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Ironic's stand-ins, and the two sidecars on one port of 127.0.31.1 and .2, as the
    // headless Service's records name them.
    let backends: Vec<Backend> = bind_same_port(&[ip(31, 11), ip(31, 12)])
        .into_iter()
        .zip(["b1", "b2"])
        .map(|(l, id)| Backend::start(id, l))
        .collect();
    let (s1_ip, s2_ip): (IpAddr, IpAddr) = (ip(31, 1), ip(31, 2));
    let port = free_port_on(s1_ip);
    std::net::TcpListener::bind(SocketAddr::new(s2_ip, port))
        .unwrap_or_else(|e| panic!("port {port} is taken on {s2_ip}: {e}"));
    let mut s1 = sidecar(
        dir.path(),
        "sidecar-1",
        SocketAddr::new(s1_ip, port),
        backends[0].addr,
    );
    let _s2 = sidecar(
        dir.path(),
        "sidecar-2",
        SocketAddr::new(s2_ip, port),
        backends[1].addr,
    );

    let mut dns = Dnsmasq::start(ZONE, 1);
    let (a1, a2) = (s1_ip.to_string(), s2_ip.to_string());
    dns.set_hosts(&[(a1.as_str(), NAME), (a2.as_str(), NAME)]);
    let lb = Node::start(
        dir.path(),
        "balancer",
        IpAddr::from([127, 0, 0, 1]),
        Lb::new(dns.addr(), &format!("{NAME}:{port}")).render(),
    );
    let healthy = [("upstream", "api"), ("state", "healthy")];
    lb.wait_metric("ironic_proxy_upstream_endpoints", &healthy, HANG, |v| {
        v == 2.0
    });

    // POST: never replayed once sent, so only a failure before the first byte (a refused
    // connection) could be retried, and the retry counter would show it.
    let load = Load::start_method(lb.listen, "POST", 2, 100_000, Duration::from_secs(60));
    support::poll_until(HANG, || {
        backends.iter().all(|b| b.hit_count() > 0).then_some(())
    })
    .expect("both sidecars get traffic");

    // 1. The pod is deleted: its address leaves the Service, and the balancer's next answer
    //    from DNS drops it. The kit's preStop delay is reasoned to cover exactly this.
    dns.set_hosts(&[(a2.as_str(), NAME)]);
    lb.wait_metric(
        "ironic_proxy_upstream_endpoints",
        &[("upstream", "api")],
        HANG,
        |v| v == 1.0,
    );
    // 2. The delay is over: Ironic stops (gracefully: what it has in flight is answered), then
    //    the sidecar, last, drains and closes its sockets.
    s1.signal("TERM");
    let exit = s1.wait_exit(HANG);
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "sidecar-1 exits 0");
    // 3. The other sidecar carries the traffic on.
    let b2_after_stop = backends[1].hit_count();
    support::poll_until(HANG, || {
        (backends[1].hit_count() > b2_after_stop + 500).then_some(())
    })
    .expect("sidecar-2 keeps answering after sidecar-1 stopped");
    let outcomes = load.finish();

    let failed = node::failures(&outcomes);
    assert!(
        failed.is_empty(),
        "{} of {} requests through the balancer failed: {:?}",
        failed.len(),
        outcomes.len(),
        &failed[..failed.len().min(10)]
    );
    let retries = lb.metric("ironic_proxy_upstream_retries", &[("upstream", "api")]);
    assert_eq!(
        retries, 0.0,
        "the balancer met a refused or failed connection and retried it"
    );
    eprintln!(
        "stop in the kit's order: {} requests through the balancer, 0 failed, 0 retried; \
         sidecar-1's Ironic answered {}, sidecar-2's {}",
        outcomes.len(),
        backends[0].hit_count(),
        backends[1].hit_count()
    );
}
