//! The verified identity of a mutual-TLS client, its `X-Forwarded-Client-Cert` form, and the
//! table that shares both among the connections presenting the same certificate.

use super::allow::{is_allowed, AllowRule};
use http::HeaderValue;
use rustls::pki_types::CertificateDer;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
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

/// The most distinct client certificates [`Identities`] remembers; more are parsed for each
/// connection as before.
const MAX_IDENTITIES: usize = 256;

/// The parsed identities of the client certificates one listener has verified, shared by the
/// connections that present the same leaf. A JSON-RPC listener sees a few certificates (one per
/// conductor) over many connections: the identity and its `X-Forwarded-Client-Cert` value are
/// then parsed and formatted once per certificate instead of once per handshake, and held once
/// however many connections carry them. rustls still verifies every handshake's chain; only the
/// parse of identical bytes is reused, keyed by the whole leaf. The chain as presented is kept
/// the same way (a connection re-verifies it after a trust change, see `trust`); a connection
/// whose intermediates differ from the entry's keeps its own copy. An entry lives while a
/// connection holds its identity; dead entries are swept when the table is full.
#[derive(Default)]
pub(crate) struct Identities {
    known: Mutex<HashMap<Box<[u8]>, Known>>,
}

struct Known {
    identity: Weak<ClientIdentity>,
    xfcc: Option<HeaderValue>,
    chain: Weak<[CertificateDer<'static>]>,
}

/// A verified client of one connection: its identity, the identity's XFCC value, and the
/// chain it presented (leaf first).
pub(crate) struct Client {
    pub(crate) identity: Arc<ClientIdentity>,
    pub(crate) xfcc: Option<HeaderValue>,
    pub(crate) chain: Arc<[CertificateDer<'static>]>,
}

impl Identities {
    /// The client of the verified `chain` (leaf first); `None` when there is no leaf or it
    /// cannot be parsed.
    pub(crate) fn get(&self, chain: &[CertificateDer<'static>]) -> Option<Client> {
        let der: &[u8] = chain.first()?.as_ref();
        if let Ok(known) = self.known.lock() {
            if let Some(k) = known.get(der) {
                if let Some(identity) = k.identity.upgrade() {
                    let chain = k
                        .chain
                        .upgrade()
                        .filter(|c| **c == *chain)
                        .unwrap_or_else(|| chain.into());
                    let xfcc = k.xfcc.clone();
                    return Some(Client {
                        identity,
                        xfcc,
                        chain,
                    });
                }
            }
        }
        let identity = Arc::new(ClientIdentity::from_der(der)?);
        let xfcc = HeaderValue::from_str(&identity.xfcc()).ok();
        let chain: Arc<[CertificateDer<'static>]> = chain.into();
        if let Ok(mut known) = self.known.lock() {
            if known.len() >= MAX_IDENTITIES && !known.contains_key(der) {
                known.retain(|_, k| k.identity.strong_count() > 0);
            }
            if known.len() < MAX_IDENTITIES || known.contains_key(der) {
                let entry = Known {
                    identity: Arc::downgrade(&identity),
                    xfcc: xfcc.clone(),
                    chain: Arc::downgrade(&chain),
                };
                known.insert(der.into(), entry);
            }
        }
        Some(Client {
            identity,
            xfcc,
            chain,
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.known.lock().map_or(0, |k| k.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(dns: &str) -> Vec<CertificateDer<'static>> {
        let key = rcgen::KeyPair::generate().expect("key");
        let der = rcgen::CertificateParams::new(vec![dns.to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("certificate")
            .der()
            .to_vec();
        vec![CertificateDer::from(der)]
    }

    fn parts(c: Client) -> (Arc<ClientIdentity>, Option<HeaderValue>) {
        (c.identity, c.xfcc)
    }

    #[test]
    fn connections_with_the_same_certificate_share_one_identity() {
        let table = Identities::default();
        let (a, b) = (
            leaf("conductor-1.ironic.test"),
            leaf("conductor-2.ironic.test"),
        );
        let (first, xfcc) = parts(table.get(&a).expect("parses"));
        let (again, xfcc_again) = parts(table.get(&a).expect("parses"));
        assert!(
            Arc::ptr_eq(&first, &again),
            "the same leaf shares its identity"
        );
        assert_eq!(xfcc, xfcc_again);
        assert_eq!(first.dns, ["conductor-1.ironic.test"]);
        let expected = HeaderValue::from_str(&first.xfcc()).ok();
        assert_eq!(xfcc, expected, "the XFCC value is the identity's");
        let (other, other_xfcc) = parts(table.get(&b).expect("parses"));
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(other.dns, ["conductor-2.ironic.test"]);
        assert_ne!(other_xfcc, xfcc);
        // Once no connection holds it, the identity is parsed again (its memory went with
        // the last connection).
        drop((first, again, xfcc, xfcc_again));
        let (parsed, _) = parts(table.get(&a).expect("parses"));
        assert_eq!(parsed.dns, ["conductor-1.ironic.test"]);
        assert!(table
            .get(&[CertificateDer::from(b"not a certificate".to_vec())])
            .is_none());
        assert!(table.get(&[]).is_none(), "no leaf");
    }

    #[test]
    fn the_same_chain_is_shared_and_other_intermediates_are_kept_apart() {
        let table = Identities::default();
        let mut chain = leaf("conductor-1.ironic.test");
        chain.extend(leaf("intermediate-1.ironic.test"));
        let first = table.get(&chain).expect("parses");
        let again = table.get(&chain.clone()).expect("parses");
        assert!(Arc::ptr_eq(&first.chain, &again.chain), "one copy");
        assert_eq!(&*first.chain, chain.as_slice());
        let mut other = chain.clone();
        other[1] = leaf("intermediate-2.ironic.test").remove(0);
        let apart = table.get(&other).expect("parses");
        assert!(Arc::ptr_eq(&first.identity, &apart.identity), "same leaf");
        assert_eq!(&*apart.chain, other.as_slice(), "its own intermediates");
    }

    #[test]
    fn the_table_stays_bounded_and_sweeps_identities_no_connection_holds() {
        let table = Identities::default();
        let leaves: Vec<Vec<CertificateDer<'static>>> = (0..MAX_IDENTITIES + 8)
            .map(|i| leaf(&format!("c{i}.ironic.test")))
            .collect();
        let held: Vec<_> = leaves
            .iter()
            .map(|d| table.get(d).expect("parses"))
            .collect();
        assert_eq!(
            table.len(),
            MAX_IDENTITIES,
            "no more entries than the bound"
        );
        for (d, c) in leaves.iter().zip(&held) {
            let again = table.get(d).expect("parses");
            assert_eq!(
                again.identity.dns, c.identity.dns,
                "past the bound, still the right identity"
            );
        }
        drop(held);
        let fresh = table.get(&leaf("new.ironic.test")).expect("parses");
        assert_eq!(fresh.identity.dns, ["new.ironic.test"]);
        assert_eq!(table.len(), 1, "dead entries swept when the table was full");
    }
}
