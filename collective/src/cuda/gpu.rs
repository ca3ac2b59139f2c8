//! One device's collectives: kolo's stream, the fusion buffer, the pack kernel and the NCCL
//! communicator, with the stream discipline of the issue: every op first makes kolo's stream
//! wait (through an event) for the work already queued on the framework's stream, runs on
//! kolo's stream, and makes the framework's stream wait for its result; the returned event
//! tells the host when the result is ready. No device-wide synchronization.

use super::driver::{CUstream, Device, DeviceBuffer, Event, Stream};
use super::mapping::{nccl_type, reduction, NcclType};
use super::nccl::{Communicator, UniqueId};
use super::pack::Packer;
use super::plan::{push_split, Direction, FusionLayout, Segment};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// A device tensor: its address and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePtr {
    /// Device address.
    pub ptr: u64,
    /// Bytes.
    pub bytes: usize,
}

/// One device's collective state.
#[derive(Debug)]
pub struct Gpu {
    // Field order is drop order: the communicator and buffers go before the context.
    comm: Option<Communicator>,
    packer: Option<Packer>,
    fusion: DeviceBuffer,
    scratch: DeviceBuffer,
    stream: Stream,
    device: Device,
}

fn stream_of(raw: u64) -> CUstream {
    raw as usize as CUstream
}

impl Gpu {
    /// Device `ordinal`'s state; its primary context becomes current on this thread.
    pub fn open(ordinal: i32) -> Result<Gpu> {
        let device = Device::open(ordinal)?;
        Ok(Gpu {
            comm: None,
            packer: None,
            fusion: DeviceBuffer::default(),
            scratch: DeviceBuffer::default(),
            stream: Stream::new()?,
            device,
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// kolo's stream (raw handle).
    pub fn stream(&self) -> u64 {
        self.stream.raw() as usize as u64
    }

    /// Joins NCCL communicator `id` as `rank` of `size` (blocks until every rank joined).
    pub fn connect(&mut self, id: &UniqueId, rank: usize, size: usize) -> Result<()> {
        self.device.bind()?;
        self.comm = Some(Communicator::new(id, rank, size)?);
        Ok(())
    }

    /// Makes kolo's stream wait for `ready` (a raw `CUevent` recorded by the submitter).
    ///
    /// # Safety
    /// `ready` must be a live event of this device's context.
    pub unsafe fn wait_for(&self, ready: u64) -> Result<()> {
        self.device.bind()?;
        let event = ready as usize as super::driver::CUevent;
        // SAFETY: the caller's contract; kolo's stream lives as long as `self`.
        unsafe {
            cudarc::driver::result::stream::wait_event(
                self.stream.raw(),
                event,
                cudarc::driver::sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| Error::Cuda(format!("cuStreamWaitEvent failed: {e}")))
    }

    /// `bytes` zeroed bytes of device scratch memory on kolo's stream (a joined rank's
    /// stand-in tensor).
    pub fn zeros(&mut self, bytes: usize) -> Result<u64> {
        let ptr = self.scratch.reserve(bytes.max(1))?;
        // SAFETY: the scratch buffer holds `bytes` bytes; kolo's stream orders the memset
        // before the collective that reads it.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, self.stream.raw()) }
            .map_err(|e| Error::Cuda(format!("cuMemsetD8Async failed: {e}")))?;
        Ok(ptr)
    }

    fn comm(&mut self) -> Result<&mut Communicator> {
        self.comm.as_mut().ok_or_else(|| {
            Error::Config("no NCCL communicator on this device yet; connect() first".into())
        })
    }

    fn packer(&mut self) -> Result<&mut Packer> {
        if self.packer.is_none() {
            self.packer = Some(Packer::new(&self.device)?);
        }
        self.packer
            .as_mut()
            .ok_or_else(|| Error::Internal("the pack kernel vanished".into()))
    }

    /// Makes kolo's stream wait for the work queued on the framework's stream `user` (a live
    /// stream of this device, or 0 for the legacy default stream).
    fn begin(&self, user: u64) -> Result<()> {
        self.device.bind()?;
        let queued = Event::new()?;
        // SAFETY: `user` is the framework's live stream of this device (the binding's
        // contract) and kolo's stream lives as long as `self`.
        unsafe {
            queued.record(stream_of(user))?;
            queued.block(self.stream.raw())
        }
    }

    /// Makes `user` wait for kolo's stream; the event passes once the result is ready.
    fn end(&self, user: u64) -> Result<Event> {
        let done = Event::new()?;
        // SAFETY: as in `begin`.
        unsafe {
            done.record(self.stream.raw())?;
            done.block(stream_of(user))?;
        }
        Ok(done)
    }

    /// One launch of the batched copy over `segments` on kolo's stream, scaling elements of
    /// `dtype` by `factor`; ordered after `user`'s queued work and before its later work.
    ///
    /// # Safety
    /// The segments must name device memory valid until the returned event passed.
    pub unsafe fn batched_copy(
        &mut self,
        segments: &[Segment],
        dtype: DType,
        factor: f64,
        user: u64,
    ) -> Result<Event> {
        self.begin(user)?;
        let stream = self.stream.raw();
        // SAFETY: the caller's contract.
        unsafe { self.packer()?.run(segments, dtype, factor, stream)? };
        self.end(user)
    }

    /// Scales `t` in place by `factor` on kolo's stream (nothing when `factor == 1`).
    unsafe fn scale(&mut self, t: DevicePtr, dtype: DType, factor: f64) -> Result<()> {
        if factor == 1.0 || t.bytes == 0 {
            return Ok(());
        }
        let mut segs = Vec::new();
        push_split(&mut segs, t.ptr, t.ptr, t.bytes as u64);
        let stream = self.stream.raw();
        // SAFETY: the caller's contract.
        unsafe { self.packer()?.run(&segs, dtype, factor, stream) }
    }

    fn nccl_dtype(&mut self, dtype: DType) -> Result<NcclType> {
        let version = self.comm()?.version();
        nccl_type(dtype, version).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "NCCL cannot carry {dtype} tensors; they take the host-staged path"
            ))
        })
    }

    /// Allreduces `tensors` (all of `dtype`) in place as one fused NCCL call: packed into the
    /// fusion buffer with `prescale` by one kernel launch, reduced, unpacked with `postscale`
    /// (and the 1/size of an average NCCL cannot do itself). A single tensor without
    /// prescaling is reduced where it is.
    ///
    /// # Safety
    /// Every tensor must be device memory of this device, valid until the event passed.
    pub unsafe fn allreduce(
        &mut self,
        tensors: &[DevicePtr],
        dtype: DType,
        op: ReduceOp,
        prescale: f64,
        postscale: f64,
        user: u64,
    ) -> Result<Event> {
        crate::reduce::check_reduction(dtype, op, prescale, postscale)
            .map_err(Error::InvalidArgument)?;
        let (size, version) = {
            let c = self.comm()?;
            (c.size(), c.version())
        };
        let r = reduction(dtype, op, size, version).ok_or_else(|| no_nccl_reduction(dtype, op))?;
        let post = postscale * r.postscale;
        let elem = dtype.size();
        self.begin(user)?;
        let stream = self.stream.raw();
        if let [t] = tensors {
            if prescale == 1.0 {
                // SAFETY: the caller's contract.
                unsafe {
                    self.comm()?
                        .allreduce(t.ptr, t.ptr, t.bytes / elem, r.dtype, r.op, stream)?;
                    self.scale(*t, dtype, post)?;
                }
                return self.end(user);
            }
        }
        let sizes: Vec<u64> = tensors.iter().map(|t| t.bytes as u64).collect();
        let ptrs: Vec<u64> = tensors.iter().map(|t| t.ptr).collect();
        let layout = FusionLayout::new(&sizes);
        let total = layout.total() as usize;
        if total > 0 {
            let base = self.fusion.reserve(total)?;
            let pack = layout.segments(&ptrs, base, Direction::Pack);
            let unpack = layout.segments(&ptrs, base, Direction::Unpack);
            // SAFETY: the fusion buffer holds `total` bytes; the caller's contract for the rest.
            unsafe {
                self.packer()?.run(&pack, dtype, prescale, stream)?;
                self.comm()?
                    .allreduce(base, base, total / elem, r.dtype, r.op, stream)?;
                self.packer()?.run(&unpack, dtype, post, stream)?;
            }
        }
        self.end(user)
    }

    /// Broadcasts `t` in place from `root`.
    ///
    /// # Safety
    /// As for [`Gpu::allreduce`].
    pub unsafe fn broadcast(
        &mut self,
        t: DevicePtr,
        dtype: DType,
        root: usize,
        user: u64,
    ) -> Result<Event> {
        let nt = self.nccl_dtype(dtype)?;
        self.begin(user)?;
        let stream = self.stream.raw();
        // SAFETY: the caller's contract.
        unsafe {
            self.comm()?
                .broadcast(t.ptr, t.ptr, t.bytes / dtype.size(), nt, root, stream)?
        };
        self.end(user)
    }

    /// Allgathers: `counts[r]` elements from each rank into `recv` (their sum), rank order.
    ///
    /// # Safety
    /// As for [`Gpu::allreduce`].
    pub unsafe fn allgather(
        &mut self,
        send: DevicePtr,
        counts: &[usize],
        recv: DevicePtr,
        dtype: DType,
        user: u64,
    ) -> Result<Event> {
        let nt = self.nccl_dtype(dtype)?;
        check_total(recv, counts, dtype, "allgather output")?;
        self.begin(user)?;
        let stream = self.stream.raw();
        // SAFETY: the caller's contract.
        unsafe {
            self.comm()?
                .allgatherv(send.ptr, recv.ptr, counts, nt, dtype.size(), stream)?
        };
        self.end(user)
    }

    /// Reducescatters `send` (every rank's part, `counts[r]` elements each, in rank order)
    /// into `recv` (this rank's part), with the scaling of [`Gpu::allreduce`]; `send` is left
    /// unchanged.
    ///
    /// # Safety
    /// As for [`Gpu::allreduce`].
    #[allow(clippy::too_many_arguments, reason = "the collective's arguments")]
    pub unsafe fn reducescatter(
        &mut self,
        send: DevicePtr,
        counts: &[usize],
        recv: DevicePtr,
        dtype: DType,
        op: ReduceOp,
        prescale: f64,
        postscale: f64,
        user: u64,
    ) -> Result<Event> {
        crate::reduce::check_reduction(dtype, op, prescale, postscale)
            .map_err(Error::InvalidArgument)?;
        check_total(send, counts, dtype, "reducescatter input")?;
        let (size, version, rank) = {
            let c = self.comm()?;
            (c.size(), c.version(), c.rank())
        };
        let r = reduction(dtype, op, size, version).ok_or_else(|| no_nccl_reduction(dtype, op))?;
        if counts.get(rank).map(|&n| n * dtype.size()) != Some(recv.bytes) {
            return Err(Error::InvalidArgument(format!(
                "reducescatter output has {} bytes, this rank's part is {:?} elements",
                recv.bytes,
                counts.get(rank)
            )));
        }
        self.begin(user)?;
        let stream = self.stream.raw();
        let mut input = send.ptr;
        if prescale != 1.0 && send.bytes > 0 {
            let copy = self.scratch.reserve(send.bytes)?;
            let mut segs = Vec::new();
            push_split(&mut segs, send.ptr, copy, send.bytes as u64);
            // SAFETY: the scratch buffer holds `send.bytes`.
            unsafe { self.packer()?.run(&segs, dtype, prescale, stream)? };
            input = copy;
        }
        // SAFETY: the caller's contract.
        unsafe {
            self.comm()?.reducescatterv(
                input,
                recv.ptr,
                counts,
                r.dtype,
                r.op,
                dtype.size(),
                stream,
            )?;
            self.scale(recv, dtype, postscale * r.postscale)?;
        }
        self.end(user)
    }

    /// Alltoall with per-rank element counts (see [`Communicator::alltoallv`]).
    ///
    /// # Safety
    /// As for [`Gpu::allreduce`].
    pub unsafe fn alltoall(
        &mut self,
        send: DevicePtr,
        send_counts: &[usize],
        recv: DevicePtr,
        recv_counts: &[usize],
        dtype: DType,
        user: u64,
    ) -> Result<Event> {
        let nt = self.nccl_dtype(dtype)?;
        check_total(send, send_counts, dtype, "alltoall input")?;
        check_total(recv, recv_counts, dtype, "alltoall output")?;
        self.begin(user)?;
        let stream = self.stream.raw();
        // SAFETY: the caller's contract.
        unsafe {
            self.comm()?.alltoallv(
                send.ptr,
                send_counts,
                recv.ptr,
                recv_counts,
                nt,
                dtype.size(),
                stream,
            )?
        };
        self.end(user)
    }
}

fn check_total(t: DevicePtr, counts: &[usize], dtype: DType, what: &str) -> Result<()> {
    let want = counts.iter().sum::<usize>() * dtype.size();
    if t.bytes == want {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "{what} has {} bytes; the counts {counts:?} of {dtype} need {want}",
        t.bytes
    )))
}

/// Why NCCL cannot run this reduction.
fn no_nccl_reduction(dtype: DType, op: ReduceOp) -> Error {
    Error::InvalidArgument(if op == ReduceOp::Adasum {
        "NCCL has no Adasum reduction; hvd.allreduce(op=hvd.Adasum) runs it on host copies of \
         CUDA tensors"
            .to_owned()
    } else {
        format!("NCCL cannot reduce {dtype} tensors; they take the host-staged path")
    })
}
