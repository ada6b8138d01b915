//! `ironic-proxy doctor`: checks a running deployment from inside its pod, with the proxy's own
//! configuration and identity, and reports one line per check with a verdict.
//!
//! What it looks at, in order: the live certificate (the one a TLS listener serves right now:
//! its SANs against the configured names and IPs, its time to expiry, its chain to the trust
//! bundle), every trusted CA's validity, the exported files against the live certificate, then
//! per listener its upstream (the local endpoint reachable, the DNS answer, and for every peer
//! found: TCP, a TLS handshake with our client certificate, whether the peer's certificate
//! covers the address dialled, its expiry, the round-trip time of a health request and the
//! clock skew from the peer's `Date`), and finally the admin endpoint's `/readyz`.
//!
//! Everything is done in-process with the proxy's own TLS and DNS code (no shell, no curl), so
//! it runs in a distroless image. It only reads: no file is written, no state is changed.

mod identity;
mod net;
mod peers;
mod upstream;

use crate::config::{Config, Env};
use std::fmt::Write as _;
use std::time::Duration;

/// How long any one network step may take.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(3);

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked, as a dotted path: `identity.sans`, `upstream[api].peer[10.0.0.2:6385].tls`.
    pub name: String,
    pub verdict: Verdict,
    /// What was found, in one line.
    pub detail: String,
}

/// Every check, in the order they ran.
#[derive(Debug, Default)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub(crate) fn pass(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(name, Verdict::Pass, detail);
    }

    pub(crate) fn fail(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(name, Verdict::Fail, detail);
    }

    fn push(&mut self, name: impl Into<String>, verdict: Verdict, detail: impl Into<String>) {
        // One line per check, whatever a peer put in its answer.
        let detail: String = detail
            .into()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        self.checks.push(Check {
            name: name.into(),
            verdict,
            detail,
        });
    }

    /// True when every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.verdict == Verdict::Pass)
    }

    /// `PASS name: detail` lines and a summary line.
    pub fn text(&self) -> String {
        let mut o = String::new();
        for c in &self.checks {
            let v = match c.verdict {
                Verdict::Pass => "PASS",
                Verdict::Fail => "FAIL",
            };
            let _ = writeln!(o, "{v} {}: {}", c.name, c.detail);
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.verdict == Verdict::Fail)
            .count();
        let _ = writeln!(o, "{} checks, {} failed", self.checks.len(), failed);
        o
    }

    /// `{"ok": bool, "checks": [{"check", "verdict", "detail"}]}`, one line.
    pub fn json(&self) -> String {
        let mut o = format!("{{\"ok\":{},\"checks\":[", self.passed());
        for (i, c) in self.checks.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            let v = match c.verdict {
                Verdict::Pass => "pass",
                Verdict::Fail => "fail",
            };
            let _ = write!(
                o,
                "{{\"check\":{},\"verdict\":\"{v}\",\"detail\":{}}}",
                json_string(&c.name),
                json_string(&c.detail)
            );
        }
        o.push_str("]}\n");
        o
    }
}

/// A JSON string literal (RFC 8259 §7).
fn json_string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", u32::from(c));
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// What to check beyond the pod itself.
pub struct Options<'a> {
    /// `--peers`: a JSON-RPC call to every peer conductor and through every egress.
    pub peers: bool,
    /// The environment the configuration came from, to name the variable behind an address.
    pub env: &'a dyn Env,
}

/// Runs every check for `config`.
pub async fn run(config: &Config, options: &Options<'_>) -> Report {
    let mut report = Report::default();
    let ours = identity::check(config, &mut report).await;
    for f in crate::config::scale_out(config, options.env) {
        let name = format!("scale.{}", f.check);
        if f.ok {
            report.pass(name, f.detail);
        } else {
            report.fail(name, f.detail);
        }
    }
    for lc in &config.listeners {
        upstream::check(config, lc, ours.as_ref(), &mut report).await;
    }
    if options.peers {
        peers::check(config, ours.as_ref(), &mut report).await;
    }
    match &config.admin {
        Some(a) => net::check_admin(a.listen[0], &mut report).await,
        None => report.pass("admin", "no [admin] configured"),
    }
    report
}

#[cfg(test)]
mod tests {
    use super::{json_string, Report};

    #[test]
    fn report_lines_and_json() {
        let mut r = Report::default();
        r.pass("a", "fine");
        r.fail("b", "broken\nacross \"lines\"");
        assert!(!r.passed());
        assert_eq!(
            r.text(),
            "PASS a: fine\nFAIL b: broken across \"lines\"\n2 checks, 1 failed\n"
        );
        assert_eq!(
            r.json(),
            "{\"ok\":false,\"checks\":[{\"check\":\"a\",\"verdict\":\"pass\",\"detail\":\"fine\"},\
             {\"check\":\"b\",\"verdict\":\"fail\",\"detail\":\"broken across \\\"lines\\\"\"}]}\n"
        );
        assert_eq!(json_string("\u{1}\\"), "\"\\u0001\\\\\"");
    }
}
