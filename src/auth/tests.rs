use super::public::{is_public, PublicPath, IRONIC_DEFAULT};
use super::*;

fn ironic() -> Vec<PublicPath> {
    IRONIC_DEFAULT.iter().map(|p| p.parse().unwrap()).collect()
}

#[test]
fn public_paths_match_literally_and_canonically() {
    let rules = ironic();
    for p in [
        "/",
        "/v1",
        "/v1/",
        "/v1/lookup",
        "/v1/heartbeat/1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
        "/v1/continue_inspection",
    ] {
        assert!(is_public(&rules, p), "{p}");
    }
    for p in [
        "/v1/nodes",
        "/v1/lookup/../nodes",
        "/v1/lookup/",
        "/v1/lookup.",
        "/v1/lookup%2f..%2fnodes",
        "//v1/nodes",
        "//v1/lookup",
        "/v1//lookup",
        "/V1/lookup",
        "/v1/LOOKUP",
        "/v1/%6cookup",
        "/v1/heartbeat/",
        "/v1/heartbeat/..",
        "/v1/heartbeat/.",
        "/v1/heartbeat/../../v1/nodes",
        "/v1/heartbeat/x/../../nodes",
        "/v1/heartbeat/x;y",
        "/v1/heartbeat/x\\..\\nodes",
        "/v1/./lookup",
        "/v1/continue_inspection/../nodes",
        "/v1/heartbeat",
        "",
        "*",
    ] {
        assert!(!is_public(&rules, p), "{p}");
    }
    assert!(!is_public(&[], "/"));
}

#[test]
fn public_entries_are_checked() {
    for bad in ["v1", "/v1/*/x", "/v1/../x", "/v1//x", "/v1/%41", "/v1*"] {
        assert!(bad.parse::<PublicPath>().is_err(), "{bad}");
    }
    assert_eq!(
        "/v1/heartbeat/*".parse::<PublicPath>().unwrap(),
        PublicPath::Below("/v1/heartbeat/".into())
    );
}

#[test]
fn basic_credentials_parse_strictly() {
    use base64::Engine as _;
    let enc = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let ok = format!("Basic {}", enc(b"admin:pa:ss"));
    assert_eq!(
        parse_basic(ok.as_bytes()),
        Some(("admin".into(), b"pa:ss".to_vec()))
    );
    let lower = format!("basic   {}", enc(b"u:p"));
    assert!(parse_basic(lower.as_bytes()).is_some());
    for bad in [
        "Basic".to_owned(),
        "Basic ".to_owned(),
        "Basic !!!!".to_owned(),
        format!("Basic {}", enc(b"nocolon")),
        format!("Basic {}", enc(b":nouser")),
        format!("Basic {}", enc(b"u\x00:p")),
        format!("Basic {}", enc(b"u:p\x00")),
        format!("Basic {}", enc(b"\xff\xfe:p")),
        format!("Bearer {}", enc(b"u:p")),
        format!("Basicx{}", enc(b"u:p")),
        format!("Basic {}", "A".repeat(MAX_CREDENTIALS)),
        String::new(),
    ] {
        assert!(parse_basic(bad.as_bytes()).is_none(), "{bad:?}");
    }
}

#[test]
fn htpasswd_accepts_bcrypt_only_and_names_the_line() {
    let good = bcrypt::hash("secret", 4).unwrap();
    let text = format!("# comment\n\nadmin:{good}\r\n");
    let users = Users::parse(text.as_bytes()).unwrap();
    assert!(users.hash("admin").is_some());
    for (line, why) in [
        ("bob:$apr1$abc$def", "MD5"),
        ("bob:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "SHA-1"),
        ("bob:plaintext", "plain-text"),
        ("bob:$6$salt$hash", "SHA-crypt"),
        ("bob:$2y$05$short", "malformed bcrypt"),
        ("nocolon", "user:hash"),
    ] {
        let text = format!("admin:{good}\n{line}\n");
        let err = Users::parse(text.as_bytes()).unwrap_err().to_string();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(err.contains(why), "{err}");
    }
    let dup = format!("a:{good}\na:{good}\n");
    assert!(Users::parse(dup.as_bytes()).is_err());
    assert!(matches!(
        Users::parse(b"# none\n"),
        Err(HtpasswdError::Empty)
    ));
}

#[test]
fn cache_never_crosses_generations() {
    let c = cache::Cache::new().unwrap();
    let t = c.tag("u", b"p");
    assert_ne!(t, c.tag("u", b"q"));
    assert_ne!(c.tag("u", b"\x00p"), c.tag("u\x00", b"p"));
    c.insert(0, t);
    assert!(c.contains(0, &t));
    c.reset(1);
    assert!(!c.contains(1, &t));
    c.insert(0, t); // a verification against the old file finishing late
    assert!(!c.contains(1, &t));
    for i in 0..(cache::CAPACITY + 10) {
        c.insert(1, c.tag(&i.to_string(), b"p"));
    }
    assert!(c.len() <= cache::CAPACITY);
}

#[tokio::test]
async fn limiter_bounds_the_queue() {
    let l = Limiter::new(1, 2);
    let held = l.acquire().await.unwrap();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let l = &l;
            Box::pin(async move { l.acquire().await.is_some() })
        })
        .collect();
    let mut waiting = waiting;
    for w in &mut waiting {
        assert!(futures_util::FutureExt::now_or_never(w.as_mut()).is_none());
    }
    assert!(l.acquire().await.is_none(), "queue of 2 is full");
    drop(held);
    assert!(waiting.remove(0).await);
}

#[tokio::test]
async fn the_verification_threads_answer_and_release_the_slot() {
    let hash = bcrypt::hash_with_result("right", 4)
        .unwrap()
        .format_for_version(bcrypt::Version::TwoY);
    let pool = verifier::Pool::global(1);
    // No queue: each acquire below succeeds only if the previous verification gave its slot back.
    let l = Limiter::new(1, 0);
    for (password, hash, expected) in [
        (&b"right"[..], hash.as_str(), true),
        (b"wrong", hash.as_str(), false),
        (b"right", "$2y$04$not-a-bcrypt-hash", false),
    ] {
        let slot = l.acquire().await.expect("the slot was given back");
        assert!(l.acquire().await.is_none());
        let ok = pool.verify(password.to_vec(), hash.to_owned(), slot).await;
        assert_eq!(ok, expected, "{password:?} against {hash}");
    }
}

/// A gate on one user `admin:right` (bcrypt cost 4), no public paths.
fn gate(metrics: &Metrics) -> Gate {
    let hash = bcrypt::hash_with_result("right", 4)
        .unwrap()
        .format_for_version(bcrypt::Version::TwoY);
    let users = Users::parse(format!("admin:{hash}\n").as_bytes()).unwrap();
    let cfg = AuthConfig {
        htpasswd: "/nonexistent".into(),
        realm: config::DEFAULT_REALM.to_owned(),
        public: Vec::new(),
        forward_authorization: true,
    };
    Gate::new("api", &cfg, users, metrics).unwrap()
}

fn request(user: &str, password: &str) -> Request<()> {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    Request::get("/v1/nodes")
        .header(header::AUTHORIZATION, format!("Basic {token}"))
        .body(())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_with_the_same_credentials_share_one_verification() {
    let metrics = Metrics::new();
    let gate = Arc::new(gate(&metrics));
    let count = |o: Outcome| gate.counters[o as usize].get();
    // 64 clients start at once with a credential nobody verified yet: more than the queue
    // holds (1 + 32 on this machine), yet one bcrypt answers them all, and none gets 503.
    for (password, ok) in [("right", true), ("wrong", false)] {
        let before = (count(Outcome::Ok), count(Outcome::WrongPassword));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move { gate.admit(&mut request("admin", password)).await })
            })
            .collect();
        for t in tasks {
            match t.await.unwrap() {
                Ok(()) => assert!(ok, "{password} let through"),
                Err(Deny::Unauthorized { .. }) => assert!(!ok, "{password} refused"),
                Err(Deny::Busy { .. }) => panic!("{password}: 503 although one verification runs"),
            }
        }
        assert!(
            gate.inflight.is_idle(),
            "an entry outlived its verification"
        );
        if ok {
            // Later arrivals may find the cache instead; bcrypt ran once either way.
            assert_eq!(count(Outcome::Ok) - before.0, 1);
            assert_eq!(count(Outcome::OkCached), 63);
        }
    }
    // A different password is verified on its own, not answered from another's verification.
    assert!(gate.admit(&mut request("admin", "right")).await.is_ok());
    assert!(gate.admit(&mut request("admin", "other")).await.is_err());
}
