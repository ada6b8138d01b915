//! The admin listener (`/healthz`, `/readyz`, `/metrics`) and the access log (text and
//! `--log-format json`) of the real binary, checked against the traffic the test sent.

use crate::support;

use std::collections::BTreeMap;
use support::{
    curl, json_object, metric, poll_until, tls_client_config, HttpConn, LeafSpec, Proxy, Sandbox,
    Tls, Upstream,
};

#[test]
fn healthz_readyz_and_metrics_report_what_happened() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy()
        .listener("api", Tls::Server, &up.address())
        .listener("json-rpc", Tls::Mutual, &up.address())
        .start();

    let h = proxy.admin_get("/healthz").unwrap();
    assert_eq!((h.status, h.text().as_str()), (200, "ok\n"));
    let r = proxy.admin_get("/readyz").unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "ready\n"));

    // Traffic: two 200s and a 404 from the upstream on one keep-alive connection, and a
    // refused handshake on the mutual listener.
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    assert_eq!(c.get("/a").unwrap().status, 200);
    assert_eq!(c.get("/b").unwrap().status, 200);
    assert_eq!(c.get("/c?status=404").unwrap().status, 404);
    let out = curl(&[
        "--cacert",
        sb.path("ca.crt").to_str().unwrap(),
        &proxy.url("json-rpc", "/"),
    ]);
    assert!(!out.ok());

    let m = proxy.admin_get("/metrics").unwrap();
    assert_eq!(m.status, 200);
    assert!(
        m.header("content-type").is_some_and(|t| t.contains("text")),
        "{:?}",
        m.headers
    );
    let text = m.text();
    let get = |name: &str, labels: &[(&str, &str)]| metric(&text, name, labels);
    assert_eq!(
        get(
            "ironic_proxy_requests_total",
            &[("listener", "api"), ("class", "2xx")]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        get(
            "ironic_proxy_requests_total",
            &[("listener", "api"), ("class", "4xx")]
        ),
        Some(1.0)
    );
    assert_eq!(
        get(
            "ironic_proxy_request_duration_seconds_count",
            &[("listener", "api")]
        ),
        Some(3.0)
    );
    assert_eq!(
        get(
            "ironic_proxy_request_duration_seconds_bucket",
            &[("listener", "api"), ("le", "+Inf")]
        ),
        Some(3.0)
    );
    assert_eq!(
        get("ironic_proxy_active_connections", &[("listener", "api")]),
        Some(1.0),
        "the keep-alive connection is open"
    );
    assert_eq!(
        get(
            "ironic_proxy_tls_handshake_failures_total",
            &[("listener", "json-rpc"), ("reason", "no_client_cert")]
        ),
        Some(1.0)
    );
    assert_eq!(
        get(
            "ironic_proxy_certificate_expiry_timestamp_seconds",
            &[("certificate", "leaf")]
        ),
        Some(sb.server.not_after.unix_timestamp() as f64)
    );
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics text ends with # EOF"
    );

    drop(c);
    let closed = poll_until(support::HANG, || {
        (proxy.metric("ironic_proxy_active_connections", &[("listener", "api")]) == 0.0)
            .then_some(())
    });
    assert!(
        closed.is_some(),
        "active connections back to 0 after the client left"
    );

    let nf = proxy.admin_get("/nope").unwrap();
    assert_eq!(nf.status, 404);
    assert_eq!(nf.json()["error"], "not_found");
    assert_eq!(up.all().len(), 3);
}

#[test]
fn readyz_is_503_with_the_reason_while_the_certificate_is_expired() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let expired = sb
        .ca
        .leaf(&LeafSpec::new(&["localhost", "127.0.0.1"]).expired());
    expired.write(sb.dir.path(), "tls");
    let proxy = sb
        .proxy()
        .listener("api", Tls::Server, &up.address())
        .start_unready();
    assert_eq!(proxy.admin_get("/healthz").unwrap().status, 200);
    let r = proxy.admin_get("/readyz").unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("not valid"),
        "the reason is given: {}",
        r.text()
    );
}

/// `key=value` fields of a text log line (values may be double-quoted).
fn text_fields(line: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = line;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].rsplit(' ').next().unwrap_or("").to_owned();
        let after = &rest[eq + 1..];
        let (value, tail) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"').unwrap_or(q.len());
            (q[..end].to_owned(), &q[(end + 1).min(q.len())..])
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_owned(), &after[end..])
        };
        out.insert(key, value);
        rest = tail;
    }
    out
}

/// The `User-Agent` of the GET requests of [`traffic`]; the others send none.
const UA: &str = "ironic-python-agent/9.13.0 (test; x86_64)";

/// Sends the same traffic in both log-format tests: returns (path, status, body bytes, client
/// certificate DNS name) for each request.
fn traffic(sb: &Sandbox, proxy: &Proxy) -> Vec<(String, u16, usize, Option<&'static str>)> {
    let mut seen = Vec::new();
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    for path in ["/v1/nodes?detail=1", "/v1/ports?size=1234"] {
        let r = c.request("GET", path, &[("User-Agent", UA)], b"").unwrap();
        seen.push((
            path.split('?').next().unwrap().to_owned(),
            r.status,
            r.body.len(),
            None,
        ));
    }
    let r = c
        .request("POST", "/v1/created?status=201", &[], b"hello")
        .unwrap();
    seen.push(("/v1/created".to_owned(), r.status, r.body.len(), None));
    let client = sb.ca.client_leaf(&["conductor-7.ironic.test"]);
    let cfg = tls_client_config(&sb.ca.pem, Some(&client), &[b"http/1.1"]);
    let mut m = HttpConn::tls(proxy.addr("json-rpc"), cfg).unwrap();
    let r = m
        .request("POST", "/", &[], br#"{"method":"ping"}"#)
        .unwrap();
    seen.push((
        "/".to_owned(),
        r.status,
        r.body.len(),
        Some("conductor-7.ironic.test"),
    ));
    seen
}

/// One line per request and nothing else, shown with a barrier instead of a wait: one more
/// request, on a connection of its own, whose line must be the next one. A duplicate or stray
/// line for the `sent` requests would have been written before it.
fn no_stray_access_lines(sb: &Sandbox, proxy: &Proxy, sent: usize) {
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    let r = c.request("GET", "/v1/barrier", &[], b"").unwrap();
    assert_eq!(r.status, 200);
    let lines = proxy.wait_access_logs(sent + 1, support::HANG);
    assert_eq!(lines.len(), sent + 1, "one line per request: {lines:#?}");
    assert!(lines[sent].contains("/v1/barrier"), "{lines:#?}");
}

#[test]
fn access_log_has_one_text_line_per_request_with_every_field() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy()
        .listener("api", Tls::Server, &up.address())
        .listener("json-rpc", Tls::Mutual, &up.address())
        .start();
    let sent = traffic(&sb, &proxy);
    let lines = proxy.wait_access_logs(sent.len(), support::HANG);
    no_stray_access_lines(&sb, &proxy, sent.len());
    let upstream = up.address();
    for (line, (path, status, bytes, identity)) in lines.iter().zip(&sent) {
        let f = text_fields(line);
        let listener = if identity.is_some() {
            "json-rpc"
        } else {
            "api"
        };
        assert_eq!(f["listener"], listener, "{line}");
        assert!(f["client"].starts_with("127.0.0.1:"), "{line}");
        assert_eq!(f["identity"], identity.unwrap_or("-"), "{line}");
        assert_eq!(
            f["method"],
            if path.starts_with("/v1/c") || path == "/" {
                "POST"
            } else {
                "GET"
            }
        );
        assert_eq!(&f["path"], path, "{line}");
        let ua = if f["method"] == "GET" { UA } else { "-" };
        assert_eq!(f["user_agent"], ua, "{line}");
        assert_eq!(f["status"], status.to_string(), "{line}");
        assert_eq!(f["bytes"], bytes.to_string(), "{line}");
        assert!(
            f["duration_ms"].parse::<f64>().is_ok_and(|d| d >= 0.0),
            "{line}"
        );
        assert_eq!(f["upstream"], upstream, "{line}");
    }
    assert_eq!(sent[1].2, 1234);
    assert_eq!(sent[2].1, 201);
}

#[test]
fn access_log_in_json_is_one_object_per_request() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy()
        .listener("api", Tls::Server, &up.address())
        .listener("json-rpc", Tls::Mutual, &up.address())
        .json_logs()
        .start();
    let sent = traffic(&sb, &proxy);
    let lines = proxy.wait_access_logs(sent.len(), support::HANG);
    no_stray_access_lines(&sb, &proxy, sent.len());
    for line in proxy.logs() {
        json_object(&line); // every stderr line is JSON, not only the access log
    }
    for (line, (path, status, bytes, identity)) in lines.iter().zip(&sent) {
        let f = json_object(line);
        assert_eq!(f["target"], "access");
        assert_eq!(
            f["listener"],
            if identity.is_some() {
                "json-rpc"
            } else {
                "api"
            }
        );
        assert!(f["client"].starts_with("127.0.0.1:"), "{line}");
        assert_eq!(f["identity"], identity.unwrap_or("-"), "{line}");
        assert!(["GET", "POST"].contains(&f["method"].as_str()), "{line}");
        assert_eq!(&f["path"], path);
        let ua = if f["method"] == "GET" { UA } else { "-" };
        assert_eq!(f["user_agent"], ua, "{line}");
        assert_eq!(f["status"], status.to_string(), "{line}");
        assert_eq!(f["bytes"], bytes.to_string(), "{line}");
        assert!(f["duration_ms"].parse::<f64>().is_ok(), "{line}");
        assert_eq!(f["upstream"], up.address(), "{line}");
    }
}
