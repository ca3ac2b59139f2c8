//! The engine's ops for `kolo.torch.ops`: submit an op on raw views of contiguous CPU tensors
//! and get a handle at once; `wait` (GIL released, Ctrl-C honoured) and `poll` complete it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kolo_collective::engine::{recycle_output, Output, RawTensor, Submission};
use kolo_collective::wire::OpKind;
use kolo_collective::{DType, Error, ReduceOp};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::IntoPyResult;
use crate::session;

/// The Python objects (the tensors) each submitted op works on, by handle: held here from the
/// moment the op is submitted until `wait` consumes its result, so nothing the engine still
/// reads or writes can be freed — not even when a KeyboardInterrupt arrives before the caller
/// has recorded the handle.
static KEPT: Mutex<Option<HashMap<u64, Py<PyAny>>>> = Mutex::new(None);

fn kept() -> MutexGuard<'static, Option<HashMap<u64, Py<PyAny>>>> {
    KEPT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Drops what `submit` keeps for `handle` (an op that was never handed to the engine).
pub(crate) fn forget(handle: u64) {
    if let Some(kept) = kept().as_mut() {
        kept.remove(&handle);
    }
}

/// True while the tensor `submit` was given with `keep` for `handle` is still held (until
/// `wait` consumed the handle's result).
#[pyfunction]
pub fn holds(handle: u64) -> bool {
    kept().as_ref().is_some_and(|k| k.contains_key(&handle))
}

fn kind_of(kind: &str) -> PyResult<OpKind> {
    Ok(match kind {
        "allreduce" => OpKind::Allreduce,
        "allgather" => OpKind::Allgather,
        "broadcast" => OpKind::Broadcast,
        "alltoall" => OpKind::Alltoall,
        "reducescatter" => OpKind::Reducescatter,
        "barrier" => OpKind::Barrier,
        other => {
            return Err(crate::error::to_py(Error::InvalidArgument(format!(
                "unknown collective '{other}'"
            ))))
        }
    })
}

/// Submits one collective on `nbytes` at `ptr` (allreduce and broadcast write their result
/// there) and returns its handle. The caller keeps the memory alive and untouched until the
/// handle completes. `wake=False`: the caller waits for the handle at once (a synchronous
/// op), so the engine thread is not woken (`Engine::submit_with`). `keep` (the tensor, and
/// whatever else must outlive the op) is held by the handle itself until `wait` consumed its
/// result: registered in the same native call as the submission, with no Python code in
/// between where a KeyboardInterrupt could drop it.
#[pyfunction]
#[pyo3(signature = (kind, name, ptr, nbytes, shape, dtype, op="Sum", prescale=1.0, postscale=1.0, root=0, splits=Vec::new(), process_set=0, device=-1, ready_event=0, wake=true, keep=None))]
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the union of Horovod's op parameters"
)]
pub fn submit(
    py: Python<'_>,
    kind: &str,
    name: &str,
    ptr: usize,
    nbytes: usize,
    shape: Vec<i64>,
    dtype: &str,
    op: &str,
    prescale: f64,
    postscale: f64,
    root: usize,
    splits: Vec<u64>,
    process_set: u32,
    device: i32,
    ready_event: u64,
    wake: bool,
    keep: Option<Py<PyAny>>,
) -> PyResult<u64> {
    let worker = session::current(py)?;
    let mut sub = Submission::new(kind_of(kind)?, name);
    sub.dtype = dtype.parse::<DType>().py_err()?;
    sub.op = op.parse::<ReduceOp>().py_err()?;
    sub.shape = shape;
    sub.prescale = prescale;
    sub.postscale = postscale;
    sub.root = root;
    sub.splits = splits;
    sub.process_set = process_set;
    // A CUDA tensor (`device` >= 0): NCCL runs it after `ready_event` (recorded by
    // `kolo.torch.ops` on torch's stream); see `crate::cuda::device_submission`.
    sub.device = crate::cuda::device_submission(sub.kind, sub.dtype, device, ready_event)?;
    if nbytes > 0 && ptr == 0 {
        return Err(crate::error::to_py(Error::InvalidArgument(
            "a null tensor pointer".into(),
        )));
    }
    let ptr = if nbytes == 0 {
        std::ptr::NonNull::<u8>::dangling().as_ptr()
    } else {
        ptr as *mut u8
    };
    // SAFETY: `kolo.torch.ops` passes the data pointer of a contiguous CPU tensor of `nbytes`
    // bytes and keeps the tensor referenced, and unused by Python, until the handle completes.
    sub.tensor = unsafe { RawTensor::new(ptr, nbytes) };
    let mut kept = kept();
    let handle = crate::group::submit_or_hold(&worker, sub, wake).py_err()?;
    if let Some(keep) = keep {
        kept.get_or_insert_with(HashMap::new).insert(handle, keep);
    }
    Ok(handle)
}

/// Submits this rank's join; the handle's result is the last rank to join.
#[pyfunction]
pub fn join(py: Python<'_>) -> PyResult<u64> {
    session::current(py)?.engine().join().py_err()
}

/// Submits the registration of a process set of `ranks`; the handle's result is its id
/// (`id` when given, free and not below the next one).
#[pyfunction]
#[pyo3(signature = (ranks, initializing, id = None))]
pub fn add_process_set(
    py: Python<'_>,
    ranks: Vec<usize>,
    initializing: bool,
    id: Option<u32>,
) -> PyResult<u64> {
    session::current(py)?
        .engine()
        .add_process_set_as(&ranks, initializing, id)
        .py_err()
}

/// Submits the removal of process set `id`.
#[pyfunction]
pub fn remove_process_set(py: Python<'_>, id: u32) -> PyResult<u64> {
    session::current(py)?
        .engine()
        .remove_process_set(id)
        .py_err()
}

/// True once the op behind `handle` finished.
#[pyfunction]
pub fn poll(py: Python<'_>, handle: u64) -> PyResult<bool> {
    session::current(py)?.engine().poll(handle).py_err()
}

/// Waits for `handle` without the GIL (Ctrl-C raises KeyboardInterrupt; the op keeps running).
/// Returns None, `(capsule, rows)` for ops with a new output (a DLPack capsule of a 1-D uint8
/// CPU tensor that owns the engine's buffer: `torch.from_dlpack` takes it without a copy), or an int (join: last rank;
/// add_process_set: the id). With `timeout` (seconds), raises kolo's TimeoutError once it ran
/// out (the op stays pending).
#[pyfunction]
#[pyo3(signature = (handle, timeout=None))]
pub fn wait(py: Python<'_>, handle: u64, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
    let limit = timeout
        .map(|t| crate::job::timeout_seconds("timeout", t))
        .transpose()?;
    let worker = session::current(py)?;
    let engine = worker.engine();
    let started = std::time::Instant::now();
    loop {
        if let Some(after) = limit.filter(|&limit| started.elapsed() >= limit) {
            return Err(Error::Timeout {
                what: format!("waiting for op {handle}"),
                after,
            })
            .py_err();
        }
        if let Some(result) = py.detach(|| engine.wait(handle, Duration::from_millis(100))) {
            // The op is over: the engine no longer touches its tensors.
            let released = kept().as_mut().and_then(|k| k.remove(&handle));
            drop(released);
            return match result.py_err()? {
                Output::Done => Ok(py.None()),
                Output::Tensor { data, rows } => Ok((dlpack_bytes(py, data)?, rows)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind()),
                Output::LastJoined(rank) => Ok(rank.into_pyobject(py)?.into_any().unbind()),
                Output::ProcessSet(id) => Ok(id.into_pyobject(py)?.into_any().unbind()),
            };
        }
        py.check_signals()?;
    }
}

// DLPack (v0.8 ABI, the legacy `dltensor` capsule every torch version takes): hands an engine
// output to Python without copying it. A fresh copy of a 64 MiB result cost more than the
// collective (page faults on new memory), and the buffer goes back to the engine when the
// tensor is freed (`recycle_output`).

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut std::ffi::c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut std::ffi::c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// The managed tensor and what it points into; `managed` first, so a pointer to it is a
/// pointer to the whole.
#[repr(C)]
struct Owned {
    managed: DlManagedTensor,
    shape: [i64; 1],
    data: Vec<u8>,
}

const DLTENSOR: &std::ffi::CStr = c"dltensor";
const K_DL_CPU: i32 = 1;
const K_DL_UINT: u8 = 1;

/// The DLPack deleter: frees the [`Owned`] and recycles its bytes.
unsafe extern "C" fn delete_owned(managed: *mut DlManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` is the pointer `dlpack_bytes` got from `Box::into_raw` of an `Owned`
    // (`managed` is its first field of a `repr(C)` struct); DLPack calls the deleter once.
    let owned = unsafe { Box::from_raw(managed.cast::<Owned>()) };
    recycle_output(owned.data);
}

/// Destructor of the capsule: frees the tensor when no consumer took it (a consumer renames
/// the capsule `used_dltensor` and calls the deleter itself).
unsafe extern "C" fn drop_capsule(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: Python calls this with the capsule being destroyed (GIL held); checking the
    // name sets no exception.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let managed = pyo3::ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            delete_owned(managed.cast::<DlManagedTensor>());
        }
    }
}

/// A DLPack capsule of `data` as a 1-D uint8 CPU tensor that owns it.
fn dlpack_bytes(py: Python<'_>, mut data: Vec<u8>) -> PyResult<Py<PyAny>> {
    let len = i64::try_from(data.len()).map_err(|_| {
        crate::error::to_py(Error::Internal("an output of more than 2^63 bytes".into()))
    })?;
    let ptr = data.as_mut_ptr().cast::<std::ffi::c_void>();
    let owned = Box::into_raw(Box::new(Owned {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                data: ptr,
                device: DlDevice {
                    device_type: K_DL_CPU,
                    device_id: 0,
                },
                ndim: 1,
                dtype: DlDataType {
                    code: K_DL_UINT,
                    bits: 8,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_owned),
        },
        shape: [len],
        data,
    }));
    // SAFETY: `owned` is a valid, uniquely owned `Owned` (just leaked from its box): point the
    // shape at its own field (the box never moves), then hand the allocation to the capsule,
    // whose destructor or consumer frees it exactly once. The Vec's heap buffer (`ptr`) did
    // not move when the Vec moved into the box.
    unsafe {
        (*owned).managed.dl_tensor.shape = (*owned).shape.as_mut_ptr();
        (*owned).managed.manager_ctx = owned.cast();
        let capsule = pyo3::ffi::PyCapsule_New(owned.cast(), DLTENSOR.as_ptr(), Some(drop_capsule));
        if capsule.is_null() {
            delete_owned(owned.cast());
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, capsule).unbind())
    }
}

/// The engine's counters.
#[pyfunction]
pub fn engine_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let worker = session::current(py)?;
    let dict = PyDict::new(py);
    for (name, value) in worker.engine().stats() {
        dict.set_item(name, value)?;
    }
    Ok(dict)
}

/// Starts the timeline (written by rank 0).
#[pyfunction]
pub fn start_timeline(py: Python<'_>, path: &str, mark_cycles: bool) -> PyResult<()> {
    let worker = session::current(py)?;
    worker
        .engine()
        .start_timeline(std::path::Path::new(path), mark_cycles)
        .py_err()
}

/// Stops the timeline and completes its file.
#[pyfunction]
pub fn stop_timeline(py: Python<'_>) -> PyResult<()> {
    let worker = session::current(py)?;
    py.detach(|| worker.engine().stop_timeline()).py_err()
}

/// Adds the op functions to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(submit, m)?)?;
    m.add_function(wrap_pyfunction!(join, m)?)?;
    m.add_function(wrap_pyfunction!(add_process_set, m)?)?;
    m.add_function(wrap_pyfunction!(remove_process_set, m)?)?;
    m.add_function(wrap_pyfunction!(poll, m)?)?;
    m.add_function(wrap_pyfunction!(wait, m)?)?;
    m.add_function(wrap_pyfunction!(holds, m)?)?;
    m.add_function(wrap_pyfunction!(engine_stats, m)?)?;
    m.add_function(wrap_pyfunction!(start_timeline, m)?)?;
    m.add_function(wrap_pyfunction!(stop_timeline, m)?)?;
    Ok(())
}
