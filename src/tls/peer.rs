//! TLS origination to peers: verify the peer against the trust bundle, present our own
//! certificate. The client configuration follows identity changes.

use crate::identity::Material;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use std::sync::Arc;
use tokio::net::TcpStream;

/// A reloadable client TLS configuration plus the name to verify.
#[derive(Clone)]
pub struct PeerTls {
    config: Arc<super::ReloadableClient>,
    name: ServerName<'static>,
}

impl PeerTls {
    pub fn new(config: Arc<super::ReloadableClient>, name: ServerName<'static>) -> Self {
        Self { config, name }
    }

    /// A TLS connection over `tcp` with the current identity, and the generation of the
    /// client configuration it was made with (see [`Self::generation`]).
    pub async fn connect(
        &self,
        tcp: TcpStream,
    ) -> std::io::Result<(tokio_rustls::client::TlsStream<TcpStream>, u64)> {
        let (generation, config) = self.config.load_with_generation();
        let connector = tokio_rustls::TlsConnector::from(config);
        let stream = connector.connect(self.name.clone(), tcp).await?;
        Ok((stream, generation))
    }

    /// The generation of the current client configuration: it changes with every identity
    /// generation (a renewed certificate, a new trust bundle), so a connection made with an
    /// older one presents a certificate that has since been replaced.
    pub fn generation(&self) -> u64 {
        self.config.generation()
    }

    /// Receives every new generation of the client configuration (see [`Self::generation`]).
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.config.changes()
    }
}

/// Client configuration for peers from one identity generation (HTTP/1.1 only).
pub(crate) fn client_config(material: &Material) -> Result<Arc<ClientConfig>, rustls::Error> {
    let provider = Arc::new(crate::crypto::provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(crate::crypto::policy::current().versions())?
        .with_root_certificates(material.roots.clone())
        .with_client_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(
            material.certified_key.clone(),
        )));
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The rustls error in an error's chain (itself or a source, also inside an `io::Error`) and the
/// `reason` label it is counted under in `ironic_proxy_peer_tls_failures_total`; `None` when the
/// failure was not TLS (refused, reset, timeout). Used for real requests and for health checks
/// alike: a peer whose certificate fails never passes a check, so the checks are where its
/// refusal shows.
pub(crate) fn failure_reason<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<(&'static str, &'a rustls::Error)> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        let tls = c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>())
            .or_else(|| c.downcast_ref::<rustls::Error>());
        if let Some(t) = tls {
            let reason = match t {
                rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. },
                ) => "name_mismatch",
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer) => {
                    "unknown_issuer"
                }
                rustls::Error::InvalidCertificate(_) => "bad_certificate",
                rustls::Error::AlertReceived(_) => "alert_received",
                _ => "other",
            };
            return Some((reason, t));
        }
        cur = c.source();
    }
    None
}
