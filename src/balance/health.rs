//! Health of one endpoint: active checks with thresholds, passive ejection with backoff.
//!
//! Two sources decide whether an endpoint may receive requests:
//!
//! - **Active checks** ([`run_checks`]): a probe every `interval`. A healthy endpoint turns
//!   unhealthy after `unhealthy_after` consecutive failures, an unhealthy one healthy after
//!   `healthy_after` consecutive passes. An endpoint created with [`Health::new`] has not been
//!   checked yet and receives nothing until its first check passes (one pass is enough then, as
//!   in Envoy): a peer that DNS has just announced may still be starting, and the issue asks that
//!   "it receives traffic after passing its health check".
//! - **Passive ejection**: a real request that could not connect or got a 5xx from the endpoint
//!   ejects it for 1 s, doubling with each ejection that follows a re-admission without a success
//!   in between, up to 30 s. A successful request resets the backoff. Failures of requests that
//!   were already in flight when the endpoint was ejected do not extend the ejection, so a burst
//!   of concurrent failures counts once. A passing active check lifts an ejection at once: the
//!   checker has just seen the endpoint answer.
//!
//! Without active checks use [`Health::passive_only`]: the endpoint starts available and only
//! passive ejection applies.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tracing::info;

/// First passive ejection.
const EJECT_BASE: Duration = Duration::from_secs(1);
/// Longest passive ejection.
const EJECT_MAX: Duration = Duration::from_secs(30);

/// The `health` table of an upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthOptions {
    /// HTTP path the probe requests (the probe itself is the caller's).
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub unhealthy_after: u32,
    pub healthy_after: u32,
}

impl Default for HealthOptions {
    fn default() -> Self {
        Self {
            path: "/".into(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            unhealthy_after: 2,
            healthy_after: 1,
        }
    }
}

/// What the active checks concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Not checked yet: unavailable; the first result decides.
    Pending,
    Healthy,
    Unhealthy,
}

#[derive(Debug)]
struct State {
    verdict: Verdict,
    /// Consecutive check results that contradict the verdict.
    streak: u32,
    /// End of the current passive ejection.
    ejected_until: Option<Instant>,
    /// Ejections since the last successful request; sets the next ejection's length.
    ejections: u32,
}

/// Health of one endpoint. Thread-safe; share it through an `Arc`.
#[derive(Debug)]
pub struct Health {
    healthy_after: u32,
    unhealthy_after: u32,
    state: Mutex<State>,
}

impl Health {
    /// For an endpoint with active checks: unavailable until its first check passes.
    /// Thresholds of 0 count as 1.
    #[must_use]
    pub fn new(healthy_after: u32, unhealthy_after: u32) -> Self {
        Self::starting(Verdict::Pending, healthy_after, unhealthy_after)
    }

    /// For an endpoint without active checks: available until passive ejection says otherwise.
    #[must_use]
    pub fn passive_only() -> Self {
        Self::starting(Verdict::Healthy, 1, 1)
    }

    fn starting(verdict: Verdict, healthy_after: u32, unhealthy_after: u32) -> Self {
        Self {
            healthy_after: healthy_after.max(1),
            unhealthy_after: unhealthy_after.max(1),
            state: Mutex::new(State {
                verdict,
                streak: 0,
                ejected_until: None,
                ejections: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section below only assigns plain fields, so a panic elsewhere cannot
        // leave the state half-written: a poisoned lock is still consistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the outcome of one active check.
    pub fn record_check(&self, ok: bool) {
        let mut state = self.lock();
        if ok {
            state.ejected_until = None;
        }
        let (confirms, threshold, flipped) = match state.verdict {
            Verdict::Pending => {
                state.verdict = if ok {
                    Verdict::Healthy
                } else {
                    Verdict::Unhealthy
                };
                state.streak = 0;
                return;
            }
            Verdict::Healthy => (ok, self.unhealthy_after, Verdict::Unhealthy),
            Verdict::Unhealthy => (!ok, self.healthy_after, Verdict::Healthy),
        };
        if confirms {
            state.streak = 0;
        } else {
            state.streak += 1;
            if state.streak >= threshold {
                state.verdict = flipped;
                state.streak = 0;
            }
        }
    }

    /// A real request could not connect, or got a 5xx: eject with exponential backoff.
    pub fn record_passive_failure(&self, now: Instant) {
        let mut state = self.lock();
        if state.ejected_until.is_some_and(|until| now < until) {
            return;
        }
        let doublings = state.ejections.min(5);
        let backoff = EJECT_BASE.saturating_mul(1 << doublings).min(EJECT_MAX);
        state.ejected_until = Some(now + backoff);
        state.ejections = state.ejections.saturating_add(1);
    }

    /// A real request succeeded: the next ejection starts again from the shortest backoff.
    pub fn record_passive_success(&self) {
        self.lock().ejections = 0;
    }

    /// Healthy by the active checks and not ejected.
    pub fn is_available(&self, now: Instant) -> bool {
        let state = self.lock();
        state.verdict == Verdict::Healthy && state.ejected_until.is_none_or(|until| now >= until)
    }

    /// Whether the active checks last judged it healthy (an ejection aside): true for an
    /// endpoint without checks.
    pub fn checks_passed(&self) -> bool {
        self.lock().verdict == Verdict::Healthy
    }

    /// `healthy`, `unhealthy` (failing or not yet passed its checks) or `ejected`, for metrics
    /// and logs; judged at the current time.
    pub fn state(&self) -> &'static str {
        let state = self.lock();
        match state.verdict {
            Verdict::Pending | Verdict::Unhealthy => "unhealthy",
            Verdict::Healthy if state.ejected_until.is_some_and(|u| Instant::now() < u) => {
                "ejected"
            }
            Verdict::Healthy => "healthy",
        }
    }
}

/// Runs active checks for one endpoint: every `interval` (the first at once), `probe()` bounded
/// by `timeout`, a timeout counting as a failure. Logs each change of state at `info`; run it
/// inside a span naming the endpoint. It returns when it holds the last reference to `health`,
/// that is once the endpoint has left the set; aborting the task also stops it.
pub(crate) async fn run_checks<F, Fut>(health: Arc<Health>, opts: HealthOptions, probe: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut ticks = tokio::time::interval(opts.interval.max(Duration::from_millis(10)));
    // A probe that ran long must not be followed by a burst of catch-up probes.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if Arc::strong_count(&health) == 1 {
            return;
        }
        let ok = tokio::time::timeout(opts.timeout, probe())
            .await
            .unwrap_or(false);
        let before = health.state();
        health.record_check(ok);
        let after = health.state();
        if before != after {
            info!(path = %opts.path, from = before, to = after, "endpoint health changed");
        }
    }
}
