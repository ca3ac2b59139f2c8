//! `kolorun`, its command-line parser, `kolo.run`'s launch, and the build report behind
//! `kolorun --check-build`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kolo_collective::launcher::{self, HostSource, Invocation};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::blocking::run_interruptibly;
use crate::error::IntoPyResult;

/// How long Ctrl-C waits for the launcher to stop every rank before giving up on it.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// Runs the launcher with `args` (everything after `kolorun`); returns the job's exit status.
#[pyfunction]
pub fn kolorun(py: Python<'_>, args: Vec<String>) -> PyResult<i32> {
    run_interruptibly(py, STOP_GRACE, move |stop| {
        launcher::run(&args, &|| stop.load(Ordering::SeqCst))
    })?
    .py_err()
}

/// Parses a kolorun command line without launching anything: a dict with `action` (`launch`,
/// `help`, `version`, `check_build`) and, for `launch`, the options, `env` (the tuning flags'
/// variables), `notices` (`(flag, text)` pairs) and `command`.
#[pyfunction]
pub fn kolorun_parse(py: Python<'_>, args: Vec<String>) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    let parsed = match launcher::parse_args(&args).py_err()? {
        Invocation::Help => return action(dict, "help"),
        Invocation::Version => return action(dict, "version"),
        Invocation::CheckBuild => return action(dict, "check_build"),
        Invocation::Launch(parsed) => parsed,
    };
    dict.set_item("action", "launch")?;
    dict.set_item("num_proc", parsed.num_proc)?;
    let (hosts, hostfile, discovery) = match &parsed.hosts {
        Some(HostSource::Flag(text)) => (Some(text.clone()), None, None),
        Some(HostSource::File(path)) => (None, Some(text(path)), None),
        Some(HostSource::Discovery(path)) => (None, None, Some(text(path))),
        None => (None, None, None),
    };
    dict.set_item("hosts", hosts)?;
    dict.set_item("hostfile", hostfile)?;
    dict.set_item("host_discovery_script", discovery)?;
    dict.set_item(
        "start_timeout",
        parsed.start_timeout.map(|t| t.as_secs_f64()),
    )?;
    dict.set_item("network_interfaces", parsed.network_interfaces.clone())?;
    dict.set_item("ssh_port", parsed.ssh_port)?;
    dict.set_item(
        "ssh_identity_file",
        parsed.ssh_identity_file.as_deref().map(text),
    )?;
    dict.set_item("verbose", parsed.verbose)?;
    dict.set_item("output_filename", parsed.output_dir.as_deref().map(text))?;
    dict.set_item("prefix_output_with_timestamp", parsed.prefix_timestamp)?;
    dict.set_item("disable_cache", parsed.disable_cache)?;
    dict.set_item("controller", parsed.controller.clone())?;
    dict.set_item("mpi_args", parsed.mpi_args.clone())?;
    dict.set_item("binding_args", parsed.binding_args.clone())?;
    let flags = &parsed.elastic_flags;
    dict.set_item("elastic", parsed.elastic.is_some())?;
    dict.set_item("min_num_proc", flags.min_num_proc)?;
    dict.set_item("max_num_proc", flags.max_num_proc)?;
    dict.set_item("slots_per_host", flags.slots_per_host)?;
    dict.set_item("elastic_timeout", flags.elastic_timeout)?;
    dict.set_item("reset_limit", flags.reset_limit)?;
    dict.set_item(
        "cooldown_range",
        flags.cooldown_range.map(|r| (r.lower(), r.upper())),
    )?;
    let env = PyDict::new(py);
    for (name, value) in &parsed.engine_env {
        env.set_item(name, value)?;
    }
    dict.set_item("env", env)?;
    dict.set_item("notices", parsed.notices.clone())?;
    dict.set_item("config_file", parsed.config_file.as_deref().map(text))?;
    dict.set_item("options_end", parsed.options_end)?;
    dict.set_item("command", parsed.command.clone())?;
    Ok(dict)
}

fn text(path: &std::path::Path) -> String {
    path.to_string_lossy().into_owned()
}

fn action<'py>(dict: Bound<'py, PyDict>, name: &str) -> PyResult<Bound<'py, PyDict>> {
    dict.set_item("action", name)?;
    Ok(dict)
}

/// A failed job's first failure: `(rank or None, host, message)`.
type Failure = (Option<u32>, String, String);
/// `(exit code, results by rank, failure)`.
type FunctionOutcome = (i32, Vec<Option<Py<PyBytes>>>, Option<Failure>);

/// Runs a `kolo.run` job (the kolorun command line `args`, whose ranks fetch `payload`);
/// returns `(exit_code, results by rank (bytes or None), failure)` where `failure` is
/// `(rank or None, host, message)` or None.
#[pyfunction]
pub fn kolorun_function(
    py: Python<'_>,
    args: Vec<String>,
    payload: Vec<u8>,
) -> PyResult<FunctionOutcome> {
    let run = run_interruptibly(py, STOP_GRACE, move |stop| {
        launcher::run_function(&args, payload, &|| stop.load(Ordering::SeqCst))
    })?
    .py_err()?;
    let results = run
        .results
        .iter()
        .map(|result| result.as_ref().map(|data| PyBytes::new(py, data).unbind()))
        .collect();
    let failure = run
        .failure
        .map(|cause| (cause.rank, cause.host, cause.message));
    Ok((run.exit_code, results, failure))
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
    m.add_function(wrap_pyfunction!(kolorun_parse, m)?)?;
    m.add_function(wrap_pyfunction!(kolorun_function, m)?)?;
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    Ok(())
}
