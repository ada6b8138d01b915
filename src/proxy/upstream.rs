//! Upstream endpoints: one pooled keep-alive HTTP/1.1 client per endpoint, over unix sockets,
//! TCP, or TLS to peers.
//!
//! Each [`Endpoint`] owns its own hyper-util client, so the pool key is the endpoint itself and
//! the URI authority only fills in `Host` when the client sent none. Connect errors are reported
//! as such (`is_connect`), which is what makes a retry on another endpoint safe.

use crate::config::UpstreamAddr;
use crate::proxy::body::RequestBody;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpStream, UnixStream};

/// How long a TCP connect may take before the endpoint counts as refused.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Connects to one upstream address.
#[derive(Clone)]
pub struct Connector {
    addr: Arc<UpstreamAddr>,
    tls: Option<crate::tls::peer::PeerTls>,
}

impl Connector {
    pub fn new(addr: UpstreamAddr, tls: Option<crate::tls::peer::PeerTls>) -> Self {
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

impl Connection for Conn {
    fn connected(&self) -> Connected {
        Connected::new()
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

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let addr = self.addr.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            match &*addr {
                UpstreamAddr::Unix(path) => {
                    let s = UnixStream::connect(path).await?;
                    Ok(Conn::Unix {
                        io: TokioIo::new(s),
                    })
                }
                UpstreamAddr::Tcp { host, port } => {
                    let s = tokio::time::timeout(
                        CONNECT_TIMEOUT,
                        TcpStream::connect((host.as_str(), *port)),
                    )
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
                    let _ = s.set_nodelay(true);
                    match tls {
                        None => Ok(Conn::Tcp {
                            io: TokioIo::new(s),
                        }),
                        Some(tls) => {
                            let stream = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(s))
                                .await
                                .map_err(|_| {
                                    io::Error::new(
                                        io::ErrorKind::TimedOut,
                                        "TLS handshake timed out",
                                    )
                                })??;
                            Ok(Conn::Tls {
                                io: TokioIo::new(stream),
                            })
                        }
                    }
                }
            }
        })
    }
}

/// One upstream endpoint with its connection pool and in-flight count.
pub struct Endpoint {
    pub addr: UpstreamAddr,
    /// Label for logs and metrics.
    pub name: String,
    /// `name`, shared with every request's access log record without a copy.
    label: Arc<str>,
    client: Client<Connector, RequestBody>,
    in_flight: AtomicUsize,
    /// `http://<authority>` used to build request URIs for this endpoint.
    base: String,
    authority: http::uri::Authority,
}

impl Endpoint {
    pub fn new(
        addr: UpstreamAddr,
        tls: Option<crate::tls::peer::PeerTls>,
        max_response_head: usize,
    ) -> Self {
        let base = match &addr {
            UpstreamAddr::Unix(_) => "http://localhost".to_owned(),
            tcp => format!("http://{tcp}"),
        };
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .http1_max_buf_size(max_response_head.max(8192))
            .set_host(false)
            .build(Connector::new(addr.clone(), tls));
        let name = addr.to_string();
        Self {
            label: name.as_str().into(),
            name,
            addr,
            client,
            in_flight: AtomicUsize::new(0),
            authority: base
                .trim_start_matches("http://")
                .parse()
                .unwrap_or_else(|_| http::uri::Authority::from_static("localhost")),
            base,
        }
    }

    pub fn label(&self) -> &Arc<str> {
        &self.label
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Sends one request; `path_and_query` is appended to the endpoint's base URI.
    pub async fn send(
        &self,
        mut req: http::Request<RequestBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(http::uri::Scheme::HTTP);
        uri.authority = Some(self.authority.clone());
        uri.path_and_query = Some(
            req.uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        );
        if let Ok(uri) = http::Uri::from_parts(uri) {
            *req.uri_mut() = uri;
        }
        // We speak HTTP/1.1 upstream, which requires Host (RFC 9112 §3.2); an HTTP/1.0 client
        // may have sent none: name the endpoint.
        if !req.headers().contains_key(http::header::HOST) {
            if let Ok(v) = http::HeaderValue::from_str(self.authority.as_str()) {
                req.headers_mut().insert(http::header::HOST, v);
            }
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let _guard = InFlight(&self.in_flight);
        self.client.request(req).await
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
    pub async fn probe(&self, path: &str) -> Result<bool, hyper_util::client::legacy::Error> {
        let Ok(req) = http::Request::get(format!("{}{path}", self.base))
            .header(http::header::HOST, self.authority())
            .header(http::header::USER_AGENT, "ironic-proxy-health")
            .header(
                http::header::VIA,
                format!("1.1 {}", crate::proxy::headers::VIA_NAME),
            )
            .body(RequestBody::empty())
        else {
            return Ok(false);
        };
        let resp = self.client.request(req).await?;
        let ok = resp.status().is_success() || resp.status().is_redirection();
        // Drain the body so the connection goes back to the pool.
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        Ok(ok)
    }

    fn authority(&self) -> String {
        self.base.trim_start_matches("http://").to_owned()
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
