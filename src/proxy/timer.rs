//! The `upstream_timeout` timer, kept by the connection between its requests.
//!
//! `tokio::time::timeout` builds a new timer for every request: registered in the runtime's
//! timer wheel on its first poll and taken out again when the request is done, about 700
//! instructions per request (callgrind, 2 % of a keep-alive request). A timer that lives as
//! long as the connection costs that once: tokio moves a registered timer's deadline later with
//! one atomic update and leaves it in its wheel slot (`TimerEntry::reset`, which re-files it
//! only when the old slot comes due), and every request sets a deadline later than the last.
//!
//! A request takes the connection's timer for as long as it waits on the upstream and gives it
//! back when done, dropped half-way included. HTTP/1.1 serves one request at a time, so it is
//! always there; an HTTP/2 request that finds it taken gets a timer of its own, as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::Poll;
use tokio::time::{Instant, Sleep};

/// One connection's spare timer.
#[derive(Default)]
pub struct UpstreamTimer(Mutex<Option<Pin<Box<Sleep>>>>);

/// A copy of a connection's description starts without a timer of its own.
impl Clone for UpstreamTimer {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for UpstreamTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpstreamTimer")
    }
}

/// The deadline passed before the upstream answered.
#[derive(Debug)]
pub(super) struct TimedOut;

impl UpstreamTimer {
    /// The connection's timer set to `deadline`, or a new one when another request holds it.
    pub(super) fn lease(&self, deadline: Instant) -> Lease<'_> {
        let spare = self.0.lock().ok().and_then(|mut s| s.take());
        let sleep = match spare {
            Some(mut s) => {
                s.as_mut().reset(deadline);
                s
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        Lease {
            home: self,
            sleep: Some(sleep),
        }
    }
}

/// A timer taken from its connection; given back when dropped.
pub(super) struct Lease<'a> {
    home: &'a UpstreamTimer,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Lease<'_> {
    /// `fut`'s output, or [`TimedOut`] once the deadline has passed first. `fut` is polled
    /// first, as `tokio::time::timeout` does, so an answer that is ready wins over the deadline.
    ///
    /// A named future, not an `async fn`: an async fn keeps its argument and the local it is
    /// pinned in side by side, so every request's future carried `fut` twice (1.4 KiB more,
    /// copied at each level above that awaits it; `-Zprint-type-sizes`).
    pub(super) fn run<F: Future>(&mut self, fut: F) -> Timed<'_, F> {
        Timed {
            fut,
            sleep: self.sleep.as_mut(),
        }
    }
}

pin_project_lite::pin_project! {
    /// What [`Lease::run`] returns.
    pub(super) struct Timed<'a, F> {
        #[pin]
        fut: F,
        // `None` is not reachable: the timer leaves a lease only when the lease is dropped.
        sleep: Option<&'a mut Pin<Box<Sleep>>>,
    }
}

impl<F: Future> Future for Timed<'_, F> {
    type Output = Result<F::Output, TimedOut>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match this.sleep {
            Some(sleep) => sleep.as_mut().poll(cx).map(|()| Err(TimedOut)),
            None => Poll::Pending,
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let (Some(sleep), Ok(mut home)) = (self.sleep.take(), self.home.0.lock()) {
            *home = Some(sleep);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_deadline_cuts_a_slow_answer_and_the_timer_serves_the_next_request() {
        let timer = UpstreamTimer::default();
        let start = Instant::now();
        let slow = tokio::time::sleep(Duration::from_secs(10));
        let got = timer.lease(start + Duration::from_secs(3)).run(slow).await;
        assert!(got.is_err());
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert!(timer.0.lock().unwrap().is_some(), "given back");
        // The same timer, set later: a fast answer wins, a ready one even past the deadline.
        let got = timer
            .lease(Instant::now() + Duration::from_secs(3))
            .run(tokio::time::sleep(Duration::from_secs(1)))
            .await;
        assert!(got.is_ok());
        let got = timer.lease(Instant::now()).run(async { 7 }).await;
        assert_eq!(got.ok(), Some(7));
        // A deadline moved later is not fired at the earlier one.
        let mut lease = timer.lease(Instant::now() + Duration::from_secs(1));
        drop(lease);
        lease = timer.lease(Instant::now() + Duration::from_secs(5));
        let t = Instant::now();
        assert!(lease.run(std::future::pending::<()>()).await.is_err());
        assert_eq!(t.elapsed(), Duration::from_secs(5));
        // Nor is one moved earlier kept to the later one.
        drop(lease);
        let t = Instant::now();
        let got = timer
            .lease(t + Duration::from_secs(1))
            .run(std::future::pending::<()>())
            .await;
        assert!(got.is_err());
        assert_eq!(t.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_request_while_the_timer_is_out_gets_its_own() {
        let timer = UpstreamTimer::default();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut first = timer.lease(deadline);
        let mut second = timer.lease(deadline + Duration::from_secs(2));
        let t = Instant::now();
        assert!(first.run(std::future::pending::<()>()).await.is_err());
        assert_eq!(t.elapsed(), Duration::from_secs(2));
        assert!(second.run(std::future::pending::<()>()).await.is_err());
        assert_eq!(t.elapsed(), Duration::from_secs(4));
        drop((first, second));
        assert!(timer.0.lock().unwrap().is_some());
    }
}
