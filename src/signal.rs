//! Process signals: SIGTERM and SIGINT end the wait (the caller drains); SIGHUP reloads the
//! certificates and the trust bundle and keeps waiting.

use crate::identity::Identity;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// The process's signal handlers, installed once.
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers. Do it before anything can report ready: until then SIGTERM and
    /// SIGHUP keep their default action, which kills the process (no drain, no reload).
    pub fn install() -> Option<Self> {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(term), Ok(int), Ok(hup)) => Some(Self { term, int, hup }),
            _ => {
                tracing::error!("cannot install signal handlers; running until killed");
                None
            }
        }
    }

    /// Waits for SIGTERM or SIGINT, serving SIGHUP reloads meanwhile; returns the signal's name.
    pub async fn wait(mut self, identity: Option<Identity>) -> &'static str {
        loop {
            tokio::select! {
                _ = self.term.recv() => return "SIGTERM",
                _ = self.int.recv() => return "SIGINT",
                _ = self.hup.recv() => {
                    tracing::info!("SIGHUP: reloading certificates and trust bundle");
                    if let Some(id) = &identity {
                        id.reload();
                    }
                }
            }
        }
    }
}
