//! Process signals: SIGTERM and SIGINT end the wait (the caller drains); SIGHUP reloads the
//! certificates and the trust bundle and keeps waiting.

use crate::identity::Identity;
use tokio::signal::unix::{signal, SignalKind};

/// Waits for SIGTERM or SIGINT, serving SIGHUP reloads meanwhile; returns the signal's name.
pub async fn wait(identity: Option<Identity>) -> &'static str {
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers; running until killed");
        return std::future::pending().await;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return "SIGTERM",
            _ = int.recv() => return "SIGINT",
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading certificates and trust bundle");
                if let Some(id) = &identity {
                    id.reload();
                }
            }
        }
    }
}
