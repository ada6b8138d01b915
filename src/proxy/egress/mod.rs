//! Egress: a listener that is a forward proxy for Ironic's own JSON-RPC client
//! (`[listeners.egress]`), so that Ironic holds no key and speaks no TLS.
//!
//! Ironic runs with `[json_rpc]client_use_ssl = false` and `HTTP_PROXY` naming this listener;
//! keystoneauth then sends `POST http://<peer>:<port>/ HTTP/1.1` with `Proxy-Authorization`.
//! Each such request is sent to the peer over mutual TLS with the sidecar's live identity (the
//! certificate the identity module rotates, through the same reloadable client configuration
//! as the load balancer's peers), verifying that the peer's certificate covers `<peer>`.
//!
//! One exception, by configuration: a port in `plain_ports` (the image server, ironic-image's
//! httpd, that shares a peer's IP; Python's `no_proxy` cannot exclude one port of an IPv4
//! host) is relayed in plain HTTP to the host it names, as the client would have sent it
//! without a proxy: no TLS, never the sidecar's identity, credentials still required, the
//! same `targets`, `Proxy-Authorization` and hop-by-hop fields removed. Counted as `plain`.
//!
//! It is not an open proxy, and nothing else leaves it in plain text. Refused, never forwarded, in
//! this order: a client that is not on loopback (403: the listener only binds loopback, this is
//! defence in depth), `CONNECT` (405), a target that is not `http://host:port/…` (400),
//! missing or wrong credentials (407 with `Proxy-Authenticate`), a host outside `targets` or a
//! port outside `ports` (403). Everything else (body limits, framing, timeouts, the JSON-RPC
//! method in the log and metrics) is the forwarding service's, as on any listener. Each request
//! counts once in `ironic_proxy_egress_requests_total{listener,outcome}`.
//!
//! Connections: one pool per (host, port), each a lone TLS endpoint with the upstream module's
//! keep-alive pool; a new connection takes the identity current at its handshake.

pub(crate) mod credentials;
pub(crate) mod quickack;

use super::pool::{Pool, PoolOptions};
use super::upstream::EndpointLimits;
use super::{ConnInfo, ProxyError};
use crate::auth::Outcome as AuthOutcome;
use crate::balance::HealthOptions;
use crate::config::{EgressConfig, UpstreamAddr};
use crate::metrics::{EgressLabels, Metrics};
use crate::tls::peer::PeerTls;
use crate::tls::ReloadableClient;
use credentials::Credentials;
use http::{header, HeaderValue, Method, Request};
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use credentials::CredentialsError;

/// Destinations whose pools are kept; past this the map starts again (their idle connections
/// close), so a client walking a large CIDR cannot grow it without bound.
const MAX_DESTINATIONS: usize = 1024;

/// What became of one request, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Sent to the peer; its answer was relayed, whatever its status.
    Forwarded,
    /// Relayed in plain HTTP to a port in `plain_ports`; its answer relayed.
    Plain,
    /// Sent, but the peer failed (connect, TLS, reset, timeout): 502 or 504.
    PeerFailed,
    NotLoopback,
    Connect,
    OriginForm,
    NoCredentials,
    BadCredentials,
    AuthBusy,
    TargetRefused,
    PortRefused,
    /// Refused after admission by the forwarding service (body too large, bad framing).
    BadRequest,
}

impl Outcome {
    const ALL: [Self; 12] = [
        Self::Forwarded,
        Self::Plain,
        Self::PeerFailed,
        Self::NotLoopback,
        Self::Connect,
        Self::OriginForm,
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
            Self::PeerFailed => "peer_failed",
            Self::NotLoopback => "not_loopback",
            Self::Connect => "connect_refused",
            Self::OriginForm => "origin_form",
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

/// A request let through: the pool of its destination, and how it is relayed.
pub(crate) struct Admitted {
    pub(crate) pool: Arc<Pool>,
    /// True for a port in `plain_ports`: plain HTTP, no TLS.
    pub(crate) plain: bool,
}

/// One egress listener's gate and its pools towards peers.
pub struct Egress {
    listener: String,
    cfg: EgressConfig,
    credentials: Credentials,
    challenge: HeaderValue,
    client: Arc<ReloadableClient>,
    pools: Mutex<HashMap<(String, u16), Arc<Pool>>>,
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
        Ok(egress)
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
                tracing::info!(listener = %self.listener, outcome = outcome.label(),
                    target = %req.uri(), "egress request refused");
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
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(80);
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
        if !self.cfg.allows_host(&host) {
            return Err((
                Outcome::TargetRefused,
                ProxyError::EgressRefused("the host is not one of this listener's targets"),
            ));
        }
        if self.cfg.plain_ports.contains(&port) {
            return Ok(Admitted {
                pool: self.pool(host, port, false).ok_or((
                    Outcome::TargetRefused,
                    ProxyError::EgressRefused("the host cannot be a TLS server name"),
                ))?,
                plain: true,
            });
        }
        if !self.cfg.ports.contains(&port) {
            return Err((
                Outcome::PortRefused,
                ProxyError::EgressRefused("the port is not one of this listener's ports"),
            ));
        }
        let pool = self.pool(host, port, true).ok_or((
            Outcome::TargetRefused,
            ProxyError::EgressRefused("the host cannot be a TLS server name"),
        ))?;
        Ok(Admitted { pool, plain: false })
    }

    fn challenge(&self, close: bool) -> ProxyError {
        ProxyError::ProxyAuth {
            challenge: self.challenge.clone(),
            close,
        }
    }

    /// The pool of `host:port`, made on first use: one TLS endpoint verifying `host`, or with
    /// `tls` false one plain TCP endpoint (a port is in `ports` or `plain_ports`, never both,
    /// so `(host, port)` alone keys it).
    fn pool(&self, host: String, port: u16, tls: bool) -> Option<Arc<Pool>> {
        let mut pools = self
            .pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (host, port);
        if let Some(p) = pools.get(&key) {
            return Some(p.clone());
        }
        let local_tls = if tls {
            let name = rustls_pki_types::ServerName::try_from(key.0.clone()).ok()?;
            Some(PeerTls::new(self.client.clone(), name))
        } else {
            None
        };
        if pools.len() >= MAX_DESTINATIONS {
            pools.clear();
        }
        let addr = UpstreamAddr::Tcp {
            host: key.0.clone(),
            port,
        };
        let pool = Pool::new(PoolOptions {
            name: format!("{}/{addr}", self.listener),
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
        });
        pools.insert(key, pool.clone());
        Some(pool)
    }

    /// Counts a request that was admitted, by how its forwarding ended.
    pub(crate) fn count_result<T>(&self, result: &Result<T, ProxyError>, plain: bool) {
        self.count(match result {
            Ok(_) if plain => Outcome::Plain,
            Ok(_) => Outcome::Forwarded,
            Err(e) if e.blame() == super::Blame::Client => Outcome::BadRequest,
            Err(_) => Outcome::PeerFailed,
        });
    }
}

/// Whether the request has a body we will not read when refusing it: the connection then
/// closes after the answer (RFC 9112 §9.6), as for the listener authentication's 401.
fn has_body(h: &http::HeaderMap) -> bool {
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

#[cfg(test)]
mod tests;
