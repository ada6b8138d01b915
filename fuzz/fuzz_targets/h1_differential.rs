//! Differential: the upstream client's response reading (`ironic_proxy::read_whole_response`:
//! our head parse, body framing and chunked decoding) against hyper's HTTP/1.1 client
//! (`hyper::client::conn::http1`) on the same bytes, sent by an upstream that then closes.
//!
//! Input: one byte choosing the method (bit 0: HEAD, else GET), then the upstream's bytes.
//! They must agree on whether the response is accepted at all, and for every response hyper
//! accepts, on its status, version, header fields and body. (Whether the connection is kept is
//! not compared: hyper does not expose it; `h1.rs`'s unit tests cover it.)
#![no_main]

use http::{Method, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn hyper_reads(method: &Method, wire: &[u8]) -> Result<ironic_proxy::WholeResponse, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .map_err(|e| e.to_string())?;
        let driver = tokio::spawn(conn);
        let wire = wire.to_vec();
        let upstream = tokio::spawn(async move {
            // The request head first, as an upstream would read it, then the answer and EOF.
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && server.read(&mut b).await.unwrap_or(0) == 1 {
                head.push(b[0]);
            }
            let _ = server.write_all(&wire).await;
            let _ = server.shutdown().await;
            // Kept open for reading until the client is done, so hyper sees EOF, not a reset.
            let mut sink = Vec::new();
            let _ = server.read_to_end(&mut sink).await;
        });
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
            Ok(ironic_proxy::WholeResponse {
                status: parts.status,
                version: parts.version,
                headers: parts.headers,
                body: body.to_vec(),
                keep_alive: false,
            })
        }
        .await;
        drop(sender);
        driver.abort();
        upstream.abort();
        result
    })
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
    let ours = ironic_proxy::read_whole_response(&method, wire);
    let theirs = hyper_reads(&method, wire);
    match (ours, theirs) {
        (Ok(mut o), Ok(t)) => {
            o.keep_alive = false;
            assert_eq!(
                o,
                t,
                "both accepted, read differently: {:?}",
                String::from_utf8_lossy(wire)
            );
        }
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
