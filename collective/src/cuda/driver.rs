//! The CUDA driver through cudarc (`dynamic-loading`: libcuda.so.1 is opened at run time):
//! the device's primary context (the one torch uses, so its pointers are valid here),
//! streams, events, device and pinned host memory.

use std::time::{Duration, Instant};

use cudarc::driver::result as cu;
use cudarc::driver::sys;

use crate::error::{Error, Result};

pub use sys::{CUevent, CUstream};

fn err(call: &str) -> impl Fn(cu::DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("{call} failed: {e}"))
}

/// What the loaded driver offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    /// `cuDriverGetVersion` (`12040` is CUDA 12.4).
    pub version: i32,
    /// Visible devices.
    pub devices: i32,
}

/// Loads libcuda (once) and reads its CUDA version, without initializing CUDA (so a process
/// that asks may still fork).
pub fn version() -> Result<i32> {
    // SAFETY: probing the library has no preconditions.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Cuda(
            "libcuda.so.1 (the NVIDIA driver) could not be loaded: this machine has no NVIDIA \
             driver, or the library is not on the loader's path"
                .into(),
        ));
    }
    let mut version = 0;
    // SAFETY: one valid out-pointer; cuDriverGetVersion needs no cuInit.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(err("cuDriverGetVersion"))?;
    Ok(version)
}

/// Loads libcuda (once), initializes it and counts the devices this process sees.
pub fn init() -> Result<DriverInfo> {
    let version = version()?;
    cu::init().map_err(err("cuInit"))?;
    let devices = cu::device::get_count().map_err(err("cuDeviceGetCount"))?;
    Ok(DriverInfo { version, devices })
}

/// NVIDIA GPUs the kernel driver knows (entries of `/proc/driver/nvidia/gpus`): counted
/// without initializing CUDA, and before `CUDA_VISIBLE_DEVICES` narrows the view.
pub fn physical_gpus() -> i32 {
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|d| i32::try_from(d.count()).unwrap_or(i32::MAX))
        .unwrap_or(0)
}

/// One device with its primary context retained.
#[derive(Debug)]
pub struct Device {
    ordinal: i32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sms: i32,
}

// SAFETY: a primary context may be made current on any thread; the handles are plain values.
unsafe impl Send for Device {}
// SAFETY: see `Send`; `Device` has no interior mutability.
unsafe impl Sync for Device {}

impl Device {
    /// Device `ordinal` (as torch numbers them), its primary context made current here.
    pub fn open(ordinal: i32) -> Result<Device> {
        let info = init()?;
        if ordinal < 0 || ordinal >= info.devices {
            return Err(Error::InvalidArgument(format!(
                "CUDA device {ordinal} does not exist; this process sees {} device(s) (check CUDA_VISIBLE_DEVICES)",
                info.devices
            )));
        }
        let dev = cu::device::get(ordinal).map_err(err("cuDeviceGet"))?;
        // SAFETY: `dev` is a valid device.
        let ctx =
            unsafe { cu::primary_ctx::retain(dev) }.map_err(err("cuDevicePrimaryCtxRetain"))?;
        let attr = |a| {
            // SAFETY: `dev` is a valid device and `a` a valid attribute.
            unsafe { cu::device::get_attribute(dev, a) }.map_err(err("cuDeviceGetAttribute"))
        };
        use sys::CUdevice_attribute as A;
        let device = Device {
            ordinal,
            dev,
            ctx,
            capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sms: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        };
        device.bind()?;
        Ok(device)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Makes the device's primary context current on this thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained until `self` drops.
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(err("cuCtxSetCurrent"))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: retained in `open`, released once.
        if let Err(e) = unsafe { cu::primary_ctx::release(self.dev) } {
            log::warn!("cuDevicePrimaryCtxRelease failed: {e}");
        }
    }
}

/// A non-blocking stream of the current context.
#[derive(Debug)]
pub struct Stream(CUstream);

// SAFETY: CUDA streams may be used from any thread of the process.
unsafe impl Send for Stream {}

impl Stream {
    /// A new stream that does not synchronize with the legacy default stream.
    pub fn new() -> Result<Stream> {
        cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map(Stream)
            .map_err(err("cuStreamCreate"))
    }

    /// The raw handle.
    pub fn raw(&self) -> CUstream {
        self.0
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        if let Err(e) = unsafe { cu::stream::destroy(self.0) } {
            log::warn!("cuStreamDestroy failed: {e}");
        }
    }
}

/// A CUDA event without timing (the cheap kind used for ordering).
#[derive(Debug)]
pub struct Event(CUevent);

// SAFETY: CUDA events may be used from any thread of the process.
unsafe impl Send for Event {}
// SAFETY: querying, recording and waiting on an event are thread-safe driver calls.
unsafe impl Sync for Event {}

impl Event {
    /// A new event.
    pub fn new() -> Result<Event> {
        cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map(Event)
            .map_err(err("cuEventCreate"))
    }

    /// Records the event on `stream` (a raw handle: kolo's or the framework's).
    ///
    /// # Safety
    /// `stream` must be a live stream of the current context (or null, the legacy stream).
    pub unsafe fn record(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the event is alive; the caller vouches for `stream`.
        unsafe { cu::event::record(self.0, stream) }.map_err(err("cuEventRecord"))
    }

    /// Makes `stream` wait for the work recorded before the event, without blocking the host.
    ///
    /// # Safety
    /// As for [`Event::record`].
    pub unsafe fn block(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the event is alive; the caller vouches for `stream`.
        unsafe {
            cu::stream::wait_event(
                stream,
                self.0,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(err("cuStreamWaitEvent"))
    }

    /// True once the recorded work finished.
    pub fn done(&self) -> Result<bool> {
        // SAFETY: the event is alive.
        match unsafe { sys::cuEventQuery(self.0) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => Err(err("cuEventQuery")(cu::DriverError(other))),
        }
    }

    /// Waits up to `timeout` for the recorded work (polling, so the wait is bounded).
    pub fn wait(&self, timeout: Duration, what: &str) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(5);
        while !self.done()? {
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("waiting for the GPU to finish {what}"),
                    after: timeout,
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        Ok(())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        if let Err(e) = unsafe { cu::event::destroy(self.0) } {
            log::warn!("cuEventDestroy failed: {e}");
        }
    }
}

/// Device memory that grows on demand (the fusion buffer, the segment table).
#[derive(Debug, Default)]
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
}

impl DeviceBuffer {
    /// The address of at least `len` bytes (reallocated, contents lost, when smaller).
    /// Growing waits for the device (`cuMemFree`), which happens only while sizes still grow.
    pub fn reserve(&mut self, len: usize) -> Result<u64> {
        if len > self.len {
            self.release();
            let want = len.next_power_of_two().max(1 << 20);
            // SAFETY: a plain allocation in the current context.
            self.ptr = unsafe { cu::malloc_sync(want) }.map_err(err("cuMemAlloc"))?;
            self.len = want;
        }
        Ok(self.ptr)
    }

    fn release(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `reserve`, freed once.
            if let Err(e) = unsafe { cu::free_sync(self.ptr) } {
                log::warn!("cuMemFree failed: {e}");
            }
            self.len = 0;
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.release();
    }
}

/// Page-locked host memory (fast, asynchronous copies to and from the device).
#[derive(Debug)]
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// `len` bytes of pinned memory (portable: usable from every context).
    pub fn new(len: usize) -> Result<PinnedBuffer> {
        // SAFETY: a plain allocation.
        let ptr = unsafe { cu::malloc_host(len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(err("cuMemHostAlloc"))?;
        Ok(PinnedBuffer {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `len` bytes owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once.
        if let Err(e) = unsafe { cu::free_host(self.ptr.cast()) } {
            log::warn!("cuMemFreeHost failed: {e}");
        }
    }
}

/// Copies `bytes` device bytes from `src` to `dst` on `stream`.
///
/// # Safety
/// Both ranges must be device memory of the current context, valid until the copy ran.
pub unsafe fn copy_dtod(dst: u64, src: u64, bytes: usize, stream: CUstream) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { cu::memcpy_dtod_async(dst, src, bytes, stream) }.map_err(err("cuMemcpyDtoDAsync"))
}

/// Copies host bytes `src` to device address `dst` on `stream`.
///
/// # Safety
/// `dst` must hold `src.len()` bytes; `src` must stay untouched until the copy ran (pinned
/// memory: the copy is asynchronous).
pub unsafe fn copy_htod(dst: u64, src: &[u8], stream: CUstream) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { cu::memcpy_htod_async(dst, src, stream) }.map_err(err("cuMemcpyHtoDAsync"))
}
