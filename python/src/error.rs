//! The `kolo.exceptions` hierarchy, and the one mapping from kolo's Rust errors onto it.

use kolo_collective::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    kolo.exceptions,
    KoloError,
    PyException,
    "Base class of every error kolo raises."
);
create_exception!(
    kolo.exceptions,
    ConfigError,
    KoloError,
    "A setting (environment variable, launcher flag, argument) is invalid."
);
create_exception!(
    kolo.exceptions,
    InvalidArgumentError,
    KoloError,
    "An argument of a kolo call is invalid (dtype, shape, op, rank, splits, ...)."
);
create_exception!(
    kolo.exceptions,
    RendezvousError,
    KoloError,
    "Joining the job failed: the driver refused the worker, or not every rank arrived in time."
);
create_exception!(
    kolo.exceptions,
    TimeoutError,
    KoloError,
    "A bounded wait ran out."
);
create_exception!(
    kolo.exceptions,
    MismatchError,
    KoloError,
    "Ranks called different collectives (name, shape, dtype, op, root) at the same point."
);
create_exception!(
    kolo.exceptions,
    InternalError,
    KoloError,
    "A collective failed because the job broke (Horovod's HorovodInternalError)."
);
create_exception!(
    kolo.exceptions,
    JobAbortedError,
    InternalError,
    "Another rank failed and the job was aborted; the message names the rank and the cause."
);
create_exception!(
    kolo.exceptions,
    PeerConnectionError,
    InternalError,
    "The connection to a peer rank broke in the middle of a collective."
);
create_exception!(
    kolo.exceptions,
    LaunchError,
    KoloError,
    "Starting or supervising the processes of a job failed."
);

create_exception!(
    kolo.exceptions,
    StoreError,
    KoloError,
    "A store location could not be resolved or reached (URL, credentials, missing object)."
);
create_exception!(
    kolo.exceptions,
    DataError,
    KoloError,
    "A dataset cannot be used for training (missing or non-numeric column, nulls, ragged arrays, too few rows)."
);

/// Adds every exception class to the native module (re-exported by `kolo.exceptions`).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KoloError", py.get_type::<KoloError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    m.add("RendezvousError", py.get_type::<RendezvousError>())?;
    m.add("TimeoutError", py.get_type::<TimeoutError>())?;
    m.add("MismatchError", py.get_type::<MismatchError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add("JobAbortedError", py.get_type::<JobAbortedError>())?;
    m.add("PeerConnectionError", py.get_type::<PeerConnectionError>())?;
    m.add("LaunchError", py.get_type::<LaunchError>())?;
    m.add("StoreError", py.get_type::<StoreError>())?;
    m.add("DataError", py.get_type::<DataError>())?;
    Ok(())
}

/// Maps a runtime error onto its `kolo.exceptions` class, keeping the message.
pub fn to_py(err: Error) -> PyErr {
    let message = err.to_string();
    match err {
        Error::Config(_) => ConfigError::new_err(message),
        Error::InvalidArgument(_) => InvalidArgumentError::new_err(message),
        Error::Rendezvous(_) => RendezvousError::new_err(message),
        Error::Timeout { .. } => TimeoutError::new_err(message),
        Error::Mismatch(_) => MismatchError::new_err(message),
        Error::Aborted(_) => JobAbortedError::new_err(message),
        Error::Peer { .. } => PeerConnectionError::new_err(message),
        Error::Closed(_) => InternalError::new_err(message),
        Error::Launch(_) => LaunchError::new_err(message),
        Error::Transport(_) | Error::Status(_) => RendezvousError::new_err(message),
        Error::Runtime(inner) => runtime_to_py(inner),
        _ => KoloError::new_err(message),
    }
}

/// Maps a runtime error onto its `kolo.exceptions` class, keeping the message: a forked child
/// is told how to start processes instead (`ConfigError`); a runtime that cannot be built is a
/// `KoloError`.
pub fn runtime_to_py(err: kolo_runtime::Error) -> PyErr {
    let message = err.to_string();
    match err {
        kolo_runtime::Error::Forked => ConfigError::new_err(message),
        kolo_runtime::Error::Build(_) => KoloError::new_err(message),
    }
}

/// `Result` with Python's error, for the binding's functions.
pub trait IntoPyResult<T> {
    /// Maps the error with [`to_py`].
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for kolo_collective::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// Maps a store error onto `kolo.exceptions.StoreError`, keeping the message.
pub fn store_to_py(err: kolo_store::Error) -> PyErr {
    StoreError::new_err(err.to_string())
}

/// Maps a data-path error onto its `kolo.exceptions` class, keeping the message.
pub fn data_to_py(err: kolo_estimator::Error) -> PyErr {
    match err {
        kolo_estimator::Error::Store(inner) => store_to_py(inner),
        kolo_estimator::Error::Runtime(inner) => runtime_to_py(inner),
        kolo_estimator::Error::DatasetNotFound { .. }
        | kolo_estimator::Error::ReadFile { .. }
        | kolo_estimator::Error::WriteParquet { .. } => StoreError::new_err(err.to_string()),
        kolo_estimator::Error::InvalidArgument(_) => InvalidArgumentError::new_err(err.to_string()),
        kolo_estimator::Error::Internal(_) => InternalError::new_err(err.to_string()),
        _ => DataError::new_err(err.to_string()),
    }
}

/// Maps a Spark-launch error onto its `kolo.exceptions` class, keeping the message.
pub fn spark_to_py(err: kolo_spark_bridge::Error) -> PyErr {
    match err {
        kolo_spark_bridge::Error::Collective(inner) => to_py(inner),
        kolo_spark_bridge::Error::Runtime(inner) => runtime_to_py(inner),
        kolo_spark_bridge::Error::Spawn { .. } => LaunchError::new_err(err.to_string()),
        kolo_spark_bridge::Error::InvalidArgument(_) => {
            InvalidArgumentError::new_err(err.to_string())
        }
        _ => InternalError::new_err(err.to_string()),
    }
}

/// Maps a Ray-placement error onto its `kolo.exceptions` class, keeping the message: invalid
/// arguments become `InvalidValueError` (an `InvalidArgumentError` and a `ValueError`, as
/// Horovod raises `ValueError` for them).
pub fn ray_to_py(py: Python<'_>, err: kolo_ray_bridge::Error) -> PyErr {
    let message = err.to_string();
    match err {
        kolo_ray_bridge::Error::InvalidArgument(_) => py
            .import("kolo.exceptions")
            .and_then(|module| module.getattr("InvalidValueError"))
            .and_then(|class| class.call1((message,)))
            .map_or_else(|failed| failed, PyErr::from_value),
        _ => InternalError::new_err(message),
    }
}
