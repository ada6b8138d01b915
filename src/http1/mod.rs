//! HTTP/1.1 framing, in one place: head parsing (requests and responses, with httparse as
//! hyper configures it), the body framing rules (RFC 9112 §6.3 for responses, hyper's server
//! rules for requests), the one chunked decoder, the request head writer, and what can be
//! wrong with any of them ([`Error`]). A low layer: bytes in, facts out; no I/O.
//!
//! Its users: the upstream client (`proxy::upstream`, which reads responses over any
//! `AsyncRead + AsyncWrite`), the listener's framing guard (`listen::guard`, which follows the
//! requests hyper's server reads), `doctor`'s one-shot GET, and the fuzz targets.
//!
//! Why our own client and not hyper's: hyper's HTTP/1.1 client runs every connection as its
//! own task, fed through a channel, and a response body through another, a hand-off per
//! keep-alive request (the measurement: docs/architecture.md, decisions). What we parse is what
//! httparse parses (hyper's parser too); what is ours is small: the head's serialisation, the
//! body framing, and chunked decoding (§7.1).
//!
//! A peer is not trusted: a head over its bound, a malformed head, a `Content-Length` that does
//! not parse or disagrees with itself, bad chunk framing, a chunk size over 64 bits, a chunk
//! line or trailer section over its bound are errors, never a panic and never a guess.

mod chunked;
mod error;
mod request;
mod response;
#[cfg(test)]
mod tests;

pub(crate) use chunked::{Chunked, Decoded};
pub(crate) use error::Error;
pub(crate) use request::{chunk_line, parse_request_head, write_head, RequestBody, RequestFraming};
pub(crate) use response::{
    keep_alive_timeout, parse_response_head, response_framing, BodyKind, ResponseFraming,
    ResponseHead,
};

/// `Keep-Alive` (RFC 9112 appendix C.2.2): hop-by-hop, and where a server says how long it keeps
/// an idle connection.
pub(crate) const KEEP_ALIVE: http::header::HeaderName =
    http::header::HeaderName::from_static("keep-alive");

/// Header fields in a head: hyper's default for its client and its server (100, as HAProxy's
/// `tune.http.maxhdr` 101), which the listener leaves as it is; more get 431 from hyper. Left
/// unset, hyper parses a head into arrays on the stack; set, it allocates two arrays of that
/// many entries for every request it parses.
pub(crate) const MAX_HEADERS: usize = 100;

/// The least room in a response's header map. hyper keeps the map of the response it last
/// wrote on a connection and parses that connection's next request into it; the forwarded
/// request then gains up to five fields (`X-Forwarded-For`, `-Proto`, `-Host`, `-Client-Cert`,
/// `Via`). With room for an Ironic client's head (python-requests sends about nine fields) plus
/// those, the request's map never grows on the way through: a grow rehashes every field, on
/// every request. The price is the room's memory per connection while hyper holds it, none
/// once the connection parks.
const REQUEST_ROOM: usize = 24;

/// The one length that every `Content-Length` value and list element names (`None` without
/// any): an error for an element that is not a decimal number or for numbers that differ.
/// Requests are held stricter than this by the proxy (no repeats, `proxy::headers`); responses
/// may repeat one value.
pub(crate) fn agreed_length<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<u64>, Error> {
    let mut found: Option<u64> = None;
    for v in values {
        for part in v.split(|b| *b == b',') {
            let part = part.trim_ascii();
            // As hyper parses it (`headers::from_digits`): digits only, any number of them
            // (leading zeros too) while the value fits in 64 bits.
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return Err(Error::InvalidLength);
            }
            let n = part
                .iter()
                .try_fold(0u64, |n, d| {
                    n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                })
                .ok_or(Error::InvalidLength)?;
            match found {
                Some(prev) if prev != n => return Err(Error::ConflictingLength),
                _ => found = Some(n),
            }
        }
    }
    Ok(found)
}

/// Whether a `Transfer-Encoding` value's final coding is `chunked`, as hyper's `is_chunked_`
/// reads it: a value that is not visible ASCII (`HeaderValue::to_str`) is not chunked.
fn ends_in_chunked(value: &[u8]) -> bool {
    let visible = value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b));
    visible
        && value
            .rsplit(|b| *b == b',')
            .next()
            .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}
