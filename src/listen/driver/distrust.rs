//! A mutual-TLS connection's wake-up on trust changes ([`Distrust`]), polled by the driver.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use tokio::sync::watch;

/// A mutual-TLS connection's side of trust changes: resolves once its client chain no longer
/// verifies (`tls::trust`), whether the connection is idle, parked or serving. The driver then
/// ends it as a drain does: an idle connection closes at once, one serving requests after them
/// (`Connection: close` on HTTP/1.1, GOAWAY on HTTP/2).
pub(in crate::listen) struct Distrust {
    /// The listener's configuration changes, looked at (an atomic load) before `wait` is
    /// polled, for the reason the drain's watch is (see `ConnectionDriver::poll`).
    changes: watch::Receiver<u64>,
    /// Checks the chain at once and after every change; resolves when it fails.
    wait: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// `wait` has been polled once, so its waker is registered with the listener's watch.
    armed: bool,
}

impl Distrust {
    pub(in crate::listen) fn new(
        changes: watch::Receiver<u64>,
        wait: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Self {
            changes,
            wait: Box::pin(wait),
            armed: false,
        }
    }

    /// Whether the chain was found failing, polling `wait` only if a change came since.
    pub(super) fn failed(&mut self, cx: &mut Context<'_>) -> bool {
        if self.armed && !self.changes.has_changed().unwrap_or(false) {
            return false;
        }
        self.armed = true;
        // Marked seen before `wait` looks: a change after this is seen on the next poll.
        self.changes.mark_unchanged();
        self.wait.as_mut().poll(cx).is_ready()
    }
}
