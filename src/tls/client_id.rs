//! The verified identity of a mutual-TLS client, and its `X-Forwarded-Client-Cert` form.

use super::allow::{is_allowed, AllowRule};
use std::fmt::Write as _;
use std::net::IpAddr;
use x509_parser::extensions::GeneralName;

/// What the proxy knows about a client whose certificate chain verified.
#[derive(Clone, Debug, Default)]
pub struct ClientIdentity {
    /// SHA-256 of the leaf DER, lower-case hex.
    pub hash: String,
    pub subject: String,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub uris: Vec<String>,
}

impl ClientIdentity {
    /// Reads a leaf certificate that rustls already verified. `None` only if it cannot be parsed,
    /// which verification makes impossible in practice.
    pub fn from_der(der: &[u8]) -> Option<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let mut id = Self {
            hash: hex(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der).as_ref()),
            subject: cert.subject().to_string(),
            ..Self::default()
        };
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(n) => id.dns.push((*n).to_owned()),
                    GeneralName::URI(u) => id.uris.push((*u).to_owned()),
                    GeneralName::IPAddress(bytes) => match bytes.len() {
                        4 => id.ips.push(IpAddr::from(<[u8; 4]>::try_from(*bytes).ok()?)),
                        16 => id
                            .ips
                            .push(IpAddr::from(<[u8; 16]>::try_from(*bytes).ok()?)),
                        _ => {}
                    },
                    _ => {}
                }
            }
        }
        Some(id)
    }

    pub fn is_allowed(&self, rules: &[AllowRule]) -> bool {
        is_allowed(rules, &self.dns, &self.ips)
    }

    /// A short name for logs: the first SAN, else the subject.
    pub fn display_name(&self) -> String {
        self.dns
            .first()
            .cloned()
            .or_else(|| self.ips.first().map(ToString::to_string))
            .or_else(|| self.uris.first().cloned())
            .unwrap_or_else(|| self.subject.clone())
    }

    /// Envoy's `X-Forwarded-Client-Cert` element: `Hash=…;Subject="…";URI=…;DNS=…`.
    /// Quotes and backslashes inside the subject are escaped; SAN values cannot contain
    /// `;`, `,` or `"` as valid DNS names / URIs, but they are quoted when they do.
    pub fn xfcc(&self) -> String {
        let mut out = format!("Hash={};Subject=\"{}\"", self.hash, escape(&self.subject));
        for u in &self.uris {
            let _ = write!(out, ";URI={}", quote_if_needed(u));
        }
        for d in &self.dns {
            let _ = write!(out, ";DNS={}", quote_if_needed(d));
        }
        for ip in &self.ips {
            let _ = write!(out, ";IP={ip}");
        }
        out
    }
}

/// Escapes `\\` and `"`, and writes control and non-ASCII bytes as `\\xNN` so the result is
/// always a valid header value (SANs are IA5String and may hold anything).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            ' '..='~' => out.push(c),
            _ => {
                let mut buf = [0; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
        }
    }
    out
}

fn quote_if_needed(s: &str) -> String {
    if s.contains([';', ',', '"', '=', '\\']) || s.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
        format!("\"{}\"", escape(s))
    } else {
        s.to_owned()
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
