//! `kolo.spark.run`'s Spark-only native piece: the task runner (a wrapper over
//! `kolo-spark-bridge`). The driver and the rank process's session are launcher-neutral
//! (`crate::job`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use kolo_collective::control::WorkerEnv;
use kolo_spark_bridge::{run_task, Error, TaskOptions};
use pyo3::prelude::*;

use crate::blocking::run_interruptibly;
use crate::error::spark_to_py;
use crate::job::seconds;

/// How long Ctrl-C in a task waits for the runner to stop its child.
const TASK_STOP_GRACE: Duration = Duration::from_secs(15);

/// Runs one task's rank process to its end (see `kolo_spark_bridge::run_task`); returns
/// `(success, description)`. `envs` must hold the task's `KOLO_*` job variables.
#[pyfunction]
#[pyo3(signature = (envs, program, args, attempt, hostname, term_grace = 5.0))]
fn spark_run_task(
    py: Python<'_>,
    envs: Vec<(String, String)>,
    program: String,
    args: Vec<String>,
    attempt: u32,
    hostname: String,
    term_grace: f64,
) -> PyResult<(bool, String)> {
    let worker = WorkerEnv::from_lookup(|name| {
        envs.iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    })
    .map_err(|err| spark_to_py(err.into()))?
    .ok_or_else(|| {
        spark_to_py(Error::InvalidArgument(
            "spark_run_task needs the task's KOLO_* job variables in envs".into(),
        ))
    })?;
    let options = TaskOptions {
        worker,
        program,
        args,
        envs,
        attempt,
        hostname,
        term_grace: seconds("term_grace", term_grace)?,
    };
    let outcome = run_interruptibly(py, TASK_STOP_GRACE, move |stop| {
        run_task(&options, &|| stop.load(Ordering::SeqCst))
    })?
    .map_err(spark_to_py)?;
    Ok((outcome.success, outcome.description))
}

/// Adds the Spark task runner to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(spark_run_task, m)?)?;
    Ok(())
}
