//! HTTP/2-specific attacks on a `server` listener (ALPN h2), written frame by frame with a
//! real TLS client: rapid reset (CVE-2023-44487), a CONTINUATION flood (CVE-2024-27316's
//! family), an HPACK bomb (one dynamic-table entry referenced until the decoded list is
//! megabytes), PING and SETTINGS floods from a client that never reads, and a client that never
//! opens its flow-control window. After each one the proxy must still be alive and serve, its
//! memory must not have grown with the attack, and the upstream must have seen only requests
//! that a client could legitimately have made.

use crate::support;

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};
use support::{poll_until, tls_client_config, Proxy, Sandbox, Tls, TlsStream, Upstream};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// One frame: 9-byte header, then the payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("frame length");
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1), the prefix's other bits `first`.
fn hpack_int(first: u8, n: u32, mut v: usize, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A literal field with a new name (RFC 7541 §6.2): `0x00` never indexed, `0x40` added to the
/// dynamic table. No Huffman coding.
fn hpack_literal(kind: u8, name: &str, value: &str, out: &mut Vec<u8>) {
    out.push(kind);
    hpack_int(0, 7, name.len(), out);
    out.extend_from_slice(name.as_bytes());
    hpack_int(0, 7, value.len(), out);
    out.extend_from_slice(value.as_bytes());
}

/// The header block of `GET path`.
fn get_block(path: &str) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", path),
        (":authority", "localhost"),
    ] {
        hpack_literal(0x00, n, v, &mut b);
    }
    b
}

struct H2 {
    s: TlsStream,
}

impl H2 {
    /// A TLS connection that negotiated h2, with the preface and `settings` sent.
    fn open(proxy: &Proxy, ca_pem: &str, settings: &[(u16, u32)]) -> Self {
        let cfg = tls_client_config(ca_pem, None, &[b"h2"]);
        let mut s = support::tls_connect(proxy.addr("api"), cfg).expect("TLS handshake");
        assert_eq!(s.conn.alpn_protocol(), Some(&b"h2"[..]), "ALPN h2");
        let mut payload = Vec::new();
        for (id, v) in settings {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&v.to_be_bytes());
        }
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &payload));
        s.write_all(&hello).expect("preface");
        Self { s }
    }

    /// Writes until done or the proxy stops taking bytes; the bytes it took.
    fn send_all(&mut self, frames: impl Iterator<Item = Vec<u8>>) -> usize {
        let mut sent = 0;
        for f in frames {
            if self.s.write_all(&f).is_err() {
                break;
            }
            sent += f.len();
        }
        let _ = self.s.flush();
        sent
    }

    /// Reads frames, giving each to `seen` (type, flags, stream, payload) until it returns
    /// true (`End::Open`), or until a GOAWAY, the end of the connection, or `within`.
    fn read_frames(
        &mut self,
        within: Duration,
        mut seen: impl FnMut(u8, u8, u32, &[u8]) -> bool,
    ) -> End {
        let deadline = Instant::now() + within;
        let _ = self
            .s
            .sock
            .set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        while Instant::now() < deadline {
            match self.s.read(&mut chunk) {
                Ok(0) => return End::Closed,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    continue
                }
                // A reset: the proxy closed while we were still sending.
                Err(_) => return End::Closed,
            }
            while buf.len() >= 9 {
                let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
                if buf.len() < 9 + len {
                    break;
                }
                let (kind, flags) = (buf[3], buf[4]);
                let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
                let payload = buf[9..9 + len].to_vec();
                buf.drain(..9 + len);
                if kind == GOAWAY && payload.len() >= 8 {
                    return End::Goaway(u32::from_be_bytes([
                        payload[4], payload[5], payload[6], payload[7],
                    ]));
                }
                if seen(kind, flags, stream, &payload) {
                    return End::Open;
                }
            }
        }
        End::Open
    }

    /// Reads frames until a GOAWAY, the end of the connection, or `within`; returns how the
    /// connection ended and how many responses (HEADERS frames) came before.
    fn read_until_goaway(&mut self, within: Duration) -> (End, usize) {
        let mut responses = 0;
        let end = self.read_frames(within, |kind, _, _, _| {
            responses += usize::from(kind == HEADERS);
            false
        });
        (end, responses)
    }

    /// The proxy's answer to stream 1, within 3 s.
    fn answer(&mut self) -> Answer {
        let mut answer = None;
        let end = self.read_frames(Duration::from_secs(3), |kind, _, stream, payload| {
            if stream != 1 {
                return false;
            }
            answer = match kind {
                // `:status` first, as an indexed static entry (RFC 7541 appendix A) when
                // it is one of 200, 204, 206, 304, 400, 404, 500.
                HEADERS => Some(Answer::Status(match payload.first() {
                    Some(0x88) => 200,
                    Some(0x8c) => 400,
                    Some(0x8d) => 404,
                    Some(0x8e) => 500,
                    _ => 0,
                })),
                RST_STREAM if payload.len() == 4 => Some(Answer::Reset(u32::from_be_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]))),
                _ => None,
            };
            answer.is_some()
        });
        answer.unwrap_or(match end {
            End::Goaway(code) => Answer::Goaway(code),
            End::Closed => Answer::Closed,
            End::Open => Answer::Nothing,
        })
    }
}

/// What came back for one stream.
#[derive(Debug, PartialEq)]
enum Answer {
    /// A response; 0 when its status is not one of the indexed ones.
    Status(u16),
    Reset(u32),
    Goaway(u32),
    Closed,
    Nothing,
}

/// How a connection under attack ended.
#[derive(Debug, PartialEq)]
enum End {
    Goaway(u32),
    Closed,
    Open,
}

fn rss_kib(proxy: &Proxy) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", proxy.pid()))
        .expect("the proxy's /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .expect("VmRSS")
}

struct Rig {
    sb: Sandbox,
    up: Upstream,
    proxy: Proxy,
}

fn rig() -> Rig {
    rig_with_idle_timeout("60s")
}

fn rig_with_idle_timeout(idle: &str) -> Rig {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("api", Tls::Server)])
        .limit("header_bytes", "16384")
        .limit_dur("idle_timeout", idle)
        .start();
    Rig { sb, up, proxy }
}

impl Rig {
    fn open(&self, settings: &[(u16, u32)]) -> H2 {
        H2::open(&self.proxy, &self.sb.ca.pem, settings)
    }

    /// After an attack: alive, and a normal HTTP/2 request on a new connection is served.
    fn still_serves(&self, what: &str) {
        let mut c = self.open(&[]);
        let sent = c.send_all(std::iter::once(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            1,
            &get_block("/after"),
        )));
        assert!(sent > 0, "{what}: the proxy takes a new connection");
        let (_, responses) = c.read_until_goaway(Duration::from_secs(2));
        assert!(responses >= 1, "{what}: a normal request is answered");
        let after = poll_until(Duration::from_secs(5), || {
            self.up
                .requests()
                .iter()
                .any(|r| r.path == "/after")
                .then_some(())
        });
        assert!(after.is_some(), "{what}: the normal request reached Ironic");
    }

    /// The proxy's resident memory has not grown by more than `mib` since `before`.
    fn memory_bounded(&self, before: u64, mib: u64, what: &str) {
        let after = rss_kib(&self.proxy);
        assert!(
            after < before + mib * 1024,
            "{what}: RSS {before} KiB -> {after} KiB"
        );
        eprintln!("{what}: RSS {before} KiB -> {after} KiB");
    }
}

/// Rapid reset: every stream opened and cancelled at once, 20,000 times on one connection. The
/// proxy ends the connection (GOAWAY) long before, and Ironic sees a small part of them.
#[test]
fn rapid_reset_is_cut_and_ironic_sees_few_of_the_streams() {
    let rig = rig();
    let before = rss_kib(&rig.proxy);
    let mut c = rig.open(&[]);
    let n: u32 = 20_000;
    let block = get_block("/reset");
    let started = Instant::now();
    let sent = c.send_all((0..n).map(|i| {
        let id = 1 + 2 * i;
        let mut f = frame(HEADERS, END_STREAM | END_HEADERS, id, &block);
        f.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
        f
    }));
    let (end, _) = c.read_until_goaway(Duration::from_secs(5));
    let reached = rig.up.requests().len();
    let whole = n as usize * (2 * 9 + block.len() + 4);
    eprintln!(
        "rapid reset: {sent} of {whole} bytes taken in {:?}, {end:?}, {reached} of {n} streams reached the upstream",
        started.elapsed()
    );
    assert_ne!(end, End::Open, "the connection must be ended");
    assert!(sent < whole, "the proxy took the whole attack");
    assert!(
        reached < (n / 10) as usize,
        "{reached} of {n} cancelled streams reached Ironic"
    );
    rig.memory_bounded(before, 32, "rapid reset");
    rig.still_serves("rapid reset");
}

/// CONTINUATION flood: a header block that never ends, 16 KiB at a time, up to 32 MiB. The
/// proxy must stop it at its header limit (16 KiB here), not buffer it.
#[test]
fn a_continuation_flood_is_cut_at_the_header_limit() {
    let rig = rig();
    let before = rss_kib(&rig.proxy);
    let mut c = rig.open(&[]);
    let mut first = get_block("/cont");
    hpack_literal(0x00, "x-a", "b", &mut first);
    let mut filler = Vec::new();
    while filler.len() < 16 * 1024 - 64 {
        hpack_literal(0x00, "x-flood", &"f".repeat(100), &mut filler);
    }
    let sent = c.send_all(
        std::iter::once(frame(HEADERS, END_STREAM, 1, &first))
            .chain((0..2048).map(|_| frame(CONTINUATION, 0, 1, &filler))),
    );
    let (end, _) = c.read_until_goaway(Duration::from_secs(5));
    eprintln!("CONTINUATION flood: {sent} bytes taken, {end:?}");
    assert_ne!(end, End::Open, "the connection must be ended");
    assert!(
        sent < 8 << 20,
        "the proxy kept reading a header block to {sent} bytes"
    );
    assert!(
        rig.up.requests().iter().all(|r| r.path != "/cont"),
        "the flooded request must not reach Ironic"
    );
    rig.memory_bounded(before, 32, "CONTINUATION flood");
    rig.still_serves("CONTINUATION flood");
}

/// HPACK bomb: one 4 KiB field put in the dynamic table, then referenced by its one-byte index
/// 4,000 times: 16 MiB of headers from 8 KiB on the wire. Refused, never forwarded.
#[test]
fn an_hpack_bomb_is_refused_without_being_decoded_in_full() {
    let rig = rig();
    let before = rss_kib(&rig.proxy);
    let mut c = rig.open(&[]);
    let mut block = get_block("/bomb");
    hpack_literal(0x40, "x-bomb", &"b".repeat(4000), &mut block);
    for _ in 0..4000 {
        // Indexed field: the first dynamic-table entry is index 62.
        block.push(0x80 | 62);
    }
    let sent = c.send_all(std::iter::once(frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &block,
    )));
    assert!(sent > 0);
    let (end, responses) = c.read_until_goaway(Duration::from_secs(2));
    eprintln!("HPACK bomb: {end:?}, {responses} responses");
    assert!(
        rig.up.requests().iter().all(|r| r.path != "/bomb"),
        "the bomb must not reach Ironic"
    );
    rig.memory_bounded(before, 32, "HPACK bomb");
    rig.still_serves("HPACK bomb");
}

/// PING and SETTINGS floods from a client that never reads what it is sent back: the proxy's
/// answers must not pile up in memory.
#[test]
fn ping_and_settings_floods_from_a_client_that_never_reads_stay_bounded() {
    let rig = rig();
    for (what, kind, payload) in [
        ("PING flood", PING, vec![7u8; 8]),
        ("SETTINGS flood", SETTINGS, vec![0, 3, 0, 0, 0, 100]),
    ] {
        let before = rss_kib(&rig.proxy);
        let mut c = rig.open(&[]);
        let started = Instant::now();
        // Bounded in count (500,000 frames) and, through the socket's 10 s write timeout,
        // in time once the proxy stops reading.
        let sent = c.send_all((0..500_000).map(|_| frame(kind, 0, 0, &payload)));
        eprintln!("{what}: {sent} bytes taken in {:?}", started.elapsed());
        rig.memory_bounded(before, 32, what);
        drop(c);
        rig.still_serves(what);
    }
}

/// A client that never opens its flow-control window (initial window 0) and asks for 1 MiB:
/// the response cannot move, and the connection must not be held forever. The proxy gives it
/// one to two `idle_timeout`s of no progress (the driver compares a progress counter at its
/// checks), as it gives an HTTP/1.1 client that stops reading `idle_timeout`.
#[test]
fn a_client_that_never_opens_its_window_is_cut_after_the_idle_timeout() {
    let rig = rig_with_idle_timeout("2s");
    // SETTINGS_INITIAL_WINDOW_SIZE (4) = 0.
    let mut c = rig.open(&[(4, 0)]);
    let started = Instant::now();
    c.send_all(std::iter::once(frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &get_block("/stall?size=1048576"),
    )));
    // The response head arrives, no DATA can; then the proxy must end the connection. Bounded
    // at 20 s.
    let (end, responses) = c.read_until_goaway(Duration::from_secs(20));
    let took = started.elapsed();
    eprintln!("zero window: {end:?} after {took:?}, {responses} response heads");
    assert_ne!(end, End::Open, "a stalled HTTP/2 connection must be ended");
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(10),
        "ended after {took:?}, want one to two idle_timeouts (2 s)"
    );
    assert_eq!(responses, 1, "the response head went out");
    rig.still_serves("a never-opened window");
}

/// A header block from `fields` as given (pseudo-fields included), literal and never indexed.
fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in fields {
        hpack_literal(0x00, n, v, &mut b);
    }
    b
}

/// Malformed HTTP/2 requests (RFC 9113 §8.1.1, §8.2, §8.3): each one on its own connection,
/// answered with a stream reset or 400 (or the connection ended), never forwarded; the
/// connection's next good request, or a new connection's, is served. HTTP/2 messages are
/// re-framed as HTTP/1.1 for Ironic, so anything that survived malformed would be a smuggling
/// vector there.
#[test]
fn malformed_requests_are_refused_and_never_forwarded() {
    let rig = rig();
    // POSTs: the four pseudo-fields with `path`, then `extra`; the body in one DATA frame.
    type Fields = &'static [(&'static str, &'static str)];
    #[rustfmt::skip]
    let posts: [(&'static str, &'static str, Fields, &'static str); 13] = [
        ("DATA beyond content-length", "/m-long", &[("content-length", "5")], "0123456789"),
        ("DATA short of content-length", "/m-short", &[("content-length", "10")], "abc"),
        ("two content-length", "/m-2cl", &[("content-length", "3"), ("content-length", "4")], "abc"),
        ("transfer-encoding", "/m-te", &[("transfer-encoding", "chunked")], "3\r\nabc\r\n0\r\n\r\n"),
        ("connection-specific field", "/m-conn", &[("connection", "keep-alive")], "abc"),
        ("te other than trailers", "/m-tegzip", &[("te", "gzip")], "abc"),
        ("upper-case field name", "/m-upper", &[("X-Upper", "1")], "abc"),
        ("CR LF in a value", "/m-crlf", &[("x-a", "1\r\nx-injected: 1")], "abc"),
        ("space in a field name", "/m-space", &[("x-a b", "1")], "abc"),
        ("colon in a field name", "/m-colon", &[("x-a:b", "1")], "abc"),
        // Found by fuzz/ (target `request`): the `http` crate accepts '"' in HTTP/2 names.
        ("double quote in a field name", "/m-dquote", &[("x-a\"b", "1")], "abc"),
        ("unknown pseudo-field", "/m-pseudo", &[(":foo", "1")], "abc"),
        ("two :path", "/m-2path", &[(":path", "/m-2path-b")], "abc"),
    ];
    type Case = (
        &'static str,
        Vec<(&'static str, &'static str)>,
        &'static str,
    );
    let mut cases: Vec<Case> = posts
        .iter()
        .map(|&(what, path, extra, body)| {
            let mut fields = vec![
                (":method", "POST"),
                (":scheme", "https"),
                (":path", path),
                (":authority", "localhost"),
            ];
            fields.extend_from_slice(extra);
            (what, fields, body)
        })
        .collect();
    // Whole header lists; an empty body: no DATA frame, END_STREAM on HEADERS.
    cases.extend([
        (
            "pseudo-field after a regular field",
            vec![
                (":method", "POST"),
                (":scheme", "https"),
                ("x-a", "1"),
                (":path", "/m-late"),
                (":authority", "localhost"),
            ],
            "abc",
        ),
        (
            "no :path",
            vec![
                (":method", "POST"),
                (":scheme", "https"),
                (":authority", "localhost"),
                ("x-case", "/m-nopath"),
            ],
            "abc",
        ),
        (
            ":path not a path",
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "m-relative"),
                (":authority", "localhost"),
            ],
            "",
        ),
        (
            "CONNECT",
            vec![
                (":method", "CONNECT"),
                (":authority", "m-connect.example:443"),
            ],
            "",
        ),
    ]);
    assert_eq!(cases.len(), 17);
    for (what, fields, body) in &cases {
        let mut c = rig.open(&[]);
        let end = if body.is_empty() { END_STREAM } else { 0 };
        let mut frames = vec![frame(HEADERS, END_HEADERS | end, 1, &block(fields))];
        if !body.is_empty() {
            frames.push(frame(DATA, END_STREAM, 1, body.as_bytes()));
        }
        c.send_all(frames.into_iter());
        let answer = c.answer();
        eprintln!("{what}: {answer:?}");
        assert!(
            matches!(
                answer,
                Answer::Reset(_) | Answer::Status(400) | Answer::Goaway(_) | Answer::Closed
            ),
            "{what}: refused, got {answer:?}"
        );
    }
    rig.still_serves("malformed requests");
    let leaked: Vec<String> = rig
        .up
        .all()
        .iter()
        .filter(|r| r.path != "/after")
        .map(|r| format!("{} {} {:?}", r.method, r.path, r.headers))
        .collect();
    assert!(leaked.is_empty(), "forwarded: {leaked:#?}");
    // Nor forwarded in a form the upstream's HTTP/1.1 parser refused (its 400 would pass for
    // a refusal above).
    assert_eq!(
        rig.up.malformed(),
        0,
        "requests the upstream could not parse"
    );
}
