//! Per-connection timing: the request head deadline from accept (TLS handshake included), the
//! head deadline of later requests from their first byte, and the idle timeout between requests.
//!
//! hyper's own `header_read_timeout` restarts whenever a keep-alive connection waits for the next
//! head, which would make `request_head_timeout` an idle timeout too; we switch it off and keep
//! our own clock here instead. [`Activity`] notes the first byte read while the connection is
//! idle; [`InFlight`] guards count requests until their response body ends.
//!
//! While a request runs there is no deadline (the upstream has `upstream_timeout`), except when
//! the client stops reading: a response write that makes no progress for `idle_timeout` ends the
//! connection, so a client that never reads (slow read) cannot hold it, and the upstream
//! connection its response comes from, forever.
//!
//! The clock is checked lazily: nothing on the request path touches a timer or wakes the
//! connection's driver. The driver sleeps until [`ConnClock::next_check`], which is never later
//! than any deadline the connection can reach from its state at that moment (every deadline
//! that a later event creates lies at least `min(head_timeout, idle_timeout)` after it), and
//! then compares [`ConnClock::deadline`] with the time.

use super::guard::Guard;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

pub(crate) struct ConnClock {
    accepted: Instant,
    in_flight: AtomicUsize,
    served: AtomicU64,
    /// Milliseconds after `accepted` at which the last request ended.
    idle_since: AtomicU64,
    /// Milliseconds after `accepted` + 1 at which the first byte of the next head arrived
    /// while idle; 0 when none has.
    head_started: AtomicU64,
    /// Milliseconds after `accepted` + 1 since which writes to the client have made no
    /// progress; 0 while they do.
    write_stalled: AtomicU64,
    head_timeout: Duration,
    idle_timeout: Duration,
}

impl ConnClock {
    pub(crate) fn new(
        accepted: Instant,
        head_timeout: Duration,
        idle_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            accepted,
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            write_stalled: AtomicU64::new(0),
            head_timeout,
            idle_timeout,
        })
    }

    /// A request head arrived.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(0, Ordering::Release);
        InFlight(self.clone())
    }

    fn note_read(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.served.load(Ordering::Acquire) > 0
            && self.head_started.load(Ordering::Acquire) == 0
        {
            self.head_started
                .store(self.since_accepted() + 1, Ordering::Release);
        }
    }

    fn since_accepted(&self) -> u64 {
        u64::try_from(self.accepted.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// A write to the client could not proceed.
    fn note_write_pending(&self) {
        if self.write_stalled.load(Ordering::Acquire) == 0 {
            let now = self.since_accepted() + 1;
            let _ =
                self.write_stalled
                    .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// A write to the client went through.
    fn note_write_progress(&self) {
        self.write_stalled.store(0, Ordering::Release);
    }

    /// When the driver must look at the clock next, given the time `now`: the deadline if one
    /// is due sooner, else the earliest moment a deadline that starts from now could fall due.
    pub(crate) fn next_check(&self, now: Instant) -> Instant {
        let soonest = now + self.head_timeout.min(self.idle_timeout);
        self.deadline().map_or(soonest, |d| d.min(soonest))
    }

    /// When the connection must be closed if nothing changes; while requests run, only when
    /// the client has stopped reading.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            let stalled = self.write_stalled.load(Ordering::Acquire);
            return (stalled > 0)
                .then(|| self.accepted + Duration::from_millis(stalled - 1) + self.idle_timeout);
        }
        if self.served.load(Ordering::Acquire) == 0 {
            return Some(self.accepted + self.head_timeout);
        }
        let started = self.head_started.load(Ordering::Acquire);
        if started > 0 {
            return Some(self.accepted + Duration::from_millis(started - 1) + self.head_timeout);
        }
        let idle = self.accepted + Duration::from_millis(self.idle_since.load(Ordering::Acquire));
        Some(idle + self.idle_timeout)
    }
}

/// Counts one request until its response ends.
pub(crate) struct InFlight(Arc<ConnClock>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .idle_since
            .store(self.0.since_accepted(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

pin_project_lite::pin_project! {
    /// A connection's stream as hyper sees it: tells the clock when bytes arrive and when
    /// writes stall, and on HTTP/1.1 feeds every byte read to the framing guard too.
    pub(crate) struct Activity<S> {
        #[pin]
        inner: S,
        clock: Arc<ConnClock>,
        framing: Option<Arc<Guard>>,
    }
}

impl<S> Activity<S> {
    pub(crate) fn new(inner: S, clock: Arc<ConnClock>, framing: Option<Arc<Guard>>) -> Self {
        Self {
            inner,
            clock,
            framing,
        }
    }
}

impl<S: AsyncRead> AsyncRead for Activity<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let r = this.inner.poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.clock.note_read();
            if let Some(g) = this.framing {
                g.feed(&buf.filled()[before..]);
            }
        }
        r
    }
}

impl<S> Activity<S> {
    fn note_write<T>(clock: &ConnClock, r: &Poll<std::io::Result<T>>) {
        match r {
            Poll::Pending => clock.note_write_pending(),
            Poll::Ready(_) => clock.note_write_progress(),
        }
    }
}

impl<S: AsyncWrite> AsyncWrite for Activity<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let r = this.inner.poll_write(cx, buf);
        Self::note_write(this.clock, &r);
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let r = this.inner.poll_flush(cx);
        Self::note_write(this.clock, &r);
        r
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let r = this.inner.poll_write_vectored(cx, bufs);
        Self::note_write(this.clock, &r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_the_connection_state() {
        let t0 = Instant::now();
        let c = ConnClock::new(t0, Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(
            c.deadline(),
            Some(t0 + Duration::from_secs(10)),
            "first head from accept"
        );
        let g = c.begin();
        assert_eq!(c.deadline(), None, "no deadline while a request runs");
        tokio::time::advance(Duration::from_secs(30)).await;
        drop(g);
        let idle_start = Instant::now();
        assert_eq!(
            c.deadline(),
            Some(idle_start + Duration::from_secs(60)),
            "idle timeout"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        c.note_read();
        let first_byte = Instant::now();
        let d = c.deadline().unwrap();
        assert!(
            d <= first_byte + Duration::from_secs(10),
            "next head from its first byte"
        );
        assert!(d + Duration::from_millis(2) >= first_byte + Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_write_gets_the_idle_timeout_even_in_flight() {
        let t0 = Instant::now();
        let c = ConnClock::new(t0, Duration::from_secs(10), Duration::from_secs(60));
        let _g = c.begin();
        tokio::time::advance(Duration::from_secs(5)).await;
        c.note_write_pending();
        let stalled_at = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        c.note_write_pending();
        let d = c.deadline().expect("a deadline once writes stall");
        assert!(d <= stalled_at + Duration::from_secs(60));
        assert!(d + Duration::from_millis(2) >= stalled_at + Duration::from_secs(60));
        c.note_write_progress();
        assert_eq!(c.deadline(), None, "progress lifts it");
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_check_is_never_after_a_deadline_that_a_later_event_creates() {
        let t0 = Instant::now();
        let c = ConnClock::new(t0, Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(c.next_check(t0), t0 + Duration::from_secs(10), "first head");
        let g = c.begin();
        let armed = c.next_check(Instant::now());
        tokio::time::advance(Duration::from_secs(2)).await;
        c.note_write_pending();
        assert!(armed <= c.deadline().unwrap(), "a stall after arming");
        c.note_write_progress();
        drop(g);
        let armed = c.next_check(Instant::now());
        assert!(armed <= c.deadline().unwrap(), "idle after arming");
        tokio::time::advance(Duration::from_secs(1)).await;
        c.note_read();
        assert!(
            armed <= c.deadline().unwrap(),
            "a head started after arming"
        );
        assert!(c.deadline().unwrap() < Instant::now() + Duration::from_secs(60));
    }
}
