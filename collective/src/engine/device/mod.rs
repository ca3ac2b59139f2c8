//! The engine's device path: agreed batches of CUDA ops leave the CPU transports here and run
//! through NCCL (`nccl`, feature `cuda`). Without the `cuda` feature every device op of a
//! batch fails with [`Error::Cuda`](crate::Error::Cuda) (the Python side stages CUDA tensors
//! through host memory instead).
//!
//! This module depends on [`crate::cuda`]'s wrappers (driver, NCCL, the pack kernel); they know
//! nothing of the engine.

#[cfg(feature = "cuda")]
pub mod nccl;

use super::request::{Output, Submission};
use crate::collectives::Session;
use crate::error::Result;
use crate::wire::OpDescriptor;

/// One op of an agreed device batch: the descriptor and, unless this rank joined, the local
/// handle and submission.
#[derive(Debug)]
pub(crate) struct DevicePart {
    #[cfg_attr(
        not(feature = "cuda"),
        expect(dead_code, reason = "read by the `cuda` feature's engine path")
    )]
    pub desc: OpDescriptor,
    pub local: Option<(u64, Submission)>,
}

/// Runs an agreed batch of device ops (through `nccl` with the `cuda` feature); returns each
/// local handle's outcome, or a fatal error.
pub(crate) fn run_device_batch(
    session: &mut Session,
    parts: Vec<DevicePart>,
) -> Result<Vec<(u64, Result<Output>)>> {
    #[cfg(feature = "cuda")]
    {
        nccl::run(session, parts)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = session;
        Ok(parts
            .into_iter()
            .filter_map(|p| p.local.map(|(h, _)| h))
            .map(|h| {
                let why = "kolo was built without the `cuda` feature; CUDA tensors take the host-staged path";
                (h, Err(crate::Error::Cuda(why.into())))
            })
            .collect())
    }
}
