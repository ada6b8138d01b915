//! Our TLS server stream (`ironic_proxy::TlsServerStream`, rustls' unbuffered API) against the
//! library it replaces, tokio-rustls' `server::TlsStream` (rustls' buffered connection), on the
//! same script: each has its own rustls client and in-memory socket, and every step of the
//! input is applied to both. The two connections' bytes differ (keys, nonces), but not their
//! lengths: one suite, one group and no tickets make every record the client sends the same
//! size on both, so "deliver n bytes" cuts both at the same place.
//!
//! The script, (operation, argument) byte pairs: client writes, key updates, close_notify,
//! delivery of the client's records in pieces of any size, raw bytes injected (an alert,
//! garbage), the TCP close (early, late, mid-record), server reads into buffers of any size,
//! server writes (plain and vectored, of every size class the stream treats apart), flushes and
//! the shutdown. Every poll is one poll with a no-op waker.
//!
//! Compared, and any disagreement panics naming it:
//! - the plaintext the server read, the same bytes in the same order;
//! - how the server's read side ended: end of stream (after close_notify), `UnexpectedEof`
//!   (a truncation), a TLS failure (`InvalidData`), another error, or not yet;
//! - what each server write and the shutdown returned;
//! - what the client received from the server's writes, and how its side ended: close_notify,
//!   a TCP close without it, the alert or error rustls reported, or still open.
//!
//! Normalised, because the two differ there by design (each case says why where it is done):
//! how reads and writes are cut into calls; the order of a failure and the plaintext before it
//! (tokio-rustls can report the error first and hand out the plaintext on the next reads);
//! writes after the session failed.
#![no_main]

mod tls_fixture;

use ironic_proxy::{accept_tls, TlsServerStream};
use libfuzzer_sys::fuzz_target;
use std::future::Future;
use std::io::{self, IoSlice, Read, Write};
use std::pin::Pin;
use std::task::Poll;
use tls_fixture::{configs, cx, guarded, install_hook, raw_read, raw_write};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

type Theirs = tokio_rustls::server::TlsStream<DuplexStream>;
type Ours = TlsServerStream<DuplexStream>;

/// A server stream under test.
trait Server: AsyncRead + AsyncWrite + Unpin {
    /// Plaintext the session accepted that the stream has not handed out yet, once its reads
    /// stopped at an error.
    fn leftover(&mut self) -> Vec<u8>;
}

impl Server for Ours {
    /// Nothing: this stream hands out every plaintext byte before the failure that follows it.
    fn leftover(&mut self) -> Vec<u8> {
        Vec::new()
    }
}

impl Server for Theirs {
    /// tokio-rustls returns rustls' error as soon as `process_new_packets` fails, even when
    /// records before the bad one in the same socket read gave plaintext; that plaintext stays
    /// in rustls' buffer and the next `poll_read` returns it. Our reads stop at the first
    /// error (as hyper's do), so it is taken here: it was accepted by rustls all the same.
    fn leftover(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let conn = self.get_mut().1;
        while let Ok(n) = conn.reader().read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    }
}

/// How a read side ended.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum End {
    /// `Ok` with nothing: end of stream.
    Clean,
    /// Failed with this kind (`UnexpectedEof`: a truncation; `InvalidData`: rustls refused).
    Failed(io::ErrorKind),
}

/// What a server write (to its end, or until it could not go on) or shutdown returned.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Outcome {
    Done(usize),
    Pending(usize),
    Failed(io::ErrorKind, usize),
}

/// How the client's side ended.
#[derive(Debug, PartialEq, Eq, Clone)]
enum ClientEnd {
    Open,
    CloseNotify,
    Truncated,
    /// rustls' error (an alert received, a record refused).
    Error(String),
}

/// The client and its socket.
struct Peer {
    client: rustls::ClientConnection,
    raw: Option<DuplexStream>,
    /// Ciphertext the client produced and the socket has not been given yet.
    pending: Vec<u8>,
    read: Vec<u8>,
    error: Option<String>,
    eof: bool,
}

impl Peer {
    fn take_records(&mut self) {
        while self.client.wants_write() {
            if self.client.write_tls(&mut self.pending).is_err() {
                break;
            }
        }
    }

    fn deliver(&mut self, n: usize) {
        let Some(raw) = self.raw.as_mut() else {
            return;
        };
        let n = n.min(self.pending.len());
        let k = raw_write(raw, &self.pending[..n]);
        self.pending.drain(..k);
    }

    fn drain_plain(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.client.reader().read(&mut buf) {
            if n == 0 {
                break;
            }
            self.read.extend_from_slice(&buf[..n]);
        }
    }

    fn receive(&mut self) {
        let Some(raw) = self.raw.as_mut() else {
            return;
        };
        let (bytes, eof) = raw_read(raw);
        let mut slice = &bytes[..];
        while !slice.is_empty() && self.error.is_none() {
            if let Err(e) = self.client.read_tls(&mut slice) {
                self.error = Some(format!("read_tls: {e}"));
                break;
            }
            if let Err(e) = self.client.process_new_packets() {
                self.error = Some(format!("{e:?}"));
                break;
            }
            self.drain_plain();
        }
        if eof && !self.eof && self.error.is_none() {
            self.eof = true;
            let _ = self.client.read_tls(&mut io::empty());
            if let Err(e) = self.client.process_new_packets() {
                self.error = Some(format!("{e:?}"));
            }
            self.drain_plain();
        }
    }

    fn end(&mut self) -> ClientEnd {
        if let Some(e) = &self.error {
            return ClientEnd::Error(e.clone());
        }
        let mut buf = [0u8; 1];
        match self.client.reader().read(&mut buf) {
            Ok(0) => ClientEnd::CloseNotify,
            Ok(_) => ClientEnd::Error("plaintext left unread".into()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => ClientEnd::Truncated,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => ClientEnd::Open,
            Err(e) => ClientEnd::Error(format!("reader: {e}")),
        }
    }
}

/// One server with its client, and what happened to it.
struct Side<S> {
    server: S,
    peer: Peer,
    /// Plaintext the server read.
    got: Vec<u8>,
    ended: Option<End>,
    /// Plaintext the server's writes accepted.
    served: Vec<u8>,
    /// Each write's and shutdown's outcome, with the index of its step.
    outcomes: Vec<(usize, Outcome)>,
    /// rustls refused something (a read or write failed with `InvalidData`).
    tls_failed: bool,
    /// `poll_shutdown` was called, or a write failed.
    write_closed: bool,
    /// `poll_shutdown` was called after rustls failed.
    shut_after_failure: bool,
    /// rustls failed only once its alert could no longer reach the client: the write side
    /// was shut (or a write had failed), or the client had closed its socket.
    alert_lost: bool,
    /// rustls' own assertion fired (see `tls_fixture::RUSTLS_ASSERT`): the side is done.
    asserted: bool,
}

fn handshake<S>(peer: &mut Peer, accepting: impl Future<Output = io::Result<S>>) -> S {
    let mut accepting = std::pin::pin!(accepting);
    for _ in 0..64 {
        peer.take_records();
        peer.deliver(usize::MAX);
        if let Poll::Ready(r) = accepting.as_mut().poll(&mut cx()) {
            let server = r.expect("the handshake with our own client");
            peer.receive();
            return server;
        }
        peer.receive();
    }
    panic!("the handshake did not end");
}

fn peer(raw: DuplexStream) -> Peer {
    Peer {
        client: tls_fixture::client_connection(),
        raw: Some(raw),
        pending: Vec::new(),
        read: Vec::new(),
        error: None,
        eof: false,
    }
}

impl<S: Server> Side<S> {
    fn new(server: S, peer: Peer) -> Self {
        Side {
            server,
            peer,
            got: Vec::new(),
            ended: None,
            served: Vec::new(),
            outcomes: Vec::new(),
            tls_failed: false,
            write_closed: false,
            alert_lost: false,
            shut_after_failure: false,
            asserted: false,
        }
    }

    fn note_error(&mut self, e: &io::Error) {
        if e.kind() == io::ErrorKind::InvalidData && !self.tls_failed {
            self.tls_failed = true;
            self.alert_lost = self.write_closed || self.peer.raw.is_none();
        }
    }

    /// One `poll_read` into a buffer of `size`; `false` when it gave nothing new (pending or
    /// already ended).
    fn read(&mut self, size: usize) -> bool {
        if self.ended.is_some() || self.asserted {
            return false;
        }
        let mut buf = vec![0u8; size];
        let mut rb = ReadBuf::new(&mut buf);
        let server = &mut self.server;
        match guarded(|| Pin::new(server).poll_read(&mut cx(), &mut rb)) {
            Some(Poll::Ready(Ok(()))) if rb.filled().is_empty() => {
                self.ended = Some(End::Clean);
                false
            }
            Some(Poll::Ready(Ok(()))) => {
                self.got.extend_from_slice(rb.filled());
                true
            }
            Some(Poll::Ready(Err(e))) => {
                self.note_error(&e);
                self.ended = Some(End::Failed(e.kind()));
                false
            }
            Some(Poll::Pending) => false,
            None => {
                self.asserted = true;
                false
            }
        }
    }

    /// Writes `parts` (vectored when there are two) until all is accepted or a poll does not
    /// accept: a write may take less than it is given (ours caps a call, gathers vectored
    /// slices up to a size), which `AsyncWrite` allows and every caller loops over; only the
    /// total is compared.
    fn write(&mut self, step: usize, parts: [&[u8]; 2]) {
        if self.asserted {
            return;
        }
        let total = parts[0].len() + parts[1].len();
        let mut done = 0;
        let outcome = loop {
            if done == total {
                break Outcome::Done(done);
            }
            let (a, b) = if done < parts[0].len() {
                (&parts[0][done..], parts[1])
            } else {
                (&parts[1][done - parts[0].len()..], &[][..])
            };
            let server = &mut self.server;
            let polled = guarded(|| {
                if b.is_empty() {
                    Pin::new(server).poll_write(&mut cx(), a)
                } else {
                    let slices = [IoSlice::new(a), IoSlice::new(b)];
                    Pin::new(server).poll_write_vectored(&mut cx(), &slices)
                }
            });
            match polled {
                Some(Poll::Ready(Ok(0))) => break Outcome::Failed(io::ErrorKind::WriteZero, done),
                Some(Poll::Ready(Ok(n))) => {
                    let accepted = a.iter().chain(b.iter()).take(n);
                    self.served.extend(accepted);
                    done += n;
                }
                Some(Poll::Ready(Err(e))) => {
                    self.note_error(&e);
                    self.write_closed = true;
                    break Outcome::Failed(e.kind(), done);
                }
                Some(Poll::Pending) => break Outcome::Pending(done),
                None => {
                    self.asserted = true;
                    return;
                }
            }
            self.peer.receive();
        };
        self.outcomes.push((step, outcome));
        self.peer.receive();
    }

    fn flush(&mut self, step: usize) {
        // After the shutdown or a failed write, not compared: a write our stream refuses (after
        // the shutdown) or fails to send leaves nothing behind, while tokio-rustls encrypts it
        // into rustls' buffer first and keeps what the socket refused, so a later flush fails
        // on those bytes. The write itself returned the error on both.
        if self.asserted || self.write_closed {
            return;
        }
        let server = &mut self.server;
        let outcome = match guarded(|| Pin::new(server).poll_flush(&mut cx())) {
            Some(Poll::Ready(Ok(()))) => Outcome::Done(0),
            Some(Poll::Ready(Err(e))) => Outcome::Failed(e.kind(), 0),
            Some(Poll::Pending) => Outcome::Pending(0),
            None => {
                self.asserted = true;
                return;
            }
        };
        self.outcomes.push((step, outcome));
        self.peer.receive();
    }

    fn shutdown(&mut self, step: usize) {
        if self.asserted {
            return;
        }
        // A second shutdown, or one after a failed write: not compared, as a flush (above).
        let compare = !self.write_closed;
        self.shut_after_failure |= self.tls_failed;
        self.write_closed = true;
        let server = &mut self.server;
        let outcome = match guarded(|| Pin::new(server).poll_shutdown(&mut cx())) {
            Some(Poll::Ready(Ok(()))) => Outcome::Done(0),
            Some(Poll::Ready(Err(e))) => {
                self.note_error(&e);
                Outcome::Failed(e.kind(), 0)
            }
            Some(Poll::Pending) => Outcome::Pending(0),
            None => {
                self.asserted = true;
                return;
            }
        };
        if compare {
            self.outcomes.push((step, outcome));
        }
        self.peer.receive();
    }

    /// Delivers what the client still has and reads until nothing more comes.
    /// Delivers the rest and reads to the end: in rounds, should the socket be full.
    fn drain(&mut self) {
        self.peer.take_records();
        for _ in 0..1024 {
            let before = self.peer.pending.len();
            self.peer.deliver(usize::MAX);
            let mut progress = self.peer.pending.len() < before;
            while self.read(16 * 1024) {
                progress = true;
            }
            if !progress {
                break;
            }
        }
        if !self.asserted {
            let rest = self.server.leftover();
            self.got.extend_from_slice(&rest);
        }
        self.peer.receive();
    }
}

/// Where two byte strings first differ, for a readable panic.
fn first_difference(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("differ at byte {i} (lengths {} and {})", a.len(), b.len()),
        None => format!(
            "one is a prefix of the other (lengths {} and {})",
            a.len(),
            b.len()
        ),
    }
}

/// The sockets' capacity each way: more than a script can queue, so that what reaches a server
/// before a TCP close does not depend on how fast it emptied its socket (tokio-rustls reads
/// ahead, ours reads a record at a time), which would make the two differ by design. A full
/// socket is `tls_stream`'s to fuzz (64 KiB there).
const SOCKET: usize = 1 << 24;

fuzz_target!(|data: &[u8]| {
    install_hook();
    let c = configs();
    let (io, raw) = tokio::io::duplex(SOCKET);
    let mut ours_peer = peer(raw);
    let ours = handshake(&mut ours_peer, accept_tls(c.server.clone(), io));
    let (io, raw) = tokio::io::duplex(SOCKET);
    let mut theirs_peer = peer(raw);
    let acceptor = tokio_rustls::TlsAcceptor::from(c.server.clone());
    let theirs = handshake(&mut theirs_peer, acceptor.accept(io));
    let mut ours = Side::new(ours, ours_peer);
    let mut theirs = Side::new(theirs, theirs_peer);

    // The client's side is the same for both: its writes and close_notify are decided here.
    let mut wrote = 0usize; // plaintext the client wrote
    let mut close_notify = false;
    let mut server_bytes = 0usize; // plaintext offered to the servers' writes, for patterns
    let mut injected = false;
    let mut bytes = data.iter().copied();
    let mut step = 0usize;
    // TLS_DIFFERENTIAL_TRACE=1: each step's state on stderr, to read a disagreement.
    let trace = std::env::var_os("TLS_DIFFERENTIAL_TRACE").is_some();
    while let Some(op) = bytes.next() {
        step += 1;
        let arg = usize::from(bytes.next().unwrap_or(0));
        macro_rules! both {
            ($side:ident => $body:expr) => {{
                {
                    let $side = &mut ours;
                    $body;
                }
                {
                    let $side = &mut theirs;
                    $body;
                }
            }};
        }
        match op % 12 {
            0 if !close_notify => {
                let chunk: Vec<u8> = (0..arg * 37).map(|i| (wrote + i) as u8).collect();
                wrote += chunk.len();
                both!(s => {
                    // Refused once the client has failed (an alert received): compared
                    // through the clients' ends.
                    let _ = s.peer.client.writer().write_all(&chunk);
                    s.peer.take_records();
                });
            }
            1 if !close_notify => both!(s => {
                let _ = s.peer.client.refresh_traffic_keys();
                s.peer.take_records();
            }),
            2 if !close_notify => {
                close_notify = true;
                both!(s => {
                    s.peer.client.send_close_notify();
                    s.peer.take_records();
                });
            }
            3 => both!(s => s.peer.deliver(arg + 1)),
            4 => both!(s => s.peer.deliver(usize::MAX)),
            5 => both!(s => s.read(arg * 64 + 1)),
            6 => {
                let chunk: Vec<u8> = (0..arg * 53)
                    .map(|i| (server_bytes + i) as u8 ^ 0x5a)
                    .collect();
                server_bytes += chunk.len();
                both!(s => s.write(step, [&chunk, &[]]));
            }
            7 => {
                // Raw bytes on the socket, after part of what is pending: a fatal alert
                // record (decode_error), or garbage from the input.
                let junk: Vec<u8> = if arg % 2 == 0 {
                    vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]
                } else {
                    bytes.by_ref().take(arg % 32).collect()
                };
                both!(s => {
                    s.peer.deliver(arg % 7);
                    if let Some(raw) = s.peer.raw.as_mut() {
                        raw_write(raw, &junk);
                        injected = true;
                    }
                });
            }
            8 => both!(s => s.peer.raw = None),
            9 => both!(s => s.shutdown(step)),
            10 => {
                // A head and a body in one vectored write: the sizes cross the stream's
                // gathering thresholds (4 KiB on the stack, 16 KiB for a body of its own).
                let head_len = (arg % 64) * 67 + arg / 64;
                let body_len = usize::from(bytes.next().unwrap_or(0)) * 131;
                let all: Vec<u8> = (0..head_len + body_len)
                    .map(|i| (server_bytes + i) as u8 ^ 0xa5)
                    .collect();
                server_bytes += all.len();
                let (head, body) = all.split_at(head_len);
                both!(s => s.write(step, [head, body]));
            }
            11 => both!(s => s.flush(step)),
            _ => {}
        }
        both!(s => s.peer.receive());
        if trace {
            eprintln!(
                "step {step} op {} arg {arg}: read {}/{} ended {:?}/{:?} pending {}/{} \
                 client {:?}/{:?}",
                op % 12,
                ours.got.len(),
                theirs.got.len(),
                ours.ended,
                theirs.ended,
                ours.peer.pending.len(),
                theirs.peer.pending.len(),
                ours.peer.error,
                theirs.peer.error,
            );
        }
    }
    ours.drain();
    theirs.drain();

    if trace {
        eprintln!(
            "drained: read {}/{} ended {:?}/{:?} outcomes {:?}/{:?} client read {}/{}",
            ours.got.len(),
            theirs.got.len(),
            ours.ended,
            theirs.ended,
            ours.outcomes,
            theirs.outcomes,
            ours.peer.read.len(),
            theirs.peer.read.len()
        );
    }
    if ours.asserted || theirs.asserted {
        // rustls' own assertion (see tls_fixture::RUSTLS_ASSERT): only after refused bytes.
        assert!(injected, "rustls' assertion without an injected record");
        return;
    }
    assert!(
        ours.got == theirs.got,
        "the servers read different plaintext: {}",
        first_difference(&ours.got, &theirs.got)
    );
    assert_eq!(
        ours.ended, theirs.ended,
        "the read sides ended differently (ours, tokio-rustls')"
    );
    let refused = ours.tls_failed || theirs.tls_failed;
    if !refused {
        assert_eq!(
            ours.outcomes, theirs.outcomes,
            "the servers' writes or shutdown returned differently (ours, tokio-rustls')"
        );
        assert!(
            ours.peer.read == theirs.peer.read,
            "the clients received different plaintext: {}",
            first_difference(&ours.peer.read, &theirs.peer.read)
        );
        assert_eq!(
            ours.peer.end(),
            theirs.peer.end(),
            "the clients' sides ended differently (ours, tokio-rustls')"
        );
    } else {
        // A record rustls refused. tokio-rustls reads ahead: each read takes all the socket
        // has and rustls processes every record in it, so it meets the refused record (and
        // fails, and sends the alert) at the first read after it arrived. Our stream processes
        // records only as its reader asks for plaintext (by design: no plaintext is held
        // beyond a record), so it fails later, when the reader gets there. Between the two,
        // our server's writes still reach the client, and tokio-rustls' do not (its client
        // has the alert). So what its client received is a prefix of what ours did, and the
        // alert is the same unless ours failed only once the alert could not reach the
        // client (after the shutdown's close_notify, or the client's TCP close). The writes'
        // outcomes are not compared: after the failure ours refuses every write, while
        // tokio-rustls keeps encrypting into the session it sent its alert for.
        assert!(
            ours.peer.read.starts_with(&theirs.peer.read),
            "tokio-rustls' client received what ours did not: {}",
            first_difference(&ours.peer.read, &theirs.peer.read)
        );
        let (ours_end, theirs_end) = (ours.peer.end(), theirs.peer.end());
        // A shutdown after rustls failed: tokio-rustls still sends close_notify (rustls'
        // buffered connection queues it in a failed session), ours cannot (rustls' unbuffered
        // API answers every call after an error with the error) and shuts the socket without
        // it. The client sees close_notify or a truncation after the alert it may have had.
        let excused = ours.shut_after_failure
            && ours_end == ClientEnd::Truncated
            && theirs_end == ClientEnd::CloseNotify;
        if !ours.alert_lost && !excused {
            assert_eq!(
                ours_end, theirs_end,
                "the clients' sides ended differently after a refused record (ours, \
                 tokio-rustls')"
            );
        }
    }
    assert!(
        theirs.served.starts_with(&theirs.peer.read) && ours.served.starts_with(&ours.peer.read),
        "a client received what its server's writes did not accept"
    );
});
