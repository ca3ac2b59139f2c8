//! `kolo.ray.RayExecutor`'s native pieces: placement planning (wrappers over
//! `kolo-ray-bridge`). Registration and fail-fast use the launcher-neutral `crate::job`.

use kolo_ray_bridge::{layout, ActorLocation, PlacementPlan, PlacementRequest};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::ray_to_py;

/// Checks the executor's arguments (Horovod's rules) and plans its placement group: a dict with
/// `strategy` (`"PACK"`/`"STRICT_SPREAD"`), `bundles` (Ray bundle dicts), `worker_bundles`
/// (bundle index per worker), `cpus_per_worker`, `gpus_per_worker` and `description`.
#[pyfunction]
#[pyo3(signature = (num_workers, num_hosts, num_workers_per_host, cpus_per_worker, use_gpu, gpus_per_worker))]
fn ray_plan<'py>(
    py: Python<'py>,
    num_workers: Option<u32>,
    num_hosts: Option<u32>,
    num_workers_per_host: u32,
    cpus_per_worker: f64,
    use_gpu: bool,
    gpus_per_worker: Option<f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let plan = PlacementPlan::new(&PlacementRequest {
        num_workers,
        num_hosts,
        num_workers_per_host,
        cpus_per_worker,
        use_gpu,
        gpus_per_worker,
    })
    .map_err(|err| ray_to_py(py, err))?;
    let bundles = plan
        .bundles
        .iter()
        .map(|bundle| {
            let dict = PyDict::new(py);
            dict.set_item("CPU", bundle.cpus)?;
            if bundle.gpus > 0.0 {
                dict.set_item("GPU", bundle.gpus)?;
            }
            Ok(dict)
        })
        .collect::<PyResult<Vec<_>>>()?;
    let out = PyDict::new(py);
    out.set_item("strategy", plan.strategy.as_ray())?;
    out.set_item("bundles", bundles)?;
    out.set_item("worker_bundles", plan.worker_bundles.clone())?;
    out.set_item("cpus_per_worker", plan.cpus_per_worker)?;
    out.set_item("gpus_per_worker", plan.gpus_per_worker)?;
    out.set_item("description", plan.describe())?;
    Ok(out)
}

/// Lays out placed actors, given `(node_id, gpu_ids)` per actor in creation order: one dict per
/// actor with `task_index` (consecutive per node; the rank it gets), `node_index`,
/// `local_rank`, `local_size` and `cuda_visible_devices` (None without GPUs).
#[pyfunction]
fn ray_layout<'py>(
    py: Python<'py>,
    actors: Vec<(String, Vec<String>)>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let actors: Vec<ActorLocation> = actors
        .into_iter()
        .map(|(node_id, gpu_ids)| ActorLocation { node_id, gpu_ids })
        .collect();
    layout(&actors)
        .into_iter()
        .map(|worker| {
            let dict = PyDict::new(py);
            dict.set_item("task_index", worker.task_index)?;
            dict.set_item("node_index", worker.node_index)?;
            dict.set_item("local_rank", worker.local_rank)?;
            dict.set_item("local_size", worker.local_size)?;
            dict.set_item("cuda_visible_devices", worker.cuda_visible_devices)?;
            Ok(dict)
        })
        .collect()
}

/// Adds the Ray functions to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ray_plan, m)?)?;
    m.add_function(wrap_pyfunction!(ray_layout, m)?)?;
    Ok(())
}
