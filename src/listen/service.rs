//! A connection's hyper service ([`Service`]): every request goes to the listener's [`Proxy`],
//! counted in flight on the connection's clock until its response body ends, and a
//! `Connection: close` on either side noted so that HTTP/1.1 parking ends with keep-alive.
//! On a mutual-TLS connection, each request first checks that the client's chain still
//! verifies against the listener's trust (`tls::trust`); once it does not, that request is
//! served and the connection closes after it (`Connection: close` on HTTP/1.1, GOAWAY on
//! HTTP/2, through the driver). The same for the first request of a connection that the server
//! began draining before that request arrived. Between requests, the driver runs the same check
//! when the trust changes ([`untrusted`]).

use super::conn::ConnClock;
use super::guard;
use crate::proxy::headers::KEEP_ALIVE;
use crate::proxy::{ConnInfo, Proxy};
use crate::tls::trust::{LiveChain, Verdict};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A connection's service: every request goes to the listener's [`Proxy`], and stays counted
/// in flight on the connection's clock until its response body ends.
pub(super) struct Service {
    pub(super) proxy: Arc<Proxy>,
    pub(super) info: Arc<ConnInfo>,
    pub(super) clock: Arc<ConnClock>,
    /// HTTP/1.1: the second reader of the connection's bytes (see `guard`).
    pub(super) framing: Option<Arc<guard::Guard>>,
    /// Mutual TLS: the client's chain, checked against the current trust before each request
    /// (and by the driver when the trust changes).
    pub(super) live: Option<Arc<LiveChain>>,
    /// HTTP/1.1: the `Keep-Alive` field of every response that keeps the connection, which
    /// tells the client how long the connection may stay idle ([`keep_alive_hint`]).
    pub(super) keep_alive: Option<http::HeaderValue>,
}

/// `timeout=<seconds>`: how long a listener keeps an idle HTTP/1.1 connection (its
/// `limits.idle_timeout`, whole seconds), sent in a `Keep-Alive` field as Apache httpd and nginx
/// do. Clients that read it (this proxy's upstream pool does, `http1::keep_alive_timeout`) keep
/// their idle connections to us for less than that, instead of a short guess; others ignore it.
pub(super) fn keep_alive_hint(idle_timeout: std::time::Duration) -> http::HeaderValue {
    match idle_timeout.as_secs() {
        60 => http::HeaderValue::from_static("timeout=60"),
        // Digits after an ASCII word: always a valid field value.
        secs => http::HeaderValue::try_from(format!("timeout={secs}"))
            .unwrap_or(http::HeaderValue::from_static("timeout=0")),
    }
}

impl Service {
    /// Whether the connection must close after this request: its client chain no longer
    /// verifies against the listener's trust. Logged and counted once per connection.
    fn untrusted(&self) -> bool {
        let Some(live) = &self.live else {
            return false;
        };
        match live.check() {
            Verdict::Keep => false,
            Verdict::Closing => true,
            Verdict::Close(reason) => {
                untrusted(live, &self.info, &reason, self.clock.in_flight());
                true
            }
        }
    }
}

/// Logs the one event of a connection closed because its client chain no longer verifies
/// (counted by the check that found it, see `tls::trust`): the listener, the client's address
/// and identity, rustls' reason, and the requests still answered before the close (0: closed
/// at once).
pub(super) fn untrusted(
    live: &LiveChain,
    info: &ConnInfo,
    reason: &rustls::Error,
    in_flight: usize,
) {
    let client = info
        .peer
        .map_or_else(|| "unix".to_owned(), |p| p.to_string());
    let identity = info
        .identity
        .as_ref()
        .map(|id| id.display_name())
        .unwrap_or_default();
    tracing::info!(listener = %live.listener().name, %client, %identity, %reason, in_flight,
        "client certificate chain no longer verifies against the trust bundle; closing the connection after its requests in flight");
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Service {
    type Response = http::Response<crate::proxy::response::ResponseBody>;
    type Error = Infallible;
    // Boxed: hyper keeps a slot for the service's future in every connection, idle or not;
    // boxing makes that slot a pointer instead of the whole forwarding state machine (idle
    // connections outnumber requests in flight, so one allocation per request is the cheaper
    // side).
    type Future = ServiceFuture;

    fn call(&self, mut req: http::Request<hyper::body::Incoming>) -> ServiceFuture {
        crate::memory_release::note_request();
        if let Some(g) = &self.framing {
            if let Err(why) = g.take(req.method()) {
                req.extensions_mut()
                    .insert(crate::proxy::FramingRefused(why));
            }
        }
        let proxy = self.proxy.clone();
        let info = self.info.clone();
        let mut guard = self.clock.begin();
        // HTTP/1.1: what ends keep-alive for hyper ends parking too (see `drive`).
        let h1 = self.framing.is_some();
        // Untrusted, or the server drained before this connection's first request (see
        // `drive`): this request is served and the connection ends after it.
        let last = self.untrusted() || self.clock.close_requested();
        if last {
            // The driver ends the connection gracefully: after this response on HTTP/1.1,
            // after the streams in flight on HTTP/2.
            self.clock.request_close();
        }
        let closing =
            h1 && (last || req.version() != http::Version::HTTP_11 || wants_close(req.headers()));
        if closing {
            self.clock.note_closing();
        }
        let keep_alive = (!closing).then(|| self.keep_alive.clone()).flatten();
        Box::pin(async move {
            let mut resp = proxy.handle(req, &info).await;
            if h1 && last {
                // Told, so the client does not send its next request into a closing
                // connection (RFC 9112 §9.6).
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            // Only the proxy's own error responses carry `Connection: close` (an upstream's is
            // hop-by-hop and removed).
            if h1 && !resp.status().is_success() && wants_close(resp.headers()) {
                guard.note_closing();
            } else if let Some(hint) = keep_alive {
                resp.headers_mut().insert(KEEP_ALIVE, hint);
            }
            guard.responding();
            resp.body_mut().attach(guard);
            Ok(resp)
        })
    }
}

/// Whether `headers` have a `Connection` field with the `close` option (RFC 9112 §9.6).
fn wants_close(headers: &http::HeaderMap) -> bool {
    headers.get_all(http::header::CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|o| o.trim_ascii().eq_ignore_ascii_case(b"close"))
    })
}

type ServiceFuture = Pin<
    Box<
        dyn Future<
                Output = Result<http::Response<crate::proxy::response::ResponseBody>, Infallible>,
            > + Send,
    >,
>;
