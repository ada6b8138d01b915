//! The two sides of `tls_differential`: a server stream under test (ours or tokio-rustls'),
//! its rustls client and socket, and what happened to them.

use crate::tls_fixture::{cx, guarded, raw_read, raw_write};
use ironic_proxy::TlsServerStream;
use std::future::Future;
use std::io::{self, IoSlice, Read};
use std::pin::Pin;
use std::task::Poll;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

pub type Theirs = tokio_rustls::server::TlsStream<DuplexStream>;
pub type Ours = TlsServerStream<DuplexStream>;

/// A server stream under test.
pub trait Server: AsyncRead + AsyncWrite + Unpin {
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
pub enum End {
    /// `Ok` with nothing: end of stream.
    Clean,
    /// Failed with this kind (`UnexpectedEof`: a truncation; `InvalidData`: rustls refused).
    Failed(io::ErrorKind),
}

/// What a server write (to its end, or until it could not go on) or shutdown returned.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Outcome {
    Done(usize),
    Pending(usize),
    Failed(io::ErrorKind, usize),
}

/// How the client's side ended.
#[derive(Debug, PartialEq, Eq, Clone)]
pub enum ClientEnd {
    Open,
    CloseNotify,
    Truncated,
    /// rustls' error (an alert received, a record refused).
    Error(String),
}

/// The client and its socket.
pub struct Peer {
    pub client: rustls::ClientConnection,
    pub raw: Option<DuplexStream>,
    /// Ciphertext the client produced and the socket has not been given yet.
    pub pending: Vec<u8>,
    pub read: Vec<u8>,
    pub error: Option<String>,
    pub eof: bool,
}

impl Peer {
    pub fn take_records(&mut self) {
        while self.client.wants_write() {
            if self.client.write_tls(&mut self.pending).is_err() {
                break;
            }
        }
    }

    pub fn deliver(&mut self, n: usize) {
        let Some(raw) = self.raw.as_mut() else {
            return;
        };
        let n = n.min(self.pending.len());
        let k = raw_write(raw, &self.pending[..n]);
        self.pending.drain(..k);
    }

    pub fn drain_plain(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.client.reader().read(&mut buf) {
            if n == 0 {
                break;
            }
            self.read.extend_from_slice(&buf[..n]);
        }
    }

    pub fn receive(&mut self) {
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

    pub fn end(&mut self) -> ClientEnd {
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
pub struct Side<S> {
    pub server: S,
    pub peer: Peer,
    /// Plaintext the server read.
    pub got: Vec<u8>,
    pub ended: Option<End>,
    /// Plaintext the server's writes accepted.
    pub served: Vec<u8>,
    /// Each write's and shutdown's outcome, with the index of its step.
    pub outcomes: Vec<(usize, Outcome)>,
    /// rustls refused something (a read or write failed with `InvalidData`).
    pub tls_failed: bool,
    /// The first such failure was met by a write or the shutdown, not a read.
    pub failed_in_write: bool,
    /// `poll_shutdown` was called, or a write failed.
    pub write_closed: bool,
    /// `poll_shutdown` was called after rustls failed.
    pub shut_after_failure: bool,
    /// rustls failed only once its alert could no longer reach the client: the write side
    /// was shut (or a write had failed), or the client had closed its socket.
    pub alert_lost: bool,
    /// rustls' own assertion fired (see `tls_fixture::RUSTLS_ASSERT`): the side is done.
    pub asserted: bool,
}

pub fn handshake<S>(peer: &mut Peer, accepting: impl Future<Output = io::Result<S>>) -> S {
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

pub fn peer(raw: DuplexStream) -> Peer {
    Peer {
        client: crate::tls_fixture::client_connection(),
        raw: Some(raw),
        pending: Vec::new(),
        read: Vec::new(),
        error: None,
        eof: false,
    }
}

impl<S: Server> Side<S> {
    pub fn new(server: S, peer: Peer) -> Self {
        Side {
            server,
            peer,
            got: Vec::new(),
            ended: None,
            served: Vec::new(),
            outcomes: Vec::new(),
            tls_failed: false,
            failed_in_write: false,
            write_closed: false,
            alert_lost: false,
            shut_after_failure: false,
            asserted: false,
        }
    }

    pub fn note_error(&mut self, e: &io::Error, in_write: bool) {
        if e.kind() == io::ErrorKind::InvalidData && !self.tls_failed {
            self.tls_failed = true;
            self.failed_in_write = in_write;
            self.alert_lost = self.write_closed || self.peer.raw.is_none();
            if std::env::var_os("TLS_DIFFERENTIAL_TRACE").is_some() {
                eprintln!("first TLS failure (in a write: {in_write}): {e}");
            }
        }
    }

    /// One `poll_read` into a buffer of `size`; `false` when it gave nothing new (pending or
    /// already ended).
    pub fn read(&mut self, size: usize) -> bool {
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
                self.note_error(&e, false);
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
    pub fn write(&mut self, step: usize, parts: [&[u8]; 2]) {
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
                    // Slice copies: a byte iterator here is traced byte by byte.
                    let from_a = n.min(a.len());
                    self.served.extend_from_slice(&a[..from_a]);
                    self.served.extend_from_slice(&b[..n - from_a]);
                    done += n;
                }
                Some(Poll::Ready(Err(e))) => {
                    self.note_error(&e, true);
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

    pub fn flush(&mut self, step: usize) {
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

    pub fn shutdown(&mut self, step: usize) {
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
                self.note_error(&e, true);
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
    pub fn drain(&mut self) {
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
pub fn first_difference(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("differ at byte {i} (lengths {} and {})", a.len(), b.len()),
        None => format!(
            "one is a prefix of the other (lengths {} and {})",
            a.len(),
            b.len()
        ),
    }
}
