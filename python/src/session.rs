//! This process's place in a job: `init`, `shutdown`, and the rank queries.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kolo_collective::worker::Worker;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::blocking::run_interruptibly;
use crate::error::IntoPyResult;

static CURRENT: Mutex<Option<Arc<Worker>>> = Mutex::new(None);

fn slot() -> MutexGuard<'static, Option<Arc<Worker>>> {
    CURRENT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The joined worker, or `kolo.exceptions.NotInitializedError`.
pub fn current(py: Python<'_>) -> PyResult<Arc<Worker>> {
    if let Some(worker) = slot().as_ref() {
        return Ok(Arc::clone(worker));
    }
    let class = py
        .import("kolo.exceptions")?
        .getattr("NotInitializedError")?;
    Err(PyErr::from_value(class.call1((
        "kolo has not been initialized; call hvd.init() first",
    ))?))
}

/// Joins the job this process was launched into (or becomes a single rank). Idempotent.
#[pyfunction]
pub fn init(py: Python<'_>) -> PyResult<()> {
    if slot().is_some() {
        return Ok(());
    }
    let worker =
        run_interruptibly(py, Duration::from_secs(1), |_stop| Worker::join_from_env())?.py_err()?;
    *slot() = Some(Arc::new(worker));
    Ok(())
}

/// Leaves the job (no-op when not initialized).
#[pyfunction]
pub fn shutdown(py: Python<'_>) {
    let worker = slot().take();
    if let Some(worker) = worker {
        py.detach(|| worker.shutdown());
    }
}

/// The rank assignment as a dict (`rank`, `size`, `local_rank`, ..., `is_homogeneous`).
#[pyfunction]
pub fn rank_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let worker = current(py)?;
    let info = worker.info();
    let dict = PyDict::new(py);
    dict.set_item("rank", info.rank)?;
    dict.set_item("size", info.size)?;
    dict.set_item("local_rank", info.local_rank)?;
    dict.set_item("local_size", info.local_size)?;
    dict.set_item("cross_rank", info.cross_rank)?;
    dict.set_item("cross_size", info.cross_size)?;
    dict.set_item("is_homogeneous", worker.is_homogeneous())?;
    Ok(dict)
}

/// Elastic jobs: the host updates (`(timestamp in seconds since the epoch, HostUpdateResult)`:
/// 1 removed, 2 added, 3 mixed) the driver sent this worker since the last call, oldest first;
/// empty when not initialized or not launched (bounded: older ones are merged past 1,024).
#[pyfunction]
pub fn host_updates() -> Vec<(f64, u32)> {
    let worker = slot().as_ref().map(Arc::clone);
    worker
        .map(|worker| {
            worker
                .take_host_updates()
                .into_iter()
                .map(|update| (update.timestamp, update.result))
                .collect()
        })
        .unwrap_or_default()
}

/// Elastic jobs: whether this commit raises `HostsUpdatedInterrupt` — `(timestamp, skip_sync)`
/// of the newest host update, or `None` — agreed on every rank without a collective. Waits up
/// to `timeout` seconds for the global collectives submitted before it; `None` when not
/// initialized.
#[pyfunction]
#[pyo3(signature = (timeout = 60.0))]
pub fn check_host_updates(py: Python<'_>, timeout: f64) -> PyResult<Option<(f64, bool)>> {
    let Some(worker) = slot().as_ref().map(Arc::clone) else {
        return Ok(None);
    };
    let timeout = Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX);
    let raised = py
        .detach(|| worker.engine().check_host_updates(timeout))
        .py_err()?;
    Ok(raised.map(|r| (r.timestamp, r.skip_sync)))
}

/// Elastic jobs: records a host update (`HostUpdateResult`: 1 removed, 2 added, 3 mixed) this
/// process learned of, as if the driver had sent it; rank 0's record reaches every rank's next
/// commit.
#[pyfunction]
pub fn record_host_update(timestamp: f64, result: u32) -> PyResult<()> {
    if !(timestamp.is_finite() && timestamp >= 0.0) || result > 3 {
        return Err::<(), _>(kolo_collective::error::Error::InvalidArgument(format!(
            "a host update needs a timestamp (seconds since the epoch, got {timestamp}) and a \
             HostUpdateResult of 0-3 (got {result})"
        )))
        .py_err();
    }
    kolo_collective::control::host_updates::record_news(kolo_collective::control::HostUpdate {
        timestamp,
        result,
    });
    Ok(())
}

/// Adds the session functions to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(rank_info, m)?)?;
    m.add_function(wrap_pyfunction!(host_updates, m)?)?;
    m.add_function(wrap_pyfunction!(check_host_updates, m)?)?;
    m.add_function(wrap_pyfunction!(record_host_update, m)?)?;
    Ok(())
}
