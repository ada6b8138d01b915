//! Running one connection to its end: hyper's HTTP/1.1 or HTTP/2 connection, the connection's
//! deadlines (see `conn`), the server's drain and, on a mutual-TLS connection, trust changes
//! ([`Distrust`]), in one hand-written future. Hand-written so the connection is stored once:
//! an `async fn` keeps its arguments for its whole life, and a second copy of the hyper
//! connection would be part of every idle connection's memory.
//!
//! **Parking (HTTP/1.1).** hyper holds an 8 KiB read buffer and an 8 KiB write buffer for every
//! connection from its first byte to its close, idle or not, and no setting changes that. A
//! keep-alive connection idle for [`PARK_AFTER`] with every response written out is therefore
//! taken back from hyper: hyper closes the idle connection without shutting its stream down
//! (`graceful_shutdown` of an idle connection, then `into_parts`), the hyper connection and its
//! buffers are freed, and the stream (its TLS state) and the service wait for the next byte on
//! their own. That byte builds a new hyper connection, which reads it first. An idle keep-alive
//! connection then costs its TLS state and no HTTP buffers; HAProxy likewise holds buffers only
//! while data flows. Deadlines, the drain and the connection's clock are the same parked or
//! not: the clock and the framing guard see the byte that wakes a parked connection.
//!
//! A new connection parks as soon as its first response is written out, not after
//! [`PARK_AFTER`]: most connections a sidecar sees carry one request and then wait (a
//! conductor's JSON-RPC call, an agent's heartbeat, a probe), and a burst of them would
//! otherwise hold every one's buffers at once for `PARK_AFTER`. A client that sends its second
//! request right away pays one new hyper connection for it (once per connection) and parks after
//! `PARK_AFTER` from then on.

use super::conn::ConnClock;
use super::guard::Guard;
use super::io::WatchedStream;
use super::service::Service;
use bytes::Bytes;
pub(super) use distrust::Distrust;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

/// How long an HTTP/1.1 connection that has carried more than one request waits idle before it
/// parks (a new connection parks after its first response, see the module's documentation).
/// Longer than the gap between requests of a client that sends a few a second (a pool between
/// proxies, baremetal-operator polling its hosts): waking a parked connection builds a new
/// hyper connection, a large part of a request's work, and each check of an unparked
/// connection is a wake-up of its own, so such a client must pay neither per request. Short
/// enough that idle connections give their buffers back within seconds. A connection parks
/// between one and two of these after its last response was written; the driver checks an
/// unparked connection every `PARK_AFTER`.
pub(super) const PARK_AFTER: Duration = Duration::from_secs(1);

/// A hyper connection as the driver runs it.
pub(super) trait HyperConnection {
    /// Serves until the connection ends.
    fn poll_serve(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()>;

    /// The server drains: end after the response in progress, if any.
    fn graceful(self: Pin<&mut Self>);

    /// Whether the connection would park if it were idle (see [`HyperConnection::park`]).
    fn can_park(&self) -> bool {
        false
    }

    /// The connection has been idle for [`PARK_AFTER`]: give the HTTP buffers back.
    fn park(self: Pin<&mut Self>) {}

    /// Whether a parked connection woke since the last call.
    fn woke(self: Pin<&mut Self>) -> bool {
        false
    }
}

impl<I, S, E> HyperConnection for http2::Connection<I, S, E>
where
    Self: Future,
    S: hyper::service::HttpService<
        hyper::body::Incoming,
        ResBody = crate::proxy::response::ResponseBody,
    >,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn poll_serve(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.poll(cx).map(|_| ())
    }

    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

type Io<S> = TokioIo<WatchedStream<S>>;
type Conn<S> = http1::Connection<Io<S>, Service>;

/// An HTTP/1.1 connection that parks when idle (see the module's documentation).
pub(super) struct Parking<S> {
    state: State<S>,
    /// Builds the next hyper connection after a parked one wakes, with the same settings.
    builder: http1::Builder,
    framing: Option<Arc<Guard>>,
    /// The listener's parked connections.
    parked: Gauge,
    draining: bool,
    woke: bool,
}

enum State<S> {
    /// hyper serves; `parking`: told to end once idle, leaving the stream open.
    Serving {
        conn: Box<Conn<S>>,
        parking: bool,
    },
    /// No hyper connection: the stream waits for its next byte.
    Parked(Box<Idle<S>>),
    /// Closing the stream: the client closed it while parked, or the server drains.
    Closing(Box<Io<S>>),
    Done,
}

struct Idle<S> {
    io: Io<S>,
    service: Service,
    _counted: Counted,
}

/// One parked connection in the listener's gauge, for as long as it lives.
struct Counted(Gauge);

impl Counted {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl<S> Parking<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    pub(super) fn new(
        builder: http1::Builder,
        io: Io<S>,
        service: Service,
        framing: Option<Arc<Guard>>,
        parked: Gauge,
    ) -> Self {
        let conn = Box::new(builder.serve_connection(io, service));
        Self {
            state: State::Serving {
                conn,
                parking: false,
            },
            builder,
            framing,
            parked,
            draining: false,
            woke: false,
        }
    }

    fn serving(&self, io: Io<S>, service: Service) -> State<S> {
        State::Serving {
            conn: Box::new(self.builder.serve_connection(io, service)),
            parking: false,
        }
    }

    /// hyper has ended the idle connection without shutting the stream down.
    fn parked(&mut self, conn: Conn<S>) -> State<S> {
        let parts = conn.into_parts();
        let mut io = parts.io;
        if !parts.read_buf.is_empty() {
            // Bytes of a next request were read after all: serve them now.
            io.inner_mut().unread(parts.read_buf);
            return self.serving(io, parts.service);
        }
        if self.draining {
            return State::Closing(Box::new(io));
        }
        State::Parked(Box::new(Idle {
            io,
            service: parts.service,
            _counted: Counted::new(&self.parked),
        }))
    }
}

impl<S> HyperConnection for Parking<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    fn poll_serve(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Serving {
                    conn,
                    parking: false,
                } => {
                    // hyper's own end: the stream is shut down (or broken); nothing to keep.
                    let _ = ready!(Pin::new(&mut **conn).poll(cx));
                    this.state = State::Done;
                }
                State::Serving {
                    conn,
                    parking: true,
                } => {
                    let ended = ready!(conn.poll_without_shutdown(cx));
                    let State::Serving { conn, .. } =
                        std::mem::replace(&mut this.state, State::Done)
                    else {
                        unreachable!("matched above");
                    };
                    if ended.is_ok() {
                        this.state = this.parked(*conn);
                    }
                }
                State::Parked(idle) => {
                    if this.draining {
                        let State::Parked(idle) = std::mem::replace(&mut this.state, State::Done)
                        else {
                            unreachable!("matched above");
                        };
                        this.state = State::Closing(Box::new(idle.io));
                        continue;
                    }
                    let mut first = [0u8; 64];
                    let mut buf = ReadBuf::new(&mut first);
                    let read = ready!(Pin::new(idle.io.inner_mut()).poll_read(cx, &mut buf));
                    let State::Parked(idle) = std::mem::replace(&mut this.state, State::Done)
                    else {
                        unreachable!("matched above");
                    };
                    let Idle {
                        mut io, service, ..
                    } = *idle;
                    match read {
                        // The client closed its side: close ours, as hyper does.
                        Ok(()) if buf.filled().is_empty() => {
                            this.state = State::Closing(Box::new(io));
                        }
                        Ok(()) => {
                            io.inner_mut().unread(Bytes::copy_from_slice(buf.filled()));
                            this.state = this.serving(io, service);
                            this.woke = true;
                        }
                        Err(_) => {}
                    }
                }
                State::Closing(io) => {
                    let _ = ready!(Pin::new(io.inner_mut()).poll_shutdown(cx));
                    this.state = State::Done;
                }
                State::Done => return Poll::Ready(()),
            }
        }
    }

    fn graceful(self: Pin<&mut Self>) {
        let this = self.get_mut();
        this.draining = true;
        // Parking, hyper ends the connection already; parked, `poll_serve` closes the stream.
        if let State::Serving {
            conn,
            parking: false,
        } = &mut this.state
        {
            Pin::new(&mut **conn).graceful_shutdown();
        }
    }

    fn can_park(&self) -> bool {
        !self.draining
            && matches!(self.state, State::Serving { parking: false, .. })
            && !self.framing.as_ref().is_some_and(|g| g.mid_message())
    }

    fn woke(self: Pin<&mut Self>) -> bool {
        std::mem::take(&mut self.get_mut().woke)
    }

    fn park(self: Pin<&mut Self>) {
        let this = self.get_mut();
        if let State::Serving { conn, parking } = &mut this.state {
            if !*parking {
                *parking = true;
                // hyper closes an idle connection at once; `poll_serve` takes the stream back.
                Pin::new(&mut **conn).graceful_shutdown();
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// Runs a connection to completion, closing it at the clock's deadline or gracefully on
    /// drain, and parking it when idle. One timer per connection, re-armed only when it fires
    /// (see `conn` for why that is never late); an HTTP/1.1 connection that could park is
    /// checked at least every [`PARK_AFTER`].
    pub(super) struct ConnectionDriver<C> {
        #[pin]
        conn: C,
        #[pin]
        check: tokio::time::Sleep,
        clock: Arc<ConnClock>,
        // An HTTP/1.1 connection that has not yet served more than its first request: it parks
        // as soon as that first response is out (see the module's documentation).
        fresh: bool,
        // Resolves when the server starts draining; `None` once the connection was told.
        drain: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        // The same watch, to look at before polling `drain` (see `ConnectionDriver::poll`).
        shutdown: watch::Receiver<bool>,
        // `drain` has been polled once, so its waker is registered with the watch.
        drain_armed: bool,
        // The connection was told to end after its requests in flight because the clock asked
        // for it (an untrusted client chain, see `tls::trust`, or a drain before its first
        // request).
        closed_early: bool,
        // Mutual TLS: resolves when a trust change leaves the client chain unverified; `None`
        // without mutual TLS and once it resolved.
        distrust: Option<Distrust>,
    }
}

impl<C: HyperConnection> ConnectionDriver<C> {
    pub(super) fn new(
        conn: C,
        clock: Arc<ConnClock>,
        shutdown: watch::Receiver<bool>,
        distrust: Option<Distrust>,
    ) -> Self {
        let now = Instant::now();
        let mut first = clock.next_check(now);
        if conn.can_park() {
            first = first.min(now + PARK_AFTER);
        }
        Self {
            fresh: conn.can_park(),
            conn,
            check: tokio::time::sleep_until(first),
            clock,
            drain: Some({
                let mut shutdown = shutdown.clone();
                Box::pin(async move {
                    // A dropped sender counts as a drain too.
                    let _ = shutdown.wait_for(|s| *s).await;
                })
            }),
            shutdown,
            drain_armed: false,
            closed_early: false,
            distrust,
        }
    }
}

impl<C: HyperConnection> Future for ConnectionDriver<C> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        // The drain future is polled once to register with the watch, then only once the watch
        // has changed (an atomic load): polling it on every wake-up would re-read the watch's
        // value under its lock and re-register its waker on every request. The waker it
        // registered is this task's, the same on every poll, so the watch still wakes the
        // connection.
        let changed = !*this.drain_armed || this.shutdown.has_changed().unwrap_or(true);
        if let Some(drain) = this.drain.as_mut().filter(|_| changed) {
            *this.drain_armed = true;
            if drain.as_mut().poll(cx).is_ready() {
                *this.drain = None;
                if this.clock.served() == 0 {
                    // Its first request is still to come (queued in the backlog, or accepted
                    // just before the drain): served, then closed, as an untrusted client's
                    // (`Service` answers it `Connection: close`). A graceful end now would
                    // close it unanswered; the head deadline from accept still bounds it.
                    this.clock.request_close();
                } else {
                    this.conn.as_mut().graceful();
                }
            }
        }
        if this.distrust.as_mut().is_some_and(|d| d.failed(cx)) {
            *this.distrust = None;
            // Idle (parked, between requests, or before the first): closed now, unanswered,
            // as nothing was asked. Serving: ended after the requests in flight, and a request
            // that begins meanwhile is answered `Connection: close` (`Service`).
            this.clock.request_close();
            *this.closed_early = true;
            this.conn.as_mut().graceful();
        }
        loop {
            if this.conn.as_mut().poll_serve(cx).is_ready() {
                return Poll::Ready(());
            }
            // Asked for by the service while hyper was polled just now, or by a drain before
            // the first request: the same graceful end as a drain once a request has begun
            // (before it, hyper would close the connection unanswered), and hyper polled again
            // to act on it.
            if !*this.closed_early && this.clock.close_requested() && this.clock.served() > 0 {
                *this.closed_early = true;
                this.conn.as_mut().graceful();
                continue;
            }
            if this.conn.as_mut().woke() {
                // Checked every PARK_AFTER again, as before it parked.
                let soon = Instant::now() + PARK_AFTER;
                if soon < this.check.deadline() {
                    this.check.as_mut().reset(soon);
                }
            }
            let mut parked = false;
            if *this.fresh {
                match this.clock.served() {
                    0 => {}
                    1 => {
                        if this.conn.can_park()
                            && !this.clock.closing()
                            && this.clock.idle_for(Instant::now(), Duration::ZERO)
                        {
                            *this.fresh = false;
                            this.conn.as_mut().park();
                            parked = true;
                        }
                    }
                    _ => *this.fresh = false,
                }
            }
            while this.check.as_mut().poll(cx).is_ready() {
                let now = Instant::now();
                this.clock.observe(now);
                if this.clock.deadline().is_some_and(|d| d <= now) {
                    // Idle, a head too slow, or a client that stopped reading its response.
                    return Poll::Ready(());
                }
                let mut next = this.clock.next_check(now);
                if this.conn.can_park() && !this.clock.closing() {
                    if this.clock.idle_for(now, PARK_AFTER) {
                        this.conn.as_mut().park();
                        parked = true;
                    } else {
                        next = next.min(now + PARK_AFTER);
                    }
                }
                this.check.as_mut().reset(next);
            }
            if !parked {
                return Poll::Pending;
            }
            // hyper must be polled to end the idle connection.
        }
    }
}

mod distrust;
#[cfg(test)]
mod distrust_tests;
#[cfg(test)]
pub(super) mod tests;
