//! `kolorun` and the build report behind `kolorun --check-build`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::blocking::run_interruptibly;
use crate::error::IntoPyResult;

/// How long Ctrl-C waits for the launcher to stop every rank before giving up on it.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// Runs the launcher with `args` (everything after `kolorun`); returns the job's exit status.
#[pyfunction]
pub fn kolorun(py: Python<'_>, args: Vec<String>) -> PyResult<i32> {
    run_interruptibly(py, STOP_GRACE, move |stop| {
        kolo_collective::launcher::run(&args, &|| stop.load(Ordering::SeqCst))
    })?
    .py_err()
}

/// What this build supports: version, transports, CUDA/NCCL (found at run time: `cuda` when
/// the driver sees a device, `nccl` when libnccl loads too).
#[pyfunction]
pub fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let found = py.detach(kolo_collective::cuda::probe);
    let dict = PyDict::new(py);
    dict.set_item("version", env!("CARGO_PKG_VERSION"))?;
    dict.set_item("tcp", true)?;
    dict.set_item("shm", true)?;
    dict.set_item("cuda", found.cuda_available())?;
    dict.set_item("nccl", found.nccl_available())?;
    Ok(dict)
}

/// Adds the launcher functions to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(kolorun, m)?)?;
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    Ok(())
}
