//! config (under construction)
