//! Forwarding through the real proxy binary to a recording upstream on a unix socket, with real
//! clients: curl and Python `requests` over `server` and `mutual` listeners with keep-alive on
//! both sides; one well-formed upstream request per client request; framing attacks refused;
//! spoofed `X-Forwarded-Client-Cert` and hop-by-hop headers stripped; 502 and 504.

use crate::support;

use std::time::{Duration, Instant};
use support::{
    curl, json_object, python, status_lines, tls_client_config, HttpConn, Proxy, Sandbox, Tls,
    Upstream,
};

/// Parses curl output written with `-w '\n%{http_code} %{num_connects} %{http_version}\n'`
/// after each body: (body, status, new connections, http version) per URL.
fn curl_results(stdout: &str) -> Vec<(String, u16, u32, String)> {
    let lines: Vec<&str> = stdout.lines().collect();
    lines
        .chunks(2)
        .map(|pair| {
            let mut w = pair[1].split_whitespace();
            (
                pair[0].to_owned(),
                w.next().and_then(|s| s.parse().ok()).expect("http_code"),
                w.next().and_then(|s| s.parse().ok()).expect("num_connects"),
                w.next().expect("http_version").to_owned(),
            )
        })
        .collect()
}

const CURL_W: &str = "\n%{http_code} %{num_connects} %{http_version}\n";

/// The `client=` field of text access-log lines, in order.
fn access_clients(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix("client="))
                .map(str::to_owned)
        })
        .collect()
}

#[test]
fn curl_through_a_server_listener_reuses_both_connections() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb.proxy_to(&up, &[("api", Tls::Server)]).start();
    let ca = sb.path("ca.crt");
    let ca = ca.to_str().unwrap();

    // The two curl runs go back to back, every check after both: the proxy keeps an idle
    // upstream connection for the pool's idle timeout only, and the checks (a Python process
    // per JSON body) took longer than that on a loaded machine, so the second run found the
    // pooled connection closed.
    let runs = [("--http1.1", "1.1"), ("--http2", "2")].map(|(flag, version)| {
        let out = curl(&[
            "--cacert",
            ca,
            flag,
            "-w",
            CURL_W,
            &proxy.url("api", "/v1/nodes?one"),
            &proxy.url("api", "/v1/ports"),
        ]);
        (flag, version, out)
    });
    for (flag, version, out) in &runs {
        assert!(out.ok(), "curl {flag}: {out:?}");
        let results = curl_results(&out.stdout);
        assert_eq!(results.len(), 2, "{out:?}");
        for (i, (body, status, _, v)) in results.iter().enumerate() {
            assert_eq!(*status, 200, "{flag} request {i}");
            assert_eq!(v, version, "{flag} negotiated version");
            let json = json_object(body);
            assert_eq!(json["upstream"], "ok");
        }
        assert_eq!(json_object(&results[0].0)["path"], "/v1/nodes");
        assert_eq!(json_object(&results[1].0)["path"], "/v1/ports");
        assert_eq!(
            (results[0].2, results[1].2),
            (1, 0),
            "{flag}: the second URL must reuse the first connection"
        );
    }
    // The proxy saw each run's two requests on one client connection (same source port), and
    // each run on its own.
    let logs = proxy.wait_access_logs(4, Duration::from_secs(10));
    let c = access_clients(&logs);
    assert_eq!(c.len(), 4, "{logs:?}");
    assert_eq!(
        c[0], c[1],
        "--http1.1: one client connection for both requests"
    );
    assert_eq!(
        c[2], c[3],
        "--http2: one client connection for both requests"
    );
    assert_ne!(c[0], c[2], "each curl run is its own connection");

    let reqs = up.requests();
    let paths: Vec<&str> = reqs.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/v1/nodes?one", "/v1/ports", "/v1/nodes?one", "/v1/ports"]
    );
    assert_eq!(
        up.all().len(),
        4,
        "exactly one upstream request per client request"
    );
    assert!(
        reqs.iter().all(|r| r.conn == 1) && up.connections() == 1,
        "the proxy must reuse its pooled upstream connection: {:?}",
        reqs.iter().map(|r| r.conn).collect::<Vec<_>>()
    );
    for r in &reqs {
        assert_eq!(r.method, "GET");
        assert_eq!(r.version, "HTTP/1.1", "upstream side is HTTP/1.1");
        assert_eq!(r.header("x-forwarded-proto"), Some("https"));
        assert_eq!(r.header("x-forwarded-for"), Some("127.0.0.1"));
        assert_eq!(
            r.header("x-forwarded-host"),
            Some(format!("127.0.0.1:{}", proxy.port("api")).as_str())
        );
        assert!(
            r.header("via").is_some_and(|v| v.contains("ironic-proxy")),
            "{r:?}"
        );
        assert_eq!(
            r.header("x-forwarded-client-cert"),
            None,
            "server listener: no identity"
        );
    }
    assert_eq!(up.malformed(), 0);
}

#[test]
fn curl_with_a_client_certificate_through_a_mutual_listener() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("rpc"));
    let proxy = sb
        .proxy()
        .listener("json-rpc", Tls::Mutual, &up.address())
        .allow(&["*.ironic.test"])
        .start();
    let client = sb.ca.client_leaf(&["conductor-1.ironic.test"]);
    let (crt, key) = sb.client_files(&client, "client");
    // curl's `--next` resets the options, so each URL repeats them.
    let ca = sb.path("ca.crt");
    let opts = [
        "--cacert",
        ca.to_str().unwrap(),
        "--cert",
        crt.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--http1.1",
        "-w",
        CURL_W,
    ];
    let (ping, health) = (proxy.url("json-rpc", "/"), proxy.url("json-rpc", "/health"));
    let out = curl(
        &[
            &opts[..],
            &[
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                r#"{"method":"ping"}"#,
                &ping,
                "--next",
            ],
            &opts[..],
            &[&health],
        ]
        .concat(),
    );
    assert!(out.ok(), "{out:?}");
    let results = curl_results(&out.stdout);
    assert_eq!(
        results.iter().map(|r| (r.1, r.2)).collect::<Vec<_>>(),
        [(200, 1), (200, 0)],
        "two 200s over one connection: {out:?}"
    );
    let reqs = up.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(up.all().len(), 2);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].body, br#"{"method":"ping"}"#);
    assert_eq!(reqs[0].header("content-length"), Some("17"));
    assert_eq!(reqs[1].method, "GET");
    assert!(
        reqs.iter().all(|r| r.conn == reqs[0].conn),
        "pooled upstream connection"
    );
    for r in &reqs {
        let xfcc = r.all("x-forwarded-client-cert");
        assert_eq!(xfcc.len(), 1, "{r:?}");
        assert!(
            xfcc[0].starts_with(&format!("Hash={};Subject=\"", client.sha256())),
            "{xfcc:?}"
        );
        assert!(xfcc[0].contains(";DNS=conductor-1.ironic.test"), "{xfcc:?}");
    }
}

/// Ironic's JSON-RPC client: a `requests.Session` posting JSON with a client certificate.
const PY_SESSION: &str = r#"
import json, sys, requests
url, ca = sys.argv[1], sys.argv[2]
cert = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else None
s = requests.Session()
out, pools = [], set()
for i in range(3):
    body = {"jsonrpc": "2.0", "method": "do_node_deploy", "params": {"node": "n%d" % i}, "id": i}
    r = s.post(url, json=body, cert=cert, verify=ca, timeout=10)
    out.append([r.status_code, r.json()])
    pools.add(id(r.raw._pool))
    pool = r.raw._pool
print(json.dumps({"responses": out, "pools": len(pools), "connections": pool.num_connections}))
"#;

#[test]
fn python_requests_session_through_server_and_mutual_listeners() {
    let sb = Sandbox::new();
    let up_api = Upstream::start(&sb.socket("api"));
    let up_rpc = Upstream::start(&sb.socket("rpc"));
    let proxy = sb
        .proxy()
        .listener("api", Tls::Server, &up_api.address())
        .listener("json-rpc", Tls::Mutual, &up_rpc.address())
        .allow(&["*.ironic.test", "ip:10.0.0.0/8"])
        .start();
    let client = sb.ca.client_leaf(&["conductor-2.ironic.test", "10.1.2.3"]);
    let (crt, key) = sb.client_files(&client, "client");
    let ca = sb.path("ca.crt");

    for (listener, up, with_cert) in [("api", &up_api, false), ("json-rpc", &up_rpc, true)] {
        let url = proxy.url(listener, "/");
        let mut args = vec![url.as_str(), ca.to_str().unwrap()];
        if with_cert {
            args.extend([crt.to_str().unwrap(), key.to_str().unwrap()]);
        }
        let out = python(PY_SESSION, &args);
        assert!(out.ok(), "{listener}: {out:?}");
        let result = json_object(out.stdout.trim());
        assert_eq!(
            result["connections"], "1",
            "{listener}: the session must reuse one TLS connection: {result:?}"
        );
        assert_eq!(result["pools"], "1");
        let responses = &result["responses"];
        assert_eq!(responses.matches("[200, {").count(), 3, "{responses}");
        assert_eq!(
            responses.matches("\"upstream\": \"ok\"").count(),
            3,
            "{responses}"
        );

        let reqs = up.requests();
        assert_eq!(reqs.len(), 3, "{listener}");
        assert_eq!(
            up.all().len(),
            3,
            "{listener}: exactly one upstream request each"
        );
        for (i, r) in reqs.iter().enumerate() {
            assert_eq!(r.method, "POST");
            let want = format!(
                "{{\"jsonrpc\": \"2.0\", \"method\": \"do_node_deploy\", \"params\": {{\"node\": \"n{i}\"}}, \"id\": {i}}}"
            );
            assert_eq!(
                String::from_utf8_lossy(&r.body),
                want,
                "{listener} body {i}"
            );
            assert_eq!(r.header("content-type"), Some("application/json"));
            assert_eq!(
                r.conn, reqs[0].conn,
                "{listener}: pooled upstream connection"
            );
            let xfcc = r.all("x-forwarded-client-cert");
            if with_cert {
                assert_eq!(xfcc.len(), 1);
                assert!(
                    xfcc[0].contains(&format!("Hash={}", client.sha256())),
                    "{xfcc:?}"
                );
                assert!(xfcc[0].contains("DNS=conductor-2.ironic.test"), "{xfcc:?}");
                assert!(xfcc[0].contains("IP=10.1.2.3"), "{xfcc:?}");
            } else {
                assert!(xfcc.is_empty());
            }
        }
        assert_eq!(up.connections(), 1, "{listener}: one upstream connection");
    }
    let clients = access_clients(&proxy.wait_access_logs(6, support::HANG));
    assert_eq!(clients.len(), 6, "{:?}", proxy.access_logs());
    assert!(clients[..3].iter().all(|c| *c == clients[0]));
    assert!(clients[3..].iter().all(|c| *c == clients[3]));
}

#[test]
fn one_well_formed_upstream_request_per_pipelined_client_request() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb.proxy_to(&up, &[("plain", Tls::None)]).start();
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    c.send(
        b"GET /one HTTP/1.1\r\nHost: ironic\r\n\r\n\
          POST /two HTTP/1.1\r\nHost: ironic\r\nContent-Length: 5\r\n\r\nhello\
          POST /three HTTP/1.1\r\nHost: ironic\r\nTransfer-Encoding: chunked\r\n\r\n\
          3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n\
          DELETE /four HTTP/1.1\r\nHost: ironic\r\n\r\n",
    )
    .unwrap();
    for want in ["/one", "/two", "/three", "/four"] {
        let r = c.read_response().unwrap();
        assert_eq!(r.status, 200, "{want}: {}", r.text());
        assert_eq!(r.json()["path"], want);
    }
    let reqs = up.requests();
    assert_eq!(up.all().len(), 4);
    let summary: Vec<(&str, &str, &[u8])> = reqs
        .iter()
        .map(|r| (r.method.as_str(), r.path.as_str(), r.body.as_slice()))
        .collect();
    assert_eq!(
        summary,
        [
            ("GET", "/one", &b""[..]),
            ("POST", "/two", b"hello"),
            ("POST", "/three", b"abcdefg"),
            ("DELETE", "/four", b""),
        ]
    );
    for r in &reqs {
        assert_eq!(r.header("host"), Some("ironic"), "Host is kept");
        assert_eq!(r.all("host").len(), 1);
        assert_eq!(r.header("x-forwarded-proto"), Some("http"));
        let framing = (
            r.all("content-length").len(),
            r.all("transfer-encoding").len(),
        );
        assert!(
            framing.0 + framing.1 <= 1,
            "one framing header at most: {r:?}"
        );
    }
    assert_eq!(reqs[1].header("content-length"), Some("5"));
    assert_eq!(up.malformed(), 0);
}

/// Requests with ambiguous or obfuscated framing, each followed by a request that would be
/// smuggled if the proxy and the upstream disagreed about where the first one ends.
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
const LAST_CHUNK: &str = "0\r\n\r\n";

fn attack(headers: &str, body: &str) -> String {
    format!("POST /attack HTTP/1.1\r\nHost: x\r\n{headers}\r\n{body}{SMUGGLED}")
}

/// Both Content-Length and Transfer-Encoding, in both orders.
fn cl_te_attacks() -> Vec<(&'static str, String)> {
    vec![
        (
            "CL then TE",
            attack(
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                LAST_CHUNK,
            ),
        ),
        (
            "TE then CL",
            attack(
                "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
                LAST_CHUNK,
            ),
        ),
    ]
}

/// Conflicting Content-Length and obfuscated Transfer-Encoding.
fn framing_attacks() -> Vec<(&'static str, String)> {
    let te = |v: &str| attack(&format!("Transfer-Encoding: {v}\r\n"), LAST_CHUNK);
    vec![
        (
            "conflicting Content-Length",
            attack("Content-Length: 5\r\nContent-Length: 40\r\n", "hello"),
        ),
        ("Content-Length list", attack("Content-Length: 5, 40\r\n", "hello")),
        ("Content-Length sign", attack("Content-Length: +5\r\n", "hello")),
        ("TE chunked, identity", te("chunked, identity")),
        ("TE identity, chunked", te("identity, chunked")),
        ("TE xchunked", te("xchunked")),
        ("TE chunked, chunked", te("chunked, chunked")),
        (
            "TE duplicated",
            attack(
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                LAST_CHUNK,
            ),
        ),
        (
            "TE with space before the colon",
            attack("Transfer-Encoding : chunked\r\n", LAST_CHUNK),
        ),
        (
            "TE folded onto the next line",
            attack("Transfer-Encoding:\r\n chunked\r\n", LAST_CHUNK),
        ),
        ("TE after a vertical tab", te("\x0bchunked")),
        (
            "TE on HTTP/1.0",
            format!(
                "POST /attack HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{LAST_CHUNK}{SMUGGLED}"
            ),
        ),
        ("two Host headers", attack("Host: y\r\nContent-Length: 0\r\n", "")),
    ]
}

/// Sends each attack on its own connection; returns a line per attack that did not get exactly
/// one 400 followed by the connection closing (RFC 9112 §6.3: respond 400, then close).
fn refused_and_closed<S: support::Stream>(
    attacks: Vec<(&'static str, String)>,
    mut connect: impl FnMut() -> HttpConn<S>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, raw) in attacks {
        let mut c = connect();
        c.send(raw.as_bytes()).unwrap();
        let (bytes, closed) = c.head_then_drain(Duration::from_secs(2));
        let statuses = status_lines(&bytes);
        if statuses != [400] || !closed {
            failures.push(format!(
                "{name}: responses {statuses:?}, closed {closed}: {:?}",
                String::from_utf8_lossy(&bytes)
            ));
        }
    }
    failures
}

/// [`refused_and_closed`] over new plain connections to the `plain` listener.
fn refused_over_tcp(attacks: Vec<(&'static str, String)>, proxy: &Proxy) -> Vec<String> {
    refused_and_closed(attacks, || HttpConn::tcp(proxy.addr("plain")).unwrap())
}

/// [`refused_and_closed`] over new TLS connections to the server listener `api`.
fn refused_over_tls(
    attacks: Vec<(&'static str, String)>,
    proxy: &Proxy,
    sb: &Sandbox,
) -> Vec<String> {
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    refused_and_closed(attacks, || {
        HttpConn::tls(proxy.addr("api"), cfg.clone()).unwrap()
    })
}

fn assert_refused(failures: &[String], up: &Upstream) {
    let reached: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert!(
        failures.is_empty() && reached.is_empty(),
        "each attack must get exactly one 400 and a closed connection, and the upstream \
         must see nothing.\nfailures:\n{}\nupstream saw: {reached:?}",
        failures.join("\n")
    );
}

#[test]
fn conflicting_length_and_obfuscated_te_get_400_close_and_never_reach_the_upstream() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb.proxy_to(&up, &[("plain", Tls::None)]).start();
    let failures = refused_over_tcp(framing_attacks(), &proxy);
    assert_refused(&failures, &up);
    // The proxy is still serving.
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    assert_eq!(c.get("/after").unwrap().status, 200);
    assert_eq!(up.all().len(), 1);
}

#[test]
fn framing_attacks_over_tls_get_400_close_and_never_reach_the_upstream() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb.proxy_to(&up, &[("api", Tls::Server)]).start();
    let attacks: Vec<_> = framing_attacks()
        .into_iter()
        .filter(|(n, _)| *n == "conflicting Content-Length" || *n == "TE duplicated")
        .collect();
    assert_eq!(attacks.len(), 2);
    let failures = refused_over_tls(attacks, &proxy, &sb);
    assert_refused(&failures, &up);
}

#[test]
fn content_length_with_transfer_encoding_gets_400_and_never_reaches_the_upstream() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("plain", Tls::None), ("api", Tls::Server)])
        .start();
    let mut failures = refused_over_tcp(cl_te_attacks(), &proxy);
    failures.extend(refused_over_tls(cl_te_attacks(), &proxy, &sb));
    assert_refused(&failures, &up);
}

#[test]
fn spoofed_client_cert_header_never_reaches_the_upstream() {
    let sb = Sandbox::new();
    let up_rpc = Upstream::start(&sb.socket("rpc"));
    let up_api = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy()
        .listener("json-rpc", Tls::Mutual, &up_rpc.address())
        .listener("api", Tls::Server, &up_api.address())
        .start();
    let client = sb.ca.client_leaf(&["conductor-3.ironic.test"]);
    let spoof = "X-Forwarded-Client-Cert: Hash=0000;Subject=\"CN=admin\";DNS=admin.evil\r\n\
                 x-forwarded-client-cert: By=evil\r\n\
                 X-FORWARDED-CLIENT-CERT: DNS=upper.evil\r\n\
                 X_Forwarded_Client_Cert: DNS=underscore.evil\r\n\
                 x_forwarded_client_cert: DNS=underscore-lower.evil\r\n\
                 X-Forwarded-Client_Cert: DNS=mixed.evil\r\n";
    let raw = format!("GET /spoof HTTP/1.1\r\nHost: x\r\n{spoof}\r\n");

    // Mutual listener over raw TLS: only the proxy's own header arrives.
    let cfg = tls_client_config(&sb.ca.pem, Some(&client), &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("json-rpc"), cfg).unwrap();
    c.send(raw.as_bytes()).unwrap();
    assert_eq!(c.read_response().unwrap().status, 200);
    // Server listener: no identity, so no header at all.
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    c.send(raw.as_bytes()).unwrap();
    assert_eq!(c.read_response().unwrap().status, 200);
    // And over HTTP/2 with curl on the mutual listener.
    let (crt, key) = sb.client_files(&client, "client");
    let out = curl(&[
        "--http2",
        "--cacert",
        sb.path("ca.crt").to_str().unwrap(),
        "--cert",
        crt.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "-H",
        "X-Forwarded-Client-Cert: DNS=h2.evil",
        "-H",
        "X_Forwarded_Client_Cert: DNS=h2-underscore.evil",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{http_version}",
        &proxy.url("json-rpc", "/spoof-h2"),
    ]);
    assert_eq!(out.stdout, "200 2", "{out:?}");

    let rpc = up_rpc.requests();
    assert_eq!(rpc.len(), 2);
    for r in &rpc {
        let xfcc = r.all("x-forwarded-client-cert");
        assert_eq!(xfcc.len(), 1, "exactly the proxy's header: {r:?}");
        assert!(
            xfcc[0].starts_with(&format!("Hash={};", client.sha256())),
            "{xfcc:?}"
        );
        assert!(xfcc[0].contains("DNS=conductor-3.ironic.test"), "{xfcc:?}");
        assert!(!xfcc[0].contains("evil"), "{xfcc:?}");
        assert!(
            r.headers
                .iter()
                .all(|(n, v)| !n.contains('_') && !v.contains("evil")),
            "no spoofed copy in any spelling: {:?}",
            r.headers
        );
    }
    let api = up_api.requests();
    assert_eq!(api.len(), 1);
    assert!(
        api[0]
            .headers
            .iter()
            .all(|(n, v)| !n.contains("client") && !v.contains("evil")),
        "{:?}",
        api[0].headers
    );
}

#[test]
fn hop_by_hop_headers_are_stripped_and_h2c_upgrade_never_happens() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb.proxy_to(&up, &[("api", Tls::Server)]).start();
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    c.send(
        b"GET /hop?hop=1 HTTP/1.1\r\n\
          Host: ironic.example\r\n\
          Connection: keep-alive, X-Secret-Hop, Upgrade, HTTP2-Settings\r\n\
          X-Secret-Hop: 1\r\n\
          Keep-Alive: timeout=5\r\n\
          TE: trailers\r\n\
          Upgrade: h2c\r\n\
          HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\
          Proxy-Connection: keep-alive\r\n\
          Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
          X-Forwarded-For: 203.0.113.9\r\n\
          X-Forwarded-Host: evil.example\r\n\
          X-Forwarded-Proto: gopher\r\n\
          X-End: kept\r\n\r\n",
    )
    .unwrap();
    let r = c.read_response().unwrap();
    assert_eq!(r.status, 200, "never 101: {r:?}");
    assert!(!r.has_header("upgrade"), "{r:?}");
    for gone in ["x-upstream-hop", "proxy-authenticate"] {
        assert!(!r.has_header(gone), "response kept {gone}: {:?}", r.headers);
    }
    // The upstream's `Keep-Alive: timeout=5` is its own; the client gets the listener's
    // (`idle_timeout` 10 s in these tests).
    assert_eq!(
        r.header("keep-alive"),
        Some("timeout=10"),
        "{:?}",
        r.headers
    );
    assert_eq!(r.header("x-upstream-end"), Some("kept"));
    assert!(
        r.header("via").is_some_and(|v| v.contains("ironic-proxy")),
        "{r:?}"
    );

    // The connection is still HTTP/1.1 after the refused upgrade.
    let r2 = c.get("/second").unwrap();
    assert_eq!(r2.status, 200);

    let reqs = up.requests();
    assert_eq!(reqs.len(), 2);
    let h = &reqs[0];
    for gone in [
        "connection",
        "x-secret-hop",
        "keep-alive",
        "te",
        "upgrade",
        "http2-settings",
        "proxy-connection",
        "proxy-authorization",
    ] {
        assert!(
            h.header(gone).is_none(),
            "upstream got {gone}: {:?}",
            h.headers
        );
    }
    assert_eq!(h.header("x-end"), Some("kept"));
    assert_eq!(h.header("host"), Some("ironic.example"));
    assert_eq!(h.header("x-forwarded-for"), Some("203.0.113.9, 127.0.0.1"));
    assert_eq!(h.all("x-forwarded-proto"), ["https"]);
    assert_eq!(h.all("x-forwarded-host"), ["ironic.example"]);
    assert!(
        h.header("via")
            .is_some_and(|v| v.contains("1.1 ironic-proxy")),
        "{h:?}"
    );
}

#[test]
fn missing_upstream_socket_gives_502_quickly_and_recovers_when_it_appears() {
    let sb = Sandbox::new();
    let sock = sb.socket("api");
    // An upstream timeout far above HANG: a 502 within HANG is the failed connect's, not a
    // timeout's (HANG only catches a hang; a busy machine may delay the answer by seconds).
    let proxy = sb
        .proxy()
        .listener("api", Tls::Server, &format!("unix:{}", sock.display()))
        .limit_dur("upstream_timeout", "60s")
        .start();
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    let t = Instant::now();
    let r = c.get("/v1/nodes").unwrap();
    let took = t.elapsed();
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(took < support::HANG, "502 took {took:?}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.json();
    assert_eq!(body["error"], "bad_gateway");
    assert_eq!(body["status"], "502");
    assert!(
        !body["message"].contains(sock.to_str().unwrap()),
        "no internals: {body:?}"
    );

    // Ironic comes up after the proxy: the same client connection now gets through.
    let up = Upstream::start(&sock);
    let r = c.get("/v1/nodes").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(up.requests().len(), 1);
}

#[test]
fn slow_upstream_gives_504_and_the_proxy_keeps_serving() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("api", Tls::Server)])
        .limit_dur("upstream_timeout", "1s")
        .start();
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let mut c = HttpConn::tls(proxy.addr("api"), cfg.clone()).unwrap();
    // The upstream would answer after 60 s: the 504 is the timeout's. Not before the timeout;
    // the upper bound only catches a hang (the timer's own timing is src/proxy's paused-clock
    // tests').
    let stall = |c: &mut HttpConn<_>, which: &str| {
        let t = Instant::now();
        let r = c.get("/slow?delay_ms=60000").unwrap();
        let took = t.elapsed();
        assert_eq!(r.status, 504, "{which}: {}", r.text());
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(1) + support::HANG,
            "{which} 504 after {took:?}, upstream_timeout is 1s"
        );
        r
    };
    let body = stall(&mut c, "first").json();
    assert_eq!(body["error"], "gateway_timeout");
    assert_eq!(body["status"], "504");

    // Keeps serving: on the same connection and on a new one.
    let r = c.get("/fast").unwrap();
    assert_eq!(r.status, 200);
    let mut c2 = HttpConn::tls(proxy.addr("api"), cfg).unwrap();
    assert_eq!(c2.get("/fast2").unwrap().status, 200);

    // Each request's upstream deadline starts with that request: a slow answer inside the
    // timeout is relayed after a deadline that fired and after one that passed while the
    // connection was idle; the next stall gets its full second again.
    let r = c.get("/slow?delay_ms=500").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // Exercised: the connection idles past the previous request's deadline.
    std::thread::sleep(Duration::from_millis(1500));
    let r = c.get("/slow?delay_ms=600").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    stall(&mut c, "second");
    let paths: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        paths,
        [
            "/slow?delay_ms=60000",
            "/fast",
            "/fast2",
            "/slow?delay_ms=500",
            "/slow?delay_ms=600",
            "/slow?delay_ms=60000"
        ]
    );
}

/// An HTTP/1.0 server (as `python3 -m http.server`) on a unix socket: reads one request per
/// connection and answers it in HTTP/1.0, without keep-alive; `framed` answers carry a
/// Content-Length, the others end when the connection closes. Returns the request lines.
fn http10_upstream(path: &std::path::Path, answers: usize) -> std::thread::JoinHandle<Vec<String>> {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::os::unix::net::UnixListener::bind(path).expect("bind");
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for i in 0..answers {
            let (s, _) = listener.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            seen.push(line.trim_end().to_owned());
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                    break;
                }
            }
            let body = format!("answer {i}");
            let head = if i % 2 == 0 {
                format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", body.len())
            } else {
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n".to_owned()
            };
            let mut s = r.into_inner();
            s.write_all(format!("{head}{body}").as_bytes()).unwrap();
            // Dropped: the close ends the unframed body.
        }
        seen
    })
}

/// The real-iPXE e2e finding: behind `python3 -m http.server` curl got `HTTP/1.0 200 OK` and
/// a new connection per request. The proxy answers in its own version, keeps the client's
/// connection, and frames an unframed (close-delimited) answer for it.
#[test]
fn an_http10_upstream_is_answered_to_http11_clients_in_http11_on_one_connection() {
    let sb = Sandbox::new();
    let socket = sb.socket("old");
    let server = http10_upstream(&socket, 4);
    let proxy = sb
        .proxy()
        .listener("api", Tls::None, &format!("unix:{}", socket.display()))
        .start();
    let out = curl(&[
        "--http1.1",
        "-i",
        "-w",
        CURL_W,
        &proxy.http_url("api", "/a"),
        &proxy.http_url("api", "/b"),
        &proxy.http_url("api", "/c"),
        &proxy.http_url("api", "/d"),
    ]);
    assert!(out.ok(), "{out:?}");
    let status: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("HTTP/"))
        .collect();
    assert_eq!(status, ["HTTP/1.1 200 OK"; 4], "{}", out.stdout);
    let mut connects = Vec::new();
    for line in out.stdout.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() == 3 && w[0] == "200" {
            connects.push(w[1].to_owned());
            assert_eq!(w[2], "1.1", "{line}");
        }
    }
    assert_eq!(
        connects,
        ["1", "0", "0", "0"],
        "one client connection: {}",
        out.stdout
    );
    for i in 0..4 {
        assert!(
            out.stdout.contains(&format!("answer {i}")),
            "{}",
            out.stdout
        );
    }
    let lower = out.stdout.to_ascii_lowercase();
    assert!(
        lower.contains("transfer-encoding: chunked"),
        "{}",
        out.stdout
    );
    assert!(!lower.contains("connection: close"), "{}", out.stdout);
    assert_eq!(
        server.join().expect("upstream"),
        [
            "GET /a HTTP/1.1",
            "GET /b HTTP/1.1",
            "GET /c HTTP/1.1",
            "GET /d HTTP/1.1"
        ]
    );
}
