use super::*;

fn map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn frame(pairs: &[(&str, &str)]) -> Result<Framing, &'static str> {
    let mut all = vec![("host", "x")];
    all.extend_from_slice(pairs);
    check_framing(Version::HTTP_11, &map(&all))
}

#[test]
fn accepts_plain_framings() {
    assert_eq!(frame(&[]), Ok(Framing::None));
    assert_eq!(frame(&[("content-length", "5")]), Ok(Framing::Length(5)));
    assert_eq!(
        frame(&[("transfer-encoding", "chunked")]),
        Ok(Framing::Chunked)
    );
    assert_eq!(
        frame(&[("transfer-encoding", "Chunked")]),
        Ok(Framing::Chunked)
    );
}

#[test]
fn rejects_ambiguous_framing() {
    for bad in [
        vec![("content-length", "5"), ("transfer-encoding", "chunked")],
        vec![("transfer-encoding", "chunked"), ("content-length", "0")],
        vec![("content-length", "5"), ("content-length", "6")],
        vec![("content-length", "5"), ("content-length", "5")],
        vec![("content-length", "5, 5")],
        vec![("content-length", "+5")],
        vec![("content-length", "0x5")],
        vec![("content-length", "99999999999999999999999")],
        vec![("transfer-encoding", "chunked, identity")],
        vec![("transfer-encoding", "identity, chunked")],
        vec![("transfer-encoding", "xchunked")],
        vec![("transfer-encoding", "\"chunked\"")],
        vec![
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked"),
        ],
    ] {
        assert!(frame(&bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn host_rules() {
    assert!(check_framing(Version::HTTP_11, &map(&[])).is_err());
    assert!(check_framing(Version::HTTP_11, &map(&[("host", "a"), ("host", "b")])).is_err());
    assert!(check_framing(Version::HTTP_10, &map(&[])).is_ok());
    assert!(check_framing(Version::HTTP_10, &map(&[("transfer-encoding", "chunked")])).is_err());
}

#[test]
fn strips_hop_by_hop_and_named() {
    let mut h = map(&[
        ("connection", "close, x-secret"),
        ("x-secret", "1"),
        ("keep-alive", "timeout=5"),
        ("upgrade", "h2c"),
        ("te", "trailers"),
        ("x-keep", "1"),
    ]);
    strip_hop_by_hop(&mut h);
    assert_eq!(h.len(), 1);
    assert!(h.contains_key("x-keep"));
}

#[test]
fn spoofed_identity_never_survives() {
    let mut h = map(&[
        ("x-forwarded-client-cert", "Hash=evil"),
        ("X-FORWARDED-CLIENT-CERT", "Hash=evil2"),
        ("x_forwarded_client_cert", "Hash=evil3"),
        ("x-forwarded-proto", "http"),
        ("x-forwarded-for", "1.2.3.4"),
        ("x-forwarded-host", "evil"),
    ]);
    let host = HeaderValue::from_static("ironic:6385");
    let fwd = Forwarded {
        client_ip: Some("10.0.0.9".parse().unwrap()),
        proto: "https",
        host: Some(&host),
        xfcc: None,
        version: Version::HTTP_11,
    };
    rewrite_request(&mut h, &fwd);
    assert!(h.get(XFCC).is_none());
    assert!(!h.keys().any(|k| k.as_str().contains('_')));
    assert_eq!(h[XFP], "https");
    assert_eq!(h[XFF], "1.2.3.4, 10.0.0.9");
    assert_eq!(h[XFH], "ironic:6385");
    assert!(came_through_proxy(&h));

    let good = HeaderValue::from_static("Hash=good");
    let fwd = Forwarded {
        xfcc: Some(&good),
        ..fwd
    };
    let mut h = map(&[("x-forwarded-client-cert", "Hash=evil")]);
    rewrite_request(&mut h, &fwd);
    assert_eq!(h.get_all(XFCC).iter().collect::<Vec<_>>(), ["Hash=good"]);
}

#[test]
fn via_detection() {
    assert!(!came_through_proxy(&map(&[("via", "1.1 nginx")])));
    assert!(came_through_proxy(&map(&[(
        "via",
        "1.1 nginx, 1.1 ironic-proxy"
    )])));
}
