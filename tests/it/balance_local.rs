//! Local first (issue 4): a sidecar sends everything to its own Ironic (a unix socket) while it
//! is healthy, to its peers within a health interval once it stops, and back when it returns;
//! two sidecars that are each other's peers, both with a dead local, never bounce a request
//! between them.

use crate::support;
use crate::support::{backend, dnsmasq, node};

use backend::{bind_same_port, ip, Backend};
use dnsmasq::Dnsmasq;
use node::{Lb, Load, Node};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::upstream::{default_reply, Recorded, Reply};
use support::{poll_until, Upstream};

const ZONE: &str = "metal3.svc";
const INTERVAL: Duration = Duration::from_secs(1);
/// Scheduling slack on a loaded 2-core machine.
const MARGIN: Duration = Duration::from_millis(500);

/// A recording unix upstream that names itself in `x-backend`, like the TCP backends.
fn local_ironic(path: &Path, id: &'static str) -> Upstream {
    Upstream::start_with(
        path,
        Arc::new(move |r: &Recorded| {
            let mut reply: Reply = default_reply(r);
            reply.headers.push(("x-backend".into(), id.into()));
            reply
        }),
    )
}

/// Stops a unix upstream the way a restarting Ironic does: the socket file stays, nobody
/// listens on it, connections are refused.
fn stop_local(up: Upstream) {
    let path = up.path.clone();
    drop(up);
    drop(std::os::unix::net::UnixListener::bind(&path).expect("rebind the socket file"));
    assert!(path.exists(), "the socket file stays");
}

#[test]
fn local_takes_everything_while_healthy_and_peers_take_over_within_a_health_interval() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("api.sock");
    let local = local_ironic(&sock, "local");
    let listeners = bind_same_port(&[ip(31, 1), ip(31, 2)]);
    let port = listeners[0].local_addr().expect("address").port();
    let peers: Vec<Backend> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| Backend::start(&format!("peer{}", i + 1), l))
        .collect();
    let mut dns = Dnsmasq::start(ZONE, 1);
    dns.set_hosts(&[
        ("127.0.31.1", "ironic.metal3.svc"),
        ("127.0.31.2", "ironic.metal3.svc"),
    ]);
    let mut lb = Lb::new(dns.addr(), &format!("ironic.metal3.svc:{port}"));
    lb.local = Some(local.address());
    let proxy = Node::start(
        dir.path(),
        "sidecar",
        IpAddr::from([127, 0, 0, 1]),
        lb.render(),
    );
    proxy.wait_metric(
        "ironic_proxy_upstream_endpoints",
        &[("upstream", "api"), ("state", "healthy")],
        Duration::from_secs(10),
        |v| v == 3.0,
    );

    // Healthy local: every request goes there, none to the (healthy) peers.
    let outcomes = Load::start(proxy.listen, 2, 100, Duration::from_secs(20)).wait();
    assert_eq!(node::answered_by(&outcomes, "local"), 200, "all local");
    assert_eq!(peers[0].hit_count() + peers[1].hit_count(), 0);

    // Local stops under load.
    let load = Load::start(proxy.listen, 2, 200_000, Duration::from_secs(30));
    poll_until(Duration::from_secs(5), || {
        (node::answered_by(&load.outcomes(), "local") > 20).then_some(())
    })
    .expect("load reaches local");
    stop_local(local);
    let stopped = Instant::now();
    let first_peer = poll_until(INTERVAL + MARGIN, || {
        load.outcomes()
            .iter()
            .find(|o| o.at > stopped && o.result.as_deref().is_ok_and(|b| b.starts_with("peer")))
            .map(|o| o.at - stopped)
    })
    .expect("requests go to the peers within one health interval");
    // Exercised: the load runs a health interval while local is down.
    std::thread::sleep(INTERVAL + MARGIN);

    // Local comes back: traffic returns to it after a passing check.
    let local = local_ironic(&sock, "local");
    let restarted = Instant::now();
    let back = poll_until(INTERVAL + MARGIN + MARGIN, || {
        (!local.all().is_empty()).then(|| restarted.elapsed())
    })
    .expect("traffic returns to local once it is back");
    let so_far = load.outcomes().len();
    poll_until(Duration::from_secs(5), || {
        (load.outcomes().len() >= so_far + 20).then_some(())
    })
    .expect("the load goes on once local is back");
    let outcomes = load.finish();
    let after_stop: Vec<&node::Outcome> = outcomes
        .iter()
        // Sent after local stopped: a request local was already answering when it stopped may
        // still complete from it (seen on a loaded machine).
        .filter(|o| o.sent > stopped && o.at > stopped + first_peer && o.at < restarted)
        .collect();
    let failed = node::failures(&outcomes);
    eprintln!(
        "local stopped: first answer from a peer after {first_peer:?}; {} requests while it was \
         down, all by peers: {}; local back: traffic again after {back:?}; {} GETs, {} failed",
        after_stop.len(),
        after_stop
            .iter()
            .all(|o| o.result.as_deref().is_ok_and(|b| b.starts_with("peer"))),
        outcomes.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "failed GETs: {:?}",
        &failed[..failed.len().min(10)]
    );
    assert!(!after_stop.is_empty());
    assert!(
        after_stop
            .iter()
            .all(|o| o.result.as_deref().is_ok_and(|b| b.starts_with("peer"))),
        "while local is down, peers answer"
    );
    assert!(
        peers.iter().all(|p| p.hit_count() > 0),
        "both peers share the load"
    );
}

#[test]
fn two_sidecars_that_are_each_others_peers_never_loop() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Both listen on the same port of their own address; each resolves the other's name.
    let (a_ip, b_ip) = (ip(32, 1), ip(32, 2));
    // Reserved for this test process on every address; each sidecar binds it on its own.
    let port = support::free_port();
    let mut dns = Dnsmasq::start(ZONE, 1);
    dns.set_hosts(&[
        ("127.0.32.1", "a.metal3.svc"),
        ("127.0.32.2", "b.metal3.svc"),
    ]);
    let locals = [
        local_ironic(&dir.path().join("a.sock"), "local-a"),
        local_ironic(&dir.path().join("b.sock"), "local-b"),
    ];
    let mut nodes = Vec::new();
    for (name, me, other, local) in [("a", a_ip, "b", &locals[0]), ("b", b_ip, "a", &locals[1])] {
        let mut lb = Lb::new(dns.addr(), &format!("{other}.metal3.svc:{port}"));
        lb.local = Some(local.address());
        // Keep the peer in the healthy set by its checks even once its local is gone, so that
        // requests do reach it: what must stop them is `Via`, not the health checks.
        lb.unhealthy_after = 1000;
        nodes.push(Node::spawn_at(
            dir.path(),
            name,
            SocketAddr::new(me, port),
            lb.render(),
        ));
    }
    for n in &mut nodes {
        n.wait_ready(Duration::from_secs(10))
            .unwrap_or_else(|logs| panic!("{} not ready: {logs}", n.name));
    }
    // Each sees the other healthy (the first check may have run before the other was up).
    for n in &nodes {
        n.wait_metric(
            "ironic_proxy_upstream_endpoints",
            &[("upstream", "api"), ("state", "healthy")],
            Duration::from_secs(5),
            |v| v == 2.0,
        );
        let mut conn = None;
        assert_eq!(
            node::get_backend(&mut conn, n.listen, "/v1"),
            Ok(format!("local-{}", n.name)),
            "local first while it is up"
        );
    }

    let [la, lb_] = locals;
    stop_local(la);
    stop_local(lb_);

    // Requests to both, one at a time; each must end quickly in a 5xx.
    let mut statuses = Vec::new();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        for n in &nodes {
            let path = format!("/loop/{}/{i}", n.name);
            let started = Instant::now();
            let mut c = support::HttpConn::tcp(n.listen).expect("connect");
            let r = c
                .request("GET", &path, &[("Connection", "close")], b"")
                .expect("a response");
            slowest = slowest.max(started.elapsed());
            assert!(
                (500..600).contains(&r.status),
                "{path}: {} {}",
                r.status,
                r.text()
            );
            statuses.push(r.status);
        }
        // Exercised: the rounds are spread over time, not sent in one burst.
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        slowest < Duration::from_secs(2),
        "5xx quickly: slowest {slowest:?}"
    );

    // Each request appears once in the access log of the proxy it was sent to, at most once in
    // the other's, and never comes back. The access log is written in batches: a graceful exit
    // writes every line, so stop both first.
    for n in &nodes {
        n.signal("TERM");
    }
    for n in &mut nodes {
        assert!(n.wait_exit(Duration::from_secs(10)).is_some(), "exit");
    }
    let logs: Vec<Vec<String>> = nodes.iter().map(|n| n.access_logs()).collect();
    let count = |log: &[String], path: &str| {
        log.iter()
            .filter(|l| l.contains(&format!("path={path} ")))
            .count()
    };
    let mut forwarded = 0;
    for i in 0..20 {
        for (me, other) in [(0, 1), (1, 0)] {
            let path = format!("/loop/{}/{i}", nodes[me].name);
            assert_eq!(count(&logs[me], &path), 1, "{path} reached its proxy once");
            let relayed = count(&logs[other], &path);
            assert!(relayed <= 1, "{path} forwarded at most once");
            forwarded += relayed;
        }
    }
    eprintln!(
        "mutual peers with dead locals: 40 requests, statuses {:?}, slowest {slowest:?}, \
         {forwarded} forwarded once to the other proxy, none twice",
        {
            let mut s = statuses.clone();
            s.sort_unstable();
            s.dedup();
            s
        }
    );
    assert!(
        forwarded > 0,
        "some requests did go to the peer (so Via is what stopped them)"
    );
}

#[test]
fn a_sidecar_whose_ironic_is_down_fails_the_load_balancers_health_checks() {
    // The DaemonSet topology: a load balancer in front of two sidecars, each with its own Ironic
    // (a unix socket) and the other sidecar as peer through the headless Service's name.
    let dir = tempfile::tempdir().expect("temp dir");
    let (s1, s2) = (ip(35, 1), ip(35, 2));
    // Reserved for this test process on every address; each sidecar binds it on its own.
    let port = support::free_port();
    let mut dns = Dnsmasq::start(ZONE, 1);
    dns.set_hosts(&[
        ("127.0.35.1", "ironic.metal3.svc"),
        ("127.0.35.2", "ironic.metal3.svc"),
    ]);
    let target = format!("ironic.metal3.svc:{port}");
    let ironics = [
        local_ironic(&dir.path().join("ironic-1.sock"), "ironic-1"),
        local_ironic(&dir.path().join("ironic-2.sock"), "ironic-2"),
    ];
    let mut sidecars = Vec::new();
    for (name, me, local) in [("s1", s1, &ironics[0]), ("s2", s2, &ironics[1])] {
        let mut lb = Lb::new(dns.addr(), &target);
        lb.local = Some(local.address());
        sidecars.push(Node::spawn_at(
            dir.path(),
            name,
            SocketAddr::new(me, port),
            lb.render(),
        ));
    }
    for n in &mut sidecars {
        n.wait_ready(Duration::from_secs(10))
            .unwrap_or_else(|logs| panic!("{} not ready: {logs}", n.name));
    }
    let lb = Node::start(
        dir.path(),
        "lb",
        IpAddr::from([127, 0, 0, 1]),
        Lb::new(dns.addr(), &target).render(),
    );
    lb.wait_metric(
        "ironic_proxy_upstream_endpoints",
        &[("upstream", "api"), ("state", "healthy")],
        Duration::from_secs(10),
        |v| v == 2.0,
    );
    let before = Load::start_method(lb.listen, "POST", 2, 20, Duration::from_secs(10)).wait();
    assert!(
        node::failures(&before).is_empty(),
        "{:?}",
        node::failures(&before)
    );
    assert!(
        node::answered_by(&before, "ironic-1") > 0 && node::answered_by(&before, "ironic-2") > 0
    );

    // Ironic behind s1 stops; s1 itself keeps running (and could relay to s2).
    let [i1, _i2] = ironics;
    stop_local(i1);
    let stopped = Instant::now();
    // Two failed checks (unhealthy_after = 2) one interval apart, plus the 1 s metric period.
    let bound = INTERVAL * 3 + MARGIN * 4;
    let out = poll_until(bound, || {
        (node::endpoints(&lb, "healthy") == 1.0).then(|| stopped.elapsed())
    });
    eprintln!(
        "sidecar s1's Ironic stopped: load balancer marks s1 unhealthy after {out:?} (bound \
         {bound:?}); healthy now {}",
        node::endpoints(&lb, "healthy")
    );
    assert!(
        out.is_some(),
        "the load balancer still counts s1 healthy: its health checks were answered by s2 through \
         s1, while its requests get 502 from s1"
    );

    // Non-idempotent requests (never replayed once sent) all land on the healthy sidecar.
    let after = Load::start_method(lb.listen, "POST", 2, 50, Duration::from_secs(10)).wait();
    let failed = node::failures(&after);
    eprintln!(
        "{} POSTs after s1 was marked unhealthy: {} failed",
        after.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "failed POSTs: {:?}",
        &failed[..failed.len().min(5)]
    );
    assert_eq!(node::answered_by(&after, "ironic-2"), after.len());
}
