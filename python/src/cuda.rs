//! CUDA for `kolo._cuda` and `kolo.torch`: what was found at run time, and (feature `cuda`)
//! one device's NCCL collectives and batched copy kernel on raw device pointers and streams.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Adds `site-packages` directories to search for the `nvidia-*` wheels' libraries.
fn cuda_add_site_packages(dirs: Vec<String>) {
    let dirs: Vec<PathBuf> = dirs.into_iter().map(PathBuf::from).collect();
    kolo_collective::cuda::discover::add_site_packages(&dirs);
}

/// What was found: `built`, `cuda`, `nccl`, `pack_kernel` (booleans), the driver's version
/// and device count, the libraries' paths and versions, and `*_error` for what is missing.
#[pyfunction]
pub fn cuda_probe(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let found = py.detach(kolo_collective::cuda::probe);
    let d = PyDict::new(py);
    d.set_item("built", kolo_collective::cuda::BUILT)?;
    d.set_item("cuda", found.cuda_available())?;
    d.set_item("nccl", found.nccl_available())?;
    d.set_item("pack_kernel", found.pack_kernel_available())?;
    match &found.driver {
        Ok((version, devices)) => {
            d.set_item("driver_version", version)?;
            d.set_item("devices", devices)?;
            if *devices == 0 {
                d.set_item("cuda_error", "the NVIDIA driver is installed but lists no GPU (/proc/driver/nvidia/gpus is empty)")?;
            }
        }
        Err(e) => d.set_item("cuda_error", e)?,
    }
    match &found.nccl {
        Ok((path, version)) => {
            d.set_item("nccl_path", path)?;
            d.set_item(
                "nccl_version",
                kolo_collective::cuda::mapping::version_string(*version),
            )?;
        }
        Err(e) => d.set_item("nccl_error", e)?,
    }
    match &found.nvrtc {
        Ok((path, version)) => {
            d.set_item("nvrtc_path", path)?;
            d.set_item("nvrtc_version", version)?;
        }
        Err(e) => d.set_item("nvrtc_error", e)?,
    }
    Ok(d)
}

#[cfg(feature = "cuda")]
mod device {
    use std::sync::{Mutex, MutexGuard};

    use kolo_collective::cuda::driver::Event;
    use kolo_collective::cuda::gpu::{DevicePtr, Gpu as Inner};
    use kolo_collective::cuda::nccl::UniqueId;
    use kolo_collective::cuda::plan::{push_split, Segment};
    use kolo_collective::{DType, Error, ReduceOp};
    use pyo3::prelude::*;
    use pyo3::types::PyBytes;

    use crate::error::IntoPyResult;

    /// A fresh NCCL unique id (128 bytes) for rank 0 to hand to every rank.
    #[pyfunction]
    pub fn nccl_unique_id(py: Python<'_>) -> PyResult<Bound<'_, PyBytes>> {
        let id = UniqueId::new().py_err()?;
        Ok(PyBytes::new(py, &id.0))
    }

    /// Work enqueued on the GPU: passes once the result is ready.
    #[pyclass(name = "GpuEvent", module = "kolo._native")]
    #[derive(Debug)]
    pub struct GpuEvent(Mutex<Event>);

    #[pymethods]
    impl GpuEvent {
        /// True once the work finished.
        fn done(&self) -> PyResult<bool> {
            lock(&self.0).done().py_err()
        }

        /// Waits (without the GIL) up to `timeout` seconds for the work.
        fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
            let timeout = crate::job::timeout_seconds("timeout", timeout)?;
            let event = lock(&self.0);
            py.detach(|| event.wait(timeout, "a collective")).py_err()
        }
    }

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn event(e: Event) -> GpuEvent {
        GpuEvent(Mutex::new(e))
    }

    fn views(ptrs: &[u64], sizes: &[usize]) -> PyResult<Vec<DevicePtr>> {
        if ptrs.len() != sizes.len() {
            return Err(crate::error::to_py(Error::InvalidArgument(format!(
                "{} pointers but {} sizes",
                ptrs.len(),
                sizes.len()
            ))));
        }
        Ok(ptrs
            .iter()
            .zip(sizes)
            .map(|(&ptr, &bytes)| DevicePtr { ptr, bytes })
            .collect())
    }

    fn parse(dtype: &str) -> PyResult<DType> {
        dtype.parse::<DType>().py_err()
    }

    /// One CUDA device's collectives on raw device pointers (see `kolo.torch.nccl`). Every
    /// method takes the framework's current stream (`torch.cuda.current_stream().cuda_stream`)
    /// and returns a `GpuEvent`; the framework's stream already waits for the result.
    #[pyclass(name = "Gpu", module = "kolo._native")]
    #[derive(Debug)]
    pub struct Gpu(Mutex<Inner>);

    #[pymethods]
    impl Gpu {
        #[new]
        fn new(ordinal: i32) -> PyResult<Self> {
            Ok(Gpu(Mutex::new(Inner::open(ordinal).py_err()?)))
        }

        /// kolo's stream on this device (a raw `cudaStream_t`).
        fn stream(&self) -> u64 {
            lock(&self.0).stream()
        }

        /// Joins NCCL communicator `unique_id` as `rank` of `size` (blocks until every rank
        /// joined; the GIL is released).
        fn connect(
            &self,
            py: Python<'_>,
            unique_id: Vec<u8>,
            rank: usize,
            size: usize,
        ) -> PyResult<()> {
            let id = UniqueId::from_bytes(&unique_id).py_err()?;
            py.detach(|| lock(&self.0).connect(&id, rank, size))
                .py_err()
        }

        /// Fused in-place allreduce of the tensors at `ptrs` (`sizes` bytes each, one dtype).
        #[allow(clippy::too_many_arguments, reason = "the collective's arguments")]
        fn allreduce(
            &self,
            ptrs: Vec<u64>,
            sizes: Vec<usize>,
            dtype: &str,
            op: &str,
            prescale: f64,
            postscale: f64,
            stream: u64,
        ) -> PyResult<GpuEvent> {
            let tensors = views(&ptrs, &sizes)?;
            let op = op.parse::<ReduceOp>().py_err()?;
            // SAFETY: `kolo.torch.nccl` passes live CUDA tensors of this device and keeps them
            // referenced until the event passed.
            let e = unsafe {
                lock(&self.0).allreduce(&tensors, parse(dtype)?, op, prescale, postscale, stream)
            };
            Ok(event(e.py_err()?))
        }

        /// In-place broadcast from `root`.
        fn broadcast(
            &self,
            ptr: u64,
            size: usize,
            dtype: &str,
            root: usize,
            stream: u64,
        ) -> PyResult<GpuEvent> {
            let t = DevicePtr { ptr, bytes: size };
            // SAFETY: as in `allreduce`.
            let e = unsafe { lock(&self.0).broadcast(t, parse(dtype)?, root, stream) };
            Ok(event(e.py_err()?))
        }

        /// Allgather of `counts[r]` elements per rank into `recv`.
        #[allow(clippy::too_many_arguments, reason = "the collective's arguments")]
        fn allgather(
            &self,
            send: u64,
            send_size: usize,
            counts: Vec<usize>,
            recv: u64,
            recv_size: usize,
            dtype: &str,
            stream: u64,
        ) -> PyResult<GpuEvent> {
            let (s, r) = (
                DevicePtr {
                    ptr: send,
                    bytes: send_size,
                },
                DevicePtr {
                    ptr: recv,
                    bytes: recv_size,
                },
            );
            // SAFETY: as in `allreduce`.
            let e = unsafe { lock(&self.0).allgather(s, &counts, r, parse(dtype)?, stream) };
            Ok(event(e.py_err()?))
        }

        /// Reducescatter of `send` (`counts[r]` elements per rank) into `recv`.
        #[allow(clippy::too_many_arguments, reason = "the collective's arguments")]
        fn reducescatter(
            &self,
            send: u64,
            send_size: usize,
            counts: Vec<usize>,
            recv: u64,
            recv_size: usize,
            dtype: &str,
            op: &str,
            prescale: f64,
            postscale: f64,
            stream: u64,
        ) -> PyResult<GpuEvent> {
            let (s, r) = (
                DevicePtr {
                    ptr: send,
                    bytes: send_size,
                },
                DevicePtr {
                    ptr: recv,
                    bytes: recv_size,
                },
            );
            let op = op.parse::<ReduceOp>().py_err()?;
            // SAFETY: as in `allreduce`.
            let e = unsafe {
                lock(&self.0).reducescatter(
                    s,
                    &counts,
                    r,
                    parse(dtype)?,
                    op,
                    prescale,
                    postscale,
                    stream,
                )
            };
            Ok(event(e.py_err()?))
        }

        /// Alltoall with element counts per peer.
        #[allow(clippy::too_many_arguments, reason = "the collective's arguments")]
        fn alltoall(
            &self,
            send: u64,
            send_size: usize,
            send_counts: Vec<usize>,
            recv: u64,
            recv_size: usize,
            recv_counts: Vec<usize>,
            dtype: &str,
            stream: u64,
        ) -> PyResult<GpuEvent> {
            let (s, r) = (
                DevicePtr {
                    ptr: send,
                    bytes: send_size,
                },
                DevicePtr {
                    ptr: recv,
                    bytes: recv_size,
                },
            );
            // SAFETY: as in `allreduce`.
            let e = unsafe {
                lock(&self.0).alltoall(s, &send_counts, r, &recv_counts, parse(dtype)?, stream)
            };
            Ok(event(e.py_err()?))
        }

        /// One launch of the batched copy kernel: `sizes[i]` bytes from `srcs[i]` to
        /// `dsts[i]`, elements of `dtype` scaled by `factor`.
        fn batched_copy(
            &self,
            srcs: Vec<u64>,
            dsts: Vec<u64>,
            sizes: Vec<usize>,
            dtype: &str,
            factor: f64,
            stream: u64,
        ) -> PyResult<GpuEvent> {
            if srcs.len() != dsts.len() || srcs.len() != sizes.len() {
                return Err(crate::error::to_py(Error::InvalidArgument(
                    "batched_copy needs as many sources, destinations and sizes".into(),
                )));
            }
            let mut segs: Vec<Segment> = Vec::new();
            for ((&s, &d), &n) in srcs.iter().zip(&dsts).zip(&sizes) {
                push_split(&mut segs, s, d, n as u64);
            }
            // SAFETY: as in `allreduce`.
            let e = unsafe { lock(&self.0).batched_copy(&segs, parse(dtype)?, factor, stream) };
            Ok(event(e.py_err()?))
        }
    }
}

/// The device part of a submission: `None` for a CPU tensor (`device < 0`); for a CUDA tensor
/// an error unless this build has the `cuda` feature and the op is an allreduce or broadcast
/// of a dtype NCCL carries (the others take the host-staged path in `kolo.torch.ops`).
pub fn device_submission(
    kind: kolo_collective::wire::OpKind,
    dtype: kolo_collective::DType,
    device: i32,
    ready_event: u64,
) -> PyResult<Option<kolo_collective::cuda::DeviceTensor>> {
    use kolo_collective::wire::OpKind;
    use kolo_collective::{DType, Error};
    if device < 0 {
        return Ok(None);
    }
    let refuse = |why: String| Err(crate::error::to_py(Error::InvalidArgument(why)));
    if !kolo_collective::cuda::BUILT {
        return refuse(
            "this kolo was built without the `cuda` feature; stage CUDA tensors through the host"
                .into(),
        );
    }
    if !matches!(kind, OpKind::Allreduce | OpKind::Broadcast) {
        return refuse(format!(
            "{kind} of CUDA tensors takes the host-staged path, not NCCL"
        ));
    }
    if dtype == DType::I16 || ready_event == 0 {
        return refuse(format!(
            "a CUDA {kind} needs a dtype NCCL carries (not int16) and a ready event (got {ready_event})"
        ));
    }
    Ok(Some(kolo_collective::cuda::DeviceTensor {
        ordinal: device,
        ready_event,
    }))
}

/// The directories of `sys.path`: where the `nvidia-*` wheels of this interpreter live.
fn python_path(py: Python<'_>) -> PyResult<Vec<String>> {
    py.import("sys")?.getattr("path")?.extract()
}

/// Adds the CUDA functions (and, with the `cuda` feature, the `Gpu` class) to the module,
/// and makes the library search look in this interpreter's `sys.path` (so torch's
/// `nvidia-nccl` wheel is found before anything is loaded).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    if let Ok(dirs) = python_path(m.py()) {
        cuda_add_site_packages(dirs.into_iter().filter(|d| !d.is_empty()).collect());
    }
    m.add_function(wrap_pyfunction!(cuda_probe, m)?)?;
    #[cfg(feature = "cuda")]
    {
        m.add_function(wrap_pyfunction!(device::nccl_unique_id, m)?)?;
        m.add_class::<device::Gpu>()?;
        m.add_class::<device::GpuEvent>()?;
    }
    Ok(())
}
