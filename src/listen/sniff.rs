//! `tls = "optional"`: TLS or plain HTTP on one port, decided by the connection's first byte.
//!
//! A TLS connection starts with a handshake record, content type 22 (`0x16`, RFC 8446 §5.1);
//! an HTTP/1.1 request starts with a method token, which is ASCII letters. The first byte is
//! read (within the request head deadline, like a handshake) and given back in front of the
//! stream ([`Rewind`]), so the TLS acceptor or hyper reads the connection from its start.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The first byte of a TLS handshake record.
pub(super) const TLS_HANDSHAKE: u8 = 0x16;

/// Reads the first byte of `io`; `None` when the client closed without sending one.
pub(super) async fn first_byte<S: AsyncRead + Unpin>(mut io: S) -> io::Result<Option<Rewind<S>>> {
    let mut b = [0u8; 1];
    if io.read(&mut b).await? == 0 {
        return Ok(None);
    }
    Ok(Some(Rewind {
        first: Some(b[0]),
        inner: io,
    }))
}

pin_project_lite::pin_project! {
    /// A stream with its first byte, already read, put back in front.
    pub(super) struct Rewind<S> {
        first: Option<u8>,
        #[pin]
        inner: S,
    }
}

impl<S> Rewind<S> {
    pub(super) fn first(&self) -> Option<u8> {
        self.first
    }
}

impl<S: AsyncRead> AsyncRead for Rewind<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if buf.remaining() > 0 {
            if let Some(b) = this.first.take() {
                buf.put_slice(&[b]);
                return Poll::Ready(Ok(()));
            }
        }
        this.inner.poll_read(cx, buf)
    }
}

impl<S: AsyncWrite> AsyncWrite for Rewind<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn the_first_byte_is_read_again() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        drop(client);
        let mut r = first_byte(server).await.unwrap().expect("a byte");
        assert_eq!(r.first(), Some(b'G'));
        let mut all = String::new();
        r.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "GET / HTTP/1.1\r\n");
    }

    #[tokio::test]
    async fn a_client_that_closes_at_once_sends_nothing() {
        let (client, server) = tokio::io::duplex(64);
        drop(client);
        assert!(first_byte(server).await.unwrap().is_none());
    }
}
