//! The `ironic-proxy` binary: parse the command line, start tracing, load the configuration,
//! start the server, wait for signals, drain.

#![warn(clippy::unwrap_used)]

use clap::{Args, Parser, Subcommand, ValueEnum};
use ironic_proxy::cli;
use ironic_proxy::config::{profile, Config, ProcessEnv};
use ironic_proxy::Server;
use std::path::PathBuf;
use std::process::ExitCode;

/// The embedded default configuration (dev certificates from `certs-dev/`).
const DEFAULT_CONFIG: &str = include_str!("../config/default.toml");

#[derive(Parser)]
#[command(
    name = "ironic-proxy",
    version = cli::version::VERSION,
    long_version = cli::version::long(),
    about = "TLS sidecar, identity and load balancer for OpenStack Ironic"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (without --config or --profile: the embedded dev configuration).
    Run(Source),
    /// Validate a configuration or profile and print the effective configuration.
    Check(Source),
    /// Check a running deployment with its own configuration: identity, upstreams, peers,
    /// admin. One line per check; exit 0 when all pass, 1 otherwise.
    Doctor {
        #[command(flatten)]
        source: Source,
        /// One JSON object instead of lines.
        #[arg(long)]
        json: bool,
        /// Also call every peer conductor's JSON-RPC listener over mutual TLS with this
        /// sidecar's identity, and its own [DEFAULT]host through each egress listener.
        #[arg(long)]
        peers: bool,
    },
    /// Operator CA: `ca init`.
    #[command(subcommand)]
    Ca(cli::pki::CaCommand),
    /// Leaf certificates: `cert issue`, `cert show`.
    #[command(subcommand)]
    Cert(cli::pki::CertCommand),
    /// The Kubernetes kit: `kit secrets`, `kit check`.
    #[command(subcommand)]
    Kit(cli::kit::KitCommand),
}

/// Where the configuration comes from: a file, a built-in profile, or (`run` only) neither.
#[derive(Args)]
struct Source {
    /// Configuration file.
    #[arg(long, env = "IRONIC_PROXY_CONFIG", conflicts_with = "profile")]
    config: Option<PathBuf>,
    /// Built-in profile configured from environment variables: sidecar, sidecar-openshift,
    /// balancer (docs/reference.md).
    #[arg(long, env = "IRONIC_PROXY_PROFILE")]
    profile: Option<String>,
}

impl Source {
    fn load(&self) -> Result<Config, Box<dyn std::error::Error>> {
        Ok(match (&self.config, &self.profile) {
            (Some(path), _) => Config::load(path, &ProcessEnv)?,
            (None, Some(name)) => profile::load(name, &ProcessEnv)?,
            (None, None) => {
                tracing::warn!(
                    "no --config or --profile: serving the embedded DEV configuration \
                     (config/default.toml), whose private keys are public; never use it \
                     outside development"
                );
                Config::parse(DEFAULT_CONFIG, &ProcessEnv)?
            }
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Writes the buffered access lines when main returns, whichever way.
    let _log = init_tracing(cli.log_format).flush_on_drop();
    match cli.command {
        Command::Run(source) => match source.load() {
            Ok(config) => match outside_the_ca(&config) {
                Some(detail) => {
                    eprintln!("ironic-proxy: scale-out: ca: {detail}");
                    ExitCode::from(1)
                }
                None => run(config),
            },
            Err(e) => fail(e.as_ref()),
        },
        Command::Check(source) => {
            if source.config.is_none() && source.profile.is_none() {
                eprintln!("ironic-proxy: check needs --config FILE or --profile NAME");
                return ExitCode::from(2);
            }
            check(&source)
        }
        Command::Doctor {
            source,
            json,
            peers,
        } => {
            if source.config.is_none() && source.profile.is_none() {
                eprintln!("ironic-proxy: doctor needs --config FILE or --profile NAME");
                return ExitCode::from(2);
            }
            match source.load() {
                Ok(c) => doctor(&c, json, peers),
                Err(e) => fail(e.as_ref()),
            }
        }
        Command::Ca(cmd) => cli::pki::run_ca(cmd).map_or_else(|e| fail(&e), |()| ExitCode::SUCCESS),
        Command::Cert(cmd) => {
            cli::pki::run_cert(cmd).map_or_else(|e| fail(&e), |()| ExitCode::SUCCESS)
        }
        Command::Kit(cmd) => cli::kit::run(cmd).map_or_else(|e| fail(&e), |()| ExitCode::SUCCESS),
    }
}

/// One line on stderr with the whole cause chain, exit 1.
fn fail(e: &dyn std::error::Error) -> ExitCode {
    eprintln!("ironic-proxy: {}", ironic_proxy::error::chain(e));
    ExitCode::from(1)
}

fn init_tracing(format: LogFormat) -> ironic_proxy::LogWriter {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let stderr = ironic_proxy::LogWriter::new();
    // The builder's own level cap (INFO by default) would hide `debug` events that `RUST_LOG`
    // asks for: it is set to the most verbose level `RUST_LOG` names, so `filter` decides and
    // the global level hint stays as tight as `RUST_LOG`.
    let most_verbose = filter
        .iter()
        .map(|(_, level)| level)
        .chain(filter.default_level())
        .max()
        .unwrap_or(tracing::level_filters::LevelFilter::INFO);
    let builder = tracing_subscriber::fmt()
        .with_max_level(most_verbose)
        .with_writer(stderr.clone())
        .with_timer(ironic_proxy::LogTimestamp)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.finish().with(filter).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .event_format(ironic_proxy::AccessJson::new())
            .finish()
            .with(filter)
            .init(),
    }
    // The same lines as the formats above, written without tracing's field visitor.
    let access = match format {
        LogFormat::Text => ironic_proxy::AccessFormat::Text,
        LogFormat::Json => ironic_proxy::AccessFormat::Json,
    };
    stderr.write_access_lines(access, ansi);
    stderr
}

/// `RUST_LOG` as targets and levels (`info`, `warn,access=info`, `info,ironic_proxy=debug`);
/// `info` when unset. A value that does not parse is reported once and `info` used: a typo in
/// the log level must not keep the proxy from starting.
fn log_filter(spec: Option<&str>) -> tracing_subscriber::filter::Targets {
    let default = || tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO);
    match spec.map(str::trim) {
        None | Some("") => default(),
        Some(s) => s.parse().unwrap_or_else(|e| {
            eprintln!("ironic-proxy: RUST_LOG={s:?} ignored ({e}); logging at info");
            default()
        }),
    }
}

/// Why the leaf cannot be issued when one of our names is outside the CA's constraints, naming
/// the variable the address came from (`IRONIC_PROXY_API_VIPS`, `POD_IPS`): issuing would fail
/// too, with the bare SAN. The other scale-out checks do not stop `run`.
fn outside_the_ca(config: &Config) -> Option<String> {
    ironic_proxy::config::scale_out(config, &ProcessEnv)
        .into_iter()
        .find(|f| f.check == "ca" && !f.ok)
        .map(|f| f.detail)
}

fn check(source: &Source) -> ExitCode {
    let config = match source.load() {
        Ok(c) => c,
        Err(e) => return fail(e.as_ref()),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    // Before the identity: a SAN outside the CA fails there too, but only this names its cause.
    // A node that cannot work is refused; one missing from the fallback only warned about.
    let misfits: Vec<_> = ironic_proxy::config::scale_out(&config, &ProcessEnv)
        .into_iter()
        .filter(|f| !f.ok)
        .collect();
    for f in &misfits {
        let level = if f.blocking { "" } else { "warning: " };
        eprintln!("ironic-proxy: {level}scale-out: {}: {}", f.check, f.detail);
    }
    if misfits.iter().any(|f| f.blocking) {
        return ExitCode::from(1);
    }
    if let Some(id) = &config.identity {
        if let Err(e) = rt.block_on(ironic_proxy::check_identity(id)) {
            return fail(&e);
        }
    }
    if let Some(Err(e)) = config
        .admin
        .as_ref()
        .and_then(|a| a.bearer_token_file.as_deref())
        .map(ironic_proxy::check_metrics_token)
    {
        return fail(&e);
    }
    for (index, l) in config.listeners.iter().enumerate() {
        if let Some(Err(e)) = l.auth.as_ref().map(|a| ironic_proxy::check_auth(index, a)) {
            return fail(&e);
        }
        if let Some(Err(e)) = l
            .egress
            .as_ref()
            .map(|e| ironic_proxy::check_egress(index, &e.credentials))
        {
            return fail(&e);
        }
    }
    for w in ironic_proxy::boot_tls_warnings(&config) {
        eprintln!("warning: {w}");
    }
    print!("{}", config.render());
    ExitCode::SUCCESS
}

/// `doctor` with a loaded configuration (from `--config`, or a profile once one is given).
fn doctor(config: &Config, json: bool, peers: bool) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    let options = ironic_proxy::DoctorOptions {
        peers,
        env: &ProcessEnv,
    };
    let report = rt.block_on(ironic_proxy::doctor(config, &options));
    print!("{}", if json { report.json() } else { report.text() });
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn run(config: Config) -> ExitCode {
    let rt = match ironic_proxy::runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    rt.block_on(async move {
        // Before start: /readyz turns 200 inside it, and a signal must not find no handler.
        let signals = ironic_proxy::Signals::install();
        let server = match Server::start(config).await {
            Ok(s) => s,
            Err(e) => return fail(&e),
        };
        tracing::info!("ready");
        let reason = match signals {
            Some(s) => s.wait(server.identity.clone()).await,
            None => std::future::pending().await,
        };
        tracing::info!(signal = reason, "draining");
        server.drain().await;
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::log_filter;
    use tracing::Level;

    #[test]
    fn rust_log_takes_targets_and_falls_back_to_info() {
        let f = log_filter(Some("warn,access=info,ironic_proxy=debug"));
        assert!(f.would_enable("access", &Level::INFO));
        assert!(f.would_enable("ironic_proxy::proxy", &Level::DEBUG));
        assert!(!f.would_enable("hyper", &Level::INFO));
        assert!(f.would_enable("hyper", &Level::WARN));
        let off = log_filter(Some("info,access=off"));
        assert!(!off.would_enable("access", &Level::ERROR));
        for fallback in [None, Some(""), Some("x=y=z")] {
            let f = log_filter(fallback);
            assert!(f.would_enable("ironic_proxy", &Level::INFO), "{fallback:?}");
            assert!(
                !f.would_enable("ironic_proxy", &Level::DEBUG),
                "{fallback:?}"
            );
        }
    }
}
