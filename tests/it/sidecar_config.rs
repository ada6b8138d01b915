//! Bad configurations through the real binary: `ironic-proxy check --config F` and
//! `ironic-proxy run --config F` each exit 1 with exactly one line on stderr that names the key.

use crate::support;

use std::path::Path;
use support::proxy::command;
use support::{Output, Sandbox, Tls};

const UNSET: &str = "IRONIC_PROXY_TEST_SURELY_UNSET";

/// A valid config for the sandbox, as text, with a mutual listener on a free port.
fn base(sb: &Sandbox) -> String {
    let (path, _, _) = sb
        .proxy()
        .listener(
            "json-rpc",
            Tls::Mutual,
            &format!("unix:{}", sb.socket("rpc").display()),
        )
        .allow(&["*.ironic.test", "ip:10.0.0.0/8"])
        .write_config();
    std::fs::read_to_string(path).unwrap()
}

fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in config:\n{text}");
    text.replacen(from, to, 1)
}

fn ironic_proxy(sub: &str, config: &Path) -> Output {
    command(&[sub, "--config", config.to_str().unwrap()], &[], &[UNSET])
}

/// Both `check` and `run` refuse the config: exit 1, one stderr line containing every `needle`.
fn assert_refused(config: &Path, needles: &[&str]) {
    for sub in ["check", "run"] {
        let out = ironic_proxy(sub, config);
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(out.code, Some(1), "{sub}: exit code; {out:?}");
        assert_eq!(lines.len(), 1, "{sub}: exactly one line on stderr; {out:?}");
        for n in needles {
            assert!(
                lines[0].contains(n),
                "{sub}: {n:?} not named in {:?}",
                lines[0]
            );
        }
        if sub == "check" {
            assert!(
                out.stdout.is_empty(),
                "no effective config on failure: {out:?}"
            );
        }
    }
}

#[test]
fn a_valid_config_checks_and_prints_the_effective_config() {
    let sb = Sandbox::new();
    let cfg = sb.path("good.toml");
    std::fs::write(&cfg, base(&sb)).unwrap();
    let out = ironic_proxy("check", &cfg);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("json-rpc"), "{out:?}");
    assert!(out.stdout.contains("mutual"), "{out:?}");
    assert!(!out.stdout.contains("PRIVATE KEY"), "no secrets: {out:?}");
}

#[test]
fn a_missing_file_names_its_key() {
    let sb = Sandbox::new();
    let text = base(&sb);
    let tls_crt = sb.path("tls.crt").display().to_string();
    let tls_key = sb.path("tls.key").display().to_string();
    let ca_crt = sb.path("ca.crt").display().to_string();
    for (key, from) in [
        ("identity.cert", &tls_crt),
        ("identity.key", &tls_key),
        ("identity.trust", &ca_crt),
    ] {
        let missing = sb.path("missing.pem").display().to_string();
        let cfg = sb.path("missing-file.toml");
        std::fs::write(
            &cfg,
            edit(&text, &format!("\"{from}\""), &format!("\"{missing}\"")),
        )
        .unwrap();
        assert_refused(&cfg, &[key, &missing]);
    }
    // Present but not a certificate: also named.
    std::fs::write(sb.path("tls.crt"), "not a certificate\n").unwrap();
    let cfg = sb.path("garbage.toml");
    std::fs::write(&cfg, &text).unwrap();
    assert_refused(&cfg, &["identity.cert", &tls_crt]);
}

#[test]
fn a_missing_config_file_is_named() {
    let sb = Sandbox::new();
    let cfg = sb.path("no-such-config.toml");
    assert_refused(&cfg, &[cfg.to_str().unwrap()]);
}

#[test]
fn an_unset_variable_names_the_key_and_the_variable() {
    let sb = Sandbox::new();
    let cfg = sb.path("unset.toml");
    let text = base(&sb);
    let listen = text
        .lines()
        .find(|l| l.starts_with("listen = \"127.0.0.1:") && !l.contains("admin"))
        .unwrap()
        .to_owned();
    let port = listen
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('"')
        .to_owned();
    // The second [listen] line is the listener's (the first is [admin]).
    let listener_listen = text
        .lines()
        .filter(|l| l.starts_with("listen = "))
        .nth(1)
        .unwrap();
    let with_var = format!("listen = \"${{{UNSET}}}\"");
    std::fs::write(&cfg, edit(&text, listener_listen, &with_var)).unwrap();
    assert_refused(&cfg, &["listeners[0].listen", UNSET]);
    // With a default, the same config is fine.
    let with_default = format!("listen = \"${{{UNSET}:-127.0.0.1:{port}}}\"");
    std::fs::write(&cfg, edit(&text, listener_listen, &with_default)).unwrap();
    let out = ironic_proxy("check", &cfg);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn an_unknown_key_is_named() {
    let sb = Sandbox::new();
    let text = base(&sb);
    let cfg = sb.path("unknown.toml");
    std::fs::write(
        &cfg,
        edit(&text, "[limits]\n", "[limits]\nmax_conections = 5\n"),
    )
    .unwrap();
    assert_refused(&cfg, &["limits", "max_conections"]);
    std::fs::write(
        &cfg,
        edit(&text, "tls = \"mutual\"\n", "tls = \"mutual\"\nalow = []\n"),
    )
    .unwrap();
    assert_refused(&cfg, &["listeners[0]", "alow"]);
}

#[test]
fn a_bad_duration_is_named() {
    let sb = Sandbox::new();
    let text = base(&sb);
    let cfg = sb.path("duration.toml");
    std::fs::write(
        &cfg,
        edit(
            &text,
            "idle_timeout = \"10s\"",
            "idle_timeout = \"10 parsecs\"",
        ),
    )
    .unwrap();
    assert_refused(&cfg, &["limits.idle_timeout", "10 parsecs"]);
}

#[test]
fn a_bad_cidr_is_named() {
    let sb = Sandbox::new();
    let text = base(&sb);
    let cfg = sb.path("cidr.toml");
    std::fs::write(&cfg, edit(&text, "\"ip:10.0.0.0/8\"", "\"ip:10.0.0.0/33\"")).unwrap();
    assert_refused(&cfg, &["listeners[0].allow[1]", "10.0.0.0/33"]);
}

#[test]
fn a_bad_listen_address_is_named() {
    let sb = Sandbox::new();
    let text = base(&sb);
    let listener_listen = text
        .lines()
        .filter(|l| l.starts_with("listen = "))
        .nth(1)
        .unwrap();
    let cfg = sb.path("listen.toml");
    for (bad, named) in [
        ("127.0.0.1:99999", "127.0.0.1:99999"),
        ("localhost", "localhost"),
        ("unix:relative.sock", "relative.sock"),
    ] {
        std::fs::write(
            &cfg,
            edit(&text, listener_listen, &format!("listen = \"{bad}\"")),
        )
        .unwrap();
        assert_refused(&cfg, &["listeners[0].listen", named]);
    }
}

#[test]
fn a_wrong_type_or_missing_field_is_named_on_one_line() {
    let sb = Sandbox::new();
    let text = base(&sb);
    let cfg = sb.path("types.toml");
    std::fs::write(
        &cfg,
        edit(
            &text,
            "[limits]\n",
            "[limits]\nmax_connections = \"many\"\n",
        ),
    )
    .unwrap();
    assert_refused(&cfg, &["limits.max_connections"]);
    let upstream_line = text.lines().find(|l| l.starts_with("upstream = ")).unwrap();
    std::fs::write(&cfg, edit(&text, upstream_line, "")).unwrap();
    assert_refused(&cfg, &["listeners[0]", "upstream"]);
}

#[test]
fn invalid_toml_is_reported_on_one_line_with_its_position() {
    let sb = Sandbox::new();
    let text = base(&sb);
    let cfg = sb.path("syntax.toml");
    let broken = edit(&text, "[limits]", "[limits");
    let line = broken.lines().position(|l| l == "[limits").unwrap() + 1;
    std::fs::write(&cfg, broken).unwrap();
    assert_refused(&cfg, &["TOML", &format!("line {line}")]);
}
