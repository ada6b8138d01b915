//! The floor under CPU per request with HTTP/1.1 of our own on both sides (issue 15; the
//! decision it informs is docs/architecture.md, "Whose HTTP/1.1"). TLS by tokio-rustls; each
//! request head parsed once by httparse and forwarded as it came, with `X-Forwarded-For` and
//! `X-Forwarded-Proto` appended as HAProxy's configuration in the benchmark does; the response
//! head parsed once and relayed with its `Content-Length` body in one write. Upstream
//! connections are pooled on the unix socket.
//!
//! It is not a proxy anyone should run: no chunked bodies, no limits, timeouts, header checks or
//! any other feature, and an error ends the connection. It measures how far below hyper's
//! server (`naive-proxy`) a hand-written HTTP/1.1 path could go before a single feature is
//! added (`benches/load/cpu-split`).
//!
//! Usage: `bare-proxy LISTEN CERT KEY UPSTREAM_SOCKET` (TLS 1.3, current-thread runtime).

#[path = "reference.rs"]
mod reference;

use std::io;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

/// Idle upstream connections (a connection that read past its response is not given back).
type Pool = Arc<Mutex<Vec<UnixStream>>>;

const BUF: usize = 16 * 1024;

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The head's length and its `Content-Length` (0 when absent) once `buf` holds a whole head.
fn head<const REQUEST: bool>(buf: &[u8]) -> io::Result<Option<(usize, usize)>> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let parsed = if REQUEST {
        httparse::Request::new(&mut fields).parse(buf)
    } else {
        httparse::Response::new(&mut fields).parse(buf)
    };
    let n = match parsed.map_err(|e| invalid(&e.to_string()))? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let mut length = 0;
    for f in fields.iter().take_while(|f| !f.name.is_empty()) {
        if f.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid("chunked bodies are not handled"));
        }
        if f.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(f.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| invalid("bad content-length"))?;
        }
    }
    Ok(Some((n, length)))
}

/// Reads until `buf[..*filled]` holds a whole head; false at a clean end of stream before one.
async fn read_head<const REQUEST: bool, R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut [u8],
    filled: &mut usize,
) -> io::Result<Option<(usize, usize)>> {
    loop {
        if let Some(h) = head::<REQUEST>(&buf[..*filled])? {
            return Ok(Some(h));
        }
        if *filled == buf.len() {
            return Err(invalid("head too large"));
        }
        let n = io.read(&mut buf[*filled..]).await?;
        if n == 0 {
            return if *filled == 0 {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        *filled += n;
    }
}

/// Reads until `buf[..*filled]` holds `want` bytes.
async fn read_to<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut [u8],
    filled: &mut usize,
    want: usize,
) -> io::Result<()> {
    if want > buf.len() {
        return Err(invalid("message larger than the buffer"));
    }
    while *filled < want {
        let n = io.read(&mut buf[*filled..]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        *filled += n;
    }
    Ok(())
}

async fn upstream(pool: &Pool, socket: &str) -> io::Result<UnixStream> {
    let idle = pool.lock().map_err(|_| invalid("pool poisoned"))?.pop();
    match idle {
        Some(s) => Ok(s),
        None => UnixStream::connect(socket).await,
    }
}

async fn connection(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: std::net::IpAddr,
    pool: Pool,
    socket: Arc<str>,
) -> io::Result<()> {
    let mut inb = vec![0u8; BUF];
    let mut filled = 0;
    let mut req = Vec::with_capacity(BUF);
    let mut resp = vec![0u8; 2 * BUF];
    let added = format!("x-forwarded-for: {peer}\r\nx-forwarded-proto: https\r\n\r\n");
    loop {
        let Some((head_len, body_len)) =
            read_head::<true, _>(&mut tls, &mut inb, &mut filled).await?
        else {
            return Ok(());
        };
        let end = head_len + body_len;
        read_to(&mut tls, &mut inb, &mut filled, end).await?;
        req.clear();
        req.extend_from_slice(&inb[..head_len - 2]);
        req.extend_from_slice(added.as_bytes());
        req.extend_from_slice(&inb[head_len..end]);
        inb.copy_within(end..filled, 0);
        filled -= end;

        let mut up = upstream(&pool, &socket).await?;
        up.write_all(&req).await?;
        let mut got = 0;
        let (rhead, rbody) = read_head::<false, _>(&mut up, &mut resp, &mut got)
            .await?
            .ok_or_else(|| invalid("upstream closed"))?;
        let rend = rhead + rbody;
        read_to(&mut up, &mut resp, &mut got, rend).await?;
        if got != rend {
            return Err(invalid("upstream sent past its response"));
        }
        pool.lock().map_err(|_| invalid("pool poisoned"))?.push(up);
        tls.write_all(&resp[..rend]).await?;
        tls.flush().await?;
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (listen, acceptor, socket) = reference::start("bare-proxy")?;
    reference::runtime()?.block_on(serve(&listen, acceptor, socket))?;
    Ok(())
}

async fn serve(
    listen: &str,
    acceptor: tokio_rustls::TlsAcceptor,
    socket: Arc<str>,
) -> io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    let pool: Pool = Arc::default();
    loop {
        let (tcp, addr) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let (acceptor, pool, socket) = (acceptor.clone(), pool.clone(), socket.clone());
        tokio::spawn(async move {
            if let Ok(tls) = acceptor.accept(tcp).await {
                let _ = connection(tls, addr.ip(), pool, socket).await;
            }
        });
    }
}
