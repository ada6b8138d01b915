//! server (under construction)
