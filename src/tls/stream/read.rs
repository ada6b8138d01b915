//! The read side of [`ServerStream`]: plaintext out of records, read from the socket into the
//! stack between records and into `incoming` mid-record, and the end of stream (close_notify,
//! or a truncation's `UnexpectedEof`).

use super::{ServerStream, Step, FIRST_READ, MAX_INCOMING};
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

impl<S: AsyncRead + AsyncWrite + Unpin> ServerStream<S> {
    /// Reads from the socket into `incoming`: the rest of a started record, or whatever
    /// arrives into an empty buffer (on the stack first). Ready(0) at the socket's end.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.incoming.is_empty() {
            let mut stack = [MaybeUninit::<u8>::uninit(); FIRST_READ];
            let mut buf = ReadBuf::uninit(&mut stack[..]);
            ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf))?;
            self.incoming.extend_from_slice(buf.filled());
            return Poll::Ready(Ok(buf.filled().len()));
        }
        if self.incoming.len() >= MAX_INCOMING {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS message too large",
            )));
        }
        // The whole record when its header is in (16 KiB plus overhead at most), else 4 KiB.
        let want = match self.incoming.get(3..5) {
            Some(len) => (5 + usize::from(u16::from_be_bytes([len[0], len[1]])))
                .saturating_sub(self.incoming.len())
                .max(1024),
            None => FIRST_READ,
        };
        let at = self.incoming.len();
        self.incoming.resize(at + want, 0);
        let mut buf = ReadBuf::new(&mut self.incoming[at..]);
        let read = Pin::new(&mut self.io).poll_read(cx, &mut buf);
        let n = buf.filled().len();
        self.incoming.truncate(at + n);
        ready!(read)?;
        Poll::Ready(Ok(n))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for ServerStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = this.poll_read_plain(cx, buf);
        this.check();
        r
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> ServerStream<S> {
    fn poll_read_plain(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self;
        loop {
            if this.plain_read < this.plain.len() {
                let rest = &this.plain[this.plain_read..];
                let n = rest.len().min(buf.remaining());
                buf.put_slice(&rest[..n]);
                this.plain_read += n;
                if this.plain_read == this.plain.len() {
                    this.plain = Vec::new();
                    this.plain_read = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.truncated {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed connection without sending TLS close_notify",
                )));
            }
            if this.read_closed || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            let step = if this.has_nothing_to_process() {
                Step::NeedRead
            } else {
                this.step(cx, Some(buf), None)?
            };
            match step {
                Step::Again if buf.filled().len() > before => return Poll::Ready(Ok(())),
                Step::Again => {}
                Step::WriteBlocked => return Poll::Pending,
                Step::NeedRead | Step::CanWrite { .. } if this.incoming.is_empty() => {
                    // Between records (a keep-alive connection's next request): read on the
                    // stack and decrypt there; only part of a record goes to `incoming`.
                    let mut stack = [MaybeUninit::<u8>::uninit(); FIRST_READ];
                    let mut records = ReadBuf::uninit(&mut stack[..]);
                    ready!(Pin::new(&mut this.io).poll_read(cx, &mut records))?;
                    if records.filled().is_empty() {
                        this.socket_ended();
                        continue;
                    }
                    match this.step_borrowed(records.filled_mut(), cx, Some(buf))? {
                        Step::Again if buf.filled().len() > before => return Poll::Ready(Ok(())),
                        Step::WriteBlocked => return Poll::Pending,
                        _ => {}
                    }
                }
                Step::NeedRead | Step::CanWrite { .. } => {
                    if ready!(this.poll_fill(cx))? == 0 {
                        // Mid-record.
                        this.socket_ended();
                    }
                }
            }
        }
    }
}
