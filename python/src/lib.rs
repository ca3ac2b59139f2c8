//! `kolo._native`: the thin binding under the pure-Python `kolo` package. Every public name
//! lives in Python (`kolo.torch`, `kolo.exceptions`, `kolo.runner`); this module only moves
//! calls and errors across, releasing the GIL while Rust works.

use pyo3::prelude::*;

mod blocking;
mod cuda;
mod error;
mod group;
mod job;
mod launch;
mod loader;
mod logging;
mod ops;
mod prepare;
mod ray;
mod session;
mod spark;
mod store;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::init();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    error::register(m)?;
    session::register(m)?;
    ops::register(m)?;
    group::register(m)?;
    launch::register(m)?;
    store::register(m)?;
    loader::register(m)?;
    prepare::register(m)?;
    job::register(m)?;
    spark::register(m)?;
    ray::register(m)?;
    cuda::register(m)?;
    Ok(())
}
