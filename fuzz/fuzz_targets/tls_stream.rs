//! The TLS server stream (`ironic_proxy::TlsServerStream`, our replacement of tokio-rustls over
//! rustls' unbuffered API) driven by a rustls client through an in-memory socket, one step at
//! a time as the input says: client writes, key updates, close_notify, delivery of the client's
//! records in pieces of any size (record splits), server reads and writes, raw bytes injected
//! (alerts, garbage), early and late TCP closes, the server's shutdown.
//!
//! Checks, for every input (and every `debug_assert!` of the stream, on in fuzz builds):
//! - nothing panics, and no step blocks (every poll is one poll, with a no-op waker);
//! - what the server reads is exactly a prefix of what the client wrote, in order;
//! - a clean end of stream (`Ok` with nothing) only after the client's close_notify reached
//!   it, with every byte written before it read; a TCP close without close_notify is
//!   `UnexpectedEof`, never a clean end;
//! - what the client reads is exactly a prefix of what the server's writes accepted.
//!
//! The handshake before each input is made cheap (`tls_fixture`); `tls_differential` runs the
//! same kind of script against tokio-rustls beside this stream and compares the outcomes.
#![no_main]

use ironic_proxy::{accept_tls, TlsServerStream};
use libfuzzer_sys::fuzz_target;
use std::future::Future;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::task::Poll;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

mod tls_fixture;
use tls_fixture::{configs, cx, guarded, install_hook, pattern, raw_read, raw_write};

/// The test's side of the socket: the client, its ciphertext not yet delivered, and what it
/// has read.
struct Peer {
    client: rustls::ClientConnection,
    raw: Option<DuplexStream>,
    pending: Vec<u8>,
    read: Vec<u8>,
    /// Plaintext written by the client, and how much of it precedes its close_notify.
    wrote: Vec<u8>,
    close_notify_at: Option<usize>,
    injected: bool,
}

impl Peer {
    fn take_records(&mut self) {
        while self.client.wants_write() {
            let _ = self.client.write_tls(&mut self.pending);
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

    fn receive(&mut self) {
        let Some(raw) = self.raw.as_mut() else {
            return;
        };
        let (bytes, _) = raw_read(raw);
        let mut slice = &bytes[..];
        while !slice.is_empty() {
            if self.client.read_tls(&mut slice).is_err()
                || self.client.process_new_packets().is_err()
            {
                return;
            }
        }
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.client.reader().read(&mut buf) {
            if n == 0 {
                break;
            }
            self.read.extend_from_slice(&buf[..n]);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    install_hook();
    let c = configs();
    let (server_io, raw) = tokio::io::duplex(64 * 1024);
    let client = tls_fixture::client_connection();
    let mut peer = Peer {
        client,
        raw: Some(raw),
        pending: Vec::new(),
        read: Vec::new(),
        wrote: Vec::new(),
        close_notify_at: None,
        injected: false,
    };
    // The handshake, whole: the steps below fuzz what follows it.
    let mut accepting = Box::pin(accept_tls(c.server.clone(), server_io));
    let mut server: TlsServerStream<DuplexStream> = loop {
        peer.take_records();
        peer.deliver(usize::MAX);
        if let Poll::Ready(r) = accepting.as_mut().poll(&mut cx()) {
            break r.expect("the handshake with our own client");
        }
        peer.receive();
    };
    drop(accepting);
    peer.receive();
    let mut served = Vec::new(); // what the server's writes accepted
    let mut got = Vec::new(); // what the server read
    let mut ended: Option<io::Result<()>> = None;
    let mut rustls_asserted = false;
    let mut bytes = data.iter().copied();
    while let Some(op) = bytes.next() {
        let arg = usize::from(bytes.next().unwrap_or(0));
        match op % 10 {
            0 if peer.close_notify_at.is_none() => {
                let chunk = pattern(peer.wrote.len(), arg * 37, 0);
                if peer.client.writer().write_all(&chunk).is_ok() {
                    peer.wrote.extend_from_slice(&chunk);
                }
                peer.take_records();
            }
            1 if peer.close_notify_at.is_none() => {
                let _ = peer.client.refresh_traffic_keys();
                peer.take_records();
            }
            2 if peer.close_notify_at.is_none() => {
                peer.take_records();
                peer.close_notify_at = Some(peer.wrote.len());
                peer.client.send_close_notify();
                peer.take_records();
            }
            3 => peer.deliver(arg + 1),
            4 => peer.deliver(usize::MAX),
            5 => {
                if ended.is_none() {
                    let mut buf = vec![0u8; arg * 64 + 1];
                    let mut rb = ReadBuf::new(&mut buf);
                    match guarded(|| Pin::new(&mut server).poll_read(&mut cx(), &mut rb)) {
                        Some(Poll::Ready(Ok(()))) if rb.filled().is_empty() => ended = Some(Ok(())),
                        Some(Poll::Ready(Ok(()))) => got.extend_from_slice(rb.filled()),
                        Some(Poll::Ready(Err(e))) => ended = Some(Err(e)),
                        Some(Poll::Pending) => {}
                        None => {
                            rustls_asserted = true;
                            break;
                        }
                    }
                }
            }
            6 => {
                let chunk = pattern(served.len(), arg * 53, 0x5a);
                match guarded(|| Pin::new(&mut server).poll_write(&mut cx(), &chunk)) {
                    Some(Poll::Ready(Ok(n))) => served.extend_from_slice(&chunk[..n]),
                    Some(_) => {}
                    None => {
                        rustls_asserted = true;
                        break;
                    }
                }
                peer.receive();
            }
            7 => {
                // Raw bytes on the socket, in the middle of whatever is pending: an alert
                // record (fatal, decode_error), or garbage.
                let junk: Vec<u8> = if arg % 2 == 0 {
                    vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]
                } else {
                    bytes.by_ref().take(arg % 32).collect()
                };
                peer.deliver(arg % 7);
                if let Some(raw) = peer.raw.as_mut() {
                    raw_write(raw, &junk);
                    peer.injected = true;
                }
            }
            8 => peer.raw = None, // the TCP close (early or late)
            9 => {
                if guarded(|| Pin::new(&mut server).poll_shutdown(&mut cx())).is_none() {
                    rustls_asserted = true;
                    break;
                }
                peer.receive();
            }
            _ => {}
        }
        if op % 10 != 6 {
            peer.receive();
        }
    }
    // Drain what the server can still read once everything pending was delivered.
    peer.deliver(usize::MAX);
    for _ in 0..64 {
        if ended.is_some() || rustls_asserted {
            break;
        }
        let mut buf = vec![0u8; 16 * 1024];
        let mut rb = ReadBuf::new(&mut buf);
        match guarded(|| Pin::new(&mut server).poll_read(&mut cx(), &mut rb)) {
            Some(Poll::Ready(Ok(()))) if rb.filled().is_empty() => ended = Some(Ok(())),
            Some(Poll::Ready(Ok(()))) => got.extend_from_slice(rb.filled()),
            Some(Poll::Ready(Err(e))) => ended = Some(Err(e)),
            Some(Poll::Pending) => break,
            None => rustls_asserted = true,
        }
    }
    if rustls_asserted {
        // Only after a record rustls refused: the stream was never given garbage otherwise.
        assert!(
            peer.injected,
            "rustls' assertion without an injected record"
        );
        return;
    }
    assert!(
        peer.wrote.starts_with(&got),
        "the server read {} bytes that the client did not write",
        got.len()
    );
    assert!(
        served.starts_with(&peer.read),
        "the client read {} bytes the server did not write",
        peer.read.len()
    );
    if !peer.injected {
        if let Some(Ok(())) = ended {
            let at = peer
                .close_notify_at
                .expect("a clean end only after close_notify");
            assert_eq!(got.len(), at, "a clean end before every byte was read");
        }
        if peer.raw.is_none() && peer.pending.is_empty() && peer.close_notify_at.is_none() {
            if let Some(end) = &ended {
                assert!(
                    end.is_err(),
                    "a TCP close without close_notify ended cleanly"
                );
            }
        }
    }
});
