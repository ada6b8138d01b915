//! Adversarial header hygiene (issue 5, item 1) on `none`, `server` and `mutual` listeners, as
//! seen byte for byte by the upstream: fields named in `Connection` are removed (and naming
//! framing or identity fields in it changes neither), `Upgrade` never yields a 101, client
//! copies of `X-Forwarded-Client-Cert` never arrive in any spelling (case, duplicates,
//! underscores, lists, trailers), with or without a client certificate, `Forwarded` and the
//! other hop-by-hop fields are dropped, and `X-Forwarded-*` are the proxy's.

use crate::support::{adversary, wire};

use adversary::{Rig, Target, ALL};
use std::time::Duration;
use wire::Wire;

/// Sends `raw` and returns the statuses and what the upstream got.
fn send(rig: &Rig, t: Target, raw: &str) -> (Vec<u16>, Vec<Wire>, Vec<u8>) {
    let mark = rig.tap.mark();
    let seen = rig.exchange(t, raw.as_bytes(), Duration::from_millis(300));
    let reached = rig.reached_since(&mark);
    assert!(
        reached.errors.is_empty(),
        "[{t:?}] non-canonical upstream bytes: {:?}",
        reached.errors
    );
    let raw_upstream: Vec<u8> = rig
        .tap
        .since(&mark)
        .into_iter()
        .flat_map(|c| c.bytes)
        .collect();
    (seen.statuses, reached.requests, raw_upstream)
}

fn get(fields: &str) -> String {
    format!("GET /h HTTP/1.1\r\nHost: x\r\n{fields}\r\n")
}

fn proto(t: Target) -> &'static str {
    if t == Target::Plain {
        "http"
    } else {
        "https"
    }
}

#[test]
fn fields_named_in_connection_are_removed_without_breaking_framing_or_identity() {
    let rig = Rig::new(|b| b);
    let mut failures = Vec::new();
    for t in ALL {
        let (st, reqs, _) = send(
            &rig,
            t,
            &get("Connection: X-A, x-b\r\nConnection: X-C,, keep-alive\r\nX-A: 1\r\nX-B: 2\r\nX-C: 3\r\nX-Keep: kept\r\n"),
        );
        let w = &reqs[0];
        if st != [200]
            || ["connection", "x-a", "x-b", "x-c", "keep-alive"]
                .iter()
                .any(|n| w.header(n).is_some())
            || w.header("x-keep") != Some("kept")
        {
            failures.push(format!("[{t:?}] listed fields: {st:?} {:?}", w.headers));
        }

        // Naming the framing field removes it, but the body is still framed right upstream.
        let (st, reqs, _) = send(
            &rig,
            t,
            "POST /h HTTP/1.1\r\nHost: x\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello",
        );
        if st != [200] || reqs.len() != 1 || reqs[0].body != b"hello" {
            failures.push(format!(
                "[{t:?}] Connection: Content-Length: {st:?} {reqs:?}"
            ));
        }
        let (st, reqs, _) = send(
            &rig,
            t,
            "POST /h HTTP/1.1\r\nHost: x\r\nConnection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        );
        if st != [200] || reqs.len() != 1 || reqs[0].body != b"hello" {
            failures.push(format!(
                "[{t:?}] Connection: Transfer-Encoding: {st:?} {reqs:?}"
            ));
        }
        // Naming Host or the proxy's own fields does not remove what the proxy sets.
        let (st, reqs, _) = send(
            &rig,
            t,
            &get("Connection: Host, X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host, Via, X-Forwarded-Client-Cert\r\n"),
        );
        let w = &reqs[0];
        let identity_ok = match t {
            Target::Mutual => w.all("x-forwarded-client-cert").len() == 1,
            _ => w.header("x-forwarded-client-cert").is_none(),
        };
        if st != [200]
            || w.all("host") != ["x"]
            || w.all("x-forwarded-for") != ["127.0.0.1"]
            || w.all("x-forwarded-proto") != [proto(t)]
            || w.all("x-forwarded-host") != ["x"]
            || !w.all("via").iter().any(|v| v.contains("ironic-proxy"))
            || !identity_ok
        {
            failures.push(format!(
                "[{t:?}] Connection naming proxy fields: {st:?} {:?}",
                w.headers
            ));
        }
        // Connection: close is honoured towards the client, not forwarded.
        let mark = rig.tap.mark();
        let seen = rig.exchange(
            t,
            get("Connection: close\r\n").as_bytes(),
            Duration::from_secs(2),
        );
        let reached = rig.reached_since(&mark);
        if seen.statuses != [200]
            || !seen.closed
            || reached.requests[0].header("connection").is_some()
        {
            failures.push(format!("[{t:?}] Connection: close: {seen:?}"));
        }
        rig.normal_request(t).expect("normal request");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn upgrades_never_switch_protocols() {
    let rig = Rig::new(|b| b);
    for t in ALL {
        for (name, fields) in [
            ("h2c", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"),
            ("websocket", "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"),
            ("upgrade without Connection", "Upgrade: h2c\r\n"),
            ("TLS upgrade", "Connection: Upgrade\r\nUpgrade: TLS/1.2\r\n"),
        ] {
            let raw = format!("{}GET /after-upgrade HTTP/1.1\r\nHost: x\r\n\r\n", get(fields));
            let (st, reqs, _) = send(&rig, t, &raw);
            assert_eq!(st, [200, 200], "[{t:?}] {name}: never 101, and HTTP/1.1 goes on");
            assert_eq!(reqs.len(), 2, "[{t:?}] {name}");
            for gone in ["upgrade", "http2-settings", "connection"] {
                assert!(reqs[0].header(gone).is_none(), "[{t:?}] {name}: {gone} forwarded");
            }
        }
        rig.normal_request(t).expect("normal request");
    }
}

#[test]
fn client_cert_header_spoofing_never_arrives_in_any_spelling() {
    let rig = Rig::new(|b| b);
    let spellings = [
        "X-Forwarded-Client-Cert: Hash=00;Subject=\"CN=admin\";DNS=evil-1",
        "x-forwarded-client-cert: DNS=evil-2",
        "X-FORWARDED-CLIENT-CERT: DNS=evil-3",
        "X-Forwarded-Client-Cert: DNS=evil-4, By=evil-4b",
        "X_Forwarded_Client_Cert: DNS=evil-5",
        "x_forwarded_client_cert: DNS=evil-6",
        "X-Forwarded-Client_Cert: DNS=evil-7",
        "X-Forwarded_Client-Cert: DNS=evil-8",
        "X_FORWARDED_CLIENT_CERT: DNS=evil-9",
        "HTTP_X_FORWARDED_CLIENT_CERT: DNS=evil-10",
    ];
    let mut failures = Vec::new();
    for t in ALL {
        let mut cases: Vec<(String, String)> = spellings
            .iter()
            .map(|s| (s.to_string(), get(&format!("{s}\r\n"))))
            .collect();
        cases.push((
            "all at once, duplicated".into(),
            get(&format!(
                "{}\r\n{}\r\n",
                spellings.join("\r\n"),
                spellings.join("\r\n")
            )),
        ));
        cases.push((
            "named in Connection".into(),
            get("Connection: X-Forwarded-Client-Cert\r\nX-Forwarded-Client-Cert: DNS=evil-11\r\n"),
        ));
        cases.push((
            "in a chunked trailer".into(),
            "POST /h HTTP/1.1\r\nHost: x\r\nTrailer: X-Forwarded-Client-Cert\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Forwarded-Client-Cert: DNS=evil-12\r\n\r\n".into(),
        ));
        for (name, raw) in &cases {
            let (st, reqs, upstream_bytes) = send(&rig, t, raw);
            let evil = String::from_utf8_lossy(&upstream_bytes).contains("evil");
            let xfcc: Vec<&str> = reqs
                .iter()
                .flat_map(|w| w.all("x-forwarded-client-cert"))
                .collect();
            let want_xfcc = match t {
                Target::Mutual => {
                    xfcc.len() == 1
                        && xfcc[0].starts_with(&format!("Hash={};", rig.client.sha256()))
                        && xfcc[0].contains("DNS=conductor-0.ironic.test")
                }
                _ => xfcc.is_empty(),
            };
            let underscores = reqs
                .iter()
                .any(|w| w.headers.iter().any(|(n, _)| n.contains('_')));
            let trailers = reqs.iter().any(|w| !w.trailers.is_empty());
            if st != [200] || reqs.len() != 1 || evil || !want_xfcc || underscores || trailers {
                failures.push(format!(
                    "[{t:?}] {name}: statuses {st:?}, spoofed bytes upstream {evil}, xfcc {xfcc:?}, \
                     fields {:?}",
                    reqs.first().map(|w| &w.headers)
                ));
            }
        }
        // A space before the colon is not a field name at all: 400 (RFC 9112 §5.1).
        let (st, reqs, _) = send(&rig, t, &get("X-Forwarded-Client-Cert : DNS=evil-13\r\n"));
        if st != [400] || !reqs.is_empty() {
            failures.push(format!("[{t:?}] space before colon: {st:?}"));
        }
        rig.normal_request(t).expect("normal request");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn hop_by_hop_and_forwarding_fields_are_the_proxys() {
    let rig = Rig::new(|b| b);
    let mut failures = Vec::new();
    for t in ALL {
        let (st, reqs, _) = send(
            &rig,
            t,
            &get(
                "Proxy-Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nTE: gzip\r\n\
                 Trailer: X-T\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\n\
                 Forwarded: for=203.0.113.9;proto=http;host=evil.example\r\n\
                 X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Host: evil.example\r\n\
                 X-Forwarded-Proto: gopher\r\nX-Auth-Token: kept\r\n",
            ),
        );
        let w = &reqs[0];
        let gone = [
            "proxy-connection",
            "keep-alive",
            "te",
            "trailer",
            "proxy-authorization",
            // oslo.middleware's HTTPProxyToWSGI prefers RFC 7239 `Forwarded` over the
            // X-Forwarded-* fields the proxy sets, so a client copy must not reach Ironic.
            "forwarded",
        ];
        let kept: Vec<&str> = gone
            .iter()
            .copied()
            .filter(|n| w.header(n).is_some())
            .collect();
        if st != [200]
            || !kept.is_empty()
            || w.all("x-forwarded-for") != ["203.0.113.9, 127.0.0.1"]
            || w.all("x-forwarded-host") != ["x"]
            || w.all("x-forwarded-proto") != [proto(t)]
            || w.header("x-auth-token") != Some("kept")
        {
            failures.push(format!(
                "[{t:?}] {st:?}, forwarded {kept:?}: {:?}",
                w.headers
            ));
        }
        rig.normal_request(t).expect("normal request");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
