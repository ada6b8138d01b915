//! HTTP Basic authentication (`[listeners.auth]`) with real clients (curl, Python requests)
//! and byte-exact requests: what a client without the right credentials gets, and above all
//! what reaches the upstream: nothing unauthenticated outside the public paths, however the
//! path is spelled.

use crate::support;

use base64::Engine as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{curl, python, run, HttpConn, Proxy, Sandbox, Tls, Upstream};

/// `htpasswd -B`'s default cost.
const COST: u32 = 5;

/// An htpasswd line as `htpasswd -B` writes it (`$2y$`).
fn entry(user: &str, password: &str) -> String {
    let h = bcrypt::hash_with_result(password, COST).unwrap();
    format!("{user}:{}\n", h.format_for_version(bcrypt::Version::TwoY))
}

fn basic(user: &str, password: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {token}")
}

/// Starts a proxy whose last listener gets `auth` (the body of `[listeners.auth]`).
fn start(builder: &support::ProxyBuilder, auth: &str) -> Proxy {
    start_env(builder, auth, &[])
}

/// [`start`] with `env` added to the proxy's environment.
fn start_env(builder: &support::ProxyBuilder, auth: &str, env: &[(&str, &str)]) -> Proxy {
    support::proxy::start_ready(Duration::from_secs(10), || {
        let (config, admin, ports) = builder.write_config();
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str("\n[listeners.auth]\n");
        text.push_str(auth);
        std::fs::write(&config, text).unwrap();
        Proxy::spawn_env(&config, admin, ports, false, None, env)
    })
}

fn auth_table(htpasswd: &Path, extra: &str) -> String {
    format!(
        "htpasswd = \"{}\"\nrealm = \"Ironic API\"\n{extra}",
        htpasswd.display()
    )
}

/// curl with `args`, printing the status code then the body.
fn curl_code(args: &[&str]) -> (u16, String) {
    let mut all = vec!["-w", "\n%{http_code}"];
    all.extend_from_slice(args);
    let out = curl(&all);
    assert!(out.ok(), "curl failed: {out:?}");
    let (body, code) = out.stdout.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_owned())
}

#[test]
fn curl_and_requests_need_the_right_password_except_on_public_paths() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    std::fs::write(
        sb.path("htpasswd"),
        entry("admin", "s3cret") + &entry("ro", "other"),
    )
    .unwrap();
    let proxy = start(
        &sb.proxy_to(&up, &[("api", Tls::Server)]),
        &auth_table(&sb.path("htpasswd"), ""),
    );
    let ca = sb.path("ca.crt").display().to_string();
    let url = |p: &str| proxy.url("api", p);

    // No credentials: 401, the challenge, the proxy's JSON body.
    let out = curl(&["--cacert", &ca, "-i", &url("/v1/nodes")]);
    assert!(
        out.stdout.starts_with("HTTP/2 401") || out.stdout.starts_with("HTTP/1.1 401"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .to_ascii_lowercase()
            .contains("www-authenticate: basic realm=\"ironic api\""),
        "{}",
        out.stdout
    );
    let body = out.stdout.split("\r\n\r\n").nth(1).unwrap();
    let json = support::json_object(body);
    assert_eq!(json["error"], "unauthorized");
    assert_eq!(json["status"], "401");

    assert_eq!(
        curl_code(&["--cacert", &ca, "-u", "admin:s3cret", &url("/v1/nodes")]).0,
        200
    );
    assert_eq!(
        curl_code(&["--cacert", &ca, "-u", "admin:wrong", &url("/v1/nodes")]).0,
        401
    );
    assert_eq!(
        curl_code(&["--cacert", &ca, "-u", "nobody:s3cret", &url("/v1/nodes")]).0,
        401
    );
    // ro's password is not admin's.
    assert_eq!(
        curl_code(&["--cacert", &ca, "-u", "admin:other", &url("/v1/nodes")]).0,
        401
    );
    assert_eq!(
        curl_code(&["--cacert", &ca, "-u", "ro:other", &url("/v1/drivers")]).0,
        200
    );

    // Public paths: what the ramdisk agent and version discovery call without credentials.
    for (method, path) in [
        ("GET", "/"),
        ("GET", "/v1"),
        ("GET", "/v1/"),
        ("GET", "/v1/lookup?addresses=52:54:00:12:34:56"),
        ("POST", "/v1/heartbeat/1be26c0b-03f2-4d2e-ae87-c02d7f33c123"),
        ("POST", "/v1/continue_inspection"),
    ] {
        let (code, _) = curl_code(&[
            "--cacert",
            &ca,
            "-X",
            method,
            "--data-binary",
            "{}",
            &url(path),
        ]);
        assert_eq!(code, 200, "{method} {path}");
    }

    // Python requests, as the Ironic client libraries use it.
    const SCRIPT: &str = r#"
import sys, requests
url, ca = sys.argv[1], sys.argv[2]
s = requests.Session()
print(s.get(url, verify=ca).status_code)
print(s.get(url, verify=ca, auth=("admin", "s3cret")).status_code)
print(s.get(url, verify=ca, auth=("admin", "s3cret!")).status_code)
r = s.post(url, verify=ca, json={"a": 1})
print(r.status_code, r.headers.get("WWW-Authenticate"), r.json()["error"])
print(s.post(url, verify=ca, json={"a": 1}, auth=("admin", "s3cret")).status_code)
"#;
    let out = python(SCRIPT, &[&url("/v1/nodes"), &ca]);
    assert!(out.ok(), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "401",
            "200",
            "401",
            "401 Basic realm=\"Ironic API\" unauthorized",
            "200"
        ]
    );

    // What reached the upstream: the authenticated requests (Authorization passed through
    // untouched, the default) and the public ones; nothing else.
    let got = up.requests();
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(got.len(), 2 + 6 + 2, "{paths:?}");
    for r in &got {
        let public = r.path == "/"
            || r.path.starts_with("/v1/lookup")
            || r.path.starts_with("/v1/heartbeat/")
            || r.path == "/v1"
            || r.path == "/v1/"
            || r.path == "/v1/continue_inspection";
        if !public {
            let a = r.header("authorization").unwrap();
            assert!(
                a == basic("admin", "s3cret") || a == basic("ro", "other"),
                "{a}"
            );
        }
    }
    let m = proxy.metrics();
    let count = |outcome: &str| {
        support::metric(
            &m,
            "ironic_proxy_auth_total",
            &[("listener", "api"), ("outcome", outcome)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(count("public"), 6.0);
    assert_eq!(count("no_credentials"), 3.0);
    assert_eq!(count("wrong_password"), 3.0);
    assert_eq!(count("unknown_user"), 1.0);
    // bcrypt ran once per credential (curl), every later use (Python) hit the cache.
    assert_eq!(count("ok"), 2.0);
    assert_eq!(count("ok_cached"), 2.0);
}

/// Spellings of a protected path that try to pass as a public one. Sent byte-exact over a plain
/// listener (curl would normalise most of them) and with curl `--path-as-is` over TLS.
const BYPASSES: &[&str] = &[
    "/v1/lookup/../nodes",
    "/v1/lookup/..%2fnodes",
    "/v1/lookup%2f..%2fnodes",
    "/v1/lookup/%2e%2e/nodes",
    "//v1/nodes",
    "//v1/lookup",
    "/v1//lookup",
    "/v1/%6eodes",
    "/v1/%6cookup",
    "/V1/nodes",
    "/V1/lookup",
    "/v1/LOOKUP",
    "/v1/lookup.",
    "/v1/lookup./../nodes",
    "/v1/heartbeat/../../v1/nodes",
    "/v1/heartbeat/x/../../nodes",
    "/v1/heartbeat/..",
    "/v1/heartbeat/.",
    "/v1/heartbeat/",
    "/v1/heartbeat/%2e%2e/nodes",
    "/v1/heartbeat/x;/../../nodes",
    "/v1/heartbeat/x\\..\\..\\nodes",
    "/v1/./nodes",
    "/./v1/lookup",
    "/v1/continue_inspection/../nodes",
    "/v1/lookup/",
    "/v1/lookup;x",
    "http://localhost/v1/nodes",
];

#[test]
fn bypass_spellings_never_reach_the_upstream_unauthenticated() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    std::fs::write(sb.path("htpasswd"), entry("admin", "s3cret")).unwrap();
    let proxy = start(
        &sb.proxy().listener("api", Tls::Server, &up.address()),
        &auth_table(&sb.path("htpasswd"), ""),
    );
    let cfg = support::tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let connect = || HttpConn::tls(proxy.addr("api"), cfg.clone()).unwrap();
    let mut c = connect();
    for path in BYPASSES {
        let r = c.request("GET", path, &[], b"").unwrap();
        assert_eq!(r.status, 401, "{path}");
        if r.header("connection") == Some("close") {
            c = connect();
        }
    }
    // Again with curl, path as is (HTTP/2 where curl negotiates it).
    let ca = sb.path("ca.crt").display().to_string();
    for path in BYPASSES
        .iter()
        .filter(|p| p.starts_with('/') && !p.contains('\\'))
    {
        let (code, _) = curl_code(&["--cacert", &ca, "--path-as-is", &proxy.url("api", path)]);
        assert_eq!(code, 401, "{path}");
    }
    assert!(
        up.requests().is_empty(),
        "reached the upstream: {:?}",
        up.requests()
    );
    // The public spelling itself passes, on a connection of its own: the first one sat idle
    // through the curl runs, which on a loaded machine outlast the proxy's `idle_timeout`.
    drop(c);
    let r = connect().request("GET", "/v1/lookup", &[], b"").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(up.requests().len(), 1);
}

#[test]
fn malformed_authorization_headers_get_401_and_reach_nothing() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    std::fs::write(sb.path("htpasswd"), entry("admin", "s3cret")).unwrap();
    let proxy = start(
        &sb.proxy()
            .listener("plain", Tls::None, &up.address())
            .limit("header_bytes", "131072"),
        &auth_table(&sb.path("htpasswd"), ""),
    );
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let big = format!("Basic {}", "QUFB".repeat(16 * 1024));
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("bad base64", b"Basic !!!not-base64!!!".to_vec(), 401),
        (
            "no colon",
            format!("Basic {}", b64(b"admins3cret")).into_bytes(),
            401,
        ),
        ("64 KiB value", big.into_bytes(), 401),
        (
            "non-UTF-8 user",
            [b"Basic ".as_slice(), b64(b"\xff\xfe:s3cret").as_bytes()].concat(),
            401,
        ),
        ("raw non-UTF-8 bytes", b"Basic \xff\xfe\xfd".to_vec(), 401),
        (
            "NUL in credentials",
            format!("Basic {}", b64(b"admin:s3\x00cret")).into_bytes(),
            401,
        ),
        ("Bearer scheme", b"Bearer abcdef".to_vec(), 401),
        ("Digest scheme", b"Digest username=\"admin\"".to_vec(), 401),
        ("empty", b"".to_vec(), 401),
        ("scheme only", b"Basic".to_vec(), 401),
        (
            "unpadded",
            format!("Basic {}", b64(b"admin:s3cret1").trim_end_matches('=')).into_bytes(),
            401,
        ),
        // hyper refuses a NUL byte in a field value while parsing: 400 before anything else.
        ("raw NUL", b"Basic YWRt\x00aW4=".to_vec(), 400),
    ];
    for (what, value, want) in &cases {
        let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
        let mut raw = b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: ".to_vec();
        raw.extend_from_slice(value);
        raw.extend_from_slice(b"\r\n\r\n");
        c.send(&raw).unwrap();
        let r = c.read_response().unwrap();
        assert_eq!(r.status, *want, "{what}");
        if *want == 401 {
            assert_eq!(
                r.header("www-authenticate"),
                Some("Basic realm=\"Ironic API\""),
                "{what}"
            );
        }
    }
    // Two Authorization fields, one of them right: refused, never guessed.
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    let right = basic("admin", "s3cret");
    let r = c
        .request(
            "GET",
            "/v1/nodes",
            &[("Authorization", &right), ("Authorization", "Basic eDp5")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 401);
    assert!(up.requests().is_empty(), "{:?}", up.requests());
    // Still serving, and the right credentials pass.
    let r = c
        .request("GET", "/v1/nodes", &[("Authorization", &right)], b"")
        .unwrap();
    assert_eq!(r.status, 200);
    let m = proxy.metrics();
    let malformed = support::metric(&m, "ironic_proxy_auth_total", &[("outcome", "malformed")]);
    assert_eq!(malformed, Some(12.0), "{m}");
}

#[test]
fn forward_authorization_false_strips_the_header() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    std::fs::write(sb.path("htpasswd"), entry("admin", "s3cret")).unwrap();
    let proxy = start(
        &sb.proxy().listener("plain", Tls::None, &up.address()),
        &auth_table(
            &sb.path("htpasswd"),
            "forward_authorization = false\npublic = [\"/v1/lookup\"]\n",
        ),
    );
    let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
    let right = basic("admin", "s3cret");
    assert_eq!(
        c.request("GET", "/v1/nodes", &[("Authorization", &right)], b"")
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        c.request("GET", "/v1/lookup", &[("Authorization", "Bearer x")], b"")
            .unwrap()
            .status,
        200
    );
    // Only /v1/lookup is public now.
    assert_eq!(c.get("/v1").unwrap().status, 401);
    let got = up.requests();
    assert_eq!(got.len(), 2);
    assert!(
        got.iter().all(|r| r.header("authorization").is_none()),
        "{got:?}"
    );
}

#[test]
fn a_non_bcrypt_line_is_a_config_error_naming_the_line() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let htpasswd = sb.path("htpasswd");
    std::fs::write(
        &htpasswd,
        entry("admin", "s3cret") + "old:$apr1$x8Ysrf0r$0Hhm2S0w5pAj6l0LvDXIY.\n",
    )
    .unwrap();
    let (config, _, _) = sb
        .proxy()
        .listener("api", Tls::Server, &up.address())
        .write_config();
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "\n[listeners.auth]\n{}",
        auth_table(&htpasswd, "")
    ));
    std::fs::write(&config, &text).unwrap();
    for sub in ["check", "run"] {
        let out = run(
            Command::new(env!("CARGO_BIN_EXE_ironic-proxy"))
                .arg(sub)
                .arg("--config")
                .arg(&config),
            b"",
        );
        assert_eq!(out.code, Some(1), "{sub}: {out:?}");
        let err = out.stderr.trim();
        assert!(
            err.contains("listeners[0].auth.htpasswd: line 2: user \"old\": MD5 ($apr1$)"),
            "{sub}: {err}"
        );
        assert!(!err.contains("x8Ysrf0r"), "the hash is not printed: {err}");
    }
    // Bad keys name their path.
    for (table, key) in [
        (
            "realm = \"a\\\"b\"\nhtpasswd = \"/x\"",
            "listeners[0].auth.realm",
        ),
        (
            "htpasswd = \"/x\"\npublic = [\"/v1/*/x\"]",
            "listeners[0].auth.public[0]",
        ),
        ("htpasswd = \"/x\"\nuser = \"y\"", "listeners[0].auth"),
    ] {
        let t = text.split("\n[listeners.auth]").next().unwrap().to_owned()
            + "\n[listeners.auth]\n"
            + table
            + "\n";
        std::fs::write(&config, t).unwrap();
        let out = run(
            Command::new(env!("CARGO_BIN_EXE_ironic-proxy"))
                .arg("check")
                .arg("--config")
                .arg(&config),
            b"",
        );
        assert_eq!(out.code, Some(1), "{out:?}");
        assert!(out.stderr.contains(key), "{key}: {}", out.stderr);
    }
    // A good file: check prints the effective table with the default public set.
    std::fs::write(&htpasswd, entry("admin", "s3cret")).unwrap();
    std::fs::write(&config, &text).unwrap();
    let out = run(
        Command::new(env!("CARGO_BIN_EXE_ironic-proxy"))
            .arg("check")
            .arg("--config")
            .arg(&config),
        b"",
    );
    assert!(out.ok(), "{out:?}");
    assert!(out.stdout.contains("[listeners.auth]"), "{}", out.stdout);
    assert!(
        out.stdout.contains("public = [\"/\", \"/v1\", \"/v1/\", \"/v1/lookup\", \"/v1/heartbeat/*\", \"/v1/continue_inspection\"]"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("forward_authorization = true"));
}

#[test]
fn the_file_is_followed_and_a_bad_one_keeps_the_last_good() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let htpasswd = sb.path("htpasswd");
    std::fs::write(&htpasswd, entry("alice", "one")).unwrap();
    let proxy = start(
        &sb.proxy()
            .watch_interval("100ms")
            .listener("plain", Tls::None, &up.address()),
        &auth_table(&htpasswd, ""),
    );
    let status = |user: &str, pw: &str| {
        let mut c = HttpConn::tcp(proxy.addr("plain")).unwrap();
        c.request(
            "GET",
            "/v1/nodes",
            &[("Authorization", &basic(user, pw))],
            b"",
        )
        .unwrap()
        .status
    };
    assert_eq!(status("alice", "one"), 200);
    assert_eq!(status("alice", "one"), 200); // now cached
                                             // alice's password changes: the cached credential must not survive the change.
    std::fs::write(&htpasswd, entry("alice", "two") + &entry("bob", "three")).unwrap();
    let moved = support::poll_until(Duration::from_secs(5), || {
        (status("alice", "one") == 401).then_some(())
    });
    assert!(moved.is_some(), "the old password still works");
    assert_eq!(status("alice", "two"), 200);
    assert_eq!(status("bob", "three"), 200);
    // A broken file is refused, counted, and the last good one stays.
    let failures = |p: &Proxy| {
        support::metric(
            &p.metrics(),
            "ironic_proxy_reload_failures_total",
            &[("what", "htpasswd")],
        )
        .unwrap_or(0.0)
    };
    std::fs::write(&htpasswd, "bob:plaintext\n").unwrap();
    let counted = support::poll_until(Duration::from_secs(5), || {
        (failures(&proxy) >= 1.0).then_some(())
    });
    assert!(counted.is_some(), "{:?}", proxy.logs());
    assert_eq!(status("bob", "three"), 200);
    assert_eq!(status("bob", "plaintext"), 401);
    // SIGHUP re-reads even an unchanged file.
    let before = failures(&proxy);
    proxy.signal("HUP");
    let again = support::poll_until(Duration::from_secs(5), || {
        (failures(&proxy) > before).then_some(())
    });
    assert!(again.is_some());
}

/// p-th percentile of durations.
fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// A flood of 2,000 wrong passwords from 200 connections costs a bounded share of the CPU: an
/// authenticated client on its own connection is never stalled by it. Run twice: with one worker
/// thread (a sidecar with a 1-CPU limit; nothing else could serve the client while a worker is
/// busy) and with one per CPU (the default). The figures are printed (`--no-capture`).
///
/// Every flood request carries a different wrong password (a guessing attack: no two can share a
/// verification). The flood comes from a process of its own, under `SCHED_IDLE` once it is ready
/// (tests/it/support/flood.py, one thread): the load generator is not the system under test, and
/// 200 client threads in this process would compete with the measuring client for the 2 CPUs of
/// a small machine. It is sent in 10 waves of 200 (one on each of the 200 connections); each
/// wave is 6 times what the verification queue holds, so during a wave the proxy is as saturated
/// as under a longer flood. The last check reads the proxy's threads: bcrypt ran on its own
/// threads, at nice 19 under `SCHED_IDLE`.
///
/// The bound allows for a control measured in the same run: before each wrong-password wave
/// comes a control wave of the same 200 requests without credentials, answered 401 at once with
/// nothing to verify, and idle windows separate them all. Parsing and answering a burst of 200
/// requests is normal-priority work that the client's next request waits behind on a small
/// machine (with one worker thread, debug build: 13 to 53 ms in 6 runs on a 2-core host whose
/// idle p99 was 1.4 to 5.6 ms); the control's p99 is that wait, since a control wave is over in
/// the client's first few requests. So the flood's p99 may be at most twice the idle p99 plus
/// the control's p99 plus [`NOISE`]: what the verifications themselves add must fit in the idle
/// share and the noise allowance. A stalled event loop is far above it (bcrypt inlined on the
/// loop: p99 0.8 to 3.1 s against 3.4 to 7.7 ms idle; 0.49 s against 2.3 ms idle and a control
/// of 33 ms when tried again with the control in place, which also left too few samples during
/// the flood); bcrypt on normal-priority threads (12x the idle p99 once, under the bound) is
/// caught by the thread check. Before the control, the burst's allowance was a fixed
/// 10 ms: the test failed CI on a host busier than the one it was tuned on, at 33.6 ms against
/// 5.2 ms idle, where the burst alone takes longer. With a busy-looping process beside the test,
/// the flood (under `SCHED_IDLE`) trickles instead of bursting and the control's p99 falls to
/// the idle one (0.71 ms against 0.94 ms idle, the flood at 1.95 ms): [`NOISE`] is for such runs.
#[test]
fn a_wrong_password_flood_does_not_stall_an_authenticated_client() {
    /// What a shared host's scheduling may add to one p99 and not the others; a stall adds
    /// hundreds of milliseconds.
    const NOISE: Duration = Duration::from_millis(10);
    for workers in ["1", ""] {
        let env: &[(&str, &str)] = if workers.is_empty() {
            &[]
        } else {
            &[("IRONIC_PROXY_WORKER_THREADS", workers)]
        };
        let p99 = flood_against_one_client(env);
        println!(
            "{env:?}: p99 during the flood / idle p99 = {:.2}, / control p99 = {:.2}",
            p99.during.as_secs_f64() / p99.idle.as_secs_f64(),
            p99.during.as_secs_f64() / p99.control.as_secs_f64()
        );
        assert!(
            p99.during <= p99.idle * 2 + p99.control + NOISE,
            "stalled: p99 {:?} > 2 x idle p99 {:?} + control p99 {:?} + {NOISE:?}",
            p99.during,
            p99.idle,
            p99.control
        );
    }
}

/// One flood against a new proxy; every check but the p99 bound is asserted here.
fn flood_against_one_client(env: &[(&str, &str)]) -> FloodP99 {
    const FLOOD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/support/flood.py");
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    std::fs::write(sb.path("htpasswd"), entry("admin", "s3cret")).unwrap();
    let proxy = start_env(
        &sb.proxy().listener("plain", Tls::None, &up.address()),
        &auth_table(&sb.path("htpasswd"), ""),
        env,
    );
    let addr = proxy.addr("plain");
    let right = basic("admin", "s3cret");
    let mut me = HttpConn::tcp(addr).unwrap();
    let sample = |n: usize, me: &mut HttpConn<std::net::TcpStream>| {
        (0..n)
            .map(|_| {
                let t = Instant::now();
                let r = me.request("GET", "/v1/nodes", &[("Authorization", &right)], b"");
                let r = r.unwrap_or_else(|e| panic!("the authenticated client stalled: {e}"));
                assert_eq!(r.status, 200);
                t.elapsed()
            })
            .collect::<Vec<_>>()
    };
    sample(50, &mut me); // warm: bcrypt once, then cached

    // Killed (by its PID) if the test fails half-way.
    struct Flood(std::process::Child);
    impl Drop for Flood {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut flood = Flood(
        Command::new("python3")
            .arg(FLOOD)
            .args([&addr.ip().to_string(), &addr.port().to_string()])
            .args(["admin", "wrong-", "200"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut orders = flood.0.stdin.take().unwrap();
    let lines = {
        let out = std::io::BufReader::new(flood.0.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(out) {
                if tx.send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        rx
    };
    let ready = lines.recv_timeout(Duration::from_secs(30));
    assert_eq!(
        ready.as_deref(),
        Ok("ready"),
        "the flood process did not start"
    );

    // One wave: `order` to the flood, the client sampling until the flood's answer line; the
    // statuses it reports are added to `statuses`.
    let started = Instant::now();
    let mut reconnects = 0;
    let mut wave = |order: &[u8], statuses: &mut Vec<u16>, me: &mut HttpConn<_>| {
        std::io::Write::write_all(&mut orders, order).unwrap();
        let mut during = Vec::new();
        let counts = loop {
            during.extend(sample(5, me));
            // A breath between batches: the verifications and the flood run at idle priority,
            // and a client sampling flat out beside another test on the second core left them
            // no CPU at all (a FIPS run of CI at load: the flood never finished in 300 s).
            std::thread::sleep(Duration::from_millis(1));
            // No deadline of its own: the verifications run under SCHED_IDLE, which has no
            // bounded completion time on a machine with no idle core (a stress run beside VMs
            // took over 300 s here). A flood that never ends is ended by nextest's hang bound
            // (.config/nextest.toml) and reported as a TIMEOUT.
            if let Ok(line) = lines.try_recv() {
                break line;
            }
        };
        // {"401": 31, "503": 369, "reconnects": 0}
        for pair in counts.trim_matches(['{', '}']).split(',') {
            let (key, n) = pair.split_once(':').unwrap();
            let n: usize = n.trim().parse().unwrap();
            match key.trim().trim_matches('"') {
                "reconnects" => reconnects += n,
                status => statuses.extend(std::iter::repeat_n(status.parse::<u16>().unwrap(), n)),
            }
        }
        during
    };
    let (mut idle, mut during, mut control, mut statuses, mut bare) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..10 {
        idle.extend(sample(100, &mut me));
        control.extend(wave(b"1 bare\n", &mut bare, &mut me));
        idle.extend(sample(100, &mut me));
        during.extend(wave(b"1\n", &mut statuses, &mut me));
    }
    idle.extend(sample(200, &mut me));
    let flood_time = started.elapsed();
    drop(orders);
    let _ = flood.0.wait();
    let n = |s: u16| statuses.iter().filter(|x| **x == s).count();
    let (n401, n503) = (n(401), n(503));
    let [idle_p99, control_p99, during_p99] =
        [&idle, &control, &during].map(|v| percentile(v.to_vec(), 0.99));
    println!(
        "{env:?}: flood of {} requests in 10 waves, {flood_time:?} with the idle windows and \
         controls (401: {n401}, 503 queue full: {n503}, other: {}, reconnected: {reconnects}); \
         authenticated client: idle p99 {idle_p99:?} over {} requests, during the control \
         waves p99 {control_p99:?} over {} requests, during the flood p99 {during_p99:?} over \
         {} requests",
        statuses.len(),
        statuses.len() - n401 - n503,
        idle.len(),
        control.len(),
        during.len()
    );
    assert_eq!(bare, vec![401; 2000], "the control waves");
    assert_eq!(statuses.len(), 2000);
    assert_eq!(n401 + n503, 2000, "{statuses:?}");
    assert!(n401 > 0, "no wrong password was verified");
    assert!(during.len() >= 100, "too few samples during the flood");
    // The verifications ran on the proxy's bcrypt threads, at the lowest priority.
    let sched = bcrypt_threads_sched(proxy.pid());
    assert!(
        !sched.is_empty() && sched.iter().all(|s| *s == (19, SCHED_IDLE)),
        "(nice, policy) of the bcrypt threads: {sched:?}"
    );
    // Only the authenticated client's requests reached the upstream.
    let got = up.requests();
    assert!(got
        .iter()
        .all(|r| r.header("authorization") == Some(right.as_str())));
    FloodP99 {
        idle: idle_p99,
        control: control_p99,
        during: during_p99,
    }
}

/// The authenticated client's p99 in one run of the flood test.
struct FloodP99 {
    /// Between waves.
    idle: Duration,
    /// During the control waves: as many requests, without credentials (nothing to verify).
    control: Duration,
    /// During the wrong-password waves.
    during: Duration,
}

/// The scheduling policy number of `SCHED_IDLE` (sched(7); /usr/include/linux/sched.h).
const SCHED_IDLE: i64 = 5;

/// The nice value and scheduling policy of each `bcrypt-N` thread of process `pid`, from /proc
/// (as `ps -L -o nice,policy` shows them).
fn bcrypt_threads_sched(pid: u32) -> Vec<(i64, i64)> {
    let mut sched = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.starts_with("bcrypt-") {
            // Fields after the command's closing parenthesis start at field 3 (state); the
            // nice value is field 19, the policy field 41 (proc(5)).
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .unwrap()
                .1
                .split_whitespace()
                .collect();
            sched.push((
                fields[19 - 3].parse().unwrap(),
                fields[41 - 3].parse().unwrap(),
            ));
        }
    }
    sched
}
