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
mod tls_side;

use ironic_proxy::accept_tls;
use libfuzzer_sys::fuzz_target;
use std::io::Write;
use tls_fixture::{configs, install_hook, pattern, raw_write};
use tls_side::{first_difference, handshake, peer, ClientEnd, Side};

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
                let chunk = pattern(wrote, arg * 37, 0);
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
                let chunk = pattern(server_bytes, arg * 53, 0x5a);
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
                let all = pattern(server_bytes, head_len + body_len, 0xa5);
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
        //
        // The other way round when ours met the record in a write: a read of ours takes what
        // the socket has into its buffer, and rustls' unbuffered API processes every record
        // received before it allows a write, so a write of ours can meet the record while
        // tokio-rustls, whose writes never read, still writes until its next read. Then
        // either client's plaintext may be the longer one, but one is a prefix of the other.
        let prefix = if ours.failed_in_write {
            ours.peer.read.starts_with(&theirs.peer.read)
                || theirs.peer.read.starts_with(&ours.peer.read)
        } else {
            ours.peer.read.starts_with(&theirs.peer.read)
        };
        assert!(
            prefix,
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
        // When ours met the record first, in a write, tokio-rustls meets it later, and its
        // alert can be the one that no longer reaches the client.
        let lost = ours.alert_lost || (ours.failed_in_write && theirs.alert_lost);
        // Which alert is sent is rustls' choice, not the stream's (it sends what rustls
        // queued), and after injected bytes it can depend on chance: bytes that land inside a
        // record make what follows them be read as records cut from ciphertext, random on each
        // connection, and rustls' buffered connection and its unbuffered API do not refuse such
        // a run at the same check. Seen: bad_record_mac from one side and decode_error from the
        // other, either way round, not reproduced by a rerun of the same input. So when both
        // servers failed on a record rustls refused and both clients received an alert, they
        // agree.
        let alert =
            |end: &ClientEnd| matches!(end, ClientEnd::Error(e) if e.starts_with("AlertReceived("));
        let both_alerted =
            ours.tls_failed && theirs.tls_failed && alert(&ours_end) && alert(&theirs_end);
        if !lost && !excused && !both_alerted {
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
