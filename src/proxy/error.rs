//! The one place where a failure becomes a status code and the proxy's own short JSON body.

use super::response::ResponseBody;
use http::{header, HeaderValue, Response, StatusCode};

/// Who failed, recorded in the access log next to the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    Client,
    Upstream,
    Proxy,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("malformed request: {0}")]
    BadRequest(&'static str),
    #[error("client certificate not allowed on this listener")]
    Forbidden,
    /// 401 with the listener's `WWW-Authenticate` challenge.
    #[error("authentication required")]
    Unauthorized { challenge: HeaderValue, close: bool },
    /// Too many password verifications waiting; nothing was verified.
    #[error("too many authentication attempts in progress; retry later")]
    AuthBusy { close: bool },
    #[error("request head larger than {0} bytes")]
    HeadTooLarge(usize),
    #[error("request target too long")]
    UriTooLong,
    #[error("request body too slow")]
    BodyTimeout,
    #[error("request body larger than {0} bytes")]
    BodyTooLarge(u64),
    #[error("forwarding loop detected")]
    Loop,
    #[error("upstream {endpoint} failed")]
    BadGateway {
        /// The endpoint (`local`, a peer's address) or `find` for a fan-out.
        endpoint: std::sync::Arc<str>,
        #[source]
        cause: Gateway,
    },
    #[error("no healthy upstream")]
    NoUpstream,
    #[error("upstream did not answer in time")]
    GatewayTimeout,
    #[error("plain HTTP is not allowed for this path; use https")]
    PlainHttp,
    #[error("method not allowed on this path")]
    MethodNotAllowed(HeaderValue),
    #[error("not found on any endpoint")]
    NotFound,
    /// 407 with `Proxy-Authenticate` (an egress listener, missing or wrong credentials).
    #[error("proxy authentication required")]
    ProxyAuth { challenge: HeaderValue, close: bool },
    /// 403 from an egress listener: a host, port or client it does not serve.
    #[error("egress refused: {0}")]
    EgressRefused(&'static str),
}

/// How an upstream failed a request.
#[derive(Debug, thiserror::Error)]
pub enum Gateway {
    #[error("the request could not be sent or its answer read")]
    Send(#[source] super::upstream::SendError),
    #[error("response head over header_bytes")]
    HeadTooLarge,
    /// We never ask for an upgrade (Upgrade is stripped), so a 101 is a broken upstream.
    #[error("unsolicited 101 Switching Protocols")]
    Unsolicited101,
    /// A 502, 503 or 504 held back for a retry that could not follow.
    #[error("answered {0}")]
    Answered(u16),
    /// No endpoint of a `find` route had the file and some failed: one line per failure (an
    /// aggregate of several endpoints' errors, so text rather than one source).
    #[error(
        "no endpoint has it, {failed} failed, {unavailable} unavailable (not asked): {detail}"
    )]
    Find {
        failed: usize,
        unavailable: usize,
        detail: String,
    },
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Self::AuthBusy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::HeadTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UriTooLong => StatusCode::URI_TOO_LONG,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Loop => StatusCode::LOOP_DETECTED,
            Self::BadGateway { .. } => StatusCode::BAD_GATEWAY,
            Self::NoUpstream => StatusCode::SERVICE_UNAVAILABLE,
            Self::GatewayTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::PlainHttp => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::ProxyAuth { .. } => StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            Self::EgressRefused(_) => StatusCode::FORBIDDEN,
        }
    }

    pub fn blame(&self) -> Blame {
        match self {
            Self::BadRequest(_)
            | Self::Forbidden
            | Self::Unauthorized { .. }
            | Self::AuthBusy { .. }
            | Self::HeadTooLarge(_)
            | Self::UriTooLong
            | Self::BodyTimeout
            | Self::BodyTooLarge(_)
            | Self::Loop
            | Self::PlainHttp
            | Self::MethodNotAllowed(_)
            | Self::NotFound
            | Self::ProxyAuth { .. }
            | Self::EgressRefused(_) => Blame::Client,
            Self::BadGateway { .. } | Self::GatewayTimeout => Blame::Upstream,
            Self::NoUpstream => Blame::Proxy,
        }
    }

    /// Machine-readable code in the JSON body.
    fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::Forbidden => "forbidden",
            Self::Unauthorized { .. } => "unauthorized",
            Self::AuthBusy { .. } => "authentication_busy",
            Self::HeadTooLarge(_) => "request_header_fields_too_large",
            Self::UriTooLong => "uri_too_long",
            Self::BodyTimeout => "request_timeout",
            Self::BodyTooLarge(_) => "payload_too_large",
            Self::Loop => "loop_detected",
            Self::BadGateway { .. } => "bad_gateway",
            Self::NoUpstream => "no_healthy_upstream",
            Self::GatewayTimeout => "gateway_timeout",
            Self::PlainHttp => "forbidden",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::NotFound => "not_found",
            Self::ProxyAuth { .. } => "proxy_authentication_required",
            Self::EgressRefused(_) => "forbidden",
        }
    }

    /// The message of the JSON body. Upstream details stay in the log, not the body.
    fn message(&self) -> String {
        match self {
            Self::BadGateway { .. } => "upstream refused or broke the connection".to_owned(),
            other => other.to_string(),
        }
    }

    /// The JSON body alone.
    pub fn json_body(&self) -> String {
        json_body(self.status(), self.code(), &self.message())
    }

    /// `{"error":"…","status":…,"message":"…"}`.
    pub fn to_response(&self) -> Response<ResponseBody> {
        let mut resp = json_response(self.status(), self.code(), &self.message());
        if let Self::MethodNotAllowed(allow) = self {
            resp.headers_mut().insert(header::ALLOW, allow.clone());
        }
        // Route refusals (403 over plain HTTP, 405) are answered before the body is read too.
        if matches!(
            self,
            Self::BadRequest(_)
                | Self::Forbidden
                | Self::PlainHttp
                | Self::MethodNotAllowed(_)
                | Self::EgressRefused(_)
        ) {
            // RFC 9112 §6.3: after rejecting a request whose framing we do not trust, close the
            // connection; parsing on would take the rejected body for the next request. A
            // client outside `allow` is answered before its body is read: hyper could keep the
            // connection only by draining a body that has already arrived, which races with
            // the client's send (Python's http.client sends the body after the head), so its
            // next request could meet a closed connection. Closing says so: a client opens a
            // new connection and gets its 403 again.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        match self {
            Self::Unauthorized { challenge, close } => {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, challenge.clone());
                if *close {
                    // Answered before the body was read: as for 403 above.
                    resp.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
            }
            Self::ProxyAuth { challenge, close } => {
                resp.headers_mut()
                    .insert(header::PROXY_AUTHENTICATE, challenge.clone());
                if *close {
                    resp.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
            }
            Self::AuthBusy { close } => {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                if *close {
                    resp.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
            }
            _ => {}
        }
        resp
    }
}

impl From<crate::auth::Deny> for ProxyError {
    fn from(d: crate::auth::Deny) -> Self {
        match d {
            crate::auth::Deny::Unauthorized { challenge, close } => {
                Self::Unauthorized { challenge, close }
            }
            crate::auth::Deny::Busy { close } => Self::AuthBusy { close },
        }
    }
}

/// The whole HTTP/1.1 response, as bytes, for a request head that hyper's parser refused:
/// `status` with the JSON `body`, `Connection: close` (the connection ends with it), and the
/// `date` line hyper would have sent.
pub(super) fn refused_head_response(
    status: StatusCode,
    body: &str,
    date_line: Option<&[u8]>,
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    if let Some(date) = date_line {
        out.extend_from_slice(date);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
    out
}

/// The proxy's own JSON error response.
pub(crate) fn json_response(
    status: StatusCode,
    code: &str,
    message: &str,
) -> Response<ResponseBody> {
    let body = json_body(status, code, message);
    let mut resp = Response::new(ResponseBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `{"error":"…","status":…,"message":"…"}` and a newline.
fn json_body(status: StatusCode, code: &str, message: &str) -> String {
    format!(
        "{{\"error\":\"{code}\",\"status\":{},\"message\":\"{}\"}}\n",
        status.as_u16(),
        message.replace('\\', "\\\\").replace('"', "\\\"")
    )
}
