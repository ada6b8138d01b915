use super::*;
use DnsNameError as E;

/// `n` characters: labels of 63 `a`s joined by dots, the last one shorter.
fn long_name(n: usize) -> String {
    let mut s = String::new();
    while s.len() < n {
        let label = (n - s.len()).min(MAX_LABEL);
        s.push_str(&"a".repeat(label));
        if s.len() + 1 < n {
            s.push('.');
        }
    }
    s
}

/// What rustls accepts for the name without one trailing dot (pki-types itself would also take
/// one more trailing dot there, which our normal form has already removed).
fn rustls_accepts(s: &str) -> bool {
    let bare = s.strip_suffix('.').unwrap_or(s);
    !bare.ends_with('.') && rustls_pki_types::DnsName::try_from(bare).is_ok()
}

#[test]
fn names_parse_to_their_normal_form_or_say_why_not() {
    let n253 = long_name(253);
    let n254 = long_name(254);
    let label63 = format!("{}.example", "b".repeat(63));
    let label64 = format!("{}.example", "b".repeat(64));
    let dotted253 = format!("{n253}.");
    let cases: Vec<(&str, Result<&str, DnsNameError>)> = vec![
        ("", Err(E::Empty)),
        (".", Err(E::Empty)),
        ("localhost", Ok("localhost")),
        (
            "conductor-0.ironic.metal3.svc",
            Ok("conductor-0.ironic.metal3.svc"),
        ),
        (&n253, Ok(&n253)),
        (&dotted253, Ok(&n253)),
        (&n254, Err(E::TooLong)),
        (&label63, Ok(&label63)),
        (&label64, Err(E::LabelTooLong)),
        (
            "_api._tcp.ironic.metal3.svc",
            Ok("_api._tcp.ironic.metal3.svc"),
        ),
        ("a_b.example", Ok("a_b.example")),
        ("-a.example", Err(E::Hyphen)),
        ("a-.example", Err(E::Hyphen)),
        ("a.-b", Err(E::Hyphen)),
        ("a.b-", Err(E::Hyphen)),
        ("xn--caf-dma.example", Ok("xn--caf-dma.example")),
        ("123.example", Ok("123.example")),
        ("host.123", Err(E::NumericLast)),
        ("10.0.0.1", Err(E::NumericLast)),
        ("0", Err(E::NumericLast)),
        ("a.0x1f", Err(E::NumericLast)),
        ("a.0X1F", Err(E::NumericLast)),
        ("a.0x", Err(E::NumericLast)),
        ("a.0x1g", Ok("a.0x1g")),
        ("a.1a", Ok("a.1a")),
        ("a.example.", Ok("a.example")),
        ("a.example..", Err(E::EmptyLabel)),
        ("a..b", Err(E::EmptyLabel)),
        (".a", Err(E::EmptyLabel)),
        ("Conductor-0.IRONIC.Svc", Ok("conductor-0.ironic.svc")),
        ("é.com", Err(E::Character('é'))),
        ("xn--caf-dma.é", Err(E::Character('é'))),
        ("a\0b.example", Err(E::Character('\0'))),
        ("a b.example", Err(E::Character(' '))),
        (" a.example", Err(E::Character(' '))),
        ("a.example\n", Err(E::Character('\n'))),
        ("a*.example", Err(E::Character('*'))),
        ("*.example.com", Err(E::Character('*'))),
        ("a:80", Err(E::Character(':'))),
    ];
    for (input, want) in cases {
        let got = DnsName::parse(input);
        assert_eq!(
            got.as_ref().map(DnsName::as_str).map_err(|e| *e),
            want,
            "{input:?}"
        );
        assert_eq!(
            got.is_ok(),
            rustls_accepts(input),
            "{input:?}: rustls disagrees"
        );
    }
}

/// Every string of up to four characters over the alphabet that exercises each rule: the hand
/// written reasons accept exactly what pki-types accepts, and never fall back to `Syntax`.
#[test]
fn reasons_agree_with_pki_types_on_every_short_string() {
    let alphabet = ['a', 'Z', '0', '1', 'x', 'f', '-', '_', '.', '*', ' ', 'é'];
    let mut inputs = vec![String::new()];
    let mut last = vec![String::new()];
    for _ in 0..4 {
        last = last
            .iter()
            .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
            .collect();
        inputs.extend(last.iter().cloned());
    }
    for input in &inputs {
        let got = DnsName::parse(input);
        assert_ne!(got, Err(E::Syntax), "{input:?}");
        assert_eq!(got.is_ok(), rustls_accepts(input), "{input:?}: {got:?}");
    }
}

#[test]
fn wildcards_are_one_whole_leftmost_label_before_two_more() {
    let cases: Vec<(&str, Result<&str, DnsNameError>)> = vec![
        ("*.ironic.metal3.svc", Ok("ironic.metal3.svc")),
        ("*.IRONIC.svc.", Ok("ironic.svc")),
        ("*.a_b.svc", Ok("a_b.svc")),
        ("*", Err(E::Wildcard)),
        ("*.", Err(E::Wildcard)),
        ("*..", Err(E::Wildcard)),
        ("**.a.b", Err(E::Wildcard)),
        ("*a.b.c", Err(E::Wildcard)),
        ("a*.b.c", Err(E::Wildcard)),
        ("a.*.b", Err(E::Wildcard)),
        ("*.*.a.b", Err(E::Wildcard)),
        ("*.a.*", Err(E::Wildcard)),
        ("*.svc", Err(E::Wildcard)),
        ("a.b.c", Err(E::Wildcard)),
        ("*.a..b", Err(E::EmptyLabel)),
        ("*.a.123", Err(E::NumericLast)),
        ("*.-a.b", Err(E::Hyphen)),
        ("*.a b.c", Err(E::Character(' '))),
    ];
    for (input, want) in cases {
        let got = WildcardName::parse(input);
        let suffix = got.as_ref().map(|w| w.suffix().as_str()).map_err(|e| *e);
        assert_eq!(suffix, want, "{input:?}");
        if let Ok(w) = got {
            assert_eq!(w.to_string(), format!("*.{}", w.suffix()));
            assert_eq!(w.to_string().parse::<WildcardName>(), Ok(w));
        }
    }
}

#[test]
fn matching_ignores_case_and_one_trailing_dot_and_nothing_else() {
    let name = DnsName::parse("admin.example.org").unwrap();
    for yes in [
        "admin.example.org",
        "ADMIN.Example.ORG",
        "admin.example.org.",
    ] {
        assert!(name.matches(yes), "{yes:?}");
    }
    for no in [
        "admin.example.org..",
        "x.admin.example.org",
        "evil-admin.example.org",
        "admin.example",
        "",
    ] {
        assert!(!name.matches(no), "{no:?}");
    }
    let wild = WildcardName::parse("*.ironic.metal3.svc").unwrap();
    for yes in [
        "a.ironic.metal3.svc",
        "A.IRONIC.metal3.svc.",
        "*.ironic.metal3.svc",
    ] {
        assert!(wild.matches(yes), "{yes:?}");
    }
    for no in [
        "ironic.metal3.svc",
        ".ironic.metal3.svc",
        "a.b.ironic.metal3.svc",
        "xironic.metal3.svc",
        "a.ironic.metal3.svc..",
        "",
    ] {
        assert!(!wild.matches(no), "{no:?}");
    }
}

#[test]
fn suffixes_take_an_optional_leading_dot() {
    let n252 = long_name(252);
    let dot252 = format!(".{n252}");
    let dot253 = format!(".{}", long_name(253));
    let cases: Vec<(&str, Result<&str, DnsNameError>)> = vec![
        ("metal3.svc", Ok("metal3.svc")),
        (".metal3.svc", Ok(".metal3.svc")),
        ("Metal3.SVC", Ok("metal3.svc")),
        ("_tcp.svc", Ok("_tcp.svc")),
        (&dot252, Ok(&dot252)),
        (&dot253, Err(E::TooLong)),
        ("metal3.svc.", Err(E::Absolute)),
        ("", Err(E::Empty)),
        (".", Err(E::Empty)),
        ("..a", Err(E::EmptyLabel)),
        ("a..b", Err(E::EmptyLabel)),
        (".10.0.0", Err(E::NumericLast)),
        ("*.metal3.svc", Err(E::Character('*'))),
    ];
    for (input, want) in cases {
        let got = DnsSuffix::parse(input).map(|s| s.to_string());
        assert_eq!(got.as_deref().map_err(|e| *e), want, "{input:?}");
    }
    let base = DnsSuffix::parse("metal3.SVC").unwrap();
    assert_eq!(base.name().as_str(), "metal3.svc");
    assert!(base.contains("metal3.svc"));
    assert!(base.contains("a.b.Metal3.svc"));
    assert!(!base.contains("badmetal3.svc"));
    assert!(!base.contains("svc"));
    assert!(!base.contains(".metal3.svc.x"));
    let sub = DnsSuffix::parse(".metal3.svc").unwrap();
    assert!(!sub.contains("metal3.svc"));
    assert!(sub.contains("a.metal3.svc"));
    assert!(!sub.contains(".metal3.svc"));
}

#[test]
fn certificate_names_are_host_names_or_wildcards_never_absolute() {
    for good in [
        "localhost",
        "a-b.example",
        "*.ironic.metal3.svc",
        "X1.Example",
    ] {
        assert_eq!(check_san(good), Ok(()), "{good:?}");
    }
    let bad = [
        ("", E::Empty),
        ("a..b", E::EmptyLabel),
        ("-a.b", E::Hyphen),
        ("a_b.c", E::Underscore),
        ("*._a.b", E::Underscore),
        ("a.", E::Absolute),
        ("*.a.b.", E::Absolute),
        ("10.0.0.1", E::NumericLast),
        ("*", E::Wildcard),
        ("*.svc", E::Wildcard),
        ("a.*.b", E::Wildcard),
        ("é.com", E::Character('é')),
    ];
    for (input, want) in bad {
        assert_eq!(check_san(input), Err(want), "{input:?}");
    }
    assert_eq!(DnsName::parse_host("a.b").unwrap().as_str(), "a.b");
    assert_eq!(DnsName::parse_host("*.a.b"), Err(E::Character('*')));
}

#[test]
fn a_name_is_what_rustls_verifies() {
    let name = DnsName::parse("Pod.Ironic.SVC.").unwrap();
    let server = name.to_server_name();
    assert_eq!(server.to_str(), "pod.ironic.svc");
    assert!(matches!(server, rustls_pki_types::ServerName::DnsName(_)));
}

#[test]
fn messages_name_the_rule() {
    assert_eq!(E::Empty.to_string(), "the name is empty");
    assert!(E::LabelTooLong.to_string().contains("63"));
    assert!(E::TooLong.to_string().contains("253"));
    let character = E::Character('\0').to_string();
    assert!(character.starts_with("only letters, digits"), "{character}");
    assert!(character.contains("'\\0'"), "{character}");
    assert!(!character.contains("xn--"), "{character}");
    let idn = E::Character('é').to_string();
    assert!(
        idn.ends_with("not 'é' (an internationalised name goes in its xn-- form)"),
        "{idn}"
    );
}
