//! `[listeners.egress]`: a listener that is a forward proxy for Ironic's JSON-RPC client (see
//! `crate::proxy::egress`). Typed here; the credentials file is read when the listener starts
//! (and by `check`).

use super::raw::RawEgress;
use super::{msg, Fields, ListenAddr, TlsMode};
use crate::tls::allow::AllowRule;
use std::path::PathBuf;

/// A typed `[listeners.egress]` table.
#[derive(Clone, Debug)]
pub struct EgressConfig {
    /// `user:password` on one line, or an htpasswd file of bcrypt hashes.
    pub credentials: PathBuf,
    /// Hosts it may dial: names and wildcards as in `allow`, IPs and CIDRs (bare or `ip:`).
    pub targets: Vec<AllowRule>,
    /// Ports it may dial, over mutual TLS with the sidecar's identity.
    pub ports: Vec<u16>,
    /// Ports it relays to in plain HTTP, as the client would have sent without a proxy: the
    /// image server that shares a peer's IP (ironic-image's httpd). Never in `ports`.
    pub plain_ports: Vec<u16>,
    /// What becomes of a request that is neither a TLS target nor a plain port, and whose
    /// port is not in `ports`.
    pub others: Others,
    /// The listener's own address, never a relay's destination.
    pub listen: Option<std::net::SocketAddr>,
}

/// `others`: relay the rest of the client's plain HTTP as it would have gone without a proxy,
/// or refuse it (403).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Others {
    Relay,
    #[default]
    Refuse,
}

impl Others {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::Refuse => "refuse",
        }
    }
}

impl EgressConfig {
    /// True when `host` (a name, or an IP literal without brackets) is one of `targets`.
    pub fn allows_host(&self, host: &str) -> bool {
        match host.parse::<std::net::IpAddr>() {
            Ok(ip) => crate::tls::allow::is_allowed(&self.targets, &[], &[ip]),
            Err(_) => crate::tls::allow::is_allowed(&self.targets, &[host.to_owned()], &[]),
        }
    }
}

/// One `targets` entry: a bare IP or CIDR is taken as `ip:` would be; anything else as an
/// `allow` rule (exact name, `*.suffix`, `ip:`).
fn target(s: &str) -> Result<AllowRule, crate::tls::allow::AllowError> {
    let t = s.trim();
    if !t.starts_with("ip:")
        && (t.parse::<ipnet::IpNet>().is_ok() || t.parse::<std::net::IpAddr>().is_ok())
    {
        return format!("ip:{t}").parse();
    }
    t.parse()
}

/// Types the table at `path` (`listeners[0].egress`) and checks the listener around it: loopback
/// TCP only, `tls = "none"`, and none of the keys of a reverse proxy.
pub(super) fn egress_from_raw(
    e: RawEgress,
    path: &str,
    listen: Option<&ListenAddr>,
    tls: TlsMode,
    f: &mut Fields,
) -> Option<EgressConfig> {
    let listener = path.trim_end_matches(".egress");
    match listen {
        Some(ListenAddr::Tcp(a)) if a.ip().is_loopback() => {}
        Some(other) => f.push(
            format!("{listener}.listen"),
            msg(format!(
                "an egress listener must listen on a loopback address (127.0.0.1:PORT or \
                 [::1]:PORT), not {other}: it lends the pod's identity to whoever connects"
            )),
        ),
        None => {}
    }
    if tls != TlsMode::None {
        f.push(
            format!("{listener}.tls"),
            msg("an egress listener takes plain HTTP from Ironic: tls must be \"none\""),
        );
    }
    if e.credentials.is_empty() {
        f.push(format!("{path}.credentials"), msg("must name a file"));
    }
    let targets: Vec<AllowRule> = e
        .targets
        .iter()
        .enumerate()
        .filter_map(|(i, t)| match target(t) {
            Ok(r) => Some(r),
            Err(why) => {
                f.push(format!("{path}.targets[{i}]"), Box::new(why));
                None
            }
        })
        .collect();
    if e.targets.is_empty() {
        f.push(
            format!("{path}.targets"),
            msg("needs at least one host, wildcard or CIDR (it is not an open proxy)"),
        );
    }
    let ports = port_list(&e.ports, &format!("{path}.ports"), f);
    if e.ports.is_empty() {
        f.push(format!("{path}.ports"), msg("needs at least one port"));
    }
    let plain_ports = port_list(&e.plain_ports, &format!("{path}.plain_ports"), f);
    if let Some(p) = plain_ports.iter().find(|p| ports.contains(p)) {
        f.push(
            format!("{path}.plain_ports"),
            msg(format!(
                "port {p} is also in ports: a port is relayed over mutual TLS or in plain \
                 HTTP, not both"
            )),
        );
    }
    let others = match e.others.as_deref().map(str::trim) {
        None | Some("refuse") => Others::Refuse,
        Some("relay") => Others::Relay,
        Some(other) => {
            f.push(
                format!("{path}.others"),
                msg(format!("{other:?} is not \"relay\" or \"refuse\"")),
            );
            Others::Refuse
        }
    };
    Some(EgressConfig {
        credentials: PathBuf::from(e.credentials),
        targets,
        ports,
        plain_ports,
        others,
        listen: match listen {
            Some(ListenAddr::Tcp(a)) => Some(*a),
            _ => None,
        },
    })
}

/// The ports of the list at `key` (integers, or strings of digits); each bad item is an error
/// naming `key[i]`.
fn port_list(values: &[toml::Value], key: &str, f: &mut Fields) -> Vec<u16> {
    values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let port = match v {
                toml::Value::Integer(n) => u16::try_from(*n).ok(),
                toml::Value::String(s) => s.trim().parse::<u16>().ok(),
                _ => None,
            };
            let port = port.filter(|p| *p != 0);
            if port.is_none() {
                f.push(
                    format!("{key}[{i}]"),
                    msg(match v {
                        toml::Value::String(s) => format!("{s:?} is not a port (1 to 65535)"),
                        other => format!("{other:?} is not a port (1 to 65535)"),
                    }),
                );
            }
            port
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Others;
    use crate::config::Config;
    use std::collections::HashMap;

    const ID: &str = "[identity]\ncert = \"/c.crt\"\nkey = \"/c.key\"\ntrust = \"/ca.crt\"\n";

    fn egress(listen: &str, extra: &str) -> String {
        format!(
            "{ID}[[listeners]]\nname = \"json-rpc-egress\"\nlisten = \"{listen}\"\njsonrpc = true\n\
             {extra}[listeners.egress]\ncredentials = \"/shared/egress.htpasswd\"\n\
             targets = [\"*.ironic.metal3.svc\", \"10.0.10.0/24\", \"fd00:10::/64\", \"ip:10.1.0.1\"]\n\
             ports = [6189]\n"
        )
    }

    fn err(text: &str) -> String {
        Config::parse(text, &HashMap::<String, String>::new())
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn the_design_example_parses_and_matches_names_ips_and_cidrs() {
        let c = Config::parse(
            &egress("127.0.0.1:8090", ""),
            &HashMap::<String, String>::new(),
        )
        .expect("parses");
        let e = c.listeners[0].egress.as_ref().expect("egress");
        assert_eq!(e.ports, [6189]);
        for ok in ["a.ironic.metal3.svc", "10.0.10.7", "fd00:10::5", "10.1.0.1"] {
            assert!(e.allows_host(ok), "{ok}");
        }
        for no in [
            "ironic.metal3.svc",
            "a.b.ironic.metal3.svc",
            "10.0.11.1",
            "10.1.0.2",
            "::1",
        ] {
            assert!(!e.allows_host(no), "{no}");
        }
        // `check` prints the effective file; it parses back to the same listener.
        let again = Config::parse(&c.render(), &HashMap::<String, String>::new()).expect("again");
        let e2 = again.listeners[0].egress.as_ref().expect("egress");
        assert_eq!((&e2.targets, &e2.ports), (&e.targets, &e.ports));
        assert!(e.plain_ports.is_empty());
        assert_eq!((e.others, e2.others), (Others::Refuse, Others::Refuse));
    }

    #[test]
    fn others_is_relay_or_refuse_and_renders() {
        let text = egress("127.0.0.1:8090", "")
            .replace("ports = [6189]", "ports = [6189]\nothers = \"relay\"");
        let c = Config::parse(&text, &HashMap::<String, String>::new()).expect("parses");
        let e = c.listeners[0].egress.as_ref().expect("egress");
        assert_eq!(e.others, Others::Relay);
        assert!(
            c.render().contains("others = \"relay\"\n"),
            "{}",
            c.render()
        );
        let again = Config::parse(&c.render(), &HashMap::<String, String>::new()).expect("again");
        assert_eq!(
            again.listeners[0].egress.as_ref().expect("egress").others,
            Others::Relay
        );
        let bad = egress("127.0.0.1:8090", "")
            .replace("ports = [6189]", "ports = [6189]\nothers = \"allow\"");
        let e = err(&bad);
        assert!(
            e.starts_with("listeners[0].egress.others: \"allow\" is not \"relay\" or \"refuse\""),
            "{e}"
        );
    }

    #[test]
    fn plain_ports_parse_render_and_may_not_repeat_a_tls_port() {
        let text = egress("127.0.0.1:8090", "").replace(
            "ports = [6189]",
            "ports = [6189]\nplain_ports = [6180, \"8080,8081\"]",
        );
        let c = Config::parse(&text, &HashMap::<String, String>::new()).expect("parses");
        let e = c.listeners[0].egress.as_ref().expect("egress");
        assert_eq!(e.plain_ports, [6180, 8080, 8081]);
        let again = Config::parse(&c.render(), &HashMap::<String, String>::new()).expect("again");
        let e2 = again.listeners[0].egress.as_ref().expect("egress");
        assert_eq!(e2.plain_ports, e.plain_ports);
        let both = egress("127.0.0.1:8090", "").replace(
            "ports = [6189]",
            "ports = [6189, 6180]\nplain_ports = [6180]",
        );
        let e = err(&both);
        assert!(
            e.starts_with("listeners[0].egress.plain_ports: port 6180 is also in ports"),
            "{e}"
        );
        let bad = egress("127.0.0.1:8090", "")
            .replace("ports = [6189]", "ports = [6189]\nplain_ports = [0]");
        let e = err(&bad);
        assert!(e.starts_with("listeners[0].egress.plain_ports[0]"), "{e}");
    }

    #[test]
    fn a_listener_with_egress_is_loopback_plain_http_with_no_upstream() {
        let e = err(&egress("0.0.0.0:8090", ""));
        assert!(
            e.starts_with("listeners[0].listen: an egress listener must listen on a loopback"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        let e = err(&egress("10.0.0.1:8090", ""));
        assert!(e.starts_with("listeners[0].listen"), "{e}");
        let e = err(&egress("unix:/run/e.sock", ""));
        assert!(e.starts_with("listeners[0].listen"), "{e}");
        assert!(
            Config::parse(&egress("[::1]:8090", ""), &HashMap::<String, String>::new()).is_ok()
        );
        let e = err(&egress("127.0.0.1:8090", "tls = \"server\"\n"));
        assert!(e.starts_with("listeners[0].tls"), "{e}");
        let e = err(&egress("127.0.0.1:8090", "upstream = \"unix:/x\"\n"));
        assert!(e.starts_with("listeners[0].upstream"), "{e}");
        let e = err(&egress("127.0.0.1:8090", "").replace(ID, ""));
        assert!(e.starts_with("listeners[0].egress"), "{e}");
        let e = err(&egress("127.0.0.1:8090", "").replace("ports = [6189]", "ports = []"));
        assert!(e.starts_with("listeners[0].egress.ports"), "{e}");
        let e = err(&egress("127.0.0.1:8090", "").replace("\"10.0.10.0/24\"", "\"bad name!\""));
        assert!(e.starts_with("listeners[0].egress.targets[1]"), "{e}");
        let e = err("[[listeners]]\nlisten = \"127.0.0.1:1\"\n");
        assert!(e.starts_with("listeners[0].upstream"), "{e}");
    }
}
