//! The batched pack/unpack kernel on a device: compiled by NVRTC for the device's exact
//! architecture on first use, then one launch per fused batch.

use std::ffi::{c_void, CString};

use cudarc::driver::result as cu;
use cudarc::driver::sys;

use super::driver::{copy_htod, CUstream, Device, DeviceBuffer, Event, PinnedBuffer};
use super::kernel::{compile_options, BLOCK_THREADS, KERNEL_NAME, MAX_BLOCKS, SOURCE};
use super::nvrtc;
use super::plan::{grid_blocks, Segment};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The loaded kernel and the segment table it reads.
#[derive(Debug)]
pub struct Packer {
    module: sys::CUmodule,
    function: sys::CUfunction,
    table: DeviceBuffer,
    staging: PinnedBuffer,
    /// Recorded after the last table upload: the staging buffer is free again once it passed.
    uploaded: Event,
}

// SAFETY: module and function handles are plain values valid in the device's primary context.
unsafe impl Send for Packer {}

const STAGING_SEGMENTS: usize = 1 << 16;

impl Packer {
    /// Compiles and loads the kernel for `device` (whose context must be current).
    pub fn new(device: &Device) -> Result<Packer> {
        let (major, minor) = device.capability;
        let mut cubin = nvrtc::compile(SOURCE, "kolo_pack.cu", &compile_options(major, minor))?;
        cubin.push(0);
        // SAFETY: `cubin` is a complete CUBIN image for this device.
        let module = unsafe { cu::module::load_data(cubin.as_ptr().cast()) }
            .map_err(|e| Error::Cuda(format!("cuModuleLoadData (pack kernel) failed: {e}")))?;
        let name = CString::new(KERNEL_NAME).map_err(|e| Error::Internal(e.to_string()))?;
        // SAFETY: `module` was just loaded and exports the kernel.
        let function = unsafe { cu::module::get_function(module, name) }
            .map_err(|e| Error::Cuda(format!("cuModuleGetFunction({KERNEL_NAME}) failed: {e}")))?;
        let uploaded = Event::new()?;
        Ok(Packer {
            module,
            function,
            table: DeviceBuffer::default(),
            staging: PinnedBuffer::new(STAGING_SEGMENTS * std::mem::size_of::<Segment>())?,
            uploaded,
        })
    }

    /// Enqueues the copies `segments` on `stream`, scaling elements of `dtype` by `factor`.
    ///
    /// # Safety
    /// Every segment must name device memory of the current context that stays valid until
    /// the work on `stream` ran.
    pub unsafe fn run(
        &mut self,
        segments: &[Segment],
        dtype: DType,
        factor: f64,
        stream: CUstream,
    ) -> Result<()> {
        for batch in segments.chunks(STAGING_SEGMENTS) {
            // The previous upload must have left the staging buffer before it is rewritten.
            self.uploaded
                .wait(std::time::Duration::from_secs(60), "the pack table upload")?;
            let bytes: &[u8] = bytemuck_segments(batch);
            let staging = &mut self.staging.as_mut_slice()[..bytes.len()];
            staging.copy_from_slice(bytes);
            let table = self.table.reserve(bytes.len())?;
            // SAFETY: `table` holds `bytes.len()` bytes; `staging` is pinned and kept until
            // `uploaded` passes.
            unsafe { copy_htod(table, staging, stream)? };
            // SAFETY: `stream` is the caller's live stream.
            unsafe { self.uploaded.record(stream)? };
            let mut table_arg = table;
            let mut count = i32::try_from(batch.len()).unwrap_or(i32::MAX);
            let mut code = dtype as i32;
            let mut scale = factor;
            let mut params: [*mut c_void; 4] = [
                (&raw mut table_arg).cast(),
                (&raw mut count).cast(),
                (&raw mut code).cast(),
                (&raw mut scale).cast(),
            ];
            let grid = grid_blocks(batch.len(), MAX_BLOCKS);
            // SAFETY: the parameters match the kernel's signature; the caller guarantees the
            // segments' memory.
            unsafe {
                cu::launch_kernel(
                    self.function,
                    (grid, 1, 1),
                    (BLOCK_THREADS, 1, 1),
                    0,
                    stream,
                    &mut params,
                )
            }
            .map_err(|e| Error::Cuda(format!("cuLaunchKernel({KERNEL_NAME}) failed: {e}")))?;
        }
        Ok(())
    }
}

fn bytemuck_segments(segments: &[Segment]) -> &[u8] {
    // SAFETY: `Segment` is `repr(C)` of three u64 (no padding); any bytes are readable.
    unsafe { std::slice::from_raw_parts(segments.as_ptr().cast(), std::mem::size_of_val(segments)) }
}

impl Drop for Packer {
    fn drop(&mut self) {
        // SAFETY: loaded in `new`, unloaded once.
        if let Err(e) = unsafe { cu::module::unload(self.module) } {
            log::warn!("cuModuleUnload failed: {e}");
        }
    }
}
