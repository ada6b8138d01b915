//! `kit check`: an offline preflight of a site overlay and its CA, before anything is applied
//! (in the spirit of `linkerd check --pre`). It reads the overlay folder ([`overlay`]) and the
//! folder `ca init` wrote, and prints one line per check, `PASS name: what was found` or
//! `FAIL name: what is wrong. Fix: ... See docs/troubleshoot.md#kit-check-NAME`, then a
//! summary; any FAIL makes the command exit 1. It writes nothing and opens no socket.
//!
//! Every check runs even when an earlier one failed, so one run lists every fault; a check
//! whose input is missing fails saying which. The site facts it reads ([`facts`]) are keys of
//! the ConfigMap `ironic-proxy-site`.

mod conductor;
mod dhcp;
mod facts;
mod ipa;
mod json6902;
mod model;
mod objects;
mod overlay;
mod rules;

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::pki::NameConstraints;

/// `ironic-proxy kit check`
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The site overlay: the kustomization folder with the site facts (the ConfigMap
    /// ironic-proxy-site or a patch of it), the Namespace and the kit it builds on.
    #[arg(long, value_name = "DIR")]
    pub site: PathBuf,
    /// The CA directory `ca init` wrote: ca.crt, ca.key and ca-bundle.crt.
    #[arg(long, value_name = "DIR")]
    pub ca_dir: PathBuf,
}

/// Where the FAIL lines point: docs/troubleshoot.md's rows have these anchors.
pub const TROUBLESHOOT: &str = "docs/troubleshoot.md";

/// One check's outcome.
#[derive(Debug)]
pub struct Line {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
    /// What to change, for a FAIL.
    pub fix: String,
}

impl Line {
    pub(crate) fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            ok: true,
            detail: detail.into(),
            fix: String::new(),
        }
    }

    pub(crate) fn fail(
        name: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            name,
            ok: false,
            detail: detail.into(),
            fix: fix.into(),
        }
    }

    /// The anchor of the check's row in docs/troubleshoot.md: `kit-check-` and the name with
    /// `.` and `_` as `-`.
    pub fn anchor(&self) -> String {
        format!("kit-check-{}", self.name.replace(['.', '_'], "-"))
    }
}

/// Every check, in the order they ran.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.lines.iter().all(|l| l.ok)
    }

    pub fn failed(&self) -> usize {
        self.lines.iter().filter(|l| !l.ok).count()
    }

    /// The lines and a summary, as printed.
    pub fn text(&self) -> String {
        let mut o = String::new();
        for l in &self.lines {
            if l.ok {
                let _ = writeln!(o, "PASS {}: {}", l.name, l.detail);
            } else {
                let _ = writeln!(
                    o,
                    "FAIL {}: {}. Fix: {}. See {TROUBLESHOOT}#{}",
                    l.name,
                    l.detail.trim_end_matches('.'),
                    l.fix.trim_end_matches('.'),
                    l.anchor()
                );
            }
        }
        let _ = writeln!(o, "{} checks, {} failed", self.lines.len(), self.failed());
        o
    }
}

/// Runs every check on the overlay in `args.site` and the CA in `args.ca_dir`.
pub fn check(args: &CheckArgs) -> Report {
    let o = overlay::load(&args.site);
    let mut lines = vec![rules::site(&args.site, &o)];
    let ca = ca_constraints(&args.ca_dir);
    lines.push(match &ca {
        Ok(Some(c)) => Line::pass(
            "ca",
            format!(
                "{}: ca.crt, ca.key, ca-bundle.crt; name constraints: {c}",
                args.ca_dir.display()
            ),
        ),
        Ok(None) => Line::pass(
            "ca",
            format!(
                "{}: ca.crt, ca.key, ca-bundle.crt; no name constraints (any address can be \
                 certified)",
                args.ca_dir.display()
            ),
        ),
        Err(e) => Line::fail(
            "ca",
            format!("{}: {e}", args.ca_dir.display()),
            "point --ca-dir at the folder `ironic-proxy ca init --out DIR` wrote (ca.crt, \
             ca.key, ca-bundle.crt), the one `kit secrets` reads",
        ),
    });
    let ca = ca.ok();
    let layout = objects::layout(&o);
    lines.extend(rules::addresses(&o.site, ca.as_ref(), &layout));
    lines.push(rules::names(&o, ca.as_ref(), &layout));
    lines.extend(dhcp::dhcp(&o.site, &layout));
    lines.extend(dhcp::provisioning(&o.site, &layout));
    lines.push(objects::host_ports(&o));
    lines.push(conductor::conductor_name(&o));
    lines.push(ipa::ipa_verify(&o));
    lines.push(objects::namespace(&o, &layout));
    lines.push(objects::digests(&o));
    Report { lines }
}

/// The CA's name constraints, once the folder is checked to be what `kit secrets` reads.
fn ca_constraints(dir: &std::path::Path) -> Result<Option<NameConstraints>, String> {
    let [(_, crt), _, _] = super::ca_dir::ca_files(dir).map_err(|e| crate::error::chain(&e))?;
    let der = crate::identity::expiry::pem_certs(&String::from_utf8_lossy(&crt))
        .into_iter()
        .next()
        .ok_or("ca.crt holds no certificate")?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| e.to_string())?;
    NameConstraints::from_cert(&cert).map_err(|e| crate::error::chain(&e))
}
