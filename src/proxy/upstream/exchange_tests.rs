//! The exchange and the endpoint's pool over in-memory pipes (`tokio::io::duplex`), one
//! scripted upstream per connection: every framing case the integration tests send through a
//! real proxy (tests/it/adversarial_upstream.rs, sidecar_forwarding.rs), here without sockets,
//! each answer also delivered one byte per write, and the typed error checked where one is due.

use super::*;
use crate::http1::Error as Http1Error;
use crate::proxy::body::BoxError;
use http::Method;
use http_body_util::BodyExt as _;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

/// What a request got: status, body and whether its connection went back to the pool; or
/// the http1 fault it failed on (`None`: another error).
type Outcome = Result<(u16, Vec<u8>, bool), Option<Http1Error>>;

/// An endpoint whose every connection is a new pipe; the far ends come out of the receiver.
fn endpoint(connections: usize) -> (Endpoint, mpsc::UnboundedReceiver<DuplexStream>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let tx = Mutex::new(tx);
    let dial: Dial = Arc::new(move || {
        let (near, far) = tokio::io::duplex(1 << 16);
        tx.lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .send(far)
            .map_err(|_| io::Error::from(io::ErrorKind::ConnectionRefused))?;
        Ok(Box::new(near))
    });
    let limits = EndpointLimits {
        max_response_head: 8192,
        connections,
    };
    (Endpoint::over("in-memory", dial, limits), rx)
}

/// Reads one request head from `far`: its first line (`None` at the end of the stream).
async fn request_line(far: &mut DuplexStream) -> Option<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if far.read(&mut b).await.ok()? == 0 {
            return None;
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    head.lines().next().map(str::to_owned)
}

/// Writes `answer` to `far` in writes of `piece` bytes, each let through before the next,
/// until the client hangs up (it does on a fault).
async fn answer(far: &mut DuplexStream, answer: &[u8], piece: usize) {
    for part in answer.chunks(piece.max(1)) {
        if far.write_all(part).await.is_err() {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// The http1 fault inside an error from `send` or from the body.
fn fault(e: &BoxError) -> Option<Http1Error> {
    let io = match e.downcast_ref::<SendError>() {
        Some(SendError::Exchange(io) | SendError::Stale(io) | SendError::Connect(io)) => io,
        None => e.downcast_ref::<io::Error>()?,
    };
    io.get_ref()?.downcast_ref::<Http1Error>().copied()
}

/// Sends `method /` and reads the answer to its end.
async fn send(ep: &Endpoint, method: Method) -> Outcome {
    let req = http::Request::builder()
        .method(method)
        .uri("/")
        .body(RequestBody::empty())
        .expect("a request");
    let (parts, mut body) = match ep.send(req).await {
        Ok(resp) => resp.into_parts(),
        Err(e) => return Err(fault(&(Box::new(e) as BoxError))),
    };
    let mut data = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => data.extend_from_slice(&f.into_data().unwrap_or_default()),
            Err(e) => return Err(fault(&e)),
        }
    }
    drop(body);
    Ok((parts.status.as_u16(), data, ep.idle.has_any()))
}

/// `wire` as the answer to one `method` request, whole and one byte per write; the upstream
/// then closes when `close`. Both deliveries must give the same outcome, which is returned.
async fn one(method: Method, wire: &[u8], close: bool) -> Outcome {
    let mut outcomes = Vec::new();
    for piece in [wire.len(), 1] {
        let (ep, mut far) = endpoint(0);
        let wire = wire.to_vec();
        let up = tokio::spawn(async move {
            let mut far = far.recv().await.expect("a connection");
            request_line(&mut far).await.expect("a request");
            answer(&mut far, &wire, piece).await;
            if close {
                let _ = far.shutdown().await;
            }
            far // kept open (a keep-alive upstream) until the test ends
        });
        let mut outcome = send(&ep, method.clone()).await;
        // Once all of the answer is out, whether the connection would carry another request.
        let _far = up.await.expect("the upstream");
        if let Ok((_, _, pooled)) = &mut outcome {
            *pooled = ep.idle.take().is_some();
        }
        outcomes.push(outcome);
    }
    assert_eq!(outcomes[0], outcomes[1], "whole and byte by byte differ");
    outcomes.remove(0)
}

fn ok(status: u16, body: &str, pooled: bool) -> Outcome {
    Ok((status, body.as_bytes().to_vec(), pooled))
}

#[tokio::test]
async fn lengths_and_their_conflicts() {
    let get = Method::GET;
    for (wire, want) in [
        (&b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"[..], ok(200, "hello", true)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", ok(200, "hello", true)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello", ok(200, "hello", true)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", ok(200, "", true)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", Err(Some(Http1Error::ConflictingLength))),
        (b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello", Err(Some(Http1Error::InvalidLength))),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n", Err(Some(Http1Error::LengthTooLarge))),
        // An extra response after the body is never read as the next one's: not pooled.
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nSMUGGLED!", ok(200, "hello", false)),
    ] {
        assert_eq!(one(get.clone(), wire, false).await, want, "{:?}", String::from_utf8_lossy(wire));
    }
}

#[tokio::test]
async fn chunked_bodies_with_extensions_trailers_and_bad_sizes() {
    let get = Method::GET;
    let te = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (body, want) in [
        (
            "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
            ok(200, "hello world", true),
        ),
        ("0\r\n\r\n", ok(200, "", true)),
        (
            "zz\r\nhello\r\n0\r\n\r\n",
            Err(Some(Http1Error::ChunkSizeWithoutDigit)),
        ),
        (
            "5 x\r\nhello\r\n0\r\n\r\n",
            Err(Some(Http1Error::InvalidChunkSize)),
        ),
        (
            "10000000000000000\r\n",
            Err(Some(Http1Error::ChunkSizeOverflow)),
        ),
        (
            "5\r\nhelloX\r\n0\r\n\r\n",
            Err(Some(Http1Error::ChunkDataWithoutCrlf)),
        ),
        (
            "5;a\nb\r\nhello\r\n0\r\n\r\n",
            Err(Some(Http1Error::BareLfInExtension)),
        ),
        (
            "0\r\nnot a field\r\n\r\n",
            Err(Some(Http1Error::MalformedTrailer)),
        ),
    ] {
        let wire = format!("{te}{body}");
        assert_eq!(
            one(get.clone(), wire.as_bytes(), false).await,
            want,
            "{body:?}"
        );
    }
    // Transfer-Encoding with Content-Length: read as chunked, never pooled.
    let wire = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    assert_eq!(one(get.clone(), wire, false).await, ok(200, "hello", false));
    // A final coding other than chunked: read to the close.
    let wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nzipped";
    assert_eq!(one(get.clone(), wire, true).await, ok(200, "zipped", false));
    let wire = b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    assert_eq!(
        one(get, wire, true).await,
        Err(Some(Http1Error::TransferEncodingInHttp10))
    );
}

#[tokio::test]
async fn close_delimited_bodiless_and_interim_answers() {
    let (get, head) = (Method::GET, Method::HEAD);
    let smuggled = "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nSMUGGLED!";
    for (method, wire, close, want) in [
        (
            get.clone(),
            "HTTP/1.1 200 OK\r\n\r\nuntil-close".to_owned(),
            true,
            ok(200, "until-close", false),
        ),
        // A HEAD, 204 or 304 has no body whatever its head says; bytes after it are not the
        // next response, so the connection is not pooled.
        (
            head.clone(),
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n".to_owned(),
            false,
            ok(200, "", true),
        ),
        (
            head,
            format!("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{smuggled}"),
            false,
            ok(200, "", false),
        ),
        (
            get.clone(),
            format!("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n{smuggled}"),
            false,
            ok(204, "", false),
        ),
        (
            get.clone(),
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n".to_owned(),
            false,
            ok(304, "", true),
        ),
        (
            get.clone(),
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                .to_owned(),
            false,
            ok(200, "ok", true),
        ),
        (
            get.clone(),
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n".to_owned(),
            false,
            ok(101, "", false),
        ),
        // HTTP/1.0: kept only with keep-alive; Connection: close in 1.1 is not kept.
        (
            get.clone(),
            "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok".to_owned(),
            false,
            ok(200, "ok", false),
        ),
        (
            get.clone(),
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok".to_owned(),
            false,
            ok(200, "ok", true),
        ),
        (
            get,
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok".to_owned(),
            false,
            ok(200, "ok", false),
        ),
    ] {
        assert_eq!(one(method, wire.as_bytes(), close).await, want, "{wire:?}");
    }
}

#[tokio::test]
async fn bad_heads_and_an_upstream_that_closes_early() {
    let get = Method::GET;
    let big = format!(
        "HTTP/1.1 200 OK\r\nX-Big: {}\r\n\r\n",
        "b".repeat(20 * 1024)
    );
    let many = format!("HTTP/1.1 200 OK\r\n{}\r\n", "x: y\r\n".repeat(101));
    for (wire, want) in [
        (
            "HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n",
            Some(Http1Error::MalformedHead),
        ),
        (
            "HTTX/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            Some(Http1Error::MalformedHead),
        ),
        (
            "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n",
            Some(Http1Error::MalformedHead),
        ),
        (
            "HTTP/1.1 200 OK\r\nX-A: a\0b\r\n\r\n",
            Some(Http1Error::MalformedHead),
        ),
        (big.as_str(), Some(Http1Error::HeadTooLarge)),
        (many.as_str(), Some(Http1Error::TooManyHeaders)),
        ("", Some(Http1Error::ClosedBeforeAnswer)),
        (
            "HTTP/1.1 200 OK\r\nContent-Le",
            Some(Http1Error::ClosedBeforeAnswer),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789",
            Some(Http1Error::ClosedInBody),
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
            Some(Http1Error::ClosedInBody),
        ),
    ] {
        assert_eq!(
            one(get.clone(), wire.as_bytes(), true).await,
            Err(want),
            "{wire:?}"
        );
    }
}

/// Keep-alive: the second request goes on the first's connection; a connection the upstream
/// closed while it was idle is never handed out, the request goes on a new one; one idle
/// past IDLE_TIMEOUT (paused time) is dropped.
#[tokio::test(start_paused = true)]
async fn pooled_reuse_a_stale_connection_and_expiry() {
    let (ep, mut far) = endpoint(0);
    let dialled = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(tokio::sync::Notify::new());
    let (count, closing) = (dialled.clone(), closed.clone());
    let up = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Some(mut conn) = far.recv().await {
            let first = count.fetch_add(1, Ordering::SeqCst) == 0;
            let closing = closing.clone();
            open.push(tokio::spawn(async move {
                let mut answered = 0;
                while request_line(&mut conn).await.is_some() {
                    let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                    answer(&mut conn, ok, ok.len()).await;
                    answered += 1;
                    // The first connection is closed by the upstream after two answers.
                    if first && answered == 2 {
                        let _ = conn.shutdown().await;
                        closing.notify_one();
                    }
                }
            }));
        }
    });
    assert_eq!(send(&ep, Method::GET).await, ok(200, "ok", true));
    assert_eq!(send(&ep, Method::GET).await, ok(200, "ok", true));
    assert_eq!(
        dialled.load(Ordering::SeqCst),
        1,
        "reused, not a second connection"
    );
    tokio::time::timeout(Duration::from_secs(5), closed.notified())
        .await
        .expect("the upstream closed its first connection");
    assert_eq!(send(&ep, Method::GET).await, ok(200, "ok", true));
    assert_eq!(
        dialled.load(Ordering::SeqCst),
        2,
        "the closed one was not handed out"
    );
    tokio::time::advance(IDLE_TIMEOUT).await;
    assert!(ep.idle.take().is_none(), "expired");
    up.abort();
}

/// An upstream that says how long it keeps an idle connection (`Keep-Alive: timeout=60`, as
/// this proxy's listeners do) has its connection kept for half of that, past the default
/// IDLE_TIMEOUT, and dropped after; one whose last answer said nothing falls back to the
/// default; a nonsense value counts as nothing.
#[tokio::test(start_paused = true)]
async fn pooled_connections_live_as_long_as_the_upstream_allows() {
    let (ep, mut far) = endpoint(0);
    let dialled = Arc::new(AtomicUsize::new(0));
    let count = dialled.clone();
    let up = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Some(mut conn) = far.recv().await {
            count.fetch_add(1, Ordering::SeqCst);
            open.push(tokio::spawn(async move {
                while let Some(line) = request_line(&mut conn).await {
                    let answer_bytes: &[u8] = if line.contains("/quiet") {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    } else if line.contains("/nonsense") {
                        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=soon\r\nContent-Length: 2\r\n\r\nok"
                    } else {
                        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=60, max=100\r\nContent-Length: 2\r\n\r\nok"
                    };
                    answer(&mut conn, answer_bytes, answer_bytes.len()).await;
                }
            }));
        }
    });
    assert_eq!(send(&ep, Method::GET).await, ok(200, "ok", true));
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(send(&ep, Method::GET).await, ok(200, "ok", true));
    assert_eq!(
        dialled.load(Ordering::SeqCst),
        1,
        "kept 29 s of the 30 the upstream's 60 allow"
    );
    tokio::time::advance(Duration::from_secs(30)).await;
    assert!(
        ep.idle.take().is_none(),
        "expired at half the upstream's 60 s"
    );

    for path in ["/quiet", "/nonsense"] {
        let before = dialled.load(Ordering::SeqCst);
        let req = http::Request::get(path).body(RequestBody::empty()).unwrap();
        let resp = ep.send(req).await.expect("an answer");
        let _ = resp.into_body().collect().await;
        tokio::time::advance(IDLE_TIMEOUT).await;
        assert!(
            ep.idle.take().is_none(),
            "{path}: dropped after the default"
        );
        assert_eq!(dialled.load(Ordering::SeqCst), before + 1, "{path}");
    }
    up.abort();
}
