//! The access log line and request metrics, written when a response ends.

use super::jsonrpc;
use super::response::OnEnd;
use super::{Blame, ConnInfo};
use crate::metrics::{JsonRpcLabels, JsonRpcMethodLabels, ListenerLabels, Metrics, RequestLabels};
use crate::tls::ClientIdentity;
use http::{Method, Uri};
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::{Arc, OnceLock};
use tokio::time::Instant;

/// A listener's request metrics, resolved once so the hot path takes no lock and allocates no
/// label strings.
pub(super) struct ListenerMetrics {
    listener: String,
    requests: prometheus_client::metrics::family::Family<RequestLabels, Counter>,
    /// The counter of each status 100..=599, resolved on first use: a series appears once a
    /// code was answered, and later requests with that code take no lock.
    by_code: Box<[OnceLock<Counter>]>,
    duration: Histogram,
    /// For `jsonrpc = true` listeners.
    jsonrpc: Option<JsonRpcFamilies>,
}

struct JsonRpcFamilies {
    calls: prometheus_client::metrics::family::Family<JsonRpcLabels, Counter>,
    duration: prometheus_client::metrics::family::Family<JsonRpcMethodLabels, Histogram>,
    /// Per method index (`jsonrpc::index`) and outcome, resolved on first use like `by_code`.
    call_counters: Box<[OnceLock<Counter>]>,
    durations: Box<[OnceLock<Histogram>]>,
}

/// The `outcome` label values, in the order of `JsonRpcFamilies::call_counters`.
const OUTCOMES: [&str; 4] = ["ok", "error", "refused", "failed"];

impl ListenerMetrics {
    pub(super) fn new(metrics: &Metrics, listener: &str, jsonrpc: bool) -> Arc<Self> {
        Arc::new(Self {
            listener: listener.to_owned(),
            requests: metrics.requests.clone(),
            by_code: (100..600).map(|_| OnceLock::new()).collect(),
            jsonrpc: jsonrpc.then(|| {
                let methods = jsonrpc::KNOWN.len() + 1;
                JsonRpcFamilies {
                    calls: metrics.jsonrpc_calls.clone(),
                    duration: metrics.jsonrpc_call_duration.clone(),
                    call_counters: (0..methods * OUTCOMES.len())
                        .map(|_| OnceLock::new())
                        .collect(),
                    durations: (0..methods).map(|_| OnceLock::new()).collect(),
                }
            }),
            duration: metrics
                .request_duration
                .get_or_create(&ListenerLabels {
                    listener: listener.to_owned(),
                })
                .clone(),
        })
    }

    fn count(&self, status: u16) {
        let labels = || RequestLabels {
            listener: self.listener.clone(),
            class: crate::metrics::status_class(status),
            code: status,
        };
        match self.by_code.get(usize::from(status).wrapping_sub(100)) {
            Some(slot) => slot
                .get_or_init(|| self.requests.get_or_create(&labels()).clone())
                .inc(),
            // A code outside 100..=599 (an upstream may send up to 999): rare, looked up.
            None => self.requests.get_or_create(&labels()).inc(),
        };
    }

    fn count_call(&self, method: &'static str, outcome: usize, secs: f64) {
        let Some(j) = &self.jsonrpc else { return };
        let m = jsonrpc::index(method);
        if let Some(slot) = j.call_counters.get(m * OUTCOMES.len() + outcome) {
            slot.get_or_init(|| {
                j.calls
                    .get_or_create(&JsonRpcLabels {
                        listener: self.listener.clone(),
                        method,
                        outcome: OUTCOMES[outcome],
                    })
                    .clone()
            })
            .inc();
        }
        if let Some(slot) = j.durations.get(m) {
            slot.get_or_init(|| {
                j.duration
                    .get_or_create(&JsonRpcMethodLabels {
                        listener: self.listener.clone(),
                        method,
                    })
                    .clone()
            })
            .observe(secs);
        }
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
    /// The request's `User-Agent` (a reference count on hyper's read buffer, not a copy).
    user_agent: Option<http::HeaderValue>,
    pub(super) status: u16,
    pub(super) upstream: Option<Arc<str>>,
    pub(super) blame: Option<Blame>,
    /// The JSON-RPC method, on a `jsonrpc = true` listener once the body was read.
    pub(super) rpc_method: Option<&'static str>,
    /// The answer's first bytes held a JSON-RPC `error` member.
    rpc_error: bool,
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
            user_agent: req.headers().get(http::header::USER_AGENT).cloned(),
            status: 0,
            upstream: None,
            blame: None,
            rpc_method: None,
            rpc_error: false,
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
            user_agent: None,
            status,
            upstream: None,
            blame: Some(Blame::Client),
            rpc_method: None,
            rpc_error: false,
            start: Instant::now(),
            metrics,
        }
    }
}

/// The request path for the log, bounded whatever the client sends: its first 256 bytes (to a
/// character boundary) and whether it was cut (the line then shows `…` after it); `-` for a
/// head that never became a request. Borrowed, no copy.
fn bounded_path(uri: Option<&Uri>) -> (&str, bool) {
    let Some(uri) = uri else {
        return ("-", false);
    };
    let path = uri.path();
    if path.len() <= 256 {
        return (path, false);
    }
    let mut end = 256;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    (&path[..end], true)
}

/// The `User-Agent` for the log: its first 256 bytes (to a character boundary), `-` when there
/// is none. Bytes that are not UTF-8 (obs-text) are replaced, which copies; others are borrowed.
fn bounded_user_agent(ua: Option<&http::HeaderValue>) -> std::borrow::Cow<'_, str> {
    let Some(ua) = ua else {
        return "-".into();
    };
    let mut text = String::from_utf8_lossy(ua.as_bytes());
    if text.len() > 256 {
        let mut end = 256;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        match &mut text {
            std::borrow::Cow::Borrowed(s) => *s = &s[..end],
            std::borrow::Cow::Owned(s) => s.truncate(end),
        }
    }
    text
}

/// Room for an IP address as text on the stack.
type IpText = crate::logging::StackText<48>;

/// `ClientIdentity::display_name` (the first SAN, else the subject) without allocating: an IP
/// SAN is written into `ip`, anything else is borrowed.
fn identity_name<'a>(id: &'a ClientIdentity, ip: &'a mut IpText) -> &'a str {
    if let Some(dns) = id.dns.first() {
        return dns;
    }
    if let Some(addr) = id.ips.first() {
        use std::fmt::Write as _;
        if write!(ip, "{addr}").is_ok() {
            return ip.as_str();
        }
    }
    id.uris.first().unwrap_or(&id.subject)
}

impl OnEnd for Record {
    fn on_end(&mut self, bytes: u64, complete: bool) {
        let elapsed = self.start.elapsed();
        self.metrics.count(self.status);
        self.metrics.duration.observe(elapsed.as_secs_f64());
        let rpc_method = self
            .metrics
            .jsonrpc
            .is_some()
            .then(|| self.rpc_method.unwrap_or(jsonrpc::OTHER));
        if let Some(method) = rpc_method {
            // Indexes into OUTCOMES.
            let outcome = match self.status {
                _ if !complete => 3,
                200..=299 if self.rpc_error => 1,
                200..=399 => 0,
                400..=499 => 2,
                _ => 3,
            };
            self.metrics
                .count_call(method, outcome, elapsed.as_secs_f64());
        }
        if !tracing::event_enabled!(target: "access", tracing::Level::INFO) {
            return;
        }
        let mut ip = IpText::default();
        let identity = self.identity.as_deref().map(|i| identity_name(i, &mut ip));
        let (path, path_cut) = bounded_path(self.request.as_ref().map(|(_, u)| u));
        let user_agent = bounded_user_agent(self.user_agent.as_ref());
        crate::logging::access::Line {
            listener: &self.listener,
            client: self.peer,
            identity: identity.unwrap_or("-"),
            method: self.request.as_ref().map_or("-", |(m, _)| m.as_str()),
            path,
            path_cut,
            user_agent: &user_agent,
            status: self.status,
            bytes,
            duration_ms: millis(elapsed),
            upstream: self.upstream.as_deref().unwrap_or("-"),
            rpc_method: rpc_method.unwrap_or("-"),
            blame: self.blame.map_or("-", |b| match b {
                Blame::Client => "client",
                Blame::Upstream => "upstream",
                Blame::Proxy => "proxy",
            }),
            complete,
        }
        .log();
    }

    fn on_first_data(&mut self, data: &[u8]) {
        if self.metrics.jsonrpc.is_some() && (200..300).contains(&self.status) {
            self.rpc_error = jsonrpc::is_error(data);
        }
    }
}

/// `d` in milliseconds, the nearest `f64` to its exact value, so that a log line reads
/// `1.622804`, not `1.6228040000000001` (what `as_secs_f64() * 1000.0` rounds to, twice).
fn millis(d: std::time::Duration) -> f64 {
    // Exact below 2^53 ns (104 days): one rounding, in the division.
    #[allow(clippy::cast_precision_loss)]
    let ns = d.as_nanos() as f64;
    ns / 1e6
}

#[cfg(test)]
mod tests {
    use super::{bounded_path, bounded_user_agent, identity_name, millis, IpText};
    use crate::tls::ClientIdentity;
    use std::time::Duration;

    #[test]
    fn durations_print_with_the_digits_they_have() {
        for (ns, text) in [
            (1_622_804, "1.622804"),
            (2_304_244, "2.304244"),
            (1_000, "0.001"),
            (1, "1e-6"),
            (0, "0.0"),
            (12_345_678_901_234, "12345678.901234"),
        ] {
            let ms = millis(Duration::from_nanos(ns));
            assert_eq!(format!("{ms:?}"), text, "{ns} ns");
            assert_eq!(serde_json::to_string(&ms).unwrap(), text, "JSON");
        }
        // What the old arithmetic gave for the first one.
        assert_ne!(
            format!(
                "{:?}",
                Duration::from_nanos(1_622_804).as_secs_f64() * 1000.0
            ),
            "1.622804"
        );
    }

    #[test]
    fn identity_name_is_display_name_without_allocating() {
        let base = ClientIdentity {
            subject: "CN=conductor".into(),
            ..ClientIdentity::default()
        };
        let ids = [
            base.clone(),
            ClientIdentity {
                uris: vec!["spiffe://x/y".into()],
                ..base.clone()
            },
            ClientIdentity {
                ips: vec!["ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"
                    .parse()
                    .unwrap()],
                uris: vec!["spiffe://x/y".into()],
                ..base.clone()
            },
            ClientIdentity {
                ips: vec!["127.0.0.2".parse().unwrap(), "::1".parse().unwrap()],
                ..base.clone()
            },
            ClientIdentity {
                dns: vec!["a.example".into()],
                ips: vec!["127.0.0.2".parse().unwrap()],
                ..base
            },
        ];
        for id in &ids {
            let mut ip = IpText::default();
            assert_eq!(identity_name(id, &mut ip), id.display_name(), "{id:?}");
        }
    }

    #[test]
    fn user_agents_are_bounded_and_never_refused() {
        assert_eq!(bounded_user_agent(None), "-");
        let ipa = http::HeaderValue::from_static("ironic-python-agent/9.13.0");
        assert_eq!(bounded_user_agent(Some(&ipa)), "ironic-python-agent/9.13.0");
        let long = http::HeaderValue::from_bytes("é".repeat(200).as_bytes()).unwrap();
        assert_eq!(bounded_user_agent(Some(&long)).len(), 256);
        let obs = http::HeaderValue::from_bytes(b"agent \xff/1").unwrap();
        assert_eq!(bounded_user_agent(Some(&obs)), "agent \u{fffd}/1");
    }

    /// The client's half of this test is `logging::tests::the_client_prints_as_before`.
    #[test]
    fn path_and_client_print_as_before() {
        let long = format!("/{}", "a".repeat(300));
        let uri: http::Uri = long.parse().unwrap();
        assert_eq!(bounded_path(Some(&uri)), (&long[..256], true));
        let uri: http::Uri = "/v1/nodes?detail=true".parse().unwrap();
        assert_eq!(bounded_path(Some(&uri)), ("/v1/nodes", false));
        assert_eq!(bounded_path(None), ("-", false));
        // A cut inside a character ends before it.
        let wide = format!("/{}", "é".repeat(200));
        let uri: http::Uri = wide.parse().unwrap();
        let (cut, more) = bounded_path(Some(&uri));
        assert!(more && cut.len() == 255 && wide.starts_with(cut), "{cut}");
    }
}
