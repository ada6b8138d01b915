//! The access log line and request metrics, written when a response ends.

use super::body::OnEnd;
use super::{Blame, ConnInfo};
use crate::metrics::{ListenerLabels, Metrics, RequestLabels};
use crate::tls::ClientIdentity;
use http::{Method, Uri};
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::Arc;
use tokio::time::Instant;

/// A listener's request metrics, resolved once so the hot path takes no lock and allocates no
/// label strings.
pub(super) struct ListenerMetrics {
    by_class: [Counter; 5],
    duration: Histogram,
}

impl ListenerMetrics {
    pub(super) fn new(metrics: &Metrics, listener: &str) -> Arc<Self> {
        let class = |c: &'static str| {
            metrics
                .requests
                .get_or_create(&RequestLabels {
                    listener: listener.to_owned(),
                    class: c,
                })
                .clone()
        };
        Arc::new(Self {
            by_class: [
                class("1xx"),
                class("2xx"),
                class("3xx"),
                class("4xx"),
                class("5xx"),
            ],
            duration: metrics
                .request_duration
                .get_or_create(&ListenerLabels {
                    listener: listener.to_owned(),
                })
                .clone(),
        })
    }
}

/// What the access log line and the request metrics need, captured as reference counts and
/// copies of small values: the strings of the log line are formatted only when the `access`
/// target is enabled, at the end of the response.
pub(super) struct Record {
    listener: Arc<str>,
    peer: Option<std::net::SocketAddr>,
    identity: Option<Arc<ClientIdentity>>,
    /// None for a head the HTTP parser refused before it became a request.
    request: Option<(Method, Uri)>,
    pub(super) status: u16,
    pub(super) upstream: Option<Arc<str>>,
    pub(super) blame: Option<Blame>,
    start: Instant,
    metrics: Arc<ListenerMetrics>,
}

impl Record {
    pub(super) fn new(
        listener: &Arc<str>,
        req: &http::Request<Incoming>,
        conn: &ConnInfo,
        metrics: Arc<ListenerMetrics>,
        start: Instant,
    ) -> Self {
        Self {
            listener: listener.clone(),
            peer: conn.peer,
            identity: conn.identity.clone(),
            request: Some((req.method().clone(), req.uri().clone())),
            status: 0,
            upstream: None,
            blame: None,
            start,
            metrics,
        }
    }

    /// A head hyper's parser refused with `status` (see `Proxy::refused_head`).
    pub(super) fn refused_head(
        listener: &Arc<str>,
        conn: &ConnInfo,
        metrics: Arc<ListenerMetrics>,
        status: u16,
    ) -> Self {
        Self {
            listener: listener.clone(),
            peer: conn.peer,
            identity: conn.identity.clone(),
            request: None,
            status,
            upstream: None,
            blame: Some(Blame::Client),
            start: Instant::now(),
            metrics,
        }
    }
}

/// The request path for the log, bounded whatever the client sends.
fn bounded_path(uri: &Uri) -> String {
    let mut path = uri.path().to_owned();
    if path.len() > 256 {
        let mut end = 256;
        while !path.is_char_boundary(end) {
            end -= 1;
        }
        path.truncate(end);
        path.push('…');
    }
    path
}

impl OnEnd for Record {
    fn on_end(&mut self, bytes: u64, complete: bool) {
        let elapsed = self.start.elapsed();
        let class = usize::from(self.status / 100).clamp(1, 5) - 1;
        self.metrics.by_class[class].inc();
        self.metrics.duration.observe(elapsed.as_secs_f64());
        if !tracing::event_enabled!(target: "access", tracing::Level::INFO) {
            return;
        }
        let client = self
            .peer
            .map_or_else(|| "unix".to_owned(), |p| p.to_string());
        let identity = self.identity.as_ref().map(|i| i.display_name());
        tracing::info!(
            target: "access",
            listener = %self.listener,
            client = %client,
            identity = identity.as_deref().unwrap_or("-"),
            method = %self.request.as_ref().map_or("-", |(m, _)| m.as_str()),
            path = %self.request.as_ref().map_or_else(|| "-".to_owned(), |(_, u)| bounded_path(u)),
            status = self.status,
            bytes,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            upstream = self.upstream.as_deref().unwrap_or("-"),
            blame = self.blame.map_or("-", |b| match b {
                Blame::Client => "client",
                Blame::Upstream => "upstream",
                Blame::Proxy => "proxy",
            }),
            complete,
        );
    }
}
