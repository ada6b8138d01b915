//! Per-connection timing: the request head deadline from accept (TLS handshake included), the
//! head deadline of later requests from their first byte, and the idle timeout between requests.
//!
//! hyper's own `header_read_timeout` restarts whenever a keep-alive connection waits for the next
//! head, which would make `request_head_timeout` an idle timeout too; we switch it off and keep
//! our own clock here instead. [`WatchedStream`] notes the first byte read while the connection is
//! idle; [`InFlight`] guards count requests until their response body ends.
//!
//! While a request runs there is no deadline (the upstream has `upstream_timeout`), except when
//! the client stops reading: a response write that makes no progress for `idle_timeout`, or a
//! response that waits on the client (its body not polled, or holding data) while nothing moves
//! between two of the driver's checks and `idle_timeout` after (an HTTP/2 client that never
//! opens its flow-control window writes nothing that could stall), ends the connection. So a
//! client that never reads (slow read) cannot hold it, and the upstream connection its response
//! comes from, forever. A body waiting on a slow upstream is not the client's doing and sets no
//! deadline.
//!
//! The clock is checked lazily: nothing on the request path touches a timer or wakes the
//! connection's driver. The driver sleeps until [`ConnClock::next_check`], which is never later
//! than any deadline the connection can reach from its state at that moment (every deadline
//! that a later event creates lies at least `min(head_timeout, idle_timeout)` after it), and
//! then compares [`ConnClock::deadline`] with the time.

use crate::proxy::response::Progress;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

pub(crate) struct ConnClock {
    accepted: Instant,
    in_flight: AtomicUsize,
    /// Responses in flight whose body waits on the client: the head is out and the body was
    /// not polled since, or its last poll gave data. Not those waiting on the upstream.
    on_client: AtomicUsize,
    /// Counts signs that the client reads: a response ready, a body polled, bytes written.
    /// A plain counter, so the request path reads no clock for it; the driver compares it
    /// between its checks ([`ConnClock::observe`]).
    progress: AtomicU64,
    /// `progress` at the driver's last check.
    progress_seen: AtomicU64,
    /// Milliseconds after `accepted` + 1 of the check since which a response waits on the
    /// client and `progress` has not moved; 0 when none waits.
    still_since: AtomicU64,
    served: AtomicU64,
    /// Milliseconds after `accepted` at which the last request ended.
    idle_since: AtomicU64,
    /// Milliseconds after `accepted` + 1 at which the first byte of the next head arrived
    /// while idle; 0 when none has.
    head_started: AtomicU64,
    /// Milliseconds after `accepted` + 1 since which writes to the client have made no
    /// progress; 0 while they do.
    write_stalled: AtomicU64,
    /// `served` + 1 at the last flush to the client that completed with no request in flight
    /// (HTTP/1.1): every byte of the responses begun by then is out. 0 before any.
    flushed_idle: AtomicU64,
    /// A request or its response ended keep-alive (HTTP/1.1): hyper closes the connection once
    /// that response is out, so it must not park (parking would serve bytes hyper left unread).
    closing: AtomicBool,
    /// The connection must end gracefully (its client chain is no longer trusted): the
    /// driver tells hyper, as for a drain.
    close_requested: AtomicBool,
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
            on_client: AtomicUsize::new(0),
            progress: AtomicU64::new(0),
            progress_seen: AtomicU64::new(0),
            still_since: AtomicU64::new(0),
            served: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            write_stalled: AtomicU64::new(0),
            flushed_idle: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            close_requested: AtomicBool::new(false),
            head_timeout,
            idle_timeout,
        })
    }

    /// A request head arrived.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(0, Ordering::Release);
        InFlight {
            clock: self.clone(),
            on_client: false,
        }
    }

    /// Not an atomic increment: only its change matters, and a lost one among racing HTTP/2
    /// streams still changes it.
    fn note_progress(&self) {
        let n = self.progress.load(Ordering::Relaxed);
        self.progress.store(n.wrapping_add(1), Ordering::Relaxed);
    }

    /// The driver's check at `now`: notes whether the client made progress since the last one.
    pub(crate) fn observe(&self, now: Instant) {
        let moved = self.progress.load(Ordering::Relaxed);
        let waiting = self.on_client.load(Ordering::Acquire) > 0;
        if !waiting {
            self.still_since.store(0, Ordering::Release);
        } else if moved != self.progress_seen.load(Ordering::Relaxed)
            || self.still_since.load(Ordering::Acquire) == 0
        {
            let ms = u64::try_from(now.saturating_duration_since(self.accepted).as_millis())
                .unwrap_or(u64::MAX - 1);
            self.still_since.store(ms + 1, Ordering::Release);
        }
        self.progress_seen.store(moved, Ordering::Relaxed);
    }

    /// The exchange in progress ends keep-alive: `Connection: close` on either side, or
    /// HTTP/1.0.
    pub(super) fn note_closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// End the connection gracefully: after the response in progress (HTTP/1.1), after the
    /// streams in flight (HTTP/2); asked before the first request, after that request. Acted
    /// on by the driver.
    pub(super) fn request_close(&self) {
        self.close_requested.store(true, Ordering::Release);
    }

    pub(super) fn close_requested(&self) -> bool {
        self.close_requested.load(Ordering::Acquire)
    }

    /// Whether a request or response has ended keep-alive on this connection.
    pub(super) fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Requests begun on the connection.
    pub(super) fn served(&self) -> u64 {
        self.served.load(Ordering::Acquire)
    }

    /// Requests whose response has not ended.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    pub(super) fn note_read(&self) {
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
    pub(super) fn note_write_pending(&self) {
        if self.write_stalled.load(Ordering::Acquire) == 0 {
            let now = self.since_accepted() + 1;
            let _ =
                self.write_stalled
                    .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// A write or flush to the client went through; `wrote`: bytes went out (a flush with
    /// nothing to flush, which the driver's own wake-ups cause, is no sign of a reading client).
    pub(super) fn note_write_progress(&self, wrote: bool) {
        self.write_stalled.store(0, Ordering::Release);
        if wrote {
            self.note_progress();
        }
    }

    /// A flush to the client completed (HTTP/1.1).
    pub(super) fn note_flushed(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            self.flushed_idle
                .store(self.served.load(Ordering::Acquire) + 1, Ordering::Release);
        }
    }

    /// Whether the connection has been idle for `after` at `now` with everything it answered
    /// written out: a request served, none in flight, every response flushed, not a byte of
    /// the next one read. Such a connection can give its HTTP/1.1 buffers back (`park`).
    pub(super) fn idle_for(&self, now: Instant, after: Duration) -> bool {
        let served = self.served.load(Ordering::Acquire);
        served > 0
            && self.in_flight.load(Ordering::Acquire) == 0
            && self.head_started.load(Ordering::Acquire) == 0
            && self.flushed_idle.load(Ordering::Acquire) == served + 1
            && now.saturating_duration_since(
                self.accepted + Duration::from_millis(self.idle_since.load(Ordering::Acquire)),
            ) >= after
    }

    /// When the driver must look at the clock next, given the time `now`: the deadline if one
    /// is due sooner, else the earliest moment a deadline that starts from now could fall due.
    pub(crate) fn next_check(&self, now: Instant) -> Instant {
        let soonest = now + self.head_timeout.min(self.idle_timeout);
        self.deadline().map_or(soonest, |d| d.min(soonest))
    }

    /// When the connection must be closed if nothing changes; while requests run, only when
    /// the client has stopped reading: its writes stall (HTTP/1.1), or a response waits on it
    /// and nothing moved (an HTTP/2 client that never opens its flow-control window).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            let after_idle =
                |ms: u64| self.accepted + Duration::from_millis(ms - 1) + self.idle_timeout;
            let stalled = self.write_stalled.load(Ordering::Acquire);
            let stalled = (stalled > 0).then(|| after_idle(stalled));
            let still = self.still_since.load(Ordering::Acquire);
            let unread = (self.on_client.load(Ordering::Acquire) > 0 && still > 0)
                .then(|| after_idle(still));
            return match (stalled, unread) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
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

/// Counts one request until its response ends, and whether that response waits on the client.
pub(crate) struct InFlight {
    clock: Arc<ConnClock>,
    on_client: bool,
}

impl InFlight {
    /// This exchange ends keep-alive (see [`ConnClock::note_closing`]).
    pub(super) fn note_closing(&self) {
        self.clock.note_closing();
    }

    /// The response is ready: its head goes out, its body waits on the client.
    pub(crate) fn responding(&mut self) {
        self.set_on_client(true);
    }

    fn set_on_client(&mut self, on: bool) {
        if on != self.on_client {
            self.on_client = on;
            if on {
                self.clock.on_client.fetch_add(1, Ordering::AcqRel);
            } else {
                self.clock.on_client.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.clock.note_progress();
    }
}

impl Progress for InFlight {
    fn polled(&mut self, waiting_on_upstream: bool) {
        self.set_on_client(!waiting_on_upstream);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.on_client {
            self.clock.on_client.fetch_sub(1, Ordering::AcqRel);
        }
        self.clock
            .idle_since
            .store(self.clock.since_accepted(), Ordering::Release);
        self.clock.in_flight.fetch_sub(1, Ordering::AcqRel);
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
        c.note_write_progress(true);
        assert_eq!(c.deadline(), None, "progress lifts it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_waiting_on_the_client_gets_the_idle_timeout_one_on_the_upstream_none() {
        let t0 = Instant::now();
        let c = ConnClock::new(t0, Duration::from_secs(10), Duration::from_secs(60));
        let mut g = c.begin();
        tokio::time::advance(Duration::from_secs(100)).await;
        assert_eq!(
            c.deadline(),
            None,
            "waiting for the upstream's response head"
        );
        g.responding();
        let ready = Instant::now();
        c.observe(ready);
        let d = c.deadline().expect("the body waits on the client");
        assert!(d <= ready + Duration::from_secs(60));
        assert!(d + Duration::from_millis(2) >= ready + Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(10)).await;
        c.observe(Instant::now());
        assert_eq!(c.deadline(), Some(d), "no progress: the deadline stays");
        g.polled(true);
        c.observe(Instant::now());
        assert_eq!(c.deadline(), None, "the body waits on the upstream");
        tokio::time::advance(Duration::from_secs(30)).await;
        g.polled(false);
        c.observe(Instant::now());
        let d = c
            .deadline()
            .expect("data handed out, waiting on the client");
        assert!(d >= Instant::now() + Duration::from_millis(59_990));
        tokio::time::advance(Duration::from_secs(10)).await;
        c.note_write_progress(true);
        c.observe(Instant::now());
        assert!(c.deadline().unwrap() > d, "bytes written: progress");
        drop(g);
        assert!(c.deadline().unwrap() >= Instant::now() + Duration::from_millis(59_990));
        assert_eq!(c.on_client.load(Ordering::Acquire), 0);
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
        c.note_write_progress(true);
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
