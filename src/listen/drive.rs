//! Running one connection to its end: hyper's HTTP/1.1 or HTTP/2 connection, the connection's
//! deadlines (see `conn`) and the server's drain, in one hand-written future. Hand-written so
//! the connection is stored once: an `async fn` keeps its arguments for its whole life, and a
//! second copy of the hyper connection would be part of every idle connection's memory.

use super::conn::ConnClock;
use hyper::server::conn::{http1, http2};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::watch;
use tokio::time::Instant;

/// hyper connections that can finish gracefully.
pub(super) trait Graceful: Future {
    fn graceful(self: Pin<&mut Self>);
}

impl<I, S> Graceful for http1::Connection<I, S>
where
    Self: Future,
    S: hyper::service::HttpService<
        hyper::body::Incoming,
        ResBody = crate::proxy::response::ResponseBody,
    >,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, E> Graceful for http2::Connection<I, S, E>
where
    Self: Future,
    S: hyper::service::HttpService<
        hyper::body::Incoming,
        ResBody = crate::proxy::response::ResponseBody,
    >,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

pin_project_lite::pin_project! {
    /// Runs a connection to completion, closing it at the clock's deadline or gracefully on
    /// drain. One timer per connection, re-armed only when it fires (see `conn` for why that is
    /// never late).
    pub(super) struct Drive<C> {
        #[pin]
        conn: C,
        #[pin]
        check: tokio::time::Sleep,
        clock: Arc<ConnClock>,
        // Resolves when the server starts draining; `None` once the connection was told.
        drain: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    }
}

impl<C: Graceful> Drive<C> {
    pub(super) fn new(conn: C, clock: Arc<ConnClock>, mut shutdown: watch::Receiver<bool>) -> Self {
        Self {
            conn,
            check: tokio::time::sleep_until(clock.next_check(Instant::now())),
            clock,
            drain: Some(Box::pin(async move {
                // A dropped sender counts as a drain too.
                let _ = shutdown.wait_for(|s| *s).await;
            })),
        }
    }
}

impl<C: Graceful> Future for Drive<C> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if let Some(drain) = this.drain {
            if drain.as_mut().poll(cx).is_ready() {
                *this.drain = None;
                this.conn.as_mut().graceful();
            }
        }
        if this.conn.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        while this.check.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            this.clock.observe(now);
            if this.clock.deadline().is_some_and(|d| d <= now) {
                // Idle, a head too slow, or a client that stopped reading its response.
                return Poll::Ready(());
            }
            let next = this.clock.next_check(now);
            this.check.as_mut().reset(next);
        }
        Poll::Pending
    }
}
