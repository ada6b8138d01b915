//! Upstream endpoints: one pool of keep-alive HTTP/1.1 connections per endpoint, over unix
//! sockets, TCP, or TLS to peers.
//!
//! The pool and the client are ours ([`super::h1`] says why): an idle list per endpoint (the
//! most recently used first, so few connections stay warm), a connection taken for one request
//! and given back by its response body when that has been read to its end ([`UpstreamBody`]),
//! idle ones dropped after [`IDLE_TIMEOUT`] or when the upstream closed them. Nothing is spawned
//! per request or per connection and no URI is rebuilt: the request's own task writes the
//! request in origin form, with `Host` filled in from the endpoint when the client sent none,
//! and reads the response head; whoever polls the body reads the rest. Connect errors are
//! reported as such ([`SendError::is_connect`]), which is what makes a retry on another
//! endpoint safe. A pooled connection that fails before any answer came back (refused the
//! write, closed or reset: a stale keep-alive the upstream had closed) is the connection's
//! failure, not the endpoint's ([`SendError::Stale`], which passive health ignores); the request
//! is sent again on a fresh connection when it had not gone out, or its method is replayable
//! (GET, HEAD, OPTIONS; as Go's `net/http` transport), and its body is still ours to send.

use super::h1::{self, BodyKind, Decoded, RequestFraming};
use crate::config::UpstreamAddr;
use crate::proxy::body::{BoxError, RequestBody};
use bytes::BytesMut;
use http_body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
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

/// A read asks for at least this much room: a small response (head and body) is one read.
const READ_SIZE: usize = 8 * 1024;

/// A long body is read up to this much at a time.
const MAX_READ_SIZE: usize = 64 * 1024;

/// A buffered request body up to this size goes out in the same write as the head.
const INLINE_BODY: usize = 16 * 1024;

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

/// A connection's transport.
pub(crate) enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Unix(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tcp(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tls(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Unix(io) => Pin::new(io).poll_write(cx, buf),
            Self::Tcp(io) => Pin::new(io).poll_write(cx, buf),
            Self::Tls(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Unix(io) => Pin::new(io).poll_flush(cx),
            Self::Tcp(io) => Pin::new(io).poll_flush(cx),
            Self::Tls(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Unix(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tcp(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

/// One HTTP/1.1 connection to an upstream, between requests or carrying one.
pub(crate) struct Connection {
    io: Conn,
    /// Bytes read and not yet used: the response head, then the body's bytes until its
    /// reader takes them.
    buf: BytesMut,
    /// The request head being written; its capacity is kept for the next request.
    out: Vec<u8>,
}

impl Connection {
    /// Boxed: it moves with its request and its response body, and stays where it is.
    fn new(io: Conn) -> Box<Self> {
        Box::new(Self {
            io,
            buf: BytesMut::new(),
            out: Vec::new(),
        })
    }

    /// True when the connection can carry a request: nothing unread, and the upstream has
    /// neither closed it nor sent anything unasked. Asked without waiting: a read that would
    /// block means it is open and quiet.
    fn is_reusable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut byte = [0u8; 1];
        let mut probe = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(&mut self.io)
            .poll_read(&mut cx, &mut probe)
            .is_pending()
    }

    /// Reads more into `buf`, with room for at least `want` bytes.
    fn poll_fill(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < want.min(READ_SIZE) {
            self.buf.reserve(want);
        }
        let read = self.io.read_buf(&mut self.buf);
        tokio::pin!(read);
        read.poll(cx)
    }

    /// Writes the request's head, and its body when it is in memory; a streamed body comes
    /// back as a [`BodyWriter`], sent while the response is awaited. `Err(_, false)`: the head
    /// could not be written, so nothing of the request reached the upstream.
    async fn write_request(
        &mut self,
        parts: &http::request::Parts,
        body: RequestBody,
    ) -> Result<Option<Box<BodyWriter>>, (io::Error, bool)> {
        let framing = request_framing(parts, &body);
        self.out.clear();
        h1::write_head(
            &parts.method,
            &parts.uri,
            &parts.headers,
            framing,
            &mut self.out,
        );
        match body {
            RequestBody::Full(None) => self.write_head().await?,
            RequestBody::Full(Some(b)) if b.len() <= INLINE_BODY => {
                self.out.extend_from_slice(&b);
                self.write_head().await?;
            }
            RequestBody::Full(Some(b)) => {
                self.write_head().await?;
                self.io.write_all(&b).await.map_err(|e| (e, true))?;
            }
            stream @ RequestBody::Stream(..) => {
                self.write_head().await?;
                return Ok(Some(Box::new(BodyWriter {
                    body: stream,
                    chunked: framing == RequestFraming::Chunked,
                    declared: declared_length(parts),
                    sent: 0,
                    queue: VecDeque::new(),
                    ended: false,
                })));
            }
        }
        self.io.flush().await.map_err(|e| (e, true))?;
        Ok(None)
    }

    async fn write_head(&mut self) -> Result<(), (io::Error, bool)> {
        self.io.write_all(&self.out).await.map_err(|e| (e, false))
    }

    /// Reads the response head, skipping interim (1xx) responses other than 101, while
    /// `sending` (a streamed request body) goes out: an upstream may answer before it has read
    /// the whole body (a refused upload) and stop reading. `sending` is `None` on return when
    /// the body was all sent, or when the upstream stopped taking it and answered anyway: then
    /// the flag that comes with the head is false, and the connection must not carry another
    /// request.
    async fn read_head(
        &mut self,
        max: usize,
        sending: &mut Option<Box<BodyWriter>>,
    ) -> Result<(h1::ResponseHead, bool), (io::Error, bool)> {
        // Why the body could not be sent: the better explanation when no answer comes either.
        let mut refused: Option<io::Error> = None;
        // Whether any byte of an answer came: a failure before one is a stale connection's.
        let mut answered = false;
        std::future::poll_fn(|cx| loop {
            if let Some(writer) = sending.as_mut() {
                match writer.poll_send(&mut self.io, cx) {
                    Poll::Ready(Ok(())) => *sending = None,
                    // The client's fault: nothing to wait for.
                    Poll::Ready(Err(e)) if failed_on_our_side(&e) => {
                        return Poll::Ready(Err((e, true)))
                    }
                    Poll::Ready(Err(e)) => {
                        refused = Some(e);
                        *sending = None;
                    }
                    Poll::Pending => {}
                }
            }
            // Right after the request the buffer is empty: no parse of nothing.
            if !self.buf.is_empty() {
                if let Some(head) = h1::parse_head(&mut self.buf).map_err(|e| (e, true))? {
                    if head.status.is_informational()
                        && head.status != http::StatusCode::SWITCHING_PROTOCOLS
                    {
                        continue;
                    }
                    return Poll::Ready(Ok((head, refused.is_none())));
                }
            }
            if self.buf.len() >= max {
                return Poll::Ready(Err((
                    io::Error::new(io::ErrorKind::InvalidData, "response head too large"),
                    true,
                )));
            }
            let unanswered = match self.poll_fill(cx, READ_SIZE) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the upstream closed the connection before answering",
                ),
                Poll::Ready(Ok(_)) => {
                    answered = true;
                    continue;
                }
                Poll::Ready(Err(e)) => e,
            };
            return Poll::Ready(Err((refused.take().unwrap_or(unanswered), answered)));
        })
        .await
    }
}

/// A streamed request body on its way to the upstream, written as the exchange is polled:
/// while the response head is awaited, and then while the response body is read when the
/// upstream answered first. Written to its end before the response is read, a body the
/// upstream stopped reading would hold the answer back until `upstream_timeout`.
struct BodyWriter {
    body: RequestBody,
    chunked: bool,
    /// The request's `Content-Length`, which the body must match.
    declared: Option<u64>,
    sent: u64,
    /// Taken from the body (with chunk framing), not yet written.
    queue: VecDeque<bytes::Bytes>,
    ended: bool,
}

impl BodyWriter {
    /// `Ready(Ok(()))` once all of the body is written and flushed.
    fn poll_send(&mut self, io: &mut Conn, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        use bytes::Buf as _;
        loop {
            while let Some(front) = self.queue.front_mut() {
                let n = std::task::ready!(Pin::new(&mut *io).poll_write(cx, front))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                front.advance(n);
                if front.is_empty() {
                    self.queue.pop_front();
                }
            }
            if self.ended {
                return Pin::new(&mut *io).poll_flush(cx);
            }
            let Some(frame) = std::task::ready!(Pin::new(&mut self.body).poll_frame(cx)) else {
                if self.declared.is_some_and(|n| self.sent < n) {
                    return Poll::Ready(Err(io::Error::other(BodyError::Shorter)));
                }
                if self.chunked {
                    self.queue
                        .push_back(bytes::Bytes::from_static(b"0\r\n\r\n"));
                }
                self.ended = true;
                continue;
            };
            let frame = frame.map_err(|e| io::Error::other(BodyError::Read(e)))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers are not forwarded
            };
            if data.is_empty() {
                continue;
            }
            self.sent += data.len() as u64;
            if self.declared.is_some_and(|n| self.sent > n) {
                return Poll::Ready(Err(io::Error::other(BodyError::Longer)));
            }
            if self.chunked {
                let mut line = Vec::with_capacity(20);
                h1::chunk_line(data.len(), &mut line);
                self.queue.push_back(line.into());
                self.queue.push_back(data);
                self.queue.push_back(bytes::Bytes::from_static(b"\r\n"));
            } else {
                self.queue.push_back(data);
            }
        }
    }
}

/// True when `e`, from [`BodyWriter::poll_send`], is the client's body failing or not matching
/// its length, not the upstream refusing it.
fn failed_on_our_side(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<BodyError>())
}

/// A client body that failed while it was being sent (the cause is the client's).
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("reading the request body failed")]
    Read(#[source] BoxError),
    #[error("request body longer than its Content-Length")]
    Longer,
    #[error("request body shorter than its Content-Length")]
    Shorter,
}

/// How the request body goes on the wire: as its own `Content-Length` says, or with one we add
/// for a buffered body, or chunked for a streamed one of unknown length. `Transfer-Encoding`
/// never reaches here (hop-by-hop, stripped with the request's other such fields).
fn request_framing(parts: &http::request::Parts, body: &RequestBody) -> RequestFraming {
    if parts.headers.contains_key(http::header::CONTENT_LENGTH) {
        return RequestFraming::AsIs;
    }
    match body {
        RequestBody::Full(None) => RequestFraming::AsIs,
        RequestBody::Full(Some(b)) => RequestFraming::Length(b.len() as u64),
        RequestBody::Stream(..) => body
            .size_hint()
            .exact()
            .map_or(RequestFraming::Chunked, RequestFraming::Length),
    }
}

fn declared_length(parts: &http::request::Parts) -> Option<u64> {
    parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

impl Connector {
    async fn connect(&self) -> io::Result<Conn> {
        match &*self.addr {
            UpstreamAddr::Unix(path) => Ok(Conn::Unix(UnixStream::connect(path).await?)),
            UpstreamAddr::Tcp { host, port } => {
                let s = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    TcpStream::connect((host.as_str(), *port)),
                )
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
                let _ = s.set_nodelay(true);
                let Some(tls) = &self.tls else {
                    return Ok(Conn::Tcp(s));
                };
                let stream = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(s))
                    .await
                    .map_err(|_| {
                        io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                    })??;
                Ok(Conn::Tls(Box::new(stream)))
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

/// The idle connections of one endpoint.
struct Idle {
    conns: Mutex<VecDeque<(Box<Connection>, Instant)>>,
}

impl Idle {
    /// The most recently used connection that can carry a request; closed and expired ones
    /// are dropped on the way.
    fn take(&self) -> Option<Box<Connection>> {
        let mut conns = self.conns.lock().ok()?;
        let now = Instant::now();
        while let Some((mut conn, since)) = conns.pop_back() {
            if now.duration_since(since) < IDLE_TIMEOUT && conn.is_reusable() {
                return Some(conn);
            }
            // Closed, expired, or it sent something unasked: dropping it closes it.
        }
        None
    }

    /// Drops the connections idle for [`IDLE_TIMEOUT`] or longer (the oldest are first).
    fn close_expired(&self) {
        if let Ok(mut conns) = self.conns.lock() {
            expire(&mut conns, Instant::now());
        }
    }

    fn put(&self, mut conn: Box<Connection>) {
        if !conn.buf.is_empty() {
            return;
        }
        // A long body's read buffer is not kept by an idle connection.
        if conn.buf.capacity() > READ_SIZE {
            conn.buf = BytesMut::new();
        }
        let Ok(mut conns) = self.conns.lock() else {
            return;
        };
        let now = Instant::now();
        expire(&mut conns, now);
        if conns.len() < MAX_IDLE {
            conns.push_back((conn, now));
        }
    }
}

/// Drops the connections of `conns` (oldest first) idle for [`IDLE_TIMEOUT`] or longer.
fn expire(conns: &mut VecDeque<(Box<Connection>, Instant)>, now: Instant) {
    while conns
        .front()
        .is_some_and(|(_, since)| now.duration_since(*since) >= IDLE_TIMEOUT)
    {
        conns.pop_front();
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
            max_head: max_response_head.max(8192) * 2,
            in_flight: AtomicUsize::new(0),
            authority: http::HeaderValue::from_str(&authority)
                .unwrap_or_else(|_| http::HeaderValue::from_static("localhost")),
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
        self.dispatch(req).await
    }

    /// `req` on a pooled connection, or on a new one when none is ready or the pooled one
    /// refused the request before it went out.
    async fn dispatch(
        &self,
        req: http::Request<RequestBody>,
    ) -> Result<http::Response<UpstreamBody>, SendError> {
        let (parts, mut body) = req.into_parts();
        // Let the other requests that arrived with this one reach this point first, so that
        // their writes to the upstream go out together: an upstream on another core is then
        // woken once for all of them rather than once each. Measured (BENCHMARKS.md "Our own
        // upstream client"): without it, 25.4-27.4 CPU µs per keep-alive request; with it,
        // 23.1-25.9, as with hyper's client, whose connection task gave the same batching.
        tokio::task::yield_now().await;
        if let Some(mut conn) = self.idle.take() {
            let again = body.try_clone();
            let replayable = crate::proxy::headers::is_replayable(&parts.method);
            // Closed under us before any answer: `sent` when the request may have gone out.
            let (e, sent) = match conn.write_request(&parts, body).await {
                Ok(sending) => match self.answer(conn, &parts.method, sending).await {
                    Err((e, false)) if closed_under_us(&e) => (e, true),
                    done => return done.map_err(|(e, _)| SendError::Exchange(e)),
                },
                Err((e, false)) => (e, false),
                Err((e, true)) if closed_under_us(&e) => (e, true),
                Err((e, true)) => return Err(SendError::Exchange(e)),
            };
            match again {
                Some(b) if !sent || replayable => body = b,
                _ => return Err(SendError::Stale(e)),
            }
        }
        // Boxed: connecting (TCP, TLS to a peer) is the rare path of a pooled endpoint, and its
        // state (1.3 KiB) would otherwise be part of every request's future, copied at each
        // level that awaits it (memcpy was 2,600 instructions per request, callgrind).
        let mut conn = Box::pin(self.connect()).await?;
        let sending = conn
            .write_request(&parts, body)
            .await
            .map_err(|(e, _)| SendError::Exchange(e))?;
        self.answer(conn, &parts.method, sending)
            .await
            .map_err(|(e, _)| SendError::Exchange(e))
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
        let framing = h1::response_framing(method, &head).map_err(|e| (e, true))?;
        let mut body = UpstreamBody::new(conn, &framing, self.idle.clone());
        body.sending = sending;
        body.keep_alive &= whole;
        let mut resp = http::Response::new(body);
        *resp.status_mut() = head.status;
        *resp.version_mut() = head.version;
        *resp.headers_mut() = head.headers;
        Ok(resp)
    }

    /// A new connection.
    async fn connect(&self) -> Result<Box<Connection>, SendError> {
        let io = self.connector.connect().await.map_err(SendError::Connect)?;
        Ok(Connection::new(io))
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
        let resp = self.dispatch(req).await?;
        let ok = resp.status().is_success() || resp.status().is_redirection();
        // Read to its end, the body gives the connection back to the pool.
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        Ok(ok)
    }
}

/// The body of an upstream response, read from its connection as it is polled. Read to its
/// end on a connection that may carry another request, it gives the connection back to its
/// endpoint's pool; dropped before that, it closes the connection.
pub struct UpstreamBody {
    conn: Option<Box<Connection>>,
    left: Left,
    keep_alive: bool,
    idle: Arc<Idle>,
    /// The rest of a streamed request body, when the upstream answered before all of it was
    /// sent: sent on while the response is read. The connection is reused only if it ends.
    /// Boxed: only streamed bodies have one.
    sending: Option<Box<BodyWriter>>,
}

enum Left {
    /// Bytes still to come of a known length; 0 once the body has ended.
    Length(u64),
    Chunked(h1::Chunked),
    Close,
}

impl UpstreamBody {
    fn new(conn: Box<Connection>, framing: &h1::ResponseFraming, idle: Arc<Idle>) -> Self {
        let left = match framing.body {
            BodyKind::Empty => Left::Length(0),
            BodyKind::Length(n) => Left::Length(n),
            BodyKind::Chunked => Left::Chunked(h1::Chunked::default()),
            BodyKind::Close => Left::Close,
        };
        Self {
            conn: Some(conn),
            left,
            keep_alive: framing.keep_alive,
            idle,
            sending: None,
        }
    }

    /// The body has ended: the connection goes back to the pool if it can carry another
    /// request.
    fn end(&mut self) {
        self.left = Left::Length(0);
        // A request body not all sent leaves the connection in the middle of a request.
        let reusable = self.keep_alive && self.sending.take().is_none();
        if let Some(conn) = self.conn.take().filter(|_| reusable) {
            self.idle.put(conn);
        }
    }

    fn fail(&mut self, e: io::Error) -> Poll<Option<Result<Frame<bytes::Bytes>, BoxError>>> {
        self.conn = None;
        self.left = Left::Length(0);
        Poll::Ready(Some(Err(Box::new(e))))
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // Ended but never polled to its end (an empty body, a known length fully read).
        if self.conn.is_some() && matches!(self.left, Left::Length(0)) {
            self.end();
        }
    }
}

impl Body for UpstreamBody {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if let Some(writer) = this.sending.as_mut() {
                match writer.poll_send(&mut conn.io, cx) {
                    Poll::Ready(Ok(())) => this.sending = None,
                    // The answer is already on its way; the upstream may have stopped reading
                    // (what it answered says why). The connection is not reused.
                    Poll::Ready(Err(_)) => {
                        this.sending = None;
                        this.keep_alive = false;
                    }
                    Poll::Pending => {}
                }
            }
            let want = match &mut this.left {
                Left::Length(0) => {
                    this.end();
                    return Poll::Ready(None);
                }
                Left::Length(left) => {
                    let have = conn.buf.len();
                    let rest = usize::try_from(*left).unwrap_or(usize::MAX);
                    if have > 0 && have < rest && have < MAX_READ_SIZE {
                        // Part of the body came with the head (a read of READ_SIZE): top it
                        // up with what the socket already holds, without waiting, so that a
                        // 64 KiB body is one frame, sealed and sent with the head in one write
                        // (BENCHMARKS.md "Performance round 20"). One byte more than the body
                        // needs: a read that does not fill its buffer tells tokio the socket
                        // is drained, so the pool's next reuse check makes no system call.
                        let want = if rest <= MAX_READ_SIZE {
                            rest - have + 1
                        } else {
                            MAX_READ_SIZE - have
                        };
                        if let Poll::Ready(Ok(1..)) = conn.poll_fill(cx, want) {
                            continue;
                        }
                        // Nothing more yet, or the socket's end or an error: the bytes we have
                        // go first; the next poll reads again and reports the end.
                    }
                    if have > 0 {
                        let n = rest.min(have);
                        let data = conn.buf.split_to(n).freeze();
                        *left -= n as u64;
                        if *left == 0 {
                            this.end();
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    // One byte more than the body needs, as above.
                    rest.saturating_add(1).clamp(READ_SIZE, MAX_READ_SIZE)
                }
                Left::Chunked(chunks) => match chunks.decode(&mut conn.buf) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::End) => {
                        this.end();
                        return Poll::Ready(None);
                    }
                    Ok(Decoded::More) => READ_SIZE,
                    Err(e) => return this.fail(e),
                },
                Left::Close => {
                    if !conn.buf.is_empty() {
                        let data = conn.buf.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    MAX_READ_SIZE
                }
            };
            match conn.poll_fill(cx, want) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) if matches!(this.left, Left::Close) => {
                    this.keep_alive = false;
                    this.end();
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => {
                    return this.fail(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the upstream closed the connection in the middle of the body",
                    ))
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.left, Left::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.left {
            Left::Length(n) => SizeHint::with_exact(*n),
            Left::Chunked(_) | Left::Close => SizeHint::default(),
        }
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

    /// A pooled connection over a unix socket pair, and the pair's far end.
    fn connection() -> (Box<Connection>, UnixStream) {
        let (near, far) = UnixStream::pair().expect("a socket pair");
        (Connection::new(Conn::Unix(near)), far)
    }

    /// Lets the I/O driver see what happened on the sockets.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// An upstream on a unix socket whose first connection answers one request and then
    /// closes when the next arrives (a keep-alive it closed while the request was on its way),
    /// and whose later connections answer every request. Returns the requests' methods.
    async fn closing_upstream(
        dir: &tempfile::TempDir,
    ) -> (Endpoint, tokio::task::JoinHandle<Vec<String>>) {
        let path = dir.path().join("up.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for conn in 0.. {
                let Ok(Ok((mut s, _))) =
                    tokio::time::timeout(Duration::from_millis(500), listener.accept()).await
                else {
                    return seen;
                };
                let mut buf = vec![0u8; 4096];
                for n in 0.. {
                    let Ok(len) = s.read(&mut buf).await else {
                        break;
                    };
                    if len == 0 {
                        break;
                    }
                    let text = String::from_utf8_lossy(&buf[..len]).into_owned();
                    seen.push(text.split(' ').next().unwrap_or_default().to_owned());
                    if conn == 0 && n == 1 {
                        break; // closes without an answer
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if s.write_all(ok).await.is_err() {
                        break;
                    }
                }
            }
            seen
        });
        let ep = Endpoint::new(UpstreamAddr::Unix(path), None, 8192);
        (ep, server)
    }

    async fn send(ep: &Endpoint, method: http::Method) -> Result<u16, SendError> {
        let mut req = http::Request::new(RequestBody::Full(Some("{}".into())));
        *req.method_mut() = method;
        *req.uri_mut() = http::Uri::from_static("/v1/heartbeat");
        let resp = ep.send(req).await?;
        let status = resp.status().as_u16();
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        Ok(status)
    }

    /// The scale bench's storm: requests on keep-alive connections the sidecar had closed
    /// failed and ejected the only healthy peer. A replayable request is sent again on a fresh
    /// connection; one that is not fails as `Stale`, which does not blame the endpoint.
    #[tokio::test]
    async fn a_pooled_connection_closed_under_a_request_is_not_the_endpoints_failure() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ep, server) = closing_upstream(&dir).await;
        assert_eq!(send(&ep, http::Method::GET).await.expect("first"), 200);
        settle().await;
        let again = send(&ep, http::Method::GET).await;
        assert_eq!(again.expect("sent again on a fresh connection"), 200);
        drop(ep);
        assert_eq!(server.await.expect("server"), ["GET", "GET", "GET"]);

        let dir = tempfile::tempdir().expect("temp dir");
        let (ep, server) = closing_upstream(&dir).await;
        assert_eq!(send(&ep, http::Method::POST).await.expect("first"), 200);
        settle().await;
        let err = send(&ep, http::Method::POST)
            .await
            .expect_err("not replayable");
        assert!(matches!(err, SendError::Stale(_)), "{err:?}");
        assert!(!err.blames_endpoint());
        assert!(!err.is_connect());
        drop(ep);
        assert_eq!(server.await.expect("server"), ["POST", "POST"]);
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
        let (a, _far_a) = connection();
        let (b, _far_b) = connection();
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
    async fn expired_idle_connections_are_closed_without_waiting_for_a_request() {
        let idle = Idle {
            conns: Mutex::new(VecDeque::new()),
        };
        let (a, mut far_a) = connection();
        let (b, _far_b) = connection();
        idle.put(a);
        tokio::time::advance(Duration::from_secs(2)).await;
        idle.put(b);
        tokio::time::advance(IDLE_TIMEOUT - Duration::from_secs(1)).await;
        idle.close_expired();
        assert_eq!(
            idle.conns.lock().unwrap().len(),
            1,
            "the older one is closed"
        );
        let mut byte = [0u8; 1];
        assert_eq!(
            far_a.read(&mut byte).await.unwrap(),
            0,
            "its upstream sees the close"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_the_server_closed_or_wrote_to_is_never_handed_out() {
        let idle = Idle {
            conns: Mutex::new(VecDeque::new()),
        };
        let (a, far_a) = connection();
        let (b, far_b) = connection();
        idle.put(a);
        idle.put(b);
        settle().await;
        drop(far_a);
        far_b
            .try_write(b"HTTP/1.1 200 OK\r\n")
            .expect("room in the socket");
        settle().await;
        assert!(idle.take().is_none());
    }

    /// A response body over a socket pair, with the far end to write the upstream's bytes.
    fn body(framing: BodyKind, keep_alive: bool) -> (UpstreamBody, UnixStream, Arc<Idle>) {
        let idle = Arc::new(Idle {
            conns: Mutex::new(VecDeque::new()),
        });
        let (conn, far) = connection();
        let body = UpstreamBody::new(
            conn,
            &h1::ResponseFraming {
                body: framing,
                keep_alive,
            },
            idle.clone(),
        );
        (body, far, idle)
    }

    fn pooled(idle: &Idle) -> usize {
        idle.conns.lock().unwrap().len()
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_gives_its_connection_back() {
        use http_body_util::BodyExt as _;
        for (kind, wire, data) in [
            (BodyKind::Length(5), &b"hello"[..], &b"hello"[..]),
            (
                BodyKind::Chunked,
                b"2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n",
                b"hello",
            ),
            (BodyKind::Empty, b"", b""),
        ] {
            let (b, mut far, idle) = body(kind, true);
            far.write_all(wire).await.unwrap();
            let got = b.collect().await.expect("a whole body").to_bytes();
            assert_eq!(&got[..], data);
            assert_eq!(pooled(&idle), 1, "{:?}", String::from_utf8_lossy(wire));
        }
        // Not when the upstream said close, nor for a body delimited by the close.
        let (b, mut far, idle) = body(BodyKind::Length(2), false);
        far.write_all(b"ok").await.unwrap();
        assert_eq!(&b.collect().await.unwrap().to_bytes()[..], b"ok");
        assert_eq!(pooled(&idle), 0);
        let (b, mut far, idle) = body(BodyKind::Close, false);
        far.write_all(b"until the end").await.unwrap();
        drop(far);
        assert_eq!(&b.collect().await.unwrap().to_bytes()[..], b"until the end");
        assert_eq!(pooled(&idle), 0);
    }

    #[tokio::test]
    async fn a_body_begun_with_its_head_is_topped_up_to_one_frame_without_waiting() {
        use http_body_util::BodyExt as _;
        let whole = (0..70_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
        // What came with the head is in the buffer; the rest is already in the socket: one
        // frame of as much as one read takes, then the rest.
        let (mut b, mut far, idle) = body(BodyKind::Length(whole.len() as u64), true);
        b.conn
            .as_mut()
            .unwrap()
            .buf
            .extend_from_slice(&whole[..8000]);
        far.write_all(&whole[8000..]).await.unwrap();
        settle().await;
        let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), MAX_READ_SIZE, "topped up to one read's most");
        let rest = b.collect().await.unwrap().to_bytes();
        assert_eq!([&first[..], &rest[..]].concat(), whole);
        assert_eq!(
            pooled(&idle),
            1,
            "read to its end, the connection goes back"
        );

        // The rest has not come yet: what we have is given at once, the rest when it comes.
        let (mut b, mut far, idle) = body(BodyKind::Length(10), true);
        b.conn.as_mut().unwrap().buf.extend_from_slice(b"hello");
        let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"hello");
        far.write_all(b"world").await.unwrap();
        assert_eq!(&b.collect().await.unwrap().to_bytes()[..], b"world");
        assert_eq!(pooled(&idle), 1);

        // The upstream closes after part of the rest: the bytes that came are given, then the
        // error, and the connection is not reused.
        let (mut b, mut far, idle) = body(BodyKind::Length(20), true);
        b.conn.as_mut().unwrap().buf.extend_from_slice(b"hello");
        far.write_all(b"world").await.unwrap();
        drop(far);
        settle().await;
        let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"helloworld");
        assert!(b.frame().await.unwrap().is_err(), "cut short");
        assert_eq!(pooled(&idle), 0);
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_closes_its_connection() {
        use http_body_util::BodyExt as _;
        for (kind, wire) in [
            (BodyKind::Length(10), &b"short"[..]),
            (BodyKind::Chunked, b"5\r\nhel"),
            (BodyKind::Chunked, b"5\r\nhello\r\nzz\r\n"),
        ] {
            let (b, mut far, idle) = body(kind, true);
            far.write_all(wire).await.unwrap();
            drop(far);
            assert!(
                b.collect().await.is_err(),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
            assert_eq!(pooled(&idle), 0);
        }
        // Dropped before its end: closed, not pooled.
        let (b, mut far, idle) = body(BodyKind::Length(10), true);
        far.write_all(b"part").await.unwrap();
        drop(b);
        assert_eq!(pooled(&idle), 0);
    }
}
