//! The body of an upstream response ([`UpstreamBody`]): read from its connection as it is
//! polled, framed by length, chunks or the connection's end, and the connection given back to
//! its endpoint's pool when the body has been read to its end.

use super::connection::{BodyWriter, Connection, READ_SIZE};
use super::idle::Idle;
use crate::http1::{self, BodyKind, Decoded};
use crate::proxy::body::BoxError;
use http_body::{Body, Frame, SizeHint};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A long body is read up to this much at a time.
pub(super) const MAX_READ_SIZE: usize = 64 * 1024;

/// The body of an upstream response, read from its connection as it is polled. Read to its
/// end on a connection that may carry another request, it gives the connection back to its
/// endpoint's pool; dropped before that, it closes the connection.
pub struct UpstreamBody {
    pub(super) conn: Option<Box<Connection>>,
    left: Left,
    pub(super) keep_alive: bool,
    idle: Arc<Idle>,
    /// The rest of a streamed request body, when the upstream answered before all of it was
    /// sent: sent on while the response is read. The connection is reused only if it ends.
    /// Boxed: only streamed bodies have one.
    pub(super) sending: Option<Box<BodyWriter>>,
}

enum Left {
    /// Bytes still to come of a known length; 0 once the body has ended.
    Length(u64),
    Chunked(http1::Chunked),
    Close,
}

impl UpstreamBody {
    pub(super) fn new(
        conn: Box<Connection>,
        framing: &http1::ResponseFraming,
        idle: Arc<Idle>,
    ) -> Self {
        let left = match framing.body {
            BodyKind::Empty => Left::Length(0),
            BodyKind::Length(n) => Left::Length(n),
            BodyKind::Chunked => Left::Chunked(http1::Chunked::default()),
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
                        // body up to MAX_READ_SIZE is one frame, sealed and sent with the head
                        // in one write. One byte more than the body
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
                    Err(e) => return this.fail(e.into()),
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
                Poll::Ready(Ok(0)) => return this.fail(http1::Error::ClosedInBody.into()),
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
