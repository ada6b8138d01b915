//! The forwarding service: one request in, one request to an upstream endpoint, one response
//! out, with the limits, header hygiene and error statuses of DESIGN.md.
//!
//! Request bodies of known length up to [`BUFFER_LIMIT`] are read completely (within
//! `body_timeout`) before an upstream is contacted: Ironic's JSON bodies are small, a slow
//! client then never ties up an Ironic worker, and a buffered request can be retried on another
//! endpoint. Larger and chunked bodies are streamed through a size and time limit.

pub mod body;
mod error;
pub mod headers;
mod log;
pub mod upstream;

pub use error::{json_response, Blame, ProxyError};

use crate::config::Limits;
use crate::metrics::Metrics;
use crate::tls::ClientIdentity;
use body::{CutSlot, Limited, RequestBody, ResponseBody};
use bytes::Bytes;
use headers::Framing;
use http::{header, HeaderValue, Request, Response, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::time::Instant;
use upstream::Endpoint;

/// Bodies up to this size (with a known length) are buffered before forwarding.
pub const BUFFER_LIMIT: u64 = 64 * 1024;

/// What the listener knows about the connection a request came on.
#[derive(Clone, Debug, Default)]
pub struct ConnInfo {
    pub peer: Option<SocketAddr>,
    pub identity: Option<Arc<ClientIdentity>>,
    /// False when a verified client certificate is outside `allow`: every request gets 403.
    pub allowed: bool,
    /// The identity in `X-Forwarded-Client-Cert` form, computed once per connection.
    pub xfcc: Option<Arc<str>>,
    pub tls: bool,
}

/// Where a listener's requests go.
pub struct Upstream {
    pub name: String,
    pub local: Option<Arc<Endpoint>>,
}

impl Upstream {
    fn pick(&self) -> Option<Arc<Endpoint>> {
        self.local.clone()
    }
}

/// One listener's forwarding service.
pub struct Proxy {
    listener: Arc<str>,
    upstream: Upstream,
    limits: Limits,
    metrics: Metrics,
}

impl Proxy {
    pub fn new(listener: &str, upstream: Upstream, limits: Limits, metrics: Metrics) -> Self {
        Self {
            listener: listener.into(),
            upstream,
            limits,
            metrics,
        }
    }

    pub fn listener(&self) -> &str {
        &self.listener
    }

    /// Handles one request; never fails: errors become the proxy's own responses.
    pub async fn handle(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<ResponseBody> {
        let start = Instant::now();
        let mut record = log::Record::new(&self.listener, &req, conn, self.metrics.clone(), start);
        let mut resp = match self.forward(req, conn).await {
            Ok((resp, endpoint)) => {
                record.upstream = Some(endpoint);
                resp
            }
            Err(e) => {
                if e.blame() != Blame::Client {
                    tracing::warn!(listener = %self.listener, error = %e, "request failed");
                } else {
                    tracing::debug!(listener = %self.listener, error = %e, "request refused");
                }
                record.blame = Some(e.blame());
                e.to_response()
            }
        };
        record.status = resp.status().as_u16();
        resp.body_mut().set_on_end(Box::new(record));
        resp
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        conn: &ConnInfo,
    ) -> Result<(Response<ResponseBody>, String), ProxyError> {
        if !conn.allowed {
            return Err(ProxyError::Forbidden);
        }
        // hyper's `max_buf_size` is only checked between reads, so a head up to about twice
        // `header_bytes` can arrive whole in one read and pass; this makes the limit exact.
        if head_size(&req) > self.limits.header_bytes {
            return Err(ProxyError::HeadTooLarge(self.limits.header_bytes));
        }
        let framing =
            headers::check_framing(req.version(), req.headers()).map_err(ProxyError::BadRequest)?;
        let (mut parts, incoming) = req.into_parts();
        let body_deadline = Instant::now() + self.limits.body_timeout;
        let cut: CutSlot = CutSlot::default();
        let max = self.limits.max_body_bytes;
        let body = match framing {
            Framing::Length(n) if n > max => return Err(ProxyError::BodyTooLarge(max)),
            Framing::Length(0) => RequestBody::empty(),
            Framing::None if incoming.is_end_stream() => RequestBody::empty(),
            Framing::Length(n) if n <= BUFFER_LIMIT => {
                let limited = Limited::new(incoming, max, body_deadline, cut.clone());
                match limited.collect().await {
                    Ok(c) => RequestBody::Full(Some(c.to_bytes())),
                    Err(_) => {
                        return Err(cut_error(&cut, max)
                            .unwrap_or(ProxyError::BadRequest("incomplete request body")))
                    }
                }
            }
            _ => RequestBody::Stream(Box::pin(Limited::new(
                incoming,
                max,
                body_deadline,
                cut.clone(),
            ))),
        };

        let host = parts
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
            .or_else(|| parts.uri.authority().map(|a| a.as_str().to_owned()));
        let fwd = headers::Forwarded {
            client_ip: conn.peer.map(|p| p.ip()),
            proto: if conn.tls { "https" } else { "http" },
            host: host.as_deref(),
            xfcc: conn.xfcc.as_deref(),
            version: parts.version,
        };
        headers::rewrite_request(&mut parts.headers, &fwd);
        if !parts.headers.contains_key(header::HOST) {
            if let Some(v) = host.as_deref().and_then(|h| HeaderValue::from_str(h).ok()) {
                parts.headers.insert(header::HOST, v);
            }
        }
        parts.version = Version::HTTP_11;
        let out = Request::from_parts(parts, body);

        let endpoint = self.upstream.pick().ok_or(ProxyError::NoUpstream)?;
        let sent = tokio::time::timeout(self.limits.upstream_timeout, endpoint.send(out)).await;
        let mut resp = match sent {
            Err(_) => return Err(ProxyError::GatewayTimeout),
            Ok(Err(e)) => {
                if let Some(e) = cut_error(&cut, max) {
                    return Err(e);
                }
                return Err(ProxyError::BadGateway(format!(
                    "{}: {}",
                    endpoint.name,
                    error_chain(&e)
                )));
            }
            Ok(Ok(resp)) => resp,
        };
        let version = resp.version();
        headers::rewrite_response(resp.headers_mut(), version);
        let (parts, body) = resp.into_parts();
        Ok((
            Response::from_parts(parts, ResponseBody::upstream(body)),
            endpoint.name.clone(),
        ))
    }
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

fn cut_error(cut: &CutSlot, max: u64) -> Option<ProxyError> {
    let why = *cut.lock().ok()?;
    why.map(|w| match w {
        body::BodyCut::TooLarge => ProxyError::BodyTooLarge(max),
        body::BodyCut::Timeout => ProxyError::BodyTimeout,
    })
}

/// `a: b: c` from an error and its sources.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let part = c.to_string();
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = c.source();
    }
    s
}

/// An empty body, for responses that have none.
pub fn empty() -> ResponseBody {
    ResponseBody::full(Bytes::new())
}
