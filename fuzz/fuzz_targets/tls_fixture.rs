//! What the TLS stream targets (`tls_stream`, `tls_differential`) share: configurations built
//! once for a cheap handshake, rustls' one known assertion caught, and the in-memory socket.
//!
//! The handshake runs before every input and is not what these targets fuzz (rustls has fuzz
//! targets of its own), so it is made as cheap as rustls allows: one ECDSA P-256 certificate
//! generated once per process, TLS 1.3 with one suite (AES-128-GCM) and one group (X25519, not
//! rustls' default post-quantum hybrid, whose key share is 1,216 bytes of ML-KEM), no session
//! tickets, and a client that accepts the certificate without verifying it or the handshake's
//! signature (dangerous anywhere else; here the server is ours and in the same process).
#![allow(dead_code)]

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::aws_lc_rs::{cipher_suite, kx_group};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

pub struct Configs {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
}

/// Accepts any certificate and signature: the handshake is not what is fuzzed.
#[derive(Debug)]
struct NoVerify;

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ECDSA_NISTP256_SHA256]
    }
}

pub fn configs() -> &'static Configs {
    static C: OnceLock<Configs> = OnceLock::new();
    C.get_or_init(|| {
        // rcgen's default key is ECDSA P-256.
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("certificate");
        let der: CertificateDer<'static> = cert.der().clone();
        // The proxy's provider (its policy), narrowed to one suite and one group.
        let provider = Arc::new(rustls::crypto::CryptoProvider {
            cipher_suites: vec![cipher_suite::TLS13_AES_128_GCM_SHA256],
            kx_groups: vec![kx_group::X25519],
            ..ironic_proxy::crypto_provider()
        });
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![der],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("server config");
        server.send_tls13_tickets = 0;
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify))
            .with_no_client_auth();
        client.resumption = rustls::client::Resumption::disabled();
        Configs {
            server: Arc::new(server),
            client: Arc::new(client),
        }
    })
}

/// The longest [`pattern`] a target asks for (`tls_differential`'s vectored write: a 4,224-byte
/// head and a 33,405-byte body), with room to spare.
const PATTERN_MAX: usize = 1 << 16;

/// The bytes `(start + i) as u8 ^ xor` for `i` in `0..len`, copied from a table built once.
/// Built byte by byte in the target, every iteration's bound check is a traced comparison: that
/// loop took about 40 % of `tls_differential`'s time (perf), more than both connections' TLS.
pub fn pattern(start: usize, len: usize, xor: u8) -> Vec<u8> {
    static TABLES: OnceLock<[Vec<u8>; 3]> = OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        let table = |x: u8| (0..PATTERN_MAX + 256).map(|i| i as u8 ^ x).collect();
        [table(0), table(0x5a), table(0xa5)]
    });
    let table = match xor {
        0 => &tables[0],
        0x5a => &tables[1],
        0xa5 => &tables[2],
        _ => panic!("no pattern table for {xor:#x}"),
    };
    assert!(len <= PATTERN_MAX, "pattern of {len} bytes");
    table[start % 256..][..len].to_vec()
}

pub fn client_connection() -> rustls::ClientConnection {
    let name = ServerName::try_from("localhost").expect("name");
    rustls::ClientConnection::new(configs().client.clone(), name).expect("client")
}

/// rustls 0.23.46 trips its own `debug_assert!(!self.sent_fatal_alert)` when one processing call
/// meets a second failing record (its buffered connection too: see the stream's unit tests).
/// That panic is rustls', not the stream's: it is caught (the stream is not used after it) and
/// every other panic still aborts, as libFuzzer's hook makes it.
pub const RUSTLS_ASSERT: &str = "!self.sent_fatal_alert";

pub fn install_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if !text.contains(RUSTLS_ASSERT) {
                abort(info);
            }
        }));
    });
}

/// Runs one poll; `None` after rustls' known assertion (see [`RUSTLS_ASSERT`]).
pub fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}

pub fn cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// Writes what the socket takes now.
pub fn raw_write(raw: &mut DuplexStream, bytes: &[u8]) -> usize {
    match Pin::new(raw).poll_write(&mut cx(), bytes) {
        Poll::Ready(Ok(n)) => n,
        _ => 0,
    }
}

/// Reads what the socket has now; `true` when it also reached its end.
pub fn raw_read(raw: &mut DuplexStream) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let mut rb = ReadBuf::new(&mut buf);
        match Pin::new(&mut *raw).poll_read(&mut cx(), &mut rb) {
            Poll::Ready(Ok(())) if !rb.filled().is_empty() => out.extend_from_slice(rb.filled()),
            Poll::Ready(Ok(())) => return (out, true),
            Poll::Ready(Err(_)) => return (out, true),
            Poll::Pending => return (out, false),
        }
    }
}
