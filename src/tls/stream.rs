//! A TLS server stream whose buffers exist only while data flows.
//!
//! tokio-rustls drives rustls' buffered `ServerConnection`, which keeps a 4 KiB receive buffer
//! for every connection from its first read to its close (rustls 0.23 `DeframerVecBuffer`
//! never shrinks below 4 KiB), idle or not: a third of what an idle keep-alive connection
//! holds (massif, 1,000 parked connections: 4,047 of about 10,700 bytes each). rustls'
//! unbuffered API leaves the buffers to the caller, so this stream owns three:
//!
//! - `incoming`: ciphertext read from the socket and not yet processed. Empty (no allocation)
//!   between records: a read into an empty buffer lands on the stack, is decrypted there, and
//!   only what rustls cannot process yet (part of a record) is copied to the heap, so a
//!   connection waiting for its next request holds nothing and a small request allocates none.
//! - `plain`: decrypted bytes that did not fit the reader's buffer; usually never allocated
//!   (hyper reads into 8 KiB or more, a record carries at most 16 KiB).
//! - `outgoing`: encrypted bytes not yet written, freed once flushed. A write is sealed into a
//!   buffer of the thread's (kept, at most 70 KiB per thread) and sent from there: `outgoing`
//!   holds only what the socket did not take at once, and handshake records. A vectored write
//!   of a response head and a small body is gathered on the stack into one record; a head
//!   followed by a body of 16 KiB or more is sealed as a record of its own and the body's
//!   records after it, sent in the same system call, so the body is never copied to be gathered.
//!
//! Written by hand because no maintained crate offers it: tokio-rustls wraps only the buffered
//! API. The protocol itself (records, keys, alerts, close_notify) stays rustls'; this module
//! moves bytes between the socket and rustls' states. Semantics as tokio-rustls: `poll_read`
//! gives end of stream after the peer's close_notify or the socket's end, `poll_shutdown`
//! sends close_notify and shuts the socket's write side.

use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, InsufficientSizeError, WriteTraffic,
};
use rustls::ServerConfig;
use std::cell::RefCell;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A socket read into an empty `incoming` lands here first.
const FIRST_READ: usize = 4096;

/// Vectored writes of up to this many bytes in all are gathered on the stack.
const GATHER_ON_STACK: usize = 4096;

/// The most plaintext encrypted per `poll_write`: a response head gathered on the stack and
/// four full records after it, so that a 64 KiB body goes out with its head in one system call
/// (with four records only, the head's bytes pushed the body's last ones into a second write,
/// and a second wake-up of the client).
const MAX_WRITE: usize = GATHER_ON_STACK + 4 * 16384;

/// The most ciphertext held unprocessed: a handshake message of rustls' largest (64 KiB) split
/// over records, and the next record. A peer sending more without completing a message is cut.
const MAX_INCOMING: usize = 0xffff + 5 + 16384 + 2048;

/// Plaintext for one write: `head` (short, possibly empty) is sealed as a record of its own,
/// then `data`.
#[derive(Clone, Copy)]
struct Parts<'a> {
    head: &'a [u8],
    data: &'a [u8],
}

impl<'a> Parts<'a> {
    fn one(data: &'a [u8]) -> Self {
        Self { head: &[], data }
    }
}

/// TLS over `S`, server side, after [`accept`].
pub(crate) struct ServerStream<S> {
    io: S,
    conn: UnbufferedServerConnection,
    incoming: Vec<u8>,
    plain: Vec<u8>,
    /// How much of `plain` was read.
    plain_read: usize,
    outgoing: Vec<u8>,
    /// How much of `outgoing` was written.
    sent: usize,
    /// The peer sent close_notify, or the socket's read side ended.
    read_closed: bool,
    /// close_notify is in `outgoing` or sent.
    close_queued: bool,
    /// rustls failed (a bad record, an alert from the peer): nothing more is processed.
    failed: bool,
    /// rustls' last state was `ReadTraffic` (all of it taken) or `WriteTraffic`: asked again
    /// with no new bytes, it would say `WriteTraffic` (see [`ServerStream::quiet`]).
    settled: bool,
    /// Calls into rustls, for the test that counts them per keep-alive request.
    #[cfg(test)]
    calls: usize,
}

/// What processing the records in `incoming` led to.
enum Step {
    /// Something changed (plaintext delivered, a handshake record encoded or sent): look again.
    Again,
    /// Nothing to do until more bytes arrive from the peer.
    NeedRead,
    /// A handshake record waits for room in the socket (its waker is registered).
    WriteBlocked,
    /// Records processed; `wrote`: plaintext encrypted into `outgoing` (write requests only).
    CanWrite { wrote: usize },
}

/// Performs the TLS handshake on `io` with `config`, to its end: the client's certificate (if
/// any) is verified and the session tickets are queued. Errors carry rustls' error as their
/// inner error (`io::Error::get_ref`), as tokio-rustls' do; a closed socket is `UnexpectedEof`.
pub(crate) async fn accept<S>(config: Arc<ServerConfig>, io: S) -> io::Result<ServerStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let conn = UnbufferedServerConnection::new(config).map_err(invalid)?;
    let mut stream = ServerStream {
        io,
        conn,
        incoming: Vec::new(),
        plain: Vec::new(),
        plain_read: 0,
        outgoing: Vec::new(),
        sent: 0,
        read_closed: false,
        close_queued: false,
        failed: false,
        settled: false,
        #[cfg(test)]
        calls: 0,
    };
    std::future::poll_fn(|cx| stream.poll_handshake(cx)).await?;
    Ok(stream)
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl<S> ServerStream<S> {
    /// The TLS session: negotiated protocol, the client's certificates.
    pub(crate) fn session(&self) -> &UnbufferedServerConnection {
        &self.conn
    }

    /// Nothing for rustls to do until bytes arrive, so a read goes to the socket without asking
    /// it: it has not failed, its last state gave plaintext or room to write, it has every byte
    /// it was given (`incoming` empty), has queued no message since (processing a key update,
    /// or an encryption near the key's limit, queues one) and has none encoded but unsent
    /// (`outgoing` empty). rustls' loop (`process_tls_records`) would then find no plaintext,
    /// nothing to encode or transmit, no record and no close_notify edge, and answer
    /// `WriteTraffic`: that was three of a keep-alive request's five calls into rustls.
    fn quiet(&self) -> bool {
        self.settled
            && !self.failed
            && self.incoming.is_empty()
            && self.outgoing.is_empty()
            && !self.conn.wants_write()
    }

    /// Bytes held in this stream's buffers (for the tests of what an idle stream holds).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.incoming.capacity() + self.plain.capacity() + self.outgoing.capacity()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> ServerStream<S> {
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if !self.conn.is_handshaking() && self.sent == self.outgoing.len() {
                return Poll::Ready(Ok(()));
            }
            match self.step(cx, None, None) {
                Ok(Step::Again) => {}
                Ok(Step::WriteBlocked) => return Poll::Pending,
                Ok(Step::NeedRead | Step::CanWrite { .. }) if self.conn.is_handshaking() => {
                    if ready!(self.poll_fill(cx))? == 0 {
                        return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                    }
                }
                Ok(Step::NeedRead | Step::CanWrite { .. }) => {
                    ready!(self.poll_send(cx))?;
                }
                Err(e) => {
                    // rustls queued an alert telling the peer why: send it if the socket
                    // takes it now, then fail.
                    let _ = self.poll_alert(cx);
                    return Poll::Ready(Err(e));
                }
            }
        }
    }

    /// Encodes and sends the alert rustls queued after an error, if the socket takes it now.
    /// One call to rustls, which gives a queued record before it looks at any received one.
    fn poll_alert(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.conn.wants_write() {
            let Self {
                conn,
                incoming,
                outgoing,
                ..
            } = &mut *self;
            let status = conn.process_tls_records(incoming);
            if let Ok(ConnectionState::EncodeTlsData(mut record)) = status.state {
                let _ = grow(outgoing, 64, |out| record.encode(out).map_err(encode_size));
            }
        }
        self.poll_send(cx)
    }

    /// Processes the records in `incoming` up to rustls' next state and acts on it: plaintext
    /// goes to `read` (then to `plain`), handshake records are encoded into `outgoing` and
    /// sent, and `write` is encrypted when rustls allows application data.
    fn step(
        &mut self,
        cx: &mut Context<'_>,
        read: Option<&mut ReadBuf<'_>>,
        write: Option<Parts<'_>>,
    ) -> io::Result<Step> {
        let mut incoming = std::mem::take(&mut self.incoming);
        let (discard, step) = self.step_in(&mut incoming, cx, read, write);
        self.incoming = incoming;
        finish(&mut self.incoming, discard, step)
    }

    /// [`Self::step`] on records read into a buffer of the caller's (the stack) while
    /// `incoming` was empty: what rustls does not consume (part of a record) goes to
    /// `incoming`.
    fn step_on(
        &mut self,
        records: &mut [u8],
        cx: &mut Context<'_>,
        read: Option<&mut ReadBuf<'_>>,
    ) -> io::Result<Step> {
        debug_assert!(self.incoming.is_empty());
        let (discard, step) = self.step_in(records, cx, read, None);
        self.incoming
            .extend_from_slice(&records[discard.min(records.len())..]);
        step
    }

    /// The work of [`Self::step`] on `records`: how many of their bytes rustls is done with
    /// (the caller discards them, error or not), and the step.
    fn step_in(
        &mut self,
        records: &mut [u8],
        cx: &mut Context<'_>,
        mut read: Option<&mut ReadBuf<'_>>,
        write: Option<Parts<'_>>,
    ) -> (usize, io::Result<Step>) {
        #[cfg(test)]
        {
            self.calls += 1;
        }
        let Self {
            io,
            conn,
            plain,
            outgoing,
            sent,
            read_closed,
            failed,
            settled,
            ..
        } = self;
        *settled = false;
        if *failed {
            // rustls must not see the records again (it would fail on them twice).
            return (0, Err(io::Error::other("TLS session failed")));
        }
        let status = conn.process_tls_records(records);
        let mut discard = status.discard;
        let state = match status.state {
            Ok(state) => state,
            Err(e) => {
                *failed = true;
                return (discard, Err(invalid(e)));
            }
        };
        // Plaintext (all of it taken below, or the stream fails) or room to write: see `quiet`.
        *settled = matches!(
            state,
            ConnectionState::ReadTraffic(_) | ConnectionState::WriteTraffic(_)
        );
        let step = match state {
            ConnectionState::ReadTraffic(mut traffic) => {
                while let Some(record) = traffic.next_record() {
                    let record = match record {
                        Ok(record) => record,
                        Err(e) => {
                            *failed = true;
                            return (discard, Err(invalid(e)));
                        }
                    };
                    discard += record.discard;
                    let mut payload = record.payload;
                    if let Some(buf) = read.as_deref_mut().filter(|_| plain.is_empty()) {
                        let n = payload.len().min(buf.remaining());
                        buf.put_slice(&payload[..n]);
                        payload = &payload[n..];
                    }
                    plain.extend_from_slice(payload);
                }
                Step::Again
            }
            ConnectionState::EncodeTlsData(mut record) => {
                if let Err(e) = grow(outgoing, 512, |out| record.encode(out).map_err(encode_size)) {
                    return (discard, Err(e));
                }
                Step::Again
            }
            ConnectionState::TransmitTlsData(done) => {
                match poll_write_all(io, cx, outgoing, sent) {
                    Poll::Ready(Ok(())) => done.done(),
                    // Asked again once the socket takes more: rustls keeps the state.
                    Poll::Pending => return (discard, Ok(Step::WriteBlocked)),
                    Poll::Ready(Err(e)) => return (discard, Err(e)),
                }
                Step::Again
            }
            ConnectionState::WriteTraffic(mut traffic) => match write {
                Some(Parts { head, data }) if head.len() + data.len() > 0 => {
                    let parts = [head, &data[..data.len().min(MAX_WRITE - head.len())]];
                    let n = parts[0].len() + parts[1].len();
                    // Each record adds a header, a content type and a tag (22 bytes in TLS 1.3).
                    let room = n + (n / 16384 + 2) * 64;
                    let sealed = if outgoing.is_empty() {
                        // Sealed in the thread's buffer and sent from there; only what the
                        // socket does not take now is kept.
                        seal_and_send(&mut traffic, parts, room, io, cx, outgoing, sent)
                    } else {
                        // Behind records still queued (a key update's): after them.
                        parts.iter().filter(|p| !p.is_empty()).try_for_each(|part| {
                            grow(outgoing, room, |out| {
                                traffic.encrypt(part, out).map_err(encrypt_size)
                            })
                        })
                    };
                    if let Err(e) = sealed {
                        return (discard, Err(e));
                    }
                    Step::CanWrite { wrote: n }
                }
                _ => Step::CanWrite { wrote: 0 },
            },
            ConnectionState::BlockedHandshake => Step::NeedRead,
            // Edge-triggered; `Closed` follows our own close_notify, after which nothing is
            // written (`close_queued`).
            ConnectionState::PeerClosed | ConnectionState::Closed => {
                *read_closed = true;
                Step::Again
            }
            // Early data is never enabled (`max_early_data_size` is 0); anything else is a
            // state this rustls version added.
            _ => return (discard, Err(io::Error::other("unexpected TLS state"))),
        };
        (discard, Ok(step))
    }

    /// Reads from the socket into `incoming`: the rest of a started record, or whatever
    /// arrives into an empty buffer (on the stack first). Ready(0) at the socket's end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
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

    /// Writes `outgoing` to the socket; frees it once all is written.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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

/// Discards what rustls is done with, then gives `step`.
fn finish(incoming: &mut Vec<u8>, discard: usize, step: io::Result<Step>) -> io::Result<Step> {
    incoming.drain(..discard.min(incoming.len()));
    if incoming.is_empty() {
        // Nothing held between records.
        *incoming = Vec::new();
    }
    step
}

/// Appends to `out` what `fill` writes into room after its end: `room` bytes first, then the
/// size rustls asks for. `fill` gives the size written, or `Err(Ok(size needed))`.
fn grow(
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
    static SEAL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Encrypts `parts` one after the other into the thread's [`SEAL`] buffer and writes their
/// records to `io` at once; what the socket does not take now goes to `outgoing` (empty on
/// entry). `room`: the size expected.
fn seal_and_send<S: AsyncWrite + Unpin>(
    traffic: &mut WriteTraffic<'_, ServerConnectionData>,
    parts: [&[u8]; 2],
    room: usize,
    io: &mut S,
    cx: &mut Context<'_>,
    outgoing: &mut Vec<u8>,
    sent: &mut usize,
) -> io::Result<()> {
    SEAL.with_borrow_mut(|buf| {
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
    })
}

fn encode_size(e: EncodeError) -> Result<usize, io::Error> {
    match e {
        EncodeError::InsufficientSize(InsufficientSizeError { required_size }) => Ok(required_size),
        e => Err(io::Error::other(e.to_string())),
    }
}

fn encrypt_size(e: EncryptError) -> Result<usize, io::Error> {
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
fn poll_write_all<S: AsyncWrite + Unpin>(
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

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for ServerStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
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
            if this.read_closed || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            let step = if this.quiet() {
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
                        // The socket's end without close_notify: end of stream all the same
                        // (hyper's framing tells a cut message from a whole one).
                        this.read_closed = true;
                        continue;
                    }
                    match this.step_on(records.filled_mut(), cx, Some(buf))? {
                        Step::Again if buf.filled().len() > before => return Poll::Ready(Ok(())),
                        Step::WriteBlocked => return Poll::Pending,
                        _ => {}
                    }
                }
                Step::NeedRead | Step::CanWrite { .. } => {
                    if ready!(this.poll_fill(cx))? == 0 {
                        this.read_closed = true;
                    }
                }
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ServerStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_plain(cx, Parts::one(data))
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
        if !this.close_queued && !this.failed {
            ready!(this.poll_send(cx))?;
            // rustls' state changes here, outside `step_in`.
            this.settled = false;
            let Self {
                conn,
                incoming,
                outgoing,
                ..
            } = &mut *this;
            let status = conn.process_tls_records(incoming);
            let discard = status.discard;
            // In any other state (records not read yet, a broken session) the socket is shut
            // without close_notify, as if it were closed.
            if let Ok(ConnectionState::WriteTraffic(mut traffic)) = status.state {
                let _ = grow(outgoing, 64, |out| {
                    traffic.queue_close_notify(out).map_err(encrypt_size)
                });
            }
            finish(incoming, discard, Ok(Step::Again))?;
            this.close_queued = true;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    type Client = tokio_rustls::client::TlsStream<DuplexStream>;

    fn configs() -> (Arc<ServerConfig>, Arc<rustls::ClientConfig>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der().clone();
        let provider = Arc::new(crate::crypto::provider());
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
    }

    async fn pair(room: usize) -> (ServerStream<DuplexStream>, Client) {
        let (server, client) = configs();
        let (a, b) = tokio::io::duplex(room);
        let connector = tokio_rustls::TlsConnector::from(client);
        let name = ServerName::try_from("localhost").unwrap();
        let (s, c) = tokio::join!(accept(server, a), connector.connect(name, b));
        (s.unwrap(), c.unwrap())
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    async fn read_all(client: &mut Client) -> Vec<u8> {
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        got
    }

    /// Compares without printing megabytes on failure.
    fn assert_same(got: &[u8], expected: &[u8]) {
        assert!(
            got == expected,
            "{} bytes, expected {}",
            got.len(),
            expected.len()
        );
    }

    #[tokio::test]
    async fn data_crosses_both_ways_whole_and_an_idle_stream_holds_no_buffer() {
        // A small pipe: writes meet a full socket, records arrive in pieces.
        let (mut server, mut client) = pair(1000).await;
        let up = pattern(300_000, 7);
        let down = pattern(1_000_000, 9);
        let (got_up, got_down) = tokio::join!(
            async {
                let mut got = vec![0u8; up.len()];
                // 100-byte reads: most of every record waits in `plain`.
                for chunk in got.chunks_mut(100) {
                    server.read_exact(chunk).await.unwrap();
                }
                server.write_all(&down).await.unwrap();
                server.flush().await.unwrap();
                got
            },
            async {
                client.write_all(&up).await.unwrap();
                client.flush().await.unwrap();
                let mut got = vec![0u8; down.len()];
                client.read_exact(&mut got).await.unwrap();
                got
            }
        );
        assert!(got_up == up, "the server read what the client wrote");
        assert!(got_down == down, "the client read what the server wrote");
        assert_eq!(server.held(), 0, "no buffer held once every byte moved");
    }

    #[tokio::test]
    async fn vectored_writes_arrive_in_order() {
        let (mut server, mut client) = pair(64 * 1024).await;
        let big = pattern(40_000, 3);
        let bufs = [
            io::IoSlice::new(b"HTTP/1.1 200 OK\r\n\r\n"),
            io::IoSlice::new(b""),
            io::IoSlice::new(b"hello"),
            io::IoSlice::new(&big),
        ];
        let mut expected = b"HTTP/1.1 200 OK\r\n\r\nhello".to_vec();
        expected.extend_from_slice(&big);
        let (_, got) = tokio::join!(
            async {
                let mut copy = bufs;
                let mut bufs = &mut copy[..];
                while !bufs.is_empty() {
                    let n = server.write_vectored(bufs).await.unwrap();
                    assert!(n > 0);
                    io::IoSlice::advance_slices(&mut bufs, n);
                }
                server.flush().await.unwrap();
            },
            async {
                let mut got = vec![0u8; expected.len()];
                client.read_exact(&mut got).await.unwrap();
                got
            }
        );
        assert!(got == expected);
    }

    #[tokio::test]
    async fn small_vectored_writes_go_whole_at_the_stack_limit_and_past_it() {
        let (mut server, mut client) = pair(64 * 1024).await;
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n";
        let mut expected = Vec::new();
        let (_, got) = tokio::join!(
            async {
                // Totals: a head and a small body; exactly the stack's size; one byte over.
                for (i, body_len) in [
                    5,
                    GATHER_ON_STACK - head.len(),
                    GATHER_ON_STACK - head.len() + 1,
                ]
                .into_iter()
                .enumerate()
                {
                    let body = pattern(body_len, i as u8);
                    let bufs = [io::IoSlice::new(head), io::IoSlice::new(&body)];
                    let n = server.write_vectored(&bufs).await.unwrap();
                    assert_eq!(n, head.len() + body_len, "the whole of a small gather");
                    expected.extend_from_slice(head);
                    expected.extend_from_slice(&body);
                }
                server.flush().await.unwrap();
                server.shutdown().await.unwrap();
            },
            read_all(&mut client)
        );
        assert_same(&got, &expected);
    }

    #[tokio::test]
    async fn a_head_and_a_large_body_are_taken_in_one_write() {
        // Over a roomy pipe and over one that takes 1,000 bytes at a time (the rest of the
        // records waits in `outgoing`): the head and as much of the body as one write seals go
        // in one call, and the client reads them whole and in order.
        for room in [256 * 1024, 1000] {
            let (mut server, mut client) = pair(room).await;
            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 70000\r\n\r\n";
            let body = pattern(70_000, 5);
            let mut expected = head.to_vec();
            expected.extend_from_slice(&body);
            let (_, got) = tokio::join!(
                async {
                    let bufs = [io::IoSlice::new(head), io::IoSlice::new(&body)];
                    let n = server.write_vectored(&bufs).await.unwrap();
                    assert_eq!(n, MAX_WRITE, "the head and the body up to one write's most");
                    server.write_all(&body[n - head.len()..]).await.unwrap();
                    server.flush().await.unwrap();
                    assert_eq!(server.held(), 0, "nothing kept once flushed");
                    server.shutdown().await.unwrap();
                },
                read_all(&mut client)
            );
            assert_same(&got, &expected);
        }
    }

    #[tokio::test]
    async fn writes_sealed_in_the_thread_buffer_survive_a_full_socket_and_another_stream() {
        // Two streams on one thread share its seal buffer, each over a 1,000-byte pipe: a
        // write's records are partly taken, or not at all, and the rest waits in that stream's
        // `outgoing` while the other stream seals its own writes in the same buffer. Sizes
        // around one record and past the most sealed per write (four records).
        async fn stream_through(seed: u8) {
            let (mut server, mut client) = pair(1000).await;
            let sizes = [
                1, 150, 999, 1000, 1001, 4096, 4097, 16384, 16385, 40000, 65536, 70000,
            ];
            let writes: Vec<Vec<u8>> = (0..60)
                .map(|i| pattern(sizes[i % sizes.len()], seed.wrapping_add(i as u8)))
                .collect();
            let expected = writes.concat();
            let (_, got) = tokio::join!(
                async {
                    for w in &writes {
                        server.write_all(w).await.unwrap();
                    }
                    server.flush().await.unwrap();
                    assert_eq!(server.held(), 0, "nothing kept once flushed");
                    server.shutdown().await.unwrap();
                },
                read_all(&mut client)
            );
            assert_same(&got, &expected);
        }
        tokio::join!(stream_through(1), stream_through(101));
    }

    #[tokio::test]
    async fn small_records_read_on_the_stack_arrive_whole_across_key_updates() {
        // Small records, several to a socket read and some split between two, with key updates
        // from the client among them (each asks the server for one in return, encoded while it
        // reads). Read with buffers of assorted sizes, so plaintext also waits in `plain`.
        let (mut server, mut client) = pair(64 * 1024).await;
        let writes: Vec<Vec<u8>> = (0..300)
            .map(|i| pattern([1, 90, 700, 1500, 2999][i % 5], i as u8))
            .collect();
        let expected = writes.concat();
        let (got, ()) = tokio::join!(
            async {
                let mut got = Vec::new();
                let mut sizes = [7, 100, 4096, 16384, 300].into_iter().cycle();
                while got.len() < expected.len() {
                    let mut buf = vec![0u8; sizes.next().unwrap()];
                    let n = server.read(&mut buf).await.unwrap();
                    assert!(n > 0, "end of stream after {} bytes", got.len());
                    got.extend_from_slice(&buf[..n]);
                }
                server.write_all(b"done").await.unwrap();
                server.flush().await.unwrap();
                assert_eq!(server.held(), 0, "nothing kept between records");
                got
            },
            async {
                for (i, w) in writes.iter().enumerate() {
                    if i % 25 == 24 {
                        client.get_mut().1.refresh_traffic_keys().unwrap();
                    }
                    client.write_all(w).await.unwrap();
                    if i % 3 == 0 {
                        client.flush().await.unwrap();
                    }
                }
                client.flush().await.unwrap();
                let mut answer = [0u8; 4];
                client.read_exact(&mut answer).await.unwrap();
                assert_eq!(&answer, b"done");
            }
        );
        assert_same(&got, &expected);
    }

    /// Polls one read: true when it is pending (nothing to read yet).
    async fn nothing_to_read(server: &mut ServerStream<DuplexStream>) -> bool {
        let mut room = [0u8; 64];
        std::future::poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut room);
            Poll::Ready(Pin::new(&mut *server).poll_read(cx, &mut buf).is_pending())
        })
        .await
    }

    /// One request in and one answer out, with a look for the next request after each.
    async fn keep_alive_exchange(server: &mut ServerStream<DuplexStream>, client: &mut Client) {
        let request = b"GET /v1/nodes HTTP/1.1\r\nHost: localhost\r\n\r\n";
        let answer = pattern(200, 3);
        client.write_all(request).await.unwrap();
        client.flush().await.unwrap();
        let mut buf = [0u8; 64];
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], request);
        assert!(nothing_to_read(server).await);
        server.write_all(&answer).await.unwrap();
        server.flush().await.unwrap();
        assert!(nothing_to_read(server).await);
        let mut got = vec![0u8; answer.len()];
        client.read_exact(&mut got).await.unwrap();
        assert_same(&got, &answer);
    }

    #[tokio::test]
    async fn a_keep_alive_exchange_asks_rustls_once_each_way() {
        // A keep-alive connection as hyper drives it: read a request, look for the next one
        // (none yet), write the answer, look again. rustls decrypts the request and encrypts
        // the answer; the looks in between go to the socket without asking it (five calls
        // into rustls per exchange before `quiet`).
        let (mut server, mut client) = pair(64 * 1024).await;
        keep_alive_exchange(&mut server, &mut client).await;
        let before = server.calls;
        for _ in 0..20 {
            keep_alive_exchange(&mut server, &mut client).await;
        }
        assert_eq!(
            server.calls - before,
            40,
            "calls into rustls for 20 exchanges"
        );
        // A key update from the client while the stream is quiet: the request after it is
        // read under the new key, and the answer (after rustls' own key update, which it
        // sends ahead of it) is read by the client.
        for _ in 0..3 {
            client.get_mut().1.refresh_traffic_keys().unwrap();
            keep_alive_exchange(&mut server, &mut client).await;
        }
        assert_eq!(server.held(), 0, "nothing kept between exchanges");
    }

    #[tokio::test]
    async fn close_notify_ends_each_side_cleanly() {
        let (mut server, mut client) = pair(64 * 1024).await;
        client.write_all(b"last words").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last words");
        server.write_all(b"goodbye").await.unwrap();
        server.shutdown().await.unwrap();
        let mut got = Vec::new();
        // tokio-rustls gives a clean end only after close_notify.
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"goodbye");
        assert!(
            server.write_all(b"more").await.is_err(),
            "no write after close_notify"
        );
    }

    #[tokio::test]
    async fn a_socket_that_ends_mid_handshake_is_unexpected_eof() {
        let (server, _) = configs();
        let (a, mut b) = tokio::io::duplex(4096);
        // A record header announcing more than arrives, then the end.
        b.write_all(&[0x16, 0x03, 0x01, 0x01, 0x00, 0x01])
            .await
            .unwrap();
        drop(b);
        let err = accept(server, a).await.err().expect("no handshake");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn plaintext_is_a_rustls_error_and_gets_no_answer_but_an_alert() {
        let (server, _) = configs();
        let (a, mut b) = tokio::io::duplex(4096);
        b.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let err = accept(server, a).await.err().expect("no handshake");
        let inner = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>());
        assert!(inner.is_some(), "rustls' error inside: {err}");
        let mut answer = Vec::new();
        b.read_to_end(&mut answer).await.unwrap();
        // One fatal alert record (RFC 8446 §6): content type 21, TLS 1.2 framing, two bytes of
        // alert, level 2 (fatal).
        assert!(
            answer.len() == 7 && answer[..5] == [0x15, 3, 3, 0, 2] && answer[5] == 2,
            "a fatal alert record, not {answer:?}"
        );
    }

    #[tokio::test]
    async fn a_peer_that_never_completes_a_message_is_cut() {
        let (server, _) = configs();
        let (a, mut b) = tokio::io::duplex(256 * 1024);
        let accepting = tokio::spawn(accept(server, a));
        // Handshake records whose message claims 16 MB: joined, never complete.
        let mut flight = vec![0x16, 0x03, 0x03, 0x40, 0x00, 0x01, 0xff, 0xff, 0xff];
        flight.resize(5 + 0x4000, 0);
        let _ = b.write_all(&flight).await;
        let mut more = vec![0x16, 0x03, 0x03, 0x40, 0x00];
        more.resize(5 + 0x4000, 0);
        for _ in 0..8 {
            if b.write_all(&more).await.is_err() {
                break;
            }
        }
        let err = accepting.await.unwrap().err().expect("no handshake");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }

    #[tokio::test]
    async fn a_forged_record_after_the_handshake_fails_the_stream_and_nothing_after_panics() {
        let (mut server, client) = pair(64 * 1024).await;
        let (mut raw, _) = client.into_inner();
        // An application-data record whose tag cannot verify.
        let mut forged = vec![0x17, 0x03, 0x03, 0x00, 0x40];
        forged.resize(5 + 0x40, 0xab);
        raw.write_all(&forged).await.unwrap();
        let mut buf = [0u8; 64];
        let err = server
            .read(&mut buf)
            .await
            .expect_err("a forged record is an error");
        assert!(
            err.get_ref().is_some_and(|e| e.is::<rustls::Error>()),
            "{err}"
        );
        // More bytes, another read, a write and the shutdown: errors or nothing, no panic
        // (rustls must not see the same records twice).
        raw.write_all(&forged).await.unwrap();
        assert!(server.read(&mut buf).await.is_err());
        assert!(server.write_all(b"x").await.is_err());
        let _ = server.shutdown().await;
    }
}
