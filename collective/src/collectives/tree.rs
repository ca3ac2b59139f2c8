//! The O(log n)-latency TCP algorithms for small messages: binomial-tree broadcast, and
//! recursive-doubling allreduce and allgather (any n: the ranks beyond the largest power of
//! two `p` are folded into a partner first and sent the result last).
//!
//! Folding: of the first `2r` ranks (`r = n - p`), each even rank hands its data to the odd
//! rank after it and waits; odd rank `2v+1` plays virtual rank `v`, rank `q >= 2r` plays
//! `q - r`. Virtual rank `v` so stands for the real ranks `2v, 2v+1` (`v < r`) or `v + r`:
//! consecutive virtual ranks stand for consecutive real ranks, so an aligned group of virtual
//! ranks owns one contiguous byte range of an allgather's result.
//!
//! Every rank gets a bitwise-identical allreduce result, even for operations that are not
//! bitwise commutative (min and max of ±0 or NaN): each combination is computed as
//! `reduce(lower group, higher group)` on both partners, so the two partners of a step compute
//! the same function of the same two values, and the folded ranks receive a copy.

use std::ops::Range;

use super::allreduce::Ring;
use super::AlignedBuf;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::{Buffers, Mesh, RecvBlock, SendBlock, StreamPlan};

/// The binomial tree over `size` positions rooted at position 0: position `v`'s parent
/// (`v` with its lowest set bit cleared) and children (largest subtree first).
pub(crate) fn binomial(v: usize, size: usize) -> (Option<usize>, Vec<usize>) {
    let mut mask = 1;
    let mut parent = None;
    while mask < size {
        if v & mask != 0 {
            parent = Some(v - mask);
            break;
        }
        mask <<= 1;
    }
    let mut children = Vec::new();
    let mut m = mask >> 1;
    while m > 0 {
        if v + m < size {
            children.push(v + m);
        }
        m >>= 1;
    }
    (parent, children)
}

/// The ranks rank `rank` of `size` talks to in a binomial-tree broadcast from `root`.
pub(crate) fn binomial_peers(rank: usize, size: usize, root: usize) -> Vec<usize> {
    let v = (rank + size - root) % size;
    let (parent, children) = binomial(v, size);
    parent
        .into_iter()
        .chain(children)
        .map(|p| (p + root) % size)
        .collect()
}

/// Recursive doubling's shape for `size` ranks: the largest power of two `p <= size` and the
/// number `r = size - p` of ranks folded away.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fold {
    pub p: usize,
    pub r: usize,
}

impl Fold {
    pub(crate) fn new(size: usize) -> Fold {
        let p = if size == 0 {
            0
        } else {
            1 << (usize::BITS - 1 - size.leading_zeros())
        };
        Fold { p, r: size - p }
    }

    /// The virtual rank of `rank`, or `None` for a folded-away (even, `< 2r`) rank.
    pub(crate) fn virtual_of(&self, rank: usize) -> Option<usize> {
        if rank < 2 * self.r {
            (rank % 2 == 1).then_some(rank / 2)
        } else {
            Some(rank - self.r)
        }
    }

    /// The real rank playing virtual rank `v`.
    pub(crate) fn real_of(&self, v: usize) -> usize {
        if v < self.r {
            2 * v + 1
        } else {
            v + self.r
        }
    }

    /// The lowest real rank virtual rank `v` stands for.
    fn first_real(&self, v: usize) -> usize {
        if v < self.r {
            2 * v
        } else {
            v + self.r
        }
    }

    /// The partners of virtual rank `v`, step by step.
    fn partners(&self, v: usize) -> impl Iterator<Item = usize> + '_ {
        let mut mask = 1;
        std::iter::from_fn(move || {
            (mask < self.p).then(|| {
                let partner = v ^ mask;
                mask <<= 1;
                partner
            })
        })
    }
}

/// The ranks rank `rank` of `size` talks to in recursive doubling (allreduce or allgather).
pub(crate) fn doubling_peers(rank: usize, size: usize) -> Vec<usize> {
    let fold = Fold::new(size);
    match fold.virtual_of(rank) {
        None => vec![rank + 1],
        Some(v) => {
            let folded = (rank < 2 * fold.r).then(|| rank - 1);
            folded
                .into_iter()
                .chain(fold.partners(v).map(|pv| fold.real_of(pv)))
                .collect()
        }
    }
}

impl Ring<'_> {
    /// One stream step with member `to` and/or `from` (positions in `members`): sends
    /// `send` of the buffers and stores what arrives into `recv`.
    fn step(
        &self,
        mesh: &mut Mesh,
        to: Option<usize>,
        from: Option<usize>,
        bufs: Buffers<'_>,
        send: Range<usize>,
        recv: Range<usize>,
    ) -> Result<()> {
        let sends = [SendBlock {
            range: send,
            after: None,
        }];
        let recvs = [RecvBlock {
            range: recv,
            reduce: false,
        }];
        let plan = StreamPlan {
            tag: self.tag,
            send_to: to.map(|m| self.members[m]),
            recv_from: from.map(|m| self.members[m]),
            send_blocks: &sends,
            recv_blocks: &recvs,
        };
        mesh.run_stream(self.what, &plan, bufs, &mut [], |_, _, _| {
            Err(Error::Internal("this step has nothing to reduce".into()))
        })
    }

    fn send_all(&self, mesh: &mut Mesh, to: usize, buf: &[u8]) -> Result<()> {
        let all = 0..buf.len();
        let bufs = Buffers::Split {
            send: buf,
            recv: &mut [],
        };
        self.step(mesh, Some(to), None, bufs, all, 0..0)
    }

    fn recv_all(&self, mesh: &mut Mesh, from: usize, buf: &mut [u8]) -> Result<()> {
        let all = 0..buf.len();
        self.step(mesh, None, Some(from), Buffers::InPlace(buf), 0..0, all)
    }

    /// Binomial-tree broadcast from member `root`: receive the whole buffer from the parent,
    /// then send it to each child, largest subtree first.
    pub(crate) fn tree_broadcast(
        &self,
        mesh: &mut Mesh,
        buf: &mut [u8],
        root: usize,
    ) -> Result<()> {
        let size = self.members.len();
        let v = (self.rank + size - root) % size;
        let (parent, children) = binomial(v, size);
        if let Some(parent) = parent {
            self.recv_all(mesh, (parent + root) % size, buf)?;
        }
        for child in children {
            self.send_all(mesh, (child + root) % size, buf)?;
        }
        Ok(())
    }

    /// Recursive-doubling allreduce of `buf` in place (`work` holds the partner's copy);
    /// the result is multiplied by `factor`. See the module docs for the order of reduction.
    pub(crate) fn doubling_allreduce(
        &self,
        mesh: &mut Mesh,
        work: &mut AlignedBuf,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        factor: f64,
    ) -> Result<()> {
        let (me, fold) = (self.rank, Fold::new(self.members.len()));
        let Some(v) = fold.virtual_of(me) else {
            self.send_all(mesh, me + 1, buf)?;
            return self.recv_all(mesh, me + 1, buf);
        };
        let theirs = work.get(buf.len());
        // `lower` and `higher` into `buf`, as reduce(lower, higher).
        let combine = |buf: &mut [u8], theirs: &mut [u8], theirs_lower: bool| -> Result<()> {
            if theirs_lower {
                reduce::reduce_into(dtype, op, theirs, buf)?;
                buf.copy_from_slice(theirs);
                Ok(())
            } else {
                reduce::reduce_into(dtype, op, buf, theirs)
            }
        };
        let folded = me < 2 * fold.r;
        if folded {
            self.recv_all(mesh, me - 1, theirs)?;
            combine(buf, theirs, true)?;
        }
        for pv in fold.partners(v) {
            let partner = fold.real_of(pv);
            let all = 0..buf.len();
            let bufs = Buffers::Split {
                send: buf,
                recv: theirs,
            };
            self.step(mesh, Some(partner), Some(partner), bufs, all.clone(), all)?;
            combine(buf, theirs, pv < v)?;
        }
        reduce::scale(dtype, buf, factor)?;
        if folded {
            self.send_all(mesh, me - 1, buf)?;
        }
        Ok(())
    }

    /// Recursive-doubling allgather in place: `buf[segs[rank]]` holds this member's block;
    /// afterwards every `buf[segs[j]]` holds member `j`'s. Each step swaps the contiguous
    /// range of this rank's group of virtual ranks with the partner group's.
    pub(crate) fn doubling_allgather(
        &self,
        mesh: &mut Mesh,
        buf: &mut [u8],
        segs: &[Range<usize>],
    ) -> Result<()> {
        let (me, fold) = (self.rank, Fold::new(self.members.len()));
        let Some(v) = fold.virtual_of(me) else {
            let bufs = Buffers::InPlace(buf);
            self.step(mesh, Some(me + 1), None, bufs, segs[me].clone(), 0..0)?;
            return self.recv_all(mesh, me + 1, buf);
        };
        let folded = me < 2 * fold.r;
        if folded {
            let bufs = Buffers::InPlace(buf);
            self.step(mesh, None, Some(me - 1), bufs, 0..0, segs[me - 1].clone())?;
        }
        // The byte range of the `count` virtual ranks from `start`.
        let group = |start: usize, count: usize| {
            segs[fold.first_real(start)].start..segs[fold.real_of(start + count - 1)].end
        };
        let mut mask = 1;
        for pv in fold.partners(v) {
            let partner = fold.real_of(pv);
            let (mine, theirs) = (group(v & !(mask - 1), mask), group(pv & !(mask - 1), mask));
            let bufs = Buffers::InPlace(buf);
            self.step(mesh, Some(partner), Some(partner), bufs, mine, theirs)?;
            mask <<= 1;
        }
        if folded {
            self.send_all(mesh, me - 1, buf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_tree_reaches_every_position_once() {
        for size in 1..40 {
            let mut reached = vec![0usize; size];
            reached[0] = 1;
            for v in 0..size {
                let (parent, children) = binomial(v, size);
                assert_eq!(parent.is_none(), v == 0);
                if let Some(p) = parent {
                    assert!(
                        binomial(p, size).1.contains(&v),
                        "{v}'s parent {p} lists it"
                    );
                }
                for c in children {
                    assert!(c > v);
                    reached[c] += 1;
                }
            }
            assert!(reached.iter().all(|&r| r == 1), "size {size}: {reached:?}");
            // Depth is at most ⌈log2 size⌉.
            let depth = (0..size).map(|v| v.count_ones()).max().unwrap_or(0);
            assert!(size < 2 || (1usize << depth) < 2 * size);
        }
    }

    #[test]
    fn folding_pairs_every_rank_and_groups_are_contiguous() {
        for size in 1..40 {
            let fold = Fold::new(size);
            assert!(fold.p.is_power_of_two() && fold.p <= size && size < 2 * fold.p);
            let virtuals: Vec<usize> = (0..size).filter_map(|q| fold.virtual_of(q)).collect();
            assert_eq!(virtuals, (0..fold.p).collect::<Vec<_>>());
            for v in 0..fold.p {
                assert_eq!(fold.virtual_of(fold.real_of(v)), Some(v));
                if v + 1 < fold.p {
                    assert_eq!(fold.real_of(v) + 1, fold.first_real(v + 1));
                }
            }
            // Peers are symmetric: whoever q talks to talks to q.
            for q in 0..size {
                for p in doubling_peers(q, size) {
                    assert!(doubling_peers(p, size).contains(&q), "{size}: {q} <-> {p}");
                }
                for p in binomial_peers(q, size, size / 2) {
                    assert!(binomial_peers(p, size, size / 2).contains(&q));
                }
                assert!(doubling_peers(q, size).len() <= 1 + fold.p.trailing_zeros() as usize);
            }
        }
    }
}
