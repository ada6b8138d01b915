//! Credentials that bcrypt already verified, so that a keep-alive client pays for bcrypt once
//! per file generation, not once per request.
//!
//! Keys are a 128-bit keyed hash of the length-prefixed user and the password, under a random
//! key drawn when the process starts and never stored: the cache holds neither a password nor a
//! plain (offline-guessable without the key) hash of one. It is bounded, and emptied whenever
//! the file changes; an entry computed against an older file generation is never inserted into
//! a newer one.
//!
//! The keyed hash is SipHash-2-4 with its 128-bit output, a pseudorandom function made for
//! short inputs, where HMAC-SHA-256 runs two SHA-256 compressions for every lookup, on every
//! authenticated request (the measurement: docs/architecture.md, decisions). A FIPS build keeps
//! HMAC-SHA-256 from the validated module, the approved algorithm for a keyed hash there.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

/// Entries kept at most; verified credentials are few (one per user and password), so this
/// only stops growth if a file holds very many users.
pub(crate) const CAPACITY: usize = 4096;

pub(crate) type Tag = u128;

pub(crate) struct Cache {
    key: Key,
    inner: Mutex<Inner>,
}

#[cfg(not(feature = "fips"))]
type Key = [u8; 16];
#[cfg(feature = "fips")]
type Key = aws_lc_rs::hmac::Key;

struct Inner {
    generation: u64,
    tags: HashSet<Tag, BuildHasherDefault<TagHasher>>,
}

/// A tag is already the output of a keyed pseudorandom function: its low 64 bits serve as the
/// set's hash as they are, without hashing it again.
#[derive(Default)]
struct TagHasher(u64);

impl Hasher for TagHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u128` tags are hashed (`write_u128`); any other input still hashes.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        // Truncation intended: the low half of a pseudorandom value.
        #[allow(clippy::cast_possible_truncation)]
        {
            self.0 = n as u64;
        }
    }
}

impl Cache {
    /// A cache with a fresh random key.
    pub(crate) fn new() -> Result<Self, aws_lc_rs::error::Unspecified> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        #[cfg(not(feature = "fips"))]
        let key = aws_lc_rs::rand::generate::<Key>(&rng)?.expose();
        #[cfg(feature = "fips")]
        let key = aws_lc_rs::hmac::Key::generate(aws_lc_rs::hmac::HMAC_SHA256, &rng)?;
        Ok(Self {
            key,
            inner: Mutex::new(Inner {
                generation: 0,
                tags: HashSet::default(),
            }),
        })
    }

    /// The tag of a user and password: length-prefixed, so that no two (user, password) pairs
    /// feed the same bytes.
    pub(crate) fn tag(&self, user: &str, password: &[u8]) -> Tag {
        #[cfg(not(feature = "fips"))]
        {
            use siphasher::sip128::Hasher128 as _;
            let mut h = siphasher::sip128::SipHasher24::new_with_key(&self.key);
            h.write(&(user.len() as u64).to_be_bytes());
            h.write(user.as_bytes());
            h.write(password);
            h.finish128().into()
        }
        #[cfg(feature = "fips")]
        {
            let mut ctx = aws_lc_rs::hmac::Context::with_key(&self.key);
            ctx.update(&(user.len() as u64).to_be_bytes());
            ctx.update(user.as_bytes());
            ctx.update(password);
            let mut out = [0u8; 16];
            out.copy_from_slice(&ctx.sign().as_ref()[..16]);
            u128::from_be_bytes(out)
        }
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
