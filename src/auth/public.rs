//! Public paths: requests that pass without credentials, as httpd's `Require all granted`
//! locations do in ironic-image (`ironic-config/httpd-ironic-api.conf.j2`).
//!
//! A request is public only when its path matches an entry literally (case-sensitive) AND
//! cannot mean anything else to the upstream: every byte is an RFC 3986 unreserved character
//! or `/`, so there is no percent-encoding, no `;` parameter, no `\`; no segment is `.` or `..`
//! (RFC 3986 §5.2.4 would remove them); and no segment is empty (`//`), which some routers
//! collapse. Anything else is not an error, it simply needs credentials.

use std::fmt;

/// One entry of `public`: `/x` exact, `/x/*` every path below `/x/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublicPath {
    Exact(String),
    /// The prefix, ending in `/`.
    Below(String),
}

impl std::str::FromStr for PublicPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (path, below) = match s.strip_suffix("/*") {
            Some(p) => (format!("{p}/"), true),
            None => (s.to_owned(), false),
        };
        if !path.starts_with('/') {
            return Err(format!("{s:?} must start with /"));
        }
        if path.contains('*') {
            return Err(format!("{s:?}: * is only allowed as a final /*"));
        }
        // The root is "/", whose only segment is empty; every other entry must be canonical.
        if path != "/" && !is_canonical(path.trim_end_matches('/')) {
            return Err(format!(
                "{s:?} is not a canonical path (unreserved characters only, no . or .. or // \
                 segments)"
            ));
        }
        Ok(if below {
            Self::Below(path)
        } else {
            Self::Exact(path)
        })
    }
}

impl fmt::Display for PublicPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(p) => f.write_str(p),
            Self::Below(p) => write!(f, "{p}*"),
        }
    }
}

/// ironic-image's set: version discovery and what the ramdisk agent calls before it has
/// credentials.
pub(crate) const IRONIC_DEFAULT: &[&str] = &[
    "/",
    "/v1",
    "/v1/",
    "/v1/lookup",
    "/v1/heartbeat/*",
    "/v1/continue_inspection",
];

/// True when `path` is public under `rules`.
pub(crate) fn is_public(rules: &[PublicPath], path: &str) -> bool {
    if rules.is_empty() || !(path == "/" || is_canonical(path.strip_suffix('/').unwrap_or(path))) {
        return false;
    }
    rules.iter().any(|r| match r {
        PublicPath::Exact(p) => p == path,
        PublicPath::Below(p) => path.len() > p.len() && path.starts_with(p.as_str()),
    })
}

/// `/seg/seg/...` with every segment non-empty, not `.` or `..`, and made of RFC 3986
/// unreserved characters only.
fn is_canonical(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    rest.split('/').all(|seg| {
        !seg.is_empty()
            && seg != "."
            && seg != ".."
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
    })
}
