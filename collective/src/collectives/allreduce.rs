//! allreduce: ring reduce-scatter then ring allgather, in place.

use super::{
    check_tensor, even_segments, invalid, label, ring_allgather, ring_pieces, ring_reduce_scatter,
    Session,
};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::reduce;
use crate::transport::{Buffers, StreamPlan, CHUNK};
use crate::wire::{OpDescriptor, OpKind};

/// The reduction arguments shared by allreduce and reducescatter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reduction {
    pub op: ReduceOp,
    pub prescale: f64,
    pub postscale: f64,
}

impl Reduction {
    /// The factor applied to the reduced result: postscale, divided by `size` for `Average`.
    pub(crate) fn result_factor(&self, size: usize) -> f64 {
        if self.op == ReduceOp::Average {
            self.postscale / size as f64
        } else {
            self.postscale
        }
    }

    /// The ring's block sink: reduce `src` into `dst`, then scale blocks whose reduction is
    /// complete here (`is_final[block]`) by `factor`.
    pub(crate) fn sink<'f>(
        &self,
        dtype: DType,
        factor: f64,
        is_final: &'f [bool],
    ) -> impl FnMut(usize, &mut [u8], &[u8]) -> Result<()> + 'f {
        let op = self.op;
        move |block, dst, src| {
            reduce::reduce_into(dtype, op, dst, src)?;
            if is_final.get(block).copied().unwrap_or(false) {
                reduce::scale(dtype, dst, factor)?;
            }
            Ok(())
        }
    }

    pub(crate) fn descriptor(
        &self,
        kind: OpKind,
        name: &str,
        dtype: DType,
        shape: &[i64],
    ) -> OpDescriptor {
        OpDescriptor {
            dtype,
            shape: shape.to_vec(),
            op: Some(self.op),
            prescale: self.prescale,
            postscale: self.postscale,
            ..OpDescriptor::new(kind, name)
        }
    }
}

pub(crate) fn allreduce(
    session: &mut Session,
    name: &str,
    buf: &mut [u8],
    shape: &[i64],
    dtype: DType,
    reduction: Reduction,
) -> Result<()> {
    let kind = OpKind::Allreduce;
    let mut desc = reduction.descriptor(kind, name, dtype, shape);
    desc.invalid = check_tensor(name, buf.len(), shape, dtype, "input")
        .and_then(|()| {
            reduce::check_reduction(dtype, reduction.op, reduction.prescale, reduction.postscale)
        })
        .err()
        .map(|m| invalid(kind, name, m));
    let (_, tag) = session.negotiate(desc)?;
    let (rank, size) = (session.rank, session.size);
    let factor = reduction.result_factor(size);
    let what = label(kind, name);
    reduce::scale(dtype, buf, reduction.prescale).map_err(|e| session.abandon(&what, e))?;
    if size == 1 {
        return reduce::scale(dtype, buf, factor);
    }
    let segs = even_segments(buf.len() / dtype.size(), dtype.size(), size);
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    let mut finals = Vec::new();
    for piece in ring_pieces(&segs, dtype.size()) {
        let last = ring_reduce_scatter(&piece, rank, &mut sends, &mut recvs);
        ring_allgather(&piece, rank, Some(last), &mut sends, &mut recvs);
        finals.push(last);
    }
    let mut is_final = vec![false; recvs.len()];
    for i in finals {
        is_final[i] = true;
    }
    let plan = StreamPlan {
        tag,
        send_to: Some(session.peer((rank + 1) % size)),
        recv_from: Some(session.peer((rank + size - 1) % size)),
        send_blocks: &sends,
        recv_blocks: &recvs,
    };
    let Session { mesh, scratch, .. } = session;
    let Some(mesh) = mesh.as_mut() else {
        return Err(no_mesh());
    };
    mesh.run_stream(
        &what,
        &plan,
        Buffers::InPlace(buf),
        scratch.get(CHUNK),
        reduction.sink(dtype, factor, &is_final),
    )
}

pub(crate) fn no_mesh() -> crate::error::Error {
    crate::error::Error::Internal("a multi-rank session has no mesh".into())
}
