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
//! moves bytes between the socket and rustls' states. Semantics as tokio-rustls 0.26 over
//! rustls 0.23:
//!
//! - `poll_read` gives every plaintext byte received, then end of stream (`Ok` with nothing)
//!   after the peer's close_notify;
//! - a socket that ends without close_notify (a truncation: after whole records, mid-record or
//!   mid-handshake) is an `UnexpectedEof` error once the plaintext before it is read, on every
//!   read from then on, as rustls' `Reader` reports it through tokio-rustls. hyper's server
//!   treats a read error on an idle connection as the client's close, and a cut message as an
//!   incomplete one, so a client that skips close_notify between requests ends no differently;
//! - a record rustls refuses fails the call that processed it with rustls' error
//!   (`InvalidData`, rustls' error inside), rustls' alert is sent, and every later read or
//!   write fails with the same error. The call may be a write where tokio-rustls would fail the
//!   next read: rustls' unbuffered API processes the records received so far before it allows
//!   a write, its buffered one does not;
//! - `poll_shutdown` sends close_notify and shuts the socket's write side.
//!
//! The invariants the code relies on are checked with `debug_assert!` at each poll's end
//! ([`ServerStream::check`]).

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::ConnectionState;
use rustls::ServerConfig;
use std::io;
use std::sync::Arc;
use write::{encode_size, encrypt_size, grow, poll_write_all, seal_and_send, Parts};

mod read;
mod write;
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

/// TLS over `S`, server side, after [`accept`].
pub struct ServerStream<S> {
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
    /// The socket's read side ended without close_notify: reads fail with `UnexpectedEof`.
    truncated: bool,
    /// close_notify is in `outgoing` or sent.
    close_queued: bool,
    /// rustls failed (a bad record, an alert from the peer), with its error: nothing more is
    /// processed, and every later call fails with that error (as rustls' buffered connection
    /// repeats it through tokio-rustls), whether the failure came in a read, a write or the
    /// shutdown.
    failed: Option<rustls::Error>,
    /// rustls' last state was `ReadTraffic` (all of it taken) or `WriteTraffic`: asked again
    /// with no new bytes, it would say `WriteTraffic` (see [`ServerStream::has_nothing_to_process`]).
    last_step_ready: bool,
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
pub async fn accept<S>(config: Arc<ServerConfig>, io: S) -> io::Result<ServerStream<S>>
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
        truncated: false,
        close_queued: false,
        failed: None,
        last_step_ready: false,
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
    fn has_nothing_to_process(&self) -> bool {
        self.last_step_ready
            && self.failed.is_none()
            && self.incoming.is_empty()
            && self.outgoing.is_empty()
            && !self.conn.wants_write()
    }

    /// The invariants between the buffers and the flags, at the end of each poll.
    fn check(&self) {
        debug_assert!(
            self.sent <= self.outgoing.len(),
            "sent past what was queued"
        );
        debug_assert!(
            self.plain_read <= self.plain.len() && (self.plain_read == 0 || !self.plain.is_empty()),
            "plaintext read past what was kept"
        );
        debug_assert!(
            !self.truncated || self.read_closed,
            "truncation ends the read side"
        );
        // `poll_fill` stops at MAX_INCOMING, after a read of at most a record or 1 KiB.
        debug_assert!(
            self.incoming.len() < MAX_INCOMING + 5 + 16384 + 1024,
            "ciphertext held past its bound"
        );
        debug_assert!(
            !self.last_step_ready || self.failed.is_none(),
            "a failed session is never last_step_ready"
        );
    }

    /// The socket's read side ended: without close_notify (we are here only if rustls has not
    /// reported one), a truncation.
    fn socket_ended(&mut self) {
        self.read_closed = true;
        self.truncated = true;
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
                // `step` has sent rustls' alert, if any.
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Encodes and sends what rustls queued after an error (its alert, behind any record queued
    /// before it, such as the answer to the peer's key update), if the socket takes it now.
    /// rustls gives queued records before it looks at any received one, one per call. Called
    /// once, where rustls failed ([`Self::step`]), as tokio-rustls' "last-gasp write" after
    /// `process_new_packets` fails, in the handshake and after it (before, a refused record
    /// after the handshake left the peer without the alert, and only the first queued record
    /// was sent: found by the `tls_differential` fuzz target).
    fn poll_alert(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Self {
            conn,
            incoming,
            outgoing,
            ..
        } = &mut *self;
        // Bounded: an alert, and what was queued before it (a key update, session tickets).
        for _ in 0..8 {
            if !conn.wants_write() {
                break;
            }
            let status = conn.process_tls_records(incoming);
            let Ok(ConnectionState::EncodeTlsData(mut record)) = status.state else {
                break;
            };
            if grow(outgoing, 64, |out| record.encode(out).map_err(encode_size)).is_err() {
                break;
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
        let was_failed = self.failed.is_some();
        let mut incoming = std::mem::take(&mut self.incoming);
        let (discard, step) = self.process_records(&mut incoming, cx, read, write);
        self.incoming = incoming;
        let step = finish(&mut self.incoming, discard, step);
        self.alert_if_failed(was_failed, cx);
        step
    }

    /// Sends rustls' alert when this step is the one where rustls failed.
    fn alert_if_failed(&mut self, was_failed: bool, cx: &mut Context<'_>) {
        if self.failed.is_some() && !was_failed {
            let _ = self.poll_alert(cx);
        }
    }

    /// [`Self::step`] on records read into a buffer of the caller's (the stack) while
    /// `incoming` was empty: what rustls does not consume (part of a record) goes to
    /// `incoming`.
    fn step_borrowed(
        &mut self,
        records: &mut [u8],
        cx: &mut Context<'_>,
        read: Option<&mut ReadBuf<'_>>,
    ) -> io::Result<Step> {
        debug_assert!(self.incoming.is_empty());
        let was_failed = self.failed.is_some();
        let (discard, step) = self.process_records(records, cx, read, None);
        self.incoming
            .extend_from_slice(&records[discard.min(records.len())..]);
        self.alert_if_failed(was_failed, cx);
        step
    }

    /// The work of [`Self::step`] on `records`: how many of their bytes rustls is done with
    /// (the caller discards them, error or not), and the step.
    fn process_records(
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
            last_step_ready,
            ..
        } = self;
        *last_step_ready = false;
        if let Some(e) = failed {
            // rustls must not see the records again (it would fail on them twice).
            return (0, Err(invalid(e.clone())));
        }
        let status = conn.process_tls_records(records);
        let mut discard = status.discard;
        let state = match status.state {
            Ok(state) => state,
            Err(e) => {
                *failed = Some(e.clone());
                return (discard, Err(invalid(e)));
            }
        };
        // Plaintext (all of it taken below, or the stream fails) or room to write: see `has_nothing_to_process`.
        *last_step_ready = matches!(
            state,
            ConnectionState::ReadTraffic(_) | ConnectionState::WriteTraffic(_)
        );
        let step = match state {
            ConnectionState::ReadTraffic(mut traffic) => {
                while let Some(record) = traffic.next_record() {
                    let record = match record {
                        Ok(record) => record,
                        Err(e) => {
                            *failed = Some(e.clone());
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
            _ => {
                let e = rustls::Error::General("unexpected TLS state".into());
                *failed = Some(e.clone());
                return (discard, Err(invalid(e)));
            }
        };
        (discard, Ok(step))
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

#[cfg(test)]
mod tests;
