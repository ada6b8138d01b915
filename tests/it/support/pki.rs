//! Certificates generated per test with rcgen: a CA, and leaves with chosen SANs, extended key
//! usages and validity (expired, serverAuth-only, from another CA, ...).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use time::{Duration, OffsetDateTime};

/// A certificate authority that can sign leaves.
pub(crate) struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

/// A signed leaf and its key.
#[derive(Clone)]
pub(crate) struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
    /// The serial number, unique within the test process.
    pub serial: u64,
    pub not_after: OffsetDateTime,
}

/// What a leaf should look like.
#[derive(Clone)]
pub(crate) struct LeafSpec {
    pub common_name: String,
    /// DNS names or IP addresses.
    pub sans: Vec<String>,
    pub server_auth: bool,
    pub client_auth: bool,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl LeafSpec {
    /// Valid from an hour ago for a day, serverAuth + clientAuth.
    pub(crate) fn new(sans: &[&str]) -> Self {
        let now = OffsetDateTime::now_utc();
        Self {
            common_name: sans.first().copied().unwrap_or("leaf").to_owned(),
            sans: sans.iter().map(|s| (*s).to_owned()).collect(),
            server_auth: true,
            client_auth: true,
            not_before: now - Duration::hours(1),
            not_after: now + Duration::days(1),
        }
    }

    /// Only the clientAuth extended key usage.
    pub(crate) fn client(sans: &[&str]) -> Self {
        Self {
            server_auth: false,
            ..Self::new(sans)
        }
    }

    /// Expired yesterday.
    pub(crate) fn expired(mut self) -> Self {
        let now = OffsetDateTime::now_utc();
        self.not_before = now - Duration::days(3);
        self.not_after = now - Duration::days(1);
        self
    }

    /// Only the serverAuth extended key usage.
    pub(crate) fn server_only(mut self) -> Self {
        self.server_auth = true;
        self.client_auth = false;
        self
    }
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

fn next_serial() -> u64 {
    // Distinct across tests in one process and across processes (time-based prefix).
    let base = OffsetDateTime::now_utc().unix_timestamp_nanos() as u64 & 0x00ff_ffff_ffff_0000;
    base | (SERIAL.fetch_add(1, Ordering::Relaxed) & 0xffff) | 0x0100_0000_0000_0000
}

impl Ca {
    pub(crate) fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::days(1);
        params.not_after = now + Duration::days(30);
        params.serial_number = Some(SerialNumber::from(next_serial()));
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-sign CA");
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    pub(crate) fn leaf(&self, spec: &LeafSpec) -> Leaf {
        let mut params = CertificateParams::new(spec.sans.clone()).expect("leaf SANs");
        params
            .distinguished_name
            .push(DnType::CommonName, spec.common_name.as_str());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if spec.server_auth {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if spec.client_auth {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        params.not_before = spec.not_before;
        params.not_after = spec.not_after;
        params.use_authority_key_identifier_extension = true;
        let serial = next_serial();
        params.serial_number = Some(SerialNumber::from(serial));
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            serial,
            not_after: spec.not_after,
        }
    }

    /// The proxy's own certificate: `localhost` and `127.0.0.1`, serverAuth + clientAuth.
    pub(crate) fn server_leaf(&self) -> Leaf {
        self.leaf(&LeafSpec::new(&["localhost", "127.0.0.1"]))
    }

    /// A client certificate with clientAuth only.
    pub(crate) fn client_leaf(&self, sans: &[&str]) -> Leaf {
        self.leaf(&LeafSpec::client(sans))
    }
}

impl Leaf {
    /// Writes `<name>.crt` and `<name>.key` into `dir`.
    pub(crate) fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let crt = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&crt, &self.cert_pem).expect("write cert");
        std::fs::write(&key, &self.key_pem).expect("write key");
        (crt, key)
    }

    /// SHA-256 of the DER, lower-case hex (as in `X-Forwarded-Client-Cert: Hash=`).
    pub(crate) fn sha256(&self) -> String {
        super::sha256_hex(&self.der)
    }
}
