//! pki (under construction)
