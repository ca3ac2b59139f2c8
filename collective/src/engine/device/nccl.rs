//! The NCCL side of the engine's device path: an agreed batch of CUDA allreduces (fused) or one
//! broadcast runs through NCCL on the process set's communicator, created on the set's first device op (the
//! unique id travels over the set's data plane from group rank 0).
//!
//! Each op waits on kolo's stream for the event the submitter recorded on its stream, and its
//! handle completes once the result is on the device (the engine thread waits for the
//! completion event, bounded by [`DEVICE_TIMEOUT`]).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::DevicePart;
use crate::collectives::Session;
use crate::cuda::gpu::{DevicePtr, Gpu};
use crate::cuda::nccl::UniqueId;
use crate::engine::request::Output;
use crate::error::{Error, Result};
use crate::wire::{OpDescriptor, OpKind};

/// The longest the engine waits for the GPU to finish one batch before failing the job.
pub const DEVICE_TIMEOUT: Duration = Duration::from_secs(600);

/// The device state of one process set on this rank.
#[derive(Debug)]
struct SetGpu {
    members: Vec<usize>,
    gpu: Gpu,
}

/// Every process set's communicator (keyed by its members; sets are few).
static SETS: Mutex<Vec<SetGpu>> = Mutex::new(Vec::new());

fn sets() -> MutexGuard<'static, Vec<SetGpu>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops every communicator (after the engine stopped; a later `init` makes new ones).
pub fn reset() {
    sets().clear();
}

/// Runs `parts` (one fused allreduce batch or one broadcast, as the engine agreed) and returns
/// each local handle's outcome. An `Err` is fatal for the engine (a rank cannot take part).
pub(crate) fn run(
    session: &mut Session,
    parts: Vec<DevicePart>,
) -> Result<Vec<(u64, Result<Output>)>> {
    let ordinal = parts.iter().find_map(|p| {
        p.local
            .as_ref()
            .and_then(|(_, s)| s.device)
            .map(|d| d.ordinal)
    });
    let mut all = sets();
    let at = match all.iter().position(|s| s.members == session.members) {
        Some(at) => at,
        None => {
            let gpu = connect(session, ordinal)?;
            all.push(SetGpu {
                members: session.members.clone(),
                gpu,
            });
            all.len() - 1
        }
    };
    let gpu = &mut all[at].gpu;
    let outcome = execute(gpu, &parts);
    let handles = parts
        .iter()
        .filter_map(|p| p.local.as_ref().map(|(h, _)| *h));
    match outcome {
        Ok(()) => Ok(handles.map(|h| (h, Ok(Output::Done))).collect()),
        Err(e) => {
            log::error!("a CUDA collective failed: {e}");
            Err(e)
        }
    }
}

/// Opens this rank's device and joins the set's NCCL communicator. Every member takes part
/// in both exchanges even when its own steps fail, so all of them fail alike.
fn connect(session: &mut Session, ordinal: Option<i32>) -> Result<Gpu> {
    let opened = match ordinal {
        Some(o) => Gpu::open(o),
        None => Err(Error::Cuda(
            "this rank joined (hvd.join()) before its process set ran any CUDA collective, so it \
             has no device to stand in with"
                .into(),
        )),
    };
    let id = if session.rank == 0 {
        UniqueId::new().map(|id| id.0.to_vec())
    } else {
        Ok(Vec::new())
    };
    let id = exchange(
        session,
        "the NCCL unique id",
        id.as_deref().unwrap_or(&[]),
        128,
    )?
    .into_iter()
    .next()
    .unwrap_or_default();
    let ready = opened.is_ok() && id.len() == 128;
    let flags = exchange(session, "NCCL readiness", &[u8::from(ready)], 1)?;
    let mut gpu = opened?;
    if flags.iter().any(|f| f.first() != Some(&1)) {
        return Err(Error::Cuda(format!(
            "ranks {:?} of the process set could not open their GPU or NCCL; see their logs",
            flags
                .iter()
                .enumerate()
                .filter(|(_, f)| f.first() != Some(&1))
                .map(|(r, _)| session.members.get(r).copied().unwrap_or(r))
                .collect::<Vec<_>>()
        )));
    }
    gpu.connect(&UniqueId::from_bytes(&id)?, session.rank, session.size)?;
    Ok(gpu)
}

fn exchange(session: &mut Session, what: &str, payload: &[u8], max: usize) -> Result<Vec<Vec<u8>>> {
    if session.size == 1 {
        return Ok(vec![payload.to_vec()]);
    }
    let tag = session.next_tag();
    session.exchange(what, tag, payload, max)
}

fn execute(gpu: &mut Gpu, parts: &[DevicePart]) -> Result<()> {
    let Some(first) = parts.first() else {
        return Ok(());
    };
    let desc = &first.desc;
    let dtype = desc.dtype;
    let bytes_of = |d: &OpDescriptor| {
        d.shape
            .iter()
            .try_fold(dtype.size(), |acc, &n| {
                acc.checked_mul(usize::try_from(n).ok()?)
            })
            .unwrap_or(0)
    };
    // A joined rank's stand-ins: zeros (the identity of Sum and Average).
    let stand_in_bytes = parts
        .iter()
        .filter(|p| p.local.is_none())
        .map(|p| bytes_of(&p.desc))
        .max();
    let zeros = stand_in_bytes.map(|n| gpu.zeros(n)).transpose()?;
    let mut tensors = Vec::with_capacity(parts.len());
    for part in parts {
        match &part.local {
            Some((_, sub)) => {
                if let Some(device) = sub.device {
                    // SAFETY: the binding recorded the event and keeps it alive until the
                    // handle completes, which is after this batch.
                    unsafe { gpu.wait_for(device.ready_event)? };
                }
                tensors.push(DevicePtr {
                    ptr: sub.tensor.addr(),
                    bytes: sub.tensor.len(),
                });
            }
            None => tensors.push(DevicePtr {
                ptr: zeros.unwrap_or_default(),
                bytes: bytes_of(&part.desc),
            }),
        }
    }
    let own = gpu.stream();
    // SAFETY: the submitters keep their device tensors alive and untouched until the handles
    // complete, which is after `done` passed; stand-ins live in the scratch buffer.
    let done = unsafe {
        match desc.kind {
            OpKind::Allreduce => gpu.allreduce(
                &tensors,
                dtype,
                desc.op.unwrap_or(crate::dtype::ReduceOp::Sum),
                desc.prescale,
                desc.postscale,
                own,
            )?,
            OpKind::Broadcast => gpu.broadcast(tensors[0], dtype, desc.root as usize, own)?,
            other => {
                return Err(Error::Internal(format!(
                "{other} reached the engine's CUDA path, which only runs allreduce and broadcast"
            )))
            }
        }
    };
    done.wait(DEVICE_TIMEOUT, &format!("{} '{}'", desc.kind, desc.name))
}
