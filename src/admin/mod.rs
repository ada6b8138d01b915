//! admin (under construction)
