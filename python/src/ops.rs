//! The collectives, called by `kolo.torch.ops` with raw views of contiguous CPU tensors. Each
//! releases the GIL while the runtime works.

use std::sync::Mutex;

use kolo_collective::{DType, Error, ReduceOp};
use pyo3::prelude::*;

use crate::error::IntoPyResult;
use crate::raw::RawBuf;
use crate::session;

fn parse(dtype: &str, op: Option<&str>) -> PyResult<(DType, ReduceOp)> {
    let dtype: DType = dtype.parse().py_err()?;
    let op: ReduceOp = op.unwrap_or("Sum").parse().py_err()?;
    Ok((dtype, op))
}

/// Hands a collective the Python allocator `alloc(counts) -> (ptr, nbytes)`, which it calls
/// once the output size is known (taking the GIL for that call only). A Python exception from
/// `alloc` is kept and raised after the collective returns, in place of its error.
struct PythonAlloc<'p> {
    alloc: &'p Py<PyAny>,
    failure: Mutex<Option<PyErr>>,
}

impl PythonAlloc<'_> {
    fn allocate<'a>(&self, counts: &[u64]) -> kolo_collective::Result<&'a mut [u8]> {
        let result = Python::attach(|py| -> PyResult<(usize, usize)> {
            self.alloc.call1(py, (counts.to_vec(),))?.extract(py)
        });
        match result {
            // SAFETY: the allocator returned a fresh tensor that the Python caller keeps alive
            // and leaves alone until this call returns.
            Ok((ptr, len)) => Ok(unsafe { RawBuf::new(ptr, len).as_mut_slice() }),
            Err(err) => {
                let message = format!("allocating the output failed: {err}");
                if let Ok(mut slot) = self.failure.lock() {
                    *slot = Some(err);
                }
                Err(Error::InvalidArgument(message))
            }
        }
    }
}

/// Runs `op` without the GIL with a [`PythonAlloc`] over `alloc`.
fn with_python_alloc<R: Send>(
    py: Python<'_>,
    alloc: &Py<PyAny>,
    op: impl FnOnce(&PythonAlloc<'_>) -> kolo_collective::Result<R> + Send,
) -> PyResult<R> {
    let allocator = PythonAlloc {
        alloc,
        failure: Mutex::new(None),
    };
    let result = py.detach(|| op(&allocator));
    match allocator.failure.into_inner().ok().flatten() {
        Some(err) => Err(err),
        None => result.py_err(),
    }
}

/// In-place allreduce of `nbytes` at `ptr`.
#[pyfunction]
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the collective's parameters one to one"
)]
pub fn allreduce(
    py: Python<'_>,
    ptr: usize,
    nbytes: usize,
    shape: Vec<i64>,
    dtype: &str,
    op: &str,
    prescale: f64,
    postscale: f64,
    name: &str,
) -> PyResult<()> {
    let session = session::current(py)?;
    let (dtype, op) = parse(dtype, Some(op))?;
    let buf = RawBuf::new(ptr, nbytes);
    py.detach(|| {
        // SAFETY: the caller passes a tensor it keeps alive and does not touch during the call.
        let data = unsafe { buf.as_mut_slice() };
        session
            .comm()
            .allreduce(name, data, &shape, dtype, op, prescale, postscale)
    })
    .py_err()
}

/// Allgather along the first dimension; `alloc(first_dims)` returns the output's `(ptr, nbytes)`.
#[pyfunction]
pub fn allgather(
    py: Python<'_>,
    ptr: usize,
    nbytes: usize,
    shape: Vec<i64>,
    dtype: &str,
    name: &str,
    alloc: Py<PyAny>,
) -> PyResult<Vec<u64>> {
    let session = session::current(py)?;
    let (dtype, _) = parse(dtype, None)?;
    let input = RawBuf::new(ptr, nbytes);
    with_python_alloc(py, &alloc, |allocator| {
        // SAFETY: the caller keeps the input tensor alive and unmodified during the call.
        let data = unsafe { input.as_slice() };
        session
            .comm()
            .allgather(name, data, &shape, dtype, |dims| allocator.allocate(dims))
    })
}

/// In-place broadcast from `root`.
#[pyfunction]
pub fn broadcast(
    py: Python<'_>,
    ptr: usize,
    nbytes: usize,
    shape: Vec<i64>,
    dtype: &str,
    root: usize,
    name: &str,
) -> PyResult<()> {
    let session = session::current(py)?;
    let (dtype, _) = parse(dtype, None)?;
    let buf = RawBuf::new(ptr, nbytes);
    py.detach(|| {
        // SAFETY: the caller keeps the tensor alive and untouched during the call.
        let data = unsafe { buf.as_mut_slice() };
        session.comm().broadcast(name, data, &shape, dtype, root)
    })
    .py_err()
}

/// Alltoall with `splits[j]` first-dim rows to rank j; returns the rows received from each rank.
#[pyfunction]
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the collective's parameters one to one"
)]
pub fn alltoall(
    py: Python<'_>,
    ptr: usize,
    nbytes: usize,
    shape: Vec<i64>,
    dtype: &str,
    splits: Vec<u64>,
    name: &str,
    alloc: Py<PyAny>,
) -> PyResult<Vec<u64>> {
    let session = session::current(py)?;
    let (dtype, _) = parse(dtype, None)?;
    let input = RawBuf::new(ptr, nbytes);
    with_python_alloc(py, &alloc, |allocator| {
        // SAFETY: the caller keeps the input tensor alive and unmodified during the call.
        let data = unsafe { input.as_slice() };
        let allocate = |recv: &[u64]| allocator.allocate(recv);
        session
            .comm()
            .alltoall(name, data, &shape, dtype, &splits, allocate)
    })
}

/// Reducescatter of the input into this rank's slice `out_ptr`.
#[pyfunction]
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the collective's parameters one to one"
)]
pub fn reducescatter(
    py: Python<'_>,
    in_ptr: usize,
    in_nbytes: usize,
    out_ptr: usize,
    out_nbytes: usize,
    shape: Vec<i64>,
    dtype: &str,
    op: &str,
    prescale: f64,
    postscale: f64,
    name: &str,
) -> PyResult<()> {
    let session = session::current(py)?;
    let (dtype, op) = parse(dtype, Some(op))?;
    let input = RawBuf::new(in_ptr, in_nbytes);
    let output = RawBuf::new(out_ptr, out_nbytes);
    py.detach(|| {
        // SAFETY: the caller keeps both tensors alive and untouched during the call; they are
        // distinct allocations.
        let (input, output) = unsafe { (input.as_slice(), output.as_mut_slice()) };
        session
            .comm()
            .reducescatter(name, input, output, &shape, dtype, op, prescale, postscale)
    })
    .py_err()
}

/// Blocks until every rank arrived.
#[pyfunction]
pub fn barrier(py: Python<'_>) -> PyResult<()> {
    let session = session::current(py)?;
    py.detach(|| session.comm().barrier()).py_err()
}

/// Adds the collectives to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(allreduce, m)?)?;
    m.add_function(wrap_pyfunction!(allgather, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast, m)?)?;
    m.add_function(wrap_pyfunction!(alltoall, m)?)?;
    m.add_function(wrap_pyfunction!(reducescatter, m)?)?;
    m.add_function(wrap_pyfunction!(barrier, m)?)?;
    Ok(())
}
