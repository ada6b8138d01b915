//! What the two reference proxies (`naive-proxy`, `bare-proxy`) share: their command line and
//! the TLS acceptor both run with (TLS 1.3, the benchmark's certificate, ALPN `http/1.1`).

use rustls_pki_types::pem::PemObject;
use std::sync::Arc;

/// `LISTEN CERT KEY UPSTREAM_SOCKET` from the command line, and the acceptor for CERT and KEY.
pub(crate) fn start(
    name: &str,
) -> Result<(String, tokio_rustls::TlsAcceptor, Arc<str>), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, cert, key, socket] = args.as_slice() else {
        return Err(format!("usage: {name} LISTEN CERT KEY UPSTREAM_SOCKET").into());
    };
    let chain = rustls_pki_types::CertificateDer::pem_file_iter(cert)?.collect::<Result<_, _>>()?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    Ok((listen.clone(), acceptor, socket.as_str().into()))
}

/// A current-thread runtime, as both proxies run on one core.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}
