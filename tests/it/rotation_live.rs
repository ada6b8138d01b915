//! Rotation reaches live connections (issue 43): after the trust bundle drops a CA, Ironic's
//! own client, holding a keep-alive connection from that CA, is closed and refused at its next
//! handshake (the connection-level cases are in `trust_change`). After our certificate is
//! renewed, the egress closes its idle pooled connection to the peer, and the next request
//! reaches the peer over a new connection presenting the new certificate (the peer records the
//! client certificate of every request).
//!
//! Both wait for the event that says the change took effect (the listener's or the egress's
//! "TLS configuration follows the new identity" log line), never for time.

use crate::support;
use crate::support::backend::{bind_same_port, Backend, BackendTls};
use crate::support::node::{self, Node};
use crate::support::{Ca, HttpConn, Sandbox, Tls, Upstream, IO_TIMEOUT};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Writes `contents` next to `dest` and renames it over `dest`, as a Secret update does.
fn rename_over(dest: &Path, contents: &str) {
    let tmp = dest.with_extension("tmp");
    std::fs::write(&tmp, contents).expect("write");
    std::fs::rename(&tmp, dest).expect("rename");
}

const USER: &str = "ironic";
const PASSWORD: &str = "s3cret-rotation";

/// `Proxy-Authorization: Basic` for [`USER`]:[`PASSWORD`].
fn proxy_authorization() -> String {
    use base64::Engine as _;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    format!("Basic {token}")
}

#[test]
fn after_a_renewal_the_next_request_through_the_egress_presents_the_new_certificate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let ca = node::ca_init(&d.join("ca"), &[]);
    let ca_pem = std::fs::read_to_string(&ca.0).expect("ca.crt");
    // The peer: a TLS server for 127.0.0.1 from the same CA, asking for and recording the
    // client certificate of every request, on a keep-alive connection.
    let peer_pem = node::cert_issue(&ca, &d.join("peer"), &["--ip", "127.0.0.1"]);
    let listener = bind_same_port(&[LOCALHOST]).remove(0);
    let peer = Backend::start_tls(
        "peer",
        listener,
        &BackendTls {
            cert_pem: peer_pem.cert,
            key_pem: peer_pem.key,
            client_ca_pem: Some(ca_pem),
        },
    );
    let cred = d.join("egress.credentials");
    std::fs::write(&cred, format!("{USER}:{PASSWORD}\n")).expect("credentials");
    let export = d.join("export");
    // Valid an hour: the only renewal is the one SIGHUP asks for.
    let mut identity = node::issuer_identity(&ca, &["egress-a.ironic.test"], &[], "1h");
    identity.push_str(&format!("export_dir = {}\n", node::tp(&export)));
    let (port, cred) = (peer.addr.port(), node::tp(&cred));
    let egress = Node::start(d, "egress", LOCALHOST, move |admin, listen| {
        format!(
            "{identity}\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\n[[listeners]]\n\
             name = \"egress\"\nlisten = \"{listen}\"\ntls = \"none\"\n[listeners.egress]\n\
             credentials = {cred}\ntargets = [\"127.0.0.1\"]\nports = [{port}]\n"
        )
    });
    let exported = || {
        node::serial(&node::pem_der(
            &std::fs::read_to_string(export.join("tls.crt")).expect("tls.crt"),
        ))
    };
    let target = format!("http://127.0.0.1:{port}/");
    let auth = proxy_authorization();
    let mut client = HttpConn::tcp(egress.listen).expect("connect to the egress");
    let mut call = |n: usize| {
        let r = client
            .request(
                "GET",
                &format!("{target}call/{n}"),
                &[("Proxy-Authorization", &auth)],
                b"",
            )
            .expect("answered");
        assert_eq!(r.status, 200, "call {n}: {}", r.text());
        let hits = peer.hits();
        assert_eq!(hits.len(), n, "the peer got every call once");
        let der = hits[n - 1]
            .client_cert
            .clone()
            .expect("a client certificate");
        node::serial(&der)
    };
    let first = exported();
    assert_eq!(call(1), first, "the live certificate");
    assert_eq!(call(2), first, "the same, on the pooled connection");

    assert_eq!(peer.connections_closed(), 0, "one pooled connection, open");

    egress.signal("HUP");
    egress
        .wait_log(IO_TIMEOUT, |l| {
            l.contains("TLS configuration follows the new identity") && l.contains("(egress)")
        })
        .expect("the egress follows the renewed identity");
    // The pooled connection made with the replaced certificate is closed while idle, without
    // a request on it.
    let closed = support::poll_until(IO_TIMEOUT, || {
        (peer.connections_closed() == 1).then_some(())
    });
    assert!(
        closed.is_some(),
        "the egress closes its idle pooled connection"
    );
    assert_eq!(peer.hits().len(), 2, "no request on it since");
    let renewed = exported();
    assert_ne!(renewed, first, "SIGHUP re-issued the certificate");
    assert_eq!(
        call(3),
        renewed,
        "the first request after the renewal presents the new certificate"
    );
    assert_eq!(call(4), renewed);
    assert_eq!(
        egress.metric("ironic_proxy_certificate_renewals_total", &[]),
        1.0
    );
    assert_eq!(peer.handshake_failures(), 0);
}

/// Ironic's JSON-RPC client as it runs: Python `requests`, one `Session` (urllib3's keep-alive
/// pool), client certificate from files. When the trust drops its CA, the proxy closes the
/// session's idle connection; urllib3 sees it closed, and the next call, on a new connection,
/// is refused at the handshake: the client is cut off when the trust changes, not at its next
/// request.
#[test]
fn a_python_requests_session_of_a_ca_dropped_from_trust_is_cut_off_at_the_change() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    const SCRIPT: &str = r#"
import json, sys, requests
url, ca, crt, key = sys.argv[1:5]
s = requests.Session()
def call(i):
    try:
        r = s.post(url, json={"jsonrpc": "2.0", "method": "m", "id": i}, cert=(crt, key),
                   verify=ca, timeout=10)
        return {"status": r.status_code, "connection": r.headers.get("connection")}
    except requests.exceptions.SSLError as e:
        return {"error": "SSLError", "detail": str(e)[:300]}
    except requests.RequestException as e:
        return {"error": type(e).__name__ + ": " + str(e)[:200]}
print(json.dumps(call(1)), flush=True)
sys.stdin.readline()
print(json.dumps(call(2)), flush=True)
"#;
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("rpc"));
    let ca2 = Ca::new("ironic-proxy second test CA");
    // No idle timeout within the test: the session's connection closes by the trust change.
    let proxy = sb
        .proxy()
        .listener("json-rpc", Tls::Mutual, &up.address())
        .watch_interval("100ms")
        .limit_dur("idle_timeout", "1h")
        .start();
    let (crt, key) = sb.client_files(&sb.ca.client_leaf(&["conductor-1.ironic.test"]), "c1");
    // The client keeps trusting the proxy's CA; only the proxy's trust changes.
    let client_ca = sb.path("client-ca.crt");
    std::fs::write(&client_ca, &sb.ca.pem).expect("write");
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(proxy.url("json-rpc", "/"))
        .arg(&client_ca)
        .args([&crt, &key])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = || {
        let mut l = String::new();
        out.read_line(&mut l).expect("a line from python");
        support::json_object(&l)
    };
    let first = line();
    assert_eq!(
        first.get("status").map(String::as_str),
        Some("200"),
        "{first:?}"
    );

    rename_over(&sb.path("ca.crt"), &ca2.pem);
    // The session's connection is closed without the client asking anything: its task has
    // ended (the socket is closed) once the listener has no open connection left.
    proxy
        .wait_log(IO_TIMEOUT, |l| {
            l.contains("no longer verifies") && l.contains("in_flight=0")
        })
        .expect("the idle connection is closed at the change");
    proxy.wait_metric(
        "ironic_proxy_active_connections",
        &[("listener", "json-rpc")],
        IO_TIMEOUT,
        |n| n == 0.0,
    );
    child
        .stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("tell python");
    let second = line();
    assert_eq!(
        second["error"], "SSLError",
        "urllib3 sees the closed connection and reconnects; refused at its handshake: {second:?}"
    );
    // The refusal is the proxy's (counted at its handshake), not the client's: the proxy's
    // certificate still verifies for it. TLS 1.3 ends the client's handshake before the
    // server has checked the certificate, so the client sees the proxy's alert or, when the
    // close overtakes it, an EOF.
    let detail = second.get("detail").cloned().unwrap_or_default();
    assert!(!detail.contains("CERTIFICATE_VERIFY_FAILED"), "{detail}");
    let refused = support::poll_until(IO_TIMEOUT, || {
        let n = proxy.metric(
            "ironic_proxy_tls_handshake_failures_total",
            &[("listener", "json-rpc"), ("reason", "bad_certificate")],
        );
        (n >= 1.0).then_some(n)
    });
    assert_eq!(refused, Some(1.0), "the proxy refused it: {detail}");
    assert!(child.wait().expect("python3 exits").success());
    assert_eq!(
        up.requests().len(),
        1,
        "the call after the change never reached Ironic"
    );
    assert_eq!(
        proxy.metric(
            "ironic_proxy_untrusted_connections_closed_total",
            &[("listener", "json-rpc")]
        ),
        1.0
    );
}
