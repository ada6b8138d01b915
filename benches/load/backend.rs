//! The load benchmark's backend: a tiny hyper HTTP/1.1 server that all three proxies share, on a
//! unix socket (what the proxies forward to) and on 127.0.0.1 TCP (the "backend hit directly"
//! baseline). It must never be the bottleneck: one current-thread runtime, static bodies, no
//! logging.
//!
//! `GET /small` answers 13 bytes, `GET /64k` answers 64 KiB, `POST /v1/heartbeat/...` reads the
//! request body and answers an Ironic-sized JSON document (195 bytes; 400 if the body was empty),
//! anything else answers `/small`'s body.
//!
//! `--status N` answers every request but `/health` with status N (404: an endpoint that lacks
//! the file, for the find benchmark `benches/find/run`).
//!
//! Usage: `backend --unix PATH [--tcp 127.0.0.1:PORT] [--status N]`

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;

const SMALL: &[u8] = b"{\"ok\": true}\n";

/// What the Ironic-like phase gets back: about the size of a small Ironic API answer.
const NODE: &[u8] = br#"{"uuid":"1be26c0b-03f2-4d2e-ae87-c02d7f33c123","provision_state":"deploying","target_provision_state":"active","power_state":"power on","last_error":null,"updated_at":"2026-12-03T07:00:00+00:00"}"#;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut unix = None;
    let mut tcp = None;
    let mut status = 200u16;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--unix" => unix = args.next(),
            "--tcp" => tcp = args.next(),
            "--status" => {
                status = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                    eprintln!("backend: --status needs a status code");
                    std::process::exit(2);
                });
            }
            other => {
                eprintln!("backend: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let big = Bytes::from(vec![b'x'; 64 * 1024]);
        let mut tasks = Vec::new();
        if let Some(path) = unix {
            let _ = std::fs::remove_file(&path);
            let l = tokio::net::UnixListener::bind(&path).expect("bind unix");
            let big = big.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let Ok((s, _)) = l.accept().await else {
                        continue;
                    };
                    tokio::spawn(serve(s, big.clone(), status));
                }
            }));
        }
        if let Some(addr) = tcp {
            let l = tokio::net::TcpListener::bind(&addr)
                .await
                .expect("bind tcp");
            tasks.push(tokio::spawn(async move {
                loop {
                    let Ok((s, _)) = l.accept().await else {
                        continue;
                    };
                    let _ = s.set_nodelay(true);
                    tokio::spawn(serve(s, big.clone(), status));
                }
            }));
        }
        println!("ready");
        for t in tasks {
            let _ = t.await;
        }
    });
}

async fn serve<S>(s: S, big: Bytes, status: u16)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let path = req.uri().path();
        let status = if path == "/health" { 200 } else { status };
        let heartbeat = path.starts_with("/v1/heartbeat/");
        let body = if path == "/64k" {
            big.clone()
        } else if heartbeat {
            Bytes::from_static(NODE)
        } else {
            Bytes::from_static(SMALL)
        };
        async move {
            // The heartbeat's body is read whole, as Ironic's WSGI server does before it answers.
            let status = if heartbeat {
                match req.into_body().collect().await.map(|b| b.to_bytes()) {
                    Ok(b) if !b.is_empty() => status,
                    _ => 400,
                }
            } else {
                status
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Full::new(body))
                    .expect("static response"),
            )
        }
    });
    let _ = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(s), svc)
        .await;
}
