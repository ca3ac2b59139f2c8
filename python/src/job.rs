//! The launcher-neutral native pieces shared by `kolo.spark.run` and `kolo.ray.RayExecutor`:
//! the driver-side `LaunchDriver` and the worker's session functions (`session_*`), wrappers
//! over `kolo_collective::control::launch` and `kolo_collective::worker::session`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kolo_collective::control::env::{ELASTIC_JOINING, ELASTIC_TIMEOUT};
use kolo_collective::control::{
    DriverEvent, ElasticConfig, JobId, JobSecret, LaunchDriver, LaunchDriverOptions, PeerAssignment,
};
use kolo_collective::worker::WorkerSession;
use kolo_collective::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::blocking::run_interruptibly;
use crate::error::to_py;

/// `value` seconds as a `Duration`, or `InvalidArgumentError` naming `name`.
pub fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    if value.is_finite() && value > 0.0 && value < MAX_TIMEOUT_SECONDS {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(to_py(Error::InvalidArgument(format!(
            "{name}={value} must be a positive number of seconds"
        ))))
    }
}

/// The longest wait a timeout argument may ask for: about 31 years. Larger values (`1e300`)
/// would overflow a `Duration`; `inf` and `nan` are no number of seconds at all.
const MAX_TIMEOUT_SECONDS: f64 = 1e9;

/// `value` seconds (0 included: do not wait) as a `Duration`, or `InvalidArgumentError` naming
/// `name` and the accepted range for `inf`, `nan`, negative or huge values.
pub fn timeout_seconds(name: &str, value: f64) -> PyResult<Duration> {
    if value.is_finite() && (0.0..MAX_TIMEOUT_SECONDS).contains(&value) {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(to_py(Error::InvalidArgument(format!(
            "{name}={value:?} must be a number of seconds from 0 to {MAX_TIMEOUT_SECONDS:e}{}",
            if value == f64::INFINITY {
                " (pass None where waiting without a limit is allowed)"
            } else {
                ""
            }
        ))))
    }
}

/// The most tasks (ranks) one launch may have. Task indices travel as 32-bit numbers and the
/// driver keeps state per task, so `num_tasks=2**40` is refused here instead of exhausting
/// memory.
pub const MAX_TASKS: usize = 1 << 20;

/// The job driver of one launch (`kolo.spark.run`, `RayExecutor`, rank 0 of an `mpirun`/`srun`
/// job). `secret` and `job_id` (hex) give the job an identity its workers already know.
#[pyclass(name = "LaunchDriver", module = "kolo._native")]
#[derive(Debug)]
pub struct PyLaunchDriver {
    inner: Arc<LaunchDriver>,
    /// Elastic launches: the elastic timeout, passed to every worker ([`ELASTIC_TIMEOUT`]).
    elastic_timeout: Option<Duration>,
}

#[pymethods]
impl PyLaunchDriver {
    #[new]
    #[pyo3(signature = (num_tasks, bind = "127.0.0.1:0", start_timeout = 30.0, heartbeat_timeout = 30.0, secret = None, job_id = None, min_np = None, max_np = None, elastic_timeout = 600.0, reset_limit = None))]
    #[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn new(
        py: Python<'_>,
        num_tasks: usize,
        bind: &str,
        start_timeout: f64,
        heartbeat_timeout: f64,
        secret: Option<&str>,
        job_id: Option<&str>,
        min_np: Option<usize>,
        max_np: Option<usize>,
        elastic_timeout: f64,
        reset_limit: Option<u32>,
    ) -> PyResult<Self> {
        let bind: SocketAddr = bind.parse().map_err(|_| {
            to_py(Error::InvalidArgument(format!(
                "bind={bind:?} is not an IP:port address (e.g. 127.0.0.1:0)"
            )))
        })?;
        if !(1..=MAX_TASKS).contains(&num_tasks) {
            return Err(to_py(Error::InvalidArgument(format!(
                "num_tasks={num_tasks} must be between 1 and {MAX_TASKS}"
            ))));
        }
        let options = LaunchDriverOptions {
            bind,
            num_tasks,
            start_timeout: seconds("start_timeout", start_timeout)?,
            heartbeat_timeout: seconds("heartbeat_timeout", heartbeat_timeout)?,
        };
        // A job whose workers already know its secret and id (given both, or neither).
        let identity = match (secret, job_id) {
            (None, None) => None,
            (Some(secret), Some(job_id)) => Some((
                JobSecret::from_hex(secret, "secret").map_err(to_py)?,
                JobId::from_hex(job_id, "job_id").map_err(to_py)?,
            )),
            _ => {
                return Err(to_py(Error::InvalidArgument(
                    "pass secret and job_id together (or neither, for fresh ones)".into(),
                )))
            }
        };
        // An elastic launch when either bound is given (the other defaults to num_tasks).
        let elastic = match (min_np, max_np) {
            (None, None) => None,
            (min_np, max_np) => Some(ElasticConfig {
                min_np: min_np.unwrap_or(num_tasks),
                max_np: max_np.unwrap_or(num_tasks),
                elastic_timeout: seconds("elastic_timeout", elastic_timeout)?,
                reset_limit,
            }),
        };
        if elastic.is_some() && identity.is_some() {
            return Err(to_py(Error::InvalidArgument(
                "an elastic launch (min_np/max_np) starts with a fresh secret and job_id".into(),
            )));
        }
        let inner = py
            .detach(|| match (identity, elastic) {
                (_, Some(elastic)) => LaunchDriver::start_elastic(&options, elastic),
                (Some((secret, job_id)), None) => {
                    LaunchDriver::start_with_identity(&options, secret, job_id)
                }
                (None, None) => LaunchDriver::start(&options),
            })
            .map_err(to_py)?;
        Ok(Self {
            inner: Arc::new(inner),
            elastic_timeout: elastic.map(|e| e.elastic_timeout),
        })
    }

    /// Elastic launches: the launcher started processes for these new task indices.
    fn add_tasks(&self, py: Python<'_>, task_indices: Vec<u32>) -> PyResult<()> {
        py.detach(|| self.inner.add_tasks(&task_indices))
            .map_err(to_py)
    }

    /// Elastic launches: task `task_index` is gone (`reason` reaches the survivors); False when
    /// it was not live.
    fn remove_task(&self, py: Python<'_>, task_index: u32, reason: &str) -> PyResult<bool> {
        py.detach(|| self.inner.remove_task(task_index, reason))
            .map_err(to_py)
    }

    /// The live task indices, ascending.
    fn live_tasks(&self) -> Vec<u32> {
        self.inner.live_tasks()
    }

    /// Elastic launches: True while added task `task_index` has not registered yet.
    fn is_joining(&self, task_index: u32) -> bool {
        self.inner.is_joining(task_index)
    }

    /// The `host:port` tasks connect to.
    #[getter]
    fn addr(&self) -> String {
        self.inner.addr().to_string()
    }

    /// The `KOLO_*` variables of task `task_index` (the secret among them: never log them).
    fn worker_env<'py>(&self, py: Python<'py>, task_index: u32) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, value) in self.inner.worker_env(task_index).to_vars() {
            dict.set_item(name, value)?;
        }
        if let Some(timeout) = self.elastic_timeout {
            dict.set_item(ELASTIC_TIMEOUT, timeout.as_secs_f64().to_string())?;
        }
        if self.inner.is_joining(task_index) {
            dict.set_item(ELASTIC_JOINING, "1")?;
        }
        Ok(dict)
    }

    /// Publishes the pickled `(fn, args, kwargs)`.
    fn put_payload(&self, py: Python<'_>, payload: Vec<u8>) -> PyResult<()> {
        py.detach(|| self.inner.put_payload(payload)).map_err(to_py)
    }

    /// What the tasks sent since the last call, waiting up to `timeout` seconds for something:
    /// tuples `("started", task, attempt, hostname, pid)`, `("output", task, rank, stderr,
    /// bytes, unix_micros)`, `("message", task, rank, bytes)`, `("exited", task, rank,
    /// success, description)`.
    fn poll<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let timeout = timeout_seconds("timeout", timeout)?.min(Duration::from_secs(60));
        let inner = Arc::clone(&self.inner);
        let events = py.detach(move || inner.poll(timeout)).map_err(to_py)?;
        events
            .into_iter()
            .map(|event| match event {
                DriverEvent::Started { task, start } => PyTuple::new(
                    py,
                    [
                        "started".into_pyobject(py)?.into_any(),
                        task.into_pyobject(py)?.into_any(),
                        start.attempt.into_pyobject(py)?.into_any(),
                        start.hostname.into_pyobject(py)?.into_any(),
                        start.pid.into_pyobject(py)?.into_any(),
                    ],
                ),
                DriverEvent::Output {
                    task,
                    rank,
                    stderr,
                    text,
                    unix_micros,
                } => PyTuple::new(
                    py,
                    [
                        "output".into_pyobject(py)?.into_any(),
                        task.into_pyobject(py)?.into_any(),
                        rank.into_pyobject(py)?.into_any(),
                        pyo3::types::PyBool::new(py, stderr).to_owned().into_any(),
                        PyBytes::new(py, &text).into_any(),
                        unix_micros.into_pyobject(py)?.into_any(),
                    ],
                ),
                DriverEvent::Message { task, rank, data } => PyTuple::new(
                    py,
                    [
                        "message".into_pyobject(py)?.into_any(),
                        task.into_pyobject(py)?.into_any(),
                        rank.into_pyobject(py)?.into_any(),
                        PyBytes::new(py, &data).into_any(),
                    ],
                ),
                DriverEvent::Exited {
                    task,
                    rank,
                    success,
                    description,
                } => PyTuple::new(
                    py,
                    [
                        "exited".into_pyobject(py)?.into_any(),
                        task.into_pyobject(py)?.into_any(),
                        rank.into_pyobject(py)?.into_any(),
                        pyo3::types::PyBool::new(py, success).to_owned().into_any(),
                        description.into_pyobject(py)?.into_any(),
                    ],
                ),
            })
            .collect()
    }

    /// Task `task_index`'s pickled result, or None.
    fn result<'py>(&self, py: Python<'py>, task_index: u32) -> Option<Bound<'py, PyBytes>> {
        let value = py.detach(|| self.inner.result(task_index))?;
        Some(PyBytes::new(py, &value))
    }

    /// `(attempt, hostname, pid)` task `task_index` reported at its start, or None.
    fn task_start(&self, task_index: u32) -> Option<(u32, String, u32)> {
        self.inner
            .task_start(task_index)
            .map(|start| (start.attempt, start.hostname, start.pid))
    }

    /// `(success, description)` of task `task_index`'s rank process once it ended, or None.
    fn task_exit(&self, task_index: u32) -> Option<(bool, String)> {
        self.inner.task_exit(task_index)
    }

    /// How many ranks joined and have not left (`shutdown()`) yet; 0 before every task joined.
    fn active_ranks(&self) -> usize {
        self.inner.active_ranks()
    }

    /// True once every task's rank process ended.
    fn all_exited(&self) -> bool {
        self.inner.all_exited()
    }

    /// The first failure as `(rank or None, host, message)`, or None.
    fn failure(&self) -> Option<(Option<u32>, String, String)> {
        self.inner
            .failure()
            .map(|cause| (cause.rank, cause.host, cause.message))
    }

    /// Every task's assignment (dicts by task index) once all registered, else None.
    fn assignment<'py>(&self, py: Python<'py>) -> PyResult<Option<Vec<Bound<'py, PyDict>>>> {
        self.inner
            .assignment()
            .map(|peers| assignment_rows(py, peers))
            .transpose()
    }

    /// Records that task `task_index` failed (its process died, its actor was lost): the abort
    /// cause names its rank and host, and the job is aborted.
    fn report_task_failure(&self, task_index: u32, message: String) {
        self.inner.report_task_failure(task_index, message);
    }

    /// Aborts the job: every task stops its rank process.
    fn abort(&self, message: String) {
        self.inner.abort(message);
    }

    /// Stops the service (idempotent).
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.inner.shutdown());
    }
}

static SESSION: Mutex<Option<Arc<WorkerSession>>> = Mutex::new(None);

fn session() -> PyResult<Arc<WorkerSession>> {
    SESSION
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .ok_or_else(|| {
            to_py(Error::InvalidArgument(
                "this process has no job session (send_to_driver and the rank helpers work \
                 only inside the function kolo.spark.run or RayExecutor runs)"
                    .into(),
            ))
        })
}

/// Registers this process with the job its `KOLO_*` environment names; returns the rank variables to set (a list of
/// `(name, value)`).
#[pyfunction]
fn session_join(py: Python<'_>) -> PyResult<Vec<(String, String)>> {
    let session = run_interruptibly(py, Duration::from_secs(1), |_stop| {
        WorkerSession::join_from_env()
    })?
    .map_err(to_py)?;
    let vars = session.rank_env();
    *SESSION.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(session));
    Ok(vars)
}

/// Fetches the pickled `(fn, args, kwargs)`, waiting up to `timeout` seconds.
#[pyfunction]
fn session_payload<'py>(py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyBytes>> {
    let session = session()?;
    let timeout = seconds("timeout", timeout)?;
    let payload = run_interruptibly(py, Duration::from_secs(1), move |_stop| {
        session.fetch_payload(timeout)
    })?
    .map_err(to_py)?;
    Ok(PyBytes::new(py, &payload))
}

/// Returns this rank's pickled result to the driver.
#[pyfunction]
fn session_put_result(py: Python<'_>, result: Vec<u8>) -> PyResult<()> {
    let session = session()?;
    run_interruptibly(py, Duration::from_secs(1), move |_stop| {
        session.put_result(&result)
    })?
    .map_err(to_py)
}

/// Sends a small pickled object to the driver.
#[pyfunction]
fn session_send(py: Python<'_>, message: Vec<u8>) -> PyResult<()> {
    let session = session()?;
    py.detach(move || session.send_message(message))
        .map_err(to_py)
}

/// Tells the driver this task's worker runs (a `started` event with attempt, host, pid).
#[pyfunction]
fn session_post_started(py: Python<'_>, attempt: u32, hostname: String, pid: u32) -> PyResult<()> {
    let session = session()?;
    py.detach(move || session.post_started(attempt, &hostname, pid))
        .map_err(to_py)
}

/// Reports that the user's function failed (`message` carries the traceback).
#[pyfunction]
fn session_fail(py: Python<'_>, message: String) -> PyResult<()> {
    let session = session()?;
    py.detach(move || session.report_failure(&message))
        .map_err(to_py)
}

/// Ends the session (leaves the job unless `init()` adopted it).
#[pyfunction]
fn session_finish(py: Python<'_>) -> PyResult<()> {
    let session = session()?;
    py.detach(move || session.finish()).map_err(to_py)
}

/// Adds the launch driver class and the session functions to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLaunchDriver>()?;
    m.add_function(wrap_pyfunction!(session_join, m)?)?;
    m.add_function(wrap_pyfunction!(session_payload, m)?)?;
    m.add_function(wrap_pyfunction!(session_put_result, m)?)?;
    m.add_function(wrap_pyfunction!(session_send, m)?)?;
    m.add_function(wrap_pyfunction!(session_post_started, m)?)?;
    m.add_function(wrap_pyfunction!(session_fail, m)?)?;
    m.add_function(wrap_pyfunction!(session_finish, m)?)?;
    Ok(())
}

/// Every task's assignment as dicts (task_index, rank, size, local/cross rank and size, host
/// hash, hostname), in the order given.
fn assignment_rows(py: Python<'_>, peers: Vec<PeerAssignment>) -> PyResult<Vec<Bound<'_, PyDict>>> {
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
