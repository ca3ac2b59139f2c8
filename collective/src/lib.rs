//! kolo's per-process runtime.
//!
//! - [`control`]: the job driver service (tonic gRPC, authenticated with a per-job secret),
//!   its worker-side client, host hashing and rank assignment — shared by `kolorun`, Spark and
//!   Ray launches (the launcher's side is [`control::launch`]).
//! - [`transport`] and [`wire`]: the direct TCP data plane between ranks and its framed protocol.
//! - [`collectives`] and [`reduce`]: allreduce, allgather, broadcast, alltoall, reducescatter and
//!   barrier on CPU memory, with Horovod's reduction ops (Adasum included) and scaling.
//! - [`communicator`]: runs one collective at a time on a rank's mesh.
//! - [`cuda`]: the CUDA, NCCL and NVRTC wrappers (device memory, NCCL collectives, the pack
//!   kernel, library discovery; feature `cuda`, libraries loaded at run time).
//! - [`engine`]: the background engine the Python binding submits to: negotiation across ranks,
//!   response cache, tensor fusion, process sets, join, stall inspector and timeline; its
//!   device path ([`engine::device`]) runs agreed batches of CUDA ops through [`cuda`].
//! - [`launcher`]: `kolorun`, which starts a job's ranks locally and over ssh and supervises them.
//! - [`worker`]: joining a job as one rank (driver registration, then the mesh), and
//!   [`worker::session`], the worker's side of a Spark or Ray launch ([`worker::WorkerSession`]).
//! - [`abort`]: the job-wide abort flag ([`AbortSignal`]) and the cause it carries.
//! - [`dtype`]: tensor element types and reduction ops ([`DType`], [`ReduceOp`]).
//! - [`error`]: the crate's one [`Error`], which wraps the runtime's ([`kolo_runtime::Error`]).
//!
//! Async work (the driver service and its client) runs on the one process-global tokio runtime of
//! the `kolo-runtime` crate ([`kolo_runtime::block_on`]).
//!
//! A single rank needs no job at all:
//!
//! ```
//! use kolo_collective::{communicator::Communicator, DType, ReduceOp};
//!
//! let comm = Communicator::single();
//! let mut data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
//! comm.allreduce("grad", &mut data, &[2], DType::F32, ReduceOp::Sum, 2.0, 1.0).unwrap();
//! assert_eq!(&data[..4], &2.0f32.to_le_bytes());
//! ```
#![warn(missing_docs)]

pub mod abort;
pub mod collectives;
pub mod communicator;
pub mod control;
pub mod cuda;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod launcher;
pub mod reduce;
pub mod transport;
pub mod wire;
pub mod worker;

pub use abort::{AbortCause, AbortSignal};
pub use dtype::{DType, ReduceOp};
pub use error::{Error, Result};
