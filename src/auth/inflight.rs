//! Verifications in flight, shared: requests that carry the same credentials while bcrypt checks
//! them wait for that one answer instead of each running bcrypt and taking a slot of the bounded
//! queue ([`super::Limiter`]).
//!
//! Why: clients start together (64 connections of one tool, conductors after a restart), all
//! with the credential that is not cached yet. Each running its own bcrypt costs 64 times the CPU
//! and, past the queue's 33 places, answers 503 to a client whose password is right. The same
//! holds for a flood repeating one wrong password. Requests with different credentials are not
//! affected: each still verifies on its own.
//!
//! Keyed by file generation and the credential's cache tag (see [`super::cache`]: a keyed hash, never
//! the password). An entry lives while its leader does: at most one per verification slot or
//! queue place, so the map stays as small as the queue. A leader that ends without an answer
//! (queue full, client gone) releases its followers with no answer; they answer 503 as a full
//! queue would.

use super::cache::Tag;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::watch;

type Key = (u64, Tag);

#[derive(Default)]
pub(crate) struct InFlight {
    waiting: Mutex<HashMap<Key, watch::Receiver<Option<bool>>>>,
}

/// What a request does about a credential.
pub(crate) enum Turn<'a> {
    /// Verify it, then [`Leader::finish`].
    Lead(Leader<'a>),
    /// Wait for the leader's answer with [`answer`].
    Follow(watch::Receiver<Option<bool>>),
}

impl InFlight {
    pub(crate) fn join(&self, generation: u64, tag: Tag) -> Turn<'_> {
        let key = (generation, tag);
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rx) = waiting.get(&key) {
            return Turn::Follow(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        waiting.insert(key, rx);
        Turn::Lead(Leader {
            owner: self,
            key,
            tx,
        })
    }

    /// No verification in flight (tests).
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        self.waiting.lock().map_or(true, |w| w.is_empty())
    }
}

/// The request that verifies; its entry goes when it does, answered or not.
pub(crate) struct Leader<'a> {
    owner: &'a InFlight,
    key: Key,
    tx: watch::Sender<Option<bool>>,
}

impl Leader<'_> {
    /// Gives every follower the verification's result.
    pub(crate) fn finish(self, verified: bool) {
        self.tx.send_replace(Some(verified));
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut waiting = self.owner.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.remove(&self.key);
    }
}

/// The leader's result; `None` if it ended without one.
pub(crate) async fn answer(mut rx: watch::Receiver<Option<bool>>) -> Option<bool> {
    rx.wait_for(Option::is_some).await.ok().and_then(|v| *v)
}
