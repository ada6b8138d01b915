//! The doctor's upstream checks for one listener: the local endpoint, the DNS answer, and every
//! peer found (TCP, TLS with our client certificate, the peer's certificate against the address
//! dialled, its expiry, a health request's round trip and the peer's clock).

use super::identity::CertInfo;
use super::{net, Report, STEP_TIMEOUT};
use crate::config::{Config, ListenerConfig, UpstreamAddr};
use crate::discovery::resolve::{Family, Hickory, LookupError, Resolve};
use crate::discovery::Target;
use crate::identity::Material;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

/// Clock skew beyond this fails: certificates issued by a peer with such a clock are not yet
/// valid (or already expired) here, and Ironic's own timeouts go wrong.
const MAX_SKEW: Duration = Duration::from_secs(10);

pub(super) async fn check(
    config: &Config,
    lc: &ListenerConfig,
    ours: Option<&Material>,
    report: &mut Report,
) {
    let base = format!("upstream[{}]", lc.name);
    let up = &lc.upstream;
    if let Some(local) = &up.local {
        check_local(&format!("{base}.local"), local, report).await;
    }
    let Some(target) = &up.dns else { return };
    let name = format!("{base}.dns");
    let peers = match resolve(&config.dns.servers, target).await {
        Ok(p) => p,
        Err(e) => return report.fail(name, format!("{target}: {e}")),
    };
    let list: Vec<String> = peers.iter().map(|(a, _)| a.to_string()).collect();
    report.pass(
        name,
        format!("{target}: {} endpoint(s): {}", peers.len(), list.join(", ")),
    );
    for (addr, tls_name) in peers {
        let peer = format!("{base}.peer[{addr}]");
        check_peer(
            &peer,
            addr,
            &tls_name,
            up.tls.then_some(ours).flatten(),
            up.tls,
            &up.health.path,
            report,
        )
        .await;
    }
}

async fn check_local(name: &str, local: &UpstreamAddr, report: &mut Report) {
    let start = std::time::Instant::now();
    let connected = match local {
        UpstreamAddr::Unix(path) => {
            match tokio::time::timeout(STEP_TIMEOUT, tokio::net::UnixStream::connect(path)).await {
                Err(_) => Err(format!("no answer within {STEP_TIMEOUT:?}")),
                Ok(r) => r.map(drop).map_err(|e| e.to_string()),
            }
        }
        UpstreamAddr::Tcp { host, port } => {
            let dial = async {
                let addr = tokio::net::lookup_host((host.as_str(), *port))
                    .await
                    .map_err(|e| e.to_string())?
                    .next()
                    .ok_or_else(|| "no address".to_owned())?;
                net::connect(addr).await.map(drop)
            };
            dial.await
        }
    };
    match connected {
        Ok(()) => report.pass(
            name,
            format!(
                "{local} accepts connections ({:.1} ms)",
                ms(start.elapsed())
            ),
        ),
        Err(e) => report.fail(name, format!("{local}: cannot connect: {e}")),
    }
}

/// The endpoints the proxy's discovery would find now: (address, name to verify).
pub(super) async fn resolve(
    servers: &[SocketAddr],
    target: &Target,
) -> Result<Vec<(SocketAddr, String)>, String> {
    let resolver = Hickory::new(servers).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let hosts: Vec<(String, u16)> = match target {
        Target::Host { name, port } => vec![(name.clone(), *port)],
        Target::Srv { name } => resolver
            .srv(name)
            .await
            .map_err(|e| lookup_error(&e))?
            .records
            .into_iter()
            .filter(|s| s.target != ".")
            .map(|s| (s.target, s.port))
            .collect(),
    };
    let srv = matches!(target, Target::Srv { .. });
    let mut last_err = None;
    for (host, port) in hosts {
        for family in [Family::V4, Family::V6] {
            match resolver.ips(&host, family).await {
                Ok(a) => out.extend(a.records.into_iter().map(|ip: IpAddr| {
                    let tls_name = if srv { host.clone() } else { ip.to_string() };
                    (SocketAddr::new(ip, port), tls_name)
                })),
                Err(LookupError::NoData) => {}
                Err(e) => last_err = Some(lookup_error(&e)),
            }
        }
    }
    if out.is_empty() {
        return Err(last_err.unwrap_or_else(|| "no A or AAAA records".to_owned()));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn lookup_error(e: &LookupError) -> String {
    match e {
        LookupError::Failed(f) => format!("no answer from DNS: {}", crate::error::chain(f)),
        other => other.to_string(),
    }
}

#[allow(clippy::too_many_arguments)]
async fn check_peer(
    base: &str,
    addr: SocketAddr,
    tls_name: &str,
    ours: Option<&Material>,
    tls: bool,
    health_path: &str,
    report: &mut Report,
) {
    let (tcp, took) = match net::connect(addr).await {
        Ok(c) => c,
        Err(e) => return report.fail(format!("{base}.tcp"), e),
    };
    report.pass(
        format!("{base}.tcp"),
        format!("connected in {:.1} ms", ms(took)),
    );
    let host = addr.to_string();
    let answer = if tls {
        let Some(m) = ours else {
            return report.fail(format!("{base}.tls"), "no identity to connect with");
        };
        let (stream, presented) = match net::handshake(tcp, tls_name, Some(m), m.roots.clone())
            .await
        {
            Ok(x) => x,
            Err(e) => return report.fail(format!("{base}.tls"), format!("handshake failed: {e}")),
        };
        let leaf = CertInfo::parse(&presented.chain[0]);
        let name_error = matches!(
            presented.verified,
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. }
            ))
        );
        match &presented.verified {
            Err(e) if !name_error => report.fail(
                format!("{base}.tls"),
                format!("the peer's certificate is not trusted: {e}"),
            ),
            _ => report.pass(
                format!("{base}.tls"),
                "handshake with our client certificate; the peer's chain is trusted",
            ),
        }
        match &leaf {
            None => report.fail(
                format!("{base}.name"),
                "the peer's certificate does not parse",
            ),
            Some(l) if l.covers(tls_name) => report.pass(
                format!("{base}.name"),
                format!("the certificate covers {tls_name}"),
            ),
            Some(l) => report.fail(
                format!("{base}.name"),
                format!(
                    "the certificate does not cover {tls_name}, the address dialled (it names {})",
                    l.sans()
                ),
            ),
        }
        if let Some(l) = &leaf {
            match l.validity(SystemTime::now()) {
                Ok(v) => report.pass(format!("{base}.expiry"), v),
                Err(e) => report.fail(format!("{base}.expiry"), e),
            }
        }
        net::get(stream, &host, health_path).await
    } else {
        net::get(tcp, &host, health_path).await
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => return report.fail(format!("{base}.http"), format!("GET {health_path}: {e}")),
    };
    let line = format!(
        "GET {health_path} answered {} in {:.1} ms",
        answer.status,
        ms(answer.round_trip)
    );
    if (200..400).contains(&answer.status) {
        report.pass(format!("{base}.http"), line);
    } else {
        report.fail(format!("{base}.http"), line);
    }
    let Some(date) = answer.date else {
        return report.fail(format!("{base}.clock"), "the answer has no Date header");
    };
    let now = SystemTime::now();
    let (skew, sign) = match now.duration_since(date) {
        Ok(d) => (d, "behind"),
        Err(e) => (e.duration(), "ahead of"),
    };
    // Date has a resolution of one second.
    let line = format!("the peer's clock is {}s {sign} ours", skew.as_secs());
    if skew > MAX_SKEW {
        report.fail(format!("{base}.clock"), line);
    } else {
        report.pass(format!("{base}.clock"), line);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
