//! The admin listener: `/healthz` (the process runs), `/readyz` (listeners bound, identity valid,
//! every upstream has a healthy endpoint, not draining) and `/metrics` (Prometheus text).
//!
//! One task per address of `[admin] listen`, all serving the same routes. With
//! `bearer_token_file`, `/metrics` answers 401 without the token ([`token`]); the probes stay
//! open, because kubelet's HTTP probes carry no credentials and tell nothing an attacker could
//! use beyond "the process runs".

mod token;

pub use token::check as check_token;
pub(crate) use token::MetricsToken;
pub(crate) use token::TokenError;

use crate::metrics::Metrics;
use crate::proxy::{json_response, response::ResponseBody};
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;

/// Something `/readyz` asks.
pub trait Check: Send + Sync {
    /// `Err(reason)` when not ready.
    fn check(&self) -> Result<(), String>;
}

/// Everything `/readyz` depends on.
#[derive(Default)]
pub struct Readiness {
    draining: AtomicBool,
    bound: AtomicBool,
    checks: std::sync::Mutex<Vec<Box<dyn Check>>>,
}

impl Readiness {
    pub fn set_bound(&self) {
        self.bound.store(true, Ordering::Release);
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn add(&self, check: Box<dyn Check>) {
        if let Ok(mut c) = self.checks.lock() {
            c.push(check);
        }
    }

    pub fn status(&self) -> Result<(), String> {
        if self.draining.load(Ordering::Acquire) {
            return Err("draining".into());
        }
        if !self.bound.load(Ordering::Acquire) {
            return Err("listeners not bound yet".into());
        }
        let checks = self
            .checks
            .lock()
            .map_err(|_| "internal error".to_owned())?;
        let failed: Vec<String> = checks.iter().filter_map(|c| c.check().err()).collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }
}

/// `/readyz` fails when the served certificate is outside its validity window.
pub(crate) struct IdentityCheck(pub crate::identity::Identity);

impl Check for IdentityCheck {
    fn check(&self) -> Result<(), String> {
        let m = self.0.current();
        if m.is_valid_at(SystemTime::now()) {
            Ok(())
        } else {
            Err(format!("certificate {} is not valid now", m.serial))
        }
    }
}

/// Serves the admin endpoints until the process ends.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    readiness: Arc<Readiness>,
    token: Option<Arc<MetricsToken>>,
) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let readiness = readiness.clone();
        let token = token.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                crate::memory_release::note_request();
                let resp = route(&req, &metrics, &readiness, token.as_deref());
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(Duration::from_secs(60), conn).await;
        });
    }
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn route(
    req: &Request<hyper::body::Incoming>,
    metrics: &Metrics,
    readiness: &Readiness,
    token: Option<&MetricsToken>,
) -> Response<ResponseBody> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use GET",
        );
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".into(), "text/plain"),
        "/readyz" => match readiness.status() {
            Ok(()) => text(StatusCode::OK, "ready\n".into(), "text/plain"),
            Err(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
                "text/plain",
            ),
        },
        "/metrics" => match token.map(|t| t.check(req.headers())) {
            Some(Err(refusal)) => unauthorized(refusal),
            None | Some(Ok(())) => text(
                StatusCode::OK,
                metrics.encode(),
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
        },
        _ => json_response(
            StatusCode::NOT_FOUND,
            "not_found",
            "try /healthz, /readyz or /metrics",
        ),
    }
}

/// 401 with the challenge of RFC 6750 §3: `invalid_token` when a token was given but is not
/// the one, `invalid_request` when the field is not one `Bearer <token>`.
fn unauthorized(refusal: token::Refusal) -> Response<ResponseBody> {
    let challenge = match refusal {
        token::Refusal::NoCredentials => "Bearer realm=\"ironic-proxy metrics\"",
        token::Refusal::Malformed => {
            "Bearer realm=\"ironic-proxy metrics\", error=\"invalid_request\""
        }
        token::Refusal::WrongToken => {
            "Bearer realm=\"ironic-proxy metrics\", error=\"invalid_token\""
        }
    };
    let mut r = json_response(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "/metrics needs Authorization: Bearer <the token of admin.bearer_token_file>",
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    r
}
