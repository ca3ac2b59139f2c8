//! broadcast: a pipelined chain from the root.

use super::allreduce::no_mesh;
use super::{check_tensor, invalid, label, Session};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::transport::{Buffers, RecvBlock, SendBlock, StreamPlan};
use crate::wire::{OpDescriptor, OpKind};

pub(crate) fn broadcast(
    session: &mut Session,
    name: &str,
    buf: &mut [u8],
    shape: &[i64],
    dtype: DType,
    root: usize,
) -> Result<()> {
    let kind = OpKind::Broadcast;
    let (rank, size) = (session.rank, session.size);
    let mut desc = OpDescriptor {
        dtype,
        shape: shape.to_vec(),
        root: u32::try_from(root).unwrap_or(u32::MAX),
        ..OpDescriptor::new(kind, name)
    };
    let root_check = if root < size {
        Ok(())
    } else {
        Err(format!(
            "root rank {root} is out of range; the job has {size} ranks (0 to {})",
            size - 1
        ))
    };
    desc.invalid = root_check
        .and_then(|()| check_tensor(name, buf.len(), shape, dtype, "tensor"))
        .err()
        .map(|m| invalid(kind, name, m));
    let (_, tag) = session.negotiate(desc)?;
    if size == 1 {
        return Ok(());
    }
    // Position in the chain root -> root+1 -> ... -> root-1.
    let position = (rank + size - root) % size;
    let send = [SendBlock {
        range: 0..buf.len(),
        after: (position > 0).then_some(0),
    }];
    let recv = [RecvBlock {
        range: 0..buf.len(),
        reduce: false,
    }];
    let plan = StreamPlan {
        tag,
        send_to: (position + 1 < size).then(|| session.peer((rank + 1) % size)),
        recv_from: (position > 0).then(|| session.peer((rank + size - 1) % size)),
        send_blocks: &send,
        recv_blocks: &recv,
    };
    let what = label(kind, name);
    let mesh = session.mesh.as_mut().ok_or_else(no_mesh)?;
    mesh.run_stream(&what, &plan, Buffers::InPlace(buf), &mut [], |_, _, _| {
        Err(Error::Internal("broadcast has nothing to reduce".into()))
    })
}
