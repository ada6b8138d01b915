//! Peer discovery through DNS: a resolve loop that turns a name into a set of endpoints.
//!
//! What it owns: the `dns` target of an upstream (`name:port` for A/AAAA records of a headless
//! Service, `srv:_api._tcp.name` for SRV records), the hickory resolver that queries it, and a
//! task that re-resolves it and publishes the resulting [`EndpointSet`] through a
//! [`tokio::sync::watch`] channel.
//!
//! What it guarantees (the operator's view: "it depends on nothing in the cluster but
//! DNS, and keeps serving from its last known peers when DNS itself is down"):
//!
//! - **Refresh.** The name is re-resolved every `refresh`, earlier when the shortest TTL of the
//!   answer (floored at `min_ttl`, and never below 100 ms) is shorter. A new set is published only
//!   when it differs from the last one, so receivers wake only for real changes.
//! - **Failure keeps the last set.** A timeout, SERVFAIL, REFUSED or an unreachable server never
//!   removes an endpoint: whatever that query would have told us is taken from the last set. One
//!   warning and one `dns_failures` count per failed attempt; every attempt counts
//!   `dns_resolutions`. Failures are never turned into "no endpoints", so an outage of the DNS
//!   server cannot make the proxy flap.
//! - **Empty answers are held.** NXDOMAIN, or NOERROR without records, is an answer, not a failure,
//!   but an empty set is only published after the answers have stayed empty for `hold_on_empty`.
//!   The reason: a headless Service lists only ready pods, and during a rolling restart (or when
//!   every pod briefly fails readiness at once) its records can vanish for a moment. Emptying the
//!   set at once would turn that moment into 503s for every client; keeping the last endpoints lets
//!   health checks and passive ejection decide, and the proxy recovers as soon as DNS does. A
//!   partial shrink (some records left) is published at once: that is an ordinary removal.
//! - **Fallback.** An upstream may list fixed `fallback` peers. They are the published set
//!   whenever discovery has none: from the start until DNS first answers with records (a
//!   cluster whose DNS is down when the proxy starts), and after empty answers outlast the hold.
//!   A failing DNS server never brings them back once peers were discovered (the last set is
//!   kept, as above), and they are never mixed with discovered peers.
//! - **Start.** [`spawn`] returns at once. The first value of the channel is the fallback set
//!   (often empty) until the first resolution completes (on a healthy DNS server, within milliseconds). Callers that
//!   need the first answer wait with `Receiver::wait_for(|set| !set.is_empty())` or treat the
//!   upstream as not ready, which is what `/readyz` reports anyway.
//! - **End.** The task stops by itself once every receiver is dropped.
//!
//! SRV records: every target of the answer is resolved to its A/AAAA addresses and each address
//! becomes an endpoint with the record's port and the target host name as its TLS name. Priority
//! and weight are ignored: Kubernetes publishes every pod with the same values, and the balancer
//! and health checks decide among endpoints. A target of `.` ("service not available", RFC 2782)
//! contributes nothing.

pub(crate) mod resolve;
mod task;
#[cfg(test)]
mod tests;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::dns_name::{DnsName, DnsNameError};
use crate::metrics::Metrics;

/// What to resolve for one upstream, parsed from its `dns` key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A/AAAA records of `name`; every address becomes an endpoint on `port`.
    Host { name: String, port: u16 },
    /// SRV records of `name` (`_service._proto.name`); targets and ports come from the records.
    Srv { name: String },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host { name, port } => write!(f, "{name}:{port}"),
            Self::Srv { name } => write!(f, "srv:{name}"),
        }
    }
}

impl FromStr for Target {
    type Err = DiscoveryError;

    /// Parses `ironic.metal3.svc:6385` or `srv:_api._tcp.ironic.metal3.svc`.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let fail = |reason| DiscoveryError::Target {
            input: input.to_owned(),
            reason,
        };
        if let Some(name) = input.strip_prefix("srv:") {
            if name.contains(':') {
                return Err(fail(TargetError::SrvPort));
            }
            check_name(name).map_err(fail)?;
            return Ok(Self::Srv {
                name: name.to_owned(),
            });
        }
        if input.starts_with('[') || input.parse::<SocketAddr>().is_ok() {
            return Err(fail(TargetError::IpAddress));
        }
        let (name, port) = input
            .rsplit_once(':')
            .ok_or_else(|| fail(TargetError::Shape))?;
        if name.parse::<std::net::IpAddr>().is_ok() {
            return Err(fail(TargetError::IpAddress));
        }
        check_name(name).map_err(fail)?;
        let port = match port.parse::<u16>() {
            Ok(0) | Err(_) => return Err(fail(TargetError::Port(port.to_owned()))),
            Ok(port) => port,
        };
        Ok(Self::Host {
            name: name.to_owned(),
            port,
        })
    }
}

/// Checks the syntax of a DNS name: [`DnsName`]'s, whose `_` SRV owner names need. The name is
/// kept as written: a trailing dot makes it absolute, which tells the resolver to skip the search
/// domains of `/etc/resolv.conf`.
fn check_name(name: &str) -> Result<(), TargetError> {
    DnsName::parse(name).map(drop).map_err(TargetError::Name)
}

/// How the resolve loop behaves; see the module documentation for the why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryOptions {
    /// DNS servers to query; empty means the system resolver configuration (`/etc/resolv.conf`,
    /// with its search domains, `ndots`, timeout and attempts).
    pub servers: Vec<SocketAddr>,
    /// Re-resolution period.
    pub refresh: Duration,
    /// Floor for record TTLs, so a TTL of 0 cannot turn the loop into a busy loop.
    pub min_ttl: Duration,
    /// How long an empty answer (NXDOMAIN or no records) leaves the last set in place.
    pub hold_on_empty: Duration,
    /// Peers published while discovery has none: before DNS has answered with any record, and
    /// after an empty answer has outlasted the hold. They are never mixed with discovered
    /// peers; the first non-empty answer replaces them.
    pub fallback: Vec<SocketAddr>,
}

/// One discovered peer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// The name to verify the peer's certificate against: the IP as a string when discovered
    /// through A/AAAA records, the SRV target host name (lower case, no trailing dot) for SRV.
    pub tls_name: String,
}

/// A published endpoint set: sorted and deduplicated, shared by every reader.
pub type EndpointSet = Arc<Vec<Endpoint>>;

/// Why discovery could not start, or why a `dns` target does not parse.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("`{input}`: {reason}")]
    Target { input: String, reason: TargetError },
    #[error("cannot read the system DNS configuration (/etc/resolv.conf)")]
    SystemConfig(#[source] hickory_resolver::ResolveError),
    #[error("`refresh` must be longer than zero")]
    ZeroRefresh,
    #[error("DNS discovery must be started inside a tokio runtime")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
}

/// What is wrong with a `dns` target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("expected NAME:PORT (A/AAAA records) or srv:NAME (SRV records)")]
    Shape,
    #[error("an SRV target takes no port: the SRV records carry it")]
    SrvPort,
    #[error("`dns` takes a DNS name, not an IP address (`local` takes a fixed address)")]
    IpAddress,
    #[error("port `{0}` is not a number in 1..=65535")]
    Port(String),
    /// The reason is shown, not chained: this error is itself the reason of
    /// [`DiscoveryError::Target`].
    #[error("not a valid DNS name: {0}")]
    Name(DnsNameError),
}

/// Spawns the resolve loop on the current tokio runtime.
///
/// Returns at once: the receiver holds an empty set until the first resolution completes, and
/// its value changes only when the set changes. `upstream_name` labels the metrics and logs.
/// The task ends when every receiver is dropped; aborting the handle also stops it.
///
/// # Errors
///
/// [`DiscoveryError::SystemConfig`] when `opts.servers` is empty and the system configuration
/// cannot be read, [`DiscoveryError::ZeroRefresh`], and [`DiscoveryError::NoRuntime`] outside
/// a tokio runtime. DNS failures after the start are never errors: see the module docs.
pub fn spawn(
    upstream_name: String,
    target: Target,
    opts: DiscoveryOptions,
    metrics: Metrics,
) -> Result<(watch::Receiver<EndpointSet>, JoinHandle<()>), DiscoveryError> {
    let resolver = resolve::Hickory::new(&opts.servers).map_err(DiscoveryError::SystemConfig)?;
    spawn_with(resolver, upstream_name, target, opts, metrics)
}

/// [`spawn`] with any resolver: the seam the unit tests use with a scripted one.
pub(crate) fn spawn_with<R: resolve::Resolve>(
    resolver: R,
    upstream_name: String,
    target: Target,
    opts: DiscoveryOptions,
    metrics: Metrics,
) -> Result<(watch::Receiver<EndpointSet>, JoinHandle<()>), DiscoveryError> {
    if opts.refresh.is_zero() {
        return Err(DiscoveryError::ZeroRefresh);
    }
    let runtime = tokio::runtime::Handle::try_current().map_err(DiscoveryError::NoRuntime)?;
    // The first value: the fallback peers, if any, until DNS gives some.
    let (tx, rx) = watch::channel(Arc::new(task::fallback_set(&opts.fallback)));
    let task = task::Loop::new(resolver, upstream_name, target, opts, metrics, tx);
    Ok((rx, runtime.spawn(task.run())))
}
