//! A sidecar's lone local Ironic answering 502/503/504: the client gets that answer as it is
//! (body included), not the proxy's own 502, whatever the method (HEAD takes the same path;
//! the byte-level client here does not read HEAD answers): there is no other endpoint to
//! retry on, so nothing is held back for a retry. The upstream sees each request once.

use crate::support;

use support::{tls_client_config, HttpConn, Sandbox, Tls, Upstream};

#[test]
fn a_lone_upstream_s_gateway_errors_are_relayed_not_replaced() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy()
        .listener("api", Tls::Server, &up.address())
        .start();
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    for status in [502u16, 503, 504] {
        for method in ["GET", "OPTIONS", "POST", "DELETE"] {
            let before = up.requests().len();
            let path = format!("/v1/nodes?status={status}");
            let r = c.request(method, &path, &[], b"").unwrap();
            assert_eq!(r.status, status, "{method} {path}");
            // The upstream's own body, not the proxy's JSON error.
            assert!(
                !r.text().contains("\"error\":\"bad_gateway\""),
                "{method} {status}: {}",
                r.text()
            );
            assert_eq!(
                up.requests().len(),
                before + 1,
                "{method} {status} sent once"
            );
        }
    }
}
