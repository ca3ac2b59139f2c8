//! Horovod's Adasum reduction (`op=Adasum`) on CPU memory: the VHDD algorithm of [`vhdd`]
//! over the TCP mesh between the group's ranks, with the per-tensor arithmetic of [`kernel`].
//!
//! Adasum always runs point to point over the mesh (never the shared-memory or hierarchical
//! paths: it is not an elementwise reduction). A fused batch keeps its tensor boundaries: each
//! tensor gets its own dot product, norms and coefficients, as in Horovod's fused response.
//! The group must have a power-of-two number of ranks (Horovod's rule); the engine refuses
//! other sizes when the op is submitted, so no rank ever starts it.

mod kernel;
mod vhdd;

pub(crate) use vhdd::size_refusal;

use super::{allreduce::no_mesh, Session};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::{Buffers, Failure, Mesh, RecvBlock, SendBlock, StreamPlan};
use crate::wire::FrameError;

/// The mesh as VHDD's point-to-point network: group ranks mapped to global ranks through
/// `members`; every frame carries the collective's `tag`.
struct MeshPairs<'a> {
    mesh: &'a mut Mesh,
    members: &'a [usize],
    tag: u32,
    what: &'a str,
}

impl vhdd::Pairwise for MeshPairs<'_> {
    fn swap(&mut self, peer: usize, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let peer = self.members[peer];
        let sends = [SendBlock {
            range: 0..send.len(),
            after: None,
        }];
        let recvs = [RecvBlock {
            range: 0..recv.len(),
            reduce: false,
        }];
        let plan = StreamPlan {
            tag: self.tag,
            send_to: Some(peer),
            recv_from: Some(peer),
            send_blocks: &sends,
            recv_blocks: &recvs,
        };
        self.mesh.run_stream(
            self.what,
            &plan,
            Buffers::Split { send, recv },
            &mut [],
            |_, _, _| {
                Err(Error::Internal(
                    "an Adasum swap has nothing to reduce".into(),
                ))
            },
        )
    }

    fn swap_sums(&mut self, peer: usize, mine: &[f64]) -> Result<Vec<f64>> {
        let peer = self.members[peer];
        let payload: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut got = self
            .mesh
            .exchange(self.what, self.tag, &payload, payload.len(), &[peer])?;
        let theirs = got.pop().unwrap_or_default();
        if theirs.len() != payload.len() {
            let source = FrameError::Truncated {
                needed: payload.len(),
                got: theirs.len(),
            };
            return Err(self.mesh.fail(Failure::Frame { peer, source }, self.what));
        }
        Ok(theirs
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    }
}

/// Runs Adasum on `buf` (tensors of `counts` elements of `dtype`, end to end) among the
/// session's members after the negotiation (frames tagged `tag`), then multiplies the result
/// by `postscale`. A failure of the data plane leaves the mesh unusable, as for every
/// collective.
pub(crate) fn run(
    session: &mut Session,
    tag: u32,
    what: &str,
    buf: &mut [u8],
    dtype: DType,
    counts: &[usize],
    postscale: f64,
) -> Result<()> {
    let (rank, size) = (session.rank, session.size);
    if size > 1 {
        let Session { mesh, members, .. } = session;
        let mesh = mesh.as_mut().ok_or_else(no_mesh)?;
        let mut net = MeshPairs {
            mesh,
            members,
            tag,
            what,
        };
        vhdd::allreduce(&mut net, rank, size, dtype, buf, counts)?;
    }
    reduce::scale(dtype, buf, postscale)
}
