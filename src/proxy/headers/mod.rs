//! Request framing checks and header hygiene, in both directions.
//!
//! - Framing (RFC 9112 §6): a request with both `Content-Length` and `Transfer-Encoding`, with
//!   conflicting or malformed `Content-Length`, or with any transfer coding other than exactly
//!   `chunked` is rejected, never forwarded. hyper already refuses most of these; the checks
//!   here close the cases RFC 9112 leaves to the recipient (it MAY process CL+TE) and make the
//!   rule explicit.
//! - Hop-by-hop fields (RFC 9110 §7.6.1): `Connection` and every field it names, `Keep-Alive`,
//!   `Proxy-Connection`, `TE`, `Transfer-Encoding`, `Upgrade`, `Trailer` and `Proxy-Authorization`
//!   are not forwarded. We never upgrade connections (no `h2c`, no WebSocket: Ironic has none).
//! - Field names with an underscore are dropped (as nginx does by default): WSGI servers map
//!   `X_Forwarded_Client_Cert` and `X-Forwarded-Client-Cert` to the same variable, so a client
//!   could otherwise smuggle an identity past the dash-spelled removal.
//! - `X-Forwarded-Client-Cert`, `X-Forwarded-Proto` and `X-Forwarded-Host` from the client are
//!   replaced by ours; `X-Forwarded-For` gets the client address appended; `Via` gets our entry.
//!   A client's RFC 7239 `Forwarded` is removed: oslo.middleware's HTTPProxyToWSGI (Ironic's
//!   proxy-header parser) prefers it over `X-Forwarded-*`, so it would override ours.
//! - A plain relay (the egress's `plain_ports` and `others = "relay"`) keeps the client's fields
//!   but never its identity ones ([`strip_relayed`]): `X-Forwarded-Client-Cert`, `Forwarded`
//!   and underscore names go there too, since the server behind may trust them as an
//!   ironic-proxy's, and the relay has no verified identity to put in their place.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Version};
use smallvec::SmallVec;

pub(crate) const XFCC: HeaderName = HeaderName::from_static("x-forwarded-client-cert");
pub(crate) const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) const XFH: HeaderName = HeaderName::from_static("x-forwarded-host");
pub(crate) use crate::http1::KEEP_ALIVE;
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// The pseudonym in `Via` (RFC 9110 §7.6.3).
pub const VIA_NAME: &str = "ironic-proxy";

/// The framing of a request that passed the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// Checks `Content-Length`, `Transfer-Encoding` and `Host` of an HTTP/1.x request.
pub fn check_framing(version: Version, headers: &HeaderMap) -> Result<Framing, &'static str> {
    // One pass over the fields instead of a hashed lookup per name (three names, each looked up
    // on every request): comparing a standard name is one byte.
    let mut te: SmallVec<[&HeaderValue; 1]> = SmallVec::new();
    let mut cl: SmallVec<[&HeaderValue; 1]> = SmallVec::new();
    let mut hosts: SmallVec<[&HeaderValue; 1]> = SmallVec::new();
    for (name, value) in headers {
        if name == header::TRANSFER_ENCODING {
            te.push(value);
        } else if name == header::CONTENT_LENGTH {
            cl.push(value);
        } else if name == header::HOST {
            hosts.push(value);
        }
    }
    // Forwarded as HTTP/1.1, where several Host fields are invalid (RFC 9112 §3.2): an HTTP/1.0
    // or HTTP/2 request may not have more than one either, or the upstream would pick one.
    if hosts.len() > 1 {
        return Err("more than one Host header");
    }
    if version == Version::HTTP_2 || version == Version::HTTP_3 {
        if !te.is_empty() {
            return Err("transfer-encoding is not allowed in HTTP/2");
        }
        // Re-framed as HTTP/1.1, every name must be a token there (RFC 9110 §5.1). The `http`
        // crate's HTTP/2 name table also takes '"' (found by fuzz/, target `request`: Ironic's
        // HTTP/1.1 parser refused what we forwarded); HTTP/1.1 requests were parsed by httparse,
        // which takes tokens only.
        if headers
            .keys()
            .any(|name| !name.as_str().bytes().all(is_tchar))
        {
            return Err("invalid character in a header field name");
        }
        return content_length(&cl).map(|l| l.map_or(Framing::None, Framing::Length));
    }
    // RFC 9112 §3.2: 400 for an HTTP/1.1 request without Host, for any request with more than
    // one Host line or with an invalid Host value (uri-host [ ":" port ], RFC 9110 §7.2; no
    // userinfo, RFC 9110 §4.2.4).
    if version == Version::HTTP_11 && hosts.is_empty() {
        return Err("exactly one Host header is required");
    }
    if hosts.first().is_some_and(|h| !valid_host(h.as_bytes())) {
        return Err("invalid Host header");
    }
    if !te.is_empty() {
        if !cl.is_empty() {
            return Err("both Content-Length and Transfer-Encoding");
        }
        if version != Version::HTTP_11 {
            return Err("Transfer-Encoding requires HTTP/1.1");
        }
        if te.len() != 1 {
            return Err("repeated Transfer-Encoding");
        }
        let v = te[0].as_bytes();
        let trimmed = v.trim_ascii();
        if !trimmed.eq_ignore_ascii_case(b"chunked") || trimmed.len() != v.len() {
            return Err("unsupported Transfer-Encoding (only a bare \"chunked\" is accepted)");
        }
        return Ok(Framing::Chunked);
    }
    content_length(&cl).map(|l| l.map_or(Framing::None, Framing::Length))
}

/// A `tchar` of RFC 9110 §5.6.2 (names reach here lower-cased).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `uri-host [ ":" port ]`: what `http`'s authority parser accepts, minus userinfo.
fn valid_host(v: &[u8]) -> bool {
    !v.is_empty() && !v.contains(&b'@') && http::uri::Authority::try_from(v).is_ok()
}

fn content_length(values: &[&HeaderValue]) -> Result<Option<u64>, &'static str> {
    let found =
        crate::http1::agreed_length(values.iter().map(|v| v.as_bytes())).map_err(|e| match e {
            crate::http1::Error::ConflictingLength => "conflicting Content-Length",
            _ => "invalid Content-Length",
        })?;
    if values.len() > 1 || values.first().is_some_and(|v| v.as_bytes().contains(&b',')) {
        // Identical repeats are legal (RFC 9110 §8.6) but a smuggling tell; be strict.
        return Err("repeated Content-Length");
    }
    Ok(found)
}

/// Hop-by-hop fields that are never forwarded (RFC 9110 §7.6.1), besides those `Connection`
/// names.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
];

/// Removes hop-by-hop fields, including those named in `Connection` (RFC 9110 §7.6.1).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip(headers, false, &[]);
}

/// The fields of a request relayed as the client would have sent it without a proxy: the
/// hop-by-hop ones go, and so does every field a client could claim an identity with
/// (`X-Forwarded-Client-Cert`, `Forwarded`, any name with `_`), exactly as [`rewrite_request`]
/// removes them; no value of ours replaces them.
pub fn strip_relayed(headers: &mut HeaderMap) {
    strip(headers, true, &[XFCC, FORWARDED]);
}

/// One pass over the field names instead of a lookup per hop-by-hop name, and no allocation in
/// the common case (at most `Connection: keep-alive`); with `underscores`, names containing `_`
/// go too, and so do the names in `also`. A name that is not there costs no lookup.
fn strip(headers: &mut HeaderMap, underscores: bool, also: &[HeaderName]) {
    let mut doomed: SmallVec<[HeaderName; 4]> = SmallVec::new();
    let mut connection = false;
    for name in headers.keys() {
        if name == header::CONNECTION {
            connection = true;
        } else if HOP_BY_HOP.contains(name)
            || also.contains(name)
            || (underscores && name.as_str().contains('_'))
        {
            doomed.push(name.clone());
        }
    }
    if connection {
        // Further `Connection` lines are rare; only they are copied (reference counts).
        let more: Vec<HeaderValue> = headers
            .get_all(header::CONNECTION)
            .iter()
            .skip(1)
            .cloned()
            .collect();
        if let Some(first) = headers.remove(header::CONNECTION) {
            for value in std::iter::once(&first).chain(&more) {
                let Ok(value) = value.to_str() else { continue };
                for token in value.split(',') {
                    // `&str` keys are matched case-insensitively, without allocating.
                    headers.remove(token.trim());
                }
            }
        }
    }
    for name in doomed {
        headers.remove(name);
    }
}

/// What the proxy knows about the client, for the forwarded headers.
pub struct Forwarded<'a> {
    /// The client's address as a header value ([`ip_value`]), formatted once per connection.
    pub client_ip: Option<&'a HeaderValue>,
    pub proto: &'static str,
    /// The request's `Host` (or HTTP/2 authority), for `X-Forwarded-Host`.
    pub host: Option<&'a HeaderValue>,
    /// The connection's verified client identity, built once per connection.
    pub xfcc: Option<&'a HeaderValue>,
    pub version: Version,
}

/// Rewrites request headers for the upstream.
pub fn rewrite_request(headers: &mut HeaderMap, fwd: &Forwarded<'_>) {
    // The client's own of the fields we set: removed where we have no value to put in.
    let mut also: SmallVec<[HeaderName; 3]> = SmallVec::new();
    also.push(FORWARDED);
    if fwd.xfcc.is_none() {
        also.push(XFCC);
    }
    if fwd.host.is_none() {
        also.push(XFH);
    }
    strip(headers, true, &also);
    // `insert` replaces every value the client sent.
    if let Some(v) = fwd.xfcc {
        headers.insert(XFCC, v.clone());
    }
    if let Some(ip) = fwd.client_ip {
        let joined = match headers.get(XFF).and_then(|v| v.to_str().ok()) {
            Some(prev) if !prev.trim().is_empty() => {
                let ip = ip.to_str().unwrap_or_default();
                HeaderValue::from_str(&format!("{prev}, {ip}")).ok()
            }
            _ => Some(ip.clone()),
        };
        if let Some(v) = joined {
            headers.insert(XFF, v);
        }
    } else {
        // A unix-socket client has no address to append; keep what earlier hops wrote.
    }
    headers.insert(XFP, HeaderValue::from_static(fwd.proto));
    if let Some(h) = fwd.host {
        headers.insert(XFH, h.clone());
    }
    append_via(headers, fwd.version);
}

/// An address as a header value, formatted on the stack: the value's copy is the only
/// allocation.
pub fn ip_value(ip: std::net::IpAddr) -> Option<HeaderValue> {
    use std::io::Write as _;
    // The longest textual IPv6 address is 45 bytes.
    let mut buf = [0u8; 48];
    let mut rest = &mut buf[..];
    write!(rest, "{ip}").ok()?;
    let len = 48 - rest.len();
    HeaderValue::from_bytes(&buf[..len]).ok()
}

/// Rewrites response headers for the client.
pub fn rewrite_response(headers: &mut HeaderMap, version: Version) {
    // One pass to learn what needs doing; most responses need none of it.
    let (mut te, mut lengths, mut listed) = (false, 0usize, false);
    for (name, value) in &*headers {
        if name == header::TRANSFER_ENCODING {
            te = true;
        } else if name == header::CONTENT_LENGTH {
            lengths += 1;
            listed |= value.as_bytes().contains(&b',');
        }
    }
    // RFC 9112 §6.3 item 3: Transfer-Encoding overrides Content-Length, and an intermediary
    // MUST remove the received Content-Length before forwarding. Our client reads the body by
    // Transfer-Encoding but leaves the field; relayed, it would frame the decoded body anew.
    if te && lengths > 0 {
        headers.remove(header::CONTENT_LENGTH);
    } else if lengths > 1 || listed {
        fold_content_length(headers);
    }
    strip_hop_by_hop(headers);
    append_via(headers, version);
}

/// hyper accepts a response `Content-Length` that repeats one value as a list (`5, 5`), which
/// RFC 9110 §8.6 allows a recipient to replace with that single value; relaying the list would
/// leave every client after us to decide again. Folded here; a list that does not agree (which
/// hyper would already have refused) is dropped, leaving the body to frame itself.
fn fold_content_length(headers: &mut HeaderMap) {
    let values: Vec<&HeaderValue> = headers.get_all(header::CONTENT_LENGTH).iter().collect();
    if values.len() == 1 && !values[0].as_bytes().contains(&b',') {
        return;
    }
    if values.is_empty() {
        return;
    }
    let mut parts = values
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|p| {
            std::str::from_utf8(p.trim_ascii())
                .ok()?
                .parse::<u64>()
                .ok()
        });
    let first = parts.next().flatten();
    let agreed = first.filter(|n| parts.all(|p| p == Some(*n)));
    headers.remove(header::CONTENT_LENGTH);
    if let Some(n) = agreed {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
}

/// The size of a response head as received, near enough to hold it to `header_bytes`: the
/// status line and every field line with its separators.
pub fn head_len(headers: &HeaderMap) -> usize {
    let fields: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    fields + "HTTP/1.1 200 \r\n\r\n".len()
}

fn append_via(headers: &mut HeaderMap, version: Version) {
    let entry = match version {
        Version::HTTP_10 => "1.0 ironic-proxy",
        Version::HTTP_2 => "2 ironic-proxy",
        _ => "1.1 ironic-proxy",
    };
    headers.append(header::VIA, HeaderValue::from_static(entry));
}

/// True when an earlier ironic-proxy already forwarded this request (`Via` names us).
pub fn came_through_proxy(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::VIA)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|entry| entry.split_whitespace().nth(1) == Some(VIA_NAME))
}

/// Methods that may be replayed after a request reached an upstream (docs/reference.md: retries).
pub fn is_replayable(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

#[cfg(test)]
mod tests;
