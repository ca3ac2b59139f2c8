//! allreduce: recursive doubling ([`super::tree`]) for small messages, ring reduce-scatter then
//! ring allgather for large ones, in place (over TCP; [`super::algorithm`] chooses); the shared-memory
//! node's algorithm on one host; the hierarchical one across hosts. Also the ring and chain
//! building blocks the hierarchical collectives run among host leaders.

use std::ops::Range;

use super::algorithm::Algorithm;
use super::scattered::Scattered;
use super::{
    check_tensor, even_segments, invalid, label, ring_allgather, ring_pieces, ring_reduce_scatter,
    AlignedBuf, Session,
};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::{Buffers, Layout, Mesh, RecvBlock, SendBlock, StreamPlan, CHUNK};
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
    let elements = buf.len() / dtype.size();
    allreduce_tensors(session, name, buf, shape, dtype, reduction, &[elements])
}

/// [`allreduce`] of several tensors laid end to end in `buf` (`counts[i]` elements of tensor
/// `i`): the engine's fused batches. Only Adasum looks at the boundaries (each tensor gets
/// its own coefficients); the elementwise ops reduce the buffer as one.
pub(crate) fn allreduce_tensors(
    session: &mut Session,
    name: &str,
    buf: &mut [u8],
    shape: &[i64],
    dtype: DType,
    reduction: Reduction,
    counts: &[usize],
) -> Result<()> {
    let kind = OpKind::Allreduce;
    let mut desc = reduction.descriptor(kind, name, dtype, shape);
    let size = session.size;
    let algorithm = session.algorithm(kind, buf.len());
    desc.invalid = check_tensor(name, buf.len(), shape, dtype, "input")
        .and_then(|()| algorithm.clone().map(|_| ()))
        .and_then(|()| {
            reduce::check_reduction(dtype, reduction.op, reduction.prescale, reduction.postscale)
        })
        .and_then(|()| match reduction.op {
            ReduceOp::Adasum => super::adasum::size_refusal(size).map_or(Ok(()), Err),
            _ => Ok(()),
        })
        .err()
        .map(|m| invalid(kind, name, m));
    let tag = session.negotiate_tag(desc)?;
    let factor = reduction.result_factor(size);
    let what = label(kind, name);
    reduce::scale(dtype, buf, reduction.prescale).map_err(|e| session.abandon(&what, e))?;
    if reduction.op == ReduceOp::Adasum {
        return super::adasum::run(session, tag, &what, buf, dtype, counts, factor);
    }
    if size == 1 {
        return reduce::scale(dtype, buf, factor);
    }
    match session.shm_layout() {
        Some(Layout::Flat) => session.on_node(&what, |node| {
            node.allreduce(buf, dtype, reduction.op, factor)
        }),
        Some(Layout::Hierarchical(hosts)) if super::hier::chosen(kind) => super::hier::allreduce(
            session,
            &hosts,
            &what,
            tag,
            buf,
            dtype,
            reduction.op,
            factor,
        ),
        _ => {
            let algorithm = algorithm.map_err(Error::Internal)?;
            let op = reduction.op;
            session.run_algorithm(kind, algorithm, tag, &what, |ring, mesh, scratch, work| {
                match algorithm {
                    Algorithm::RecursiveDoubling => {
                        ring.doubling_allreduce(mesh, work, buf, dtype, op, factor)
                    }
                    _ => ring.allreduce(mesh, scratch, buf, dtype, op, factor),
                }
            })
        }
    }
}

/// Whether [`allreduce_scattered`] can run a batch reduced with `op` on `session`: the
/// session acts for the whole job over shared memory (flat, or hierarchical when chosen), and
/// the op is elementwise (Adasum needs every tensor's boundaries and the TCP mesh).
pub(crate) fn scattered_fits(session: &Session, op: ReduceOp) -> bool {
    op != ReduceOp::Adasum
        && session.size > 1
        && match session.shm_layout() {
            Some(Layout::Flat) => true,
            Some(Layout::Hierarchical(_)) => super::hier::chosen(OpKind::Allreduce),
            None => false,
        }
}

/// [`allreduce`] of the joint range of `buf` (tensors of `dtype` laid end to end, reduced as
/// one `[elements]` tensor named `name`) where they are: the engine's fused batches on shared
/// memory, whose tensors go straight into the shared halves with no fusion buffer. Only when
/// [`scattered_fits`]; a hierarchical host's leader packs the node's result into `packed` for
/// the TCP ring among the leaders.
pub(crate) fn allreduce_scattered(
    session: &mut Session,
    name: &str,
    buf: &mut Scattered<'_>,
    dtype: DType,
    reduction: Reduction,
    packed: &mut AlignedBuf,
) -> Result<()> {
    let kind = OpKind::Allreduce;
    let len = buf.len();
    let elements = i64::try_from(len / dtype.size()).unwrap_or(i64::MAX);
    let shape = [elements];
    let mut desc = reduction.descriptor(kind, name, dtype, &shape);
    desc.invalid = check_tensor(name, len, &shape, dtype, "input")
        .and_then(|()| {
            reduce::check_reduction(dtype, reduction.op, reduction.prescale, reduction.postscale)
        })
        .and_then(|()| {
            if scattered_fits(session, reduction.op) {
                Ok(())
            } else {
                Err("a batch without shared memory or with Adasum (this is a bug)".into())
            }
        })
        .err()
        .map(|m| invalid(kind, name, m));
    let tag = session.negotiate_tag(desc)?;
    let factor = reduction.result_factor(session.size);
    let what = label(kind, name);
    for part in buf.parts_mut() {
        if let Err(e) = reduce::scale(dtype, part, reduction.prescale) {
            return Err(session.abandon(&what, e));
        }
    }
    match session.shm_layout() {
        Some(Layout::Hierarchical(hosts)) => super::hier::allreduce_scattered(
            session,
            &hosts,
            &what,
            tag,
            buf,
            dtype,
            reduction.op,
            factor,
            packed,
        ),
        _ => session.on_node(&what, |node| {
            node.allreduce_scattered(buf, dtype, reduction.op, factor)
        }),
    }
}

/// A ring over some of the mesh's ranks: `members` (global ranks) in ring order, this rank's
/// position, and the tag of the collective's frames.
pub(crate) struct Ring<'a> {
    pub members: &'a [usize],
    pub rank: usize,
    pub tag: u32,
    pub what: &'a str,
}

impl Ring<'_> {
    /// Ring reduce-scatter then ring allgather of `buf`, in place, pipelined in pieces; the
    /// result is multiplied by `factor`.
    pub(crate) fn allreduce(
        &self,
        mesh: &mut Mesh,
        scratch: &mut AlignedBuf,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        factor: f64,
    ) -> Result<()> {
        let (rank, size) = (self.rank, self.members.len());
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
            tag: self.tag,
            send_to: Some(self.members[(rank + 1) % size]),
            recv_from: Some(self.members[(rank + size - 1) % size]),
            send_blocks: &sends,
            recv_blocks: &recvs,
        };
        let reduction = Reduction {
            op,
            prescale: 1.0,
            postscale: 1.0,
        };
        mesh.run_stream(
            self.what,
            &plan,
            Buffers::InPlace(buf),
            scratch.get(CHUNK),
            reduction.sink(dtype, factor, &is_final),
        )
    }

    /// Ring allgather in place: `buf[segs[rank]]` holds this member's block; afterwards every
    /// `buf[segs[j]]` holds member `j`'s.
    pub(crate) fn allgather(
        &self,
        mesh: &mut Mesh,
        buf: &mut [u8],
        segs: &[Range<usize>],
    ) -> Result<()> {
        let size = self.members.len();
        let rank = self.rank;
        let (mut sends, mut recvs) = (Vec::with_capacity(size), Vec::with_capacity(size));
        ring_allgather(segs, rank, None, &mut sends, &mut recvs);
        let plan = StreamPlan {
            tag: self.tag,
            send_to: Some(self.members[(rank + 1) % size]),
            recv_from: Some(self.members[(rank + size - 1) % size]),
            send_blocks: &sends,
            recv_blocks: &recvs,
        };
        mesh.run_stream(
            self.what,
            &plan,
            Buffers::InPlace(buf),
            &mut [],
            |_, _, _| Err(Error::Internal("allgather has nothing to reduce".into())),
        )
    }

    /// A pipelined chain from member `root` through the ring: afterwards every member's
    /// `buf` holds root's.
    pub(crate) fn broadcast(&self, mesh: &mut Mesh, buf: &mut [u8], root: usize) -> Result<()> {
        let (rank, size) = (self.rank, self.members.len());
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
            tag: self.tag,
            send_to: (position + 1 < size).then(|| self.members[(rank + 1) % size]),
            recv_from: (position > 0).then(|| self.members[(rank + size - 1) % size]),
            send_blocks: &send,
            recv_blocks: &recv,
        };
        mesh.run_stream(
            self.what,
            &plan,
            Buffers::InPlace(buf),
            &mut [],
            |_, _, _| Err(Error::Internal("broadcast has nothing to reduce".into())),
        )
    }
}

/// Runs `f` with the TCP ring over `members` (global ranks in ring order; this rank is member
/// `rank`), `session`'s mesh and its scratch buffer.
pub(crate) fn on_ring<R>(
    session: &mut Session,
    members: &[usize],
    rank: usize,
    tag: u32,
    what: &str,
    f: impl FnOnce(&Ring<'_>, &mut Mesh, &mut AlignedBuf) -> Result<R>,
) -> Result<R> {
    let ring = Ring {
        members,
        rank,
        tag,
        what,
    };
    let Session { mesh, scratch, .. } = session;
    let mesh = mesh.as_mut().ok_or_else(no_mesh)?;
    f(&ring, mesh, scratch)
}

/// Allreduce of `buf` among `members` (global ranks; this rank is member `rank`): the host
/// leaders of the hierarchical path. Recursive doubling or the ring, chosen as for a flat job
/// of that many ranks (or forced alike).
#[expect(
    clippy::too_many_arguments,
    reason = "the allreduce's arguments plus the members, the frame tag and the label"
)]
pub(crate) fn among(
    session: &mut Session,
    members: &[usize],
    rank: usize,
    tag: u32,
    what: &str,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    factor: f64,
) -> Result<()> {
    let algorithm = session.algorithm_among(OpKind::Allreduce, buf.len(), members.len());
    let ring = Ring {
        members,
        rank,
        tag,
        what,
    };
    let Session {
        mesh,
        scratch,
        work,
        ..
    } = session;
    let mesh = mesh.as_mut().ok_or_else(no_mesh)?;
    match algorithm {
        Algorithm::RecursiveDoubling => ring.doubling_allreduce(mesh, work, buf, dtype, op, factor),
        _ => ring.allreduce(mesh, scratch, buf, dtype, op, factor),
    }
}

pub(crate) fn no_mesh() -> crate::error::Error {
    crate::error::Error::Internal("a multi-rank session has no mesh".into())
}
