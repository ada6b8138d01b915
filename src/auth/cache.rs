//! Credentials that bcrypt already verified, so that a keep-alive client pays for bcrypt once
//! per file generation, not once per request.
//!
//! Keys are HMAC-SHA-256 of the length-prefixed user and the password under a random key drawn when the process
//! starts and never stored: the cache holds neither a password nor a plain (offline-guessable
//! without the key) hash of one. It is bounded, and emptied whenever the file changes; an entry
//! computed against an older file generation is never inserted into a newer one.

use aws_lc_rs::hmac;
use std::collections::HashSet;
use std::sync::Mutex;

/// Entries kept at most; verified credentials are few (one per user and password), so this
/// only stops growth if a file holds very many users.
pub(crate) const CAPACITY: usize = 4096;

pub(crate) type Tag = [u8; 32];

pub(crate) struct Cache {
    key: hmac::Key,
    inner: Mutex<Inner>,
}

struct Inner {
    generation: u64,
    tags: HashSet<Tag>,
}

impl Cache {
    /// A cache with a fresh random key.
    pub(crate) fn new() -> Result<Self, aws_lc_rs::error::Unspecified> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)?;
        Ok(Self {
            key,
            inner: Mutex::new(Inner {
                generation: 0,
                tags: HashSet::new(),
            }),
        })
    }

    pub(crate) fn tag(&self, user: &str, password: &[u8]) -> Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        // Length-prefixed, so that no two (user, password) pairs feed the same bytes.
        ctx.update(&(user.len() as u64).to_be_bytes());
        ctx.update(user.as_bytes());
        ctx.update(password);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    /// True when `tag` was verified under file generation `generation`.
    pub(crate) fn contains(&self, generation: u64, tag: &Tag) -> bool {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.generation == generation && inner.tags.contains(tag)
    }

    /// Records a verification made against `generation`; ignored if the file changed since.
    pub(crate) fn insert(&self, generation: u64, tag: Tag) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if inner.generation != generation {
            return;
        }
        if inner.tags.len() >= CAPACITY {
            // Any entry: it is re-verified (once) if it comes back.
            if let Some(old) = inner.tags.iter().next().copied() {
                inner.tags.remove(&old);
            }
        }
        inner.tags.insert(tag);
    }

    /// A new file generation: every entry is dropped.
    pub(crate) fn reset(&self, generation: u64) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.generation = generation;
        inner.tags.clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .tags
            .len()
    }
}
