//! Certificate and trust reload in the real binary: files renamed over the old ones with
//! SIGHUP, a Kubernetes Secret volume's `..data` symlink swap picked up by polling
//! (`identity.watch_interval`), a bad new file keeping the last good one. New handshakes present
//! the new certificate; connections opened before keep working.

use crate::support;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use support::{
    poll_until, run, tls_client_config, HttpConn, Leaf, Proxy, ProxyBuilder, Sandbox, Tls, Upstream,
};

/// The leaf a fresh handshake on `listener` presents.
fn presented(proxy: &Proxy, listener: &str, cfg: &Arc<rustls::ClientConfig>) -> Vec<u8> {
    HttpConn::tls(proxy.addr(listener), cfg.clone())
        .expect("handshake")
        .peer_leaf()
}

/// Polls fresh handshakes until one presents `leaf`.
fn wait_presented(proxy: &Proxy, listener: &str, cfg: &Arc<rustls::ClientConfig>, leaf: &Leaf) {
    let seen = poll_until(Duration::from_secs(5), || {
        (presented(proxy, listener, cfg) == leaf.der).then_some(())
    });
    assert!(
        seen.is_some(),
        "new handshakes must present the new certificate (serial {:x})",
        leaf.serial
    );
}

/// Writes a file next to `dest` and renames it over `dest` (atomic replace).
fn rename_over(dest: &Path, contents: &str) {
    let tmp = dest.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, dest).unwrap();
}

/// SHA-256 fingerprint of the certificate `openssl s_client` is shown, as openssl prints it.
fn openssl_fingerprint(port: u16, ca: &Path) -> String {
    let script = format!(
        "openssl s_client -connect 127.0.0.1:{port} -servername localhost -CAfile {} \
         </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256",
        ca.display()
    );
    let out = run(Command::new("sh").arg("-c").arg(script), b"");
    assert!(out.ok(), "{out:?}");
    out.stdout
        .trim()
        .rsplit('=')
        .next()
        .unwrap()
        .replace(':', "")
        .to_lowercase()
}

/// A sandbox whose proxy has one server listener, `api`, and looks at its files every `watch`
/// (and on SIGHUP); the upstream; and a client config trusting the sandbox CA.
fn serving_api(watch: &str) -> (Sandbox, Upstream, Proxy, Arc<rustls::ClientConfig>) {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let proxy = sb
        .proxy_to(&up, &[("api", Tls::Server)])
        .watch_interval(watch)
        .start();
    let cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    (sb, up, proxy, cfg)
}

#[test]
fn sighup_after_renaming_new_files_over_serves_the_new_certificate() {
    // Polling practically off: only SIGHUP can make the proxy notice.
    let (sb, up, proxy, cfg) = serving_api("1h");
    let mut old = HttpConn::tls(proxy.addr("api"), cfg.clone()).unwrap();
    assert_eq!(old.get("/before").unwrap().status, 200);
    assert_eq!(old.peer_leaf(), sb.server.der);
    // The file watcher's first look (its interval's first tick, at start) would legitimately
    // notice a change made before it. The watcher handles one wake-up at a time, and that tick
    // is ready from the start, so once it has answered a SIGHUP (unchanged files: a forced
    // reload, logged and counted) the first look is behind it and only SIGHUP can reload.
    proxy.signal("HUP");
    proxy.wait_metric(
        "ironic_proxy_reloads_total",
        &[("what", "certificate")],
        Duration::from_secs(10),
        |v| v >= 1.0,
    );

    let new = sb.ca.server_leaf();
    rename_over(&sb.path("tls.crt"), &new.cert_pem);
    rename_over(&sb.path("tls.key"), &new.key_pem);
    // Polling is off, so the old certificate stays until SIGHUP (and the logs below show that
    // every reload was a forced one).
    assert_eq!(
        presented(&proxy, "api", &cfg),
        sb.server.der,
        "without SIGHUP (and with polling off) the old certificate is still served"
    );

    proxy.signal("HUP");
    wait_presented(&proxy, "api", &cfg, &new);
    assert_eq!(
        openssl_fingerprint(proxy.port("api"), &sb.path("ca.crt")),
        new.sha256(),
        "openssl s_client sees the new certificate"
    );

    // The connection from before the swap still works (and still has the old certificate).
    assert_eq!(old.get("/after").unwrap().status, 200);
    assert_eq!(old.peer_leaf(), sb.server.der);

    // The barrier's reload and SIGHUP's, both forced: none came from polling.
    assert_eq!(
        proxy.metric("ironic_proxy_reloads_total", &[("what", "certificate")]),
        2.0
    );
    let reloads: Vec<String> = proxy
        .logs()
        .into_iter()
        .filter(|l| l.contains("identity reloaded from files"))
        .collect();
    assert!(
        reloads.len() == 2 && reloads.iter().all(|l| l.contains("forced=true")),
        "every reload came from SIGHUP: {reloads:#?}"
    );
    assert_eq!(
        proxy.metric(
            "ironic_proxy_certificate_expiry_timestamp_seconds",
            &[("certificate", "leaf")]
        ),
        new.not_after.unix_timestamp() as f64
    );
    let paths: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/before", "/after"]);
}

#[test]
fn plain_rename_is_picked_up_by_polling_without_sighup() {
    let (sb, _up, proxy, cfg) = serving_api("200ms");
    let mut old = HttpConn::tls(proxy.addr("api"), cfg.clone()).unwrap();
    assert_eq!(old.get("/before").unwrap().status, 200);

    let new = sb.ca.server_leaf();
    rename_over(&sb.path("tls.key"), &new.key_pem);
    rename_over(&sb.path("tls.crt"), &new.cert_pem);
    wait_presented(&proxy, "api", &cfg, &new);
    assert_eq!(old.get("/after").unwrap().status, 200);
}

/// A Secret volume as the kubelet writes it: `<dir>/..<ts>/{files}`, `..data -> ..<ts>`, and
/// `<dir>/<file> -> ..data/<file>`.
fn write_secret_generation(dir: &Path, ts: &str, files: &[(&str, &str)]) {
    let generation = dir.join(ts);
    std::fs::create_dir_all(&generation).unwrap();
    for (name, contents) in files {
        std::fs::write(generation.join(name), contents).unwrap();
    }
}

fn swap_secret_data(dir: &Path, ts: &str) {
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(ts, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[test]
fn kubernetes_secret_symlink_swap_reloads_certificate_and_trust_without_sighup() {
    let sb = Sandbox::new();
    let up = Upstream::start(&sb.socket("api"));
    let secret = sb.path("secret");
    write_secret_generation(
        &secret,
        "..2026_01_01_00_00_00.1",
        &[
            ("tls.crt", &sb.server.cert_pem),
            ("tls.key", &sb.server.key_pem),
            ("ca.crt", &sb.ca.pem),
        ],
    );
    swap_secret_data(&secret, "..2026_01_01_00_00_00.1");
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        symlink(format!("..data/{f}"), secret.join(f)).unwrap();
    }
    let proxy = ProxyBuilder::new(sb.dir.path())
        .identity(
            &secret.join("ca.crt"),
            &secret.join("tls.crt"),
            &secret.join("tls.key"),
        )
        .watch_interval("200ms")
        .listener("api", Tls::Server, &up.address())
        .listener("json-rpc", Tls::Mutual, &up.address())
        .start();

    // A second CA appears in the new bundle (CA rotation); its clients are refused before.
    let ca2 = support::Ca::new("next CA");
    let client1 = sb.ca.client_leaf(&["conductor-1.ironic.test"]);
    let client2 = ca2.client_leaf(&["conductor-2.ironic.test"]);
    let server_cfg = tls_client_config(&sb.ca.pem, None, &[b"http/1.1"]);
    let rpc_cfg1 = tls_client_config(&sb.ca.pem, Some(&client1), &[b"http/1.1"]);
    let rpc_cfg2 = tls_client_config(&sb.ca.pem, Some(&client2), &[b"http/1.1"]);
    let mut old_api = HttpConn::tls(proxy.addr("api"), server_cfg.clone()).unwrap();
    assert_eq!(old_api.get("/api-before").unwrap().status, 200);
    let mut old_rpc = HttpConn::tls(proxy.addr("json-rpc"), rpc_cfg1.clone()).unwrap();
    assert_eq!(old_rpc.get("/rpc-before").unwrap().status, 200);
    let mut c2 = HttpConn::tls(proxy.addr("json-rpc"), rpc_cfg2.clone()).unwrap();
    assert!(c2.get("/ca2-before").is_err(), "CA2 is not trusted yet");

    let new = sb.ca.server_leaf();
    let bundle = format!("{}{}", sb.ca.pem, ca2.pem);
    write_secret_generation(
        &secret,
        "..2026_01_02_00_00_00.2",
        &[
            ("tls.crt", &new.cert_pem),
            ("tls.key", &new.key_pem),
            ("ca.crt", &bundle),
        ],
    );
    swap_secret_data(&secret, "..2026_01_02_00_00_00.2");
    std::fs::remove_dir_all(secret.join("..2026_01_01_00_00_00.1")).unwrap();

    wait_presented(&proxy, "api", &server_cfg, &new);
    wait_presented(&proxy, "json-rpc", &rpc_cfg1, &new);
    let mut c2 = HttpConn::tls(proxy.addr("json-rpc"), rpc_cfg2).unwrap();
    assert_eq!(c2.get("/ca2-after").unwrap().status, 200, "CA2 trusted now");

    assert_eq!(old_api.get("/api-after").unwrap().status, 200);
    assert_eq!(old_rpc.get("/rpc-after").unwrap().status, 200);
    let paths: Vec<String> = up.all().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        paths,
        [
            "/api-before",
            "/rpc-before",
            "/ca2-after",
            "/api-after",
            "/rpc-after"
        ]
    );
}

#[test]
fn a_bad_new_certificate_keeps_the_last_good_one() {
    let (sb, _up, proxy, cfg) = serving_api("1h");

    // Garbage, then a certificate whose key does not match: both refused.
    let other = sb.ca.server_leaf();
    for (what, crt) in [
        ("garbage", "not a certificate\n"),
        ("mismatched key", &other.cert_pem),
    ] {
        let failures = || {
            proxy.metric(
                "ironic_proxy_reload_failures_total",
                &[("what", "certificate")],
            )
        };
        let before = failures();
        rename_over(&sb.path("tls.crt"), crt);
        proxy.signal("HUP");
        let failed = poll_until(support::HANG, || (failures() > before).then_some(()));
        assert!(failed.is_some(), "{what}: reload failure must be counted");
        assert_eq!(
            presented(&proxy, "api", &cfg),
            sb.server.der,
            "{what}: old cert kept"
        );
        let mut c = HttpConn::tls(proxy.addr("api"), cfg.clone()).unwrap();
        assert_eq!(c.get("/still-serving").unwrap().status, 200, "{what}");
    }
    assert!(
        proxy
            .logs()
            .iter()
            .any(|l| l.contains("WARN") && l.contains("reload failed")),
        "a warning is logged: {:?}",
        proxy.logs()
    );

    // The matching key arrives: the new certificate is served.
    rename_over(&sb.path("tls.key"), &other.key_pem);
    proxy.signal("HUP");
    wait_presented(&proxy, "api", &cfg, &other);
}
