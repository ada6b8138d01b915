//! The certificate, key and trust loading path on arbitrary bytes, and the client identity a
//! mutual listener derives from a certificate: nothing panics, and for every certificate that
//! parses, `xfcc()` is a valid HTTP header value (it goes upstream verbatim) and the log name
//! is printable.
//!
//! The input is written to a file and loaded as a chain, a key and a trust bundle exactly as
//! the identity module does at start-up and on reload (`load_files`: the same file as cert, key
//! and trust, so a PEM holding a leaf, its key and a CA builds a whole identity, then the TLS
//! server configurations of both listener kinds); every certificate of a chain that loads, and
//! the raw input as DER, go through `ClientIdentity::from_der`.
#![no_main]

use http::HeaderValue;
use ironic_proxy::allow::AllowRule;
use ironic_proxy::config::{IdentityConfig, IdentitySource, TlsMode};
use ironic_proxy::ClientIdentity;
use ironic_proxy::{load_chain, load_files, load_key, load_trust};
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The scratch file, and an identity configuration using it as cert, key and trust.
fn scratch() -> &'static (PathBuf, IdentityConfig) {
    static FILE: OnceLock<(PathBuf, IdentityConfig)> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("ironic-proxy-fuzz-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir is writable");
        let path = dir.join("input.pem");
        let cfg = IdentityConfig {
            trust: path.clone(),
            source: IdentitySource::Files {
                cert: path.clone(),
                key: path.clone(),
            },
            export: None,
            watch_interval: std::time::Duration::from_secs(1),
        };
        (path, cfg)
    })
}

fn rules() -> &'static [AllowRule] {
    static RULES: OnceLock<Vec<AllowRule>> = OnceLock::new();
    RULES.get_or_init(|| {
        [
            "*.ironic.metal3.svc",
            "conductor-0.example.org",
            "ip:10.0.0.0/8",
            "ip:fd00::/8",
        ]
        .iter()
        .map(|r| r.parse().expect("valid rule"))
        .collect()
    })
}

fn check_identity(der: &[u8]) {
    let Some(id) = ClientIdentity::from_der(der) else {
        return;
    };
    let xfcc = id.xfcc();
    if let Err(e) = HeaderValue::from_str(&xfcc) {
        panic!("xfcc is not a valid header value ({e}): {xfcc:?}");
    }
    assert!(xfcc.starts_with("Hash="), "{xfcc:?}");
    let _ = id.is_allowed(rules());
    let _ = id.display_name();
}

fuzz_target!(|data: &[u8]| {
    check_identity(data);
    let (path, cfg) = scratch();
    if std::fs::write(path, data).is_err() {
        return;
    }
    if let Ok(chain) = load_chain(path) {
        assert!(!chain.certs.is_empty(), "a loaded chain has a leaf");
        for cert in &chain.certs {
            check_identity(cert.as_ref());
        }
    }
    let _ = load_key(path);
    let _ = load_trust(path);
    if let Ok(material) = load_files(cfg, path, path) {
        for mode in [TlsMode::Server, TlsMode::Mutual] {
            let _ = ironic_proxy::server_config(&material, mode, true);
        }
    }
});
