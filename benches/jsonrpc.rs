//! The cost of `jsonrpc = true` (issue 14): the method extraction alone on bodies Ironic sends,
//! and A/B one keep-alive JSON-RPC POST through [`Proxy::handle`] (in-memory client, unix-socket
//! upstream, as `proxy_request`) on a listener without and with `jsonrpc`.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use ironic_proxy::config::{Limits, UpstreamAddr};
use ironic_proxy::jsonrpc;
use ironic_proxy::Metrics;
use ironic_proxy::{ConnInfo, Proxy};
use ironic_proxy::{Pool, PoolOptions};
use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;

/// A call as ironic/common/json_rpc/client.py writes it (json.dumps of jsonrpc, method,
/// params with the request context, id).
const CALL: &[u8] = br#"{"jsonrpc": "2.0", "method": "change_node_power_state", "params": {"node_id": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123", "new_state": "power on", "timeout": null, "topic": "ironic.conductor_manager.127.0.0.3", "context": {"user": null, "project_id": null, "system_scope": "all", "domain": null, "user_domain": null, "project_domain": null, "is_admin": true, "read_only": false, "show_deleted": false, "auth_token": null, "request_id": "req-6f1c5a0e-3a43-4f5d-9a6b-2b7c7e0d9a11", "global_request_id": null, "resource_uuid": null, "roles": ["admin"], "user_identity": "- - - - -", "is_admin_project": true}, "rpc.version": "1.62"}, "id": "req-6f1c5a0e-3a43-4f5d-9a6b-2b7c7e0d9a11"}"#;
const ANSWER: &[u8] =
    br#"{"jsonrpc": "2.0", "result": null, "id": "req-6f1c5a0e-3a43-4f5d-9a6b-2b7c7e0d9a11"}"#;

fn extraction(c: &mut Criterion) {
    let mut late = b"{\"params\": {\"x\": \"".to_vec();
    late.extend(std::iter::repeat_n(b'a', 3000));
    late.extend(b"\"}, \"method\": \"do_node_deploy\"}");
    let mut g = c.benchmark_group("jsonrpc::method");
    g.bench_function("Ironic call (method second)", |b| {
        b.iter(|| jsonrpc::method(black_box(CALL)));
    });
    g.bench_function("method after 3 KB of params", |b| {
        b.iter(|| jsonrpc::method(black_box(&late)));
    });
    g.bench_function("not JSON (4 KiB)", |b| {
        let junk = vec![b'<'; 4096];
        b.iter(|| jsonrpc::method(black_box(&junk)));
    });
    g.bench_function("is_error on a result answer", |b| {
        b.iter(|| jsonrpc::is_error(black_box(ANSWER)));
    });
    g.finish();
}

async fn upstream(listener: tokio::net::UnixListener) {
    while let Ok((s, _)) = listener.accept().await {
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| async {
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(ANSWER))))
                });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}

fn through_proxy(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("upstream.sock");
    rt.block_on(async {
        let listener = tokio::net::UnixListener::bind(&sock).expect("bind");
        tokio::spawn(upstream(listener));
    });
    let mut g = c.benchmark_group("JSON-RPC POST through Proxy::handle");
    for on in [false, true] {
        let mut sender = rt.block_on(async {
            let metrics = Metrics::new();
            let pool = Pool::new(PoolOptions::local(
                "bench",
                UpstreamAddr::Unix(sock.clone()),
                65_536,
                metrics.clone(),
            ));
            let proxy =
                Arc::new(Proxy::new("json-rpc", pool, Limits::default(), metrics).with_jsonrpc(on));
            let info = Arc::new(ConnInfo::new(
                Some("10.0.0.7:40000".parse().expect("address")),
                true,
            ));
            let (client_io, server_io) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let proxy = proxy.clone();
                    let info = info.clone();
                    async move { Ok::<_, Infallible>(proxy.handle(req, &info).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(server_io), svc)
                    .await;
            });
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
                .await
                .expect("client handshake");
            tokio::spawn(conn);
            sender
        });
        let name = if on {
            "jsonrpc = true"
        } else {
            "jsonrpc = false"
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let req = hyper::Request::post("/")
                        .header("host", "127.0.0.3:8089")
                        .header("content-type", "application/json")
                        .header("content-length", CALL.len())
                        .body(Full::new(Bytes::from_static(CALL)))
                        .expect("request");
                    let resp = sender.send_request(req).await.expect("response");
                    assert_eq!(resp.status(), 200);
                    resp.into_body().collect().await.expect("body").to_bytes()
                })
            });
        });
    }
    g.finish();
}

criterion_group!(benches, extraction, through_proxy);
criterion_main!(benches);
