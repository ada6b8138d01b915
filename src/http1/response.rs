//! Responses: the head parsed as hyper's client parses it, and the body's framing by
//! RFC 9112 §6.3 as hyper's client reads it.

use super::{agreed_length, ends_in_chunked, Error, KEEP_ALIVE, MAX_HEADERS, REQUEST_ROOM};
use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use smallvec::SmallVec;
use std::time::Duration;

/// A response head, parsed.
pub(crate) struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
}

/// Parses a response head at the start of `buf` and takes it out of `buf`: `Ok(None)` (and
/// `buf` untouched) while it is incomplete. Header values share the head's bytes, not copies.
pub(crate) fn parse_response_head(buf: &mut BytesMut) -> Result<Option<ResponseHead>, Error> {
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
            Err(httparse::Error::TooManyHeaders) => return Err(Error::TooManyHeaders),
            Err(_) => return Err(Error::MalformedHead),
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
        .ok_or(Error::InvalidStatus)?;
    let version = match minor {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let raw = buf.split_to(len).freeze();
    // Room for the `Via` the proxy appends, so that appending it does not grow the map; and
    // at least REQUEST_ROOM: see there.
    let mut headers = HeaderMap::with_capacity((fields.len() + 1).max(REQUEST_ROOM));
    for (n0, n1, v0, v1) in fields {
        let name = HeaderName::from_bytes(&raw[n0..n1]).map_err(|_| Error::InvalidHeaderName)?;
        let value = HeaderValue::from_maybe_shared(raw.slice(v0..v1))
            .map_err(|_| Error::InvalidHeaderValue)?;
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
) -> Result<ResponseFraming, Error> {
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
            return Err(Error::TransferEncodingInHttp10);
        }
        // Both fields: Transfer-Encoding wins (§6.3 item 3), and a message framed two ways is
        // not one to read another message after.
        if !lengths.is_empty() {
            keep_alive = false;
        }
        // As hyper's `is_chunked_`: a value that is not visible ASCII is not chunked.
        if ends_in_chunked(te.as_bytes()) {
            BodyKind::Chunked
        } else {
            keep_alive = false;
            BodyKind::Close
        }
    } else if !lengths.is_empty() {
        match agreed_length(lengths.iter().map(|v| v.as_bytes()))? {
            Some(0) => BodyKind::Empty,
            // hyper's client refuses the two largest values (its markers for chunked and
            // close-delimited bodies).
            Some(n) if n > u64::MAX - 2 => return Err(Error::LengthTooLarge),
            Some(n) => BodyKind::Length(n),
            None => return Err(Error::InvalidLength),
        }
    } else {
        keep_alive = false;
        BodyKind::Close
    };
    Ok(ResponseFraming { body, keep_alive })
}

/// How long the server says it keeps an idle connection open: the `timeout` parameter of its
/// `Keep-Alive` field (RFC 7230 §A.1.2 names the field; Apache httpd and nginx send
/// `timeout=<seconds>`, and so do this proxy's listeners). `None` when the field is absent, has
/// no `timeout`, or its value is not a whole number of seconds; of several, the first.
pub(crate) fn keep_alive_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(KEEP_ALIVE)?.as_bytes();
    let param = value.split(|b| *b == b',').find_map(|p| {
        let (name, secs) = p.trim_ascii().split_at_checked(b"timeout=".len())?;
        name.eq_ignore_ascii_case(b"timeout=").then_some(secs)
    })?;
    if param.is_empty() || param.len() > 9 || !param.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let secs = param.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(Duration::from_secs(secs))
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
