//! balance (under construction)
