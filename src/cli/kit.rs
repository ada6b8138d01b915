//! `kit secrets`: the five Secrets the Kubernetes kit (config/k8s/) mounts, printed as YAML manifests
//! for `kubectl apply -f`, so that an install needs no hand-made Secret.
//!
//! What the kit reads, by Secret and key (config/k8s/*/ironic.yaml, ironic-proxy-lb.yaml,
//! common/upgrade/jobs.yaml):
//! - `ironic-proxy-ca`: `ca.crt`, `ca.key` (the sidecars issue their leaves with it) and
//!   `ca-bundle.crt` (every proxy's trust, and ironic-image's API CA), from `--ca-dir` as
//!   `ca init` writes it;
//! - `ironic-htpasswd`: `htpasswd`, one bcrypt entry (`$2y$`, cost 5: what `htpasswd -nbB`
//!   writes and ironic-image's httpd reads) for a generated password;
//! - `ironic-proxy-egress`: `credentials`, `ironic:<48 hex digits>`, URL-safe because Ironic
//!   carries it inside its `HTTP_PROXY` URL;
//! - `ironic-mariadb`: `username`, `password` (Ironic's database account);
//! - `ironic-proxy-metrics`: `token`, 48 hex digits, the bearer token every proxy's `/metrics`
//!   asks for (`IRONIC_PROXY_METRICS_TOKEN_FILE`) and the PodMonitor and ServiceMonitor send;
//! - with `--api-credentials-secret NAME`: NAME with `username`, `password`, `htpasswd`, for
//!   API clients (baremetal-operator, the Ironic standalone operator recipe).
//!
//! Generated passwords come from the AWS-LC random generator (the process's one crypto module)
//! and are shown once, on stderr, never on stdout: the manifests can go to a file or a pipe
//! while the operator reads the passwords on the terminal. Nothing is written to disk here.
//! Every input is checked before anything is printed, so a bad input prints no half manifest.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::ca_dir::ca_files;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

/// bcrypt cost of the API's htpasswd entry: `htpasswd -B`'s default, which every reader of the
/// file (the proxies, ironic-image's httpd, Ironic) verifies per new credential.
const BCRYPT_COST: u32 = 5;

/// `ironic-proxy kit ...`
#[derive(clap::Subcommand, Debug)]
pub enum KitCommand {
    /// Print the kit's five Secrets as YAML on stdout (ironic-proxy-ca, ironic-htpasswd,
    /// ironic-proxy-egress, ironic-mariadb, ironic-proxy-metrics); generated passwords are shown
    /// once, on stderr.
    Secrets(SecretsArgs),
    /// Check a site overlay and its CA before applying them (offline): node addresses, VIP and
    /// DHCP ranges against the CA and the networks, host ports, the namespace's Pod Security
    /// label, image digests. One line per check; exit 1 when any fails.
    Check(super::kit_check::CheckArgs),
}

#[derive(clap::Args, Debug)]
pub struct SecretsArgs {
    /// Namespace of the Secrets (the kit's namespace).
    #[arg(long, value_name = "NS")]
    pub namespace: String,
    /// The CA directory `ca init` wrote: ca.crt, ca.key and ca-bundle.crt.
    #[arg(long, value_name = "DIR")]
    pub ca_dir: PathBuf,
    /// User name of the API's htpasswd entry.
    #[arg(long, value_name = "NAME", default_value = "ironic")]
    pub api_user: String,
    /// User name of Ironic's database account (Secret ironic-mariadb).
    #[arg(long, value_name = "NAME", default_value = "ironic")]
    pub db_user: String,
    /// File holding the database account's existing password (first line); without it a
    /// password is generated and shown once on stderr, for the account to be created with.
    #[arg(long, value_name = "FILE")]
    pub db_password_file: Option<PathBuf>,
    /// Also print a Secret NAME with the API's `username`, `password` and `htpasswd`, for API
    /// clients that read credentials from a Secret (Metal3's baremetal-operator; the Ironic
    /// standalone operator's spec.apiCredentialsName, e.g. ironic-api-credentials). The
    /// password is then stored in that Secret as well.
    #[arg(long, value_name = "NAME")]
    pub api_credentials_secret: Option<String>,
}

/// What `kit secrets` refuses, each naming the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error("--namespace {0:?} is not a Kubernetes namespace name (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63)")]
    Namespace(String),
    #[error("--api-credentials-secret {0:?} is not a Secret name of its own (lowercase RFC 1123, not one of the kit's five)")]
    SecretName(String),
    #[error(
        "--{flag} {value:?} is not a usable user name (1-64 of letters, digits, '.', '_', '-')"
    )]
    User { flag: &'static str, value: String },
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} holds no password on its first line", path.display())]
    EmptyPassword { path: PathBuf },
    #[error(transparent)]
    CaDir(#[from] super::ca_dir::CaDirError),
    #[error("cannot write the manifests to stdout")]
    Write(#[source] std::io::Error),
    #[error("the random generator failed")]
    Random,
    #[error("hashing the htpasswd entry failed")]
    Hash(#[source] bcrypt::BcryptError),
    #[error("kit check: {0} check(s) failed")]
    Failed(usize),
}

/// Runs a `kit` command: manifests (or `check`'s report) on stdout, generated passwords on
/// stderr.
pub fn run(cmd: KitCommand) -> Result<(), KitError> {
    match cmd {
        KitCommand::Secrets(args) => {
            let out = secrets(&args)?;
            // The passwords are shown only once the manifests that hold their hashes are out:
            // a failed write (a full disk, a closed pipe) shows none.
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(out.manifests.as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(KitError::Write)?;
            for line in out.notes {
                eprintln!("{line}");
            }
            Ok(())
        }
        KitCommand::Check(args) => {
            let report = super::kit_check::check(&args);
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(report.text().as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(KitError::Write)?;
            if report.passed() {
                Ok(())
            } else {
                Err(KitError::Failed(report.failed()))
            }
        }
    }
}

/// The manifests, and the lines for the operator (generated passwords).
pub struct Secrets {
    pub manifests: String,
    pub notes: Vec<String>,
}

/// Builds every Secret from `args`, or fails before producing any.
pub fn secrets(args: &SecretsArgs) -> Result<Secrets, KitError> {
    check_namespace(&args.namespace)?;
    if let Some(name) = &args.api_credentials_secret {
        check_secret_name(name)?;
    }
    check_user("api-user", &args.api_user)?;
    check_user("db-user", &args.db_user)?;
    let ca = ca_files(&args.ca_dir)?;
    let db_password = match &args.db_password_file {
        Some(path) => read_password(path)?,
        None => random_token()?,
    };
    let api_password = random_token()?;
    let htpasswd = bcrypt::hash_with_result(&api_password, BCRYPT_COST)
        .map_err(KitError::Hash)?
        .format_for_version(bcrypt::Version::TwoY);
    let egress = format!("ironic:{}", random_hex()?);

    let ns = &args.namespace;
    let mut manifests = String::new();
    secret(&mut manifests, ns, "ironic-proxy-ca", &ca);
    let entry = entry_for(&args.api_user, &htpasswd);
    secret(
        &mut manifests,
        ns,
        "ironic-htpasswd",
        &[("htpasswd", entry)],
    );
    secret(
        &mut manifests,
        ns,
        "ironic-proxy-egress",
        &[("credentials", egress.into_bytes())],
    );
    let db = [
        ("username", args.db_user.clone().into_bytes()),
        ("password", db_password.clone().into_bytes()),
    ];
    secret(&mut manifests, ns, "ironic-mariadb", &db);
    let token = random_hex()?;
    secret(
        &mut manifests,
        ns,
        "ironic-proxy-metrics",
        &[("token", token.into_bytes())],
    );
    let shown = match &args.api_credentials_secret {
        Some(name) => {
            let creds = [
                ("username", args.api_user.clone().into_bytes()),
                ("password", api_password.clone().into_bytes()),
                ("htpasswd", entry_for(&args.api_user, &htpasswd)),
            ];
            secret(&mut manifests, ns, name, &creds);
            format!("shown once here; also in the Secret {name}")
        }
        None => "shown once; only their bcrypt hash is in the Secret ironic-htpasswd".to_owned(),
    };

    let mut notes = vec![format!(
        "API credentials ({shown}): user {} password {api_password}",
        args.api_user
    )];
    if args.db_password_file.is_none() {
        notes.push(format!(
            "database account (Secret ironic-mariadb; create it in MariaDB with this password): \
             user {} password {db_password}",
            args.db_user
        ));
    }
    Ok(Secrets { manifests, notes })
}

/// The htpasswd file: one line, `user:hash`.
fn entry_for(user: &str, hash: &str) -> Vec<u8> {
    format!("{user}:{hash}\n").into_bytes()
}

/// One `v1/Secret` document; every value base64 in `data`, so no content needs YAML quoting.
fn secret(out: &mut String, namespace: &str, name: &str, data: &[(&str, Vec<u8>)]) {
    let _ = write!(
        out,
        "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  \
         labels:\n    app.kubernetes.io/part-of: ironic\ntype: Opaque\ndata:\n"
    );
    for (key, value) in data {
        let _ = writeln!(out, "  {key}: {}", STANDARD.encode(value));
    }
}

fn read_password(path: &Path) -> Result<String, KitError> {
    let text = std::fs::read_to_string(path).map_err(|source| KitError::Read {
        path: path.to_owned(),
        source,
    })?;
    let line = text.lines().next().unwrap_or("").trim_end_matches('\r');
    if line.is_empty() {
        return Err(KitError::EmptyPassword {
            path: path.to_owned(),
        });
    }
    Ok(line.to_owned())
}

/// RFC 1123 label, as Kubernetes requires of a namespace name.
fn check_namespace(ns: &str) -> Result<(), KitError> {
    let b = ns.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(KitError::Namespace(ns.to_owned()))
    }
}

/// A Secret's name: an RFC 1123 subdomain, none of the kit's own.
fn check_secret_name(name: &str) -> Result<(), KitError> {
    let ok = (1..=253).contains(&name.len())
        && name.split('.').all(|label| check_namespace(label).is_ok())
        && ![
            "ironic-proxy-ca",
            "ironic-htpasswd",
            "ironic-proxy-egress",
            "ironic-mariadb",
            "ironic-proxy-metrics",
        ]
        .contains(&name);
    if ok {
        Ok(())
    } else {
        Err(KitError::SecretName(name.to_owned()))
    }
}

/// A name that is safe in an htpasswd line (no ':'), a URL's userinfo and a database account.
fn check_user(flag: &'static str, user: &str) -> Result<(), KitError> {
    let ok = (1..=64).contains(&user.len())
        && user
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(KitError::User {
            flag,
            value: user.to_owned(),
        })
    }
}

fn random_bytes<const N: usize>() -> Result<[u8; N], KitError> {
    let mut buf = [0u8; N];
    aws_lc_rs::rand::fill(&mut buf).map_err(|_| KitError::Random)?;
    Ok(buf)
}

/// 24 random bytes as 32 characters of URL-safe base64: a password that needs no quoting in a
/// shell, a URL or YAML.
fn random_token() -> Result<String, KitError> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    Ok(URL_SAFE_NO_PAD.encode(random_bytes::<24>()?))
}

/// 24 random bytes as 48 hex digits (the egress password and the metrics token, as
/// `openssl rand -hex 24` writes them).
fn random_hex() -> Result<String, KitError> {
    Ok(random_bytes::<24>()?
        .iter()
        .fold(String::with_capacity(48), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_and_user_rules() {
        for ok in ["metal3", "baremetal-operator-system", "a", &"a".repeat(63)] {
            check_namespace(ok).unwrap();
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Metal3",
            "a_b",
            "a.b",
            &"a".repeat(64),
            "a\nb: c",
        ] {
            assert!(check_namespace(bad).is_err(), "{bad:?}");
        }
        check_user("u", "ironic").unwrap();
        for bad in ["", "a:b", "a b", "a@b", &"a".repeat(65)] {
            assert!(check_user("u", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn generated_secrets_are_url_safe_and_distinct() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        let h = random_hex().unwrap();
        assert_eq!(h.len(), 48);
        assert!(h.bytes().all(|c| c.is_ascii_hexdigit()));
    }
}
