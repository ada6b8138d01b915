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
//! The unix socket's connections are registered with the reactor for reading only, and for
//! writing only after a write would have blocked ([`ReadInterest`]), as Ironic's own server does:
//! cheroot's `ConnectionManager` watches an idle keep-alive connection with `EVENT_READ` only and
//! its worker threads write on blocking sockets. tokio's `UnixStream` registers both directions,
//! edge-triggered, and a unix socket tells its sender of write space on every read of its data
//! (Linux `unix_write_space`, called from `sock_wfree`; TCP waits for a writer that found its
//! buffer full): every proxy's read of an answer would then wake this backend for a write
//! readiness it does not need, a cost booked to the proxy, and larger the sooner the backend went
//! back to sleep. `--write-interest` keeps tokio's registration (what this backend did before).
//!
//! Usage: `backend --unix PATH [--tcp 127.0.0.1:PORT] [--status N] [--write-interest]`

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::io::{self, Write};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

const SMALL: &[u8] = b"{\"ok\": true}\n";

/// What the Ironic-like phase gets back: about the size of a small Ironic API answer.
const NODE: &[u8] = br#"{"uuid":"1be26c0b-03f2-4d2e-ae87-c02d7f33c123","provision_state":"deploying","target_provision_state":"active","power_state":"power on","last_error":null,"updated_at":"2026-12-03T07:00:00+00:00"}"#;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut unix = None;
    let mut tcp = None;
    let mut status = 200u16;
    let mut write_interest = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--write-interest" => write_interest = true,
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
                    if write_interest {
                        tokio::spawn(serve(s, big.clone(), status));
                    } else if let Ok(s) = ReadInterest::new(s) {
                        tokio::spawn(serve(s, big.clone(), status));
                    }
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
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
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

/// A unix-socket connection registered for read readiness only, and for write readiness too
/// only once a write would have blocked (a 64 KiB answer the proxy reads slower than we write).
struct ReadInterest {
    /// `None` only after registering it for writes failed.
    fd: Option<AsyncFd<StdUnixStream>>,
    writes: bool,
}

impl ReadInterest {
    fn new(s: tokio::net::UnixStream) -> io::Result<Self> {
        Ok(Self {
            fd: Some(register(s.into_std()?, Interest::READABLE)?),
            writes: false,
        })
    }

    fn fd(&self) -> io::Result<&AsyncFd<StdUnixStream>> {
        self.fd
            .as_ref()
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }
}

/// tokio's `AsyncFd::register_with_interest` is unsafe since tokio 1.52 (I/O safety).
#[allow(unsafe_code)]
fn register(s: StdUnixStream, interest: Interest) -> io::Result<AsyncFd<StdUnixStream>> {
    // SAFETY: the AsyncFd owns the stream, which owns its descriptor, until it is dropped or
    // given back by `into_inner`.
    Ok(unsafe { AsyncFd::register_with_interest(s, interest) }?)
}

/// Reads into `buf`'s unfilled part without zeroing it first.
#[allow(unsafe_code)]
fn recv_into(s: &StdUnixStream, buf: &mut ReadBuf<'_>) -> io::Result<()> {
    // SAFETY: recv only writes bytes, and only the n it reports.
    let n = socket2::SockRef::from(s).recv(unsafe { buf.unfilled_mut() })?;
    // SAFETY: the kernel wrote n bytes at the start of the unfilled part.
    unsafe { buf.assume_init(n) };
    buf.advance(n);
    Ok(())
}

impl AsyncRead for ReadInterest {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let fd = self.get_mut().fd()?;
        loop {
            let mut ready = ready!(fd.poll_read_ready(cx))?;
            if let Ok(result) = ready.try_io(|s| recv_into(s.get_ref(), buf)) {
                return Poll::Ready(result);
            }
        }
    }
}

impl AsyncWrite for ReadInterest {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.writes {
            match (&mut this.fd()?.get_ref()).write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Registered anew for both: epoll reports the current state on adding.
                    let s = this.fd.take().ok_or(io::ErrorKind::NotConnected)?;
                    this.fd = Some(register(
                        s.into_inner(),
                        Interest::READABLE | Interest::WRITABLE,
                    )?);
                    this.writes = true;
                }
                done => return Poll::Ready(done),
            }
        }
        let fd = this.fd()?;
        loop {
            let mut ready = ready!(fd.poll_write_ready(cx))?;
            if let Ok(done) = ready.try_io(|s| (&mut s.get_ref()).write(buf)) {
                return Poll::Ready(done);
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.fd()?.get_ref().shutdown(std::net::Shutdown::Write))
    }
}
