//! Connecting to one upstream address: a unix socket, TCP, or TLS to a peer over TCP, each
//! bounded by [`CONNECT_TIMEOUT`], and the transport ([`Conn`]) a connection then runs over.
//! A connection runs over any [`Transport`]: the three above are the production ones, named so
//! that their reads and writes are direct calls; anything else (an in-memory pipe: the pool's
//! and the exchange's tests, the differential fuzz target) is boxed ([`Connector::dial`]).

use crate::config::UpstreamAddr;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// How long a TCP connect may take before the endpoint counts as refused.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A byte stream an upstream connection can run over.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> Transport for T {}

/// Makes a connection's transport for an endpoint that is not an address (see [`Conn::Other`]).
pub(crate) type Dial = Arc<dyn Fn() -> io::Result<Box<dyn Transport>> + Send + Sync>;

/// Connects to one upstream address.
#[derive(Clone)]
pub(super) struct Connector {
    addr: Arc<UpstreamAddr>,
    tls: Option<crate::tls::peer::PeerTls>,
    /// Set: every connection comes from here instead of `addr`.
    dial: Option<Dial>,
}

impl Connector {
    pub(super) fn new(addr: UpstreamAddr, tls: Option<crate::tls::peer::PeerTls>) -> Self {
        Self {
            addr: Arc::new(addr),
            tls,
            dial: None,
        }
    }

    /// Connections from `dial` instead of an address.
    pub(super) fn dial(addr: UpstreamAddr, dial: Dial) -> Self {
        Self {
            addr: Arc::new(addr),
            tls: None,
            dial: Some(dial),
        }
    }
}

/// A connection's transport.
pub(super) enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// Any other transport.
    Other(Box<dyn Transport>),
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
            Self::Other(io) => Pin::new(io).poll_read(cx, buf),
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
            Self::Other(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Unix(io) => Pin::new(io).poll_flush(cx),
            Self::Tcp(io) => Pin::new(io).poll_flush(cx),
            Self::Tls(io) => Pin::new(io).poll_flush(cx),
            Self::Other(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Unix(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tcp(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls(io) => Pin::new(io).poll_shutdown(cx),
            Self::Other(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

impl Connector {
    /// A new transport, and the generation of the TLS identity it was made with (0 without
    /// TLS; see [`crate::tls::peer::PeerTls::generation`]).
    pub(super) async fn connect(&self) -> io::Result<(Conn, u64)> {
        if let Some(dial) = &self.dial {
            return Ok((Conn::Other(dial()?), 0));
        }
        match &*self.addr {
            UpstreamAddr::Unix(path) => Ok((Conn::Unix(UnixStream::connect(path).await?), 0)),
            UpstreamAddr::Tcp { host, port } => {
                let s = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    TcpStream::connect((host.as_str(), *port)),
                )
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
                let _ = s.set_nodelay(true);
                let Some(tls) = &self.tls else {
                    return Ok((Conn::Tcp(s), 0));
                };
                let (stream, generation) = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(s))
                    .await
                    .map_err(|_| {
                        io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                    })??;
                Ok((Conn::Tls(Box::new(stream)), generation))
            }
        }
    }
}
