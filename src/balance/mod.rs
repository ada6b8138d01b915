//! Picking an endpoint for a request, and the health state that decides which may be picked.
//!
//! What it owns: the two balancing policies of docs/reference.md (`least_request`, power of two choices
//! on in-flight requests, and `round_robin`) and, in [`health`], the per-endpoint state machine
//! fed by active checks and by the outcome of real requests.
//!
//! What it guarantees: [`Picker::pick`] returns only endpoints that are available now and not in
//! the caller's `exclude` list (the endpoints a retried request already tried), and `None` when
//! there is none, which the proxy answers with 503. It never blocks and never allocates.
//!
//! The endpoint type belongs to the caller; it only has to implement [`Load`].

pub(crate) mod health;
#[cfg(test)]
mod tests;

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::Instant;

pub(crate) use health::{run_checks, Health, HealthOptions};

/// What the picker needs to know about an endpoint.
pub trait Load {
    /// Requests sent to the endpoint and not yet answered.
    fn in_flight(&self) -> usize;
    /// Whether the endpoint may receive a request now (healthy and not ejected).
    fn is_available(&self, now: Instant) -> bool;
    /// Whether its active checks last passed, ejected or not (for [`fallback`]); true for an
    /// endpoint without active checks.
    fn checks_passed(&self) -> bool {
        true
    }
}

/// How to choose among available endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// Power of two choices: of two endpoints drawn at random, the one with fewer requests in
    /// flight. Nearly as good as scanning for the least loaded, without herding every proxy onto
    /// the same endpoint (Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing").
    #[default]
    LeastRequest,
    /// Each available endpoint in turn.
    RoundRobin,
}

impl FromStr for Policy {
    type Err = BalanceError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        match input {
            "least_request" => Ok(Self::LeastRequest),
            "round_robin" => Ok(Self::RoundRobin),
            other => Err(BalanceError::Policy(other.to_owned())),
        }
    }
}

/// Why a balancing setting does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BalanceError {
    #[error("unknown balance policy `{0}`: expected \"least_request\" or \"round_robin\"")]
    Policy(String),
}

/// Chooses endpoints for one upstream. Shared by every request of that upstream.
#[derive(Debug)]
pub struct Picker {
    policy: Policy,
    /// Round-robin position; wraps, which only shifts the rotation once.
    cursor: AtomicUsize,
}

impl Picker {
    #[must_use]
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            cursor: AtomicUsize::new(0),
        }
    }

    /// Picks among available endpoints, skipping the indices in `exclude` (already tried in this
    /// request). Returns an index into `endpoints`, or `None` when no endpoint qualifies.
    pub fn pick<L: Load>(&self, endpoints: &[L], exclude: &[usize], now: Instant) -> Option<usize> {
        let candidates = || {
            endpoints
                .iter()
                .enumerate()
                .filter(|(i, _)| !exclude.contains(i))
                .filter(move |(_, e)| e.is_available(now))
        };
        match self.policy {
            Policy::LeastRequest => least_request(candidates()),
            Policy::RoundRobin => {
                let count = candidates().count();
                if count == 0 {
                    return None;
                }
                let turn = self.cursor.fetch_add(1, Ordering::Relaxed) % count;
                // Availability may change between the two passes (another task records a
                // failure); then the last candidate still standing takes the turn.
                let mut last = None;
                for (n, (i, _)) in candidates().enumerate() {
                    if n == turn {
                        return Some(i);
                    }
                    last = Some(i);
                }
                last
            }
        }
    }
}

/// When [`Picker::pick`] finds no available endpoint (panic mode): the untried endpoint to try
/// anyway. Those whose active checks last passed (ejected after failed requests) come first:
/// they answered a probe lately, where one that never passed a check (nothing listening, as on
/// `::1` for a `localhost` name served on IPv4 only) can only fail. Least loaded among them.
pub(crate) fn fallback<L: Load>(endpoints: &[L], exclude: &[usize]) -> Option<usize> {
    endpoints
        .iter()
        .enumerate()
        .filter(|(i, _)| !exclude.contains(i))
        .min_by_key(|(_, e)| (!e.checks_passed(), e.in_flight()))
        .map(|(i, _)| i)
}

/// Power of two choices in one pass: a uniform random pair is kept by reservoir sampling
/// (Vitter's algorithm R with a reservoir of two), then the less loaded of the pair wins, ties
/// broken at random.
fn least_request<'a, L: Load + 'a>(
    candidates: impl Iterator<Item = (usize, &'a L)>,
) -> Option<usize> {
    let mut pair: [Option<(usize, &L)>; 2] = [None, None];
    for (seen, candidate) in candidates.enumerate() {
        match seen {
            0 | 1 => pair[seen] = Some(candidate),
            _ => {
                let slot = fastrand::usize(0..=seen);
                if slot < 2 {
                    pair[slot] = Some(candidate);
                }
            }
        }
    }
    match pair {
        [None, _] => None,
        [Some((i, _)), None] => Some(i),
        [Some((a, ea)), Some((b, eb))] => {
            let (la, lb) = (ea.in_flight(), eb.in_flight());
            if la < lb || (la == lb && fastrand::bool()) {
                Some(a)
            } else {
                Some(b)
            }
        }
    }
}
