//! The reference point for CPU per request (issue 15): a TLS-terminating HTTP/1.1 proxy with
//! none of ironic-proxy's features, hyper's server and client on tokio-rustls and nothing else.
//! No header rewriting, framing guard, limits, timeouts, metrics, access log, parking or
//! retries; a bare pool of upstream connections. It is not a product: it shows what this
//! machine's kernel and these libraries cost per request before any of our work is added
//! (`benches/load/cpu-split`, docs/benchmarks-history-2026.md "Performance round 7").
//!
//! Usage: `naive-proxy LISTEN CERT KEY UPSTREAM_SOCKET` (TLS 1.3, current-thread runtime).

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
#[path = "reference.rs"]
mod reference;

use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, UnixStream};

type Pool = Arc<Mutex<Vec<SendRequest<Incoming>>>>;

async fn forward(
    pool: Pool,
    socket: Arc<str>,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let pooled = pool.lock().map_err(|_| "pool poisoned")?.pop();
    let mut sender = match pooled {
        Some(sender) => sender,
        None => {
            let io = UnixStream::connect(&*socket).await?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
            tokio::spawn(conn);
            sender
        }
    };
    sender.ready().await?;
    let resp = sender.send_request(req).await?;
    pool.lock().map_err(|_| "pool poisoned")?.push(sender);
    Ok(resp)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (listen, acceptor, socket) = reference::start("naive-proxy")?;
    reference::runtime()?.block_on(serve(&listen, acceptor, socket))?;
    Ok(())
}

async fn serve(
    listen: &str,
    acceptor: tokio_rustls::TlsAcceptor,
    socket: Arc<str>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    let pool: Pool = Arc::default();
    loop {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let (acceptor, pool, socket) = (acceptor.clone(), pool.clone(), socket.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service =
                hyper::service::service_fn(move |req| forward(pool.clone(), socket.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}
