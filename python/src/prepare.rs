//! Binding of `kolo.data.prepare_data`: Parquet/CSV paths or an Arrow C stream (pyarrow
//! Table, pandas via pyarrow) prepared into a store, with the GIL released throughout.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kolo_estimator::prepare::{self, PrepareOptions, PreparedData, Source, Validation};
use kolo_store::Store;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

use crate::blocking::run_interruptibly;
use crate::error::{data_to_py, runtime_to_py, store_to_py, to_py};
use crate::store::store_options;

/// How long a preparation may take to notice Ctrl-C before it is abandoned.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The options `kolo.data.prepare_data` passes as a dict (every key present).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct Request {
    feature_columns: Vec<String>,
    label_columns: Vec<String>,
    sample_weight_col: Option<String>,
    validation_ratio: Option<f64>,
    validation_column: Option<String>,
    num_processes: usize,
    partitions_per_process: usize,
    dataset_idx: Option<usize>,
    seed: u64,
    compression: String,
    overwrite: bool,
}

impl Request {
    fn into_options(self) -> PrepareOptions {
        let validation = match (self.validation_column, self.validation_ratio) {
            (Some(column), _) => Some(Validation::Column(column)),
            (None, Some(ratio)) => Some(Validation::Ratio(ratio)),
            (None, None) => None,
        };
        PrepareOptions {
            feature_columns: self.feature_columns,
            label_columns: self.label_columns,
            sample_weight_col: self.sample_weight_col,
            validation,
            num_processes: self.num_processes,
            partitions_per_process: self.partitions_per_process,
            dataset_idx: self.dataset_idx,
            seed: self.seed,
            compression: self.compression,
            overwrite: self.overwrite,
        }
    }
}

/// Prepares `source_paths` (or the Arrow C stream in `source_stream`, a PyCapsule named
/// `arrow_array_stream`) into the store at `store_prefix`; returns what was written as a dict.
#[pyfunction]
#[pyo3(signature = (store_prefix, storage_options, request, source_paths=None, source_stream=None))]
fn prepare_data<'py>(
    py: Python<'py>,
    store_prefix: String,
    storage_options: Option<HashMap<String, String>>,
    request: Request,
    source_paths: Option<Vec<String>>,
    source_stream: Option<Bound<'py, PyCapsule>>,
) -> PyResult<Bound<'py, PyDict>> {
    let store_options = store_options(storage_options, None);
    let source = match (source_paths, source_stream) {
        (Some(paths), None) => Source::Paths {
            paths,
            options: store_options.clone(),
        },
        (None, Some(capsule)) => {
            let pointer = capsule.pointer_checked(Some(c"arrow_array_stream"))?;
            // SAFETY: a capsule named "arrow_array_stream" holds a valid ArrowArrayStream
            // (the Arrow PyCapsule protocol); `from_arrow_c_stream` moves it out and leaves a
            // released stream, which the capsule's destructor then skips.
            unsafe { Source::from_arrow_c_stream(pointer.as_ptr()) }.map_err(data_to_py)?
        }
        _ => {
            return Err(to_py(kolo_collective::Error::InvalidArgument(
                "pass exactly one of source_paths and source_stream".into(),
            )))
        }
    };
    let store = Store::open(&store_prefix, &store_options).map_err(store_to_py)?;
    let options = request.into_options();
    let prepared = run_interruptibly(py, STOP_GRACE, move |stop| {
        kolo_runtime::block_on(until_stopped(
            stop,
            prepare::prepare_data(&store, source, &options),
        ))
    })?;
    let prepared = prepared.map_err(runtime_to_py)?;
    match prepared {
        Some(result) => to_dict(py, result.map_err(data_to_py)?),
        // Stopped by Ctrl-C (run_interruptibly normally raises KeyboardInterrupt first).
        None => Err(pyo3::exceptions::PyKeyboardInterrupt::new_err(
            "prepare_data was interrupted",
        )),
    }
}

/// Runs `work` until it ends or `stop` is set (then drops it, cancelling its I/O).
async fn until_stopped<T>(stop: Arc<AtomicBool>, work: impl Future<Output = T>) -> Option<T> {
    let watch = async {
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        result = work => Some(result),
        () = watch => None,
    }
}

/// The result as the dict `kolo.data.prepare` turns into `PreparedData`.
fn to_dict(py: Python<'_>, prepared: PreparedData) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("dataset_idx", prepared.dataset_idx)?;
    out.set_item("train_path", prepared.train_url)?;
    out.set_item("val_path", prepared.val_url)?;
    out.set_item("train_rows", prepared.train_rows)?;
    out.set_item("val_rows", prepared.val_rows)?;
    out.set_item("num_files", prepared.train_files)?;
    out.set_item("val_num_files", prepared.val_files)?;
    let columns = prepared
        .columns
        .into_iter()
        .map(|c| {
            let shape = PyTuple::new(py, c.shape)?;
            Ok((c.name, c.dtype, shape))
        })
        .collect::<PyResult<Vec<_>>>()?;
    out.set_item("columns", columns)?;
    Ok(out)
}

/// Adds this module's functions and classes to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(prepare_data, m)?)?;
    Ok(())
}
