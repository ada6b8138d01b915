//! Requests: the head the upstream client writes, and the head and body framing of a request
//! as hyper's server reads it (which the listener's framing guard follows).

use super::{agreed_length, ends_in_chunked, Error, MAX_HEADERS};
use http::header::HeaderMap;
use http::Method;
use std::mem::MaybeUninit;

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

/// What a request head says, as far as its framing goes.
#[derive(Debug)]
pub(crate) struct RequestHead {
    /// The head's length in bytes; its body (if any) starts there.
    pub len: usize,
    pub method: Method,
    /// The target has a `#` (a fragment, which no request target may carry).
    pub fragment: bool,
    /// Whether the head has `Transfer-Encoding`, and how many `Content-Length` fields.
    pub transfer_encoding: bool,
    pub length_fields: usize,
    /// The body as hyper's server reads it, or why hyper refuses the request.
    pub body: Result<RequestBody, Error>,
}

/// How a request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestBody {
    Empty,
    Length(u64),
    Chunked,
}

/// Parses a request head at the start of `buf` with the parser and field limit hyper's server
/// uses: `Ok(None)` while it is incomplete.
pub(crate) fn parse_request_head(buf: &[u8]) -> Result<Option<RequestHead>, Error> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_request_with_uninit_headers(&mut req, buf, &mut slots)
    {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Error::MalformedRequestHead),
    };
    let method = req
        .method
        .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
        .ok_or(Error::MalformedRequestHead)?;
    let mut last_te: Option<&[u8]> = None;
    let mut lengths: smallvec::SmallVec<[&[u8]; 1]> = smallvec::SmallVec::new();
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            last_te = Some(h.value);
        } else if h.name.eq_ignore_ascii_case("content-length") {
            lengths.push(h.value);
        }
    }
    Ok(Some(RequestHead {
        len,
        method,
        fragment: req.path.is_some_and(|p| p.contains('#')),
        transfer_encoding: last_te.is_some(),
        length_fields: lengths.len(),
        body: request_body(req.version == Some(1), last_te, &lengths),
    }))
}

/// hyper's rule for the body of a request (`proto::h1::role::Server::parse`): any
/// Transfer-Encoding makes it chunked if the last field's final coding is `chunked` and the
/// request is HTTP/1.1 (anything else is refused); otherwise Content-Length, every value and
/// list element equal; otherwise none.
fn request_body(
    http11: bool,
    last_te: Option<&[u8]>,
    lengths: &[&[u8]],
) -> Result<RequestBody, Error> {
    if let Some(te) = last_te {
        return if !http11 {
            Err(Error::TransferEncodingInHttp10Request)
        } else if ends_in_chunked(te) {
            Ok(RequestBody::Chunked)
        } else {
            Err(Error::NotChunked)
        };
    }
    Ok(match agreed_length(lengths.iter().copied())? {
        Some(n) if n > 0 => RequestBody::Length(n),
        _ => RequestBody::Empty,
    })
}
