//! One request through the forwarding service ([`Proxy::handle`]): a hyper HTTP/1.1 client over an
//! in-memory stream to a hyper server running the proxy's service, which forwards over its pooled
//! keep-alive connection to an upstream on a unix socket and streams the answer back. TLS is left
//! out (see `tls_handshake` and the load benchmark); the connection is mutual-TLS-like: a client
//! identity and its `X-Forwarded-Client-Cert` value are attached, so the full header rewrite runs.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::{BodyExt, Empty, Full};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use ironic_proxy::config::{Limits, UpstreamAddr};
use ironic_proxy::ClientIdentity;
use ironic_proxy::Metrics;
use ironic_proxy::{ConnInfo, Proxy};
use ironic_proxy::{Pool, PoolOptions};
use std::convert::Infallible;
use std::sync::Arc;

const SMALL: &[u8] = b"{\"ok\": true}\n";

async fn upstream(listener: tokio::net::UnixListener) {
    while let Ok((s, _)) = listener.accept().await {
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(|_req| async {
                Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(SMALL))))
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}

fn one_request(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("upstream.sock");
    let mut sender = rt.block_on(async {
        let listener = tokio::net::UnixListener::bind(&sock).expect("bind");
        tokio::spawn(upstream(listener));
        let metrics = Metrics::new();
        let pool = Pool::new(PoolOptions::local(
            "bench",
            UpstreamAddr::Unix(sock.clone()),
            65_536,
            metrics.clone(),
        ));
        let proxy = Arc::new(Proxy::new("bench", pool, Limits::default(), metrics));
        let identity = ClientIdentity {
            hash: "ab".repeat(32),
            subject: "CN=conductor-0.ironic.metal3.svc".into(),
            dns: vec!["conductor-0.ironic.metal3.svc".into()],
            ..ClientIdentity::default()
        };
        let info = Arc::new(ConnInfo {
            xfcc: http::HeaderValue::from_str(&identity.xfcc()).ok(),
            identity: Some(Arc::new(identity)),
            ..ConnInfo::new(Some("10.0.0.7:40000".parse().expect("address")), true)
        });
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
    let request = || {
        hyper::Request::get("/v1/nodes/1be26c0b-03f2-4d2e-ae87-c02d7f33c123")
            .header("host", "10.0.0.5:6385")
            .header("user-agent", "python-requests/2.32.3")
            .header("accept", "*/*")
            .header(
                "x-openstack-request-id",
                "req-6f1c5a0e-3a43-4f5d-9a6b-2b7c7e0d9a11",
            )
            .body(Empty::<Bytes>::new())
            .expect("request")
    };
    c.bench_function(
        "proxy: GET through Proxy::handle to a unix-socket upstream",
        |b| {
            b.iter(|| {
                rt.block_on(async {
                    let resp = sender.send_request(request()).await.expect("response");
                    assert_eq!(resp.status(), 200);
                    resp.into_body().collect().await.expect("body").to_bytes()
                })
            });
        },
    );
}

criterion_group!(benches, one_request);
criterion_main!(benches);
