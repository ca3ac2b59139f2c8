//! A batch of tensors seen as one byte range, laid end to end: the engine's fused allreduce
//! over shared memory reads and writes the tensors where they are, so packing a fusion buffer
//! *is* the copy into the shared segment and unpacking it the copy out of it.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::transport::shm;

/// Several disjoint byte slices viewed as their concatenation (the "joint range").
pub(crate) struct Scattered<'a> {
    parts: Vec<&'a mut [u8]>,
    /// Where each part starts in the joint range, then the total length.
    starts: Vec<usize>,
}

impl<'a> Scattered<'a> {
    /// The concatenation of `parts`, in order. An error (a bug) if their total overflows.
    pub(crate) fn new(parts: Vec<&'a mut [u8]>) -> Result<Self> {
        let mut starts = Vec::with_capacity(parts.len() + 1);
        let mut at = 0usize;
        for part in &parts {
            starts.push(at);
            at = at
                .checked_add(part.len())
                .ok_or_else(|| Error::Internal("a tensor batch larger than memory".into()))?;
        }
        starts.push(at);
        Ok(Scattered { parts, starts })
    }

    /// One contiguous buffer.
    pub(crate) fn one(buf: &'a mut [u8]) -> Self {
        let len = buf.len();
        Scattered {
            parts: vec![buf],
            starts: vec![0, len],
        }
    }

    /// Bytes in the joint range.
    pub(crate) fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The parts, in order.
    pub(crate) fn parts_mut(&mut self) -> &mut [&'a mut [u8]] {
        &mut self.parts
    }

    /// Calls `f(offset, piece)` for every non-empty piece of a part inside `range` of the joint
    /// range, in order; `offset` is the piece's start relative to `range.start`. A range past
    /// the end is an error (a bug), checked before `f` runs.
    pub(crate) fn visit(
        &mut self,
        range: Range<usize>,
        mut f: impl FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        if range.start > range.end || range.end > self.len() {
            return Err(Error::Internal(format!(
                "bytes {range:?} of a {}-byte tensor batch",
                self.len()
            )));
        }
        let mut i = self
            .starts
            .partition_point(|&s| s <= range.start)
            .saturating_sub(1);
        let mut at = range.start;
        while at < range.end && i < self.parts.len() {
            let (start, end) = (self.starts[i], self.starts[i + 1]);
            if end > at {
                let piece = &mut self.parts[i][at - start..range.end.min(end) - start];
                f(at - range.start, piece)?;
                at += piece.len();
            }
            i += 1;
        }
        Ok(())
    }

    /// Copies `range` of the joint range into `dst` (of `range.len()` bytes); `streaming` when
    /// `dst` is a shared half peers read next ([`shm::copy_into_half`]).
    pub(crate) fn gather(
        &mut self,
        range: Range<usize>,
        dst: &mut [u8],
        streaming: bool,
    ) -> Result<()> {
        check_len(&range, dst.len())?;
        self.visit(range, |at, piece| {
            shm::copy_into_half(&mut dst[at..at + piece.len()], piece, streaming);
            Ok(())
        })
    }

    /// Copies `src` (of `range.len()` bytes) into `range` of the joint range.
    pub(crate) fn scatter(&mut self, range: Range<usize>, src: &[u8]) -> Result<()> {
        check_len(&range, src.len())?;
        self.visit(range, |at, piece| {
            piece.copy_from_slice(&src[at..at + piece.len()]);
            Ok(())
        })
    }
}

fn check_len(range: &Range<usize>, len: usize) -> Result<()> {
    if range.len() != len {
        return Err(Error::Internal(format!(
            "{len} bytes for the {}-byte range {range:?} of a tensor batch",
            range.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_and_scatter_cross_part_boundaries_and_skip_empty_parts() {
        let (mut a, mut b, mut c, mut d) = ([1u8, 2, 3], [0u8; 0], [4u8, 5], [6u8, 7, 8, 9]);
        let mut s = Scattered::new(vec![&mut a, &mut b, &mut c, &mut d]).unwrap();
        assert_eq!(s.len(), 9);
        let mut out = [0u8; 5];
        s.gather(2..7, &mut out, false).unwrap();
        assert_eq!(out, [3, 4, 5, 6, 7]);
        s.scatter(1..8, &[10, 11, 12, 13, 14, 15, 16]).unwrap();
        let mut all = [0u8; 9];
        s.gather(0..9, &mut all, false).unwrap();
        assert_eq!(all, [1, 10, 11, 12, 13, 14, 15, 16, 9]);
        let mut seen = Vec::new();
        s.visit(2..9, |at, piece| {
            seen.push((at, piece.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(0, 1), (1, 2), (3, 4)]);
        // Out-of-range and wrong-length requests are errors, not panics or partial copies.
        assert!(s.gather(5..10, &mut [0; 5], false).is_err());
        assert!(s.scatter(0..3, &[1, 2]).is_err());
        assert_eq!(all, {
            let mut again = [0u8; 9];
            s.gather(0..9, &mut again, false).unwrap();
            again
        });
    }
}
