//! `[tls]` parsing: what is accepted, dropped and refused, and what `check` prints.

use super::*;

fn parse(text: &str) -> (TlsPolicy, Vec<String>) {
    let v: toml::Value = toml::from_str(text).unwrap();
    let mut errs = Vec::new();
    let p = from_toml(v, &mut |path, e| errs.push(format!("{path}: {e}")));
    (p, errs)
}

#[test]
#[cfg(feature = "fips")]
fn a_fips_build_drops_what_is_not_approved() {
    let (p, e) = parse(
        "cipher_suites = [\"TLS_AES_128_GCM_SHA256\", \"TLS_CHACHA20_POLY1305_SHA256\"]\n\
         groups = [\"secp256r1\", \"X25519\"]",
    );
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(p.dropped, ["TLS_CHACHA20_POLY1305_SHA256", "X25519"]);
    assert!(crate::crypto::fips());
}

#[test]
#[cfg(not(feature = "fips"))]
fn openshift_profiles_are_expressible() {
    // Modern: TLS 1.3 only, its three suites.
    let (p, e) = parse(
        "min_version = \"1.3\"\ncipher_suites = [\"TLS_AES_128_GCM_SHA256\", \
         \"TLS_AES_256_GCM_SHA384\", \"TLS_CHACHA20_POLY1305_SHA256\"]",
    );
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(p.versions().len(), 1);
    // Intermediate, OpenSSL spellings as the profile lists them (without DHE).
    let (p, e) = parse(
        "min_version = \"1.2\"\ncipher_suites = [\"TLS_AES_128_GCM_SHA256\", \
         \"TLS_AES_256_GCM_SHA384\", \"TLS_CHACHA20_POLY1305_SHA256\", \
         \"ECDHE-ECDSA-AES128-GCM-SHA256\", \"ECDHE-RSA-AES128-GCM-SHA256\", \
         \"ECDHE-ECDSA-AES256-GCM-SHA384\", \"ECDHE-RSA-AES256-GCM-SHA384\", \
         \"ECDHE-ECDSA-CHACHA20-POLY1305\", \"ECDHE-RSA-CHACHA20-POLY1305\"]\n\
         groups = [\"X25519\", \"P-256\", \"secp384r1\"]",
    );
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(p.cipher_suites.as_ref().unwrap().len(), 9);
    assert!(p
        .render()
        .contains("groups = [\"X25519\", \"secp256r1\", \"secp384r1\"]"));
}

#[test]
fn bad_names_and_inconsistent_sets_name_the_key() {
    let (_, e) =
        parse("cipher_suites = [\"TLS_AES_128_GCM_SHA256\", \"X\", \"DHE-RSA-AES128-GCM-SHA257\"]");
    assert!(e[0].starts_with("tls.cipher_suites[1]: unknown"), "{e:?}");
    assert!(e[1].starts_with("tls.cipher_suites[2]: unknown"), "{e:?}");
    let (_, e) =
        parse("min_version = \"1.3\"\ncipher_suites = [\"ECDHE-ECDSA-AES128-GCM-SHA256\"]");
    assert!(e[0].starts_with("tls.cipher_suites: min_version"), "{e:?}");
    let (_, e) = parse("groups = [\"X25519\", \"brainpoolP256r1\"]\nmin_version = \"1.1\"");
    assert!(e.iter().any(|x| x.starts_with("tls.groups[1]")), "{e:?}");
    assert!(e.iter().any(|x| x.starts_with("tls.min_version")), "{e:?}");
    let (_, e) = parse("ciphers = []");
    assert!(e[0].starts_with("tls"), "{e:?}");
    let (_, e) = parse("groups = []\ncipher_suites = []");
    assert_eq!(e.len(), 2, "{e:?}");
}

#[test]
fn known_names_this_build_cannot_offer_are_dropped_unless_nothing_is_left() {
    // OpenShift's Old profile lists CBC, RSA key exchange and 3DES suites; its groups
    // include secp521r1 and SecP384r1MLKEM1024, which rustls does not implement.
    let (p, e) = parse(
        "cipher_suites = [\"TLS_AES_128_GCM_SHA256\", \"ECDHE-RSA-AES128-SHA\", \
         \"des-cbc3-sha\", \"TLS_AES_128_CCM_SHA256\"]\n\
         groups = [\"secp384r1\", \"SECP521R1\", \"SecP384r1MLKEM1024\", \"ffdhe2048\"]",
    );
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(p.cipher_suites.as_ref().map(Vec::len), Some(1));
    assert_eq!(p.groups.as_ref().map(Vec::len), Some(1));
    assert_eq!(p.dropped.len(), 6, "{:?}", p.dropped);
    assert!(p.render().contains(
        "# dropped, not offered by this build: ECDHE-RSA-AES128-SHA, des-cbc3-sha, \
         TLS_AES_128_CCM_SHA256, SECP521R1, SecP384r1MLKEM1024, ffdhe2048"
    ));
    let (_, e) = parse("groups = [\"secp521r1\"]\ncipher_suites = [\"AES128-SHA\"]");
    assert!(e[0].starts_with("tls.cipher_suites: no suite"), "{e:?}");
    assert!(e[0].contains("AES128-SHA"), "{e:?}");
    assert!(e[1].starts_with("tls.groups: no group"), "{e:?}");
}
