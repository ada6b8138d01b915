//! Adversarial HTTP/1.1 framing (issue 5, item 1): request smuggling shapes and malformed heads,
//! sent as raw bytes over a `none` listener and over rustls to a `server` and a `mutual`
//! listener, against the real proxy and a recording upstream behind a byte tap.
//!
//! For every case and listener the test checks what the client got (statuses, connection
//! closed or not), what reached the upstream byte for byte (parsed strictly: canonical framing,
//! exactly the requests the client legitimately sent, never the `/tail` request a smuggling
//! parser would see), and that a normal request is served right after. A case lists more than
//! one acceptable outcome only where RFC 9112/9110 allow both, with the section named; the
//! table in `docs/adversarial.md` says which one we chose.

use crate::support::{adversary, wire};

use adversary::{Reached, Rig, Seen, Target, ALL};
use std::time::Duration;
use wire::Wire;

/// The request a desynchronised parser would see as a second request.
const TAIL: &str = "GET /tail HTTP/1.1\r\nHost: x\r\n\r\n";

/// One acceptable outcome.
#[derive(Clone, Debug)]
struct Want {
    statuses: Vec<u16>,
    /// (method, target, body) of every request the upstream must get, in order.
    upstream: Vec<(&'static str, String, Vec<u8>)>,
    /// Whether the proxy must have closed the connection (`None`: either).
    closed: Option<bool>,
    /// An upstream request cut off before it was complete is acceptable (streamed bodies).
    partial_ok: bool,
}

/// Refused with one of `statuses`, the connection closed, nothing forwarded.
fn refused_with(statuses: &[u16]) -> Vec<Want> {
    statuses
        .iter()
        .map(|s| Want {
            statuses: vec![*s],
            upstream: vec![],
            closed: Some(true),
            partial_ok: false,
        })
        .collect()
}

/// Refused with 400 and closed (RFC 9112 §6.3 / §2.2 / §5): the usual answer.
fn refused() -> Vec<Want> {
    refused_with(&[400])
}

/// Closed without any response and nothing forwarded.
fn dropped() -> Want {
    Want {
        statuses: vec![],
        upstream: vec![],
        closed: Some(true),
        partial_ok: false,
    }
}

fn served(statuses: &[u16], upstream: &[(&'static str, &str, &[u8])]) -> Want {
    Want {
        statuses: statuses.to_vec(),
        upstream: upstream
            .iter()
            .map(|(m, t, b)| (*m, (*t).to_owned(), b.to_vec()))
            .collect(),
        closed: None,
        partial_ok: false,
    }
}

/// An extra check on the requests the upstream got.
type Check = fn(&[Wire]) -> Result<(), String>;

struct Case {
    name: &'static str,
    raw: Vec<u8>,
    wants: Vec<Want>,
    /// Extra checks on what the upstream got.
    check: Option<Check>,
}

fn case(name: &'static str, raw: impl AsRef<[u8]>, wants: Vec<Want>) -> Case {
    Case {
        name,
        raw: raw.as_ref().to_vec(),
        wants,
        check: None,
    }
}

/// `POST /a` with `fields` (CRLF-terminated lines), then `body`, then [`TAIL`].
fn post(fields: &str, body: &str) -> String {
    format!("POST /a HTTP/1.1\r\nHost: x\r\n{fields}\r\n{body}{TAIL}")
}

const CHUNKED_HELLO: &str = "5\r\nhello\r\n0\r\n\r\n";

/// Both Content-Length and Transfer-Encoding, in every order (RFC 9112 §6.3 item 3: a server
/// MAY reject or process by Transfer-Encoding, and MUST close afterwards; this proxy: reject).
fn cl_te() -> Vec<Case> {
    vec![
        case(
            "CL then TE",
            post("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"),
            refused(),
        ),
        case(
            "TE then CL",
            post("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "0\r\n\r\n"),
            refused(),
        ),
        case(
            "CL, TE, CL",
            post(
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n",
                "0\r\n\r\n",
            ),
            refused(),
        ),
        case(
            "TE then CL 0 on GET",
            format!(
                "GET /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n{CHUNKED_HELLO}{TAIL}"
            ),
            refused(),
        ),
        case(
            "CL 0 then TE with a chunked body",
            post("Content-Length: 0\r\nTransfer-Encoding: chunked\r\n", CHUNKED_HELLO),
            refused(),
        ),
        case(
            "lower-case CL and TE",
            post("content-length: 5\r\ntransfer-encoding: chunked\r\n", "0\r\n\r\n"),
            refused(),
        ),
        case(
            "upper-case CL and TE",
            post("CONTENT-LENGTH: 5\r\nTRANSFER-ENCODING: chunked\r\n", "0\r\n\r\n"),
            refused(),
        ),
        case(
            "CL with TE identity",
            post("Content-Length: 5\r\nTransfer-Encoding: identity\r\n", "hello"),
            refused(),
        ),
    ]
}

/// Duplicate and invalid Content-Length (RFC 9112 §6.3 item 5: invalid -> 400 and close;
/// RFC 9110 §8.6: identical duplicates MAY be folded or rejected; we reject).
fn content_length() -> Vec<Case> {
    let cl = |v: &str| post(&format!("Content-Length: {v}\r\n"), "hello");
    vec![
        case("CL +5", cl("+5"), refused()),
        case("CL -5", cl("-5"), refused()),
        case("CL 0x5", cl("0x5"), refused()),
        case("CL 5.0", cl("5.0"), refused()),
        case("CL 5e0", cl("5e0"), refused()),
        case("CL empty", cl(""), refused()),
        case("CL list 5, 5", cl("5, 5"), refused()),
        case("CL list 5,5", cl("5,5"), refused()),
        case("CL list 5, 6", cl("5, 6"), refused()),
        case(
            "CL duplicated 5 and 5",
            post("Content-Length: 5\r\nContent-Length: 5\r\n", "hello"),
            refused(),
        ),
        case(
            "CL conflicting 5 and 6",
            post("Content-Length: 5\r\nContent-Length: 6\r\n", "hello"),
            refused(),
        ),
        case(
            "CL 20-digit overflow",
            cl("99999999999999999999"),
            refused(),
        ),
        // u64::MAX itself: hyper refuses it as too large for its length type before we see it
        // (431); any refusal that forwards nothing is right, 400 and 413 included.
        case(
            "CL u64::MAX",
            cl("18446744073709551615"),
            refused_with(&[400, 413, 431]),
        ),
        // A valid length far above max_body_bytes: 413 before any upstream contact; the body
        // never comes, so the connection must not wait for it.
        case(
            "CL above max_body_bytes",
            cl("9999999999999999999"),
            refused_with(&[413]),
        ),
        case("CL with NUL", cl("5\0"), refused()),
        // Leading zeros are still 1*DIGIT (RFC 9110 §8.6): "005" is 5, then TAIL is the next
        // request.
        case(
            "CL leading zeros",
            cl("005"),
            vec![served(
                &[200, 200],
                &[("POST", "/a", b"hello"), ("GET", "/tail", b"")],
            )],
        ),
    ]
}

/// Obfuscated Transfer-Encoding (RFC 9112 §6.1: chunked MUST be final; §6.3 item 4: a request
/// whose final coding is not chunked -> 400 and close). This proxy: exactly one `chunked`.
fn transfer_encoding() -> Vec<Case> {
    let te = |v: &str| post(&format!("Transfer-Encoding: {v}\r\n"), CHUNKED_HELLO);
    let ok = || {
        vec![served(
            &[200, 200],
            &[("POST", "/a", b"hello"), ("GET", "/tail", b"")],
        )]
    };
    vec![
        case("TE chunked, identity", te("chunked, identity"), refused()),
        case("TE identity, chunked", te("identity, chunked"), refused()),
        case("TE gzip, chunked", te("gzip, chunked"), refused()),
        case("TE chunked, chunked", te("chunked, chunked"), refused()),
        case("TE xchunked", te("xchunked"), refused()),
        case("TE chunkedx", te("chunkedx"), refused()),
        case("TE quoted", te("\"chunked\""), refused()),
        case("TE with a parameter", te("chunked;q=1"), refused()),
        case("TE vertical tab", te("\x0bchunked"), refused()),
        case("TE form feed", te("\x0cchunked"), refused()),
        case("TE NUL", te("chunked\0"), refused()),
        case("TE empty", te(""), refused()),
        case(
            "TE space before colon",
            post("Transfer-Encoding : chunked\r\n", CHUNKED_HELLO),
            refused(),
        ),
        case(
            "TE tab before colon",
            post("Transfer-Encoding\t: chunked\r\n", CHUNKED_HELLO),
            refused(),
        ),
        case(
            "TE folded (obs-fold)",
            post("Transfer-Encoding:\r\n chunked\r\n", CHUNKED_HELLO),
            refused(),
        ),
        case(
            "TE folded after a value",
            post("Transfer-Encoding: identity\r\n chunked\r\n", CHUNKED_HELLO),
            refused(),
        ),
        case(
            "TE duplicated",
            post(
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                CHUNKED_HELLO,
            ),
            refused(),
        ),
        case(
            "TE chunked then identity",
            post(
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
                CHUNKED_HELLO,
            ),
            refused(),
        ),
        case(
            "TE on HTTP/1.0",
            format!(
                "POST /a HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{CHUNKED_HELLO}{TAIL}"
            ),
            refused(),
        ),
        // Whitespace around a field value is not part of it (RFC 9110 §5.5), and coding names
        // are case-insensitive (RFC 9112 §7): these are plain `chunked`.
        case("TE leading tab", te("\tchunked"), ok()),
        case("TE trailing spaces", te("chunked  "), ok()),
        case("TE upper case", te("CHUNKED"), ok()),
        // A field name with an underscore is not Transfer-Encoding: no body; the proxy drops
        // the field; the chunk bytes are then a malformed next request (400, close).
        case(
            "Transfer_Encoding",
            post("Transfer_Encoding: chunked\r\n", "0\r\n\r\n"),
            vec![Want {
                closed: Some(true),
                ..served(&[200, 400], &[("POST", "/a", b"")])
            }],
        ),
    ]
}

/// Bad chunk sizes and extensions (RFC 9112 §7.1: chunk-size is 1*HEXDIG, every line CRLF).
/// Chunked bodies are streamed; a body that turns out malformed is refused with 400.
fn chunks() -> Vec<Case> {
    let body = |b: &str| post("Transfer-Encoding: chunked\r\n", b);
    let ok = || {
        vec![served(
            &[200, 200],
            &[("POST", "/a", b"hello"), ("GET", "/tail", b"")],
        )]
    };
    let many_ext: String = (0..200).map(|i| format!(";e{i}=v{i}")).collect();
    let huge_ext = format!(";x={}", "a".repeat(20 * 1024));
    vec![
        case(
            "chunk size negative",
            body("-5\r\nhello\r\n0\r\n\r\n"),
            refused(),
        ),
        case(
            "chunk size hex overflow",
            body("10000000000000005\r\nhello\r\n0\r\n\r\n"),
            refused(),
        ),
        case(
            "chunk size 0x prefix",
            body("0x5\r\nhello\r\n0\r\n\r\n"),
            refused(),
        ),
        case(
            "chunk size leading space",
            body(" 5\r\nhello\r\n0\r\n\r\n"),
            refused(),
        ),
        case(
            "chunk size missing",
            body("\r\nhello\r\n0\r\n\r\n"),
            refused(),
        ),
        case(
            "chunk size bare LF",
            body("5\nhello\r\n0\r\n\r\n"),
            refused(),
        ),
        case(
            "chunk data without CRLF",
            body("5\r\nhelloX0\r\n\r\n"),
            refused(),
        ),
        case(
            "chunk data too long",
            body("3\r\nhello\r\n0\r\n\r\n"),
            refused(),
        ),
        case(
            "chunk data bare LF",
            body("5\r\nhello\n0\r\n\r\n"),
            refused(),
        ),
        case("last chunk bare LF", body("5\r\nhello\r\n0\n\n"), refused()),
        case(
            "chunk extension with bare LF",
            body("5;a\nb\r\nhello\r\n0\r\n\r\n"),
            refused(),
        ),
        case(
            "chunk extension of 20 KiB",
            body(&format!("5{huge_ext}\r\nhello\r\n0\r\n\r\n")),
            refused(),
        ),
        // Extensions are legal and ignored (RFC 9112 §7.1.1); they are not forwarded.
        case(
            "200 chunk extensions",
            body(&format!("5{many_ext}\r\nhello\r\n0\r\n\r\n")),
            ok(),
        ),
        case(
            "quoted chunk extension",
            body("5;name=\"a;b\"\r\nhello\r\n0\r\n\r\n"),
            ok(),
        ),
        // BWS after the size is only allowed before a `;` (RFC 9112 §7.1), but a recipient that
        // reads "5 " as 5 and re-frames the body cannot desynchronise anyone: either is fine.
        case(
            "chunk size trailing space",
            body("5 \r\nhello\r\n0\r\n\r\n"),
            [ok(), refused()].concat(),
        ),
        // A trailer section is legal (RFC 9112 §7.1.2); trailers are not forwarded.
        case(
            "trailer fields",
            body("5\r\nhello\r\n0\r\nX-Trailer: 1\r\nContent-Length: 99\r\n\r\n"),
            ok(),
        ),
        case(
            "trailer with obs-fold",
            body("5\r\nhello\r\n0\r\nX-Trailer: 1\r\n folded\r\n\r\n"),
            refused(),
        ),
    ]
}

/// Bare CR/LF, obs-fold, NUL and control bytes in the head (RFC 9112 §2.2, §5.1, §5.2;
/// RFC 9110 §5.5).
fn head_bytes() -> Vec<Case> {
    let get = |fields: &str| format!("GET /a HTTP/1.1\r\nHost: x\r\n{fields}\r\n{TAIL}");
    let pair = || {
        vec![served(
            &[200, 200],
            &[("GET", "/a", b""), ("GET", "/tail", b"")],
        )]
    };
    vec![
        case("bare CR in a value", get("X-A: a\rb\r\n"), refused()),
        case("bare CR ends a line", get("X-A: a\rX-B: b\r\n"), refused()),
        case(
            "bare CR ends the request line",
            format!("GET /a HTTP/1.1\rHost: x\r\n\r\n{TAIL}"),
            refused(),
        ),
        // A lone LF MAY be read as a line end (RFC 9112 §2.2); forwarded with CRLF either way.
        case(
            "bare LF line ends",
            format!("GET /a HTTP/1.1\nHost: x\n\n{TAIL}"),
            [pair(), refused()].concat(),
        ),
        case("obs-fold in a field", get("X-A: a\r\n b\r\n"), refused()),
        case("obs-fold with a tab", get("X-A: a\r\n\tb\r\n"), refused()),
        case(
            "whitespace before the first field",
            format!("GET /a HTTP/1.1\r\n Host: x\r\n\r\n{TAIL}"),
            refused(),
        ),
        case("NUL in a value", get("X-A: a\0b\r\n"), refused()),
        case("NUL in a name", get("X-\0A: b\r\n"), refused()),
        case("SOH in a value", get("X-A: a\x01b\r\n"), refused()),
        case("DEL in a value", get("X-A: a\x7fb\r\n"), refused()),
        case("ESC in a value", get("X-A: \x1b[31m\r\n"), refused()),
        case(
            "NUL in the target",
            format!("GET /a\0b HTTP/1.1\r\nHost: x\r\n\r\n{TAIL}"),
            refused(),
        ),
        case(
            "space in the target",
            format!("GET /a b HTTP/1.1\r\nHost: x\r\n\r\n{TAIL}"),
            refused(),
        ),
        case("empty field name", get(": b\r\n"), refused()),
        case("space in a field name", get("X A: b\r\n"), refused()),
        case("field without a colon", get("X-A\r\n"), refused()),
        case(
            "non-ASCII in the target",
            format!("GET /\u{e9} HTTP/1.1\r\nHost: x\r\n\r\n{TAIL}"),
            refused(),
        ),
        // obs-text in a value is allowed (RFC 9110 §5.5) and forwarded as is.
        case(
            "obs-text in a value",
            [
                &b"GET /a HTTP/1.1\r\nHost: x\r\nX-A: caf\xe9\r\n\r\n"[..],
                TAIL.as_bytes(),
            ]
            .concat(),
            [pair(), refused()].concat(),
        ),
        // An empty line before the request line SHOULD be ignored (RFC 9112 §2.2).
        case(
            "CRLF before the request line",
            format!("\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\n{TAIL}"),
            [pair(), refused()].concat(),
        ),
    ]
}

/// Request lines and targets (RFC 9112 §3, §3.2).
fn request_lines() -> Vec<Case> {
    let line = |l: &str| format!("{l}\r\nHost: x\r\n\r\n{TAIL}");
    vec![
        case("two spaces", line("GET  /a HTTP/1.1"), refused()),
        case("tab separator", line("GET\t/a HTTP/1.1"), refused()),
        case("lower-case version", line("GET /a http/1.1"), refused()),
        // RFC 9110 §15.6.6 allows 505 for an unsupported major version; 400 is also right.
        case(
            "HTTP/1.2",
            line("GET /a HTTP/1.2"),
            refused_with(&[400, 505]),
        ),
        case(
            "HTTP/2.0 in HTTP/1",
            line("GET /a HTTP/2.0"),
            refused_with(&[400, 505]),
        ),
        case("HTTP/3", line("GET /a HTTP/3"), refused_with(&[400, 505])),
        case("bad method token", line("GE(T /a HTTP/1.1"), refused()),
        // HTTP/0.9 has no version and no headers: there is nothing sensible to answer, a 400 in
        // HTTP/1.1 or a silent close are both fine; it must never be forwarded.
        case(
            "HTTP/0.9 request",
            "GET /\r\n",
            [refused(), vec![dropped()]].concat(),
        ),
        case(
            "HTTP/2 preface on HTTP/1.1",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            [refused(), vec![dropped()]].concat(),
        ),
        // Only origin-form and absolute-form reach Ironic (RFC 9112 §3.2): asterisk-form and
        // authority-form outside CONNECT are refused, and CONNECT is never a tunnel.
        case(
            "asterisk-form OPTIONS",
            line("OPTIONS * HTTP/1.1"),
            refused(),
        ),
        case("asterisk-form GET", line("GET * HTTP/1.1"), refused()),
        case(
            "authority-form GET",
            line("GET evil.example:443 HTTP/1.1"),
            refused(),
        ),
        case(
            "CONNECT",
            format!("CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n{TAIL}"),
            refused(),
        ),
        case("relative target", line("GET a/b HTTP/1.1"), refused()),
        // Userinfo in a target is an error (RFC 9110 §4.2.4), and would become the Host.
        case(
            "absolute-form with userinfo",
            line("GET http://user:pw@evil.example/a HTTP/1.1"),
            refused(),
        ),
        // absolute-form MUST be accepted (RFC 9112 §3.2.2); its authority replaces Host.
        Case {
            check: Some(|w| {
                let w = &w[0];
                (w.all("host") == ["evil.example"] && w.all("x-forwarded-host") == ["evil.example"])
                    .then_some(())
                    .ok_or_else(|| format!("Host must come from the target: {:?}", w.headers))
            }),
            ..case(
                "absolute-form",
                line("GET http://evil.example/a?q=1 HTTP/1.1"),
                vec![served(
                    &[200, 200],
                    &[("GET", "/a?q=1", b""), ("GET", "/tail", b"")],
                )],
            )
        },
        // An empty path is sent as "/" (RFC 9112 §3.2.1); a query alone keeps it.
        case(
            "absolute-form, empty path and a query",
            line("GET http://evil.example?q=1 HTTP/1.1"),
            vec![served(
                &[200, 200],
                &[("GET", "/?q=1", b""), ("GET", "/tail", b"")],
            )],
        ),
        // A target has no fragment (RFC 9112 §3.2); `http` would drop it silently, so the
        // upstream would see another path than the one the client sent. Found by the fuzzer:
        // `http://b:8#/close` went out as an empty target.
        case(
            "absolute-form with a fragment",
            line("GET http://evil.example#/close HTTP/1.1"),
            refused(),
        ),
        case(
            "origin-form with a fragment",
            line("GET /a#/b HTTP/1.1"),
            refused(),
        ),
        case(
            "absolute-form https",
            line("GET https://evil.example/a HTTP/1.1"),
            vec![served(
                &[200, 200],
                &[("GET", "/a", b""), ("GET", "/tail", b"")],
            )],
        ),
    ]
}

/// Host (RFC 9112 §3.2: exactly one, with a valid value, else 400) and HTTP/1.0.
fn host_and_versions() -> Vec<Case> {
    vec![
        case("Host missing", format!("GET /a HTTP/1.1\r\n\r\n{TAIL}"), refused()),
        case(
            "Host duplicated",
            format!("GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n{TAIL}"),
            refused(),
        ),
        case(
            "Host duplicated, same value",
            format!("GET /a HTTP/1.1\r\nHost: x\r\nHost: x\r\n\r\n{TAIL}"),
            refused(),
        ),
        case(
            "Host list",
            format!("GET /a HTTP/1.1\r\nHost: x, y\r\n\r\n{TAIL}"),
            refused(),
        ),
        case(
            "Host with a space",
            format!("GET /a HTTP/1.1\r\nHost: a b\r\n\r\n{TAIL}"),
            refused(),
        ),
        case(
            "Host with userinfo",
            format!("GET /a HTTP/1.1\r\nHost: user@evil.example\r\n\r\n{TAIL}"),
            refused(),
        ),
        case(
            "Host with a path",
            format!("GET /a HTTP/1.1\r\nHost: x/../y\r\n\r\n{TAIL}"),
            refused(),
        ),
        // HTTP/1.0 needs no Host; the proxy speaks HTTP/1.1 upstream and sends one.
        Case {
            check: Some(|w| {
                (w[0].all("host").len() == 1)
                    .then_some(())
                    .ok_or_else(|| format!("HTTP/1.1 upstream needs a Host: {:?}", w[0].headers))
            }),
            ..case(
                "HTTP/1.0 without Host",
                "GET /a HTTP/1.0\r\n\r\n",
                vec![Want {
                    closed: Some(true),
                    ..served(&[200], &[("GET", "/a", b"")])
                }],
            )
        },
        case(
            "HTTP/1.0 keep-alive pipelined",
            "GET /a HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\nHost: x\r\n\r\n",
            vec![Want {
                closed: Some(true),
                ..served(&[200, 200], &[("GET", "/a", b""), ("GET", "/b", b"")])
            }],
        ),
        case(
            "HTTP/1.0 POST with a body",
            "POST /a HTTP/1.0\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
            vec![Want {
                closed: Some(true),
                ..served(&[200], &[("POST", "/a", b"hello")])
            }],
        ),
    ]
}

/// Requests hidden in bodies and pipelined after them: a request inside a body is body.
fn pipelining() -> Vec<Case> {
    let inner = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    let n = inner.len();
    vec![
        case(
            "POST then pipelined GET",
            post("Content-Length: 5\r\n", "hello"),
            vec![served(&[200, 200], &[("POST", "/a", b"hello"), ("GET", "/tail", b"")])],
        ),
        case(
            "request inside a Content-Length body",
            post(&format!("Content-Length: {n}\r\n"), inner),
            vec![served(
                &[200, 200],
                &[("POST", "/a", inner.as_bytes()), ("GET", "/tail", b"")],
            )],
        ),
        case(
            "request inside a chunked body",
            post(
                "Transfer-Encoding: chunked\r\n",
                &format!("{n:x}\r\n{inner}\r\n0\r\n\r\n"),
            ),
            vec![served(
                &[200, 200],
                &[("POST", "/a", inner.as_bytes()), ("GET", "/tail", b"")],
            )],
        ),
        case(
            "request inside a GET body",
            format!("GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{inner}{TAIL}"),
            vec![served(
                &[200, 200],
                &[("GET", "/a", inner.as_bytes()), ("GET", "/tail", b"")],
            )],
        ),
        case(
            "body longer than its Content-Length",
            format!("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloX\r\n{TAIL}"),
            vec![Want {
                closed: Some(true),
                ..served(&[200, 400], &[("POST", "/a", b"hello")])
            }],
        ),
        case(
            "Content-Length longer than the body",
            post("Content-Length: 10\r\n", "hello"),
            vec![Want {
                closed: Some(true),
                ..served(&[200, 400], &[("POST", "/a", b"helloGET /")])
            }],
        ),
        case(
            "Expect: 100-continue",
            format!("POST /a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello{TAIL}"),
            vec![
                served(&[100, 200, 200], &[("POST", "/a", b"hello"), ("GET", "/tail", b"")]),
                // A server MAY skip the 100 when the body has already arrived (RFC 9110 §10.1.1).
                served(&[200, 200], &[("POST", "/a", b"hello"), ("GET", "/tail", b"")]),
            ],
        ),
    ]
}

fn matches(want: &Want, seen: &Seen, reached: &Reached) -> Result<(), String> {
    if seen.statuses != want.statuses {
        return Err(format!(
            "statuses {:?}, want {:?}",
            seen.statuses, want.statuses
        ));
    }
    if let Some(c) = want.closed {
        if seen.closed != c {
            return Err(format!("connection closed: {}, want {c}", seen.closed));
        }
    }
    let got: Vec<(&str, &str, &[u8])> = reached
        .requests
        .iter()
        .map(|w| (w.method.as_str(), w.target.as_str(), w.body.as_slice()))
        .collect();
    let expected: Vec<(&str, &str, &[u8])> = want
        .upstream
        .iter()
        .map(|(m, t, b)| (*m, t.as_str(), b.as_slice()))
        .collect();
    if got != expected {
        return Err(format!(
            "upstream got {:?}, want {:?}",
            got.iter()
                .map(|(m, t, b)| format!("{m} {t} {:?}", String::from_utf8_lossy(b)))
                .collect::<Vec<_>>(),
            expected
                .iter()
                .map(|(m, t, b)| format!("{m} {t} {:?}", String::from_utf8_lossy(b)))
                .collect::<Vec<_>>()
        ));
    }
    if reached.partial > 0 && !want.partial_ok {
        return Err(format!(
            "{} incomplete request(s) reached the upstream",
            reached.partial
        ));
    }
    Ok(())
}

/// Runs every case on every listener; returns one line per failure.
fn run(rig: &Rig, cases: &[Case], targets: &[Target]) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    let mut runs = 0;
    for t in targets {
        for c in cases {
            runs += 1;
            let mark = rig.tap.mark();
            let seen = rig.exchange(*t, &c.raw, Duration::from_millis(300));
            let reached = rig.reached_since(&mark);
            let mut problems: Vec<String> = Vec::new();
            if !reached.errors.is_empty() {
                problems.push(format!(
                    "non-canonical bytes upstream: {:?}",
                    reached.errors
                ));
            }
            if reached
                .requests
                .iter()
                .any(|w| w.target.contains("smuggled"))
            {
                problems.push("a request hidden in a body reached the upstream".into());
            }
            for w in &reached.requests {
                if w.headers.iter().any(|(n, _)| n.contains('_')) {
                    problems.push(format!("underscore field forwarded: {:?}", w.headers));
                }
            }
            let verdicts: Vec<Result<(), String>> = c
                .wants
                .iter()
                .map(|w| matches(w, &seen, &reached))
                .collect();
            if !verdicts.iter().any(Result::is_ok) {
                let why: Vec<String> = verdicts.into_iter().filter_map(Result::err).collect();
                problems.push(format!(
                    "{} (client got {:?})",
                    why.join(" | or | "),
                    String::from_utf8_lossy(&seen.bytes[..seen.bytes.len().min(300)])
                ));
            } else if let Some(check) = c.check {
                if let Err(e) = check(&reached.requests) {
                    problems.push(e);
                }
            }
            if let Err(e) = rig.normal_request(*t) {
                problems.push(format!("afterwards: {e}"));
            }
            if !problems.is_empty() {
                failures.push(format!("[{t:?}] {}: {}", c.name, problems.join("; ")));
            }
        }
    }
    (runs, failures)
}

fn check_all(name: &str, cases: &[Case]) {
    let rig = Rig::new(|b| b.limit("max_body_bytes", "1048576"));
    let started = std::time::Instant::now();
    let (runs, failures) = run(&rig, cases, &ALL);
    eprintln!(
        "{name}: {} cases x {} listeners = {runs} runs in {:?}, {} failed",
        cases.len(),
        ALL.len(),
        started.elapsed(),
        failures.len()
    );
    assert!(adversary::alive(&rig.proxy), "the proxy died");
    assert_eq!(
        rig.up.malformed(),
        0,
        "the upstream never got bytes it could not parse"
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn content_length_with_transfer_encoding_is_refused_in_every_order() {
    check_all("CL+TE", &cl_te());
}

#[test]
fn duplicate_and_invalid_content_length_is_refused() {
    check_all("Content-Length", &content_length());
}

#[test]
fn obfuscated_transfer_encoding_is_refused() {
    check_all("Transfer-Encoding", &transfer_encoding());
}

#[test]
fn bad_chunk_sizes_and_extensions_are_refused() {
    check_all("chunks", &chunks());
}

#[test]
fn bare_cr_lf_obs_fold_and_control_bytes_are_refused() {
    check_all("head bytes", &head_bytes());
}

#[test]
fn request_lines_and_target_forms() {
    check_all("request lines", &request_lines());
}

#[test]
fn host_rules_and_http_1_0() {
    check_all("Host and HTTP/1.0", &host_and_versions());
}

#[test]
fn requests_in_bodies_are_body_and_pipelining_stays_in_step() {
    check_all("pipelining", &pipelining());
}
