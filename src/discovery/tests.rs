//! The resolve loop under paused time with a scripted resolver: what is published, when, and
//! what is kept when DNS fails or answers empty.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_resolver::ResolveError;
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

use super::resolve::{Answer, Family, LookupError, Resolve, Srv};
use super::*;
use crate::metrics::UpstreamLabels;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    A,
    Aaaa,
    Srv,
}

#[derive(Clone, Debug)]
enum Reply {
    Ips(Vec<&'static str>, Duration),
    Srv(Vec<(&'static str, u16)>, Duration),
    NxDomain,
    NoData,
    /// SERVFAIL, REFUSED, no server: anything hickory reports as an error.
    Fail,
    /// A server that never answers: the query times out after 2 s.
    Hang,
}

/// Answers from a table the test edits while the loop runs; unknown names are NXDOMAIN.
#[derive(Clone, Default)]
struct Script(Arc<Mutex<ScriptState>>);

#[derive(Default)]
struct ScriptState {
    replies: HashMap<(String, Kind), Reply>,
    calls: Vec<(Instant, String, Kind)>,
}

impl Script {
    fn set(&self, name: &str, kind: Kind, reply: Reply) {
        self.0
            .lock()
            .expect("script lock")
            .replies
            .insert((name.to_owned(), kind), reply);
    }

    fn calls(&self, kind: Kind) -> Vec<Instant> {
        let state = self.0.lock().expect("script lock");
        state
            .calls
            .iter()
            .filter(|(_, _, k)| *k == kind)
            .map(|(at, _, _)| *at)
            .collect()
    }

    async fn reply(&self, name: &str, kind: Kind) -> Result<Reply, LookupError> {
        let reply = {
            let mut state = self.0.lock().expect("script lock");
            state.calls.push((Instant::now(), name.to_owned(), kind));
            state
                .replies
                .get(&(name.to_owned(), kind))
                .cloned()
                .unwrap_or(Reply::NxDomain)
        };
        match reply {
            Reply::NxDomain => Err(LookupError::NxDomain),
            Reply::NoData => Err(LookupError::NoData),
            Reply::Fail => Err(LookupError::Failed(ResolveError::from(
                "SERVFAIL (scripted)",
            ))),
            Reply::Hang => {
                sleep(Duration::from_secs(2)).await;
                Err(LookupError::Failed(ResolveError::from(
                    "request timed out (scripted)",
                )))
            }
            other => Ok(other),
        }
    }
}

impl Resolve for Script {
    async fn ips(&self, name: &str, family: Family) -> Result<Answer<IpAddr>, LookupError> {
        let kind = if family == Family::V4 {
            Kind::A
        } else {
            Kind::Aaaa
        };
        match self.reply(name, kind).await? {
            Reply::Ips(ips, ttl) => Ok(Answer {
                records: ips
                    .iter()
                    .map(|ip| ip.parse().expect("scripted IP"))
                    .collect(),
                ttl,
            }),
            other => panic!("scripted {other:?} for an address query"),
        }
    }

    async fn srv(&self, name: &str) -> Result<Answer<Srv>, LookupError> {
        match self.reply(name, Kind::Srv).await? {
            Reply::Srv(records, ttl) => Ok(Answer {
                records: records
                    .into_iter()
                    .map(|(target, port)| Srv {
                        target: target.to_owned(),
                        port,
                    })
                    .collect(),
                ttl,
            }),
            other => panic!("scripted {other:?} for an SRV query"),
        }
    }
}

const NAME: &str = "ironic.metal3.svc";
const REFRESH: Duration = Duration::from_secs(5);
const HOLD: Duration = Duration::from_secs(30);
const LONG_TTL: Duration = Duration::from_secs(300);

fn options() -> DiscoveryOptions {
    DiscoveryOptions {
        servers: Vec::new(),
        refresh: REFRESH,
        min_ttl: Duration::from_secs(1),
        hold_on_empty: HOLD,
        fallback: Vec::new(),
    }
}

fn ips(list: &[&'static str]) -> Reply {
    Reply::Ips(list.to_vec(), LONG_TTL)
}

fn ep(addr: &str) -> Endpoint {
    let addr: SocketAddr = addr.parse().expect("test address");
    Endpoint {
        addr,
        tls_name: addr.ip().to_string(),
    }
}

fn named(addr: &str, name: &str) -> Endpoint {
    Endpoint {
        addr: addr.parse().expect("test address"),
        tls_name: name.to_owned(),
    }
}

struct Running {
    rx: watch::Receiver<EndpointSet>,
    task: JoinHandle<()>,
    metrics: Metrics,
}

impl Running {
    fn start(script: &Script, target: Target, opts: DiscoveryOptions) -> Self {
        let metrics = Metrics::new();
        let (rx, task) = spawn_with(
            script.clone(),
            "api".to_owned(),
            target,
            opts,
            metrics.clone(),
        )
        .expect("spawn inside a runtime");
        Self { rx, task, metrics }
    }

    fn host(script: &Script) -> Self {
        Self::start(
            script,
            Target::Host {
                name: NAME.to_owned(),
                port: 6385,
            },
            options(),
        )
    }

    /// The next published set; fails the test if none comes within ten minutes of test time.
    async fn next(&mut self) -> Vec<Endpoint> {
        tokio::time::timeout(Duration::from_secs(600), self.rx.changed())
            .await
            .expect("a new endpoint set")
            .expect("the loop is running");
        self.rx.borrow_and_update().to_vec()
    }

    /// Lets `span` of test time pass and asserts nothing was published meanwhile.
    async fn quiet_for(&mut self, span: Duration) {
        sleep(span).await;
        assert!(
            !self.rx.has_changed().expect("the loop is running"),
            "unexpected publication"
        );
    }

    fn current(&self) -> Vec<Endpoint> {
        self.rx.borrow().to_vec()
    }

    fn counts(&self) -> (u64, u64) {
        let labels = UpstreamLabels {
            upstream: "api".to_owned(),
        };
        (
            self.metrics.dns_resolutions.get_or_create(&labels).get(),
            self.metrics.dns_failures.get_or_create(&labels).get(),
        )
    }
}

#[tokio::test(start_paused = true)]
async fn first_value_is_empty_then_the_set_arrives_sorted_and_deduplicated() {
    let script = Script::default();
    script.set(NAME, Kind::A, ips(&["10.0.0.3", "10.0.0.1", "10.0.0.1"]));
    script.set(NAME, Kind::Aaaa, ips(&["fd00::1"]));
    let mut run = Running::host(&script);
    assert!(
        run.current().is_empty(),
        "spawn returns before the first resolution"
    );
    assert_eq!(
        run.next().await,
        [
            ep("10.0.0.1:6385"),
            ep("10.0.0.3:6385"),
            ep("[fd00::1]:6385")
        ]
    );
    assert_eq!(run.counts(), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn additions_and_removals_are_published_and_unchanged_answers_wake_nobody() {
    let script = Script::default();
    script.set(NAME, Kind::A, ips(&["10.0.0.1"]));
    let mut run = Running::host(&script);
    assert_eq!(run.next().await, [ep("10.0.0.1:6385")]);
    run.quiet_for(REFRESH * 3 + Duration::from_secs(1)).await;
    assert_eq!(run.counts(), (4, 0), "one resolution per refresh");

    script.set(NAME, Kind::A, ips(&["10.0.0.2", "10.0.0.1"]));
    let asked = Instant::now();
    assert_eq!(run.next().await, [ep("10.0.0.1:6385"), ep("10.0.0.2:6385")]);
    assert!(
        asked.elapsed() <= REFRESH,
        "an addition shows within one refresh"
    );

    script.set(NAME, Kind::A, ips(&["10.0.0.2"]));
    assert_eq!(run.next().await, [ep("10.0.0.2:6385")]);
}

#[tokio::test(start_paused = true)]
async fn failures_keep_the_last_set_and_are_counted() {
    let script = Script::default();
    script.set(NAME, Kind::A, ips(&["10.0.0.1", "10.0.0.2"]));
    let mut run = Running::host(&script);
    let known = run.next().await;

    script.set(NAME, Kind::A, Reply::Fail);
    script.set(NAME, Kind::Aaaa, Reply::Fail);
    run.quiet_for(REFRESH * 4 + Duration::from_secs(1)).await;
    assert_eq!(run.current(), known);
    assert_eq!(
        run.counts(),
        (5, 4),
        "every attempt counted, every failed one too"
    );

    // A server that stops answering altogether: the same.
    script.set(NAME, Kind::A, Reply::Hang);
    script.set(NAME, Kind::Aaaa, Reply::Hang);
    run.quiet_for(REFRESH * 4 + Duration::from_secs(3)).await;
    assert_eq!(run.current(), known);
    let (resolutions, failures) = run.counts();
    assert_eq!(resolutions, failures + 1);

    // Recovery publishes the fresh answer.
    script.set(NAME, Kind::A, ips(&["10.0.0.2"]));
    script.set(NAME, Kind::Aaaa, Reply::NoData);
    assert_eq!(run.next().await, [ep("10.0.0.2:6385")]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_family_keeps_its_last_addresses_while_the_other_updates() {
    let script = Script::default();
    script.set(NAME, Kind::A, ips(&["10.0.0.1"]));
    script.set(NAME, Kind::Aaaa, ips(&["fd00::1"]));
    let mut run = Running::host(&script);
    run.next().await;

    script.set(NAME, Kind::A, ips(&["10.0.0.2"]));
    script.set(NAME, Kind::Aaaa, Reply::Fail);
    assert_eq!(
        run.next().await,
        [ep("10.0.0.2:6385"), ep("[fd00::1]:6385")]
    );
    assert_eq!(run.counts().1, 1);
}

#[tokio::test(start_paused = true)]
async fn empty_answers_are_held_then_published() {
    let script = Script::default();
    script.set(NAME, Kind::A, ips(&["10.0.0.1"]));
    let mut run = Running::host(&script);
    run.next().await;

    script.set(NAME, Kind::A, Reply::NxDomain);
    sleep(REFRESH + Duration::from_secs(1)).await; // the first empty answer came meanwhile
    let first_empty = *script.calls(Kind::A).last().expect("a query");
    assert_eq!(run.current(), [ep("10.0.0.1:6385")]);
    assert!(run.next().await.is_empty());
    let held = first_empty.elapsed();
    assert!(held >= HOLD && held <= HOLD + REFRESH, "held for {held:?}");
    assert_eq!(run.counts().1, 0, "an empty answer is not a DNS failure");
}

#[tokio::test(start_paused = true)]
async fn empty_answers_that_end_within_the_hold_do_not_flap() {
    let script = Script::default();
    script.set(NAME, Kind::A, ips(&["10.0.0.1"]));
    let mut run = Running::host(&script);
    run.next().await;

    // A rolling restart: the records vanish for 20 s (NOERROR, no data), then come back.
    script.set(NAME, Kind::A, Reply::NoData);
    run.quiet_for(Duration::from_secs(20)).await;
    script.set(NAME, Kind::A, ips(&["10.0.0.1"]));
    run.quiet_for(REFRESH * 2).await;

    // A later empty spell gets a full hold of its own.
    script.set(NAME, Kind::A, Reply::NxDomain);
    run.quiet_for(HOLD - Duration::from_secs(1)).await;
    assert!(run.next().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn without_a_hold_an_empty_answer_empties_the_set_at_once() {
    let script = Script::default();
    script.set(NAME, Kind::A, ips(&["10.0.0.1"]));
    let opts = DiscoveryOptions {
        hold_on_empty: Duration::ZERO,
        fallback: Vec::new(),
        ..options()
    };
    let mut run = Running::start(
        &script,
        Target::Host {
            name: NAME.to_owned(),
            port: 80,
        },
        opts,
    );
    run.next().await;
    script.set(NAME, Kind::A, Reply::NxDomain);
    let asked = Instant::now();
    assert!(run.next().await.is_empty());
    assert!(asked.elapsed() <= REFRESH);
}

#[tokio::test(start_paused = true)]
async fn short_ttls_bring_the_next_resolution_forward_down_to_the_floor() {
    let script = Script::default();
    script.set(
        NAME,
        Kind::A,
        Reply::Ips(vec!["10.0.0.1"], Duration::from_secs(2)),
    );
    let run = Running::host(&script);
    sleep(Duration::from_millis(9_500)).await;
    let calls = script.calls(Kind::A);
    assert_eq!(
        calls.len(),
        5,
        "every 2 s (TTL) rather than every 5 s (refresh)"
    );

    script.set(NAME, Kind::A, Reply::Ips(vec!["10.0.0.1"], Duration::ZERO));
    sleep(Duration::from_secs(10)).await;
    let gaps: Vec<Duration> = script
        .calls(Kind::A)
        .windows(2)
        .skip(5)
        .map(|w| w[1] - w[0])
        .collect();
    assert!(!gaps.is_empty());
    assert!(
        gaps.iter().all(|gap| *gap == Duration::from_secs(1)),
        "TTL 0 floored: {gaps:?}"
    );
    drop(run);
}

#[tokio::test(start_paused = true)]
async fn srv_targets_become_endpoints_named_after_the_target() {
    let script = Script::default();
    let srv = "_api._tcp.ironic.metal3.svc";
    script.set(
        srv,
        Kind::Srv,
        Reply::Srv(
            vec![
                ("ironic-0.metal3.svc", 6385),
                ("ironic-1.metal3.svc", 6385),
                (".", 0),
            ],
            LONG_TTL,
        ),
    );
    script.set("ironic-0.metal3.svc.", Kind::A, ips(&["10.0.0.10"]));
    script.set("ironic-1.metal3.svc.", Kind::A, ips(&["10.0.0.11"]));
    let target = Target::Srv {
        name: srv.to_owned(),
    };
    let mut run = Running::start(&script, target, options());
    let both = vec![
        named("10.0.0.10:6385", "ironic-0.metal3.svc"),
        named("10.0.0.11:6385", "ironic-1.metal3.svc"),
    ];
    assert_eq!(run.next().await, both);

    // A target whose addresses cannot be resolved keeps its last ones.
    script.set("ironic-1.metal3.svc.", Kind::A, Reply::Fail);
    run.quiet_for(REFRESH * 2 + Duration::from_secs(1)).await;
    assert_eq!(run.counts().1, 2);

    // So does the whole set when the SRV query itself fails.
    script.set(srv, Kind::Srv, Reply::Fail);
    run.quiet_for(REFRESH * 2).await;
    assert_eq!(run.counts().1, 4);

    // A target that leaves the SRV answer leaves the set.
    script.set(
        srv,
        Kind::Srv,
        Reply::Srv(vec![("ironic-0.metal3.svc", 6385)], LONG_TTL),
    );
    assert_eq!(run.next().await, both[..1]);
}

#[tokio::test(start_paused = true)]
async fn the_loop_ends_when_every_receiver_is_gone() {
    let script = Script::default();
    script.set(NAME, Kind::A, ips(&["10.0.0.1"]));
    let mut run = Running::host(&script);
    run.next().await;
    let Running { rx, task, .. } = run;
    drop(rx);
    tokio::time::timeout(REFRESH, task)
        .await
        .expect("ends")
        .expect("no panic");
}

#[tokio::test]
async fn a_zero_refresh_is_refused() {
    let opts = DiscoveryOptions {
        refresh: Duration::ZERO,
        ..options()
    };
    let target = Target::Host {
        name: NAME.to_owned(),
        port: 80,
    };
    let err = spawn_with(
        Script::default(),
        "api".to_owned(),
        target,
        opts,
        Metrics::new(),
    );
    assert!(matches!(err, Err(DiscoveryError::ZeroRefresh)));
}

#[test]
fn spawning_outside_a_runtime_is_an_error_not_a_panic() {
    let target = Target::Host {
        name: NAME.to_owned(),
        port: 80,
    };
    let err = spawn_with(
        Script::default(),
        "api".to_owned(),
        target,
        options(),
        Metrics::new(),
    );
    assert!(matches!(err, Err(DiscoveryError::NoRuntime(_))));
}

#[test]
fn targets_parse() {
    assert_eq!(
        "ironic.metal3.svc:6385".parse::<Target>().expect("valid"),
        Target::Host {
            name: "ironic.metal3.svc".to_owned(),
            port: 6385
        }
    );
    assert_eq!(
        "srv:_api._tcp.ironic.metal3.svc"
            .parse::<Target>()
            .expect("valid"),
        Target::Srv {
            name: "_api._tcp.ironic.metal3.svc".to_owned()
        }
    );
    assert_eq!(
        "ironic.metal3.svc.cluster.local.:6385"
            .parse::<Target>()
            .expect("valid")
            .to_string(),
        "ironic.metal3.svc.cluster.local.:6385"
    );
}

#[test]
fn bad_targets_say_what_is_wrong() {
    let cases = [
        (
            "ironic.metal3.svc",
            "expected NAME:PORT (A/AAAA records) or srv:NAME (SRV records)",
        ),
        (
            "ironic.metal3.svc:http",
            "port `http` is not a number in 1..=65535",
        ),
        (
            "ironic.metal3.svc:0",
            "port `0` is not a number in 1..=65535",
        ),
        (
            "ironic.metal3.svc:70000",
            "port `70000` is not a number in 1..=65535",
        ),
        (
            "srv:_api._tcp.ironic:6385",
            "an SRV target takes no port: the SRV records carry it",
        ),
        ("10.0.0.1:6385", "`dns` takes a DNS name, not an IP address"),
        (
            "[fd00::1]:6385",
            "`dns` takes a DNS name, not an IP address",
        ),
        (
            "ironic..svc:6385",
            "not a valid DNS name: the name has an empty label",
        ),
        (":6385", "not a valid DNS name: the name is empty"),
        ("srv:", "not a valid DNS name: the name is empty"),
        (
            "iron ic.svc:6385",
            "not a valid DNS name: only letters, digits",
        ),
    ];
    for (input, expected) in cases {
        let err = input.parse::<Target>().expect_err(input).to_string();
        assert!(err.starts_with(&format!("`{input}`: ")), "{err}");
        assert!(err.contains(expected), "{input}: {err}");
    }
    let long = format!("{}.svc:80", "a".repeat(64));
    assert!(long
        .parse::<Target>()
        .expect_err("long label")
        .to_string()
        .contains("63"));
}

/// The target's name follows rustls' syntax (`DnsName`): `_` stays allowed for SRV owner names,
/// and a name no resolver or certificate uses is refused with its reason. The name is kept as
/// written, trailing dot included (an absolute name skips the search domains).
#[test]
fn target_names_follow_the_dns_name_rules() {
    assert_eq!(
        "srv:_ironic._tcp.ironic.svc"
            .parse::<Target>()
            .expect("valid"),
        Target::Srv {
            name: "_ironic._tcp.ironic.svc".to_owned()
        }
    );
    assert_eq!(
        "Ironic.Metal3.svc.:6385".parse::<Target>().expect("valid"),
        Target::Host {
            name: "Ironic.Metal3.svc.".to_owned(),
            port: 6385
        }
    );
    let cases = [
        (
            "-ironic.svc:6385",
            "not a valid DNS name: a label starts or ends with '-'",
        ),
        (
            "ironic-.svc:6385",
            "not a valid DNS name: a label starts or ends with '-'",
        ),
        (
            "10.0.0.256:6385",
            "not a valid DNS name: the last label is a number",
        ),
        (
            "ironic.0x1f:6385",
            "not a valid DNS name: the last label is a number",
        ),
        (
            "srv:_api._tcp.-x.svc",
            "not a valid DNS name: a label starts or ends with '-'",
        ),
        (
            "ironic.svc..:6385",
            "not a valid DNS name: the name has an empty label",
        ),
    ];
    for (input, expected) in cases {
        let err = input.parse::<Target>().expect_err(input).to_string();
        assert!(err.starts_with(&format!("`{input}`: ")), "{err}");
        assert!(err.contains(expected), "{input}: {err}");
    }
}

fn with_fallback(addrs: &[&str]) -> DiscoveryOptions {
    DiscoveryOptions {
        fallback: addrs
            .iter()
            .map(|a| a.parse().expect("test address"))
            .collect(),
        ..options()
    }
}

#[tokio::test(start_paused = true)]
async fn fallback_serves_while_dns_never_answered_and_yields_to_the_first_answer() {
    let script = Script::default();
    script.set(NAME, Kind::A, Reply::Fail);
    script.set(NAME, Kind::Aaaa, Reply::Fail);
    let target = Target::Host {
        name: NAME.to_owned(),
        port: 6385,
    };
    let mut run = Running::start(
        &script,
        target,
        with_fallback(&["10.0.0.9:6385", "[fd00::9]:6385"]),
    );
    // Published before the first query returns, and kept through failures.
    let fallback = vec![ep("10.0.0.9:6385"), ep("[fd00::9]:6385")];
    assert_eq!(run.current(), fallback);
    run.quiet_for(REFRESH * 4).await;
    assert!(run.counts().1 >= 4, "failures counted: {:?}", run.counts());
    // DNS comes back: the discovered peers replace the fallback, not join it.
    script.set(NAME, Kind::A, ips(&["10.0.0.1"]));
    script.set(NAME, Kind::Aaaa, Reply::NoData);
    assert_eq!(run.next().await, vec![ep("10.0.0.1:6385")]);
    // DNS fails again: the last discovered set stays, the fallback does not come back.
    script.set(NAME, Kind::A, Reply::Fail);
    run.quiet_for(REFRESH * 4).await;
    assert_eq!(run.current(), vec![ep("10.0.0.1:6385")]);
    run.task.abort();
}

#[tokio::test(start_paused = true)]
async fn fallback_returns_when_answers_stay_empty_past_the_hold() {
    let script = Script::default();
    script.set(NAME, Kind::A, ips(&["10.0.0.1"]));
    script.set(NAME, Kind::Aaaa, Reply::NoData);
    let target = Target::Host {
        name: NAME.to_owned(),
        port: 6385,
    };
    let mut run = Running::start(&script, target, with_fallback(&["10.0.0.9:6385"]));
    assert_eq!(run.current(), vec![ep("10.0.0.9:6385")]);
    assert_eq!(run.next().await, vec![ep("10.0.0.1:6385")]);
    script.set(NAME, Kind::A, Reply::NxDomain);
    let started = Instant::now();
    assert_eq!(run.next().await, vec![ep("10.0.0.9:6385")]);
    assert!(
        started.elapsed() >= HOLD,
        "published after {:?}",
        started.elapsed()
    );
    run.task.abort();
}
