//! Upstream endpoints: one pool of keep-alive HTTP/1.1 connections per endpoint, over unix
//! sockets, TCP, or TLS to peers.
//!
//! The pool is ours, on hyper's connection-level client: an idle list per endpoint (the most
//! recently used first, so few connections stay warm), a connection taken for one request and
//! given back by the response body when it has been read to its end ([`Lease`]), idle ones
//! dropped after [`IDLE_TIMEOUT`]. Nothing is spawned per request and no URI is rebuilt: the
//! request goes out in origin form, with `Host` filled in from the endpoint when the client sent
//! none. Connect errors are reported as such ([`SendError::is_connect`]), which is what makes a
//! retry on another endpoint safe; a request that a pooled connection closed before sending is
//! sent again on a fresh one.

use crate::config::UpstreamAddr;
use crate::proxy::body::RequestBody;
use hyper::client::conn::http1;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::rt::TokioIo;
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpStream, UnixStream};
use tokio::time::Instant;

/// How long an unused connection stays in the pool. Below the idle timeout of Ironic's own
/// server (cheroot closes a connection idle for 10 s), so the proxy closes first and never
/// sends a request into a connection the server is closing at that moment.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle connections kept per endpoint; more are closed when they come back.
const MAX_IDLE: usize = 256;

/// How long a TCP connect may take before the endpoint counts as refused.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Connects to one upstream address.
#[derive(Clone)]
pub(crate) struct Connector {
    addr: Arc<UpstreamAddr>,
    tls: Option<crate::tls::peer::PeerTls>,
}

impl Connector {
    pub(crate) fn new(addr: UpstreamAddr, tls: Option<crate::tls::peer::PeerTls>) -> Self {
        Self {
            addr: Arc::new(addr),
            tls,
        }
    }
}

pin_project_lite::pin_project! {
    #[project = ConnProj]
    pub enum Conn {
        Unix { #[pin] io: TokioIo<UnixStream> },
        Tcp { #[pin] io: TokioIo<TcpStream> },
        Tls { #[pin] io: TokioIo<tokio_rustls::client::TlsStream<TcpStream>> },
    }
}

impl Read for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.project() {
            ConnProj::Unix { io } => io.poll_read(cx, buf),
            ConnProj::Tcp { io } => io.poll_read(cx, buf),
            ConnProj::Tls { io } => io.poll_read(cx, buf),
        }
    }
}

impl Write for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.project() {
            ConnProj::Unix { io } => io.poll_write(cx, buf),
            ConnProj::Tcp { io } => io.poll_write(cx, buf),
            ConnProj::Tls { io } => io.poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.project() {
            ConnProj::Unix { io } => io.poll_flush(cx),
            ConnProj::Tcp { io } => io.poll_flush(cx),
            ConnProj::Tls { io } => io.poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.project() {
            ConnProj::Unix { io } => io.poll_shutdown(cx),
            ConnProj::Tcp { io } => io.poll_shutdown(cx),
            ConnProj::Tls { io } => io.poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.project() {
            ConnProj::Unix { io } => io.poll_write_vectored(cx, bufs),
            ConnProj::Tcp { io } => io.poll_write_vectored(cx, bufs),
            ConnProj::Tls { io } => io.poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Unix { io } => io.is_write_vectored(),
            Self::Tcp { io } => io.is_write_vectored(),
            Self::Tls { io } => io.is_write_vectored(),
        }
    }
}

impl Connector {
    async fn connect(&self) -> io::Result<Conn> {
        match &*self.addr {
            UpstreamAddr::Unix(path) => Ok(Conn::Unix {
                io: TokioIo::new(UnixStream::connect(path).await?),
            }),
            UpstreamAddr::Tcp { host, port } => {
                let s = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    TcpStream::connect((host.as_str(), *port)),
                )
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
                let _ = s.set_nodelay(true);
                let Some(tls) = &self.tls else {
                    return Ok(Conn::Tcp {
                        io: TokioIo::new(s),
                    });
                };
                let stream = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(s))
                    .await
                    .map_err(|_| {
                        io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                    })??;
                Ok(Conn::Tls {
                    io: TokioIo::new(stream),
                })
            }
        }
    }
}

/// Why a request got no response from an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made (refused, timed out, TLS failed): nothing was sent.
    #[error("cannot connect")]
    Connect(#[source] io::Error),
    /// The connection failed after the request was handed to it.
    #[error("the upstream connection failed")]
    Http(#[source] hyper::Error),
}

impl SendError {
    /// True when the request cannot have reached the upstream.
    pub fn is_connect(&self) -> bool {
        matches!(self, Self::Connect(_))
    }
}

/// The idle connections of one endpoint.
struct Idle {
    conns: Mutex<VecDeque<(http1::SendRequest<RequestBody>, Instant)>>,
}

impl Idle {
    /// The most recently used connection that is ready for a request; closed and expired ones
    /// are dropped on the way.
    fn take(&self) -> Option<http1::SendRequest<RequestBody>> {
        let mut conns = self.conns.lock().ok()?;
        let now = Instant::now();
        while let Some((tx, since)) = conns.pop_back() {
            if tx.is_ready() && now.duration_since(since) < IDLE_TIMEOUT {
                return Some(tx);
            }
            // Closed, expired, or (rarely) not yet ready after its last response: dropping
            // the sender lets hyper close it.
        }
        None
    }

    fn put(&self, tx: http1::SendRequest<RequestBody>) {
        if tx.is_closed() {
            return;
        }
        let Ok(mut conns) = self.conns.lock() else {
            return;
        };
        let now = Instant::now();
        while conns
            .front()
            .is_some_and(|(_, since)| now.duration_since(*since) >= IDLE_TIMEOUT)
        {
            conns.pop_front();
        }
        if conns.len() < MAX_IDLE {
            conns.push_back((tx, now));
        }
    }
}

/// A pooled connection lent to one request: its response body hands it back
/// ([`Lease::release`]) once read to the end; dropped otherwise, which closes it.
pub struct Lease {
    tx: http1::SendRequest<RequestBody>,
    idle: Arc<Idle>,
}

impl Lease {
    pub fn release(self) {
        self.idle.put(self.tx);
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
    /// hyper's read buffer bound: a response head must fit in it, and body reads grow up to
    /// it (from 8 KiB, doubling while reads fill the buffer). Twice `header_bytes` (128 KiB by
    /// default), so a 64 KiB body plus its head is one read, not two; heads over `header_bytes`
    /// are refused after parsing (`Proxy::send_with_retries`).
    max_buf: usize,
    in_flight: AtomicUsize,
    /// `Host` for requests that came without one, and for health checks.
    authority: http::HeaderValue,
}

impl Endpoint {
    pub fn new(
        addr: UpstreamAddr,
        tls: Option<crate::tls::peer::PeerTls>,
        max_response_head: usize,
    ) -> Self {
        let authority = match &addr {
            UpstreamAddr::Unix(_) => "localhost".to_owned(),
            tcp => tcp.to_string(),
        };
        let name = addr.to_string();
        Self {
            label: name.as_str().into(),
            name,
            connector: Connector::new(addr.clone(), tls),
            addr,
            idle: Arc::new(Idle {
                conns: Mutex::new(VecDeque::new()),
            }),
            max_buf: max_response_head.max(8192) * 2,
            in_flight: AtomicUsize::new(0),
            authority: http::HeaderValue::from_str(&authority)
                .unwrap_or_else(|_| http::HeaderValue::from_static("localhost")),
        }
    }

    pub fn label(&self) -> &Arc<str> {
        &self.label
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Sends one request in origin form on a pooled or new connection. The [`Lease`] goes with
    /// the response body and gives the connection back when that body has been read.
    pub async fn send(
        &self,
        mut req: http::Request<RequestBody>,
    ) -> Result<(http::Response<hyper::body::Incoming>, Lease), SendError> {
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
        self.dispatch(req).await
    }

    /// `req` on a pooled connection, or on a new one when none is ready or the pooled one
    /// closed before the request went out.
    async fn dispatch(
        &self,
        mut req: http::Request<RequestBody>,
    ) -> Result<(http::Response<hyper::body::Incoming>, Lease), SendError> {
        if let Some(mut tx) = self.idle.take() {
            match tx.try_send_request(req).await {
                Ok(resp) => return Ok((resp, self.lease(tx))),
                Err(mut e) => match e.take_message() {
                    // The connection closed before the request went out: a fresh one.
                    Some(again) => req = again,
                    None => return Err(SendError::Http(e.into_error())),
                },
            }
        }
        let mut tx = self.connect().await?;
        let resp = tx.send_request(req).await.map_err(SendError::Http)?;
        Ok((resp, self.lease(tx)))
    }

    fn lease(&self, tx: http1::SendRequest<RequestBody>) -> Lease {
        Lease {
            tx,
            idle: self.idle.clone(),
        }
    }

    /// A new connection, its hyper task spawned.
    async fn connect(&self) -> Result<http1::SendRequest<RequestBody>, SendError> {
        let io = self.connector.connect().await.map_err(SendError::Connect)?;
        let (tx, conn) = http1::Builder::new()
            .max_buf_size(self.max_buf)
            .handshake(io)
            .await
            .map_err(SendError::Http)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        Ok(tx)
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
        let (resp, lease) = self.dispatch(req).await?;
        let ok = resp.status().is_success() || resp.status().is_redirection();
        // Read the body so the connection can go back to the pool.
        if http_body_util::BodyExt::collect(resp.into_body())
            .await
            .is_ok()
        {
            lease.release();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection over an in-memory pipe whose far end stays open and silent.
    async fn connection() -> (http1::SendRequest<RequestBody>, tokio::io::DuplexStream) {
        let (near, far) = tokio::io::duplex(1024);
        let (tx, conn) = http1::handshake(TokioIo::new(near))
            .await
            .expect("handshake over a pipe");
        tokio::spawn(conn);
        (tx, far)
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn absolute_form_targets_become_origin_form_with_a_path() {
        for (target, origin) in [
            ("http://b:8#/close", "/"),
            ("http://b:8?x=1", "/?x=1"),
            ("http://b:8", "/"),
            ("https://b/a/c?q#f", "/a/c?q"),
        ] {
            let uri: http::Uri = target.parse().expect("a valid absolute-form target");
            assert_eq!(origin_form(&uri).to_string(), origin, "{target}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connections_are_reused_most_recent_first_until_they_expire() {
        let idle = Idle {
            conns: Mutex::new(VecDeque::new()),
        };
        let (a, _far_a) = connection().await;
        let (b, _far_b) = connection().await;
        settle().await;
        idle.put(a);
        tokio::time::advance(Duration::from_secs(1)).await;
        idle.put(b);
        let first = idle.take().expect("a ready connection");
        idle.put(first);
        tokio::time::advance(IDLE_TIMEOUT - Duration::from_millis(500)).await;
        // The older one has expired by now, the one just given back has not.
        assert!(
            idle.take().is_some(),
            "the most recently used is still fresh"
        );
        assert!(
            idle.take().is_none(),
            "the other one expired and was dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_the_server_closed_is_never_handed_out() {
        let idle = Idle {
            conns: Mutex::new(VecDeque::new()),
        };
        let (a, far) = connection().await;
        settle().await;
        idle.put(a);
        drop(far);
        settle().await;
        assert!(idle.take().is_none());
    }
}
