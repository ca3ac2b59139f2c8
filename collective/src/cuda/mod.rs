//! CUDA support: NCCL collectives on device memory, the batched pack/unpack kernel of fused
//! device buffers, and run-time discovery of the libraries.
//!
//! Everything that needs no GPU is plain Rust and always built: where libraries are looked
//! for ([`discover`]), kolo's dtypes and ops in NCCL's terms ([`mapping`]), the fusion-buffer
//! layout and copy segments ([`plan`]) and the kernel's source ([`kernel`]). With the `cuda`
//! feature the rest loads at run time — libcuda through cudarc (`dynamic-loading`), libnccl
//! and libnvrtc by path with libloading — so the build needs no CUDA toolkit and a machine
//! without a GPU simply reports that CUDA is unavailable ([`probe`]).
//!
//! These are wrappers only: the engine's device path (`engine/device/`), which runs the
//! engine's agreed batches of CUDA ops through them, lives with the engine.
//!
//! ```
//! let found = kolo_collective::cuda::probe();
//! if !kolo_collective::cuda::BUILT {
//!     assert!(!found.cuda_available() && !found.nccl_available());
//! }
//! ```

pub mod discover;
pub mod kernel;
pub mod mapping;
pub mod plan;

#[cfg(feature = "cuda")]
pub mod driver;
#[cfg(not(feature = "cuda"))]
/// Without the `cuda` feature: nothing to load.
pub mod driver {
    /// Always 0 without the `cuda` feature.
    pub fn physical_gpus() -> i32 {
        0
    }
}
#[cfg(feature = "cuda")]
mod dylib;
#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod pack;

/// A submitted tensor that lives on a CUDA device: the engine runs its collective through
/// NCCL on that device instead of the CPU transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTensor {
    /// The device's ordinal (as the framework numbers them in this process).
    pub ordinal: i32,
    /// A CUDA event (raw `CUevent`) recorded on the framework's stream when the op was
    /// submitted: the op waits for it. Owned by the submitter, alive until the handle
    /// completed.
    pub ready_event: u64,
}

/// True when kolo was built with the `cuda` feature.
pub const BUILT: bool = cfg!(feature = "cuda");

/// What was found at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The driver's CUDA version code and the machine's NVIDIA GPUs (counted without
    /// initializing CUDA, see [`driver::physical_gpus`]), or why it is unavailable.
    pub driver: Result<(i32, i32), String>,
    /// libnccl's path and version code, or why it is unavailable.
    pub nccl: Result<(String, i32), String>,
    /// libnvrtc's path and version, or why it is unavailable.
    pub nvrtc: Result<(String, String), String>,
}

impl Probe {
    /// CUDA tensors can be used: the driver loaded and sees at least one device.
    pub fn cuda_available(&self) -> bool {
        matches!(self.driver, Ok((_, devices)) if devices > 0)
    }

    /// NCCL collectives can run: CUDA is available and libnccl loaded.
    pub fn nccl_available(&self) -> bool {
        self.cuda_available() && self.nccl.is_ok()
    }

    /// Fused device buffers can be packed by the kernel: CUDA is available and NVRTC loaded.
    pub fn pack_kernel_available(&self) -> bool {
        self.cuda_available() && self.nvrtc.is_ok()
    }
}

/// Loads what it can (once per library) and reports what was found. Does not initialize
/// CUDA, so a process may still fork afterwards.
pub fn probe() -> Probe {
    #[cfg(feature = "cuda")]
    {
        let driver = driver::version()
            .map(|v| (v, driver::physical_gpus()))
            .map_err(|e| e.to_string());
        Probe {
            driver,
            nccl: nccl::library().map_err(|e| e.to_string()),
            nvrtc: nvrtc::library().map_err(|e| e.to_string()),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let why = "kolo was built without the `cuda` feature".to_owned();
        Probe {
            driver: Err(why.clone()),
            nccl: Err(why.clone()),
            nvrtc: Err(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_reported_available_without_a_driver() {
        let found = probe();
        let has_driver = std::path::Path::new("/proc/driver/nvidia/version").exists();
        if !has_driver {
            let why = found.driver.as_ref().unwrap_err();
            assert!(why.contains("libcuda") || why.contains("cuda"), "{why}");
            assert!(!found.cuda_available() && !found.nccl_available());
            assert!(!found.pack_kernel_available());
        }
        assert!(!found.nccl_available() || found.cuda_available());
        if !BUILT {
            assert!(found.nccl.is_err() && found.nvrtc.is_err());
        }
    }

    #[test]
    fn a_cpu_and_a_cuda_tensor_under_one_name_are_a_mismatch() {
        use crate::wire::{OpDescriptor, OpKind};
        let cpu = OpDescriptor {
            dtype: crate::DType::F32,
            shape: vec![4],
            op: Some(crate::ReduceOp::Sum),
            ..OpDescriptor::new(OpKind::Allreduce, "grad")
        };
        let gpu = OpDescriptor {
            device: true,
            ..cpu.clone()
        };
        assert_eq!(
            crate::collectives::difference(&gpu, 0, &gpu.clone(), 1),
            None
        );
        let message = crate::collectives::difference(&cpu, 0, &gpu, 1).unwrap();
        assert!(message.contains("rank 0 passes a CPU tensor but rank 1 passes a CUDA tensor"));
        let decoded = OpDescriptor::decode(&gpu.encode(), 2).unwrap();
        assert!(decoded.device, "the device flag survives the wire");
    }

    #[test]
    fn the_cuda_wrappers_do_not_reach_into_the_engine() {
        // The engine's device path (engine::device) calls these wrappers; an arrow back would
        // make the engine and the wrappers one circle again.
        // The run's CARGO_MANIFEST_DIR (cargo sets it), not the build's: a test binary that
        // cargo reuses from a checkout at another path would read that checkout's files.
        let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo test");
        let dir = std::path::Path::new(&manifest_dir).join("src/cuda");
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            files += 1;
            assert!(
                !text.contains(concat!("crate::", "engine")),
                "{} uses the engine",
                path.display()
            );
        }
        assert!(files > 5, "read {files} files of {}", dir.display());
    }
}
