//! Path routes of one listener: which upstream a request goes to, and what is refused before
//! any upstream is asked.
//!
//! On a listener with routes, every request path is checked first, whichever route it would
//! take: a path with a `.` or `..` segment, an empty segment (`//`), a percent-encoded `/` or
//! `\` (`%2F`, `%5C`), a raw `\`, a control character (raw or encoded, `%00`), a bad
//! percent-escape, or more than [`MAX_PATH`] bytes gets 400. Why every path: the routes decide
//! which upstream sees a request and whether it may come over plain HTTP, so the path they match
//! must be the path the upstream serves. Apache (Ironic's httpd) and WSGI servers resolve dot
//! segments and decode escapes, so `/pxelinux.cfg/%2e%2e/v1/nodes` would match the plain-HTTP
//! boot route here and be served as `/v1/nodes` there. No Ironic API or boot path has any of
//! these forms. A listener without routes forwards paths as before.
//!
//! Matching uses the percent-decoded path, so `/pxelinux%2Ecfg/x` is the route `/pxelinux.cfg/*`
//! as the upstream would see it; the request goes out with its path unchanged. Matching is
//! case-sensitive (RFC 3986 §6.2.2.1: paths are). Selection: the most specific pattern (see
//! `config::routes`). Then, in this order: a plain-HTTP request that is not on a `plaintext`
//! route of a listener that has one gets 403; a method the route does not allow gets 405 with
//! `Allow` (RFC 9110 §15.5.6).

use super::find_newest::Finder;
use super::pool::Pool;
use super::ProxyError;
use crate::config::{PathPattern, TlsMode};
use http::{HeaderValue, Method};
use std::sync::Arc;

/// Longest request path (without the query) a listener with routes accepts.
pub const MAX_PATH: usize = 2048;

/// Where a route's requests go.
pub enum Target {
    /// Forwarded like a listener's requests: one endpoint, retries as configured.
    Forward(Arc<Pool>),
    /// Asked of every endpoint, the newest copy served.
    Find(Arc<Finder>),
}

pub struct Route {
    pub patterns: Vec<PathPattern>,
    /// Empty: any method.
    pub methods: Vec<Method>,
    pub plaintext: bool,
    pub target: Target,
}

/// A listener's routes.
pub struct Routes {
    routes: Vec<Route>,
    /// `Allow` of each route, built once.
    allow: Vec<HeaderValue>,
    /// Plain HTTP only reaches `plaintext` routes.
    restrict_plain: bool,
}

/// What to do with one request.
pub enum Decision<'a> {
    /// The listener's own upstream.
    Default,
    Forward(&'a Arc<Pool>),
    Find(&'a Finder),
}

impl Routes {
    pub fn new(listener_tls: TlsMode, routes: Vec<Route>) -> Self {
        let restrict_plain = matches!(listener_tls, TlsMode::None | TlsMode::Optional)
            && routes.iter().any(|r| r.plaintext);
        let allow = routes
            .iter()
            .map(|r| {
                let list: Vec<&str> = r.methods.iter().map(Method::as_str).collect();
                HeaderValue::from_str(&list.join(", "))
                    .unwrap_or_else(|_| HeaderValue::from_static("GET, HEAD"))
            })
            .collect();
        Self {
            routes,
            allow,
            restrict_plain,
        }
    }

    /// The route of a request, or why it is refused. `tls`: the request came over TLS.
    /// The upstream for a request, and whether its route is a `plaintext` one: such routes
    /// serve boot files to iPXE, which sends no credentials, so `[listeners.auth]` does not
    /// apply to them.
    pub fn decide(
        &self,
        method: &Method,
        path: &str,
        tls: bool,
    ) -> Result<(Decision<'_>, bool), ProxyError> {
        let decoded = check_path(path).map_err(ProxyError::BadRequest)?;
        let chosen = self.select(&decoded);
        let route = chosen.map(|i| &self.routes[i]);
        if !tls && self.restrict_plain && !route.is_some_and(|r| r.plaintext) {
            return Err(ProxyError::PlainHttp);
        }
        let (Some(i), Some(route)) = (chosen, route) else {
            return Ok((Decision::Default, false));
        };
        if !route.methods.is_empty() && !route.methods.contains(method) {
            return Err(ProxyError::MethodNotAllowed(self.allow[i].clone()));
        }
        let decision = match &route.target {
            Target::Forward(pool) => Decision::Forward(pool),
            Target::Find(finder) => Decision::Find(finder),
        };
        Ok((decision, route.plaintext))
    }

    /// The index of the most specific matching route; the first written among equals.
    fn select(&self, path: &str) -> Option<usize> {
        let mut best: Option<(usize, (bool, usize))> = None;
        for (i, r) in self.routes.iter().enumerate() {
            for p in &r.patterns {
                if p.matches(path) {
                    let s = p.specificity();
                    if best.is_none_or(|(_, b)| s > b) {
                        best = Some((i, s));
                    }
                }
            }
        }
        best.map(|(i, _)| i)
    }
}

/// The percent-decoded path for matching, or why the path is refused (see the module doc).
pub fn check_path(path: &str) -> Result<String, &'static str> {
    if path.len() > MAX_PATH {
        return Err("request path too long");
    }
    let mut out = Vec::with_capacity(path.len());
    let segments: Vec<&str> = path.split('/').collect();
    for (i, seg) in segments.iter().enumerate().skip(1) {
        if seg.is_empty() && i + 1 < segments.len() {
            return Err("empty path segment (//)");
        }
        out.push(b'/');
        let start = out.len();
        let bytes = seg.as_bytes();
        let mut j = 0;
        while j < bytes.len() {
            let b = match bytes[j] {
                b'%' => {
                    let hex = bytes.get(j + 1..j + 3).ok_or("invalid percent-encoding")?;
                    let v = std::str::from_utf8(hex)
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                        .ok_or("invalid percent-encoding")?;
                    if v == b'/' || v == b'\\' {
                        return Err("encoded slash in the request path");
                    }
                    j += 3;
                    v
                }
                b'\\' => return Err("backslash in the request path"),
                b => {
                    j += 1;
                    b
                }
            };
            if b.is_ascii_control() {
                return Err("control character in the request path");
            }
            out.push(b);
        }
        let decoded = &out[start..];
        if decoded == b"." || decoded == b".." {
            return Err("dot segment in the request path");
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpstreamAddr;
    use crate::metrics::Metrics;
    use crate::proxy::pool::PoolOptions;

    fn pool(name: &str) -> Arc<Pool> {
        Pool::new(PoolOptions::local(
            name,
            UpstreamAddr::Unix(format!("/nonexistent/{name}.sock").into()),
            65536,
            Metrics::new(),
        ))
    }

    fn route(patterns: &[&str], methods: &[Method], plaintext: bool, name: &str) -> Route {
        Route {
            patterns: patterns.iter().map(|p| p.parse().unwrap()).collect(),
            methods: methods.to_vec(),
            plaintext,
            target: Target::Forward(pool(name)),
        }
    }

    /// The pool a request goes to, by name; "default" for the listener's own.
    fn to(routes: &Routes, method: &Method, path: &str, tls: bool) -> Result<String, u16> {
        match routes.decide(method, path, tls) {
            Ok((Decision::Default, _)) => Ok("default".into()),
            Ok((Decision::Forward(p), _)) => Ok(p.name.clone()),
            Ok((Decision::Find(_), _)) => Ok("find".into()),
            Err(e) => Err(e.status().as_u16()),
        }
    }

    #[tokio::test]
    async fn the_most_specific_route_wins_whatever_the_order() {
        let routes = Routes::new(
            TlsMode::Optional,
            vec![
                route(&["/a/*"], &[], true, "a"),
                route(&["/a/b/*"], &[], false, "ab"),
                route(&["/a/b/c"], &[Method::GET], true, "abc-exact"),
                route(&["/a/b/*"], &[], true, "ab-second"),
            ],
        );
        let get = &Method::GET;
        assert_eq!(to(&routes, get, "/a/x", true).unwrap(), "a");
        assert_eq!(
            to(&routes, get, "/a/b/x", true).unwrap(),
            "ab",
            "longer prefix; first of equals"
        );
        assert_eq!(to(&routes, get, "/a/b/c", true).unwrap(), "abc-exact");
        assert_eq!(to(&routes, get, "/a/b/c/d", true).unwrap(), "ab");
        assert_eq!(to(&routes, get, "/v1", true).unwrap(), "default");
        // Over plain HTTP only plaintext routes; the route chosen decides, not any match.
        assert_eq!(to(&routes, get, "/a/x", false).unwrap(), "a");
        assert_eq!(to(&routes, get, "/a/b/x", false), Err(403));
        assert_eq!(to(&routes, get, "/v1", false), Err(403));
        // Methods: 405 with the route's Allow.
        assert_eq!(to(&routes, &Method::POST, "/a/b/c", true), Err(405));
        match routes.decide(&Method::POST, "/a/b/c", true) {
            Err(ProxyError::MethodNotAllowed(allow)) => assert_eq!(allow, "GET"),
            _ => panic!("405 expected"),
        }
        // Matching is on the decoded path.
        assert_eq!(to(&routes, get, "/a/b/%63", true).unwrap(), "abc-exact");
        assert_eq!(to(&routes, get, "/a/../v1", true), Err(400));
    }

    #[tokio::test]
    async fn a_none_listener_without_plaintext_routes_serves_plain_http_as_before() {
        let routes = Routes::new(
            TlsMode::None,
            vec![route(&["/images/*"], &[], false, "img")],
        );
        assert_eq!(to(&routes, &Method::GET, "/v1", false).unwrap(), "default");
        assert_eq!(
            to(&routes, &Method::GET, "/images/x", false).unwrap(),
            "img"
        );
        let server = Routes::new(
            TlsMode::Server,
            vec![route(&["/images/*"], &[], false, "img")],
        );
        assert_eq!(to(&server, &Method::GET, "/v1", true).unwrap(), "default");
    }

    #[test]
    fn paths_that_an_upstream_would_resolve_differently_are_refused() {
        for bad in [
            "/pxelinux.cfg/../v1/nodes",
            "/pxelinux.cfg/%2e%2e/v1",
            "/pxelinux.cfg/%2E%2e/v1",
            "/pxelinux.cfg/.%2E/v1",
            "/pxelinux.cfg/./x",
            "/pxelinux.cfg/..",
            "/pxelinux.cfg/%2e",
            "/pxelinux.cfg/a%2fb",
            "/pxelinux.cfg/a%2Fb",
            "/pxelinux.cfg/a%5cb",
            "/pxelinux.cfg/a%5Cb",
            "/pxelinux.cfg/a\\b",
            "/pxelinux.cfg//x",
            "//v1/nodes",
            "/a%00b",
            "/a%0ab",
            "/a%zz",
            "/a%2",
            "/a%",
        ] {
            assert!(check_path(bad).is_err(), "{bad} passed");
        }
        assert!(check_path(&format!("/{}", "a".repeat(8192))).is_err());
        assert!(check_path(&format!("/{}", "a".repeat(MAX_PATH - 1))).is_ok());
    }

    #[test]
    fn ordinary_paths_pass_decoded() {
        assert_eq!(check_path("/").unwrap(), "/");
        assert_eq!(check_path("/v1/nodes/").unwrap(), "/v1/nodes/");
        assert_eq!(
            check_path("/pxelinux%2Ecfg/52-54-00-00-00-01").unwrap(),
            "/pxelinux.cfg/52-54-00-00-00-01"
        );
        assert_eq!(check_path("/images/a..b/..c").unwrap(), "/images/a..b/..c");
        assert_eq!(check_path("/a%20b").unwrap(), "/a b");
    }
}
