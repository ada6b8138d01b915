//! The doctor's network steps: a TLS handshake that records the peer's certificate and what our
//! verifier thought of it instead of stopping at the first problem, a one-shot HTTP/1.1 GET (on
//! the proxy's own framing, `crate::http1`), and the admin `/readyz` check.

use super::{Report, STEP_TIMEOUT};
use crate::http1;
use crate::identity::Material;
use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderValue};
use http::Method;
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

/// The most of an answer's body the doctor reads.
const BODY_BYTES: usize = 4096;

/// The longest answer head the doctor reads.
const HEAD_BYTES: usize = 64 * 1024;

/// `GET path` with `Connection: close`, through the proxy's own HTTP/1.1 framing
/// ([`crate::http1`]): the head written as the upstream client writes it, the answer's head
/// parsed and its body framed as the upstream client does; up to 4 KiB of the body are read.
pub(crate) async fn get<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    host: &str,
    path: &str,
) -> Result<Answer, StepError> {
    let start = Instant::now();
    let target = http::Uri::try_from(path).map_err(|e| format!("path {path:?}: {e}"))?;
    let mut headers = HeaderMap::new();
    let host = HeaderValue::from_str(host).map_err(|e| format!("host {host:?}: {e}"))?;
    headers.insert(header::HOST, host);
    headers.insert(
        header::USER_AGENT,
        HeaderValue::from_static("ironic-proxy-doctor"),
    );
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    let mut out = Vec::new();
    http1::write_head(
        &Method::GET,
        &target,
        &headers,
        http1::RequestFraming::AsIs,
        &mut out,
    );
    let exchange = async {
        s.write_all(&out).await?;
        s.flush().await?;
        let mut buf = BytesMut::with_capacity(BODY_BYTES);
        let head = read_head(&mut s, &mut buf).await?;
        let framing = http1::response_framing(&Method::GET, &head)?;
        let body = read_body(&mut s, &mut buf, framing.body).await;
        Ok::<_, std::io::Error>((head, body))
    };
    let (head, body) = match tokio::time::timeout(STEP_TIMEOUT, exchange).await {
        Err(_) => return Err(format!("no HTTP answer within {STEP_TIMEOUT:?}")),
        Ok(Err(e)) => return Err(crate::error::chain(&e)),
        Ok(Ok(answer)) => answer,
    };
    let date = head
        .headers
        .get(header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate(v.trim()));
    let body = String::from_utf8_lossy(&body[..body.len().min(512)]).into();
    Ok(Answer {
        status: head.status.as_u16(),
        date,
        body,
        round_trip: start.elapsed(),
    })
}

/// Reads the answer's head, skipping interim (1xx) answers.
async fn read_head<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
) -> std::io::Result<http1::ResponseHead> {
    loop {
        if let Some(head) = http1::parse_response_head(buf)? {
            if head.status.is_informational()
                && head.status != http::StatusCode::SWITCHING_PROTOCOLS
            {
                continue;
            }
            return Ok(head);
        }
        if buf.len() > HEAD_BYTES {
            return Err(http1::Error::HeadTooLarge.into());
        }
        // A TLS peer that closes without close_notify reads as UnexpectedEof: the same end.
        match s.read_buf(buf).await {
            Ok(0) => return Err(http1::Error::ClosedBeforeAnswer.into()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(http1::Error::ClosedBeforeAnswer.into())
            }
            Err(e) => return Err(e),
        }
    }
}

/// Up to [`BODY_BYTES`] of the body, framed as `kind` says. The body is only shown in the
/// report: a body that ends early or badly ends what is shown, it does not fail the step.
async fn read_body<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
    kind: http1::BodyKind,
) -> Vec<u8> {
    let mut body = Vec::new();
    let mut chunked = http1::Chunked::default();
    let mut left = match kind {
        http1::BodyKind::Empty => return body,
        http1::BodyKind::Length(n) => usize::try_from(n).unwrap_or(usize::MAX),
        http1::BodyKind::Chunked | http1::BodyKind::Close => usize::MAX,
    };
    while body.len() < BODY_BYTES && left > 0 {
        let data = match kind {
            http1::BodyKind::Chunked => match chunked.decode(buf) {
                Ok(http1::Decoded::Data(data)) => data,
                Ok(http1::Decoded::End) | Err(_) => break,
                Ok(http1::Decoded::More) => bytes::Bytes::new(),
            },
            _ => buf.split_to(buf.len().min(left)).freeze(),
        };
        if !data.is_empty() {
            left = left.saturating_sub(data.len());
            body.extend_from_slice(&data);
            continue;
        }
        if !matches!(s.read_buf(buf).await, Ok(1..)) {
            break;
        }
    }
    body.truncate(BODY_BYTES);
    body
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
    use super::{dial_addr, get, httpdate};
    use std::time::{Duration, SystemTime};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The GET writes the upstream client's head and reads the answer with its framing.
    #[tokio::test]
    async fn one_shot_gets_read_answers_by_their_framing() {
        let date = "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n";
        for (answer, status, body) in [
            (format!("HTTP/1.1 200 OK\r\n{date}Content-Length: 5\r\n\r\nready+junk"), 200, "ready"),
            (format!("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Unavailable\r\n{date}Transfer-Encoding: chunked\r\n\r\n3\r\nnot\r\n6\r\n ready\r\n0\r\n\r\n"), 503, "not ready"),
            (format!("HTTP/1.0 200 OK\r\n{date}\r\nuntil close"), 200, "until close"),
        ] {
            let (near, mut far) = tokio::io::duplex(1 << 16);
            let up = tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && far.read(&mut b).await.unwrap_or(0) == 1 {
                    head.push(b[0]);
                }
                far.write_all(answer.as_bytes()).await.expect("write");
                far.shutdown().await.expect("shutdown");
                String::from_utf8(head).expect("ASCII")
            });
            let a = get(near, "[::1]:6385", "/v1/?x=1").await.expect("an answer");
            assert_eq!((a.status, a.body.as_str()), (status, body));
            assert_eq!(a.date, httpdate("Sun, 06 Nov 1994 08:49:37 GMT"));
            assert_eq!(
                up.await.expect("upstream"),
                "GET /v1/?x=1 HTTP/1.1\r\nhost: [::1]:6385\r\nuser-agent: ironic-proxy-doctor\r\n\
                 connection: close\r\n\r\n"
            );
        }
        let (near, mut far) = tokio::io::duplex(1 << 16);
        far.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
            .await
            .expect("write");
        let e = get(near, "h", "/").await.expect_err("a bad length");
        assert!(e.contains("invalid Content-Length"), "{e}");
    }

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
