//! The `ca` and `cert` commands: argument definitions and what they do with files.
//!
//! Private keys are created with mode 0600 in the `open(2)` call itself, so they are never
//! readable by others, not even for an instant. Existing files are never replaced unless
//! `--force` is given; then the new file is written beside the old one and renamed over it, so a
//! reader sees either the old or the new file, never a partial one.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ipnet::IpNet;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::pki::{
    generate_ca, issue_leaf, rfc3339, summarize, CaSpec, Issuer, LeafRequest, PkiError,
};

/// `ironic-proxy ca ...`
#[derive(clap::Subcommand, Debug)]
pub enum CaCommand {
    /// Create a CA (ECDSA P-256): DIR/ca.crt, DIR/ca.key (mode 0600) and DIR/ca-bundle.crt,
    /// the trust bundle (this CA alone until a rotation adds another).
    Init(CaInitArgs),
}

#[derive(clap::Args, Debug)]
pub struct CaInitArgs {
    /// Directory to write ca.crt, ca.key and ca-bundle.crt into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Subject common name of the CA.
    #[arg(long, value_name = "CN", default_value = "ironic-proxy CA")]
    pub name: String,
    /// How long the CA is valid (e.g. 10y, 90d).
    #[arg(long, value_name = "DURATION", default_value = "10y", value_parser = humantime::parse_duration)]
    pub validity: Duration,
    /// Permit leaves for this DNS suffix and its subdomains (".suffix": subdomains only).
    /// Repeatable. Once any --permit-* is given, every name or address not permitted is
    /// forbidden: with --permit-dns alone no IP address is allowed, and vice versa.
    #[arg(long = "permit-dns", value_name = "SUFFIX")]
    pub permit_dns: Vec<String>,
    /// Permit leaves for IP addresses in this network (CIDR, or a single address). Repeatable.
    #[arg(long = "permit-ip", value_name = "CIDR", value_parser = parse_network)]
    pub permit_ip: Vec<IpNet>,
    /// Replace existing ca.crt, ca.key and ca-bundle.crt.
    #[arg(long)]
    pub force: bool,
}

/// `ironic-proxy cert ...`
#[derive(clap::Subcommand, Debug)]
pub enum CertCommand {
    /// Issue a leaf (serverAuth + clientAuth) with a new ECDSA P-256 key into DIR/tls.crt and
    /// DIR/tls.key (mode 0600). tls.crt holds the leaf only, not the CA: give clients and
    /// servers the CA as their trust bundle.
    Issue(CertIssueArgs),
    /// Print subject, SANs, issuer, validity, key type and SHA-256 fingerprint of every
    /// certificate in FILE (PEM or DER); warn on stderr when one is expired or not yet valid.
    Show(CertShowArgs),
}

#[derive(clap::Args, Debug)]
pub struct CertIssueArgs {
    /// CA certificate (PEM).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: PathBuf,
    /// CA private key (PEM: PKCS#8, SEC1 or PKCS#1).
    #[arg(long, value_name = "FILE")]
    pub ca_key: PathBuf,
    /// DNS name SAN. Repeatable; the first one is also the subject CN (a leaf with IP
    /// addresses only has an empty subject).
    #[arg(long, value_name = "NAME")]
    pub dns: Vec<String>,
    /// IP address SAN. Repeatable.
    #[arg(long, value_name = "IP")]
    pub ip: Vec<IpAddr>,
    /// Directory to write tls.crt and tls.key into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// How long the leaf is valid (e.g. 24h); never beyond the CA's own expiry.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = humantime::parse_duration)]
    pub validity: Duration,
    /// Replace existing tls.crt and tls.key.
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args, Debug)]
pub struct CertShowArgs {
    /// Certificate file: PEM (one or more certificates) or DER.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// Runs a `ca` command. Prints what it did on stdout.
pub fn run_ca(cmd: CaCommand) -> Result<(), PkiError> {
    match cmd {
        CaCommand::Init(args) => ca_init(args),
    }
}

/// Runs a `cert` command. Prints results on stdout and warnings on stderr.
pub fn run_cert(cmd: CertCommand) -> Result<(), PkiError> {
    match cmd {
        CertCommand::Issue(args) => cert_issue(&args),
        CertCommand::Show(args) => cert_show(&args.file),
    }
}

fn ca_init(args: CaInitArgs) -> Result<(), PkiError> {
    let spec = CaSpec {
        name: args.name,
        validity: args.validity,
        permit_dns: args.permit_dns,
        permit_ip: args.permit_ip,
    };
    let ca = generate_ca(&spec)?;
    let written = write_files(
        &args.out,
        &[
            ("ca.key", ca.key_pem.as_bytes(), 0o600),
            ("ca.crt", ca.cert_pem.as_bytes(), 0o644),
            // The file the kit's Secret ironic-proxy-ca carries as the trust of every proxy
            // and of ironic-image (config/k8s/*/ironic.yaml, key ca-bundle.crt): written here
            // so that the Secret can be made from this directory as it is.
            ("ca-bundle.crt", ca.cert_pem.as_bytes(), 0o644),
        ],
        args.force,
    )?;
    println!("wrote {}", display_paths(&written));
    let der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes())
        .map_err(|_| PkiError::NoCertificate)?;
    println!("{}", summarize(&der)?);
    Ok(())
}

fn cert_issue(args: &CertIssueArgs) -> Result<(), PkiError> {
    let issuer = Issuer::from_files(&args.ca_cert, &args.ca_key)?;
    let request = LeafRequest {
        dns_names: args.dns.clone(),
        ip_addresses: args.ip.clone(),
        validity: args.validity,
    };
    let leaf = issue_leaf(&issuer, &request)?;
    let written = write_files(
        &args.out,
        &[
            ("tls.key", leaf.key_pem.as_bytes(), 0o600),
            ("tls.crt", leaf.cert_pem.as_bytes(), 0o644),
        ],
        args.force,
    )?;
    if leaf.not_after >= issuer.not_after() {
        eprintln!(
            "warning: the CA expires at {}; the leaf is valid only until then",
            rfc3339(leaf.not_after)
        );
    }
    println!("wrote {}", display_paths(&written));
    println!("{}", summarize(&leaf.cert_der)?);
    Ok(())
}

fn cert_show(path: &Path) -> Result<(), PkiError> {
    let bytes = fs::read(path).map_err(|source| PkiError::Read {
        path: path.to_owned(),
        source,
    })?;
    let in_file = |source| PkiError::InFile {
        path: path.to_owned(),
        source: Box::new(source),
    };
    let ders: Vec<CertificateDer<'static>> = if bytes.starts_with(b"\x30") {
        vec![CertificateDer::from(bytes)]
    } else {
        CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<_, _>>()
            .map_err(|_| in_file(PkiError::NoCertificate))?
    };
    if ders.is_empty() {
        return Err(in_file(PkiError::NoCertificate));
    }
    let summaries = ders
        .iter()
        .map(|der| summarize(der))
        .collect::<Result<Vec<_>, _>>()
        .map_err(in_file)?;
    let now = SystemTime::now();
    for (i, summary) in summaries.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("{summary}");
        if let Some(warning) = summary.validity_warning(now) {
            eprintln!("warning: {}: {warning}", path.display());
        }
    }
    Ok(())
}

/// Writes `(name, contents, mode)` files into `dir`, in order; see the module documentation.
fn write_files(
    dir: &Path,
    files: &[(&str, &[u8], u32)],
    force: bool,
) -> Result<Vec<PathBuf>, PkiError> {
    fs::create_dir_all(dir).map_err(|source| PkiError::Write {
        path: dir.to_owned(),
        source,
    })?;
    if !force {
        // Checked up front so that nothing is written when any file is in the way.
        for (name, _, _) in files {
            let path = dir.join(name);
            if path.symlink_metadata().is_ok() {
                return Err(PkiError::Exists { path });
            }
        }
    }
    let mut written = Vec::new();
    for (name, contents, mode) in files {
        let path = dir.join(name);
        if force {
            let tmp = dir.join(format!(".{name}.tmp-{:016x}", fastrand::u64(..)));
            create_with(&tmp, contents, *mode)?;
            fs::rename(&tmp, &path).map_err(|source| {
                let _ = fs::remove_file(&tmp);
                PkiError::Write {
                    path: path.clone(),
                    source,
                }
            })?;
        } else {
            create_with(&path, contents, *mode)?;
        }
        written.push(path);
    }
    Ok(written)
}

/// Creates `path` (which must not exist) with `mode`, writes `contents` and syncs it.
fn create_with(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    let write_err = |source| PkiError::Write {
        path: path.to_owned(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source: std::io::Error| {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                PkiError::Exists {
                    path: path.to_owned(),
                }
            } else {
                write_err(source)
            }
        })?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(write_err)
}

fn display_paths(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.concat(),
    }
}

/// A network in CIDR notation, or a single address as a host network (`/32`, `/128`).
fn parse_network(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{s:?} is not a CIDR network (like 10.0.0.0/8) or an IP address"))
}
