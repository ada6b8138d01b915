//! `jsonrpc = true`: the method of each JSON-RPC call, read from the first bytes of its body,
//! in the access log (`rpc_method`, next to the calling conductor's certificate identity) and in
//! `ironic_proxy_jsonrpc_calls_total` / `ironic_proxy_jsonrpc_call_duration_seconds`. Calls are
//! made the way Ironic's client makes them (Python `requests`, `json=` body, client
//! certificate, one keep-alive session). Bodies the proxy cannot read (not JSON, deeply nested,
//! non-UTF-8, a 1 MB method, 100 MB) reach the upstream byte for byte and count as `other`,
//! with the proxy's memory flat.

use crate::support;

use std::sync::Arc;
use std::time::Duration;
use support::upstream::{Recorded, Reply};
use support::{python, Sandbox, Tls, Upstream};

/// Answers like Ironic's JSON-RPC server: `destroy_node` fails with a JSON-RPC error object
/// (HTTP 200, as `ironic/common/json_rpc/server.py` does), `vif_list` with an HTTP 500 (a
/// crashed worker), everything else succeeds.
fn ironic_like(r: &Recorded) -> Reply {
    if r.body.windows(10).any(|w| w == b"\"vif_list\"") {
        return Reply {
            status: 500,
            headers: vec![],
            body: b"Internal Server Error".to_vec(),
            delay: Duration::ZERO,
        };
    }
    let body = if r.body.windows(14).any(|w| w == b"\"destroy_node\"") {
        r#"{"jsonrpc": "2.0", "id": "1", "error": {"code": 404, "message": "Node not found"}}"#
            .to_owned()
    } else {
        format!(
            r#"{{"jsonrpc": "2.0", "result": {{"received": {}}}, "id": "1"}}"#,
            r.body.len()
        )
    };
    Reply {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.into_bytes(),
        delay: Duration::ZERO,
    }
}

/// Python: makes the calls of `argv[5]` (a JSON list of [kind, arg]) on one session, prints
/// one status per call.
const CLIENT: &str = r#"
import json, sys, requests
url, ca, crt, key, calls = sys.argv[1:6]
s = requests.Session()
s.cert = (crt, key)
post = lambda **kw: s.post(url, verify=ca, **kw)  # per call: REQUESTS_CA_BUNDLE beats s.verify
for kind, arg in json.loads(calls):
    if kind == "call":
        body = {"jsonrpc": "2.0", "method": arg, "params": {"node_id": "n1", "context": {}}, "id": "1"}
        r = post(json=body, timeout=60)
    elif kind == "raw":
        r = post(data=bytes.fromhex(arg), timeout=60,
                   headers={"content-type": "application/json"})
    elif kind == "big":
        r = post(data=b'{"jsonrpc": "2.0", "params": "' + b"x" * int(arg) + b'"}', timeout=120)
    elif kind == "bigmethod":
        r = post(data=b'{"jsonrpc": "2.0", "method": "' + b"m" * int(arg) + b'"}', timeout=60)
    print(r.status_code)
"#;

#[test]
fn methods_of_ironic_calls_are_logged_and_counted_per_conductor() {
    let sb = Sandbox::new();
    let up = Upstream::start_with(&sb.socket("rpc"), Arc::new(ironic_like));
    let plain_up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy()
        .listener("json-rpc", Tls::Mutual, &up.address())
        .jsonrpc()
        .listener("api", Tls::Server, &plain_up.address())
        .start();
    let conductor = sb.ca.client_leaf(&["127.0.0.3"]);
    let (crt, key) = sb.client_files(&conductor, "conductor");
    let ca = sb.path("ca.crt");
    let calls = r#"[["call", "create_node"], ["call", "change_node_power_state"],
        ["call", "change_node_power_state"], ["call", "destroy_node"], ["call", "frobnicate"],
        ["call", "vif_list"]]"#;
    let out = python(
        CLIENT,
        &[
            &proxy.url("json-rpc", "/"),
            ca.to_str().unwrap(),
            crt.to_str().unwrap(),
            key.to_str().unwrap(),
            calls,
        ],
    );
    assert_eq!(out.stdout, format!("{}500\n", "200\n".repeat(5)), "{out:?}");

    let logs = proxy.wait_access_logs(6, Duration::from_secs(5));
    let rpc: Vec<(String, String)> = logs
        .iter()
        .map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix(k))
                    .unwrap_or("?")
                    .trim_matches('"')
                    .to_owned()
            };
            (field("identity="), field("rpc_method="))
        })
        .collect();
    let want: Vec<(String, String)> = [
        "create_node",
        "change_node_power_state",
        "change_node_power_state",
        "destroy_node",
        "other",
        "vif_list",
    ]
    .iter()
    .map(|m| ("127.0.0.3".to_owned(), (*m).to_owned()))
    .collect();
    assert_eq!(rpc, want, "{logs:#?}");

    let m = proxy.metrics();
    let calls = |method: &str, outcome: &str| {
        support::metric(
            &m,
            "ironic_proxy_jsonrpc_calls_total",
            &[
                ("listener", "json-rpc"),
                ("method", method),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(calls("create_node", "ok"), Some(1.0), "{m}");
    assert_eq!(calls("change_node_power_state", "ok"), Some(2.0));
    assert_eq!(
        calls("destroy_node", "error"),
        Some(1.0),
        "a JSON-RPC error answer"
    );
    assert_eq!(calls("destroy_node", "ok"), None);
    assert_eq!(calls("other", "ok"), Some(1.0), "an unknown method");
    assert_eq!(calls("vif_list", "failed"), Some(1.0), "an HTTP 500 answer");
    assert_eq!(
        support::metric(
            &m,
            "ironic_proxy_jsonrpc_call_duration_seconds_count",
            &[
                ("listener", "json-rpc"),
                ("method", "change_node_power_state")
            ]
        ),
        Some(2.0)
    );

    // The API listener is not a JSON-RPC one: its requests have no method and no series.
    let api = support::curl(&[
        "-s",
        "--cacert",
        ca.to_str().unwrap(),
        &proxy.url("api", "/v1"),
    ]);
    assert!(api.ok(), "{api:?}");
    let logs = proxy.wait_access_logs(7, Duration::from_secs(5));
    assert!(
        logs[6].contains("listener=api") && logs[6].contains("rpc_method=\"-\""),
        "{logs:#?}"
    );
    let m = proxy.metrics();
    assert_eq!(
        support::metric(
            &m,
            "ironic_proxy_jsonrpc_calls_total",
            &[("listener", "api")]
        ),
        None
    );
}

#[test]
fn unreadable_bodies_are_forwarded_unchanged_as_other_with_flat_memory() {
    let sb = Sandbox::new();
    let up = Upstream::start_with(&sb.socket("rpc"), Arc::new(ironic_like));
    let proxy = sb
        .proxy()
        .listener("json-rpc", Tls::Mutual, &up.address())
        .jsonrpc()
        .limit_dur("body_timeout", "60s")
        .limit_dur("upstream_timeout", "60s")
        .start();
    let conductor = sb.ca.client_leaf(&["conductor-2.ironic.metal3.svc"]);
    let (crt, key) = sb.client_files(&conductor, "conductor");
    let ca = sb.path("ca.crt");

    let hex = |b: &[u8]| b.iter().map(|c| format!("{c:02x}")).collect::<String>();
    let not_json = b"<xml>definitely not json</xml>".to_vec();
    let batch = br#"[{"jsonrpc": "2.0", "method": "create_node", "id": 1}]"#.to_vec();
    // Nesting before the method: 1 500 levels fit in the 4 KiB scanned, 30 000 do not.
    let nested_in = |depth: usize| {
        let mut b = b"{\"params\": ".to_vec();
        b.extend(std::iter::repeat_n(b'[', depth));
        b.extend(std::iter::repeat_n(b']', depth));
        b.extend(b", \"method\": \"create_node\"}");
        b
    };
    let (nested, deep) = (nested_in(1_500), nested_in(30_000));
    let non_utf8 = b"{\"jsonrpc\": \"2.0\", \"method\": \"create_n\xffode\", \"id\": 1}".to_vec();
    let raw_bodies = [&not_json, &batch, &nested, &deep, &non_utf8];
    let mut calls: Vec<String> = raw_bodies
        .iter()
        .map(|b| format!(r#"["raw", "{}"]"#, hex(b)))
        .collect();
    calls.push(r#"["bigmethod", "1048576"]"#.to_owned());
    calls.push(r#"["big", "100000000"]"#.to_owned());
    calls.push(r#"["call", "heartbeat"]"#.to_owned());

    let rss = || proxy.metric("process_resident_memory_bytes", &[]);
    let rss_before = rss();
    assert!(
        rss_before > 0.0,
        "process_resident_memory_bytes is exported"
    );
    let out = python(
        CLIENT,
        &[
            &proxy.url("json-rpc", "/"),
            ca.to_str().unwrap(),
            crt.to_str().unwrap(),
            key.to_str().unwrap(),
            &format!("[{}]", calls.join(",")),
        ],
    );
    assert_eq!(out.stdout, "200\n".repeat(8), "{out:?}");
    let rss_after = rss();

    let got = up.wait_for(8, Duration::from_secs(10));
    for (i, b) in raw_bodies.iter().enumerate() {
        assert_eq!(
            &got[i].body, *b,
            "body {i} reached the upstream byte for byte"
        );
    }
    assert_eq!(got[5].body.len(), 1_048_576 + 32);
    assert_eq!(got[6].body.len(), 100_000_000 + 32);
    assert!(got[6].body.ends_with(b"x\"}"));

    let logs = proxy.wait_access_logs(8, Duration::from_secs(5));
    let methods: Vec<&str> = logs
        .iter()
        .map(|l| {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix("rpc_method="))
                .unwrap_or("?")
                .trim_matches('"')
        })
        .collect();
    assert_eq!(
        methods,
        [
            "other",
            "other",
            "create_node",
            "other",
            "other",
            "other",
            "other",
            "heartbeat"
        ],
        "a method after 1 500 levels of nesting is read; the rest are other"
    );
    assert_eq!(
        proxy.metric(
            "ironic_proxy_jsonrpc_calls_total",
            &[("method", "other"), ("outcome", "ok")]
        ),
        6.0
    );
    // 100 MB went through; the proxy's resident memory grew by far less than one such body.
    let grown = rss_after - rss_before;
    assert!(
        grown < 16.0 * 1024.0 * 1024.0,
        "RSS grew {:.1} MiB ({rss_before} -> {rss_after})",
        grown / 1048576.0
    );
    println!(
        "RSS before {:.1} MiB, after 100 MB + 1 MB bodies {:.1} MiB",
        rss_before / 1048576.0,
        rss_after / 1048576.0
    );
}
