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
    // Found by fuzz/ (target `request`): these reached the upstream as HTTP/1.1 with two Hosts.
    assert!(check_framing(Version::HTTP_10, &map(&[("host", "a"), ("host", "b")])).is_err());
    assert!(check_framing(Version::HTTP_2, &map(&[("host", "a"), ("host", "b")])).is_err());
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
        ("forwarded", "for=1.2.3.4;proto=http;host=evil"),
    ]);
    let host = HeaderValue::from_static("ironic:6385");
    let client = ip_value("10.0.0.9".parse().unwrap());
    let fwd = Forwarded {
        client_ip: client.as_ref(),
        proto: "https",
        host: Some(&host),
        xfcc: None,
        version: Version::HTTP_11,
    };
    rewrite_request(&mut h, &fwd);
    assert!(h.get(XFCC).is_none());
    assert!(h.get("forwarded").is_none());
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
fn a_relay_keeps_the_clients_fields_but_no_identity_ones() {
    let mut h = map(&[
        ("x-forwarded-client-cert", "Hash=evil"),
        ("X-Forwarded-Client-Cert", "Hash=evil2"),
        ("x_forwarded_client_cert", "Hash=evil3"),
        ("X_Forwarded_Client_Cert", "Hash=evil4"),
        ("Forwarded", "for=1.2.3.4"),
        ("x-forwarded-for", "1.2.3.4"),
        ("x-request-id", "r1"),
        ("connection", "close"),
    ]);
    strip_relayed(&mut h);
    let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
    left.sort_unstable();
    assert_eq!(left, ["x-forwarded-for", "x-request-id"]);
}

#[test]
fn via_detection() {
    assert!(!came_through_proxy(&map(&[("via", "1.1 nginx")])));
    assert!(came_through_proxy(&map(&[(
        "via",
        "1.1 nginx, 1.1 ironic-proxy"
    )])));
}

#[test]
fn response_content_length_lists_are_folded() {
    let mut h = map(&[("content-length", "5, 5")]);
    rewrite_response(&mut h, Version::HTTP_11);
    assert_eq!(
        h.get_all("content-length").iter().collect::<Vec<_>>(),
        ["5"]
    );
    let mut h = map(&[("content-length", "7")]);
    rewrite_response(&mut h, Version::HTTP_11);
    assert_eq!(
        h.get_all("content-length").iter().collect::<Vec<_>>(),
        ["7"]
    );
    let mut h = map(&[("content-length", "5, 6")]);
    rewrite_response(&mut h, Version::HTTP_11);
    assert!(h.get("content-length").is_none(), "never relayed ambiguous");
}

#[test]
fn head_len_counts_every_field_line() {
    let small = map(&[("a", "b")]);
    let big = map(&[("x-big", &"b".repeat(100_000))]);
    assert!(head_len(&small) < 100);
    assert!(head_len(&big) > 100_000);
}

#[test]
fn host_must_be_one_valid_authority() {
    let check = |v: Version, hosts: &[&str]| {
        let pairs: Vec<(&str, &str)> = hosts.iter().map(|h| ("host", *h)).collect();
        check_framing(v, &map(&pairs))
    };
    for ok in [
        "x",
        "ironic.metal3.svc:6385",
        "10.0.0.1",
        "[fd00::1]:6385",
        "a,b",
    ] {
        assert_eq!(check(Version::HTTP_11, &[ok]), Ok(Framing::None), "{ok}");
    }
    for bad in ["", "a b", "user@evil", "x/../y", "x?y", "x#y", "[fd00::1"] {
        assert!(check(Version::HTTP_11, &[bad]).is_err(), "{bad:?}");
        assert!(check(Version::HTTP_10, &[bad]).is_err(), "HTTP/1.0 {bad:?}");
    }
    assert!(check(Version::HTTP_11, &[]).is_err(), "HTTP/1.1 needs Host");
    assert_eq!(
        check(Version::HTTP_10, &[]),
        Ok(Framing::None),
        "HTTP/1.0 does not"
    );
    assert!(check(Version::HTTP_10, &["x", "x"]).is_err(), "never two");
}

#[test]
fn a_response_framed_by_transfer_encoding_loses_its_content_length() {
    let mut h = map(&[("content-length", "3"), ("transfer-encoding", "chunked")]);
    rewrite_response(&mut h, Version::HTTP_11);
    assert!(h.get("content-length").is_none());
    assert!(h.get("transfer-encoding").is_none(), "hop-by-hop");
}

/// Found by fuzz/ (target `request`): an HTTP/2 field name with '"' (which the `http` crate's
/// HTTP/2 table accepts) was forwarded in HTTP/1.1, where Ironic's parser refused it.
#[test]
fn http2_names_must_be_tokens() {
    let mut h = HeaderMap::new();
    h.insert(
        HeaderName::from_lowercase(b"x-forwa\"-client-cert").unwrap(),
        HeaderValue::from_static("evil"),
    );
    assert_eq!(
        check_framing(Version::HTTP_2, &h),
        Err("invalid character in a header field name")
    );
    // Every tchar is a name character.
    let mut h = HeaderMap::new();
    h.insert(
        HeaderName::from_lowercase(b"x-!#$%&'*+-.^_`|~09az").unwrap(),
        HeaderValue::from_static("ok"),
    );
    assert_eq!(check_framing(Version::HTTP_2, &h), Ok(Framing::None));
}
