//! An upstream's endpoints: the optional `local` one, preferred while healthy, and the peers
//! found through DNS, with their health and the rules for picking and retrying.
//!
//! - Peers come from the discovery loop; on every change the set is rebuilt, keeping the
//!   [`Peer`] (pool, health, checker) of every address that remains, so health carries over.
//!   A new peer takes traffic only after its first active check passes.
//! - `local` is used while available; when it is the only endpoint it is always tried (a
//!   refused connect then answers 502, the status the contract gives a sidecar whose Ironic restarts).
//! - Loop safety: a request that already came through an ironic-proxy (`Via`) only goes to
//!   `local`, never to a peer again.

use super::upstream::{Endpoint, EndpointLimits};
use crate::balance::{run_checks, Health, HealthOptions, Load, Picker};
use crate::config::UpstreamAddr;
use crate::discovery::{self, EndpointSet};
use crate::metrics::{EndpointHealthLabels, EndpointLabels, Metrics, PeerTlsLabels};
use crate::tls::peer::PeerTls;
use arc_swap::ArcSwap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One endpoint with its health.
pub struct Member {
    pub endpoint: Arc<Endpoint>,
    pub health: Arc<Health>,
    checker: Option<JoinHandle<()>>,
    /// The discovered address, for peers.
    key: Option<discovery::Endpoint>,
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(c) = &self.checker {
            c.abort();
        }
    }
}

impl Load for Arc<Member> {
    fn in_flight(&self) -> usize {
        self.endpoint.in_flight()
    }

    fn is_available(&self, now: Instant) -> bool {
        self.health.is_available(now)
    }

    fn checks_passed(&self) -> bool {
        self.health.checks_passed()
    }
}

/// Where a pick came from, for retry bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Local,
    Peer(usize),
}

pub struct Pool {
    pub name: String,
    local: Option<Arc<Member>>,
    peers: ArcSwap<Vec<Arc<Member>>>,
    has_dns: bool,
    picker: Picker,
    pub retries: u32,
    /// `ironic_proxy_upstream_retries_total` of this upstream, resolved once.
    pub retried: prometheus_client::metrics::counter::Counter,
}

/// How to build the pool's endpoints.
pub struct PoolOptions {
    pub name: String,
    pub local: Option<UpstreamAddr>,
    /// TLS towards `local` (an egress listener's peer); `None`: plain, as a sidecar's Ironic.
    pub local_tls: Option<PeerTls>,
    pub dns: Option<watch::Receiver<EndpointSet>>,
    pub peer_tls: Option<Arc<crate::tls::ReloadableClient>>,
    pub balance: crate::balance::Policy,
    pub health: HealthOptions,
    pub retries: u32,
    pub limits: EndpointLimits,
    pub metrics: Metrics,
    /// Whether the pool runs its own once-a-second task (health series, expiry of idle
    /// connections). `false` for an egress's plain destinations, possibly thousands of BMCs
    /// and agents: no series, and the egress sweeps them ([`Pool::sweep`]).
    pub report: bool,
}

impl PoolOptions {
    /// A sidecar's upstream: one `local` endpoint, no peers, the default balancing, health and
    /// retries. For embedding the proxy without a config file (benchmarks, fuzzing).
    pub fn local(
        name: &str,
        addr: UpstreamAddr,
        max_response_head: usize,
        metrics: Metrics,
    ) -> Self {
        Self {
            name: name.into(),
            local: Some(addr),
            local_tls: None,
            dns: None,
            peer_tls: None,
            balance: crate::balance::Policy::LeastRequest,
            health: HealthOptions::default(),
            retries: 2,
            limits: EndpointLimits::with_head(max_response_head),
            metrics,
            report: true,
        }
    }
}

/// Where a checker counts the TLS failures of its probes.
#[derive(Clone)]
struct CheckerMetrics {
    upstream: String,
    metrics: Metrics,
}

fn spawn_checker(
    endpoint: &Arc<Endpoint>,
    health: &Arc<Health>,
    h: &HealthOptions,
    m: &CheckerMetrics,
) -> JoinHandle<()> {
    let ep = endpoint.clone();
    let path = h.path.clone();
    let m = m.clone();
    // The reason of the last failed TLS handshake, so that a peer refused on every check is
    // one warning per run of failures (the counter has every one).
    let last_tls: Arc<std::sync::Mutex<Option<&'static str>>> = Arc::default();
    let span = tracing::info_span!("health", endpoint = %endpoint.name);
    let fut = run_checks(health.clone(), h.clone(), move || {
        let (ep, path, m, last_tls) = (ep.clone(), path.clone(), m.clone(), last_tls.clone());
        async move {
            let outcome = ep.probe(&path).await;
            let tls = outcome
                .as_ref()
                .err()
                .and_then(|e| crate::tls::peer::failure_reason(e));
            let mut last = last_tls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((reason, t)) = tls {
                m.metrics
                    .peer_tls_failures
                    .get_or_create(&PeerTlsLabels {
                        upstream: m.upstream.clone(),
                        reason,
                    })
                    .inc();
                if *last != Some(reason) {
                    tracing::warn!(upstream = %m.upstream, reason, error = %t, "peer TLS failed; health check fails");
                }
            } else if let Err(e) = &outcome {
                tracing::debug!(error = %crate::error::chain(e), "health check failed");
            }
            *last = tls.map(|(reason, _)| reason);
            outcome.unwrap_or(false)
        }
    });
    tokio::spawn(tracing::Instrument::instrument(fut, span))
}

impl Pool {
    pub fn new(opts: PoolOptions) -> Arc<Self> {
        let has_dns = opts.dns.is_some();
        let checker_metrics = CheckerMetrics {
            upstream: opts.name.clone(),
            metrics: opts.metrics.clone(),
        };
        let local_tls = opts.local_tls;
        // The pool's connections all follow one client configuration (its `local` endpoint's
        // towards an egress peer, or its peers'): its changes retire their idle connections.
        let tls_changes = local_tls
            .as_ref()
            .map(PeerTls::changes)
            .or_else(|| opts.peer_tls.as_ref().map(|c| c.changes()));
        let local = opts.local.map(|addr| {
            let endpoint = Arc::new(Endpoint::new(addr, local_tls, opts.limits));
            if has_dns {
                // With peers to fall back to, local is health-checked like them, but starts
                // available so the first requests need not wait for a check.
                let health = Arc::new(Health::passive_only());
                let checker = Some(spawn_checker(
                    &endpoint,
                    &health,
                    &opts.health,
                    &checker_metrics,
                ));
                Arc::new(Member {
                    endpoint,
                    health,
                    checker,
                    key: None,
                })
            } else {
                Arc::new(Member {
                    endpoint,
                    health: Arc::new(Health::passive_only()),
                    checker: None,
                    key: None,
                })
            }
        });
        let pool = Arc::new(Self {
            name: opts.name.clone(),
            local,
            peers: ArcSwap::from_pointee(Vec::new()),
            has_dns,
            picker: Picker::new(opts.balance),
            retries: opts.retries,
            retried: opts
                .metrics
                .upstream_retries
                .get_or_create(&crate::metrics::UpstreamLabels {
                    upstream: opts.name.clone(),
                })
                .clone(),
        });
        if let Some(rx) = opts.dns {
            tokio::spawn(follow(
                Arc::downgrade(&pool),
                rx,
                opts.peer_tls,
                opts.health,
                opts.limits,
                checker_metrics,
            ));
        }
        if opts.report {
            tokio::spawn(report(Arc::downgrade(&pool), opts.metrics, tls_changes));
        }
        pool
    }

    /// For an egress destination's pool (no task, no peers): closes its expired idle
    /// connections; true when unused, so that dropping it loses nothing.
    pub fn sweep(&self) -> bool {
        self.local.iter().all(|m| {
            m.endpoint.close_expired();
            m.endpoint.open_connections() == 0 && m.endpoint.in_flight() == 0
        })
    }

    /// Picks the next endpoint for a request, given the slots already tried.
    pub fn pick(&self, tried: &[Slot], via_proxy: bool) -> Option<(Slot, Arc<Member>)> {
        if let Some(local) = &self.local {
            let untried = !tried.contains(&Slot::Local);
            // A sidecar's lone `local` is picked without reading the clock.
            let alone = !self.has_dns || via_proxy;
            if untried && (alone || local.health.is_available(Instant::now())) {
                return Some((Slot::Local, local.clone()));
            }
        }
        if via_proxy {
            return None;
        }
        let now = Instant::now();
        let peers = self.peers.load();
        let exclude: smallvec::SmallVec<[usize; 4]> = tried
            .iter()
            .filter_map(|s| {
                if let Slot::Peer(i) = s {
                    Some(*i)
                } else {
                    None
                }
            })
            .collect();
        if let Some(i) = self.picker.pick(&peers, &exclude, now) {
            return Some((Slot::Peer(i), peers[i].clone()));
        }
        // Panic mode (as Envoy's): when no peer passes its checks, health checks are more likely
        // wrong (an overloaded node, slow probes) than every peer dead; try the untried peers
        // anyway rather than answer 503 to a cluster that may still work: first those ejected
        // after failed requests (they passed their last check), never one that has not passed
        // a check while such a one is left.
        if peers.iter().any(|p| p.is_available(now)) {
            return None;
        }
        let i = crate::balance::fallback(&peers, &exclude)?;
        tracing::debug!(upstream = %self.name, endpoint = %peers[i].endpoint.name, "no healthy peer: trying one anyway");
        Some((Slot::Peer(i), peers[i].clone()))
    }

    /// Every endpoint a find asks (`proxy::find`), `local` first: `local` when it is the only
    /// endpoint, the request already came through a proxy, or it is available; and the
    /// available peers, or every peer when none is (panic mode, as [`Self::pick`]). Also how
    /// many known endpoints were left out as unavailable: one of them may be the one that has
    /// the file, so a find that finds nothing then answers 502, not 404. A request that came
    /// through a proxy (`via_proxy`) gets `local` only: a fan-out never fans out again.
    pub fn find_members(&self, via_proxy: bool) -> (Vec<(Slot, Arc<Member>)>, usize) {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut skipped = 0;
        if let Some(local) = &self.local {
            if !self.has_dns || via_proxy || local.health.is_available(now) {
                out.push((Slot::Local, local.clone()));
            } else {
                skipped += 1;
            }
        }
        if via_proxy {
            return (out, skipped);
        }
        let peers = self.peers.load();
        let any_available = peers.iter().any(|p| p.is_available(now));
        for (i, p) in peers.iter().enumerate() {
            if !any_available || p.is_available(now) {
                out.push((Slot::Peer(i), p.clone()));
            } else {
                skipped += 1;
            }
        }
        (out, skipped)
    }

    /// Whether [`Self::pick`] might find an endpoint outside `tried`: cheap and conservative (an
    /// unavailable peer still counts), so a request is copied for a retry only when one can
    /// follow.
    pub fn has_alternative(&self, tried: &[Slot], via_proxy: bool) -> bool {
        let local_left = self.local.is_some() && !tried.contains(&Slot::Local);
        if local_left || via_proxy {
            return local_left;
        }
        let peers_tried = tried.iter().filter(|s| matches!(s, Slot::Peer(_))).count();
        self.peers.load().len() > peers_tried
    }

    /// Whether some endpoint can take a request now (for `/readyz`).
    pub fn is_ready(&self) -> Result<(), String> {
        let now = Instant::now();
        if let Some(local) = &self.local {
            if !self.has_dns || local.health.is_available(now) {
                return Ok(());
            }
        }
        if self.peers.load().iter().any(|p| p.is_available(now)) {
            return Ok(());
        }
        Err(format!("upstream {}: no healthy endpoint", self.name))
    }

    fn counts(&self) -> [(&'static str, i64); 3] {
        let mut c = [("healthy", 0), ("unhealthy", 0), ("ejected", 0)];
        let peers = self.peers.load();
        for m in self.local.iter().chain(peers.iter()) {
            let s = m.health.state();
            if let Some(e) = c.iter_mut().find(|(n, _)| *n == s) {
                e.1 += 1;
            }
        }
        c
    }
}

/// Rebuilds the peer set on every discovery change, carrying members over.
async fn follow(
    pool: std::sync::Weak<Pool>,
    mut rx: watch::Receiver<EndpointSet>,
    tls: Option<Arc<crate::tls::ReloadableClient>>,
    health: HealthOptions,
    limits: EndpointLimits,
    metrics: CheckerMetrics,
) {
    loop {
        let set = rx.borrow_and_update().clone();
        let Some(p) = pool.upgrade() else { return };
        let old = p.peers.load_full();
        let mut next = Vec::with_capacity(set.len());
        for d in set.iter() {
            if let Some(m) = old.iter().find(|m| m.key.as_ref() == Some(d)) {
                next.push(m.clone());
                continue;
            }
            let peer_tls = match &tls {
                None => None,
                Some(cfg) => match rustls_pki_types::ServerName::try_from(d.tls_name.clone()) {
                    Ok(name) => Some(PeerTls::new(cfg.clone(), name)),
                    Err(e) => {
                        tracing::warn!(upstream = %p.name, peer = %d.addr, error = %e, "peer name unusable for TLS; skipping");
                        continue;
                    }
                },
            };
            let addr = UpstreamAddr::Tcp {
                host: d.addr.ip().to_string(),
                port: d.addr.port(),
            };
            let endpoint = Arc::new(Endpoint::new(addr, peer_tls, limits));
            let h = Arc::new(Health::new(health.healthy_after, health.unhealthy_after));
            let checker = Some(spawn_checker(&endpoint, &h, &health, &metrics));
            next.push(Arc::new(Member {
                endpoint,
                health: h,
                checker,
                key: Some(d.clone()),
            }));
        }
        let added = next
            .iter()
            .filter(|m| !old.iter().any(|o| Arc::ptr_eq(o, m)))
            .count();
        let removed = old
            .iter()
            .filter(|o| !next.iter().any(|m| Arc::ptr_eq(o, m)))
            .count();
        tracing::info!(upstream = %p.name, peers = next.len(), added, removed, "peer set changed");
        p.peers.store(Arc::new(next));
        drop(p);
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Resolves when `rx` announces a change (`true`) or its sender is gone (`false`); never
/// without a receiver.
async fn changed(rx: Option<&mut watch::Receiver<u64>>) -> bool {
    match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// Publishes endpoint counts by state every second, and closes the idle upstream connections
/// that have expired (without it they would wait for the endpoint's next request). Also at
/// once when the pool's TLS identity changes (`tls_changes`): idle connections made with the
/// replaced certificate or trust are closed then, not at their next checkout.
async fn report(
    pool: std::sync::Weak<Pool>,
    metrics: Metrics,
    mut tls_changes: Option<watch::Receiver<u64>>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut shown: Vec<EndpointHealthLabels> = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = changed(tls_changes.as_mut()) => {
                if !changed {
                    // The configuration is gone; the ticks go on.
                    tls_changes = None;
                }
            }
        }
        let Some(p) = pool.upgrade() else {
            for l in &shown {
                metrics.endpoint_healthy.remove(l);
            }
            return;
        };
        let peers = p.peers.load();
        for m in p.local.iter().chain(peers.iter()) {
            m.endpoint.close_expired();
        }
        // Per endpoint: 1 healthy, 0 not; series of endpoints that left the set are removed.
        let now: Vec<(EndpointHealthLabels, bool)> = p
            .local
            .iter()
            .map(|m| (m, "local"))
            .chain(peers.iter().map(|m| (m, "peer")))
            .map(|(m, role)| {
                let labels = EndpointHealthLabels {
                    upstream: p.name.clone(),
                    endpoint: m.endpoint.name.clone(),
                    role,
                };
                (labels, m.health.state() == "healthy")
            })
            .collect();
        for l in shown.iter().filter(|l| !now.iter().any(|(n, _)| n == *l)) {
            metrics.endpoint_healthy.remove(l);
        }
        for (l, healthy) in &now {
            metrics
                .endpoint_healthy
                .get_or_create(l)
                .set(i64::from(*healthy));
        }
        shown = now.into_iter().map(|(l, _)| l).collect();
        for (state, n) in p.counts() {
            metrics
                .upstream_endpoints
                .get_or_create(&EndpointLabels {
                    upstream: p.name.clone(),
                    state,
                })
                .set(n);
        }
    }
}
