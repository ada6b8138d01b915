//! `allow` rules: parsing arbitrary strings and matching arbitrary SAN lists never panics, and
//! the matching rules of `tls::allow` hold for every input:
//! - a rule's display form parses back to the same rule (it is what `check` prints);
//! - a wildcard (or exact) rule that matches a name never matches it with a label added, and a
//!   wildcard never matches its bare suffix;
//! - matching ignores ASCII case and one trailing dot;
//! - an `ip:` rule never matches a DNS SAN, a DNS rule never matches an IP SAN.
//!
//! Input: rules one per line up to the first NUL byte, then SANs one per line (a line that
//! parses as an IP address is an IP SAN, any other line a DNS SAN).
#![no_main]

use ironic_proxy::allow::{is_allowed, AllowRule};
use libfuzzer_sys::fuzz_target;
use std::net::IpAddr;

fn matches(rule: &AllowRule, name: &str) -> bool {
    is_allowed(std::slice::from_ref(rule), &[name.to_owned()], &[])
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (rules_text, sans_text) = text.split_once('\0').unwrap_or((&text, ""));
    let rules: Vec<AllowRule> = rules_text
        .lines()
        .filter_map(|l| l.parse::<AllowRule>().ok())
        .collect();
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for line in sans_text.lines() {
        match line.parse::<IpAddr>() {
            Ok(ip) => ips.push(ip),
            Err(_) => dns.push(line.to_owned()),
        }
    }
    let _ = is_allowed(&rules, &dns, &ips);
    let _ = is_allowed(&[], &dns, &ips);

    for rule in &rules {
        let shown = rule.to_string();
        assert_eq!(
            shown.parse::<AllowRule>().as_ref(),
            Ok(rule),
            "display form {shown:?} does not parse back"
        );
        if let AllowRule::Wildcard(pattern) = rule {
            let bare = pattern.suffix().as_str();
            let dotted = format!(".{bare}");
            assert!(!matches(rule, bare), "{shown} matches its bare suffix");
            assert!(!matches(rule, &dotted), "{shown} matches {dotted:?}");
        }
        if !ips.is_empty() {
            let by_ip = is_allowed(std::slice::from_ref(rule), &[], &ips);
            assert!(
                !by_ip || matches!(rule, AllowRule::Ip(_)),
                "DNS rule {shown} matched an IP SAN"
            );
        }
        for name in &dns {
            if !matches(rule, name) {
                continue;
            }
            assert!(
                !matches!(rule, AllowRule::Ip(_)),
                "{shown} matched DNS SAN {name:?}"
            );
            for label in ["a", "*", "xn--x", "A-1"] {
                let longer = format!("{label}.{name}");
                assert!(
                    !matches(rule, &longer),
                    "{shown} matches {name:?} and also {longer:?} (an extra label)"
                );
            }
            let upper = name.to_ascii_uppercase();
            assert!(matches(rule, &upper), "{shown}: case matters for {upper:?}");
            if !name.ends_with('.') {
                let dotted = format!("{name}.");
                assert!(matches(rule, &dotted), "{shown}: trailing dot matters");
            }
        }
    }
});
