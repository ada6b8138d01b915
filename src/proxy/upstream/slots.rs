//! The bound on connections open to one endpoint ([`Slots`]), idle or carrying a request.
//!
//! Without it a burst that finds no idle connection opens one per waiting request, each a full
//! TLS handshake, where a few connections would have kept up (docs/architecture.md, decisions,
//! links the measurement). At the bound a request waits for a connection to come
//! back to the idle list or to close, as behind HAProxy's `maxconn` on a server line: a burst
//! costs queueing, not handshakes. The wait is bounded by the request's upstream deadline.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// The connections open to one endpoint, and the wake-up of a request waiting for one.
pub(super) struct Slots {
    /// At most this many open at once; 0: no bound.
    limit: usize,
    open: AtomicUsize,
    /// Notified once for each connection that closes or comes back idle.
    pub(super) freed: Notify,
}

/// One open connection's place; dropping it (the connection closing) frees the place.
pub(super) struct Slot(Arc<Slots>);

impl Slots {
    pub(super) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            open: AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    /// A place for a new connection, when one is free.
    pub(super) fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.open.load(Ordering::Relaxed);
        loop {
            if self.limit != 0 && open >= self.limit {
                return None;
            }
            match self.open.compare_exchange_weak(
                open,
                open + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(Slot(self.clone())),
                Err(now) => open = now,
            }
        }
    }

    /// Whether a new connection would get a place now.
    pub(super) fn has_room(&self) -> bool {
        self.limit == 0 || self.open.load(Ordering::Relaxed) < self.limit
    }

    /// Connections open now.
    pub(super) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}
