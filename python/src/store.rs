//! Binding of kolo-store: `_native.Store` (one prefix in one backend, addressed by
//! store-relative keys) and `_native.resolve_store_url`. Every call that touches the store
//! releases the GIL and can be interrupted with Ctrl-C.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use kolo_store::bytes::Bytes;
use kolo_store::{Store, StoreOptions};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use crate::blocking::run_interruptibly;
use crate::error::{runtime_to_py, store_to_py};

/// How long Ctrl-C waits for a store request to stop before abandoning it.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// Store options from flat `storage_options` and a DBFS mount, each defaulted when absent.
pub(crate) fn store_options(
    storage_options: Option<HashMap<String, String>>,
    dbfs_mount: Option<PathBuf>,
) -> StoreOptions {
    let mut options = StoreOptions::default();
    if let Some(storage_options) = storage_options {
        options.storage_options = storage_options;
    }
    if let Some(dbfs_mount) = dbfs_mount {
        options.dbfs_mount = dbfs_mount;
    }
    options
}

/// Runs `future` on kolo's runtime without the GIL; maps both error layers to Python.
fn wait<T, F>(py: Python<'_>, future: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = kolo_store::Result<T>> + Send + 'static,
{
    run_interruptibly(py, STOP_GRACE, move |_stop| kolo_runtime::block_on(future))?
        .map_err(runtime_to_py)?
        .map_err(store_to_py)
}

/// `(key, size, e_tag, mtime_seconds)` of one listed object.
type ListedObject = (String, u64, Option<String>, f64);

/// One store prefix (`file:///…`, `s3://bucket/prefix`, …) and its client.
#[pyclass(name = "Store", module = "kolo._native", frozen)]
#[derive(Debug)]
pub struct PyStore {
    store: Store,
}

#[pymethods]
impl PyStore {
    /// Resolves `url` and builds its client (no request is made).
    #[new]
    #[pyo3(signature = (url, storage_options=None, dbfs_mount=None))]
    fn new(
        url: &str,
        storage_options: Option<HashMap<String, String>>,
        dbfs_mount: Option<PathBuf>,
    ) -> PyResult<Self> {
        let store =
            Store::open(url, &store_options(storage_options, dbfs_mount)).map_err(store_to_py)?;
        Ok(PyStore { store })
    }

    /// The canonical prefix URL.
    #[getter]
    fn url(&self) -> String {
        self.store.url().to_string()
    }

    /// The full URL of `rel`.
    fn url_of(&self, rel: &str) -> String {
        self.store.url_of(rel)
    }

    /// The local path of `rel` for local and DBFS stores, else None; StoreError when `rel`
    /// could leave the store root.
    fn local_path(&self, rel: &str) -> PyResult<Option<PathBuf>> {
        self.store.local_path(rel).map_err(store_to_py)
    }

    /// Writes `data` at `rel` atomically.
    fn put(&self, py: Python<'_>, rel: String, data: PyBackedBytes) -> PyResult<()> {
        let store = self.store.clone();
        let data = Bytes::from_owner(data);
        wait(py, async move { store.put_atomic(&rel, data).await })
    }

    /// Reads the whole object at `rel`.
    fn get<'py>(&self, py: Python<'py>, rel: String) -> PyResult<Bound<'py, PyBytes>> {
        let store = self.store.clone();
        let data = wait(py, async move { store.get(&rel).await })?;
        Ok(PyBytes::new(py, &data))
    }

    /// Whether `rel` is an object or a non-empty directory.
    fn exists(&self, py: Python<'_>, rel: String) -> PyResult<bool> {
        let store = self.store.clone();
        wait(py, async move { store.exists(&rel).await })
    }

    /// Every object under `rel` as `(key, size, e_tag, mtime_seconds)`, sorted by key.
    fn list(&self, py: Python<'_>, rel: String) -> PyResult<Vec<ListedObject>> {
        let store = self.store.clone();
        let objects = wait(py, async move { store.list(&rel).await })?;
        Ok(objects
            .into_iter()
            .map(|info| {
                let mtime = info
                    .last_modified
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                (info.rel, info.size, info.e_tag, mtime)
            })
            .collect())
    }

    /// Deletes `rel` and everything under it.
    fn delete(&self, py: Python<'_>, rel: String) -> PyResult<()> {
        let store = self.store.clone();
        wait(py, async move { store.delete(&rel).await })
    }

    /// Uploads the changed files of `local_dir` to `rel`; returns
    /// `(uploaded, unchanged, bytes_uploaded)`.
    fn sync_dir(
        &self,
        py: Python<'_>,
        local_dir: PathBuf,
        rel: String,
    ) -> PyResult<(Vec<String>, Vec<String>, u64)> {
        let store = self.store.clone();
        let report = wait(py, async move { store.sync_dir(&local_dir, &rel).await })?;
        Ok((report.uploaded, report.unchanged, report.bytes_uploaded))
    }

    fn __repr__(&self) -> String {
        format!("Store({:?})", self.store.url())
    }
}

/// The canonical URL a location resolves to, without building a client.
#[pyfunction]
#[pyo3(signature = (location, dbfs_mount=None))]
fn resolve_store_url(location: &str, dbfs_mount: Option<PathBuf>) -> PyResult<String> {
    Store::resolve_url(location, &store_options(None, dbfs_mount)).map_err(store_to_py)
}

/// Checks a run id (one plain path component); StoreError naming the id and the rule.
#[pyfunction]
fn check_run_id(run_id: &str) -> PyResult<()> {
    kolo_store::check_run_id(run_id)
        .map(|_| ())
        .map_err(store_to_py)
}

/// Adds this module's functions and classes to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStore>()?;
    m.add_function(wrap_pyfunction!(check_run_id, m)?)?;
    m.add_function(wrap_pyfunction!(resolve_store_url, m)?)?;
    Ok(())
}
