//! `[[listeners.routes]]`: path routes of a listener, each to its own upstream.
//!
//! A route matches by path: `"/x"` is exact, a pattern ending in `*` is a prefix (`"/x/*"`,
//! `"/x-*"`). Selection is **most specific first**: an exact pattern beats every prefix, a longer
//! prefix beats a shorter one, and among equals the route written first wins. The order of
//! routes in the file therefore never changes which one a path reaches when their patterns
//! differ, so an operator adding a route cannot silently shadow a narrower one.
//!
//! A route's `upstream` takes the same forms as a listener's, plus `find = "newest"` (ask every
//! healthy endpoint for the file and serve the newest copy; see `proxy::find`) and
//! `find_timeout` (connect and response head, per endpoint; default 3s).

use super::upstream::upstream_from_raw;
use super::{msg, Fields, TlsMode, UpstreamConfig};
use std::fmt;
use std::time::Duration;

/// How a find route answers when several endpoints have the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Find {
    /// Newest `Last-Modified` wins, `local` on a tie.
    Newest,
}

/// One path pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathPattern {
    Exact(String),
    /// Matches every path that starts with this string (the pattern without its `*`).
    Prefix(String),
}

impl PathPattern {
    pub fn matches(&self, path: &str) -> bool {
        match self {
            Self::Exact(p) => path == p,
            Self::Prefix(p) => path.starts_with(p.as_str()),
        }
    }

    /// Higher is more specific: exact patterns above every prefix, then by length.
    pub fn specificity(&self) -> (bool, usize) {
        match self {
            Self::Exact(p) => (true, p.len()),
            Self::Prefix(p) => (false, p.len()),
        }
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(p) => f.write_str(p),
            Self::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

impl std::str::FromStr for PathPattern {
    type Err = Box<dyn std::error::Error + Send + Sync>;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if !s.starts_with('/') {
            return Err(msg(format!("path pattern {s:?} must start with /")));
        }
        let (body, prefix) = match s.strip_suffix('*') {
            Some(b) => (b, true),
            None => (s, false),
        };
        if body.contains('*') {
            return Err(msg(format!(
                "path pattern {s:?}: `*` is only allowed at the end (a prefix)"
            )));
        }
        // Patterns are compared with the decoded, checked request path (`proxy::route`), which
        // never holds these; a pattern with them could never match.
        let bad = body.contains("//")
            || body.contains('%')
            || body.contains('?')
            || body.contains('#')
            || body.split('/').any(|seg| seg == "." || seg == "..")
            || !body.bytes().all(|b| b.is_ascii_graphic());
        if bad {
            return Err(msg(format!(
                "path pattern {s:?}: no `//`, `.`/`..` segments, `%`, `?`, `#` or non-ASCII"
            )));
        }
        Ok(if prefix {
            Self::Prefix(body.to_owned())
        } else {
            Self::Exact(body.to_owned())
        })
    }
}

#[derive(Clone, Debug)]
pub struct RouteConfig {
    pub paths: Vec<PathPattern>,
    /// Allowed methods; empty: any.
    pub methods: Vec<http::Method>,
    /// May be served over plain HTTP on a `none` or `optional` listener.
    pub plaintext: bool,
    pub upstream: UpstreamConfig,
    pub find: Option<Find>,
    /// Per endpoint, for finds: connect and response head.
    pub find_timeout: Duration,
}

const DEFAULT_FIND_TIMEOUT: Duration = Duration::from_secs(3);

pub(super) fn routes_from_raw(
    raw: Vec<super::raw::RawRoute>,
    listener: &str,
    tls: TlsMode,
    f: &mut Fields,
) -> Vec<RouteConfig> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let path = format!("{listener}.routes[{i}]");
        if let Some(route) = route_from_raw(r, &path, tls, f) {
            out.push(route);
        }
    }
    if tls == TlsMode::Optional && !out.iter().any(|r| r.plaintext) {
        f.push(
            format!("{listener}.tls"),
            msg("\"optional\" serves plain HTTP only to routes with plaintext = true, and no route \
                 has it; use tls = \"server\""),
        );
    }
    out
}

fn route_from_raw(
    r: super::raw::RawRoute,
    path: &str,
    tls: TlsMode,
    f: &mut Fields,
) -> Option<RouteConfig> {
    if r.paths.is_empty() {
        f.push(format!("{path}.paths"), msg("needs at least one path"));
    }
    let paths: Vec<PathPattern> = r
        .paths
        .iter()
        .enumerate()
        .filter_map(|(j, p)| f.parse::<PathPattern>(&format!("{path}.paths[{j}]"), p))
        .collect();
    let mut methods = Vec::new();
    for (j, m) in r.methods.iter().flatten().enumerate() {
        // Methods are case-sensitive (RFC 9110 §9.1); the registered ones are upper case.
        let valid = !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase());
        match http::Method::from_bytes(m.as_bytes()) {
            Ok(method) if valid => methods.push(method),
            _ => f.push(
                format!("{path}.methods[{j}]"),
                msg(format!("{m:?} is not an HTTP method in upper case")),
            ),
        }
    }
    if r.methods.as_ref().is_some_and(Vec::is_empty) {
        f.push(
            format!("{path}.methods"),
            msg("an empty list would refuse every request; leave it out for any method"),
        );
    }
    let plaintext = r.plaintext.unwrap_or(false);
    if plaintext && matches!(tls, TlsMode::Server | TlsMode::Mutual) {
        f.push(
            format!("{path}.plaintext"),
            msg("only applies to tls = \"none\" or \"optional\" listeners"),
        );
    }
    let upath = format!("{path}.upstream");
    let (value, find, find_timeout) = take_find(r.upstream, &upath, f);
    if find.is_some() {
        if methods.is_empty() {
            methods = vec![http::Method::GET, http::Method::HEAD];
        } else if let Some(j) = methods
            .iter()
            .position(|m| *m != http::Method::GET && *m != http::Method::HEAD)
        {
            f.push(
                format!("{path}.methods[{j}]"),
                msg("a find route serves GET and HEAD only"),
            );
        }
    }
    let upstream = upstream_from_raw(value, &upath, f)?;
    Some(RouteConfig {
        paths,
        methods,
        plaintext,
        upstream,
        find,
        find_timeout,
    })
}

/// Takes `find` and `find_timeout` out of an upstream table.
fn take_find(
    mut value: toml::Value,
    path: &str,
    f: &mut Fields,
) -> (toml::Value, Option<Find>, Duration) {
    let mut find = None;
    let mut timeout = None;
    if let toml::Value::Table(t) = &mut value {
        match t.remove("find") {
            None => {}
            Some(toml::Value::String(s)) if s == "newest" => find = Some(Find::Newest),
            Some(other) => f.push(
                format!("{path}.find"),
                msg(format!("{} is not \"newest\"", shown(&other))),
            ),
        }
        match t.remove("find_timeout") {
            None => {}
            Some(toml::Value::String(s)) => timeout = Some(s),
            Some(other) => f.push(
                format!("{path}.find_timeout"),
                msg(format!(
                    "{} is not a duration string like \"3s\"",
                    shown(&other)
                )),
            ),
        }
    }
    if timeout.is_some() && find.is_none() {
        f.push(
            format!("{path}.find_timeout"),
            msg("only applies with find = \"newest\""),
        );
    }
    let timeout = f.dur(
        &format!("{path}.find_timeout"),
        timeout.as_ref(),
        DEFAULT_FIND_TIMEOUT,
    );
    if timeout.is_zero() {
        f.push(format!("{path}.find_timeout"), msg("must be above 0"));
    }
    (value, find, timeout)
}

/// A value in an error: a string quoted, anything else by its type.
fn shown(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        other => format!("a {}", other.type_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;
    use std::collections::HashMap;

    const BASE: &str = r#"
[identity]
trust = "/ca.crt"
cert = "/tls.crt"
key = "/tls.key"

[[listeners]]
name = "api"
listen = "[::]:6385"
tls = "optional"
upstream = "unix:/shared/ironic.sock"
"#;

    fn parse(routes: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}{routes}"), &HashMap::new()).map_err(|e| e.to_string())
    }

    #[test]
    fn parses_the_contract_example() {
        let c = parse(
            r#"
[[listeners.routes]]
paths = ["/pxelinux.cfg/*", "/grub.cfg-01-*", "/boot.ipxe"]
methods = ["GET", "HEAD"]
plaintext = true
[listeners.routes.upstream]
local = "127.0.0.1:6180"
dns = "ironic.metal3.svc:6180"
find = "newest"
"#,
        )
        .unwrap();
        let r = &c.listeners[0].routes[0];
        assert_eq!(c.listeners[0].tls, TlsMode::Optional);
        assert_eq!(
            r.paths,
            [
                PathPattern::Prefix("/pxelinux.cfg/".into()),
                PathPattern::Prefix("/grub.cfg-01-".into()),
                PathPattern::Exact("/boot.ipxe".into())
            ]
        );
        assert_eq!(r.methods, [http::Method::GET, http::Method::HEAD]);
        assert!(r.plaintext);
        assert_eq!(r.find, Some(Find::Newest));
        assert_eq!(r.find_timeout, DEFAULT_FIND_TIMEOUT);
        assert_eq!(
            r.upstream.dns.as_ref().map(ToString::to_string).as_deref(),
            Some("ironic.metal3.svc:6180")
        );
    }

    #[test]
    fn errors_name_the_route_key() {
        for (routes, want) in [
            (
                "[[listeners.routes]]\npaths = [\"/a\", \"x\"]\nplaintext = true\nupstream = \"127.0.0.1:1\"",
                "listeners[0].routes[0].paths[1]: path pattern \"x\" must start with /",
            ),
            (
                "[[listeners.routes]]\npaths = [\"/a*b\"]\nplaintext = true\nupstream = \"127.0.0.1:1\"",
                "listeners[0].routes[0].paths[0]",
            ),
            (
                "[[listeners.routes]]\npaths = [\"/a/../b\"]\nplaintext = true\nupstream = \"127.0.0.1:1\"",
                "listeners[0].routes[0].paths[0]",
            ),
            (
                "[[listeners.routes]]\npaths = [\"/a\"]\nmethods = [\"get\"]\nplaintext = true\nupstream = \"127.0.0.1:1\"",
                "listeners[0].routes[0].methods[0]",
            ),
            (
                "[[listeners.routes]]\npaths = [\"/a\"]\nmethods = [\"POST\"]\nplaintext = true\n[listeners.routes.upstream]\nlocal = \"127.0.0.1:1\"\nfind = \"newest\"",
                "listeners[0].routes[0].methods[0]: a find route serves GET and HEAD only",
            ),
            (
                "[[listeners.routes]]\npaths = [\"/a\"]\nplaintext = true\n[listeners.routes.upstream]\nlocal = \"127.0.0.1:1\"\nfind = \"oldest\"",
                "listeners[0].routes[0].upstream.find",
            ),
            (
                "[[listeners.routes]]\npaths = [\"/a\"]\nplaintext = true\n[listeners.routes.upstream]\nlocal = \"127.0.0.1:1\"\nbogus = 1",
                "listeners[0].routes[0].upstream.bogus",
            ),
            (
                "[[listeners.routes]]\npaths = [\"/a\"]\nplaintext = true\nupstream = \"nowhere\"",
                "listeners[0].routes[0].upstream.local",
            ),
            (
                "[[listeners.routes]]\npaths = [\"/a\"]\nupstream = \"127.0.0.1:1\"",
                "listeners[0].tls: \"optional\" serves plain HTTP only",
            ),
            (
                "[[listeners.routes]]\npaths = [\"/a\"]\nplaintext = true\nupstream = \"127.0.0.1:1\"\nextra = 1",
                "listeners[0].routes[0].extra",
            ),
        ] {
            let e = parse(routes).expect_err(routes);
            assert!(e.contains(want), "{routes}\n=> {e}\nwanted {want}");
        }
    }

    #[test]
    fn rendered_routes_read_back_unchanged() {
        let c = parse(
            "[[listeners.routes]]\npaths = [\"/boot.ipxe\", \"/pxelinux.cfg/*\"]\nplaintext = true\n\
             [listeners.routes.upstream]\nlocal = \"127.0.0.1:6180\"\nfind = \"newest\"\n\
             find_timeout = \"750ms\"\n[[listeners.routes]]\npaths = [\"/images/*\"]\n\
             upstream = \"127.0.0.1:6181\"",
        )
        .unwrap();
        let text = c.render();
        let again = Config::parse(&text, &HashMap::new()).unwrap();
        assert_eq!(text, again.render());
        let r = &again.listeners[0].routes;
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].find_timeout, Duration::from_millis(750));
        assert_eq!(r[0].methods, [http::Method::GET, http::Method::HEAD]);
        assert!(r[1].methods.is_empty() && !r[1].plaintext && r[1].find.is_none());
    }

    #[test]
    fn plaintext_needs_a_listener_that_speaks_plain_http() {
        let text = BASE.replace("\"optional\"", "\"server\"")
            + "[[listeners.routes]]\npaths = [\"/a\"]\nplaintext = true\nupstream = \"127.0.0.1:1\"";
        let e = Config::parse(&text, &HashMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("listeners[0].routes[0].plaintext"), "{e}");
    }

    #[test]
    fn patterns_match_exactly_or_by_prefix() {
        let p: PathPattern = "/pxelinux.cfg/*".parse().unwrap();
        assert!(p.matches("/pxelinux.cfg/52-54-00-00-00-01"));
        assert!(!p.matches("/pxelinux.cfg"));
        assert!(!p.matches("/PXELINUX.CFG/x"));
        let e: PathPattern = "/boot.ipxe".parse().unwrap();
        assert!(e.matches("/boot.ipxe"));
        assert!(!e.matches("/boot.ipxe/"));
        assert!(!e.matches("/boot.ipxex"));
        assert!(
            e.specificity()
                > "/boot.ipxe-long-prefix/*"
                    .parse::<PathPattern>()
                    .unwrap()
                    .specificity()
        );
    }
}
