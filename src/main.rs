//! The `ironic-proxy` binary: parse the command line, start tracing, load the configuration,
//! start the server, wait for signals, drain.

use clap::{Parser, Subcommand, ValueEnum};
use ironic_proxy::config::{Config, ProcessEnv};
use ironic_proxy::pki;
use ironic_proxy::server::Server;
use std::path::PathBuf;
use std::process::ExitCode;

/// The embedded default configuration (dev certificates from `certs-dev/`).
const DEFAULT_CONFIG: &str = include_str!("../config/default.toml");

#[derive(Parser)]
#[command(
    name = "ironic-proxy",
    version,
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
    /// Run the proxy.
    Run {
        /// Configuration file; without it, the embedded dev default.
        #[arg(long, env = "IRONIC_PROXY_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Validate a configuration and print the effective configuration.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// Operator CA: `ca init`.
    #[command(subcommand)]
    Ca(pki::CaCommand),
    /// Leaf certificates: `cert issue`, `cert show`.
    #[command(subcommand)]
    Cert(pki::CertCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    match cli.command {
        Command::Run { config } => {
            let parsed = match &config {
                Some(path) => Config::load(path, &ProcessEnv),
                None => Config::parse(DEFAULT_CONFIG, &ProcessEnv),
            };
            let config = match parsed {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            run(config)
        }
        Command::Check { config } => check(&config),
        Command::Ca(cmd) => pki::run_ca(cmd).map_or_else(|e| fail(&e), |()| ExitCode::SUCCESS),
        Command::Cert(cmd) => pki::run_cert(cmd).map_or_else(|e| fail(&e), |()| ExitCode::SUCCESS),
    }
}

/// One line on stderr with the whole cause chain, exit 1.
fn fail(e: &dyn std::error::Error) -> ExitCode {
    eprintln!("ironic-proxy: {}", ironic_proxy::proxy::error_chain(e));
    ExitCode::from(1)
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    let config = match Config::load(path, &ProcessEnv) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    if let Some(id) = &config.identity {
        if let Err(e) = rt.block_on(ironic_proxy::identity::check(id)) {
            return fail(&e);
        }
    }
    print!("{}", config.render());
    ExitCode::SUCCESS
}

fn run(config: Config) -> ExitCode {
    let rt = match ironic_proxy::server::runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    rt.block_on(async move {
        // Before start: /readyz turns 200 inside it, and a signal must not find no handler.
        let signals = ironic_proxy::signal::Signals::install();
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
