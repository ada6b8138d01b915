//! The resolve loop: one resolution per round, merged with the last set where DNS failed, held
//! while empty, published on change, and scheduled by `refresh` and the answers' TTLs.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::resolve::{Family, LookupError, Resolve};
use super::{DiscoveryOptions, Endpoint, EndpointSet, Target};
use crate::metrics::{Metrics, UpstreamLabels};

/// Short TTLs bring the next query forward, but never to less than this after the last one.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

pub(super) struct Loop<R> {
    resolver: R,
    upstream: String,
    target: Target,
    opts: DiscoveryOptions,
    metrics: Metrics,
    labels: UpstreamLabels,
    tx: watch::Sender<EndpointSet>,
    /// What DNS has given (after merging failures and holding empties). The published set is
    /// this, or `opts.fallback` while this is empty.
    discovered: EndpointSet,
    /// When the answers became empty while the discovered set was not; `None` when not holding.
    empty_since: Option<Instant>,
    /// Consecutive failed attempts.
    failing: u64,
}

impl<R: Resolve> Loop<R> {
    pub(super) fn new(
        resolver: R,
        upstream: String,
        target: Target,
        opts: DiscoveryOptions,
        metrics: Metrics,
        tx: watch::Sender<EndpointSet>,
    ) -> Self {
        let fallback = fallback_set(&opts.fallback);
        if !fallback.is_empty() {
            info!(
                upstream = %upstream,
                endpoints = %fallback.iter().map(describe).collect::<Vec<_>>().join(","),
                "serving from the fallback peers until DNS gives any",
            );
        }
        let labels = UpstreamLabels {
            upstream: upstream.clone(),
        };
        Self {
            resolver,
            upstream,
            target,
            opts,
            metrics,
            labels,
            tx,
            discovered: EndpointSet::default(),
            empty_since: None,
            failing: 0,
        }
    }

    pub(super) async fn run(mut self) {
        loop {
            let started = Instant::now();
            self.metrics
                .dns_resolutions
                .get_or_create(&self.labels)
                .inc();
            let last = self.discovered.clone();
            let outcome = tokio::select! {
                outcome = resolve(&self.resolver, &self.target, &last) => outcome,
                () = self.tx.closed() => return,
            };
            self.report(&outcome.failures);
            let now = Instant::now();
            self.settle(outcome.endpoints, now);
            let delay = self.next_delay(outcome.ttl, now);
            debug!(upstream = %self.upstream, ?delay, "next DNS resolution");
            tokio::select! {
                () = tokio::time::sleep_until(started + delay) => {}
                () = self.tx.closed() => return,
            }
        }
    }

    /// Counts a failed attempt; warns at the first of a run of failures and when it ends, so a
    /// long DNS outage is one warning, not one per refresh (the counter has the rest).
    fn report(&mut self, failures: &[(String, LookupError)]) {
        if failures.is_empty() {
            if self.failing > 0 {
                info!(
                    upstream = %self.upstream,
                    target = %self.target,
                    failed_attempts = self.failing,
                    "DNS resolution recovered",
                );
                self.failing = 0;
            }
            return;
        }
        self.metrics.dns_failures.get_or_create(&self.labels).inc();
        self.failing += 1;
        let failures: Vec<String> = failures
            .iter()
            .map(|(query, err)| format!("{query}: {err}"))
            .collect();
        if self.failing == 1 {
            warn!(
                upstream = %self.upstream,
                target = %self.target,
                failures = %failures.join("; "),
                "DNS resolution failed; keeping the last known endpoints for what failed",
            );
        } else {
            debug!(
                upstream = %self.upstream,
                failures = %failures.join("; "),
                "DNS resolution still failing",
            );
        }
    }

    /// Publishes `endpoints` if they differ from the current set, unless they are empty and
    /// the hold for empty answers has not run out yet.
    fn settle(&mut self, endpoints: Vec<Endpoint>, now: Instant) {
        if endpoints.is_empty() && !self.discovered.is_empty() {
            let since = *self.empty_since.get_or_insert_with(|| {
                warn!(
                    upstream = %self.upstream,
                    target = %self.target,
                    hold = ?self.opts.hold_on_empty,
                    "DNS answered with no endpoints; keeping the last set while the hold lasts",
                );
                now
            });
            if now.duration_since(since) < self.opts.hold_on_empty {
                return;
            }
        }
        self.empty_since = None;
        self.discovered = Arc::new(endpoints.clone());
        let endpoints = if endpoints.is_empty() {
            fallback_set(&self.opts.fallback)
        } else {
            endpoints
        };
        let current = self.tx.borrow().clone();
        if *current == endpoints {
            return;
        }
        let added: Vec<String> = endpoints
            .iter()
            .filter(|e| !current.contains(e))
            .map(describe)
            .collect();
        let removed: Vec<String> = current
            .iter()
            .filter(|e| !endpoints.contains(e))
            .map(describe)
            .collect();
        info!(
            upstream = %self.upstream,
            endpoints = endpoints.len(),
            added = %added.join(","),
            removed = %removed.join(","),
            "endpoint set changed",
        );
        self.tx.send_replace(Arc::new(endpoints));
    }

    /// `refresh`, brought forward by a shorter TTL (floored) and by the end of a hold.
    fn next_delay(&self, ttl: Option<Duration>, now: Instant) -> Duration {
        let mut delay = self.opts.refresh;
        if let Some(ttl) = ttl {
            delay = delay.min(ttl.max(self.opts.min_ttl).max(MIN_INTERVAL));
        }
        if let Some(since) = self.empty_since {
            let left = (since + self.opts.hold_on_empty).saturating_duration_since(now);
            delay = delay.min(left.max(MIN_INTERVAL));
        }
        delay
    }
}

/// The fallback addresses as endpoints, verified against their IP like A/AAAA peers.
pub(super) fn fallback_set(addrs: &[SocketAddr]) -> Vec<Endpoint> {
    let mut set: Vec<Endpoint> = addrs
        .iter()
        .map(|addr| Endpoint {
            addr: *addr,
            tls_name: addr.ip().to_string(),
        })
        .collect();
    set.sort();
    set.dedup();
    set
}

fn describe(endpoint: &Endpoint) -> String {
    if endpoint.tls_name == endpoint.addr.ip().to_string() {
        endpoint.addr.to_string()
    } else {
        format!("{}({})", endpoint.addr, endpoint.tls_name)
    }
}

/// What one round of queries produced.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Sorted and deduplicated; what failed is filled in from the last set.
    pub(super) endpoints: Vec<Endpoint>,
    /// The shortest remaining TTL among the answers that arrived.
    pub(super) ttl: Option<Duration>,
    /// Which query failed, and how.
    pub(super) failures: Vec<(String, LookupError)>,
}

impl Outcome {
    fn note_ttl(&mut self, ttl: Duration) {
        self.ttl = Some(self.ttl.map_or(ttl, |shortest| shortest.min(ttl)));
    }

    fn absorb(&mut self, other: Self) {
        self.endpoints.extend(other.endpoints);
        if let Some(ttl) = other.ttl {
            self.note_ttl(ttl);
        }
        self.failures.extend(other.failures);
    }
}

/// One round of queries for `target`. `last` is the published set, the source of whatever a
/// failed query would have told us.
pub(super) async fn resolve<R: Resolve>(
    resolver: &R,
    target: &Target,
    last: &[Endpoint],
) -> Outcome {
    let mut out = match target {
        Target::Host { name, port } => addresses(resolver, name, &[*port], None, last).await,
        Target::Srv { name } => match resolver.srv(name).await {
            Ok(answer) => {
                let mut out = Outcome::default();
                out.note_ttl(answer.ttl);
                // A target may be listed with several ports; each of its addresses serves each.
                let mut targets: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
                for srv in answer.records.iter().filter(|srv| srv.target != ".") {
                    targets.entry(&srv.target).or_default().push(srv.port);
                }
                // SRV targets are absolute names: no search domains (RFC 2782).
                let fqdns: Vec<(String, &str, &Vec<u16>)> = targets
                    .iter()
                    .map(|(host, ports)| (format!("{host}."), *host, ports))
                    .collect();
                let lookups = fqdns
                    .iter()
                    .map(|(fqdn, host, ports)| addresses(resolver, fqdn, ports, Some(host), last));
                for partial in join_all(lookups).await {
                    out.absorb(partial);
                }
                out
            }
            Err(LookupError::Failed(err)) => Outcome {
                endpoints: last.to_vec(),
                ttl: None,
                failures: vec![(format!("SRV {name}"), LookupError::Failed(err))],
            },
            Err(LookupError::NxDomain | LookupError::NoData) => Outcome::default(),
        },
    };
    out.endpoints.sort();
    out.endpoints.dedup();
    out
}

/// A and AAAA of `host`, each address on each of `ports`. For SRV, `srv_target` is the target
/// host name: the endpoints' TLS name, and the key to their previous addresses.
async fn addresses<R: Resolve>(
    resolver: &R,
    host: &str,
    ports: &[u16],
    srv_target: Option<&str>,
    last: &[Endpoint],
) -> Outcome {
    let (v4, v6) = tokio::join!(
        resolver.ips(host, Family::V4),
        resolver.ips(host, Family::V6)
    );
    let mut out = Outcome::default();
    for (family, result) in [(Family::V4, v4), (Family::V6, v6)] {
        let ips: Vec<IpAddr> = match result {
            Ok(answer) => {
                out.note_ttl(answer.ttl);
                answer.records
            }
            Err(LookupError::NxDomain | LookupError::NoData) => Vec::new(),
            Err(LookupError::Failed(err)) => {
                let kind = if family == Family::V4 { "A" } else { "AAAA" };
                out.failures
                    .push((format!("{kind} {host}"), LookupError::Failed(err)));
                last.iter()
                    .filter(|e| Family::of(e.addr.ip()) == family)
                    .filter(|e| srv_target.is_none_or(|target| e.tls_name == target))
                    .map(|e| e.addr.ip())
                    .collect()
            }
        };
        for ip in ips {
            for &port in ports {
                let tls_name = srv_target.map_or_else(|| ip.to_string(), str::to_owned);
                out.endpoints.push(Endpoint {
                    addr: SocketAddr::new(ip, port),
                    tls_name,
                });
            }
        }
    }
    out
}
