//! The DNS queries the resolve loop needs, behind a small trait, and their hickory implementation.
//!
//! The trait is the seam between the loop's logic (what to keep, when to publish, when to ask
//! again), which the unit tests drive with a scripted resolver under paused time, and the wire,
//! which the integration tests drive against a real dnsmasq.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::proto::ProtoErrorKind;
use hickory_resolver::{ResolveError, TokioResolver};

/// Address family of an address query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    /// A records.
    V4,
    /// AAAA records.
    V6,
}

impl Family {
    pub(crate) fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }
}

/// One SRV record, reduced to what the loop uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Srv {
    /// Lower case, without the trailing dot; `.` (the root) means "no service" (RFC 2782).
    pub(crate) target: String,
    pub(crate) port: u16,
}

/// A non-empty answer and how long it may be trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Answer<T> {
    pub(crate) records: Vec<T>,
    /// Time left until the shortest-lived record of the answer expires.
    pub(crate) ttl: Duration,
}

/// Why a query produced no records. Only [`LookupError::Failed`] is a DNS failure; the other two
/// are authoritative answers.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum LookupError {
    #[error("NXDOMAIN")]
    NxDomain,
    #[error("no records of that type")]
    NoData,
    #[error(transparent)]
    Failed(#[from] ResolveError),
}

/// The queries the resolve loop makes.
pub(crate) trait Resolve: Send + Sync + 'static {
    /// A (`V4`) or AAAA (`V6`) records of `name`.
    fn ips(
        &self,
        name: &str,
        family: Family,
    ) -> impl Future<Output = Result<Answer<IpAddr>, LookupError>> + Send;

    /// SRV records of `name`.
    fn srv(&self, name: &str) -> impl Future<Output = Result<Answer<Srv>, LookupError>> + Send;
}

/// The real resolver.
pub(crate) struct Hickory {
    resolver: TokioResolver,
}

impl Hickory {
    /// Queries `servers` (UDP, TCP when truncated), or the system configuration when empty.
    pub(crate) fn new(servers: &[SocketAddr]) -> Result<Self, ResolveError> {
        let mut builder = if servers.is_empty() {
            TokioResolver::builder_tokio()?
        } else {
            let mut group = Vec::with_capacity(servers.len() * 2);
            for &addr in servers {
                group.push(NameServerConfig::new(addr, Protocol::Udp));
                group.push(NameServerConfig::new(addr, Protocol::Tcp));
            }
            let config = ResolverConfig::from_parts(None, Vec::new(), group);
            let mut builder =
                TokioResolver::builder_with_config(config, TokioConnectionProvider::default());
            let opts = builder.options_mut();
            // Named servers are the whole truth: /etc/hosts must not shadow them.
            opts.use_hosts_file = ResolveHosts::Never;
            // A server that does not answer within 2 s is down for this round; the loop keeps
            // the last set and asks again at the next refresh.
            opts.timeout = Duration::from_secs(2);
            opts.attempts = 1;
            builder
        };
        // Answers are cached by hickory only as long as their TTL allows; the loop reads the
        // remaining TTL from the answer, so a cached answer schedules the next query correctly.
        builder.options_mut().cache_size = 64;
        Ok(Self {
            resolver: builder.build(),
        })
    }
}

impl Resolve for Hickory {
    async fn ips(&self, name: &str, family: Family) -> Result<Answer<IpAddr>, LookupError> {
        let kind = match family {
            Family::V4 => RecordType::A,
            Family::V6 => RecordType::AAAA,
        };
        let lookup = self.resolver.lookup(name, kind).await.map_err(classify)?;
        // The answer may also carry the CNAME chain that led to the addresses.
        let records: Vec<IpAddr> = lookup
            .record_iter()
            .filter_map(|record| match record.data() {
                RData::A(a) if family == Family::V4 => Some(IpAddr::V4(a.0)),
                RData::AAAA(aaaa) if family == Family::V6 => Some(IpAddr::V6(aaaa.0)),
                _ => None,
            })
            .collect();
        answer(records, lookup.valid_until())
    }

    async fn srv(&self, name: &str) -> Result<Answer<Srv>, LookupError> {
        let lookup = self
            .resolver
            .lookup(name, RecordType::SRV)
            .await
            .map_err(classify)?;
        let records: Vec<Srv> = lookup
            .record_iter()
            .filter_map(|record| match record.data() {
                RData::SRV(srv) => Some(Srv {
                    target: host_name(&srv.target().to_lowercase().to_ascii()),
                    port: srv.port(),
                }),
                _ => None,
            })
            .collect();
        answer(records, lookup.valid_until())
    }
}

fn answer<T>(records: Vec<T>, valid_until: Instant) -> Result<Answer<T>, LookupError> {
    if records.is_empty() {
        return Err(LookupError::NoData);
    }
    let ttl = valid_until.saturating_duration_since(Instant::now());
    Ok(Answer { records, ttl })
}

/// `name.` -> `name`, keeping the root `.` as it is.
fn host_name(ascii: &str) -> String {
    match ascii.strip_suffix('.') {
        Some(bare) if !bare.is_empty() => bare.to_owned(),
        _ => ascii.to_owned(),
    }
}

/// Sorts hickory's errors into answers (NXDOMAIN, NOERROR without data) and failures (timeouts,
/// SERVFAIL, REFUSED, no reachable server, anything else).
fn classify(err: ResolveError) -> LookupError {
    if let Some(proto) = err.proto() {
        if let ProtoErrorKind::NoRecordsFound { response_code, .. } = proto.kind() {
            match *response_code {
                ResponseCode::NXDomain => return LookupError::NxDomain,
                ResponseCode::NoError => return LookupError::NoData,
                _ => {}
            }
        }
    }
    LookupError::Failed(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srv_target_names_lose_the_trailing_dot_but_the_root_stays() {
        assert_eq!(host_name("ironic-0.metal3.svc."), "ironic-0.metal3.svc");
        assert_eq!(host_name("ironic-0.metal3.svc"), "ironic-0.metal3.svc");
        assert_eq!(host_name("."), ".");
    }

    #[test]
    fn failures_and_answers_are_told_apart() {
        assert!(matches!(
            classify(ResolveError::from("boom")),
            LookupError::Failed(_)
        ));
        let timeout = ResolveError::from(hickory_resolver::proto::ProtoError::from(
            ProtoErrorKind::Timeout,
        ));
        assert!(matches!(classify(timeout), LookupError::Failed(_)));
    }
}
