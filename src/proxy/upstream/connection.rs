//! One HTTP/1.1 connection to an upstream ([`Connection`]): writing a request's head and body,
//! reading the response head, and a streamed request body sent while the answer is awaited
//! ([`BodyWriter`]). The response body is read by [`super::body`].

use super::connect::Conn;
use super::slots::Slot;
use crate::http1::{self, RequestFraming};
use crate::proxy::body::{BoxError, RequestBody};
use bytes::BytesMut;
use http_body::Body;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// A read asks for at least this much room: a small response (head and body) is one read.
pub(super) const READ_SIZE: usize = 8 * 1024;

/// A buffered request body up to this size goes out in the same write as the head.
const INLINE_BODY: usize = 16 * 1024;

/// One HTTP/1.1 connection to an upstream, between requests or carrying one.
pub(super) struct Connection {
    pub(super) io: Conn,
    /// Bytes read and not yet used: the response head, then the body's bytes until its
    /// reader takes them.
    pub(super) buf: BytesMut,
    /// The request head being written; its capacity is kept for the next request.
    out: Vec<u8>,
    /// Its place under the endpoint's bound, freed when the connection closes (`None`: a
    /// health check's connection, which never waits for a place).
    _slot: Option<Slot>,
    /// The TLS identity generation it was made with (0 without TLS): one older than the
    /// endpoint's current is not given another request ([`super::idle::Idle`]).
    pub(super) generation: u64,
    /// How long it may wait unused in the pool: what the upstream's last response allowed
    /// ([`super::idle_limit`]).
    pub(super) keep_for: std::time::Duration,
}

impl Connection {
    /// Boxed: it moves with its request and its response body, and stays where it is.
    pub(super) fn new(io: Conn, slot: Option<Slot>, generation: u64) -> Box<Self> {
        Box::new(Self {
            io,
            buf: BytesMut::new(),
            out: Vec::new(),
            _slot: slot,
            generation,
            keep_for: super::IDLE_TIMEOUT,
        })
    }

    /// True when the connection can carry a request: nothing unread, and the upstream has
    /// neither closed it nor sent anything unasked. Asked without waiting: a read that would
    /// block means it is open and quiet.
    pub(super) fn is_reusable(&mut self) -> bool {
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
    pub(super) fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        want: usize,
    ) -> Poll<io::Result<usize>> {
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
    pub(super) async fn write_request(
        &mut self,
        parts: &http::request::Parts,
        body: RequestBody,
    ) -> Result<Option<Box<BodyWriter>>, (io::Error, bool)> {
        let framing = request_framing(parts, &body);
        self.out.clear();
        http1::write_head(
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
    pub(super) async fn read_head(
        &mut self,
        max: usize,
        sending: &mut Option<Box<BodyWriter>>,
    ) -> Result<(http1::ResponseHead, bool), (io::Error, bool)> {
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
                if let Some(head) =
                    http1::parse_response_head(&mut self.buf).map_err(|e| (e.into(), true))?
                {
                    if head.status.is_informational()
                        && head.status != http::StatusCode::SWITCHING_PROTOCOLS
                    {
                        continue;
                    }
                    return Poll::Ready(Ok((head, refused.is_none())));
                }
            }
            if self.buf.len() >= max {
                return Poll::Ready(Err((http1::Error::HeadTooLarge.into(), true)));
            }
            let unanswered = match self.poll_fill(cx, READ_SIZE) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => http1::Error::ClosedBeforeAnswer.into(),
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
pub(super) struct BodyWriter {
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
    pub(super) fn poll_send(
        &mut self,
        io: &mut Conn,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
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
                http1::chunk_line(data.len(), &mut line);
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
