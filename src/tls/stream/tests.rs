//! The stream against tokio-rustls' client: data both ways, writes and reads of every shape,
//! the buffers an idle stream holds, close_notify and truncation, refused and forged input.

use super::write::SEAL;
use super::*;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use std::pin::Pin;
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
    // into rustls per exchange before `has_nothing_to_process`).
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
    // A key update from the client while the stream has nothing to process: the request after it is
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

/// The client's records for `data` (one write), without sending them.
fn records_for(conn: &mut rustls::ClientConnection, data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    conn.writer().write_all(data).unwrap();
    let mut wire = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut wire).unwrap();
    }
    wire
}

/// Reads until the stream ends or fails: what was read, and how it ended.
async fn read_to_end_or_error(
    server: &mut ServerStream<DuplexStream>,
) -> (Vec<u8>, io::Result<()>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match server.read(&mut buf).await {
            Ok(0) => return (got, Ok(())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return (got, Err(e)),
        }
    }
}

fn assert_truncated(end: io::Result<()>) {
    let err = end.expect_err("a socket's end without close_notify is not a clean end");
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
}

/// Truncation, as tokio-rustls and rustls report it: a socket that ends without
/// close_notify gives what came before, then `UnexpectedEof` (on every read after).
#[tokio::test]
async fn a_socket_that_ends_without_close_notify_is_unexpected_eof_after_the_data() {
    let (mut server, client) = pair(64 * 1024).await;
    let (mut io, mut conn) = client.into_inner();
    let wire = records_for(&mut conn, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    io.write_all(&wire).await.unwrap();
    drop(io); // the TCP close, no close_notify
    let (got, end) = read_to_end_or_error(&mut server).await;
    assert_eq!(got, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_truncated(end);
    let mut buf = [0u8; 16];
    assert_truncated(server.read(&mut buf).await.map(drop));
}

/// With close_notify before the close: a clean end, the same data.
#[tokio::test]
async fn a_socket_that_ends_after_close_notify_is_a_clean_end() {
    let (mut server, client) = pair(64 * 1024).await;
    let (mut io, mut conn) = client.into_inner();
    let mut wire = records_for(&mut conn, b"last words");
    conn.send_close_notify();
    conn.write_tls(&mut wire).unwrap();
    io.write_all(&wire).await.unwrap();
    drop(io);
    let (got, end) = read_to_end_or_error(&mut server).await;
    assert_eq!(got, b"last words");
    end.expect("close_notify, then the socket's end: a clean end of stream");
}

/// Mid-record: the part of a record that arrived is never delivered (it cannot be
/// authenticated), the whole records before it are.
#[tokio::test]
async fn a_socket_that_ends_mid_record_is_unexpected_eof_and_gives_no_partial_plaintext() {
    let (mut server, client) = pair(64 * 1024).await;
    let (mut io, mut conn) = client.into_inner();
    let whole = records_for(&mut conn, b"first");
    let cut = records_for(&mut conn, b"second, cut short");
    for at in [1, 5, 6, cut.len() / 2, cut.len() - 1] {
        let (mut server, client) = pair(64 * 1024).await;
        let (mut io, mut conn) = client.into_inner();
        let mut wire = records_for(&mut conn, b"first");
        wire.extend_from_slice(&records_for(&mut conn, b"second, cut short")[..at]);
        io.write_all(&wire).await.unwrap();
        drop(io);
        let (got, end) = read_to_end_or_error(&mut server).await;
        assert_eq!(got, b"first", "cut {at} bytes into the second record");
        assert_truncated(end);
    }
    // The same records whole: both delivered (the cut above is what made the difference).
    io.write_all(&whole).await.unwrap();
    io.write_all(&cut).await.unwrap();
    drop(io);
    let (got, end) = read_to_end_or_error(&mut server).await;
    assert_eq!(got, b"firstsecond, cut short");
    assert_truncated(end);
}

/// Mid-request: hyper reads the half it got, then the error, and does not mistake the half
/// for a whole request (it would with a clean end and a close-delimited message).
#[tokio::test]
async fn a_request_cut_by_a_socket_end_is_read_then_unexpected_eof() {
    let (mut server, client) = pair(64 * 1024).await;
    let (mut io, mut conn) = client.into_inner();
    let wire = records_for(
        &mut conn,
        b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345",
    );
    io.write_all(&wire).await.unwrap();
    drop(io);
    let (got, end) = read_to_end_or_error(&mut server).await;
    assert!(got.ends_with(b"12345"), "{got:?}");
    assert_truncated(end);
}

/// The thread's seal buffer already borrowed (a socket whose write re-entered another
/// stream of this thread): the write seals into a buffer of its own, no panic.
#[tokio::test]
async fn a_write_while_the_thread_seal_buffer_is_borrowed_still_goes_out() {
    let (mut server, mut client) = pair(64 * 1024).await;
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let written =
        SEAL.with_borrow_mut(|_held| Pin::new(&mut server).poll_write(&mut cx, b"re-entered"));
    assert!(matches!(written, Poll::Ready(Ok(10))), "{written:?}");
    let mut got = [0u8; 10];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"re-entered");
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

/// Found by the `tls_differential` fuzz target: a record rustls refuses after the handshake
/// (here a plaintext alert record, which cannot decrypt) fails the read, and the client gets
/// rustls' fatal alert, as tokio-rustls sends it; it used to get nothing.
#[tokio::test]
async fn a_refused_record_after_the_handshake_sends_the_alert() {
    let (mut server, client) = pair(64 * 1024).await;
    let (mut raw, mut conn) = client.into_inner();
    let wire = records_for(&mut conn, b"before");
    raw.write_all(&wire).await.unwrap();
    raw.write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32])
        .await
        .unwrap();
    let (got, end) = read_to_end_or_error(&mut server).await;
    assert_eq!(got, b"before");
    let err = end.expect_err("a refused record fails the read");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    drop(server);
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).await.unwrap();
    conn.read_tls(&mut &answer[..]).unwrap();
    let refused = conn.process_new_packets().expect_err("the alert");
    assert_eq!(
        refused,
        rustls::Error::AlertReceived(rustls::AlertDescription::BadRecordMac)
    );
}

/// The same after a key update the client asked the server to answer: rustls queues the
/// server's key update and the alert behind it, and both are sent, as tokio-rustls sends them
/// (the stream sent the first queued record only: found by the `tls_differential` target).
#[tokio::test]
async fn a_refused_record_after_a_key_update_sends_the_alert() {
    let (mut server, client) = pair(64 * 1024).await;
    let (mut raw, mut conn) = client.into_inner();
    conn.refresh_traffic_keys().unwrap();
    let mut wire = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut wire).unwrap();
    }
    wire.extend_from_slice(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]);
    raw.write_all(&wire).await.unwrap();
    let (got, end) = read_to_end_or_error(&mut server).await;
    assert!(got.is_empty());
    let err = end.expect_err("a refused record fails the read");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    drop(server);
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).await.unwrap();
    conn.read_tls(&mut &answer[..]).unwrap();
    let refused = conn.process_new_packets().expect_err("the alert");
    assert_eq!(
        refused,
        rustls::Error::AlertReceived(rustls::AlertDescription::BadRecordMac)
    );
}

/// Found by the `tls_differential` fuzz target: a write processes the records received so far
/// (rustls' unbuffered API does before it allows one), so a refused record that a read left in
/// the buffer fails the write; the next read then fails with rustls' error (`InvalidData`), as
/// tokio-rustls' read does, not with an error of another kind.
#[tokio::test]
async fn a_record_refused_in_a_write_fails_later_reads_with_rustls_error() {
    let (mut server, client) = pair(64 * 1024).await;
    let (mut raw, mut conn) = client.into_inner();
    let mut wire = records_for(&mut conn, b"hello");
    wire.extend_from_slice(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]);
    raw.write_all(&wire).await.unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(server.read(&mut buf).await.unwrap(), 5);
    let err = server
        .write_all(b"x")
        .await
        .expect_err("the record is refused");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    for _ in 0..2 {
        let err = server.read(&mut buf).await.expect_err("failed");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert_eq!(
            err.get_ref()
                .and_then(|e| e.downcast_ref::<rustls::Error>()),
            Some(&rustls::Error::DecryptError)
        );
    }
}

/// Found by the `tls_differential` fuzz target: records a read left unprocessed (it returns at
/// the first that gives plaintext) made the shutdown skip close_notify (rustls allows it only
/// in its write state), so the client saw a truncation; tokio-rustls sends it. Their plaintext
/// is still read after the shutdown.
#[tokio::test]
async fn the_shutdown_sends_close_notify_with_records_left_unread() {
    let (mut server, client) = pair(64 * 1024).await;
    let (mut raw, mut conn) = client.into_inner();
    let mut wire = records_for(&mut conn, b"first");
    wire.extend_from_slice(&records_for(&mut conn, b"second"));
    raw.write_all(&wire).await.unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(server.read(&mut buf).await.unwrap(), 5);
    server.shutdown().await.unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).await.unwrap();
    conn.read_tls(&mut &answer[..]).unwrap();
    let state = conn.process_new_packets().unwrap();
    assert!(
        state.peer_has_closed(),
        "close_notify before the socket's end"
    );
    assert_eq!(server.read(&mut buf).await.unwrap(), 6);
    assert_eq!(&buf[..6], b"second");
}

/// Found by the `tls_stream` fuzz target: after the server's own close_notify, a client record
/// with a byte inserted fails rustls, which sends a second fatal alert and trips its own
/// `debug_assert!(!self.sent_fatal_alert)` in debug builds. rustls' buffered connection (what
/// tokio-rustls drives) does the same (next test): rustls 0.23.46's, not this stream's. In
/// release builds the read fails.
#[tokio::test]
#[cfg_attr(debug_assertions, should_panic(expected = "sent_fatal_alert"))]
async fn a_forged_record_after_the_servers_close_notify_fails_the_read() {
    let (mut server, client) = pair(64 * 1024).await;
    let (mut io, mut conn) = client.into_inner();
    let wire = records_for(&mut conn, &[7u8; 185]);
    server.shutdown().await.unwrap();
    let mut forged = wire[..5].to_vec();
    forged.push(0x14);
    forged.extend_from_slice(&wire[5..]);
    io.write_all(&forged).await.unwrap();
    let mut buf = [0u8; 2048];
    assert!(server.read(&mut buf).await.is_err());
    assert!(server.read(&mut buf).await.is_err());
}

/// rustls' buffered connection after its close_notify and a forged record: the same debug
/// assertion, so the case is rustls' (remove the `should_panic` once a rustls release fixes it).
#[test]
#[cfg_attr(debug_assertions, should_panic(expected = "sent_fatal_alert"))]
fn rustls_buffered_after_close_notify_and_a_forged_record() {
    let (server_cfg, client_cfg) = configs();
    let mut server = rustls::ServerConnection::new(server_cfg).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut client = rustls::ClientConnection::new(client_cfg, name).unwrap();
    // Handshake in memory.
    for _ in 0..10 {
        let mut buf = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut buf).unwrap();
        }
        server.read_tls(&mut &buf[..]).unwrap();
        server.process_new_packets().unwrap();
        let mut buf = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut buf).unwrap();
        }
        client.read_tls(&mut &buf[..]).unwrap();
        client.process_new_packets().unwrap();
    }
    let wire = records_for(&mut client, &[7u8; 185]);
    server.send_close_notify();
    let mut forged = wire[..5].to_vec();
    forged.push(0x14);
    forged.extend_from_slice(&wire[5..]);
    server.read_tls(&mut &forged[..]).unwrap();
    assert!(server.process_new_packets().is_err());
}
