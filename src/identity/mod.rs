//! identity (under construction)
