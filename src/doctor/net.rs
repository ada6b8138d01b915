//! The doctor's network steps: a TLS handshake that records the peer's certificate and what our
//! verifier thought of it instead of stopping at the first problem, a one-shot HTTP/1.1 GET, and
//! the admin `/readyz` check.

use super::{Report, STEP_TIMEOUT};
use crate::identity::Material;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the server presented and what verification against our trust bundle said.
#[derive(Debug)]
pub(crate) struct Presented {
    pub chain: Vec<CertificateDer<'static>>,
    /// The verifier's verdict for the name dialled (chain, validity and name together).
    pub verified: Result<(), rustls::Error>,
}

/// Records the certificate and the real verifier's verdict, and lets the handshake go on so the
/// doctor can report every problem of a peer at once. Only ever used by the doctor, which sends
/// nothing but a health request over such a connection.
#[derive(Debug)]
struct DangerRecordingVerifier {
    inner: Arc<WebPkiServerVerifier>,
    seen: Mutex<Option<Presented>>,
}

impl ServerCertVerifier for DangerRecordingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map(|_| ());
        let mut chain = vec![end_entity.clone().into_owned()];
        chain.extend(intermediates.iter().map(|c| c.clone().into_owned()));
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some(Presented { chain, verified });
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A TLS connection made by [`handshake`].
pub(crate) type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// Why a step failed, in words for the report.
pub(crate) type StepError = String;

/// TCP connect within [`STEP_TIMEOUT`]; the time it took.
pub(crate) async fn connect(addr: SocketAddr) -> Result<(TcpStream, Duration), StepError> {
    let start = Instant::now();
    match tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(addr)).await {
        Err(_) => Err(format!("no TCP answer within {STEP_TIMEOUT:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(s)) => Ok((s, start.elapsed())),
    }
}

/// A TLS handshake as `name`, presenting `ours` (when given) as the client certificate.
/// Returns the stream and what the server presented; a handshake that fails is an error.
pub(crate) async fn handshake(
    tcp: TcpStream,
    name: &str,
    ours: Option<&Material>,
    roots: Arc<rustls::RootCertStore>,
) -> Result<(Tls, Presented), StepError> {
    let provider = Arc::new(crate::crypto::provider());
    let inner = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| format!("trust bundle unusable: {e}"))?;
    let recorder = Arc::new(DangerRecordingVerifier {
        inner,
        seen: Mutex::new(None),
    });
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(recorder.clone());
    let mut cfg = match ours {
        Some(m) => builder.with_client_cert_resolver(Arc::new(
            rustls::sign::SingleCertAndKey::from(m.certified_key.clone()),
        )),
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let server_name =
        ServerName::try_from(name.to_owned()).map_err(|e| format!("name {name:?}: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tls = match tokio::time::timeout(STEP_TIMEOUT, connector.connect(server_name, tcp)).await {
        Err(_) => return Err(format!("no TLS handshake within {STEP_TIMEOUT:?}")),
        Ok(Err(e)) => return Err(crate::error::chain(&e)),
        Ok(Ok(t)) => t,
    };
    let presented = recorder
        .seen
        .lock()
        .ok()
        .and_then(|mut s| s.take())
        .ok_or_else(|| "the server presented no certificate".to_owned())?;
    Ok((tls, presented))
}

/// An HTTP/1.1 answer's status and `Date`.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub date: Option<SystemTime>,
    pub body: String,
    pub round_trip: Duration,
}

/// `GET path` with `Connection: close`; reads the head and up to 4 KiB of body.
pub(crate) async fn get<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    host: &str,
    path: &str,
) -> Result<Answer, StepError> {
    let start = Instant::now();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: ironic-proxy-doctor\r\n\
         Connection: close\r\n\r\n"
    );
    let exchange = async {
        s.write_all(req.as_bytes()).await?;
        s.flush().await?;
        let mut buf = Vec::with_capacity(4096);
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > 64 * 1024 {
                break;
            }
            if let Some(end) = memchr::memmem::find(&buf, b"\r\n\r\n") {
                if buf.len() >= end + 4 + 4096 {
                    break;
                }
            }
        }
        Ok::<_, std::io::Error>(buf)
    };
    let buf = match tokio::time::timeout(STEP_TIMEOUT, exchange).await {
        Err(_) => return Err(format!("no HTTP answer within {STEP_TIMEOUT:?}")),
        // A close after a complete answer (TLS without close_notify) is not a failure.
        Ok(Err(e)) if !matches!(e.kind(), std::io::ErrorKind::UnexpectedEof) => {
            return Err(crate::error::chain(&e))
        }
        Ok(Err(_)) => Vec::new(),
        Ok(Ok(b)) => b,
    };
    let round_trip = start.elapsed();
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(head_len)) = resp.parse(&buf) else {
        return Err("no complete HTTP answer".to_owned());
    };
    let date = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("date"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .and_then(|v| httpdate(v.trim()));
    let body = String::from_utf8_lossy(&buf[head_len..buf.len().min(head_len + 512)]).into();
    Ok(Answer {
        status: resp.code.unwrap_or(0),
        date,
        body,
        round_trip,
    })
}

/// An HTTP-date (RFC 9110 §5.6.7): the `httpdate` crate (hyper's), which accepts the three
/// forms a recipient must (IMF-fixdate, RFC 850, asctime).
fn httpdate(v: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(v).ok()
}

/// Where to connect for a listen address: a wildcard becomes loopback of its family.
pub(crate) fn dial_addr(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    }
}

/// `GET /readyz` on the admin listener.
pub(crate) async fn check_admin(listen: SocketAddr, report: &mut Report) {
    let addr = dial_addr(listen);
    let name = "admin";
    let tcp = match connect(addr).await {
        Ok((s, _)) => s,
        Err(e) => return report.fail(name, format!("{addr}: {e}")),
    };
    match get(tcp, &addr.to_string(), "/readyz").await {
        Ok(a) if a.status == 200 => report.pass(name, format!("{addr}/readyz answers 200")),
        Ok(a) => report.fail(
            name,
            format!("{addr}/readyz answers {}: {}", a.status, a.body.trim()),
        ),
        Err(e) => report.fail(name, format!("{addr}/readyz: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{dial_addr, httpdate};
    use std::time::{Duration, SystemTime};

    #[test]
    fn parses_imf_fixdate() {
        let t = httpdate("Sun, 06 Nov 1994 08:49:37 GMT").expect("date");
        assert_eq!(t, SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777));
        assert_eq!(httpdate("Sunday, 06-Nov-94 08:49:37 GMT"), Some(t));
        assert_eq!(httpdate("Sun Nov  6 08:49:37 1994"), Some(t));
        assert_eq!(httpdate(""), None);
    }

    #[test]
    fn wildcards_dial_loopback() {
        assert_eq!(
            dial_addr("0.0.0.0:6385".parse().unwrap()),
            "127.0.0.1:6385".parse().unwrap()
        );
        assert_eq!(
            dial_addr("[::]:6385".parse().unwrap()),
            "[::1]:6385".parse().unwrap()
        );
        assert_eq!(
            dial_addr("10.0.0.2:6385".parse().unwrap()),
            "10.0.0.2:6385".parse().unwrap()
        );
    }
}
