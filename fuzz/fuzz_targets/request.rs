//! The request path: raw bytes from a client, through hyper's server with the proxy's service
//! (`listen::serve_stream`, the same settings as a listener's connections), to a real upstream
//! on a unix socket. Checks, for every input:
//! - nothing panics (libFuzzer aborts on a panic in any task);
//! - the connection ends (every timeout is enforced; time is paused, so they fire at once);
//! - what the upstream received is never ambiguous: no `Transfer-Encoding` with
//!   `Content-Length`, at most one `Content-Length`, exactly one `Host`, no hop-by-hop field,
//!   no field name with an underscore, and `X-Forwarded-Client-Cert` only as set by the proxy
//!   (exactly ours on a mutual connection, absent otherwise);
//! - the upstream's own HTTP/1.1 parser never rejects what the proxy sent it.
//!
//! Input: one mode byte, then the bytes the client writes. Mode bit 0: a mutual-TLS connection
//! with a verified identity; bit 1: HTTP/2 (prior knowledge) instead of HTTP/1.1; bit 2: the
//! client half-closes after writing; bit 3: a listener with routes (`tls = "optional"`, a
//! plain-HTTP find route for `/pxelinux.cfg/*` and `/boot.ipxe`, the rest to the default
//! upstream), where in addition no path the route checks refuse (dot segments, encoded slashes,
//! over-long) reaches the upstream, and over plain HTTP (bit 0 clear) only the find route's
//! paths do. The upstream answers by path: `/502` a 502 (exercises the
//! retry path), `/big` a 256 KiB body, `/close` with `Connection: close`, anything else 200.
//!
//! Mode bit 4: a rogue upstream instead. The client sends one well-formed request (bit 0: a
//! `POST` with a body, else a `GET`); the rest of the input is what the upstream answers, byte
//! for byte (heads, framings, chunk extensions, trailers, 1xx, garbage), before closing the
//! connection: every input's length is an end of stream at that byte. Bit 5: the upstream
//! answers at once, before reading the request (an early answer). Checks: nothing panics, the
//! connection ends, and what the client gets starts with one well-formed HTTP/1.1 response head
//! (the proxy's 502 for what our client refuses, else the upstream's), or is nothing at all
//! when the upstream's body failed before its first byte (hyper's server writes the head with
//! the body's first bytes, so it drops the connection unanswered).
#![no_main]

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ironic_proxy::config::{Limits, PathPattern, TlsMode, UpstreamAddr};
use ironic_proxy::route::{self, Route, Routes, Target};
use ironic_proxy::serve_stream;
use ironic_proxy::Finder;
use ironic_proxy::Metrics;
use ironic_proxy::{ConnInfo, Proxy};
use ironic_proxy::{Pool, PoolOptions};
use libfuzzer_sys::fuzz_target;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::runtime::Runtime;

/// What the proxy puts in `X-Forwarded-Client-Cert` for the fuzzed mutual connections.
const OUR_XFCC: &str = "Hash=00ff;Subject=\"CN=conductor-0\";DNS=conductor-0.ironic.metal3.svc";

/// Longer than every timeout of [`limits`]: a connection still open then is a bug.
const GIVE_UP: Duration = Duration::from_secs(3600);

/// Longer than `body_timeout` + `upstream_timeout`: every task of an HTTP/2 input has ended by
/// then.
const SETTLE_H2: Duration = Duration::from_secs(12);

/// For HTTP/1.1, whose requests end with the connection: time for what the proxy already wrote
/// to reach the upstream's record before the next input clears it.
const SETTLE_H1: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Upstream {
    /// Request heads received, in order.
    seen: Vec<HeaderMap>,
    /// Their paths, in the same order.
    paths: Vec<String>,
    /// Parse errors of the upstream's HTTP/1.1 server: the proxy sent something malformed.
    parse_errors: Vec<String>,
}

/// What the rogue upstream answers to every connection (see the module's doc).
#[derive(Default)]
struct Rogue {
    answer: Vec<u8>,
    early: bool,
}

struct Harness {
    rt: Runtime,
    proxy: Arc<Proxy>,
    /// A proxy in front of the rogue upstream.
    rogue_proxy: Arc<Proxy>,
    rogue: Arc<Mutex<Rogue>>,
    /// The same upstream behind a listener with routes.
    routed: Arc<Proxy>,
    limits: Limits,
    upstream: Arc<Mutex<Upstream>>,
}

/// Timeouts in the order of the defaults (head < body < idle, upstream), short so that an input
/// spends few virtual seconds (see [`SETTLE_H2`]).
fn limits() -> Limits {
    Limits {
        max_connections: 16,
        header_bytes: 16 * 1024,
        request_head_timeout: Duration::from_secs(2),
        body_timeout: Duration::from_secs(4),
        idle_timeout: Duration::from_secs(6),
        upstream_timeout: Duration::from_secs(6),
        // Small, so that the 413 paths (declared and streamed) are reachable by short inputs.
        max_body_bytes: 2048,
        drain_timeout: Duration::from_secs(1),
        // The server's idle trim is not part of a request's path (and runs no server here).
        idle_trim: Duration::ZERO,
        upstream_connections: 128,
        handover: false,
    }
}

async fn answer(
    req: Request<Incoming>,
    record: Arc<Mutex<Upstream>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    record
        .lock()
        .expect("no panic while holding the record")
        .seen
        .push(req.headers().clone());
    let path = req.uri().path().to_owned();
    record
        .lock()
        .expect("no panic while holding the record")
        .paths
        .push(path.clone());
    // Read the whole body, as Ironic does, so the proxy's framing is exercised to the end.
    let _ = req.into_body().collect().await;
    let mut resp = Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}")));
    match path.as_str() {
        "/502" => *resp.status_mut() = StatusCode::BAD_GATEWAY,
        "/big" => *resp.body_mut() = Full::new(Bytes::from(vec![b'x'; 256 * 1024])),
        "/close" => {
            resp.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        _ => {}
    }
    Ok(resp)
}

async fn serve_upstream(listener: UnixListener, record: Arc<Mutex<Upstream>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let record = record.clone();
        tokio::spawn(async move {
            let svc_record = record.clone();
            let svc = hyper::service::service_fn(move |req| answer(req, svc_record.clone()));
            // Limits above the proxy's own (1024 fields, `header_bytes`), so that everything
            // the proxy may forward is read and checked rather than refused as too large.
            let conn = hyper::server::conn::http1::Builder::new()
                .max_headers(4096)
                .max_buf_size(1024 * 1024)
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                if e.is_parse() || e.is_parse_too_large() {
                    record
                        .lock()
                        .expect("no panic while holding the record")
                        .parse_errors
                        .push(e.to_string());
                }
            }
        });
    }
}

/// Answers every connection with the bytes of [`Rogue`], then closes its half; reads on to the
/// end so that the proxy's writes never meet a reset.
async fn serve_rogue(listener: UnixListener, rogue: Arc<Mutex<Rogue>>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let (answer, early) = {
            let r = rogue.lock().expect("no panic while holding the rogue");
            (r.answer.clone(), r.early)
        };
        tokio::spawn(async move {
            if !early {
                // The request head, byte by byte: nothing of a body is read before answering.
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut b).await.unwrap_or(0) == 1 {
                    head.push(b[0]);
                }
            }
            let _ = stream.write_all(&answer).await;
            let _ = stream.shutdown().await;
            let mut sink = Vec::new();
            let _ = stream.read_to_end(&mut sink).await;
        });
    }
}

/// The client's side of a rogue-upstream input: one request, then what the proxy answers must
/// be one well-formed HTTP/1.1 response.
async fn rogue_exchange(h: &Harness, post: bool, input: &[u8]) {
    let (client, server) = tokio::io::duplex(8 * 1024);
    let proxy = h.rogue_proxy.clone();
    let limits = h.limits.clone();
    let info = ConnInfo::new(Some(([127, 0, 0, 1], 40000).into()), false);
    let conn = tokio::spawn(async move { serve_stream(server, false, proxy, info, &limits).await });
    let (mut rd, mut wr) = tokio::io::split(client);
    let request: &[u8] = if post {
        b"POST /rogue HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    } else {
        b"GET /rogue HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    };
    let exchange = async {
        let _ = wr.write_all(request).await;
        let mut got = Vec::new();
        let _ = rd.read_to_end(&mut got).await;
        (wr, got)
    };
    let Ok((wr, got)) = tokio::time::timeout(GIVE_UP, exchange).await else {
        panic!(
            "no end of the answer: upstream sent {:?}",
            String::from_utf8_lossy(input)
        );
    };
    drop(wr);
    match tokio::time::timeout(GIVE_UP, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Ok(Err(e)) => panic!("connection task failed: {e}"),
        Err(_) => panic!(
            "connection still open after {GIVE_UP:?}: upstream sent {:?}",
            String::from_utf8_lossy(input)
        ),
    }
    // Nothing at all is an answer too: an upstream body that fails before its first byte ends
    // the connection before hyper's server wrote the head (it writes it with the first bytes).
    if got.is_empty() {
        return;
    }
    let mut fields = [httparse::EMPTY_HEADER; 128];
    let mut resp = httparse::Response::new(&mut fields);
    let parsed = resp.parse(&got);
    assert!(
        matches!(parsed, Ok(httparse::Status::Complete(_))) && resp.version == Some(1),
        "not one HTTP/1.1 response to the client: {:?}\nupstream sent {:?}",
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(input)
    );
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        // libFuzzer's C `main` replaces Rust's, which ignores SIGPIPE for every Rust binary,
        // the proxy's included: restore that, or a write to a socket the peer closed (the
        // upstream after a cut request) kills the process instead of returning EPIPE.
        // SAFETY: setting a signal's disposition to SIG_IGN, once, before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime can be built");
        let dir: PathBuf =
            std::env::temp_dir().join(format!("ironic-proxy-fuzz-req-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir is writable");
        let sock = dir.join("upstream.sock");
        let rogue_sock = dir.join("rogue.sock");
        let upstream = Arc::new(Mutex::new(Upstream::default()));
        let rogue = Arc::new(Mutex::new(Rogue::default()));
        let limits = limits();
        let (proxy, routed, rogue_proxy) = rt.block_on(async {
            let listener = UnixListener::bind(&sock).expect("bind the upstream socket");
            tokio::spawn(serve_upstream(listener, upstream.clone()));
            let listener = UnixListener::bind(&rogue_sock).expect("bind the rogue socket");
            tokio::spawn(serve_rogue(listener, rogue.clone()));
            let metrics = Metrics::new();
            let rogue_pool = Pool::new(PoolOptions::local(
                "fuzz-rogue",
                UpstreamAddr::Unix(rogue_sock.clone()),
                limits.header_bytes,
                metrics.clone(),
            ));
            let rogue_proxy = Arc::new(Proxy::new(
                "fuzz-rogue",
                rogue_pool,
                limits.clone(),
                metrics.clone(),
            ));
            let pool = Pool::new(PoolOptions::local(
                "fuzz",
                UpstreamAddr::Unix(sock.clone()),
                limits.header_bytes,
                metrics.clone(),
            ));
            let routed = routed_proxy(&sock, &limits, pool.clone(), &metrics);
            (
                Arc::new(Proxy::new("fuzz", pool, limits.clone(), metrics)),
                routed,
                rogue_proxy,
            )
        });
        Harness {
            rt,
            proxy,
            rogue_proxy,
            rogue,
            routed,
            limits,
            upstream,
        }
    })
}

/// A proxy whose listener has a plain-HTTP find route in front of the same upstream.
fn routed_proxy(
    sock: &std::path::Path,
    limits: &Limits,
    default: Arc<Pool>,
    metrics: &Metrics,
) -> Arc<Proxy> {
    let boot = Pool::new(PoolOptions::local(
        "fuzz-boot",
        UpstreamAddr::Unix(sock.to_owned()),
        limits.header_bytes,
        metrics.clone(),
    ));
    let finder = Finder::new(boot, Duration::from_secs(3), "fuzz-routed", metrics);
    let routes = Routes::new(
        TlsMode::Optional,
        vec![Route {
            patterns: vec![
                PathPattern::Prefix("/pxelinux.cfg/".into()),
                PathPattern::Exact("/boot.ipxe".into()),
            ],
            methods: vec![http::Method::GET, http::Method::HEAD],
            plaintext: true,
            target: Target::Find(Arc::new(finder)),
        }],
    );
    Arc::new(
        Proxy::new("fuzz-routed", default, limits.clone(), metrics.clone()).with_routes(routes),
    )
}

/// On a listener with routes: what reached the upstream passed the path checks, and over plain
/// HTTP it was a boot path.
fn check_routed(record: &Upstream, tls: bool, input: &[u8]) {
    for path in &record.paths {
        let show = || format!("{path:?}\ninput: {:?}", String::from_utf8_lossy(input));
        let decoded = route::check_path(path).unwrap_or_else(|why| {
            panic!("a refused path ({why}) reached the upstream: {}", show())
        });
        assert!(
            tls || decoded.starts_with("/pxelinux.cfg/") || decoded == "/boot.ipxe",
            "plain HTTP reached the upstream outside the plaintext route: {}",
            show()
        );
    }
}

fn check_upstream(record: &Upstream, xfcc: Option<&str>, input: &[u8]) {
    assert!(
        record.parse_errors.is_empty(),
        "the upstream could not parse what the proxy sent: {:?}\ninput: {:?}",
        record.parse_errors,
        String::from_utf8_lossy(input)
    );
    let hop_by_hop = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
    ];
    for h in &record.seen {
        let show = || format!("{h:?}\ninput: {:?}", String::from_utf8_lossy(input));
        assert!(
            !(h.contains_key(header::TRANSFER_ENCODING) && h.contains_key(header::CONTENT_LENGTH)),
            "Transfer-Encoding with Content-Length reached the upstream: {}",
            show()
        );
        assert!(
            h.get_all(header::CONTENT_LENGTH).iter().count() <= 1,
            "several Content-Length: {}",
            show()
        );
        assert_eq!(
            h.get_all(header::HOST).iter().count(),
            1,
            "Host: {}",
            show()
        );
        for name in h.keys() {
            assert!(
                !name.as_str().contains('_'),
                "underscore name {name}: {}",
                show()
            );
            assert!(
                !hop_by_hop.contains(&name.as_str()),
                "hop-by-hop {name} forwarded: {}",
                show()
            );
        }
        let got: Vec<&[u8]> = h
            .get_all(HeaderName::from_static("x-forwarded-client-cert"))
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        let want: Vec<&[u8]> = xfcc.map(str::as_bytes).into_iter().collect();
        assert_eq!(got, want, "X-Forwarded-Client-Cert: {}", show());
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let h = harness();
    if mode & 0x10 != 0 {
        {
            let mut r = h.rogue.lock().expect("no panic while holding the rogue");
            r.answer = bytes.to_vec();
            r.early = mode & 0x20 != 0;
        }
        h.rt.block_on(async {
            rogue_exchange(h, mode & 1 != 0, bytes).await;
            // What the proxy still does with the upstream (a body's end, a pooled connection)
            // ends before the next input.
            tokio::time::sleep(SETTLE_H1).await;
        });
        return;
    }
    let mutual = mode & 1 != 0;
    let h2 = mode & 2 != 0;
    let half_close = mode & 4 != 0;
    let routed = mode & 8 != 0;
    let xfcc = mutual.then_some(OUR_XFCC);
    let info = ConnInfo {
        xfcc: xfcc.map(http::HeaderValue::from_static),
        ..ConnInfo::new(Some(([127, 0, 0, 1], 40000).into()), mutual)
    };
    *h.upstream
        .lock()
        .expect("no panic while holding the record") = Upstream::default();
    h.rt.block_on(async {
        let (client, server) = tokio::io::duplex(8 * 1024);
        let proxy = if routed {
            h.routed.clone()
        } else {
            h.proxy.clone()
        };
        let limits = h.limits.clone();
        let conn =
            tokio::spawn(async move { serve_stream(server, h2, proxy, info, &limits).await });
        let (mut rd, mut wr) = tokio::io::split(client);
        let write = async {
            let _ = wr.write_all(bytes).await;
            if half_close {
                let _ = wr.shutdown().await;
            }
            // Keep the write half open (unless closed above) until the server is done.
            wr
        };
        let read = async {
            let mut sink = Vec::new();
            let _ = rd.read_to_end(&mut sink).await;
        };
        let exchange = async {
            let (wr, ()) = tokio::join!(write, read);
            drop(wr);
        };
        let _ = tokio::time::timeout(GIVE_UP, exchange).await;
        match tokio::time::timeout(GIVE_UP, conn).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(Err(e)) => panic!("connection task failed: {e}"),
            Err(_) => panic!(
                "connection still open after {GIVE_UP:?}: input {:?}",
                String::from_utf8_lossy(bytes)
            ),
        }
        // HTTP/2 streams run in their own tasks and may outlive the connection by up to
        // body_timeout + upstream_timeout: let them finish before reading the record, so
        // that it holds this input's requests and no later input's. The clock is paused, so
        // the wait costs no real time, but every virtual second runs the pools' once-a-second
        // metrics task: with the longer timeouts of before (90 virtual seconds an input) that
        // task was half of the CPU and the target ran at about 360 inputs a second.
        tokio::time::sleep(if h2 { SETTLE_H2 } else { SETTLE_H1 }).await;
    });
    let record = h
        .upstream
        .lock()
        .expect("no panic while holding the record");
    check_upstream(&record, xfcc, bytes);
    if routed {
        check_routed(&record, mutual, bytes);
    }
});
