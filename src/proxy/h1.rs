//! The HTTP/1.1 client codec of upstream connections: the request head written, the response
//! head parsed, the response body's framing decoded. The I/O around it is in
//! [`super::upstream`].
//!
//! Why our own and not hyper's client: hyper's HTTP/1.1 client runs every connection as its
//! own task, fed through a channel, and a response body through another, a hand-off per
//! keep-alive request (the measurement: docs/architecture.md, decisions). Here the request's task
//! writes the head and reads the answer itself, and the body is read from the connection by whoever
//! polls it. What we parse is what httparse parses (hyper's parser too); what is ours is small: the
//! head's serialisation, the body framing of RFC 9112 §6.3, and chunked decoding (§7.1).
//!
//! The upstream is not trusted more than a client: a head over its bound, a malformed head, a
//! `Content-Length` that does not parse or disagrees with itself, bad chunk framing, a chunk
//! size over 64 bits, a chunk line or trailer section over its bound are errors (the request
//! gets 502), never a panic and never a guess.

mod chunked;
mod whole;

pub(crate) use chunked::{Chunked, Decoded};
pub use whole::{read_whole_response, WholeResponse};

use super::headers;
use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use smallvec::SmallVec;
use std::io;

/// Header fields in a response head, as hyper's client allows by default.
const MAX_HEADERS: usize = 100;

/// The least room in a response's header map. hyper keeps the map of the response it last
/// wrote on a connection and parses that connection's next request into it; the forwarded
/// request then gains up to five fields (`X-Forwarded-For`, `-Proto`, `-Host`, `-Client-Cert`,
/// `Via`). With room for an Ironic client's head (python-requests sends about nine fields) plus
/// those, the request's map never grows on the way through: a grow rehashes every field, on
/// every request. The price is the room's memory per connection while hyper holds it, none
/// once the connection parks.
const REQUEST_ROOM: usize = 24;

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// How a request body is framed on the wire to the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RequestFraming {
    /// No body, or the `Content-Length` the request already carries.
    AsIs,
    /// A known length the request does not state: `Content-Length` is added.
    Length(u64),
    /// An unknown length: `Transfer-Encoding: chunked` is added and the body chunk-encoded.
    Chunked,
}

/// Appends the request head (HTTP/1.1, origin-form target) to `out`.
pub(crate) fn write_head(
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    framing: RequestFraming,
    out: &mut Vec<u8>,
) {
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let target = if target.is_empty() { "/" } else { target };
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        RequestFraming::AsIs => {}
        RequestFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends one chunk's size line to `out` (the data and its CRLF follow).
pub(crate) fn chunk_line(len: usize, out: &mut Vec<u8>) {
    use std::io::Write as _;
    let _ = write!(out, "{len:x}\r\n");
}

/// A response head, parsed.
pub(crate) struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
}

/// Parses a response head at the start of `buf` and takes it out of `buf`: `Ok(None)` (and
/// `buf` untouched) while it is incomplete. Header values share the head's bytes, not copies.
pub(crate) fn parse_head(buf: &mut BytesMut) -> io::Result<Option<ResponseHead>> {
    // Where each field's name and value are in `buf`, so that the head can be split off once
    // parsed and its values sliced from it.
    let mut fields: SmallVec<[(usize, usize, usize, usize); 16]> = SmallVec::new();
    let (len, code, minor) = {
        let mut slots =
            [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut slots)
        {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(invalid("too many response headers"))
            }
            Err(_) => return Err(invalid("malformed response head")),
        };
        let base = buf.as_ptr() as usize;
        for h in resp.headers.iter() {
            let name = h.name.as_ptr() as usize - base;
            let value = h.value.as_ptr() as usize - base;
            fields.push((name, name + h.name.len(), value, value + h.value.len()));
        }
        (len, resp.code, resp.version)
    };
    let status = code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| invalid("invalid response status"))?;
    let version = match minor {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let raw = buf.split_to(len).freeze();
    // Room for the `Via` the proxy appends, so that appending it does not grow the map; and
    // at least REQUEST_ROOM: see there.
    let mut headers = HeaderMap::with_capacity((fields.len() + 1).max(REQUEST_ROOM));
    for (n0, n1, v0, v1) in fields {
        let name = HeaderName::from_bytes(&raw[n0..n1])
            .map_err(|_| invalid("invalid response header name"))?;
        let value = HeaderValue::from_maybe_shared(raw.slice(v0..v1))
            .map_err(|_| invalid("invalid response header value"))?;
        headers.append(name, value);
    }
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
    }))
}

/// How a response body is delimited (RFC 9112 §6.3), and whether the connection can carry
/// another request after it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ResponseFraming {
    pub body: BodyKind,
    pub keep_alive: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BodyKind {
    Empty,
    Length(u64),
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// The framing of the response to a `method` request.
pub(crate) fn response_framing(
    method: &Method,
    head: &ResponseHead,
) -> io::Result<ResponseFraming> {
    // One pass over the fields for the three names that frame a response, instead of a hashed
    // lookup per name and use (five per response).
    let mut connection: SmallVec<[&HeaderValue; 1]> = SmallVec::new();
    let mut lengths: SmallVec<[&HeaderValue; 1]> = SmallVec::new();
    let mut last_te: Option<&HeaderValue> = None;
    for (name, value) in &head.headers {
        if name == header::CONNECTION {
            connection.push(value);
        } else if name == header::CONTENT_LENGTH {
            lengths.push(value);
        } else if name == header::TRANSFER_ENCODING {
            last_te = Some(value);
        }
    }
    // After a 101 the connection speaks another protocol (we never ask for one: it is refused).
    let mut keep_alive = connection_allows_reuse(head.version, &connection)
        && head.status != StatusCode::SWITCHING_PROTOCOLS;
    let status = head.status.as_u16();
    let body = if *method == Method::HEAD
        || status == 204
        || status == 304
        || head.status.is_informational()
    {
        BodyKind::Empty
    } else if let Some(te) = last_te {
        // HTTP/1.0 has no transfer codings (RFC 9112 §6.1: a recipient of such a message MUST
        // treat it as faulty framing and close the connection after it). hyper's client
        // refuses the response (`Client::decoder`, "HTTP/1.0 cannot have Transfer-Encoding
        // header"); so do we: the request gets 502 and the connection is not kept.
        if head.version == Version::HTTP_10 {
            return Err(invalid("Transfer-Encoding in an HTTP/1.0 response"));
        }
        // Both fields: Transfer-Encoding wins (§6.3 item 3), and a message framed two ways is
        // not one to read another message after.
        if !lengths.is_empty() {
            keep_alive = false;
        }
        // As hyper's `is_chunked_`: a value that is not visible ASCII is not chunked.
        let last = te.to_str().ok().and_then(|v| v.rsplit(',').next());
        if last.is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked")) {
            BodyKind::Chunked
        } else {
            keep_alive = false;
            BodyKind::Close
        }
    } else if !lengths.is_empty() {
        match headers::agreed_length(lengths) {
            Ok(Some(0)) => BodyKind::Empty,
            // hyper's client refuses the two largest values (its markers for chunked and
            // close-delimited bodies).
            Ok(Some(n)) if n > u64::MAX - 2 => return Err(invalid("Content-Length too large")),
            Ok(Some(n)) => BodyKind::Length(n),
            Ok(None) => return Err(invalid("invalid Content-Length")),
            Err(why) => return Err(invalid(why)),
        }
    } else {
        keep_alive = false;
        BodyKind::Close
    };
    Ok(ResponseFraming { body, keep_alive })
}

/// HTTP/1.1 keeps the connection unless `Connection: close`; HTTP/1.0 only with `keep-alive`.
/// `connection`: the response's `Connection` values.
fn connection_allows_reuse(version: Version, connection: &[&HeaderValue]) -> bool {
    let has = |token: &[u8]| {
        connection.iter().any(|v| {
            v.as_bytes()
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
        })
    };
    if has(b"close") {
        return false;
    }
    version == Version::HTTP_11 || has(b"keep-alive")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> ResponseHead {
        parse(raw.as_bytes())
            .expect("a valid head")
            .expect("a complete head")
    }

    fn parse(raw: &[u8]) -> io::Result<Option<ResponseHead>> {
        parse_head(&mut BytesMut::from(raw))
    }

    fn framing(method: &Method, raw: &str) -> io::Result<ResponseFraming> {
        response_framing(method, &head(raw))
    }

    #[test]
    fn request_heads_are_written_in_origin_form_with_the_framing_asked_for() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("localhost"));
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        let mut out = Vec::new();
        let uri: http::Uri = "/v1/nodes?detail=true".parse().unwrap();
        write_head(
            &Method::POST,
            &uri,
            &h,
            RequestFraming::Length(12),
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/nodes?detail=true HTTP/1.1\r\nhost: localhost\r\nx-a: 1\r\nx-a: 2\r\n\
             content-length: 12\r\n\r\n"
        );
        let mut out = Vec::new();
        write_head(&Method::PUT, &uri, &h, RequestFraming::Chunked, &mut out);
        assert!(String::from_utf8(out)
            .unwrap()
            .ends_with("x-a: 2\r\ntransfer-encoding: chunked\r\n\r\n"));
        let mut out = Vec::new();
        chunk_line(0x1f40, &mut out);
        assert_eq!(out, b"1f40\r\n");
    }

    #[test]
    fn response_heads_parse_once_complete() {
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Len"[..]);
        assert!(parse_head(&mut buf).unwrap().is_none());
        assert_eq!(buf.len(), 28, "an incomplete head stays in the buffer");
        let mut buf =
            BytesMut::from(&b"HTTP/1.0 404 Not Found\r\nA: b\r\nA: c\r\nX-Y:  z \r\n\r\nbody"[..]);
        let h = parse_head(&mut buf).unwrap().expect("a complete head");
        assert_eq!(h.status, StatusCode::NOT_FOUND);
        assert_eq!(h.version, Version::HTTP_10);
        let a: Vec<_> = h.headers.get_all("a").iter().collect();
        assert_eq!(a, ["b", "c"]);
        assert_eq!(h.headers["x-y"], "z");
        assert_eq!(
            &buf[..],
            b"body",
            "the head is taken out of the buffer, the body stays"
        );
    }

    #[test]
    fn malformed_response_heads_are_errors() {
        for raw in [
            &b"HTTP/1.1 2000 OK\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nA: \x00\r\n\r\n",
            b"HTTP/2 200 OK\r\n\r\n",
            b"\x16\x03\x01\x00\x05hello",
        ] {
            assert!(parse(raw).is_err(), "{:?}", String::from_utf8_lossy(raw));
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("h{i}: v\r\n")).collect();
        let raw = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert!(parse(raw.as_bytes()).is_err());
    }

    #[test]
    fn bodies_are_framed_as_rfc_9112_says() {
        use BodyKind::*;
        let cases = [
            (
                Method::GET,
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                Length(5),
                true,
            ),
            (
                Method::GET,
                "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n",
                Length(5),
                true,
            ),
            (
                Method::GET,
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                Empty,
                true,
            ),
            (
                Method::HEAD,
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                Empty,
                true,
            ),
            (Method::GET, "HTTP/1.1 204 No Content\r\n\r\n", Empty, true),
            (
                Method::GET,
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                Empty,
                true,
            ),
            (
                Method::GET,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                Chunked,
                true,
            ),
            (
                Method::GET,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n",
                Chunked,
                true,
            ),
            (
                Method::GET,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                Chunked,
                false,
            ),
            (
                Method::GET,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                Close,
                false,
            ),
            (Method::GET, "HTTP/1.1 200 OK\r\n\r\n", Close, false),
            (
                Method::GET,
                "HTTP/1.1 200 OK\r\nConnection: x, Close\r\nContent-Length: 1\r\n\r\n",
                Length(1),
                false,
            ),
            (
                Method::GET,
                "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n",
                Length(1),
                false,
            ),
            (
                Method::GET,
                "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n",
                Length(1),
                true,
            ),
        ];
        for (method, raw, body, keep_alive) in cases {
            assert_eq!(
                framing(&method, raw).expect(raw),
                ResponseFraming { body, keep_alive },
                "{raw}"
            );
        }
        for raw in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
        ] {
            assert!(framing(&Method::GET, raw).is_err(), "{raw}");
        }
    }

    /// RFC 9112 §6.1: HTTP/1.0 has no transfer codings; a 1.0 response with Transfer-Encoding
    /// is faulty framing. It was read as chunked and the connection kept; hyper's client
    /// refuses it (`Client::decoder`), and so do we now: an error (502), the connection gone.
    /// A response without a body (HEAD, 204, 304) is not framed by it, in hyper as here.
    #[test]
    fn an_http_1_0_response_with_transfer_encoding_is_refused() {
        for raw in [
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\n",
        ] {
            assert!(framing(&Method::GET, raw).is_err(), "{raw}");
        }
        let no_body = "HTTP/1.0 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(
            framing(&Method::GET, no_body).expect("no body").body,
            BodyKind::Empty
        );
        let head = "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(
            framing(&Method::HEAD, head).expect("no body").body,
            BodyKind::Empty
        );
    }

    /// Where hyper's client rules differ from a first reading of RFC 9112, we follow hyper's
    /// (found reading `hyper` 1.x `proto/h1/role.rs` and `headers.rs` side by side).
    #[test]
    fn lengths_and_codings_are_read_as_hyper_reads_them() {
        use BodyKind::*;
        for (raw, body) in [
            // Leading zeros: any number while the value fits in 64 bits (was: at most 19).
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 000000000000000000005\r\n\r\n",
                Length(5),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551613\r\n\r\n",
                Length(u64::MAX - 2),
            ),
            // A coding list that is not visible ASCII is not chunked: read to the close.
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: \u{e9}, chunked\r\n\r\n",
                Close,
            ),
        ] {
            assert_eq!(framing(&Method::GET, raw).expect(raw).body, body, "{raw}");
        }
        // hyper's markers for chunked and close-delimited bodies are not lengths.
        for raw in [
            "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551614\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551616\r\n\r\n",
        ] {
            assert!(framing(&Method::GET, raw).is_err(), "{raw}");
        }
    }
}
