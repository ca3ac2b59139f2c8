//! The collectives over the shared-memory node of one host (see
//! [`transport::shm`](crate::transport::shm) for the phase protocol). Every function runs on
//! all of the node's ranks with the same arguments (sizes agreed in the negotiation) and
//! returns a [`Failure`] the caller turns into an error with [`Mesh::fail`].
//!
//! - small allreduce: one phase; every rank copies its input into its half and reduces all
//!   halves itself, in rank order (so every rank gets bit-identical results);
//! - large allreduce: pipelined reduce-scatter + allgather. The buffer is cut into rounds; in
//!   phase `p` each rank writes the parts of round `p` the others reduce and the part of
//!   round `p - 1` it reduced; it then copies the others' reduced parts of round `p - 1` and
//!   reduces its part of round `p` from the others' halves;
//! - reducescatter: the reduce-scatter half of that, on Horovod's uneven row split;
//! - allgather, broadcast, alltoall: chunked copies through the halves.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::even_segments;
use super::scattered::Scattered;
use crate::dtype::{DType, ReduceOp};
use crate::error::Error;
use crate::reduce;
use crate::transport::shm::{copy_into_half, publish_fence, Halves, ShmNode};
use crate::transport::Failure;
#[cfg(doc)]
use crate::transport::Mesh;

/// Inputs up to this many bytes take the one-phase allreduce.
pub(crate) const SMALL_ALLREDUCE: usize = 256 << 10;

/// The most bytes per rank of one round of the large allreduce: small enough that the halves
/// every rank writes and reads in a phase stay in the cache (a 64 MiB allreduce with 2 MiB
/// regions ran at 1.8x the time of two concurrent copies, the halves making a round trip
/// through memory).
pub(crate) const ROUND_REGION_MAX: usize = 512 << 10;

/// Bytes of the blocks a rank reduces its part of a round in: each block of the accumulator
/// gets every other rank's contribution and the scaling while it is in the L1 cache (16 KiB of
/// accumulator plus 16 KiB per source fit the 32-48 KiB L1 of current x86 and Arm cores),
/// instead of one pass over the whole part per source and one more for the scaling.
const REDUCE_BLOCK: usize = 16 << 10;

/// [`ROUND_REGION_MAX`] as a multiple of `elem` and of 64 bytes.
fn round_region(elem: usize) -> usize {
    let unit = lcm(elem.max(1), 64);
    (ROUND_REGION_MAX / unit * unit).max(unit)
}

/// A node and the check run while waiting for local rank `j` (`alive(j)`: the mesh's
/// [`Mesh::peer_alive`] for its global rank).
pub(crate) struct Node<'a> {
    pub alive: &'a dyn Fn(usize) -> Result<(), Failure>,
    pub node: &'a ShmNode,
}

impl Node<'_> {
    /// One phase: `write` fills this rank's half; returns every rank's half (valid until the
    /// next phase).
    fn phase(
        &self,
        write: impl FnOnce(&mut [u8]) -> Result<(), Error>,
    ) -> Result<Halves<'_>, Failure> {
        self.node.phase(self.alive, write)
    }

    fn n(&self) -> usize {
        self.node.len()
    }

    fn me(&self) -> usize {
        self.node.me()
    }

    /// Bytes of one rank's region when a half is split into one region per rank, a multiple
    /// of `align` (and of 64 bytes, so regions start on cache lines).
    fn region(&self, align: usize) -> usize {
        let unit = lcm(align.max(1), 64);
        (self.node.half() / self.n() / unit * unit).max(unit)
    }

    /// Sends `payload` to every local rank and returns every rank's payload (this rank's
    /// included), indexed by local rank. Payloads longer than a half take several phases.
    pub(crate) fn exchange(&self, payload: &[u8], max_len: usize) -> Result<Vec<Vec<u8>>, Failure> {
        let cap = self.node.half() - 8;
        let n = self.n();
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); n];
        let mut at = 0usize;
        loop {
            let halves = self.phase(|half| {
                half[..8].copy_from_slice(&(payload.len() as u64).to_le_bytes());
                let part = &payload[at.min(payload.len())..(at + cap).min(payload.len())];
                half[8..8 + part.len()].copy_from_slice(part);
                Ok(())
            })?;
            let mut more = false;
            for (j, out) in out.iter_mut().enumerate() {
                let half = halves.get(j);
                let mut word = [0u8; 8];
                word.copy_from_slice(&half[..8]);
                let len = usize::try_from(u64::from_le_bytes(word)).unwrap_or(usize::MAX);
                if len > max_len.max(payload.len()) {
                    return Err(Failure::Other(Error::Internal(format!(
                        "rank {} sent a {len}-byte message over shared memory; at most {max_len} are expected",
                        self.node.members()[j]
                    ))));
                }
                let end = (at + cap).min(len);
                if at < end {
                    out.extend_from_slice(&half[8..8 + end - at]);
                }
                more |= len > at + cap;
            }
            if !more {
                return Ok(out);
            }
            at += cap;
        }
    }

    /// Reduces `buf` across the node in place and multiplies the result by `factor`.
    pub(crate) fn allreduce(
        &self,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        factor: f64,
    ) -> Result<(), Failure> {
        self.allreduce_scattered(&mut Scattered::one(buf), dtype, op, factor)
    }

    /// Reduces the joint range of `buf` (tensors of `dtype` laid end to end) across the node
    /// in place and multiplies the result by `factor`. The tensors are read straight into the
    /// shared halves and the results written straight back: a fused batch needs no fusion
    /// buffer.
    ///
    /// The large algorithm moves each byte through memory about as often as one copy does:
    /// rounds are small enough ([`ROUND_REGION_MAX`] per rank) that the halves stay in the
    /// cache between the writer and the readers, a rank's reduced part goes into the next
    /// phase's half while still in the cache, and its part is reduced and scaled in
    /// [`REDUCE_BLOCK`]s that stay in L1. Per byte of the buffer each rank reads its input from
    /// memory once and writes its result once (as one copy does), and moves it through the
    /// shared cache twice (into its half; from a peer's half).
    pub(crate) fn allreduce_scattered(
        &self,
        buf: &mut Scattered<'_>,
        dtype: DType,
        op: ReduceOp,
        factor: f64,
    ) -> Result<(), Failure> {
        if self.n() == 1 {
            for part in buf.parts_mut() {
                reduce::scale(dtype, part, factor).map_err(Failure::Other)?;
            }
            return Ok(());
        }
        let len = buf.len();
        if len <= SMALL_ALLREDUCE.min(self.node.half()) {
            return self.allreduce_small(buf, dtype, op, factor);
        }
        let (n, me) = (self.n(), self.me());
        let elem = dtype.size();
        let region = self.region(elem).min(round_region(elem));
        let rounds = buf_rounds(len, elem, region, n);
        let at = |j: usize, len: usize| j * region..j * region + len;
        let streaming = self.node.streaming(len);
        let mut work = Duration::ZERO;
        for p in 0..=rounds.len() {
            let (current, previous) = (rounds.get(p), p.checked_sub(1).map(|q| &rounds[q]));
            let halves = self.phase(|half| {
                timed(&mut work, || {
                    // This rank's reduced part of the previous round first, while it is in
                    // the cache.
                    if let Some(segs) = previous {
                        let seg = segs[me].clone();
                        buf.gather(seg.clone(), &mut half[at(me, seg.len())], streaming)?;
                    }
                    if let Some(segs) = current {
                        for (j, seg) in segs.iter().enumerate().filter(|(j, _)| *j != me) {
                            buf.gather(seg.clone(), &mut half[at(j, seg.len())], streaming)?;
                        }
                    }
                    // The streamed stores drain here, inside the timed work (the phase's own
                    // fence then finds none left).
                    publish_fence();
                    Ok(())
                })
            })?;
            timed(&mut work, || {
                if let Some(segs) = previous {
                    for (j, seg) in segs.iter().enumerate().filter(|(j, _)| *j != me) {
                        let src = &halves.get(j)[at(j, seg.len())];
                        buf.scatter(seg.clone(), src)?;
                    }
                }
                if let Some(segs) = current {
                    buf.visit(segs[me].clone(), |offset, acc| {
                        reduce_blocks(&halves, me, me * region + offset, acc, dtype, op, factor)
                    })?;
                }
                Ok(())
            })
            .map_err(Failure::Other)?;
        }
        self.node.tune_stores(streaming, len, work);
        Ok(())
    }

    /// Reduces into `acc` this rank's region (`region` bytes per rank) of every other rank's
    /// half, then multiplies the result by `factor`.
    fn reduce_region(
        &self,
        halves: &Halves<'_>,
        region: usize,
        acc: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        factor: f64,
    ) -> Result<(), Failure> {
        let me = self.me();
        reduce_blocks(halves, me, me * region, acc, dtype, op, factor).map_err(Failure::Other)
    }

    fn allreduce_small(
        &self,
        buf: &mut Scattered<'_>,
        dtype: DType,
        op: ReduceOp,
        factor: f64,
    ) -> Result<(), Failure> {
        let len = buf.len();
        let streaming = self.node.streaming(len);
        let mut work = Duration::ZERO;
        let halves = self.phase(|half| {
            timed(&mut work, || {
                buf.gather(0..len, &mut half[..len], streaming)?;
                publish_fence();
                Ok(())
            })
        })?;
        // Every rank reduces in rank order, so all get bit-identical results.
        timed(&mut work, || {
            buf.visit(0..len, |offset, piece| {
                let range = offset..offset + piece.len();
                piece.copy_from_slice(&halves.get(0)[range.clone()]);
                for j in 1..self.n() {
                    reduce::reduce_into(dtype, op, piece, &halves.get(j)[range.clone()])?;
                }
                reduce::scale(dtype, piece, factor)
            })
        })
        .map_err(Failure::Other)?;
        self.node.tune_stores(streaming, len, work);
        Ok(())
    }

    /// Reduces `input` across the node; `segs[j]` (byte ranges of `input`, by local rank) is
    /// the part local rank `j` receives; this rank's reduced part, times `factor`, goes to
    /// `output` (of `segs[me].len()` bytes).
    pub(crate) fn reducescatter(
        &self,
        input: &[u8],
        output: &mut [u8],
        segs: &[Range<usize>],
        dtype: DType,
        op: ReduceOp,
        factor: f64,
    ) -> Result<(), Failure> {
        let me = self.me();
        let region = self.region(dtype.size());
        let base = segs[me].start;
        let streaming = self.node.streaming(input.len());
        for piece in pieces(segs, region) {
            let halves = self.phase(|half| {
                for (j, seg) in piece.iter().enumerate().filter(|(j, _)| *j != me) {
                    copy_into_half(
                        &mut half[j * region..j * region + seg.len()],
                        &input[seg.clone()],
                        streaming,
                    );
                }
                Ok(())
            })?;
            let seg = piece[me].clone();
            let acc = &mut output[seg.start - base..seg.end - base];
            acc.copy_from_slice(&input[seg.clone()]);
            self.reduce_region(&halves, region, acc, dtype, op, factor)?;
        }
        Ok(())
    }

    /// Gathers in place: `buf[segs[me]]` holds this rank's part; afterwards `buf[segs[j]]`
    /// holds local rank `j`'s for every `j`.
    pub(crate) fn allgather(&self, buf: &mut [u8], segs: &[Range<usize>]) -> Result<(), Failure> {
        if self.n() == 1 {
            return Ok(());
        }
        let me = self.me();
        let streaming = self.node.streaming(buf.len());
        for piece in pieces(segs, self.node.half()) {
            let mine = piece[me].clone();
            let halves = self.phase(|half| {
                copy_into_half(&mut half[..mine.len()], &buf[mine.clone()], streaming);
                Ok(())
            })?;
            for (j, seg) in piece.iter().enumerate().filter(|(j, _)| *j != me) {
                buf[seg.clone()].copy_from_slice(&halves.get(j)[..seg.len()]);
            }
        }
        Ok(())
    }

    /// Copies local rank `root`'s `buf` to every local rank's `buf`.
    pub(crate) fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), Failure> {
        self.broadcast_scattered(&mut Scattered::one(buf), root)
    }

    /// Copies local rank `root`'s joint range of `buf` to every local rank's.
    pub(crate) fn broadcast_scattered(
        &self,
        buf: &mut Scattered<'_>,
        root: usize,
    ) -> Result<(), Failure> {
        if self.n() == 1 {
            return Ok(());
        }
        let me = self.me();
        let cap = self.node.half();
        let len = buf.len();
        let mut at = 0;
        let streaming = self.node.streaming(len);
        while at < len {
            let end = (at + cap).min(len);
            let halves = self.phase(|half| {
                if me == root {
                    buf.gather(at..end, &mut half[..end - at], streaming)?;
                }
                Ok(())
            })?;
            if me != root {
                buf.scatter(at..end, &halves.get(root)[..end - at])
                    .map_err(Failure::Other)?;
            }
            at = end;
        }
        Ok(())
    }

    /// Sends `input[send[j]]` to local rank `j` and receives local rank `j`'s part for this
    /// rank into `output[recv[j]]`. `longest` is the longest message between any two ranks.
    pub(crate) fn alltoall(
        &self,
        input: &[u8],
        send: &[Range<usize>],
        output: &mut [u8],
        recv: &[Range<usize>],
        longest: usize,
    ) -> Result<(), Failure> {
        let (n, me) = (self.n(), self.me());
        let region = self.region(1);
        let streaming = self.node.streaming(input.len());
        for round in 0..longest.div_ceil(region) {
            let at = round * region;
            let part = |r: &Range<usize>| {
                let start = (r.start + at).min(r.end);
                start..(start + region).min(r.end)
            };
            let halves = self.phase(|half| {
                for (j, seg) in send.iter().enumerate().filter(|(j, _)| *j != me) {
                    let piece = part(seg);
                    copy_into_half(
                        &mut half[j * region..j * region + piece.len()],
                        &input[piece],
                        streaming,
                    );
                }
                Ok(())
            })?;
            for j in (0..n).filter(|&j| j != me) {
                let piece = part(&recv[j]);
                let src = &halves.get(j)[me * region..me * region + piece.len()];
                output[piece].copy_from_slice(src);
            }
        }
        Ok(())
    }
}

/// `acc = (acc op half_j[from..from + acc.len()] for every local rank j but me) * factor`,
/// [`REDUCE_BLOCK`] bytes at a time (whole elements of `dtype`), so each block of `acc` is
/// read from and written to memory once whatever the number of ranks and the factor.
fn reduce_blocks(
    halves: &Halves<'_>,
    me: usize,
    from: usize,
    acc: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    factor: f64,
) -> Result<(), Error> {
    let block = (REDUCE_BLOCK / dtype.size()).max(1) * dtype.size();
    for (k, part) in acc.chunks_mut(block).enumerate() {
        let at = from + k * block;
        for j in (0..halves.len()).filter(|&j| j != me) {
            reduce::reduce_into(dtype, op, part, &halves.get(j)[at..at + part.len()])?;
        }
        reduce::scale(dtype, part, factor)?;
    }
    Ok(())
}

/// The rounds of a large allreduce: consecutive blocks of at most `n * region` bytes, each
/// split into `n` element-aligned segments of at most `region` bytes.
fn buf_rounds(len: usize, elem: usize, region: usize, n: usize) -> Vec<Vec<Range<usize>>> {
    let per_round = region * n;
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let end = (at + per_round).min(len);
        out.push(
            even_segments((end - at) / elem, elem, n)
                .into_iter()
                .map(|r| at + r.start..at + r.end)
                .collect(),
        );
        at = end;
    }
    out
}

/// Cuts every segment into pieces of at most `cap` bytes (a multiple of the element size);
/// returns, per phase, the piece of every segment (empty once a segment is done).
fn pieces(segs: &[Range<usize>], cap: usize) -> Vec<Vec<Range<usize>>> {
    let longest = segs.iter().map(ExactSizeIterator::len).max().unwrap_or(0);
    let count = longest.div_ceil(cap).max(1);
    (0..count)
        .map(|p| {
            segs.iter()
                .map(|s| {
                    let start = (s.start + p * cap).min(s.end);
                    start..(start + cap).min(s.end)
                })
                .collect()
        })
        .collect()
}

/// Runs `f`, adding the time it took to `work`.
fn timed<T>(work: &mut Duration, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    *work += start.elapsed();
    out
}

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_and_pieces_cover_everything_aligned() {
        let rounds = buf_rounds(1000 * 4, 4, 256, 3);
        let mut at = 0;
        for round in &rounds {
            for seg in round {
                assert_eq!(seg.start, at);
                assert!(seg.len() <= 256 && seg.len() % 4 == 0);
                at = seg.end;
            }
        }
        assert_eq!(at, 4000);
        let segs = vec![0..10, 10..10, 10..35];
        let p = pieces(&segs, 8);
        assert_eq!(p.len(), 4);
        assert_eq!(p[0], vec![0..8, 10..10, 10..18]);
        assert_eq!(p[3], vec![10..10, 10..10, 34..35]);
        assert_eq!(lcm(6, 64), 192);
    }
}
