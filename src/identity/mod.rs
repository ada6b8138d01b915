//! identity (under construction)

pub mod export;
