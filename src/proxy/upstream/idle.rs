//! The idle connections of one endpoint ([`Idle`]): the most recently used handed out first,
//! closed ones skipped, and those idle for as long as the upstream allows
//! ([`Connection::keep_for`], by default [`super::IDLE_TIMEOUT`]) or past [`MAX_IDLE`] dropped.
//!
//! Over TLS, a connection made with an identity generation older than the current one (our
//! certificate was renewed, or the trust changed, since its handshake) is never handed out
//! again: it is dropped when it comes back, when a request looks for one, and at the
//! endpoint's once-a-second sweep. A request in flight on it finishes. So after a renewal the
//! next request handshakes with the new certificate; an atomic load per checkout is the cost.

use super::connection::{Connection, READ_SIZE};
use super::slots::Slots;
use crate::tls::peer::PeerTls;
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
    /// The endpoint's TLS, whose generation a connection must have to be used.
    tls: Option<PeerTls>,
}

impl Idle {
    pub(super) fn new(slots: Arc<Slots>, tls: Option<PeerTls>) -> Self {
        Self {
            conns: Mutex::new(VecDeque::new()),
            slots,
            tls,
        }
    }

    /// The identity generation a connection must have been made with to carry a request.
    fn generation(&self) -> u64 {
        self.tls.as_ref().map_or(0, PeerTls::generation)
    }

    /// The most recently used connection that can carry a request; closed, expired and
    /// outdated ones are dropped on the way.
    pub(super) fn take(&self) -> Option<Box<Connection>> {
        let current = self.generation();
        let mut conns = self.conns.lock().ok()?;
        let now = Instant::now();
        while let Some((mut conn, since)) = conns.pop_back() {
            if now.duration_since(since) < conn.keep_for
                && conn.generation == current
                && conn.is_reusable()
            {
                return Some(conn);
            }
            // Closed, expired, made with a replaced certificate, or it sent something
            // unasked: dropping it closes it.
        }
        None
    }

    /// Whether any connection is in the list (usable or not: `take` decides).
    pub(super) fn has_any(&self) -> bool {
        self.conns.lock().is_ok_and(|c| !c.is_empty())
    }

    /// Drops the connections idle for as long as they may be, and those made with a replaced
    /// certificate.
    pub(super) fn close_expired(&self) {
        let current = self.generation();
        if let Ok(mut conns) = self.conns.lock() {
            let now = Instant::now();
            conns.retain(|(conn, since)| {
                conn.generation == current && now.duration_since(*since) < conn.keep_for
            });
        }
    }

    pub(super) fn put(&self, mut conn: Box<Connection>) {
        if !conn.buf.is_empty() || conn.generation != self.generation() {
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

/// Drops the oldest connections of `conns` while they have been idle for as long as they may
/// be. Cheap enough for every `put`; one that may stay longer than an older one behind it
/// shields that one until `take` or the once-a-second `close_expired` reaches it.
fn expire(conns: &mut VecDeque<(Box<Connection>, Instant)>, now: Instant) {
    while conns
        .front()
        .is_some_and(|(conn, since)| now.duration_since(*since) >= conn.keep_for)
    {
        conns.pop_front();
    }
}
