//! A restart without a refused connection (issue 62: the balancer restarted during an agent's
//! first lookup; IPA gives up when its first call is refused). With `limits.handover`, a second
//! process on the same configuration binds the same addresses while the first still serves,
//! takes every new connection from its `listen` on, and the first stops (SIGTERM) without a
//! connection refused or reset: a client opening one connection per request all along sees every
//! request answered. Without the setting, the second process cannot bind (what the balancer did
//! before: stop, then start, and refuse in between).
//!
//! Real processes; every wait is for an event (a log line, an access-log count, an exit),
//! bounded; the client's loop is bounded by a request count.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use support::{HttpConn, Proxy, Sandbox, Tls, Upstream, HANG};

/// At most this many requests: the loop ends here even if the test's events never come.
const MAX_REQUESTS: usize = 200_000;

/// One request per connection, until `stop`: counts the answered ones and keeps every failure.
struct Client {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    fn start(addr: std::net::SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let (s, a, f) = (stop.clone(), answered.clone(), failures.clone());
        let thread = std::thread::spawn(move || {
            for i in 0..MAX_REQUESTS {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let outcome = HttpConn::tcp(addr).and_then(|mut c| c.get(&format!("/r{i}")));
                match outcome {
                    Ok(r) if r.status == 200 => {
                        a.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(r) => f
                        .lock()
                        .unwrap()
                        .push(format!("request {i}: status {}", r.status)),
                    Err(e) => f.lock().unwrap().push(format!("request {i}: {e}")),
                }
            }
        });
        Self {
            stop,
            answered,
            failures,
            thread: Some(thread),
        }
    }

    /// Waits until `n` more requests than now have been answered (or a failure happened).
    fn wait_more(&self, n: usize) {
        let target = self.answered.load(Ordering::SeqCst) + n;
        let got = support::poll_until(HANG, || {
            (self.answered.load(Ordering::SeqCst) >= target || !self.failures().is_empty())
                .then_some(())
        });
        assert!(
            got.is_some(),
            "the client's requests stopped being answered"
        );
    }

    fn failures(&self) -> Vec<String> {
        self.failures.lock().unwrap().clone()
    }

    fn finish(mut self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("client thread");
        }
        (self.answered.load(Ordering::SeqCst), self.failures())
    }
}

/// The client's request numbers (`/rN`) in a process's access log.
fn requests(p: &Proxy) -> Vec<usize> {
    p.access_logs()
        .iter()
        .filter_map(|l| l.split(" path=/r").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

/// The second process, on the first one's configuration file (the same ports, admin included).
fn successor(first: &Proxy) -> Proxy {
    let ports = HashMap::from([("plain".to_owned(), first.port("plain"))]);
    Proxy::spawn(&first.config, first.admin.port(), ports, false, Some("new"))
}

#[test]
fn a_new_process_takes_the_listeners_over_and_the_old_one_stops_without_a_refusal() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let mut old = sb
        .proxy()
        .listener("plain", Tls::None, &up.address())
        .limit("handover", "true")
        .start();
    let client = Client::start(old.addr("plain"));
    client.wait_more(20);

    let mut new = successor(&old);
    new.wait_log(HANG, |l| l.contains("listening") && l.contains("plain"))
        .unwrap_or_else(|| panic!("the new process did not listen: {:?}", new.logs()));
    // It logs `listening` once its sockets listen and steer: from then on every new connection
    // is its own. Requests 0..k were answered before; request k may have connected just before.
    let k = client.answered.load(Ordering::SeqCst);
    client.wait_more(50);
    new.wait_access_logs(50, HANG);

    old.signal("TERM");
    let exit = old.wait_exit(HANG);
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "{:?}", old.logs());
    client.wait_more(50);
    let (answered, failures) = client.finish();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed across the handover: {failures:?}",
        failures.len(),
        answered + failures.len()
    );
    // The old process's access log is complete once it has exited.
    let last_old = requests(&old).into_iter().max();
    assert!(
        last_old.is_some_and(|i| i <= k),
        "the old process served request {last_old:?}, after the new one listened (request {k})"
    );
    assert!(requests(&new).iter().any(|&i| i > k));
    let stopped = old
        .logs()
        .into_iter()
        .find(|l| l.contains("stopped accepting"));
    assert!(stopped.is_some(), "{:?}", old.logs());
    new.signal("TERM");
    assert_eq!(new.wait_exit(HANG).and_then(|s| s.code()), Some(0));
}

#[test]
fn without_handover_a_second_process_cannot_bind_the_same_address() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let old = sb
        .proxy()
        .listener("plain", Tls::None, &up.address())
        .start();
    let mut new = successor(&old);
    let exit = new.wait_exit(HANG);
    assert!(
        exit.is_some_and(|s| !s.success()),
        "a second process bound the same address without handover: {:?}",
        new.logs()
    );
    assert!(
        new.logs()
            .iter()
            .any(|l| l.contains("Address already in use")),
        "{:?}",
        new.logs()
    );
}
