//! The forwarding service: one request in, one request to an upstream endpoint, one response
//! out, with the limits, header hygiene and error statuses of docs/reference.md.
//!
//! Request bodies up to [`BUFFER_LIMIT`], of known length or chunked, are read completely (within
//! `body_timeout`) before an upstream is contacted: Ironic's JSON bodies are small, a slow or
//! malformed body then never ties up or reaches an Ironic worker, and a buffered request can be
//! retried on another endpoint. Larger bodies are streamed through a size and time limit.

mod admit;
pub(crate) mod body;
pub(crate) mod egress;
mod error;
pub(crate) mod find_newest;
pub mod headers;
pub mod jsonrpc;
mod log;
pub(crate) mod pool;
pub(crate) mod response;
mod retry;
pub mod route;
pub(crate) mod upstream;

pub(crate) use error::{json_response, Blame, Gateway, ProxyError};

use crate::config::Limits;
use crate::metrics::Metrics;
use crate::tls::ClientIdentity;
use body::{CutSlot, Limited, RequestBody};
use headers::Framing;
use http::{header, HeaderValue, Request, Response, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use pool::Pool;
use response::ResponseBody;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::time::Instant;

/// Bodies up to this size (with a known length) are buffered before forwarding.
pub(crate) const BUFFER_LIMIT: u64 = 64 * 1024;

/// Set on a request by the listener when its HTTP/1.1 framing was ambiguous in a way hyper
/// resolved before the service could see it (see `listen::guard`): the reason to refuse it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FramingRefused(pub &'static str);

/// What the listener knows about the connection a request came on.
#[derive(Clone, Debug, Default)]
pub struct ConnInfo {
    pub peer: Option<SocketAddr>,
    /// `peer`'s address as a header value for `X-Forwarded-For`, formatted once per connection
    /// (not once per request: the address is the connection's).
    pub peer_value: Option<HeaderValue>,
    pub identity: Option<Arc<ClientIdentity>>,
    /// False when a verified client certificate is outside `allow`: every request gets 403.
    pub allowed: bool,
    /// The identity in `X-Forwarded-Client-Cert` form, computed once per connection.
    pub xfcc: Option<HeaderValue>,
    pub tls: bool,
}

impl ConnInfo {
    /// A connection from `peer`, allowed until a client certificate says otherwise.
    pub fn new(peer: Option<SocketAddr>, tls: bool) -> Self {
        Self {
            peer,
            peer_value: peer.and_then(|p| headers::ip_value(p.ip())),
            allowed: true,
            tls,
            ..Self::default()
        }
    }
}

/// One listener's forwarding service.
pub struct Proxy {
    listener: Arc<str>,
    upstream: Arc<Pool>,
    limits: Limits,
    metrics: Metrics,
    listener_metrics: Arc<log::ListenerMetrics>,
    auth: Option<Arc<crate::auth::Gate>>,
    /// Path routes to other upstreams (`[[listeners.routes]]`); `upstream` serves the rest.
    routes: Option<Arc<route::Routes>>,
    /// `jsonrpc = true`: the method of each call is read for the log and metrics.
    jsonrpc: bool,
    /// `[listeners.egress]`: requests name their peer and pass the egress gate first.
    egress: Option<Arc<egress::Egress>>,
    /// Upstream latency to the response head: `[local, peer]`.
    upstream_latency: [prometheus_client::metrics::histogram::Histogram; 2],
}

impl Proxy {
    pub fn new(listener: &str, upstream: Arc<Pool>, limits: Limits, metrics: Metrics) -> Self {
        let listener_metrics = log::ListenerMetrics::new(&metrics, listener, false);
        let latency = |role| {
            metrics
                .upstream_duration
                .get_or_create(&crate::metrics::UpstreamRoleLabels {
                    upstream: upstream.name.clone(),
                    role,
                })
                .clone()
        };
        let upstream_latency = [latency("local"), latency("peer")];
        Self {
            listener: listener.into(),
            upstream,
            limits,
            metrics,
            listener_metrics,
            auth: None,
            routes: None,
            jsonrpc: false,
            egress: None,
            upstream_latency,
        }
    }

    /// Requires Basic authentication (`[listeners.auth]`) on this listener.
    #[must_use]
    pub fn with_auth(mut self, gate: Option<Arc<crate::auth::Gate>>) -> Self {
        self.auth = gate;
        self
    }

    /// Adds path routes (see [`route`]).
    #[must_use]
    pub fn with_routes(mut self, routes: route::Routes) -> Self {
        self.routes = Some(Arc::new(routes));
        self
    }

    /// Makes the listener an egress proxy (see [`egress`]).
    #[must_use]
    /// Whether this listener is an egress (a forward proxy for Ironic's client).
    pub fn is_egress(&self) -> bool {
        self.egress.is_some()
    }

    pub fn with_egress(mut self, egress: Option<Arc<egress::Egress>>) -> Self {
        self.egress = egress;
        self
    }

    /// Marks the listener as JSON-RPC (`jsonrpc = true`): see [`jsonrpc`].
    #[must_use]
    pub fn with_jsonrpc(mut self, on: bool) -> Self {
        self.jsonrpc = on;
        self.listener_metrics = log::ListenerMetrics::new(&self.metrics, &self.listener, on);
        self
    }

    /// Handles one request; never fails: errors become the proxy's own responses.
    pub async fn handle(
        &self,
        mut req: Request<Incoming>,
        conn: &ConnInfo,
    ) -> Response<ResponseBody> {
        let start = Instant::now();
        let mut record = log::Record::new(
            &self.listener,
            &req,
            conn,
            self.listener_metrics.clone(),
            start,
        );
        let forwarded = match &self.egress {
            None => self.forward(req, conn, None, &mut record.rpc_method).await,
            Some(e) => match e.admit(&mut req, conn).await {
                Err(refused) => Err(refused),
                Ok(admitted) => {
                    let route = admitted.route;
                    let r = self
                        .forward(req, conn, Some(admitted), &mut record.rpc_method)
                        .await;
                    e.count_result(&r, route);
                    r
                }
            },
        };
        let mut resp = match forwarded {
            Ok((mut resp, endpoint)) => {
                record.upstream = Some(endpoint);
                // The version is hop-by-hop (RFC 9110 §6.2): an HTTP/1.0 upstream's answer goes
                // to an HTTP/1.1 client as HTTP/1.1, framed for it by hyper (its length, else
                // chunked), and the connection stays open; with the upstream's 1.0 hyper would
                // write `HTTP/1.0` and close. hyper itself answers an HTTP/1.0 client in 1.0,
                // and HTTP/2 ignores the field.
                *resp.version_mut() = Version::HTTP_11;
                resp
            }
            Err(e) => {
                let error = crate::error::chain(&e);
                if e.blame() != Blame::Client {
                    tracing::warn!(listener = %self.listener, %error, "request failed");
                } else {
                    tracing::debug!(listener = %self.listener, %error, "request refused");
                }
                record.blame = Some(e.blame());
                e.to_response()
            }
        };
        record.status = resp.status().as_u16();
        resp.body_mut().set_on_end(Box::new(record));
        resp
    }

    /// hyper's parser refused a request head on `conn` with `status` (400 malformed, 414 target
    /// too long, 431 head too large) before it became a request: counts it, writes its access
    /// log line, and returns the response to send instead of hyper's empty-bodied one, with the
    /// `date` line taken from that one.
    pub fn refused_head(
        &self,
        conn: &ConnInfo,
        status: http::StatusCode,
        date_line: Option<&[u8]>,
    ) -> Vec<u8> {
        let e = match status {
            http::StatusCode::URI_TOO_LONG => ProxyError::UriTooLong,
            http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => {
                ProxyError::HeadTooLarge(self.limits.header_bytes)
            }
            _ => ProxyError::BadRequest("request head could not be parsed"),
        };
        let body = e.json_body();
        let mut record = log::Record::refused_head(
            &self.listener,
            conn,
            self.listener_metrics.clone(),
            e.status().as_u16(),
        );
        response::OnEnd::on_end(&mut record, body.len() as u64, true);
        error::refused_head_response(e.status(), &body, date_line)
    }

    async fn forward(
        &self,
        mut req: Request<Incoming>,
        conn: &ConnInfo,
        egress: Option<egress::Admitted>,
        rpc_method: &mut Option<&'static str>,
    ) -> Result<(Response<ResponseBody>, Arc<str>), ProxyError> {
        admit::check(&req, conn, &self.limits)?;
        // Routes first: a request over plain HTTP that may not be served that way gets its 403
        // before any 401 could invite a client to send its password in clear.
        let (decision, plaintext_route) = match &self.routes {
            Some(r) => r.decide(req.method(), req.uri().path(), conn.tls)?,
            None => (route::Decision::Default, false),
        };
        if let Some(gate) = self.auth.as_ref().filter(|_| !plaintext_route) {
            gate.admit(&mut req).await?;
        }
        let framing =
            headers::check_framing(req.version(), req.headers()).map_err(ProxyError::BadRequest)?;
        let (mut parts, incoming) = req.into_parts();
        // Read from the clock only for a body to read (a GET has none).
        let body_deadline = || Instant::now() + self.limits.body_timeout;
        let cut: CutSlot = CutSlot::default();
        let max = self.limits.max_body_bytes;
        let body = match framing {
            Framing::Length(n) if n > max => return Err(ProxyError::BodyTooLarge(max)),
            Framing::Length(0) => RequestBody::empty(),
            Framing::None if incoming.is_end_stream() => RequestBody::empty(),
            Framing::Length(n) if n <= BUFFER_LIMIT => {
                let limited = Limited::new(incoming, max, body_deadline(), cut.clone());
                match limited.collect().await {
                    Ok(c) => RequestBody::Full(Some(c.to_bytes())),
                    Err(_) => {
                        return Err(cut_error(&cut, max)
                            .unwrap_or(ProxyError::BadRequest("incomplete request body")))
                    }
                }
            }
            Framing::Length(_) => RequestBody::Stream(
                None,
                Box::pin(Limited::new(incoming, max, body_deadline(), cut.clone())),
            ),
            // Chunked, or HTTP/2 without a length: buffered like a known small length until it
            // ends or passes BUFFER_LIMIT, so that a malformed or slow small body never reaches
            // the upstream and a small one can be retried.
            Framing::Chunked | Framing::None => {
                let limited = Box::pin(Limited::new(incoming, max, body_deadline(), cut.clone()));
                buffer_prefix(limited, &cut, max).await?
            }
        };
        if self.jsonrpc {
            // Only from what is already in memory: never waits for more of the body.
            *rpc_method = Some(jsonrpc::method(body.prefix()));
        }

        let via_proxy = headers::came_through_proxy(&parts.headers);
        // The target's authority, when it has one (absolute-form, HTTP/2 :authority), wins
        // over Host: RFC 9112 §3.2.2, the recipient MUST ignore Host and use the target's.
        // A copy of the value (a reference count), not of its bytes.
        let host = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .or_else(|| {
                parts
                    .headers
                    .get(header::HOST)
                    .filter(|h| h.to_str().is_ok())
                    .cloned()
            });
        let fwd = headers::Forwarded {
            client_ip: conn.peer_value.as_ref(),
            proto: if conn.tls { "https" } else { "http" },
            host: host.as_ref(),
            xfcc: conn.xfcc.as_ref(),
            version: parts.version,
        };
        match egress.as_ref().map(|a| a.route) {
            // A plain relay sends what the client would have sent without a proxy.
            Some(egress::Route::Plain | egress::Route::Relay) => {
                egress::rewrite_relayed(&mut parts.headers, parts.version);
            }
            _ => headers::rewrite_request(&mut parts.headers, &fwd),
        }
        if let Some(v) = host {
            parts.headers.insert(header::HOST, v);
        }
        parts.version = Version::HTTP_11;
        let upstream = match (&egress, decision) {
            (Some(admitted), _) => &admitted.pool,
            (None, route::Decision::Default) => &self.upstream,
            (None, route::Decision::Forward(pool)) => pool,
            // GET and HEAD only; a body sent with one is not forwarded.
            (None, route::Decision::Find(finder)) => return finder.find(parts, via_proxy).await,
        };
        retry::send(self, parts, body, via_proxy, &cut, upstream).await
    }

    fn count_peer_tls_failure(&self, e: &upstream::SendError, upstream: &str) {
        if let Some((reason, t)) = crate::tls::peer::failure_reason(e) {
            tracing::warn!(upstream = %upstream, reason, error = %t, "peer TLS failed");
            self.metrics
                .peer_tls_failures
                .get_or_create(&crate::metrics::PeerTlsLabels {
                    upstream: upstream.to_owned(),
                    reason,
                })
                .inc();
        }
    }
}

/// Reads a body of unknown length into memory until it ends (a buffered body) or passes
/// [`BUFFER_LIMIT`] (what was read so far, then the rest streamed). Trailers are dropped.
async fn buffer_prefix(
    mut body: std::pin::Pin<Box<Limited>>,
    cut: &CutSlot,
    max: u64,
) -> Result<RequestBody, ProxyError> {
    let mut buf = bytes::BytesMut::new();
    loop {
        match body.frame().await {
            None => return Ok(RequestBody::Full((!buf.is_empty()).then(|| buf.freeze()))),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                    if buf.len() as u64 > BUFFER_LIMIT {
                        return Ok(RequestBody::Stream(Some(buf.freeze()), body));
                    }
                }
            }
            Some(Err(_)) => {
                return Err(cut_error(cut, max).unwrap_or(ProxyError::BadRequest(
                    "malformed or incomplete request body",
                )))
            }
        }
    }
}

fn cut_error(cut: &CutSlot, max: u64) -> Option<ProxyError> {
    let why = *cut.lock().ok()?;
    why.map(|w| match w {
        body::BodyCut::TooLarge => ProxyError::BodyTooLarge(max),
        body::BodyCut::Timeout => ProxyError::BodyTimeout,
        body::BodyCut::Client => ProxyError::BadRequest("malformed or incomplete request body"),
    })
}
