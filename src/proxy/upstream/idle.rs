//! The idle connections of one endpoint ([`Idle`]): the most recently used handed out first,
//! closed ones skipped, and those idle for [`IDLE_TIMEOUT`] or past [`MAX_IDLE`] dropped.

use super::connection::{Connection, READ_SIZE};
use super::slots::Slots;
use super::IDLE_TIMEOUT;
use bytes::BytesMut;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// Idle connections kept per endpoint; more are closed when they come back.
const MAX_IDLE: usize = 256;

/// The idle connections of one endpoint.
pub(super) struct Idle {
    pub(super) conns: Mutex<VecDeque<(Box<Connection>, Instant)>>,
    /// The endpoint's bound on open connections: a connection put back wakes a request
    /// waiting for one.
    pub(super) slots: Arc<Slots>,
}

impl Idle {
    pub(super) fn new(slots: Arc<Slots>) -> Self {
        Self {
            conns: Mutex::new(VecDeque::new()),
            slots,
        }
    }

    /// The most recently used connection that can carry a request; closed and expired ones
    /// are dropped on the way.
    pub(super) fn take(&self) -> Option<Box<Connection>> {
        let mut conns = self.conns.lock().ok()?;
        let now = Instant::now();
        while let Some((mut conn, since)) = conns.pop_back() {
            if now.duration_since(since) < IDLE_TIMEOUT && conn.is_reusable() {
                return Some(conn);
            }
            // Closed, expired, or it sent something unasked: dropping it closes it.
        }
        None
    }

    /// Whether any connection is in the list (usable or not: `take` decides).
    pub(super) fn has_any(&self) -> bool {
        self.conns.lock().is_ok_and(|c| !c.is_empty())
    }

    /// Drops the connections idle for [`IDLE_TIMEOUT`] or longer (the oldest are first).
    pub(super) fn close_expired(&self) {
        if let Ok(mut conns) = self.conns.lock() {
            expire(&mut conns, Instant::now());
        }
    }

    pub(super) fn put(&self, mut conn: Box<Connection>) {
        if !conn.buf.is_empty() {
            return;
        }
        // A long body's read buffer is not kept by an idle connection.
        if conn.buf.capacity() > READ_SIZE {
            conn.buf = BytesMut::new();
        }
        let Ok(mut conns) = self.conns.lock() else {
            return;
        };
        let now = Instant::now();
        expire(&mut conns, now);
        if conns.len() < MAX_IDLE {
            conns.push_back((conn, now));
            drop(conns);
            self.slots.freed.notify_one();
        }
    }
}

/// Drops the connections of `conns` (oldest first) idle for [`IDLE_TIMEOUT`] or longer.
fn expire(conns: &mut VecDeque<(Box<Connection>, Instant)>, now: Instant) {
    while conns
        .front()
        .is_some_and(|(_, since)| now.duration_since(*since) >= IDLE_TIMEOUT)
    {
        conns.pop_front();
    }
}
