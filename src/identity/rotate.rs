//! Self-issued identity from the operator CA: issue at start, renew before expiry.

use crate::config::{IdentityConfig, IssuerConfig};
use crate::metrics::Metrics;
use std::sync::Arc;
use tokio::sync::{watch, Notify};

#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error("identity.issuer_cert: self-issued identity is not available in this build yet")]
    Unavailable,
}

pub(super) async fn start(
    _cfg: &IdentityConfig,
    _issuer: &IssuerConfig,
    _metrics: &Metrics,
    _reload: Arc<Notify>,
) -> Result<watch::Receiver<Arc<super::Material>>, RotateError> {
    Err(RotateError::Unavailable)
}

pub(super) fn check(_cfg: &IdentityConfig, _issuer: &IssuerConfig) -> Result<(), RotateError> {
    Err(RotateError::Unavailable)
}
