//! Every Prometheus metric family of the process, registered once in one registry.
//!
//! Names are public (docs/reference.md, "Metrics"): all carry the `ironic_proxy_` prefix, which
//! the registry adds. Modules receive a cheap clone of [`Metrics`] and record into it; the admin
//! listener encodes the registry in the Prometheus text format.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;

mod process;

/// Labels for per-listener request counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub listener: String,
    /// `1xx` .. `5xx`.
    pub class: &'static str,
    /// The full status code; `class` stays so that queries by class keep working.
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    pub listener: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub upstream: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    pub upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// What was reloaded: `certificate`, `trust`, `issuer`.
    pub what: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerTlsLabels {
    pub upstream: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthLabels {
    pub listener: String,
    /// `ok`, `ok_cached`, `public`, `no_credentials`, `malformed`, `unknown_user`,
    /// `wrong_password`, `queue_full` (see `auth::Outcome`).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EgressLabels {
    pub listener: String,
    /// See `proxy::egress::Outcome`: `forwarded`, `peer_failed`, or why it was refused.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JsonRpcLabels {
    pub listener: String,
    /// A method of `proxy::jsonrpc::KNOWN`, or `other`.
    pub method: &'static str,
    /// `ok`, `error` (a JSON-RPC error answer), `refused` (4xx), `failed` (5xx, or the answer
    /// was cut).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FindLabels {
    pub listener: String,
    /// `found`, `not_found`, `failed`, `no_endpoint`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JsonRpcMethodLabels {
    pub listener: String,
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BuildLabels {
    pub version: &'static str,
    pub arch: &'static str,
    pub os: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamRoleLabels {
    pub upstream: String,
    /// `local` (the configured local upstream) or `peer` (a discovered endpoint).
    pub role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointHealthLabels {
    pub upstream: String,
    pub endpoint: String,
    pub role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabels {
    /// `leaf` (the certificate served) or `ca` (an entry of the trust bundle).
    pub certificate: &'static str,
    pub subject: String,
    pub serial: String,
}

/// All metric handles. Cloning is cheap (every handle is an `Arc` inside).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: Family<ListenerLabels, Histogram>,
    pub active_connections: Family<ListenerLabels, Gauge>,
    pub parked_connections: Family<ListenerLabels, Gauge>,
    pub rejected_connections: Family<ListenerLabels, Counter>,
    pub tls_handshake_failures: Family<HandshakeLabels, Counter>,
    pub untrusted_connections_closed: Family<ListenerLabels, Counter>,
    pub upstream_endpoints: Family<EndpointLabels, Gauge>,
    pub upstream_retries: Family<UpstreamLabels, Counter>,
    pub peer_tls_failures: Family<PeerTlsLabels, Counter>,
    /// By [`CertificateLabels`]: the live leaf and every trusted CA.
    pub certificate_expiry: Family<CertificateLabels, Gauge>,
    pub certificate_renewals: Counter,
    pub certificate_renewal_failures: Counter,
    pub reloads: Family<ReloadLabels, Counter>,
    pub reload_failures: Family<ReloadLabels, Counter>,
    pub dns_resolutions: Family<UpstreamLabels, Counter>,
    pub dns_failures: Family<UpstreamLabels, Counter>,
    pub panics: Counter,
    pub auth: Family<AuthLabels, Counter>,
    pub egress_requests: Family<EgressLabels, Counter>,
    pub finds: Family<FindLabels, Counter>,
    pub jsonrpc_calls: Family<JsonRpcLabels, Counter>,
    pub jsonrpc_call_duration: Family<JsonRpcMethodLabels, Histogram>,
    pub upstream_duration: Family<UpstreamRoleLabels, Histogram>,
    /// 1 healthy, 0 not, per endpoint (removed with the endpoint).
    pub endpoint_healthy: Family<EndpointHealthLabels, Gauge>,
    /// `process_*` families, without our prefix (the names every exporter uses).
    process_registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ironic_proxy");
        let requests = Family::default();
        registry.register(
            "requests",
            "Requests by listener and status class",
            requests.clone(),
        );
        let request_duration = Family::<ListenerLabels, Histogram>::new_with_constructor(
            (|| {
                Histogram::new([
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 120.0,
                ])
            }) as fn() -> Histogram,
        );
        registry.register_with_unit(
            "request_duration",
            "Time from request head to response head",
            prometheus_client::registry::Unit::Seconds,
            request_duration.clone(),
        );
        let active_connections = Family::default();
        registry.register(
            "active_connections",
            "Open client connections by listener",
            active_connections.clone(),
        );
        let parked_connections = Family::default();
        registry.register(
            "parked_connections",
            "Idle HTTP/1.1 client connections holding no HTTP buffers, by listener",
            parked_connections.clone(),
        );
        let rejected_connections = Family::default();
        registry.register(
            "rejected_connections",
            "Connections closed at once because the listener was at max_connections",
            rejected_connections.clone(),
        );
        let tls_handshake_failures = Family::default();
        registry.register(
            "tls_handshake_failures",
            "Failed TLS handshakes by listener and reason",
            tls_handshake_failures.clone(),
        );
        let untrusted_connections_closed = Family::default();
        registry.register(
            "untrusted_connections_closed",
            "Mutual-TLS connections closed after their request in flight because the client's \
             chain no longer verifies against a changed trust bundle",
            untrusted_connections_closed.clone(),
        );
        let upstream_endpoints = Family::default();
        registry.register(
            "upstream_endpoints",
            "Upstream endpoints by state (healthy, unhealthy)",
            upstream_endpoints.clone(),
        );
        let upstream_retries = Family::default();
        registry.register(
            "upstream_retries",
            "Requests retried on another endpoint",
            upstream_retries.clone(),
        );
        let peer_tls_failures = Family::default();
        registry.register(
            "peer_tls_failures",
            "TLS failures when connecting to peers, by reason",
            peer_tls_failures.clone(),
        );
        let certificate_expiry = Family::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "notAfter of the certificate served (certificate=leaf) and of each trusted CA \
             (certificate=ca), as a Unix timestamp",
            certificate_expiry.clone(),
        );
        let certificate_renewals = Counter::default();
        registry.register(
            "certificate_renewals",
            "Self-issued certificate renewals",
            certificate_renewals.clone(),
        );
        let certificate_renewal_failures = Counter::default();
        registry.register(
            "certificate_renewal_failures",
            "Failed self-issued certificate renewals",
            certificate_renewal_failures.clone(),
        );
        let reloads = Family::default();
        registry.register("reloads", "Successful reloads of files", reloads.clone());
        let reload_failures = Family::default();
        registry.register(
            "reload_failures",
            "Failed reloads (the last good value is kept)",
            reload_failures.clone(),
        );
        let dns_resolutions = Family::default();
        registry.register(
            "dns_resolutions",
            "DNS resolutions",
            dns_resolutions.clone(),
        );
        let panics = Counter::default();
        registry.register(
            "panics",
            "Panics contained in a task (a connection, a health check); the process kept running",
            panics.clone(),
        );
        let dns_failures = Family::default();
        registry.register(
            "dns_failures",
            "Failed DNS resolutions",
            dns_failures.clone(),
        );
        let auth = Family::default();
        registry.register(
            "auth",
            "Basic authentication outcomes by listener",
            auth.clone(),
        );
        let egress_requests = Family::default();
        registry.register(
            "egress_requests",
            "Requests to egress listeners (Ironic's JSON-RPC client towards peers) by outcome",
            egress_requests.clone(),
        );
        let finds = Family::default();
        registry.register(
            "find",
            "Finds across a route's endpoints (find = \"newest\") by outcome",
            finds.clone(),
        );
        let jsonrpc_calls = Family::default();
        registry.register(
            "jsonrpc_calls",
            "JSON-RPC calls on jsonrpc listeners by method and outcome",
            jsonrpc_calls.clone(),
        );
        let jsonrpc_call_duration = Family::<JsonRpcMethodLabels, Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        registry.register_with_unit(
            "jsonrpc_call_duration",
            "JSON-RPC calls: time from request head to the end of the answer",
            prometheus_client::registry::Unit::Seconds,
            jsonrpc_call_duration.clone(),
        );
        let upstream_duration = Family::<UpstreamRoleLabels, Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        registry.register_with_unit(
            "upstream_duration",
            "Time from sending a request to an upstream endpoint to its response head, by role",
            prometheus_client::registry::Unit::Seconds,
            upstream_duration.clone(),
        );
        let endpoint_healthy = Family::default();
        registry.register(
            "upstream_endpoint_healthy",
            "1 when the endpoint is healthy, 0 when not",
            endpoint_healthy.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                arch: std::env::consts::ARCH,
                os: std::env::consts::OS,
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1; labels say which build runs",
            build_info,
        );
        let mut process_registry = Registry::default();
        process_registry.register_collector(Box::new(process::Collector::new()));
        Self {
            registry: Arc::new(registry),
            requests,
            request_duration,
            active_connections,
            parked_connections,
            rejected_connections,
            tls_handshake_failures,
            untrusted_connections_closed,
            upstream_endpoints,
            upstream_retries,
            peer_tls_failures,
            certificate_expiry,
            certificate_renewals,
            certificate_renewal_failures,
            reloads,
            reload_failures,
            dns_resolutions,
            dns_failures,
            panics,
            auth,
            egress_requests,
            finds,
            jsonrpc_calls,
            jsonrpc_call_duration,
            upstream_duration,
            endpoint_healthy,
            process_registry: Arc::new(process_registry),
        }
    }

    /// The registry in Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry);
        let _ =
            prometheus_client::encoding::text::encode_registry(&mut out, &self.process_registry);
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }
}

/// The buckets of every latency histogram, in seconds.
fn duration_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        120.0,
    ])
}

/// The status class label for a status code.
pub(crate) fn status_class(status: u16) -> &'static str {
    match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}
