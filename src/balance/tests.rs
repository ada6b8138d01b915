//! Picks and health under deterministic randomness and paused time.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, Instant};

use super::*;

/// An endpoint with a fixed load and availability.
#[derive(Clone, Copy, Debug)]
struct Fake {
    load: usize,
    up: bool,
}

impl Load for Fake {
    fn in_flight(&self) -> usize {
        self.load
    }
    fn is_available(&self, _now: Instant) -> bool {
        self.up
    }
    fn checks_passed(&self) -> bool {
        self.up
    }
}

fn up(load: usize) -> Fake {
    Fake { load, up: true }
}

const DOWN: Fake = Fake { load: 0, up: false };

fn tally(picker: &Picker, endpoints: &[Fake], exclude: &[usize], picks: usize) -> Vec<usize> {
    let now = Instant::now();
    let mut counts = vec![0; endpoints.len()];
    for _ in 0..picks {
        counts[picker.pick(endpoints, exclude, now).expect("an endpoint")] += 1;
    }
    counts
}

#[test]
fn policies_parse_and_say_what_they_accept() {
    assert_eq!("least_request".parse(), Ok(Policy::LeastRequest));
    assert_eq!("round_robin".parse(), Ok(Policy::RoundRobin));
    let err = "random".parse::<Policy>().expect_err("unknown").to_string();
    assert_eq!(
        err,
        "unknown balance policy `random`: expected \"least_request\" or \"round_robin\""
    );
}

#[test]
fn round_robin_spreads_evenly_within_one() {
    let picker = Picker::new(Policy::RoundRobin);
    for n in 1..=7 {
        let endpoints = vec![up(0); n];
        let counts = tally(&picker, &endpoints, &[], 1000);
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(
            max.zip(min).is_some_and(|(max, min)| max - min <= 1),
            "{n}: {counts:?}"
        );
    }
}

#[test]
fn round_robin_spreads_evenly_over_the_available_ones_only() {
    let picker = Picker::new(Policy::RoundRobin);
    let endpoints = [up(0), DOWN, up(0), up(0), DOWN];
    let counts = tally(&picker, &endpoints, &[], 999);
    assert_eq!(counts, [333, 0, 333, 333, 0]);
}

#[test]
fn least_request_never_picks_the_uniquely_busiest_of_several() {
    fastrand::seed(7);
    let picker = Picker::new(Policy::LeastRequest);
    let endpoints = [up(3), up(9), up(3), up(4)];
    let counts = tally(&picker, &endpoints, &[], 4000);
    assert_eq!(counts[1], 0, "{counts:?}");
    // The two least loaded share evenly; the third wins only against the busiest.
    assert!(counts[0].abs_diff(counts[2]) < 200, "{counts:?}");
    assert!(counts[3] < counts[0] / 2, "{counts:?}");
}

#[test]
fn least_request_spreads_equal_loads_evenly() {
    fastrand::seed(11);
    let picker = Picker::new(Policy::LeastRequest);
    let counts = tally(&picker, &[up(1); 3], &[], 30_000);
    assert!(
        counts.iter().all(|&c| c.abs_diff(10_000) < 500),
        "{counts:?}"
    );
}

/// Three endpoints, one of which takes ten times as long to answer: requests pile up on it, and
/// least_request sends it clearly fewer new ones.
#[test]
fn least_request_sends_clearly_fewer_requests_to_a_slow_endpoint() {
    fastrand::seed(3);
    let picker = Picker::new(Policy::LeastRequest);
    let latency = [1_usize, 10, 1]; // ticks to answer
    let mut endpoints = [up(0); 3];
    let mut pending: Vec<(usize, usize)> = Vec::new(); // (endpoint, tick it finishes)
    let mut picks = [0_usize; 3];
    let now = Instant::now();
    for tick in 0..3000 {
        pending.retain(|&(i, done)| {
            let keep = done > tick;
            if !keep {
                endpoints[i].load -= 1;
            }
            keep
        });
        for _ in 0..3 {
            let i = picker.pick(&endpoints, &[], now).expect("an endpoint");
            picks[i] += 1;
            endpoints[i].load += 1;
            pending.push((i, tick + latency[i]));
        }
    }
    assert!(picks[1] * 3 < picks[0].min(picks[2]), "{picks:?}");
}

#[test]
fn both_policies_skip_unavailable_and_excluded_endpoints() {
    fastrand::seed(5);
    for policy in [Policy::LeastRequest, Policy::RoundRobin] {
        let picker = Picker::new(policy);
        let endpoints = [up(0), DOWN, up(5), up(0)];
        let counts = tally(&picker, &endpoints, &[0], 300);
        assert_eq!((counts[0], counts[1]), (0, 0), "{policy:?}: {counts:?}");
        assert!(counts[3] > 0, "{policy:?}: {counts:?}");
        let counts = tally(&picker, &endpoints, &[0, 3], 10);
        assert_eq!(counts, [0, 0, 10, 0], "{policy:?}: the one left");
        let now = Instant::now();
        assert_eq!(picker.pick(&endpoints, &[0, 2, 3], now), None, "{policy:?}");
        assert_eq!(picker.pick(&[DOWN, DOWN], &[], now), None, "{policy:?}");
        assert_eq!(picker.pick::<Fake>(&[], &[], now), None, "{policy:?}");
    }
}

#[test]
fn picker_is_shareable_between_tasks() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Picker>();
    assert_send_sync::<Health>();
}

// ---- health ----

struct Checked {
    health: Health,
    load: AtomicUsize,
}

impl Load for Checked {
    fn in_flight(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }
    fn is_available(&self, now: Instant) -> bool {
        self.health.is_available(now)
    }
    fn checks_passed(&self) -> bool {
        self.health.checks_passed()
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_endpoint_receives_nothing_until_its_first_check_passes() {
    let now = Instant::now();
    let health = Health::new(3, 2);
    assert!(!health.is_available(now));
    assert_eq!(health.state(), "unhealthy");
    health.record_check(true);
    assert!(
        health.is_available(now),
        "one pass is enough for a new endpoint"
    );
    assert_eq!(health.state(), "healthy");

    let failing_first = Health::new(2, 2);
    failing_first.record_check(false);
    failing_first.record_check(true);
    assert!(
        !failing_first.is_available(now),
        "once failed, healthy_after applies"
    );
    failing_first.record_check(true);
    assert!(failing_first.is_available(now));

    assert!(Health::passive_only().is_available(now));
}

#[tokio::test(start_paused = true)]
async fn check_thresholds_need_consecutive_results() {
    let now = Instant::now();
    let health = Health::new(3, 2);
    health.record_check(true);
    health.record_check(false);
    health.record_check(true); // breaks the streak
    health.record_check(false);
    assert!(
        health.is_available(now),
        "one failure in a row is below unhealthy_after"
    );
    health.record_check(false);
    assert!(!health.is_available(now));
    assert_eq!(health.state(), "unhealthy");
    health.record_check(true);
    health.record_check(true);
    health.record_check(false); // breaks the streak
    health.record_check(true);
    health.record_check(true);
    assert!(
        !health.is_available(now),
        "two passes in a row are below healthy_after"
    );
    health.record_check(true);
    assert!(health.is_available(now));
}

#[tokio::test(start_paused = true)]
async fn passive_failures_eject_with_doubling_backoff_up_to_thirty_seconds() {
    let health = Health::passive_only();
    let mut expected = Vec::new();
    let mut observed = Vec::new();
    for backoff in [1, 2, 4, 8, 16, 30, 30] {
        let failed_at = Instant::now();
        health.record_passive_failure(failed_at);
        assert_eq!(health.state(), "ejected");
        let mut ejected_for = Duration::ZERO;
        while !health.is_available(failed_at + ejected_for) {
            ejected_for += Duration::from_millis(250);
        }
        expected.push(Duration::from_secs(backoff));
        observed.push(ejected_for);
        sleep(ejected_for).await;
        assert_eq!(
            health.state(),
            "healthy",
            "re-admitted when the backoff ends"
        );
    }
    assert_eq!(observed, expected);

    health.record_passive_success();
    let now = Instant::now();
    health.record_passive_failure(now);
    assert!(
        health.is_available(now + Duration::from_secs(1)),
        "a success resets the backoff"
    );
}

#[tokio::test(start_paused = true)]
async fn failures_of_requests_already_in_flight_do_not_extend_an_ejection() {
    let health = Health::passive_only();
    let start = Instant::now();
    health.record_passive_failure(start);
    for ms in [1, 10, 500, 999] {
        health.record_passive_failure(start + Duration::from_millis(ms));
    }
    assert!(health.is_available(start + Duration::from_secs(1)));
    // The next failure after re-admission doubles.
    let again = start + Duration::from_secs(1);
    health.record_passive_failure(again);
    assert!(!health.is_available(again + Duration::from_millis(1999)));
    assert!(health.is_available(again + Duration::from_secs(2)));
}

#[tokio::test(start_paused = true)]
async fn a_passing_check_lifts_an_ejection_and_a_failing_check_does_not() {
    let health = Health::new(1, 3);
    health.record_check(true);
    let now = Instant::now();
    health.record_passive_failure(now);
    health.record_check(false);
    assert!(!health.is_available(now));
    health.record_check(true);
    assert!(health.is_available(now));
}

#[tokio::test(start_paused = true)]
async fn the_picker_follows_health() {
    let endpoints: Vec<Checked> = (0..3)
        .map(|_| Checked {
            health: Health::new(1, 1),
            load: AtomicUsize::new(0),
        })
        .collect();
    let picker = Picker::new(Policy::LeastRequest);
    let now = Instant::now();
    assert_eq!(
        picker.pick(&endpoints, &[], now),
        None,
        "nothing checked yet"
    );
    endpoints[2].health.record_check(true);
    assert_eq!(picker.pick(&endpoints, &[], now), Some(2));
    endpoints[1].health.record_check(true);
    endpoints[2].health.record_passive_failure(now);
    assert_eq!(picker.pick(&endpoints, &[], now), Some(1));
    assert_eq!(picker.pick(&endpoints, &[1], now), None);
    assert_eq!(
        picker.pick(&endpoints, &[1], now + Duration::from_secs(1)),
        Some(2)
    );
}

#[tokio::test(start_paused = true)]
async fn run_checks_probes_every_interval_and_times_out_slow_probes() {
    let opts = HealthOptions {
        path: "/".to_owned(),
        interval: Duration::from_secs(2),
        timeout: Duration::from_secs(1),
        unhealthy_after: 2,
        healthy_after: 1,
    };
    let health = Arc::new(Health::new(opts.healthy_after, opts.unhealthy_after));
    let hang = Arc::new(AtomicBool::new(false));
    let probes = Arc::new(AtomicUsize::new(0));
    let checker = tokio::spawn(run_checks(Arc::clone(&health), opts, {
        let (hang, probes) = (Arc::clone(&hang), Arc::clone(&probes));
        move || {
            let (hang, probes) = (Arc::clone(&hang), Arc::clone(&probes));
            async move {
                probes.fetch_add(1, Ordering::Relaxed);
                if hang.load(Ordering::Relaxed) {
                    sleep(Duration::from_secs(60)).await;
                }
                true
            }
        }
    }));

    sleep(Duration::from_millis(1)).await;
    assert!(
        health.is_available(Instant::now()),
        "the first check runs at once"
    );
    assert_eq!(probes.load(Ordering::Relaxed), 1);

    // The endpoint stops answering: a probe that outlives its timeout fails.
    hang.store(true, Ordering::Relaxed);
    sleep(Duration::from_millis(2_000 + 1_001)).await; // check at 2 s times out at 3 s
    assert!(
        health.is_available(Instant::now()),
        "one failure is below unhealthy_after"
    );
    sleep(Duration::from_secs(2)).await; // check at 4 s times out at 5 s
    assert!(!health.is_available(Instant::now()));
    assert_eq!(health.state(), "unhealthy");

    hang.store(false, Ordering::Relaxed);
    sleep(Duration::from_secs(2)).await;
    assert!(
        health.is_available(Instant::now()),
        "re-admitted after healthy_after passes"
    );

    // The endpoint leaves the set: the checker notices it holds the last reference and ends.
    drop(health);
    tokio::time::timeout(Duration::from_secs(3), checker)
        .await
        .expect("the checker ends")
        .expect("no panic");
}

/// The scale bench's storm: `localhost` gave 127.0.0.1 (healthy, then ejected after failed
/// requests) and ::1 (nothing listening, never passed a check). With nothing available, the
/// request must go to the ejected one, however busy, not to the idle one that never answered.
#[tokio::test(start_paused = true)]
async fn with_nothing_available_an_ejected_endpoint_goes_before_one_never_checked_healthy() {
    let endpoints: Vec<Checked> = (0..3)
        .map(|_| Checked {
            health: Health::new(1, 1),
            load: AtomicUsize::new(0),
        })
        .collect();
    let now = Instant::now();
    endpoints[0].health.record_check(true);
    endpoints[0].health.record_passive_failure(now);
    endpoints[0].load.store(50, Ordering::Relaxed);
    endpoints[1].health.record_check(false);
    let picker = Picker::new(Policy::LeastRequest);
    assert_eq!(picker.pick(&endpoints, &[], now), None, "nothing available");
    for _ in 0..10 {
        assert_eq!(fallback(&endpoints, &[]), Some(0));
    }
    // Once it has been tried, the others are still a last resort, least loaded first.
    endpoints[2].load.store(1, Ordering::Relaxed);
    assert_eq!(fallback(&endpoints, &[0]), Some(1));
    assert_eq!(fallback(&endpoints, &[0, 1, 2]), None);
}
