//! Egress: a listener that is a forward proxy for Ironic's HTTP clients (`[listeners.egress]`),
//! so that Ironic holds no key and speaks no TLS, and needs no `no_proxy` beyond loopback.
//!
//! Ironic runs with `[json_rpc]client_use_ssl = false` and `HTTP_PROXY` naming this listener;
//! keystoneauth then sends `POST http://<peer>:<port>/ HTTP/1.1` with `Proxy-Authorization`,
//! and so does every other `http://` call Ironic makes (agents on `:9999`, image URLs, Redfish
//! over HTTP). What becomes of a request, by its host and port (after the checks below):
//!
//! | host in `targets` | port | what happens | counted |
//! |---|---|---|---|
//! | yes | in `ports` | sent to the peer over mutual TLS with the live identity | `forwarded` |
//! | yes | in `plain_ports` | relayed in plain HTTP (the image server on a peer's IP) | `plain` |
//! | no | in `ports` | 403, never dialled: JSON-RPC never leaves in clear | `target_refused` |
//! | any other | | `others = "relay"`: relayed in plain HTTP; `"refuse"`: 403 | `relayed` |
//!
//! A plain relay (`plain`, `relayed`) sends the request to `<host>:<port>` as the client would have
//! sent it without a proxy: origin form, `Proxy-Authorization` and hop-by-hop fields removed, the
//! client's other fields as they were, `Via` added (RFC 9110 §7.6.3); no TLS, never the sidecar's
//! identity. On every path, relays included, the identity fields a client could forge
//! (`X-Forwarded-Client-Cert`, `Forwarded`, names with `_`) never leave: the server behind a relay
//! may be a peer that trusts them, and on the mutual-TLS path the peer learns the caller from the
//! sidecar's client certificate alone. A relayed request is origin form, which this listener
//! refuses (400 `origin_form`), so a target that names the egress itself under any name costs one
//! hop and cannot loop; its own address and an unspecified one (`0.0.0.0`, `::`, which Linux
//! connects to the host itself) are refused up front. Names are resolved when a connection is made,
//! by the system resolver (getaddrinfo through tokio: the pod's `/etc/hosts` and `resolv.conf`, as
//! Ironic's direct call would), within the connect timeout; the answer is bounded by
//! `upstream_timeout`; bodies are streamed past the forwarding service's buffer.
//!
//! It is not an open proxy. Refused, never forwarded, in this order: a client that is not on
//! loopback (403: the listener only binds loopback, this is defence in depth), `CONNECT` (405),
//! a target that is not `http://host:port/…` (400), an invalid authority in the target or
//! `Host` (400 `bad_target`, see [`target`]), missing or wrong credentials (407 with
//! `Proxy-Authenticate`), then the table above. Everything else (body limits, framing,
//! timeouts, the JSON-RPC method in the log and metrics) is the forwarding service's, as on any
//! listener. Each request counts once in `ironic_proxy_egress_requests_total{listener,outcome}`.
//!
//! Connections: one pool per (host, port), each a lone endpoint with the upstream module's
//! keep-alive pool; a new TLS connection takes the identity current at its handshake.

pub(crate) mod credentials;
pub(crate) mod quickack;
pub(crate) mod target;

use super::pool::{Pool, PoolOptions};
use super::upstream::EndpointLimits;
use super::{ConnInfo, ProxyError};
use crate::auth::Outcome as AuthOutcome;
use crate::balance::HealthOptions;
use crate::config::{EgressConfig, EgressOthers, UpstreamAddr};
use crate::metrics::{EgressLabels, Metrics};
use crate::tls::peer::PeerTls;
use crate::tls::ReloadableClient;
use credentials::Credentials;
use http::{header, HeaderValue, Method, Request};
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use target::{Authority, Host};

use credentials::CredentialsError;

/// Destinations whose pools are kept; past this the map starts again (their idle connections
/// close), so a client walking a large CIDR cannot grow it without bound. Plain destinations
/// leave the map as soon as they are unused ([`Egress::sweep`]), so only destinations busy at
/// the same moment count towards it: a conductor's thousand BMCs polled one after the other
/// never fill it.
const MAX_DESTINATIONS: usize = 1024;

/// Per `(host, port)`, its pool, and whether the egress sweeps it.
type Destinations = HashMap<(String, u16), (Arc<Pool>, bool)>;

/// How often the plain destinations' expired idle connections are closed and their unused
/// pools dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// What became of one request, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Sent to the peer; its answer was relayed, whatever its status.
    Forwarded,
    /// Relayed in plain HTTP to a port in `plain_ports`; its answer relayed.
    Plain,
    /// Relayed in plain HTTP by `others = "relay"`; its answer relayed.
    Relayed,
    /// Sent, but the peer failed (connect, TLS, reset, timeout): 502 or 504.
    PeerFailed,
    NotLoopback,
    Connect,
    OriginForm,
    /// An invalid authority in the target or `Host`.
    BadTarget,
    NoCredentials,
    BadCredentials,
    AuthBusy,
    TargetRefused,
    PortRefused,
    /// Refused after admission by the forwarding service (body too large, bad framing).
    BadRequest,
}

impl Outcome {
    const ALL: [Self; 14] = [
        Self::Forwarded,
        Self::Plain,
        Self::Relayed,
        Self::PeerFailed,
        Self::NotLoopback,
        Self::Connect,
        Self::OriginForm,
        Self::BadTarget,
        Self::NoCredentials,
        Self::BadCredentials,
        Self::AuthBusy,
        Self::TargetRefused,
        Self::PortRefused,
        Self::BadRequest,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::Plain => "plain",
            Self::Relayed => "relayed",
            Self::PeerFailed => "peer_failed",
            Self::NotLoopback => "not_loopback",
            Self::Connect => "connect_refused",
            Self::OriginForm => "origin_form",
            Self::BadTarget => "bad_target",
            Self::NoCredentials => "no_credentials",
            Self::BadCredentials => "bad_credentials",
            Self::AuthBusy => "auth_busy",
            Self::TargetRefused => "target_refused",
            Self::PortRefused => "port_refused",
            Self::BadRequest => "bad_request",
        }
    }
}

/// The error a startup of an egress listener can meet.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

/// How an admitted request leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Mutual TLS to a peer.
    Tls,
    /// Plain HTTP to a port in `plain_ports`.
    Plain,
    /// Plain HTTP by `others = "relay"`.
    Relay,
}

/// A request let through: the pool of its destination, and how it is relayed.
pub(crate) struct Admitted {
    pub(crate) pool: Arc<Pool>,
    pub(crate) route: Route,
}

/// One egress listener's gate and its pools towards peers.
pub struct Egress {
    listener: String,
    cfg: EgressConfig,
    credentials: Credentials,
    challenge: HeaderValue,
    client: Arc<ReloadableClient>,
    /// Per destination, its pool and whether the egress sweeps it (plain destinations: no
    /// task of their own, see [`PoolOptions::report`]).
    pools: Mutex<Destinations>,
    counters: Vec<Counter>,
    limits: EndpointLimits,
    metrics: Metrics,
}

impl Egress {
    /// Loads the credentials (an error names `listeners[index].egress.credentials`) and
    /// follows them every `every`; `client` is the sidecar's live client TLS configuration.
    pub(crate) fn start(
        listener: &str,
        index: usize,
        cfg: &EgressConfig,
        client: Arc<ReloadableClient>,
        every: Duration,
        limits: EndpointLimits,
        metrics: &Metrics,
    ) -> Result<Arc<Self>, EgressError> {
        let credentials = Credentials::start(listener, index, &cfg.credentials, every, metrics)?;
        let counters = Outcome::ALL
            .iter()
            .map(|o| {
                metrics
                    .egress_requests
                    .get_or_create(&EgressLabels {
                        listener: listener.to_owned(),
                        outcome: o.label(),
                    })
                    .clone()
            })
            .collect();
        let egress = Arc::new(Self {
            listener: listener.to_owned(),
            cfg: cfg.clone(),
            credentials,
            challenge: HeaderValue::from_static("Basic realm=\"ironic-proxy egress\""),
            client,
            pools: Mutex::new(HashMap::new()),
            counters,
            limits,
            metrics: metrics.clone(),
        });
        tokio::spawn(sweep_while_alive(Arc::downgrade(&egress)));
        Ok(egress)
    }

    /// Closes the plain destinations' expired idle connections and drops the pools of those
    /// unused: no connection open, no request in flight, and no request holding the pool. A
    /// request that looks its destination up again gets a new pool.
    fn sweep(&self) {
        let mut pools = self
            .pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Under the lock, no request can take a new reference to a pool in the map.
        pools.retain(|_, (pool, swept)| !(*swept && pool.sweep() && Arc::strong_count(pool) == 1));
    }

    pub(crate) fn count(&self, outcome: Outcome) {
        self.counters[outcome as usize].inc();
    }

    /// Lets `req` through to the pool of the peer it names, or refuses it (counted).
    pub(crate) async fn admit<B>(
        &self,
        req: &mut Request<B>,
        conn: &ConnInfo,
    ) -> Result<Admitted, ProxyError> {
        match self.decide(req, conn).await {
            Ok(admitted) => Ok(admitted),
            Err((outcome, e)) => {
                self.count(outcome);
                // Never the target as sent: it may hold userinfo, or a signed query.
                tracing::info!(listener = %self.listener, outcome = outcome.label(),
                    target = %target::loggable(req.uri()), "egress request refused");
                Err(e)
            }
        }
    }

    async fn decide<B>(
        &self,
        req: &mut Request<B>,
        conn: &ConnInfo,
    ) -> Result<Admitted, (Outcome, ProxyError)> {
        if !conn.peer.is_some_and(|p| p.ip().is_loopback()) {
            return Err((
                Outcome::NotLoopback,
                ProxyError::EgressRefused("only clients on loopback may use it"),
            ));
        }
        if req.method() == Method::CONNECT {
            return Err((
                Outcome::Connect,
                ProxyError::MethodNotAllowed(HeaderValue::from_static(
                    "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS",
                )),
            ));
        }
        let uri = req.uri();
        let (Some(scheme), Some(host)) = (uri.scheme_str(), uri.host()) else {
            return Err((
                Outcome::OriginForm,
                ProxyError::BadRequest(
                    "an egress proxy takes absolute-form targets (http://host:port/)",
                ),
            ));
        };
        if scheme != "http" {
            return Err((
                Outcome::OriginForm,
                ProxyError::BadRequest("only http:// targets: the proxy adds the TLS"),
            ));
        }
        let authority = Authority::parse(uri.authority().map_or(host, |a| a.as_str()))
            .map_err(|e| (Outcome::BadTarget, ProxyError::BadRequest(e.reason(false))))?;
        check_host_field(req).map_err(|e| (Outcome::BadTarget, e))?;
        let close = has_body(req.headers());
        match self
            .credentials
            .check(req.headers(), &header::PROXY_AUTHORIZATION)
            .await
        {
            AuthOutcome::Ok | AuthOutcome::OkCached | AuthOutcome::Public => {}
            AuthOutcome::QueueFull => {
                return Err((Outcome::AuthBusy, ProxyError::AuthBusy { close }));
            }
            AuthOutcome::NoCredentials => {
                return Err((Outcome::NoCredentials, self.challenge(close)));
            }
            _ => return Err((Outcome::BadCredentials, self.challenge(close))),
        }
        req.headers_mut().remove(header::PROXY_AUTHORIZATION);
        let route = self.route(&authority)?;
        let pool = self.pool(&authority, route);
        Ok(Admitted { pool, route })
    }

    /// The table of the module documentation.
    fn route(&self, a: &Authority) -> Result<Route, (Outcome, ProxyError)> {
        let in_targets = self.cfg.allows_host(&a.match_name());
        let tls_port = self.cfg.ports.contains(&a.port);
        let refused = |outcome, why| Err((outcome, ProxyError::EgressRefused(why)));
        match (in_targets, tls_port) {
            (true, true) => return Ok(Route::Tls),
            (false, true) => {
                return refused(
                    Outcome::TargetRefused,
                    "the host is not one of this listener's targets",
                )
            }
            (true, false) if self.cfg.plain_ports.contains(&a.port) => return Ok(Route::Plain),
            _ => {}
        }
        match (self.cfg.others, in_targets) {
            (EgressOthers::Relay, _) if self.is_own(a) => refused(
                Outcome::TargetRefused,
                "the target is this listener's own or an unspecified address",
            ),
            (EgressOthers::Relay, _) => Ok(Route::Relay),
            (EgressOthers::Refuse, false) => refused(
                Outcome::TargetRefused,
                "the host is not one of this listener's targets",
            ),
            (EgressOthers::Refuse, true) => refused(
                Outcome::PortRefused,
                "the port is not one of this listener's ports",
            ),
        }
    }

    /// Whether `a` is this listener's own address, or an unspecified one (`0.0.0.0`, `::`),
    /// which Linux connects to the host itself.
    fn is_own(&self, a: &Authority) -> bool {
        let Host::Ip(ip) = a.host else { return false };
        ip.is_unspecified()
            || self
                .cfg
                .listen
                .is_some_and(|l| l.ip() == ip && l.port() == a.port)
    }

    fn challenge(&self, close: bool) -> ProxyError {
        ProxyError::ProxyAuth {
            challenge: self.challenge.clone(),
            close,
        }
    }

    /// The pool of `host:port`, made on first use: one TLS endpoint verifying the host, or one
    /// plain TCP endpoint. A route depends on nothing but the host and the port (see
    /// [`Self::route`]), so `(host as dialled, port)` alone keys it. Plain relays share one
    /// pool name, so that the metrics labelled by it stay one series however many hosts they
    /// reach (the access log still names each endpoint).
    fn pool(&self, a: &Authority, route: Route) -> Arc<Pool> {
        let mut pools = self
            .pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A peer by the name its certificate is verified for; a plain relay by the name as
        // written (a trailing dot tells the resolver to skip the search domains).
        let host = match route {
            Route::Tls => a.match_name(),
            Route::Plain | Route::Relay => a.dial_host(),
        };
        let key = (host, a.port);
        if let Some((p, _)) = pools.get(&key) {
            return p.clone();
        }
        // A parsed host is always a valid TLS server name: an IP, or a `DnsName`.
        let local_tls = if route == Route::Tls {
            let name = match &a.host {
                Host::Ip(ip) => rustls_pki_types::ServerName::IpAddress((*ip).into()),
                Host::Name { name, .. } => name.to_server_name(),
            };
            Some(PeerTls::new(self.client.clone(), name))
        } else {
            None
        };
        if pools.len() >= MAX_DESTINATIONS {
            pools.clear();
        }
        let addr = UpstreamAddr::Tcp {
            host: key.0.clone(),
            port: a.port,
        };
        let name = match route {
            Route::Relay => format!("{}/relayed", self.listener),
            Route::Tls | Route::Plain => format!("{}/{addr}", self.listener),
        };
        let pool = Pool::new(PoolOptions {
            name,
            local: Some(addr),
            local_tls,
            dns: None,
            peer_tls: None,
            balance: crate::balance::Policy::default(),
            health: HealthOptions::default(),
            // One endpoint: nothing to retry on.
            retries: 0,
            limits: self.limits,
            metrics: self.metrics.clone(),
            report: route == Route::Tls,
        });
        pools.insert(key, (pool.clone(), route != Route::Tls));
        pool
    }

    /// Counts a request that was admitted, by how its forwarding ended.
    pub(crate) fn count_result<T>(&self, result: &Result<T, ProxyError>, route: Route) {
        self.count(match result {
            Ok(_) => match route {
                Route::Tls => Outcome::Forwarded,
                Route::Plain => Outcome::Plain,
                Route::Relay => Outcome::Relayed,
            },
            Err(e) if e.blame() == super::Blame::Client => Outcome::BadRequest,
            Err(_) => Outcome::PeerFailed,
        });
    }
}

/// The fields of a plain relay: the client's own (its `X-Forwarded-For` and the like too: they
/// would have reached the server without a proxy) minus the hop-by-hop ones and
/// `Proxy-Authorization` (RFC 9110 §7.6.1) and minus the identity fields of
/// [`super::headers::strip_relayed`], plus `Via`, which a proxy must add (RFC 9110 §7.6.3).
pub(crate) fn rewrite_relayed(h: &mut http::HeaderMap, version: http::Version) {
    super::headers::strip_relayed(h);
    h.append(
        header::VIA,
        HeaderValue::from_static(if version == http::Version::HTTP_10 {
            "1.0 ironic-proxy"
        } else {
            "1.1 ironic-proxy"
        }),
    );
}

/// `Host` must be one valid authority on HTTP/1.1 (RFC 9112 §3.2: 400 for none, several or an
/// invalid one), even though the target's authority is the one used; at most one otherwise.
fn check_host_field<B>(req: &Request<B>) -> Result<(), ProxyError> {
    let mut values = req.headers().get_all(header::HOST).iter();
    match (values.next(), values.next()) {
        (None, _) if req.version() == http::Version::HTTP_11 => {
            Err(ProxyError::BadRequest("no Host field"))
        }
        (None, _) => Ok(()),
        (Some(_), Some(_)) => Err(ProxyError::BadRequest("more than one Host field")),
        (Some(v), None) => {
            let v = v
                .to_str()
                .map_err(|_| ProxyError::BadRequest("the Host field is not ASCII"))?;
            Authority::parse(v)
                .map(|_| ())
                .map_err(|e| ProxyError::BadRequest(e.reason(true)))
        }
    }
}

/// Whether the request has a body we will not read when refusing it: the connection then
/// closes after the answer (RFC 9112 §9.6), as for the listener authentication's 401.
fn has_body(h: &http::HeaderMap) -> bool {
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// Sweeps `egress` every [`SWEEP_EVERY`] until it is gone (its listener closed).
async fn sweep_while_alive(egress: std::sync::Weak<Egress>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(egress) = egress.upgrade() else {
            return;
        };
        egress.sweep();
    }
}

#[cfg(test)]
mod tests;
