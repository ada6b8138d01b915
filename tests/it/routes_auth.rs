//! Routes and Basic authentication on one `tls = "optional"` listener, as the single well-known
//! port runs them: over plain HTTP a request that is not on a `plaintext` route gets 403 before
//! any 401 (a challenge there would invite the client to send its password in clear); the boot
//! routes are served without credentials over plain HTTP and TLS (iPXE sends none); everything
//! else over TLS needs the password. Asserted on what each upstream received.

use crate::support;

use std::time::Duration;
use support::proxy::{start_ready, Proxy};
use support::{curl, Sandbox, Upstream};

fn htpasswd_line(user: &str, password: &str) -> String {
    let h = bcrypt::hash_with_result(password, 5).unwrap();
    format!("{user}:{}\n", h.format_for_version(bcrypt::Version::TwoY))
}

fn config(sb: &Sandbox, admin: u16, port: u16, api: &Upstream, boot: &Upstream) -> String {
    format!(
        r#"
[identity]
trust = "{dir}/ca.crt"
cert = "{dir}/tls.crt"
key = "{dir}/tls.key"

[admin]
listen = "127.0.0.1:{admin}"

[[listeners]]
name = "api"
listen = "127.0.0.1:{port}"
tls = "optional"
upstream = "{api}"

[listeners.auth]
htpasswd = "{dir}/htpasswd"
realm = "Ironic API"

[[listeners.routes]]
paths = ["/boot.ipxe", "/pxelinux.cfg/*"]
methods = ["GET", "HEAD"]
plaintext = true
upstream = "{boot}"
"#,
        dir = sb.dir.path().display(),
        api = api.address(),
        boot = boot.address(),
    )
}

/// `curl -i` with `args`: (status, whether a `WWW-Authenticate` came with it).
fn status(args: &[&str]) -> (u16, bool) {
    let mut all = vec!["-s", "-i", "-o", "-"];
    all.extend_from_slice(args);
    let out = curl(&all);
    assert!(out.ok(), "curl failed: {out:?}");
    let first = out.stdout.lines().next().unwrap_or_default().to_owned();
    let code = first.split_whitespace().nth(1).unwrap().parse().unwrap();
    let challenge = out
        .stdout
        .to_ascii_lowercase()
        .contains("www-authenticate:");
    (code, challenge)
}

#[test]
fn plain_http_gets_403_before_any_challenge_and_boot_routes_need_no_credentials() {
    let sb = Sandbox::new();
    let api = Upstream::start(&sb.socket("api"));
    let boot = Upstream::start(&sb.socket("boot"));
    std::fs::write(sb.path("htpasswd"), htpasswd_line("admin", "s3cret")).unwrap();
    let proxy = start_ready(Duration::from_secs(10), || {
        let (admin, port) = (support::free_port(), support::free_port());
        let path = sb.path("proxy.toml");
        std::fs::write(&path, config(&sb, admin, port, &api, &boot)).unwrap();
        let ports = [("api".to_owned(), port)].into_iter().collect();
        Proxy::spawn(&path, admin, ports, false, None)
    });
    let ca = sb.path("ca.crt").display().to_string();
    let plain = |p: &str| proxy.http_url("api", p);
    let tls = |p: &str| proxy.url("api", p);

    // Plain HTTP: the API is refused outright, with or without credentials, and never
    // challenged; public API paths are no exception (they are not plaintext routes).
    for path in ["/v1/nodes", "/v1", "/", "/v1/lookup"] {
        assert_eq!(status(&[&plain(path)]), (403, false), "{path}");
        assert_eq!(
            status(&["-u", "admin:s3cret", &plain(path)]),
            (403, false),
            "{path} with credentials"
        );
    }
    // Boot routes over plain HTTP and over TLS: no credentials needed.
    assert_eq!(status(&[&plain("/boot.ipxe")]).0, 200);
    assert_eq!(status(&[&plain("/pxelinux.cfg/52-54-00-00-00-02")]).0, 200);
    assert_eq!(status(&["--cacert", &ca, &tls("/boot.ipxe")]).0, 200);
    // A boot route's path spelled to reach the API is refused, not forwarded anywhere.
    assert_eq!(
        status(&["--path-as-is", &plain("/pxelinux.cfg/../v1/nodes")]).0,
        400
    );
    assert_eq!(status(&[&plain("/pxelinux.cfg/%2e%2e/v1/nodes")]).0, 400);
    assert!(
        api.requests().is_empty(),
        "plain HTTP reached the API: {:?}",
        api.requests().len()
    );
    assert_eq!(boot.requests().len(), 3);

    // TLS: the API needs the password, except on its public paths.
    assert_eq!(status(&["--cacert", &ca, &tls("/v1/nodes")]), (401, true));
    assert_eq!(
        status(&["--cacert", &ca, "-u", "admin:wrong", &tls("/v1/nodes")]),
        (401, true)
    );
    assert!(
        api.requests().is_empty(),
        "unauthenticated request forwarded"
    );
    assert_eq!(
        status(&["--cacert", &ca, "-u", "admin:s3cret", &tls("/v1/nodes")]).0,
        200
    );
    assert_eq!(status(&["--cacert", &ca, &tls("/v1/lookup")]).0, 200);
    let seen: Vec<String> = api.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(seen, ["/v1/nodes", "/v1/lookup"]);
}
