//! The gRPC messages and the generated client and server of `proto/driver.proto`
//! (package `kolo.driver.v1`). Most code uses [`crate::control::DriverClient`] and
//! [`crate::control::DriverService`] instead.
#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    reason = "generated code"
)]

tonic::include_proto!("kolo.driver.v1");
