//! A connection's byte stream as hyper sees it ([`WatchedStream`]): it tells the connection's clock
//! when bytes arrive and when writes stall, feeds every byte read on HTTP/1.1 to the framing
//! guard, replaces hyper's automatic answers to refused heads with ours and lingers at close
//! ([`Http1`]). It knows the proxy only through [`RefusedHead`].

use super::conn::ConnClock;
use super::guard::Guard;
use bytes::Bytes;
use http::StatusCode;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The answer to a request head that hyper's parser refused with `status` (400, 414, 431)
/// before it became a request: the bytes of a whole response, written instead of hyper's
/// empty-bodied one, whose `date` line is passed on.
pub(crate) trait RefusedHead: Send + Sync {
    fn answer(&self, status: StatusCode, date_line: Option<&[u8]>) -> Vec<u8>;
}

/// What an HTTP/1.1 connection's stream adds to hyper's handling, on the way out.
///
/// **Refused heads.** hyper answers a request head its parser refuses (400 malformed, 414
/// target too long, 431 head too large) with an empty-bodied response of its own that no
/// setting changes. That answer is recognised on its way out and replaced with the proxy's JSON
/// error, counted and logged like any other response. Recognised safely: hyper writes such an
/// answer only with no response in progress, and writes nothing else on its own. So a write
/// that comes when no request has begun since the last completed flush with nothing in flight
/// can only be hyper's automatic answer; it must also have exactly that answer's shape (status
/// line, `content-length: 0`, `date`).
///
/// **Lingering close.** When hyper closes a connection whose client is still sending (a 413 in
/// the middle of a body, a refused head: the framing guard is mid-message), closing the socket
/// with unread bytes would make the kernel answer them with a reset, and a reset can destroy
/// the response before the client reads it. So the write side is shut first, and what the client still sends is read and
/// dropped until it closes too, for at most [`LINGER_TIME`] and [`LINGER_BYTES`] (nginx's
/// `lingering_close`).
pub(crate) struct Http1 {
    /// Answers a refused head (the proxy's JSON error, counted and logged).
    refused: Box<dyn RefusedHead>,
    /// Requests begun (`ConnClock::served`) at the last completed flush with none in flight.
    idle_flush_at: Option<u64>,
    /// The replacement while it is written: its bytes and how many went out.
    replacement: Option<(Vec<u8>, usize)>,
    /// The client closed its side: nothing to linger for.
    read_eof: bool,
    /// After the write side is shut: until when, and how many more bytes, to read and drop.
    linger: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
}

/// How long a closing connection reads and drops what its client still sends.
const LINGER_TIME: Duration = Duration::from_secs(2);

/// How much it reads and drops at most.
const LINGER_BYTES: usize = 8 << 20;

impl Http1 {
    pub(crate) fn new(refused: Box<dyn RefusedHead>) -> Box<Self> {
        Box::new(Self {
            refused,
            idle_flush_at: Some(0),
            replacement: None,
            read_eof: false,
            linger: None,
        })
    }
}

/// The status and `date` line of hyper's automatic answer to a refused head, if `out` is one.
fn automatic_answer(out: &[u8]) -> Option<(StatusCode, Option<&[u8]>)> {
    if out.len() > 256 || !out.ends_with(b"\r\n\r\n") {
        return None;
    }
    let status = match out.get(..13)? {
        b"HTTP/1.1 400 " => StatusCode::BAD_REQUEST,
        b"HTTP/1.1 414 " => StatusCode::URI_TOO_LONG,
        b"HTTP/1.1 431 " => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        _ => return None,
    };
    // hyper 1: `connection: close`, `content-length: 0`, `date: …`.
    let mut date = None;
    let mut empty = false;
    for line in out[..out.len() - 2]
        .split_inclusive(|b| *b == b'\n')
        .skip(1)
    {
        if line.eq_ignore_ascii_case(b"content-length: 0\r\n") {
            empty = true;
        } else if line.len() > 6 && line[..6].eq_ignore_ascii_case(b"date: ") {
            date = Some(line);
        } else if !line.eq_ignore_ascii_case(b"connection: close\r\n") {
            return None;
        }
    }
    empty.then_some((status, date))
}

pin_project_lite::pin_project! {
    /// A connection's stream as hyper sees it: tells the clock when bytes arrive and when
    /// writes stall, and on HTTP/1.1 feeds every byte read to the framing guard too and
    /// replaces hyper's automatic answers to refused heads and lingers at close ([`Http1`]).
    pub(crate) struct WatchedStream<S> {
        #[pin]
        inner: S,
        clock: Arc<ConnClock>,
        framing: Option<Arc<Guard>>,
        http1: Option<Box<Http1>>,
        // Bytes read while the connection was parked, handed to the next reader first; the
        // clock and the framing guard have seen them already.
        unread: Bytes,
    }
}

impl<S> WatchedStream<S> {
    pub(crate) fn new(
        inner: S,
        clock: Arc<ConnClock>,
        framing: Option<Arc<Guard>>,
        http1: Option<Box<Http1>>,
    ) -> Self {
        Self {
            inner,
            clock,
            framing,
            http1,
            unread: Bytes::new(),
        }
    }

    /// Gives `bytes` to the next read, before anything from the stream.
    pub(crate) fn unread(&mut self, bytes: Bytes) {
        self.unread = bytes;
    }
}

impl<S: AsyncRead> AsyncRead for WatchedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        if !this.unread.is_empty() {
            let n = this.unread.len().min(buf.remaining());
            buf.put_slice(&this.unread.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = this.inner.poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) {
            if buf.filled().len() > before {
                this.clock.note_read();
                if let Some(g) = this.framing {
                    g.feed(&buf.filled()[before..]);
                }
            } else if let Some(h1) = this.http1.as_deref_mut() {
                h1.read_eof = buf.remaining() > 0;
            }
        }
        r
    }
}

impl<S> WatchedStream<S> {
    fn note_write(clock: &ConnClock, r: &Poll<std::io::Result<usize>>) {
        match r {
            Poll::Pending => clock.note_write_pending(),
            Poll::Ready(r) => clock.note_write_progress(r.as_ref().is_ok_and(|n| *n > 0)),
        }
    }

    fn note_flush(clock: &ConnClock, r: &Poll<std::io::Result<()>>) {
        match r {
            Poll::Pending => clock.note_write_pending(),
            Poll::Ready(_) => clock.note_write_progress(false),
        }
    }
}

impl<S: AsyncRead + AsyncWrite> WatchedStream<S> {
    /// Writes the replacement of hyper's automatic answer when `out` (everything hyper is
    /// writing now, `len` bytes) is one; `None` to write `out` as it is. Once replaced, the
    /// connection ends: anything hyper might still write is dropped.
    fn poll_replace(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: impl FnOnce() -> Option<Vec<u8>>,
        len: usize,
    ) -> Option<Poll<std::io::Result<usize>>> {
        let this = self.project();
        let r = this.http1.as_deref_mut()?;
        if r.replacement.is_none() {
            let clock = &this.clock;
            if r.idle_flush_at != Some(clock.served()) || clock.in_flight() > 0 {
                return None;
            }
            let out = out()?;
            let (status, date) = automatic_answer(&out)?;
            r.replacement = Some((r.refused.answer(status, date), 0));
        }
        let (bytes, sent) = r.replacement.as_mut()?;
        let mut inner = this.inner;
        while *sent < bytes.len() {
            let w = inner.as_mut().poll_write(cx, &bytes[*sent..]);
            Self::note_write(this.clock, &w);
            match w {
                Poll::Ready(Ok(0)) => {
                    return Some(Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(n)) => *sent += n,
                Poll::Ready(Err(e)) => return Some(Poll::Ready(Err(e))),
                Poll::Pending => return Some(Poll::Pending),
            }
        }
        Some(Poll::Ready(Ok(len)))
    }
}

impl<S: AsyncRead + AsyncWrite> AsyncWrite for WatchedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(r) = self
            .as_mut()
            .poll_replace(cx, || Some(buf.to_vec()), buf.len())
        {
            return r;
        }
        let this = self.project();
        let r = this.inner.poll_write(cx, buf);
        Self::note_write(this.clock, &r);
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let r = this.inner.poll_flush(cx);
        Self::note_flush(this.clock, &r);
        if let (Some(h1), Poll::Ready(Ok(()))) = (this.http1.as_deref_mut(), &r) {
            let clock = &this.clock;
            h1.idle_flush_at = (clock.in_flight() == 0).then(|| clock.served());
            clock.note_flushed();
        }
        r
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let mut inner = this.inner;
        let Some(h1) = this.http1.as_deref_mut() else {
            return inner.poll_shutdown(cx);
        };
        if h1.linger.is_none() {
            std::task::ready!(inner.as_mut().poll_shutdown(cx))?;
            // Between requests (an idle connection drained or timed out) the client is not
            // sending: nothing to linger for.
            let sending = this.framing.as_ref().is_some_and(|g| g.mid_message());
            if h1.read_eof || !sending {
                return Poll::Ready(Ok(()));
            }
            h1.linger = Some((Box::pin(tokio::time::sleep(LINGER_TIME)), LINGER_BYTES));
        }
        let Some((until, left)) = h1.linger.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let mut scratch = [0u8; 8192];
        loop {
            if *left == 0 || until.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut dropped = ReadBuf::new(&mut scratch);
            match inner.as_mut().poll_read(cx, &mut dropped) {
                Poll::Ready(Ok(())) if !dropped.filled().is_empty() => {
                    *left = left.saturating_sub(dropped.filled().len());
                }
                // The client closed too, or the connection broke: nothing left to protect.
                Poll::Ready(_) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let len = bufs.iter().map(|b| b.len()).sum();
        let whole = || (len <= 256).then(|| bufs.iter().flat_map(|b| b.iter().copied()).collect());
        if let Some(r) = self.as_mut().poll_replace(cx, whole, len) {
            return r;
        }
        let this = self.project();
        let r = this.inner.poll_write_vectored(cx, bufs);
        Self::note_write(this.clock, &r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hyper_s_own_empty_answers_to_refused_heads_are_recognised() {
        let date = "date: Mon, 30 Nov 2026 00:45:06 GMT\r\n";
        let hyper = format!(
            "HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\
             content-length: 0\r\n{date}\r\n"
        );
        assert_eq!(
            automatic_answer(hyper.as_bytes()),
            Some((
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                Some(date.as_bytes())
            ))
        );
        for other in [
            // A response with a body, another status, another header, or not all of it.
            format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n{date}\r\n{{}}"),
            format!("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n{date}\r\n"),
            format!("HTTP/1.1 400 Bad Request\r\nvia: 1.1 x\r\ncontent-length: 0\r\n{date}\r\n"),
            format!("HTTP/1.1 400 Bad Request\r\n{date}\r\n"),
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n".to_owned(),
            format!("HTTP/1.0 400 Bad Request\r\ncontent-length: 0\r\n{date}\r\n"),
        ] {
            assert_eq!(automatic_answer(other.as_bytes()), None, "{other:?}");
        }
    }
}
