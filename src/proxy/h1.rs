//! The HTTP/1.1 client codec of upstream connections: the request head written, the response
//! head parsed, the response body's framing decoded. The I/O around it is in
//! [`super::upstream`].
//!
//! Why our own and not hyper's client: hyper's HTTP/1.1 client runs every connection as its
//! own task, fed through a channel, and a response body through another; per keep-alive request
//! that task, its dispatch and its channels were a quarter of the proxy's user-space instructions
//! (callgrind, BENCHMARKS.md "Our own upstream client"). Here the request's task writes the head
//! and reads the answer itself, and the body is read from the connection by whoever polls it.
//! What we parse is what httparse parses (hyper's parser too); what is ours is small: the head's
//! serialisation, the body framing of RFC 9112 §6.3, and chunked decoding (§7.1).
//!
//! The upstream is not trusted more than a client: a head over its bound, a malformed head, a
//! `Content-Length` that does not parse or disagrees with itself, bad chunk framing, a chunk
//! size over 64 bits, a chunk line or trailer section over its bound are errors (the request
//! gets 502), never a panic and never a guess.

use super::headers;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use smallvec::SmallVec;
use std::io;

/// Header fields in a response head, as hyper's client allows by default.
const MAX_HEADERS: usize = 100;

/// A chunk-size line (size and extensions) may not be longer.
const MAX_CHUNK_LINE: usize = 4096;

/// The least room in a response's header map. hyper keeps the map of the response it last
/// wrote on a connection and parses that connection's next request into it; the forwarded
/// request then gains up to five fields (`X-Forwarded-For`, `-Proto`, `-Host`, `-Client-Cert`,
/// `Via`). With room for an Ironic client's head (python-requests sends about nine fields) plus
/// those, the request's map never grows on the way through: a grow rehashes every field and
/// cost about 1,000 instructions per request (callgrind). The price is about 2 KiB more per
/// connection while hyper holds it, none once the connection parks.
const REQUEST_ROOM: usize = 24;

/// The trailer section of a chunked body (read and dropped) may not be longer.
const MAX_TRAILERS: usize = 16 * 1024;

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
        // Both fields: Transfer-Encoding wins (§6.3 item 3), and a message framed two ways is
        // not one to read another message after.
        if !lengths.is_empty() {
            keep_alive = false;
        }
        let last = te
            .as_bytes()
            .rsplit(|b| *b == b',')
            .next()
            .unwrap_or_default();
        if last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            BodyKind::Chunked
        } else {
            keep_alive = false;
            BodyKind::Close
        }
    } else if !lengths.is_empty() {
        match headers::agreed_length(lengths) {
            Ok(Some(0)) => BodyKind::Empty,
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

/// What [`Chunked::decode`] found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    Data(Bytes),
    /// The last chunk and the trailer section have been read.
    End,
    /// More bytes are needed.
    More,
}

/// A chunked body's decoder (RFC 9112 §7.1). Trailer fields are read and dropped.
#[derive(Debug, Default)]
pub(crate) struct Chunked {
    state: ChunkState,
    trailer_bytes: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
    Done,
}

impl Chunked {
    /// Decodes from the front of `buf`, consuming what it uses.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> io::Result<Decoded> {
        loop {
            match self.state {
                ChunkState::Done => return Ok(Decoded::End),
                ChunkState::Size => {
                    let Some(line) = take_line(buf, MAX_CHUNK_LINE)? else {
                        return Ok(Decoded::More);
                    };
                    let size = chunk_size(&line)?;
                    self.state = if size == 0 {
                        ChunkState::Trailers
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::More);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(invalid("chunk data not followed by CRLF"));
                    }
                    buf.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => {
                    let room = MAX_TRAILERS.saturating_sub(self.trailer_bytes);
                    let Some(line) = take_line(buf, room)? else {
                        return Ok(Decoded::More);
                    };
                    self.trailer_bytes += line.len() + 2;
                    if line.is_empty() {
                        self.state = ChunkState::Done;
                    }
                }
            }
        }
    }
}

/// A CRLF-terminated line from the front of `buf`, without its CRLF; `None` while incomplete.
fn take_line(buf: &mut BytesMut, max: usize) -> io::Result<Option<BytesMut>> {
    match memchr::memchr(b'\n', buf) {
        Some(i) if i > max => Err(invalid("chunk line or trailers too long")),
        Some(0) => Err(invalid("bare LF in chunked body")),
        Some(i) => {
            if buf[i - 1] != b'\r' {
                return Err(invalid("bare LF in chunked body"));
            }
            let mut line = buf.split_to(i + 1);
            line.truncate(i - 1);
            Ok(Some(line))
        }
        None if buf.len() > max => Err(invalid("chunk line or trailers too long")),
        None => Ok(None),
    }
}

/// `chunk-size [ chunk-ext ]`: hex digits, then nothing or `;` extensions (whitespace before
/// the `;` allowed, RFC 9112 §7.1.1 BWS).
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(invalid("invalid chunk size"));
    }
    let rest = line[digits..].trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(invalid("invalid chunk size"));
    }
    Ok(line[..digits].iter().fold(0u64, |n, d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => d - b'A' + 10,
        };
        (n << 4) | u64::from(v)
    }))
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

    /// Decodes `wire` fed in pieces of `step` bytes; the data, or the first error.
    fn dechunk(wire: &[u8], step: usize) -> io::Result<(Vec<u8>, usize)> {
        let mut d = Chunked::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in wire.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match d.decode(&mut buf)? {
                    Decoded::Data(b) => out.extend_from_slice(&b),
                    Decoded::More => break,
                    Decoded::End => return Ok((out, buf.len())),
                }
            }
        }
        Err(io::Error::new(io::ErrorKind::UnexpectedEof, "not ended"))
    }

    #[test]
    fn chunked_bodies_decode_however_they_arrive() {
        let wire =
            b"5\r\nhello\r\n1;ext=\"a;b\"\r\n \r\nA \t;x\r\n0123456789\r\n0\r\nT: v\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, wire.len()] {
            let (data, left) = dechunk(wire, step).expect("a valid chunked body");
            assert_eq!(data, b"hello 0123456789", "step {step}");
            // What follows the body stays in the buffer (it is not ours to read).
            if step == wire.len() {
                assert_eq!(left, 4);
            }
        }
    }

    #[test]
    fn bad_chunk_framing_is_an_error_not_a_guess() {
        let long_line = format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE));
        let long_trailers = format!("0\r\nT: {}\r\n\r\n", "v".repeat(MAX_TRAILERS));
        for wire in [
            &b"5\r\nhelloX\r\n0\r\n\r\n"[..],
            b"\r\nhello\r\n0\r\n\r\n",
            b"g\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"10000000000000000\r\n",
            long_line.as_bytes(),
            long_trailers.as_bytes(),
        ] {
            for step in [1, wire.len()] {
                assert!(
                    dechunk(wire, step).is_err(),
                    "{:?} step {step}",
                    String::from_utf8_lossy(wire)
                );
            }
        }
        // The largest size that fits in 64 bits is a size, not an overflow.
        let mut d = Chunked::default();
        let mut buf = BytesMut::from(&b"ffffffffffffffff\r\nabc"[..]);
        assert_eq!(
            d.decode(&mut buf).unwrap(),
            Decoded::Data(Bytes::from_static(b"abc"))
        );
    }
}
