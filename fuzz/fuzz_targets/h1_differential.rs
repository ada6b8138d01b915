//! Differential: the proxy's upstream exchange (`ironic_proxy::read_response_over`: the same
//! request write, response head read, RFC 9112 §6.3 framing, chunked decoding and body top-up
//! reads as every proxied request, over an in-memory pipe) against hyper's HTTP/1.1 client
//! (`hyper::client::conn::http1`) on the same bytes, sent by an upstream that then closes.
//!
//! Input: one byte, then the upstream's bytes. Bit 0 of the byte chooses the method (HEAD,
//! else GET); bits 1-7, when not 0, cut the upstream's bytes into writes of that many bytes,
//! each let through before the next, so that heads and bodies arrive split as they do from a
//! socket. They must agree on whether the response is accepted at all, and for every response
//! hyper accepts, on its status, version, header fields and body. (Whether the connection is
//! kept is not compared: hyper does not expose it; `http1`'s unit tests and the upstream's
//! in-memory tests cover it.)
#![no_main]

use http::{HeaderMap, Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

thread_local! {
    /// One runtime for every input of the process (a runtime per input would cost more than
    /// the input).
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
}

/// What a client made of the response, in the terms both clients share.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// Plays the upstream on `server`: reads the request head, answers `wire` in writes of
/// `piece` bytes (0: one write), closes its side, and keeps reading until the client is done
/// (so the client sees the end of the stream, not a reset).
async fn upstream(mut server: DuplexStream, wire: Vec<u8>, piece: usize) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && server.read(&mut b).await.unwrap_or(0) == 1 {
        head.push(b[0]);
    }
    let piece = if piece == 0 { wire.len().max(1) } else { piece };
    for part in wire.chunks(piece) {
        if server.write_all(part).await.is_err() {
            break;
        }
        tokio::task::yield_now().await;
    }
    let _ = server.shutdown().await;
    let mut sink = Vec::new();
    let _ = server.read_to_end(&mut sink).await;
}

async fn ours(method: &Method, wire: &[u8], piece: usize) -> Result<Read, String> {
    let (client, server) = tokio::io::duplex(1 << 20);
    let up = tokio::spawn(upstream(server, wire.to_vec(), piece));
    let read = ironic_proxy::read_response_over(client, method.clone()).await;
    up.abort();
    let r = read.map_err(|e| e.to_string())?;
    Ok(Read {
        status: r.status,
        version: r.version,
        headers: r.headers,
        body: r.body,
    })
}

async fn hypers(method: &Method, wire: &[u8], piece: usize) -> Result<Read, String> {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let up = tokio::spawn(upstream(server, wire.to_vec(), piece));
    let req = Request::builder()
        .method(method.clone())
        .uri("/")
        .header("host", "upstream")
        .body(Empty::<bytes::Bytes>::new())
        .expect("request");
    let result = async {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Read {
            status: parts.status,
            version: parts.version,
            headers: parts.headers,
            body: body.to_vec(),
        })
    }
    .await;
    drop(sender);
    driver.abort();
    up.abort();
    result
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, wire)) = data.split_first() else {
        return;
    };
    let method = if mode & 1 == 1 {
        Method::HEAD
    } else {
        Method::GET
    };
    let piece = usize::from(mode >> 1);
    let (ours, theirs) = RUNTIME.with(|rt| {
        rt.block_on(async {
            (
                ours(&method, wire, piece).await,
                hypers(&method, wire, piece).await,
            )
        })
    });
    match (ours, theirs) {
        (Ok(o), Ok(t)) => assert_eq!(
            o,
            t,
            "both accepted, read differently: {:?}",
            String::from_utf8_lossy(wire)
        ),
        (Err(_), Err(_)) => {}
        (Ok(o), Err(e)) => panic!(
            "accepted by us, refused by hyper ({e}): {o:?} from {:?}",
            String::from_utf8_lossy(wire)
        ),
        (Err(e), Ok(t)) => panic!(
            "refused by us ({e}), accepted by hyper: {t:?} from {:?}",
            String::from_utf8_lossy(wire)
        ),
    }
});
