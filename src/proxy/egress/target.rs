//! The authority of an egress request (its absolute-form target, and its `Host`), parsed
//! strictly: what the egress dials is exactly what the client named, or the request is 400.
//!
//! `http`'s `Uri` accepts an authority whose port is any string (`:1a`, `:+80`, `:99999`) and
//! `port_u16` then gives `None`; a bracketed host may hold anything (`[127.0.0.2]`). Here
//! (RFC 3986 §3.2.2-3, RFC 9112 §3.2): no userinfo (RFC 9110 §4.2.4: a sender must not
//! generate it); a port, when there is a `:`, is 1 to 65535 in ASCII digits (an absent port is
//! 80, an invalid one is never replaced by it); brackets hold an IPv6 address and nothing else;
//! any other host is an IPv4 address or a DNS name by the rules of `crate::dns_name` (at most
//! one trailing dot, which is kept for dialling since it tells the resolver to skip the search
//! domains, and ignored for matching `targets`).

use crate::dns_name::{DnsName, DnsNameError};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an authority was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TargetError {
    #[error("userinfo in the request target")]
    Userinfo,
    #[error("the port is not 1 to 65535 in digits")]
    Port,
    #[error("brackets must hold an IPv6 address")]
    Brackets,
    #[error("an IPv6 address must be in brackets")]
    Unbracketed,
    #[error("the host is not an IP address or a DNS name")]
    Name(#[source] DnsNameError),
}

impl TargetError {
    /// The message of a 400, naming the field: the forwarding service's errors carry a static
    /// reason (the cause of `Name` stays in the error for a log).
    pub(crate) fn reason(&self, in_host_field: bool) -> &'static str {
        match (self, in_host_field) {
            (Self::Userinfo, _) => "userinfo in the request target",
            (Self::Port, false) => "the target's port is not 1 to 65535 in digits",
            (Self::Port, true) => "the Host field's port is not 1 to 65535 in digits",
            (Self::Brackets | Self::Unbracketed, false) => {
                "the target's brackets do not hold exactly an IPv6 address"
            }
            (Self::Brackets | Self::Unbracketed, true) => {
                "the Host field's brackets do not hold exactly an IPv6 address"
            }
            (Self::Name(_), false) => "the target's host is not an IP address or a DNS name",
            (Self::Name(_), true) => "the Host field's host is not an IP address or a DNS name",
        }
    }
}

/// The host an authority names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Host {
    Ip(IpAddr),
    /// Lower case, without its trailing dot; `absolute` when it was written with one.
    Name {
        name: DnsName,
        absolute: bool,
    },
}

/// A parsed authority: host and port (80 when none was written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Authority {
    pub(crate) host: Host,
    pub(crate) port: u16,
}

impl Authority {
    /// Parses `uri-host [ ":" port ]` without userinfo.
    pub(crate) fn parse(s: &str) -> Result<Self, TargetError> {
        if s.contains('@') {
            return Err(TargetError::Userinfo);
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or(TargetError::Brackets)?;
            let ip: Ipv6Addr = inside.parse().map_err(|_| TargetError::Brackets)?;
            (Host::Ip(IpAddr::V6(ip)), after)
        } else {
            let (host, after) = match s.find(':') {
                Some(i) => s.split_at(i),
                None => (s, ""),
            };
            if host.contains(['[', ']']) {
                return Err(TargetError::Brackets);
            }
            if after[1.min(after.len())..].contains(':') {
                return Err(TargetError::Unbracketed);
            }
            let host = match host.parse::<Ipv4Addr>() {
                Ok(ip) => Host::Ip(IpAddr::V4(ip)),
                Err(_) => Host::Name {
                    name: DnsName::parse(host).map_err(TargetError::Name)?,
                    absolute: host.ends_with('.'),
                },
            };
            (host, after)
        };
        let port = match port.strip_prefix(':') {
            None if port.is_empty() => 80,
            None => return Err(TargetError::Brackets),
            Some(digits) => parse_port(digits).ok_or(TargetError::Port)?,
        };
        Ok(Self { host, port })
    }

    /// The host as `targets` match it: an IP, or the name without its trailing dot.
    pub(crate) fn match_name(&self) -> String {
        match &self.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Name { name, .. } => name.as_str().to_owned(),
        }
    }

    /// The host as it is dialled: an IP without brackets, or the name as written (lower case,
    /// its trailing dot kept).
    pub(crate) fn dial_host(&self) -> String {
        match &self.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Name { name, absolute } => {
                let dot = if *absolute { "." } else { "" };
                format!("{}{dot}", name.as_str())
            }
        }
    }
}

impl fmt::Display for Authority {
    /// `host:port`, brackets around an IPv6 address: safe to log (it never has userinfo).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            _ => write!(f, "{}:{}", self.dial_host(), self.port),
        }
    }
}

/// 1 to 65535 in ASCII digits (leading zeros allowed, as RFC 3986's `*DIGIT` allows them).
fn parse_port(digits: &str) -> Option<u16> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = digits.bytes().try_fold(0u32, |n, d| {
        let n = n * 10 + u32::from(d - b'0');
        (n <= 65535).then_some(n)
    })?;
    u16::try_from(n).ok().filter(|p| *p != 0)
}

/// A request target for a log line: `scheme://authority/path` with any userinfo and the query
/// left out (a query may carry a signature, as a temporary image URL's does), the path cut at
/// 256 bytes.
pub(crate) fn loggable(uri: &http::Uri) -> String {
    let authority = uri
        .authority()
        .map_or("", |a| a.as_str().rsplit('@').next().unwrap_or(""));
    let path = uri.path();
    let mut end = path.len().min(256);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}://{authority}{}",
        uri.scheme_str().unwrap_or(""),
        &path[..end]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> (String, u16) {
        let a = Authority::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        (a.dial_host(), a.port)
    }

    #[test]
    fn valid_authorities_keep_what_was_written() {
        assert_eq!(ok("127.0.0.2:6180"), ("127.0.0.2".into(), 6180));
        assert_eq!(ok("127.0.0.2"), ("127.0.0.2".into(), 80));
        assert_eq!(ok("[fd00::5]:9999"), ("fd00::5".into(), 9999));
        assert_eq!(ok("[::1]"), ("::1".into(), 80));
        assert_eq!(
            ok("Agent-1.Example.ORG:9999"),
            ("agent-1.example.org".into(), 9999)
        );
        assert_eq!(ok("a.example.org.:80"), ("a.example.org.".into(), 80));
        assert_eq!(ok("h:08080"), ("h".into(), 8080));
        assert_eq!(ok("h:65535").1, 65535);
        let a = Authority::parse("A.example.org.:1").expect("valid");
        assert_eq!(a.match_name(), "a.example.org");
        assert_eq!(a.to_string(), "a.example.org.:1");
        let a = Authority::parse("[FD00::5]:1").expect("valid");
        assert_eq!(a.to_string(), "[fd00::5]:1");
    }

    #[test]
    fn invalid_authorities_are_refused_with_their_reason() {
        for (s, want) in [
            ("127.0.0.2:65616", "port"),
            ("127.0.0.2:65536", "port"),
            ("127.0.0.2:99999", "port"),
            ("127.0.0.2:1a", "port"),
            ("127.0.0.2:+80", "port"),
            ("127.0.0.2:-1", "port"),
            ("127.0.0.2:", "port"),
            ("127.0.0.2:0", "port"),
            ("127.0.0.2: 80", "port"),
            ("[127.0.0.2]:80", "brackets"),
            ("[localhost]", "brackets"),
            ("[::1", "brackets"),
            ("[::1]x", "brackets"),
            ("[fe80::1%25eth0]:80", "brackets"),
            ("a]:80", "brackets"),
            ("::1", "brackets"),
            ("fd00::5:80", "brackets"),
            ("user:pass@h:80", "userinfo"),
            ("@h", "userinfo"),
            ("", "host"),
            (":80", "host"),
            ("a..b", "host"),
            ("a.example.org..", "host"),
            (".a.example.org", "host"),
            ("127.0.0.2.", "host"),
            ("127.1", "host"),
            ("a b", "host"),
            ("a%2eb", "host"),
        ] {
            let e = Authority::parse(s).expect_err(s).to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    /// Every number from 0 to 70,000, bare and with a leading zero, and every byte that is not
    /// a digit after a valid port: a port is accepted exactly when it is 1 to 65535 in digits.
    #[test]
    fn a_port_is_accepted_exactly_when_it_is_1_to_65535_in_digits() {
        for n in 0u32..=70_000 {
            for s in [format!("h:{n}"), format!("h:0{n}")] {
                let got = Authority::parse(&s).ok().map(|a| a.port);
                let want = u16::try_from(n).ok().filter(|p| *p != 0);
                assert_eq!(got, want, "{s}");
            }
        }
        for b in 0u8..=255 {
            let s = format!("h:80{}", char::from(b));
            if !b.is_ascii_digit() {
                assert!(Authority::parse(&s).is_err(), "{s:?}");
            }
        }
    }

    #[test]
    fn the_log_form_has_no_userinfo_and_no_query() {
        let uri: http::Uri = "http://user:secret@h.example:80/a/b?sig=abc"
            .parse()
            .expect("uri");
        assert_eq!(loggable(&uri), "http://h.example:80/a/b");
        let uri: http::Uri = format!("http://h/{}", "a".repeat(300))
            .parse()
            .expect("uri");
        assert_eq!(loggable(&uri).len(), "http://h".len() + 256);
    }
}
