//! The access log is written in batches (`src/logging/`): a real process that served N requests
//! and got SIGTERM has written all N lines when it exits, in text and in JSON, including the
//! line of a request that was still in flight when the signal came.

use crate::support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{json_object, poll_until, tls_client_config, HttpConn, Sandbox, Tls, Upstream};

const REQUESTS: usize = 300;

/// Runs the binary with `RUST_LOG=warn,access=info` (no `ready`/`draining` info lines that
/// would flush the buffer on their way out), stderr into a file; sends `REQUESTS` requests on
/// three keep-alive connections and one slow request, SIGTERMs it right after the last fast
/// answer, and returns the access lines it wrote before it exited.
fn serve_then_sigterm(json: bool) -> Vec<String> {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let builder = sb.proxy().listener("api", Tls::Server, &up.address());
    let (config, admin, ports) = builder.write_config();
    let stderr_path = sb.path("stderr.log");
    let mut cmd = Command::new(support::proxy::BIN);
    if json {
        cmd.args(["--log-format", "json"]);
    }
    let mut child = cmd
        .arg("run")
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn,access=info")
        .env_remove("IRONIC_PROXY_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], admin));
    let ready = poll_until(Duration::from_secs(10), || {
        let mut c = HttpConn::tcp(admin).ok()?;
        (c.get("/readyz").ok()?.status == 200).then_some(())
    });
    assert!(ready.is_some(), "not ready: {}", read(&stderr_path));

    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], ports["api"]));
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let slow = {
        let cfg = cfg.clone();
        std::thread::spawn(move || {
            let mut c = HttpConn::tls(addr, cfg).unwrap();
            c.get("/slow?delay_ms=700").unwrap().status
        })
    };
    up.wait_for(1, Duration::from_secs(5));
    let mut conns: Vec<_> = (0..3)
        .map(|_| HttpConn::tls(addr, cfg.clone()).unwrap())
        .collect();
    for i in 0..REQUESTS {
        let r = conns[i % 3].get(&format!("/n/{i}")).unwrap();
        assert_eq!(r.status, 200);
    }
    let kill = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(kill.success());
    drop(conns);
    assert_eq!(slow.join().unwrap(), 200, "the in-flight request completes");

    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0), "{}", read(&stderr_path));
    read(&stderr_path)
        .lines()
        .filter(|l| l.contains(" access:") || l.contains("\"target\":\"access\""))
        .map(str::to_owned)
        .collect()
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// Each request's path once, the slow one with its status.
fn check(lines: &[String], path_and_status: impl Fn(&str) -> (String, String)) {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for l in lines {
        let (path, status) = path_and_status(l);
        assert_eq!(status, "200", "{l}");
        *seen.entry(path).or_default() += 1;
    }
    for i in 0..REQUESTS {
        assert_eq!(seen.get(&format!("/n/{i}")), Some(&1), "/n/{i}");
    }
    assert_eq!(seen.get("/slow"), Some(&1), "the in-flight request's line");
    assert_eq!(lines.len(), REQUESTS + 1);
}

#[test]
fn sigterm_loses_no_access_line_in_json() {
    let lines = serve_then_sigterm(true);
    let f = json_object(&lines[0]);
    assert_eq!(f["target"], "access");
    check(&lines, |l| {
        // One python run per line would take seconds: the two members by hand.
        let member = |key: &str| {
            let rest = &l[l.find(key).unwrap_or_else(|| panic!("{key} in {l}")) + key.len()..];
            rest[..rest.find(['"', ',']).unwrap()].to_owned()
        };
        (member(r#""path":""#), member(r#""status":"#))
    });
}

#[test]
fn sigterm_loses_no_access_line_in_text() {
    let lines = serve_then_sigterm(false);
    check(&lines, |l| {
        let field = |name: &str| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name} in {l}"))
                .to_owned()
        };
        (field("path"), field("status"))
    });
}
