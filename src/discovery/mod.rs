//! discovery (under construction)
