//! The `kolo.exceptions` hierarchy, and the one mapping from kolo's Rust errors onto it.
//!
//! Horovod's classes are Python builtins' subclasses, and kolo's keep that: a failed or
//! mismatched collective is an [`InternalError`], which is a `RuntimeError` and *is* Horovod's
//! `HorovodInternalError` (every op failure surfaces as one in `horovod/torch/mpi_ops.py`'s
//! `synchronize`, mismatches included); a bad argument is an [`InvalidArgumentError`], which is
//! a `ValueError` (Horovod's argument checks raise `ValueError`); a bounded wait that ran out is a
//! [`TimeoutError`], an `InternalError` too. Every class also derives from
//! [`KoloError`], so `except KoloError` still catches everything kolo raises.

use std::ffi::CStr;

use kolo_collective::Error;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

/// Declares `kolo.exceptions.$name` deriving from every class in `[$bases]` (in that order:
/// kolo's own base first, then Python's builtin, e.g. `[KoloError, PyRuntimeError]`).
/// `create_exception!` takes one base only; this is the same declaration with several.
macro_rules! create_exception_with_bases {
    ($name:ident, [$($base:ty),+], $doc:expr) => {
        #[repr(transparent)]
        #[doc = $doc]
        pub struct $name(pyo3::PyAny);

        pyo3::impl_exception_boilerplate!($name);
        pyo3::pyobject_native_type_named!($name);

        // SAFETY: the type object is created once, under the GIL, as a subclass of
        // BaseException (every base is an exception class), and lives for the process.
        unsafe impl pyo3::type_object::PyTypeInfo for $name {
            const NAME: &'static str = stringify!($name);
            const MODULE: Option<&'static str> = Some("kolo.exceptions");

            fn type_object_raw(py: Python<'_>) -> *mut pyo3::ffi::PyTypeObject {
                static TYPE_OBJECT: pyo3::sync::PyOnceLock<Py<PyType>> =
                    pyo3::sync::PyOnceLock::new();
                TYPE_OBJECT
                    .get_or_init(py, || {
                        new_exception_type(
                            py,
                            pyo3::ffi::c_str!(concat!("kolo.exceptions.", stringify!($name))),
                            pyo3::ffi::c_str!($doc),
                            &[$(py.get_type::<$base>()),+],
                        )
                    })
                    .as_ptr()
                    .cast()
            }
        }
    };
}

/// A new exception class `name` (`module.Class`) with docstring `doc` and base classes `bases`.
fn new_exception_type(
    py: Python<'_>,
    name: &CStr,
    doc: &CStr,
    bases: &[Bound<'_, PyType>],
) -> Py<PyType> {
    let bases = PyTuple::new(py, bases).expect("a tuple of the base classes");
    // SAFETY: a correct call of the C API (it accepts a tuple of bases); the result is a new
    // reference to the class, or null with the Python error set.
    let class = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyErr_NewExceptionWithDoc(
                name.as_ptr(),
                doc.as_ptr(),
                bases.as_ptr(),
                std::ptr::null_mut(),
            ),
        )
    };
    class
        .and_then(|class| Ok(class.cast_into::<PyType>()?.unbind()))
        .expect("kolo.exceptions classes can be created")
}

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
create_exception_with_bases!(
    InvalidArgumentError,
    [KoloError, PyValueError],
    "An argument of a kolo call is invalid (dtype, shape, op, rank, splits, ...); a ValueError, \
     as Horovod's argument checks raise."
);
create_exception!(
    kolo.exceptions,
    RendezvousError,
    KoloError,
    "Joining the job failed: the driver refused the worker, or not every rank arrived in time."
);
create_exception_with_bases!(
    InternalError,
    [KoloError, PyRuntimeError],
    "A collective failed: the job broke, or the ranks disagreed. A RuntimeError, and Horovod's \
     HorovodInternalError (kolo.common.exceptions.HorovodInternalError is this class)."
);
create_exception!(
    kolo.exceptions,
    TimeoutError,
    InternalError,
    "A bounded wait ran out (for a collective that stalled, for the other ranks, for the driver); \
     an InternalError, as Horovod raises HorovodInternalError for a stalled collective."
);
create_exception!(
    kolo.exceptions,
    MismatchError,
    InternalError,
    "Ranks called different collectives (name, shape, dtype, op, root) at the same point."
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
        Error::Config(_) | Error::SharedMemory(_) | Error::HostDiscovery { .. } => {
            ConfigError::new_err(message)
        }
        Error::InvalidArgument(_) => InvalidArgumentError::new_err(message),
        Error::Rendezvous(_) => RendezvousError::new_err(message),
        Error::Timeout { .. } => TimeoutError::new_err(message),
        Error::Mismatch(_) => MismatchError::new_err(message),
        Error::Aborted(_) => JobAbortedError::new_err(message),
        Error::Peer { .. } => PeerConnectionError::new_err(message),
        Error::Closed(_)
        | Error::MembershipChanged(_)
        | Error::Cuda(_)
        | Error::Io(_)
        | Error::Internal(_) => InternalError::new_err(message),
        Error::Launch(_) => LaunchError::new_err(message),
        Error::Transport(_) | Error::Status(_) => RendezvousError::new_err(message),
        Error::Runtime(inner) => runtime_to_py(inner),
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
