//! DNS names: the one syntax every part of the proxy accepts, and the three shapes it uses.
//!
//! What it owns: [`DnsName`] (a host or service name: `allow` rules, `dns` targets, the name a
//! self-issued leaf is verified for), [`WildcardName`] (`*.suffix`, one whole leftmost label:
//! `allow` rules and certificate SANs) and [`DnsSuffix`] (an X.509 name-constraint subtree,
//! RFC 5280 §4.2.1.10, with an optional leading dot).
//!
//! What it guarantees:
//! - **Syntax is rustls'.** A [`DnsName`] holds a [`rustls_pki_types::DnsName`], so what we accept
//!   is exactly what rustls and webpki accept as a name: labels of 1 to 63 letters, digits, `-`
//!   and `_`, no label starting or ending with `-`, at most 253 characters (not counting one
//!   trailing dot), and a last label that is not a number (decimal, or `0x` hex), which would
//!   read as an IPv4 address. Internationalised names are written in their `xn--` form.
//! - **Reasons.** pki-types' error carries no reason, so [`reason`] finds it by hand, following
//!   the same rules in the same order; it runs before pki-types, and a name is accepted only when
//!   both agree (the unit tests check they agree on every case in their tables).
//! - **One normal form.** ASCII lower case, one trailing dot removed. Matching a presented name
//!   (a certificate SAN as a peer sent it: any string) is ASCII case-insensitive, ignores one
//!   trailing dot and never allocates.
//!
//! Certificates we issue are stricter than that ([`check_san`]): no trailing dot, since webpki
//! never matches an absolute presented name, and no `_`, since RFC 5280 §4.2.1.6 puts DNS SANs in
//! the host name syntax of RFC 1034 §3.5 (an `_` name is an SRV owner, not a host).

use std::fmt;
use std::str::FromStr;

/// The longest name, without its trailing dot (RFC 1035 §2.3.4: 255 octets on the wire).
const MAX_NAME: usize = 253;
/// The longest label (RFC 1035 §2.3.4).
const MAX_LABEL: usize = 63;

/// Why a string is not a DNS name of the shape asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DnsNameError {
    #[error("the name is empty")]
    Empty,
    #[error("the name is longer than 253 characters")]
    TooLong,
    #[error("the name has an empty label (a leading, doubled or second trailing dot)")]
    EmptyLabel,
    #[error("a label is longer than 63 characters")]
    LabelTooLong,
    #[error(
        "only letters, digits, '-', '_' and '.' are allowed, not {0:?}{hint}",
        hint = if .0.is_ascii() { "" } else { " (an internationalised name goes in its xn-- form)" }
    )]
    Character(char),
    #[error("a label starts or ends with '-'")]
    Hyphen,
    #[error("the last label is a number, which reads as an IP address (use an IP address)")]
    NumericLast,
    #[error(
        "a wildcard is '*' as the whole leftmost label, then at least two labels, as in \
             *.ironic.metal3.svc"
    )]
    Wildcard,
    #[error("a certificate name cannot end with a dot")]
    Absolute,
    #[error("'_' is for service (SRV) names, not the host names a certificate carries")]
    Underscore,
    /// pki-types refused a name that `reason` passed: a defence, which the unit tests check
    /// no case in their tables reaches.
    #[error("not a name rustls accepts")]
    Syntax,
}

/// A DNS name in normal form (ASCII lower case, no trailing dot), valid for rustls.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DnsName(rustls_pki_types::DnsName<'static>);

impl DnsName {
    /// Parses a name as written in configuration or a query: one trailing dot is allowed and
    /// removed, upper case is lowered.
    ///
    /// # Errors
    ///
    /// The first rule `s` breaks, in the order of `reason`.
    pub fn parse(s: &str) -> Result<Self, DnsNameError> {
        let bare = s.strip_suffix('.').unwrap_or(s);
        if let Some(reason) = reason(bare) {
            return Err(reason);
        }
        rustls_pki_types::DnsName::try_from(bare.to_ascii_lowercase())
            .map(Self)
            .map_err(|_| DnsNameError::Syntax)
    }

    /// Parses a host name as a certificate we issue carries it: [`Self::parse`], and neither a
    /// trailing dot nor `_` (see the module documentation).
    ///
    /// # Errors
    ///
    /// As [`Self::parse`], then [`DnsNameError::Absolute`] or [`DnsNameError::Underscore`].
    pub fn parse_host(s: &str) -> Result<Self, DnsNameError> {
        let name = Self::parse(s)?;
        host_only(s)?;
        Ok(name)
    }

    pub fn as_str(&self) -> &str {
        self.0.as_ref()
    }

    /// Whether `presented` (a SAN as a peer sent it) is this name: ASCII case-insensitive, one
    /// trailing dot ignored.
    pub fn matches(&self, presented: &str) -> bool {
        strip_dot(presented).eq_ignore_ascii_case(self.as_str())
    }

    /// The name rustls verifies a server certificate for.
    pub fn to_server_name(&self) -> rustls_pki_types::ServerName<'static> {
        rustls_pki_types::ServerName::DnsName(self.0.clone())
    }
}

impl FromStr for DnsName {
    type Err = DnsNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// `*.suffix`: any one label in front of `suffix` (RFC 6125 §6.4.3 as webpki and NSS apply it:
/// `*` is the whole leftmost label, and at least two labels follow it).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct WildcardName {
    suffix: DnsName,
}

impl WildcardName {
    /// Parses `*.suffix`; one trailing dot is allowed and removed, upper case is lowered.
    ///
    /// # Errors
    ///
    /// [`DnsNameError::Wildcard`] when `*` is misplaced or fewer than two labels follow it,
    /// otherwise why the suffix is not a [`DnsName`].
    pub fn parse(s: &str) -> Result<Self, DnsNameError> {
        let rest = s.strip_prefix("*.").ok_or(DnsNameError::Wildcard)?;
        if rest.contains('*') {
            return Err(DnsNameError::Wildcard);
        }
        let suffix = DnsName::parse(rest).map_err(|e| match e {
            DnsNameError::Empty => DnsNameError::Wildcard,
            e => e,
        })?;
        if !suffix.as_str().contains('.') {
            return Err(DnsNameError::Wildcard);
        }
        Ok(Self { suffix })
    }

    /// [`Self::parse`] with the rules of [`DnsName::parse_host`].
    ///
    /// # Errors
    ///
    /// As [`Self::parse`], then [`DnsNameError::Absolute`] or [`DnsNameError::Underscore`].
    pub fn parse_host(s: &str) -> Result<Self, DnsNameError> {
        let name = Self::parse(s)?;
        host_only(s)?;
        Ok(name)
    }

    /// The name the wildcard label stands in front of.
    pub fn suffix(&self) -> &DnsName {
        &self.suffix
    }

    /// Whether `presented` is one non-empty label followed by the suffix: ASCII case-insensitive,
    /// one trailing dot ignored. Neither the bare suffix nor a name two labels deeper matches.
    pub fn matches(&self, presented: &str) -> bool {
        strip_dot(presented)
            .split_once('.')
            .is_some_and(|(first, rest)| {
                !first.is_empty() && rest.eq_ignore_ascii_case(self.suffix.as_str())
            })
    }
}

impl FromStr for WildcardName {
    type Err = DnsNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for WildcardName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "*.{}", self.suffix)
    }
}

impl fmt::Debug for WildcardName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"*.{}\"", self.suffix)
    }
}

/// A DNS name-constraint subtree (RFC 5280 §4.2.1.10): `example.com` holds `example.com` and
/// every name made by adding labels on its left; `.example.com` (leading dot, an extension
/// OpenSSL and webpki share) holds only those longer names.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct DnsSuffix {
    name: DnsName,
    subdomains_only: bool,
}

impl DnsSuffix {
    /// Parses `name` or `.name`, as webpki reads a constraint: no trailing dot, at most 253
    /// characters with the leading dot. Upper case is lowered. (The empty subtree, which holds
    /// every name, is not a suffix: callers that read constraints handle it first.)
    ///
    /// # Errors
    ///
    /// [`DnsNameError::Absolute`] for a trailing dot, [`DnsNameError::TooLong`], or why the name
    /// is not a [`DnsName`].
    pub(crate) fn parse(s: &str) -> Result<Self, DnsNameError> {
        let (rest, subdomains_only) = match s.strip_prefix('.') {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let name = DnsName::parse(rest)?;
        if rest.ends_with('.') {
            return Err(DnsNameError::Absolute);
        }
        if s.len() > MAX_NAME {
            return Err(DnsNameError::TooLong);
        }
        Ok(Self {
            name,
            subdomains_only,
        })
    }

    /// The name without its leading dot.
    pub(crate) fn name(&self) -> &DnsName {
        &self.name
    }

    /// Whether `presented` lies in this subtree, ASCII case-insensitive.
    pub(crate) fn contains(&self, presented: &str) -> bool {
        let base = self.name.as_str();
        (!self.subdomains_only && presented.eq_ignore_ascii_case(base))
            || presented.len() > base.len() + 1
                && presented.as_bytes()[presented.len() - base.len() - 1] == b'.'
                && presented.as_bytes()[presented.len() - base.len()..]
                    .eq_ignore_ascii_case(base.as_bytes())
    }
}

impl FromStr for DnsSuffix {
    type Err = DnsNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for DnsSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dot = if self.subdomains_only { "." } else { "" };
        write!(f, "{dot}{}", self.name)
    }
}

impl fmt::Debug for DnsSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

/// Checks a DNS SAN for a certificate we issue: a host name or a wildcard, with the rules of
/// [`DnsName::parse_host`] (no trailing dot, no `_`).
///
/// # Errors
///
/// Why `s` is neither; a `*` anywhere makes it a wildcard, so a misplaced one says so.
pub(crate) fn check_san(s: &str) -> Result<(), DnsNameError> {
    if s.contains('*') {
        WildcardName::parse_host(s).map(drop)
    } else {
        DnsName::parse_host(s).map(drop)
    }
}

/// The rules certificates add to [`DnsName::parse`], checked once the name parsed.
fn host_only(s: &str) -> Result<(), DnsNameError> {
    if s.ends_with('.') {
        return Err(DnsNameError::Absolute);
    }
    if s.contains('_') {
        return Err(DnsNameError::Underscore);
    }
    Ok(())
}

fn strip_dot(s: &str) -> &str {
    s.strip_suffix('.').unwrap_or(s)
}

/// The first rule a name without its trailing dot breaks, in the order pki-types checks them
/// (`validate` in rustls-pki-types' `server_name.rs`): length, then label by label (empty,
/// character, length, hyphen), then the last label's number check. Written by hand because
/// pki-types' `InvalidDnsNameError` says only that the name is invalid.
fn reason(bare: &str) -> Option<DnsNameError> {
    if bare.is_empty() {
        return Some(DnsNameError::Empty);
    }
    if bare.len() > MAX_NAME {
        return Some(DnsNameError::TooLong);
    }
    let mut last = bare;
    for label in bare.split('.') {
        if label.is_empty() {
            return Some(DnsNameError::EmptyLabel);
        }
        let bad = |c: &char| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_');
        if let Some(c) = label.chars().find(bad) {
            return Some(DnsNameError::Character(c));
        }
        if label.len() > MAX_LABEL {
            return Some(DnsNameError::LabelTooLong);
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Some(DnsNameError::Hyphen);
        }
        last = label;
    }
    // The WHATWG URL "ends in a number" rule, as pki-types applies it: `10`, `0`, `0x`, `0x1f`.
    let hex = last.strip_prefix("0x").or_else(|| last.strip_prefix("0X"));
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || hex.is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    numeric.then_some(DnsNameError::NumericLast)
}

#[cfg(test)]
mod tests;
