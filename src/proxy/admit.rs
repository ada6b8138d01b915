//! Admission: the checks every request passes before routing, authentication and its body,
//! in one place. Each refusal is the client's fault (4xx) and reaches no upstream.

use super::{ConnInfo, FramingRefused, ProxyError};
use crate::config::Limits;
use http::Request;

/// Refuses what no route or upstream may see: a framing the listener found ambiguous, a client
/// certificate outside `allow`, a head over `header_bytes`, a tunnel, a target that is not an
/// ASCII path.
pub(super) fn check<B>(
    req: &Request<B>,
    conn: &ConnInfo,
    limits: &Limits,
) -> Result<(), ProxyError> {
    if let Some(FramingRefused(why)) = req.extensions().get::<FramingRefused>() {
        return Err(ProxyError::BadRequest(why));
    }
    if !conn.allowed {
        return Err(ProxyError::Forbidden);
    }
    // hyper's `max_buf_size` is only checked between reads, so a head up to about twice
    // `header_bytes` can arrive whole in one read and pass; this makes the limit exact.
    if head_size(req) > limits.header_bytes {
        return Err(ProxyError::HeadTooLarge(limits.header_bytes));
    }
    // We are a reverse proxy: no tunnels, and only origin-form (or absolute-form) targets.
    if req.method() == http::Method::CONNECT {
        return Err(ProxyError::BadRequest("CONNECT is not supported"));
    }
    if !req.uri().path().starts_with('/') {
        return Err(ProxyError::BadRequest("request target must be a path"));
    }
    // http accepts raw UTF-8 in a target; a URI is ASCII (RFC 3986 §2, RFC 9112 §3.2), and
    // Ironic's WSGI server would decode such bytes its own way. Userinfo in an
    // absolute-form target is an error too (RFC 9110 §4.2.4).
    let target_ok = req
        .uri()
        .path_and_query()
        .is_none_or(|pq| pq.as_str().bytes().all(|b| b.is_ascii_graphic()));
    if !target_ok {
        return Err(ProxyError::BadRequest("request target must be ASCII"));
    }
    if req
        .uri()
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
    {
        return Err(ProxyError::BadRequest("userinfo in the request target"));
    }
    Ok(())
}

/// The size of a request head as HTTP/1.1 writes it: request line, `name: value\r\n` per
/// field, and the blank line.
fn head_size<B>(req: &Request<B>) -> usize {
    let target = req.uri().path_and_query().map_or(1, |pq| pq.as_str().len());
    let fields: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    req.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len() + fields + 2
}
