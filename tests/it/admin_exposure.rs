//! `[admin]` exposure with the real binary and real curl: the admin listener binds exactly the
//! listed addresses; with `bearer_token_file`, `/metrics` needs the file's token (reloaded when
//! the file changes) while `/healthz` and `/readyz` stay open for probes.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;
use support::proxy::{command, start_ready};
use support::{curl, free_port, metric, Proxy, Sandbox, Tls, Upstream};

/// The sandbox's config with `[admin]` replaced by `admin` (TOML lines); returns the proxy,
/// waited for until ready on 127.0.0.1:`port`, the first listen address.
fn start_with_admin(sb: &Sandbox, up: &Upstream, port: u16, admin: &str) -> Proxy {
    start_ready(Duration::from_secs(10), || {
        let (config, old, ports) = sb
            .proxy()
            .listener("api", Tls::Server, &up.address())
            .write_config();
        let text = std::fs::read_to_string(&config).unwrap();
        let text = text.replace(
            &format!("[admin]\nlisten = \"127.0.0.1:{old}\"\n"),
            &format!("[admin]\n{admin}\n"),
        );
        assert!(text.contains(admin), "the [admin] table was replaced");
        std::fs::write(&config, text).unwrap();
        Proxy::spawn(&config, port, ports, false, None)
    })
}

/// A proxy whose admin listener is 127.0.0.1 only, with `/metrics` guarded by a token file
/// holding `token`: (proxy, admin port, the token file).
fn start_with_token(sb: &Sandbox, up: &Upstream, token: &str) -> (Proxy, u16, PathBuf) {
    let token_file = sb.path("metrics-token");
    write_token(&token_file, token);
    let port = free_port();
    let proxy = start_with_admin(
        sb,
        up,
        port,
        &format!(
            "listen = \"127.0.0.1:{port}\"\nbearer_token_file = {:?}",
            token_file.display().to_string()
        ),
    );
    (proxy, port, token_file)
}

/// `curl` on the admin listener: (status, headers and body as curl printed them).
fn get(url: &str, extra: &[&str]) -> (u16, String) {
    let mut args = vec!["-i", "-o", "-", "-w", "\n%{http_code}"];
    args.extend_from_slice(extra);
    args.push(url);
    let out = curl(&args);
    assert!(out.ok(), "curl {url}: {out:?}");
    let (body, code) = out.stdout.rsplit_once('\n').expect("status line");
    (code.trim().parse().expect("status"), body.to_owned())
}

fn write_token(path: &Path, token: &str) {
    // As `kubectl create secret --from-file` of an `echo`ed file: a trailing newline.
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, format!("{token}\n")).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn admin_binds_every_listed_address_and_no_other() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let (a, b, c) = (free_port(), free_port(), free_port());
    let proxy = start_with_admin(
        &sb,
        &up,
        a,
        &format!("listen = [\"127.0.0.1:{a}\", \"127.0.0.2:{b}\", \"[::1]:{c}\"]"),
    );
    for url in [
        format!("http://127.0.0.1:{a}/healthz"),
        format!("http://127.0.0.2:{b}/readyz"),
        format!("http://[::1]:{c}/metrics"),
    ] {
        assert_eq!(get(&url, &[]).0, 200, "{url}");
    }
    // Not the wildcard: the same ports on another loopback address have nothing listening.
    for url in [
        format!("http://127.0.0.3:{a}/healthz"),
        format!("http://127.0.0.1:{b}/healthz"),
        format!("http://127.0.0.3:{c}/healthz"),
    ] {
        let out = curl(&[&url]);
        assert_eq!(
            out.code,
            Some(7),
            "{url}: connection refused expected: {out:?}"
        );
    }
    drop(proxy);
}

#[test]
fn metrics_need_the_bearer_token_and_the_probes_stay_open() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let (proxy, port, _) = start_with_token(&sb, &up, "eyJhbGciOiJSUzI1NiJ9.c2NyYXBlcg.sig-_");
    let base = format!("http://127.0.0.1:{port}");

    // The probes need nothing (kubelet sends no credentials).
    assert_eq!(get(&format!("{base}/healthz"), &[]).0, 200);
    assert_eq!(get(&format!("{base}/readyz"), &[]).0, 200);

    // A refused scrape, three ways.
    let metrics = format!("{base}/metrics");
    let (status, text) = get(&metrics, &[]);
    assert_eq!(status, 401, "{text}");
    assert!(
        text.contains("www-authenticate: Bearer realm=\"ironic-proxy metrics\"")
            || text.contains("WWW-Authenticate: Bearer realm=\"ironic-proxy metrics\""),
        "{text}"
    );
    assert!(!text.contains("ironic_proxy_"), "no metric leaks: {text}");
    let (status, text) = get(&metrics, &["--oauth2-bearer", "not-the-token"]);
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("error=\"invalid_token\""), "{text}");
    let (status, text) = get(
        &metrics,
        &["-u", "prometheus:eyJhbGciOiJSUzI1NiJ9.c2NyYXBlcg.sig-_"],
    );
    assert_eq!(status, 401, "Basic is not Bearer: {text}");
    assert!(text.contains("error=\"invalid_request\""), "{text}");

    // The scrape Prometheus makes with `authorization: credentials`.
    let (status, text) = get(
        &metrics,
        &["--oauth2-bearer", "eyJhbGciOiJSUzI1NiJ9.c2NyYXBlcg.sig-_"],
    );
    assert_eq!(status, 200, "{text}");
    let auth = |outcome: &str| {
        metric(
            &text,
            "ironic_proxy_auth_total",
            &[("listener", "admin"), ("outcome", outcome)],
        )
    };
    assert_eq!(auth("no_credentials"), Some(1.0), "{text}");
    assert_eq!(auth("wrong_token"), Some(1.0));
    assert_eq!(auth("malformed"), Some(1.0));
    // This scrape is admitted before its answer is encoded: it counts itself.
    assert_eq!(auth("ok"), Some(1.0));
    drop(proxy);
}

#[test]
fn a_changed_token_file_is_followed_and_a_broken_one_keeps_the_last_token() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let (proxy, port, token_file) = start_with_token(&sb, &up, "first-token");
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    let logged = |what: &'static str| {
        proxy
            .wait_log(Duration::from_secs(10), move |l| l.contains(what))
            .unwrap_or_else(|| panic!("no log line {what:?}: {:#?}", proxy.logs()))
    };
    assert_eq!(get(&metrics, &["--oauth2-bearer", "first-token"]).0, 200);

    write_token(&token_file, "second-token");
    logged("metrics bearer token reloaded");
    assert_eq!(get(&metrics, &["--oauth2-bearer", "first-token"]).0, 401);
    assert_eq!(get(&metrics, &["--oauth2-bearer", "second-token"]).0, 200);

    // Emptied (a bad edit, a Secret half written): the last good token stays.
    std::fs::write(&token_file, "\n").unwrap();
    logged("metrics bearer token reload failed");
    let (status, text) = get(&metrics, &["--oauth2-bearer", "second-token"]);
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        metric(
            &text,
            "ironic_proxy_reload_failures_total",
            &[("what", "metrics_token")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "ironic_proxy_reloads_total",
            &[("what", "metrics_token")]
        ),
        Some(1.0)
    );
    let logs = proxy.logs().join("\n");
    assert!(
        !logs.contains("second-token"),
        "the token is never logged: {logs}"
    );
}

#[test]
fn a_missing_or_bad_token_file_stops_check_and_run_with_its_name() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let (config, old, _) = sb
        .proxy()
        .listener("api", Tls::Server, &up.address())
        .write_config();
    let missing = sb.path("no-such-token");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &format!("listen = \"127.0.0.1:{old}\"\n"),
        &format!(
            "listen = \"127.0.0.1:{old}\"\nbearer_token_file = {:?}\n",
            missing.display().to_string()
        ),
    );
    std::fs::write(&config, text).unwrap();
    for cmd in ["check", "run"] {
        let out = command(&[cmd, "--config", config.to_str().unwrap()], &[], &[]);
        assert_eq!(out.code, Some(1), "{cmd}: {out:?}");
        assert!(
            out.stderr.contains(&format!(
                "admin.bearer_token_file: cannot read {}",
                missing.display()
            )),
            "{cmd}: {}",
            out.stderr
        );
    }
    // A file that holds no token is refused as clearly.
    std::fs::write(&missing, "two words\n").unwrap();
    let out = command(&["check", "--config", config.to_str().unwrap()], &[], &[]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("is not one bearer token (byte 3"),
        "{}",
        out.stderr
    );
}

/// The sidecar profile's default, in a network namespace of its own with two pod IPs and an
/// address of the provisioning network on its loopback (needs root and `unshare`, like the
/// other namespace tests): the admin endpoints answer on the pod IPs and 127.0.0.1, nothing on
/// the provisioning address; `/metrics` needs the token.
#[test]
fn the_sidecar_profile_serves_admin_on_the_pod_ips_and_loopback_not_the_provisioning_network() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    support::node::ca_init(&ca, &[]);
    let token = dir.path().join("metrics-token");
    write_token(&token, "profile-token");
    let s = |p: &Path| p.display().to_string();
    let env = [
        ("POD_NAME", "ironic-0".to_owned()),
        ("POD_NAMESPACE", "metal3".to_owned()),
        ("POD_IPS", "10.9.0.5,fd00:9::5".to_owned()),
        ("IRONIC_PROXY_PEER_CIDRS", "10.9.0.0/24".to_owned()),
        ("IRONIC_PROXY_TRUST", s(&ca.join("ca.crt"))),
        ("IRONIC_PROXY_ISSUER_DIR", s(&ca)),
        ("IRONIC_PROXY_EXPORT_DIR", s(&dir.path().join("export"))),
        (
            "IRONIC_PROXY_API_SOCKET",
            s(&dir.path().join("ironic.sock")),
        ),
        (
            "IRONIC_PROXY_RPC_SOCKET",
            s(&dir.path().join("json-rpc.sock")),
        ),
        ("IRONIC_PROXY_PEERS", "none".to_owned()),
        ("IRONIC_PROXY_HTPASSWD", "none".to_owned()),
        ("IRONIC_PROXY_METRICS_TOKEN_FILE", s(&token)),
    ];
    let script = "set -e; ip link set lo up; ip addr add 10.9.0.5/32 dev lo; \
                  ip addr add 172.22.0.5/32 dev lo; ip addr add fd00:9::5/128 dev lo nodad; \
                  exec \"$0\" run --profile sidecar";
    let mut cmd = std::process::Command::new("unshare");
    cmd.args([
        "--net",
        "sh",
        "-c",
        script,
        env!("CARGO_BIN_EXE_ironic-proxy"),
    ])
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    for k in support::role::PROFILE_VARS
        .iter()
        .chain(&["IRONIC_PROXY_ADMIN_LISTEN", "IRONIC_PROXY_BIND"])
    {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let mut child = cmd.spawn().expect("unshare");
    // `unshare` without --fork and `exec` keep one PID: the proxy's, in the new namespace.
    let netns = format!("--net=/proc/{}/ns/net", child.id());
    let get = |url: &str, extra: &[&str]| {
        let mut args = vec![
            netns.as_str(),
            "curl",
            "-sS",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
        ];
        args.extend_from_slice(&["-w", "%{http_code}"]);
        args.extend_from_slice(extra);
        args.push(url);
        support::run(std::process::Command::new("nsenter").args(&args), b"")
    };
    let up = support::poll_until(Duration::from_secs(20), || {
        (get("http://127.0.0.1:9901/healthz", &[]).stdout == "200").then_some(())
    });
    let seen = [
        get("http://10.9.0.5:9901/healthz", &[]),
        get("http://[fd00:9::5]:9901/readyz", &[]),
        get("http://172.22.0.5:9901/healthz", &[]),
        get("http://10.9.0.5:9901/metrics", &[]),
        get(
            "http://10.9.0.5:9901/metrics",
            &["--oauth2-bearer", "profile-token"],
        ),
    ];
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        up.is_some(),
        "the sidecar's admin listener never answered on 127.0.0.1:9901"
    );
    let codes: Vec<(&str, Option<i32>)> =
        seen.iter().map(|o| (o.stdout.as_str(), o.code)).collect();
    assert_eq!(
        codes,
        [
            ("200", Some(0)),
            ("200", Some(0)),
            // Connection refused: nothing listens on the provisioning network's address.
            ("000", Some(7)),
            ("401", Some(0)),
            ("200", Some(0)),
        ],
        "{seen:#?}"
    );
}
