//! What callers submit to the engine and what they get back.

use crate::dtype::{DType, ReduceOp};
use crate::wire::{OpDescriptor, OpKind};

/// A caller's memory the engine reads and writes while an op runs.
#[derive(Debug, Clone, Copy)]
pub struct RawTensor {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a `RawTensor` is only created through `RawTensor::new`, whose contract makes the
// memory exclusively the engine's until the op's handle completes; the engine thread is then
// its only user.
unsafe impl Send for RawTensor {}

impl RawTensor {
    /// No memory (barrier, join, process-set ops).
    pub const EMPTY: RawTensor = RawTensor {
        ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
        len: 0,
    };

    /// A view of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The memory must stay valid, and untouched by anyone but the engine, until the handle of
    /// the op it is submitted with has completed. `ptr` must be non-null (dangling is fine for
    /// `len == 0`).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        RawTensor { ptr, len }
    }

    /// The address of the view (a device address for CUDA tensors).
    pub fn addr(&self) -> u64 {
        self.ptr as usize as u64
    }

    /// Bytes in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty view.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, for reading only (allgather, alltoall and reducescatter inputs, which other
    /// pending ops may read at the same time; see `Handles::open`).
    ///
    /// # Safety
    /// Only the engine thread may call it, while the op is running (see [`RawTensor::new`]).
    pub(crate) unsafe fn read<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: as for `bytes`; no pending op writes these bytes (the engine refuses to
        // submit a writer over memory another pending op uses, and the reverse).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, for reading and writing.
    ///
    /// # Safety
    /// Only the engine thread may call it, while the op is running (see [`RawTensor::new`]).
    pub(crate) unsafe fn bytes<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: the caller of `RawTensor::new` guaranteed the memory is valid and exclusive
        // to the engine until completion; the caller of `bytes` is that engine.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// One op submitted to the engine.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The collective.
    pub kind: OpKind,
    /// The name all ranks use for this tensor (unique among this rank's outstanding ops).
    pub name: String,
    /// The process set it runs in (0: every rank).
    pub process_set: u32,
    /// Element type.
    pub dtype: DType,
    /// Shape of the input.
    pub shape: Vec<i64>,
    /// Reduction (allreduce, reducescatter).
    pub op: ReduceOp,
    /// Factor applied to inputs before reducing.
    pub prescale: f64,
    /// Factor applied to the result.
    pub postscale: f64,
    /// Root rank within the process set (broadcast).
    pub root: usize,
    /// Alltoall: rows for each rank of the set; add_process_set: the members.
    pub splits: Vec<u64>,
    /// The input; allreduce and broadcast write their result here too.
    pub tensor: RawTensor,
    /// Set when `tensor` is CUDA device memory (allreduce and broadcast): NCCL runs it.
    pub device: Option<crate::cuda::DeviceTensor>,
}

impl Submission {
    /// A submission of `kind` named `name` with no tensor; fill in the rest.
    pub fn new(kind: OpKind, name: &str) -> Self {
        Submission {
            kind,
            name: name.to_owned(),
            process_set: 0,
            dtype: DType::U8,
            shape: Vec::new(),
            op: ReduceOp::Sum,
            prescale: 1.0,
            postscale: 1.0,
            root: 0,
            splits: Vec::new(),
            tensor: RawTensor::EMPTY,
            device: None,
        }
    }

    /// The descriptor the ranks agree on.
    pub(crate) fn descriptor(&self) -> OpDescriptor {
        let reduces = matches!(self.kind, OpKind::Allreduce | OpKind::Reducescatter);
        OpDescriptor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            op: reduces.then_some(self.op),
            prescale: if reduces { self.prescale } else { 1.0 },
            postscale: if reduces { self.postscale } else { 1.0 },
            root: u32::try_from(self.root).unwrap_or(u32::MAX),
            splits: self.splits.clone(),
            device: self.device.is_some(),
            ..OpDescriptor::new(self.kind, &self.name)
        }
    }
}

/// What a completed op hands back beyond the in-place result.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// The result is in the submitted tensor (allreduce, broadcast) or there is none.
    Done,
    /// A new tensor (allgather, alltoall, reducescatter): its bytes and the first-dimension
    /// rows per rank of the set (allgather: rows from each rank; alltoall: rows received from
    /// each rank; reducescatter: rows each rank got).
    Tensor {
        /// The result's bytes.
        data: Vec<u8>,
        /// Rows per rank of the process set.
        rows: Vec<u64>,
    },
    /// join: the last rank (in the process set) that joined.
    LastJoined(usize),
    /// add_process_set: the new set's id.
    ProcessSet(u32),
}
