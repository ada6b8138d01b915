//! The access log line and request metrics, written when a response ends.

use super::body::OnEnd;
use super::{Blame, ConnInfo};
use crate::metrics::{status_class, ListenerLabels, Metrics, RequestLabels};
use hyper::body::Incoming;
use tokio::time::Instant;

pub(super) struct Record {
    listener: String,
    client: String,
    identity: Option<String>,
    method: String,
    path: String,
    pub(super) status: u16,
    pub(super) upstream: Option<String>,
    pub(super) blame: Option<Blame>,
    start: Instant,
    metrics: Metrics,
}

impl Record {
    pub(super) fn new(
        listener: &str,
        req: &http::Request<Incoming>,
        conn: &ConnInfo,
        metrics: Metrics,
        start: Instant,
    ) -> Self {
        let mut path = req.uri().path().to_owned();
        // Keep log lines bounded whatever the client sends.
        if path.len() > 256 {
            let mut end = 256;
            while !path.is_char_boundary(end) {
                end -= 1;
            }
            path.truncate(end);
            path.push('…');
        }
        Self {
            listener: listener.to_owned(),
            client: conn
                .peer
                .map_or_else(|| "unix".to_owned(), |p| p.to_string()),
            identity: conn.identity.as_ref().map(|i| i.display_name()),
            method: req.method().as_str().to_owned(),
            path,
            status: 0,
            upstream: None,
            blame: None,
            start,
            metrics,
        }
    }
}

impl OnEnd for Record {
    fn on_end(&mut self, bytes: u64, complete: bool) {
        let elapsed = self.start.elapsed();
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                listener: self.listener.clone(),
                class: status_class(self.status),
            })
            .inc();
        self.metrics
            .request_duration
            .get_or_create(&ListenerLabels {
                listener: self.listener.clone(),
            })
            .observe(elapsed.as_secs_f64());
        tracing::info!(
            target: "access",
            listener = %self.listener,
            client = %self.client,
            identity = self.identity.as_deref().unwrap_or("-"),
            method = %self.method,
            path = %self.path,
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
