//! The egress listener's client connections ACK every read at once (`TCP_QUICKACK`).
//!
//! Why: urllib3 (under keystoneauth, Ironic's JSON-RPC client) opens its connections to an HTTP
//! proxy without `TCP_NODELAY`, and http.client writes a request's head and body separately, so
//! Nagle holds the body until the head is ACKed; Linux delays that ACK up to 40 ms once a
//! connection has left quick-ACK mode, so every keep-alive call through the egress would wait
//! for that delayed ACK. Setting `TCP_QUICKACK` after a read sends the pending ACK now; the kernel clears the flag on
//! its own, hence once per read. One system call per read, on this listener only.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A client connection of an egress listener.
pub(crate) struct QuickAck(TcpStream);

impl QuickAck {
    pub(crate) fn new(s: TcpStream) -> Self {
        Self(s)
    }
}

impl AsyncRead for QuickAck {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.0).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            // Best effort: a failure only means the ACK goes out on the kernel's own timer.
            let _ = rustix::net::sockopt::set_tcp_quickack(&this.0, true);
        }
        r
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}
