//! Serving one accepted (and, with TLS, decrypted) connection to its end: hyper's HTTP/1.1 or
//! HTTP/2 server over the connection's byte stream ([`WatchedStream`]), with the framing guard on
//! HTTP/1.1, and the service that hands every request to the listener's [`Proxy`]. Used by the
//! accept loops in `mod.rs` and, without a bound socket, by [`serve_stream`].

use super::conn::ConnClock;
use super::driver::{ConnectionDriver, Distrust, Parking};
use super::guard;
use super::io::{Http1, RefusedHead, WatchedStream};
use super::service::Service;
use super::Listener;
use crate::config::Limits;
use crate::proxy::{ConnInfo, Proxy};
use crate::tls::trust::LiveChain;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::Instant;

/// The proxy's answer to a refused head on one connection: the one place the connection's
/// byte stream reaches the proxy.
struct ProxyAnswers {
    proxy: Arc<Proxy>,
    info: Arc<ConnInfo>,
}

impl RefusedHead for ProxyAnswers {
    fn answer(&self, status: http::StatusCode, date_line: Option<&[u8]>) -> Vec<u8> {
        self.proxy.refused_head(&self.info, status, date_line)
    }
}

impl Listener {
    pub(super) fn context(&self) -> ListenerContext<'_> {
        ListenerContext {
            proxy: self.proxy.clone(),
            limits: &self.limits,
            parked: self.parked.clone(),
        }
    }

    /// Serves a connection to its end. An associated function so that [`serve_stream`] can use
    /// it without a bound socket. Not an `async fn`: it returns the connection's future boxed,
    /// built without keeping a second copy of the stream or the hyper connection (an async fn
    /// keeps its arguments for its whole life), so an idle connection's task holds a pointer.
    pub(super) fn serve<S>(
        context: ListenerContext<'_>,
        io: S,
        h2: bool,
        info: ConnInfo,
        live: Option<Arc<LiveChain>>,
        clock: Arc<ConnClock>,
        shutdown: watch::Receiver<bool>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let ListenerContext {
            proxy,
            limits,
            parked,
        } = context;
        // HTTP/1.1 only: HTTP/2 frames its messages itself.
        let framing = (!h2).then(|| guard::Guard::new(limits.header_bytes));
        let info = Arc::new(info);
        let http1 = (!h2).then(|| {
            Http1::new(Box::new(ProxyAnswers {
                proxy: proxy.clone(),
                info: info.clone(),
            }))
        });
        let distrust = live.as_ref().map(|live| distrust(live, &info, &clock));
        // An egress answers as a forward proxy, whose client may itself be a proxy that would
        // take a Keep-Alive field for an end-to-end one: none there. Every other HTTP/1.1
        // listener tells its clients (the pools between proxies) its idle timeout.
        let hint = !h2 && !proxy.is_egress();
        let svc = Service {
            proxy,
            info,
            clock: clock.clone(),
            framing: framing.clone(),
            live,
            keep_alive: hint.then(|| super::service::keep_alive_hint(limits.idle_timeout)),
        };
        let io = TokioIo::new(WatchedStream::new(
            io,
            clock.clone(),
            framing.clone(),
            http1,
        ));
        if h2 {
            let conn = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_header_list_size(u32::try_from(limits.header_bytes).unwrap_or(u32::MAX))
                .max_concurrent_streams(256)
                .serve_connection(io, svc);
            Box::pin(ConnectionDriver::new(conn, clock, shutdown, distrust))
        } else {
            // max_buf_size alone is not a limit on the head: a head that arrives in one large
            // read is parsed whole. max_header_size is exact (431 above it).
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(None)
                .max_buf_size(limits.header_bytes.max(8192))
                .max_header_size(limits.header_bytes)
                // No max_headers: hyper's default is crate::http1::MAX_HEADERS, parsed on the
                // stack (see there).
                .keep_alive(true);
            let conn = Parking::new(builder, io, svc, framing, parked);
            Box::pin(ConnectionDriver::new(conn, clock, shutdown, distrust))
        }
    }
}

/// What ends a mutual-TLS connection when a trust change leaves its client chain unverified:
/// the check, and the one log line of the close.
fn distrust(live: &Arc<LiveChain>, info: &Arc<ConnInfo>, clock: &Arc<ConnClock>) -> Distrust {
    let changes = live.listener().changes();
    let (live, info, clock) = (live.clone(), info.clone(), clock.clone());
    let wait = async move {
        let reason = live.clone().distrusted(live.listener().changes()).await;
        super::service::untrusted(&live, &info, &reason, clock.in_flight());
    };
    Distrust::new(changes, wait)
}

/// Serves one already-accepted, already-decrypted connection to its end with exactly the
/// settings, timeouts and service of a listener's connections: HTTP/1.1, or HTTP/2 with prior
/// knowledge when `h2`. The request head deadline counts from this call. For in-memory tests
/// and fuzzing (`fuzz/`), where the stream is a `tokio::io::duplex` pipe; the connection is
/// never drained, it ends when the peer closes or a timeout of `limits` fires.
pub async fn serve_stream<S>(io: S, h2: bool, proxy: Arc<Proxy>, info: ConnInfo, limits: &Limits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = ConnClock::new(
        Instant::now(),
        limits.request_head_timeout,
        limits.idle_timeout,
    );
    // Kept alive until the connection ends: a dropped sender would read as a drain.
    let (_never, shutdown) = watch::channel(false);
    let context = ListenerContext {
        proxy,
        limits,
        // Parked connections are counted per listener; this one belongs to none.
        parked: Gauge::default(),
    };
    Listener::serve(context, io, h2, info, None, clock, shutdown).await;
}

/// What serving a connection takes from its listener.
pub(super) struct ListenerContext<'a> {
    pub(super) proxy: Arc<Proxy>,
    pub(super) limits: &'a Limits,
    /// The listener's parked HTTP/1.1 connections (see `drive`).
    pub(super) parked: Gauge,
}
