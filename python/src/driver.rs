//! `DriverService`: the job driver for launchers written in Python (Spark, Ray) and for tests.

use std::net::SocketAddr;
use std::time::Duration;

use kolo_collective::control::{
    env::WorkerEnv, DriverConfig, DriverService as Service, PeerAssignment,
};
use kolo_collective::{AbortCause, Error};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::IntoPyResult;

/// A running job driver service; workers started with `worker_env(i)` join it.
#[pyclass(name = "DriverService", module = "kolo._native")]
#[derive(Debug)]
pub struct PyDriverService {
    service: Service,
    config: DriverConfig,
}

#[pymethods]
impl PyDriverService {
    #[new]
    #[pyo3(signature = (num_tasks, bind = "127.0.0.1:0", start_timeout = 30.0))]
    fn new(py: Python<'_>, num_tasks: usize, bind: &str, start_timeout: f64) -> PyResult<Self> {
        let bind: SocketAddr = bind.parse().map_err(|_| {
            crate::error::to_py(Error::Config(format!(
                "bind={bind:?} is not an IP:port address (e.g. 127.0.0.1:0)"
            )))
        })?;
        if !(start_timeout.is_finite() && start_timeout > 0.0) {
            return Err(crate::error::to_py(Error::Config(format!(
                "start_timeout={start_timeout} must be a positive number of seconds"
            ))));
        }
        let config = DriverConfig {
            bind,
            start_timeout: Duration::from_secs_f64(start_timeout),
            ..DriverConfig::new(num_tasks)
        };
        let service = py.detach(|| Service::start(config.clone())).py_err()?;
        Ok(Self { service, config })
    }

    /// The `host:port` workers connect to.
    #[getter]
    fn addr(&self) -> String {
        self.service.addr().to_string()
    }

    /// The environment variables that make a process task `task_index` of this job.
    fn worker_env<'py>(&self, py: Python<'py>, task_index: u32) -> PyResult<Bound<'py, PyDict>> {
        let env = WorkerEnv {
            driver_addr: self.service.addr().to_string(),
            secret: self.config.secret.clone(),
            job_id: self.config.job_id,
            task_index,
            num_tasks: self.config.num_tasks as u32,
            start_timeout: self.config.start_timeout,
            hostname: None,
            host_hash_salt: None,
            data_addr: None,
        };
        let dict = PyDict::new(py);
        for (name, value) in env.to_vars() {
            dict.set_item(name, value)?;
        }
        Ok(dict)
    }

    /// Every task's assignment once all registered (a list of dicts by task index), else None.
    fn assignment<'py>(&self, py: Python<'py>) -> PyResult<Option<Vec<Bound<'py, PyDict>>>> {
        self.service
            .assignment()
            .map(|peers| assignment_rows(py, peers))
            .transpose()
    }

    /// Aborts the job: every worker's pending and later collectives fail with this cause.
    #[pyo3(signature = (message, rank = None, host = String::new()))]
    fn abort(&self, message: String, rank: Option<u32>, host: String) {
        self.service.abort(AbortCause {
            rank,
            host,
            message,
        });
    }

    /// Stops serving.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.service.shutdown());
    }
}

/// Every task's assignment as dicts (task_index, rank, size, local/cross rank and size, host
/// hash, hostname), in the order given.
pub(crate) fn assignment_rows(
    py: Python<'_>,
    peers: Vec<PeerAssignment>,
) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let mut rows = Vec::with_capacity(peers.len());
    for peer in peers {
        let row = PyDict::new(py);
        row.set_item("task_index", peer.task_index)?;
        row.set_item("rank", peer.rank)?;
        row.set_item("size", peer.size)?;
        row.set_item("local_rank", peer.local_rank)?;
        row.set_item("local_size", peer.local_size)?;
        row.set_item("cross_rank", peer.cross_rank)?;
        row.set_item("cross_size", peer.cross_size)?;
        row.set_item("host_hash", peer.host_hash)?;
        row.set_item("hostname", peer.hostname)?;
        rows.push(row);
    }
    Ok(rows)
}

/// Adds the class to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDriverService>()
}
