//! proxy (under construction)
