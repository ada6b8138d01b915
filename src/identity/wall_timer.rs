//! A timer on the wall clock, for deadlines that are wall-clock facts (a certificate's
//! notAfter).
//!
//! tokio's timers run on the monotonic clock, which does not move while a virtual machine is
//! frozen; the wall clock is stepped forward on resume. A `timerfd` on `CLOCK_REALTIME` armed
//! with an absolute time (`TFD_TIMER_ABSTIME`) fires as soon as the wall clock passes that time,
//! however it got there, and `TFD_TIMER_CANCEL_ON_SET` also wakes it when the clock is set
//! (`timerfd_create(2)`). Written here because it is a few lines over rustix's safe calls (the
//! one unsafe call is tokio's registration of the descriptor, `register`); the timerfd crates
//! add nothing we need.

use rustix::fd::OwnedFd;
use rustix::io::Errno;
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use std::io;
use std::time::SystemTime;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub(crate) struct WallTimer {
    fd: AsyncFd<OwnedFd>,
}

impl WallTimer {
    /// A disarmed timer; call [`WallTimer::arm`]. Needs a tokio runtime with I/O enabled.
    pub(crate) fn new() -> io::Result<Self> {
        let fd = timerfd_create(
            TimerfdClockId::Realtime,
            TimerfdFlags::CLOEXEC | TimerfdFlags::NONBLOCK,
        )?;
        Ok(Self { fd: register(fd)? })
    }

    /// Fires once the wall clock reaches `at` (at once if it already has). Replaces any earlier
    /// time, and forgets an expiry not yet waited for.
    pub(crate) fn arm(&self, at: SystemTime) -> io::Result<()> {
        let since = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let value = Timespec {
            tv_sec: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
            // All zeroes would disarm the timer; 1970 plus 1 ns is in the past all the same.
            tv_nsec: i64::from(since.subsec_nanos().max(1)),
        };
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        timerfd_settime(
            self.fd.get_ref(),
            TimerfdTimerFlags::ABSTIME | TimerfdTimerFlags::CANCEL_ON_SET,
            &spec,
        )?;
        Ok(())
    }

    /// Waits until the armed time has passed or the wall clock was set; the caller compares the
    /// clock with its deadline and re-arms.
    pub(crate) async fn fired(&self) -> io::Result<()> {
        loop {
            let mut ready = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            match rustix::io::read(self.fd.get_ref(), &mut expirations) {
                // Expired, or the clock was set (ECANCELED) and the caller has to look again.
                Ok(_) | Err(Errno::CANCELED) => return Ok(()),
                Err(Errno::AGAIN | Errno::INTR) => ready.clear_ready(),
                Err(err) => return Err(err.into()),
            }
        }
    }
}

/// tokio's registration is `unsafe` since 1.52: it cannot know that the descriptor stays open.
#[allow(unsafe_code)]
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and refers to this
    // timer until the AsyncFd (which deregisters first) is dropped.
    Ok(unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const BOUND: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn fires_once_the_wall_clock_reaches_the_time() {
        let timer = WallTimer::new().unwrap();
        let at = SystemTime::now() + Duration::from_millis(30);
        timer.arm(at).unwrap();
        tokio::time::timeout(BOUND, timer.fired())
            .await
            .expect("fired")
            .unwrap();
        assert!(SystemTime::now() >= at, "not before its time");
    }

    #[tokio::test]
    async fn a_time_already_past_fires_at_once_and_re_arming_replaces_the_time() {
        let timer = WallTimer::new().unwrap();
        timer
            .arm(SystemTime::now() + Duration::from_secs(3600))
            .unwrap();
        let fired = tokio::time::timeout(Duration::from_millis(50), timer.fired()).await;
        assert!(fired.is_err(), "an hour away: not fired");
        timer.arm(SystemTime::UNIX_EPOCH).unwrap();
        tokio::time::timeout(BOUND, timer.fired())
            .await
            .expect("fired")
            .unwrap();
    }
}
