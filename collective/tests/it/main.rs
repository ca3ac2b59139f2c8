//! The crate's one integration-test binary.

mod adasum;
mod algorithms;
mod autotune;
mod collectives;
mod connect;
mod driver;
mod driver_auth;
mod driver_scale;
mod elastic;
mod engine_cycles;
mod groups;
mod hostile;
mod launcher;
mod mesh_auth;
mod negotiation;
mod register_retry;
