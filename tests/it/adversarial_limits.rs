//! Adversarial limits (issue 5, item 1): oversized heads, header counts and URIs, bodies over
//! `max_body_bytes`, slow and stalled clients cut by `request_head_timeout`, `body_timeout` and
//! `idle_timeout`, and a flood of 2,000 connections. After every case the proxy still serves a
//! normal request and the upstream (behind a byte tap) got exactly what the client
//! legitimately sent.
//!
//! Real time: every timeout here is a second or a few, every wait polls with a deadline, every
//! loop is bounded in count and time.

use crate::support;
use crate::support::adversary;

use adversary::{Rig, Target, ALL};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Scheduling slack on a loaded two-core machine.
/// How far past a timeout a cut may come before the test calls it a hang ([`support::HANG`]:
/// the exact deadlines are the paused-clock tests').
const SLACK: Duration = support::HANG;

fn rig() -> Rig {
    Rig::new(|b| {
        b.limit("max_body_bytes", "1048576")
            .limit_dur("request_head_timeout", "2s")
            .limit_dur("body_timeout", "3s")
            .limit_dur("idle_timeout", "2s")
    })
}

/// Sends `raw` (the proxy may close early: write errors are ignored) and returns the statuses
/// seen and whether the connection closed.
fn send_and_read(rig: &Rig, t: Target, raw: &[u8]) -> (Vec<u16>, bool) {
    let seen = rig.exchange(t, raw, Duration::from_secs(2));
    (seen.statuses, seen.closed)
}

fn assert_nothing_reached(rig: &Rig, mark: &[usize], what: &str) {
    let r = rig.reached_since(mark);
    assert!(
        r.requests.is_empty() && r.partial == 0 && r.errors.is_empty(),
        "{what}: the upstream must get nothing, got {:?} (partial {}, errors {:?})",
        r.requests
            .iter()
            .map(|w| format!("{} {}", w.method, w.target))
            .collect::<Vec<_>>(),
        r.partial,
        r.errors
    );
}

fn normal(rig: &Rig, t: Target) {
    rig.normal_request(t)
        .unwrap_or_else(|e| panic!("after the case: {e}"));
}

#[test]
fn oversized_heads_are_refused_and_big_legitimate_ones_pass() {
    let rig = rig();
    let huge_block: String = (0..64)
        .map(|i| format!("X-Big-{i}: {}\r\n", "b".repeat(16 * 1024)))
        .collect();
    let many_fields: String = (0..10_000).map(|i| format!("x{i}:y\r\n")).collect();
    let cases: Vec<(&str, String)> = vec![
        (
            "100 KiB header block (over header_bytes, 64 KiB)",
            format!(
                "GET /big HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
                "b".repeat(100 * 1024)
            ),
        ),
        (
            "1 MiB header block",
            format!("GET /big HTTP/1.1\r\nHost: x\r\n{huge_block}\r\n"),
        ),
        (
            "10,000 header fields",
            format!("GET /many HTTP/1.1\r\nHost: x\r\n{many_fields}\r\n"),
        ),
        (
            "128 KiB URI",
            format!(
                "GET /{} HTTP/1.1\r\nHost: x\r\n\r\n",
                "u".repeat(128 * 1024)
            ),
        ),
    ];
    for t in ALL {
        for (name, raw) in &cases {
            let mark = rig.tap.mark();
            let (statuses, closed) = send_and_read(&rig, t, raw.as_bytes());
            // 431 (RFC 6585 §5) or 414 for the URI (RFC 9110 §15.5.15), then close; a reset
            // before the client read the answer is also acceptable: the proxy stopped reading.
            assert!(
                (statuses.is_empty() || statuses == [431] || statuses == [414]) && closed,
                "[{t:?}] {name}: got {statuses:?}, closed {closed}"
            );
            assert_nothing_reached(&rig, &mark, name);
            normal(&rig, t);
            eprintln!("[{t:?}] {name}: {statuses:?}, closed");
        }
    }

    // 24 KiB of headers and a 4 KiB URI are fine, and arrive intact.
    let uri = format!("/long/{}", "p".repeat(4 * 1024));
    let fields: Vec<(String, String)> = (0..24)
        .map(|i| (format!("X-Pad-{i}"), format!("{i:02}{}", "v".repeat(1022))))
        .collect();
    for t in ALL {
        let mark = rig.tap.mark();
        let mut raw = format!("GET {uri} HTTP/1.1\r\nHost: x\r\n");
        for (n, v) in &fields {
            raw.push_str(&format!("{n}: {v}\r\n"));
        }
        raw.push_str("\r\n");
        let seen = rig.exchange(t, raw.as_bytes(), Duration::from_millis(500));
        assert_eq!(seen.statuses, [200], "[{t:?}] 24 KiB of headers");
        let r = rig.reached_since(&mark);
        assert_eq!(r.requests.len(), 1, "[{t:?}]");
        assert_eq!(r.requests[0].target, uri);
        for (n, v) in &fields {
            assert_eq!(
                r.requests[0].all(&n.to_ascii_lowercase()),
                [v.as_str()],
                "[{t:?}] {n}"
            );
        }
    }
    assert!(adversary::alive(&rig.proxy));
}

#[test]
fn bodies_over_max_body_bytes_get_413() {
    let rig = rig();
    let over = 2 * 1024 * 1024;
    for t in ALL {
        // Known length over the limit: refused from the head alone, before any upstream contact
        // and without waiting for the body.
        let mark = rig.tap.mark();
        let started = Instant::now();
        let (statuses, _) = send_and_read(
            &rig,
            t,
            format!("POST /cl HTTP/1.1\r\nHost: x\r\nContent-Length: {over}\r\n\r\nsome")
                .as_bytes(),
        );
        assert_eq!(statuses, [413], "[{t:?}] Content-Length over the limit");
        assert!(started.elapsed() < Duration::from_secs(2), "413 at once");
        assert_nothing_reached(&rig, &mark, "Content-Length over the limit");
        normal(&rig, t);

        // Chunked over the limit: cut at the limit with 413. Its first 64 KiB may already be on
        // the way upstream (bodies that large are streamed), but never a complete request.
        let mark = rig.tap.mark();
        let mut raw =
            b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let chunk = vec![b'z'; 64 * 1024];
        for _ in 0..(over / chunk.len()) {
            raw.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            raw.extend_from_slice(&chunk);
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"0\r\n\r\n");
        // The client is still sending when the 413 goes out: the proxy reads and drops the rest
        // before it closes (lingering close), so the 413 is never lost to a reset.
        let (statuses, _) = send_and_read(&rig, t, &raw);
        assert_eq!(statuses, [413], "[{t:?}] chunked over the limit");
        let r = rig.reached_since(&mark);
        assert!(
            r.requests.is_empty() && r.errors.is_empty(),
            "[{t:?}] no complete request upstream: {:?}",
            r.requests.iter().map(|w| w.body.len()).collect::<Vec<_>>()
        );
        normal(&rig, t);

        // Just under the limit, both ways: served, complete.
        let mark = rig.tap.mark();
        let body = vec![b'k'; 1024 * 1024];
        let mut raw = format!(
            "POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        raw.extend_from_slice(&body);
        let seen = rig.exchange(t, &raw, Duration::from_millis(500));
        assert_eq!(seen.statuses, [200], "[{t:?}] 1 MiB body");
        let r = rig.reached_since(&mark);
        assert_eq!(r.requests.len(), 1);
        assert_eq!(r.requests[0].body, body);
    }
    let m = rig.proxy.metrics();
    eprintln!(
        "413s counted: {:?}",
        support::metric(&m, "ironic_proxy_requests_total", &[("class", "4xx")])
    );
    assert!(adversary::alive(&rig.proxy));
}

/// A connection that writes `head` one byte every `every` and returns when the proxy closed it
/// (or `limit` passed): (time to close, bytes the proxy sent). The time counts from before the
/// connection is opened, so it is never shorter than the proxy's own count from accept.
fn trickle(
    rig: &Rig,
    t: Target,
    prefix: &[u8],
    trickle: &[u8],
    every: Duration,
    limit: Duration,
) -> (Option<Duration>, Vec<u8>) {
    let started = Instant::now();
    rig.with_conn(t, |c| {
        let _ = c.send_raw(prefix);
        for b in trickle.iter().cycle() {
            if started.elapsed() > limit {
                return (None, Vec::new());
            }
            if c.send_raw(&[*b]).is_err() {
                break;
            }
            // Anything back, or a close, ends the trickle.
            let (bytes, closed) = c.drain_for(every);
            if closed || !bytes.is_empty() {
                let (more, _) = c.drain_for(Duration::from_millis(200));
                return (Some(started.elapsed()), [bytes, more].concat());
            }
        }
        let (bytes, _) = c.drain_for(Duration::from_millis(500));
        (Some(started.elapsed()), bytes)
    })
}

#[test]
fn slowloris_heads_are_cut_by_request_head_timeout() {
    let rig = rig();
    for t in ALL {
        let mark = rig.tap.mark();
        // A head that never ends: one header byte every 200 ms.
        let (closed_after, bytes) = trickle(
            &rig,
            t,
            b"GET /slow HTTP/1.1\r\nHost: x\r\n",
            b"X-Slow: aaaa\r\n",
            Duration::from_millis(200),
            Duration::from_secs(3) + SLACK,
        );
        let took = closed_after.unwrap_or_else(|| panic!("[{t:?}] slowloris never cut"));
        assert!(
            took >= Duration::from_millis(1800) && took < Duration::from_secs(2) + SLACK,
            "[{t:?}] cut after {took:?}, request_head_timeout is 2s"
        );
        // RFC 9110 §15.5.9 lets a server close an idle connection without a 408.
        let st = adversary::statuses(&bytes);
        assert!(st.is_empty() || st == [408], "[{t:?}] {st:?}");
        assert_nothing_reached(&rig, &mark, "slowloris");
        normal(&rig, t);

        // The next head on a keep-alive connection gets the same deadline from its first byte.
        let mark = rig.tap.mark();
        let took = rig.with_conn(t, |c| {
            assert_eq!(c.get_path("/first").expect("first").0, 200);
            // Exercised: the connection idles before the next head starts.
            std::thread::sleep(Duration::from_millis(500));
            let started = Instant::now();
            let _ = c.send_raw(b"GET /second HTTP/1.1\r\n");
            // Up to 75 rounds of at least 200 ms: past 2 s + SLACK.
            for _ in 0..75 {
                if c.send_raw(b"X").is_err() {
                    break;
                }
                let (b, closed) = c.drain_for(Duration::from_millis(200));
                assert!(b.is_empty(), "no answer to an unfinished head");
                if closed {
                    break;
                }
            }
            started.elapsed()
        });
        assert!(
            took >= Duration::from_millis(1800) && took < Duration::from_secs(2) + SLACK,
            "[{t:?}] second head cut after {took:?}"
        );
        let r = rig.reached_since(&mark);
        assert_eq!(
            r.requests
                .iter()
                .map(|w| w.target.as_str())
                .collect::<Vec<_>>(),
            ["/first"]
        );
    }
    assert!(adversary::alive(&rig.proxy));
}

#[test]
fn stalled_and_trickled_bodies_are_cut_by_body_timeout() {
    let rig = rig();
    for t in ALL {
        // Stalled: 10 of 100 bytes, then nothing.
        let mark = rig.tap.mark();
        let started = Instant::now();
        let seen = rig.with_conn(t, |c| {
            let _ = c.send_raw(
                b"POST /stalled HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
            );
            c.drain_for(Duration::from_secs(4) + SLACK)
        });
        let took = started.elapsed();
        assert_eq!(adversary::statuses(&seen.0), [408], "[{t:?}] stalled body");
        assert!(
            took < Duration::from_secs(3) + SLACK,
            "[{t:?}] 408 after {took:?}"
        );
        assert_nothing_reached(&rig, &mark, "stalled body");
        normal(&rig, t);

        // A 1 byte/s trickle, known length and chunked: the whole body must arrive within
        // body_timeout (3 s), however steadily it trickles.
        for (name, head) in [
            (
                "Content-Length",
                "POST /trickle HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
            ),
            (
                "chunked",
                "POST /trickle HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n",
            ),
        ] {
            let mark = rig.tap.mark();
            let (after, bytes) = trickle(
                &rig,
                t,
                head.as_bytes(),
                b"t",
                Duration::from_secs(1),
                Duration::from_secs(4) + SLACK,
            );
            let after = after.unwrap_or_else(|| panic!("[{t:?}] {name} trickle never cut"));
            assert_eq!(adversary::statuses(&bytes), [408], "[{t:?}] {name} trickle");
            assert!(
                after >= Duration::from_millis(2800) && after < Duration::from_secs(3) + SLACK,
                "[{t:?}] {name} trickle cut after {after:?}, body_timeout is 3s"
            );
            assert_nothing_reached(&rig, &mark, "trickled body");
            normal(&rig, t);
        }
    }
    assert!(adversary::alive(&rig.proxy));
}

#[test]
fn idle_connections_are_closed() {
    let rig = rig();
    for t in ALL {
        // Idle after a request: idle_timeout (2 s).
        let took = rig.with_conn(t, |c| {
            // Timed from before the request: the idle clock starts when the answer is written.
            let started = Instant::now();
            assert_eq!(c.get_path("/once").expect("request").0, 200);
            let (b, closed) = c.drain_for(Duration::from_secs(3) + SLACK);
            assert!(
                b.is_empty() && closed,
                "[{t:?}] idle connection must close silently"
            );
            started.elapsed()
        });
        assert!(
            took >= Duration::from_millis(1800) && took < Duration::from_secs(2) + SLACK,
            "[{t:?}] idle keep-alive closed after {took:?}, idle_timeout is 2s"
        );
        // Never a byte after connecting (after the handshake on TLS): request_head_timeout.
        let took = rig.with_conn(t, |c| {
            let started = Instant::now();
            let (b, closed) = c.drain_for(Duration::from_secs(3) + SLACK);
            assert!(
                b.is_empty() && closed,
                "[{t:?}] silent connection must close"
            );
            started.elapsed()
        });
        assert!(
            took < Duration::from_secs(2) + SLACK,
            "[{t:?}] silent connection closed after {took:?}"
        );
        normal(&rig, t);
    }
}

/// Opens up to `n` TCP connections to `addr` as fast as it can (bounded by `within`); returns
/// those that connected.
fn flood(addr: std::net::SocketAddr, n: usize, within: Duration) -> Vec<TcpStream> {
    let started = Instant::now();
    let mut held = Vec::with_capacity(n);
    while held.len() < n && started.elapsed() < within {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            held.push(s);
        }
    }
    held
}

/// The two flood tests open 2,000 connections each; one at a time, so neither slows the other.
static FLOOD: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_flood_of_2000_connections_does_not_stop_normal_requests() {
    let _one_flood_at_a_time = FLOOD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // max_connections (10,000 by default) above the flood: every flood connection is accepted
    // and held until request_head_timeout; normal requests are served meanwhile.
    let rig = Rig::new(|b| b.limit_dur("request_head_timeout", "20s"));
    let started = Instant::now();
    let held = flood(rig.addr(Target::Plain), 2000, Duration::from_secs(20));
    let opened = started.elapsed();
    assert_eq!(held.len(), 2000, "2,000 connections opened");
    let active = support::poll_until(Duration::from_secs(10), || {
        let v = rig
            .proxy
            .metric("ironic_proxy_active_connections", &[("listener", "plain")]);
        (v >= 2000.0).then_some(v)
    })
    .expect("the proxy holds all 2,000 connections");
    let t = Instant::now();
    for target in ALL {
        rig.normal_request(target)
            .unwrap_or_else(|e| panic!("during the flood: {e}"));
    }
    let served_in = t.elapsed();
    eprintln!(
        "flood: 2,000 connections opened in {opened:?}, {active} active; normal requests on \
         three listeners served in {served_in:?}"
    );
    drop(held);
    let after = support::poll_until(Duration::from_secs(10), || {
        let v = rig
            .proxy
            .metric("ironic_proxy_active_connections", &[("listener", "plain")]);
        (v <= 1.0).then_some(v)
    });
    assert!(after.is_some(), "connections released after the flood");
    assert_eq!(
        rig.proxy
            .metric("ironic_proxy_rejected_connections_total", &[]),
        0.0
    );
    assert!(adversary::alive(&rig.proxy));
}

#[test]
fn a_flood_over_max_connections_is_counted_and_normal_requests_pass_after_it() {
    // max_connections 500 under a flood of 2,000 silent connections (request_head_timeout is
    // long here, so the proxy holds the first 500 for the whole test): the 1,500 others are
    // closed at once and counted; while the 500 are held the listener refuses more (other
    // listeners have their own limit); once the flooding client closes them, a normal request
    // gets through at once. (That the proxy itself cuts silent connections at
    // request_head_timeout is `idle_connections_are_closed`.)
    let _one_flood_at_a_time = FLOOD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let rig = Rig::new(|b| {
        b.limit("max_connections", "500")
            .limit_dur("request_head_timeout", "60s")
    });
    let addr = rig.addr(Target::Plain);
    let started = Instant::now();
    let held = flood(addr, 2000, Duration::from_secs(30));
    let flood_done = started.elapsed();
    assert_eq!(held.len(), 2000, "2,000 connections opened");
    let rejected = support::poll_until(Duration::from_secs(5), || {
        let v = rig.proxy.metric(
            "ironic_proxy_rejected_connections_total",
            &[("listener", "plain")],
        );
        (v >= 1500.0).then_some(v)
    });
    assert_eq!(
        rejected,
        Some(1500.0),
        "every connection over the limit counted"
    );
    let active = rig
        .proxy
        .metric("ironic_proxy_active_connections", &[("listener", "plain")]);
    assert_eq!(active, 500.0, "the first 500 are held");
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let _ = c.write_all(b"GET /during HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = [0u8; 64];
    let got = c.read(&mut buf).unwrap_or(0);
    assert_eq!(got, 0, "refused while at max_connections");
    rig.normal_request(Target::Server)
        .unwrap_or_else(|e| panic!("another listener during the flood: {e}"));
    let closed_at = Instant::now();
    drop(held);
    let back = support::poll_until(Duration::from_secs(10), || {
        rig.normal_request(Target::Plain)
            .ok()
            .map(|()| closed_at.elapsed())
    })
    .expect("a normal request gets through once the flood's connections close");
    eprintln!(
        "flood over max_connections=500: 2,000 opened in {flood_done:?}; {rejected:?} rejected \
         and counted, 500 held; a new connection was refused meanwhile; normal request served \
         {back:?} after the flood closed its sockets"
    );
    assert!(
        back < Duration::from_secs(2),
        "served again at once: {back:?}"
    );
    assert!(adversary::alive(&rig.proxy));
}

#[test]
fn a_client_that_stops_reading_is_cut_after_idle_timeout() {
    // Slow read: the client asks for 8 MiB and never reads, so the proxy's writes stall (and,
    // behind them, the upstream connection the body comes from). Other clients are served
    // meanwhile, and the proxy gives up on the stalled one after idle_timeout (2 s) without
    // progress instead of holding it, and an upstream connection, forever.
    let rig = rig();
    for t in ALL {
        let listener = t.listener();
        let base = rig
            .proxy
            .metric("ironic_proxy_active_connections", &[("listener", listener)]);
        let started = Instant::now();
        let seen = rig.with_conn(t, |c| {
            let asked = rig.up.all().len();
            c.send_raw(b"GET /big?size=8388608 HTTP/1.1\r\nHost: x\r\n\r\n")
                .expect("send");
            support::poll_until(Duration::from_secs(5), || {
                (rig.up.all().len() > asked).then_some(())
            })
            .expect("the big request reached the upstream");
            rig.normal_request(t)
                .unwrap_or_else(|e| panic!("[{t:?}] while another client does not read: {e}"));
            let released = support::poll_until(Duration::from_secs(10), || {
                let v = rig
                    .proxy
                    .metric("ironic_proxy_active_connections", &[("listener", listener)]);
                (v <= base).then(|| started.elapsed())
            });
            // Now read what there is: never the whole body.
            let (bytes, closed) = c.drain_for(Duration::from_secs(3));
            (released, bytes.len(), closed)
        });
        let (released, got, closed) = seen;
        let released =
            released.unwrap_or_else(|| panic!("[{t:?}] the stalled connection was never released"));
        eprintln!("[{t:?}] stalled reader released after {released:?}; it got {got} bytes");
        assert!(
            released < Duration::from_secs(2) + Duration::from_secs(3),
            "[{t:?}] released after {released:?}"
        );
        assert!(
            closed && got < 8 * 1024 * 1024,
            "[{t:?}] cut, not completed"
        );
        rig.normal_request(t).expect("normal request afterwards");
    }
    assert!(adversary::alive(&rig.proxy));
}
