//! The crate's one integration-test binary.

mod collectives;
mod driver;
mod hostile;
mod launcher;
