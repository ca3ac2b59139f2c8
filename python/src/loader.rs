//! Binding of the loader and the dataset metadata of kolo's data path
//! (`kolo.data.ParquetLoader`, `kolo.data.read_metadata`).
//!
//! Batches cross as `BufferView`s: each owns one native batch buffer and exposes it through
//! `__array_interface__`, so `numpy.asarray(view)` is a zero-copy view kept alive by the view.

use std::collections::HashMap;
use std::time::Duration;

use kolo_estimator::loader::{BatchView, Loader, LoaderOptions, LoaderState, Next};
use kolo_estimator::metadata::Dataset;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::blocking::run_interruptibly;
use crate::error::{data_to_py, to_py};
use crate::store::store_options;

/// How long opening a dataset may take to notice Ctrl-C before it is abandoned.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How often a waiting `next_batch` looks for Ctrl-C.
const POLL: Duration = Duration::from_millis(100);

fn invalid(message: String) -> PyErr {
    to_py(kolo_collective::Error::InvalidArgument(message))
}

/// One buffer of a batch (a view of its shuffle window or its own buffer), kept alive here;
/// `numpy.asarray(view)` views it without a copy.
#[pyclass(name = "BufferView", module = "kolo._native", frozen)]
#[derive(Debug)]
pub struct BufferView {
    view: BatchView,
}

#[pymethods]
impl BufferView {
    /// numpy's array interface (version 3): address, dtype, shape and strides.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let view = &self.view;
        let [rows, cols] = view.shape();
        let [row_stride, col_stride] = view.strides();
        let interface = PyDict::new(py);
        interface.set_item("version", 3)?;
        interface.set_item("data", (view.address(), false))?;
        interface.set_item("typestr", view.dtype().typestr())?;
        interface.set_item("shape", (rows, cols))?;
        interface.set_item("strides", (row_stride, col_stride))?;
        Ok(interface)
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.view.byte_len()
    }
}

/// The native loader under `kolo.data.ParquetLoader`.
#[pyclass(name = "ParquetLoaderCore", module = "kolo._native")]
#[derive(Debug)]
pub struct ParquetLoaderCore {
    loader: Loader,
}

#[pymethods]
impl ParquetLoaderCore {
    #[new]
    #[pyo3(signature = (
        dataset, columns, batch_size, rank, size, shuffle, seed, drop_last, prefetch,
        storage_options=None, shuffle_buffer_size=None, num_threads=None, num_epochs=None,
        stack=false
    ))]
    #[expect(
        clippy::too_many_arguments,
        reason = "mirrors the keyword arguments of ParquetLoader"
    )]
    fn new(
        py: Python<'_>,
        dataset: String,
        columns: Vec<String>,
        batch_size: i64,
        rank: i64,
        size: i64,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
        prefetch: i64,
        storage_options: Option<HashMap<String, String>>,
        shuffle_buffer_size: Option<i64>,
        num_threads: Option<i64>,
        num_epochs: Option<i64>,
        stack: bool,
    ) -> PyResult<Self> {
        let positive = |name: &str, value: i64| -> PyResult<u64> {
            u64::try_from(value)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| invalid(format!("{name}={value} must be a positive integer")))
        };
        let batch_size = positive("batch_size", batch_size)?;
        let size = u32::try_from(positive("size", size)?)
            .map_err(|_| invalid(format!("size={size} is too large")))?;
        let rank = u32::try_from(rank)
            .map_err(|_| invalid(format!("rank={rank} must be in 0..size-1")))?;
        let prefetch = positive("prefetch", prefetch)? as usize;
        let shuffle_buffer_size = shuffle_buffer_size
            .map(|v| positive("shuffle_buffer_size", v))
            .transpose()?;
        let num_threads = num_threads
            .map(|v| positive("num_threads", v).map(|v| v as usize))
            .transpose()?;
        let num_epochs = num_epochs
            .map(|v| u64::try_from(v).map_err(|_| invalid(format!("num_epochs={v} must be >= 0"))))
            .transpose()?;
        let options = LoaderOptions {
            columns,
            batch_size,
            rank,
            size,
            shuffle,
            seed,
            drop_last,
            prefetch,
            shuffle_buffer_size,
            num_threads,
            num_epochs,
            stack,
        };
        let store_options = store_options(storage_options, None);
        let loader = run_interruptibly(py, STOP_GRACE, move |_stop| {
            Loader::open(&Dataset::open(&dataset, &store_options)?, options)
        })?
        .map_err(data_to_py)?;
        Ok(Self { loader })
    }

    /// The next batch as a tuple of `BufferView`s (one per entry of `layout`), or None at
    /// the end of an epoch (and once `finished`). Waits without the GIL; Ctrl-C raises.
    fn next_batch<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        loop {
            let loader = &mut self.loader;
            match py.detach(|| loader.next(POLL)).map_err(data_to_py)? {
                Next::Batch(batch) => {
                    let views = batch
                        .buffers
                        .into_iter()
                        .map(|view| Bound::new(py, BufferView { view }))
                        .collect::<PyResult<Vec<_>>>()?;
                    return PyTuple::new(py, views).map(Some);
                }
                Next::EndOfEpoch(_) | Next::Finished => return Ok(None),
                Next::Pending => py.check_signals()?,
            }
        }
    }

    /// The buffers of every batch: `(column names, dtype, array length or None)`; None
    /// means the buffer stacks scalar columns as `[columns, rows]`, a length means one array
    /// column as `[rows, length]`.
    #[getter]
    fn layout(&self) -> Vec<(Vec<String>, &'static str, Option<usize>)> {
        self.loader
            .groups()
            .iter()
            .map(|g| (g.names.clone(), g.dtype.name(), g.array_len))
            .collect()
    }

    /// The index in `layout` of the group handed out row-major as `[rows, columns]` (with
    /// `stack=True`), or None.
    #[getter]
    fn stack_group(&self) -> Option<usize> {
        self.loader.stack_group()
    }

    /// The dataset's URL.
    #[getter]
    fn url(&self) -> &str {
        self.loader.url()
    }

    /// Batches per full epoch (the same on every rank).
    #[getter]
    fn batches_per_epoch(&self) -> u64 {
        self.loader.batches_per_epoch()
    }

    /// Bytes the loader has written since it was opened (decoded, decompressed or fetched
    /// values, shuffle windows gathered, batches copied across two windows): one pass per
    /// gathered row for plain, uncompressed local files.
    #[getter]
    fn bytes_copied(&self) -> u64 {
        self.loader.bytes_copied()
    }

    /// Rows this rank hands out per full epoch.
    #[getter]
    fn rows_per_epoch(&self) -> u64 {
        self.loader.rows_per_epoch()
    }

    /// The epoch the next batch belongs to.
    #[getter]
    fn epoch(&self) -> u64 {
        self.loader.epoch()
    }

    /// Rows of the current epoch handed out so far.
    #[getter]
    fn offset(&self) -> u64 {
        self.loader.offset()
    }

    /// Rows per shuffle window.
    #[getter]
    fn shuffle_buffer_size(&self) -> u64 {
        self.loader.shuffle_buffer_size()
    }

    /// Whether all `num_epochs` epochs are done.
    #[getter]
    fn finished(&self) -> bool {
        self.loader.finished()
    }

    /// The position as JSON (see `LoaderState`).
    fn state_json(&self) -> PyResult<String> {
        Ok(self.loader.state().to_json())
    }

    /// Continues from a position saved by `state_json` (this or another rank or size).
    fn load_state_json(&mut self, py: Python<'_>, state: &str) -> PyResult<()> {
        let state = LoaderState::from_json(state).map_err(data_to_py)?;
        let loader = &mut self.loader;
        py.detach(|| loader.load_state(&state)).map_err(data_to_py)
    }

    /// Stops the background threads now (they also stop when the loader is collected).
    fn close(&mut self, py: Python<'_>) {
        let loader = &mut self.loader;
        py.detach(|| loader.stop());
    }
}

/// The metadata of the dataset at `path` as JSON (cached beside the data).
#[pyfunction]
#[pyo3(signature = (path, storage_options=None))]
fn read_metadata_json(
    py: Python<'_>,
    path: String,
    storage_options: Option<HashMap<String, String>>,
) -> PyResult<String> {
    let options = store_options(storage_options, None);
    let metadata = run_interruptibly(py, STOP_GRACE, move |_stop| {
        Dataset::open(&path, &options).and_then(|dataset| dataset.metadata())
    })?
    .map_err(data_to_py)?;
    Ok(metadata.to_json())
}

/// Adds this module's functions and classes to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ParquetLoaderCore>()?;
    m.add_class::<BufferView>()?;
    m.add_function(wrap_pyfunction!(read_metadata_json, m)?)?;
    Ok(())
}
