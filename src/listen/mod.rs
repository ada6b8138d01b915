//! listen (under construction)
