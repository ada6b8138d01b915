//! One exchange over a transport handed in, as the proxy runs it: the request head written,
//! the response head read, the body framed and read with the top-up reads of
//! [`super::body`], and the connection given back to the pool or not. The differential fuzz
//! target drives this against hyper's client on the same bytes.

use super::{Dial, Endpoint, EndpointLimits, Transport};
use crate::proxy::body::{BoxError, RequestBody};
use http_body_util::BodyExt as _;
use std::io;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite};

/// What the upstream client made of one response.
#[derive(Debug, PartialEq, Eq)]
pub struct ResponseRead {
    pub status: http::StatusCode,
    pub version: http::Version,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
    /// Whether the connection went back to the pool once the body was read.
    pub pooled: bool,
}

/// Sends `method /` over `io` (the only connection the endpoint gets) and reads the response
/// to its end: what the proxy made of it, or why it refused it.
pub async fn read_response_over(
    io: impl AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
    method: http::Method,
) -> Result<ResponseRead, BoxError> {
    let io: Mutex<Option<Box<dyn Transport>>> = Mutex::new(Some(Box::new(io)));
    let dial: Dial = Arc::new(move || {
        io.lock()
            .ok()
            .and_then(|mut io| io.take())
            .ok_or_else(|| io::ErrorKind::ConnectionRefused.into())
    });
    let limits = EndpointLimits::with_head(crate::config::Limits::default().header_bytes);
    let endpoint = Endpoint::over("in-memory", dial, limits);
    let req = http::Request::builder()
        .method(method)
        .uri("/")
        .header(http::header::HOST, "upstream")
        .body(RequestBody::empty())?;
    let (parts, mut body) = endpoint.send(req).await?.into_parts();
    let mut data = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(chunk) = frame?.into_data() {
            data.extend_from_slice(&chunk);
        }
    }
    drop(body);
    let pooled = endpoint.idle.conns.lock().is_ok_and(|c| !c.is_empty());
    Ok(ResponseRead {
        status: parts.status,
        version: parts.version,
        headers: parts.headers,
        body: data,
        pooled,
    })
}
