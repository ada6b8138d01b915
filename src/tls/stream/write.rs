//! The write side of [`ServerStream`]: plaintext sealed into records (in the thread's buffer,
//! sent from there), vectored writes gathered, what the socket does not take kept, and
//! close_notify on shutdown.

use super::{finish, ServerStream, Step, GATHER_ON_STACK};
use rustls::server::ServerConnectionData;
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, InsufficientSizeError, WriteTraffic,
};
use std::cell::RefCell;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Plaintext for one write: `head` (short, possibly empty) is sealed as a record of its own,
/// then `data`.
#[derive(Clone, Copy)]
pub(super) struct Parts<'a> {
    pub(super) head: &'a [u8],
    pub(super) data: &'a [u8],
}

impl<'a> Parts<'a> {
    fn one(data: &'a [u8]) -> Self {
        Self { head: &[], data }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> ServerStream<S> {
    /// Writes `outgoing` to the socket; frees it once all is written.
    pub(super) fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_write_all(&mut self.io, cx, &mut self.outgoing, &mut self.sent)
    }

    fn poll_write_plain(
        &mut self,
        cx: &mut Context<'_>,
        data: Parts<'_>,
    ) -> Poll<io::Result<usize>> {
        loop {
            // One write's records at a time: the caller waits while the socket is full.
            if self.sent < self.outgoing.len() {
                ready!(self.poll_send(cx))?;
            }
            if self.close_queued {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            match self.step(cx, None, Some(data))? {
                Step::Again => {}
                Step::CanWrite { wrote } => {
                    // Sent at once (one system call, as tokio-rustls); if the socket is full,
                    // the next write or flush waits for it.
                    if let Poll::Ready(Err(e)) = self.poll_send(cx) {
                        return Poll::Ready(Err(e));
                    }
                    return Poll::Ready(Ok(wrote));
                }
                // A handshake record could not be sent yet: the socket wakes us.
                Step::WriteBlocked => return Poll::Pending,
                // Not after the handshake: rustls allows application data then.
                Step::NeedRead => {
                    return Poll::Ready(Err(io::Error::other("TLS handshake not done")))
                }
            }
        }
    }
}

/// Appends to `out` what `fill` writes into room after its end: `room` bytes first, then the
/// size rustls asks for. `fill` gives the size written, or `Err(Ok(size needed))`.
pub(super) fn grow(
    out: &mut Vec<u8>,
    mut room: usize,
    mut fill: impl FnMut(&mut [u8]) -> Result<usize, Result<usize, io::Error>>,
) -> io::Result<()> {
    let at = out.len();
    loop {
        out.resize(at + room, 0);
        match fill(&mut out[at..]) {
            Ok(n) => {
                out.truncate(at + n);
                return Ok(());
            }
            Err(Ok(needed)) if needed > room => room = needed,
            Err(Ok(_)) => {
                out.truncate(at);
                return Err(io::Error::other("TLS buffer sizing"));
            }
            Err(Err(e)) => {
                out.truncate(at);
                return Err(e);
            }
        }
    }
}

thread_local! {
    /// Where writes are sealed before they are sent: one buffer per thread, kept at the largest
    /// write's size (at most [`MAX_WRITE`] and its records' overhead, 70 KiB), so that a write
    /// costs no allocation, zeroing or page fault; a connection keeps only what its socket did
    /// not take at once.
    pub(super) static SEAL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Encrypts `parts` one after the other into the thread's [`SEAL`] buffer and writes their
/// records to `io` at once; what the socket does not take now goes to `outgoing` (empty on
/// entry). `room`: the size expected.
pub(super) fn seal_and_send<S: AsyncWrite + Unpin>(
    traffic: &mut WriteTraffic<'_, ServerConnectionData>,
    parts: [&[u8]; 2],
    room: usize,
    io: &mut S,
    cx: &mut Context<'_>,
    outgoing: &mut Vec<u8>,
    sent: &mut usize,
) -> io::Result<()> {
    // A socket whose `poll_write` wrote through another stream of this thread (TLS in TLS, a
    // wrapper) would find the buffer borrowed: that write seals into a buffer of its own.
    let mut seal = |buf: &mut Vec<u8>| {
        if buf.len() < room {
            buf.resize(room, 0);
        }
        let mut len = 0;
        for part in parts.into_iter().filter(|p| !p.is_empty()) {
            loop {
                match traffic.encrypt(part, &mut buf[len..]) {
                    Ok(n) => {
                        len += n;
                        break;
                    }
                    Err(e) => match encrypt_size(e)? {
                        needed if needed > buf.len() - len => buf.resize(len + needed, 0),
                        _ => return Err(io::Error::other("TLS buffer sizing")),
                    },
                }
            }
        }
        send_or_keep(io, cx, &buf[..len], outgoing, sent)
    };
    match SEAL.try_with(|cell| cell.try_borrow_mut().ok().map(|mut buf| seal(&mut buf))) {
        Ok(Some(sealed)) => sealed,
        // Borrowed (re-entered) or gone (a thread's destructors): a buffer of its own.
        Ok(None) | Err(_) => seal(&mut Vec::new()),
    }
}

pub(super) fn encode_size(e: EncodeError) -> Result<usize, io::Error> {
    match e {
        EncodeError::InsufficientSize(InsufficientSizeError { required_size }) => Ok(required_size),
        e => Err(io::Error::other(e.to_string())),
    }
}

pub(super) fn encrypt_size(e: EncryptError) -> Result<usize, io::Error> {
    match e {
        EncryptError::InsufficientSize(InsufficientSizeError { required_size }) => {
            Ok(required_size)
        }
        e => Err(io::Error::other(e.to_string())),
    }
}

/// Writes `records` to `io` as far as the socket takes them now, and keeps the rest in `out`
/// (empty on entry) for [`poll_write_all`]. A socket that is full registers the task's wake-up.
fn send_or_keep<S: AsyncWrite + Unpin>(
    io: &mut S,
    cx: &mut Context<'_>,
    records: &[u8],
    out: &mut Vec<u8>,
    sent: &mut usize,
) -> io::Result<()> {
    let mut at = 0;
    while at < records.len() {
        match Pin::new(&mut *io).poll_write(cx, &records[at..]) {
            Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(k)) => at += k,
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => break,
        }
    }
    out.extend_from_slice(&records[at..]);
    *sent = 0;
    Ok(())
}

/// Writes `out[*sent..]` to `io`; once all of it is written, frees `out`.
pub(super) fn poll_write_all<S: AsyncWrite + Unpin>(
    io: &mut S,
    cx: &mut Context<'_>,
    out: &mut Vec<u8>,
    sent: &mut usize,
) -> Poll<io::Result<()>> {
    while *sent < out.len() {
        let n = ready!(Pin::new(&mut *io).poll_write(cx, &out[*sent..]))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        *sent += n;
    }
    *out = Vec::new();
    *sent = 0;
    Poll::Ready(Ok(()))
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ServerStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = this.poll_write_plain(cx, Parts::one(data));
        this.check();
        r
    }

    /// Gathers the slices into one record where they fit (hyper writes a head and a body
    /// chunk together): a record per slice would cost an encryption and 22 bytes each.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut slices = bufs.iter().filter(|b| !b.is_empty());
        let Some(first) = slices.next() else {
            return Poll::Ready(Ok(0));
        };
        let Some(second) = slices.next().filter(|_| first.len() < 16384) else {
            return this.poll_write_plain(cx, Parts::one(first));
        };
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total <= GATHER_ON_STACK {
            // A response head with a small body (most of Ironic's answers): gathered on the
            // stack, no allocation.
            let mut stack = [MaybeUninit::<u8>::uninit(); GATHER_ON_STACK];
            let mut gathered = ReadBuf::uninit(&mut stack[..]);
            for b in bufs {
                gathered.put_slice(b);
            }
            return this.poll_write_plain(cx, Parts::one(gathered.filled()));
        }
        if first.len() <= GATHER_ON_STACK && second.len() >= 16384 {
            // A response head and a large body (a 64 KiB answer): the head is a record of its
            // own and the body is sealed from where it lies, in the same system call; gathered,
            // 16 KiB of the body would be copied and sent on their own.
            return this.poll_write_plain(
                cx,
                Parts {
                    head: first,
                    data: second,
                },
            );
        }
        let mut gathered = Vec::with_capacity(total.min(16384));
        for b in bufs {
            let n = b.len().min(gathered.capacity() - gathered.len());
            gathered.extend_from_slice(&b[..n]);
            if n < b.len() {
                break;
            }
        }
        this.poll_write_plain(cx, Parts::one(&gathered))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_queued && this.failed.is_none() {
            ready!(this.poll_send(cx))?;
            // Whole records a read left in `incoming` (it stops at the first that gives
            // plaintext): rustls allows close_notify only in its write state, which it reaches
            // once they are processed; their plaintext goes to `plain` for later reads.
            // tokio-rustls sends close_notify whatever it has not read (found by the
            // `tls_differential` fuzz target: with such records, the socket was shut without
            // close_notify, and the client saw a truncation).
            while !this.incoming.is_empty() && this.failed.is_none() {
                match this.step(cx, None, None) {
                    Ok(Step::Again) => {}
                    Ok(Step::WriteBlocked) => return Poll::Pending,
                    // A part of a record is left, or an error (sent on by the next call).
                    Ok(Step::NeedRead | Step::CanWrite { .. }) | Err(_) => break,
                }
            }
        }
        if !this.close_queued && this.failed.is_none() {
            // rustls' state changes here, outside `process_records`.
            this.last_step_ready = false;
            let Self {
                conn,
                incoming,
                outgoing,
                failed,
                ..
            } = &mut *this;
            let status = conn.process_tls_records(incoming);
            let discard = status.discard;
            // In any other state (a broken session) the socket is shut without close_notify,
            // as if it were closed.
            match status.state {
                Ok(ConnectionState::WriteTraffic(mut traffic)) => {
                    let _ = grow(outgoing, 64, |out| {
                        traffic.queue_close_notify(out).map_err(encrypt_size)
                    });
                }
                // rustls failed on records that arrived (and queued its fatal alert): it must
                // not see records again, a later read included (found by the `tls_stream` fuzz
                // target: rustls' own `debug_assert!(!self.sent_fatal_alert)` fired).
                Err(e) => *failed = Some(e),
                Ok(_) => {}
            }
            finish(incoming, discard, Ok(Step::Again))?;
            this.close_queued = true;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
