//! Upstream endpoints: one pool of keep-alive HTTP/1.1 connections per endpoint, over unix
//! sockets, TCP, or TLS to peers.
//!
//! The pool and the client are ours ([`crate::http1`] says why): an idle list per endpoint (the
//! most recently used first, so few connections stay warm), a connection taken for one request
//! and given back by its response body when that has been read to its end ([`UpstreamBody`]),
//! idle ones dropped after the time the upstream allows ([`idle_limit`]) or when it closed them. Nothing is spawned
//! per request or per connection and no URI is rebuilt: the request's own task writes the
//! request in origin form, with `Host` filled in from the endpoint when the client sent none,
//! and reads the response head; whoever polls the body reads the rest. Connect errors are
//! reported as such ([`SendError::is_connect`]), which is what makes a retry on another
//! endpoint safe. A pooled connection that fails before any answer came back (refused the
//! write, closed or reset: a stale keep-alive the upstream had closed) is the connection's
//! failure, not the endpoint's ([`SendError::Stale`], which passive health ignores); the request
//! is sent again on a fresh connection when it had not gone out, or its method is replayable
//! (GET, HEAD, OPTIONS; as Go's `net/http` transport), and its body is still ours to send.

mod body;
mod connect;
mod connection;
#[cfg(test)]
mod exchange_tests;
mod idle;
mod in_memory;
mod slots;
#[cfg(test)]
mod tests;

pub(crate) use body::UpstreamBody;
pub(crate) use connect::{Dial, Transport};
pub use in_memory::{read_response_over, ResponseRead};

use crate::config::UpstreamAddr;
use crate::http1;
use crate::proxy::body::RequestBody;
use connect::Connector;
use connection::{BodyWriter, Connection};
use idle::Idle;
use slots::{Slot, Slots};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long an unused connection stays in the pool when the server does not say how long it
/// keeps one. Below the idle timeout of Ironic's own server (cheroot closes a connection idle
/// for 10 s and does not say so), so the proxy closes first and never sends a request into a
/// connection the server is closing at that moment.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest an unused connection stays in the pool, whatever the server advertises.
const IDLE_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// How long a connection may stay unused after a response that said how long the server keeps
/// an idle connection (`Keep-Alive: timeout=N`, which this proxy's listeners send with their
/// `limits.idle_timeout`): half of that, so that our clock, which starts once the response has
/// been read, runs out well before the server's, which started when it had written it; at most
/// [`IDLE_TIMEOUT_MAX`]. Without the field, [`IDLE_TIMEOUT`]. So a balancer's or an egress's
/// connections to ironic-proxy peers outlive the gaps between requests that a few agents or
/// conductors leave, instead of a new TLS handshake after every pause of 5 s.
pub(crate) fn idle_limit(advertised: Option<Duration>) -> Duration {
    advertised.map_or(IDLE_TIMEOUT, |t| (t / 2).min(IDLE_TIMEOUT_MAX))
}

/// Why a request got no response from an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made (refused, timed out, TLS failed): nothing was sent.
    #[error("cannot connect")]
    Connect(#[source] io::Error),
    /// The connection failed after the request was handed to it, or its answer was not
    /// HTTP/1.1 we accept.
    #[error("the upstream connection failed")]
    Exchange(#[source] io::Error),
    /// A pooled connection failed before any answer (refused the write, closed, reset): the
    /// upstream had closed it while it was idle. Not sent again on a fresh one because the
    /// request may have gone out and is not replayable, or its body is gone.
    #[error("the pooled upstream connection was closed")]
    Stale(#[source] io::Error),
}

impl SendError {
    /// True when the request cannot have reached the upstream.
    pub fn is_connect(&self) -> bool {
        matches!(self, Self::Connect(_))
    }

    /// Whether the failure says something about the endpoint (for passive health): a stale
    /// pooled connection does not, the endpoint answered on it before.
    pub fn blames_endpoint(&self) -> bool {
        !matches!(self, Self::Stale(_))
    }
}

/// Whether `e`, before any answer on a pooled connection, is the upstream having closed it.
fn closed_under_us(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
    )
}

/// What bounds one endpoint.
#[derive(Clone, Copy, Debug)]
pub struct EndpointLimits {
    /// `limits.header_bytes`: response heads are read up to twice this.
    pub max_response_head: usize,
    /// `limits.upstream_connections`: connections open at once, idle or busy; 0: no bound.
    pub connections: usize,
}

impl EndpointLimits {
    /// The configured limits of a listener's upstreams.
    pub fn from_config(limits: &crate::config::Limits) -> Self {
        Self {
            max_response_head: limits.header_bytes,
            connections: limits.upstream_connections,
        }
    }

    /// `max_response_head`, the default bound on connections.
    pub fn with_head(max_response_head: usize) -> Self {
        Self {
            max_response_head,
            connections: crate::config::Limits::default().upstream_connections,
        }
    }
}

/// One upstream endpoint with its connection pool and in-flight count.
pub struct Endpoint {
    pub addr: UpstreamAddr,
    /// Label for logs and metrics.
    pub name: String,
    /// `name`, shared with every request's access log record without a copy.
    label: Arc<str>,
    connector: Connector,
    idle: Arc<Idle>,
    /// A response head that has not ended within this many bytes is refused. Twice
    /// `header_bytes` (so 128 KiB by default): heads over `header_bytes` are refused after
    /// parsing (`retry::classify`), with the same status as one that never ends.
    max_head: usize,
    in_flight: AtomicUsize,
    /// `Host` for requests that came without one, and for health checks.
    authority: http::HeaderValue,
}

impl Endpoint {
    pub fn new(
        addr: UpstreamAddr,
        tls: Option<crate::tls::peer::PeerTls>,
        limits: EndpointLimits,
    ) -> Self {
        let authority = match &addr {
            UpstreamAddr::Unix(_) => "localhost".to_owned(),
            tcp => tcp.to_string(),
        };
        let name = addr.to_string();
        Self {
            label: name.as_str().into(),
            name,
            idle: Arc::new(Idle::new(Slots::new(limits.connections), tls.clone())),
            connector: Connector::new(addr.clone(), tls),
            addr,
            max_head: limits.max_response_head.max(8192) * 2,
            in_flight: AtomicUsize::new(0),
            authority: http::HeaderValue::from_str(&authority)
                .unwrap_or_else(|_| http::HeaderValue::from_static("localhost")),
        }
    }

    /// An endpoint whose connections come from `dial` (an in-memory pipe, say) rather than an
    /// address: the same pool and exchange, over any [`Transport`]. `name` labels it.
    pub(crate) fn over(name: &str, dial: Dial, limits: EndpointLimits) -> Self {
        let addr = UpstreamAddr::Unix(name.into());
        Self {
            label: name.into(),
            name: name.to_owned(),
            idle: Arc::new(Idle::new(Slots::new(limits.connections), None)),
            connector: Connector::dial(addr.clone(), dial),
            addr,
            max_head: limits.max_response_head.max(8192) * 2,
            in_flight: AtomicUsize::new(0),
            authority: http::HeaderValue::from_static("localhost"),
        }
    }

    pub fn label(&self) -> &Arc<str> {
        &self.label
    }

    /// Closes the pooled connections that have been idle too long to be used again.
    pub fn close_expired(&self) {
        self.idle.close_expired();
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Sends one request in origin form on a pooled or new connection. The response body
    /// gives the connection back when it has been read to its end.
    pub async fn send(
        &self,
        mut req: http::Request<RequestBody>,
    ) -> Result<http::Response<UpstreamBody>, SendError> {
        if req.uri().scheme().is_some() || req.uri().authority().is_some() {
            *req.uri_mut() = origin_form(req.uri());
        }
        // We speak HTTP/1.1 upstream, which requires Host (RFC 9112 §3.2); an HTTP/1.0 client
        // may have sent none: name the endpoint.
        if !req.headers().contains_key(http::header::HOST) {
            req.headers_mut()
                .insert(http::header::HOST, self.authority.clone());
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let _guard = InFlight(&self.in_flight);
        self.dispatch(req, true).await
    }

    /// `req` on a pooled connection, or on a new one when none is ready or the pooled one
    /// refused the request before it went out. At the endpoint's bound on connections, waits
    /// for one to come back or to close; a health check (`queue` false) never waits, it
    /// connects outside the bound.
    async fn dispatch(
        &self,
        req: http::Request<RequestBody>,
        queue: bool,
    ) -> Result<http::Response<UpstreamBody>, SendError> {
        let (parts, mut body) = req.into_parts();
        // Let the other requests that arrived with this one reach this point first, so that
        // their writes to the upstream go out together: an upstream on another core is then
        // woken once for all of them rather than once each (hyper's client, whose connection
        // task gave the same batching, is what this replaced; docs/architecture.md, decisions).
        tokio::task::yield_now().await;
        // Every waiter can use what a wake-up frees (an idle connection or a place for a new
        // one): one that could not would swallow the wake-up another needed. So after a pooled
        // connection failed stale, the next may be pooled too; `take` skips those the upstream
        // is seen to have closed.
        let slot = loop {
            if let Some(conn) = self.idle.take() {
                match self.on_pooled(conn, &parts, body).await {
                    Ok(done) => return done,
                    Err(again) => {
                        body = again;
                        continue;
                    }
                }
            }
            if let Some(slot) = self.idle.slots.try_take() {
                break Some(slot);
            }
            if !queue {
                break None;
            }
            // At the bound: registered for a wake-up before looking again, so a connection
            // freed in between is not missed. Only here: registering takes the Notify's lock,
            // which a request that finds a connection should not pay.
            let freed = self.idle.slots.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if self.idle.has_any() || self.idle.slots.has_room() {
                continue;
            }
            freed.await;
        };
        // Boxed: connecting (TCP, TLS to a peer) is the rare path of a pooled endpoint, and its
        // state would otherwise be part of every request's future, copied at each level that
        // awaits it, on every request.
        let mut conn = Box::pin(self.connect(slot)).await?;
        let sending = conn
            .write_request(&parts, body)
            .await
            .map_err(|(e, _)| SendError::Exchange(e))?;
        self.answer(conn, &parts.method, sending)
            .await
            .map_err(|(e, _)| SendError::Exchange(e))
    }

    /// `req` on the pooled `conn`: the outcome, or the body back when the upstream had closed
    /// the connection and the request may go again on a fresh one (it had not gone out, or its
    /// method is replayable, and the body is still ours to send).
    async fn on_pooled(
        &self,
        mut conn: Box<Connection>,
        parts: &http::request::Parts,
        body: RequestBody,
    ) -> Result<Result<http::Response<UpstreamBody>, SendError>, RequestBody> {
        let again = body.try_clone();
        let replayable = crate::proxy::headers::is_replayable(&parts.method);
        // Closed under us before any answer: `sent` when the request may have gone out.
        let (e, sent) = match conn.write_request(parts, body).await {
            Ok(sending) => match self.answer(conn, &parts.method, sending).await {
                Err((e, false)) if closed_under_us(&e) => (e, true),
                done => return Ok(done.map_err(|(e, _)| SendError::Exchange(e))),
            },
            Err((e, false)) => (e, false),
            Err((e, true)) if closed_under_us(&e) => (e, true),
            Err((e, true)) => return Ok(Err(SendError::Exchange(e))),
        };
        match again {
            Some(b) if !sent || replayable => Err(b),
            _ => Ok(Err(SendError::Stale(e))),
        }
    }

    /// Reads the response head; the body is read by whoever polls it. The flag with an error:
    /// some of an answer had come.
    async fn answer(
        &self,
        mut conn: Box<Connection>,
        method: &http::Method,
        mut sending: Option<Box<BodyWriter>>,
    ) -> Result<http::Response<UpstreamBody>, (io::Error, bool)> {
        let (head, whole) = conn.read_head(self.max_head, &mut sending).await?;
        let framing = http1::response_framing(method, &head).map_err(|e| (e.into(), true))?;
        conn.keep_for = idle_limit(http1::keep_alive_timeout(&head.headers));
        let mut body = UpstreamBody::new(conn, &framing, self.idle.clone());
        body.sending = sending;
        body.keep_alive &= whole;
        let mut resp = http::Response::new(body);
        *resp.status_mut() = head.status;
        *resp.version_mut() = head.version;
        *resp.headers_mut() = head.headers;
        Ok(resp)
    }

    /// A new connection, holding `slot` (its place under the bound) until it closes.
    async fn connect(&self, slot: Option<Slot>) -> Result<Box<Connection>, SendError> {
        let (io, generation) = self.connector.connect().await.map_err(SendError::Connect)?;
        Ok(Connection::new(io, slot, generation))
    }

    /// Connections open to this endpoint now, idle or carrying a request.
    pub fn open_connections(&self) -> usize {
        self.idle.slots.open()
    }
}

impl Endpoint {
    /// One active health check: `GET path`; `Ok(true)` on 2xx or 3xx, `Ok(false)` on any other
    /// answer, `Err` when there was none (connect, TLS or transport failure), for the caller to
    /// log and count. Not counted in flight.
    ///
    /// The probe carries our `Via` like every forwarded request, so a peer that is itself an
    /// ironic-proxy answers it the way it answers our requests: from its own Ironic only. Without
    /// it the peer would relay the probe to its own peers and pass it while its Ironic is down,
    /// and the requests we then send it (which do carry `Via`) would get 502.
    pub async fn probe(&self, path: &str) -> Result<bool, SendError> {
        let Ok(req) = http::Request::get(path)
            .header(http::header::HOST, self.authority.clone())
            .header(http::header::USER_AGENT, "ironic-proxy-health")
            .header(
                http::header::VIA,
                format!("1.1 {}", crate::proxy::headers::VIA_NAME),
            )
            .body(RequestBody::empty())
        else {
            return Ok(false);
        };
        let resp = self.dispatch(req, false).await?;
        let ok = resp.status().is_success() || resp.status().is_redirection();
        // Read to its end, the body gives the connection back to the pool.
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        Ok(ok)
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The origin form of an absolute-form target: its path, never empty (RFC 9112 §3.2.1: an
/// empty path is sent as `/`), and its query. `http` keeps an empty path as it is, so
/// `http://host?q` or `http://host#f` would otherwise go out as `?q` or as nothing.
fn origin_form(uri: &http::Uri) -> http::Uri {
    let path = uri.path();
    let path = if path.is_empty() { "/" } else { path };
    let origin = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    http::Uri::try_from(origin).unwrap_or_else(|_| http::Uri::from_static("/"))
}
